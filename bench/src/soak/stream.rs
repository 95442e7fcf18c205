//! dnsperf in verbose mode, read as it runs. Debian's dnsperf (2.10) has no latency histogram
//! of its own (`-O latency-histogram` came later); with `-v` it prints a line per query, `>
//! NOERROR www.cdn.example. A 0.000123` (the response code, the name, the type, the latency in
//! seconds), `> T ...` for one that timed out and `> I ...` for one still in flight when it
//! stopped. The reader tallies those lines as they come (answers by response code, timeouts,
//! a latency histogram) for the soak to take an interval's tally at a time; dnsperf's other
//! output (its closing statistics) is kept as text.

use std::io::{BufRead, BufReader};
use std::process::{ChildStdout, Stdio};

use super::*;

/// Latencies below `2^(SUB_BITS + 1)` µs (1,024) have a bucket each; above, each power of two
/// is split into `2^SUB_BITS` buckets (each at most 0.2% wide).
const SUB_BITS: u32 = 9;

/// The longest latency told apart, µs (about 12 days; longer ones count as this): far beyond
/// dnsperf's timeout.
const MAX_LATENCY_US: u64 = (1 << 40) - 1;

/// The most bytes of dnsperf's output other than the per-query lines kept (its statistics
/// take a few hundred).
const MAX_TEXT_BYTES: usize = 1 << 20;

/// The most distinct response codes tallied (DNS has 16 in its header; the rest are counted
/// as `OTHER`).
const MAX_RCODES: usize = 32;

/// The bucket of a latency of `us` microseconds.
fn bucket(us: u64) -> usize {
    let us = us.min(MAX_LATENCY_US);
    if us < 1 << (SUB_BITS + 1) {
        return us as usize;
    }
    let shift = 63 - us.leading_zeros() - SUB_BITS; // 1 for 1,024..=2,047
    let top = (us >> shift) as usize; // in 512..1,024
    (1 << (SUB_BITS + 1)) + (shift as usize - 1) * (1 << SUB_BITS) + (top - (1 << SUB_BITS))
}

/// The largest latency, µs, bucket `i` holds.
fn bucket_top(i: usize) -> u64 {
    if i < 1 << (SUB_BITS + 1) {
        return i as u64;
    }
    let k = i - (1 << (SUB_BITS + 1));
    let shift = k / (1 << SUB_BITS) + 1;
    let top = (k % (1 << SUB_BITS) + (1 << SUB_BITS)) as u64;
    ((top + 1) << shift) - 1
}

/// Latencies, µs, in buckets of bounded relative width (a fixed 128 KiB, however many).
#[derive(Clone, Debug)]
pub(crate) struct Histogram {
    counts: Vec<u64>,
    n: u64,
    max_us: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: vec![0; bucket(MAX_LATENCY_US) + 1],
            n: 0,
            max_us: 0,
        }
    }
}

impl Histogram {
    pub(crate) fn record(&mut self, us: u64) {
        self.counts[bucket(us)] += 1;
        self.n += 1;
        self.max_us = self.max_us.max(us);
    }

    pub(crate) fn merge(&mut self, other: &Histogram) {
        for (c, o) in self.counts.iter_mut().zip(&other.counts) {
            *c += o;
        }
        self.n += other.n;
        self.max_us = self.max_us.max(other.max_us);
    }

    /// The latency, ms, at or below which a share `q` of those recorded lie (the top of its
    /// bucket, at most the largest recorded); NaN when none are.
    pub(crate) fn quantile_ms(&self, q: f64) -> f64 {
        if self.n == 0 {
            return f64::NAN;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.n as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return bucket_top(i).min(self.max_us) as f64 / 1e3;
            }
        }
        self.max_us as f64 / 1e3
    }

    pub(crate) fn max_ms(&self) -> f64 {
        if self.n == 0 {
            f64::NAN
        } else {
            self.max_us as f64 / 1e3
        }
    }
}

/// What dnsperf's per-query lines said over an interval.
#[derive(Clone, Debug, Default)]
pub(crate) struct Tally {
    /// Answers by response code, in the order first seen.
    pub(crate) rcodes: Vec<(String, u64)>,
    /// Queries that timed out (`T`): lost.
    pub(crate) timeouts: u64,
    /// Queries still in flight when dnsperf stopped (`I`).
    pub(crate) interrupted: u64,
    /// The answers' latencies.
    pub(crate) latency: Histogram,
}

impl Tally {
    /// Counts a per-query line (what follows its `> `); false if it is not one.
    pub(crate) fn note(&mut self, line: &str) -> bool {
        let mut words = line.split_whitespace();
        let Some(code) = words.next() else {
            return false;
        };
        match code {
            "T" => self.timeouts += 1,
            "I" => self.interrupted += 1,
            _ => {
                let Some(secs) = words.last().and_then(|w| w.parse::<f64>().ok()) else {
                    return false;
                };
                self.answer(code, 1);
                if secs.is_finite() && secs >= 0.0 {
                    self.latency.record((secs * 1e6).round() as u64);
                }
            }
        }
        true
    }

    fn answer(&mut self, code: &str, n: u64) {
        if let Some(entry) = self.rcodes.iter_mut().find(|(c, _)| c == code) {
            entry.1 += n;
        } else if self.rcodes.len() < MAX_RCODES {
            self.rcodes.push((code.to_string(), n));
        } else {
            self.answer("OTHER", n);
        }
    }

    pub(crate) fn merge(&mut self, other: &Tally) {
        for (code, n) in &other.rcodes {
            self.answer(code, *n);
        }
        self.timeouts += other.timeouts;
        self.interrupted += other.interrupted;
        self.latency.merge(&other.latency);
    }

    pub(crate) fn answered(&self) -> u64 {
        self.rcodes.iter().map(|(_, n)| n).sum()
    }

    /// Queries that went wrong: lost (timed out) or answered with a code other than `expected`.
    pub(crate) fn errors(&self, expected: &str) -> u64 {
        let other: u64 = self
            .rcodes
            .iter()
            .filter(|(c, _)| c != expected)
            .map(|(_, n)| n)
            .sum();
        self.timeouts + other
    }
}

/// dnsperf running with `-v`, its output read by a thread of its own.
pub(crate) struct Stream {
    proc: Proc,
    reader: std::thread::JoinHandle<String>,
    /// What the per-query lines said since the last [`Stream::take`].
    tally: Arc<Mutex<Tally>>,
}

impl Stream {
    /// Starts `dnsperf args` (which must hold `-v`), its errors to `err_log`; the reader stops
    /// after `max_lines` lines.
    pub(crate) fn start(
        dnsperf: &Path,
        args: &[String],
        err_log: &Path,
        max_lines: u64,
    ) -> Result<Stream> {
        let err = std::fs::File::create(err_log)
            .with_context(|| format!("creating {}", err_log.display()))?;
        let mut child = Command::new(dnsperf)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(err)
            .spawn()
            .context("starting dnsperf")?;
        let out = child.stdout.take().context("dnsperf's output")?;
        let proc = Proc(child, "dnsperf");
        let tally = Arc::new(Mutex::new(Tally::default()));
        let shared = Arc::clone(&tally);
        let reader = std::thread::Builder::new()
            .name("bench-soak-dnsperf".into())
            .spawn(move || read(out, &shared, max_lines))?;
        Ok(Stream {
            proc,
            reader,
            tally,
        })
    }

    /// The tally since the last call.
    pub(crate) fn take(&self) -> Tally {
        std::mem::take(&mut *lock(&self.tally))
    }

    pub(crate) fn pid(&self) -> u32 {
        self.proc.0.id()
    }

    /// Whether dnsperf has exited.
    pub(crate) fn exited(&mut self) -> Result<bool> {
        Ok(self.proc.0.try_wait()?.is_some())
    }

    /// Once dnsperf has exited: waits for the reader to read the rest; dnsperf's statistics,
    /// and the tally since the last [`Stream::take`].
    pub(crate) fn finish(self) -> Result<(Run, Tally)> {
        let text = self
            .reader
            .join()
            .map_err(|_| anyhow::anyhow!("the reader of dnsperf's output panicked"))?;
        let run = parse_dnsperf(&text).with_context(|| format!("dnsperf: {text}"))?;
        let rest = std::mem::take(&mut *lock(&self.tally));
        Ok((run, rest))
    }
}

/// Reads dnsperf's output until it ends (or `max_lines`): the per-query lines into `tally`,
/// the rest returned (at most `MAX_TEXT_BYTES`).
fn read(out: ChildStdout, tally: &Mutex<Tally>, max_lines: u64) -> String {
    let mut reader = BufReader::with_capacity(1 << 16, out);
    let (mut line, mut text) = (String::new(), String::new());
    for _ in 0..max_lines {
        line.clear();
        match reader.read_line(&mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        let noted = line
            .strip_prefix("> ")
            .is_some_and(|rest| lock(tally).note(rest));
        if !noted && text.len() + line.len() <= MAX_TEXT_BYTES {
            text.push_str(&line);
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_contiguous_and_narrow() {
        // Every value falls in a bucket whose top is at least the value and within 0.2% of it.
        let mut values: Vec<u64> = (0..5_000).collect();
        values.extend((10..40).map(|b| (1u64 << b) - 1));
        values.extend((10..40).map(|b| 1u64 << b));
        values.extend([123_456, 5_000_000, 999_999_999]);
        for v in values {
            let i = bucket(v);
            assert!(bucket_top(i) >= v, "{v}: top {}", bucket_top(i));
            assert!(
                (bucket_top(i) - v) as f64 <= 0.002 * v as f64,
                "{v}: top {}",
                bucket_top(i)
            );
            if i > 0 {
                assert!(bucket_top(i - 1) < v, "{v}: the bucket before holds it too");
            }
        }
        assert_eq!(bucket(u64::MAX), bucket(MAX_LATENCY_US));
        assert_eq!(
            Histogram::default().counts.len(),
            bucket(MAX_LATENCY_US) + 1
        );
    }

    /// Quantiles against the sorted values they come from (the reference).
    #[test]
    fn quantiles_match_the_sorted_values() {
        let mut h = Histogram::default();
        let mut values: Vec<u64> = (0..10_000u64).map(|i| (i * 7919) % 20_000 + 50).collect();
        for &v in &values {
            h.record(v);
        }
        values.sort_unstable();
        for q in [0.5, 0.9, 0.99, 0.999, 1.0] {
            let want = values[((q * values.len() as f64).ceil() as usize).max(1) - 1] as f64;
            let got = h.quantile_ms(q) * 1e3;
            assert!(
                got >= want && got <= want * 1.002 + 1.0,
                "q {q}: {got} vs {want}"
            );
        }
        assert_eq!(h.max_ms(), values[values.len() - 1] as f64 / 1e3);
        assert!(Histogram::default().quantile_ms(0.99).is_nan());
    }

    #[test]
    fn dnsperf_verbose_lines_are_tallied() {
        let mut t = Tally::default();
        for line in [
            "NOERROR www.cdn.example. A 0.000123",
            "NOERROR v1.video.cdn.example. AAAA 0.002000",
            "SERVFAIL www.cdn.example. A 0.000050",
            "T www.cdn.example. A",
            "I www.cdn.example. A",
        ] {
            assert!(t.note(line), "{line}");
        }
        assert!(!t.note(""));
        assert!(!t.note("NOERROR without a latency"));
        assert_eq!(t.answered(), 3);
        assert_eq!((t.timeouts, t.interrupted), (1, 1));
        // Lost, and the answer that was not NOERROR.
        assert_eq!(t.errors("NOERROR"), 2);
        assert_eq!(t.latency.n, 3);
        assert_eq!(t.latency.max_ms(), 2.0);
        let mut all = Tally::default();
        all.merge(&t);
        all.merge(&t);
        assert_eq!(
            all.rcodes,
            vec![("NOERROR".to_string(), 4), ("SERVFAIL".to_string(), 2)]
        );
        assert_eq!(all.errors("NOERROR"), 4);
        assert_eq!(all.latency.n, 6);
    }
}
