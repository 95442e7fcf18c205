//! A map: for every map unit of an instance, how much of its demand goes to which clusters, and
//! how much is overflow. Indexed like the instance's map units.

use crate::model::{ClusterIdx, Instance, UnitIdx};

/// Demand of one map unit placed at one cluster.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Allocation {
    pub cluster: ClusterIdx,
    pub amount: f64,
}

/// The output of one solve (or a map read back from a file), unit `u`'s allocations being
/// `allocations[start[u]..start[u + 1]]`, in the unit's preference order.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Map {
    start: Vec<u32>,
    allocations: Vec<Allocation>,
    overflow: Vec<f64>,
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
        }
    }

    /// Appends the next map unit's allocations and overflow.
    pub fn push_unit(&mut self, allocations: impl IntoIterator<Item = Allocation>, overflow: f64) {
        self.allocations.extend(allocations);
        self.start.push(self.allocations.len() as u32);
        self.overflow.push(overflow);
    }

    pub fn unit_count(&self) -> usize {
        self.overflow.len()
    }

    pub fn allocations(&self, u: UnitIdx) -> &[Allocation] {
        let u = u as usize;
        &self.allocations[self.start[u] as usize..self.start[u + 1] as usize]
    }

    pub fn overflow(&self, u: UnitIdx) -> f64 {
        self.overflow[u as usize]
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
    }
}

/// What `map` places on every resource node of `instance` (indexed by global node), in the
/// node's own unit: the sum over allocations passing it of amount × the class's coefficient.
pub fn node_usage(instance: &Instance, map: &Map) -> Vec<f64> {
    let mut used = vec![0.0; instance.node_count()];
    for u in 0..instance.unit_count().min(map.unit_count()) as UnitIdx {
        let k = instance.unit_class(u);
        let per_unit = instance.classes()[usize::from(k)].per_unit;
        for a in map.allocations(u) {
            let Some(cl) = instance.clusters().get(a.cluster as usize) else {
                continue;
            };
            for n in cl.path(k) {
                used[instance.global_node(a.cluster, n)] +=
                    a.amount.max(0.0) * per_unit.get(cl.nodes[n as usize].kind);
            }
        }
    }
    used
}

/// Churn between two maps of the same instance shape (DESIGN.md, "Stickiness"): the
/// demand-weighted share of demand whose cluster changed, overflow counting as one more
/// "cluster", using the demands of `instance` (the new round's).
pub fn churn(instance: &Instance, old: &Map, new: &Map) -> f64 {
    let mut moved = 0.0;
    let mut total = 0.0;
    for u in 0..instance.unit_count() as UnitIdx {
        let d = instance.unit_demand(u);
        if d <= 0.0 {
            continue;
        }
        total += d;
        let shares_old = shares(old, u);
        let shares_new = shares(new, u);
        let mut kept = 0.0;
        for &(c, s_new) in &shares_new {
            if let Some(&(_, s_old)) = shares_old.iter().find(|(co, _)| *co == c) {
                kept += f64::min(s_old, s_new);
            }
        }
        moved += d * (1.0 - kept.min(1.0));
    }
    if total > 0.0 {
        moved / total
    } else {
        0.0
    }
}

/// Fraction of unit `u`'s demand at each cluster, overflow as cluster `u32::MAX`.
fn shares(map: &Map, u: UnitIdx) -> Vec<(u32, f64)> {
    let allocs = map.allocations(u);
    let over = map.overflow(u);
    let total: f64 = allocs.iter().map(|a| a.amount).sum::<f64>() + over;
    if total <= 0.0 {
        return Vec::new();
    }
    let mut out: Vec<(u32, f64)> = allocs
        .iter()
        .map(|a| (a.cluster, a.amount / total))
        .collect();
    if over > 0.0 {
        out.push((u32::MAX, over / total));
    }
    out
}
