//! The figures, printed: per round, and the medians and maxima over the counted rounds.

use super::*;

pub(crate) fn print_round(i: usize, of: usize, r: &RoundRec) {
    let p = r.parts;
    eprintln!(
        "round {i}/{of} (version {}): {:.0} ms = step {:.0} (estimator {:.0}, effective {:.0}, \
         solve {:.0}, index {:.0}) + publish {:.0} + persist {:.0}; churn {:.3}%",
        r.version,
        r.total_ms(),
        r.step_ms,
        p[0],
        p[1],
        p[2],
        p[3],
        p[4],
        p[5],
        100.0 * r.churn
    );
}

pub(crate) fn median_max(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => (f64::NAN, f64::NAN),
        n if n % 2 == 1 => (v[n / 2], v[n - 1]),
        n => ((v[n / 2 - 1] + v[n / 2]) / 2.0, v[n - 1]),
    }
}

pub(crate) fn mb(bytes: f64) -> f64 {
    bytes / 1e6
}

/// For each round of `rounds`, the time from its `round published` line (written after the
/// round is persisted, when WatchMap announces it) to the front end of `log` taking it into
/// use, ms.
pub(crate) fn front_lags(rounds: &[RoundRec], log: &LogTail) -> Vec<f64> {
    rounds
        .iter()
        .filter_map(|r| {
            let (t, ()) = log.find(|e| {
                (*e == Event::InUse {
                    epoch: r.epoch,
                    version: r.version,
                })
                .then_some(())
            })?;
            Some(t - r.at_ms)
        })
        .collect()
}

/// Everything measured before the restart.
pub(crate) struct Figures {
    pub(crate) first_map_s: f64,
    pub(crate) listening_s: f64,
    pub(crate) store_first: u64,
    pub(crate) store_after: u64,
    /// Of `store_after`: the demand record (bounded by `record_max_mb`).
    pub(crate) record_after: u64,
    /// Of `store_after`: the value files by kind (map records whole and as deltas, topology
    /// snapshots, the estimator's checkpoint and round entries), with their counts.
    pub(crate) values_after: Vec<(String, usize, u64)>,
    pub(crate) versions: u64,
    pub(crate) join: Join,
    pub(crate) front: (f64, f64),
    pub(crate) late: (f64, f64),
    pub(crate) peaks: [Option<f64>; 3],
    pub(crate) deltas: Vec<UpdateRec>,
    pub(crate) units: usize,
    /// [`front_lags`] of the first front end over the counted rounds.
    pub(crate) lags: Vec<f64>,
    /// The first round's persist, ms (the first map is served after it).
    pub(crate) first_persist_ms: f64,
}

pub(crate) fn fmt_mb(x: Option<f64>) -> String {
    x.map_or("unknown".into(), |v| format!("{v:.0} MB"))
}

/// A row of the rounds' table: median and max over all counted rounds, the quiet ones and
/// those with the DNS load.
pub(crate) fn print_row(name: &str, c: &Counted, f: impl Fn(&RoundRec) -> f64, digits: usize) {
    let cell = |rs: &[RoundRec]| {
        let (m, x) = median_max(rs.iter().map(&f).collect());
        format!("{m:.digits$} / {x:.digits$}")
    };
    let q = c.quiet.min(c.rounds.len());
    println!(
        "| {name} | {} | {} | {} |",
        cell(&c.rounds),
        cell(&c.rounds[..q]),
        cell(&c.rounds[q..])
    );
}

pub(crate) fn print_rounds(a: &ServeBenchArgs, c: &Counted) {
    let v = |i: usize| c.rounds.get(i).map_or(0, |r| r.version);
    let (n, q) = (c.rounds.len(), c.quiet.min(c.rounds.len()));
    println!(
        "round parts over {n} counted rounds (versions {}..={}), from the mapper's log (`round \
         parts` and `round published` lines), with reports flowing; the DNS load ran during \
         the last {} (versions {}..={}):",
        v(0),
        v(n.saturating_sub(1)),
        n - q,
        v(q),
        v(n.saturating_sub(1))
    );
    println!(
        "| part, ms: median / max | all {n} rounds | {q} rounds without DNS load | {} rounds with it |",
        n - q
    );
    println!("|---|---|---|---|");
    let names = [
        "estimator",
        "effective preferences",
        "solve",
        "index",
        "publish",
        "persist",
    ];
    for (i, name) in names.iter().enumerate() {
        print_row(name, c, |r| r.parts[i], 1);
    }
    print_row("the loop's step (estimator to index)", c, |r| r.step_ms, 1);
    print_row(
        "**round in all** (step + publish; + persist when it ran after the step)",
        c,
        RoundRec::total_ms,
        1,
    );
    print_row("churn (%)", c, |r| 100.0 * r.churn, 3);
    let over = c
        .rounds
        .iter()
        .filter(|r| r.total_ms() > a.cycle_secs as f64 * 1e3)
        .count();
    println!(
        "overruns: {over} of the counted rounds over the {} s cycle; {} `round took longer than \
         the cycle` lines in the whole log",
        a.cycle_secs, c.slow
    );
}

pub(crate) fn print_service(a: &ServeBenchArgs, f: &Figures, c: &Counted, stats: &ReportStats) {
    println!(
        "first published map: {:.1} s after the mapper's start (the demo world generated, the cold \
         round; its `round published` line, after its persist of {:.1} s; listening at {:.1} s)",
        f.first_map_s,
        f.first_persist_ms / 1e3,
        f.listening_s
    );
    let (m, x) = median_max(f.lags.clone());
    println!(
        "a round's map in use at the first front end {m:.0} ms (median) after the round's `round \
         published` line, max {x:.0} ms, over {} counted rounds (WatchMap announces a round after \
         its persist)",
        f.lags.len()
    );
    let ld = |x: &AtomicU64| x.load(Ordering::Relaxed);
    println!(
        "reports over {:.0} s: {} demand reports, {} samples ({:.0}/s acknowledged before the DNS \
         load, {:.0}/s during it, of {}/s asked; {} ticks skipped with {MAX_REPORTS_IN_FLIGHT} \
         calls open); {} load reports, {} node loads; {} calls failed{}; slowest call {:.0} ms",
        c.report_secs,
        ld(&stats.demand_reports),
        ld(&stats.samples),
        c.report_rates.0,
        c.report_rates.1,
        a.report_rate
            .unwrap_or((a.map_units as u64).div_ceil(a.cycle_secs)),
        ld(&stats.skipped),
        ld(&stats.load_reports),
        ld(&stats.loads),
        ld(&stats.failed),
        lock(&stats.first_error)
            .as_ref()
            .map_or(String::new(), |e| format!(" (first: {e})")),
        ld(&stats.latency_us_max) as f64 / 1e3
    );
    println!(
        "peak RSS (VmHWM): cdnmap serve {}; cdnmap dns {} (started with it), {} (joined late); \
         this bench's own process (the world, its WatchMap client's map, the reports) {}, {:.0} s \
         of CPU so far",
        fmt_mb(f.peaks[0]),
        fmt_mb(f.peaks[1]),
        fmt_mb(f.peaks[2]),
        fmt_mb(peak_rss_mb(Some(std::process::id()))),
        cpu_secs(std::process::id()).unwrap_or(f64::NAN)
    );
    println!(
        "store on disk: {:.1} MB after the first round; {:.1} MB after {} rounds (versions 1..={}), \
         the demand record of the reports included",
        mb(f.store_first as f64),
        mb(f.store_after as f64),
        f.versions,
        f.versions
    );
    let kinds: Vec<String> = f
        .values_after
        .iter()
        .map(|(kind, n, bytes)| format!("{kind} {:.1} MB ({n})", mb(*bytes as f64)))
        .collect();
    println!(
        "  of which the demand record {:.1} MB (bounded by record_max_mb), and the value files: {}",
        mb(f.record_after as f64),
        kinds.join(", ")
    );
    let j = f.join;
    println!(
        "joining: the whole map over WatchMap to the bench's own client in {:.2} s (messages: {}, units: {}, \
         {:.1} MB on the wire); cdnmap dns started with the mapper: map in use {:.2} s after its start, \
         first answer {:.2} s; cdnmap dns started after counted round {}: map in use {:.2} s, first answer {:.2} s",
        j.secs, j.messages, j.units, mb(j.wire_bytes as f64), f.front.0, f.front.1, c.late_after, f.late.0, f.late.1
    );
    print_deltas(f);
    let d = &c.dns;
    println!(
        "DNS during the last {} counted rounds, {} against the first cdnmap dns: {:.0} queries/s, NOERROR {:.2}%, \
         lost {}, mean latency {}; the front end's CPU {:.2} µs per query",
        c.rounds.len() - c.quiet.min(c.rounds.len()),
        d.tool,
        d.qps,
        d.noerror_pct,
        d.lost,
        if d.latency_ms.is_nan() {
            "not measured".to_string()
        } else {
            format!("{:.3} ms", d.latency_ms)
        },
        c.dns_cpu_us
    );
}

pub(crate) fn print_deltas(f: &Figures) {
    if f.deltas.is_empty() {
        println!("a round's delta: not observed (the bench's WatchMap client got no delta in the counted rounds)");
        return;
    }
    let units = median_max(
        f.deltas
            .iter()
            .map(|d| (d.units + d.removed) as f64)
            .collect(),
    );
    let bytes = median_max(f.deltas.iter().map(|d| d.wire_bytes as f64).collect());
    println!(
        "a round's delta (WatchMap, {} deltas seen by the bench's client behind a byte-counting relay): \
         median {:.0} units ({:.2}% of {}), max {:.0}; median {:.2} MB on the wire, max {:.2} MB \
         (the whole map: {:.1} MB)",
        f.deltas.len(),
        units.0,
        100.0 * units.0 / f.units.max(1) as f64,
        f.units,
        units.1,
        mb(bytes.0),
        mb(bytes.1),
        mb(f.join.wire_bytes as f64)
    );
}

pub(crate) fn print_restart(r: &Restart) {
    let s = |t: f64| (t - r.killed_ms) / 1e3;
    let (e, v) = r.fresh.in_use;
    let stored = if v == r.stored {
        "the stored map"
    } else {
        "NOT the stored map"
    };
    let stream = r
        .fresh
        .log
        .find(|e| (*e == Event::Following).then_some(()))
        .map_or("—".into(), |(t, ())| format!("{:.1} s", s(t)));
    println!(
        "restart (kill -9, then a start on the same store, version {} stored): the stored map served \
         {}; listening {:.1} s; a cdnmap dns started with it: WatchMap stream open {stream} (after its \
         reconnection backoff), map in use {:.1} s (epoch {e} version {v}: {stored}), first DNS \
         answer {:.1} s after the kill",
        r.stored,
        r.restored.map_or("— no `serving the stored map` line".into(), |(t, e, v)| format!(
            "{t:.1} s after the kill (epoch {e} version {v})"
        )),
        r.listening_s,
        s(r.fresh.in_use_ms),
        s(r.fresh.answer_ms)
    );
    println!(
        "  meanwhile the running front end answered {} of {} probes (one a second) and {}; the \
         restarted mapper's peak RSS {}",
        r.probes.0,
        r.probes.1,
        r.running_took.map_or(
            "took no new map version within 30 s".into(),
            |(t, (e, v))| format!(
                "took its first map version after the kill, epoch {e} version {v}, into use \
                 {t:.1} s after it (it held {})",
                r.running_held
                    .map_or("none".into(), |(e, v)| format!("epoch {e} version {v}"))
            )
        ),
        fmt_mb(r.peak_mb)
    );
}

pub(crate) fn print_logs(mapper: &LogTail, fronts: &[&LogTail]) {
    let cps: Vec<(f64, f64)> = mapper
        .events
        .iter()
        .filter_map(|(_, e)| match e {
            Event::Checkpoint { bytes, ms } => Some((*bytes, *ms)),
            _ => None,
        })
        .collect();
    if let Some(&(bytes, _)) = cps.last() {
        let (m, x) = median_max(cps.iter().map(|c| c.1).collect());
        println!(
            "estimator checkpoints (off the round): {} of {:.0} MB of state (less on disk, compressed), median {m:.0} ms, max {x:.0} ms",
            cps.len(),
            mb(bytes)
        );
    }
    let errors: Vec<&String> = std::iter::once(mapper)
        .chain(fronts.iter().copied())
        .flat_map(|l| l.events.iter())
        .filter_map(|(_, e)| match e {
            Event::Error(line) => Some(line),
            _ => None,
        })
        .collect();
    if let Some(first) = errors.first() {
        println!("ERROR lines in the logs: {} (first: {first})", errors.len());
    }
}
