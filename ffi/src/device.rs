//! Telling host buffers from GPU buffers without linking CUDA.
//!
//! A pointer can name GPU memory only in a process that has loaded the CUDA driver, so the
//! check asks the driver the process already loaded (`dlopen` with `RTLD_NOLOAD`: nothing is
//! loaded by asking) for the pointer's memory type. Without a loaded driver every pointer is
//! host memory, and a host-only program never starts CUDA.

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// How many shared objects this process has loaded so far (glibc's `dlpi_adds`): the driver
/// is looked up again only when this changes, since a `dlopen` per call would cost ~10 µs.
fn objects_loaded() -> u64 {
    unsafe extern "C" fn first(
        info: *mut libc::dl_phdr_info,
        size: usize,
        data: *mut c_void,
    ) -> c_int {
        let needed = std::mem::offset_of!(libc::dl_phdr_info, dlpi_adds) + 8;
        if size >= needed {
            // SAFETY: glibc passes a valid info of `size` bytes, which covers dlpi_adds, and
            // `data` is the u64 below.
            unsafe { *(data as *mut u64) = (*info).dlpi_adds };
        }
        1 // the first object is enough
    }
    let mut adds: u64 = u64::MAX;
    // SAFETY: the callback only reads the info it is given and writes `adds`.
    unsafe { libc::dl_iterate_phdr(Some(first), (&mut adds as *mut u64).cast()) };
    adds
}

/// Whether this process has loaded the CUDA driver (looked up again only when the process
/// has loaded new objects since the last look found none).
pub(crate) fn driver_loaded() -> bool {
    static FOUND: AtomicBool = AtomicBool::new(false);
    static LOOKED_AT: AtomicU64 = AtomicU64::new(u64::MAX);
    if FOUND.load(Ordering::Acquire) {
        return true;
    }
    let loaded = objects_loaded();
    if loaded != u64::MAX && LOOKED_AT.load(Ordering::Acquire) == loaded {
        return false; // nothing loaded since the last look found no driver
    }
    // SAFETY: dlopen with RTLD_NOLOAD only looks the library up; nothing is loaded.
    let lib = unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
    if lib.is_null() {
        LOOKED_AT.store(loaded, Ordering::Release);
        return false;
    }
    FOUND.store(true, Ordering::Release);
    true
}

/// Whether any of `buffers` is GPU memory (a call on it is then stream-ordered), as
/// `strata::gpu::memory_of` tells it, asked only once the process has loaded the driver.
pub(crate) fn any_device(buffers: &[*const u8]) -> bool {
    driver_loaded()
        && buffers.iter().any(|&p| {
            matches!(
                strata::gpu::memory_of(p.cast()),
                strata::gpu::Memory::Device(_)
            )
        })
}
