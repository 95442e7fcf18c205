//! Replay's closed loop: with true coefficients 30% above the configured ones, capacity
//! violations stop after a bounded warm-up when the estimator learns, and go on when it does
//! not; the report shows it.

use std::collections::BTreeMap;

use cdnmap_mapper::{Instance, PerUnit, UnitIdx};
use cdnmap_ops::replay::{replay, write_report, Row, Setting};
use cdnmap_ops::trace::{Header, Record};
use cdnmap_ops::world::{generate, WorldParams};

fn world() -> Instance {
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
