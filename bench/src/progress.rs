//! The terminal side of a long computation: a progress indicator, and a world generated with
//! one.
//!
//! On a terminal, [`Progress`] is an indicatif bar on stderr. When stderr is not a terminal
//! (a log file, journald, `kubectl logs`, a CI run), indicatif hides its bar (its stderr
//! target draws only to a terminal), so [`Progress`] prints plain lines there instead: one at
//! every tenth of the work done, and one at least every [`PLAIN_EVERY`] while it goes on, so a
//! long run's log is not silent and never a wall of redraws.

use std::io::IsTerminal;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::Result;
use cdnmap_topology::Topology;
use cdnmap_world::world::{self, WorldParams};
use indicatif::{ProgressBar, ProgressStyle};

/// The longest a long computation goes without a plain progress line when stderr is not a
/// terminal.
pub const PLAIN_EVERY: Duration = Duration::from_secs(10);

/// Progress of `len` steps (0: not known yet) on stderr: a bar on a terminal, plain lines
/// otherwise (module docs). Shared by reference between threads.
pub struct Progress {
    bar: ProgressBar,
    plain: Option<Mutex<Plain>>,
}

/// The shortest time between two plain lines for tenths of the work: a run of a second
/// prints its last line only, not ten.
pub const PLAIN_GAP_MIN: Duration = Duration::from_secs(1);

/// The state of the plain lines.
struct Plain {
    what: String,
    len: u64,
    pos: u64,
    started: Instant,
    last_line: Instant,
    /// The last tenth of the work a line was printed for.
    last_tenth: u64,
}

impl Plain {
    /// The line for the current position, if one is due.
    fn due(&mut self, now: Instant) -> Option<String> {
        let tenth = (self.pos.min(self.len) * 10)
            .checked_div(self.len)
            .unwrap_or(0);
        let since = now.duration_since(self.last_line);
        let by_work = tenth > self.last_tenth && since >= PLAIN_GAP_MIN;
        let by_time = since >= PLAIN_EVERY;
        if !(by_work || by_time) {
            return None;
        }
        self.last_tenth = self.last_tenth.max(tenth);
        self.last_line = now;
        Some(self.line(now))
    }

    fn line(&self, now: Instant) -> String {
        let secs = now.duration_since(self.started).as_secs_f64();
        match (self.pos.min(self.len) * 100).checked_div(self.len) {
            Some(pct) => format!(
                "{}: {}/{} ({pct}%), {secs:.1} s",
                self.what, self.pos, self.len
            ),
            None => format!("{}: {}, {secs:.1} s", self.what, self.pos),
        }
    }
}

impl Progress {
    /// A bar when stderr is a terminal, plain lines otherwise.
    pub fn new(len: u64, what: &str) -> Progress {
        Progress::with_plain(len, what, !std::io::stderr().is_terminal())
    }

    /// `plain`: plain lines (and no bar) whatever stderr is.
    pub fn with_plain(len: u64, what: &str, plain: bool) -> Progress {
        let bar = if plain {
            ProgressBar::hidden()
        } else {
            let bar = ProgressBar::new(len);
            if let Ok(style) =
                ProgressStyle::with_template("{msg:>12} [{bar:40}] {pos}/{len} ({eta} left)")
            {
                bar.set_style(style.progress_chars("=> "));
            }
            bar.set_message(what.to_string());
            bar
        };
        let now = Instant::now();
        let plain = plain.then(|| {
            Mutex::new(Plain {
                what: what.to_string(),
                len,
                pos: 0,
                started: now,
                last_line: now,
                last_tenth: 0,
            })
        });
        Progress { bar, plain }
    }

    /// Applies `change` to the plain state and prints a line if one is due.
    fn plain(&self, change: impl FnOnce(&mut Plain)) {
        let Some(plain) = &self.plain else { return };
        let Ok(mut p) = plain.lock() else { return };
        change(&mut p);
        if let Some(line) = p.due(Instant::now()) {
            eprintln!("{line}");
        }
    }

    pub fn set_length(&self, len: u64) {
        self.bar.set_length(len);
        self.plain(|p| p.len = len);
    }

    pub fn set_position(&self, pos: u64) {
        self.bar.set_position(pos);
        self.plain(|p| p.pos = pos);
    }

    pub fn inc(&self, delta: u64) {
        self.bar.inc(delta);
        self.plain(|p| p.pos = p.pos.saturating_add(delta));
    }

    /// Runs `f` with the bar cleared from the terminal (to print lines between its redraws).
    pub fn suspend<R>(&self, f: impl FnOnce() -> R) -> R {
        self.bar.suspend(f)
    }

    /// Ends the bar (removing it from the terminal); in plain lines, the last tenth is printed
    /// if it was not.
    pub fn finish_and_clear(&self) {
        self.bar.finish_and_clear();
        let Some(plain) = &self.plain else { return };
        let Ok(mut p) = plain.lock() else { return };
        if p.len > 0 && p.pos >= p.len && p.last_tenth < 10 {
            p.last_tenth = 10;
            eprintln!("{}", p.line(Instant::now()));
        }
    }
}

/// Progress of `len` steps on stderr ([`Progress::new`]).
pub fn progress(len: u64, what: &str) -> Progress {
    Progress::new(len, what)
}

/// Generates a world with a progress indicator.
pub fn generate_world(params: &WorldParams) -> Result<Topology> {
    let bar = progress(params.map_units as u64, "world");
    let inst = world::generate(params, &|done| bar.set_position(done as u64))?;
    bar.finish_and_clear();
    Ok(inst)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Plain lines come at every tenth of the work, and after [`PLAIN_EVERY`] without one
    /// (the times are given, not read from the clock).
    #[test]
    fn plain_lines_at_every_tenth() {
        let now = Instant::now();
        let mut p = Plain {
            what: "w".into(),
            len: 1000,
            pos: 0,
            started: now,
            last_line: now,
            last_tenth: 0,
        };
        // A step every 20 ms: a tenth every 2 s.
        let at = |pos: u64| now + Duration::from_millis(20 * pos);
        let mut lines = Vec::new();
        for pos in 1..=1000 {
            p.pos = pos;
            lines.extend(p.due(at(pos)));
        }
        assert_eq!(lines.len(), 10, "{lines:?}");
        assert!(
            lines[0].starts_with("w: 100/1000 (10%), 2.0 s"),
            "{lines:?}"
        );
        assert!(
            lines[9].starts_with("w: 1000/1000 (100%), 20.0 s"),
            "{lines:?}"
        );
        // Without progress, a line after PLAIN_EVERY.
        assert!(p.due(at(1000)).is_none());
        assert!(p.due(at(1000) + PLAIN_EVERY).is_some());
        // Fast work: tenths within PLAIN_GAP_MIN print nothing (the end prints its line).
        p.last_line = now;
        p.last_tenth = 0;
        p.pos = 500;
        assert!(p.due(now + PLAIN_GAP_MIN / 2).is_none());
    }
}
