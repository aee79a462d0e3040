//! GPU buffers: the CUDA driver loaded at run time, device memory, streams and events, and
//! the stream-ordered execution of collectives on device buffers.
//!
//! A collective on device buffers is *enqueued* on a stream, as in NCCL: the call returns at
//! once, the collective starts when the stream's earlier work is done, and the stream's later
//! work sees its result. [`queue`] says how. Two data paths: collectives among ranks of one
//! host go GPU to GPU through CUDA IPC with the reductions in GPU kernels ([`ipc`]); the
//! rest is host-staged: device → pinned host memory → strata's shared-memory or TCP
//! transports → device, in chunks whose copies overlap the transfers (`STRATA_GPU_CHUNK`,
//! default 4 MiB). `STRATA_GPU_PATH` (`auto`, `staged`, `ipc`) chooses.

mod driver;
pub mod ipc;
mod kernels;
mod memory;
pub mod queue;
mod stream;

/// The raw driver API (cudarc's bindings, loaded at run time), for handles strata does not wrap.
pub use cudarc::driver::sys;
pub use driver::{
    DriverInfo, Memory, available, current_device, current_gpu_bus_id, driver, memory_of,
    set_device,
};
pub use ipc::GpuPath;
pub use kernels::{REDUCE_SOURCE, kernel_suffix};
pub use memory::{DeviceBuffer, read_device};
pub(crate) use queue::StreamQueue;
pub use queue::{DeviceRange, DeviceWork, Staged};
pub use stream::{Event, Stream};
