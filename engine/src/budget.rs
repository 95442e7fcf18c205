//! What one source of feedback may send, and how much demand it may move: so that no single
//! front end (or forger) can move the map beyond what it could plausibly have seen.
//!
//! - **Budgets.** Each source (its identity, or its address when the service takes reports
//!   from anyone) has a token bucket of samples, refilled at `feedback_samples_per_sec` and
//!   holding [`BURST_SECS`] of it (a front end sends a period's counts at once), and one of
//!   bytes, [`BYTES_PER_SAMPLE`] a sample. A report past either is refused whole
//!   (RESOURCE_EXHAUSTED: the front end keeps its counts for the next period). At most
//!   [`MAX_SOURCES`] buckets are held; a full bucket is the same as none, so those go first.
//! - **Periods.** A report claims at most [`MAX_REPORT_PERIOD_MS`] (a front end's
//!   `report_secs` is at most an hour); a longer one, or one whose length overflows, is refused
//!   ([`report_period_ms`]). A report over more than a cycle (beyond the rounds' slack) counts
//!   as one cycle of its counts ([`period_weight`]): what it says of one round's period.
//! - **Bounds per round, not per sample.** What the reports of a round's period add to a unit,
//!   from every source together, is at most `feedback_max_demand_ratio` times the unit's demand
//!   in the last round (or its class's mean unit demand, when more: a unit rarely asked for
//!   may still grow); and what one source adds to one class, over all its reports, is at most
//!   [`SOURCE_CLASS_RATIO`] times the whole class's demand in the last round (a front end could
//!   have seen all of it; a round's period may hold two of its reports). Both are per cycle:
//!   a round's period of `n` cycles (`n` at least 1, at most [`MAX_PERIOD_CYCLES`]) holds `n`
//!   times as much, as the round then brings its counts to one cycle. More is clipped and
//!   counted (`cdnmap_feedback_clipped_total`); however a source splits its samples — into
//!   copies, into reports, over claimed periods — it moves no more. The [`RoundLedger`] keeps
//!   what each source has added in the round's period (one number a class, at most
//!   [`MAX_SOURCES`] sources) and what is admitted but not yet stored; the units' sums are the
//!   round's own column of observed demand. At the round, [`limit_period`] holds each unit to
//!   its bound once more, after the period is brought to a cycle (a period shorter than a
//!   cycle, the first after a start, is scaled up; a source's share of a class is not held
//!   again there, so in such a period it may reach a cycle over the period's length times it).
//!
//! Time comes in as an argument (seconds on a monotonic clock for the budgets, Unix
//! milliseconds for periods), so the arithmetic is tested without waiting.

use std::collections::HashMap;
use std::sync::Mutex;

use cdnmap_estimator::observed::UnitDemand;
use cdnmap_mapper::{ClassIdx, Instance, UnitIdx};

/// Seconds of the rate a bucket holds.
pub const BURST_SECS: f64 = 30.0;
/// Bytes of a report's encoding a sample may take on average (an id is at most 256 bytes).
pub const BYTES_PER_SAMPLE: f64 = 256.0;
/// Most sources with a bucket at once.
pub const MAX_SOURCES: usize = 10_000;

/// One source's token bucket of samples and of bytes.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    samples: f64,
    bytes: f64,
    at: f64,
}

/// Why a report was refused by its source's budget.
#[derive(Debug, Clone, PartialEq)]
pub enum Refusal {
    /// The source has spent its budget; it refills in `retry_secs`.
    Spent { retry_secs: f64 },
    /// A report larger than a whole bucket: it can never pass, at any wait.
    TooLarge,
    /// [`MAX_SOURCES`] sources are spending budgets at once.
    TooManySources,
}

/// The sources' budgets.
#[derive(Debug)]
pub struct Budgets {
    samples_per_sec: f64,
    buckets: Mutex<HashMap<String, Bucket>>,
}

impl Budgets {
    pub fn new(samples_per_sec: f64) -> Budgets {
        Budgets {
            samples_per_sec,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    fn capacity(&self) -> (f64, f64) {
        let samples = self.samples_per_sec * BURST_SECS;
        (samples, samples * BYTES_PER_SAMPLE)
    }

    /// Takes `samples` and `bytes` from `source`'s budget at time `now` (seconds), or says
    /// why not (and takes nothing).
    pub fn take(&self, source: &str, samples: f64, bytes: f64, now: f64) -> Result<(), Refusal> {
        let (cap_samples, cap_bytes) = self.capacity();
        if samples > cap_samples || bytes > cap_bytes {
            return Err(Refusal::TooLarge);
        }
        let rate = self.samples_per_sec;
        let refill = |b: &mut Bucket| {
            let dt = (now - b.at).max(0.0);
            b.samples = (b.samples + dt * rate).min(cap_samples);
            b.bytes = (b.bytes + dt * rate * BYTES_PER_SAMPLE).min(cap_bytes);
            b.at = now;
        };
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        if !buckets.contains_key(source) && buckets.len() >= MAX_SOURCES {
            // A bucket refilled to the brim is no different from no bucket.
            buckets.retain(|_, b| {
                refill(b);
                b.samples < cap_samples || b.bytes < cap_bytes
            });
            if buckets.len() >= MAX_SOURCES {
                return Err(Refusal::TooManySources);
            }
        }
        let bucket = buckets.entry(source.to_string()).or_insert(Bucket {
            samples: cap_samples,
            bytes: cap_bytes,
            at: now,
        });
        refill(bucket);
        if bucket.samples < samples || bucket.bytes < bytes {
            let short = ((samples - bucket.samples) / rate)
                .max((bytes - bucket.bytes) / (rate * BYTES_PER_SAMPLE))
                .max(0.0);
            return Err(Refusal::Spent { retry_secs: short });
        }
        bucket.samples -= samples;
        bucket.bytes -= bytes;
        Ok(())
    }
}

/// The longest period a demand report may claim: a front end reports every `report_secs`, at
/// most an hour; twice that leaves room for a late tick.
pub const MAX_REPORT_PERIOD_MS: i64 = 2 * 3_600_000;

/// The most cycles a round's period counts as, for the bounds (a round later than this —
/// ten minutes at the shortest cycle — bounds its reports as if it were this long).
pub const MAX_PERIOD_CYCLES: f64 = 60.0;

/// What one source may add to one traffic class in a round's period, per cycle, in multiples
/// of the class's whole demand in the last round: a front end sees at most all of a class's
/// clients, and a period may hold two of its reports (their ticks and the rounds' drift
/// apart).
pub const SOURCE_CLASS_RATIO: f64 = 2.0;

/// Why a report's period was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PeriodError {
    #[error("period_end_unix_ms: before period_start_unix_ms")]
    EndsBeforeStart,
    #[error(
        "period_end_unix_ms - period_start_unix_ms: {}, more than the {MAX_REPORT_PERIOD_MS} ms a report may cover",
        .ms.map_or_else(|| "more ms than an i64 holds".to_string(), |m| format!("{m} ms"))
    )]
    TooLong { ms: Option<i64> },
}

/// The length of a report's period, `end_ms - start_ms`: refused when it ends before it
/// starts, or is longer than [`MAX_REPORT_PERIOD_MS`] (or than any i64).
pub fn report_period_ms(start_ms: i64, end_ms: i64) -> Result<i64, PeriodError> {
    if end_ms < start_ms {
        return Err(PeriodError::EndsBeforeStart);
    }
    match end_ms.checked_sub(start_ms) {
        Some(ms) if ms <= MAX_REPORT_PERIOD_MS => Ok(ms),
        ms => Err(PeriodError::TooLong { ms }),
    }
}

/// What a report's counts over `period_ms` weigh in a round: all of them over a cycle of
/// `cycle_ms` or less (within `slack`, as the rounds count their own periods; a front end
/// reporting more often sends several a round), one cycle's share of them over a longer
/// period.
pub fn period_weight(period_ms: i64, cycle_ms: i64, slack: f64) -> f64 {
    let (period, cycle) = (period_ms as f64, cycle_ms as f64);
    if period <= cycle * (1.0 + slack) {
        1.0
    } else {
        cycle / period
    }
}

/// How many cycles a round's period that began at `since_ms` holds at `now_ms`: at least one,
/// at most [`MAX_PERIOD_CYCLES`] (and one when the clock went back).
pub fn period_cycles(since_ms: i64, now_ms: i64, cycle_ms: i64) -> f64 {
    let elapsed = now_ms.saturating_sub(since_ms) as f64;
    (elapsed / cycle_ms.max(1) as f64).clamp(1.0, MAX_PERIOD_CYCLES)
}

/// Each class's demand in one round: the sum and the mean over its map units, by class index.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ClassDemand {
    pub totals: Vec<f64>,
    pub means: Vec<f64>,
}

impl ClassDemand {
    pub fn of(instance: &Instance) -> ClassDemand {
        let classes = instance.classes().len();
        let mut totals = vec![0.0f64; classes];
        let mut count = vec![0u64; classes];
        for u in 0..instance.unit_count() as UnitIdx {
            let k = usize::from(instance.unit_class(u));
            totals[k] += instance.unit_demand(u);
            count[k] += 1;
        }
        let means = totals
            .iter()
            .zip(&count)
            .map(|(s, &n)| if n == 0 { 0.0 } else { s / n as f64 })
            .collect();
        ClassDemand { totals, means }
    }
}

/// The bounds of one round's period, in counts: `ratio` (`feedback_max_demand_ratio`), the
/// period's length in cycles ([`period_cycles`]) and the last round's demand by class.
#[derive(Debug, Clone, Copy)]
pub struct Bounds<'a> {
    pub ratio: f64,
    pub cycles: f64,
    pub classes: &'a ClassDemand,
}

impl Bounds<'_> {
    /// The most a unit of class `class` whose demand in the last round was `unit_demand` may
    /// be given, from every source together. Never more than `f64::MAX`.
    pub fn unit(&self, unit_demand: f64, class: ClassIdx) -> f64 {
        let mean = self.classes.means.get(usize::from(class)).copied();
        let reference = unit_demand.max(mean.unwrap_or(0.0));
        finite(self.ratio * reference * self.cycles)
    }

    /// The most one source may give class `class`.
    pub fn class(&self, class: ClassIdx) -> f64 {
        let total = self.classes.totals.get(usize::from(class)).copied();
        finite(SOURCE_CLASS_RATIO * total.unwrap_or(0.0) * self.cycles)
    }
}

/// `x`, with +∞ (a product past f64's range) as `f64::MAX` and NaN as 0.
fn finite(x: f64) -> f64 {
    if x.is_nan() {
        0.0
    } else {
        x.min(f64::MAX)
    }
}

/// One demand sample, as the bounds see it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ask {
    /// The unit it adds to (index of the round's column), if any: a prefix no unit of the map
    /// covers is recorded and adds to nothing.
    pub unit: Option<UnitIdx>,
    /// The unit's demand in the last round (0 for a unit that round did not have) and its
    /// class there; `None`: the class is not in the last round either, and the sample may add
    /// nothing.
    pub reference: Option<(f64, ClassIdx)>,
    /// Its queries (a finite number >= 0), weighed by its report's period.
    pub queries: f64,
}

/// What [`RoundLedger::admit`] admitted of a report.
#[derive(Debug, Clone, PartialEq)]
pub struct Admitted {
    /// To settle with [`RoundLedger::settle`] once the report is stored (or is not).
    pub ticket: u64,
    /// Each sample's queries as admitted (what is recorded and what the round adds).
    pub queries: Vec<f64>,
    /// How many samples were clipped.
    pub clipped: usize,
}

/// A report admitted and not yet settled: what it adds to which units, and what it charged its
/// source's classes.
#[derive(Debug, Clone)]
struct Held {
    source: String,
    units: Vec<(UnitIdx, f64)>,
    classes: Vec<(ClassIdx, f64)>,
}

/// What the sources have added in one round's period ([`Bounds`]): by source, its demand by
/// class; by unit, the demand admitted and not yet stored (what is stored is in the round's
/// column of observed demand, which the caller reads for [`RoundLedger::admit`]).
#[derive(Debug, Clone, Default)]
pub struct RoundLedger {
    sources: HashMap<String, Vec<f64>>,
    /// Unit → (queries held, how many reports hold some).
    in_flight: HashMap<UnitIdx, (f64, u32)>,
    held: HashMap<u64, Held>,
    next_ticket: u64,
}

impl RoundLedger {
    /// Admits what `source`'s report `asks` may add within `bounds`, given what each unit has
    /// been given and stored in this period (`stored`): each sample's queries, clipped where
    /// the unit's bound is reached (by earlier samples, reports or sources), then every sample
    /// of a class scaled alike where the source's bound for the class is reached. What it
    /// admits is held (counted against the bounds) until [`RoundLedger::settle`]. Refused
    /// (nothing held) when [`MAX_SOURCES`] other sources have reported in this period.
    pub fn admit(
        &mut self,
        source: &str,
        asks: &[Ask],
        bounds: &Bounds<'_>,
        stored: impl Fn(UnitIdx) -> f64,
    ) -> Result<Admitted, Refusal> {
        let adds = asks.iter().any(|a| a.unit.is_some());
        if adds && !self.sources.contains_key(source) && self.sources.len() >= MAX_SOURCES {
            return Err(Refusal::TooManySources);
        }
        // Each unit's bound, over what it has been given (stored, held, earlier samples).
        let mut given: HashMap<UnitIdx, f64> = HashMap::new();
        let mut queries: Vec<f64> = Vec::with_capacity(asks.len());
        for a in asks {
            let q = a.queries.max(0.0);
            let admitted = match (a.unit, a.reference) {
                (None, _) => q,
                (Some(_), None) => 0.0,
                (Some(u), Some((demand, class))) => {
                    let so_far = given
                        .entry(u)
                        .or_insert_with(|| stored(u) + self.in_flight.get(&u).map_or(0.0, |h| h.0));
                    let room = (bounds.unit(demand, class) - *so_far).max(0.0);
                    let admitted = q.min(room);
                    *so_far += admitted;
                    admitted
                }
            };
            queries.push(admitted);
        }
        // The source's bound by class, over what it gave in this period.
        let spent = self.sources.get(source);
        let mut classes: Vec<(ClassIdx, f64)> = Vec::new();
        for (a, &q) in asks.iter().zip(&queries) {
            if let (Some(_), Some((_, k))) = (a.unit, a.reference) {
                match classes.iter_mut().find(|c| c.0 == k) {
                    Some(c) => c.1 += q,
                    None => classes.push((k, q)),
                }
            }
        }
        for (k, sum) in classes.iter_mut() {
            let before = spent.and_then(|s| s.get(usize::from(*k))).copied();
            let room = (bounds.class(*k) - before.unwrap_or(0.0)).max(0.0);
            if *sum > room {
                let scale = room / *sum;
                for (a, q) in asks.iter().zip(queries.iter_mut()) {
                    if a.unit.is_some() && a.reference.map(|r| r.1) == Some(*k) {
                        *q *= scale;
                    }
                }
                *sum = room;
            }
        }
        let clipped = asks
            .iter()
            .zip(&queries)
            .filter(|(a, &q)| q < a.queries)
            .count();
        let mut units: Vec<(UnitIdx, f64)> = Vec::new();
        for (a, &q) in asks.iter().zip(&queries) {
            if let (Some(u), Some(_)) = (a.unit, a.reference) {
                units.push((u, q));
            }
        }
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        let held = Held {
            source: source.to_string(),
            units,
            classes,
        };
        if adds {
            self.hold(&held);
            self.held.insert(ticket, held);
        }
        Ok(Admitted {
            ticket,
            queries,
            clipped,
        })
    }

    /// Counts `held` against the bounds.
    fn hold(&mut self, held: &Held) {
        let spent = self.sources.entry(held.source.clone()).or_default();
        for &(k, q) in &held.classes {
            let k = usize::from(k);
            if spent.len() <= k {
                spent.resize(k + 1, 0.0);
            }
            spent[k] += q;
        }
        for &(u, q) in &held.units {
            let h = self.in_flight.entry(u).or_insert((0.0, 0));
            h.0 += q;
            h.1 += 1;
        }
    }

    /// Settles the report of `ticket`: no longer held. When it was `stored`, what it adds to
    /// each unit is returned (the caller adds it to the round's column: from then on it is
    /// `stored` to [`RoundLedger::admit`]), and its source keeps the charge; when it was not,
    /// its source's charge is given back. A ticket settled already returns nothing.
    pub fn settle(&mut self, ticket: u64, stored: bool) -> Vec<(UnitIdx, f64)> {
        let Some(held) = self.held.remove(&ticket) else {
            return Vec::new();
        };
        for &(u, q) in &held.units {
            if let Some(h) = self.in_flight.get_mut(&u) {
                h.0 -= q;
                h.1 -= 1;
                if h.1 == 0 {
                    self.in_flight.remove(&u);
                }
            }
        }
        if stored {
            return held.units;
        }
        if let Some(spent) = self.sources.get_mut(&held.source) {
            for &(k, q) in &held.classes {
                if let Some(s) = spent.get_mut(usize::from(k)) {
                    *s = (*s - q).max(0.0);
                }
            }
        }
        Vec::new()
    }

    /// The ledger of the next round's period: the reports still held (admitted, not yet
    /// stored) are added to that round, so they count against its bounds.
    pub fn next_period(&self) -> RoundLedger {
        let mut next = RoundLedger {
            next_ticket: self.next_ticket,
            ..RoundLedger::default()
        };
        for (&ticket, held) in &self.held {
            next.hold(held);
            next.held.insert(ticket, held.clone());
        }
        next
    }

    /// How many sources reported in this period.
    pub fn sources(&self) -> usize {
        self.sources.len()
    }
}

/// Holds each unit of `demand` (a round's observed demand, brought to one cycle) to
/// `ratio` times its demand in the last round, `reference`, or its class's mean there
/// (`classes`), when more: the bound [`RoundLedger::admit`] held the period's reports to, once
/// more after a period shorter than a cycle was scaled up. A unit `reference` does not have
/// keeps what it has. Returns how many units were clipped.
pub fn limit_period(
    demand: &mut UnitDemand,
    reference: &Instance,
    classes: &ClassDemand,
    ratio: f64,
) -> usize {
    let bounds = Bounds {
        ratio,
        cycles: 1.0,
        classes,
    };
    let Some(units) = demand.units().cloned() else {
        return 0;
    };
    let same = units.same_unit_ids(reference);
    demand.limit(|u| {
        let r = if same {
            Some(u)
        } else {
            reference.unit_index(units.unit_id(u))
        };
        r.map_or(f64::INFINITY, |r| {
            bounds.unit(reference.unit_demand(r), reference.unit_class(r))
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use cdnmap_topology::format::parse_instance;
    use cdnmap_topology::Topology;

    /// Four clusters, 60 units of demand 2 over 10.0.x.0/24 in three classes.
    fn instance() -> Topology {
        let clusters: Vec<String> = (0..4)
            .map(|c| {
                format!(
                    r#"{{"id": "c{c}", "lat": 0, "lon": 0, "addresses": ["198.18.{c}.1"],
                      "resources": {{"name": "r", "kind": "bps", "capacity": 40,
                                     "classes": ["web", "video", "apps"]}}}}"#
                )
            })
            .collect();
        let units: Vec<String> = (0..60)
            .map(|u| {
                let class = ["web", "video", "apps"][u % 3];
                format!(
                    r#"{{"id": "u{u:02}", "class": "{class}", "demand": 2, "prefixes": ["10.0.{u}.0/24"],
                      "lat": 0, "lon": 0, "candidates": [{{"cluster": "c{}", "score": 1}}]}}"#,
                    u % 4
                )
            })
            .collect();
        let json = format!(
            r#"{{"traffic_classes": [
                {{"name": "web", "priority": 0, "per_unit": {{"bps": 1, "fps": 0}}}},
                {{"name": "video", "priority": 1, "per_unit": {{"bps": 1, "fps": 0}}}},
                {{"name": "apps", "priority": 2, "per_unit": {{"bps": 1, "fps": 0}}}}],
              "clusters": [{}], "map_units": [{}]}}"#,
            clusters.join(","),
            units.join(",")
        );
        parse_instance(json.as_bytes(), cdnmap_mapper::Limits::default()).expect("valid")
    }

    #[test]
    fn a_bucket_holds_its_burst_and_refills_at_its_rate() {
        let b = Budgets::new(100.0); // 3,000 samples a bucket
        assert_eq!(b.take("fe", 3000.0, 0.0, 0.0), Ok(()));
        match b.take("fe", 100.0, 0.0, 0.0) {
            Err(Refusal::Spent { retry_secs }) => assert!((retry_secs - 1.0).abs() < 1e-9),
            other => panic!("{other:?}"),
        }
        // A refused report takes nothing: after one second, exactly 100 are back.
        assert_eq!(b.take("fe", 100.0, 0.0, 1.0), Ok(()));
        assert!(b.take("fe", 1.0, 0.0, 1.0).is_err());
        // Another source has its own bucket.
        assert_eq!(b.take("other", 3000.0, 0.0, 1.0), Ok(()));
        // Refilled, never past the brim.
        assert_eq!(b.take("fe", 3000.0, 0.0, 1000.0), Ok(()));
        assert!(b.take("fe", 1.0, 0.0, 1000.0).is_err());
        // Larger than a bucket: never.
        assert_eq!(b.take("new", 3001.0, 0.0, 0.0), Err(Refusal::TooLarge));
        // Bytes are a budget too.
        let cap_bytes = 3000.0 * BYTES_PER_SAMPLE;
        assert_eq!(b.take("bytes", 1.0, cap_bytes, 0.0), Ok(()));
        assert!(matches!(
            b.take("bytes", 1.0, 1.0, 0.0),
            Err(Refusal::Spent { .. })
        ));
    }

    #[test]
    fn sources_are_bounded_and_full_buckets_make_room() {
        let b = Budgets::new(1.0);
        for i in 0..MAX_SOURCES {
            assert_eq!(b.take(&format!("s{i}"), 1.0, 0.0, 0.0), Ok(()));
        }
        assert_eq!(
            b.take("one-more", 1.0, 0.0, 0.0),
            Err(Refusal::TooManySources)
        );
        // Once the others have refilled, their buckets go and the newcomer gets one.
        assert_eq!(b.take("one-more", 1.0, 0.0, 10.0), Ok(()));
    }

    #[test]
    fn a_period_is_bounded_and_never_overflows() {
        const YEAR_MS: i64 = 365 * 86_400_000;
        let end = 1_800_000_000_000i64;
        assert_eq!(report_period_ms(end - 10_000, end), Ok(10_000));
        assert_eq!(report_period_ms(end, end), Ok(0));
        assert_eq!(
            report_period_ms(end - MAX_REPORT_PERIOD_MS, end),
            Ok(MAX_REPORT_PERIOD_MS)
        );
        assert_eq!(
            report_period_ms(end - MAX_REPORT_PERIOD_MS - 1, end),
            Err(PeriodError::TooLong {
                ms: Some(MAX_REPORT_PERIOD_MS + 1)
            })
        );
        assert_eq!(
            report_period_ms(end - YEAR_MS, end),
            Err(PeriodError::TooLong { ms: Some(YEAR_MS) })
        );
        assert_eq!(
            report_period_ms(end, end - 1),
            Err(PeriodError::EndsBeforeStart)
        );
        // Longer than an i64: refused, not wrapped to a short (or negative) period.
        for (start, end) in [(i64::MIN, i64::MAX), (i64::MIN, 1), (-1, i64::MAX)] {
            assert_eq!(
                report_period_ms(start, end),
                Err(PeriodError::TooLong { ms: None }),
                "{start}..{end}"
            );
        }
        assert_eq!(
            PeriodError::TooLong { ms: None }.to_string(),
            "period_end_unix_ms - period_start_unix_ms: more ms than an i64 holds, more than \
             the 7200000 ms a report may cover"
        );
    }

    #[test]
    fn a_long_period_counts_as_one_cycle_of_it() {
        let w = |period_ms| period_weight(period_ms, 10_000, 0.1);
        assert_eq!(w(10_000), 1.0);
        assert_eq!(w(10_900), 1.0, "within the slack");
        assert_eq!(
            w(1_000),
            1.0,
            "a front end reporting each second sends ten a round"
        );
        assert_eq!(w(0), 1.0);
        assert_eq!(w(20_000), 0.5);
        assert!((w(MAX_REPORT_PERIOD_MS) - 10.0 / 7_200.0).abs() < 1e-12);
    }

    #[test]
    fn a_rounds_period_is_one_cycle_or_more_within_a_limit() {
        assert_eq!(period_cycles(0, 10_000, 10_000), 1.0);
        assert_eq!(period_cycles(0, 3_000, 10_000), 1.0, "at least a cycle");
        assert_eq!(period_cycles(0, 25_000, 10_000), 2.5);
        assert_eq!(period_cycles(10_000, 0, 10_000), 1.0, "the clock went back");
        assert_eq!(period_cycles(i64::MIN, i64::MAX, 10_000), MAX_PERIOD_CYCLES);
        assert_eq!(period_cycles(i64::MAX, i64::MIN, 10_000), 1.0);
    }

    /// Class 0: 10 units of demand 5 (total 50, mean 5); class 1: total 1,000, mean 100.
    fn classes() -> ClassDemand {
        ClassDemand {
            totals: vec![50.0, 1_000.0],
            means: vec![5.0, 100.0],
        }
    }

    fn bounds(classes: &ClassDemand, cycles: f64) -> Bounds<'_> {
        Bounds {
            ratio: 10.0,
            cycles,
            classes,
        }
    }

    fn ask(unit: UnitIdx, demand: f64, class: ClassIdx, queries: f64) -> Ask {
        Ask {
            unit: Some(unit),
            reference: Some((demand, class)),
            queries,
        }
    }

    #[test]
    fn the_bounds_follow_the_unit_its_class_and_the_period() {
        let c = classes();
        let b = bounds(&c, 1.0);
        assert_eq!(b.unit(50.0, 0), 500.0);
        assert_eq!(b.unit(0.0, 0), 50.0, "the class's mean, when more");
        assert_eq!(b.unit(1.0, 7), 10.0, "a class with no mean");
        assert_eq!(b.class(0), 2.0 * 50.0);
        assert_eq!(b.class(7), 0.0);
        let b = bounds(&c, 2.5);
        assert_eq!(b.unit(50.0, 0), 1_250.0);
        assert_eq!(b.class(1), 5_000.0);
        // Past f64's range: the largest finite bound, never +inf or NaN.
        let huge = ClassDemand {
            totals: vec![f64::MAX],
            means: vec![1e308],
        };
        let b = Bounds {
            ratio: 1e6,
            cycles: MAX_PERIOD_CYCLES,
            classes: &huge,
        };
        assert_eq!(b.unit(1e308, 0), f64::MAX);
        assert_eq!(b.class(0), f64::MAX);
    }

    #[test]
    fn honest_reports_pass_whole() {
        let c = classes();
        let b = bounds(&c, 1.0);
        let mut l = RoundLedger::default();
        // Three front ends, each seeing a third of unit 0's demand (5) and of unit 1's, and
        // a unit grown fivefold.
        let mut column = [0.0f64; 3];
        for source in ["fe-1", "fe-2", "fe-3"] {
            let asks = [ask(0, 5.0, 0, 5.0 / 3.0), ask(1, 5.0, 0, 25.0 / 3.0)];
            let a = l
                .admit(source, &asks, &b, |u| column[u as usize])
                .expect("admitted");
            assert_eq!(a.queries, vec![5.0 / 3.0, 25.0 / 3.0]);
            assert_eq!(a.clipped, 0);
            for (u, q) in l.settle(a.ticket, true) {
                column[u as usize] += q;
            }
        }
        assert!((column[0] - 5.0).abs() < 1e-9 && (column[1] - 25.0).abs() < 1e-9);
        // A prefix no unit covers is recorded whole and adds to nothing.
        let none = Ask {
            unit: None,
            reference: None,
            queries: 1e9,
        };
        let a = l.admit("fe-1", &[none], &b, |_| 0.0).expect("admitted");
        assert_eq!((a.queries, a.clipped), (vec![1e9], 0));
        assert!(l.settle(a.ticket, true).is_empty());
    }

    /// The audit's repetition: copies of one sample in a report, the same report again and
    /// again, from one source or several — a unit is given its bound once.
    #[test]
    fn copies_reports_and_sources_share_one_units_bound() {
        let c = classes();
        let b = bounds(&c, 1.0);
        let mut l = RoundLedger::default();
        let copies = vec![ask(3, 5.0, 0, 50.0); 1_000];
        let a = l.admit("fe", &copies, &b, |_| 0.0).expect("admitted");
        assert_eq!(a.queries[0], 50.0);
        assert!(a.queries[1..].iter().all(|&q| q == 0.0));
        assert_eq!(a.clipped, 999);
        // Held (not yet stored), it counts: another report, or another source, gets nothing.
        let again = l.admit("fe", &copies[..1], &b, |_| 0.0).expect("admitted");
        assert_eq!(again.queries, vec![0.0]);
        let other = l
            .admit("fe-2", &copies[..1], &b, |_| 0.0)
            .expect("admitted");
        assert_eq!(other.queries, vec![0.0]);
        // Stored, it counts as the column's.
        let added = l.settle(a.ticket, true);
        assert_eq!(added.iter().map(|x| x.1).sum::<f64>(), 50.0);
        let later = l.admit(
            "fe-3",
            &copies[..1],
            &b,
            |u| if u == 3 { 50.0 } else { 0.0 },
        );
        assert_eq!(later.expect("admitted").queries, vec![0.0]);
        // 1e308 queries: clipped to the bound, nothing infinite.
        let mut l = RoundLedger::default();
        let a = l
            .admit("fe", &[ask(4, 5.0, 0, 1e308)], &b, |_| 0.0)
            .expect("admitted");
        assert_eq!(a.queries, vec![50.0]);
    }

    /// What one source may give a class over its reports: twice the class's demand, every
    /// sample of the class scaled alike; each source has its own.
    #[test]
    fn a_source_gives_a_class_at_most_its_share_over_all_its_reports() {
        let c = classes();
        let b = bounds(&c, 1.0);
        let mut l = RoundLedger::default();
        // Ten times every unit of class 0 (ten units of 5): 500 asked, 100 the source's bound.
        let every: Vec<Ask> = (0..10).map(|u| ask(u, 5.0, 0, 50.0)).collect();
        let a = l.admit("fe", &every, &b, |_| 0.0).expect("admitted");
        assert!(a.queries.iter().all(|&q| (q - 10.0).abs() < 1e-9), "{a:?}");
        assert_eq!(a.clipped, 10);
        l.settle(a.ticket, true);
        // The same report again, or split into reports of one sample: nothing more.
        for one in every.chunks(1) {
            let b2 = l.admit("fe", one, &b, |_| 10.0).expect("admitted");
            assert_eq!(b2.queries, vec![0.0]);
        }
        // Another class is another bound; another source has its own share of the class (but
        // the units' bounds are shared).
        let a = l.admit("fe", &[ask(20, 100.0, 1, 500.0)], &b, |_| 0.0);
        assert_eq!(a.expect("admitted").queries, vec![500.0]);
        let a = l
            .admit("fe-2", &every[..2], &b, |_| 10.0)
            .expect("admitted");
        assert_eq!(a.queries, vec![40.0, 40.0]);
        // Over a period of two cycles, twice as much.
        let b = bounds(&c, 2.0);
        let mut l = RoundLedger::default();
        let a = l.admit("fe", &every, &b, |_| 0.0).expect("admitted");
        assert!(a.queries.iter().all(|&q| (q - 20.0).abs() < 1e-9), "{a:?}");
    }

    #[test]
    fn a_report_not_stored_gives_back_what_it_held() {
        let c = classes();
        let b = bounds(&c, 1.0);
        let mut l = RoundLedger::default();
        let a = l
            .admit("fe", &[ask(0, 5.0, 0, 50.0)], &b, |_| 0.0)
            .expect("admitted");
        assert!(l.settle(a.ticket, false).is_empty());
        assert!(l.settle(a.ticket, true).is_empty(), "settled once");
        let again = l
            .admit("fe", &[ask(0, 5.0, 0, 50.0)], &b, |_| 0.0)
            .expect("admitted");
        assert_eq!(again.queries, vec![50.0]);
        // A unit the last round's classes do not have may be given nothing.
        let stray = Ask {
            unit: Some(9),
            reference: None,
            queries: 1.0,
        };
        assert_eq!(
            l.admit("fe", &[stray], &b, |_| 0.0)
                .expect("admitted")
                .queries,
            vec![0.0]
        );
    }

    /// A report admitted in one round's period and stored in the next counts in the next.
    #[test]
    fn reports_held_across_a_round_count_in_the_next_period() {
        let c = classes();
        let b = bounds(&c, 1.0);
        let mut l = RoundLedger::default();
        let a = l
            .admit("fe", &[ask(0, 5.0, 0, 50.0)], &b, |_| 0.0)
            .expect("admitted");
        let done = l
            .admit("fe", &[ask(1, 5.0, 0, 20.0)], &b, |_| 0.0)
            .expect("admitted");
        l.settle(done.ticket, true);
        let mut next = l.next_period();
        assert_eq!(next.sources(), 1);
        let b2 = next
            .admit("fe-2", &[ask(0, 5.0, 0, 50.0)], &b, |_| 0.0)
            .expect("admitted");
        assert_eq!(b2.queries, vec![0.0], "unit 0's bound is held by the first");
        let mine = next
            .admit("fe", &[ask(2, 5.0, 0, 100.0)], &b, |_| 0.0)
            .expect("admitted");
        assert_eq!(
            mine.queries,
            vec![50.0],
            "fe's share of class 0 has 50 in it"
        );
        assert_eq!(next.settle(a.ticket, true), vec![(0, 50.0)]);
    }

    #[test]
    fn a_period_takes_at_most_max_sources() {
        let c = classes();
        let b = bounds(&c, 1.0);
        let mut l = RoundLedger::default();
        for i in 0..MAX_SOURCES {
            let a = l.admit(&format!("s{i}"), &[ask(0, 5.0, 0, 0.0)], &b, |_| 0.0);
            assert!(a.is_ok());
        }
        let one_more = l.admit("one-more", &[ask(0, 5.0, 0, 1.0)], &b, |_| 0.0);
        assert_eq!(one_more, Err(Refusal::TooManySources));
        // A source already in, or a report adding to no unit, still passes.
        assert!(l.admit("s0", &[ask(0, 5.0, 0, 1.0)], &b, |_| 0.0).is_ok());
        let none = Ask {
            unit: None,
            reference: None,
            queries: 1.0,
        };
        assert!(l.admit("one-more", &[none], &b, |_| 0.0).is_ok());
        // Reports still held carry their sources into the next period; stored, they do not.
        assert_eq!(l.next_period().sources(), MAX_SOURCES);
        let tickets: Vec<u64> = l.held.keys().copied().collect();
        for t in tickets {
            l.settle(t, true);
        }
        assert_eq!(l.next_period().sources(), 0);
    }

    /// At the round, after a short period was scaled up: each unit at most its bound, matched
    /// by id when the column's units are another topology's.
    #[test]
    fn a_rounds_demand_is_held_to_the_units_bounds() {
        let inst = instance(); // 60 units of 2, three classes
        let classes = ClassDemand::of(&inst);
        assert_eq!(classes.totals, vec![40.0, 40.0, 40.0]);
        assert_eq!(classes.means, vec![2.0, 2.0, 2.0]);
        let mut d = UnitDemand::new(&inst);
        d.add(0, 19.0);
        d.add(1, 21.0);
        d.add(2, 1e308);
        assert_eq!(limit_period(&mut d, &inst, &classes, 10.0), 2);
        assert_eq!(
            (d.get(0), d.get(1), d.get(2), d.get(3)),
            (Some(19.0), Some(20.0), Some(20.0), None)
        );
        // The reference without unit u00: the column's other units are still matched.
        let fewer = instance()
            .with_units_edited(&[], &["u00"], cdnmap_mapper::Limits::default())
            .expect("an edit");
        let mut d = UnitDemand::new(&inst);
        d.add(0, 1e6);
        d.add(1, 1e6);
        assert_eq!(
            limit_period(&mut d, &fewer, &ClassDemand::of(&fewer), 10.0),
            1
        );
        assert_eq!((d.get(0), d.get(1)), (Some(1e6), Some(20.0)));
    }
}
