//! The counters of strata's CUDA driver stand-in (`tests/standins/cuda`) when it is the loaded
//! driver: payload bytes that crossed host memory, host functions run, host waits on the GPU,
//! kernels launched and stream memory operations enqueued.
//! They are logic-level facts about what a call did, never GPU speed. The real driver has no
//! such counters, and there [`standin_stats`] is `None`.

use std::ffi::c_uint;
use std::sync::OnceLock;

/// What the stand-in counted in this process since it was loaded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StandinStats {
    /// Payload bytes copied from host memory into device memory.
    pub host_to_device: u64,
    /// Payload bytes copied from device memory into host memory.
    pub device_to_host: u64,
    /// Payload bytes copied between device allocations (local or IPC-mapped).
    pub device_to_device: u64,
    /// Host functions streams ran.
    pub host_functions: u64,
    /// Calls in which a host thread waited for the GPU (stream, event or context
    /// synchronisation, synchronous copies).
    pub host_waits: u64,
    /// Polls of a stream or an event.
    pub queries: u64,
    /// Kernels launched.
    pub launches: u64,
    /// Stream memory operations enqueued, a batch (`cuStreamBatchMemOp`) counting one.
    pub memory_ops: u64,
}

impl StandinStats {
    /// Payload bytes that went through host memory, either way.
    pub fn host_bytes(&self) -> u64 {
        self.host_to_device + self.device_to_host
    }

    /// What was counted between `earlier` and `self`.
    pub fn since(&self, earlier: &StandinStats) -> StandinStats {
        StandinStats {
            host_to_device: self.host_to_device.saturating_sub(earlier.host_to_device),
            device_to_host: self.device_to_host.saturating_sub(earlier.device_to_host),
            device_to_device: self
                .device_to_device
                .saturating_sub(earlier.device_to_device),
            host_functions: self.host_functions.saturating_sub(earlier.host_functions),
            host_waits: self.host_waits.saturating_sub(earlier.host_waits),
            queries: self.queries.saturating_sub(earlier.queries),
            launches: self.launches.saturating_sub(earlier.launches),
            memory_ops: self.memory_ops.saturating_sub(earlier.memory_ops),
        }
    }
}

type StatsFn = unsafe extern "C" fn(*mut u64, c_uint) -> c_uint;

/// The stand-in's counters, if the loaded `libcuda.so.1` is the stand-in (`None` for the real
/// driver, or before the driver is loaded).
pub fn standin_stats() -> Option<StandinStats> {
    static FOUND: OnceLock<StatsFn> = OnceLock::new();
    let f = match FOUND.get() {
        Some(f) => *f,
        None => {
            // SAFETY: RTLD_NOLOAD only looks up a library already loaded (by cudarc); the
            // symbol, where present, has the stand-in's signature.
            let f = unsafe {
                let lib =
                    libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD);
                if lib.is_null() {
                    return None;
                }
                let sym = libc::dlsym(lib, c"strataStandinStats".as_ptr());
                if sym.is_null() {
                    return None;
                }
                std::mem::transmute::<*mut libc::c_void, StatsFn>(sym)
            };
            *FOUND.get_or_init(|| f)
        }
    };
    let mut c = [0u64; 8];
    // SAFETY: eight writable counters (a stand-in with fewer leaves the rest at 0).
    unsafe { f(c.as_mut_ptr(), c.len() as c_uint) };
    Some(StandinStats {
        host_to_device: c[0],
        device_to_host: c[1],
        device_to_device: c[2],
        host_functions: c[3],
        host_waits: c[4],
        queries: c[5],
        launches: c[6],
        memory_ops: c[7],
    })
}
