//! The demand record: feedback reports appended to segment files in the store's `reports/`
//! directory, beside sled's files and the value files.
//!
//! Why not sled: sled 0.34 keeps what was inserted in memory whatever its `cache_capacity`
//! (measured at 1 M map units with 100 k demand samples a second: the mapper grew by about
//! 40 MB a round, with a cache of 64 MiB or of 4 MiB alike; `docs/perf/bench-serve.md`), and
//! its `len` walks the whole tree. An append-only log costs its bytes once, in memory only
//! what one segment's count and times take.
//!
//! **Layout.** Segment `seg-NNNNNNNNNNNNNNNNNNNN` (its number, 20 digits) holds records one
//! after the other, each: payload length (u32 LE), xxh3-64 of the rest (u64 LE), the time it
//! was received (i64 LE, Unix ms), its id (u64 LE), then the payload. A new segment starts
//! when the last passes [`SEGMENT_BYTES`].
//!
//! **What is durable when.** [`ReportLog::append`] returns after the record is synced (and a
//! new segment's directory entry), so an acknowledged report survives kill -9. A record cut
//! short by a crash can only be the last segment's last, which was never acknowledged: it is
//! cut off when the log is opened. A damaged record elsewhere ends its segment's reading
//! there (what follows cannot be framed), with a warning.
//!
//! **Retention.** Reads see exactly the reports the last append's bounds keep (those that
//! arrived no more than `retain_ms` before the newest, and the newest `max_reports` of those;
//! the bounds are stored when they change, so a reopened log reads the same); whole segments
//! are deleted once nothing in them is kept, so the disk holds at most one segment more than
//! the bounds.
//!
//! Age is by **arrival**, not by the times reports carry: the log keeps an arrival clock that
//! each append moves on by the wall clock's step since the report before, never back and at
//! most [`MAX_ARRIVAL_STEP_MS`] ([`Arrival`]). So a report appended after another is never
//! older than it, and a jump of the wall clock (ahead, then back) ages the record by at most
//! that step: with the newest time as the measure, a jump of the retention period hid every
//! report before it, and those acknowledged after the clock was put right (60 of 80 in an
//! audit). What that costs: a pause in the feed (the mapper stopped, no front end reporting)
//! ages the record by that step too, so reports are kept for `retain_ms` of arrivals, longer
//! by the wall clock when the feed paused; the count and byte bounds hold whatever the clock.
//! The clock is worked out from the reports' own times in the order they were appended, so a
//! reopened log has it again.
//! Besides, the log takes at most `max_bytes` of disk: while it holds more, its oldest
//! segment is deleted whatever the other bounds say (so the reports a read sees are those of
//! the segments left).

use std::collections::VecDeque;
use std::fs::{self, File, OpenOptions};
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::values::{remove_if_present, sync_dir};
use super::StoreError;

/// Reports with the times they were received, oldest first.
pub type Reports = Vec<(i64, Vec<u8>)>;

/// A segment is closed and a new one started once it holds this many bytes.
pub(super) const SEGMENT_BYTES: u64 = 32 << 20;
/// A record's frame before its payload: length, checksum, time, id.
const FRAME: usize = 4 + 8 + 8 + 8;
/// The largest payload (a report is bounded far below this by the gRPC message limit).
const MAX_PAYLOAD: usize = 64 << 20;
pub(super) const PREFIX: &str = "seg-";
/// The file of the bounds the last append gave: `retain_ms` (i64 LE), `max_reports` (u64 LE).
const BOUNDS: &str = "bounds";
/// The most the arrival clock moves on between two reports ([`Arrival`]): a jump of the wall
/// clock ages the record by no more than this. Front ends report every cycle (10 to 30 s), so
/// a longer step is a pause in the feed or a clock that jumped.
pub(super) const MAX_ARRIVAL_STEP_MS: i64 = 60_000;

/// The arrival clock after a report (module docs): the time the report carries, and the
/// clock, which each report moves on by the step of the times since the report before, at
/// least 0 and at most [`MAX_ARRIVAL_STEP_MS`]. Only differences of the clock mean anything
/// (a reopened log starts it at the first kept report's time).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Arrival {
    at_ms: i64,
    clock_ms: i64,
}

/// The arrival clock after a report received at `at_ms`, appended after the report that left
/// the clock at `before` (`None`: the first report).
fn arrived(before: Option<Arrival>, at_ms: i64) -> Arrival {
    let clock_ms = match before {
        None => at_ms,
        Some(b) => b
            .clock_ms
            .saturating_add(at_ms.saturating_sub(b.at_ms).clamp(0, MAX_ARRIVAL_STEP_MS)),
    };
    Arrival { at_ms, clock_ms }
}

pub(super) fn file_error(what: String) -> impl FnOnce(std::io::Error) -> StoreError {
    move |source| StoreError::File { what, source }
}

/// What an append keeps: reports that arrived at most `retain_ms` before it (by the arrival
/// clock, module docs), the newest `max_reports` of them, in at most `max_bytes` of disk
/// ([`ReportLog::append`]).
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    pub retain_ms: i64,
    pub max_reports: usize,
    pub max_bytes: u64,
}

/// The report log of one store (cloning shares it).
#[derive(Debug, Clone)]
pub(super) struct ReportLog {
    dir: PathBuf,
    inner: Arc<Mutex<Inner>>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Oldest first; the last is the one appended to.
    segments: VecDeque<Segment>,
    /// The last segment, open to append.
    file: Option<File>,
    /// The bounds of the last append (stored in [`BOUNDS`] when they change, so a reopened
    /// log reads as it did): reports that arrived more than `retain_ms` before the newest,
    /// and all but the newest `max_reports`, are not kept.
    retain_ms: i64,
    max_reports: usize,
    /// The arrival clock after the newest report (`None`: none yet).
    newest: Option<Arrival>,
    /// Whether a segment was deleted for the byte bound (said once in the log, not per append).
    bytes_bound_hit: bool,
}

impl Inner {
    /// The arrival clock before which reports are no longer kept.
    fn cutoff_ms(&self) -> i64 {
        self.newest
            .map_or(i64::MIN, |a| a.clock_ms.saturating_sub(self.retain_ms))
    }
}

#[derive(Debug, Clone, Copy)]
struct Segment {
    number: u64,
    count: usize,
    /// Bytes of whole records.
    bytes: u64,
    /// The oldest and newest times its reports carry (for reads of a period).
    oldest_ms: i64,
    newest_ms: i64,
    /// The arrival clock after the report before its first (`None`: none before it), and
    /// after its last (`None`: it is empty).
    before: Option<Arrival>,
    last: Option<Arrival>,
    /// Appended to no more (damaged, or a write to it failed).
    closed: bool,
}

impl Segment {
    /// Whether nothing in it arrived at or after `cutoff_ms` (an empty one: nothing kept).
    fn expired(&self, cutoff_ms: i64) -> bool {
        self.last.is_none_or(|a| a.clock_ms < cutoff_ms)
    }
}

/// One record read back: its time, id, and where its payload is in the bytes it was read from.
pub(super) struct Record {
    pub(super) at_ms: i64,
    pub(super) id: u64,
    pub(super) payload: std::ops::Range<usize>,
}

impl ReportLog {
    /// Opens (creating) the log in `dir`, cutting off a record a crash left cut short.
    pub(super) fn open(dir: &Path) -> Result<ReportLog, StoreError> {
        fs::create_dir_all(dir).map_err(file_error(format!("creating {}", dir.display())))?;
        let log = ReportLog {
            dir: dir.to_path_buf(),
            inner: Arc::new(Mutex::new(Inner {
                max_reports: usize::MAX,
                retain_ms: i64::MAX,
                ..Inner::default()
            })),
        };
        let numbers = segments_in(dir)?;
        let mut segments = VecDeque::new();
        let mut clock: Option<Arrival> = None;
        for (i, &number) in numbers.iter().enumerate() {
            let last = i + 1 == numbers.len();
            let path = log.path(number);
            let bytes =
                fs::read(&path).map_err(file_error(format!("reading {}", path.display())))?;
            let (records, valid) = parse(&bytes);
            let mut closed = false;
            if valid < bytes.len() {
                if last && torn(&bytes[valid..]) {
                    // An append a crash cut short: never acknowledged.
                    cut_off(&path, valid)?;
                } else {
                    closed = true;
                    tracing::warn!(
                        segment = %path.display(),
                        at = valid,
                        "a damaged record in the demand record: the rest of its segment is not read"
                    );
                }
            }
            let before = clock;
            for r in &records {
                clock = Some(arrived(clock, r.at_ms));
            }
            segments.push_back(Segment {
                number,
                count: records.len(),
                bytes: valid as u64,
                oldest_ms: records.iter().map(|r| r.at_ms).min().unwrap_or(i64::MAX),
                newest_ms: records.iter().map(|r| r.at_ms).max().unwrap_or(i64::MIN),
                before,
                last: clock.filter(|_| !records.is_empty()),
                closed,
            });
        }
        let bounds_path = dir.join(BOUNDS);
        let bounds = match fs::read(&bounds_path) {
            Ok(b) => <[u8; 16]>::try_from(b.as_slice()).ok(),
            Err(e) if e.kind() == ErrorKind::NotFound => None,
            Err(e) => return Err(file_error(format!("reading {}", bounds_path.display()))(e)),
        };
        if let Ok(mut inner) = log.inner.lock() {
            inner.newest = clock;
            inner.segments = segments;
            if let Some(b) = bounds {
                let (r, m) = b.split_at(8);
                inner.retain_ms = i64::from_le_bytes(r.try_into().unwrap_or([0xff; 8])).max(0);
                inner.max_reports =
                    usize::try_from(u64::from_le_bytes(m.try_into().unwrap_or([0xff; 8])))
                        .unwrap_or(usize::MAX)
                        .max(1);
            }
        }
        Ok(log)
    }

    fn path(&self, number: u64) -> PathBuf {
        self.dir.join(format!("{PREFIX}{number:020}"))
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, Inner>, StoreError> {
        self.inner.lock().map_err(|_| StoreError::Corrupt {
            what: "the demand record".into(),
            problem: "a writer panicked while holding it".into(),
        })
    }

    /// How many reports the log holds (kept or not yet deleted).
    pub(super) fn count(&self) -> Result<usize, StoreError> {
        Ok(self.lock()?.segments.iter().map(|s| s.count).sum())
    }

    /// Appends the report `payload` received at `at_ms` with `id`, synced, then applies the
    /// bounds: reports that arrived more than `retain_ms` before it (module docs), and all but
    /// the newest `max_reports`, are no longer kept (and their segments deleted once wholly
    /// so); the oldest segments are deleted while the log holds more than `max_bytes`.
    pub(super) fn append(
        &self,
        at_ms: i64,
        id: u64,
        payload: &[u8],
        bounds: Bounds,
    ) -> Result<(), StoreError> {
        let Bounds {
            retain_ms,
            max_reports,
            max_bytes,
        } = bounds;
        if payload.len() > MAX_PAYLOAD {
            return Err(StoreError::Corrupt {
                what: "a report to store".into(),
                problem: format!("{} bytes, more than {MAX_PAYLOAD}", payload.len()),
            });
        }
        let mut inner = self.lock()?;
        let full = inner
            .segments
            .back()
            .is_none_or(|s| s.closed || s.bytes >= SEGMENT_BYTES);
        if full || inner.file.is_none() {
            let number = match inner.segments.back() {
                Some(s) if !full => s.number,
                Some(s) => s.number + 1,
                None => 0,
            };
            let path = self.path(number);
            let file = OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .map_err(file_error(format!("opening {}", path.display())))?;
            if full {
                self.sync_dir()?;
                let before = inner.newest;
                inner.segments.push_back(Segment {
                    number,
                    count: 0,
                    bytes: 0,
                    oldest_ms: i64::MAX,
                    newest_ms: i64::MIN,
                    before,
                    last: None,
                    closed: false,
                });
            }
            inner.file = Some(file);
        }
        let record = frame(at_ms, id, payload);
        let what = || format!("appending a report to {}", self.dir.display());
        let Some(file) = inner.file.as_mut() else {
            return Err(StoreError::Corrupt {
                what: what(),
                problem: "no segment is open".into(),
            });
        };
        if let Err(e) = file.write_all(&record).and_then(|()| file.sync_data()) {
            // A part may be on disk: the next open cuts it off; append to a fresh segment.
            inner.file = None;
            if let Some(s) = inner.segments.back_mut() {
                s.closed = true;
            }
            return Err(file_error(what())(e));
        }
        let clock = arrived(inner.newest, at_ms);
        inner.newest = Some(clock);
        if let Some(s) = inner.segments.back_mut() {
            s.count += 1;
            s.bytes += record.len() as u64;
            s.oldest_ms = s.oldest_ms.min(at_ms);
            s.newest_ms = s.newest_ms.max(at_ms);
            s.last = Some(clock);
        }
        let (retain_ms, max_reports) = (retain_ms.max(0), max_reports.max(1));
        if (retain_ms, max_reports) != (inner.retain_ms, inner.max_reports) {
            self.put_bounds(retain_ms, max_reports)?;
            inner.retain_ms = retain_ms;
            inner.max_reports = max_reports;
        }
        let cutoff = inner.cutoff_ms();
        // Whole segments nothing is kept of, or past the byte bound, oldest first (never the
        // one appended to).
        let mut total: usize = inner.segments.iter().map(|s| s.count).sum();
        let mut bytes: u64 = inner.segments.iter().map(|s| s.bytes).sum();
        while inner.segments.len() > 1 {
            let Some(&oldest) = inner.segments.front() else {
                break;
            };
            let too_old = oldest.expired(cutoff);
            let too_many = total - oldest.count >= inner.max_reports;
            let too_big = bytes > max_bytes;
            if !(too_old || too_many || too_big) {
                break;
            }
            if too_big && !too_old && !too_many && !inner.bytes_bound_hit {
                inner.bytes_bound_hit = true;
                tracing::warn!(
                    max_bytes,
                    "the demand record is at its disk bound (record_max_mb): its oldest \
                     reports go before their retention time"
                );
            }
            remove_if_present(&self.path(oldest.number))?;
            inner.segments.pop_front();
            total -= oldest.count;
            bytes -= oldest.bytes;
        }
        Ok(())
    }

    /// Bytes of whole records the log holds on disk.
    pub(super) fn bytes(&self) -> Result<u64, StoreError> {
        Ok(self.lock()?.segments.iter().map(|s| s.bytes).sum())
    }

    /// The kept reports received in `[from_ms, to_ms)`, oldest first (by time, then id), with
    /// their times.
    pub(super) fn read(&self, from_ms: i64, to_ms: i64) -> Result<Reports, StoreError> {
        Ok(self
            .read_within(from_ms, to_ms, usize::MAX)?
            .unwrap_or_default())
    }

    /// [`Self::read`], giving up (`None`) as soon as the reports' payloads pass `max_bytes`:
    /// no more than that is ever read into memory for one caller.
    pub(super) fn read_within(
        &self,
        from_ms: i64,
        to_ms: i64,
        max_bytes: usize,
    ) -> Result<Option<Reports>, StoreError> {
        let mut out = Vec::new();
        let mut taken = 0usize;
        let mut over = false;
        self.for_each(from_ms, to_ms, |at, payload| {
            taken = taken.saturating_add(payload.len());
            if taken > max_bytes {
                over = true;
                return false;
            }
            out.push((at, payload.to_vec()));
            true
        })?;
        Ok((!over).then_some(out))
    }

    /// Bytes of the segments holding a report received in `[from_ms, to_ms)`: at least what
    /// a read of that period returns (a segment's reports outside it are counted too), known
    /// without reading a file.
    pub(super) fn bytes_within(&self, from_ms: i64, to_ms: i64) -> Result<u64, StoreError> {
        Ok(self
            .lock()?
            .segments
            .iter()
            .filter(|s| s.count > 0 && s.oldest_ms < to_ms && s.newest_ms >= from_ms)
            .map(|s| s.bytes)
            .sum())
    }

    /// Calls `each` with every kept report received in `[from_ms, to_ms)` (its time and
    /// payload), segment by segment in the order they were written, each segment's by (time,
    /// id): oldest first unless the clock stepped back between two segments. One segment is
    /// in memory at a time. `each` returning false stops the walk.
    pub(super) fn for_each(
        &self,
        from_ms: i64,
        to_ms: i64,
        mut each: impl FnMut(i64, &[u8]) -> bool,
    ) -> Result<(), StoreError> {
        let (segments, cutoff, max) = {
            let inner = self.lock()?;
            (inner.segments.clone(), inner.cutoff_ms(), inner.max_reports)
        };
        let total: usize = segments.iter().map(|s| s.count).sum();
        // Records before this position (in append order) are beyond the count bound.
        let first_kept = total.saturating_sub(max);
        let mut at = 0usize;
        for s in &segments {
            let start = at;
            at += s.count;
            if at <= first_kept
                || s.expired(cutoff)
                || s.newest_ms < from_ms
                || s.oldest_ms >= to_ms
            {
                continue;
            }
            let path = self.path(s.number);
            let bytes = match fs::read(&path) {
                Ok(b) => b,
                // Deleted by an append since the list was taken: nothing of it is kept.
                Err(e) if e.kind() == ErrorKind::NotFound => continue,
                Err(e) => return Err(file_error(format!("reading {}", path.display()))(e)),
            };
            let (records, _) = parse(&bytes[..(s.bytes as usize).min(bytes.len())]);
            let mut clock = s.before;
            let mut kept: Vec<Record> = records
                .into_iter()
                .enumerate()
                .filter(|(i, r)| {
                    let arrival = arrived(clock, r.at_ms);
                    clock = Some(arrival);
                    start + i >= first_kept
                        && arrival.clock_ms >= cutoff
                        && (from_ms..to_ms).contains(&r.at_ms)
                })
                .map(|(_, r)| r)
                .collect();
            kept.sort_by_key(|r| (r.at_ms, r.id));
            for r in kept {
                if !each(r.at_ms, &bytes[r.payload]) {
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    /// Writes `records` (time, id, payload; an older build's record, moved from sled) as the
    /// first segment, whole: written and synced under a temporary name, then renamed, so a
    /// crash leaves all of them or none. Only into an empty log.
    pub(super) fn import(&self, records: &[(i64, u64, Vec<u8>)]) -> Result<(), StoreError> {
        let mut inner = self.lock()?;
        if !inner.segments.is_empty() || records.is_empty() {
            return Ok(());
        }
        let path = self.path(0);
        let tmp = self.dir.join("import.tmp");
        let what = || format!("writing {}", tmp.display());
        let mut bytes = Vec::new();
        for (at, id, payload) in records {
            bytes.extend(frame(*at, *id, payload));
        }
        File::create(&tmp)
            .and_then(|mut f| f.write_all(&bytes).and_then(|()| f.sync_all()))
            .map_err(file_error(what()))?;
        fs::rename(&tmp, &path).map_err(file_error(format!("renaming {}", tmp.display())))?;
        self.sync_dir()?;
        let clock = records
            .iter()
            .fold(None, |clock, r| Some(arrived(clock, r.0)));
        inner.newest = clock;
        inner.segments.push_back(Segment {
            number: 0,
            count: records.len(),
            bytes: bytes.len() as u64,
            oldest_ms: records.iter().map(|r| r.0).min().unwrap_or(i64::MAX),
            newest_ms: records.iter().map(|r| r.0).max().unwrap_or(i64::MIN),
            before: None,
            last: clock,
            closed: false,
        });
        Ok(())
    }

    /// Stores the bounds (written whole, then renamed; synced).
    fn put_bounds(&self, retain_ms: i64, max_reports: usize) -> Result<(), StoreError> {
        let tmp = self.dir.join(format!("{BOUNDS}.tmp"));
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&retain_ms.to_le_bytes());
        b[8..].copy_from_slice(&(max_reports as u64).to_le_bytes());
        File::create(&tmp)
            .and_then(|mut f| f.write_all(&b).and_then(|()| f.sync_all()))
            .and_then(|()| fs::rename(&tmp, self.dir.join(BOUNDS)))
            .map_err(file_error(format!("writing {}", tmp.display())))?;
        self.sync_dir()
    }

    fn sync_dir(&self) -> Result<(), StoreError> {
        sync_dir(&self.dir)
    }
}

/// Cuts the segment at `path` to its first `len` bytes (what follows is a record a crash cut
/// short), synced.
pub(super) fn cut_off(path: &Path, len: usize) -> Result<(), StoreError> {
    let f = OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(file_error(format!("opening {}", path.display())))?;
    f.set_len(len as u64)
        .and_then(|()| f.sync_all())
        .map_err(file_error(format!("cutting {}", path.display())))
}

/// The numbers of the segment files (`seg-N`) in `dir`, in order; none when it is missing.
/// The topology's journal names its segments the same way.
pub(super) fn segments_in(dir: &Path) -> Result<Vec<u64>, StoreError> {
    let mut numbers = Vec::new();
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(numbers),
        Err(e) => return Err(file_error(format!("listing {}", dir.display()))(e)),
    };
    for entry in entries {
        let entry = entry.map_err(file_error(format!("listing {}", dir.display())))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(n) = name
            .strip_prefix(PREFIX)
            .and_then(|n| n.parse::<u64>().ok())
        {
            numbers.push(n);
        }
    }
    numbers.sort_unstable();
    Ok(numbers)
}

/// One record, framed (the topology's journal frames its entries the same way).
pub(super) fn frame(at_ms: i64, id: u64, payload: &[u8]) -> Vec<u8> {
    let mut body = Vec::with_capacity(16 + payload.len());
    body.extend(at_ms.to_le_bytes());
    body.extend(id.to_le_bytes());
    body.extend(payload);
    let mut out = Vec::with_capacity(12 + body.len());
    out.extend((payload.len() as u32).to_le_bytes());
    out.extend(xxhash_rust::xxh3::xxh3_64(&body).to_le_bytes());
    out.extend(body);
    out
}

/// Whether `rest`, what follows a log's whole records, is one record cut short by a crash: a
/// frame that runs to the end of the file or past it (a damaged record with whole records
/// after it is not).
pub(super) fn torn(rest: &[u8]) -> bool {
    let Some(len) = rest.get(..4) else {
        return true;
    };
    let mut n = [0u8; 4];
    n.copy_from_slice(len);
    FRAME.saturating_add(u32::from_le_bytes(n) as usize) >= rest.len()
}

/// The whole records at the start of `bytes` (payloads as ranges of it: a log opened is
/// counted, not copied), and how many bytes they take (where the first
/// cut short or damaged one begins, or the end).
pub(super) fn parse(bytes: &[u8]) -> (Vec<Record>, usize) {
    let mut records = Vec::new();
    let mut at = 0usize;
    while let Some(head) = bytes.get(at..at + FRAME) {
        let number = |i: usize| {
            let mut n = [0u8; 8];
            n.copy_from_slice(&head[i..i + 8]);
            n
        };
        let mut len = [0u8; 4];
        len.copy_from_slice(&head[..4]);
        let len = u32::from_le_bytes(len) as usize;
        let Some(body) = (len <= MAX_PAYLOAD)
            .then(|| bytes.get(at + 12..at + FRAME + len))
            .flatten()
        else {
            break;
        };
        if xxhash_rust::xxh3::xxh3_64(body) != u64::from_le_bytes(number(4)) {
            break;
        }
        records.push(Record {
            at_ms: i64::from_le_bytes(number(12)),
            id: u64::from_le_bytes(number(20)),
            payload: at + FRAME..at + FRAME + len,
        });
        at += FRAME + len;
    }
    (records, at)
}

#[cfg(test)]
mod tests {
    /// Bounds of age and count, no byte bound to speak of.
    fn bounds(retain_ms: i64, max_reports: usize) -> Bounds {
        Bounds {
            retain_ms,
            max_reports,
            max_bytes: u64::MAX,
        }
    }
    use super::*;

    #[test]
    fn a_record_cut_short_by_a_crash_is_cut_off_and_the_log_goes_on() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = ReportLog::open(dir.path()).expect("open");
        for i in 0..5u64 {
            log.append(1_000 + i as i64, i, &[i as u8; 100], bounds(i64::MAX, 100))
                .expect("append");
        }
        drop(log);
        // A sixth append, cut after 60 of its bytes.
        let seg = dir.path().join(format!("{PREFIX}{:020}", 0));
        let whole = frame(2_000, 5, &[5; 100]);
        let mut f = OpenOptions::new().append(true).open(&seg).expect("segment");
        f.write_all(&whole[..60]).expect("write");
        drop(f);
        let log = ReportLog::open(dir.path()).expect("reopen");
        assert_eq!(log.count().expect("count"), 5);
        log.append(3_000, 6, b"after", bounds(i64::MAX, 100))
            .expect("append");
        let back = log.read(0, i64::MAX).expect("read");
        let times: Vec<i64> = back.iter().map(|r| r.0).collect();
        assert_eq!(times, vec![1_000, 1_001, 1_002, 1_003, 1_004, 3_000]);
        assert_eq!(back[5].1, b"after".to_vec());
        // A damaged byte in a record: it and what follows in its segment are not read, the
        // segment is left as it is, and appends go to a new one.
        let mut bytes = fs::read(&seg).expect("read");
        bytes[2 * (FRAME + 100) + FRAME + 3] ^= 0xff;
        fs::write(&seg, &bytes).expect("write");
        let log = ReportLog::open(dir.path()).expect("reopen");
        assert_eq!(log.read(0, i64::MAX).expect("read").len(), 2);
        assert_eq!(fs::read(&seg).expect("read").len(), bytes.len());
        log.append(4_000, 7, b"new", bounds(i64::MAX, 100))
            .expect("append");
        let times: Vec<i64> = log
            .read(0, i64::MAX)
            .expect("read")
            .iter()
            .map(|r| r.0)
            .collect();
        assert_eq!(times, vec![1_000, 1_001, 4_000]);
    }

    /// The arrival clock: a report appended after another is never older, whichever way the
    /// wall clock stepped between them, and no step ages the record by more than
    /// `MAX_ARRIVAL_STEP_MS`; a clock set back for a while hides nothing either.
    #[test]
    fn the_arrival_clock_only_goes_on_and_by_bounded_steps() {
        let hour = 3_600_000;
        let steps = [
            0,
            1,
            999,
            MAX_ARRIVAL_STEP_MS,
            2 * hour,
            -2 * hour,
            i64::MAX,
            i64::MIN,
        ];
        for step in steps {
            let before = arrived(None, 1_000_000);
            let after = arrived(Some(before), 1_000_000i64.saturating_add(step));
            let moved = after.clock_ms - before.clock_ms;
            assert!(
                (0..=MAX_ARRIVAL_STEP_MS).contains(&moved),
                "{step}: {moved}"
            );
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let log = ReportLog::open(dir.path()).expect("open");
        let t0 = 1_800_000_000_000i64;
        let times: Vec<i64> = (0..10)
            .map(|i| t0 + i * 1_000)
            .chain((0..10).map(|i| t0 - 2 * hour + i * 1_000))
            .chain((0..10).map(|i| t0 + 20_000 + i * 1_000))
            .collect();
        for (id, &at) in times.iter().enumerate() {
            log.append(at, id as u64, b"r", bounds(hour, 1_000))
                .expect("append");
        }
        assert_eq!(log.read(i64::MIN, i64::MAX).expect("read").len(), 30);
    }

    #[test]
    fn segments_are_deleted_once_nothing_in_them_is_kept() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = ReportLog::open(dir.path()).expect("open");
        let payload = vec![7u8; (SEGMENT_BYTES / 4) as usize];
        for i in 0..20i64 {
            log.append(i * 1_000, i as u64, &payload, bounds(5_500, 1_000))
                .expect("append");
        }
        // Kept: received from 14 s on (6 reports); on disk: at most one segment more.
        let kept = log.read(0, i64::MAX).expect("read");
        assert_eq!(kept.first().map(|r| r.0), Some(14_000));
        assert_eq!(kept.len(), 6);
        let files = fs::read_dir(dir.path()).expect("list").count();
        assert!(
            files <= 4,
            "{files} segments for 6 reports of a quarter segment"
        );
        // The count bound alone.
        for i in 20..30i64 {
            log.append(i * 1_000, i as u64, b"x", bounds(i64::MAX, 3))
                .expect("append");
        }
        assert_eq!(log.read(0, i64::MAX).expect("read").len(), 3);
    }
}
