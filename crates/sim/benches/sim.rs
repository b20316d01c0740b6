//! How fast the simulator runs: one `occ` run at 100 clients per strategy, and one
//! `capacity` run at 100 workers.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use redrive_sim::{CapacityConfig, Model, OccConfig, Strategy, run_once};

fn occ(c: &mut Criterion) {
    let model = Model::Occ(OccConfig::default());
    let mut g = c.benchmark_group("occ_100_clients");
    for s in Strategy::occ_defaults() {
        g.bench_function(s.to_string(), |b| {
            b.iter(|| run_once(&model, &s, 100, black_box(7)).unwrap())
        });
    }
    g.finish();
}

fn capacity(c: &mut Criterion) {
    let model = Model::Capacity(CapacityConfig::default());
    let mut g = c.benchmark_group("capacity_100_workers");
    for s in Strategy::capacity_defaults() {
        g.bench_function(s.to_string(), |b| {
            b.iter(|| run_once(&model, &s, 100, black_box(7)).unwrap())
        });
    }
    g.finish();
}

criterion_group!(benches, occ, capacity);
criterion_main!(benches);
