//! Byte copies on the host data path: into and out of shared-memory slots, and a schedule's
//! local copies.
//!
//! glibc copies from a few KiB up to its non-temporal threshold (about 1 MiB here) with
//! `rep movsb` on CPUs that advertise fast string moves. On the AMD EPYC machines this project
//! is built and tested on, `rep movsb` falls to about 2 GB/s when the destination sits a few
//! bytes further into its cache line than the source (a slot's data after the call's header,
//! a `malloc` buffer 16 bytes past a page), against 30-60 GB/s otherwise
//! (`cargo bench --bench copy`). Those copies take a vector loop here instead, which runs at
//! 25-65 GB/s at every offset; the others stay with `memcpy`.

/// Smallest copy the vector loop takes: glibc moves smaller ones with vector loops itself.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const LOOP_MIN: usize = 2048;

/// Largest copy the vector loop takes: from here glibc streams past the cache, at full speed
/// whatever the offsets.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const LOOP_MAX: usize = 1 << 20;

/// Copies `src` into `dst`, as `dst.copy_from_slice(src)` does (and panics as it does when
/// their lengths differ).
#[inline]
pub fn copy(dst: &mut [u8], src: &[u8]) {
    assert_eq!(
        dst.len(),
        src.len(),
        "copy between slices of unequal length"
    );
    // SAFETY: two slices, one borrowed mutably, cannot overlap; both hold `src.len()` bytes.
    unsafe { copy_nonoverlapping(src.as_ptr(), dst.as_mut_ptr(), src.len()) }
}

/// Copies `n` bytes from `src` to `dst`, as `std::ptr::copy_nonoverlapping`.
///
/// # Safety
/// `src` must be readable and `dst` writable for `n` bytes, and the two must not overlap.
#[inline]
pub unsafe fn copy_nonoverlapping(src: *const u8, dst: *mut u8, n: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        let shifted = !(dst as usize).wrapping_sub(src as usize).is_multiple_of(64);
        if shifted && (LOOP_MIN..LOOP_MAX).contains(&n) {
            // SAFETY: the caller's guarantee.
            return unsafe { x86::copy_loop(src, dst, n) };
        }
    }
    // SAFETY: the caller's guarantee.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, n) }
}

/// Copies `n` bytes from `src` to `dst`, which may overlap, as `std::ptr::copy`.
///
/// # Safety
/// `src` must be readable and `dst` writable for `n` bytes.
#[inline]
pub unsafe fn copy_overlapping(src: *const u8, dst: *mut u8, n: usize) {
    let (s, d) = (src as usize, dst as usize);
    if s.abs_diff(d) >= n {
        // SAFETY: the caller's guarantee; the ranges are disjoint.
        unsafe { copy_nonoverlapping(src, dst, n) }
    } else {
        // SAFETY: the caller's guarantee.
        unsafe { std::ptr::copy(src, dst, n) }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use core::arch::x86_64::*;

    /// The vector loop: 32-byte moves where the CPU has AVX2, 16-byte ones (SSE2, every
    /// x86-64 CPU) elsewhere; unaligned loads and stores, the tail through `memcpy`.
    ///
    /// # Safety
    /// As [`super::copy_nonoverlapping`].
    #[inline]
    pub unsafe fn copy_loop(src: *const u8, dst: *mut u8, n: usize) {
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: AVX2 is present; the caller's guarantee.
            unsafe { avx2(src, dst, n) }
        } else {
            // SAFETY: the caller's guarantee.
            unsafe { sse2(src, dst, n) }
        }
    }

    /// 128 bytes a round in four 32-byte moves.
    ///
    /// # Safety
    /// AVX2 must be present; otherwise as [`super::copy_nonoverlapping`].
    #[target_feature(enable = "avx2")]
    pub unsafe fn avx2(src: *const u8, dst: *mut u8, n: usize) {
        let mut i = 0;
        // SAFETY: every access lies below `n`, which the caller guarantees.
        unsafe {
            while i + 128 <= n {
                let a = _mm256_loadu_si256(src.add(i).cast());
                let b = _mm256_loadu_si256(src.add(i + 32).cast());
                let c = _mm256_loadu_si256(src.add(i + 64).cast());
                let d = _mm256_loadu_si256(src.add(i + 96).cast());
                _mm256_storeu_si256(dst.add(i).cast(), a);
                _mm256_storeu_si256(dst.add(i + 32).cast(), b);
                _mm256_storeu_si256(dst.add(i + 64).cast(), c);
                _mm256_storeu_si256(dst.add(i + 96).cast(), d);
                i += 128;
            }
            std::ptr::copy_nonoverlapping(src.add(i), dst.add(i), n - i);
        }
    }

    /// 64 bytes a round in four 16-byte moves.
    ///
    /// # Safety
    /// As [`super::copy_nonoverlapping`].
    pub unsafe fn sse2(src: *const u8, dst: *mut u8, n: usize) {
        let mut i = 0;
        // SAFETY: every access lies below `n`, which the caller guarantees.
        unsafe {
            while i + 64 <= n {
                let a = _mm_loadu_si128(src.add(i).cast());
                let b = _mm_loadu_si128(src.add(i + 16).cast());
                let c = _mm_loadu_si128(src.add(i + 32).cast());
                let d = _mm_loadu_si128(src.add(i + 48).cast());
                _mm_storeu_si128(dst.add(i).cast(), a);
                _mm_storeu_si128(dst.add(i + 16).cast(), b);
                _mm_storeu_si128(dst.add(i + 32).cast(), c);
                _mm_storeu_si128(dst.add(i + 48).cast(), d);
                i += 64;
            }
            std::ptr::copy_nonoverlapping(src.add(i), dst.add(i), n - i);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every size around the loop's bounds and its unrolling, at every offset of source and
    /// destination within a cache line that matters, copies exactly its bytes and nothing
    /// past them.
    #[test]
    fn copies_every_byte_at_every_offset() {
        let src: Vec<u8> = (0..(LOOP_MAX + 4096)).map(|i| (i * 7 + 3) as u8).collect();
        let mut dst = vec![0u8; LOOP_MAX + 4096];
        let sizes = [
            0,
            1,
            63,
            LOOP_MIN - 1,
            LOOP_MIN,
            LOOP_MIN + 1,
            LOOP_MIN + 127,
            4096 + 17,
            65_536 + 100,
            LOOP_MAX - 1,
            LOOP_MAX,
        ];
        for n in sizes {
            for (so, d_o) in [(0, 0), (0, 16), (0, 8), (16, 0), (3, 40), (48, 16)] {
                dst.fill(0xAA);
                copy(&mut dst[d_o..d_o + n], &src[so..so + n]);
                assert_eq!(
                    dst[d_o..d_o + n],
                    src[so..so + n],
                    "{n} bytes +{so} -> +{d_o}"
                );
                assert!(dst[..d_o].iter().all(|&b| b == 0xAA), "before, {n} +{d_o}");
                assert!(
                    dst[d_o + n..d_o + n + 64].iter().all(|&b| b == 0xAA),
                    "after"
                );
            }
        }
    }

    /// Both loops, whichever the CPU would pick, copy alike.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn both_vector_loops_copy_exactly() {
        let src: Vec<u8> = (0..9000).map(|i| (i % 251) as u8).collect();
        for n in [0, 5, 64, 127, 128, 129, 4000, 8999] {
            let mut a = vec![0u8; n + 16];
            // SAFETY: disjoint buffers of at least n bytes (the destination at offset 16).
            unsafe { x86::sse2(src.as_ptr().add(1), a.as_mut_ptr().add(16), n) };
            assert_eq!(a[16..], src[1..1 + n]);
            if std::is_x86_feature_detected!("avx2") {
                let mut b = vec![0u8; n + 16];
                // SAFETY: as above; AVX2 is present.
                unsafe { x86::avx2(src.as_ptr().add(1), b.as_mut_ptr().add(16), n) };
                assert_eq!(b, a);
            }
        }
    }

    /// Overlapping ranges are copied as `memmove` does, both ways.
    #[test]
    fn overlapping_copies_move_as_memmove() {
        for (from, to) in [(0usize, 100usize), (100, 0), (0, 5000), (5000, 0)] {
            let mut want: Vec<u8> = (0..20_000).map(|i| (i % 253) as u8).collect();
            let mut got = want.clone();
            want.copy_within(from..from + 10_000, to);
            // SAFETY: both ranges lie inside `got`.
            unsafe {
                let p = got.as_mut_ptr();
                copy_overlapping(p.add(from), p.add(to), 10_000);
            }
            assert_eq!(got, want, "{from} -> {to}");
        }
    }
}
