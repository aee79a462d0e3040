//! strata's host copy (`strata::copy`) against `memcpy`, at sizes a shared-memory slot and a
//! schedule's local copies see, with the destination at the source's offset in its cache line
//! and 16 bytes further (a `malloc` buffer past a page header, a slot's data after a header).
//!
//! `cargo bench --bench copy`. On the AMD EPYC VMs of this project memcpy of 4 KiB to 512 KiB
//! runs at about 2 GB/s in the shifted case against 30-60 GB/s aligned; strata's copy should
//! hold 25 GB/s or more in both.

use criterion::{BenchmarkId, Criterion, Throughput, black_box, criterion_group, criterion_main};

fn copies(c: &mut Criterion) {
    let mut g = c.benchmark_group("copy");
    g.sample_size(20);
    // Page-aligned starts, then the chosen offsets.
    let src = vec![1u8; (1 << 20) + 8192];
    let mut dst = vec![0u8; (1 << 20) + 8192];
    let page = |p: usize| (4096 - p % 4096) % 4096;
    let (s0, d0) = (page(src.as_ptr() as usize), page(dst.as_ptr() as usize));
    for bytes in [8usize << 10, 128 << 10, 512 << 10] {
        g.throughput(Throughput::Bytes(bytes as u64));
        for shift in [0usize, 16] {
            let s = &src[s0..s0 + bytes];
            let d = d0 + shift;
            let label = format!("{}KiB/dst+{shift}", bytes >> 10);
            g.bench_function(BenchmarkId::new("memcpy", &label), |b| {
                b.iter(|| dst[d..d + bytes].copy_from_slice(black_box(s)))
            });
            g.bench_function(BenchmarkId::new("strata", &label), |b| {
                b.iter(|| strata::copy::copy(&mut dst[d..d + bytes], black_box(s)))
            });
        }
    }
    g.finish();
}

criterion_group!(benches, copies);
criterion_main!(benches);
