//! `cdnmap bench server-loads`: the service's table of reported server loads
//! (`cdnmap_api::selection::ServerLoads`, a `DashMap`) against what it replaced, a `HashMap`
//! behind one `Mutex` locked once per report, measured in the same run: one report of
//! `--servers` loads written (the Feedback handler), every load read once (publication and each
//! WatchMap conversion), and both at once (two reporters writing while a reader reads all).
//! Prints medians over `--runs` and the ratio.

use std::collections::HashMap;
use std::hint::black_box;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{ensure, Result};
use cdnmap_api::selection::ServerLoads;
use clap::Args;

use crate::solve::median;

#[derive(Args, Debug)]
pub struct LoadsBenchArgs {
    /// Servers in the table (and in each report).
    #[arg(long, default_value_t = 100_000)]
    pub servers: usize,
    /// Timed runs of each measurement.
    #[arg(long, default_value_t = 9)]
    pub runs: usize,
}

/// The table as it was: one mutex, locked once per report or read.
#[derive(Default)]
struct Locked(Mutex<HashMap<(String, IpAddr), f64>>);

impl Locked {
    fn set_all(&self, keys: &[(String, IpAddr)], load: f64) {
        if let Ok(mut t) = self.0.lock() {
            for k in keys {
                t.insert(k.clone(), load);
            }
        }
    }

    fn sum(&self, keys: &[(String, IpAddr)]) -> f64 {
        let Ok(t) = self.0.lock() else { return 0.0 };
        keys.iter()
            .map(|(c, a)| t.get(&(c.clone(), *a)).copied().unwrap_or(0.0))
            .sum()
    }
}

fn set_all(t: &ServerLoads, keys: &[(String, IpAddr)], load: f64) {
    for (c, a) in keys {
        t.set(c, *a, load);
    }
}

fn sum(t: &ServerLoads, keys: &[(String, IpAddr)]) -> f64 {
    keys.iter().map(|(c, a)| t.get(c, *a)).sum()
}

fn timed(runs: usize, mut f: impl FnMut()) -> Duration {
    f(); // warm-up
    let mut v: Vec<Duration> = (0..runs)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .collect();
    median(&mut v)
}

pub fn server_loads(a: &LoadsBenchArgs) -> Result<std::process::ExitCode> {
    ensure!(a.runs >= 1, "--runs must be at least 1");
    ensure!(
        (1..=10_000_000).contains(&a.servers),
        "--servers {}: must be in 1..=10000000",
        a.servers
    );
    let keys: Vec<(String, IpAddr)> = (0..a.servers)
        .map(|i| {
            let c = format!("c{:04}", i / 16);
            let ip = IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + i as u32));
            (c, ip)
        })
        .collect();
    let (old, new) = (Locked::default(), ServerLoads::default());
    old.set_all(&keys, 1.0);
    set_all(&new, &keys, 1.0);
    let half = keys.len() / 2;
    let rows = [
        (
            "one report written",
            timed(a.runs, || old.set_all(black_box(&keys), 2.0)),
            timed(a.runs, || set_all(&new, black_box(&keys), 2.0)),
        ),
        (
            "every load read",
            timed(a.runs, || {
                black_box(old.sum(&keys));
            }),
            timed(a.runs, || {
                black_box(sum(&new, &keys));
            }),
        ),
        (
            "2 reporters + 1 reader",
            timed(a.runs, || {
                std::thread::scope(|s| {
                    s.spawn(|| old.set_all(&keys[..half], 3.0));
                    s.spawn(|| old.set_all(&keys[half..], 3.0));
                    black_box(old.sum(&keys));
                })
            }),
            timed(a.runs, || {
                std::thread::scope(|s| {
                    s.spawn(|| set_all(&new, &keys[..half], 3.0));
                    s.spawn(|| set_all(&new, &keys[half..], 3.0));
                    black_box(sum(&new, &keys));
                })
            }),
        ),
    ];
    println!(
        "server loads   {} servers; medians of {} runs; Mutex<HashMap> (before) vs DashMap (now)",
        a.servers, a.runs
    );
    for (what, before, now) in rows {
        println!(
            "  {what:<24} before {:>8.2} ms   now {:>8.2} ms   now/before {:.2}",
            before.as_secs_f64() * 1e3,
            now.as_secs_f64() * 1e3,
            now.as_secs_f64() / before.as_secs_f64().max(1e-12)
        );
    }
    Ok(std::process::ExitCode::SUCCESS)
}
