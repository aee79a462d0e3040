//! Modules and kernel launches: a module is PTX text whose `.entry` names the stand-in looks
//! up in its host versions of strata's kernels (`src/gpu/kernels/*.cu` compiled as C): the
//! elementwise reductions (`reduce.cu`) and the low-latency collectives (`ll.cu`), whose host
//! versions poll their peers' lines on the stream's own thread, backing off to sleeps, so a
//! kernel waiting on another rank never holds that rank up.

use crate::memory::{device_view, is_host};
use crate::{code, current, put, ready, stats, status, stream};
use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_uint, c_void};
use std::sync::{Mutex, OnceLock};

#[repr(C)]
struct Entry {
    name: *const c_char,
    fn_: *const c_void,
    kind: i32,
    size: i32,
}

#[repr(C)]
struct LlEntry {
    name: *const c_char,
    fn_: *const c_void,
    /// Bytes of the kernel's one argument, a `strata_ll_args`.
    args: i32,
}

unsafe extern "C" {
    static strata_kernel_table: [Entry; 73];
    static strata_ll_table: [LlEntry; 3];
}

/// Function handles: elementwise kernels from here, low-latency kernels from [`LL_BASE`].
const KERNEL_BASE: usize = 0x4b4b_0000;
const LL_BASE: usize = 0x4c4c_0000;

/// `void kernel(const strata_ll_args*, void* (*view)(u64 addr, u64 len))`.
type LlFn = unsafe extern "C" fn(*const u8, extern "C" fn(u64, u64) -> *mut c_void);

/// What a low-latency kernel's host version reads and writes device addresses through: the
/// driver's own view of the memory. An address that is not device-accessible memory is what a
/// GPU reports as an illegal address; here the process stops with the address.
extern "C" fn view(addr: u64, len: u64) -> *mut c_void {
    match device_view(addr, len as usize) {
        Ok(p) => p.cast(),
        Err(_) => {
            eprintln!(
                "CUDA stand-in: a kernel touched {addr:#x} (+{len} bytes), which is not memory \
                 the device can address (an illegal address on a GPU)"
            );
            std::process::abort()
        }
    }
}

/// Index of low-latency kernel `name` in `strata_ll_table`.
fn ll_kernel(name: &str) -> Option<usize> {
    // SAFETY: a static table ending with a NULL name.
    let table = unsafe { &strata_ll_table };
    table
        .iter()
        .take_while(|e| !e.name.is_null())
        // SAFETY: NUL-terminated static strings.
        .position(|e| unsafe { CStr::from_ptr(e.name) }.to_str() == Ok(name))
}

type CombineFn = unsafe extern "C" fn(*mut u8, *const u8, *const u8, u64);
type DivideFn = unsafe extern "C" fn(*mut u8, u64, u64);
type ScaleFn = unsafe extern "C" fn(*mut u8, *const u8, u64, u64);

/// Host version `index` of the table, if `name` is one.
fn host_kernel(name: &str) -> Option<usize> {
    // SAFETY: a static table ending with a NULL name.
    let table = unsafe { &strata_kernel_table };
    table
        .iter()
        .take_while(|e| !e.name.is_null())
        // SAFETY: NUL-terminated static strings.
        .position(|e| unsafe { CStr::from_ptr(e.name) }.to_str() == Ok(name))
}

/// Modules: handle → the entry names of its PTX.
fn modules() -> &'static Mutex<HashMap<usize, Vec<String>>> {
    static M: OnceLock<Mutex<HashMap<usize, Vec<String>>>> = OnceLock::new();
    M.get_or_init(Default::default)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleLoadData(out: *mut usize, image: *const c_void) -> i32 {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0x3d3d_0000);
    status(current().and_then(|_| {
        if image.is_null() {
            return Err(code::INVALID_VALUE);
        }
        // SAFETY: a PTX image is NUL-terminated text (the driver's contract for PTX).
        let text = unsafe { CStr::from_ptr(image.cast()) }.to_string_lossy();
        if !text.contains(".version") || !text.contains(".target") {
            return Err(218); // CUDA_ERROR_INVALID_PTX
        }
        let entries: Vec<String> = text
            .split(".entry")
            .skip(1)
            .filter_map(|rest| {
                let name: String = rest
                    .trim_start()
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                (!name.is_empty()).then_some(name)
            })
            .collect();
        let handle = NEXT.fetch_add(16, std::sync::atomic::Ordering::Relaxed);
        modules()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(handle, entries);
        // SAFETY: out-parameter.
        unsafe { put(out, handle) }
    }))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuModuleUnload(module: usize) -> i32 {
    status(ready().and_then(|_| {
        modules()
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&module)
            .map(|_| ())
            .ok_or(code::INVALID_HANDLE)
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleGetFunction(
    out: *mut usize,
    module: usize,
    name: *const c_char,
) -> i32 {
    status(current().and_then(|_| {
        if name.is_null() {
            return Err(code::INVALID_VALUE);
        }
        // SAFETY: a NUL-terminated name.
        let name = unsafe { CStr::from_ptr(name) }
            .to_str()
            .map_err(|_| code::INVALID_VALUE)?;
        let m = modules().lock().unwrap_or_else(|p| p.into_inner());
        let entries = m.get(&module).ok_or(code::INVALID_HANDLE)?;
        if !entries.iter().any(|e| e == name) {
            return Err(500); // CUDA_ERROR_NOT_FOUND: not in the module's PTX
        }
        let handle = match (host_kernel(name), ll_kernel(name)) {
            (Some(i), _) => KERNEL_BASE + i * 16,
            (None, Some(i)) => LL_BASE + i * 16,
            (None, None) => return Err(500),
        };
        // SAFETY: out-parameter.
        unsafe { put(out, handle) }
    }))
}

/// Reads launch parameter `i` (a pointer to the value, as `kernelParams` holds them).
unsafe fn param(params: *mut *mut c_void, i: usize) -> u64 {
    // SAFETY: the caller passed as many parameters as the kernel takes, each 8 bytes.
    unsafe { (*params.add(i) as *const u64).read_unaligned() }
}

#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cuLaunchKernel(
    f: usize,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    _shared: c_uint,
    s: usize,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> i32 {
    status(current().and_then(|_| {
        if [gx, gy, gz, bx, by, bz].contains(&0) || bx * by * bz > 1024 {
            return Err(code::INVALID_VALUE);
        }
        if params.is_null() || !extra.is_null() {
            return Err(code::INVALID_VALUE);
        }
        // SAFETY: the caller passes the kernel's parameters.
        if let Some(r) = unsafe { launch_ll(f, bx * by * bz, s, params) } {
            return r;
        }
        if f < KERNEL_BASE || !(f - KERNEL_BASE).is_multiple_of(16) || f >= LL_BASE {
            return Err(code::INVALID_HANDLE);
        }
        stats::add(stats::LAUNCHES, 1);
        // SAFETY: a static table; the index came from cuModuleGetFunction.
        let e = unsafe { &strata_kernel_table[(f - KERNEL_BASE) / 16] };
        let size = e.size as usize;
        let count = if e.kind == 1 { 3 } else { 4 };
        // SAFETY: as many parameters as the kernel's signature has.
        let p: Vec<u64> = (0..count).map(|i| unsafe { param(params, i) }).collect();
        let (kind, fn_) = (e.kind, e.fn_ as usize);
        // Operands in device-mapped host memory: what the kernel reads from and writes to
        // host memory (parameter 0 is the output; the others it reads).
        let elems = if kind == 1 { p[2] } else { p[3] } * size as u64;
        let operands: &[usize] = match kind {
            0 => &[0, 1, 2],
            1 => &[0],
            _ => &[0, 1],
        };
        let written = if is_host(p[0]) { elems } else { 0 };
        let read = operands[1..].iter().filter(|&&i| is_host(p[i])).count() as u64 * elems
            + if kind == 1 { written } else { 0 };
        let count_traffic = move || {
            stats::add(stats::DEVICE_TO_HOST, written);
            stats::add(stats::HOST_TO_DEVICE, read);
        };
        let op: Box<dyn FnOnce() + Send> = match kind {
            0 => {
                let n = p[3] as usize;
                let (d, a, b) = (
                    device_view(p[0], n * size)? as usize,
                    device_view(p[1], n * size)? as usize,
                    device_view(p[2], n * size)? as usize,
                );
                Box::new(move || {
                    // SAFETY: the host version of a combine kernel on resolved views.
                    let k: CombineFn = unsafe { std::mem::transmute(fn_) };
                    unsafe { k(d as *mut u8, a as *const u8, b as *const u8, n as u64) }
                })
            }
            1 => {
                let n = p[2] as usize;
                let d = device_view(p[0], n * size)? as usize;
                let divisor = p[1];
                Box::new(move || {
                    // SAFETY: as above, a divide kernel.
                    let k: DivideFn = unsafe { std::mem::transmute(fn_) };
                    unsafe { k(d as *mut u8, divisor, n as u64) }
                })
            }
            _ => {
                let n = p[3] as usize;
                let (d, a) = (
                    device_view(p[0], n * size)? as usize,
                    device_view(p[1], n * size)? as usize,
                );
                let bits = p[2];
                Box::new(move || {
                    // SAFETY: as above, a scale kernel.
                    let k: ScaleFn = unsafe { std::mem::transmute(fn_) };
                    unsafe { k(d as *mut u8, a as *const u8, bits, n as u64) }
                })
            }
        };
        stream::enqueue(
            s,
            Box::new(move || {
                count_traffic();
                op()
            }),
        )
    }))
}

/// Launches low-latency kernel `f` if it is one (`None` if not): its one parameter, a
/// `strata_ll_args`, is copied now, as the driver copies parameters at launch, and the host
/// version runs on the stream (however many blocks were asked for: it does all their work).
/// The driver's limit on threads per block is the kernel's `__launch_bounds__` (256).
///
/// # Safety
/// `params` holds a pointer to the kernel's argument.
unsafe fn launch_ll(
    f: usize,
    threads: c_uint,
    s: usize,
    params: *mut *mut c_void,
) -> Option<Result<(), i32>> {
    if f < LL_BASE || !(f - LL_BASE).is_multiple_of(16) {
        return None;
    }
    // SAFETY: a static table ending with a NULL name.
    let table = unsafe { &strata_ll_table };
    let Some(e) = table.get((f - LL_BASE) / 16).filter(|e| !e.name.is_null()) else {
        return Some(Err(code::INVALID_HANDLE));
    };
    if threads > 256 {
        return Some(Err(701)); // CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES
    }
    // SAFETY: parameter 0 points to the argument, `e.args` bytes.
    let args: Vec<u8> =
        unsafe { std::slice::from_raw_parts(*params as *const u8, e.args as usize) }.to_vec();
    let fn_ = e.fn_ as usize;
    stats::add(stats::LAUNCHES, 1);
    Some(stream::enqueue(
        s,
        Box::new(move || {
            // SAFETY: the host version of a low-latency kernel, with its argument.
            let k: LlFn = unsafe { std::mem::transmute(fn_) };
            unsafe { k(args.as_ptr(), view) }
        }),
    ))
}
