//! The topology's journal: every acknowledged edit (`crate::edit::Edit`, as JSON), numbered
//! from 1 in the order the writer carried them out, appended to segment files in the store's
//! `journal/` directory. The stored topology is the newest snapshot (a value file
//! `topology-<seq>`: the topology after edit `seq`) with the edits after it replayed; a round's
//! record names the topology it was solved from by its sequence number. So an edit costs an
//! append of its own bytes, not a copy of the topology.
//!
//! **Layout.** Segment `seg-NNNNNNNNNNNNNNNNNNNN` is named by the sequence number of its first
//! entry and holds entries framed as the demand record's are (`reports.rs`: length, xxh3,
//! time, the sequence number as the id, the payload), numbered without a gap. A new segment
//! starts when the last passes [`SEGMENT_BYTES`], so that whole segments can be dropped once a
//! snapshot covers them.
//!
//! **What is durable when.** [`Journal::append`] returns after the entry is synced (and a new
//! segment's directory entry), so an acknowledged edit survives kill -9. An entry cut short by
//! a crash can only be the last segment's last, never acknowledged: it is cut off when the
//! journal opens. Anything else that cannot be read — a damaged entry, a gap in the numbers —
//! is [`Damage`]: the edits from there on cannot be replayed. The journal opens with the
//! edits before it, and refuses every append until the start has said what is lost and set
//! the damaged bytes aside ([`Journal::set_aside_damage`], `recover`): serving a
//! topology without them undoes acknowledged changes, which a start must not do silently.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::reports::{cut_off, file_error, frame, parse, segments_in, torn, PREFIX};
use super::values::{remove_if_present, sync_dir};
use super::StoreError;

/// A segment is closed and a new one started once it holds this many bytes.
const SEGMENT_BYTES: u64 = 4 << 20;
/// The largest entry (an edit is one cluster or one map unit: far below this).
pub(super) const MAX_ENTRY: usize = 1 << 20;

/// Journal entries: (sequence number, the entry's bytes), in order.
pub(super) type Entries = Vec<(u64, Vec<u8>)>;

/// The journal of one store (cloning shares it).
#[derive(Debug, Clone)]
pub(super) struct Journal {
    dir: PathBuf,
    inner: Arc<Mutex<Inner>>,
}

#[derive(Debug, Default)]
struct Inner {
    /// The first sequence number of each segment, oldest first; the last is appended to.
    segments: Vec<u64>,
    /// The last segment, open to append, and its length.
    file: Option<(File, u64)>,
    /// The last sequence number appended (0: none yet).
    last: u64,
    /// An append failed and its bytes could not be taken back: no more appends until the
    /// store is opened again (which cuts them off).
    broken: bool,
    /// Where the journal stops being readable, found at the open: no appends until it is set
    /// aside.
    damage: Option<Damage>,
}

/// Where a journal stops being readable: a damaged entry, or a gap in the numbers. The edits
/// from `lost_from` on cannot be replayed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Damage {
    /// The first edit that cannot be read.
    pub(super) lost_from: u64,
    /// The first sequence number of the segment it is in, and how many bytes of whole
    /// entries come before it there.
    segment: u64,
    valid: usize,
    /// What is wrong, naming the segment.
    pub(super) problem: String,
}

fn segment_name(first: u64) -> String {
    format!("{PREFIX}{first:020}")
}

/// The entries of one segment (its bytes), checked: numbered from `first` without a gap.
/// Returns the entries up to the first that does not read, how many bytes they take, and
/// what is wrong after them, if anything; `tail_ok` says whether bytes after the last whole
/// entry may be an entry cut short by a crash (the last segment's), which is then not an
/// error.
fn entries_of(
    path: &Path,
    bytes: &[u8],
    first: u64,
    tail_ok: bool,
) -> (Entries, usize, Option<StoreError>) {
    let corrupt = |problem: String| StoreError::Corrupt {
        what: format!("the topology journal's {}", path.display()),
        problem,
    };
    let (records, valid) = parse(bytes);
    let mut out = Vec::with_capacity(records.len());
    let mut end = 0;
    for (i, r) in records.iter().enumerate() {
        let want = first + i as u64;
        if r.id != want {
            let problem = format!("entry {} is numbered {}, not {want}", i + 1, r.id);
            return (out, end, Some(corrupt(problem)));
        }
        out.push((r.id, bytes[r.payload.clone()].to_vec()));
        end = r.payload.end;
    }
    if valid < bytes.len() && !(tail_ok && torn(&bytes[valid..])) {
        let problem = format!(
            "the entry at byte {valid} is damaged (the edits from there on cannot be replayed)"
        );
        return (out, valid, Some(corrupt(problem)));
    }
    (out, valid, None)
}

/// The entries after `after` up to `upto` (inclusive) of the journal in `dir`, read without
/// opening it for writing (`cdnmap store dump` beside a running server). An entry cut short
/// at the end is an append in progress, not read.
pub(super) fn read_dir(
    dir: &Path,
    after: u64,
    upto: u64,
) -> Result<Vec<(u64, Vec<u8>)>, StoreError> {
    if upto <= after {
        return Ok(Vec::new());
    }
    let segments = segments_in(dir)?;
    let mut out = Vec::new();
    for (i, &first) in segments.iter().enumerate() {
        let next = segments.get(i + 1).copied();
        // Wholly at or before `after`, or after `upto`: not read.
        if next.is_some_and(|n| n <= after + 1) || first > upto {
            continue;
        }
        let path = dir.join(segment_name(first));
        let bytes = match fs::read(&path) {
            Ok(b) => b,
            // Dropped since it was listed (a snapshot covers it): what was asked for is
            // after it, or the caller's snapshot is gone too and it says so.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(file_error(format!("reading {}", path.display()))(e)),
        };
        let (entries, _, damage) = entries_of(&path, &bytes, first, next.is_none());
        let read_to = entries.last().map_or(first.saturating_sub(1), |e| e.0);
        out.extend(
            entries
                .into_iter()
                .filter(|(s, _)| *s > after && *s <= upto),
        );
        // Damage after every edit asked for is no concern of this read.
        match damage {
            Some(e) if read_to < upto => return Err(e),
            Some(_) => break,
            None => {}
        }
    }
    // What was asked for and is there must come without a gap.
    let want = upto.min(out.last().map_or(after, |e| e.0));
    if out.first().is_some_and(|e| e.0 != after + 1) || out.len() as u64 != want - after {
        return Err(StoreError::Corrupt {
            what: format!("the topology journal in {}", dir.display()),
            problem: format!(
                "the edits after {after} are not all there (found {} from {:?})",
                out.len(),
                out.first().map(|e| e.0)
            ),
        });
    }
    Ok(out)
}

impl Journal {
    /// Opens (creating) the journal in `dir`, cutting off an entry a crash left cut short.
    pub(super) fn open(dir: &Path) -> Result<Journal, StoreError> {
        fs::create_dir_all(dir).map_err(file_error(format!("creating {}", dir.display())))?;
        let mut segments = segments_in(dir)?;
        let mut last = 0;
        let mut damage = None;
        for (i, &first) in segments.iter().enumerate() {
            let is_last = i + 1 == segments.len();
            let path = dir.join(segment_name(first));
            let bytes =
                fs::read(&path).map_err(file_error(format!("reading {}", path.display())))?;
            if i > 0 && first != last + 1 {
                damage = Some(Damage {
                    lost_from: last + 1,
                    segment: first,
                    valid: 0,
                    problem: format!(
                        "the topology journal's {}: it starts at edit {first}, after edit {last}",
                        path.display()
                    ),
                });
                break;
            }
            let (entries, valid, problem) = entries_of(&path, &bytes, first, is_last);
            last = entries.last().map_or(first.saturating_sub(1), |e| e.0);
            if let Some(problem) = problem {
                damage = Some(Damage {
                    lost_from: last + 1,
                    segment: first,
                    valid,
                    problem: problem.to_string(),
                });
                break;
            }
            if valid < bytes.len() {
                // An append a crash cut short: never acknowledged.
                cut_off(&path, valid)?;
                tracing::warn!(segment = %path.display(), "an edit cut short by a crash was cut off (it was never acknowledged)");
            }
        }
        if let Some(d) = &damage {
            // The segments from the damaged one on hold nothing that reads in order.
            segments.retain(|&first| first < d.segment || (first == d.segment && d.valid > 0));
        }
        Ok(Journal {
            dir: dir.to_path_buf(),
            inner: Arc::new(Mutex::new(Inner {
                segments,
                file: None,
                last,
                broken: false,
                damage,
            })),
        })
    }

    /// Where the journal stops being readable, as found at the open (`None`: it reads whole,
    /// or the damage was set aside).
    pub(super) fn damage(&self) -> Result<Option<Damage>, StoreError> {
        Ok(self.lock()?.damage.clone())
    }

    /// Sets the journal's damage aside, so appends go on after the last edit that reads: the
    /// damaged segment is copied whole into `to` and cut to the entries before the damage, and
    /// the segments after it are moved there. Durable when it returns. Returns the segment
    /// files set aside.
    pub(super) fn set_aside_damage(&self, to: &Path) -> Result<Vec<PathBuf>, StoreError> {
        let mut inner = self.lock()?;
        let Some(d) = inner.damage.clone() else {
            return Ok(Vec::new());
        };
        fs::create_dir_all(to).map_err(file_error(format!("creating {}", to.display())))?;
        let mut moved = Vec::new();
        for first in segments_in(&self.dir)?
            .into_iter()
            .filter(|&f| f >= d.segment)
        {
            let name = segment_name(first);
            let (from, into) = (self.dir.join(&name), to.join(format!("journal-{name}")));
            if first == d.segment && d.valid > 0 {
                fs::copy(&from, &into).map_err(file_error(format!(
                    "copying {} to {}",
                    from.display(),
                    into.display()
                )))?;
                File::open(&into)
                    .and_then(|f| f.sync_all())
                    .map_err(file_error(format!("syncing {}", into.display())))?;
                cut_off(&from, d.valid)?;
            } else {
                fs::rename(&from, &into).map_err(file_error(format!(
                    "moving {} to {}",
                    from.display(),
                    into.display()
                )))?;
            }
            moved.push(into);
        }
        sync_dir(to)?;
        sync_dir(&self.dir)?;
        inner.damage = None;
        Ok(moved)
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, Inner>, StoreError> {
        self.inner.lock().map_err(|_| StoreError::Corrupt {
            what: "the topology journal".into(),
            problem: "a writer panicked while holding it".into(),
        })
    }

    pub(super) fn dir(&self) -> &Path {
        &self.dir
    }

    /// The last sequence number appended (0 when none ever was).
    pub(super) fn last(&self) -> Result<u64, StoreError> {
        Ok(self.lock()?.last)
    }

    /// The first sequence number the journal still holds (the edits before it were dropped,
    /// a snapshot covering them); `None` when it holds none.
    pub(super) fn first(&self) -> Result<Option<u64>, StoreError> {
        let inner = self.lock()?;
        Ok(inner
            .segments
            .first()
            .copied()
            .filter(|&first| first <= inner.last))
    }

    /// Appends `entry` (received at `at_ms`) as the next edit, synced; returns its sequence
    /// number.
    pub(super) fn append(&self, at_ms: i64, entry: &[u8]) -> Result<u64, StoreError> {
        let what = || format!("appending an edit to {}", self.dir.display());
        if entry.len() > MAX_ENTRY {
            return Err(StoreError::Corrupt {
                what: what(),
                problem: format!("{} bytes, more than {MAX_ENTRY}", entry.len()),
            });
        }
        let mut inner = self.lock()?;
        if let Some(d) = &inner.damage {
            return Err(StoreError::Corrupt {
                what: what(),
                problem: format!(
                    "{}; a start sets it aside before an edit is appended",
                    d.problem
                ),
            });
        }
        if inner.broken {
            return Err(StoreError::Corrupt {
                what: what(),
                problem: "an earlier append failed and could not be taken back: restart the \
                          service (the store cuts it off when opened)"
                    .into(),
            });
        }
        let seq = inner.last + 1;
        let full = inner
            .file
            .as_ref()
            .is_none_or(|(_, len)| *len >= SEGMENT_BYTES);
        if full {
            // A segment is named by its first entry: a new one, or the last one reopened
            // when it has room.
            let reuse = inner.file.is_none()
                && inner.segments.last().is_some_and(|&first| {
                    fs::metadata(self.dir.join(segment_name(first)))
                        .is_ok_and(|m| m.len() < SEGMENT_BYTES)
                });
            let first = if reuse {
                inner.segments.last().copied().unwrap_or(seq)
            } else {
                seq
            };
            let path = self.dir.join(segment_name(first));
            let file = OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .map_err(file_error(format!("opening {}", path.display())))?;
            let len = file
                .metadata()
                .map_err(file_error(format!("reading {}", path.display())))?
                .len();
            if !reuse {
                sync_dir(&self.dir)?;
                inner.segments.push(first);
            }
            inner.file = Some((file, len));
        }
        let record = frame(at_ms, seq, entry);
        let Some((file, len)) = inner.file.as_mut() else {
            return Err(StoreError::Corrupt {
                what: what(),
                problem: "no segment is open".into(),
            });
        };
        let before = *len;
        if let Err(e) = file.write_all(&record).and_then(|()| file.sync_data()) {
            // Take back what may have been written, so the next entry follows a whole one.
            let undone = file.set_len(before).and_then(|()| file.sync_data()).is_ok();
            inner.broken = !undone;
            return Err(file_error(what())(e));
        }
        *len += record.len() as u64;
        inner.last = seq;
        Ok(seq)
    }

    /// The entries after `after` up to `upto`, in order.
    pub(super) fn read(&self, after: u64, upto: u64) -> Result<Entries, StoreError> {
        let _appends_wait = self.lock()?;
        read_dir(&self.dir, after, upto)
    }

    /// Drops the segments whose every entry is at or before `seq` (a snapshot covers them),
    /// never the one appended to.
    pub(super) fn drop_through(&self, seq: u64) -> Result<(), StoreError> {
        let mut inner = self.lock()?;
        while inner.segments.len() > 1 && inner.segments[1] <= seq + 1 {
            let first = inner.segments.remove(0);
            remove_if_present(&self.dir.join(segment_name(first)))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(n: u64) -> Vec<u8> {
        format!("edit {n} {}", "x".repeat((n % 7) as usize * 100)).into_bytes()
    }

    #[test]
    fn entries_come_back_in_order_across_segments_and_reopens() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("journal");
        let j = Journal::open(&path).expect("open");
        assert_eq!(j.last().expect("last"), 0);
        assert!(j.read(0, u64::MAX).expect("read").is_empty());
        for n in 1..=50 {
            assert_eq!(j.append(n as i64, &entry(n)).expect("append"), n);
        }
        drop(j);
        let j = Journal::open(&path).expect("reopen");
        assert_eq!(j.last().expect("last"), 50);
        for n in 51..=60 {
            assert_eq!(j.append(n as i64, &entry(n)).expect("append"), n);
        }
        let all = j.read(0, u64::MAX).expect("read");
        assert_eq!(all, (1..=60).map(|n| (n, entry(n))).collect::<Vec<_>>());
        assert_eq!(
            j.read(10, 20).expect("read"),
            (11..=20).map(|n| (n, entry(n))).collect::<Vec<_>>()
        );
        assert!(j.read(60, u64::MAX).expect("read").is_empty());
    }

    /// A crash cuts the last entry short: cut off at the open. A damaged entry elsewhere
    /// (issue 41: a start falls back past damage) opens the journal with the edits before it,
    /// refuses appends until it is set aside, and then goes on after the last edit that reads,
    /// the damaged bytes kept where they were moved.
    #[test]
    fn an_entry_cut_short_is_cut_off_and_damage_elsewhere_ends_the_journal_there() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("journal");
        let j = Journal::open(&path).expect("open");
        for n in 1..=3 {
            j.append(0, &entry(n)).expect("append");
        }
        drop(j);
        let seg = path.join(segment_name(1));
        let whole = fs::read(&seg).expect("read");
        // A crash in the middle of appending edit 4.
        let four = frame(0, 4, &entry(4));
        let mut cut = whole.clone();
        cut.extend_from_slice(&four[..four.len() / 2]);
        fs::write(&seg, &cut).expect("write");
        let j = Journal::open(&path).expect("open cuts it off");
        assert_eq!(j.last().expect("last"), 3);
        assert_eq!(fs::read(&seg).expect("read"), whole);
        assert_eq!(j.append(0, &entry(4)).expect("append"), 4);
        drop(j);
        // A damaged byte inside edit 2: the edits from there cannot be replayed.
        let mut bad = fs::read(&seg).expect("read");
        let at = frame(0, 1, &entry(1)).len() + 30;
        bad[at] ^= 0x55;
        fs::write(&seg, &bad).expect("write");
        let j = Journal::open(&path).expect("opens with the edits before the damage");
        assert_eq!(j.last().expect("last"), 1);
        let d = j.damage().expect("damage").expect("the damage found");
        assert_eq!(d.lost_from, 2);
        assert!(
            d.problem.contains("seg-") && d.problem.contains("damaged"),
            "{d:?}"
        );
        assert_eq!(
            j.read(0, 1).expect("before the damage"),
            vec![(1, entry(1))]
        );
        let err = read_dir(&path, 0, u64::MAX).expect_err("damaged");
        assert!(err.to_string().contains("damaged"), "{err}");
        let err = j.append(0, &entry(2)).expect_err("no append past damage");
        assert!(err.to_string().contains("sets it aside"), "{err}");
        let aside = dir.path().join("damaged");
        let moved = j.set_aside_damage(&aside).expect("set aside");
        assert_eq!(moved.len(), 1);
        assert_eq!(
            fs::read(&moved[0]).expect("kept"),
            bad,
            "the damaged bytes kept whole"
        );
        assert_eq!(j.damage().expect("damage"), None);
        assert_eq!(j.append(0, b"two again").expect("append"), 2);
        drop(j);
        let j = Journal::open(&path).expect("reopen");
        assert_eq!(j.damage().expect("damage"), None);
        assert_eq!(
            j.read(0, u64::MAX).expect("read"),
            vec![(1, entry(1)), (2, b"two again".to_vec())]
        );
    }

    #[test]
    fn covered_segments_are_dropped_and_a_gap_is_an_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("journal");
        let j = Journal::open(&path).expect("open");
        // Entries of 1 MB: five to a segment.
        let big = |n: u64| vec![n as u8; 1_000_000];
        for n in 1..=12 {
            j.append(0, &big(n)).expect("append");
        }
        assert_eq!(
            segments_in(&path).expect("list"),
            vec![1, 6, 11],
            "segments start at their first entry"
        );
        j.drop_through(5).expect("drop");
        assert_eq!(segments_in(&path).expect("list"), vec![6, 11]);
        j.drop_through(8).expect("drop");
        assert_eq!(
            segments_in(&path).expect("list"),
            vec![6, 11],
            "6..10 still holds 9"
        );
        assert_eq!(j.read(7, 12).expect("read").len(), 5);
        let err = j.read(2, 12).expect_err("dropped");
        assert!(err.to_string().contains("not all there"), "{err}");
        j.drop_through(12).expect("drop");
        assert_eq!(
            segments_in(&path).expect("list"),
            vec![11],
            "never the last segment"
        );
        assert_eq!(j.append(0, b"thirteen").expect("append"), 13);
        drop(j);
        let j = Journal::open(&path).expect("reopen");
        assert_eq!(j.last().expect("last"), 13);
        // A segment missing in the middle.
        for n in 14..=25 {
            j.append(0, &big(n)).expect("append");
        }
        drop(j);
        let segs = segments_in(&path).expect("list");
        assert!(segs.len() >= 3, "{segs:?}");
        fs::remove_file(path.join(segment_name(segs[1]))).expect("remove");
        let j = Journal::open(&path).expect("opens up to the gap");
        let d = j.damage().expect("damage").expect("the gap found");
        assert!(d.problem.contains("after edit"), "{d:?}");
        assert_eq!(
            (d.lost_from, j.last().expect("last")),
            (segs[1], segs[1] - 1)
        );
        let moved = j
            .set_aside_damage(&dir.path().join("damaged"))
            .expect("set aside");
        assert_eq!(moved.len(), segs.len() - 2, "the segments after the gap");
        assert_eq!(j.append(0, b"next").expect("append"), segs[1]);
    }
}
