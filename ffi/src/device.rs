//! Telling host buffers from GPU buffers without linking CUDA.
//!
//! A pointer can name GPU memory only in a process that has loaded the CUDA driver, so the
//! check asks the driver the process already loaded (`dlopen` with `RTLD_NOLOAD`: nothing is
//! loaded by asking) for the pointer's memory type. Without a loaded driver every pointer is
//! host memory, and a host-only program never starts CUDA.

use std::ffi::{c_int, c_uint, c_void};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

/// `CUresult cuPointerGetAttribute(void* data, CUpointer_attribute attribute, CUdeviceptr ptr)`.
type PointerGetAttribute = unsafe extern "C" fn(*mut c_void, c_int, u64) -> c_int;

const CU_POINTER_ATTRIBUTE_MEMORY_TYPE: c_int = 2;
const CU_POINTER_ATTRIBUTE_IS_MANAGED: c_int = 8;
const CU_MEMORYTYPE_DEVICE: c_uint = 2;

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

/// The driver's `cuPointerGetAttribute`, once the process has loaded `libcuda.so.1`.
fn driver() -> Option<PointerGetAttribute> {
    static FOUND: OnceLock<PointerGetAttribute> = OnceLock::new();
    static LOOKED_AT: AtomicU64 = AtomicU64::new(u64::MAX);
    if let Some(f) = FOUND.get() {
        return Some(*f);
    }
    let loaded = objects_loaded();
    if loaded != u64::MAX && LOOKED_AT.load(Ordering::Acquire) == loaded {
        return None; // nothing loaded since the last look found no driver
    }
    let found = lookup();
    match found {
        Some(f) => Some(*FOUND.get_or_init(|| f)),
        None => {
            LOOKED_AT.store(loaded, Ordering::Release);
            None
        }
    }
}

/// `dlopen(RTLD_NOLOAD)` of the driver and its `cuPointerGetAttribute`.
fn lookup() -> Option<PointerGetAttribute> {
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
        Some(std::mem::transmute::<*mut c_void, PointerGetAttribute>(sym))
    }
}

/// Whether `ptr` is GPU memory the host cannot read (managed memory is readable), as the
/// driver's `get` says.
fn is_device(get: PointerGetAttribute, ptr: *const u8) -> bool {
    if ptr.is_null() {
        return false;
    }
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

/// Whether any of `buffers` is GPU memory (a call on it is then stream-ordered).
pub(crate) fn any_device(buffers: &[*const u8]) -> bool {
    let Some(get) = driver() else { return false };
    buffers.iter().any(|&ptr| is_device(get, ptr))
}

/// Whether this process has loaded the CUDA driver.
pub(crate) fn driver_loaded() -> bool {
    driver().is_some()
}
