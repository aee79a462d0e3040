//! Device allocations and pinned host memory.

use super::driver::{call, set_device};
use super::stream::Stream;
use crate::error::{Error, Result};
use cudarc::driver::sys;
use std::ffi::c_void;

/// A device allocation (`cuMemAlloc`) of `len` bytes on one GPU, freed on drop; or a borrowed
/// range of someone else's allocation ([`DeviceBuffer::borrowed`]), never freed.
#[derive(Debug)]
pub struct DeviceBuffer {
    ptr: u64,
    len: usize,
    device: i32,
    owned: bool,
}

// SAFETY: a device address is a number; the driver serialises what is done with it.
unsafe impl Send for DeviceBuffer {}
// SAFETY: as above; `&DeviceBuffer` only hands out the address.
unsafe impl Sync for DeviceBuffer {}

impl DeviceBuffer {
    /// Allocates `len` bytes on `device` (its primary context becomes current on this thread).
    pub fn alloc(device: i32, len: usize) -> Result<Self> {
        set_device(device)?;
        let mut ptr: sys::CUdeviceptr = 0;
        if len > 0 {
            // SAFETY: valid out-pointer.
            call("cuMemAlloc", || unsafe {
                sys::cuMemAlloc_v2(&mut ptr, len)
            })?;
        }
        Ok(Self {
            ptr,
            len,
            device,
            owned: true,
        })
    }

    /// Names `len` bytes at device address `ptr` on `device` without owning them.
    ///
    /// # Safety
    /// The range must be device memory of `device` that outlives this value and every
    /// operation enqueued on it.
    pub unsafe fn borrowed(ptr: u64, len: usize, device: i32) -> Self {
        Self {
            ptr,
            len,
            device,
            owned: false,
        }
    }

    /// Gives up ownership: the allocation stays until [`DeviceBuffer::from_raw`] takes it back.
    pub fn into_raw(self) -> u64 {
        let ptr = self.ptr;
        std::mem::forget(self);
        ptr
    }

    /// Takes back an allocation made by [`DeviceBuffer::alloc`] and given up by `into_raw`.
    ///
    /// # Safety
    /// `ptr`, `len` and `device` must be those of such an allocation, taken back once.
    pub unsafe fn from_raw(ptr: u64, len: usize, device: i32) -> Self {
        Self {
            ptr,
            len,
            device,
            owned: true,
        }
    }

    /// The device address.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// Bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The GPU ordinal it lives on.
    pub fn device(&self) -> i32 {
        self.device
    }

    /// Copies `data` into the start of the buffer, after `stream`'s earlier work, and waits.
    pub fn upload(&self, data: &[u8], stream: &Stream) -> Result<()> {
        self.fits(data.len())?;
        if data.is_empty() {
            return Ok(());
        }
        // SAFETY: `data` is host memory of its length; the buffer holds at least that many
        // bytes (checked); the copy is complete when the synchronise returns.
        call("cuMemcpyHtoDAsync", || unsafe {
            sys::cuMemcpyHtoDAsync_v2(self.ptr, data.as_ptr().cast(), data.len(), stream.raw())
        })?;
        stream.synchronize()
    }

    /// Copies the start of the buffer into `out`, after `stream`'s earlier work, and waits.
    pub fn download(&self, out: &mut [u8], stream: &Stream) -> Result<()> {
        self.fits(out.len())?;
        if out.is_empty() {
            return Ok(());
        }
        // SAFETY: as in `upload`, in the other direction.
        call("cuMemcpyDtoHAsync", || unsafe {
            sys::cuMemcpyDtoHAsync_v2(out.as_mut_ptr().cast(), self.ptr, out.len(), stream.raw())
        })?;
        stream.synchronize()
    }

    /// Exports the buffer as a dma-buf (`cuMemGetHandleForAddressRange`), for a NIC to
    /// register (GPUDirect RDMA, see `strata::rdma::DmabufRegion`): the whole buffer, its
    /// length rounded up to the host page, offset 0 at [`DeviceBuffer::ptr`].
    pub fn export_dmabuf(&self) -> Result<std::os::fd::OwnedFd> {
        use std::os::fd::FromRawFd;
        let size = self.len.max(1).next_multiple_of(4096);
        let mut fd: std::ffi::c_int = -1;
        set_device(self.device)?;
        // SAFETY: a device allocation of at least `size` bytes (allocations are granule
        // aligned); a valid out-pointer for the descriptor.
        call("cuMemGetHandleForAddressRange", || unsafe {
            sys::cuMemGetHandleForAddressRange(
                (&mut fd as *mut std::ffi::c_int).cast(),
                self.ptr,
                size,
                sys::CUmemRangeHandleType::CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD,
                0,
            )
        })?;
        if fd < 0 {
            return Err(Error::Transport(
                "cuMemGetHandleForAddressRange gave no descriptor".into(),
            ));
        }
        // SAFETY: a fresh descriptor the driver handed to this caller.
        Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
    }

    fn fits(&self, n: usize) -> Result<()> {
        if n > self.len {
            return Err(Error::InvalidArgument(format!(
                "{n} bytes do not fit a device buffer of {}",
                self.len
            )));
        }
        Ok(())
    }
}

/// Something to do with a device range just before it is freed.
pub type FreeHook = fn(*const u8, usize);

fn free_hooks() -> &'static std::sync::Mutex<Vec<FreeHook>> {
    static HOOKS: std::sync::Mutex<Vec<FreeHook>> = std::sync::Mutex::new(Vec::new());
    &HOOKS
}

/// Calls `hook` with every device range strata frees from now on, before it is freed: what
/// holds on to device memory (a NIC's registration cache) lets go of it there. The layers
/// above register; the device layer knows none of them.
pub fn on_device_free(hook: FreeHook) {
    if let Ok(mut hooks) = free_hooks().lock() {
        hooks.push(hook);
    }
}

fn run_free_hooks(ptr: *const u8, len: usize) {
    let hooks = free_hooks().lock().map(|h| h.clone()).unwrap_or_default();
    for hook in hooks {
        hook(ptr, len);
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if self.owned && self.ptr != 0 && set_device(self.device).is_ok() {
            // A registration of this memory with a NIC must not outlive it.
            run_free_hooks(self.ptr as *const u8, self.len);
            // SAFETY: allocated by cuMemAlloc in this device's primary context.
            let _ = call("cuMemFree", || unsafe { sys::cuMemFree_v2(self.ptr) });
        }
    }
}

/// A range of device memory a stream-ordered call reads and/or writes.
#[derive(Clone, Copy, Debug)]
pub struct DeviceRange {
    /// Device address.
    pub ptr: u64,
    /// Bytes.
    pub len: usize,
    /// The call reads it (copied to the host before the call runs).
    pub read: bool,
    /// The call writes it (copied back to the device after the call).
    pub write: bool,
}

/// Page-locked host memory the GPU can read and write (`cuMemHostAlloc`, portable and
/// device-mapped), freed on drop.
pub(crate) struct PinnedBuffer {
    host: *mut u8,
    len: usize,
    /// The device whose context was current when it was made (freeing needs a context).
    device: Option<i32>,
}

// SAFETY: plain host memory owned by this value.
unsafe impl Send for PinnedBuffer {}

impl PinnedBuffer {
    /// Allocates `len` (at least 1) bytes; a context must be current on this thread.
    pub(crate) fn new(len: usize) -> Result<Self> {
        let mut host: *mut c_void = std::ptr::null_mut();
        let flags = sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP;
        // SAFETY: valid out-pointer.
        call("cuMemHostAlloc", || unsafe {
            sys::cuMemHostAlloc(&mut host, len.max(1), flags)
        })?;
        Ok(Self {
            host: host.cast(),
            len: len.max(1),
            device: super::driver::current_device().ok().flatten(),
        })
    }

    /// The host address.
    pub(crate) fn as_ptr(&self) -> *mut u8 {
        self.host
    }

    /// Bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The address the GPU uses for it.
    pub(crate) fn device_ptr(&self) -> Result<u64> {
        let mut dev: sys::CUdeviceptr = 0;
        // SAFETY: the host address of a device-mapped allocation.
        call("cuMemHostGetDevicePointer", || unsafe {
            sys::cuMemHostGetDevicePointer_v2(&mut dev, self.host.cast(), 0)
        })?;
        Ok(dev)
    }
}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        if let (Ok(None), Some(d)) = (super::driver::current_device(), self.device) {
            let _ = set_device(d);
        }
        // SAFETY: allocated by cuMemHostAlloc; nothing uses it any more.
        let _ = call("cuMemFreeHost", || unsafe {
            sys::cuMemFreeHost(self.host.cast())
        });
    }
}

/// Copies `out.len()` bytes from device address `ptr` to `out` now (after the device's earlier
/// work); a context must be current on this thread.
pub fn read_device(ptr: u64, out: &mut [u8]) -> Result<()> {
    // SAFETY: `out` is host memory of its length; the driver checks `ptr`.
    call("cuMemcpyDtoH", || unsafe {
        sys::cuMemcpyDtoH_v2(out.as_mut_ptr().cast(), ptr, out.len())
    })
}
