//! Reduction kernels over raw element bytes.
//!
//! Integer and `f32`/`f64` kernels are plain loops over slices that the compiler turns into
//! SIMD. `f16`, `bf16` and fp8 are widened to `f32` in blocks, combined there, and rounded once
//! per call (that is, once per step of a schedule); on CPUs with AVX2 (and F16C for `f16`),
//! `f16` and `bf16` do the same in one pass with explicit SIMD (`simd16`), bit for bit. Misaligned byte slices take a slower path
//! through aligned blocks, so callers never need to care about alignment.

use crate::dtype::{DataType, E4M3_ID, E5M2_ID, F8E4M3, F8E5M2, Scalar, fp8_table};
use crate::dtype::{E4M3, E5M2};
use bytemuck::Pod;
use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

mod simd16;

/// The combining step of a reduction; `Avg` and `PreMulSum` reduce with `Sum`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Combine {
    /// a + b
    Sum,
    /// a * b
    Prod,
    /// min(a, b)
    Min,
    /// max(a, b)
    Max,
}

/// The combining step of `op`: avg and PreMulSum combine by summing (avg then divides,
/// PreMulSum first scales).
pub(crate) fn combine_of(op: crate::dtype::ReduceOp) -> Combine {
    use crate::dtype::ReduceOp;
    match op {
        ReduceOp::Prod => Combine::Prod,
        ReduceOp::Min => Combine::Min,
        ReduceOp::Max => Combine::Max,
        ReduceOp::Sum | ReduceOp::Avg | ReduceOp::PreMulSum(_) => Combine::Sum,
    }
}

const BLOCK: usize = 512;

trait Arith: Pod {
    fn add(a: Self, b: Self) -> Self;
    fn mul(a: Self, b: Self) -> Self;
    fn min(a: Self, b: Self) -> Self;
    fn max(a: Self, b: Self) -> Self;
    fn div_n(a: Self, n: usize) -> Self;
}

macro_rules! int_arith {
    ($($t:ty),*) => {$(impl Arith for $t {
        #[inline(always)] fn add(a: Self, b: Self) -> Self { a.wrapping_add(b) }
        #[inline(always)] fn mul(a: Self, b: Self) -> Self { a.wrapping_mul(b) }
        #[inline(always)] fn min(a: Self, b: Self) -> Self { Ord::min(a, b) }
        #[inline(always)] fn max(a: Self, b: Self) -> Self { Ord::max(a, b) }
        #[inline(always)] fn div_n(a: Self, n: usize) -> Self { (a as i128 / n as i128) as Self }
    })*};
}
int_arith!(i8, u8, i32, u32, i64, u64);

macro_rules! float_arith {
    ($($t:ty),*) => {$(impl Arith for $t {
        #[inline(always)] fn add(a: Self, b: Self) -> Self { a + b }
        #[inline(always)] fn mul(a: Self, b: Self) -> Self { a * b }
        #[inline(always)] fn min(a: Self, b: Self) -> Self { if b < a { b } else { a } }
        #[inline(always)] fn max(a: Self, b: Self) -> Self { if b > a { b } else { a } }
        #[inline(always)] fn div_n(a: Self, n: usize) -> Self { a / n as Self }
    })*};
}
float_arith!(f32, f64);

#[inline(always)]
fn combine_into<T: Arith>(op: Combine, dst: &mut [T], a: &[T], b: &[T]) {
    let n = dst.len();
    let (a, b) = (&a[..n], &b[..n]);
    match op {
        Combine::Sum => dst
            .iter_mut()
            .zip(a.iter().zip(b))
            .for_each(|(d, (x, y))| *d = T::add(*x, *y)),
        Combine::Prod => dst
            .iter_mut()
            .zip(a.iter().zip(b))
            .for_each(|(d, (x, y))| *d = T::mul(*x, *y)),
        Combine::Min => dst
            .iter_mut()
            .zip(a.iter().zip(b))
            .for_each(|(d, (x, y))| *d = T::min(*x, *y)),
        Combine::Max => dst
            .iter_mut()
            .zip(a.iter().zip(b))
            .for_each(|(d, (x, y))| *d = T::max(*x, *y)),
    }
}

#[inline(always)]
fn combine_acc<T: Arith>(op: Combine, acc: &mut [T], b: &[T]) {
    let b = &b[..acc.len()];
    match op {
        Combine::Sum => acc.iter_mut().zip(b).for_each(|(d, y)| *d = T::add(*d, *y)),
        Combine::Prod => acc.iter_mut().zip(b).for_each(|(d, y)| *d = T::mul(*d, *y)),
        Combine::Min => acc.iter_mut().zip(b).for_each(|(d, y)| *d = T::min(*d, *y)),
        Combine::Max => acc.iter_mut().zip(b).for_each(|(d, y)| *d = T::max(*d, *y)),
    }
}

/// Widening conversions for the narrow float types.
trait Narrow: Pod {
    fn widen(src: &[Self], dst: &mut [f32]);
    fn narrow(src: &[f32], dst: &mut [Self]);
}

impl Narrow for f16 {
    fn widen(src: &[Self], dst: &mut [f32]) {
        src.convert_to_f32_slice(dst)
    }
    fn narrow(src: &[f32], dst: &mut [Self]) {
        dst.convert_from_f32_slice(src)
    }
}

impl Narrow for bf16 {
    fn widen(src: &[Self], dst: &mut [f32]) {
        // bf16 is the top half of an f32.
        dst.iter_mut()
            .zip(src)
            .for_each(|(d, s)| *d = f32::from_bits((s.to_bits() as u32) << 16));
    }
    fn narrow(src: &[f32], dst: &mut [Self]) {
        // Round to nearest even; NaN stays NaN (quietened). Branch-free so it vectorises.
        dst.iter_mut().zip(src).for_each(|(d, s)| {
            let b = s.to_bits();
            let rounded = b.wrapping_add(0x7FFF + ((b >> 16) & 1)) >> 16;
            let nan = (b & 0x7FFF_FFFF) > 0x7F80_0000;
            *d = bf16::from_bits(if nan {
                ((b >> 16) | 0x40) as u16
            } else {
                rounded as u16
            });
        });
    }
}

impl Narrow for F8E4M3 {
    fn widen(src: &[Self], dst: &mut [f32]) {
        let t = fp8_table(E4M3_ID);
        dst.iter_mut()
            .zip(src)
            .for_each(|(d, s)| *d = t[s.0 as usize]);
    }
    fn narrow(src: &[f32], dst: &mut [Self]) {
        dst.iter_mut()
            .zip(src)
            .for_each(|(d, s)| *d = F8E4M3(E4M3.encode(*s)));
    }
}

impl Narrow for F8E5M2 {
    fn widen(src: &[Self], dst: &mut [f32]) {
        let t = fp8_table(E5M2_ID);
        dst.iter_mut()
            .zip(src)
            .for_each(|(d, s)| *d = t[s.0 as usize]);
    }
    fn narrow(src: &[f32], dst: &mut [Self]) {
        dst.iter_mut()
            .zip(src)
            .for_each(|(d, s)| *d = F8E5M2(E5M2.encode(*s)));
    }
}

/// dst = op(a, b) through f32, one block at a time; `a` may be `None` meaning "dst itself".
fn narrow_combine<T: Narrow>(op: Combine, dst: &mut [T], a: Option<&[T]>, b: &[T]) {
    let mut fa = [0f32; BLOCK];
    let mut fb = [0f32; BLOCK];
    let mut start = 0;
    while start < dst.len() {
        let len = BLOCK.min(dst.len() - start);
        let r = start..start + len;
        match a {
            Some(a) => T::widen(&a[r.clone()], &mut fa[..len]),
            None => T::widen(&dst[r.clone()], &mut fa[..len]),
        }
        T::widen(&b[r.clone()], &mut fb[..len]);
        combine_acc(op, &mut fa[..len], &fb[..len]);
        T::narrow(&fa[..len], &mut dst[r]);
        start += len;
    }
}

/// Reinterprets bytes as elements, or returns `None` when misaligned.
fn cast<T: Pod>(b: &[u8]) -> Option<&[T]> {
    bytemuck::try_cast_slice(b).ok()
}
fn cast_mut<T: Pod>(b: &mut [u8]) -> Option<&mut [T]> {
    bytemuck::try_cast_slice_mut(b).ok()
}

/// Runs `f` — a kernel over typed views `(dst, optional second operand, incoming)` — on the
/// three byte slices, copying through aligned blocks when any is misaligned for `T`. Each
/// slice is cast once, and `f` is called directly: small reductions are mostly this overhead.
fn typed3<T: Pod>(
    dst: &mut [u8],
    a: Option<&[u8]>,
    b: &[u8],
    mut f: impl FnMut(&mut [T], Option<&[T]>, &[T]),
) {
    let ta = match a {
        None => Some(None),
        Some(a) => cast::<T>(a).map(Some),
    };
    if let (Some(tb), Some(ta)) = (cast::<T>(b), ta)
        && let Some(td) = cast_mut::<T>(dst)
    {
        f(td, ta, tb);
        return;
    }
    let size = std::mem::size_of::<T>();
    let mut bd = [T::zeroed(); BLOCK];
    let mut ba = [T::zeroed(); BLOCK];
    let mut bb = [T::zeroed(); BLOCK];
    let n = dst.len() / size;
    let mut start = 0;
    while start < n {
        let len = BLOCK.min(n - start);
        let r = start * size..(start + len) * size;
        bytemuck::cast_slice_mut(&mut bd[..len]).copy_from_slice(&dst[r.clone()]);
        bytemuck::cast_slice_mut(&mut bb[..len]).copy_from_slice(&b[r.clone()]);
        if let Some(a) = a {
            bytemuck::cast_slice_mut(&mut ba[..len]).copy_from_slice(&a[r.clone()]);
        }
        f(&mut bd[..len], a.map(|_| &ba[..len]), &bb[..len]);
        dst[r].copy_from_slice(bytemuck::cast_slice(&bd[..len]));
        start += len;
    }
}

fn dispatch_arith<T: Arith>(op: Combine, dst: &mut [u8], a: Option<&[u8]>, b: &[u8]) {
    typed3::<T>(dst, a, b, |d, a, b| match a {
        Some(a) => combine_into(op, d, a, b),
        None => combine_acc(op, d, b),
    });
}

fn dispatch_narrow<T: Narrow>(op: Combine, dst: &mut [u8], a: Option<&[u8]>, b: &[u8]) {
    typed3::<T>(dst, a, b, |d, a, b| narrow_combine(op, d, a, b));
}

/// A `simd16` kernel: `dst = op(a, b)` over a leading part, returning how many it did.
type HalfKernel<T> = fn(Combine, &mut [T], Option<&[T]>, &[T]) -> usize;

/// `f16` or `bf16`: the SIMD kernel where the CPU has it, the block path for what is left.
fn dispatch_half<T: Narrow>(
    op: Combine,
    dst: &mut [u8],
    a: Option<&[u8]>,
    b: &[u8],
    simd: HalfKernel<T>,
) {
    typed3::<T>(dst, a, b, |d, a, b| {
        let done = simd(op, d, a, b);
        if done < d.len() {
            narrow_combine(op, &mut d[done..], a.map(|a| &a[done..]), &b[done..]);
        }
    });
}

fn combine_bytes(dtype: DataType, op: Combine, dst: &mut [u8], a: Option<&[u8]>, b: &[u8]) {
    // Whole elements only; every element size is a power of two.
    let len = dst.len() & !(dtype.size() - 1);
    let dst = &mut dst[..len];
    let b = &b[..len];
    let a = a.map(|a| &a[..len]);
    match dtype {
        DataType::Int8 => dispatch_arith::<i8>(op, dst, a, b),
        DataType::Uint8 => dispatch_arith::<u8>(op, dst, a, b),
        DataType::Int32 => dispatch_arith::<i32>(op, dst, a, b),
        DataType::Uint32 => dispatch_arith::<u32>(op, dst, a, b),
        DataType::Int64 => dispatch_arith::<i64>(op, dst, a, b),
        DataType::Uint64 => dispatch_arith::<u64>(op, dst, a, b),
        DataType::Float32 => dispatch_arith::<f32>(op, dst, a, b),
        DataType::Float64 => dispatch_arith::<f64>(op, dst, a, b),
        DataType::Float16 => dispatch_half::<f16>(op, dst, a, b, simd16::f16_combine),
        DataType::Bfloat16 => dispatch_half::<bf16>(op, dst, a, b, simd16::bf16_combine),
        DataType::Float8E4M3 => dispatch_narrow::<F8E4M3>(op, dst, a, b),
        DataType::Float8E5M2 => dispatch_narrow::<F8E5M2>(op, dst, a, b),
    }
}

/// `acc[i] = op(acc[i], incoming[i])` over `acc.len()` bytes of `dtype` elements.
pub fn reduce_in_place(dtype: DataType, op: Combine, acc: &mut [u8], incoming: &[u8]) {
    combine_bytes(dtype, op, acc, None, incoming)
}

/// `dst[i] = op(a[i], b[i])` over `dst.len()` bytes of `dtype` elements.
pub fn reduce_into(dtype: DataType, op: Combine, dst: &mut [u8], a: &[u8], b: &[u8]) {
    combine_bytes(dtype, op, dst, Some(a), b)
}

fn divide_narrow<T: Narrow>(buf: &mut [u8], n: usize) {
    let size = std::mem::size_of::<T>();
    let mut f = [0f32; BLOCK];
    let mut t = [T::zeroed(); BLOCK];
    for chunk in buf.chunks_mut(BLOCK * size) {
        let len = chunk.len() / size;
        bytemuck::cast_slice_mut::<T, u8>(&mut t[..len]).copy_from_slice(&chunk[..len * size]);
        T::widen(&t[..len], &mut f[..len]);
        f[..len].iter_mut().for_each(|x| *x /= n as f32);
        T::narrow(&f[..len], &mut t[..len]);
        chunk[..len * size].copy_from_slice(bytemuck::cast_slice(&t[..len]));
    }
}

fn divide_arith<T: Arith>(buf: &mut [u8], n: usize) {
    let size = std::mem::size_of::<T>();
    match cast_mut::<T>(buf) {
        Some(t) => t.iter_mut().for_each(|x| *x = T::div_n(*x, n)),
        None => {
            for c in buf.chunks_exact_mut(size) {
                let x: T = bytemuck::pod_read_unaligned(c);
                c.copy_from_slice(bytemuck::bytes_of(&T::div_n(x, n)));
            }
        }
    }
}

/// Divides every element by `n` (the final step of `avg`).
pub fn divide(dtype: DataType, buf: &mut [u8], n: usize) {
    match dtype {
        DataType::Int8 => divide_arith::<i8>(buf, n),
        DataType::Uint8 => divide_arith::<u8>(buf, n),
        DataType::Int32 => divide_arith::<i32>(buf, n),
        DataType::Uint32 => divide_arith::<u32>(buf, n),
        DataType::Int64 => divide_arith::<i64>(buf, n),
        DataType::Uint64 => divide_arith::<u64>(buf, n),
        DataType::Float32 => divide_arith::<f32>(buf, n),
        DataType::Float64 => divide_arith::<f64>(buf, n),
        DataType::Float16 => divide_narrow::<f16>(buf, n),
        DataType::Bfloat16 => divide_narrow::<bf16>(buf, n),
        DataType::Float8E4M3 => divide_narrow::<F8E4M3>(buf, n),
        DataType::Float8E5M2 => divide_narrow::<F8E5M2>(buf, n),
    }
}

/// `dst[i] = src[i] * scalar` (the first step of a pre-multiplied sum).
pub fn scale(dtype: DataType, dst: &mut [u8], src: &[u8], scalar: &Scalar) {
    let size = dtype.size();
    let block: Vec<u8> = scalar
        .as_bytes()
        .iter()
        .copied()
        .cycle()
        .take(BLOCK * size)
        .collect();
    for (d, s) in dst.chunks_mut(BLOCK * size).zip(src.chunks(BLOCK * size)) {
        let len = d.len();
        reduce_into(dtype, Combine::Prod, d, s, &block[..len]);
    }
}

pub use crate::dtype::scalar_from_f64;

/// Reads element `i` of a byte buffer as f64 (for checks and reports).
pub fn element_as_f64(dtype: DataType, bytes: &[u8], i: usize) -> f64 {
    let s = dtype.size();
    let b = &bytes[i * s..(i + 1) * s];
    match dtype {
        DataType::Int8 => b[0] as i8 as f64,
        DataType::Uint8 => b[0] as f64,
        DataType::Int32 => bytemuck::pod_read_unaligned::<i32>(b) as f64,
        DataType::Uint32 => bytemuck::pod_read_unaligned::<u32>(b) as f64,
        DataType::Int64 => bytemuck::pod_read_unaligned::<i64>(b) as f64,
        DataType::Uint64 => bytemuck::pod_read_unaligned::<u64>(b) as f64,
        DataType::Float16 => bytemuck::pod_read_unaligned::<f16>(b).to_f64(),
        DataType::Float32 => bytemuck::pod_read_unaligned::<f32>(b) as f64,
        DataType::Float64 => bytemuck::pod_read_unaligned::<f64>(b),
        DataType::Bfloat16 => bytemuck::pod_read_unaligned::<bf16>(b).to_f64(),
        DataType::Float8E4M3 => F8E4M3(b[0]).to_f32() as f64,
        DataType::Float8E5M2 => F8E5M2(b[0]).to_f32() as f64,
    }
}

/// Writes `v` into element `i` of a byte buffer, converted to `dtype`.
pub fn set_element_from_f64(dtype: DataType, bytes: &mut [u8], i: usize, v: f64) {
    let s = dtype.size();
    bytes[i * s..(i + 1) * s].copy_from_slice(scalar_from_f64(dtype, v).as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f32_sum_and_unaligned_paths_agree() {
        let a: Vec<f32> = (0..1000).map(|i| i as f32).collect();
        let b: Vec<f32> = (0..1000).map(|i| (2 * i) as f32).collect();
        let mut d = vec![0f32; 1000];
        reduce_into(
            DataType::Float32,
            Combine::Sum,
            bytemuck::cast_slice_mut(&mut d),
            bytemuck::cast_slice(&a),
            bytemuck::cast_slice(&b),
        );
        assert!(d.iter().enumerate().all(|(i, x)| *x == (3 * i) as f32));
        // Same through a misaligned incoming buffer.
        let mut raw = vec![0u8; 4001];
        raw[1..].copy_from_slice(bytemuck::cast_slice(&b));
        let mut acc = a.clone();
        reduce_in_place(
            DataType::Float32,
            Combine::Max,
            bytemuck::cast_slice_mut(&mut acc),
            &raw[1..],
        );
        assert_eq!(acc, b);
    }

    #[test]
    fn integers_wrap_and_divide_toward_zero() {
        let mut acc = [120i8, -7];
        reduce_in_place(
            DataType::Int8,
            Combine::Sum,
            bytemuck::cast_slice_mut(&mut acc),
            bytemuck::cast_slice(&[10i8, 0]),
        );
        assert_eq!(acc, [-126, -7]);
        divide(DataType::Int8, bytemuck::cast_slice_mut(&mut acc), 2);
        assert_eq!(acc, [-63, -3]);
    }

    #[test]
    fn narrow_types_accumulate_in_f32_and_round_once() {
        // 1 + 2^-11 is not representable in f16; (1 + 2^-11) + 2^-11 rounds once to 1 + 2^-10.
        let a = [f16::from_f32(1.0)];
        let b = [f16::from_f32(2f32.powi(-10))];
        let mut d = [f16::ZERO];
        reduce_into(
            DataType::Float16,
            Combine::Sum,
            bytemuck::cast_slice_mut(&mut d),
            bytemuck::cast_slice(&a),
            bytemuck::cast_slice(&b),
        );
        assert_eq!(d[0].to_f32(), 1.0 + 2f32.powi(-10));
        let mut e = [F8E4M3::from_f32(3.0)];
        reduce_in_place(
            DataType::Float8E4M3,
            Combine::Prod,
            bytemuck::cast_slice_mut(&mut e),
            &[F8E4M3::from_f32(-2.0).0],
        );
        assert_eq!(e[0].to_f32(), -6.0);
        let mut h = [bf16::from_f32(6.0)];
        divide(DataType::Bfloat16, bytemuck::cast_slice_mut(&mut h), 4);
        assert_eq!(h[0].to_f32(), 1.5);
    }

    #[test]
    fn bf16_conversions_match_the_half_crate() {
        let mut samples: Vec<f32> = (0..200_000u32)
            .map(|i| f32::from_bits(i.wrapping_mul(2_654_435_761)))
            .collect();
        samples.extend([
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::MAX,
            f32::MIN_POSITIVE,
            1.0 + 2f32.powi(-8),
        ]);
        let mut ours = vec![bf16::ZERO; samples.len()];
        <bf16 as Narrow>::narrow(&samples, &mut ours);
        for (x, got) in samples.iter().zip(&ours) {
            let want = bf16::from_f32(*x);
            assert!(
                got.to_bits() == want.to_bits() || (x.is_nan() && got.is_nan()),
                "{x}: {got} vs {want}"
            );
        }
        let mut back = vec![0f32; ours.len()];
        <bf16 as Narrow>::widen(&ours, &mut back);
        assert!(
            back.iter()
                .zip(&ours)
                .all(|(b, o)| b.to_bits() == o.to_f32().to_bits() || b.is_nan())
        );
    }

    #[test]
    fn scale_multiplies_by_the_scalar() {
        let src = [1.5f64, -2.0];
        let mut dst = [0f64; 2];
        scale(
            DataType::Float64,
            bytemuck::cast_slice_mut(&mut dst),
            bytemuck::cast_slice(&src),
            &Scalar::new(2.0f64),
        );
        assert_eq!(dst, [3.0, -4.0]);
    }
}
