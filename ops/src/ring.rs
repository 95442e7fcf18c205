//! `cdnmap ring`: in-cluster server selection at work. Places servers on a ring, places a key
//! set with each policy (consistent hashing, bounded loads, power-of-d), and prints the max /
//! average load, the keys moved by adding or removing a server, and lookups per second on one
//! core beside a baseline (xxh3 of the key alone) measured in the same run.

use std::hint::black_box;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use cdnmap_select::{key_hash, BoundedLoads, PowerOfD, Ring, Selector, ServerIdx};
use clap::Args;

#[derive(Args, Debug)]
pub struct RingArgs {
    /// The cluster's servers, comma-separated ids.
    #[arg(long, value_delimiter = ',', required = true)]
    servers: Vec<String>,
    /// Virtual nodes per server.
    #[arg(long, default_value_t = 100)]
    vnodes: u32,
    /// The keys: a count (generated hostnames, unit weights) or a file with one key per line,
    /// optionally followed by whitespace and a weight.
    #[arg(long, default_value = "10000")]
    keys: String,
    /// A server to add (keys moved are reported).
    #[arg(long)]
    add: Option<String>,
    /// A server to remove (keys moved are reported).
    #[arg(long)]
    remove: Option<String>,
    /// The bounded-loads factor c (> 1).
    #[arg(long, default_value_t = 1.25)]
    c: f64,
    /// Power-of-d: how many candidates.
    #[arg(long, default_value_t = 2)]
    d: usize,
    /// Power-of-d: load reports arrive every this many keys placed.
    #[arg(long, default_value_t = 100)]
    report_every: usize,
    /// Print each key's server under each policy.
    #[arg(long)]
    show_keys: bool,
    /// Milliseconds per lookup measurement (0: no measurement).
    #[arg(long, default_value_t = 500)]
    bench_ms: u64,
}

pub(crate) const MAX_KEYS: usize = 10_000_000;

/// The keys of `--keys`: a count (generated hostnames, unit weights) or a file of `key [weight]`
/// lines. Also read by `cdnmap simulate hashing`.
pub(crate) fn read_keys(spec: &str) -> Result<Vec<(String, f64)>> {
    if let Ok(count) = spec.parse::<usize>() {
        if count > MAX_KEYS {
            bail!("--keys {count}: at most {MAX_KEYS}");
        }
        return Ok((0..count)
            .map(|i| (format!("obj{i}.cdn.example.com"), 1.0))
            .collect());
    }
    let path = Path::new(spec);
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut keys = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let mut parts = line.split_whitespace();
        let Some(key) = parts.next() else { continue };
        let weight = match parts.next() {
            None => 1.0,
            Some(w) => w
                .parse::<f64>()
                .with_context(|| format!("{}:{}: weight {w:?}", path.display(), n + 1))?,
        };
        if parts.next().is_some() {
            bail!("{}:{}: expected `key [weight]`", path.display(), n + 1);
        }
        keys.push((key.to_string(), weight));
        if keys.len() > MAX_KEYS {
            bail!("{}: more than {MAX_KEYS} keys", path.display());
        }
    }
    Ok(keys)
}

/// Each key's server id under each policy, for one server set.
struct Placement {
    ring: Vec<String>,
    bounded: Vec<String>,
    power: Vec<String>,
}

fn place(servers: &[String], keys: &[(&str, f64)], a: &RingArgs) -> Result<Placement> {
    let ids: Vec<&str> = servers.iter().map(String::as_str).collect();
    let ring = Ring::new(&ids, a.vnodes)?;
    let id = |s: ServerIdx| ring.id(s).to_string();
    let plain: Vec<String> = keys.iter().map(|k| id(ring.primary(k.0))).collect();
    let bounded: Vec<String> = BoundedLoads::assign(&ring, keys, a.c)?
        .into_iter()
        .map(id)
        .collect();
    let power = power_of_d_assign(&ring, keys, a.d, a.report_every)?
        .into_iter()
        .map(id)
        .collect();
    Ok(Placement {
        ring: plain,
        bounded,
        power,
    })
}

/// Power-of-d with load reports a batch old: places keys in order, re-reading the loads every
/// `report_every` keys. Also run by `cdnmap simulate hashing`.
pub(crate) fn power_of_d_assign(
    ring: &Ring,
    keys: &[(&str, f64)],
    d: usize,
    report_every: usize,
) -> Result<Vec<ServerIdx>> {
    let mut load = vec![0.0; ring.servers()];
    let mut placed = Vec::with_capacity(keys.len());
    let mut selector = PowerOfD::new(ring.clone(), d, load.clone())?;
    for (i, &(key, w)) in keys.iter().enumerate() {
        if i > 0 && i % report_every.max(1) == 0 {
            selector = PowerOfD::new(ring.clone(), d, load.clone())?;
        }
        let mut out = [0; 1];
        selector.pick(key, &mut out);
        load[out[0] as usize] += w;
        placed.push(out[0]);
    }
    Ok(placed)
}

fn max_avg(servers: &[String], owners: &[String], keys: &[(&str, f64)]) -> (f64, f64) {
    let mut load = vec![0.0; servers.len()];
    for (owner, &(_, w)) in owners.iter().zip(keys) {
        let s = servers
            .iter()
            .position(|x| x == owner)
            .expect("known server");
        load[s] += w;
    }
    let total: f64 = load.iter().sum();
    let avg = total / servers.len() as f64;
    (load.iter().copied().fold(0.0, f64::max), avg)
}

fn policies(p: &Placement) -> [(&'static str, &[String]); 3] {
    [
        ("consistent", &p.ring),
        ("bounded", &p.bounded),
        ("power-of-d", &p.power),
    ]
}

fn print_loads(title: &str, servers: &[String], p: &Placement, keys: &[(&str, f64)]) {
    println!("{title}: {} servers", servers.len());
    println!(
        "  {:<12} {:>10} {:>10} {:>8}",
        "policy", "max", "avg", "max/avg"
    );
    for (name, owners) in policies(p) {
        let (max, avg) = max_avg(servers, owners, keys);
        let ratio = if avg > 0.0 { max / avg } else { 0.0 };
        println!("  {name:<12} {max:>10.1} {avg:>10.1} {ratio:>8.3}");
    }
}

fn print_moves(change: &str, before: &Placement, after: &Placement) {
    println!("keys moved by {change}:");
    for ((name, b), (_, a)) in policies(before).into_iter().zip(policies(after)) {
        let moved = b.iter().zip(a).filter(|(x, y)| x != y).count();
        let share = moved as f64 / b.len().max(1) as f64;
        println!("  {name:<12} {moved:>10} ({:.2}%)", 100.0 * share);
    }
}

/// Median lookups per second of `f` over the keys, in runs of about `ms / 5` milliseconds.
fn rate(keys: &[&str], ms: u64, mut f: impl FnMut(&str) -> u64) -> f64 {
    let per_run = Duration::from_millis(ms.max(5) / 5);
    let mut rates = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        let mut n = 0u64;
        let mut acc = 0u64;
        while t.elapsed() < per_run {
            for &k in keys {
                acc = acc.wrapping_add(f(black_box(k)));
            }
            n += keys.len() as u64;
        }
        black_box(acc);
        rates.push(n as f64 / t.elapsed().as_secs_f64());
    }
    rates.sort_by(f64::total_cmp);
    rates[2]
}

fn bench(servers: &[String], a: &RingArgs) -> Result<()> {
    let ids: Vec<&str> = servers.iter().map(String::as_str).collect();
    let ring = Ring::new(&ids, a.vnodes)?;
    // 64 Ki distinct hostnames of realistic length: the working set of one DNS server.
    let owned: Vec<String> = (0..1 << 16)
        .map(|i| format!("obj{i}.cdn.example.com"))
        .collect();
    let keys: Vec<&str> = owned.iter().map(String::as_str).collect();
    let base = rate(&keys, a.bench_ms, key_hash);
    let one = rate(&keys, a.bench_ms, |k| u64::from(ring.primary(k)));
    let two = rate(&keys, a.bench_ms, |k| {
        let mut out = [0; 2];
        ring.pick(k, &mut out);
        u64::from(out[0]) ^ u64::from(out[1])
    });
    println!(
        "lookups on one core ({} points, {} keys):",
        ring.points(),
        keys.len()
    );
    println!("  baseline xxh3(key)  {:>8.1} M/s", base / 1e6);
    println!(
        "  ring, 1 server      {:>8.1} M/s  ({:.2} × baseline time)",
        one / 1e6,
        base / one
    );
    println!(
        "  ring, 2 servers     {:>8.1} M/s  ({:.2} × baseline time)",
        two / 1e6,
        base / two
    );
    Ok(())
}

pub fn run(a: &RingArgs) -> Result<()> {
    let owned = read_keys(&a.keys)?;
    let keys: Vec<(&str, f64)> = owned.iter().map(|(k, w)| (k.as_str(), *w)).collect();
    let servers = a.servers.clone();
    let total: f64 = keys.iter().map(|k| k.1).sum();
    println!(
        "{} keys (total weight {total:.1}), {} vnodes per server, bounded c = {}, power-of-{} with reports every {} keys",
        keys.len(),
        a.vnodes,
        a.c,
        a.d,
        a.report_every
    );
    let base = place(&servers, &keys, a)?;
    print_loads("placed", &servers, &base, &keys);
    if a.show_keys {
        println!(
            "  {:<32} {:>12} {:>12} {:>12}",
            "key", "consistent", "bounded", "power-of-d"
        );
        for (i, (key, _)) in keys.iter().enumerate() {
            println!(
                "  {key:<32} {:>12} {:>12} {:>12}",
                base.ring[i], base.bounded[i], base.power[i]
            );
        }
    }
    if let Some(x) = &a.add {
        if servers.contains(x) {
            bail!("--add {x:?}: already a server");
        }
        let mut more = servers.clone();
        more.push(x.clone());
        let after = place(&more, &keys, a)?;
        print_loads(&format!("after adding {x:?}"), &more, &after, &keys);
        print_moves(&format!("adding {x:?}"), &base, &after);
    }
    if let Some(x) = &a.remove {
        let less: Vec<String> = servers.iter().filter(|s| *s != x).cloned().collect();
        if less.len() == servers.len() {
            bail!("--remove {x:?}: not a server");
        }
        let after = place(&less, &keys, a)?;
        print_loads(&format!("after removing {x:?}"), &less, &after, &keys);
        print_moves(&format!("removing {x:?}"), &base, &after);
    }
    if a.bench_ms > 0 {
        bench(&servers, a)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Wrap {
        #[command(flatten)]
        a: RingArgs,
    }

    fn args(extra: &[&str]) -> RingArgs {
        let mut argv = vec!["ring", "--servers", "a,b,c,d", "--vnodes", "50"];
        argv.extend_from_slice(extra);
        Wrap::parse_from(argv).a
    }

    #[test]
    fn adding_a_server_moves_consistent_keys_only_to_it_and_bounded_stays_under_the_ceiling() {
        let a = args(&["--keys", "2000", "--c", "1.1", "--bench-ms", "0"]);
        let owned = read_keys(&a.keys).expect("count");
        let keys: Vec<(&str, f64)> = owned.iter().map(|(k, w)| (k.as_str(), *w)).collect();
        let before = place(&a.servers, &keys, &a).expect("placed");
        let mut more = a.servers.clone();
        more.push("e".to_string());
        let after = place(&more, &keys, &a).expect("placed");
        for (b, x) in before.ring.iter().zip(&after.ring) {
            assert!(b == x || x == "e");
        }
        let (max, _) = max_avg(&a.servers, &before.bounded, &keys);
        assert!(max <= 550.0, "bounded max {max} over ⌈1.1 × 500⌉");
        run(&a).expect("runs");
    }

    #[test]
    fn key_files_take_optional_weights_and_refuse_junk() {
        let dir = tempfile::tempdir().expect("tempdir");
        let good = dir.path().join("keys.txt");
        std::fs::write(&good, "a.example 2.5\n\nb.example\n").expect("write");
        let keys = read_keys(good.to_str().expect("utf-8")).expect("parsed");
        assert_eq!(
            keys,
            vec![
                ("a.example".to_string(), 2.5),
                ("b.example".to_string(), 1.0)
            ]
        );
        let bad = dir.path().join("bad.txt");
        std::fs::write(&bad, "a.example x\n").expect("write");
        let err = read_keys(bad.to_str().expect("utf-8")).expect_err("bad weight");
        assert!(format!("{err:#}").contains("bad.txt:1"), "{err:#}");
        assert!(read_keys("/nonexistent/keys").is_err());
    }
}
