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

/// The state of one map unit's forecast.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Forecaster {
    level: f64,
    /// Change of the level per millisecond.
    trend: f64,
    #[serde(with = "season_serde")]
    season: [f32; SEASON_BUCKETS],
    /// Running mean absolute error, for the spike threshold.
    error: f64,
    last_ms: Option<i64>,
    observations: u64,
}

/// The seasonal profile as a list (serde derives arrays of at most 32 only); a stored list of
/// another length is refused.
mod season_serde {
    use super::SEASON_BUCKETS;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(
        season: &[f32; SEASON_BUCKETS],
        s: S,
    ) -> Result<S::Ok, S::Error> {
        season.as_slice().serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<[f32; SEASON_BUCKETS], D::Error> {
        let v = Vec::<f32>::deserialize(d)?;
        let n = v.len();
        v.try_into().map_err(|_| {
            serde::de::Error::custom(format!("a season of {n} buckets, not {SEASON_BUCKETS}"))
        })
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
            season: [1.0; SEASON_BUCKETS],
            error: 0.0,
            last_ms: None,
            observations: 0,
        }
    }
}

impl Forecaster {
    /// The forecast for time `at_ms` (the next round's time).
    pub fn forecast(&self, at_ms: i64, config: &ForecastConfig) -> f64 {
        let ahead = self.last_ms.map_or(0, |t| (at_ms - t).max(0)) as f64;
        let base = (self.level + self.trend * ahead).max(0.0);
        (base * f64::from(self.season[bucket(at_ms)])).max(config.floor)
    }

    /// Takes the demand `observed` over the round ending at `at_ms`. Observations must come in
    /// time order; an older one than the last is ignored (returns false).
    pub fn observe(&mut self, at_ms: i64, observed: f64, config: &ForecastConfig) -> bool {
        if !observed.is_finite() || observed < 0.0 {
            return false;
        }
        if let Some(last) = self.last_ms {
            if at_ms <= last {
                return false;
            }
        }
        let b = bucket(at_ms);
        let s = f64::from(self.season[b]).max(1e-6);
        if self.observations == 0 {
            self.level = observed / s;
            self.last_ms = Some(at_ms);
            self.observations = 1;
            return true;
        }
        let dt = (at_ms - self.last_ms.unwrap_or(at_ms)) as f64;
        let predicted_level = (self.level + self.trend * dt).max(0.0);
        let predicted = predicted_level * s;
        // Clip the innovation: a spike moves the state by at most SPIKE_SIGMAS errors.
        let innovation = observed - predicted;
        let limit = SPIKE_SIGMAS * self.error.max(1e-9 * predicted.max(1.0));
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
        self.error += config.error_alpha * (counted - self.error);
        let level = predicted_level + config.alpha * (seen / s - predicted_level);
        self.trend += config.beta * ((level - self.level) / dt.max(1.0) - self.trend);
        if level > 0.0 {
            let factor = seen / level;
            self.season[b] = (s + config.gamma * (factor - s)) as f32;
        }
        self.level = level.max(0.0);
        self.last_ms = Some(at_ms);
        self.observations += 1;
        true
    }

    pub fn observations(&self) -> u64 {
        self.observations
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    const ROUND_MS: i64 = 10_000;

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
