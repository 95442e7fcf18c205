//! The store's large values (map records, base topologies, estimator entries and its
//! checkpoint), each a file of its own in the store's `values/` directory, beside sled's.
//!
//! Why not sled: a round at 1 M map units writes about 20 MB, a checkpoint 235 MB, a base
//! topology hundreds of MB; in sled 0.34 such writes stall for seconds every few rounds while
//! it cleans its segments, and the directory keeps every overwritten value for a while
//! (`docs/perf/round-with-reports.md`, reproduced with sled alone). A file written whole and
//! renamed into place costs its bytes once, and deleting it gives the space back at once.
//!
//! **What is durable when.** [`Values::put`] writes the value to `NAME.tmp`, syncs it,
//! renames it to `NAME` and syncs the directory before it returns: a reader sees the old value
//! or the new one, never a part, and a crash at any point leaves one of the two (a `.tmp` left
//! behind is never read, and is removed at the next open). Every file carries a header (magic,
//! length, xxh3-64 of the payload), checked on read, so a cut or damaged file is an error
//! naming it, never a value.
//!
//! **Compressed.** The payload is one zstd frame (level [`LEVEL`]); the header's length and
//! checksum are the value's own bytes, before compression, so two files of the same value have
//! the same header whatever the compressor did, and a value's sameness is known without
//! compressing it ([`Values::same`]). Measured on a 1 M-unit store
//! (`docs/perf/bench-serve.md`, seventh session): a topology 144 → 47 MB, an estimator
//! checkpoint 133 → 6 MB, a map record 11 → 9 MB (its demands, a forecast per unit, were
//! nearly random bits as `f64`s; now 16-bit codes, and the older versions deltas: the
//! store's module docs). Files of the format before (`CDNVAL01`, the payload as is) are still
//! read.

use std::fs::{self, File};
use std::io::{ErrorKind, Read, Write};
use std::path::{Path, PathBuf};

use super::StoreError;

/// A value file's header: magic, the value's length (u64 LE), xxh3-64 of the value (u64 LE);
/// then the value as one zstd frame.
const MAGIC: &[u8; 8] = b"CDNVAL02";
/// The header of the format before: the same two numbers, then the value as is.
const MAGIC_01: &[u8; 8] = b"CDNVAL01";
const HEADER: usize = 24;
/// zstd's level: its fastest (about 400 MB/s of a topology on this machine's cores; higher
/// levels gained 3% on a topology and nothing on a record, at twice the time).
const LEVEL: i32 = 1;
/// The buffer in front of the hasher and the compressor: the encoders write a field at a
/// time, and each of the two costs a call per write.
const BUFFER: usize = 256 << 10;
const TMP: &str = ".tmp";

/// Syncs directory `dir` (so the names created or renamed in it are durable).
pub(super) fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(file_error(format!("syncing {}", dir.display())))
}

/// Removes the file at `path` (nothing when there is none).
pub(super) fn remove_if_present(path: &Path) -> Result<(), StoreError> {
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
        Err(e) => Err(file_error(format!("removing {}", path.display()))(e)),
    }
}

/// A value written but not yet synced and in place ([`Values::write_pending`]).
#[derive(Debug)]
pub(super) struct Pending {
    values: Values,
    name: String,
    file: File,
    /// Bytes of the value (without the header).
    pub(super) len: u64,
}

impl Pending {
    /// Syncs the value and renames it into place: durable when it returns.
    pub(super) fn commit(self) -> Result<(), StoreError> {
        let tmp = self.values.path(&format!("{}{TMP}", self.name));
        self.file
            .sync_all()
            .map_err(file_error(format!("writing {}", tmp.display())))?;
        drop(self.file);
        fs::rename(&tmp, self.values.path(&self.name))
            .map_err(file_error(format!("renaming {} into place", tmp.display())))?;
        self.values.sync_dir()
    }
}

/// A writer that counts and hashes what passes through it: a value's header.
struct Hashing<W> {
    inner: W,
    hash: xxhash_rust::xxh3::Xxh3,
    len: u64,
}

impl<W: Write> Hashing<W> {
    fn new(inner: W) -> Self {
        Hashing {
            inner,
            hash: xxhash_rust::xxh3::Xxh3::new(),
            len: 0,
        }
    }

    /// The header of a value of the bytes written so far.
    fn header(&self) -> [u8; HEADER] {
        let mut h = [0u8; HEADER];
        h[..8].copy_from_slice(MAGIC);
        h[8..16].copy_from_slice(&self.len.to_le_bytes());
        h[16..].copy_from_slice(&self.hash.digest().to_le_bytes());
        h
    }
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hash.update(&buf[..n]);
        self.len += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// A reader that counts and hashes what passes through it: a value's bytes, checked against
/// its header once read.
struct HashingReader<R> {
    inner: R,
    hash: xxhash_rust::xxh3::Xxh3,
    len: u64,
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hash.update(&buf[..n]);
        self.len += n as u64;
        Ok(n)
    }
}

/// The directory of value files.
#[derive(Debug, Clone)]
pub(super) struct Values {
    dir: PathBuf,
}

fn file_error(what: String) -> impl FnOnce(std::io::Error) -> StoreError {
    move |source| StoreError::File { what, source }
}

impl Values {
    /// Opens (creating) `dir`, removing what a write cut short left.
    pub(super) fn open(dir: &Path) -> Result<Values, StoreError> {
        fs::create_dir_all(dir).map_err(file_error(format!("creating {}", dir.display())))?;
        let values = Values {
            dir: dir.to_path_buf(),
        };
        for name in values.names_ending(TMP)? {
            values.remove(&name)?;
        }
        Ok(values)
    }

    /// Opens an existing `dir` to read: nothing is created or cleaned up (a writer may be in
    /// the middle of a write).
    pub(super) fn open_existing(dir: &Path) -> Result<Values, StoreError> {
        match fs::metadata(dir) {
            Ok(m) if m.is_dir() => Ok(Values {
                dir: dir.to_path_buf(),
            }),
            Ok(_) => Err(StoreError::Corrupt {
                what: dir.display().to_string(),
                problem: "it is not a directory".into(),
            }),
            Err(e) => Err(file_error(format!(
                "opening {} (a store's values directory)",
                dir.display()
            ))(e)),
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// The path of value `name`'s file (tests damage it).
    #[cfg(test)]
    pub(super) fn path_of(&self, name: &str) -> PathBuf {
        self.path(name)
    }

    /// Stores `parts`, one after the other, as the value `name`; durable when it returns.
    pub(super) fn put(&self, name: &str, parts: &[&[u8]]) -> Result<(), StoreError> {
        self.put_with(name, |w| parts.iter().try_for_each(|p| w.write_all(p)))
    }

    /// Stores what `write` writes as the value `name`, streamed to the file (a value of
    /// gigabytes is never whole in memory); durable when it returns.
    pub(super) fn put_with(
        &self,
        name: &str,
        write: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
    ) -> Result<(), StoreError> {
        self.write_pending(name, write)?.commit()
    }

    /// Writes what `write` writes to the value `name`'s temporary file, header and all, but
    /// neither syncs it nor puts it in place: [`Pending::commit`] does (a writer holding a lock
    /// while it encodes can let go before the sync). The header's length and checksum are
    /// written last, over the room left for them. A pending value never committed is never
    /// read.
    pub(super) fn write_pending(
        &self,
        name: &str,
        write: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
    ) -> Result<Pending, StoreError> {
        use std::os::unix::fs::FileExt;
        let tmp = self.path(&format!("{name}{TMP}"));
        let what = || format!("writing {}", tmp.display());
        let f = File::create(&tmp).map_err(file_error(what()))?;
        let (header, len) = (|| {
            let mut file = std::io::BufWriter::with_capacity(1 << 20, &f);
            file.write_all(&[0u8; HEADER])?;
            let encoder = zstd::stream::write::Encoder::new(file, LEVEL)?;
            let mut out = std::io::BufWriter::with_capacity(BUFFER, Hashing::new(encoder));
            write(&mut out)?;
            let hashed = out.into_inner().map_err(|e| e.into_error())?;
            let (header, len) = (hashed.header(), hashed.len);
            hashed.inner.finish()?.flush()?;
            Ok((header, len))
        })()
        .map_err(file_error(what()))?;
        f.write_all_at(&header, 0).map_err(file_error(what()))?;
        Ok(Pending {
            values: self.clone(),
            name: name.to_string(),
            file: f,
            len,
        })
    }

    /// Whether values `a` and `b` both exist and hold the same bytes, by their headers alone
    /// (length and xxh3-64 of the payload; 24 bytes read of each): for a value written twice,
    /// to read or write it once. A damaged file is caught when it is read.
    pub(super) fn same(&self, a: &str, b: &str) -> Result<bool, StoreError> {
        Ok(match (self.header(a)?, self.header(b)?) {
            (Some(x), Some(y)) => x == y,
            _ => false,
        })
    }

    /// Whether the value `name`'s header (its length and checksum) is that of the bytes
    /// `write` writes: a file whose contents are damaged is told whether it held those bytes,
    /// so they can be written again in its place. `false` when there is no such file or its
    /// header is damaged too.
    pub(super) fn held(
        &self,
        name: &str,
        write: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
    ) -> Result<bool, StoreError> {
        let Some(header) = self.header(name)? else {
            return Ok(false);
        };
        let mut hashing = Hashing::new(std::io::sink());
        {
            let mut out = std::io::BufWriter::with_capacity(BUFFER, &mut hashing);
            write(&mut out).map_err(file_error(format!("hashing a value for {name}")))?;
            out.flush()
                .map_err(file_error(format!("hashing a value for {name}")))?;
        }
        Ok(header[8..] == hashing.header()[8..])
    }

    /// Moves the value `name` into directory `to` (created), where nothing reads it: a
    /// damaged file a start skipped, kept for whoever looks into it. Durable when it returns.
    pub(super) fn set_aside(&self, name: &str, to: &Path) -> Result<(), StoreError> {
        fs::create_dir_all(to).map_err(file_error(format!("creating {}", to.display())))?;
        let (from, into) = (self.path(name), to.join(name));
        fs::rename(&from, &into).map_err(file_error(format!(
            "moving {} to {}",
            from.display(),
            into.display()
        )))?;
        sync_dir(to)?;
        self.sync_dir()
    }

    /// Value `name`'s header, if it has a whole one (a file cut short, or not a value file,
    /// has none: it is the same as nothing).
    fn header(&self, name: &str) -> Result<Option<[u8; HEADER]>, StoreError> {
        let path = self.path(name);
        let mut f = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(file_error(format!("reading {}", path.display()))(e)),
        };
        let mut h = [0u8; HEADER];
        match f.read_exact(&mut h) {
            Ok(()) if &h[..8] == MAGIC || &h[..8] == MAGIC_01 => Ok(Some(h)),
            Ok(()) => Ok(None),
            Err(e) if e.kind() == ErrorKind::UnexpectedEof => Ok(None),
            Err(e) => Err(file_error(format!("reading {}", path.display()))(e)),
        }
    }

    /// The value `name`, checked against its header; `None` when there is none.
    pub(super) fn get(&self, name: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let read = self.read_with(name, |len, r| {
            let mut bytes = Vec::new();
            // Room for the whole value up front; a length no allocation can hold is an
            // error, not an abort.
            usize::try_from(len)
                .ok()
                .and_then(|n| bytes.try_reserve_exact(n).ok())
                .ok_or_else(|| format!("its header says {len} bytes, more than memory holds"))?;
            r.read_to_end(&mut bytes)
                .map_err(|e| format!("its contents are damaged or cut short ({e})"))?;
            Ok(bytes)
        })?;
        read.transpose().map_err(|problem| StoreError::Corrupt {
            what: format!("the value file {}", self.path(name).display()),
            problem,
        })
    }

    /// What `read` makes of the value `name` (its length as the header says, and a reader of
    /// its bytes) as it is read from the file and decompressed, never whole in memory (an
    /// estimator's checkpoint at 11 M map units is 1.4 GB); `None` when there is none. Then
    /// what `read` left is read too, and the whole is checked against the header: when the
    /// value is damaged or cut short, that is the error, whatever `read` made of it.
    pub(super) fn read_with<T>(
        &self,
        name: &str,
        read: impl FnOnce(u64, &mut dyn Read) -> T,
    ) -> Result<Option<T>, StoreError> {
        let path = self.path(name);
        let mut file = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(file_error(format!("reading {}", path.display()))(e)),
        };
        let corrupt = |problem: String| StoreError::Corrupt {
            what: format!("the value file {}", path.display()),
            problem,
        };
        let mut header = [0u8; HEADER];
        let no_header = || {
            corrupt(format!(
                "its header is not {:?} and two numbers",
                String::from_utf8_lossy(MAGIC)
            ))
        };
        match file.read_exact(&mut header) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::UnexpectedEof => return Err(no_header()),
            Err(e) => return Err(file_error(format!("reading {}", path.display()))(e)),
        }
        let number = |at: usize| {
            let mut n = [0u8; 8];
            n.copy_from_slice(&header[at..at + 8]);
            u64::from_le_bytes(n)
        };
        let (len, sum) = (number(8), number(16));
        let payload: Box<dyn Read> = match &header[..8] {
            m if m == MAGIC => Box::new(
                zstd::stream::read::Decoder::new(file)
                    .map_err(file_error(format!("reading {}", path.display())))?,
            ),
            m if m == MAGIC_01 => Box::new(std::io::BufReader::with_capacity(BUFFER, file)),
            _ => return Err(no_header()),
        };
        // At most one byte more than the header says: a longer value is caught without
        // reading all of it.
        let mut r = HashingReader {
            inner: payload.take(len.saturating_add(1)),
            hash: xxhash_rust::xxh3::Xxh3::new(),
            len: 0,
        };
        let made = read(len, &mut r);
        std::io::copy(&mut r, &mut std::io::sink()).map_err(|e| {
            corrupt(format!(
                "its compressed contents are damaged or cut short ({e})"
            ))
        })?;
        if r.len != len {
            return Err(corrupt(format!(
                "it holds {} bytes where its header says {len}",
                r.len
            )));
        }
        if r.hash.digest() != sum {
            return Err(corrupt("its checksum does not match its contents".into()));
        }
        Ok(Some(made))
    }

    /// The size on disk of value `name`'s file (header and compressed payload), if there is
    /// one.
    pub(super) fn file_len(&self, name: &str) -> Result<Option<u64>, StoreError> {
        let path = self.path(name);
        match fs::metadata(&path) {
            Ok(m) => Ok(Some(m.len())),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(file_error(format!("reading {}", path.display()))(e)),
        }
    }

    /// Removes the value `name` (nothing when there is none). Not synced: every removal is of
    /// a value nothing reads any more (a record beyond the history, a base no record names, an
    /// entry a checkpoint covers), so one a crash undoes is only done again by the next write.
    pub(super) fn remove(&self, name: &str) -> Result<(), StoreError> {
        remove_if_present(&self.path(name))
    }

    /// The names of the values starting with `prefix`, sorted (numbers in names are
    /// zero-padded, so this is their numeric order).
    pub(super) fn names(&self, prefix: &str) -> Result<Vec<String>, StoreError> {
        let mut names: Vec<String> = self
            .all_names()?
            .into_iter()
            .filter(|n| n.starts_with(prefix) && !n.ends_with(TMP))
            .collect();
        names.sort_unstable();
        Ok(names)
    }

    fn names_ending(&self, suffix: &str) -> Result<Vec<String>, StoreError> {
        let mut names = self.all_names()?;
        names.retain(|n| n.ends_with(suffix));
        Ok(names)
    }

    fn all_names(&self) -> Result<Vec<String>, StoreError> {
        let what = || format!("listing {}", self.dir.display());
        let mut names = Vec::new();
        for entry in fs::read_dir(&self.dir).map_err(file_error(what()))? {
            let entry = entry.map_err(file_error(what()))?;
            // Names this module did not write (not UTF-8) are not values.
            if let Ok(name) = entry.file_name().into_string() {
                names.push(name);
            }
        }
        Ok(names)
    }

    fn sync_dir(&self) -> Result<(), StoreError> {
        sync_dir(&self.dir)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A streamed value is the value of its bytes (header and all); a writer that fails
    /// leaves the value as it was.
    #[test]
    fn a_streamed_value_is_the_value_of_its_bytes_and_a_failed_one_is_none() {
        let dir = tempfile::tempdir().expect("tempdir");
        let values = Values::open(dir.path()).expect("open");
        let big: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
        values
            .put_with("a", |w| {
                w.write_all(&big[..10])?;
                w.write_all(&big[10..])
            })
            .expect("put_with");
        values.put("b", &[&big]).expect("put");
        assert_eq!(values.get("a").expect("read"), Some(big.clone()));
        assert!(values.same("a", "b").expect("headers"));
        let err = values.put_with("c", |w| {
            w.write_all(b"partial")?;
            Err(std::io::Error::other("the encoder gave up"))
        });
        assert!(err.is_err());
        assert_eq!(values.get("c").expect("read"), None);
    }

    #[test]
    fn a_value_reads_back_and_a_damaged_one_is_an_error_naming_its_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let values = Values::open(dir.path()).expect("open");
        assert_eq!(values.get("map-1").expect("read"), None);
        values.put("map-1", &[b"abc", b"", b"def"]).expect("put");
        values.put("map-2", &[b"x"]).expect("put");
        assert_eq!(values.get("map-1").expect("read"), Some(b"abcdef".to_vec()));
        values.put("map-1", &[b"new"]).expect("replace");
        assert_eq!(values.get("map-1").expect("read"), Some(b"new".to_vec()));
        assert_eq!(values.names("map-").expect("list"), ["map-1", "map-2"]);

        let path = dir.path().join("map-2");
        let good = fs::read(&path).expect("read");
        let with_len = |n: u64| [&good[..8], &n.to_le_bytes()[..], &good[16..]].concat();
        for (damage, expect) in [
            (good[..good.len() - 1].to_vec(), "cut short"),
            (good[..10].to_vec(), "header"),
            ([&good[..HEADER], b"y"].concat(), "damaged"),
            (
                [&good[..16], &[0u8; 8][..], &good[HEADER..]].concat(),
                "checksum",
            ),
            (with_len(0), "header says 0"),
            (with_len(2), "header says 2"),
            // The damage is the error, before what the reader made of it (no room).
            (with_len(u64::MAX), "header says 18446744073709551615"),
            ([b"CDNVAL99", &good[8..]].concat(), "header"),
        ] {
            fs::write(&path, damage).expect("damage");
            let err = values.get("map-2").expect_err("damaged");
            let text = err.to_string();
            assert!(text.contains("map-2") && text.contains(expect), "{text}");
        }
        values.remove("map-2").expect("remove");
        values.remove("map-2").expect("removing nothing");
        assert_eq!(values.names("map-").expect("list"), ["map-1"]);
    }

    /// A value read as it is decompressed gives its reader the bytes `get` gives; what the
    /// reader leaves is still checked, and damage is the error whatever the reader made.
    #[test]
    fn a_value_read_in_a_stream_is_checked_whole_whatever_its_reader_took() {
        let dir = tempfile::tempdir().expect("tempdir");
        let values = Values::open(dir.path()).expect("open");
        let big: Vec<u8> = (0..1_000_000u32).map(|i| (i * 13 % 241) as u8).collect();
        values.put("v", &[&big]).expect("put");
        let all = values.read_with("v", |len, r| {
            let mut b = Vec::new();
            r.read_to_end(&mut b).map(|_| (len, b)).expect("read")
        });
        assert_eq!(all.expect("read"), Some((big.len() as u64, big.clone())));
        let first = values.read_with("v", |_, r| {
            let mut b = [0u8; 3];
            r.read_exact(&mut b).map(|_| b).expect("read")
        });
        assert_eq!(first.expect("read"), Some([big[0], big[1], big[2]]));
        assert_eq!(values.read_with("none", |_, _| ()).expect("read"), None);
        // One byte changed past what the reader takes: the value is refused all the same.
        let path = dir.path().join("v");
        values
            .put("v", &[&big[..big.len() - 1], b"!"])
            .expect("put");
        let changed = fs::read(&path).expect("read");
        values.put("v", &[&big]).expect("put");
        let good = fs::read(&path).expect("read");
        let damaged = [&good[..HEADER], &changed[HEADER..]].concat();
        fs::write(&path, damaged).expect("damage");
        let err = values.read_with("v", |_, _| ()).expect_err("damaged");
        assert!(err.to_string().contains("checksum"), "{err}");
    }

    /// A value file of the format before (the payload as is) reads back, and a value is
    /// stored compressed: a run of one byte takes a few bytes on disk.
    #[test]
    fn a_value_of_the_format_before_reads_and_a_new_one_is_compressed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let values = Values::open(dir.path()).expect("open");
        let old = b"a value of the format before";
        let mut file = MAGIC_01.to_vec();
        file.extend_from_slice(&(old.len() as u64).to_le_bytes());
        file.extend_from_slice(&xxhash_rust::xxh3::xxh3_64(old).to_le_bytes());
        file.extend_from_slice(old);
        fs::write(dir.path().join("old"), &file).expect("write");
        assert_eq!(values.get("old").expect("read"), Some(old.to_vec()));
        let run = vec![7u8; 1 << 20];
        values.put("run", &[&run]).expect("put");
        let on_disk = fs::metadata(dir.path().join("run")).expect("file").len();
        assert!(
            on_disk < 1_000,
            "{on_disk} bytes on disk for a run of 1 MiB"
        );
        assert_eq!(values.get("run").expect("read"), Some(run));
        // The same bytes in either format are not the same value file: the newer is written.
        values.put("old2", &[old]).expect("put");
        assert!(!values.same("old", "old2").expect("headers"));
    }

    #[test]
    fn a_write_cut_short_is_never_read_and_is_cleaned_up() {
        let dir = tempfile::tempdir().expect("tempdir");
        let values = Values::open(dir.path()).expect("open");
        values.put("base-1", &[b"old"]).expect("put");
        // A crash between creating the temporary file and renaming it.
        fs::write(dir.path().join("base-1.tmp"), b"half a new val").expect("tmp");
        assert_eq!(values.names("base-").expect("list"), ["base-1"]);
        let values = Values::open(dir.path()).expect("reopen");
        assert_eq!(values.get("base-1").expect("read"), Some(b"old".to_vec()));
        assert!(!dir.path().join("base-1.tmp").exists());
    }
}
