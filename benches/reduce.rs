//! Reduction kernels against memcpy, in one run.
//!
//! Throughput counts the bytes each kernel touches: memcpy reads one buffer and writes one
//! (2 × 64 MiB); `acc += incoming` reads two and writes one (3 × 64 MiB); `dst = a + b` the
//! same. Compare the GiB/s lines: the target is a reduction at ≥ 80% of memcpy's rate.

use criterion::{BenchmarkId, Criterion, Throughput, black_box, criterion_group, criterion_main};
use strata::DataType;
use strata::reduce::{Combine, reduce_in_place, reduce_into};

const BYTES: usize = 64 << 20;

fn kernels(c: &mut Criterion) {
    let mut g = c.benchmark_group("64MiB");
    g.sample_size(20);
    let src = vec![1u8; BYTES];
    let mut dst = vec![0u8; BYTES];
    let a: Vec<f32> = vec![1.0; BYTES / 4];
    let b: Vec<f32> = vec![2.0; BYTES / 4];
    let mut acc: Vec<f32> = vec![0.5; BYTES / 4];
    let mut out: Vec<f32> = vec![0.0; BYTES / 4];

    g.throughput(Throughput::Bytes(2 * BYTES as u64));
    g.bench_function("memcpy", |bn| {
        bn.iter(|| dst.copy_from_slice(black_box(&src)))
    });

    g.throughput(Throughput::Bytes(3 * BYTES as u64));
    g.bench_function(BenchmarkId::new("f32_sum", "in_place"), |bn| {
        bn.iter(|| {
            reduce_in_place(
                DataType::Float32,
                Combine::Sum,
                bytemuck::cast_slice_mut(&mut acc),
                black_box(bytemuck::cast_slice(&b)),
            )
        })
    });
    g.bench_function(BenchmarkId::new("f32_sum", "into"), |bn| {
        bn.iter(|| {
            reduce_into(
                DataType::Float32,
                Combine::Sum,
                bytemuck::cast_slice_mut(&mut out),
                bytemuck::cast_slice(&a),
                black_box(bytemuck::cast_slice(&b)),
            )
        })
    });
    let h: Vec<half::bf16> = vec![half::bf16::ONE; BYTES / 2];
    let mut hacc: Vec<half::bf16> = vec![half::bf16::ONE; BYTES / 2];
    g.bench_function(BenchmarkId::new("bf16_sum", "in_place"), |bn| {
        bn.iter(|| {
            reduce_in_place(
                DataType::Bfloat16,
                Combine::Sum,
                bytemuck::cast_slice_mut(&mut hacc),
                black_box(bytemuck::cast_slice(&h)),
            )
        })
    });
    let f: Vec<half::f16> = vec![half::f16::ONE; BYTES / 2];
    let mut facc: Vec<half::f16> = vec![half::f16::ONE; BYTES / 2];
    g.bench_function(BenchmarkId::new("f16_sum", "in_place"), |bn| {
        bn.iter(|| {
            reduce_in_place(
                DataType::Float16,
                Combine::Sum,
                bytemuck::cast_slice_mut(&mut facc),
                black_box(bytemuck::cast_slice(&f)),
            )
        })
    });
    g.finish();
}

criterion_group!(benches, kernels);
criterion_main!(benches);
