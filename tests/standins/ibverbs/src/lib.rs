//! A test-only stand-in for `libibverbs.so.1`.
//!
//! strata's verbs provider loads libibverbs with `dlopen`; with this library first on
//! `LD_LIBRARY_PATH` the same code runs between processes of one machine, so everything above
//! the NIC (queue-pair setup, the clear-to-send protocol, completions, errors) can be tested
//! without an RDMA device. Nothing it shows is NIC speed: its "wire" is a TCP connection per
//! queue pair and each write waits for its acknowledgement.
//!
//! It is strict where a real NIC is:
//! * RC queue pairs follow the verbs state machine (RESET → INIT → RTR → RTS, any → ERR),
//!   and each transition needs the attribute mask the specification lists; RoCE ports need a
//!   global route header. Sends are refused before RTS, receives before INIT;
//! * every request is checked against the registered regions: a bad local key completes with
//!   `IBV_WC_LOC_PROT_ERR`, a bad remote key or range (or a region without remote write)
//!   with `IBV_WC_REM_ACCESS_ERR` at the initiator;
//! * a write with immediate data consumes a posted receive at the target (it waits for one,
//!   as with an infinite RNR retry count) and completes there with the byte count and the
//!   immediate data;
//! * a peer that stops acknowledging (exited, or cut off) completes the request with
//!   `IBV_WC_RETRY_EXC_ERR` after the local ACK timeout (4.096 µs × 2^timeout) times the
//!   retry count plus one; after any error the QP is in the error state and everything else
//!   outstanding, and anything posted later, completes with `IBV_WC_WR_FLUSH_ERR`;
//! * completion channels signal only completions that arrive after `ibv_req_notify_cq`.
//!
//! Configuration: `STRATA_IBV_STANDIN_DEVICES` (comma-separated device names, default
//! `standin_ib0`), `STRATA_IBV_STANDIN_LINK` (`ib`, the default, or `roce`),
//! `STRATA_IBV_STANDIN_ADDR` (RoCE only: each device's IPv4 address, comma-separated, which
//! its GID carries and peers reach across network namespaces; see `wire`),
//! `STRATA_IBV_STANDIN_PEERMEM=1` (`ibv_reg_mr` takes GPU memory of the CUDA stand-in by its
//! device address, as with `nvidia-peermem` loaded; else that fails with `EFAULT`), and
//! `STRATA_IBV_STANDIN_FAULT` to inject a fault into this process's NIC: `rkey:N` corrupts the
//! remote key of its Nth RDMA write, `drop:N` stops its NIC transmitting from the Nth write on
//! (a pulled cable: the initiator sees the retry count exceeded), `qperr:N` puts the QP of its
//! Nth write into the error state (a fatal QP error: everything outstanding is flushed), and
//! `slow:MS` holds each write MS milliseconds before it leaves (a congested link; a QP
//! destroyed meanwhile flushes it unsent).

#![allow(clippy::missing_safety_doc)] // the verbs API's own contracts apply

mod qp;
mod queues;
mod wire;

use std::collections::HashMap;
use std::ffi::{CString, c_char, c_int, c_void};
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, OnceLock};
use strata_ibverbs_abi::*;

/// Sets `errno`.
pub(crate) fn set_errno(e: c_int) {
    // SAFETY: errno is thread-local.
    unsafe { *libc::__errno_location() = e };
}

/// One device of the list.
struct Device {
    name: CString,
    roce: bool,
    /// What `ibv_get_device_list` hands out (a buffer the size of the real struct).
    handle: Box<[u64; 83]>,
}

fn devices() -> &'static [Device] {
    static LIST: OnceLock<Vec<Device>> = OnceLock::new();
    LIST.get_or_init(|| {
        let names =
            std::env::var("STRATA_IBV_STANDIN_DEVICES").unwrap_or_else(|_| "standin_ib0".into());
        let roce = std::env::var("STRATA_IBV_STANDIN_LINK").is_ok_and(|v| v == "roce");
        names
            .split(',')
            .filter(|n| !n.is_empty())
            .map(|n| Device {
                name: CString::new(n).unwrap_or_default(),
                roce,
                handle: Box::new([0; 83]),
            })
            .collect()
    })
}

fn device_index(dev: *mut ibv_device) -> Option<usize> {
    devices()
        .iter()
        .position(|d| std::ptr::eq(d.handle.as_ptr() as *const ibv_device, dev))
}

/// An open device: the ABI struct first, so the pointer strata holds is this.
#[repr(C)]
pub(crate) struct Context {
    abi: ibv_context,
    pub device: usize,
    pub roce: bool,
    /// This port's LID (unique in its network namespace while the context is open).
    pub lid: u16,
    /// The address the NIC listens on (its IPv4-mapped GID).
    pub ip: Ipv4Addr,
    pub nic: wire::Nic,
}

/// A registered region.
#[derive(Clone, Copy)]
pub(crate) struct Region {
    /// The address requests name (the virtual address, or the dma-buf's IOVA).
    pub iova: u64,
    pub len: u64,
    /// Where the bytes are in this process.
    pub host: usize,
    pub access: c_int,
    pub pd: usize,
}

/// Every registered region of the process, by key (lkey = rkey here).
pub(crate) fn regions() -> &'static Mutex<HashMap<u32, Region>> {
    static MAP: OnceLock<Mutex<HashMap<u32, Region>>> = OnceLock::new();
    MAP.get_or_init(Default::default)
}

impl Region {
    /// Where `[addr, addr + len)` is in this process, if the region holds it.
    pub fn host_range(&self, addr: u64, len: u64) -> Option<usize> {
        let end = addr.checked_add(len)?;
        (addr >= self.iova && end <= self.iova + self.len)
            .then(|| self.host + (addr - self.iova) as usize)
    }
}

static NEXT_KEY: AtomicU32 = AtomicU32::new(0x1000);

/// Where the device a GID of this stand-in names listens: the IPv4 address of an
/// IPv4-mapped GID, else the loopback address of the LID in a link-local GID's last two bytes.
pub(crate) fn address_of_gid(gid: &ibv_gid) -> Option<Ipv4Addr> {
    let r = &gid.raw;
    if r[..12] == [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff] {
        return Some(Ipv4Addr::new(r[12], r[13], r[14], r[15]));
    }
    let lid = u16::from_be_bytes([r[14], r[15]]);
    (r[..2] == [0xfe, 0x80] && lid != 0).then(|| wire::lid_address(lid))
}

/// GID `index` of a device with this LID and address: 0 link-local (the LID in its last two
/// bytes), 1 IPv4-mapped (RoCE v2 style, `::ffff:a.b.c.d`).
fn gid_of(lid: u16, ip: Ipv4Addr, index: c_int) -> ibv_gid {
    let mut raw = [0u8; 16];
    if index == 0 {
        raw[0] = 0xfe;
        raw[1] = 0x80;
        raw[8..14].copy_from_slice(b"strata");
        raw[14..16].copy_from_slice(&lid.to_be_bytes());
    } else {
        raw[10] = 0xff;
        raw[11] = 0xff;
        raw[12..16].copy_from_slice(&ip.octets());
    }
    ibv_gid { raw }
}

/// The address `STRATA_IBV_STANDIN_ADDR` gives device `index` (RoCE links only), or why it
/// is unusable.
fn configured_address(index: usize, roce: bool) -> Result<Option<Ipv4Addr>, c_int> {
    let Ok(list) = std::env::var("STRATA_IBV_STANDIN_ADDR") else {
        return Ok(None);
    };
    if !roce {
        // An InfiniBand LID is routed inside its subnet only.
        return Err(libc::EINVAL);
    }
    match list.split(',').map(str::trim).nth(index) {
        Some(a) => a.parse().map(Some).map_err(|_| libc::EINVAL),
        None => Err(libc::ENODEV),
    }
}

// ---- the exported calls ------------------------------------------------------------------

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_get_device_list(num: *mut c_int) -> *mut *mut ibv_device {
    let list: Vec<*mut ibv_device> = devices()
        .iter()
        .map(|d| d.handle.as_ptr() as *mut ibv_device)
        .chain(std::iter::once(std::ptr::null_mut()))
        .collect();
    if !num.is_null() {
        // SAFETY: the caller's out-parameter.
        unsafe { *num = list.len() as c_int - 1 };
    }
    Box::into_raw(list.into_boxed_slice()) as *mut *mut ibv_device
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_free_device_list(list: *mut *mut ibv_device) {
    if list.is_null() {
        return;
    }
    let n = devices().len() + 1;
    // SAFETY: made by ibv_get_device_list with this length.
    drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(list, n)) });
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_get_device_name(dev: *mut ibv_device) -> *const c_char {
    match device_index(dev) {
        Some(i) => devices()[i].name.as_ptr(),
        None => std::ptr::null(),
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_open_device(dev: *mut ibv_device) -> *mut ibv_context {
    let Some(device) = device_index(dev) else {
        set_errno(libc::ENODEV);
        return std::ptr::null_mut();
    };
    let roce = devices()[device].roce;
    let addr = match configured_address(device, roce) {
        Ok(a) => a,
        Err(e) => {
            set_errno(e);
            return std::ptr::null_mut();
        }
    };
    let (lid, ip, nic) = match wire::Nic::start(addr) {
        Ok(n) => n,
        Err(e) => {
            set_errno(e.raw_os_error().unwrap_or(libc::EIO));
            return std::ptr::null_mut();
        }
    };
    let ops = ContextOps {
        _compat_head: [std::ptr::null_mut(); 11],
        poll_cq: Some(queues::poll_cq),
        req_notify_cq: Some(queues::req_notify_cq),
        _compat_mid: [std::ptr::null_mut(); 12],
        post_send: Some(qp::post_send),
        post_recv: Some(qp::post_recv),
        _compat_tail: [std::ptr::null_mut(); 5],
    };
    let ctx = Box::new(Context {
        abi: ibv_context {
            device: dev,
            ops,
            cmd_fd: -1,
            async_fd: -1,
            num_comp_vectors: 1,
            _private: [0; 6],
        },
        device,
        roce,
        lid,
        ip,
        nic,
    });
    Box::into_raw(ctx) as *mut ibv_context
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_close_device(ctx: *mut ibv_context) -> c_int {
    if ctx.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: made by ibv_open_device.
    let ctx = unsafe { Box::from_raw(ctx as *mut Context) };
    ctx.nic.stop();
    0
}

/// The context behind a pointer strata passes.
pub(crate) fn context<'a>(ctx: *mut ibv_context) -> Option<&'a Context> {
    // SAFETY: every context pointer strata holds came from ibv_open_device.
    (!ctx.is_null()).then(|| unsafe { &*(ctx as *const Context) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_query_port(
    ctx: *mut ibv_context,
    port: u8,
    attr: *mut ibv_port_attr,
) -> c_int {
    let Some(c) = context(ctx) else {
        return libc::EINVAL;
    };
    if port != 1 || attr.is_null() {
        return libc::EINVAL;
    }
    let a = ibv_port_attr {
        state: PORT_ACTIVE,
        max_mtu: MTU_4096,
        active_mtu: if c.roce { 3 } else { MTU_4096 },
        gid_tbl_len: 2,
        max_msg_sz: 1 << 30,
        pkey_tbl_len: 1,
        lid: if c.roce { 0 } else { c.lid },
        link_layer: if c.roce {
            LINK_LAYER_ETHERNET
        } else {
            LINK_LAYER_INFINIBAND
        },
        ..Default::default()
    };
    // SAFETY: the caller's out-parameter (the compatibility layout ends before `flags`).
    unsafe { std::ptr::copy_nonoverlapping(&a as *const _ as *const u8, attr as *mut u8, 48) };
    0
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_query_gid(
    ctx: *mut ibv_context,
    port: u8,
    index: c_int,
    gid: *mut ibv_gid,
) -> c_int {
    let Some(c) = context(ctx) else {
        return -1;
    };
    if port != 1 || !(0..2).contains(&index) || gid.is_null() {
        return -1;
    }
    // SAFETY: the caller's out-parameter.
    unsafe { *gid = gid_of(c.lid, c.ip, index) };
    0
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_alloc_pd(ctx: *mut ibv_context) -> *mut ibv_pd {
    if context(ctx).is_none() {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    }
    Box::into_raw(Box::new(ibv_pd {
        context: ctx,
        handle: NEXT_KEY.fetch_add(1, Ordering::Relaxed),
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int {
    if pd.is_null() {
        return libc::EINVAL;
    }
    let busy = regions()
        .lock()
        .map(|r| r.values().any(|m| m.pd == pd as usize))
        .unwrap_or(true);
    if busy || qp::any_on_pd(pd as usize) {
        // Real verbs refuse to free a PD that still has regions or QPs.
        return libc::EBUSY;
    }
    // SAFETY: made by ibv_alloc_pd.
    drop(unsafe { Box::from_raw(pd) });
    0
}

fn register(pd: *mut ibv_pd, iova: u64, len: usize, host: usize, access: c_int) -> *mut ibv_mr {
    if pd.is_null() || host == 0 || len == 0 {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    }
    // Remote write needs local write, as in the specification.
    if access & access::REMOTE_WRITE != 0 && access & access::LOCAL_WRITE == 0 {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    }
    let key = NEXT_KEY.fetch_add(1, Ordering::Relaxed);
    let Ok(mut map) = regions().lock() else {
        set_errno(libc::EIO);
        return std::ptr::null_mut();
    };
    map.insert(
        key,
        Region {
            iova,
            len: len as u64,
            host,
            access,
            pd: pd as usize,
        },
    );
    // SAFETY: a valid PD from ibv_alloc_pd.
    let context = unsafe { (*pd).context };
    Box::into_raw(Box::new(ibv_mr {
        context,
        pd,
        addr: iova as *mut c_void,
        length: len,
        handle: key,
        lkey: key,
        rkey: key,
    }))
}

/// The CUDA driver stand-in's view of a device range, if that stand-in is loaded.
type DeviceAlias = unsafe extern "C" fn(u64, usize) -> *mut u8;

fn device_alias() -> Option<DeviceAlias> {
    static F: OnceLock<DeviceAlias> = OnceLock::new();
    if let Some(f) = F.get() {
        return Some(*f);
    }
    // The driver is loaded with its symbols local to it: look it up by name, without loading
    // it (a process without it has no GPU memory to register).
    // SAFETY: RTLD_NOLOAD only finds an already loaded library; the handle stays valid while
    // it is loaded, which a driver is for the life of the process.
    let lib = unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
    if lib.is_null() {
        return None;
    }
    // SAFETY: a symbol of the loaded library.
    let f = unsafe { libc::dlsym(lib, c"strataStandinDeviceAlias".as_ptr()) };
    if f.is_null() {
        return None;
    }
    // SAFETY: the CUDA stand-in exports it with this signature.
    let f = unsafe { std::mem::transmute::<*mut c_void, DeviceAlias>(f) };
    Some(*F.get_or_init(|| f))
}

/// Registers host memory, or, as with `nvidia-peermem` loaded, GPU memory by its device
/// virtual address. GPU memory without that module (`STRATA_IBV_STANDIN_PEERMEM=1` emulates
/// it) fails with `EFAULT`, as the kernel cannot pin pages it does not know.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    access: c_int,
) -> *mut ibv_mr {
    // SAFETY: the CUDA stand-in's lookup only reads its allocation table.
    let alias = device_alias().map_or(std::ptr::null_mut(), |f| unsafe { f(addr as u64, len) });
    if alias.is_null() {
        return register(pd, addr as u64, len, addr as usize, access);
    }
    if std::env::var("STRATA_IBV_STANDIN_PEERMEM").is_ok_and(|v| v == "1") {
        return register(pd, addr as u64, len, alias as usize, access);
    }
    set_errno(libc::EFAULT);
    std::ptr::null_mut()
}

/// Registers `len` bytes at `offset` of a dma-buf (here: any mappable descriptor, such as a
/// memfd standing in for GPU memory), addressed by requests as `iova`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_reg_dmabuf_mr(
    pd: *mut ibv_pd,
    offset: u64,
    len: usize,
    iova: u64,
    fd: c_int,
    access: c_int,
) -> *mut ibv_mr {
    // SAFETY: mapping a caller's descriptor; failure is reported, not dereferenced.
    let host = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            offset as libc::off_t,
        )
    };
    if host == libc::MAP_FAILED {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    }
    register(pd, iova, len, host as usize, access)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int {
    if mr.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: made by register.
    let mr = unsafe { Box::from_raw(mr) };
    let removed = regions().lock().ok().and_then(|mut m| m.remove(&mr.lkey));
    match removed {
        Some(r) => {
            if r.host != r.iova as usize {
                // SAFETY: mapped by ibv_reg_dmabuf_mr with this length.
                unsafe { libc::munmap(r.host as *mut c_void, r.len as usize) };
            }
            0
        }
        None => libc::EINVAL,
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_wc_status_str(status: u32) -> *const c_char {
    const TEXT: [&std::ffi::CStr; 22] = [
        c"success",
        c"local length error",
        c"local QP operation error",
        c"local EE context operation error",
        c"local protection error",
        c"Work Request Flushed Error",
        c"memory management operation error",
        c"bad response error",
        c"local access error",
        c"remote invalid request error",
        c"remote access error",
        c"remote operation error",
        c"transport retry counter exceeded",
        c"RNR retry counter exceeded",
        c"local RDD violation error",
        c"remote invalid RD request",
        c"aborted error",
        c"invalid EE context number",
        c"invalid EE context state",
        c"fatal error",
        c"response timeout error",
        c"general error",
    ];
    TEXT.get(status as usize)
        .copied()
        .unwrap_or(c"unknown")
        .as_ptr()
}
