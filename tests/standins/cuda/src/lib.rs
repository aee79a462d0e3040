//! A test-only stand-in for the CUDA driver, built as `libcuda.so.1`.
//!
//! strata loads the driver at run time through cudarc; with this library first on
//! `LD_LIBRARY_PATH`, the same code path runs against host memory, so the GPU path's ordering
//! and data can be tested on a machine without a GPU. Nothing it shows is GPU speed.
//!
//! It is strict where the real driver is:
//! * every call but the error-string ones fails with `CUDA_ERROR_NOT_INITIALIZED` before
//!   `cuInit`, and calls that need a context fail without a current one (contexts are per
//!   thread);
//! * device memory lives in its own address range (from `0x5a00_0000_0000`) mapped with no
//!   access at all: a host read or write of a device pointer crashes, as on a GPU. The driver
//!   reaches it through a second, private mapping of the same pages;
//! * streams run on their own threads, in order, asynchronously to the caller; events,
//!   `cuStreamWaitEvent`, host functions and 32-bit stream memory operations behave as the
//!   driver documents them; a CUDA call from inside a host function is refused with
//!   `CUDA_ERROR_NOT_PERMITTED`;
//! * allocating or freeing device or pinned memory waits for every stream first (the
//!   driver's implicit synchronisation), so code that allocates while a stream waits on it
//!   deadlocks here as it would on a GPU;
//! * `cuStreamWaitValue32` and `cuStreamWriteValue32` accept only device-accessible words:
//!   device memory, or host memory allocated or registered as device-mapped;
//!   `cuStreamBatchMemOp` runs its operations in order, a wait holding those after it, and
//!   checks every one (operation, flags, alignment, address) before it enqueues any;
//! * copies follow the driver's rules for pageable host memory: a copy from it stages the
//!   source before the call returns, a copy into it returns only when it is done; copies
//!   to and from page-locked memory are asynchronous;
//! * `cuCtxEnablePeerAccess` refuses the context's own device and a second enabling, as the
//!   driver does (peer access is recorded, not enforced on each access);
//! * unknown streams, events, contexts and pointers are `CUDA_ERROR_INVALID_HANDLE` or
//!   `CUDA_ERROR_INVALID_VALUE`, never a crash.
//!
//! * IPC handles carry the exporting process's memory file, which another process maps
//!   (`/proc/<pid>/fd/<n>`); modules are PTX whose `.entry` names must be strata's kernels,
//!   and a launch runs their host versions (the same source compiled as C) on the stream; the
//!   low-latency kernels' host versions poll their peers' lines on the stream's thread,
//!   backing off to sleeps, so one never holds up the rank it waits for.
//!
//! * it counts what tests must assert and cannot see (`stats`): payload bytes that crossed
//!   host memory, host functions run, host waits on the GPU, kernels launched and stream
//!   memory operations enqueued (a batch counts one); `strataStandinStats` reads them.
//!
//! `STRATA_STANDIN_GPUS` sets how many devices it shows (default 1).

#![allow(clippy::missing_safety_doc)] // the driver API's own contracts apply

mod kernels;
mod memory;
mod stats;
mod stream;

use std::cell::Cell;
use std::ffi::{c_char, c_int, c_uint};
use std::sync::atomic::{AtomicBool, Ordering};

/// `CUresult` values used here.
pub(crate) mod code {
    pub const SUCCESS: i32 = 0;
    pub const INVALID_VALUE: i32 = 1;
    pub const OUT_OF_MEMORY: i32 = 2;
    pub const NOT_INITIALIZED: i32 = 3;
    pub const INVALID_DEVICE: i32 = 101;
    pub const INVALID_CONTEXT: i32 = 201;
    pub const INVALID_HANDLE: i32 = 400;
    pub const NOT_READY: i32 = 600;
    pub const NOT_PERMITTED: i32 = 800;
}

static INITIALISED: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// The device whose primary context is current on this thread (+1; 0 for none).
    static CURRENT: Cell<usize> = const { Cell::new(0) };
    /// Set while a host function runs on a stream thread.
    pub(crate) static IN_HOST_FN: Cell<bool> = const { Cell::new(false) };
}

/// Devices shown (`STRATA_STANDIN_GPUS`, default 1).
pub(crate) fn device_count() -> i32 {
    std::env::var("STRATA_STANDIN_GPUS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n: &i32| n > 0)
        .unwrap_or(1)
}

/// The checks every API call makes: initialised, and not called from a host function.
pub(crate) fn ready() -> Result<(), i32> {
    if IN_HOST_FN.with(Cell::get) {
        return Err(code::NOT_PERMITTED);
    }
    if !INITIALISED.load(Ordering::Acquire) {
        return Err(code::NOT_INITIALIZED);
    }
    Ok(())
}

/// The current context's device, or `CUDA_ERROR_INVALID_CONTEXT`.
pub(crate) fn current() -> Result<i32, i32> {
    ready()?;
    match CURRENT.with(Cell::get) {
        0 => Err(code::INVALID_CONTEXT),
        d => Ok(d as i32 - 1),
    }
}

/// Turns a `Result` into a `CUresult`.
pub(crate) fn status(r: Result<(), i32>) -> i32 {
    match r {
        Ok(()) => code::SUCCESS,
        Err(c) => c,
    }
}

/// Writes through an out-pointer, refusing NULL.
pub(crate) unsafe fn put<T>(out: *mut T, v: T) -> Result<(), i32> {
    if out.is_null() {
        return Err(code::INVALID_VALUE);
    }
    // SAFETY: non-NULL; the caller passed a writable out-parameter.
    unsafe { out.write(v) };
    Ok(())
}

/// A context handle: distinct, non-NULL and never dereferenced.
fn context_handle(device: i32) -> usize {
    0x5c7c_0000 + device as usize * 16
}

#[unsafe(no_mangle)]
pub extern "C" fn cuInit(flags: c_uint) -> i32 {
    if flags != 0 {
        return code::INVALID_VALUE;
    }
    INITIALISED.store(true, Ordering::Release);
    code::SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDriverGetVersion(v: *mut c_int) -> i32 {
    // SAFETY: out-parameter.
    status(unsafe { put(v, 12080) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetCount(n: *mut c_int) -> i32 {
    // SAFETY: out-parameter.
    status(ready().and_then(|_| unsafe { put(n, device_count()) }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGet(dev: *mut c_int, ordinal: c_int) -> i32 {
    status(ready().and_then(|_| {
        if ordinal < 0 || ordinal >= device_count() {
            return Err(code::INVALID_DEVICE);
        }
        // SAFETY: out-parameter.
        unsafe { put(dev, ordinal) }
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetAttribute(v: *mut c_int, attr: c_int, dev: c_int) -> i32 {
    status(ready().and_then(|_| {
        if dev < 0 || dev >= device_count() {
            return Err(code::INVALID_DEVICE);
        }
        let value = match attr {
            16 => 132, // multiprocessors
            41 => 1,   // unified addressing
            75 => 9,   // compute capability major
            76 => 0,   // minor
            33 => dev, // PCI bus id
            _ => 0,
        };
        // SAFETY: out-parameter.
        unsafe { put(v, value) }
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: c_int) -> i32 {
    status(ready().and_then(|_| {
        if dev < 0 || dev >= device_count() || name.is_null() || len <= 0 {
            return Err(code::INVALID_VALUE);
        }
        let text = b"strata CUDA stand-in (host memory, not a GPU)\0";
        let n = text.len().min(len as usize);
        // SAFETY: the caller's buffer holds `len` bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr().cast(), name, n);
            *name.add(n - 1) = 0;
        }
        Ok(())
    }))
}

/// The stand-in's devices sit on no PCI bus: `CUDA_ERROR_NOT_SUPPORTED`, so what looks GPUs
/// up in sysfs (the NIC nearest a GPU, GPUDirect's distance rule) finds nothing, as on a
/// machine that hides its PCI topology.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetPCIBusId(id: *mut c_char, len: c_int, dev: c_int) -> i32 {
    status(ready().and_then(|_| {
        if dev < 0 || dev >= device_count() || id.is_null() || len <= 0 {
            return Err(code::INVALID_VALUE);
        }
        Err(801)
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(ctx: *mut usize, dev: c_int) -> i32 {
    status(ready().and_then(|_| {
        if dev < 0 || dev >= device_count() {
            return Err(code::INVALID_DEVICE);
        }
        // SAFETY: out-parameter.
        unsafe { put(ctx, context_handle(dev)) }
    }))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: c_int) -> i32 {
    status(ready().and_then(|_| {
        if dev < 0 || dev >= device_count() {
            return Err(code::INVALID_DEVICE);
        }
        Ok(())
    }))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuDevicePrimaryCtxRelease(dev: c_int) -> i32 {
    cuDevicePrimaryCtxRelease_v2(dev)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSetCurrent(ctx: usize) -> i32 {
    status(ready().and_then(|_| {
        if ctx == 0 {
            CURRENT.with(|c| c.set(0));
            return Ok(());
        }
        let dev = (0..device_count())
            .find(|&d| context_handle(d) == ctx)
            .ok_or(code::INVALID_CONTEXT)?;
        CURRENT.with(|c| c.set(dev as usize + 1));
        Ok(())
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetCurrent(ctx: *mut usize) -> i32 {
    status(ready().and_then(|_| {
        let d = CURRENT.with(Cell::get);
        let v = if d == 0 {
            0
        } else {
            context_handle(d as i32 - 1)
        };
        // SAFETY: out-parameter.
        unsafe { put(ctx, v) }
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetDevice(dev: *mut c_int) -> i32 {
    // SAFETY: out-parameter.
    status(current().and_then(|d| unsafe { put(dev, d) }))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSynchronize() -> i32 {
    stats::add(stats::HOST_WAITS, 1);
    status(current().map(stream::synchronize_device))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSynchronize_v2(_ctx: usize) -> i32 {
    cuCtxSynchronize()
}

/// Peer access enabled in this process: (from device, to device).
static PEERS: std::sync::Mutex<Vec<(i32, i32)>> = std::sync::Mutex::new(Vec::new());

/// Every pair of stand-in devices can reach each other (as GPUs of one NVLink domain).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceCanAccessPeer(out: *mut c_int, dev: c_int, peer: c_int) -> i32 {
    status(ready().and_then(|_| {
        let n = device_count();
        if !(0..n).contains(&dev) || !(0..n).contains(&peer) {
            return Err(code::INVALID_DEVICE);
        }
        // SAFETY: out-parameter.
        unsafe { put(out, c_int::from(dev != peer)) }
    }))
}

/// `cuCtxEnablePeerAccess`: the current context may address `peer_ctx`'s memory. The driver's
/// errors: the context's own device (`INVALID_DEVICE`), twice (`PEER_ACCESS_ALREADY_ENABLED`),
/// flags other than 0.
#[unsafe(no_mangle)]
pub extern "C" fn cuCtxEnablePeerAccess(peer_ctx: usize, flags: c_uint) -> i32 {
    status(current().and_then(|dev| {
        if flags != 0 {
            return Err(code::INVALID_VALUE);
        }
        let peer = (0..device_count())
            .find(|&d| context_handle(d) == peer_ctx)
            .ok_or(code::INVALID_CONTEXT)?;
        if peer == dev {
            return Err(code::INVALID_DEVICE);
        }
        let mut p = PEERS.lock().unwrap_or_else(|e| e.into_inner());
        if p.contains(&(dev, peer)) {
            return Err(704); // CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED
        }
        p.push((dev, peer));
        Ok(())
    }))
}

/// `cuCtxDisablePeerAccess`.
#[unsafe(no_mangle)]
pub extern "C" fn cuCtxDisablePeerAccess(peer_ctx: usize) -> i32 {
    status(current().and_then(|dev| {
        let peer = (0..device_count())
            .find(|&d| context_handle(d) == peer_ctx)
            .ok_or(code::INVALID_CONTEXT)?;
        let mut p = PEERS.lock().unwrap_or_else(|e| e.into_inner());
        let at = p.iter().position(|&x| x == (dev, peer)).ok_or(705)?; // NOT_ENABLED
        p.remove(at);
        Ok(())
    }))
}

/// (name, description) of a result code.
fn describe(r: i32) -> Option<(&'static [u8], &'static [u8])> {
    Some(match r {
        0 => (b"CUDA_SUCCESS\0", b"no error\0"),
        1 => (b"CUDA_ERROR_INVALID_VALUE\0", b"invalid argument\0"),
        2 => (b"CUDA_ERROR_OUT_OF_MEMORY\0", b"out of memory\0"),
        3 => (b"CUDA_ERROR_NOT_INITIALIZED\0", b"initialization error\0"),
        101 => (b"CUDA_ERROR_INVALID_DEVICE\0", b"invalid device ordinal\0"),
        201 => (b"CUDA_ERROR_INVALID_CONTEXT\0", b"invalid device context\0"),
        400 => (b"CUDA_ERROR_INVALID_HANDLE\0", b"invalid resource handle\0"),
        600 => (b"CUDA_ERROR_NOT_READY\0", b"device not ready\0"),
        704 => (
            b"CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED\0",
            b"peer access is already enabled\0",
        ),
        705 => (
            b"CUDA_ERROR_PEER_ACCESS_NOT_ENABLED\0",
            b"peer access has not been enabled\0",
        ),
        800 => (b"CUDA_ERROR_NOT_PERMITTED\0", b"operation not permitted\0"),
        801 => (b"CUDA_ERROR_NOT_SUPPORTED\0", b"operation not supported\0"),
        _ => return None,
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetErrorName(r: i32, out: *mut *const c_char) -> i32 {
    match describe(r) {
        // SAFETY: out-parameter; the strings are static.
        Some((name, _)) => status(unsafe { put(out, name.as_ptr().cast()) }),
        None => code::INVALID_VALUE,
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetErrorString(r: i32, out: *mut *const c_char) -> i32 {
    match describe(r) {
        // SAFETY: out-parameter; the strings are static.
        Some((_, text)) => status(unsafe { put(out, text.as_ptr().cast()) }),
        None => code::INVALID_VALUE,
    }
}

/// The driver's private export tables: NVRTC asks for them (it loads `libcuda.so.1` when it
/// finds one) and goes on without them when the driver has none to give.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetExportTable(table: *mut *const u8, _id: *const u8) -> i32 {
    if !table.is_null() {
        // SAFETY: out-parameter.
        unsafe { table.write(std::ptr::null()) };
    }
    500 // CUDA_ERROR_NOT_FOUND
}
