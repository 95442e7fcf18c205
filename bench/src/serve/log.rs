//! The mapper's and the front ends' logs, read as they grow: the events the bench follows (the `listening` lines, each round's parts and publication, the versions a front end takes into use) and the rounds made of them.

use super::*;

/// What a line of a `cdnmap serve` or `cdnmap dns` log says, of what the bench reads.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Event {
    /// The addresses bound (`grpc`, `http` of the mapper; `dns`, `metrics` of a front end).
    Listening {
        grpc: Option<SocketAddr>,
        http: Option<SocketAddr>,
        dns: Option<SocketAddr>,
        metrics: Option<SocketAddr>,
    },
    /// A round's parts, ms: estimator, effective preferences, solve, index, publish, persist;
    /// and whether persist ran beside the index, inside the loop's step (builds from 849f255
    /// on say so in the line), or after it.
    Parts([f64; 6], bool),
    /// A round published: its identity, the loop's step (estimator to index) in ms, its churn.
    Published {
        epoch: u64,
        version: u64,
        step_ms: f64,
        churn: f64,
    },
    /// A round took longer than the cycle.
    Slow,
    /// A start serves the stored map.
    Restored { epoch: u64, version: u64 },
    /// A front end took a map version into use.
    InUse { epoch: u64, version: u64 },
    /// A front end opened its WatchMap stream.
    Following,
    /// The estimator's checkpoint: bytes, encode and write ms.
    Checkpoint { bytes: f64, ms: f64 },
    /// A line logged at ERROR.
    Error(String),
}

/// `s` without its terminal colour sequences (`ESC [ ... m`).
pub(crate) fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The value of `key=` in a log line (up to the next space).
pub(crate) fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let pat = format!(" {key}=");
    let at = line.find(&pat)? + pat.len();
    line[at..].split_whitespace().next()
}

pub(crate) fn num<T: std::str::FromStr>(line: &str, key: &str) -> Option<T> {
    field(line, key)?.parse().ok()
}

/// Days from 1970-01-01 to a civil date (Howard Hinnant's `days_from_civil`).
pub(crate) fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (m + if m > 2 { -3 } else { 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The time a log line starts with (`2026-12-01T15:16:27.677932Z`), in Unix ms.
pub(crate) fn line_time_ms(line: &str) -> Option<f64> {
    let stamp = line.split_whitespace().next()?.strip_suffix('Z')?;
    let (date, time) = stamp.split_once('T')?;
    let mut d = date.splitn(3, '-').map(|p| p.parse::<i64>().ok());
    let (y, mo, da) = (d.next()??, d.next()??, d.next()??);
    let mut t = time.splitn(3, ':');
    let (h, mi) = (
        t.next()?.parse::<i64>().ok()?,
        t.next()?.parse::<i64>().ok()?,
    );
    let s: f64 = t.next()?.parse().ok()?;
    let secs = days_from_civil(y, mo, da) * 86_400 + h * 3600 + mi * 60;
    Some(secs as f64 * 1e3 + s * 1e3)
}

/// The event a (colourless) log line reports, if the bench reads it.
pub(crate) fn parse_event(line: &str) -> Option<Event> {
    if line.contains(" round parts ") {
        let keys = [
            "estimator_ms",
            "effective_ms",
            "solve_ms",
            "index_ms",
            "publish_ms",
            "persist_ms",
        ];
        let mut parts = [0.0; 6];
        for (p, k) in parts.iter_mut().zip(keys) {
            *p = num(line, k)?;
        }
        return Some(Event::Parts(
            parts,
            line.contains("persist ran beside index"),
        ));
    }
    if line.contains(" round published ") {
        return Some(Event::Published {
            epoch: num(line, "epoch")?,
            version: num(line, "version")?,
            step_ms: num(line, "solve_ms")?,
            churn: num(line, "churn").unwrap_or(0.0),
        });
    }
    if line.contains(" listening ") {
        let addr = |k| num::<SocketAddr>(line, k);
        return Some(Event::Listening {
            grpc: addr("grpc"),
            http: addr("http"),
            dns: addr("dns"),
            metrics: addr("metrics"),
        });
    }
    if line.contains("round took longer than the cycle") {
        return Some(Event::Slow);
    }
    if line.contains("serving the stored map until the first round") {
        return Some(Event::Restored {
            epoch: num(line, "epoch")?,
            version: num(line, "version")?,
        });
    }
    if line.contains("map version in use") {
        return Some(Event::InUse {
            epoch: num(line, "epoch")?,
            version: num(line, "version")?,
        });
    }
    if line.contains("following the mapper's map") {
        return Some(Event::Following);
    }
    if line.contains(" estimator checkpoint ") {
        let ms = num::<f64>(line, "encode_ms")? + num::<f64>(line, "write_ms")?;
        return Some(Event::Checkpoint {
            bytes: num(line, "bytes")?,
            ms,
        });
    }
    if line.contains(" ERROR ") {
        return Some(Event::Error(line.to_string()));
    }
    None
}

/// A log file read as it grows: its events, each with the time its line gives (Unix ms).
pub(crate) struct LogTail {
    pub(crate) path: PathBuf,
    pub(crate) offset: u64,
    pub(crate) partial: String,
    pub(crate) events: Vec<(f64, Event)>,
}

impl LogTail {
    pub(crate) fn new(path: PathBuf) -> Self {
        LogTail {
            path,
            offset: 0,
            partial: String::new(),
            events: Vec::new(),
        }
    }

    /// Reads what was written since the last call.
    pub(crate) fn poll(&mut self) {
        let Ok(mut f) = std::fs::File::open(&self.path) else {
            return;
        };
        let mut buf = Vec::new();
        if f.seek(SeekFrom::Start(self.offset)).is_err() || f.read_to_end(&mut buf).is_err() {
            return;
        }
        self.offset += buf.len() as u64;
        self.partial.push_str(&String::from_utf8_lossy(&buf));
        while let Some(end) = self.partial.find('\n') {
            let line = strip_ansi(&self.partial[..end]);
            self.partial.drain(..=end);
            if let (Some(at), Some(e)) = (line_time_ms(&line), parse_event(&line)) {
                self.events.push((at, e));
            }
        }
    }

    pub(crate) fn find<T>(&self, f: impl Fn(&Event) -> Option<T>) -> Option<(f64, T)> {
        self.events.iter().find_map(|(t, e)| f(e).map(|x| (*t, x)))
    }

    /// When the process said where it listens, and the addresses: grpc, http, dns, metrics.
    pub(crate) fn listening(&self) -> Option<(f64, [Option<SocketAddr>; 4])> {
        self.find(|e| match e {
            Event::Listening {
                grpc,
                http,
                dns,
                metrics,
            } => Some([*grpc, *http, *dns, *metrics]),
            _ => None,
        })
    }

    pub(crate) fn in_use(&self) -> Option<(f64, (u64, u64))> {
        self.find(|e| match e {
            Event::InUse { epoch, version } => Some((*epoch, *version)),
            _ => None,
        })
    }

    pub(crate) fn count(&self, f: impl Fn(&Event) -> bool) -> usize {
        self.events.iter().filter(|(_, e)| f(e)).count()
    }
}

/// One round as the mapper's log tells it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RoundRec {
    pub(crate) at_ms: f64,
    pub(crate) epoch: u64,
    pub(crate) version: u64,
    /// Estimator, effective preferences, solve, index, publish, persist, ms.
    pub(crate) parts: [f64; 6],
    /// The loop's step (estimator to index, with persist beside the index when
    /// `persist_in_step`), ms.
    pub(crate) step_ms: f64,
    pub(crate) persist_in_step: bool,
    pub(crate) churn: f64,
}

impl RoundRec {
    /// The whole round: the step, then publish, and persist when it ran after the step (in
    /// builds before 849f255; the estimator entry's encoding, a part of both the step and
    /// persist there, is counted twice: well under a millisecond).
    pub(crate) fn total_ms(&self) -> f64 {
        let after = if self.persist_in_step {
            0.0
        } else {
            self.parts[5]
        };
        self.step_ms + self.parts[4] + after
    }
}

/// The rounds of a mapper's log: each `round parts` line with the `round published` after it.
pub(crate) fn rounds_of(events: &[(f64, Event)]) -> Vec<RoundRec> {
    let mut out = Vec::new();
    let mut parts = None;
    for (at, e) in events {
        match e {
            Event::Parts(p, beside) => parts = Some((*p, *beside)),
            Event::Published {
                epoch,
                version,
                step_ms,
                churn,
            } => {
                if let Some((parts, persist_in_step)) = parts.take() {
                    out.push(RoundRec {
                        at_ms: *at,
                        epoch: *epoch,
                        version: *version,
                        parts,
                        step_ms: *step_ms,
                        persist_in_step,
                        churn: *churn,
                    });
                }
            }
            _ => {}
        }
    }
    out
}
