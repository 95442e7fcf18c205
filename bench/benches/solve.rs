//! Criterion benchmark of a cold solve of a generated world, beside the trivial pass that only
//! sums each map unit's demand into its first candidate (the baseline the solve is compared
//! with). `cargo bench -p cdnmap-bench`; `cdnmap bench solve` is the large-scale version.

use std::hint::black_box;

use cdnmap_bench::solve::trivial_pass;
use cdnmap_mapper::{solve, SolveOptions};
use cdnmap_world::world::{generate, WorldParams};
use criterion::{criterion_group, criterion_main, Criterion};

fn bench_solve(c: &mut Criterion) {
    let params = WorldParams {
        map_units: 100_000,
        clusters: 300,
        seed: 1,
        ..WorldParams::default()
    };
    let inst = match generate(&params, &|_| {}) {
        Ok(inst) => inst,
        Err(e) => panic!("generating the benchmark world: {e:#}"),
    };
    let mut group = c.benchmark_group("solve_100k_units_300_clusters");
    group.sample_size(10);
    group.bench_function("trivial_pass", |b| {
        b.iter(|| trivial_pass(black_box(&inst)))
    });
    group.bench_function("cold_solve", |b| {
        b.iter(|| solve(black_box(&inst), &SolveOptions::default()))
    });
    group.finish();
}

criterion_group!(benches, bench_solve);
criterion_main!(benches);
