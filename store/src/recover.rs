//! What a start reads from the store, falling back where a stored file is damaged instead of
//! refusing to start, and saying what it skipped ([`Store::start_topology`],
//! [`Store::start_served`]).
//!
//! **The topology.** The newest snapshot that reads, with the journal's edits after it
//! replayed (the journal is kept from the oldest kept snapshot on, so an older snapshot gives
//! the same topology); when none reads, the configured topology (`initial`) as the topology
//! before edit 1 — exactly so when it is what the snapshot of edit 0 held (its file's header,
//! the value's length and checksum, says so even when its contents are damaged), with every
//! journaled edit replayed. Only when the edits before the journal's first are in no readable
//! snapshot are acknowledged edits lost, and the start says so, naming them. An edit that no
//! longer applies (a tree deeper than this build takes, stored by an older one) is skipped,
//! named. A damaged journal entry (or a gap in its numbers) ends the replay there: the edits
//! from it on are lost, and said so; the damaged segment is copied to `damaged/` and cut to
//! the entries before the damage, the segments after it moved there, and the journal goes on
//! after the last edit that reads. Damaged snapshots are moved to `damaged/` in the store's
//! directory, and the topology the start serves is written as a snapshot, so the next start
//! reads it.
//!
//! **The served map.** The served record, as a start always read it; when it (or its base)
//! is damaged, the stored versions are moved to `damaged/` (every older version is a delta
//! against it: none reads without it) and the start serves no map until its first round,
//! which is cold; the estimator's checkpoint and entries are files of their own, read still.
//! When the topology is not exactly the stored one, the records go the same way: their bases
//! are gone.
//!
//! What is not a damaged file — the disk failing a read — is still an error: moving files
//! aside then would only lose them.

use cdnmap_mapper::Limits;
use cdnmap_topology::Topology;

use super::read::{replay_skipping, snapshot};
use super::{snapshot_name, snapshots, version_files, Served, Store, StoreError};

/// The topology a start serves ([`Store::start_topology`]).
#[derive(Debug)]
pub struct StartTopology {
    pub topology: Topology,
    /// The journal's sequence number of its last edit.
    pub seq: u64,
    /// Whether the store held no topology (`initial` was stored as its first).
    pub fresh: bool,
    /// Whether it is the topology after every acknowledged edit, as the writer last published
    /// it (false: some were lost or skipped, said in `skipped`).
    pub exact: bool,
    /// What was skipped, each naming a file or an edit and why.
    pub skipped: Vec<String>,
    /// What replaying the journal onto the snapshot cost (`Applied::cost`, summed): the
    /// topology writer goes on counting from it, so a snapshot is taken once replays cost
    /// more than `topology::replay_budget`, however many starts the edits were made across.
    pub replayed: u64,
}

/// The served map a start serves ([`Store::start_served`]).
#[derive(Debug, Default)]
pub struct StartServed {
    pub served: Option<Served>,
    /// The version of the served record moved aside, if one was: the estimator's entries up
    /// to it are still read.
    pub skipped_version: Option<u64>,
    pub skipped: Vec<String>,
}

/// Whether `e` says a file's contents are damaged (not that the disk failed to read it).
fn damaged(e: &StoreError) -> bool {
    matches!(e, StoreError::Corrupt { .. })
}

impl Store {
    /// The topology a start serves (module docs): the stored one, falling back past damaged
    /// snapshots; `initial` (called only when no snapshot reads) on a new store, stored as its
    /// first topology.
    pub fn start_topology<E: std::fmt::Display>(
        &self,
        limits: Limits,
        initial: impl FnOnce() -> Result<Topology, E>,
    ) -> Result<StartTopology, StoreError> {
        let initial_error = |e: E| StoreError::Corrupt {
            what: "the configured topology".into(),
            problem: e.to_string(),
        };
        let last = self.journal.last()?;
        let damage = self.journal.damage()?;
        let snaps = snapshots(&self.values)?;
        if snaps.is_empty() && last == 0 && damage.is_none() {
            let topology = initial().map_err(initial_error)?;
            self.put_topology(&topology)?;
            return Ok(StartTopology {
                topology,
                seq: 0,
                fresh: true,
                exact: true,
                skipped: Vec::new(),
                replayed: 0,
            });
        }
        let mut skipped = Vec::new();
        let mut unreadable = Vec::new();
        if let Some(d) = &damage {
            // The edits before the damage are replayed; those from it on are lost, said here.
            // (A replica gets them again from the replicas' log in etcd, where it still holds
            // them: it applies that log from its last edit on.)
            let moved = self.journal.set_aside_damage(&self.damaged)?;
            let moved: Vec<String> = moved.iter().map(|p| p.display().to_string()).collect();
            skipped.push(format!(
                "{}: the acknowledged edits from {} on cannot be replayed and are lost; the \
                 journal goes on after edit {last}, its damaged bytes kept in {}",
                d.problem,
                d.lost_from,
                moved.join(", ")
            ));
        }
        let mut base = None;
        for (seq, name) in snaps.iter().rev() {
            match snapshot(&self.values, name, limits) {
                Ok(t) => {
                    base = Some((t, *seq));
                    break;
                }
                Err(e) if damaged(&e) => {
                    skipped.push(format!("{e}"));
                    unreadable.push((*seq, name.clone()));
                }
                Err(e) => return Err(e),
            }
        }
        let mut exact = true;
        let (topology, from) = match base {
            Some(b) => b,
            None => {
                let topology = initial().map_err(initial_error)?;
                let first = self.journal.first()?.unwrap_or(last + 1);
                // The snapshot of edit 0 (damaged) held exactly the configured topology?
                let zero = unreadable.iter().find(|s| s.0 == 0).map(|s| s.1.clone());
                let same = match &zero {
                    Some(name) => self
                        .values
                        .held(name, |w| cdnmap_topology::compact::encode_to(&topology, w))?,
                    None => false,
                };
                if let (true, true, Some(name)) = (same, first <= 1, &zero) {
                    skipped.push(format!(
                        "the configured topology is what the snapshot {name} held (its length \
                         and checksum say so): it is written again, and every journaled edit \
                         replayed onto it"
                    ));
                    self.values.set_aside(name, &self.damaged)?;
                    unreadable.retain(|s| &s.1 != name);
                    self.values.put_with(&snapshot_name(0), |w| {
                        cdnmap_topology::compact::encode_to(&topology, w)
                    })?;
                } else {
                    exact = false;
                    skipped.push(if first > 1 {
                        format!(
                            "no snapshot reads, and edits 1 to {} were only in them: those \
                             acknowledged edits are lost; the configured topology is served \
                             with the journal's edits {first} to {last} replayed onto it",
                            first - 1
                        )
                    } else {
                        format!(
                            "no snapshot reads: the configured topology is served with the \
                             journal's {last} edits replayed onto it, which is the topology \
                             last published only if the configuration is what the store was \
                             first started with"
                        )
                    });
                }
                (topology, first.saturating_sub(1))
            }
        };
        let entries = self.journal.read(from, last)?;
        let (topology, refused, replayed) =
            replay_skipping(topology, from, &entries, self.journal.dir());
        if damage.is_some() || !refused.is_empty() {
            exact = false;
            skipped.extend(refused);
        }
        let seq = last.max(from);
        if !skipped.is_empty() {
            for (_, name) in &unreadable {
                self.values.set_aside(name, &self.damaged)?;
            }
            // The topology served, as the snapshot the next start reads.
            self.put_snapshot(seq, &topology)?;
        }
        Ok(StartTopology {
            topology,
            seq,
            fresh: false,
            exact,
            // The snapshot just written (after a skip) has nothing to replay after it.
            replayed: if skipped.is_empty() { replayed } else { 0 },
            skipped,
        })
    }

    /// The served map a start serves (module docs), given the topology it serves (`start`):
    /// the served record, read on it ([`Self::served_on`]); when that record is damaged, or
    /// the topology is not exactly the stored one, none, the stored versions moved aside.
    pub fn start_served(&self, start: &StartTopology) -> Result<StartServed, StoreError> {
        let newest = version_files(&self.values)?.last().map(|f| f.version);
        let Some(newest) = newest else {
            return Ok(StartServed::default());
        };
        let problem = if start.exact {
            match self.served_on(&start.topology, start.seq) {
                Ok(served) => {
                    return Ok(StartServed {
                        served,
                        ..StartServed::default()
                    })
                }
                Err(e) if damaged(&e) => format!("{e}"),
                Err(e) => return Err(e),
            }
        } else {
            "its topology is not the one served".into()
        };
        let files = version_files(&self.values)?;
        for f in &files {
            self.values.set_aside(&f.name, &self.damaged)?;
        }
        Ok(StartServed {
            served: None,
            skipped_version: Some(newest),
            skipped: vec![format!(
                "the served map, version {newest}: {problem}; its {} files (that version and \
                 the older ones kept as deltas of it) are moved to {}, and the first round \
                 maps afresh",
                files.len(),
                self.damaged.display()
            )],
        })
    }
}
