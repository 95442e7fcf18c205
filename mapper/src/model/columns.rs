//! The instance's unit columns: map units column-wise, and the candidates of all units in one
//! arena with each unit's first candidate (its head) written down beside them.
//!
//! Promises: unit `u`'s candidates are `cand_start[u]..cand_start[u + 1]` of the arena, in
//! the unit's preference order; `head[u]` is the first of them (cluster, and the rank its
//! cluster gives the unit), written when the unit's candidates are; explicit ranks exist only
//! when some candidate has one, [`NO_RANK`] standing for none.

use super::limits::{ClassIdx, ClusterIdx};

/// The stored rank of a candidate without an explicit `cluster_rank`.
pub(crate) const NO_RANK: f32 = f32::INFINITY;

/// Strings in one buffer: string `i` is `text[end[i - 1]..end[i]]` (from 0 for the first).
/// Millions of map unit ids cost their bytes and 4 more each, where a `Box<str>` each cost 16
/// more and the allocator's rounding. The text is at most `u32::MAX` bytes ([`Names::push`]
/// refuses more).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Names {
    text: String,
    end: Vec<u32>,
}

impl Names {
    pub(crate) fn len(&self) -> usize {
        self.end.len()
    }

    pub(crate) fn get(&self, i: usize) -> &str {
        let start = if i == 0 { 0 } else { self.end[i - 1] as usize };
        &self.text[start..self.end[i] as usize]
    }

    /// Whether `name` can be appended (the text stays within `u32::MAX` bytes).
    pub(crate) fn fits(&self, name: &str) -> bool {
        u32::try_from(self.text.len() + name.len()).is_ok()
    }

    /// Appends `name`, if it [`fits`](Self::fits); false (and nothing appended) if not.
    pub(crate) fn push(&mut self, name: &str) -> bool {
        let Ok(end) = u32::try_from(self.text.len() + name.len()) else {
            return false;
        };
        self.text.push_str(name);
        self.end.push(end);
        true
    }

    pub(crate) fn reserve_exact(&mut self, names: usize, bytes: usize) {
        self.end.reserve_exact(names);
        self.text.reserve_exact(bytes);
    }

    /// The index of `name` in names sorted in increasing order.
    pub(crate) fn binary_search(&self, name: &str) -> Result<usize, usize> {
        let (mut lo, mut hi) = (0, self.len());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match self.get(mid).cmp(name) {
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
                std::cmp::Ordering::Equal => return Ok(mid),
            }
        }
        Err(lo)
    }

    /// The text, and each name's end in it.
    pub(crate) fn parts(&self) -> (&str, &[u32]) {
        (&self.text, &self.end)
    }

    /// Bytes of text.
    pub(crate) fn text_len(&self) -> usize {
        self.text.len()
    }

    /// Bytes held (the text's and the ends' capacity).
    pub(crate) fn heap_bytes(&self) -> usize {
        self.text.capacity() + self.end.capacity() * 4
    }
}

/// Map units, column-wise. Candidates of unit `u` are at `cand_start[u]..cand_start[u + 1]`
/// of the [`CandidateColumns`].
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct MapUnits {
    pub(crate) ids: Names,
    pub(crate) class: Vec<ClassIdx>,
    /// Filled while building only (empty in an instance, which keeps its demand apart in
    /// `Instance::demand`; the name keeps instance code from reading it by mistake).
    pub(crate) building_demand: Vec<f64>,
    pub(crate) lat: Vec<f32>,
    pub(crate) lon: Vec<f32>,
    pub(crate) cand_start: Vec<u32>,
}

/// The candidates of all map units in one arena, each unit's in its preference order. Kept apart
/// from [`MapUnits`] so that an instance with other preferences (stickiness) shares everything
/// else.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct CandidateColumns {
    pub(crate) cluster: Vec<ClusterIdx>,
    pub(crate) score: Vec<f32>,
    /// Explicit cluster ranks, [`NO_RANK`] where none was given; absent when no candidate has
    /// one. (Input ranks are finite, so infinity is free to mean "none" and compares equal.)
    pub(crate) rank: Option<Vec<f32>>,
    /// Each unit's first candidate (a placeholder for a unit without candidates), written
    /// down with the unit: the passes over every unit of a warm round (stickiness, seeding)
    /// read little else of most units, and 8 bytes a unit stream where a unit's candidate
    /// lines (twice 64 bytes at 16 candidates) do not. Empty in [`Favour::moved`].
    pub(crate) head: Vec<Head>,
}

/// A unit's first candidate in its instance's arena: its cluster, and the rank that cluster
/// gives the unit (the explicit rank if any, else the score).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Head {
    pub(crate) cluster: ClusterIdx,
    pub(crate) rank: f32,
}

impl CandidateColumns {
    /// Appends the head of a unit whose candidates are the arena's entries from `start` on.
    #[inline]
    pub(super) fn push_head(&mut self, start: usize) {
        let head = match self.cluster.get(start) {
            None => Head::default(),
            Some(&cluster) => Head {
                cluster,
                rank: match self.rank.as_ref().map(|r| r[start]) {
                    Some(r) if r != NO_RANK => r,
                    _ => self.score[start],
                },
            },
        };
        self.head.push(head);
    }
}

#[cfg(test)]
mod tests {
    use super::Names;

    #[test]
    fn names_read_back_as_pushed_and_are_found_as_a_sorted_list_would_find_them() {
        let list: Vec<String> = (0..500u32)
            .map(|i| format!("u{}", i.wrapping_mul(2_654_435_761) % 10_007))
            .chain(["".to_string(), "ü-ñ".to_string()])
            .collect();
        let mut sorted = list.clone();
        sorted.sort();
        sorted.dedup();
        let mut names = Names::default();
        for n in &sorted {
            assert!(names.fits(n) && names.push(n));
        }
        assert_eq!(names.len(), sorted.len());
        assert_eq!(
            names.text_len(),
            sorted.iter().map(String::len).sum::<usize>()
        );
        for (i, n) in sorted.iter().enumerate() {
            assert_eq!(names.get(i), n);
        }
        for probe in list
            .iter()
            .map(String::as_str)
            .chain(["", "u", "u99999", "zz", "a"])
        {
            assert_eq!(
                names.binary_search(probe),
                sorted.binary_search_by(|s| s.as_str().cmp(probe)),
                "{probe:?}"
            );
        }
    }
}
