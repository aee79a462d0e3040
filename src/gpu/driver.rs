//! The CUDA driver, loaded at run time through cudarc's dynamic loading.
//!
//! Nothing here needs CUDA to build. The first use looks for `libcuda.so` (then `.so.1`, ...)
//! on the normal library path, calls `cuInit` and counts devices; without a driver or a device
//! every GPU entry point fails with one line that says so, and host buffers work as before.

use crate::error::{Error, Result};
use cudarc::driver::sys;
use std::ffi::{CStr, c_void};
use std::sync::{Mutex, OnceLock};

/// What the loaded driver reports.
#[derive(Clone, Debug)]
pub struct DriverInfo {
    /// `cuDriverGetVersion`, e.g. 12080 for CUDA 12.8.
    pub version: i32,
    /// Visible devices.
    pub devices: usize,
}

/// The driver, once: loaded and initialised, or why not.
fn loaded() -> &'static std::result::Result<DriverInfo, String> {
    static DRIVER: OnceLock<std::result::Result<DriverInfo, String>> = OnceLock::new();
    DRIVER.get_or_init(|| {
        if !keep_loaded(&["libcuda.so.1", "libcuda.so"]) {
            return Err("no CUDA driver (libcuda.so.1) on the library path".into());
        }
        let run = || -> Result<DriverInfo> {
            // SAFETY: plain driver calls with valid out-pointers.
            unsafe {
                check(sys::cuInit(0), "cuInit")?;
                let mut version = 0;
                check(sys::cuDriverGetVersion(&mut version), "cuDriverGetVersion")?;
                let mut devices = 0;
                check(sys::cuDeviceGetCount(&mut devices), "cuDeviceGetCount")?;
                Ok(DriverInfo {
                    version,
                    devices: devices.max(0) as usize,
                })
            }
        };
        match std::panic::catch_unwind(run) {
            Ok(Ok(info)) if info.devices == 0 => {
                Err("the CUDA driver loaded but sees no GPU".into())
            }
            Ok(Ok(info)) => Ok(info),
            Ok(Err(e)) => Err(format!("the CUDA driver failed to start: {e}")),
            Err(_) => Err("the CUDA driver lacks a function strata needs (too old?)".into()),
        }
    })
}

/// Loads the first of `names` that exists and keeps it loaded for the life of the process.
///
/// cudarc's own presence checks open the library and close it again before cudarc opens it
/// for good; strata loads it once here instead and never unloads it, so a CUDA library is
/// never unloaded and reloaded mid-process, and cudarc's later loads find it resident.
pub(crate) fn keep_loaded(names: &[&str]) -> bool {
    names.iter().any(|name| {
        let Ok(c) = std::ffi::CString::new(*name) else {
            return false;
        };
        // SAFETY: dlopen of a library name; the handle is deliberately never closed.
        !unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) }.is_null()
    })
}

/// The driver, or `Unsupported` with one line saying why the GPU path is unavailable.
pub fn driver() -> Result<&'static DriverInfo> {
    loaded()
        .as_ref()
        .map_err(|why| Error::Unsupported(format!("GPU buffers are unavailable: {why}")))
}

/// The driver if the process can use GPUs; never loads anything twice.
pub fn available() -> bool {
    loaded().is_ok()
}

/// Maps a driver result to strata's error, naming the call and the driver's own words.
pub(crate) fn check(r: sys::CUresult, what: &str) -> Result<()> {
    if r == sys::CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    let mut name: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: the driver writes a pointer to a static string (or leaves NULL).
    let found = unsafe { sys::cuGetErrorName(r, &mut name) } == sys::CUresult::CUDA_SUCCESS;
    let text = if found && !name.is_null() {
        // SAFETY: a NUL-terminated static string from the driver.
        unsafe { CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned()
    } else {
        format!("{r:?}")
    };
    Err(Error::Transport(format!("CUDA: {what} failed: {text}")))
}

/// Runs a driver call, turning a symbol the driver lacks (cudarc panics) into an error.
pub(crate) fn call(what: &str, f: impl FnOnce() -> sys::CUresult) -> Result<()> {
    driver()?;
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => check(r, what),
        Err(_) => Err(Error::Unsupported(format!(
            "the CUDA driver has no {what} (driver too old?)"
        ))),
    }
}

/// The primary context of each device, retained once for the life of the process (as the
/// CUDA runtime and PyTorch do).
fn primary_context(device: i32) -> Result<sys::CUcontext> {
    static CONTEXTS: OnceLock<Mutex<Vec<(i32, usize)>>> = OnceLock::new();
    let table = CONTEXTS.get_or_init(Default::default);
    let mut t = table.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(&(_, ctx)) = t.iter().find(|(d, _)| *d == device) {
        return Ok(ctx as sys::CUcontext);
    }
    let info = driver()?;
    if device < 0 || device as usize >= info.devices {
        return Err(Error::InvalidArgument(format!(
            "GPU {device} does not exist ({} visible)",
            info.devices
        )));
    }
    let mut dev: sys::CUdevice = 0;
    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: valid out-pointers; `device` is in range.
    call("cuDeviceGet", || unsafe {
        sys::cuDeviceGet(&mut dev, device)
    })?;
    call("cuDevicePrimaryCtxRetain", || unsafe {
        sys::cuDevicePrimaryCtxRetain(&mut ctx, dev)
    })?;
    t.push((device, ctx as usize));
    Ok(ctx)
}

/// Makes `device`'s primary context current on this thread (the driver keeps one per thread).
pub fn set_device(device: i32) -> Result<()> {
    let ctx = primary_context(device)?;
    // SAFETY: a context retained above, never released.
    call("cuCtxSetCurrent", || unsafe { sys::cuCtxSetCurrent(ctx) })
}

/// The device of this thread's current context, if one is current.
pub fn current_device() -> Result<Option<i32>> {
    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    call("cuCtxGetCurrent", || unsafe {
        sys::cuCtxGetCurrent(&mut ctx)
    })?;
    if ctx.is_null() {
        return Ok(None);
    }
    let mut dev: sys::CUdevice = 0;
    // SAFETY: valid out-pointer; a context is current.
    call("cuCtxGetDevice", || unsafe {
        sys::cuCtxGetDevice(&mut dev)
    })?;
    Ok(Some(dev))
}

/// The PCI bus id (`0000:18:00.0`) of the GPU current on this thread, if the process has
/// already loaded the driver and a context is current. Never loads the driver.
pub fn current_gpu_bus_id() -> Option<String> {
    // SAFETY: RTLD_NOLOAD only looks the library up; the reference is given back below.
    let lib = unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
    if lib.is_null() {
        return None;
    }
    // SAFETY: the handle dlopen just returned.
    unsafe { libc::dlclose(lib) };
    let dev = current_device().ok()??;
    let mut buf = [0 as std::ffi::c_char; 32];
    // SAFETY: a buffer of the length given.
    call("cuDeviceGetPCIBusId", || unsafe {
        sys::cuDeviceGetPCIBusId(buf.as_mut_ptr(), buf.len() as i32, dev)
    })
    .ok()?;
    // SAFETY: the driver wrote a NUL-terminated string.
    let id = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
    Some(strata_topology::nvml::normalize_bus_id(
        &id.to_string_lossy(),
    ))
}

/// Where a pointer lives, as the driver says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Memory {
    /// Host memory (pageable, pinned or managed): the host may read it.
    Host,
    /// Device memory of this GPU ordinal.
    Device(i32),
}

/// Asks the driver where `ptr` lives; host memory when no driver is loaded or the driver does
/// not know the address. Managed memory counts as host memory, as the host path can read it.
pub fn memory_of(ptr: *const c_void) -> Memory {
    if ptr.is_null() || !available() {
        return Memory::Host;
    }
    let attr = |a: sys::CUpointer_attribute| -> Option<u32> {
        let mut v: u32 = 0;
        // SAFETY: a 4-byte out-parameter for these attributes; the driver only inspects the
        // address.
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| unsafe {
            sys::cuPointerGetAttribute((&mut v as *mut u32).cast(), a, ptr as sys::CUdeviceptr)
        }));
        matches!(r, Ok(sys::CUresult::CUDA_SUCCESS)).then_some(v)
    };
    use sys::CUpointer_attribute::*;
    match attr(CU_POINTER_ATTRIBUTE_MEMORY_TYPE) {
        Some(t) if t == sys::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32 => {
            if attr(CU_POINTER_ATTRIBUTE_IS_MANAGED).is_some_and(|m| m != 0) {
                return Memory::Host;
            }
            let ordinal = attr(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL).unwrap_or(0);
            Memory::Device(ordinal as i32)
        }
        _ => Memory::Host,
    }
}

/// Makes a device's primary context current on this thread for as long as it lives, and puts
/// back what was current before (as NCCL sets the communicator's device for a call and
/// restores the caller's): a call on a communicator may come from any thread, current context
/// or none.
pub struct DeviceGuard {
    previous: Option<sys::CUcontext>,
}

impl DeviceGuard {
    /// `device`'s context, current until the guard drops.
    pub fn enter(device: i32) -> Result<Self> {
        let wanted = primary_context(device)?;
        let mut current: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        call("cuCtxGetCurrent", || unsafe {
            sys::cuCtxGetCurrent(&mut current)
        })?;
        if current == wanted {
            return Ok(Self { previous: None });
        }
        // SAFETY: a context retained for the life of the process.
        call("cuCtxSetCurrent", || unsafe {
            sys::cuCtxSetCurrent(wanted)
        })?;
        Ok(Self {
            previous: Some(current),
        })
    }
}

impl Drop for DeviceGuard {
    fn drop(&mut self) {
        if let Some(ctx) = self.previous {
            // SAFETY: what was current before (NULL, or a context the caller holds).
            let _ = call("cuCtxSetCurrent", || unsafe { sys::cuCtxSetCurrent(ctx) });
        }
    }
}

/// Lets the current context (`device`'s) address memory of `peer`, as ranks of one process
/// on different GPUs use each other's buffers directly. Already enabled is fine.
pub(crate) fn enable_peer_access(device: i32, peer: i32) -> Result<()> {
    if device == peer {
        return Ok(());
    }
    let ctx = primary_context(peer)?;
    let _on = DeviceGuard::enter(device)?;
    // SAFETY: a retained context; flags must be 0.
    let r = std::panic::catch_unwind(|| unsafe { sys::cuCtxEnablePeerAccess(ctx, 0) })
        .unwrap_or(sys::CUresult::CUDA_ERROR_NOT_SUPPORTED);
    if r == sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED {
        return Ok(());
    }
    check(r, "cuCtxEnablePeerAccess")
}
