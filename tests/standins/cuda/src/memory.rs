//! Device allocations in their own no-access address range, pinned host memory, copies and
//! pointer attributes.

use crate::{code, current, put, ready, stats, status, stream};
use std::collections::BTreeMap;
use std::ffi::{c_int, c_uint, c_void};
use std::sync::Mutex;

/// Where device addresses start: far from the heap, the stack and libraries.
const DEVICE_BASE: u64 = 0x5a00_0000_0000;
/// Device allocations are aligned (and spaced) to this.
const GRANULE: u64 = 2 << 20;

pub(crate) enum Kind {
    /// Device memory of an ordinal: `alias` is the driver's private view of it.
    Device {
        device: i32,
        alias: *mut u8,
        fd: i32,
        /// Opened from another process's IPC handle (closed with cuIpcCloseMemHandle).
        ipc: bool,
    },
    /// Page-locked host memory; `mapped` if the device may address it.
    Host { mapped: bool, owned: bool },
}

pub(crate) struct Alloc {
    pub len: usize,
    pub kind: Kind,
}

// SAFETY: the aliases are plain mappings owned by the table.
unsafe impl Send for Alloc {}

pub(crate) struct Table {
    pub allocs: BTreeMap<u64, Alloc>,
    next: u64,
}

pub(crate) static TABLE: Mutex<Table> = Mutex::new(Table {
    allocs: BTreeMap::new(),
    next: DEVICE_BASE,
});

pub(crate) fn table() -> std::sync::MutexGuard<'static, Table> {
    TABLE.lock().unwrap_or_else(|p| p.into_inner())
}

impl Table {
    /// The allocation holding `[ptr, ptr + len)`.
    pub(crate) fn find(&self, ptr: u64, len: usize) -> Option<(u64, &Alloc)> {
        let (&start, a) = self.allocs.range(..=ptr).next_back()?;
        (ptr + len as u64 <= start + a.len as u64).then_some((start, a))
    }
}

/// Where the driver reads and writes `len` bytes the device knows as `ptr`: device memory
/// through its alias, device-mapped host memory as itself.
pub(crate) fn device_view(ptr: u64, len: usize) -> Result<*mut u8, i32> {
    let t = table();
    match t.find(ptr, len) {
        Some((start, a)) => match a.kind {
            // SAFETY: within the allocation (checked by `find`).
            Kind::Device { alias, .. } => Ok(unsafe { alias.add((ptr - start) as usize) }),
            Kind::Host { mapped: true, .. } => Ok(ptr as *mut u8),
            Kind::Host { mapped: false, .. } => Err(code::INVALID_VALUE),
        },
        None => Err(code::INVALID_VALUE),
    }
}

/// Device memory only (the device side of a copy).
fn device_only(ptr: u64, len: usize) -> Result<*mut u8, i32> {
    device_side(ptr, len).map(|(p, _)| p)
}

/// The device side of a copy, and whether it is in fact (pinned) host memory.
fn device_side(ptr: u64, len: usize) -> Result<(*mut u8, bool), i32> {
    let t = table();
    match t.find(ptr, len) {
        // SAFETY: within the allocation.
        Some((start, a)) => match a.kind {
            Kind::Device { alias, .. } => Ok((unsafe { alias.add((ptr - start) as usize) }, false)),
            Kind::Host { .. } => Ok((ptr as *mut u8, true)),
        },
        None => Err(code::INVALID_VALUE),
    }
}

/// Whether the device address `ptr` is in fact (device-mapped) host memory.
pub(crate) fn is_host(ptr: u64) -> bool {
    matches!(
        table().find(ptr, 1),
        Some((
            _,
            Alloc {
                kind: Kind::Host { .. },
                ..
            }
        ))
    )
}

/// The counters a copy adds its bytes to, by which of its sides are host memory.
fn traffic(dst_host: bool, src_host: bool) -> &'static [usize] {
    match (dst_host, src_host) {
        (false, false) => &[stats::DEVICE_TO_DEVICE],
        (false, true) => &[stats::HOST_TO_DEVICE],
        (true, false) => &[stats::DEVICE_TO_HOST],
        (true, true) => &[stats::HOST_TO_DEVICE, stats::DEVICE_TO_HOST],
    }
}

/// A host pointer of a copy: any host memory, but never a device address.
fn host_only(ptr: *const c_void, len: usize) -> Result<*mut u8, i32> {
    let p = ptr as u64;
    if ptr.is_null() && len > 0 {
        return Err(code::INVALID_VALUE);
    }
    let t = table();
    if let Some((_, a)) = t.find(p, 1)
        && matches!(a.kind, Kind::Device { .. })
    {
        return Err(code::INVALID_VALUE);
    }
    Ok(ptr as *mut u8)
}

/// Maps `len` bytes of the memory file `fd` as device memory of `device`: a no-access range
/// at the next device address, and the driver's own read-write alias. Takes `fd` (closed on
/// failure) and returns the device address.
fn map_device(fd: i32, len: usize, device: i32, ipc: bool) -> Result<u64, i32> {
    let size = (len as u64).next_multiple_of(GRANULE) as usize;
    // SAFETY: fresh mappings of a memory file this function owns.
    unsafe {
        let prot = libc::PROT_READ | libc::PROT_WRITE;
        let alias = libc::mmap(std::ptr::null_mut(), size, prot, libc::MAP_SHARED, fd, 0);
        if alias == libc::MAP_FAILED {
            libc::close(fd);
            return Err(code::OUT_OF_MEMORY);
        }
        let mut t = table();
        let addr = t.next;
        t.next += size as u64 + GRANULE; // a gap: running off the end faults
        let flags = libc::MAP_SHARED | libc::MAP_FIXED_NOREPLACE;
        let dev = libc::mmap(addr as *mut c_void, size, libc::PROT_NONE, flags, fd, 0);
        if dev != addr as *mut c_void {
            libc::munmap(alias, size);
            libc::close(fd);
            return Err(code::OUT_OF_MEMORY);
        }
        let kind = Kind::Device {
            device,
            alias: alias.cast(),
            fd,
            ipc,
        };
        t.allocs.insert(addr, Alloc { len, kind });
        Ok(addr)
    }
}

/// Undoes `map_device` for the allocation at `ptr`, which must be device memory allocated
/// here (`ipc` false) or opened from a handle (`ipc` true). Waits for every stream first when
/// `sync` (everything but a stream-ordered free, which a stream runs).
fn unmap_device(ptr: u64, ipc: bool, sync: bool) -> Result<(), i32> {
    if sync {
        stream::synchronize_all();
    }
    let mut t = table();
    match t.allocs.get(&ptr) {
        Some(Alloc {
            kind: Kind::Device { ipc: i, .. },
            ..
        }) if *i == ipc => {}
        _ => return Err(code::INVALID_VALUE),
    }
    let a = t.allocs.remove(&ptr).ok_or(code::INVALID_VALUE)?;
    if let Kind::Device { alias, fd, .. } = a.kind {
        let size = (a.len as u64).next_multiple_of(GRANULE) as usize;
        // SAFETY: the mappings and file made by map_device, used by nothing now.
        unsafe {
            libc::munmap(alias.cast(), size);
            libc::munmap(ptr as *mut c_void, size);
            libc::close(fd);
        }
    }
    Ok(())
}

/// A new device allocation of `len` bytes on `device`; its address.
fn alloc_device(len: usize, device: i32) -> Result<u64, i32> {
    if len == 0 {
        return Err(code::INVALID_VALUE);
    }
    let size = (len as u64).next_multiple_of(GRANULE);
    // SAFETY: plain system calls on a fresh file.
    let fd = unsafe { libc::memfd_create(c"strata-standin-device".as_ptr(), libc::MFD_CLOEXEC) };
    // SAFETY: as above.
    if fd < 0 || unsafe { libc::ftruncate(fd, size as i64) } != 0 {
        if fd >= 0 {
            // SAFETY: the file made above.
            unsafe { libc::close(fd) };
        }
        return Err(code::OUT_OF_MEMORY);
    }
    map_device(fd, len, device, false)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAlloc_v2(out: *mut u64, len: usize) -> i32 {
    status(current().and_then(|device| {
        if len == 0 {
            return Err(code::INVALID_VALUE);
        }
        // An allocation synchronises with every stream, as the driver's does.
        stream::synchronize_all();
        let addr = alloc_device(len, device)?;
        // SAFETY: out-parameter.
        unsafe { put(out, addr) }
    }))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemFree_v2(ptr: u64) -> i32 {
    // As cudaFree does, the device finishes the work that may still use it (unmap_device).
    status(current().and_then(|_| unmap_device(ptr, false, true)))
}

/// Stream-ordered allocation: no synchronisation with any stream (the point of it); the
/// memory is usable by work enqueued on `s` after this call.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocAsync(out: *mut u64, len: usize, s: usize) -> i32 {
    status(current().and_then(|device| {
        if out.is_null() {
            return Err(code::INVALID_VALUE);
        }
        stream::check(s)?;
        let addr = alloc_device(len, device)?;
        // SAFETY: out-parameter.
        unsafe { put(out, addr) }
    }))
}

/// Stream-ordered free: the memory goes when `s` reaches this point, without waiting now.
#[unsafe(no_mangle)]
pub extern "C" fn cuMemFreeAsync(ptr: u64, s: usize) -> i32 {
    status(current().and_then(|_| {
        match table().allocs.get(&ptr) {
            Some(Alloc {
                kind: Kind::Device { ipc: false, .. },
                ..
            }) => {}
            _ => return Err(code::INVALID_VALUE),
        }
        stream::enqueue(
            s,
            Box::new(move || {
                let _ = unmap_device(ptr, false, false);
            }),
        )
    }))
}

const HOSTALLOC_DEVICEMAP: c_uint = 2;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemHostAlloc(out: *mut *mut c_void, len: usize, flags: c_uint) -> i32 {
    status(current().and_then(|_| {
        if len == 0 || out.is_null() {
            return Err(code::INVALID_VALUE);
        }
        stream::synchronize_all();
        let prot = libc::PROT_READ | libc::PROT_WRITE;
        let flags_m = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
        // SAFETY: a fresh anonymous mapping.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, flags_m, -1, 0) };
        if p == libc::MAP_FAILED {
            return Err(code::OUT_OF_MEMORY);
        }
        table().allocs.insert(
            p as u64,
            Alloc {
                len,
                kind: Kind::Host {
                    mapped: flags & HOSTALLOC_DEVICEMAP != 0,
                    owned: true,
                },
            },
        );
        // SAFETY: out-parameter.
        unsafe { put(out, p) }
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocHost_v2(out: *mut *mut c_void, len: usize) -> i32 {
    // SAFETY: same contract.
    unsafe { cuMemHostAlloc(out, len, 0) }
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemFreeHost(p: *mut c_void) -> i32 {
    status(current().and_then(|_| {
        stream::synchronize_all();
        let mut t = table();
        match t.allocs.get(&(p as u64)) {
            Some(Alloc {
                kind: Kind::Host { owned: true, .. },
                len,
            }) => {
                let len = *len;
                t.allocs.remove(&(p as u64));
                // SAFETY: the mapping made by cuMemHostAlloc.
                unsafe { libc::munmap(p, len) };
                Ok(())
            }
            _ => Err(code::INVALID_VALUE),
        }
    }))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemHostRegister_v2(p: *mut c_void, len: usize, _flags: c_uint) -> i32 {
    status(current().and_then(|_| {
        if p.is_null() || len == 0 {
            return Err(code::INVALID_VALUE);
        }
        let mut t = table();
        if t.find(p as u64, 1).is_some() {
            return Err(712); // CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED
        }
        t.allocs.insert(
            p as u64,
            Alloc {
                len,
                kind: Kind::Host {
                    mapped: true,
                    owned: false,
                },
            },
        );
        Ok(())
    }))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemHostUnregister(p: *mut c_void) -> i32 {
    status(current().and_then(|_| {
        let mut t = table();
        match t.allocs.get(&(p as u64)) {
            Some(Alloc {
                kind: Kind::Host { owned: false, .. },
                ..
            }) => {
                t.allocs.remove(&(p as u64));
                Ok(())
            }
            _ => Err(713), // CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED
        }
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemHostGetDevicePointer_v2(
    out: *mut u64,
    p: *mut c_void,
    flags: c_uint,
) -> i32 {
    status(current().and_then(|_| {
        if flags != 0 {
            return Err(code::INVALID_VALUE);
        }
        match table().find(p as u64, 1) {
            // SAFETY: out-parameter.
            Some((
                _,
                Alloc {
                    kind: Kind::Host { mapped: true, .. },
                    ..
                },
            )) => unsafe { put(out, p as u64) },
            _ => Err(code::INVALID_VALUE),
        }
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuPointerGetAttribute(data: *mut c_void, attr: c_int, ptr: u64) -> i32 {
    status(ready().and_then(|_| {
        let t = table();
        let (_, a) = t.find(ptr, 1).ok_or(code::INVALID_VALUE)?;
        let (memory_type, device) = match a.kind {
            Kind::Device { device, .. } => (2u32, device),
            Kind::Host { .. } => (1u32, 0),
        };
        let out = data as *mut u32;
        // SAFETY: out-parameters of 4 bytes for these attributes (8 for the context).
        unsafe {
            match attr {
                1 => put(data as *mut usize, 0x5c7c_0000 + device as usize * 16),
                2 => put(out, memory_type),
                3 => put(data as *mut u64, ptr),
                8 => put(out, 0),
                9 => put(out, device as u32),
                _ => Err(code::INVALID_VALUE),
            }
        }
    }))
}

/// A copy of `len` bytes between resolved views, on `stream` (0 for synchronous), counted in
/// `counters` when it runs.
fn copy(
    dst: *mut u8,
    src: *const u8,
    len: usize,
    s: usize,
    sync: bool,
    counters: &'static [usize],
) -> Result<(), i32> {
    let (d, r) = (dst as usize, src as usize);
    let op = move || {
        for &c in counters {
            stats::add(c, len as u64);
        }
        // SAFETY: both views cover `len` bytes (resolved above); device views are the
        // driver's aliases, host views the caller's memory, which it keeps valid.
        unsafe { std::ptr::copy(r as *const u8, d as *mut u8, len) }
    };
    if sync {
        stats::add(stats::HOST_WAITS, 1);
        stream::synchronize_all();
        op();
        Ok(())
    } else {
        stream::enqueue(s, Box::new(op))
    }
}

/// Whether `len` bytes at host address `ptr` are page-locked (allocated or registered with
/// the driver), as opposed to pageable memory the driver must stage.
fn pinned(ptr: *const c_void, len: usize) -> bool {
    matches!(
        table().find(ptr as u64, len.max(1)),
        Some((
            _,
            Alloc {
                kind: Kind::Host { .. },
                ..
            }
        ))
    )
}

/// `cuMemcpyHtoDAsync`. From page-locked memory the copy runs in stream order and reads the
/// source when it runs. From pageable memory the driver's rule applies ("API synchronization
/// behavior"): the source is copied into staging memory before the call returns, so the
/// caller may reuse it at once, and the transfer to the device runs in stream order.
#[unsafe(no_mangle)]
pub extern "C" fn cuMemcpyHtoDAsync_v2(dst: u64, src: *const c_void, len: usize, s: usize) -> i32 {
    status(current().and_then(|_| {
        let d = device_only(dst, len)?;
        let h = host_only(src, len)?;
        if pinned(src, len) {
            return copy(d, h, len, s, false, &[stats::HOST_TO_DEVICE]);
        }
        stream::check(s)?;
        // SAFETY: the caller's host memory of `len` bytes, read now, as the driver does.
        let staged: Vec<u8> = unsafe { std::slice::from_raw_parts(h, len) }.to_vec();
        let d = d as usize;
        stream::enqueue(
            s,
            Box::new(move || {
                stats::add(stats::HOST_TO_DEVICE, len as u64);
                // SAFETY: the device view covers `len` bytes; the staging copy is owned here.
                unsafe { std::ptr::copy_nonoverlapping(staged.as_ptr(), d as *mut u8, len) }
            }),
        )
    }))
}

/// `cuMemcpyDtoHAsync`. Into page-locked memory the copy runs in stream order and the call
/// returns at once. Into pageable memory the driver returns only once the copy is done (after
/// the stream's earlier work), which is what client code that reads the result right after
/// the call relies on; that wait is a host wait.
#[unsafe(no_mangle)]
pub extern "C" fn cuMemcpyDtoHAsync_v2(dst: *mut c_void, src: u64, len: usize, s: usize) -> i32 {
    status(current().and_then(|_| {
        let (h, d) = (host_only(dst, len)?, device_only(src, len)?);
        if pinned(dst, len) {
            return copy(h, d, len, s, false, &[stats::DEVICE_TO_HOST]);
        }
        stats::add(stats::HOST_WAITS, 1);
        let (h, d) = (h as usize, d as usize);
        stream::enqueue_and_wait(
            s,
            Box::new(move || {
                stats::add(stats::DEVICE_TO_HOST, len as u64);
                // SAFETY: both views cover `len` bytes; the caller waits here, so its memory
                // stays valid.
                unsafe { std::ptr::copy(d as *const u8, h as *mut u8, len) }
            }),
        )
    }))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemcpyDtoDAsync_v2(dst: u64, src: u64, len: usize, s: usize) -> i32 {
    status(current().and_then(|_| {
        let ((d, dh), (r, rh)) = (device_side(dst, len)?, device_side(src, len)?);
        copy(d, r, len, s, false, traffic(dh, rh))
    }))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemcpyHtoD_v2(dst: u64, src: *const c_void, len: usize) -> i32 {
    status(current().and_then(|_| {
        copy(
            device_only(dst, len)?,
            host_only(src, len)?,
            len,
            0,
            true,
            &[stats::HOST_TO_DEVICE],
        )
    }))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemcpyDtoH_v2(dst: *mut c_void, src: u64, len: usize) -> i32 {
    status(current().and_then(|_| {
        copy(
            host_only(dst, len)?,
            device_only(src, len)?,
            len,
            0,
            true,
            &[stats::DEVICE_TO_HOST],
        )
    }))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemcpyDtoD_v2(dst: u64, src: u64, len: usize) -> i32 {
    status(current().and_then(|_| {
        let ((d, dh), (r, rh)) = (device_side(dst, len)?, device_side(src, len)?);
        copy(d, r, len, 0, true, traffic(dh, rh))
    }))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemsetD8Async(dst: u64, value: u8, len: usize, s: usize) -> i32 {
    status(current().and_then(|_| {
        let d = device_only(dst, len)? as usize;
        stream::enqueue(
            s,
            Box::new(move || {
                // SAFETY: the device view covers `len` bytes.
                unsafe { std::ptr::write_bytes(d as *mut u8, value, len) }
            }),
        )
    }))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemsetD8_v2(dst: u64, value: u8, len: usize) -> i32 {
    let r = cuMemsetD8Async(dst, value, len, 0);
    if r == code::SUCCESS {
        stats::add(stats::HOST_WAITS, 1);
        stream::synchronize_all();
    }
    r
}

/// `cuMemsetD32Async`: `count` 32-bit words of `value` from `dst`, which must be 4-byte
/// aligned, in stream order.
#[unsafe(no_mangle)]
pub extern "C" fn cuMemsetD32Async(dst: u64, value: u32, count: usize, s: usize) -> i32 {
    status(current().and_then(|_| {
        if !dst.is_multiple_of(4) {
            return Err(code::INVALID_VALUE);
        }
        let d = device_only(dst, count * 4)? as usize;
        stream::enqueue(
            s,
            Box::new(move || {
                // SAFETY: the device view covers `count` aligned words.
                let words = unsafe { std::slice::from_raw_parts_mut(d as *mut u32, count) };
                words.fill(value);
            }),
        )
    }))
}

/// `cuMemsetD32`: as [`cuMemsetD32Async`] on the default stream, then waits for the device.
#[unsafe(no_mangle)]
pub extern "C" fn cuMemsetD32_v2(dst: u64, value: u32, count: usize) -> i32 {
    let r = cuMemsetD32Async(dst, value, count, 0);
    if r == code::SUCCESS {
        stats::add(stats::HOST_WAITS, 1);
        stream::synchronize_all();
    }
    r
}

/// `CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD`.
const DMA_BUF_FD: c_int = 1;
/// The host page size the range must be aligned to.
const PAGE: u64 = 4096;

/// Exports device memory as a dma-buf for a NIC to register (`ibv_reg_dmabuf_mr`). The
/// driver's rules: page-aligned address and size, inside one allocation of this process, type
/// `DMA_BUF_FD`, flags 0 or `CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE`. Offset 0 of the
/// dma-buf is `dptr`. Here the dma-buf is the allocation's memory file, so the stand-in
/// exports only ranges that start an allocation (anything else is `CUDA_ERROR_NOT_SUPPORTED`,
/// never a dma-buf whose offsets would silently name other memory).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetHandleForAddressRange(
    handle: *mut c_void,
    dptr: u64,
    size: usize,
    handle_type: c_int,
    flags: u64,
) -> i32 {
    const NOT_SUPPORTED: i32 = 801;
    status(current().and_then(|_| {
        if handle.is_null() || handle_type != DMA_BUF_FD || flags > 1 || size == 0 {
            return Err(code::INVALID_VALUE);
        }
        if !dptr.is_multiple_of(PAGE) || !(size as u64).is_multiple_of(PAGE) {
            return Err(code::INVALID_VALUE);
        }
        let t = table();
        let (start, a) = t
            .allocs
            .range(..=dptr)
            .next_back()
            .ok_or(code::INVALID_VALUE)?;
        let room = (a.len as u64).next_multiple_of(GRANULE);
        let Kind::Device { fd, ipc: false, .. } = a.kind else {
            return Err(code::INVALID_VALUE);
        };
        if dptr + size as u64 > start + room {
            return Err(code::INVALID_VALUE);
        }
        if dptr != *start {
            return Err(NOT_SUPPORTED);
        }
        // SAFETY: the allocation's own memory file, duplicated for the caller to own.
        let dup = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
        if dup < 0 {
            return Err(code::OUT_OF_MEMORY);
        }
        // SAFETY: non-NULL (checked); the driver's out-parameter is an int.
        unsafe { put(handle as *mut c_int, dup) }
    }))
}

/// What a `CUipcMemHandle` (64 bytes) carries here: the exporting process, its memory file and
/// the allocation's size and device.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IpcHandle {
    magic: u64,
    pid: u64,
    fd: u64,
    len: u64,
    device: u64,
    _pad: [u64; 3],
}

const IPC_MAGIC: u64 = 0x5354_5241_5441_4950; // "STRATAIP"

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuIpcGetMemHandle(out: *mut IpcHandle, ptr: u64) -> i32 {
    status(current().and_then(|_| {
        let t = table();
        let a = t.allocs.get(&ptr).ok_or(code::INVALID_VALUE)?;
        let Kind::Device {
            device,
            fd,
            ipc: false,
            ..
        } = a.kind
        else {
            return Err(code::INVALID_VALUE);
        };
        let h = IpcHandle {
            magic: IPC_MAGIC,
            pid: std::process::id() as u64,
            fd: fd as u64,
            len: a.len as u64,
            device: device as u64,
            _pad: [0; 3],
        };
        // SAFETY: out-parameter of 64 bytes.
        unsafe { put(out, h) }
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuIpcOpenMemHandle_v2(out: *mut u64, h: IpcHandle, _flags: c_uint) -> i32 {
    status(current().and_then(|_| {
        if h.magic != IPC_MAGIC {
            return Err(code::INVALID_VALUE);
        }
        if h.pid == std::process::id() as u64 {
            return Err(code::INVALID_CONTEXT); // a process cannot open its own handle
        }
        let path = format!("/proc/{}/fd/{}\0", h.pid, h.fd);
        // SAFETY: opens the exporter's memory file by a NUL-terminated path.
        let fd = unsafe { libc::open(path.as_ptr().cast(), libc::O_RDWR | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(code::INVALID_VALUE);
        }
        let addr = map_device(fd, h.len as usize, h.device as i32, true)?;
        // SAFETY: out-parameter.
        unsafe { put(out, addr) }
    }))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuIpcCloseMemHandle(ptr: u64) -> i32 {
    status(current().and_then(|_| unmap_device(ptr, true, true)))
}
