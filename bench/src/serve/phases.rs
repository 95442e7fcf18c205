//! The phases of a run: the mapper and the front ends started, the reports started, the counted rounds followed, the restart after `kill -9`.

use super::*;

/// A `cdnmap serve` started by the bench.
pub(crate) struct Mapper {
    pub(crate) idx: usize,
    pub(crate) log: LogTail,
    pub(crate) spawned_ms: f64,
    pub(crate) grpc: SocketAddr,
    pub(crate) http: SocketAddr,
}

/// A `cdnmap dns` started by the bench: when it was started, took its first map into use and
/// first answered (Unix ms).
pub(crate) struct Front {
    pub(crate) idx: usize,
    pub(crate) log: LogTail,
    pub(crate) spawned_ms: f64,
    pub(crate) dns: SocketAddr,
    /// Its Prometheus `/metrics`.
    pub(crate) metrics: Option<SocketAddr>,
    pub(crate) in_use_ms: f64,
    pub(crate) in_use: (u64, u64),
    pub(crate) answer_ms: f64,
}

/// What every phase needs.
pub(crate) struct Ctx<'a> {
    pub(crate) a: &'a ServeBenchArgs,
    pub(crate) exe: PathBuf,
    pub(crate) dir: PathBuf,
    pub(crate) kids: Children,
    pub(crate) timeout: Duration,
}

/// Starts the mapper with configuration `conf` and waits until it listens (after its first
/// map, or the stored map).
pub(crate) fn start_mapper(ctx: &mut Ctx, conf: &Path, log: &str) -> Result<Mapper> {
    let log = ctx.dir.join(log);
    let spawned_ms = now_unix_ms();
    let idx = ctx.kids.add(spawn_serve(&ctx.exe, conf, &log)?, &log);
    let mut tail = LogTail::new(log);
    let (_, addrs) = wait_for(
        "listening line from the mapper",
        ctx.timeout,
        &mut ctx.kids,
        &ctx.dir,
        || {
            tail.poll();
            tail.listening()
        },
    )?;
    let [Some(grpc), Some(http), ..] = addrs else {
        bail!("the mapper's listening line names no grpc and http addresses");
    };
    Ok(Mapper {
        idx,
        log: tail,
        spawned_ms,
        grpc,
        http,
    })
}

/// Starts a front end following `grpc` and waits until it answers from a map.
/// `on_poll` runs at every look (the restart probes the running front end with it).
pub(crate) fn start_front(
    ctx: &mut Ctx,
    grpc: SocketAddr,
    (log, name): (&str, &'static str),
    on_poll: &mut dyn FnMut(),
) -> Result<Front> {
    let log = ctx.dir.join(log);
    let spawned_ms = now_unix_ms();
    let proc = spawn_dns(&ctx.exe, grpc, (&log, name), ctx.a.front_end_reports)?;
    let idx = ctx.kids.add(proc, &log);
    let mut tail = LogTail::new(log);
    let what = format!("DNS answer from {name}");
    let (dns, answer_ms) = wait_for(&what, ctx.timeout, &mut ctx.kids, &ctx.dir, || {
        on_poll();
        tail.poll();
        let dns = tail.listening()?.1[2]?;
        answers(dns, "cdn.example.").then(|| (dns, now_unix_ms()))
    })?;
    let metrics = tail.listening().and_then(|(_, addrs)| addrs[3]);
    let (in_use_ms, in_use) = wait_for(&what, ctx.timeout, &mut ctx.kids, &ctx.dir, || {
        tail.poll();
        tail.in_use()
    })?;
    Ok(Front {
        idx,
        log: tail,
        spawned_ms,
        dns,
        metrics,
        in_use_ms,
        in_use,
        answer_ms,
    })
}

/// How a front end came to hold the whole map: WatchMap messages, units, bytes on the wire,
/// seconds from the request to the map applied.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Join {
    pub(crate) messages: usize,
    pub(crate) units: usize,
    pub(crate) wire_bytes: u64,
    pub(crate) secs: f64,
}

/// Starts the bench's own WatchMap client behind the counting relay; waits until it holds
/// the whole map.
pub(crate) fn start_watcher(
    ctx: &mut Ctx,
    rt: &tokio::runtime::Runtime,
    grpc: SocketAddr,
) -> Result<(Arc<Watched>, Join)> {
    let watched = Arc::new(Watched::new());
    let relay = relay(grpc, Arc::clone(&watched))?;
    let asked = Instant::now();
    rt.spawn(watch_map(relay, Arc::clone(&watched)));
    wait_for(
        "whole map at the bench's WatchMap client",
        ctx.timeout,
        &mut ctx.kids,
        &ctx.dir,
        || {
            let error = lock(&watched.error).clone();
            match error {
                Some(e) => Some(Err(anyhow::anyhow!("the bench's WatchMap client: {e}"))),
                None => lock(&watched.map).is_some().then_some(Ok(())),
            }
        },
    )??;
    let updates = lock(&watched.updates).clone();
    let end = updates.iter().position(|u| u.full && !u.more).unwrap_or(0);
    let whole = &updates[..=end.min(updates.len().saturating_sub(1))];
    let join = Join {
        messages: whole.len(),
        units: whole.iter().map(|u| u.units).sum(),
        wire_bytes: whole.iter().map(|u| u.wire_bytes).sum(),
        secs: whole
            .last()
            .map_or(0.0, |u| u.at.duration_since(asked).as_secs_f64()),
    };
    Ok((watched, join))
}

/// What the counted rounds gave.
pub(crate) struct Counted {
    pub(crate) rounds: Vec<RoundRec>,
    /// Rounds `quiet` and after ran with the DNS load.
    pub(crate) quiet: usize,
    pub(crate) slow: usize,
    pub(crate) late: Front,
    pub(crate) late_after: usize,
    pub(crate) dns: DnsFigures,
    pub(crate) dns_cpu_us: f64,
    pub(crate) report_secs: f64,
    /// Demand samples acknowledged a second before the DNS load and during it.
    pub(crate) report_rates: (f64, f64),
}

/// The rounds observed after `known` of them, once a round published after `after`.
pub(crate) fn new_rounds(log: &mut LogTail, after: Option<&RoundRec>) -> Vec<RoundRec> {
    log.poll();
    let all = rounds_of(&log.events);
    match after {
        Some(r0) => all
            .into_iter()
            .filter(|r| r.epoch == r0.epoch && r.version > r0.version)
            .collect(),
        None => all,
    }
}

/// The reporters, until `until`.
pub(crate) fn start_reports(
    rt: &tokio::runtime::Runtime,
    grpc: SocketAddr,
    (inst, watched, stats): (&Arc<Instance>, &Arc<Watched>, &Arc<ReportStats>),
    (rate, noise, seed): (u64, f64, u64),
    until: Instant,
) -> Vec<tokio::task::JoinHandle<()>> {
    let (inst, stats) = (Arc::clone(inst), Arc::clone(stats));
    let mut tasks = vec![rt.spawn(report_loads(
        grpc,
        Arc::clone(&inst),
        Arc::clone(watched),
        until,
        Arc::clone(&stats),
    ))];
    if rate > 0 {
        let how = (rate, noise, seed);
        tasks.push(rt.spawn(report_demand(grpc, inst, how, until, stats)));
    }
    eprintln!("reports flowing: {rate} demand samples/s, every node's load with every map version");
    tasks
}

/// Reports flow; after the first round whose period they covered, the counted rounds: a
/// second front end started in the first half, the DNS load on the first front end in the
/// second half.
pub(crate) fn run_rounds(
    ctx: &mut Ctx,
    rt: &tokio::runtime::Runtime,
    mapper: &mut Mapper,
    front: &Front,
    (inst, watched, stats, rate): (&Arc<Instance>, &Arc<Watched>, &Arc<ReportStats>, u64),
    queries: &Path,
) -> Result<Counted> {
    let (a, cycle) = (ctx.a, Duration::from_secs(ctx.a.cycle_secs));
    let until = Instant::now() + cycle * (2 * a.rounds as u32 + 8) + ctx.timeout;
    let how = (rate, a.noise, a.seed);
    let tasks = start_reports(rt, mapper.grpc, (inst, watched, stats), how, until);
    let reports_from = Instant::now();
    let known = new_rounds(&mut mapper.log, None).len();
    let what = "round after the reports began";
    let r0 = wait_for(
        what,
        cycle * 3 + ctx.timeout,
        &mut ctx.kids,
        &ctx.dir,
        || new_rounds(&mut mapper.log, None).get(known).copied(),
    )?;
    eprintln!(
        "round of version {} had part of a period of reports; counting the {} after it",
        r0.version, a.rounds
    );
    let (quiet, late_after) = (a.rounds / 2, (a.rounds / 4).max(1));
    let load_secs = a.cycle_secs * (a.rounds - quiet) as u64;
    let (mut printed, mut late, mut load) = (0, None, None);
    let round_limit = cycle * 3 + ctx.timeout;
    let mut last_round = Instant::now();
    loop {
        let rounds = new_rounds(&mut mapper.log, Some(&r0));
        for (i, r) in rounds.iter().enumerate().take(a.rounds).skip(printed) {
            print_round(i + 1, a.rounds, r);
            last_round = Instant::now();
        }
        printed = rounds.len();
        if late.is_none() && rounds.len() >= late_after {
            eprintln!("starting a second cdnmap dns (after counted round {late_after})");
            let name = ("dns-late.log", "cdnmap dns (late)");
            late = Some(start_front(ctx, mapper.grpc, name, &mut || {})?);
        }
        if load.is_none() && rounds.len() >= quiet {
            let cpu = ctx.kids.pid(front.idx).and_then(cpu_secs);
            let started = start_dns_load(front.dns, queries, load_secs, a.dns_qps, &ctx.dir)?;
            let samples = stats.samples.load(Ordering::Relaxed);
            load = Some((started, Instant::now(), cpu, samples));
        }
        if rounds.len() >= a.rounds && late.is_some() {
            break;
        }
        ctx.kids.check(&ctx.dir)?;
        if last_round.elapsed() > round_limit {
            bail!(
                "no round within {round_limit:?}; see the logs in {}",
                ctx.dir.display()
            );
        }
        std::thread::sleep(POLL);
    }
    let Some((load, load_started, cpu_before, samples_before)) = load else {
        bail!("the DNS load was not started");
    };
    let dns = finish_dns_load(load, Duration::from_secs(load_secs) + ctx.timeout)?;
    let dns_secs = load_started.elapsed().as_secs_f64();
    let cpu_after = ctx.kids.pid(front.idx).and_then(cpu_secs);
    let report_secs = reports_from.elapsed().as_secs_f64();
    tasks.iter().for_each(|t| t.abort());
    let quiet_secs = load_started.duration_since(reports_from).as_secs_f64();
    let samples_after = stats.samples.load(Ordering::Relaxed) - samples_before;
    let report_rates = (
        samples_before as f64 / quiet_secs.max(1e-9),
        samples_after as f64 / dns_secs.max(1e-9),
    );
    let dns_cpu_us = match (cpu_before, cpu_after) {
        (Some(b), Some(e)) => (e - b) / (dns.qps * dns_secs).max(1.0) * 1e6,
        _ => f64::NAN,
    };
    let mut rounds = new_rounds(&mut mapper.log, Some(&r0));
    rounds.truncate(a.rounds);
    let slow = mapper.log.count(|e| *e == Event::Slow);
    let Some(late) = late else {
        bail!("the second front end was not started");
    };
    eprintln!("counted rounds done");
    Ok(Counted {
        rounds,
        quiet,
        slow,
        late,
        late_after,
        dns,
        dns_cpu_us,
        report_secs,
        report_rates,
    })
}

/// Waits (at most a minute) until the first front end and the bench's WatchMap client hold
/// version `last`, so that the last round's delta is counted too.
pub(crate) fn wait_followed(
    ctx: &mut Ctx,
    front: &mut Front,
    watched: &Watched,
    last: u64,
) -> Result<()> {
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(60) {
        front.log.poll();
        let at_front = front
            .log
            .events
            .iter()
            .any(|(_, e)| matches!(e, Event::InUse { version, .. } if *version >= last));
        if at_front && *watched.version.borrow() >= last {
            break;
        }
        ctx.kids.check(&ctx.dir)?;
        std::thread::sleep(POLL);
    }
    Ok(())
}

/// What the restart gave (times in seconds after the `kill -9`).
pub(crate) struct Restart {
    pub(crate) stored: u64,
    pub(crate) restored: Option<(f64, u64, u64)>,
    pub(crate) listening_s: f64,
    pub(crate) fresh: Front,
    pub(crate) killed_ms: f64,
    pub(crate) running_took: Option<(f64, (u64, u64))>,
    /// The version the running front end held at the kill.
    pub(crate) running_held: Option<(u64, u64)>,
    pub(crate) probes: (usize, usize),
    pub(crate) peak_mb: Option<f64>,
}

/// `kill -9` of the mapper once its last round (`last`) is stored, a start on the same store (and the
/// same gRPC address, so the running front end finds it again) with a fresh front end beside
/// it: the times to the stored map served and to the fresh front end's first answer.
pub(crate) fn restart(
    ctx: &mut Ctx,
    mapper: &mut Mapper,
    front: &mut Front,
    last: u64,
) -> Result<Restart> {
    let http = mapper.http;
    let stored = wait_for(
        "stored last round",
        ctx.timeout,
        &mut ctx.kids,
        &ctx.dir,
        || {
            let page = http_get(http, "/metrics").ok()?;
            let v = metric(&page, "cdnmap_map_stored_version")? as u64;
            (v >= last).then_some(v)
        },
    )?;
    eprintln!(
        "kill -9 of the mapper (version {stored} stored); starting it again on the same store"
    );
    ctx.kids.kill(mapper.idx);
    let killed_ms = now_unix_ms();
    let conf = write_serve_config(ctx.a, &ctx.dir, "serve-restart.toml", Some(mapper.grpc))?;
    let log = ctx.dir.join("serve-restart.log");
    let idx = ctx.kids.add(spawn_serve(&ctx.exe, &conf, &log)?, &log);
    let mut tail = LogTail::new(log);
    // The running front end keeps answering from its map meanwhile: probed once a second.
    let (mut ok, mut probes, mut probed) = (0, 0, Instant::now() - Duration::from_secs(1));
    let grpc = mapper.grpc;
    let dns = front.dns;
    let mut probe = || {
        if probed.elapsed() >= Duration::from_secs(1) {
            probes += 1;
            ok += usize::from(answers(dns, "cdn.example."));
            probed = Instant::now();
        }
    };
    let name = ("dns-restart.log", "cdnmap dns (started with the restart)");
    let fresh = start_front(ctx, grpc, name, &mut probe)?;
    let restarted = wait_for(
        "listening line of the restarted mapper",
        ctx.timeout,
        &mut ctx.kids,
        &ctx.dir,
        || {
            tail.poll();
            tail.listening()
        },
    )?;
    let restored = tail.find(|e| match e {
        Event::Restored { epoch, version } => Some((*epoch, *version)),
        _ => None,
    });
    // The running front end takes the restarted mapper's map once it has reconnected.
    let waited = Instant::now();
    let running_took = loop {
        front.log.poll();
        let took = front.log.events.iter().find_map(|(t, e)| match e {
            Event::InUse { epoch, version } if *t > killed_ms => Some((*t, (*epoch, *version))),
            _ => None,
        });
        if took.is_some() || waited.elapsed() > Duration::from_secs(30) {
            break took;
        }
        ctx.kids.check(&ctx.dir)?;
        std::thread::sleep(POLL);
    };
    mapper.idx = idx;
    mapper.log = tail;
    let s = |t: f64| (t - killed_ms) / 1e3;
    Ok(Restart {
        stored,
        restored: restored.map(|(t, (e, v))| (s(t), e, v)),
        listening_s: s(restarted.0),
        fresh,
        killed_ms,
        running_took: running_took.map(|(t, id)| (s(t), id)),
        running_held: front
            .log
            .events
            .iter()
            .rev()
            .filter(|(t, _)| *t <= killed_ms)
            .find_map(|(_, e)| match e {
                Event::InUse { epoch, version } => Some((*epoch, *version)),
                _ => None,
            }),
        probes: (ok, probes),
        peak_mb: peak_rss_mb(ctx.kids.pid(idx)),
    })
}
