//! The N-1 view, kept current beside the rounds (issue 45): every `[n1] every_secs` a sweep
//! ([`cdnmap_engine::n1::sweep`]) estimates what the loss of each cluster and each site would
//! do to the map in service, on a blocking thread at a low CPU priority and within
//! `budget_secs`; then the worst `exact_top` clusters and sites are previewed with the rounds'
//! own code ([`crate::preview`], when no operator's preview runs) and those figures replace
//! the estimates. The dashboard shows the result (`GET /api/n1`) and `/metrics` exports the
//! worst overflow for alerting (`cdnmap_n1_worst_overflow_ratio`).
//!
//! It never makes a round late: it reads the published snapshot (an `Arc`), holds no lock the
//! rounds take, runs at nice 10, one sweep at a time, and steps aside while a round solves
//! ([`Gate`]): a round waits at most for the one loss being estimated when it starts.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cdnmap_engine::n1::{rank, sweep, Loss};
use cdnmap_mapper::ClusterState;

pub use crate::config::{N1Config, MAX_N1_EXACT_TOP};
use crate::preview::{preview_changes, Turn};
use crate::service::{N1View, Shared};

/// A sweep's `go_on`: it steps aside while `busy` (a round solving), and stops once its own
/// time (the time it stepped aside not counted) passes `budget`.
pub struct Gate<'a> {
    busy: &'a AtomicBool,
    budget: Duration,
    used: Duration,
    since: Instant,
}

impl<'a> Gate<'a> {
    pub fn new(busy: &'a AtomicBool, budget: Duration) -> Gate<'a> {
        Gate {
            busy,
            budget,
            used: Duration::ZERO,
            since: Instant::now(),
        }
    }

    /// Whether the sweep goes on (after waiting out a round).
    pub fn go_on(&mut self) -> bool {
        if self.busy.load(Ordering::Relaxed) {
            self.used += self.since.elapsed();
            while self.busy.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(2));
            }
            self.since = Instant::now();
        }
        self.used + self.since.elapsed() < self.budget
    }
}

/// Sets the N-1 metrics from the map in service (its own overflow share: the least the worst
/// loss can leave, and what the gauge says until the first sweep), then runs sweeps until the
/// service stops. The metrics are there from the start, as every documented series is.
pub fn start(shared: &Arc<Shared>) -> tokio::task::JoinHandle<()> {
    let overflow = shared.current().map_or(0.0, |s| {
        let demand = s.topology.total_demand();
        if demand > 0.0 {
            s.map.total_overflow() / demand
        } else {
            0.0
        }
    });
    metrics::gauge!("cdnmap_n1_worst_overflow_ratio").set(overflow);
    metrics::gauge!("cdnmap_n1_sweep_seconds").set(0.0);
    tokio::spawn(run(Arc::clone(shared)))
}

/// Runs sweeps until the service stops.
pub async fn run(shared: Arc<Shared>) {
    let cfg = shared.config.n1.clone();
    if cfg.every_secs == 0 {
        return;
    }
    let mut stopping = shared.stopping.subscribe();
    let mut done_for = 0u64;
    loop {
        let wait = tokio::time::sleep(Duration::from_secs(cfg.every_secs));
        tokio::select! {
            _ = wait => {}
            _ = stopping.changed() => return,
        }
        let Some(current) = shared.current() else {
            continue;
        };
        if current.version == done_for {
            continue; // no new map since the last sweep
        }
        done_for = current.version;
        let budget = Duration::from_secs(cfg.budget_secs);
        let t = Instant::now();
        let me = Arc::clone(&shared);
        let swept = tokio::task::spawn_blocking(move || {
            crate::service::lower_thread_priority();
            let mut gate = Gate::new(&me.round.solving, budget);
            sweep(&current.topology, &current.map, &mut || gate.go_on())
        })
        .await;
        let Ok(mut found) = swept else {
            tracing::error!("the N-1 sweep panicked");
            continue;
        };
        let sweep_ms = t.elapsed().as_secs_f64() * 1e3;
        let t = Instant::now();
        refine(&shared, &mut found.clusters, cfg.exact_top).await;
        refine(&shared, &mut found.sites, cfg.exact_top).await;
        let exact_ms = t.elapsed().as_secs_f64() * 1e3;
        let worst = found
            .clusters
            .iter()
            .chain(&found.sites)
            .map(|l| l.overflow_share)
            .fold(found.overflow_share, f64::max);
        metrics::gauge!("cdnmap_n1_worst_overflow_ratio").set(worst);
        metrics::gauge!("cdnmap_n1_sweep_seconds").set((sweep_ms + exact_ms) / 1e3);
        tracing::debug!(
            version = done_for,
            sweep_ms,
            exact_ms,
            worst,
            complete = found.complete,
            "N-1 sweep"
        );
        shared.n1.store(Some(Arc::new(N1View {
            version: done_for,
            at_unix_ms: crate::clock::now_unix_ms(),
            sweep_ms,
            exact_ms,
            sweep: found,
        })));
    }
}

/// The worst `top` of `losses` (ranked) previewed exactly, their figures replacing the
/// estimates, and ranked again. A preview that fails, or finds an operator's running (they
/// come first: [`Turn::Spare`]), leaves the estimate.
async fn refine(shared: &Arc<Shared>, losses: &mut [Loss], top: usize) {
    let top = top.min(MAX_N1_EXACT_TOP).min(losses.len());
    for loss in &mut losses[..top] {
        let changes = loss
            .ids
            .iter()
            .map(|id| (id.clone(), ClusterState::Down))
            .collect();
        match preview_changes(shared, changes, 0, Turn::Spare).await {
            Ok(p) => {
                loss.overflow = p.after.overflow;
                loss.overflow_share = p.after.overflow_share;
                loss.nodes_full_added = p.after.nodes_full.saturating_sub(p.before.nodes_full);
                loss.rtt_shift_ms = p.after.mean_rtt_ms - p.before.mean_rtt_ms;
                loss.exact = true;
            }
            Err(e) => tracing::debug!(loss = %loss.name, error = %e, "N-1: no exact preview"),
        }
    }
    rank(losses);
}
