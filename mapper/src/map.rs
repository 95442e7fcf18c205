//! A map: for every map unit of an instance, how much of its demand goes to which clusters, and
//! how much is overflow. Indexed like the instance's map units.

use crate::model::{ClassIdx, ClusterIdx, Instance, UnitIdx};
use crate::rescore::Rescore;

/// Amounts and capacities below this share of a unit's demand (or a node's capacity) are noise:
/// the solver does not tell them apart (it is re-exported as `solve::EPS_REL`).
pub const EPS_REL: f64 = 1e-9;

/// Demand of one map unit placed at one cluster.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Allocation {
    pub cluster: ClusterIdx,
    pub amount: f64,
}

/// The output of one solve (or a map read back from a file), unit `u`'s allocations being
/// `allocations[start[u]..start[u + 1]]`, in the unit's preference order; but for a unit with
/// a *companion* (the cluster its answers name second, [`crate::companion`]), whose last
/// allocation is the companion's reserved share.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Map {
    start: Vec<u32>,
    allocations: Vec<Allocation>,
    overflow: Vec<f64>,
    /// The units whose last allocation is their companion, ascending (most maps: none).
    companions: Vec<UnitIdx>,
}

impl Map {
    /// An empty map to be filled unit by unit with [`Map::push_unit`].
    pub fn with_capacity(units: usize, allocations: usize) -> Self {
        let mut start = Vec::with_capacity(units + 1);
        start.push(0);
        Map {
            start,
            allocations: Vec::with_capacity(allocations),
            overflow: Vec::with_capacity(units),
            companions: Vec::new(),
        }
    }

    /// A map from its columns, as the solver writes them: `start` has one entry more than
    /// `overflow`, begins at 0, never decreases, and ends at `allocations.len()`.
    pub(crate) fn from_columns(
        start: Vec<u32>,
        allocations: Vec<Allocation>,
        overflow: Vec<f64>,
    ) -> Self {
        debug_assert_eq!(start.len(), overflow.len() + 1);
        debug_assert_eq!(start.first(), Some(&0));
        debug_assert!(start.windows(2).all(|w| w[0] <= w[1]));
        debug_assert_eq!(start.last().map(|&s| s as usize), Some(allocations.len()));
        Map {
            start,
            allocations,
            overflow,
            companions: Vec::new(),
        }
    }

    /// Appends the next map unit's allocations and overflow.
    pub fn push_unit(&mut self, allocations: impl IntoIterator<Item = Allocation>, overflow: f64) {
        self.allocations.extend(allocations);
        self.start.push(self.allocations.len() as u32);
        self.overflow.push(overflow);
    }

    /// Appends the next map unit: its allocations by preference, then `companion`, the share
    /// reserved for the cluster its answers name second, when it has one.
    pub fn push_unit_with(
        &mut self,
        allocations: impl IntoIterator<Item = Allocation>,
        companion: Option<Allocation>,
        overflow: f64,
    ) {
        if let Some(c) = companion {
            self.companions.push(self.unit_count() as UnitIdx);
            self.push_unit(allocations.into_iter().chain([c]), overflow);
        } else {
            self.push_unit(allocations, overflow);
        }
    }

    pub fn unit_count(&self) -> usize {
        self.overflow.len()
    }

    /// All of unit `u`'s allocations, its companion's (last) included: what it loads.
    pub fn allocations(&self, u: UnitIdx) -> &[Allocation] {
        let u = u as usize;
        &self.allocations[self.start[u] as usize..self.start[u + 1] as usize]
    }

    /// Unit `u`'s allocations but its companion's: where the allocation placed it by
    /// preference, the clusters its clients are spread over by share.
    pub fn placed(&self, u: UnitIdx) -> &[Allocation] {
        let all = self.allocations(u);
        match self.companion(u) {
            Some(_) => &all[..all.len() - 1],
            None => all,
        }
    }

    /// Unit `u`'s companion: the cluster its answers name second and the demand reserved
    /// there for the clients that go to it.
    pub fn companion(&self, u: UnitIdx) -> Option<Allocation> {
        if self.companions.is_empty() || self.companions.binary_search(&u).is_err() {
            return None;
        }
        self.allocations(u).last().copied()
    }

    /// The units with a companion, ascending.
    pub fn companion_units(&self) -> &[UnitIdx] {
        &self.companions
    }

    /// This map without its companions (each unit's [`Map::placed`] and overflow): what a
    /// solve is seeded from and stickiness favours, since a companion is chosen after the
    /// solve, not by it.
    pub fn without_companions(&self) -> std::borrow::Cow<'_, Map> {
        if self.companions.is_empty() {
            return std::borrow::Cow::Borrowed(self);
        }
        let mut out = Map::with_capacity(self.unit_count(), self.allocations.len());
        for u in 0..self.unit_count() as UnitIdx {
            out.push_unit(self.placed(u).iter().copied(), self.overflow(u));
        }
        std::borrow::Cow::Owned(out)
    }

    pub fn overflow(&self, u: UnitIdx) -> f64 {
        self.overflow[u as usize]
    }

    /// Allocations over all units (allocations of nothing included).
    pub fn allocation_count(&self) -> usize {
        self.allocations.len()
    }

    pub fn total_overflow(&self) -> f64 {
        self.overflow.iter().sum()
    }

    pub fn total_allocated(&self) -> f64 {
        self.allocations.iter().map(|a| a.amount).sum()
    }

    /// Demand placed at each cluster.
    pub fn demand_per_cluster(&self, instance: &Instance) -> Vec<f64> {
        let mut out = vec![0.0; instance.clusters().len()];
        for a in &self.allocations {
            out[a.cluster as usize] += a.amount;
        }
        out
    }

    /// Heap bytes held.
    pub fn heap_bytes(&self) -> usize {
        self.start.capacity() * 4
            + self.allocations.capacity() * std::mem::size_of::<Allocation>()
            + self.overflow.capacity() * 8
            + self.companions.capacity() * 4
    }
}

/// `amount` of a unit's `demand` as a share in [0, 1]: the one definition of a share. The
/// resolver splits a unit's clients by it, WatchMap carries it, and a front end's copy (whose
/// demand is 1 and amounts are these shares) computes the same values bit for bit, so both
/// answer every client alike.
pub fn share(amount: f64, demand: f64) -> f64 {
    if demand > 0.0 && amount > 0.0 {
        (amount / demand).min(1.0)
    } else {
        0.0
    }
}

/// Unit `u`'s placed demand as (cluster, share in (0, 1]), in the map's order, its companion's
/// left out ([`Map::placed`]); allocations of nothing are left out.
pub fn unit_shares<'a>(
    instance: &Instance,
    map: &'a Map,
    u: UnitIdx,
) -> impl Iterator<Item = (ClusterIdx, f64)> + 'a {
    let demand = instance.unit_demand(u);
    map.placed(u)
        .iter()
        .map(move |a| (a.cluster, share(a.amount, demand)))
        .filter(|&(_, s)| s > 0.0)
}

/// What `map` places on every resource node of `instance` (indexed by global node), in the
/// node's own unit: the sum over allocations passing it of amount × the class's coefficient.
/// The amounts are summed per (cluster, class) first, and each sum is then spread over its
/// path: one addition per allocation, not one per node of its path with the coefficient looked
/// up (at 11 M map units, a third of the serving map's build each round went here).
pub fn node_usage(instance: &Instance, map: &Map) -> Vec<f64> {
    let classes = instance.classes().len();
    let clusters = instance.clusters();
    let mut placed = vec![0.0; clusters.len() * classes];
    for u in 0..instance.unit_count().min(map.unit_count()) as UnitIdx {
        let k = usize::from(instance.unit_class(u));
        for a in map.allocations(u) {
            if let Some(p) = placed.get_mut(a.cluster as usize * classes + k) {
                *p += a.amount.max(0.0);
            }
        }
    }
    let mut used = vec![0.0; instance.node_count()];
    for (at, &amount) in placed.iter().enumerate() {
        if amount == 0.0 {
            continue;
        }
        let (c, k) = ((at / classes) as ClusterIdx, (at % classes) as ClassIdx);
        let cl = &clusters[c as usize];
        let per_unit = instance.classes()[usize::from(k)].per_unit;
        for n in cl.path(k) {
            used[instance.global_node(c, n)] += amount * per_unit.get(cl.nodes[n as usize].kind);
        }
    }
    used
}

/// The demand-weighted mean score of what `map` places (DESIGN.md: a candidate's score is its
/// estimated RTT in ms plus penalties; a placement beyond a unit's list counts at the second
/// chance's estimate, [`crate::beyond::estimate_beyond`]), each unit's placed amounts
/// scaled by `scale(u)`
/// (`None`: the unit left out): 1 for the map's own demand, observed / planned for the demand
/// that landed on it. `None` when nothing is placed.
pub fn mean_score(
    instance: &Instance,
    map: &Map,
    scale: impl Fn(UnitIdx) -> Option<f64>,
) -> Option<f64> {
    mean_measured_score(instance, map, scale, &Rescore::default())
}

/// [`mean_score`], each candidate measured in `measured` counting with its measured score (as
/// the round that used them did).
pub fn mean_measured_score(
    instance: &Instance,
    map: &Map,
    scale: impl Fn(UnitIdx) -> Option<f64>,
    measured: &Rescore,
) -> Option<f64> {
    let (mut sum, mut placed) = (0.0, 0.0);
    for u in 0..instance.unit_count().min(map.unit_count()) as UnitIdx {
        let Some(x) = scale(u) else {
            continue;
        };
        for a in map.allocations(u) {
            // Measured, else the listed score, else (beyond the list) the second chance's
            // estimate.
            let score = measured
                .score(u, a.cluster)
                .or_else(|| {
                    instance
                        .candidates(u)
                        .find(|c| c.cluster == a.cluster)
                        .map(|c| c.score)
                })
                .map(f64::from)
                .or_else(|| crate::beyond::estimate_beyond(instance, u, a.cluster));
            if let Some(score) = score {
                sum += a.amount * x * score;
                placed += a.amount * x;
            }
        }
    }
    (placed > 0.0).then(|| sum / placed)
}

/// Churn between two maps of the same instance shape (DESIGN.md, "Stickiness"): the
/// demand-weighted share of demand whose cluster changed, overflow counting as one more
/// "cluster", using the demands of `instance` (the new round's).
///
/// Exact where the answer is: a unit whose split is the same in both maps adds exactly 0
/// (its moved share is a sum of `max(0, new share − old share)` terms, each exactly 0 when
/// the amounts and totals are the same), so an unchanged map has churn exactly 0, not the
/// rounding error of `1 − Σ kept`. A share that grew by no more than the solver's tolerance
/// ([`EPS_REL`] of the unit's demand: amounts it does not tell apart) is not a
/// move either: a sticky round on unchanged inputs re-derives its amounts through other
/// arithmetic, and their last bits differ (the demo world's second round read 4.9e-16).
pub fn churn(instance: &Instance, old: &Map, new: &Map) -> f64 {
    let mut moved = 0.0;
    let mut total = 0.0;
    for u in 0..instance.unit_count() as UnitIdx {
        let d = instance.unit_demand(u);
        if d <= 0.0 {
            continue;
        }
        total += d;
        moved += d * moved_share(old, new, u);
    }
    if total > 0.0 {
        // Each unit's share is at most 1 (clamped there), so the mean is too.
        (moved / total).min(1.0)
    } else {
        0.0
    }
}

/// The share of unit `u`'s demand that `new` places where `old` did not: Σ over clusters (and
/// overflow) of max(0, new share − old share), which is 1 − Σ min(old share, new share) as
/// both sides' shares sum to 1, at most 1 (clamped: the shares' float sum may pass it by an
/// ulp). Runs once per unit per round, so it allocates nothing: a unit has a handful of
/// allocations.
fn moved_share(old: &Map, new: &Map, u: UnitIdx) -> f64 {
    // How much a share grew: 0 within the solver's tolerance.
    let grown = |old: f64, new: f64| {
        let d = new - old;
        if d > EPS_REL {
            d
        } else {
            0.0
        }
    };
    let total = |m: &Map| m.allocations(u).iter().map(|a| a.amount).sum::<f64>() + m.overflow(u);
    let (t_old, t_new) = (total(old), total(new));
    if t_old <= 0.0 || t_new <= 0.0 {
        return 1.0;
    }
    let old_allocs = old.allocations(u);
    let at_old = |c: ClusterIdx| -> f64 {
        old_allocs
            .iter()
            .filter(|a| a.cluster == c)
            .map(|a| a.amount)
            .sum()
    };
    // A cluster named twice in a map (possible in one read from a file) counts once here.
    let new_allocs = new.allocations(u);
    let mut moved = 0.0;
    for (i, a) in new_allocs.iter().enumerate() {
        if new_allocs[..i].iter().any(|b| b.cluster == a.cluster) {
            continue;
        }
        let s_new: f64 = new_allocs
            .iter()
            .filter(|b| b.cluster == a.cluster)
            .map(|b| b.amount)
            .sum::<f64>()
            / t_new;
        moved += grown(at_old(a.cluster) / t_old, s_new);
    }
    moved += grown(old.overflow(u) / t_old, new.overflow(u) / t_new);
    moved.min(1.0)
}
