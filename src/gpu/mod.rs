//! The device layer: the CUDA driver loaded at run time, device memory, pinned host memory,
//! streams and events, and the reduction kernels. It knows nothing of communicators; the
//! stream-ordered execution of collectives on device buffers is the communicator's
//! (`comm/device`), and what must let go of device memory before it is freed registers with
//! [`on_device_free`].

pub(crate) mod driver;
pub(crate) mod kernels;
pub(crate) mod memory;
mod standin;
pub(crate) mod stream;

/// The raw driver API (cudarc's bindings, loaded at run time), for handles strata does not wrap.
pub use cudarc::driver::sys;
pub use driver::{
    DeviceGuard, DriverInfo, Memory, available, current_device, current_gpu_bus_id, driver,
    memory_of, set_device,
};
pub use kernels::{REDUCE_SOURCE, kernel_suffix};
pub use memory::{DeviceBuffer, DeviceRange, FreeHook, on_device_free, read_device};
pub use standin::{StandinStats, standin_stats};
pub use stream::{Event, Stream};
