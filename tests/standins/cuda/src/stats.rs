//! What a test must be able to assert about a run and cannot see from outside: payload bytes
//! that crossed host memory, host functions run, and host threads that waited on the GPU.
//! Counted per process, from `cuInit` on, and read with `strataStandinStats` (strata's
//! `gpu::standin_stats` finds it in the loaded driver; the real driver has no such symbol).

use std::ffi::c_uint;
use std::sync::atomic::{AtomicU64, Ordering};

/// Payload bytes copied from host memory into device memory (`cuMemcpyHtoD*`, and a
/// device-to-device copy whose source is device-mapped host memory).
pub(crate) const HOST_TO_DEVICE: usize = 0;
/// Payload bytes copied from device memory into host memory.
pub(crate) const DEVICE_TO_HOST: usize = 1;
/// Payload bytes copied between device allocations (local or IPC-mapped), host memory never
/// touched.
pub(crate) const DEVICE_TO_DEVICE: usize = 2;
/// Host functions run by streams (`cuLaunchHostFunc`).
pub(crate) const HOST_FUNCTIONS: usize = 3;
/// Calls in which a host thread waited for the GPU: stream, event and context
/// synchronisation, and the synchronous copies and sets.
pub(crate) const HOST_WAITS: usize = 4;
/// Polls of a stream or event (`cuStreamQuery`, `cuEventQuery`).
pub(crate) const QUERIES: usize = 5;
/// Kernels launched (`cuLaunchKernel`).
pub(crate) const LAUNCHES: usize = 6;
/// Stream memory operations enqueued: each `cuStreamWaitValue32`/`cuStreamWriteValue32`
/// counts one, and so does each `cuStreamBatchMemOp`, however many operations it carries
/// (the GPU's front end takes a batch as one command).
pub(crate) const MEMORY_OPS: usize = 7;
/// How many counters there are.
const COUNTERS: usize = 8;

static COUNTS: [AtomicU64; COUNTERS] = [const { AtomicU64::new(0) }; COUNTERS];

/// Adds `n` to counter `which`.
pub(crate) fn add(which: usize, n: u64) {
    COUNTS[which].fetch_add(n, Ordering::Relaxed);
}

/// Copies up to `n` counters, in the order of the constants above, into `out`, and returns
/// how many counters there are.
///
/// # Safety
/// `out` points to `n` writable `u64`s (or `n` is 0).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strataStandinStats(out: *mut u64, n: c_uint) -> c_uint {
    if !out.is_null() {
        for (i, c) in COUNTS.iter().enumerate().take(n as usize) {
            // SAFETY: within the caller's `n` slots.
            unsafe { out.add(i).write(c.load(Ordering::Relaxed)) };
        }
    }
    COUNTERS as c_uint
}

/// Where the driver keeps `len` bytes of this process's device memory at `ptr` (its own
/// read-write view), or null if that range is not device memory allocated here. Stand-in
/// only: what the `nvidia-peermem` kernel module does for a NIC (pin the GPU pages behind a
/// device virtual address), which the verbs stand-in calls when it emulates that module.
#[unsafe(no_mangle)]
pub extern "C" fn strataStandinDeviceAlias(ptr: u64, len: usize) -> *mut u8 {
    let t = crate::memory::table();
    match t.find(ptr, len.max(1)) {
        Some((
            start,
            crate::memory::Alloc {
                kind:
                    crate::memory::Kind::Device {
                        alias, ipc: false, ..
                    },
                ..
            },
        )) => {
            // SAFETY: within the allocation (checked by `find`).
            unsafe { alias.add((ptr - start) as usize) }
        }
        _ => std::ptr::null_mut(),
    }
}
