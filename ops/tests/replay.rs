//! Replay's closed loop: with true coefficients 30% above the configured ones, capacity
//! violations stop after a bounded warm-up when the estimator learns, and go on when it does
//! not; the report shows it.

use std::collections::BTreeMap;

use cdnmap_mapper::{Instance, PerUnit, UnitIdx};
use cdnmap_ops::replay::{replay, replay_with, write_report, Row, Setting};
use cdnmap_world::trace::{Header, Record};
use cdnmap_world::world::{generate, WorldParams};

fn world() -> cdnmap_topology::Topology {
    let params = WorldParams {
        map_units: 3_000,
        clusters: 40,
        seed: 5,
        headroom: 1.2,
        ..WorldParams::default()
    };
    generate(&params, &|_| {}).expect("world")
}

/// Every unit's demand, every round, steady; true costs 30% above the configured ones.
fn trace(inst: &Instance, rounds: usize) -> (Header, Vec<Record>) {
    let header = Header {
        round_ms: 10_000,
        start_ms: 0,
        true_per_unit: inst
            .classes()
            .iter()
            .map(|c| {
                (
                    c.name.clone(),
                    PerUnit {
                        bps: 1.3 * c.per_unit.bps,
                        fps: 1.3 * c.per_unit.fps,
                    },
                )
            })
            .collect::<BTreeMap<_, _>>(),
    };
    let records = (0..rounds)
        .flat_map(|r| {
            (0..inst.unit_count() as UnitIdx).map(move |u| Record::Unit {
                t: r as i64 * 10_000,
                map_unit: inst.unit_id(u).to_string(),
                demand: inst.unit_demand(u),
            })
        })
        .collect();
    (header, records)
}

fn violations_after(rows: &[Row], warmup: usize) -> usize {
    rows.iter().skip(warmup).map(|r| r.violations).sum()
}

#[test]
fn learning_stops_capacity_violations_after_a_warm_up() {
    let inst = world();
    let (header, records) = trace(&inst, 120);
    let learning =
        replay(&inst, &header, &records, &Setting::default(), &|_, _| {}).expect("replay");
    let blind = Setting {
        name: "no-learning".into(),
        learning: false,
        ..Setting::default()
    };
    let without = replay(&inst, &header, &records, &blind, &|_, _| {}).expect("replay");
    let warmup = 60;
    let early: usize = learning.iter().take(5).map(|r| r.violations).sum();
    eprintln!(
        "violations: learning {} in the first 5 rounds, {} after round {warmup}; without learning {} after",
        early,
        violations_after(&learning, warmup),
        violations_after(&without, warmup)
    );
    assert!(
        early > 0,
        "the configured coefficients must under-estimate at first"
    );
    assert_eq!(
        violations_after(&learning, warmup),
        0,
        "violations after the warm-up"
    );
    assert!(
        violations_after(&without, warmup) > 0,
        "without learning they go on"
    );
    assert!(learning.iter().skip(warmup).all(|r| r.learned_confident));

    // The report shows it.
    let dir = tempfile::tempdir().expect("tempdir");
    write_report(
        dir.path(),
        &[(Setting::default(), learning), (blind, without)],
        warmup,
    )
    .expect("report");
    let md = std::fs::read_to_string(dir.path().join("report.md")).expect("report.md");
    let line = md
        .lines()
        .find(|l| l.starts_with("| default |"))
        .expect("a row");
    let cells: Vec<&str> = line.split('|').map(str::trim).collect();
    assert_eq!(
        cells[10], "0",
        "violations after the warm-up, in the report: {line}"
    );
    for f in [
        "rounds.csv",
        "churn.svg",
        "violations.svg",
        "utilization.svg",
    ] {
        let meta = std::fs::metadata(dir.path().join(f)).expect(f);
        assert!(meta.len() > 100, "{f} is empty");
    }
}

#[test]
fn replay_refuses_records_it_cannot_place() {
    let inst = world();
    let (header, mut records) = trace(&inst, 2);
    records.push(Record::Unit {
        t: 20_000,
        map_unit: "no-such-unit".into(),
        demand: 1.0,
    });
    let err = replay(&inst, &header, &records, &Setting::default(), &|_, _| {})
        .expect_err("unknown unit");
    assert!(format!("{err:#}").contains("no-such-unit"));
}

/// Replay and the service's loop are one code path: the same trace's observations, fed to a
/// running mapper through its Feedback handlers between rounds on the same simulated clock,
/// give the same map every round (forecasts, learned coefficients and deratings included: the
/// true costs are 30% above the configured ones, so both learn and derate).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_and_the_service_loop_make_the_same_maps() {
    use cdnmap_api::feedback::FeedbackService;
    use cdnmap_api::service::Shared;
    use cdnmap_proto::v1 as pb;
    use pb::feedback_server::Feedback;

    let inst = generate(
        &WorldParams {
            map_units: 600,
            clusters: 16,
            seed: 9,
            headroom: 1.1,
            ..WorldParams::default()
        },
        &|_| {},
    )
    .expect("world");
    let (header, mut records) = trace(&inst, 14);
    // Demand that moves, so forecasts matter.
    for (i, r) in records.iter_mut().enumerate() {
        if let Record::Unit { demand, .. } = r {
            *demand *= 1.0 + 0.3 * ((i % 97) as f64 / 97.0 - 0.5);
        }
    }
    let mut replayed = Vec::new();
    let rows = replay_with(
        &inst,
        &header,
        &records,
        &Setting::default(),
        &|_, _| {},
        &mut |s, o| replayed.push((s.map.clone(), o.clone())),
    )
    .expect("replay");
    assert!(rows
        .iter()
        .any(|r| r.derated_clusters > 0 || r.learned_confident));

    let dir = tempfile::tempdir().expect("tempdir");
    let config = cdnmap_api::Config {
        data_dir: dir.path().join("data"),
        ..cdnmap_api::Config::default()
    };
    let shared = Shared::start(config, || Ok(inst.clone())).expect("start");
    let feedback = FeedbackService(std::sync::Arc::clone(&shared));
    for (r, (map, _)) in replayed.iter().enumerate() {
        if r > 0 {
            let before = &replayed[r - 1].1;
            // In unit order, which is id order.
            let units = before
                .demand
                .units()
                .expect("the replay's demand names its units");
            let samples = (0..units.unit_count() as u32)
                .filter_map(|u| Some((units.unit_id(u), before.demand.get(u)?)))
                .map(|(u, q)| pb::DemandSample {
                    target: Some(pb::demand_sample::Target::MapUnit(u.to_string())),
                    traffic_class: String::new(),
                    queries: q,
                })
                .collect();
            feedback
                .report_demand(tonic::Request::new(pb::DemandReport {
                    reporter: "replay".into(),
                    // One cycle's counts, over one cycle (a sample's claim is bounded per
                    // cycle: `cdnmap_engine::budget`).
                    period_start_unix_ms: 0,
                    period_end_unix_ms: 10_000,
                    samples,
                }))
                .await
                .expect("ReportDemand");
            let loads = before
                .loads
                .iter()
                .map(|(c, n, l)| pb::NodeLoad {
                    cluster: c.clone(),
                    node: n.clone(),
                    load: *l,
                })
                .collect();
            feedback
                .report_load(tonic::Request::new(pb::LoadReport {
                    reporter: "replay".into(),
                    measured_at_unix_ms: 0,
                    loads,
                    servers: Vec::new(),
                }))
                .await
                .expect("ReportLoad");
        }
        shared
            .run_round_at(header.start_ms + r as i64 * header.round_ms)
            .await;
        let served = shared.current().expect("a map");
        assert!(
            served.map == *map,
            "round {r}: the service's map differs from replay's"
        );
    }
    assert_eq!(replayed.len(), 14);
}

/// `beyond_lists=on` (the service's `[second_chance]`): the rounds place what the stable pass
/// leaves in overflow at clusters beyond the units' lists: over the replay, less overflow than
/// the same replay without it.
#[test]
fn beyond_the_lists_takes_overflow_the_rounds_leave() {
    let inst = world();
    let (header, records) = trace(&inst, 40);
    let off = replay(&inst, &header, &records, &Setting::default(), &|_, _| {}).expect("replay");
    let beyond = Setting::parse("beyond:beyond_lists=on").expect("a setting");
    assert!(beyond.beyond_lists);
    let on = replay(&inst, &header, &records, &beyond, &|_, _| {}).expect("replay");
    assert_eq!(off.len(), on.len());
    let total =
        |rows: &[cdnmap_ops::replay::Row]| rows.iter().map(|r| r.overflow_share).sum::<f64>();
    assert!(
        total(&off) > 0.0,
        "the replay's world must overflow for this test to say anything"
    );
    assert!(
        total(&on) < total(&off),
        "with {} against {} without",
        total(&on),
        total(&off)
    );
    assert!(Setting::parse("x:beyond_lists=maybe").is_err());
}
