//! How long building one rank's schedule takes, at 8 to 16,384 ranks.
//!
//! `cargo bench -p strata-algorithms --bench plan`. The runtime builds a schedule once per
//! (collective, algorithm, count, root) and caches it, so this is a first-call cost.

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use std::hint::black_box;
use strata_algorithms::{Algorithm, Collective, Plan, plan};

fn bench_plans(c: &mut Criterion) {
    let cases = [
        (Collective::AllReduce, Algorithm::Ring),
        (Collective::AllReduce, Algorithm::Tree),
        (Collective::AllReduce, Algorithm::Rabenseifner),
        (Collective::AllReduce, Algorithm::RecursiveDoubling),
        (Collective::AllGather, Algorithm::Bruck),
        (Collective::AllToAll, Algorithm::Pairwise),
    ];
    for (collective, algorithm) in cases {
        let mut group = c.benchmark_group(format!("plan/{collective}/{algorithm}"));
        for nranks in [8usize, 64, 1024, 16384] {
            let p = Plan {
                collective,
                algorithm,
                nranks,
                rank: nranks / 2 + 1,
                count: 1 << 20,
                root: 0,
                chunk_elems: 1 << 17,
            };
            group.bench_with_input(BenchmarkId::from_parameter(nranks), &p, |b, p| {
                b.iter(|| plan(black_box(p)).unwrap())
            });
        }
        group.finish();
    }
}

criterion_group!(benches, bench_plans);
criterion_main!(benches);
