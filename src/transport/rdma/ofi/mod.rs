//! The libfabric provider: `libfabric.so.1` loaded at run time, reliable-datagram endpoints (one
//! per lane) on one completion queue and address vector per connection, RMA writes with remote
//! CQ data. It runs over whatever provider libfabric offers: EFA, cxi (Slingshot), verbs, and
//! on a plain machine `tcp;ofi_rxm`, which is how CI runs the RDMA protocol for real.
//!
//! Provider quirks are honoured from `fi_info`: `FI_CONTEXT`/`FI_CONTEXT2` (each operation gets
//! its own context memory), `FI_RX_CQ_DATA` (remote CQ data consumes a posted receive),
//! `FI_MR_LOCAL` (descriptors are passed), `FI_MR_VIRT_ADDR` (remote addresses are virtual, else
//! offsets), `FI_MR_PROV_KEY` (keys come from the provider, else strata picks them).

mod sys;

use super::regcache::RegCache;
use super::{
    Armed, Completion, Fabric, Link, ProviderKind, RdmaConfig, Region, Write, dl::Library,
};
use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

struct Api {
    getinfo: sys::GetInfo,
    freeinfo: sys::FreeInfo,
    dupinfo: sys::DupInfo,
    fabric: sys::Fabric,
    strerror: sys::StrError,
}

fn api() -> Result<&'static Api, String> {
    static API: OnceLock<Result<Api, String>> = OnceLock::new();
    API.get_or_init(|| {
        let lib = Library::open(&["libfabric.so.1"])?;
        // SAFETY: each name is resolved with its declared type.
        let api = unsafe {
            Api {
                getinfo: lib.get("fi_getinfo")?,
                freeinfo: lib.get("fi_freeinfo")?,
                dupinfo: lib.get("fi_dupinfo")?,
                fabric: lib.get("fi_fabric")?,
                strerror: lib.get("fi_strerror")?,
            }
        };
        std::mem::forget(lib);
        Ok(api)
    })
    .as_ref()
    .map_err(Clone::clone)
}

fn cstr(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: a NUL-terminated string from libfabric.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

fn fi_err(api: &Api, what: &str, r: isize) -> io::Error {
    io::Error::other(format!(
        "{what}: {} ({r})",
        cstr(unsafe { (api.strerror)((-r) as c_int) })
    ))
}

/// A provider and domain as `collbench topo` lists them.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ProviderInfo {
    /// Provider (`efa`, `tcp;ofi_rxm`).
    pub provider: String,
    /// Domain (`rdmap0s6-rdm`, `eth0`).
    pub domain: String,
    /// Whether it is hardware (not tcp, udp, sockets, shm).
    pub hardware: bool,
}

fn is_hardware(prov: &str) -> bool {
    let first = prov.split(';').next().unwrap_or("");
    !matches!(first, "tcp" | "udp" | "sockets" | "shm" | "net" | "sm2")
}

/// The reliable-datagram providers with RMA and remote CQ data that libfabric offers here
/// (`provider` narrows them, like `FI_PROVIDER`).
pub fn providers(provider: Option<&str>) -> Result<Vec<ProviderInfo>, String> {
    let api = api()?;
    let list = getinfo(api, provider, 0)?;
    let mut out = Vec::new();
    let mut p = list;
    while !p.is_null() {
        // SAFETY: a list from fi_getinfo, freed below.
        let i = unsafe { &*p };
        let (prov, dom) = names(i);
        if !out
            .iter()
            .any(|o: &ProviderInfo| o.provider == prov && o.domain == dom)
        {
            out.push(ProviderInfo {
                hardware: is_hardware(&prov),
                provider: prov,
                domain: dom,
            });
        }
        p = i.next;
    }
    // SAFETY: the list from fi_getinfo.
    unsafe { (api.freeinfo)(list) };
    Ok(out)
}

/// `fi_getinfo` with strata's needs as hints, and `tx_op_flags` as the endpoints' default
/// transmit flags; the caller frees the list.
fn getinfo(
    api: &Api,
    provider: Option<&str>,
    tx_op_flags: u64,
) -> Result<*mut sys::fi_info, String> {
    // SAFETY: fi_dupinfo(NULL) allocates a zeroed fi_info with its attribute blocks.
    let hints = unsafe { (api.dupinfo)(std::ptr::null()) };
    if hints.is_null() {
        return Err("fi_allocinfo failed".into());
    }
    // SAFETY: hints and its attribute blocks were allocated by libfabric; strings handed to
    // it are malloc'd, as fi_freeinfo frees them.
    unsafe {
        let h = &mut *hints;
        h.caps = sys::FI_MSG
            | sys::FI_RMA
            | sys::FI_WRITE
            | sys::FI_REMOTE_WRITE
            | sys::FI_SEND
            | sys::FI_RECV;
        h.mode = sys::FI_CONTEXT | sys::FI_CONTEXT2 | sys::FI_RX_CQ_DATA;
        (*h.ep_attr).ep_type = sys::FI_EP_RDM;
        (*h.tx_attr).op_flags = tx_op_flags;
        (*h.domain_attr).mr_mode =
            sys::FI_MR_LOCAL | sys::FI_MR_VIRT_ADDR | sys::FI_MR_ALLOCATED | sys::FI_MR_PROV_KEY;
        if let Some(p) = provider {
            let c = CString::new(p).map_err(|e| e.to_string())?;
            (*h.fabric_attr).prov_name = libc::strdup(c.as_ptr());
        }
    }
    let mut info: *mut sys::fi_info = std::ptr::null_mut();
    // SAFETY: valid hints and out-parameter.
    let r = unsafe {
        (api.getinfo)(
            sys::API_VERSION,
            std::ptr::null(),
            std::ptr::null(),
            0,
            hints,
            &mut info,
        )
    };
    // SAFETY: allocated above.
    unsafe { (api.freeinfo)(hints) };
    if r != 0 || info.is_null() {
        return Err(format!(
            "no libfabric provider{} offers reliable datagrams with RMA and remote CQ data ({})",
            provider.map(|p| format!(" named {p}")).unwrap_or_default(),
            cstr(unsafe { (api.strerror)(-r) })
        ));
    }
    Ok(info)
}

/// A provider's fabric and domain, opened once per process.
pub(crate) struct OfiFabric {
    api: &'static Api,
    info: usize,
    fabric: usize,
    domain: usize,
    mr_mode: c_int,
    mode: u64,
    device: String,
    hardware: bool,
    next_key: AtomicU64,
    cache: Arc<RegCache<usize>>,
}

// SAFETY: the domain is opened with the provider's threading level and used under its rules:
// registration through the cache's lock, each endpoint by one thread at a time.
unsafe impl Send for OfiFabric {}
// SAFETY: as above.
unsafe impl Sync for OfiFabric {}

/// The fabric, or one line saying why libfabric cannot be used.
pub(crate) fn open(cfg: &RdmaConfig) -> Result<Arc<OfiFabric>, String> {
    static FABRIC: OnceLock<Result<Arc<OfiFabric>, String>> = OnceLock::new();
    FABRIC
        .get_or_init(|| open_uncached(cfg).map(Arc::new))
        .clone()
}

/// An entry's provider and domain names.
fn names(i: &sys::fi_info) -> (String, String) {
    // SAFETY: an entry from fi_getinfo, whose attribute blocks and names libfabric filled.
    unsafe {
        (
            cstr((*i.fabric_attr).prov_name),
            cstr((*i.domain_attr).name),
        )
    }
}

/// The entry of `list` that carries 4 bytes of remote CQ data, the one on the domain named
/// `domain` where there is one, else the first; null if none.
fn choose(list: *mut sys::fi_info, domain: Option<&str>) -> *mut sys::fi_info {
    let mut chosen: *mut sys::fi_info = std::ptr::null_mut();
    let mut p = list;
    while !p.is_null() {
        // SAFETY: an entry of the list.
        let i = unsafe { &*p };
        // SAFETY: as above.
        let data = unsafe { (*i.domain_attr).cq_data_size };
        let here = domain.is_some() && domain == Some(names(i).1.as_str());
        if data >= 4 && (chosen.is_null() || here) {
            chosen = p;
            if here {
                break;
            }
        }
        p = i.next;
    }
    chosen
}

/// The chosen provider and domain asked for again with writes that complete only once
/// delivered into the peer's memory (`FI_DELIVERY_COMPLETE`), as an RC queue pair's do: a
/// transmit completion (libfabric's default) may come while the data still sits in the
/// sender's socket, and a rank that destroys its communicator then loses it. A duplicate of
/// that entry, or null where the provider cannot deliver so (the caller then keeps its
/// default). Asked apart from the listing, so that a provider without it is still found.
fn delivering(api: &Api, chosen: &sys::fi_info) -> *mut sys::fi_info {
    let (prov, dom) = names(chosen);
    let Ok(list) = getinfo(api, Some(&prov), sys::FI_DELIVERY_COMPLETE) else {
        return std::ptr::null_mut();
    };
    let mut p = list;
    let mut out = std::ptr::null_mut();
    while !p.is_null() {
        // SAFETY: an entry of the list.
        let i = unsafe { &*p };
        let (p_name, d_name) = names(i);
        // SAFETY: as above.
        if p_name == prov && d_name == dom && unsafe { (*i.domain_attr).cq_data_size } >= 4 {
            // SAFETY: duplicating one entry (fi_dupinfo copies only the entry).
            out = unsafe { (api.dupinfo)(p) };
            break;
        }
        p = i.next;
    }
    // SAFETY: the list from fi_getinfo.
    unsafe { (api.freeinfo)(list) };
    out
}

fn open_uncached(cfg: &RdmaConfig) -> Result<OfiFabric, String> {
    let api = api()?;
    let list = getinfo(api, cfg.ofi_provider.as_deref(), 0)?;
    let chosen = choose(list, cfg.interface.as_deref());
    if chosen.is_null() {
        // SAFETY: the list from fi_getinfo.
        unsafe { (api.freeinfo)(list) };
        return Err("no provider carries 4 bytes of remote CQ data".into());
    }
    // SAFETY: an entry of the list, still alive.
    let mut info = delivering(api, unsafe { &*chosen });
    let delivered = !info.is_null();
    if !delivered {
        // SAFETY: duplicating one entry (fi_dupinfo copies only the entry).
        info = unsafe { (api.dupinfo)(chosen) };
    }
    // SAFETY: the list from fi_getinfo; `info` is a copy.
    unsafe { (api.freeinfo)(list) };
    if info.is_null() {
        return Err("fi_dupinfo failed".into());
    }
    // SAFETY: a valid fi_info from fi_dupinfo.
    let i = unsafe { &*info };
    let (prov, dom) = names(i);
    let mut fabric: *mut sys::fid_fabric = std::ptr::null_mut();
    // SAFETY: the entry's fabric attributes and an out-parameter.
    let r = unsafe { (api.fabric)(i.fabric_attr, &mut fabric, std::ptr::null_mut()) };
    if r != 0 {
        return Err(format!(
            "fi_fabric({prov}): {}",
            cstr(unsafe { (api.strerror)(-r) })
        ));
    }
    let mut domain: *mut sys::fid_domain = std::ptr::null_mut();
    // SAFETY: an open fabric, its info, and an out-parameter (fi_domain is inline: ops->domain).
    let r = unsafe { ((*(*fabric).ops).domain)(fabric, info, &mut domain, std::ptr::null_mut()) };
    if r != 0 {
        return Err(format!(
            "fi_domain({prov} {dom}): {}",
            cstr(unsafe { (api.strerror)(-r) })
        ));
    }
    // SAFETY: as above.
    let mr_mode = unsafe { (*i.domain_attr).mr_mode };
    Ok(OfiFabric {
        api,
        info: info as usize,
        fabric: fabric as usize,
        domain: domain as usize,
        mr_mode,
        mode: i.mode,
        hardware: is_hardware(&prov),
        device: if delivered {
            format!("{prov} on {dom}")
        } else {
            format!("{prov} on {dom} (writes complete when sent, not when delivered)")
        },
        next_key: AtomicU64::new(1),
        // SAFETY: each handle is an fid_mr this cache registered.
        cache: RegCache::new(|mr: usize| unsafe {
            close_fid(mr as *mut sys::fid);
        }),
    })
}

/// `fi_close`.
unsafe fn close_fid(f: *mut sys::fid) {
    if !f.is_null() {
        // SAFETY: an open fid; close is its table's first call.
        unsafe { ((*(*f).ops).close)(f) };
    }
}

impl OfiFabric {
    /// Whether the provider is hardware (EFA, cxi, verbs, ...), which `auto` prefers to TCP.
    pub(crate) fn hardware(&self) -> bool {
        self.hardware
    }

    fn domain(&self) -> *mut sys::fid_domain {
        self.domain as *mut sys::fid_domain
    }
}

impl Fabric for OfiFabric {
    fn kind(&self) -> ProviderKind {
        ProviderKind::Ofi
    }

    fn device(&self) -> &str {
        &self.device
    }

    fn register(&self, ptr: *mut u8, len: usize) -> io::Result<Region> {
        self.cache.get(ptr, len, || {
            let key = if self.mr_mode & sys::FI_MR_PROV_KEY != 0 {
                0
            } else {
                self.next_key.fetch_add(1, Ordering::Relaxed)
            };
            let access = sys::FI_SEND | sys::FI_RECV | sys::FI_WRITE | sys::FI_REMOTE_WRITE;
            let mut mr: *mut sys::fid_mr = std::ptr::null_mut();
            let d = self.domain();
            // SAFETY: our domain (fi_mr_reg is inline: domain->mr->reg) and the caller's memory.
            let r = unsafe {
                ((*(*d).mr).reg)(
                    &mut (*d).fid,
                    ptr as *const c_void,
                    len,
                    access,
                    0,
                    key,
                    0,
                    &mut mr,
                    std::ptr::null_mut(),
                )
            };
            if r != 0 {
                return Err(fi_err(
                    self.api,
                    &format!("fi_mr_reg of {len} bytes"),
                    r as isize,
                ));
            }
            // SAFETY: a registration the provider returned.
            let (desc, rkey) = unsafe { ((*mr).mem_desc as u64, (*mr).key) };
            let remote_base = if self.mr_mode & sys::FI_MR_VIRT_ADDR != 0 {
                ptr as u64
            } else {
                0
            };
            Ok((
                Region {
                    addr: ptr as u64,
                    len,
                    local: desc,
                    rkey,
                    remote_base,
                },
                mr as usize,
            ))
        })
    }

    fn deregister(&self, region: &Region) {
        self.cache.put(region);
    }

    fn link(&self, lanes: usize, depth: usize) -> io::Result<Box<dyn Link>> {
        OfiLink::new(self, lanes, depth).map(|l| Box::new(l) as Box<dyn Link>)
    }
}

/// Context memory for one operation (`struct fi_context2` is 8 pointers).
type OpContext = [u64; 8];

/// What an operation's context stands for.
#[derive(Clone, Copy)]
enum Op {
    Free,
    Write(u64),
    Recv,
}

/// One connection: an endpoint per lane, one CQ and one AV.
struct OfiLink {
    api: &'static Api,
    fabric: *mut sys::fid_fabric,
    eps: Vec<*mut sys::fid_ep>,
    cq: *mut sys::fid_cq,
    av: *mut sys::fid_av,
    peers: Vec<u64>,
    wait_fd: Option<c_int>,
    rx_cq_data: bool,
    /// Operation contexts (stable addresses) and what each stands for.
    contexts: Box<[OpContext]>,
    ops: Vec<Op>,
    free: Vec<usize>,
    /// Receives that could not be posted yet (the provider said "try again"), per lane.
    owed_recvs: Vec<usize>,
}

// SAFETY: libfabric objects used by one thread at a time.
unsafe impl Send for OfiLink {}

impl OfiLink {
    fn new(f: &OfiFabric, lanes: usize, depth: usize) -> io::Result<Self> {
        let d = f.domain();
        let api = f.api;
        let n_ctx = lanes * depth * 2;
        let mut link = Self {
            api,
            fabric: f.fabric as *mut sys::fid_fabric,
            eps: Vec::new(),
            cq: std::ptr::null_mut(),
            av: std::ptr::null_mut(),
            peers: Vec::new(),
            wait_fd: None,
            rx_cq_data: f.mode & sys::FI_RX_CQ_DATA != 0,
            contexts: vec![[0u64; 8]; n_ctx].into_boxed_slice(),
            ops: vec![Op::Free; n_ctx],
            free: (0..n_ctx).rev().collect(),
            owed_recvs: vec![0; lanes],
        };
        for wait in [sys::FI_WAIT_FD, sys::FI_WAIT_NONE] {
            let mut attr = sys::fi_cq_attr {
                size: 2 * n_ctx,
                format: sys::FI_CQ_FORMAT_DATA,
                wait_obj: wait,
                ..Default::default()
            };
            // SAFETY: our domain (fi_cq_open is inline: domain->ops->cq_open).
            let r =
                unsafe { ((*(*d).ops).cq_open)(d, &mut attr, &mut link.cq, std::ptr::null_mut()) };
            if r == 0 {
                break;
            }
            if wait == sys::FI_WAIT_NONE {
                return Err(fi_err(api, "fi_cq_open", r as isize));
            }
        }
        let mut fd: c_int = -1;
        // SAFETY: our CQ (fi_control is inline: fid->ops->control); FI_GETWAIT writes an int.
        let r = unsafe {
            ((*(*link.cq).fid.ops).control)(
                &mut (*link.cq).fid,
                sys::FI_GETWAIT,
                &mut fd as *mut c_int as *mut c_void,
            )
        };
        if r == 0 && fd >= 0 {
            link.wait_fd = Some(fd);
        }
        let mut av_attr = sys::fi_av_attr {
            av_type: sys::FI_AV_TABLE,
            count: lanes,
            ..Default::default()
        };
        // SAFETY: our domain (fi_av_open is inline).
        let r =
            unsafe { ((*(*d).ops).av_open)(d, &mut av_attr, &mut link.av, std::ptr::null_mut()) };
        if r != 0 {
            return Err(fi_err(api, "fi_av_open", r as isize));
        }
        for _ in 0..lanes {
            let mut ep: *mut sys::fid_ep = std::ptr::null_mut();
            // SAFETY: our domain and info (fi_endpoint is inline).
            let r = unsafe {
                ((*(*d).ops).endpoint)(
                    d,
                    f.info as *mut sys::fi_info,
                    &mut ep,
                    std::ptr::null_mut(),
                )
            };
            if r != 0 {
                return Err(fi_err(api, "fi_endpoint", r as isize));
            }
            link.eps.push(ep);
            // SAFETY: binding our endpoint to our CQ and AV, then enabling it (inline calls
            // through the endpoint's fid table).
            unsafe {
                let fid = &mut (*ep).fid as *mut sys::fid;
                let ops = &*(*fid).ops;
                let r = (ops.bind)(fid, &mut (*link.cq).fid, sys::FI_SEND | sys::FI_RECV);
                if r != 0 {
                    return Err(fi_err(api, "fi_ep_bind(cq)", r as isize));
                }
                let r = (ops.bind)(fid, &mut (*link.av).fid, 0);
                if r != 0 {
                    return Err(fi_err(api, "fi_ep_bind(av)", r as isize));
                }
                let r = (ops.control)(fid, sys::FI_ENABLE, std::ptr::null_mut());
                if r != 0 {
                    return Err(fi_err(api, "fi_enable", r as isize));
                }
            }
        }
        Ok(link)
    }

    fn take_context(&mut self, op: Op) -> Option<*mut c_void> {
        let i = self.free.pop()?;
        self.ops[i] = op;
        Some(&mut self.contexts[i] as *mut OpContext as *mut c_void)
    }

    fn give_back(&mut self, i: usize) {
        self.ops[i] = Op::Free;
        self.free.push(i);
    }

    fn context_index(&self, p: usize) -> Option<usize> {
        let base = self.contexts.as_ptr() as usize;
        let size = std::mem::size_of::<OpContext>();
        (p >= base && p < base + self.contexts.len() * size && (p - base).is_multiple_of(size))
            .then(|| (p - base) / size)
    }

    /// Posts an operation standing for `op` with `post` (given the operation's context);
    /// false if there is no free context or the provider said "try again".
    fn post(
        &mut self,
        op: Op,
        what: &str,
        post: impl FnOnce(*mut c_void) -> isize,
    ) -> io::Result<bool> {
        let Some(ctx) = self.take_context(op) else {
            return Ok(false);
        };
        let r = post(ctx);
        if r == 0 {
            return Ok(true);
        }
        let i = self.context_index(ctx as usize).unwrap_or(0);
        self.give_back(i);
        if r == -sys::FI_EAGAIN {
            return Ok(false);
        }
        Err(fi_err(self.api, what, r))
    }

    /// Posts a receive for remote CQ data on `lane`; false if the provider said "try again".
    fn try_post_recv(&mut self, lane: usize) -> io::Result<bool> {
        let ep = self.eps[lane];
        self.post(Op::Recv, "fi_recv", |ctx| {
            // SAFETY: our endpoint (fi_recv is inline: ep->msg->recv); no buffer is needed for
            // remote CQ data.
            unsafe {
                ((*(*ep).msg).recv)(
                    ep,
                    std::ptr::null_mut(),
                    0,
                    std::ptr::null_mut(),
                    u64::MAX,
                    ctx,
                )
            }
        })
    }

    fn read_error(&mut self) -> io::Error {
        // SAFETY: a zeroed error entry (err_data NULL: the provider keeps its own).
        let mut e: sys::fi_cq_err_entry = unsafe { std::mem::zeroed() };
        // SAFETY: our CQ (fi_cq_readerr is inline).
        let r = unsafe { ((*(*self.cq).ops).readerr)(self.cq, &mut e, 0) };
        if r < 0 {
            return fi_err(self.api, "fi_cq_readerr", r);
        }
        let mut buf = [0 as c_char; 256];
        // SAFETY: our CQ and the entry's provider error (fi_cq_strerror is inline).
        let prov = unsafe {
            ((*(*self.cq).ops).strerror)(
                self.cq,
                e.prov_errno,
                e.err_data,
                buf.as_mut_ptr(),
                buf.len(),
            )
        };
        let what = match self.context_index(e.op_context).map(|i| self.ops[i]) {
            Some(Op::Write(_)) => "RMA write",
            Some(Op::Recv) => "receive",
            _ => "operation",
        };
        // The errno's own kind (a peer that closed its endpoint gives ENOTCONN or EPIPE),
        // which callers tell a closed connection by, as they do for sockets.
        let kind = io::Error::from_raw_os_error(e.err).kind();
        io::Error::new(
            kind,
            format!(
                "{what} failed: {} (error {}, provider error {}: {})",
                cstr(unsafe { (self.api.strerror)(e.err) }),
                e.err,
                e.prov_errno,
                cstr(prov)
            ),
        )
    }
}

impl Link for OfiLink {
    fn address(&self) -> Vec<u8> {
        let mut all: Vec<Vec<u8>> = Vec::new();
        for &ep in &self.eps {
            let mut buf = vec![0u8; 256];
            let mut len = buf.len();
            // SAFETY: our endpoint (fi_getname is inline: ep->cm->getname).
            let r = unsafe {
                ((*(*ep).cm).getname)(&mut (*ep).fid, buf.as_mut_ptr() as *mut c_void, &mut len)
            };
            buf.truncate(if r == 0 { len } else { 0 });
            all.push(buf);
        }
        serde_json::to_vec(&all).unwrap_or_default()
    }

    fn connect(&mut self, remote: &[u8]) -> io::Result<()> {
        let addrs: Vec<Vec<u8>> = serde_json::from_slice(remote).map_err(|e| {
            io::Error::new(io::ErrorKind::InvalidData, format!("peer address: {e}"))
        })?;
        if addrs.len() != self.eps.len() || addrs.iter().any(Vec::is_empty) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "peer addresses do not match the lanes",
            ));
        }
        for a in &addrs {
            let mut fi_addr: u64 = u64::MAX;
            // SAFETY: our AV (fi_av_insert is inline) and one address of the provider's format.
            let r = unsafe {
                ((*(*self.av).ops).insert)(
                    self.av,
                    a.as_ptr() as *const c_void,
                    1,
                    &mut fi_addr,
                    0,
                    std::ptr::null_mut(),
                )
            };
            if r != 1 {
                return Err(fi_err(
                    self.api,
                    "fi_av_insert",
                    if r < 0 { r as isize } else { -22 },
                ));
            }
            self.peers.push(fi_addr);
        }
        Ok(())
    }

    fn write(&mut self, w: &Write) -> io::Result<bool> {
        let (ep, peer) = (self.eps[w.lane], self.peers[w.lane]);
        let what = format!("fi_writedata on lane {}", w.lane);
        self.post(Op::Write(w.wr_id), &what, |ctx| {
            // SAFETY: our endpoint (fi_writedata is inline: ep->rma->writedata); the source
            // lies in a registered region whose descriptor is passed.
            unsafe {
                ((*(*ep).rma).writedata)(
                    ep,
                    w.src as *const c_void,
                    w.len,
                    w.region.local as *mut c_void,
                    u64::from(w.imm),
                    peer,
                    w.dst,
                    w.rkey,
                    ctx,
                )
            }
        })
    }

    fn post_recv(&mut self, lane: usize) -> io::Result<()> {
        if self.rx_cq_data && !self.try_post_recv(lane)? {
            self.owed_recvs[lane] += 1;
        }
        Ok(())
    }

    fn poll(&mut self, out: &mut Vec<Completion>) -> io::Result<()> {
        let mut buf = [sys::fi_cq_data_entry::default(); 32];
        loop {
            // SAFETY: our CQ (fi_cq_read is inline) and an array of data entries.
            let n = unsafe {
                ((*(*self.cq).ops).read)(self.cq, buf.as_mut_ptr() as *mut c_void, buf.len())
            };
            if n == -sys::FI_EAGAIN {
                break;
            }
            if n == -sys::FI_EAVAIL {
                return Err(self.read_error());
            }
            if n < 0 {
                return Err(fi_err(self.api, "fi_cq_read", n));
            }
            for e in &buf[..n as usize] {
                let op = self.context_index(e.op_context);
                if e.flags & sys::FI_REMOTE_CQ_DATA != 0 {
                    out.push(Completion::Arrived { imm: e.data as u32 });
                    if let Some(i) = op.filter(|&i| matches!(self.ops[i], Op::Recv)) {
                        self.give_back(i);
                    }
                } else if let Some(i) = op {
                    if let Op::Write(wr_id) = self.ops[i] {
                        out.push(Completion::Sent { wr_id });
                    }
                    self.give_back(i);
                }
            }
            if (n as usize) < buf.len() {
                break;
            }
        }
        for lane in 0..self.owed_recvs.len() {
            while self.owed_recvs[lane] > 0 && self.try_post_recv(lane)? {
                self.owed_recvs[lane] -= 1;
            }
        }
        Ok(())
    }

    fn arm(&mut self) -> io::Result<Armed> {
        let Some(fd) = self.wait_fd else {
            return Ok(Armed::Poll);
        };
        let mut fids = [unsafe { &mut (*self.cq).fid as *mut sys::fid }];
        // SAFETY: our fabric (fi_trywait is inline: fabric->ops->trywait) and CQ.
        let r = unsafe { ((*(*self.fabric).ops).trywait)(self.fabric, fids.as_mut_ptr(), 1) };
        Ok(if r == 0 {
            Armed::Sleep(fd)
        } else {
            Armed::Busy
        })
    }
}

impl Drop for OfiLink {
    fn drop(&mut self) {
        // SAFETY: our objects, endpoints before what they are bound to.
        unsafe {
            for &ep in &self.eps {
                close_fid(&mut (*ep).fid);
            }
            if !self.av.is_null() {
                close_fid(&mut (*self.av).fid);
            }
            if !self.cq.is_null() {
                close_fid(&mut (*self.cq).fid);
            }
        }
    }
}
