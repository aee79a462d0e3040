//! Telling host buffers from GPU buffers without linking CUDA.
//!
//! This build moves host memory only. A pointer can name GPU memory only in a process that
//! has loaded the CUDA driver, so the check asks the driver the process already loaded
//! (`dlopen` with `RTLD_NOLOAD`: nothing is loaded by asking) for the pointer's memory type.
//! Without a loaded driver every pointer is host memory.

use std::ffi::{c_int, c_uint, c_void};
use std::sync::OnceLock;

/// `CUresult cuPointerGetAttribute(void* data, CUpointer_attribute attribute, CUdeviceptr ptr)`.
type PointerGetAttribute = unsafe extern "C" fn(*mut c_void, c_int, u64) -> c_int;

const CU_POINTER_ATTRIBUTE_MEMORY_TYPE: c_int = 2;
const CU_POINTER_ATTRIBUTE_IS_MANAGED: c_int = 8;
const CU_MEMORYTYPE_DEVICE: c_uint = 2;

/// The driver's `cuPointerGetAttribute`, once the process has loaded `libcuda.so.1`.
fn driver() -> Option<PointerGetAttribute> {
    static FOUND: OnceLock<PointerGetAttribute> = OnceLock::new();
    if let Some(f) = FOUND.get() {
        return Some(*f);
    }
    // SAFETY: dlopen with RTLD_NOLOAD only looks the library up; dlsym on the handle it
    // returns; the symbol has the driver API's documented signature.
    unsafe {
        let lib = libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD);
        if lib.is_null() {
            return None;
        }
        let sym = libc::dlsym(lib, c"cuPointerGetAttribute".as_ptr());
        if sym.is_null() {
            return None;
        }
        let f: PointerGetAttribute = std::mem::transmute(sym);
        Some(*FOUND.get_or_init(|| f))
    }
}

/// Whether `ptr` is GPU memory the host cannot read (managed memory is readable).
pub(crate) fn is_device(ptr: *const u8) -> bool {
    if ptr.is_null() {
        return false;
    }
    let Some(get) = driver() else { return false };
    let mut kind: c_uint = 0;
    // SAFETY: `kind` is a valid out-parameter for this attribute; the driver only inspects
    // the address.
    let r = unsafe {
        get(
            (&mut kind as *mut c_uint).cast(),
            CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
            ptr as u64,
        )
    };
    if r != 0 || kind != CU_MEMORYTYPE_DEVICE {
        // Not a CUDA allocation (pageable host memory), pinned host memory, or a driver that
        // was never initialised (then no GPU memory exists).
        return false;
    }
    let mut managed: c_uint = 0;
    // SAFETY: as above.
    let r = unsafe {
        get(
            (&mut managed as *mut c_uint).cast(),
            CU_POINTER_ATTRIBUTE_IS_MANAGED,
            ptr as u64,
        )
    };
    !(r == 0 && managed != 0)
}

/// `Ok` for host memory; for GPU memory, the message `ncclGetLastError` gives.
pub(crate) fn check_host(ptr: *const u8, what: &str) -> Result<(), String> {
    if is_device(ptr) {
        return Err(format!(
            "{what} ({ptr:p}) is GPU memory, and this strata build moves host memory only; \
             pass host (or CUDA managed) buffers, or use NVIDIA's NCCL for GPU buffers"
        ));
    }
    Ok(())
}
