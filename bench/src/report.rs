//! The figures a solve is judged by, computed once and shown both on screen and in the
//! assignment file's `summary`.

use std::fmt;
use std::time::Duration;

use cdnmap_mapper::{Instance, Map, SolveStats, UnitIdx};
use serde::Serialize;

/// Quality and cost of one map.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub map_units: usize,
    pub clusters: usize,
    pub candidates: usize,
    pub demand: f64,
    pub allocated: f64,
    pub overflow: f64,
    /// Demand-weighted mean score (ms) of where demand was placed.
    pub mean_rtt_ms: f64,
    /// Share of demand placed at its unit's first candidate.
    pub first_choice_share: f64,
    pub solve_ms: f64,
    pub proposals: u64,
    pub evictions: u64,
    pub repair_rounds: u32,
    /// Blocking pairs the solver found left after its repair rounds.
    pub blocking_pairs: usize,
    /// Churn against the previous map (`None`: no previous map).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub churn: Option<f64>,
    /// Demand a seeded solve kept where the previous map had it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seeded: Option<f64>,
    /// Violations the independent verifier found (`None`: verification skipped).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verifier_violations: Option<usize>,
    /// The map's cost under the instance's cost policy (price × Bps used; `None`: no policy).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost: Option<f64>,
    /// Placements that break the cost policy's latency guard (`None`: not checked).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub guard_violations: Option<usize>,
}

impl Summary {
    pub fn new(instance: &Instance, map: &Map, stats: &SolveStats, elapsed: Duration) -> Self {
        let mut weighted = 0.0;
        let mut first = 0.0;
        for u in 0..instance.unit_count() as UnitIdx {
            let allocs = map.allocations(u);
            for a in allocs {
                if let Some(c) = instance.candidates(u).find(|c| c.cluster == a.cluster) {
                    weighted += a.amount * f64::from(c.score);
                }
            }
            if let (Some(a), Some(c)) = (allocs.first(), instance.candidates(u).next()) {
                if a.cluster == c.cluster {
                    first += a.amount;
                }
            }
        }
        let demand = instance.total_demand();
        let allocated = map.total_allocated();
        Summary {
            map_units: instance.unit_count(),
            clusters: instance.clusters().len(),
            candidates: instance.total_candidates(),
            // `+ 0.0`: an empty sum of floats is -0.0, which would print as "-0.0".
            demand: demand + 0.0,
            allocated: allocated + 0.0,
            overflow: map.total_overflow() + 0.0,
            mean_rtt_ms: if allocated > 0.0 {
                weighted / allocated
            } else {
                0.0
            },
            first_choice_share: if demand > 0.0 { first / demand } else { 0.0 },
            solve_ms: elapsed.as_secs_f64() * 1e3,
            proposals: stats.proposals,
            evictions: stats.evictions,
            repair_rounds: stats.repair_rounds,
            blocking_pairs: stats.blocking_pairs_left,
            churn: None,
            seeded: (stats.seeded_demand > 0.0).then_some(stats.seeded_demand),
            verifier_violations: None,
            cost: cdnmap_mapper::policy::map_cost(instance, map),
            guard_violations: None,
        }
    }
}

/// `part` as a percentage of `whole` (0 when there is no whole). The ratio first: `100 ×
/// part` overflows to infinity for a part near `f64::MAX` (a unit's demand of 1e308 showed as
/// "inf%"). A whole that is itself infinite (demands that add up past `f64::MAX`) has no
/// percentage: NaN, shown as such.
fn pct(part: f64, whole: f64) -> f64 {
    if whole > 0.0 {
        part / whole * 100.0
    } else {
        0.0
    }
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "map units      {:>12}   clusters {}   candidates {:.1}/unit",
            self.map_units,
            self.clusters,
            self.candidates as f64 / self.map_units.max(1) as f64
        )?;
        writeln!(f, "demand         {:>12.1}", self.demand)?;
        writeln!(
            f,
            "allocated      {:>12.1}   ({:.2}%)",
            self.allocated,
            pct(self.allocated, self.demand)
        )?;
        writeln!(
            f,
            "overflow       {:>12.1}   ({:.2}%)",
            self.overflow,
            pct(self.overflow, self.demand)
        )?;
        writeln!(
            f,
            "first choice   {:>11.2}%   mean RTT {:.1} ms (demand-weighted)",
            100.0 * self.first_choice_share,
            self.mean_rtt_ms
        )?;
        writeln!(
            f,
            "solve time     {:>9.1} ms   proposals {}   evictions {}   repair rounds {}",
            self.solve_ms, self.proposals, self.evictions, self.repair_rounds
        )?;
        if let Some(churn) = self.churn {
            write!(
                f,
                "churn          {:>11.3}%   of demand changed cluster since the previous map",
                100.0 * churn
            )?;
            if let Some(seeded) = self.seeded {
                write!(f, "; warm start kept {:.2}%", pct(seeded, self.demand))?;
            }
            writeln!(f)?;
        }
        write!(
            f,
            "blocking pairs {:>12}   (solver's check)",
            self.blocking_pairs
        )?;
        if let Some(v) = self.verifier_violations {
            write!(f, "\nverifier       {:>12}   violations", v)?;
        }
        if let Some(cost) = self.cost {
            write!(f, "\ncost           {cost:>12.1}   (price × Bps used)")?;
            if let Some(g) = self.guard_violations {
                write!(f, "; latency guard broken by {g} placements")?;
            }
        }
        Ok(())
    }
}
