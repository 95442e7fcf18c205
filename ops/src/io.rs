//! What the commands share for files and the terminal: reading an instance file, writing a
//! file through a temporary name and a rename, progress bars and a world generated with one
//! (from `cdnmap-bench`, which the benchmarks share them from). A leaf of the crate: the
//! subcommands use it, it uses none of them.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use anyhow::{bail, Context, Result};
pub use cdnmap_bench::progress::{generate_world, progress, Progress};
use cdnmap_mapper::Limits;
use cdnmap_topology::format::{parse_instance, FormatError};
use cdnmap_topology::Topology;
use cdnmap_world::world::{self, WorldParams};

/// The first bytes of a zstd frame.
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];

/// How an instance file is written ([`write_instance_as`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum InstanceFormat {
    /// The JSON instance format (docs/formats.md): for small worlds, people and other tools.
    Json,
    /// The compact form the store keeps (`cdnmap_topology::compact`: columns, postcard) in
    /// one zstd frame with its checksum: about 45 bytes a map unit where JSON takes 800, read
    /// back without a parse of text (docs/formats.md).
    Compact,
}

/// Reads and validates an instance file, JSON or compact (told apart by their first bytes);
/// errors name the file.
pub fn read_instance(path: &Path, limits: Limits) -> Result<Topology> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let what = || format!("{}", path.display());
    if bytes.starts_with(&ZSTD_MAGIC) {
        // The frame's checksum is checked as it is decompressed.
        let raw = zstd::decode_all(&bytes[..]).with_context(|| {
            format!(
                "{}: the compressed compact topology is damaged",
                path.display()
            )
        })?;
        return cdnmap_topology::compact::decode(&raw, limits).with_context(what);
    }
    if bytes.starts_with(cdnmap_topology::compact::MAGIC) {
        return cdnmap_topology::compact::decode(&bytes, limits).with_context(what);
    }
    parse_instance(&bytes, limits).map_err(|e| located(path, e))
}

/// An instance or assignment file's error with the file's name before it: `world.json:12:9:
/// cluster "fra1": unknown field ...` when it has a line and column (the compilers' form,
/// which editors and terminals link), `world.json: ...` otherwise.
pub fn located(path: &Path, e: FormatError) -> anyhow::Error {
    match e {
        FormatError::Json { .. } => anyhow::anyhow!("{}:{e}", path.display()),
        e => anyhow::Error::new(e).context(path.display().to_string()),
    }
}

/// Writes `topology` to `w` as an instance file in `format`.
pub fn write_instance_as(
    topology: &Topology,
    format: InstanceFormat,
    w: &mut dyn Write,
) -> Result<()> {
    match format {
        InstanceFormat::Json => Ok(cdnmap_topology::format::write_instance(topology, w)?),
        InstanceFormat::Compact => {
            let mut z = zstd::Encoder::new(w, 1)?;
            z.include_checksum(true)?;
            cdnmap_topology::compact::encode_to(topology, &mut z)?;
            z.finish()?;
            Ok(())
        }
    }
}

/// Where a world of real client networks comes from (`cdnmap world --mmdb`, the service's
/// `[mmdb]` section): MaxMind DBs, the edge sites, the class mix, the IPv6 fold length.
#[derive(Debug, Clone)]
pub struct MmdbSource {
    pub files: Vec<std::path::PathBuf>,
    /// A sites file in `data/pop-sites.csv`'s format; `None`: the built-in sites.
    pub sites: Option<std::path::PathBuf>,
    pub class_mix: world::ClassMix,
    pub v6_fold_len: u8,
}

/// What [`mmdb_world`] read.
#[derive(Debug, Clone, Default)]
pub struct MmdbSummary {
    /// Per file: networks taken, and what was passed over.
    pub files: Vec<(String, usize, cdnmap_world::mmdb::Skipped)>,
    /// Networks a file gave that an earlier file had given already (the earlier one's kept).
    pub duplicates: usize,
}

impl std::fmt::Display for MmdbSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (name, taken, skipped) in &self.files {
            writeln!(
                f,
                "{name}: {taken} located networks taken; {} without a location, {} folded into a /24 or the IPv6 fold length",
                skipped.unlocated, skipped.folded
            )?;
        }
        write!(
            f,
            "{} networks given again by a later file (the first kept)",
            self.duplicates
        )
    }
}

/// A world whose map units are the located networks of `source`'s MaxMind DBs
/// ([`world::from_located`]), with `params`'s clusters, seed and candidate model (its
/// `map_units` does not apply: one unit per network and class of the mix).
pub fn mmdb_world(
    source: &MmdbSource,
    params: &WorldParams,
    progress_to: &dyn Fn(usize),
) -> Result<(Topology, MmdbSummary)> {
    if source.files.is_empty() {
        bail!("no MaxMind DB given");
    }
    let sites = match &source.sites {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            world::sites_from(&path.display().to_string(), &text)?
        }
        None => world::sites()?,
    };
    let mut summary = MmdbSummary::default();
    let mut nets: Vec<cdnmap_world::mmdb::Located> = Vec::new();
    for path in &source.files {
        let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        let name = path.display().to_string();
        let mut these = Vec::new();
        let skipped = cdnmap_world::mmdb::read(
            bytes,
            &name,
            source.v6_fold_len,
            cdnmap_mapper::model::MAX_MAP_UNITS,
            &mut these,
        )?;
        summary.files.push((name, these.len(), skipped));
        nets.append(&mut these);
    }
    // By network, the earlier file's first (a stable sort keeps the files' order).
    nets.sort_by_key(|l| l.net);
    let before = nets.len();
    nets.dedup_by(|later, first| later.net == first.net);
    summary.duplicates = before - nets.len();
    let topology = world::from_located(&nets, &sites, &source.class_mix, params, progress_to)?;
    Ok((topology, summary))
}

/// Refuses an output path whose directory does not exist, before any long work is done.
pub fn check_writable(path: &Path) -> Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if dir.is_dir() {
        Ok(())
    } else {
        bail!(
            "cannot write {}: no directory {}",
            path.display(),
            dir.display()
        )
    }
}

/// Writes a file through a temporary sibling (`.NAME.tmp-PID`) and a rename, so a failed write
/// never leaves a half-written file under the real name and never touches another file.
///
/// A path that is not a regular file (`/dev/null`, `/dev/stdout`, a FIFO) is written in place:
/// a rename would put a regular file where the device was (`--out /dev/null` replaced the
/// machine's `/dev/null`). A symbolic link stays one: the file it names is the one replaced.
pub fn write_atomically(
    path: &Path,
    write: impl FnOnce(&mut BufWriter<File>) -> Result<()>,
) -> Result<()> {
    if let Ok(meta) = std::fs::metadata(path) {
        if !meta.is_file() {
            let result = (|| {
                let mut w = BufWriter::new(File::create(path)?);
                write(&mut w)?;
                w.flush()?;
                Ok::<_, anyhow::Error>(())
            })();
            return result.with_context(|| format!("writing {}", path.display()));
        }
        if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink()) {
            let target = std::fs::canonicalize(path)
                .with_context(|| format!("writing {}: resolving the link", path.display()))?;
            return write_atomically(&target, write);
        }
    }
    check_writable(path)?;
    let name = path
        .file_name()
        .with_context(|| format!("cannot write {}: not a file name", path.display()))?;
    let tmp = path.with_file_name(format!(
        ".{}.tmp-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let result = (|| {
        let file = File::create(&tmp)?;
        let mut w = BufWriter::new(file);
        write(&mut w)?;
        w.flush()?;
        drop(w);
        std::fs::rename(&tmp, path)?;
        Ok::<_, anyhow::Error>(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("cdnmap-io-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("make a temporary directory");
        dir
    }

    /// A FIFO (as `/dev/null` or `/dev/stdout`, not a regular file) is written in place and is
    /// still a FIFO after: a rename put a regular file where it was.
    #[test]
    fn a_fifo_is_written_in_place_not_replaced() {
        use std::os::unix::fs::FileTypeExt;
        let dir = temp_dir("fifo");
        let fifo = dir.join("out");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .expect("run mkfifo");
        assert!(made.success());
        let reader = {
            let fifo = fifo.clone();
            std::thread::spawn(move || std::fs::read_to_string(fifo).expect("read the FIFO"))
        };
        write_atomically(&fifo, |w| Ok(w.write_all(b"through the pipe\n")?)).expect("write");
        // The kind first: had the FIFO been replaced, the reader would wait on it for ever.
        let kind = std::fs::symlink_metadata(&fifo).expect("stat").file_type();
        assert!(kind.is_fifo(), "{kind:?}");
        assert_eq!(reader.join().expect("the reader"), "through the pipe\n");
        std::fs::remove_dir_all(&dir).expect("clean up");
    }

    /// A symbolic link stays a link; the file it names gets the new content.
    #[test]
    fn a_link_stays_a_link() {
        let dir = temp_dir("link");
        let (real, link) = (dir.join("real.json"), dir.join("link.json"));
        std::fs::write(&real, "old").expect("write");
        std::os::unix::fs::symlink(&real, &link).expect("link");
        write_atomically(&link, |w| Ok(w.write_all(b"new")?)).expect("write");
        assert!(std::fs::symlink_metadata(&link)
            .expect("stat")
            .file_type()
            .is_symlink());
        assert_eq!(std::fs::read_to_string(&real).expect("read"), "new");
        std::fs::remove_dir_all(&dir).expect("clean up");
    }
}
