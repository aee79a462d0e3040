//! strata's GPU reduction kernels (`src/gpu/kernels/reduce.cu`), compiled as C for the host
//! by the CUDA stand-in, against the host path's reductions bit for bit: every type, every
//! operator, avg's divide and PreMulSum's scale, on random bit patterns (NaN, infinities and
//! subnormals included). The same source is what NVRTC compiles for the GPU; CI also compiles
//! it for sm_80 and sm_90 (`scripts/compile-kernels.sh`).

use strata::gpu::kernel_suffix;
use strata::reduce::{Combine, divide, reduce_into, scale};
use strata::{DataType, Scalar};
use strata_cuda_standin as _; // links the host kernels

#[repr(C)]
struct Entry {
    name: *const std::ffi::c_char,
    fn_: *const std::ffi::c_void,
    kind: i32,
    size: i32,
}

unsafe extern "C" {
    static strata_kernel_table: [Entry; 73];
}

type CombineFn = unsafe extern "C" fn(*mut u8, *const u8, *const u8, u64);
type DivideFn = unsafe extern "C" fn(*mut u8, u64, u64);
type ScaleFn = unsafe extern "C" fn(*mut u8, *const u8, u64, u64);

fn kernel(name: &str) -> *const std::ffi::c_void {
    // SAFETY: a static table ending with a NULL name.
    let table = unsafe { &strata_kernel_table };
    table
        .iter()
        .take_while(|e| !e.name.is_null())
        // SAFETY: NUL-terminated static strings.
        .find(|e| unsafe { std::ffi::CStr::from_ptr(e.name) }.to_str() == Ok(name))
        .unwrap_or_else(|| panic!("no kernel {name}"))
        .fn_
}

/// Random bytes, with every fp8 and 16-bit code covered for the narrow types.
fn bytes(d: DataType, n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut v: Vec<u8> = (0..n * d.size())
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect();
    if d.size() == 1 {
        for (i, b) in v.iter_mut().enumerate().take(256) {
            *b = i as u8;
        }
    }
    v
}

#[test]
fn host_kernels_match_the_host_reductions_bit_for_bit() {
    let n = 70_000; // covers every 16-bit code once as a, and plenty of pairs
    for d in DataType::ALL {
        let a = if d.size() == 2 {
            (0..n)
                .flat_map(|i| ((i % 65_536) as u16).to_le_bytes())
                .collect()
        } else {
            bytes(d, n, 0x9e37_79b9)
        };
        let b = bytes(d, n, 0x7f4a_7c15);
        for (op, name) in [
            (Combine::Sum, "sum"),
            (Combine::Prod, "prod"),
            (Combine::Min, "min"),
            (Combine::Max, "max"),
        ] {
            let mut want = vec![0u8; a.len()];
            reduce_into(d, op, &mut want, &a, &b);
            let mut got = vec![0u8; a.len()];
            let f: CombineFn =
                // SAFETY: a combine kernel's host version has this signature.
                unsafe { std::mem::transmute(kernel(&format!("strata_combine_{name}_{}", kernel_suffix(d)))) };
            // SAFETY: buffers of n elements.
            unsafe { f(got.as_mut_ptr(), a.as_ptr(), b.as_ptr(), n as u64) };
            assert_same(d, name, &got, &want);
        }
        for divisor in [3usize, 7] {
            let mut want = a.clone();
            divide(d, &mut want, divisor);
            let mut got = a.clone();
            // SAFETY: as above.
            let f: DivideFn = unsafe {
                std::mem::transmute(kernel(&format!("strata_divide_{}", kernel_suffix(d))))
            };
            // SAFETY: a buffer of n elements.
            unsafe { f(got.as_mut_ptr(), divisor as u64, n as u64) };
            assert_same(d, &format!("divide by {divisor}"), &got, &want);
        }
        let mut sb = [0u8; 8];
        sb[..d.size()].copy_from_slice(&b[d.size()..2 * d.size()]);
        let scalar = Scalar {
            dtype: d,
            bytes: sb,
        };
        let mut want = vec![0u8; a.len()];
        scale(d, &mut want, &a, &scalar);
        let bits = sb;
        let mut got = vec![0u8; a.len()];
        // SAFETY: as above.
        let f: ScaleFn =
            unsafe { std::mem::transmute(kernel(&format!("strata_scale_{}", kernel_suffix(d)))) };
        // SAFETY: buffers of n elements.
        unsafe {
            f(
                got.as_mut_ptr(),
                a.as_ptr(),
                u64::from_le_bytes(bits),
                n as u64,
            )
        };
        assert_same(d, "scale", &got, &want);
    }
}

/// Equal bytes, except that any NaN equals any NaN of the same type.
fn assert_same(d: DataType, what: &str, got: &[u8], want: &[u8]) {
    let es = d.size();
    for (i, (g, w)) in got.chunks(es).zip(want.chunks(es)).enumerate() {
        if g == w {
            continue;
        }
        let (gv, wv) = (
            strata::reduce::element_as_f64(d, got, i),
            strata::reduce::element_as_f64(d, want, i),
        );
        assert!(
            gv.is_nan() && wv.is_nan(),
            "{d} {what}: element {i} is {g:02x?} ({gv}), host path {w:02x?} ({wv})"
        );
    }
}
