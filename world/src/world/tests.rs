//! The generator as a whole: sizes, ids, clusters, capacity, candidates, parameters.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};

use cdnmap_mapper::model::MAX_MAP_UNITS;
use cdnmap_mapper::{Candidate, ClusterState, Instance, ResourceKind, UnitIdx};
use ipnet::{IpNet, Ipv4Net};

use super::candidates::{prefix_key, rendezvous};
use super::prefixes::V4_RESERVED;
use super::*;

fn small(seed: u64) -> WorldParams {
    WorldParams {
        map_units: 3_000,
        clusters: 50,
        seed,
        ..WorldParams::default()
    }
}

fn gen(params: &WorldParams) -> Topology {
    generate(params, &|_| {}).expect("generate")
}

#[test]
fn deterministic() {
    let a = gen(&small(7));
    let b = gen(&small(7));
    assert_eq!(a, b);
    let c = gen(&small(8));
    assert_ne!(a, c);
}

#[test]
fn sizes() {
    for (units, clusters) in [(3_000, 50), (3_001, 50), (3_002, 300), (1, 1), (10, 240)] {
        let params = WorldParams {
            map_units: units,
            clusters,
            ..small(1)
        };
        let inst = gen(&params);
        assert_eq!(inst.unit_count(), units);
        assert_eq!(inst.clusters().len(), clusters);
        for u in 0..units as UnitIdx {
            let n = inst.candidate_count(u);
            assert!(
                (1..=params.candidates).contains(&n),
                "unit {u}: {n} candidates"
            );
            assert_eq!(inst.unit_prefixes(u).len(), 1);
            assert!(inst.unit_demand(u) >= 0.0 && inst.unit_demand(u).is_finite());
        }
    }
    // 3,001 units: the last prefix carries only the first class in name order.
    let inst = gen(&WorldParams {
        map_units: 3_001,
        ..small(1)
    });
    assert_eq!(inst.unit_id(3_000), "u00001000-apps");
    assert_eq!(inst.unit_id(2_999), "u00000999-web");
}

#[test]
fn cluster_ids_and_trees() {
    let inst = gen(&WorldParams {
        clusters: 300,
        ..small(3)
    });
    let ids: Vec<&str> = inst.clusters().iter().map(|c| c.id.as_str()).collect();
    assert!(
        ids.contains(&"sha-1") && ids.contains(&"sha-2"),
        "big metros get several"
    );
    assert!(ids.contains(&"mrs-1") && !ids.contains(&"mrs-2"));
    let mut addresses: Vec<IpAddr> = (0..inst.clusters().len() as u32)
        .flat_map(|c| inst.cluster_addresses(c).to_vec())
        .collect();
    let n = addresses.len();
    addresses.sort();
    addresses.dedup();
    assert_eq!(addresses.len(), n, "cluster addresses are unique");
    for c in inst.clusters() {
        assert_eq!(c.state, ClusterState::Up);
        assert_eq!(c.nodes.len(), 5);
        assert_eq!(
            (c.nodes[0].name.as_str(), c.nodes[0].kind),
            ("uplink", ResourceKind::Bps)
        );
        assert_eq!(
            (c.nodes[1].name.as_str(), c.nodes[1].kind),
            ("cpu", ResourceKind::Fps)
        );
        let cpu = c.nodes[1].capacity;
        let leaves: f64 = c.nodes[2..].iter().map(|n| n.capacity).sum();
        assert!(
            leaves > cpu,
            "{}: the leaves sum to more than the cpu: {:?}",
            c.id,
            c.nodes
        );
        assert!(c.nodes[2..]
            .iter()
            .all(|n| n.capacity <= cpu && n.capacity > 0.0));
        for k in 0..3 {
            assert!(c.serves(k));
        }
    }
}

#[test]
fn capacity_matches_headroom() {
    let params = small(4);
    let inst = gen(&params);
    let mut bps = 0.0;
    let mut fps = 0.0;
    for u in 0..inst.unit_count() as UnitIdx {
        let per = inst.classes()[usize::from(inst.unit_class(u))].per_unit;
        bps += inst.unit_demand(u) * per.bps;
        fps += inst.unit_demand(u) * per.fps;
    }
    let uplink: f64 = inst.clusters().iter().map(|c| c.nodes[0].capacity).sum();
    let cpu: f64 = inst.clusters().iter().map(|c| c.nodes[1].capacity).sum();
    assert!(
        (uplink / bps - params.headroom).abs() < 1e-9,
        "{}",
        uplink / bps
    );
    assert!((cpu / fps - params.headroom).abs() < 1e-9, "{}", cpu / fps);
}

/// Capacity against the demand whose first choice is each cluster, as a whole (uplink, cpu)
/// and at its tightest node (leaves too): it must vary, and some clusters must be
/// oversubscribed, so that the solver rejects and evicts.
#[test]
fn regional_capacity_varies() {
    let inst = gen(&WorldParams {
        map_units: 30_000,
        clusters: 240,
        ..small(5)
    });
    // Per cluster: Bps, Fps, and the Fps of each class (in class order) of its first choosers.
    let mut first = vec![[0.0f64; 5]; inst.clusters().len()];
    for u in 0..inst.unit_count() as UnitIdx {
        let k = usize::from(inst.unit_class(u));
        let per = inst.classes()[k].per_unit;
        let c = inst.candidate(u, 0).cluster as usize;
        first[c][0] += inst.unit_demand(u) * per.bps;
        first[c][1] += inst.unit_demand(u) * per.fps;
        first[c][2 + k] += inst.unit_demand(u) * per.fps;
    }
    let (mut whole, mut tightest) = (Vec::new(), Vec::new());
    for (c, d) in inst.clusters().iter().zip(&first) {
        if d[0] <= 0.0 {
            continue;
        }
        let w = (c.nodes[0].capacity / d[0]).min(c.nodes[1].capacity / d[1]);
        let leaves = (0..3).map(|k| {
            let leaf = c.nodes.iter().find(|n| n.classes == [k as u16]).unwrap();
            leaf.capacity / d[2 + k]
        });
        whole.push(w);
        tightest.push(leaves.fold(w, f64::min));
    }
    let count = |v: &[f64], f: fn(f64) -> bool| v.iter().filter(|&&r| f(r)).count();
    let short = count(&whole, |r| r < 0.9);
    let roomy = count(&whole, |r| r > 1.2);
    let pinched = count(&tightest, |r| r < 0.7);
    assert!(
        short >= 10 && roomy >= 10 && pinched >= 10,
        "short {short}, roomy {roomy}, a node pinched {pinched} of {}",
        whole.len()
    );
}

/// Brute force over all clusters: unit `u`'s eligible clusters (of each site, the first
/// `max_per_site` in its prefix's rendezvous order) as (score, cluster index), best first.
fn brute_force(inst: &Instance, params: &WorldParams, u: UnitIdx) -> Vec<(f64, u32)> {
    let p: usize = inst.unit_id(u)[1..9].parse().unwrap();
    brute_force_keyed(inst, params, u, p)
}

/// [`brute_force`] for the unit of the prefix at position `p` (what keys its rendezvous order).
fn brute_force_keyed(
    inst: &Instance,
    params: &WorldParams,
    u: UnitIdx,
    p: usize,
) -> Vec<(f64, u32)> {
    let key = prefix_key(params.seed, p);
    let (lat, lon) = inst.unit_location(u);
    let mut by_site: BTreeMap<&str, Vec<u32>> = BTreeMap::new();
    for (j, c) in inst.clusters().iter().enumerate() {
        let site = c.id.split('-').next().unwrap();
        by_site.entry(site).or_default().push(j as u32);
    }
    let mut all = Vec::new();
    for mut js in by_site.into_values() {
        js.sort_by_key(|&j| (rendezvous(key, j), j));
        for (i, &j) in js.iter().take(params.max_per_site).enumerate() {
            let c = &inst.clusters()[j as usize];
            let spread = SITE_SPREAD_MS * i as f64 / params.max_per_site as f64;
            all.push((rtt_ms(lat, lon, c.lat, c.lon) + spread, j));
        }
    }
    all.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    all
}

/// Checks unit `u`'s candidates against `all` (brute force's eligible clusters, best first):
/// the nearest within reach, at most `candidates`, equal unless a cluster sits within float
/// noise of another or of the limit, each scored as brute force scores it; or, with none
/// within reach, the single nearest. Says whether it was that fallback.
fn check_nearest_within_reach(
    inst: &Instance,
    params: &WorldParams,
    u: UnitIdx,
    all: &[(f64, u32)],
) -> bool {
    let got: Vec<Candidate> = inst.candidates(u).collect();
    // Scores are from the f64 location; the stored location is f32.
    for (i, cand) in got.iter().enumerate() {
        assert!(
            (f64::from(cand.score) - all[i].0).abs() < 1e-3,
            "unit {u} #{i}"
        );
    }
    let want: Vec<(f64, u32)> = all
        .iter()
        .take(params.candidates)
        .filter(|(r, _)| *r <= params.max_rtt_ms - 1e-3)
        .copied()
        .collect();
    if want.is_empty() {
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].cluster, all[0].1, "unit {u}: fallback is the best");
        return true;
    }
    assert!(got.len() >= want.len(), "unit {u}");
    for (i, &(score, j)) in want.iter().enumerate() {
        let tie = |k: usize| want.get(k).is_some_and(|w| (w.0 - score).abs() < 1e-3);
        assert!(
            got[i].cluster == j || tie(i + 1) || (i > 0 && tie(i - 1)),
            "unit {u} #{i}"
        );
    }
    false
}

#[test]
fn candidates_are_the_nearest_within_reach() {
    // 600 clusters: big sites have several, so the per-site limit binds.
    let params = WorldParams {
        clusters: 600,
        max_rtt_ms: 10.0,
        candidates: 8,
        max_per_site: 2,
        ..small(6)
    };
    let inst = gen(&params);
    let site = |j: u32| {
        let id = &inst.clusters()[j as usize].id;
        id[..id.find('-').unwrap()].to_string()
    };
    let mut sizes: BTreeMap<String, usize> = BTreeMap::new();
    for j in 0..inst.clusters().len() as u32 {
        *sizes.entry(site(j)).or_default() += 1;
    }
    let (mut fallbacks, mut limited) = (0, 0);
    for u in (0..inst.unit_count() as UnitIdx).step_by(7) {
        let all = brute_force(&inst, &params, u);
        if check_nearest_within_reach(&inst, &params, u, &all) {
            fallbacks += 1;
            continue;
        }
        let got: Vec<Candidate> = inst.candidates(u).collect();
        let mut per_site: BTreeMap<String, usize> = BTreeMap::new();
        for cand in &got {
            *per_site.entry(site(cand.cluster)).or_default() += 1;
        }
        assert!(per_site.values().all(|&n| n <= params.max_per_site));
        // Limited: without the limit, more clusters of a site would precede the last one.
        let last = site(got[got.len() - 1].cluster);
        if per_site
            .iter()
            .any(|(s, &n)| n == params.max_per_site && sizes[s] > n && *s != last)
        {
            limited += 1;
        }
        for cand in &got {
            assert!(f64::from(cand.score) <= params.max_rtt_ms);
        }
    }
    assert!(fallbacks > 0, "10 ms leaves some units out of reach");
    assert!(limited > 0, "the per-site limit binds");
}

/// Candidate lists span several sites, and a big site's clusters share its load.
#[test]
fn lists_span_sites_and_big_sites_spread() {
    let params = WorldParams {
        map_units: 60_000,
        clusters: 1_000,
        ..small(12)
    };
    let inst = gen(&params);
    let site = |j: u32| {
        let id = &inst.clusters()[j as usize].id;
        id[..id.find('-').unwrap()].to_string()
    };
    let mut first_at_sha: BTreeMap<u32, usize> = BTreeMap::new();
    let mut sites_in_lists = 0;
    for u in 0..inst.unit_count() as UnitIdx {
        let mut sites: Vec<String> = inst.candidates(u).map(|c| site(c.cluster)).collect();
        let n = sites.len();
        sites.sort();
        sites.dedup();
        assert!(
            sites.len() * params.max_per_site >= n,
            "unit {u}: {n} candidates at {} sites",
            sites.len()
        );
        sites_in_lists += sites.len();
        let first = inst.candidate(u, 0).cluster;
        if site(first) == "sha" {
            *first_at_sha.entry(first).or_default() += 1;
        }
    }
    let mean_sites = sites_in_lists as f64 / inst.unit_count() as f64;
    assert!(mean_sites >= 4.0, "{mean_sites} sites per list");
    let sha = inst
        .clusters()
        .iter()
        .filter(|c| c.id.starts_with("sha-"))
        .count();
    assert!(sha >= 20, "{sha} clusters at Shanghai");
    assert_eq!(
        first_at_sha.len(),
        sha,
        "every Shanghai cluster is someone's first choice"
    );
}

#[test]
fn scores_within_limit_except_fallback() {
    let params = small(9);
    let inst = gen(&params);
    for u in 0..inst.unit_count() as UnitIdx {
        let n = inst.candidate_count(u);
        for cand in inst.candidates(u) {
            assert!(
                f64::from(cand.score) <= params.max_rtt_ms || n == 1,
                "unit {u}: score {}",
                cand.score
            );
        }
    }
}

#[test]
fn ids_unique_sorted_and_prefixes() {
    let inst = gen(&WorldParams {
        map_units: 6_000,
        ..small(2)
    });
    let ids: Vec<&str> = (0..inst.unit_count() as UnitIdx)
        .map(|u| inst.unit_id(u))
        .collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]));
    assert_eq!(ids[0], "u00000000-apps");
    let mut prefixes: Vec<IpNet> = (0..inst.unit_count() as UnitIdx)
        .step_by(3)
        .map(|u| inst.unit_prefixes(u)[0])
        .collect();
    let v6 = prefixes
        .iter()
        .filter(|p| matches!(p, IpNet::V6(_)))
        .count();
    assert!((120..=280).contains(&v6), "{v6} IPv6 prefixes of 2,000");
    let first_v4 = prefixes.iter().find(|p| matches!(p, IpNet::V4(_))).unwrap();
    assert_eq!(first_v4.to_string(), "1.0.0.0/24");
    let space: IpNet = "2a00::/12".parse().unwrap();
    for p in &prefixes {
        match p {
            IpNet::V4(n) => {
                assert_eq!(n.prefix_len(), 24);
                for (net, len) in V4_RESERVED {
                    let r = Ipv4Net::new(Ipv4Addr::from(net), len).unwrap();
                    assert!(!r.contains(n), "{n} in {r}");
                }
            }
            IpNet::V6(n) => {
                assert_eq!(n.prefix_len(), 48);
                assert!(space.contains(p));
            }
        }
    }
    let n = prefixes.len();
    prefixes.sort();
    prefixes.dedup();
    assert_eq!(prefixes.len(), n, "prefixes are unique");
    // Map units of one prefix share its prefix and location.
    assert_eq!(inst.unit_prefixes(0), inst.unit_prefixes(2));
    assert_eq!(inst.unit_location(0), inst.unit_location(2));
}

#[test]
fn bad_params() {
    let ok = small(1);
    let cases: [(WorldParams, &str); 11] = [
        (WorldParams { map_units: 0, ..ok }, "map_units"),
        (
            WorldParams {
                map_units: MAX_MAP_UNITS + 1,
                ..ok
            },
            "map_units",
        ),
        (WorldParams { clusters: 0, ..ok }, "clusters"),
        (
            WorldParams {
                clusters: MAX_WORLD_CLUSTERS + 1,
                ..ok
            },
            "clusters",
        ),
        (
            WorldParams {
                candidates: 0,
                ..ok
            },
            "candidates",
        ),
        (
            WorldParams {
                candidates: 256,
                ..ok
            },
            "candidates",
        ),
        (
            WorldParams {
                max_per_site: 0,
                ..ok
            },
            "max_per_site",
        ),
        (
            WorldParams {
                max_rtt_ms: 0.0,
                ..ok
            },
            "max_rtt_ms",
        ),
        (
            WorldParams {
                max_rtt_ms: f64::INFINITY,
                ..ok
            },
            "max_rtt_ms",
        ),
        (
            WorldParams {
                headroom: 0.0,
                ..ok
            },
            "headroom",
        ),
        (
            WorldParams {
                headroom: f64::NAN,
                ..ok
            },
            "headroom",
        ),
    ];
    for (params, name) in cases {
        let err = generate(&params, &|_| {}).unwrap_err().to_string();
        assert!(err.starts_with(name), "{name}: {err}");
    }
}

#[test]
fn progress_reports() {
    let seen = std::cell::Cell::new(0);
    let inst = generate(&small(1), &|n| seen.set(n)).unwrap();
    assert_eq!(seen.get(), inst.unit_count());
}

/// `cargo test -p cdnmap-world --release -- --ignored --nocapture world_1m`
#[test]
#[ignore]
fn world_1m_timing() {
    let params = WorldParams {
        map_units: 1_000_000,
        clusters: 1_000,
        ..WorldParams::default()
    };
    let t = std::time::Instant::now();
    let inst = gen(&params);
    let elapsed = t.elapsed();
    let units = inst.unit_count();
    println!(
        "{units} units x {} clusters: {:.2?}, {} candidates ({:.2}/unit), heap {} B/unit",
        inst.clusters().len(),
        elapsed,
        inst.total_candidates(),
        inst.total_candidates() as f64 / units as f64,
        inst.heap_bytes() / units
    );
    let t = std::time::Instant::now();
    let p = perturb(&inst, 5.0, 1).unwrap();
    println!("perturb: {:.2?}", t.elapsed());
    assert_eq!(p.unit_count(), units);
}

/// A world from a MaxMind DB: a generated world's networks written as a database, read back
/// and made a world have one map unit per network and class of the mix, at the network's
/// location, with the class's share as demand and as candidates the nearest clusters within
/// reach that brute force finds from there.
#[test]
fn a_world_from_a_maxmind_db_has_a_unit_per_network_and_class_where_the_database_puts_it() {
    let params = WorldParams {
        clusters: 400,
        max_rtt_ms: 10.0,
        candidates: 6,
        max_per_site: 2,
        ..small(9)
    };
    let generated = gen(&params);
    let nets = located_networks(&generated);
    assert_eq!(nets.len(), params.map_units / 3);
    let bytes = crate::mmdb::write(&nets, "GeoLite2-City", 1).expect("written");
    let mut read = Vec::new();
    let skipped = crate::mmdb::read(bytes, "world.mmdb", 48, usize::MAX, &mut read).expect("read");
    assert_eq!(skipped, crate::mmdb::Skipped::default());
    assert_eq!(
        read, nets,
        "/24s and /48s come back as written, in address order"
    );
    let mix: ClassMix = "web=0.5,video=0.35".parse().expect("a mix");
    let world =
        from_located(&read, &sites().expect("sites"), &mix, &params, &|_| {}).expect("a world");
    let inst = &world.instance;
    assert_eq!(inst.unit_count(), 2 * read.len());
    assert_eq!(inst.clusters().len(), params.clusters);
    let (mut checked, mut fallbacks) = (0, 0);
    for (p, l) in read.iter().enumerate().step_by(3) {
        for (class, share) in [("web", 0.5), ("video", 0.35)] {
            let u = inst
                .unit_index(&format!("{}-{class}", l.net))
                .expect("a unit per network and class");
            assert_eq!(world.unit_prefixes(u), [l.net]);
            assert_eq!(inst.classes()[usize::from(inst.unit_class(u))].name, class);
            assert!((inst.unit_demand(u) - share).abs() < 1e-6);
            let (lat, lon) = inst.unit_location(u);
            assert!((lat - l.lat).abs() < 1e-4 && (lon - l.lon).abs() < 1e-4);
            let all = brute_force_keyed(inst, &params, u, p);
            if check_nearest_within_reach(inst, &params, u, &all) {
                fallbacks += 1;
                continue;
            }
            checked += 1;
        }
    }
    assert!(
        checked > 500 && fallbacks > 0,
        "{checked} checked, {fallbacks} fallbacks"
    );
}

/// The class mix names the world's classes with positive shares, each once.
#[test]
fn a_class_mix_is_refused_naming_what_is_wrong() {
    assert_eq!(
        "video=2,web=1".parse::<ClassMix>().expect("a mix"),
        "video=2, web=1".parse::<ClassMix>().expect("spaces")
    );
    for (bad, names) in [
        ("web", "CLASS=SHARE"),
        ("web=1,web=2", "twice"),
        ("web=-1", "> 0"),
        ("web=NaN", "> 0"),
        ("web=x", "not a number"),
    ] {
        let e = bad.parse::<ClassMix>().expect_err(bad).to_string();
        assert!(e.contains(names), "{bad}: {e}");
    }
    let mail: ClassMix = "web=0.5,mail=1".parse().expect("a mix");
    let e = mail
        .classes_in(&["apps", "video", "web"])
        .expect_err("mail");
    assert!(e.to_string().contains("\"mail\""), "{e}");
    let order = "web=1,apps=2".parse::<ClassMix>().expect("a mix");
    assert_eq!(
        order.classes_in(&["web", "video", "apps"]).expect("known"),
        vec![(2, 2.0), (0, 1.0)],
        "in name order"
    );
}
