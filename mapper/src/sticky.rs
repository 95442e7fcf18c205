//! Stickiness: seeding a round from the previous map so that small changes move little demand
//! (DESIGN.md, "Stickiness").
//!
//! Two mechanisms work together, and neither weakens stability:
//!
//! 1. **Incumbents favoured, on both sides** ([`favour_incumbents`]). Call *(m, c)* an incumbent
//!    pair when the previous map had some of unit *m*'s demand at cluster *c*.
//!    - *Units*: the pair's score is multiplied by `1 − margin`, so a unit leaves its cluster
//!      only for one better by more than the margin (hysteresis).
//!    - *Clusters*: with `incumbents_first` (the default) a cluster likes every incumbent better
//!      than every newcomer, whatever the class; among incumbents, and among newcomers, the
//!      usual `(class priority, rank, id)` decides, an incumbent's rank also multiplied by
//!      `1 − margin`. So newcomers take free capacity but push no one out, and when a cluster
//!      must shed (its capacity shrank, its incumbents' demand grew) it sheds by priority and
//!      rank. This is what keeps a failure's ripple small: the demand of a cluster that went
//!      down moves, and displaces little. The price: a better-priority class arriving at a full
//!      cluster waits in its next choice (or overflow) until room appears; a cold solve
//!      (stickiness 0) now and then, or `incumbents_first = false`, re-optimises.
//!
//!    The result is a new [`Instance`] — the *effective preferences* — which the solver solves
//!    and the verifier checks, exactly as any other instance. `margin = 0` returns the instance
//!    unchanged: a cold solve. It shares the instance's candidates and keeps only what
//!    stickiness changed (`model::Favour`): which candidates are favoured, a *promotion* for
//!    each unit whose one incumbent moved forward (the usual reordering: the scores moved and
//!    the bonus put the incumbent back in front), a copy of the candidates of the few units
//!    reordered otherwise, and each unit's first candidate, which is all a seeded solve reads
//!    of most units. Reading the preferences back through `Instance::candidates` gives the
//!    same candidates, bit for bit, as writing them out (`mapper/tests/properties.rs` checks
//!    it against a direct computation).
//! 2. **Warm start** ([`crate::solve_seeded`]): the solve starts from the previous map's shares,
//!    sheds what no longer fits, lets only the unplaced demand propose, and repairs blocking
//!    pairs. Its work is proportional to what changed, and it ends at a stable allocation of the
//!    effective preferences close to the previous map.
//!
//! Because the effective preferences only ever make a previous allocation *more* attractive to
//! both sides, a map that was stable last round is still stable when nothing changed: same
//! inputs plus the previous map give the same map and zero churn.

use crate::error::ModelError;
use crate::map::Map;
use crate::model::{
    CandidateColumns, ClusterIdx, Favour, FirstCandidate, Head, Instance, UnitIdx, NO_RANK,
};
use crate::parts;
use crate::rescore::Rescore;

/// The largest margin accepted: at 1 an incumbent's score would be 0 and nothing could ever
/// move.
pub const MAX_STICKINESS: f64 = 0.9;

/// The default margin: an incumbent is kept unless another candidate is more than 10% better.
pub const DEFAULT_STICKINESS: f64 = 0.1;

/// How strongly a round holds on to the previous map (module documentation).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stickiness {
    /// In `[0, MAX_STICKINESS]`: incumbent scores and ranks are multiplied by `1 − margin`.
    /// 0 switches stickiness off (a plain cold solve).
    pub margin: f64,
    /// Clusters like every incumbent better than every newcomer.
    pub incumbents_first: bool,
}

impl Default for Stickiness {
    fn default() -> Self {
        Stickiness {
            margin: DEFAULT_STICKINESS,
            incumbents_first: true,
        }
    }
}

impl Stickiness {
    /// No stickiness: the effective preferences are the instance's.
    pub const OFF: Stickiness = Stickiness {
        margin: 0.0,
        incumbents_first: false,
    };

    /// Refuses a margin outside `[0, MAX_STICKINESS]` (or not a number).
    pub fn validate(&self) -> Result<(), ModelError> {
        let margin = self.margin;
        if margin.is_finite() && (0.0..=MAX_STICKINESS).contains(&margin) {
            Ok(())
        } else {
            Err(ModelError::BadNumber {
                subject: "stickiness".into(),
                field: "margin",
                value: margin,
                rule: "must be a number in [0, 0.9]",
            })
        }
    }

    /// The default with another margin.
    pub fn margin(margin: f64) -> Self {
        Stickiness {
            margin,
            ..Stickiness::default()
        }
    }
}

/// The effective preferences of a round seeded from `previous` (a map of an instance with the
/// same map units, e.g. the previous round's): see the module documentation. An allocation of
/// amount 0 in `previous` makes no incumbent (any positive amount, however tiny, does); a
/// negative, infinite or NaN amount is refused with an error naming the unit.
pub fn favour_incumbents(
    instance: &Instance,
    previous: &Map,
    stickiness: &Stickiness,
) -> Result<Instance, ModelError> {
    effective_preferences(instance, Some(previous), stickiness, &Rescore::default())
}

/// A round's effective preferences: `instance`'s, with the measured scores of `rescore` in
/// place of the instance's estimates (each measured unit's candidates in their order by
/// the measured scores), and, when seeded from `previous` with a margin, its incumbents
/// favoured as [`favour_incumbents`] favours them. Without measurements and without a
/// previous map (or a margin of 0) it is the instance. The work beyond the instance's shared
/// columns is in proportion to the units measured, as a copy of their candidates.
pub fn effective_preferences(
    instance: &Instance,
    previous: Option<&Map>,
    stickiness: &Stickiness,
    rescore: &Rescore,
) -> Result<Instance, ModelError> {
    stickiness.validate()?;
    if let Some(previous) = previous {
        if previous.unit_count() != instance.unit_count() {
            return Err(ModelError::MapShape {
                map_units: previous.unit_count(),
                instance_units: instance.unit_count(),
            });
        }
    }
    // No margin is no incumbent.
    let previous = previous.filter(|_| stickiness.margin > 0.0);
    if previous.is_none() && rescore.is_empty() {
        return Ok(instance.clone());
    }
    if let Some(&u) = rescore.units().last() {
        debug_assert!((u as usize) < instance.unit_count());
    }
    // Preferences derived once more start from the effective ones, written out.
    let base = instance.flattened();
    let (factor, incumbents_first) = match previous {
        Some(_) => (
            (1.0 - stickiness.margin) as f32,
            stickiness.incumbents_first,
        ),
        None => (1.0, false),
    };
    // The units in two halves, one on another thread, when there are enough of them to pay
    // for it.
    let parts = parts::parts_for(base.unit_count(), parts::PARALLEL_ITEMS);
    let settings = Settings {
        factor,
        incumbents_first,
        rescore,
    };
    let favour = favour_in_parts(&base, previous, &settings, parts)?;
    Ok(base.with_favour(favour))
}

/// What [`effective_preferences`] applies, besides the previous map.
struct Settings<'a> {
    factor: f32,
    incumbents_first: bool,
    rescore: &'a Rescore,
}

/// The [`Favour`] of `base`, its units split into `parts` ranges, each but the first on its
/// own thread; the parts are joined in unit order, so the result does not depend on `parts`.
fn favour_in_parts(
    base: &Instance,
    previous: Option<&Map>,
    settings: &Settings<'_>,
    parts: usize,
) -> Result<Favour, ModelError> {
    let n = base.unit_count();
    let done = parts::in_parts(n, parts, |r| {
        // The first part's columns get room for all units: the others are appended to them.
        let room = if r.start == 0 { n } else { r.len() };
        favour_part(
            base,
            previous,
            settings,
            r.start as UnitIdx..r.end as UnitIdx,
            room,
        )
    });
    if let Some(&(u, c, amount)) = done.iter().find_map(|p| p.bad.as_ref()) {
        let cluster = base
            .clusters()
            .get(c as usize)
            .map_or("?", |c| c.id.as_str());
        return Err(ModelError::BadNumber {
            subject: format!(
                "previous map, map unit {:?} at cluster {cluster:?}",
                base.unit_id(u)
            ),
            field: "amount",
            value: amount,
            rule: "must be a finite number >= 0",
        });
    }
    join_parts(base, settings.factor, settings.incumbents_first, done)
}

/// The effective preferences of a range of units (see [`favour_incumbents`]): their
/// [`Favour`] fields, with the favoured bits of their part of the arena (from word
/// `word_base` on) and their moved candidates numbered from 0.
#[derive(Default)]
struct Part {
    start: Vec<u32>,
    promote: Vec<[u8; 2]>,
    first: Vec<FirstCandidate>,
    word_base: usize,
    favoured: Vec<u64>,
    moved: CandidateColumns,
    /// The favoured entries of `moved`.
    moved_favoured: Vec<usize>,
    /// The first allocation of the previous map that is no amount (negative, infinite or
    /// NaN): its unit and amount. The effective preferences are then refused.
    bad: Option<(UnitIdx, ClusterIdx, f64)>,
}

/// One part of [`favour_in_parts`]: the units of `units`, with room for `room` of them.
fn favour_part(
    base: &Instance,
    previous: Option<&Map>,
    settings: &Settings<'_>,
    units: std::ops::Range<UnitIdx>,
    room: usize,
) -> Part {
    let cands = &base.cands;
    let count = (units.end - units.start) as usize;
    let (from, to) = if units.is_empty() {
        (0, 0)
    } else {
        (
            base.candidate_range(units.start).start,
            base.candidate_range(units.end - 1).end,
        )
    };
    let word_base = from / 64;
    let mut promote = Vec::with_capacity(room.max(count));
    promote.resize(count, [0u8; 2]);
    let mut part = Part {
        start: Vec::with_capacity(room.max(count)),
        promote,
        first: Vec::with_capacity(room.max(count)),
        word_base,
        favoured: vec![0u64; to.div_ceil(64) - word_base],
        moved: CandidateColumns {
            rank: (cands.rank.is_some() || settings.rescore.has_ranks()).then(Vec::new),
            ..CandidateColumns::default()
        },
        moved_favoured: Vec::new(),
        bad: None,
    };
    let favouring = Favouring {
        base,
        previous,
        factor: settings.factor,
        incumbents_first: settings.incumbents_first,
        word_base,
        arena_len: cands.cluster.len(),
    };
    let mut marks: Vec<usize> = Vec::new();
    let mut order: Vec<(f32, ClusterIdx, usize)> = Vec::new();
    // The next unit with measured scores.
    let rescore = settings.rescore;
    let mut next = rescore.first_at_or_after(units.start);
    for u in units.clone() {
        let local = (u - units.start) as usize;
        let c = favouring.candidates(u);
        if rescore.units().get(next) == Some(&u) {
            let scored = (rescore.at(next), rescore.ranks_at(next));
            favouring.rescored(&mut part, &mut marks, &mut order, u, &c, scored);
            next += 1;
            continue;
        }
        let one = match favouring.quick(u, &c) {
            Quick::One(p) => p,
            Quick::Gone => {
                favouring.unmoved(&mut part, &c, false);
                continue;
            }
            Quick::Other => match favouring.general(&mut part, &mut marks, &mut order, u, &c) {
                Some(p) => p,
                None => continue,
            },
        };
        favouring.promote(&mut part, local, &c, one);
    }
    part
}

/// What [`favour_part`] needs of every unit: the base instance, the previous map and the
/// settings, and where its part's favoured bits start (`word_base`, in words of the arena).
struct Favouring<'a> {
    base: &'a Instance,
    /// `None`: no incumbents (no stickiness), only measured scores.
    previous: Option<&'a Map>,
    factor: f32,
    incumbents_first: bool,
    word_base: usize,
    arena_len: usize,
}

/// A unit's candidates in the base instance's arena (from `start` on), and its head.
struct UnitCands<'a> {
    start: usize,
    list: &'a [ClusterIdx],
    scores: &'a [f32],
    ranks: Option<&'a [f32]>,
    head: Head,
}

/// What the previous map says of a unit, read the quick way.
enum Quick {
    /// Its one incumbent (a positive amount) is its candidate at this position.
    One(usize),
    /// Its one incumbent is not a candidate any more.
    Gone,
    /// Anything else (none, several, an amount of 0 or no amount, no candidates): see
    /// [`Favouring::general`].
    Other,
}

impl<'a> Favouring<'a> {
    #[inline(always)]
    fn candidates(&self, u: UnitIdx) -> UnitCands<'a> {
        let cands = &self.base.cands;
        let range = self.base.candidate_range(u);
        UnitCands {
            start: range.start,
            list: &cands.cluster[range.clone()],
            scores: &cands.score[range.clone()],
            ranks: cands.rank.as_ref().map(|r| &r[range.clone()]),
            head: cands.head[u as usize],
        }
    }

    /// Unit `u`'s allocations in the previous map (none without one).
    #[inline(always)]
    fn allocations(&self, u: UnitIdx) -> &'a [crate::map::Allocation] {
        self.previous.map_or(&[], |p| p.allocations(u))
    }

    /// The usual case, without the bookkeeping of [`Self::general`]: one incumbent. Most are
    /// the unit's first choice: its head says so, and the unit's candidates are not read at
    /// all.
    #[inline(always)]
    fn quick(&self, u: UnitIdx, c: &UnitCands<'_>) -> Quick {
        if let ([a], false) = (self.allocations(u), c.list.is_empty()) {
            if a.amount > 0.0 && a.amount < f64::INFINITY {
                if a.cluster == c.head.cluster {
                    return Quick::One(0);
                }
                if let Some(p) = c.list.iter().position(|&x| x == a.cluster) {
                    return Quick::One(p);
                }
                return Quick::Gone;
            }
        }
        Quick::Other
    }

    /// Writes down the unit's first candidate: base position `j`, favoured or not.
    #[inline(always)]
    fn push_first(
        &self,
        first: &mut Vec<FirstCandidate>,
        c: &UnitCands<'_>,
        j: usize,
        favoured: bool,
    ) {
        let bonus = if favoured { self.factor } else { 1.0 };
        let (cluster, rank) = if j == 0 {
            (c.head.cluster, c.head.rank)
        } else {
            let rank = match c.ranks.map(|r| r[j]) {
                Some(r) if r != NO_RANK => r,
                _ => c.scores[j],
            };
            (c.list[j], rank)
        };
        first.push(FirstCandidate {
            cluster,
            rank: rank * bonus,
            newcomer: self.incumbents_first && !favoured,
        });
    }

    /// A unit whose candidates keep their order: its first is its base head, favoured or not.
    #[inline(always)]
    fn unmoved(&self, part: &mut Part, c: &UnitCands<'_>, favoured: bool) {
        self.push_first(&mut part.first, c, 0, favoured);
        part.start.push(c.start as u32);
    }

    /// Sets the favoured bit of arena entry `i`.
    #[inline(always)]
    fn set(&self, bits: &mut [u64], i: usize) {
        set_bit(bits, i - self.word_base * 64);
    }

    /// Every unit the quick way does not settle: the position of its one incumbent, or
    /// `None` when it is settled here (no candidates, no incumbent, several).
    #[inline]
    fn general(
        &self,
        part: &mut Part,
        marks: &mut Vec<usize>,
        order: &mut Vec<(f32, ClusterIdx, usize)>,
        u: UnitIdx,
        c: &UnitCands<'_>,
    ) -> Option<usize> {
        self.incumbents(part, marks, u, c);
        if c.list.is_empty() {
            part.first.push(FirstCandidate {
                cluster: 0,
                rank: 0.0,
                newcomer: false,
            });
            part.start.push(c.start as u32);
            return None;
        }
        if marks.is_empty() {
            self.unmoved(part, c, false);
            return None;
        }
        if let [p] = marks[..] {
            return Some(p);
        }
        self.several(part, marks, order, c);
        None
    }

    /// Sets `marks` to the positions of unit `u`'s incumbents (once each, should the map name
    /// a cluster twice). An amount of 0 makes no incumbent; one that is no amount at all
    /// refuses the previous map (`favour_in_parts` names it).
    #[inline]
    fn incumbents(&self, part: &mut Part, marks: &mut Vec<usize>, u: UnitIdx, c: &UnitCands<'_>) {
        marks.clear();
        for a in self.allocations(u) {
            if !(a.amount >= 0.0 && a.amount < f64::INFINITY) {
                part.bad.get_or_insert((u, a.cluster, a.amount));
                continue;
            }
            if a.amount == 0.0 {
                continue;
            }
            if let Some(j) = c.list.iter().position(|&x| x == a.cluster) {
                if !marks.contains(&j) {
                    marks.push(j);
                }
            }
        }
    }

    /// A unit with measured scores (`measured`, in cluster order; each a candidate's): its
    /// candidates move to `moved` with the measured scores in place of the instance's, in
    /// their order by (score with any incumbent's bonus, cluster id), its incumbents
    /// favoured as everywhere else.
    #[inline(never)]
    fn rescored(
        &self,
        part: &mut Part,
        marks: &mut Vec<usize>,
        order: &mut Vec<(f32, ClusterIdx, usize)>,
        u: UnitIdx,
        c: &UnitCands<'_>,
        (measured, ranks): (&[(ClusterIdx, f32)], Option<&[f32]>),
    ) {
        self.incumbents(part, marks, u, c);
        let at = |j: usize| measured.binary_search_by_key(&c.list[j], |&(x, _)| x).ok();
        let score = |j: usize| at(j).map_or(c.scores[j], |k| measured[k].1);
        // The rank a cluster gives the unit: an explicit one, else the entry's own (the cost
        // policy's latency), else none (the score).
        let rank = |j: usize| match c.ranks.map(|r| r[j]) {
            Some(r) if r != NO_RANK => r,
            _ => ranks.and_then(|r| at(j).map(|k| r[k])).unwrap_or(NO_RANK),
        };
        let bonus = |j: usize| {
            if marks.contains(&j) {
                self.factor
            } else {
                1.0
            }
        };
        order.clear();
        order.extend((0..c.list.len()).map(|j| (score(j) * bonus(j), c.list[j], j)));
        order.sort_unstable_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let Some(&(_, cluster, j0)) = order.first() else {
            // A measured unit has candidates; should one have none, it stays as it is.
            part.first.push(FirstCandidate {
                cluster: 0,
                rank: 0.0,
                newcomer: false,
            });
            part.start.push(c.start as u32);
            return;
        };
        let first_rank = match rank(j0) {
            NO_RANK => score(j0),
            r => r,
        };
        part.first.push(FirstCandidate {
            cluster,
            rank: first_rank * bonus(j0),
            newcomer: self.incumbents_first && !marks.contains(&j0),
        });
        self.copy_aside(part, marks, order, score, rank);
    }

    /// Copies a unit's candidates to `moved` in `order` (each `(_, cluster, base position)`),
    /// with `score(j)` for base position `j`, its rank `rank(j)` (`NO_RANK`: the score) when
    /// the copies have a rank column, and its favoured mark.
    #[inline]
    fn copy_aside(
        &self,
        part: &mut Part,
        marks: &[usize],
        order: &[(f32, ClusterIdx, usize)],
        score: impl Fn(usize) -> f32,
        rank: impl Fn(usize) -> f32,
    ) {
        let at = part.moved.cluster.len();
        // Numbered from the end of the arena; `join_parts` adds the earlier parts' copies.
        part.start
            .push(u32::try_from(self.arena_len + at).unwrap_or(u32::MAX));
        for (k, &(_, cluster, j)) in order.iter().enumerate() {
            part.moved.cluster.push(cluster);
            part.moved.score.push(score(j));
            if let Some(r) = part.moved.rank.as_mut() {
                r.push(rank(j));
            }
            if marks.contains(&j) {
                part.moved_favoured.push(at + k);
            }
        }
    }

    /// A unit with several incumbents: only a favoured entry got better, so the order can
    /// break only just before one; if it does, the unit's candidates move to `moved` in their
    /// new order.
    #[inline]
    fn several(
        &self,
        part: &mut Part,
        marks: &[usize],
        order: &mut Vec<(f32, ClusterIdx, usize)>,
        c: &UnitCands<'_>,
    ) {
        let (list, scores, factor) = (c.list, c.scores, self.factor);
        let effective = |j: usize| {
            if marks.contains(&j) {
                scores[j] * factor
            } else {
                scores[j]
            }
        };
        let in_order = marks
            .iter()
            .all(|&j| j == 0 || (effective(j - 1), list[j - 1]) < (effective(j), list[j]));
        if in_order {
            self.unmoved(part, c, marks.contains(&0));
            for &j in marks {
                self.set(&mut part.favoured, c.start + j);
            }
            return;
        }
        // The unit's preference is (score, cluster id), now with the bonus: its candidates
        // move to `moved` in that order.
        order.clear();
        order.extend((0..list.len()).map(|j| (effective(j), list[j], j)));
        order.sort_unstable_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let j0 = order[0].2;
        self.push_first(&mut part.first, c, j0, marks.contains(&j0));
        let ranks = c.ranks;
        self.copy_aside(
            part,
            marks,
            order,
            |j| scores[j],
            |j| ranks.map_or(NO_RANK, |r| r[j]),
        );
    }

    /// A unit with one incumbent, at position `p`: it moves forward past the entries it now
    /// beats (all before it, and in order) to position `q`; `q == p` is no move.
    #[inline(always)]
    fn promote(&self, part: &mut Part, local: usize, c: &UnitCands<'_>, p: usize) {
        let (list, scores) = (c.list, c.scores);
        let q = if p == 0 {
            0
        } else {
            let key = (scores[p] * self.factor, list[p]);
            (0..p).take_while(|&j| (scores[j], list[j]) < key).count()
        };
        if q == 0 {
            self.push_first(&mut part.first, c, p, true);
        } else {
            self.push_first(&mut part.first, c, 0, false);
        }
        part.start.push(c.start as u32);
        self.set(&mut part.favoured, c.start + p);
        if q < p {
            part.promote[local] = [p as u8, q as u8];
        }
    }
}

/// Joins the parts of [`favour_incumbents`], in unit order.
fn join_parts(
    base: &Instance,
    factor: f32,
    incumbents_first: bool,
    parts: Vec<Part>,
) -> Result<Favour, ModelError> {
    let arena_len = base.cands.cluster.len();
    let moved_len: usize = parts.iter().map(|p| p.moved.cluster.len()).sum();
    if arena_len + moved_len > u32::MAX as usize {
        // Positions are `u32`s: an arena this large leaves no room for the reordered copies.
        return Err(ModelError::TooMany {
            subject: "effective preferences".into(),
            what: "candidates, with the reordered units' copies",
            count: arena_len + moved_len,
            limit: u32::MAX as usize,
        });
    }
    let ranked = base.cands.rank.is_some() || parts.iter().any(|p| p.moved.rank.is_some());
    let mut parts = parts.into_iter();
    let mut head = parts.next().unwrap_or_default();
    // The first part's columns, with room for all units, take the others' (its moved
    // copies come first, so its starts need no shift).
    let mut favour = Favour {
        factor,
        incumbents_first,
        start: std::mem::take(&mut head.start),
        promote: std::mem::take(&mut head.promote),
        arena_len,
        moved: CandidateColumns {
            cluster: Vec::with_capacity(moved_len),
            score: Vec::with_capacity(moved_len),
            rank: ranked.then(|| Vec::with_capacity(moved_len)),
            head: Vec::new(),
        },
        favoured: vec![0u64; (arena_len + moved_len).div_ceil(64)],
        first: std::mem::take(&mut head.first),
    };
    for part in std::iter::once(head).chain(parts) {
        let offset = favour.moved.cluster.len();
        // Starts at or past the arena are in this part's copies (or, for units without
        // candidates at the very end, empty ranges, which the shift leaves empty).
        favour.start.extend(part.start.iter().map(|&s| {
            if s as usize >= arena_len {
                s + offset as u32
            } else {
                s
            }
        }));
        favour.promote.extend_from_slice(&part.promote);
        favour.first.extend_from_slice(&part.first);
        // The parts' arena ranges touch at most in one word, where the bits are or-ed.
        for (w, &bits) in part.favoured.iter().enumerate() {
            favour.favoured[part.word_base + w] |= bits;
        }
        for &k in &part.moved_favoured {
            set_bit(&mut favour.favoured, arena_len + offset + k);
        }
        favour.moved.cluster.extend_from_slice(&part.moved.cluster);
        favour.moved.score.extend_from_slice(&part.moved.score);
        if let (Some(r), Some(o)) = (favour.moved.rank.as_mut(), part.moved.rank.as_ref()) {
            r.extend_from_slice(o);
        }
    }
    Ok(favour)
}

fn set_bit(bits: &mut [u64], i: usize) {
    bits[i / 64] |= 1 << (i % 64);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::map::Allocation;
    use crate::model::Limits;
    use crate::testing::parse_instance;
    use crate::{solve, solve_seeded, verify, SolveOptions};

    /// Two clusters 5% apart; unit "m" sat at the worse one last round.
    fn instance() -> Instance {
        let json = r#"{
          "traffic_classes": [{"name": "web", "priority": 0, "per_unit": {"bps": 1, "fps": 1}}],
          "clusters": [
            {"id": "a", "lat": 0, "lon": 0, "resources": {"name": "r", "kind": "bps", "capacity": 1, "classes": ["web"]}},
            {"id": "b", "lat": 0, "lon": 0, "resources": {"name": "r", "kind": "bps", "capacity": 1, "classes": ["web"]}}],
          "map_units": [
            {"id": "m", "class": "web", "demand": 1, "lat": 0, "lon": 0,
             "candidates": [{"cluster": "a", "score": 10}, {"cluster": "b", "score": 10.5}]},
            {"id": "n", "class": "web", "demand": 1, "lat": 0, "lon": 0,
             "candidates": [{"cluster": "a", "score": 20}]}]
        }"#;
        parse_instance(json.as_bytes(), Limits::default()).expect("valid")
    }

    fn previous(inst: &Instance, cluster: &str) -> Map {
        let c = inst.cluster_index(cluster).expect("cluster");
        let mut map = Map::with_capacity(2, 1);
        map.push_unit(
            [Allocation {
                cluster: c,
                amount: 1.0,
            }],
            0.0,
        ); // m
        map.push_unit([], 1.0); // n: overflow
        map
    }

    #[test]
    fn an_incumbent_within_the_margin_overtakes_and_is_kept() {
        let inst = instance();
        let prev = previous(&inst, "b");
        let eff = favour_incumbents(&inst, &prev, &Stickiness::default()).expect("effective");
        let m = inst.unit_index("m").expect("unit");
        let order: Vec<(String, f32, bool)> = eff
            .candidates(m)
            .map(|c| {
                (
                    eff.clusters()[c.cluster as usize].id.clone(),
                    c.score,
                    c.incumbent,
                )
            })
            .collect();
        assert_eq!(
            order,
            vec![("b".into(), 10.5 * 0.9, true), ("a".into(), 10.0, false)]
        );
        // Cold, m goes to a (and n, liked less by a, overflows); sticky, m stays at b and n
        // gets a.
        let cold = solve(&inst, &SolveOptions::default()).map;
        assert_eq!(
            cold.allocations(m)[0].cluster,
            inst.cluster_index("a").expect("a")
        );
        let warm = solve_seeded(&eff, &prev, &SolveOptions::default()).map;
        assert!(verify::verify(&eff, &warm).is_ok());
        assert_eq!(
            warm.allocations(m)[0].cluster,
            inst.cluster_index("b").expect("b")
        );
        let n = inst.unit_index("n").expect("unit");
        assert_eq!(
            warm.allocations(n)[0].cluster,
            inst.cluster_index("a").expect("a")
        );
    }

    #[test]
    fn beyond_the_margin_the_unit_moves() {
        let inst = instance();
        let prev = previous(&inst, "b");
        let eff = favour_incumbents(&inst, &prev, &Stickiness::margin(0.01)).expect("effective");
        let m = inst.unit_index("m").expect("unit");
        let warm = solve_seeded(&eff, &prev, &SolveOptions::default()).map;
        assert!(verify::verify(&eff, &warm).is_ok());
        assert_eq!(
            warm.allocations(m)[0].cluster,
            inst.cluster_index("a").expect("a")
        );
    }

    /// The preferences derived in parts (on threads) are the same whatever the number of
    /// parts: a random instance, ranks on some candidates, a previous map splitting units over
    /// several clusters and naming some twice, units without candidates.
    #[test]
    fn the_parts_join_to_the_same_preferences() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        let clusters: Vec<String> = (0..12)
            .map(|c| {
                format!(
                    r#"{{"id": "c{c:02}", "lat": 0, "lon": 0, "resources": {{"name": "r", "kind": "bps", "capacity": 50, "classes": ["web"]}}}}"#
                )
            })
            .collect();
        let units: Vec<String> = (0..3000)
            .map(|u| {
                let k = if u % 97 == 0 { 0 } else { rng.random_range(1..=12usize) };
                let cands = crate::testing::random_candidates(&mut rng, 12, k, 0.3);
                format!(
                    r#"{{"id": "u{u:05}", "class": "web", "demand": 1, "lat": 0, "lon": 0, "candidates": [{cands}]}}"#
                )
            })
            .collect();
        let json = format!(
            r#"{{"traffic_classes": [{{"name": "web", "priority": 0, "per_unit": {{"bps": 1, "fps": 0}}}}],
               "clusters": [{}], "map_units": [{}]}}"#,
            clusters.join(","),
            units.join(",")
        );
        let inst = parse_instance(json.as_bytes(), Limits::default()).expect("valid");
        let mut previous = Map::with_capacity(inst.unit_count(), 0);
        for u in 0..inst.unit_count() as UnitIdx {
            let cands: Vec<_> = inst.candidates(u).collect();
            let mut picks = Vec::new();
            for _ in 0..rng.random_range(0..4usize) {
                if let Some(c) = cands.get(rng.random_range(0..cands.len().max(1))) {
                    picks.push(Allocation {
                        cluster: c.cluster,
                        amount: rng.random_range(0.0..2.0),
                    });
                }
            }
            previous.push_unit(picks, 0.0);
        }
        // Every 13th unit with its candidates' scores measured (some of them, reversed).
        let measured: Vec<_> = (0..inst.unit_count() as UnitIdx)
            .step_by(13)
            .flat_map(|u| {
                let n = inst.candidate_count(u);
                inst.candidates(u)
                    .enumerate()
                    .filter(|(j, _)| j % 2 == 0)
                    .map(move |(j, c)| (u, c.cluster, 1.0 + (n - j) as f32))
                    .collect::<Vec<_>>()
            })
            .collect();
        let rescore = Rescore::new(&inst, measured).expect("measurements");
        assert!(!rescore.is_empty());
        for rescore in [Rescore::default(), rescore] {
            let settings = Settings {
                factor: 0.7,
                incumbents_first: true,
                rescore: &rescore,
            };
            let one = favour_in_parts(&inst, Some(&previous), &settings, 1).expect("favour");
            assert!(!one.moved.cluster.is_empty(), "some units are copied aside");
            assert!(one.promote.iter().any(|p| p[0] != 0), "some are promoted");
            for parts in [2, 3, 7] {
                let other =
                    favour_in_parts(&inst, Some(&previous), &settings, parts).expect("favour");
                assert!(one == other, "{parts} parts");
            }
        }
    }

    #[test]
    fn a_measured_score_reorders_and_moves_a_unit() {
        let inst = instance();
        let (m, a, b) = (0, 0, 1);
        // Measured: "a" at 80 ms, "b" at 12 ms; cold, "m" goes to "b".
        let rescore = Rescore::new(&inst, [(m, a, 80.0), (m, b, 12.0)]).expect("valid");
        let eff = effective_preferences(&inst, None, &Stickiness::default(), &rescore)
            .expect("preferences");
        let firsts: Vec<(u32, f32)> = eff.candidates(m).map(|c| (c.cluster, c.score)).collect();
        assert_eq!(firsts, vec![(b, 12.0), (a, 80.0)]);
        let sol = solve(&eff, &SolveOptions::default());
        assert!(verify(&eff, &sol.map).is_ok());
        assert_eq!(sol.map.allocations(m)[0].cluster, b);
        // Seeded from a map with "m" at "a": within the margin it stays, beyond it it moves.
        let prev = previous(&inst, "a");
        let near = Rescore::new(&inst, [(m, a, 10.5), (m, b, 10.0)]).expect("valid");
        let eff = effective_preferences(&inst, Some(&prev), &Stickiness::default(), &near)
            .expect("preferences");
        let warm = solve_seeded(&eff, &prev, &SolveOptions::default());
        assert_eq!(warm.map.allocations(m)[0].cluster, a, "within the margin");
        let eff = effective_preferences(&inst, Some(&prev), &Stickiness::default(), &rescore)
            .expect("preferences");
        let warm = solve_seeded(&eff, &prev, &SolveOptions::default());
        assert!(verify(&eff, &warm.map).is_ok());
        assert_eq!(warm.map.allocations(m)[0].cluster, b, "beyond the margin");
        // Only the measured unit was copied aside.
        let moved = eff.favour.as_ref().map_or(0, |f| f.moved.cluster.len());
        assert_eq!(moved, 2);
    }

    #[test]
    fn reorderings_are_admitted_a_bounded_number_a_round() {
        use crate::rescore::admitted;
        let inst = instance();
        let none = Rescore::default();
        let flips = Rescore::new(&inst, [(0, 0, 80.0), (0, 1, 12.0)]).expect("valid");
        // Reordering m is held back at a bound of 0, taken at 1.
        let (got, held) = admitted(&inst, &flips, &none, 0);
        assert!(got.is_empty());
        assert_eq!(held, 1);
        let (got, held) = admitted(&inst, &flips, &none, 1);
        assert_eq!((got.score(0, 1), held), (Some(12.0), 0));
        // Scores that keep the order are always taken.
        let same = Rescore::new(&inst, [(0, 0, 5.0), (0, 1, 6.0)]).expect("valid");
        let (got, held) = admitted(&inst, &same, &none, 0);
        assert_eq!((got.score(0, 0), held), (Some(5.0), 0));
        // Once taken, new figures in the same order pass; going back to the estimates is a
        // reordering too, held back at a bound of 0 (the old scores kept).
        let again = Rescore::new(&inst, [(0, 0, 70.0), (0, 1, 11.0)]).expect("valid");
        let (got, held) = admitted(&inst, &again, &flips, 0);
        assert_eq!((got.score(0, 1), held), (Some(11.0), 0));
        let (got, held) = admitted(&inst, &none, &flips, 0);
        assert_eq!((got.score(0, 1), held), (Some(12.0), 1));
    }

    #[test]
    fn bad_measurements_are_refused_by_name() {
        let inst = instance();
        for score in [0.0, -1.0, f32::NAN, f32::INFINITY, 1e9] {
            let err = Rescore::new(&inst, [(0, 0, score)]).expect_err("a bad score");
            assert!(err.to_string().contains("\"m\""), "{err}");
        }
        let err = Rescore::new(&inst, [(0, 0, 5.0), (0, 0, 6.0)]).expect_err("twice");
        assert!(err.to_string().contains("twice"), "{err}");
        assert!(Rescore::new(&inst, [(2, 0, 5.0)]).is_err(), "no unit 2");
        assert!(Rescore::new(&inst, [(0, 2, 5.0)]).is_err(), "no cluster 2");
        // "n" has no candidate "b": left out, counted.
        let r = Rescore::new(&inst, [(1, 1, 5.0)]).expect("valid");
        assert!(r.is_empty());
        assert_eq!(r.not_candidates(), 1);
    }

    #[test]
    fn bad_settings_are_refused() {
        let inst = instance();
        let prev = previous(&inst, "b");
        for margin in [-0.1, 0.95, f64::NAN, f64::INFINITY] {
            let err = favour_incumbents(&inst, &prev, &Stickiness::margin(margin));
            assert!(matches!(err, Err(ModelError::BadNumber { .. })), "{margin}");
        }
        let short = Map::with_capacity(0, 0);
        assert!(matches!(
            favour_incumbents(&inst, &short, &Stickiness::default()),
            Err(ModelError::MapShape { .. })
        ));
    }
}
