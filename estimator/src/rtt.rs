//! Measured round-trip times (RUM beacons, issue 19 point 3): a robust RTT per (map unit,
//! cluster), which the round uses as the candidate's score where it is measured.
//!
//! **Robust**: each pair keeps its last [`REPORTS_PER_PAIR`] reports (an RTT in ms and the
//! samples it summarises) and its estimate is their *weighted median*, each report weighing
//! its samples times `2^(-age / half_life)`: an outlier report moves it not at all unless it
//! outweighs the rest, and old reports fade. A report older than `max_age` counts for nothing,
//! and a pair with fewer than `min_samples` samples in that window has no estimate (the
//! distance estimate stands).
//!
//! **Bounded**: at most `max_pairs` pairs; a report for a new pair beyond it is refused (the
//! caller counts it), and [`RttTable::prune`] drops pairs whose reports all aged out. Keyed by
//! ids, not indices, so topology edits keep what was measured.
//!
//! **Deterministic**: time comes in as an argument (ms since the epoch); the same reports at the
//! same times give the same estimates.

use std::collections::HashMap;

/// Reports kept per (unit, cluster).
pub const REPORTS_PER_PAIR: usize = 8;
/// The largest RTT taken, in ms.
pub const MAX_RTT_MS: f64 = 60_000.0;
/// The most samples one report may say it summarises.
pub const MAX_REPORT_SAMPLES: u64 = 1_000_000;

/// How RTT reports are weighed and how many pairs are kept (`[rtt]` in the service's config).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RttConfig {
    /// A report's weight halves every `half_life_secs`.
    pub half_life_secs: f64,
    /// Reports older than this count for nothing.
    pub max_age_secs: f64,
    /// Samples (within `max_age_secs`) a pair needs before its estimate is used.
    pub min_samples: u64,
    /// The most (unit, cluster) pairs kept.
    pub max_pairs: usize,
    /// The most map units a round lets measurements reorder (the others wait a round): a
    /// warm start repairs a few thousand reorderings in a round, not tens of thousands.
    pub max_reordered_units: usize,
}

impl Default for RttConfig {
    fn default() -> Self {
        RttConfig {
            half_life_secs: 600.0,
            max_age_secs: 3_600.0,
            min_samples: 10,
            max_pairs: 1_000_000,
            max_reordered_units: 5_000,
        }
    }
}

impl RttConfig {
    /// Refuses settings that are not numbers, or that would keep nothing.
    pub fn validate(&self) -> Result<(), String> {
        if !(self.half_life_secs.is_finite() && self.half_life_secs >= 1.0) {
            return Err(format!(
                "rtt.half_life_secs: {} is not a number of seconds >= 1",
                self.half_life_secs
            ));
        }
        if !(self.max_age_secs.is_finite()
            && self.max_age_secs >= self.half_life_secs
            && self.max_age_secs <= 30.0 * 86_400.0)
        {
            return Err(format!(
                "rtt.max_age_secs: {} must be a number of seconds from half_life_secs to 30 days",
                self.max_age_secs
            ));
        }
        if self.max_pairs > 100_000_000 {
            return Err(format!(
                "rtt.max_pairs: {} is more than 100,000,000",
                self.max_pairs
            ));
        }
        Ok(())
    }
}

/// One report of a pair.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Obs {
    at_ms: i64,
    rtt_ms: f32,
    samples: u32,
}

/// A cluster's id and the reports of one unit's clients to it, oldest first.
type Pair = (Box<str>, Vec<Obs>);

/// Why a report was not taken.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RttRefused {
    #[error("rtt_ms: {0} is not a round trip in (0, 60000] ms")]
    BadRtt(f64),
    #[error("samples: {0} is not a count in [1, 1000000]")]
    BadSamples(u64),
    #[error("the RTT table holds its most pairs ({0}): a new pair is not taken")]
    Full(usize),
}

/// The robust RTT per (unit id, cluster id): see the module documentation.
#[derive(Debug, Clone, Default)]
pub struct RttTable {
    config: RttConfig,
    /// By unit id: its clusters' reports, newest last within a pair.
    by_unit: HashMap<Box<str>, Vec<Pair>>,
    pairs: usize,
}

/// What a pair's estimate is made of.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RttEstimate {
    /// The weighted median, in ms.
    pub rtt_ms: f32,
    /// The samples within `max_age_secs`.
    pub samples: u64,
}

impl RttTable {
    pub fn new(config: RttConfig) -> Self {
        RttTable {
            config,
            ..RttTable::default()
        }
    }

    pub fn config(&self) -> &RttConfig {
        &self.config
    }

    /// The (unit, cluster) pairs held.
    pub fn pairs(&self) -> usize {
        self.pairs
    }

    /// Checks one report's figures, as [`Self::record`] would take them.
    pub fn check(rtt_ms: f64, samples: u64) -> Result<(), RttRefused> {
        if !(rtt_ms > 0.0 && rtt_ms <= MAX_RTT_MS) {
            return Err(RttRefused::BadRtt(rtt_ms));
        }
        if !(1..=MAX_REPORT_SAMPLES).contains(&samples) {
            return Err(RttRefused::BadSamples(samples));
        }
        Ok(())
    }

    /// Takes a report: `samples` RTTs from `unit`'s clients to `cluster`, summarised as
    /// `rtt_ms`, at `at_ms`. A full pair drops its lightest report (its oldest, when they
    /// summarise alike). A report the pair holds already (the same time and figures) is taken
    /// once: a restart rebuilding the table from the record while reports keep arriving can
    /// bring one twice.
    pub fn record(
        &mut self,
        unit: &str,
        cluster: &str,
        rtt_ms: f64,
        samples: u64,
        at_ms: i64,
    ) -> Result<(), RttRefused> {
        Self::check(rtt_ms, samples)?;
        let obs = Obs {
            at_ms,
            rtt_ms: rtt_ms as f32,
            samples: samples as u32,
        };
        let full = self.pairs >= self.config.max_pairs;
        let list = match self.by_unit.get_mut(unit) {
            Some(list) => list,
            None if full => return Err(RttRefused::Full(self.config.max_pairs)),
            None => self.by_unit.entry(unit.into()).or_default(),
        };
        let reports = match list.iter().position(|(c, _)| &**c == cluster) {
            Some(i) => &mut list[i].1,
            None if full => return Err(RttRefused::Full(self.config.max_pairs)),
            None => {
                self.pairs += 1;
                list.push((cluster.into(), Vec::with_capacity(2)));
                &mut list.last_mut().expect("just pushed").1
            }
        };
        if reports.contains(&obs) {
            return Ok(());
        }
        if reports.len() >= REPORTS_PER_PAIR {
            let half_life = self.config.half_life_secs;
            let lightest = (0..reports.len())
                .min_by(|&a, &b| {
                    let (wa, wb) = (
                        weight(&reports[a], at_ms, half_life),
                        weight(&reports[b], at_ms, half_life),
                    );
                    wa.total_cmp(&wb)
                        .then(reports[a].at_ms.cmp(&reports[b].at_ms))
                })
                .unwrap_or(0);
            reports.remove(lightest);
        }
        reports.push(obs);
        Ok(())
    }

    /// The estimate of (`unit`, `cluster`) at `now_ms`, if it has enough samples.
    pub fn estimate(&self, unit: &str, cluster: &str, now_ms: i64) -> Option<RttEstimate> {
        let list = self.by_unit.get(unit)?;
        let (_, reports) = list.iter().find(|(c, _)| &**c == cluster)?;
        self.estimate_of(reports, now_ms)
    }

    fn estimate_of(&self, reports: &[Obs], now_ms: i64) -> Option<RttEstimate> {
        let max_age_ms = self.config.max_age_secs * 1e3;
        let mut live: Vec<(f32, f64)> = Vec::with_capacity(reports.len());
        let mut samples = 0u64;
        for r in reports {
            let age = (now_ms - r.at_ms) as f64;
            if age > max_age_ms {
                continue;
            }
            samples += u64::from(r.samples);
            live.push((r.rtt_ms, weight(r, now_ms, self.config.half_life_secs)));
        }
        if samples < self.config.min_samples.max(1) {
            return None;
        }
        live.sort_by(|a, b| a.0.total_cmp(&b.0));
        let total: f64 = live.iter().map(|l| l.1).sum();
        let mut seen = 0.0;
        for &(rtt, w) in &live {
            seen += w;
            if seen >= total / 2.0 {
                return Some(RttEstimate {
                    rtt_ms: rtt,
                    samples,
                });
            }
        }
        live.last().map(|&(rtt, _)| RttEstimate {
            rtt_ms: rtt,
            samples,
        })
    }

    /// Every pair with an estimate at `now_ms`: `each(unit, cluster, estimate)`.
    pub fn for_each_estimate(&self, now_ms: i64, mut each: impl FnMut(&str, &str, RttEstimate)) {
        for (unit, list) in &self.by_unit {
            for (cluster, reports) in list {
                if let Some(e) = self.estimate_of(reports, now_ms) {
                    each(unit, cluster, e);
                }
            }
        }
    }

    /// Drops the reports older than `max_age_secs` at `now_ms`, and the pairs and units left
    /// without any.
    pub fn prune(&mut self, now_ms: i64) {
        let max_age_ms = self.config.max_age_secs * 1e3;
        let mut pairs = 0;
        self.by_unit.retain(|_, list| {
            list.retain_mut(|(_, reports)| {
                reports.retain(|r| ((now_ms - r.at_ms) as f64) <= max_age_ms);
                !reports.is_empty()
            });
            pairs += list.len();
            !list.is_empty()
        });
        self.pairs = pairs;
    }
}

/// A report's weight at `now_ms`: its samples, halved every `half_life_secs` of age (a
/// report from the future weighs as one of now).
fn weight(r: &Obs, now_ms: i64, half_life_secs: f64) -> f64 {
    let age_secs = ((now_ms - r.at_ms) as f64 / 1e3).max(0.0);
    f64::from(r.samples) * (-age_secs / half_life_secs).exp2()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> RttTable {
        RttTable::new(RttConfig {
            half_life_secs: 60.0,
            max_age_secs: 600.0,
            min_samples: 10,
            max_pairs: 3,
            max_reordered_units: 5_000,
        })
    }

    #[test]
    fn the_estimate_is_a_weighted_median_that_outliers_do_not_move() {
        let mut t = table();
        for i in 0..5 {
            t.record("u", "a", 20.0 + f64::from(i), 10, i64::from(i) * 1_000)
                .expect("taken");
        }
        let e = t.estimate("u", "a", 5_000).expect("enough samples");
        assert_eq!(e.rtt_ms, 22.0);
        assert_eq!(e.samples, 50);
        // One wild report (a Wi-Fi hiccup, a forged figure) of as many samples as each other.
        t.record("u", "a", 59_000.0, 10, 5_000).expect("taken");
        let e = t.estimate("u", "a", 5_000).expect("estimate");
        assert!((20.0..=24.0).contains(&e.rtt_ms), "{e:?}");
    }

    #[test]
    fn old_reports_fade_and_new_ones_take_over() {
        let mut t = table();
        t.record("u", "a", 100.0, 100, 0).expect("taken");
        // Ten minutes later (ten half-lives) a smaller report outweighs the old one.
        t.record("u", "a", 30.0, 10, 590_000).expect("taken");
        assert_eq!(t.estimate("u", "a", 590_000).expect("e").rtt_ms, 30.0);
        // Right after the first, the old one still wins.
        let mut t = table();
        t.record("u", "a", 100.0, 100, 0).expect("taken");
        t.record("u", "a", 30.0, 10, 1_000).expect("taken");
        assert_eq!(t.estimate("u", "a", 1_000).expect("e").rtt_ms, 100.0);
        // Past max_age nothing counts, and pruning forgets the pair.
        assert_eq!(t.estimate("u", "a", 700_000), None);
        t.prune(700_000);
        assert_eq!(t.pairs(), 0);
    }

    #[test]
    fn a_report_taken_twice_counts_once() {
        let mut t = table();
        t.record("u", "a", 100.0, 30, 0).expect("taken");
        t.record("u", "a", 20.0, 20, 0).expect("taken");
        // The same report again (a restart's rebuild meeting it live): still 30 against 20.
        t.record("u", "a", 20.0, 20, 0).expect("taken");
        let e = t.estimate("u", "a", 0).expect("estimate");
        assert_eq!((e.rtt_ms, e.samples), (100.0, 50));
        // The same figures at another time are another report.
        t.record("u", "a", 20.0, 20, 1).expect("taken");
        assert_eq!(t.estimate("u", "a", 1).expect("estimate").rtt_ms, 20.0);
    }

    #[test]
    fn too_few_samples_give_no_estimate() {
        let mut t = table();
        t.record("u", "a", 50.0, 9, 0).expect("taken");
        assert_eq!(t.estimate("u", "a", 0), None);
        t.record("u", "a", 52.0, 1, 0).expect("taken");
        assert!(t.estimate("u", "a", 0).is_some());
    }

    #[test]
    fn a_pair_keeps_its_last_reports_and_the_table_its_bound() {
        let mut t = table();
        for i in 0..(REPORTS_PER_PAIR as i64 + 5) {
            t.record("u", "a", 10.0 + i as f64, 10, i * 1_000)
                .expect("taken");
        }
        let reports = &t.by_unit["u"][0].1;
        assert_eq!(reports.len(), REPORTS_PER_PAIR);
        assert_eq!(reports[0].at_ms, 5_000, "the oldest went first");
        t.record("u", "b", 10.0, 10, 0).expect("taken");
        t.record("v", "a", 10.0, 10, 0).expect("taken");
        assert_eq!(t.pairs(), 3);
        assert_eq!(
            t.record("w", "a", 10.0, 10, 0),
            Err(RttRefused::Full(3)),
            "a new pair beyond max_pairs"
        );
        assert_eq!(t.record("u", "c", 10.0, 10, 0), Err(RttRefused::Full(3)));
        t.record("u", "a", 11.0, 10, 20_000)
            .expect("a known pair is still taken");
    }

    #[test]
    fn bad_figures_are_refused() {
        let mut t = table();
        for rtt in [0.0, -1.0, f64::NAN, f64::INFINITY, 1e308, 60_001.0] {
            assert!(matches!(
                t.record("u", "a", rtt, 10, 0),
                Err(RttRefused::BadRtt(_))
            ));
        }
        for n in [0, MAX_REPORT_SAMPLES + 1, u64::MAX] {
            assert_eq!(
                t.record("u", "a", 10.0, n, 0),
                Err(RttRefused::BadSamples(n))
            );
        }
        assert_eq!(t.pairs(), 0);
        let bad = RttConfig {
            half_life_secs: f64::NAN,
            ..RttConfig::default()
        };
        assert!(bad.validate().is_err());
        let bad = RttConfig {
            max_age_secs: 1.0,
            ..RttConfig::default()
        };
        assert!(bad.validate().unwrap_err().contains("rtt.max_age_secs"));
        assert!(RttConfig::default().validate().is_ok());
    }
}
