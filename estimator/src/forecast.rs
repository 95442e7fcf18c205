//! Demand forecasting per map unit: exponential smoothing of a level and a trend with a daily
//! seasonal profile (Holt–Winters, multiplicative season), robust to gaps and to one-round
//! spikes, with a floor for units that went quiet.
//!
//! - **Season.** A day is cut into [`SEASON_BUCKETS`] buckets; each holds a factor (demand at
//!   that time of day over the level), learned as the series goes. The clock is passed in (the
//!   observation's time), never read.
//! - **Spikes.** The innovation (observation minus forecast) is clipped at [`SPIKE_SIGMAS`] times
//!   the running mean absolute error before it updates anything, so one wild round moves the
//!   forecast by a bounded fraction of itself; a level shift that persists is followed within a
//!   few rounds, as each round's clipped step adds up.
//! - **Gaps.** Missing rounds are simply not observed; the trend carries the level across them.
//! - **Floor.** A forecast is never below [`ForecastConfig::floor`] (a unit that went quiet keeps
//!   a little room on the map, so its first clients back are placed where they were).

/// Buckets per day of the seasonal profile.
pub const SEASON_BUCKETS: usize = 48;
const DAY_MS: i64 = 24 * 3600 * 1000;
/// Innovations beyond this many mean absolute errors are clipped.
pub const SPIKE_SIGMAS: f64 = 3.0;

/// Smoothing constants, per round.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ForecastConfig {
    /// Level smoothing (0..1).
    pub alpha: f64,
    /// Trend smoothing (0..1).
    pub beta: f64,
    /// Seasonal smoothing (0..1), applied to the bucket an observation falls in.
    pub gamma: f64,
    /// Error smoothing for the spike threshold (0..1).
    pub error_alpha: f64,
    /// The smallest forecast.
    pub floor: f64,
}

impl Default for ForecastConfig {
    fn default() -> Self {
        ForecastConfig {
            alpha: 0.1,
            beta: 0.01,
            gamma: 0.05,
            error_alpha: 0.05,
            floor: 0.01,
        }
    }
}

/// The state of one map unit's forecast: 128 bytes (a service at 11 M map units keeps one per
/// unit, and checkpoints them all). The level is an `f64`, so a steady demand is forecast
/// exactly as reported (a map planned for a demand rounded down overloads its clusters by
/// the rounding); trend and error are `f32` and the seasonal factors [`Factor`]s; arithmetic
/// is in `f64`.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Forecaster {
    level: f64,
    /// Change of the level per millisecond.
    trend: f32,
    /// Running mean absolute error, for the spike threshold.
    error: f32,
    /// Observations taken (saturating).
    observations: u32,
    /// The time of the last observation (meaningless while `observations` is 0).
    last_ms: i64,
    #[serde(with = "season_serde")]
    season: [Factor; SEASON_BUCKETS],
}

/// A seasonal factor in two bytes: its base-2 logarithm in [`Factor::STEPS`]ths of an octave,
/// offset so that 1.0 is [`Factor::ONE`]. Factors from 2^-8 to just under 2^8 are kept
/// (others are clamped), each to 0.017% of itself: finer than any season a round's noise
/// lets one learn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Factor(u16);

impl Factor {
    const ONE: Factor = Factor(1 << 15);
    const STEPS: f64 = 4096.0;

    /// The factor nearest `x` (the smallest for 0, a negative number or NaN).
    pub fn of(x: f64) -> Factor {
        let q = (x.max(f64::MIN_POSITIVE).log2() * Self::STEPS + f64::from(Self::ONE.0)).round();
        Factor(q.clamp(0.0, f64::from(u16::MAX)) as u16)
    }

    pub fn get(self) -> f64 {
        FACTORS[usize::from(self.0)]
    }

    /// The factor's value computed (what [`FACTORS`] holds for it).
    fn compute(self) -> f64 {
        ((f64::from(self.0) - f64::from(Self::ONE.0)) / Self::STEPS).exp2()
    }
}

/// Every factor's value, by its bits (512 KiB): a forecast reads one where computing it took an
/// `exp2` (at 11 M map units, a sixth of the estimator's step each round).
static FACTORS: std::sync::LazyLock<Box<[f64]>> =
    std::sync::LazyLock::new(|| (0..=u16::MAX).map(|b| Factor(b).compute()).collect());

/// `x` as an `f32`, saturating at the largest finite one (no forecast becomes infinite).
fn narrow(x: f64) -> f32 {
    x.clamp(-f64::from(f32::MAX), f64::from(f32::MAX)) as f32
}

/// The seasonal profile as bytes (two a bucket, little-endian): serde derives arrays of at
/// most 32 only, and a list of numbers would cost a length and a varint each. A stored profile
/// of another length is refused.
mod season_serde {
    use super::{Factor, SEASON_BUCKETS};
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(
        season: &[Factor; SEASON_BUCKETS],
        s: S,
    ) -> Result<S::Ok, S::Error> {
        let mut bytes = [0u8; 2 * SEASON_BUCKETS];
        for (b, f) in bytes.chunks_exact_mut(2).zip(season) {
            b.copy_from_slice(&f.0.to_le_bytes());
        }
        s.serialize_bytes(&bytes)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<[Factor; SEASON_BUCKETS], D::Error> {
        let bytes = <&[u8]>::deserialize(d)?;
        if bytes.len() != 2 * SEASON_BUCKETS {
            return Err(serde::de::Error::custom(format!(
                "a season of {} bytes, not {}",
                bytes.len(),
                2 * SEASON_BUCKETS
            )));
        }
        let mut season = [Factor::ONE; SEASON_BUCKETS];
        for (f, b) in season.iter_mut().zip(bytes.chunks_exact(2)) {
            *f = Factor(u16::from_le_bytes([b[0], b[1]]));
        }
        Ok(season)
    }
}

/// A forecaster as builds before the compact [`Forecaster`] stored it (`f64`s, `f32`
/// factors): read from their checkpoints, never written.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
pub struct LegacyForecaster {
    level: f64,
    trend: f64,
    #[serde(with = "legacy_season")]
    season: [f32; SEASON_BUCKETS],
    error: f64,
    last_ms: Option<i64>,
    observations: u64,
}

/// [`LegacyForecaster`]'s layout, to write one (tests of reading old checkpoints).
#[cfg(test)]
#[derive(serde::Serialize)]
pub(crate) struct OldForecaster {
    pub(crate) level: f64,
    pub(crate) trend: f64,
    pub(crate) season: Vec<f32>,
    pub(crate) error: f64,
    pub(crate) last_ms: Option<i64>,
    pub(crate) observations: u64,
}

mod legacy_season {
    use super::SEASON_BUCKETS;
    use serde::{Deserialize, Deserializer};

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<[f32; SEASON_BUCKETS], D::Error> {
        let v = Vec::<f32>::deserialize(d)?;
        let n = v.len();
        v.try_into().map_err(|_| {
            serde::de::Error::custom(format!("a season of {n} buckets, not {SEASON_BUCKETS}"))
        })
    }
}

impl From<LegacyForecaster> for Forecaster {
    fn from(f: LegacyForecaster) -> Self {
        Forecaster {
            level: f.level,
            trend: narrow(f.trend),
            error: narrow(f.error),
            observations: u32::try_from(f.observations).unwrap_or(u32::MAX),
            last_ms: f.last_ms.unwrap_or(0),
            season: f.season.map(|s| Factor::of(f64::from(s))),
        }
    }
}

fn bucket(at_ms: i64) -> usize {
    (at_ms.rem_euclid(DAY_MS) * SEASON_BUCKETS as i64 / DAY_MS) as usize
}

impl Default for Forecaster {
    fn default() -> Self {
        Forecaster {
            level: 0.0,
            trend: 0.0,
            error: 0.0,
            observations: 0,
            last_ms: 0,
            season: [Factor::ONE; SEASON_BUCKETS],
        }
    }
}

impl Forecaster {
    /// The forecast for time `at_ms` (the next round's time).
    pub fn forecast(&self, at_ms: i64, config: &ForecastConfig) -> f64 {
        let ahead = if self.observations > 0 {
            at_ms.saturating_sub(self.last_ms).max(0) as f64
        } else {
            0.0
        };
        let base = (self.level + f64::from(self.trend) * ahead).max(0.0);
        (base * self.season[bucket(at_ms)].get()).max(config.floor)
    }

    /// Takes the demand `observed` over the round ending at `at_ms`. Observations must come in
    /// time order; an older one than the last is ignored (returns false).
    pub fn observe(&mut self, at_ms: i64, observed: f64, config: &ForecastConfig) -> bool {
        if !observed.is_finite() || observed < 0.0 {
            return false;
        }
        if self.observations > 0 && at_ms <= self.last_ms {
            return false;
        }
        let b = bucket(at_ms);
        let s = self.season[b].get();
        if self.observations == 0 {
            self.level = observed / s;
            self.last_ms = at_ms;
            self.observations = 1;
            return true;
        }
        let (level0, trend0, error0) = (self.level, f64::from(self.trend), f64::from(self.error));
        let dt = at_ms.saturating_sub(self.last_ms) as f64;
        let predicted_level = (level0 + trend0 * dt).max(0.0);
        let predicted = predicted_level * s;
        // Clip the innovation: a spike moves the state by at most SPIKE_SIGMAS errors.
        let innovation = observed - predicted;
        let limit = SPIKE_SIGMAS * error0.max(1e-9 * predicted.max(1.0));
        let clipped = if self.observations > 10 {
            innovation.clamp(-limit, limit)
        } else {
            innovation
        };
        let seen = predicted + clipped;
        // A spike counts toward the error at most twice the threshold: the threshold widens
        // under a lasting shift (so it is followed) but one wild round cannot blow it open.
        let counted = if self.observations > 10 {
            innovation.abs().min(2.0 * limit)
        } else {
            innovation.abs()
        };
        self.error = narrow(error0 + config.error_alpha * (counted - error0));
        let level = predicted_level + config.alpha * (seen / s - predicted_level);
        self.trend = narrow(trend0 + config.beta * ((level - level0) / dt.max(1.0) - trend0));
        if level > 0.0 {
            let factor = seen / level;
            self.season[b] = Factor::of(s + config.gamma * (factor - s));
        }
        self.level = level.max(0.0);
        self.last_ms = at_ms;
        self.observations = self.observations.saturating_add(1);
        true
    }

    pub fn observations(&self) -> u64 {
        u64::from(self.observations)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    const ROUND_MS: i64 = 10_000;

    /// Every factor's value (read from the table) is 2 to its steps, and is taken back to
    /// itself: the table is indexed by the factor's own bits.
    #[test]
    fn every_factor_reads_back_as_itself() {
        assert_eq!(Factor::ONE.get(), 1.0);
        assert_eq!(Factor(Factor::ONE.0 + 4096).get(), 2.0);
        assert_eq!(Factor(Factor::ONE.0 - 8192).get(), 0.25);
        for b in 0..=u16::MAX {
            assert_eq!(Factor::of(Factor(b).get()), Factor(b), "factor bits {b}");
        }
    }

    /// A diurnal series: 100 + 60·sin(2π t / day) plus Gaussian noise of standard deviation
    /// `sigma` (query counts over a round are noisy), per 10 s round.
    fn diurnal(days: i64, sigma: f64, seed: u64) -> Vec<(i64, f64)> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        (0..days * DAY_MS / ROUND_MS)
            .map(|i| {
                let t = i * ROUND_MS;
                let phase = 2.0 * std::f64::consts::PI * t as f64 / DAY_MS as f64;
                let truth = 100.0 + 60.0 * phase.sin();
                // Box–Muller.
                let (u1, u2): (f64, f64) = (rng.random_range(1e-12..1.0), rng.random());
                let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
                (t, (truth + sigma * z).max(0.0))
            })
            .collect()
    }

    #[test]
    fn a_factor_is_kept_to_half_a_step_and_clamped_outside_its_range() {
        assert_eq!(std::mem::size_of::<Forecaster>(), 128);
        assert_eq!(Factor::of(1.0), Factor::ONE);
        assert_eq!(Factor::ONE.get(), 1.0);
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        for _ in 0..10_000 {
            let x: f64 = rng.random_range(-8.0f64..8.0).exp2();
            let back = Factor::of(x).get();
            assert!(
                (back / x).log2().abs() <= 0.5 / Factor::STEPS + 1e-12,
                "{x} read back as {back}"
            );
        }
        assert_eq!(Factor::of(1e9), Factor(u16::MAX));
        assert!(Factor(u16::MAX).get() > 255.9);
        assert_eq!(Factor::of(0.0).get(), 1.0 / 256.0);
        assert_eq!(Factor::of(-3.0), Factor::of(f64::NAN));
    }

    #[test]
    fn a_legacy_forecaster_reads_as_the_compact_one_it_rounds_to() {
        let old = OldForecaster {
            level: 123.25,
            trend: -0.5,
            season: (0..SEASON_BUCKETS).map(|b| 0.5 + b as f32 / 32.0).collect(),
            error: 7.0,
            last_ms: Some(86_400_000),
            observations: 1 << 40,
        };
        let bytes = postcard::to_stdvec(&old).unwrap();
        let f: Forecaster = postcard::from_bytes::<LegacyForecaster>(&bytes)
            .unwrap()
            .into();
        assert_eq!((f.level, f.trend, f.error), (123.25, -0.5, 7.0));
        assert_eq!((f.last_ms, f.observations), (86_400_000, u32::MAX));
        for (b, s) in f.season.iter().zip(&old.season) {
            assert!((b.get() / f64::from(*s) - 1.0).abs() < 1e-4);
        }
        // And the compact one round-trips bit for bit.
        let again: Forecaster = postcard::from_bytes(&postcard::to_stdvec(&f).unwrap()).unwrap();
        assert_eq!(again, f);
    }

    #[test]
    fn beats_the_last_value_on_a_diurnal_series() {
        let config = ForecastConfig::default();
        let series = diurnal(4, 10.0, 1);
        let mut f = Forecaster::default();
        let (mut err_model, mut err_last) = (0.0, 0.0);
        for w in series.windows(2) {
            let ((t0, y0), (t1, y1)) = (w[0], w[1]);
            f.observe(t0, y0, &config);
            // Score the last two days, after the season has been learned.
            if t1 >= 2 * DAY_MS {
                err_model += (f.forecast(t1, &config) - y1).abs();
                err_last += (y0 - y1).abs();
            }
        }
        eprintln!("diurnal: model error {err_model:.0}, last-value error {err_last:.0}");
        assert!(
            err_model <= 0.8 * err_last,
            "model error {err_model:.0} vs last value {err_last:.0}"
        );
    }

    #[test]
    fn a_one_round_spike_moves_the_forecast_by_less_than_half_of_it() {
        let config = ForecastConfig::default();
        let series = diurnal(2, 3.0, 2);
        let mut f = Forecaster::default();
        for &(t, y) in &series {
            f.observe(t, y, &config);
        }
        let t = series.last().map_or(0, |s| s.0) + ROUND_MS;
        let before = f.forecast(t + ROUND_MS, &config);
        let spike = 10.0 * before;
        f.observe(t, before + spike, &config);
        let after = f.forecast(t + ROUND_MS, &config);
        eprintln!(
            "spike of {spike:.1} moved the forecast by {:.1}",
            after - before
        );
        assert!(
            (after - before).abs() < 0.5 * spike,
            "the forecast moved {:.1} for a spike of {spike:.1}",
            after - before
        );
        // And it does not stay moved: a few normal rounds bring it back.
        for i in 1..=10 {
            f.observe(t + i * ROUND_MS, before, &config);
        }
        let settled = f.forecast(t + 11 * ROUND_MS, &config);
        assert!(
            (settled - before).abs() < 0.1 * before,
            "{settled} vs {before}"
        );
    }

    #[test]
    fn a_lasting_level_shift_is_followed() {
        let config = ForecastConfig::default();
        let mut f = Forecaster::default();
        for i in 0..2_000 {
            f.observe(i * ROUND_MS, 100.0, &config);
        }
        for i in 2_000..2_300 {
            f.observe(i * ROUND_MS, 300.0, &config);
        }
        let now = f.forecast(2_300 * ROUND_MS, &config);
        assert!(now > 250.0, "after 300 rounds at 300 the forecast is {now}");
    }

    #[test]
    fn gaps_old_and_bad_observations_and_the_floor() {
        let config = ForecastConfig::default();
        let mut f = Forecaster::default();
        assert_eq!(f.forecast(0, &config), config.floor);
        assert!(f.observe(10 * ROUND_MS, 50.0, &config));
        assert!(
            !f.observe(5 * ROUND_MS, 50.0, &config),
            "older than the last"
        );
        assert!(!f.observe(20 * ROUND_MS, f64::NAN, &config));
        assert!(!f.observe(20 * ROUND_MS, -1.0, &config));
        // A gap of an hour: the forecast stays near the level.
        assert!(f.observe(370 * ROUND_MS, 50.0, &config));
        assert!((f.forecast(371 * ROUND_MS, &config) - 50.0).abs() < 5.0);
        // Quiet: the forecast decays toward 0 but stays at the floor.
        for i in 371..5_000 {
            f.observe(i * ROUND_MS, 0.0, &config);
        }
        assert!(f.forecast(5_000 * ROUND_MS, &config) >= config.floor);
        assert!(f.forecast(5_000 * ROUND_MS, &config) < 1.0);
    }
}
