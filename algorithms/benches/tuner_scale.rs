//! The tuner's first call of a size class (8 B, 64 KiB and 64 MiB all-reduce), and fast
//! pricing of every all-reduce algorithm, on the repo's Meta-like fabric
//! (`examples/topology/meta-24k-h100.toml`) at 1,024 to 24,576 ranks.
//!
//! `cargo bench -p strata-algorithms --bench tuner_scale`. The first call of a size class that
//! no tuning-file rule covers is what a rank pays inside its first collective of that size, so
//! it must stay in milliseconds at any scale; `explain` (every algorithm, as `collbench
//! explain` and `--write-tuning` price them) is what the same question costs ahead of time.

use criterion::{BatchSize, BenchmarkId, Criterion, criterion_group, criterion_main};
use std::hint::black_box;
use strata_algorithms::Collective;
use strata_algorithms::hierarchy::Hierarchy;
use strata_algorithms::tuner::Tuner;
use strata_topology::fabric;

/// The first `np` devices of the Meta-like fabric.
fn meta(np: usize) -> (Hierarchy, strata_topology::fabric::TierCosts) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/topology/meta-24k-h100.toml");
    let fab = fabric::load_file(&path).expect("repo fabric file");
    let devices: Vec<usize> = (0..np).collect();
    let h = Hierarchy::on_fabric(&fab, &devices);
    (h, fab.tiers)
}

fn bench_tuner(c: &mut Criterion) {
    for (bytes, name) in [(8usize, "8B"), (64 << 10, "64KiB"), (64 << 20, "64MiB")] {
        let mut first = c.benchmark_group(format!("tuner_first_call/all_reduce/{name}"));
        first.sample_size(10);
        for np in [1024usize, 4096, 24576] {
            let (h, costs) = meta(np);
            first.bench_with_input(BenchmarkId::from_parameter(np), &np, |b, _| {
                b.iter_batched(
                    || Tuner::new(h.clone(), costs, true),
                    |t| black_box(t.choose(Collective::AllReduce, bytes)),
                    BatchSize::LargeInput,
                )
            });
        }
        first.finish();
    }
    let mut explain = c.benchmark_group("explain/all_reduce/64MiB");
    explain.sample_size(10);
    for np in [1024usize, 4096] {
        let (h, costs) = meta(np);
        let t = Tuner::new(h, costs, true);
        explain.bench_with_input(BenchmarkId::from_parameter(np), &np, |b, _| {
            b.iter(|| black_box(t.explain(Collective::AllReduce, 64 << 20)))
        });
    }
    explain.finish();
}

criterion_group!(benches, bench_tuner);
criterion_main!(benches);
