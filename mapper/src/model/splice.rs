//! The instance with map units replaced, added and removed ([`Instance::with_units_edited`]).
//! The units that change are validated exactly as [`InstanceBuilder::push_unit`] validates a
//! unit (they go through a builder over the same classes and clusters); every other unit's
//! columns are copied over in runs. An edit of a few units then costs copying the columns,
//! not validating and sorting every unit again through the file form (which at 1 M map units
//! took 1.4 s and held every unit as strings).
//!
//! Promises: the result equals the instance built from the same units in a file (a property
//! test compares them), and shares the classes and clusters with the instance edited.

use std::ops::Range;
use std::sync::Arc;

use super::builder::{InstanceBuilder, MapUnitSpec};
use super::columns::{CandidateColumns, MapUnits, NO_RANK};
use super::instance::Instance;
use super::limits::{too_many, Limits, UnitIdx, MAX_MAP_UNITS};
use crate::error::ModelError;

/// Where each unit of an edited instance comes from, in unit order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    /// The units of the instance edited at these indices, in order.
    Kept(Range<UnitIdx>),
    /// The upsert at this index of the caller's list.
    New(usize),
}

/// A run of units to copy: from the instance edited (`false`) or from the new units
/// (`true`), at these indices.
type Run = (bool, Range<usize>);

impl Instance {
    /// This instance with the map units of `upserts` (each replacing the unit of its id, or
    /// added) and without those of `deletes` (ids; one that is not there is no change), and
    /// where each unit of the result comes from. Upserts are validated as a file's units are
    /// (errors name the unit); two upserts of one id, or an id both upserted and deleted, are
    /// refused. The result has no stickiness (an instance with a previous map's preferences
    /// is a round's, never edited) and shares this one's classes and clusters.
    pub fn with_units_edited(
        &self,
        upserts: &[MapUnitSpec<'_>],
        deletes: &[&str],
        limits: Limits,
    ) -> Result<(Instance, Vec<Piece>), ModelError> {
        debug_assert!(
            self.favour.is_none(),
            "an instance with stickiness is edited"
        );
        let mut builder = InstanceBuilder::on(&self.topology, limits);
        builder.reserve(
            upserts.len(),
            upserts.iter().map(|u| u.candidates.len()).sum(),
        );
        for spec in upserts {
            builder.push_unit(spec)?;
        }
        let (new, order) = builder.finish_with_order()?;
        let push_of = |j: usize| order.as_ref().map_or(j, |o| o[j] as usize);
        let mut gone: Vec<&str> = deletes.to_vec();
        gone.sort_unstable();
        gone.dedup();
        if let Some(id) = gone.iter().find(|id| new.unit_index(id).is_some()) {
            return Err(ModelError::DuplicateId {
                what: "map unit",
                id: id.to_string(),
                context: " (upserted and deleted in one edit)".into(),
            });
        }

        let runs = self.runs_of(&new, &gone);
        let (units, cands, demand) = self.spliced(&new, &runs)?;
        let instance = Instance {
            topology: Arc::clone(&self.topology),
            units: Arc::new(units),
            demand: Arc::new(demand),
            cands: Arc::new(cands),
            favour: None,
        };
        let pieces = runs
            .into_iter()
            .map(|(from_new, r)| {
                if from_new {
                    Piece::New(push_of(r.start))
                } else {
                    Piece::Kept(r.start as UnitIdx..r.end as UnitIdx)
                }
            })
            .collect();
        Ok((instance, pieces))
    }

    /// The result's units as runs, in order: this instance's units kept, and `new`'s (the
    /// upserts), each at its place among the old units, without the units of `gone`.
    fn runs_of(&self, new: &Instance, gone: &[&str]) -> Vec<Run> {
        // Each change at its place among the old units: (old position, id, new unit, whether
        // the old unit there goes). An added unit sorts before the old unit at its position.
        let mut events: Vec<(usize, &str, Option<usize>, bool)> = Vec::new();
        for j in 0..new.unit_count() {
            let id = new.unit_id(j as UnitIdx);
            match self.units.ids.binary_search(id) {
                Ok(i) => events.push((i, id, Some(j), true)),
                Err(i) => events.push((i, id, Some(j), false)),
            }
        }
        for id in gone {
            if let Ok(i) = self.units.ids.binary_search(id) {
                events.push((i, id, None, true));
            }
        }
        events.sort_unstable_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
        let n = self.unit_count();
        let mut runs: Vec<Run> = Vec::new();
        let mut at = 0;
        for &(pos, _, j, goes) in &events {
            if pos > at {
                runs.push((false, at..pos));
                at = pos;
            }
            if let Some(j) = j {
                runs.push((true, j..j + 1));
            }
            if goes {
                at = pos + 1;
            }
        }
        if at < n {
            runs.push((false, at..n));
        }
        runs
    }

    /// The columns of the result, `runs` copied from this instance and `new`.
    fn spliced(
        &self,
        new: &Instance,
        runs: &[Run],
    ) -> Result<(MapUnits, CandidateColumns, Vec<f64>), ModelError> {
        let count: usize = runs.iter().map(|(_, r)| r.len()).sum();
        too_many(|| "instance".into(), "map units", count, MAX_MAP_UNITS)?;
        let source = |from_new: bool| if from_new { new } else { self };
        let cand_total: usize = runs
            .iter()
            .map(|(f, r)| {
                let s = &source(*f).units.cand_start;
                (s[r.end] - s[r.start]) as usize
            })
            .sum();
        let cand_limit = u32::MAX as usize;
        too_many(|| "instance".into(), "candidates", cand_total, cand_limit)?;
        let ranks = self.cands.rank.is_some() || new.cands.rank.is_some();
        let mut units = MapUnits::default();
        units.cand_start.reserve_exact(count + 1);
        units.cand_start.push(0);
        units
            .ids
            .reserve_exact(count, self.units.ids.text_len() + new.units.ids.text_len());
        units.class.reserve_exact(count);
        units.lat.reserve_exact(count);
        units.lon.reserve_exact(count);
        let mut cands = CandidateColumns {
            rank: ranks.then(|| Vec::with_capacity(cand_total)),
            ..CandidateColumns::default()
        };
        cands.cluster.reserve_exact(cand_total);
        cands.score.reserve_exact(cand_total);
        cands.head.reserve_exact(count);
        let mut demand = Vec::with_capacity(count);
        for (from_new, r) in runs {
            let src = source(*from_new);
            copy_run(src, r.clone(), &mut units, &mut cands, &mut demand)?;
        }
        // Ranks are kept only while some candidate has one, as a build keeps them.
        if cands
            .rank
            .as_ref()
            .is_some_and(|r| r.iter().all(|&x| x == NO_RANK))
        {
            cands.rank = None;
        }
        Ok((units, cands, demand))
    }
}

/// Appends the units `range` of `src` to the columns.
fn copy_run(
    src: &Instance,
    range: Range<usize>,
    units: &mut MapUnits,
    cands: &mut CandidateColumns,
    demand: &mut Vec<f64>,
) -> Result<(), ModelError> {
    let (su, sc) = (&src.units, &src.cands);
    for i in range.clone() {
        let id = su.ids.get(i);
        if !units.ids.push(id) {
            return Err(ModelError::TooMany {
                subject: "instance".into(),
                what: "bytes of map unit ids",
                count: units.ids.text_len().saturating_add(id.len()),
                limit: u32::MAX as usize,
            });
        }
    }
    units.class.extend_from_slice(&su.class[range.clone()]);
    units.lat.extend_from_slice(&su.lat[range.clone()]);
    units.lon.extend_from_slice(&su.lon[range.clone()]);
    demand.extend_from_slice(&src.demand[range.clone()]);
    let (c0, c1) = (
        su.cand_start[range.start] as usize,
        su.cand_start[range.end] as usize,
    );
    let base = cands.cluster.len() as u32;
    cands.cluster.extend_from_slice(&sc.cluster[c0..c1]);
    cands.score.extend_from_slice(&sc.score[c0..c1]);
    if let Some(dst) = cands.rank.as_mut() {
        match sc.rank.as_ref() {
            Some(r) => dst.extend_from_slice(&r[c0..c1]),
            None => dst.resize(dst.len() + (c1 - c0), NO_RANK),
        }
    }
    cands.head.extend_from_slice(&sc.head[range.clone()]);
    units.cand_start.extend(
        su.cand_start[range.start + 1..=range.end]
            .iter()
            .map(|&s| s - c0 as u32 + base),
    );
    Ok(())
}

impl Instance {
    /// This instance with `clusters` as its whole cluster list (validated as an instance
    /// file's: trees, classes, ids), the map units kept: each candidate follows its cluster
    /// to the cluster's new index, and the candidates whose cluster is gone, or no longer
    /// serves the unit's class, are dropped. Returns the instance, the candidate entries
    /// dropped and the units they belonged to. One pass over the candidates, where a rebuild
    /// validated and sorted every unit again: how a cluster is added, deleted, or given other
    /// classes. Candidates stay in preference order (the clusters keep their id order, which
    /// breaks ties) and the unit columns and demands are shared.
    pub fn with_clusters(
        &self,
        clusters: Vec<super::topology::ClusterSpec>,
        limits: Limits,
    ) -> Result<(Instance, usize, usize), ModelError> {
        debug_assert!(
            self.favour.is_none(),
            "an instance with stickiness is edited"
        );
        let mut topology = InstanceBuilder::new(self.classes().to_vec(), clusters, limits)?
            .finish()?
            .topology;
        // The policy's prices follow their clusters by id.
        Arc::make_mut(&mut topology).policy = self
            .topology
            .policy
            .carried(&self.cluster_ids(), &topology.cluster_ids());
        // Old cluster index → new index (u32::MAX: gone).
        let renumber: Vec<u32> = self
            .clusters()
            .iter()
            .map(|c| {
                topology
                    .cluster_by_id
                    .get(&c.id)
                    .copied()
                    .unwrap_or(u32::MAX)
            })
            .collect();
        let (old_u, old_c) = (&self.units, &self.cands);
        let n = self.unit_count();
        let mut cands = CandidateColumns {
            rank: old_c.rank.as_ref().map(|r| Vec::with_capacity(r.len())),
            ..CandidateColumns::default()
        };
        cands.cluster.reserve_exact(old_c.cluster.len());
        cands.score.reserve_exact(old_c.score.len());
        cands.head.reserve_exact(n);
        let mut cand_start = Vec::with_capacity(n + 1);
        cand_start.push(0u32);
        let (mut dropped, mut units_touched) = (0usize, 0usize);
        for u in 0..n {
            let class = old_u.class[u];
            let (c0, c1) = (
                old_u.cand_start[u] as usize,
                old_u.cand_start[u + 1] as usize,
            );
            let start = cands.cluster.len();
            for i in c0..c1 {
                let to = renumber[old_c.cluster[i] as usize];
                if to == u32::MAX || !topology.clusters[to as usize].serves(class) {
                    continue;
                }
                cands.cluster.push(to);
                cands.score.push(old_c.score[i]);
                if let (Some(dst), Some(src)) = (cands.rank.as_mut(), old_c.rank.as_ref()) {
                    dst.push(src[i]);
                }
            }
            let kept = cands.cluster.len() - start;
            if kept < c1 - c0 {
                dropped += c1 - c0 - kept;
                units_touched += 1;
            }
            cands.push_head(start);
            cand_start.push(cands.cluster.len() as u32);
        }
        if cands
            .rank
            .as_ref()
            .is_some_and(|r| r.iter().all(|&x| x == NO_RANK))
        {
            cands.rank = None;
        }
        let units = if dropped == 0 {
            Arc::clone(&self.units)
        } else {
            let mut units = (**old_u).clone();
            units.cand_start = cand_start;
            Arc::new(units)
        };
        let instance = Instance {
            topology,
            units,
            demand: Arc::clone(&self.demand),
            cands: Arc::new(cands),
            favour: None,
        };
        Ok((instance, dropped, units_touched))
    }
}
