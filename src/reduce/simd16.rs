//! `f16` and `bf16` reductions in one pass, 8 elements at a time, with AVX2 (and F16C for
//! `f16`), chosen at run time. Each element is widened to `f32`, combined and rounded back to
//! nearest-even exactly as the block path in `reduce.rs` does, so the results are the same bit
//! for bit (a unit test holds them to it); the block path remains for the tail, for other
//! CPUs and for other architectures.

use super::Combine;
use half::{bf16, f16};

/// Whether this CPU has what the kernels need (checked once).
#[cfg(target_arch = "x86_64")]
pub(super) fn available() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| is_x86_feature_detected!("avx2") && is_x86_feature_detected!("f16c"))
}

/// Whether this CPU has what the kernels need: never, on this architecture.
#[cfg(not(target_arch = "x86_64"))]
pub(super) fn available() -> bool {
    false
}

/// `dst = op(a, b)` (`a` = `None`: `dst` itself) over the leading multiple of 8 elements;
/// returns how many it did (0 where the CPU lacks AVX2 or F16C).
pub(super) fn f16_combine(op: Combine, dst: &mut [f16], a: Option<&[f16]>, b: &[f16]) -> usize {
    let bits = bytemuck::cast_slice::<f16, u16>;
    combine_bits(
        Format::F16,
        op,
        bytemuck::cast_slice_mut(dst),
        a.map(bits),
        bits(b),
    )
}

/// As [`f16_combine`], for `bf16`.
pub(super) fn bf16_combine(op: Combine, dst: &mut [bf16], a: Option<&[bf16]>, b: &[bf16]) -> usize {
    let bits = bytemuck::cast_slice::<bf16, u16>;
    combine_bits(
        Format::Bf16,
        op,
        bytemuck::cast_slice_mut(dst),
        a.map(bits),
        bits(b),
    )
}

/// Which 16-bit float the bits hold.
#[derive(Clone, Copy)]
enum Format {
    F16,
    Bf16,
}

/// [`f16_combine`] and [`bf16_combine`] on the elements' bits.
fn combine_bits(
    format: Format,
    op: Combine,
    dst: &mut [u16],
    a: Option<&[u16]>,
    b: &[u16],
) -> usize {
    #[cfg(target_arch = "x86_64")]
    if available() {
        let n = dst
            .len()
            .min(b.len())
            .min(a.map_or(usize::MAX, <[u16]>::len))
            / 8
            * 8;
        // SAFETY: the CPU has AVX2 and F16C; every slice holds at least `n` elements.
        unsafe {
            x86::combine(
                format,
                op,
                dst.as_mut_ptr(),
                a.map(<[u16]>::as_ptr),
                b.as_ptr(),
                n,
            )
        };
        return n;
    }
    let _ = (format, op, dst, a, b);
    0
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{Combine, Format};
    use std::arch::x86_64::*;

    const SUM: u8 = 0;
    const PROD: u8 = 1;
    const MIN: u8 = 2;
    const MAX: u8 = 3;

    fn code(op: Combine) -> u8 {
        match op {
            Combine::Sum => SUM,
            Combine::Prod => PROD,
            Combine::Min => MIN,
            Combine::Max => MAX,
        }
    }

    /// `op(a, b)` in `f32` as the scalar code has it: `a + b`, `a * b`, and for min and max
    /// `b` only when it compares below (above) `a`, so a NaN in either keeps `a`.
    #[inline(always)]
    unsafe fn apply<const OP: u8>(a: __m256, b: __m256) -> __m256 {
        // SAFETY: the callers are compiled with AVX2 enabled.
        unsafe {
            match OP {
                SUM => _mm256_add_ps(a, b),
                PROD => _mm256_mul_ps(a, b),
                // min_ps(x, y) is x < y ? x : y, and y when either is NaN.
                MIN => _mm256_min_ps(b, a),
                _ => _mm256_max_ps(b, a),
            }
        }
    }

    /// One kernel loop: `dst = op(a, b)` over `n` (a multiple of 8) elements.
    type Loop = unsafe fn(*mut u16, Option<*const u16>, *const u16, usize);

    /// Runs the loop for `format` and `op`. The CPU must have AVX2 and F16C and every
    /// pointer must hold `n` elements.
    pub(super) unsafe fn combine(
        format: Format,
        op: Combine,
        dst: *mut u16,
        a: Option<*const u16>,
        b: *const u16,
        n: usize,
    ) {
        let run: Loop = match (format, code(op)) {
            (Format::F16, SUM) => f16_loop::<SUM>,
            (Format::F16, PROD) => f16_loop::<PROD>,
            (Format::F16, MIN) => f16_loop::<MIN>,
            (Format::F16, _) => f16_loop::<MAX>,
            (Format::Bf16, SUM) => bf16_loop::<SUM>,
            (Format::Bf16, PROD) => bf16_loop::<PROD>,
            (Format::Bf16, MIN) => bf16_loop::<MIN>,
            (Format::Bf16, _) => bf16_loop::<MAX>,
        };
        // SAFETY: as the caller's.
        unsafe { run(dst, a, b, n) }
    }

    #[target_feature(enable = "avx2,f16c")]
    unsafe fn f16_loop<const OP: u8>(
        dst: *mut u16,
        a: Option<*const u16>,
        b: *const u16,
        n: usize,
    ) {
        let a = a.unwrap_or(dst.cast_const());
        let mut i = 0;
        while i < n {
            // SAFETY: i + 8 ≤ n, within every slice.
            unsafe {
                let va = _mm256_cvtph_ps(_mm_loadu_si128(a.add(i).cast()));
                let vb = _mm256_cvtph_ps(_mm_loadu_si128(b.add(i).cast()));
                let r = apply::<OP>(va, vb);
                _mm_storeu_si128(
                    dst.add(i).cast(),
                    _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(r),
                );
            }
            i += 8;
        }
    }

    /// 8 bf16 at `p` as f32: each is the top half of one.
    #[inline(always)]
    unsafe fn widen_bf16(p: *const u16) -> __m256 {
        // SAFETY: 8 elements at `p`; AVX2 enabled in the callers.
        unsafe {
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(
                _mm_loadu_si128(p.cast()),
            )))
        }
    }

    /// 8 f32 rounded to bf16 (nearest even; a NaN stays a NaN, quietened), as the scalar code,
    /// each in the low half of a 32-bit lane.
    #[inline(always)]
    unsafe fn round_bf16(r: __m256) -> __m256i {
        // SAFETY: AVX2 enabled in the callers.
        unsafe {
            let bits = _mm256_castps_si256(r);
            let top = _mm256_srli_epi32::<16>(bits);
            let lsb = _mm256_and_si256(top, _mm256_set1_epi32(1));
            let rounded = _mm256_srli_epi32::<16>(_mm256_add_epi32(
                bits,
                _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), lsb),
            ));
            let nan = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_UNORD_Q>(r, r));
            let quiet = _mm256_or_si256(top, _mm256_set1_epi32(0x40));
            _mm256_blendv_epi8(rounded, quiet, nan)
        }
    }

    #[target_feature(enable = "avx2")]
    unsafe fn bf16_loop<const OP: u8>(
        dst: *mut u16,
        a: Option<*const u16>,
        b: *const u16,
        n: usize,
    ) {
        let a = a.unwrap_or(dst.cast_const());
        let mut i = 0;
        // 16 at a time. Interleaving each bf16 above a zero half makes its f32 directly, in
        // the order [0-3, 8-11] and [4-7, 12-15]; packing the two results back (every lane is
        // below 2^16) restores [0-7, 8-15] within the 128-bit halves, with no permute.
        let zero = _mm256_setzero_si256();
        while i + 16 <= n {
            // SAFETY: i + 16 ≤ n, within every slice.
            unsafe {
                let va = _mm256_loadu_si256(a.add(i).cast());
                let vb = _mm256_loadu_si256(b.add(i).cast());
                let lo = apply::<OP>(
                    _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, va)),
                    _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, vb)),
                );
                let hi = apply::<OP>(
                    _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, va)),
                    _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, vb)),
                );
                let packed = _mm256_packus_epi32(round_bf16(lo), round_bf16(hi));
                _mm256_storeu_si256(dst.add(i).cast(), packed);
            }
            i += 16;
        }
        while i < n {
            // SAFETY: i + 8 ≤ n (n is a multiple of 8), within every slice.
            unsafe {
                let r = round_bf16(apply::<OP>(widen_bf16(a.add(i)), widen_bf16(b.add(i))));
                let packed = _mm256_packus_epi32(r, r);
                _mm_storeu_si128(
                    dst.add(i).cast(),
                    _mm256_castsi256_si128(_mm256_permute4x64_epi64::<0b1000>(packed)),
                );
            }
            i += 8;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values that exercise rounding, overflow, subnormals, signed zeros and NaNs.
    fn awkward(seed: u32, n: usize) -> Vec<f32> {
        let special = [
            0.0,
            -0.0,
            1.0,
            -1.0,
            65504.0,
            65520.0,
            -70000.0,
            6.0e-8,
            1.0e-40,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            f32::from_bits(0x7FA0_0001), // a signalling NaN with a payload
            3.0e38,
            1.0 / 3.0,
        ];
        let mut x = seed.wrapping_mul(2_654_435_761).max(1);
        (0..n)
            .map(|i| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                if i % 7 == 0 {
                    special[(x as usize) % special.len()]
                } else {
                    f32::from_bits(x) // every bit pattern, finite or not
                }
            })
            .collect()
    }

    #[test]
    fn simd_f16_and_bf16_match_the_block_path_bit_for_bit() {
        if !available() {
            println!(
                "SKIPPED simd_f16_and_bf16_match_the_block_path_bit_for_bit: this CPU lacks AVX2 or F16C"
            );
            return;
        }
        let n = 1003; // a tail of 3 past the last group of 8
        for seed in 1..20 {
            let fa = awkward(seed, n);
            let fb = awkward(seed + 100, n);
            for op in [Combine::Sum, Combine::Prod, Combine::Min, Combine::Max] {
                let ha: Vec<f16> = fa.iter().map(|&v| f16::from_f32(v)).collect();
                let hb: Vec<f16> = fb.iter().map(|&v| f16::from_f32(v)).collect();
                let mut want = vec![f16::ZERO; n];
                super::super::narrow_combine(op, &mut want, Some(&ha), &hb);
                let mut got = vec![f16::ZERO; n];
                let done = f16_combine(op, &mut got, Some(&ha), &hb);
                assert_eq!(done, n / 8 * 8);
                for i in 0..done {
                    assert_eq!(
                        got[i].to_bits(),
                        want[i].to_bits(),
                        "f16 {op:?} at {i}: {} {}",
                        ha[i],
                        hb[i]
                    );
                }
                // In place: dst is a.
                let mut acc = ha.clone();
                f16_combine(op, &mut acc, None, &hb);
                assert!(
                    acc[..done]
                        .iter()
                        .zip(&want)
                        .all(|(x, y)| x.to_bits() == y.to_bits())
                );

                let ba: Vec<bf16> = fa
                    .iter()
                    .map(|&v| bf16::from_bits((v.to_bits() >> 16) as u16))
                    .collect();
                let bb: Vec<bf16> = fb
                    .iter()
                    .map(|&v| bf16::from_bits((v.to_bits() >> 16) as u16))
                    .collect();
                let mut want = vec![bf16::ZERO; n];
                super::super::narrow_combine(op, &mut want, Some(&ba), &bb);
                let mut got = vec![bf16::ZERO; n];
                let done = bf16_combine(op, &mut got, Some(&ba), &bb);
                for i in 0..done {
                    assert_eq!(
                        got[i].to_bits(),
                        want[i].to_bits(),
                        "bf16 {op:?} at {i}: {:#06x} {:#06x}",
                        ba[i].to_bits(),
                        bb[i].to_bits()
                    );
                }
                let mut acc = ba.clone();
                bf16_combine(op, &mut acc, None, &bb);
                assert!(
                    acc[..done]
                        .iter()
                        .zip(&want)
                        .all(|(x, y)| x.to_bits() == y.to_bits())
                );
            }
        }
    }
}
