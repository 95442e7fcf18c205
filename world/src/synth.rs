//! Synthetic demand traces (`cdnmap world ... --trace HOURS --out-trace TRACE.jsonl`): a day's
//! rhythm by each map unit's time zone, noise, a flash crowd, a cluster failure, and true
//! per-unit costs that differ from the instance's configured ones, so that an estimator has
//! something to learn. The format is `docs/trace.md` ([`crate::trace`]).
//!
//! # The model
//!
//! **Rounds.** `HOURS` (in (0, [`MAX_HOURS`]], fractional allowed) is cut into
//! `⌊HOURS × 3,600,000 / round_ms⌋` rounds (at least one) of `round_ms` (default 10,000), the first
//! starting at `start_ms` (default [`DEFAULT_START_MS`], 2025-11-30T00:00:00Z, a midnight UTC).
//! Each round has one unit-demand record per map unit, in map unit order, after the round's
//! state records (if any).
//!
//! **Demand** of map unit `u` in the round starting at `t` is
//! `demand(u) × rhythm(local hour) × noise × flash`, rounded to 1e-4 (so never negative):
//!
//! - `demand(u)` is the instance's demand of the unit.
//! - The unit's time zone: the instance does not keep the city a map unit was placed in, so its
//!   UTC offset is taken from its longitude, `round(lon / 15)` hours (the nominal zone of the
//!   meridian: off by an hour or two where countries choose otherwise, e.g. China or Spain, and
//!   no daylight saving). The local hour is `t`'s hour of the day UTC plus that offset, mod 24.
//! - [`rhythm`] is smooth (its derivative is continuous), lowest at 04:00 local ([`RHYTHM_LOW`],
//!   0.4), rising along a half cosine to its peak at 20:00 local ([`RHYTHM_HIGH`], 1.3), and
//!   falling along a half cosine back to 04:00; its mean over a day is 0.85.
//! - `noise` is uniform in `[1 − noise, 1 + noise]` (default ±10%), independent per unit and
//!   round.
//! - `flash` is [`TraceParams::flash_factor`] (default ×4) for the units of the flash crowd's
//!   region inside its window, else 1.
//!
//! **Flash crowd.** The region is the map units within [`TraceParams::flash_radius_km`] (default
//! 500 km, great circle) of a centre: [`TraceParams::flash_center`] if given, else the location of
//! one map unit drawn with probability ∝ its demand (so a populous city, most likely). The window
//! starts at [`TraceParams::flash_start_h`] hours into the trace if given, else at 40% of the
//! trace; it lasts [`TraceParams::flash_minutes`] (default 30) — when its start is not given, at
//! most 20% of the trace (so a short trace still holds the whole window) — and ends at the trace's
//! end at the latest. Windows are whole rounds.
//!
//! **Cluster failure.** A state record takes a cluster `down` at [`TraceParams::failure_start_h`]
//! hours into the trace (default: 60% of the trace) and another brings it back `up`
//! [`TraceParams::failure_minutes`] later (default 60; when the start is not given, at most 25% of
//! the trace, and always at least one round before its end, so the trace holds both). With an
//! explicit start, an `up` that would fall at or after the trace's end is not written (the cluster
//! stays down). The cluster is [`TraceParams::failure_cluster`] if given, else the busiest: the
//! `up` cluster that is the first candidate of the most demand (ties: the first in id order). A
//! trace of fewer than 4 rounds has no flash crowd and no failure unless their starts are given.
//!
//! **True coefficients.** The header's `true_per_unit` gives, for every class, its configured
//! `bps` and `fps` each multiplied by its own factor uniform in [`TraceParams::true_factor`]
//! (default [1.1, 1.4]; `(1.3, 1.3)` gives a fixed +30%). A configured coefficient of 0 stays 0.
//!
//! Everything is deterministic given the instance and [`TraceParams`]: each purpose draws from its
//! own ChaCha8 stream seeded from `seed`, and the demand noise does not depend on the flash crowd
//! or the failure (a trace with `flash_factor` 1 differs from the default only inside the window).

use std::collections::BTreeMap;
use std::fmt;
use std::io::Write;

use anyhow::{bail, ensure, Context, Result};
use cdnmap_mapper::{ClusterIdx, ClusterState, Instance, PerUnit, UnitIdx};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::trace::{self, Header, Record, StateChange};
use crate::world::distance_km;

/// 2025-11-30T00:00:00Z: the default time of the first round (a midnight UTC).
pub const DEFAULT_START_MS: i64 = 1_764_460_800_000;
/// The default round length.
pub const DEFAULT_ROUND_MS: i64 = 10_000;
/// The longest trace: two weeks.
pub const MAX_HOURS: f64 = 24.0 * 14.0;
/// [`rhythm`]'s lowest factor, at [`RHYTHM_LOW_HOUR`] local.
pub const RHYTHM_LOW: f64 = 0.4;
/// [`rhythm`]'s highest factor, at [`RHYTHM_HIGH_HOUR`] local.
pub const RHYTHM_HIGH: f64 = 1.3;
/// Local hour of the quietest time of day.
pub const RHYTHM_LOW_HOUR: f64 = 4.0;
/// Local hour of the busiest time of day.
pub const RHYTHM_HIGH_HOUR: f64 = 20.0;
/// Demand is written rounded to this many decimal places.
pub const DEMAND_DECIMALS: i32 = 4;

const HOUR_MS: i64 = 3_600_000;
const DAY_MS: i64 = 24 * HOUR_MS;

/// What to generate. [`TraceParams::new`] gives the defaults for a duration and seed.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceParams {
    /// Duration in hours, in (0, [`MAX_HOURS`]].
    pub hours: f64,
    /// Seed of every random choice.
    pub seed: u64,
    /// Round length, ms (> 0).
    pub round_ms: i64,
    /// Time of the first round, Unix ms.
    pub start_ms: i64,
    /// Demand noise: each unit's demand in each round is multiplied by a factor uniform in
    /// `[1 − noise, 1 + noise]` (`noise` in [0, 1)).
    pub noise: f64,
    /// The range the true coefficients' factors are drawn from (`0 < lo <= hi`).
    pub true_factor: (f64, f64),
    /// The flash crowd multiplies its units' demand by this (finite, >= 0; 1 turns it off).
    pub flash_factor: f64,
    /// The flash crowd's region: map units within this distance of its centre, km (>= 0).
    pub flash_radius_km: f64,
    /// The flash crowd's centre (lat, lon); `None`: a map unit's location, drawn ∝ demand.
    pub flash_center: Option<(f64, f64)>,
    /// The flash crowd's start, hours into the trace; `None`: 40% of the trace.
    pub flash_start_h: Option<f64>,
    /// The flash crowd's length, minutes (> 0).
    pub flash_minutes: f64,
    /// The failing cluster's id; `None`: the busiest (see the module documentation).
    pub failure_cluster: Option<String>,
    /// When the cluster goes down, hours into the trace; `None`: 60% of the trace.
    pub failure_start_h: Option<f64>,
    /// How long it stays down, minutes (> 0).
    pub failure_minutes: f64,
}

impl TraceParams {
    /// The defaults for a trace of `hours` with `seed`.
    pub fn new(hours: f64, seed: u64) -> Self {
        TraceParams {
            hours,
            seed,
            round_ms: DEFAULT_ROUND_MS,
            start_ms: DEFAULT_START_MS,
            noise: 0.10,
            true_factor: (1.1, 1.4),
            flash_factor: 4.0,
            flash_radius_km: 500.0,
            flash_center: None,
            flash_start_h: None,
            flash_minutes: 30.0,
            failure_cluster: None,
            failure_start_h: None,
            failure_minutes: 60.0,
        }
    }

    /// Refuses parameters out of range, naming the parameter.
    pub fn validate(&self) -> Result<()> {
        ensure!(
            self.hours.is_finite() && self.hours > 0.0 && self.hours <= MAX_HOURS,
            "trace hours must be > 0 and at most {MAX_HOURS} (two weeks), got {}",
            self.hours
        );
        ensure!(
            self.round_ms > 0,
            "round_ms must be > 0, got {}",
            self.round_ms
        );
        ensure!(
            self.rounds() >= 1,
            "trace hours {} is shorter than one round of {} ms",
            self.hours,
            self.round_ms
        );
        ensure!(
            self.noise.is_finite() && (0.0..1.0).contains(&self.noise),
            "noise must be in [0, 1), got {}",
            self.noise
        );
        let (lo, hi) = self.true_factor;
        ensure!(
            lo.is_finite() && hi.is_finite() && lo > 0.0 && lo <= hi,
            "true_factor must be a range 0 < lo <= hi, got ({lo}, {hi})"
        );
        ensure!(
            self.flash_factor.is_finite() && self.flash_factor >= 0.0,
            "flash_factor must be a finite number >= 0, got {}",
            self.flash_factor
        );
        ensure!(
            self.flash_radius_km.is_finite() && self.flash_radius_km >= 0.0,
            "flash_radius_km must be a finite number >= 0, got {}",
            self.flash_radius_km
        );
        if let Some((lat, lon)) = self.flash_center {
            ensure!(
                lat.is_finite()
                    && lon.is_finite()
                    && (-90.0..=90.0).contains(&lat)
                    && (-180.0..=180.0).contains(&lon),
                "flash_center must be a (lat, lon) in range, got ({lat}, {lon})"
            );
        }
        for (name, minutes) in [
            ("flash_minutes", self.flash_minutes),
            ("failure_minutes", self.failure_minutes),
        ] {
            ensure!(
                minutes.is_finite() && minutes > 0.0,
                "{name} must be a finite number > 0, got {minutes}"
            );
        }
        for (name, start) in [
            ("flash_start_h", self.flash_start_h),
            ("failure_start_h", self.failure_start_h),
        ] {
            if let Some(h) = start {
                ensure!(
                    h.is_finite() && h >= 0.0 && self.round_of(h * HOUR_MS as f64) < self.rounds(),
                    "{name} must be within the trace's {} hours, got {h}",
                    self.hours
                );
            }
        }
        Ok(())
    }

    /// The number of rounds: `⌊hours × 3,600,000 / round_ms⌋` (the duration is rounded to whole
    /// ms first, so 0.1 h is 360,000 ms). Meaningful once [`TraceParams::validate`] passed.
    pub fn rounds(&self) -> u64 {
        if self.round_ms <= 0 || !self.hours.is_finite() || self.hours <= 0.0 {
            return 0;
        }
        let ms = (self.hours * HOUR_MS as f64).round() as i64;
        (ms / self.round_ms) as u64
    }

    /// The round `ms` into the trace falls in (rounded to the nearest round boundary).
    fn round_of(&self, ms: f64) -> u64 {
        (ms / self.round_ms as f64).round() as u64
    }

    /// The time of round `r`'s start, Unix ms.
    fn round_start(&self, r: u64) -> i64 {
        self.start_ms + r as i64 * self.round_ms
    }

    /// Rounds in `minutes`, at least 1.
    fn rounds_in(&self, minutes: f64) -> u64 {
        self.round_of(minutes * 60_000.0).max(1)
    }
}

/// The flash crowd that was generated.
#[derive(Debug, Clone, PartialEq)]
pub struct FlashSummary {
    /// The window: rounds starting at `from_ms` up to (excluding) `to_ms`.
    pub from_ms: i64,
    pub to_ms: i64,
    pub center: (f64, f64),
    pub radius_km: f64,
    pub factor: f64,
    /// The region's map units, ascending.
    pub units: Vec<UnitIdx>,
}

/// The cluster failure that was generated.
#[derive(Debug, Clone, PartialEq)]
pub struct FailureSummary {
    pub cluster: String,
    /// The time of the `down` record.
    pub down_ms: i64,
    /// The time of the `up` record (`None`: after the trace's end, not written).
    pub up_ms: Option<i64>,
    /// The demand that ranks the cluster first (the instance's demand).
    pub first_choice_demand: f64,
}

/// What [`write_trace`] wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceSummary {
    pub rounds: u64,
    /// Records after the header (unit demands and state changes).
    pub records: u64,
    pub round_ms: i64,
    /// The first round's time.
    pub start_ms: i64,
    /// The end of the last round.
    pub end_ms: i64,
    pub true_per_unit: BTreeMap<String, PerUnit>,
    pub flash: Option<FlashSummary>,
    pub failure: Option<FailureSummary>,
    /// Total demand written, summed over all rounds.
    pub total_demand: f64,
}

/// Formats a Unix ms time as `YYYY-MM-DDTHH:MM:SSZ` (UTC; proleptic Gregorian).
pub fn format_utc(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

impl fmt::Display for TraceSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "rounds         {} of {} s, {} to {}",
            self.rounds,
            self.round_ms as f64 / 1000.0,
            format_utc(self.start_ms),
            format_utc(self.end_ms)
        )?;
        writeln!(f, "records        {}", self.records)?;
        let coefficients: Vec<String> = self
            .true_per_unit
            .iter()
            .map(|(k, p)| format!("{k} bps {:.3} fps {:.3}", p.bps, p.fps))
            .collect();
        writeln!(f, "true per unit  {}", coefficients.join(", "))?;
        match &self.flash {
            Some(x) => writeln!(
                f,
                "flash crowd    x{} for {} units within {} km of ({:.2}, {:.2}), {} to {}",
                x.factor,
                x.units.len(),
                x.radius_km,
                x.center.0,
                x.center.1,
                format_utc(x.from_ms),
                format_utc(x.to_ms)
            )?,
            None => writeln!(f, "flash crowd    none (trace too short)")?,
        }
        match &self.failure {
            Some(x) => write!(
                f,
                "failure        {} down {}, up {}",
                x.cluster,
                format_utc(x.down_ms),
                x.up_ms
                    .map_or_else(|| "never (after the trace)".to_string(), format_utc)
            ),
            None => write!(f, "failure        none (trace too short)"),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The model's pieces

/// The daily rhythm: the demand factor at `local_hour` (any real; taken mod 24). Lowest
/// ([`RHYTHM_LOW`]) at 04:00, highest ([`RHYTHM_HIGH`]) at 20:00, a half cosine up over the 16
/// hours between and a half cosine down over the 8 hours after; smooth (continuous derivative).
pub fn rhythm(local_hour: f64) -> f64 {
    let mid = (RHYTHM_HIGH + RHYTHM_LOW) / 2.0;
    let amp = (RHYTHM_HIGH - RHYTHM_LOW) / 2.0;
    let rise = RHYTHM_HIGH_HOUR - RHYTHM_LOW_HOUR;
    let since_low = (local_hour - RHYTHM_LOW_HOUR).rem_euclid(24.0);
    if since_low <= rise {
        mid - amp * (std::f64::consts::PI * since_low / rise).cos()
    } else {
        mid + amp * (std::f64::consts::PI * (since_low - rise) / (24.0 - rise)).cos()
    }
}

/// The nominal UTC offset of a longitude: `round(lon / 15)` hours.
pub fn utc_offset_hours(lon: f64) -> i32 {
    (lon / 15.0).round() as i32
}

/// The hour of the day UTC (fractional) at Unix ms `t`.
fn utc_hour(t: i64) -> f64 {
    t.rem_euclid(DAY_MS) as f64 / HOUR_MS as f64
}

/// Random streams, one per purpose.
mod stream {
    pub const TRUE_FACTOR: u64 = 1;
    pub const FLASH_CENTER: u64 = 2;
    pub const NOISE: u64 = 3;
}

fn rng_for(seed: u64, stream: u64) -> ChaCha8Rng {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(stream);
    rng
}

/// The true coefficients: each configured one × its own factor drawn from `params.true_factor`.
pub fn true_per_unit(instance: &Instance, params: &TraceParams) -> BTreeMap<String, PerUnit> {
    let mut rng = rng_for(params.seed, stream::TRUE_FACTOR);
    let (lo, hi) = params.true_factor;
    let mut draw = |x: f64| x * (lo + (hi - lo) * rng.random::<f64>());
    instance
        .classes()
        .iter()
        .map(|c| {
            let bps = draw(c.per_unit.bps);
            let fps = draw(c.per_unit.fps);
            (c.name.clone(), PerUnit { bps, fps })
        })
        .collect()
}

/// The `up` cluster that is the first candidate of the most demand, and that demand.
fn busiest_cluster(instance: &Instance) -> Option<(ClusterIdx, f64)> {
    let mut first = vec![0.0; instance.clusters().len()];
    for u in 0..instance.unit_count() as UnitIdx {
        if let Some(c) = instance.candidates(u).next() {
            first[c.cluster as usize] += instance.unit_demand(u);
        }
    }
    let mut best: Option<(ClusterIdx, f64)> = None;
    for (j, (c, &d)) in instance.clusters().iter().zip(&first).enumerate() {
        if c.state == ClusterState::Up && best.is_none_or(|(_, b)| d > b) {
            best = Some((j as ClusterIdx, d));
        }
    }
    best
}

fn first_choice_demand(instance: &Instance, cluster: ClusterIdx) -> f64 {
    (0..instance.unit_count() as UnitIdx)
        .filter(|&u| {
            instance
                .candidates(u)
                .next()
                .is_some_and(|c| c.cluster == cluster)
        })
        .map(|u| instance.unit_demand(u))
        .sum()
}

/// The flash crowd's centre: given, or a map unit's location drawn ∝ demand.
fn flash_center(instance: &Instance, params: &TraceParams) -> Option<(f64, f64)> {
    if params.flash_center.is_some() {
        return params.flash_center;
    }
    let n = instance.unit_count();
    if n == 0 {
        return None;
    }
    let total = instance.total_demand();
    let mut rng = rng_for(params.seed, stream::FLASH_CENTER);
    if total <= 0.0 {
        return Some(instance.unit_location(rng.random_range(0..n) as UnitIdx));
    }
    let x = rng.random::<f64>() * total;
    let mut sum = 0.0;
    let mut chosen = n - 1;
    for u in 0..n {
        sum += instance.unit_demand(u as UnitIdx);
        if sum > x {
            chosen = u;
            break;
        }
    }
    Some(instance.unit_location(chosen as UnitIdx))
}

/// A window of rounds `[from, to)`.
#[derive(Debug, Clone, Copy)]
struct Window {
    from: u64,
    to: u64,
}

/// Where an event falls: from `start_h` or the default fraction of the trace, lasting `minutes`
/// (capped at `cap` of the trace when the start is defaulted).
fn window(
    params: &TraceParams,
    start_h: Option<f64>,
    default_at: f64,
    minutes: f64,
    cap: f64,
) -> Option<Window> {
    let rounds = params.rounds();
    let len = params.rounds_in(minutes);
    match start_h {
        Some(h) => {
            let from = params.round_of(h * HOUR_MS as f64);
            (from < rounds).then_some(Window {
                from,
                to: from + len,
            })
        }
        None if rounds >= 4 => {
            let from = (rounds as f64 * default_at) as u64;
            let cap = ((rounds as f64 * cap) as u64).max(1);
            Some(Window {
                from,
                to: from + len.min(cap),
            })
        }
        None => None,
    }
}

/// Rounds `x` to [`DEMAND_DECIMALS`] places.
fn round_demand(x: f64) -> f64 {
    let scale = 10f64.powi(DEMAND_DECIMALS);
    (x * scale).round() / scale
}

/// Writes a synthetic trace of `instance` (see the module documentation) to `out`: the header,
/// then each round's state records and one demand record per map unit. Writes each round with
/// one `write_all` (give it a buffered writer anyway: the header and state records are small
/// writes). `progress` is called with the number of rounds written so far, after every round.
/// Deterministic given `instance` and `params`.
pub fn write_trace(
    instance: &Instance,
    params: &TraceParams,
    out: &mut impl Write,
    progress: &dyn Fn(u64),
) -> Result<TraceSummary> {
    params.validate()?;
    let rounds = params.rounds();

    let true_per_unit = true_per_unit(instance, params);
    let header = Header {
        round_ms: params.round_ms,
        start_ms: params.start_ms,
        true_per_unit: true_per_unit.clone(),
    };
    trace::write_header(out, &header)?;

    let failure = plan_failure(instance, params)?;
    let (flash, in_flash) = plan_flash(instance, params);
    let lines = UnitLines::new(instance)?;
    let mut writer = RoundWriter {
        instance,
        params,
        lines: &lines,
        failure: failure.as_ref(),
        flash: flash.as_ref().map(|(w, _)| *w),
        in_flash: &in_flash,
        noise_rng: rng_for(params.seed, stream::NOISE),
        records: 0,
        total_demand: 0.0,
    };
    let mut buf: Vec<u8> = Vec::with_capacity(lines.round_bytes());
    for r in 0..rounds {
        buf.clear();
        writer.write_round(r, &mut buf)?;
        out.write_all(&buf)?;
        progress(r + 1);
    }
    out.flush()?;
    let (records, total_demand) = (writer.records, writer.total_demand);

    Ok(TraceSummary {
        rounds,
        records,
        round_ms: params.round_ms,
        start_ms: params.start_ms,
        end_ms: params.round_start(rounds),
        true_per_unit,
        flash: flash.map(|(_, s)| s),
        failure: failure.map(|f| FailureSummary {
            cluster: instance.clusters()[f.cluster as usize].id.clone(),
            down_ms: params.round_start(f.down),
            up_ms: f.up.map(|up| params.round_start(up)),
            first_choice_demand: f.first_choice_demand,
        }),
        total_demand,
    })
}

/// The cluster failure to write.
struct Failure {
    cluster: ClusterIdx,
    /// The demand that ranks the cluster first (the instance's demand).
    first_choice_demand: f64,
    /// The round of the `down` record.
    down: u64,
    /// The round of the `up` record (`None`: at or after the trace's end, not written).
    up: Option<u64>,
}

/// The cluster failure (see the module documentation), if the trace has one.
fn plan_failure(instance: &Instance, params: &TraceParams) -> Result<Option<Failure>> {
    let rounds = params.rounds();
    let Some(w) = window(
        params,
        params.failure_start_h,
        0.6,
        params.failure_minutes,
        0.25,
    ) else {
        return Ok(None);
    };
    let chosen = match &params.failure_cluster {
        Some(id) => {
            let c = instance
                .cluster_index(id)
                .with_context(|| format!("failure_cluster: no cluster {id:?}"))?;
            Some((c, first_choice_demand(instance, c)))
        }
        None => busiest_cluster(instance),
    };
    Ok(chosen.map(|(cluster, first_choice_demand)| {
        // Defaulted windows end at least one round before the trace's end.
        let up = if params.failure_start_h.is_none() {
            Some(w.to.min(rounds - 1).max(w.from + 1))
        } else {
            Some(w.to)
        }
        .filter(|&up| up < rounds);
        Failure {
            cluster,
            first_choice_demand,
            down: w.from,
            up,
        }
    }))
}

/// The flash crowd (see the module documentation), if the trace has one: its window of rounds
/// and its summary; and, per map unit, whether it is in the crowd's region (all `false`
/// without one).
fn plan_flash(
    instance: &Instance,
    params: &TraceParams,
) -> (Option<(Window, FlashSummary)>, Vec<bool>) {
    let rounds = params.rounds();
    let n = instance.unit_count();
    let flash_window = window(params, params.flash_start_h, 0.4, params.flash_minutes, 0.2);
    let mut in_flash = vec![false; n];
    let flash = match (flash_window, flash_center(instance, params)) {
        (Some(w), Some(center)) => {
            let mut units = Vec::new();
            for u in 0..n as UnitIdx {
                let (lat, lon) = instance.unit_location(u);
                if distance_km(center.0, center.1, lat, lon) <= params.flash_radius_km {
                    in_flash[u as usize] = true;
                    units.push(u);
                }
            }
            let to = w.to.min(rounds);
            Some((
                Window { from: w.from, to },
                FlashSummary {
                    from_ms: params.round_start(w.from),
                    to_ms: params.round_start(to),
                    center,
                    radius_km: params.flash_radius_km,
                    factor: params.flash_factor,
                    units,
                },
            ))
        }
        _ => None,
    };
    (flash, in_flash)
}

/// What a map unit's line is the same in every round: its middle
/// (`,"map_unit":"ID","demand":`), its base demand and its time zone (an index into the
/// per-round rhythm table, offsets -12..=12 and beyond clamped).
struct UnitLines {
    middles: Vec<u8>,
    /// Unit `u`'s middle is `middles[middle_end[u]..middle_end[u + 1]]`.
    middle_end: Vec<usize>,
    zone: Vec<u8>,
    base: Vec<f64>,
}

impl UnitLines {
    fn new(instance: &Instance) -> Result<UnitLines> {
        let n = instance.unit_count();
        let mut lines = UnitLines {
            middles: Vec::new(),
            middle_end: Vec::with_capacity(n + 1),
            zone: Vec::with_capacity(n),
            base: Vec::with_capacity(n),
        };
        lines.middle_end.push(0);
        for u in 0..n as UnitIdx {
            lines.middles.extend_from_slice(b",\"map_unit\":");
            serde_json::to_writer(&mut lines.middles, instance.unit_id(u))?;
            lines.middles.extend_from_slice(b",\"demand\":");
            lines.middle_end.push(lines.middles.len());
            let (_, lon) = instance.unit_location(u);
            lines
                .zone
                .push((utc_offset_hours(lon).clamp(-12, 12) + 12) as u8);
            lines.base.push(instance.unit_demand(u));
        }
        Ok(lines)
    }

    fn middle(&self, u: usize) -> &[u8] {
        &self.middles[self.middle_end[u]..self.middle_end[u + 1]]
    }

    /// About the size of one round's lines, for the buffer's capacity.
    fn round_bytes(&self) -> usize {
        self.middles.len() + 40 * self.base.len()
    }
}

/// Writes the rounds one after the other: what stays the same between them, the noise stream
/// (one draw per map unit and round, whatever the flash crowd and the failure), and the counts
/// for the summary.
struct RoundWriter<'a> {
    instance: &'a Instance,
    params: &'a TraceParams,
    lines: &'a UnitLines,
    failure: Option<&'a Failure>,
    flash: Option<Window>,
    in_flash: &'a [bool],
    noise_rng: ChaCha8Rng,
    /// Records written so far (after the header).
    records: u64,
    /// Demand written so far, summed line by line.
    total_demand: f64,
}

impl RoundWriter<'_> {
    /// Appends round `r` to `buf`: the failure's state record if it falls in this round, then
    /// one demand record per map unit, in map unit order.
    fn write_round(&mut self, r: u64, buf: &mut Vec<u8>) -> Result<()> {
        let params = self.params;
        let t = params.round_start(r);
        if let Some(f) = self.failure {
            let to = if r == f.down {
                Some(ClusterState::Down)
            } else if Some(r) == f.up {
                Some(ClusterState::Up)
            } else {
                None
            };
            if let Some(to) = to {
                let state = StateChange {
                    cluster: self.instance.clusters()[f.cluster as usize].id.clone(),
                    to,
                };
                trace::write_record(buf, &Record::State { t, state })?;
                self.records += 1;
            }
        }
        let hour = utc_hour(t);
        let factor: [f64; 25] = std::array::from_fn(|z| rhythm(hour + z as f64 - 12.0));
        let flashing = self.flash.is_some_and(|w| (w.from..w.to).contains(&r));
        let (noise_lo, noise_span) = (1.0 - params.noise, 2.0 * params.noise);
        let mut head = b"{\"t\":".to_vec();
        serde_json::to_writer(&mut head, &t)?;
        let lines = self.lines;
        let n = lines.base.len();
        for u in 0..n {
            let noise = noise_lo + noise_span * self.noise_rng.random::<f64>();
            let mut d = lines.base[u] * factor[usize::from(lines.zone[u])] * noise;
            if flashing && self.in_flash[u] {
                d *= params.flash_factor;
            }
            let d = round_demand(d.max(0.0));
            self.total_demand += d;
            buf.extend_from_slice(&head);
            buf.extend_from_slice(lines.middle(u));
            serde_json::to_writer(&mut *buf, &d)?;
            buf.extend_from_slice(b"}\n");
        }
        self.records += n as u64;
        Ok(())
    }
}

/// Refuses a trace duration out of range before any work is done (the command line checks
/// `--trace` with it before generating the world).
pub fn check_hours(hours: f64) -> Result<()> {
    if !(hours.is_finite() && hours > 0.0 && hours <= MAX_HOURS) {
        bail!("--trace {hours}: the trace's length in hours must be > 0 and at most {MAX_HOURS} (two weeks)");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::world::{generate, WorldParams};

    fn world(map_units: usize, clusters: usize, seed: u64) -> cdnmap_topology::Topology {
        generate(
            &WorldParams {
                map_units,
                clusters,
                seed,
                ..WorldParams::default()
            },
            &|_| {},
        )
        .expect("world")
    }

    fn small() -> cdnmap_topology::Topology {
        world(300, 20, 3)
    }

    fn write(inst: &Instance, params: &TraceParams) -> (Vec<u8>, TraceSummary) {
        let mut out = Vec::new();
        let summary = write_trace(inst, params, &mut out, &|_| {}).expect("trace");
        (out, summary)
    }

    /// Unit demands by round: `demand[r][u]`.
    fn demands(inst: &Instance, records: &[Record], header: &Header) -> Vec<Vec<f64>> {
        let mut by_round: Vec<Vec<f64>> = Vec::new();
        for rec in records {
            if let Record::Unit {
                t,
                map_unit,
                demand,
            } = rec
            {
                let r = ((t - header.start_ms) / header.round_ms) as usize;
                if by_round.len() <= r {
                    by_round.resize(r + 1, vec![f64::NAN; inst.unit_count()]);
                }
                let u = inst.unit_index(map_unit).expect("known unit") as usize;
                assert!(by_round[r][u].is_nan(), "{map_unit} twice in round {r}");
                by_round[r][u] = *demand;
            }
        }
        by_round
    }

    #[test]
    fn deterministic_and_parses() {
        let inst = small();
        let params = TraceParams::new(0.5, 7);
        let (a, summary) = write(&inst, &params);
        let (b, _) = write(&inst, &params);
        assert_eq!(a, b, "same seed, same bytes");
        let (c, _) = write(&inst, &TraceParams::new(0.5, 8));
        assert_ne!(a, c, "another seed, another trace");

        assert_eq!(summary.rounds, 180);
        let (header, records) = trace::read(a.as_slice(), "t.jsonl").expect("parses");
        assert_eq!(header.round_ms, DEFAULT_ROUND_MS);
        assert_eq!(header.start_ms, DEFAULT_START_MS);
        assert_eq!(header.true_per_unit, summary.true_per_unit);
        let units = inst.unit_count() as u64;
        assert_eq!(records.len() as u64, summary.records);
        assert_eq!(
            summary.records,
            180 * units + 2,
            "units each round + down + up"
        );
        assert_eq!(summary.end_ms, DEFAULT_START_MS + 180 * DEFAULT_ROUND_MS);

        // Every map unit appears in every round, with demand >= 0.
        let by_round = demands(&inst, &records, &header);
        assert_eq!(by_round.len(), 180);
        for (r, row) in by_round.iter().enumerate() {
            for (u, &d) in row.iter().enumerate() {
                assert!(d >= 0.0, "round {r} unit {u}: {d}");
            }
        }

        // The fast line writer writes what trace::write_record would.
        let mut again = Vec::new();
        trace::write_header(&mut again, &header).unwrap();
        for r in &records {
            trace::write_record(&mut again, r).unwrap();
        }
        assert_eq!(again, a);
    }

    #[test]
    fn rhythm_shape() {
        assert!((rhythm(4.0) - RHYTHM_LOW).abs() < 1e-12);
        assert!((rhythm(20.0) - RHYTHM_HIGH).abs() < 1e-12);
        assert!((rhythm(28.0) - RHYTHM_LOW).abs() < 1e-12, "mod 24");
        assert!((rhythm(-4.0) - RHYTHM_HIGH).abs() < 1e-12, "mod 24");
        // Rising from 04:00 to 20:00, falling from 20:00 to 04:00; continuous everywhere.
        let mut prev = rhythm(0.0);
        let mut mean = 0.0;
        for minute in 1..=24 * 60 {
            let h = f64::from(minute) / 60.0;
            let x = rhythm(h);
            mean += x / (24.0 * 60.0);
            assert!((RHYTHM_LOW..=RHYTHM_HIGH).contains(&x), "{h}: {x}");
            assert!((x - prev).abs() < 0.005, "jump at {h}");
            if (4 * 60 + 1..=20 * 60).contains(&minute) {
                assert!(x > prev, "rises at {h}");
            } else {
                assert!(x < prev, "falls at {h}");
            }
            prev = x;
        }
        assert!((mean - 0.85).abs() < 1e-3, "mean {mean}");
        assert!(rhythm(12.0) < rhythm(18.0));
        assert_eq!(utc_offset_hours(0.0), 0);
        assert_eq!(utc_offset_hours(-74.0), -5);
        assert_eq!(utc_offset_hours(139.7), 9);
        assert_eq!(utc_offset_hours(-180.0), -12);
    }

    /// A day at 10-minute rounds: units near longitude 0 are busier at 20:00 UTC than at
    /// 04:00 UTC, and units at UTC+9 the other way round.
    #[test]
    fn diurnal_shape_by_time_zone() {
        let inst = world(600, 20, 5);
        let params = TraceParams {
            round_ms: 600_000,
            flash_factor: 1.0,
            ..TraceParams::new(24.0, 1)
        };
        let (bytes, summary) = write(&inst, &params);
        assert_eq!(summary.rounds, 144);
        let (header, records) = trace::read(bytes.as_slice(), "t").unwrap();
        let by_round = demands(&inst, &records, &header);
        let mean_at = |hour: usize, zone: i32| {
            let units: Vec<usize> = (0..inst.unit_count())
                .filter(|&u| utc_offset_hours(inst.unit_location(u as UnitIdx).1) == zone)
                .collect();
            assert!(units.len() >= 10, "{} units at UTC{zone:+}", units.len());
            let row = &by_round[hour * 6];
            units.iter().map(|&u| row[u]).sum::<f64>() / units.len() as f64
        };
        let (night, evening) = (mean_at(4, 0), mean_at(20, 0));
        assert!(
            evening > 2.5 * night,
            "UTC+0: {night} at 04:00, {evening} at 20:00"
        );
        // 04:00 UTC is 13:00 at UTC+9, 20:00 UTC is 05:00 there.
        let (day, early) = (mean_at(4, 9), mean_at(20, 9));
        assert!(
            day > 1.5 * early,
            "UTC+9: {day} at 04:00 UTC, {early} at 20:00 UTC"
        );
    }

    /// The flash crowd multiplies its region's demand inside its window and nothing else.
    #[test]
    fn flash_crowd() {
        let inst = small();
        let params = TraceParams::new(0.5, 7);
        let (with, summary) = write(&inst, &params);
        let (without, _) = write(
            &inst,
            &TraceParams {
                flash_factor: 1.0,
                ..params.clone()
            },
        );
        let flash = summary.flash.expect("a flash crowd");
        assert!(!flash.units.is_empty());
        assert!(
            flash.units.len() < inst.unit_count(),
            "a region, not the world"
        );
        // 40% into 30 minutes, for at most 20% of the trace (6 minutes).
        assert_eq!(flash.from_ms, DEFAULT_START_MS + 72 * DEFAULT_ROUND_MS);
        assert_eq!(flash.to_ms, DEFAULT_START_MS + 108 * DEFAULT_ROUND_MS);
        for &u in &flash.units {
            let (lat, lon) = inst.unit_location(u);
            assert!(distance_km(flash.center.0, flash.center.1, lat, lon) <= 500.0);
        }
        let (h, a) = trace::read(with.as_slice(), "a").unwrap();
        let (_, b) = trace::read(without.as_slice(), "b").unwrap();
        let (a, b) = (demands(&inst, &a, &h), demands(&inst, &b, &h));
        let mut multiplied = 0;
        for r in 0..a.len() {
            let t = DEFAULT_START_MS + r as i64 * DEFAULT_ROUND_MS;
            let inside = (flash.from_ms..flash.to_ms).contains(&t);
            for u in 0..inst.unit_count() {
                let crowd = inside && flash.units.binary_search(&(u as UnitIdx)).is_ok();
                if crowd {
                    assert!(
                        (a[r][u] - 4.0 * b[r][u]).abs() <= 4e-4,
                        "round {r} unit {u}: {} vs {}",
                        a[r][u],
                        b[r][u]
                    );
                    multiplied += 1;
                } else {
                    assert_eq!(a[r][u], b[r][u], "round {r} unit {u}");
                }
            }
        }
        assert_eq!(multiplied, 36 * flash.units.len());
    }

    /// The busiest cluster goes down, then up again, inside the trace.
    #[test]
    fn cluster_failure() {
        let inst = small();
        let (bytes, summary) = write(&inst, &TraceParams::new(0.5, 7));
        let failure = summary.failure.expect("a failure");
        let (_, records) = trace::read(bytes.as_slice(), "t").unwrap();
        let states: Vec<(i64, &StateChange)> = records
            .iter()
            .filter_map(|r| match r {
                Record::State { t, state } => Some((*t, state)),
                _ => None,
            })
            .collect();
        assert_eq!(states.len(), 2);
        assert_eq!(states[0].1.to, ClusterState::Down);
        assert_eq!(states[1].1.to, ClusterState::Up);
        assert!(states.iter().all(|s| s.1.cluster == failure.cluster));
        assert_eq!(states[0].0, failure.down_ms);
        assert_eq!(Some(states[1].0), failure.up_ms);
        assert!(states[0].0 < states[1].0);
        assert!(states[1].0 < summary.end_ms);
        // The busiest by first-choice demand.
        let chosen = inst.cluster_index(&failure.cluster).unwrap();
        for c in 0..inst.clusters().len() as ClusterIdx {
            assert!(first_choice_demand(&inst, c) <= failure.first_choice_demand + 1e-9);
        }
        assert!((first_choice_demand(&inst, chosen) - failure.first_choice_demand).abs() < 1e-9);
        // A chosen cluster and start; an up after the end is not written.
        let params = TraceParams {
            failure_cluster: Some(inst.clusters()[3].id.clone()),
            failure_start_h: Some(0.25),
            ..TraceParams::new(0.5, 7)
        };
        let (_, s) = write(&inst, &params);
        let f = s.failure.unwrap();
        assert_eq!(f.cluster, inst.clusters()[3].id);
        assert_eq!(f.down_ms, DEFAULT_START_MS + 90 * DEFAULT_ROUND_MS);
        assert_eq!(
            f.up_ms, None,
            "60 minutes from 15 minutes in is after the end"
        );
        assert_eq!(s.records, 180 * inst.unit_count() as u64 + 1);
        let bad = TraceParams {
            failure_cluster: Some("nowhere-1".into()),
            ..TraceParams::new(0.5, 7)
        };
        let mut sink = Vec::new();
        let err = write_trace(&inst, &bad, &mut sink, &|_| {}).unwrap_err();
        assert!(format!("{err:#}").contains("nowhere-1"));
    }

    #[test]
    fn true_coefficients_differ() {
        let inst = small();
        for seed in 0..20 {
            let truth = true_per_unit(&inst, &TraceParams::new(1.0, seed));
            assert_eq!(truth.len(), inst.classes().len());
            for c in inst.classes() {
                let t = truth[&c.name];
                for (got, configured) in [(t.bps, c.per_unit.bps), (t.fps, c.per_unit.fps)] {
                    let r = got / configured;
                    assert!((1.1..=1.4).contains(&r), "{}: {r}", c.name);
                }
            }
        }
        let fixed = true_per_unit(
            &inst,
            &TraceParams {
                true_factor: (1.3, 1.3),
                ..TraceParams::new(1.0, 1)
            },
        );
        for c in inst.classes() {
            assert!((fixed[&c.name].bps - 1.3 * c.per_unit.bps).abs() < 1e-12);
            assert!((fixed[&c.name].fps - 1.3 * c.per_unit.fps).abs() < 1e-12);
        }
    }

    #[test]
    fn hours_and_rounds() {
        assert_eq!(TraceParams::new(0.5, 1).rounds(), 180);
        assert_eq!(TraceParams::new(1.0, 1).rounds(), 360);
        assert_eq!(TraceParams::new(0.1, 1).rounds(), 36);
        assert_eq!(TraceParams::new(24.0, 1).rounds(), 8640);
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY, MAX_HOURS + 0.5] {
            assert!(TraceParams::new(bad, 1).validate().is_err(), "{bad}");
            assert!(check_hours(bad).is_err(), "{bad}");
        }
        assert!(TraceParams::new(MAX_HOURS, 1).validate().is_ok());
        assert!(check_hours(MAX_HOURS).is_ok());
        let err = TraceParams::new(1.0 / 3600.0 / 2.0, 1)
            .validate()
            .unwrap_err();
        assert!(err.to_string().contains("one round"), "{err}");
        // A trace of 3 rounds: no events, but every unit each round.
        let inst = small();
        let (bytes, s) = write(&inst, &TraceParams::new(30.0 / 3600.0, 1));
        assert_eq!(s.rounds, 3);
        assert!(s.flash.is_none() && s.failure.is_none());
        let (_, records) = trace::read(bytes.as_slice(), "t").unwrap();
        assert_eq!(records.len(), 3 * inst.unit_count());
        // Progress reports every round.
        let seen = std::cell::Cell::new(0);
        let mut sink = Vec::new();
        write_trace(&inst, &TraceParams::new(0.05, 1), &mut sink, &|r| {
            seen.set(r)
        })
        .unwrap();
        assert_eq!(seen.get(), 18);
    }

    #[test]
    fn utc_formatting() {
        assert_eq!(format_utc(DEFAULT_START_MS), "2025-11-30T00:00:00Z");
        assert_eq!(format_utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(
            format_utc(951_782_400_000 + 3_723_000),
            "2000-02-29T01:02:03Z"
        );
    }

    /// `cargo test -p cdnmap-world --release -- --ignored --nocapture trace_30k_timing`
    #[test]
    #[ignore]
    fn trace_30k_timing() {
        let inst = world(30_000, 120, 1);
        let t = std::time::Instant::now();
        let mut sink = std::io::sink();
        let s = write_trace(&inst, &TraceParams::new(1.0, 3), &mut sink, &|_| {}).unwrap();
        println!("{} records: {:.2?}\n{s}", s.records, t.elapsed());
    }
}
