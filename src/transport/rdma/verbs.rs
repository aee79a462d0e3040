//! The verbs provider: InfiniBand and RoCE through `libibverbs.so.1`, loaded at run time and
//! called through strata's own declarations (`strata-ibverbs-abi`), as NCCL's `ibvwrap` does.
//!
//! One device and port per process (the NIC its traffic leaves by when that is an RDMA device,
//! else the local rank's rail: local rank mod the usable devices, the same on every host), one
//! protection domain, reliable-connected queue pairs (one per lane) on one completion queue per
//! connection, and a completion channel to sleep on.

use super::regcache::RegCache;
use super::{Armed, Completion, Fabric, Link, ProviderKind, RdmaConfig, Region, dl::Library};
use serde::{Deserialize, Serialize};
use std::ffi::{CStr, c_int, c_void};
use std::io;
use std::os::fd::RawFd;
use std::sync::{Arc, OnceLock};
use strata_ibverbs_abi::{calls, *};

/// The calls strata makes, resolved once.
struct Api {
    get_device_list: calls::GetDeviceList,
    free_device_list: calls::FreeDeviceList,
    get_device_name: calls::GetDeviceName,
    open_device: calls::OpenDevice,
    query_port: calls::QueryPort,
    query_gid: calls::QueryGid,
    alloc_pd: calls::AllocPd,
    reg_mr: calls::RegMr,
    reg_dmabuf_mr: Option<calls::RegDmabufMr>,
    dereg_mr: calls::DeregMr,
    create_comp_channel: calls::CreateCompChannel,
    destroy_comp_channel: calls::DestroyCompChannel,
    create_cq: calls::CreateCq,
    destroy_cq: calls::DestroyCq,
    get_cq_event: calls::GetCqEvent,
    ack_cq_events: calls::AckCqEvents,
    create_qp: calls::CreateQp,
    modify_qp: calls::ModifyQp,
    destroy_qp: calls::DestroyQp,
    wc_status_str: calls::WcStatusStr,
}

fn api() -> Result<&'static Api, String> {
    static API: OnceLock<Result<Api, String>> = OnceLock::new();
    API.get_or_init(|| {
        let lib = Library::open(&["libibverbs.so.1"])?;
        // SAFETY: each name is resolved with its declared type from strata-ibverbs-abi.
        let api = unsafe {
            Api {
                get_device_list: lib.get("ibv_get_device_list")?,
                free_device_list: lib.get("ibv_free_device_list")?,
                get_device_name: lib.get("ibv_get_device_name")?,
                open_device: lib.get("ibv_open_device")?,
                query_port: lib.get("ibv_query_port")?,
                query_gid: lib.get("ibv_query_gid")?,
                alloc_pd: lib.get("ibv_alloc_pd")?,
                reg_mr: lib.get("ibv_reg_mr")?,
                reg_dmabuf_mr: lib.get_optional("ibv_reg_dmabuf_mr"),
                dereg_mr: lib.get("ibv_dereg_mr")?,
                create_comp_channel: lib.get("ibv_create_comp_channel")?,
                destroy_comp_channel: lib.get("ibv_destroy_comp_channel")?,
                create_cq: lib.get("ibv_create_cq")?,
                destroy_cq: lib.get("ibv_destroy_cq")?,
                get_cq_event: lib.get("ibv_get_cq_event")?,
                ack_cq_events: lib.get("ibv_ack_cq_events")?,
                create_qp: lib.get("ibv_create_qp")?,
                modify_qp: lib.get("ibv_modify_qp")?,
                destroy_qp: lib.get("ibv_destroy_qp")?,
                wc_status_str: lib.get("ibv_wc_status_str")?,
            }
        };
        // The library stays loaded for the life of the process.
        std::mem::forget(lib);
        Ok(api)
    })
    .as_ref()
    .map_err(Clone::clone)
}

/// An RDMA device port as `collbench topo` lists it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct DevicePort {
    /// Device name (`mlx5_0`).
    pub name: String,
    /// Port number.
    pub port: u8,
    /// `InfiniBand` or `RoCE`.
    pub link: String,
    /// Whether the port is active.
    pub active: bool,
    /// PCI bus id, from sysfs, if known.
    pub pci: Option<String>,
}

fn pci_of(name: &str) -> Option<String> {
    let p = std::fs::canonicalize(format!("/sys/class/infiniband/{name}/device")).ok()?;
    p.file_name()?.to_str().map(str::to_string)
}

/// Every device's first port, as the library reports them; `Err` says why there are none.
pub fn device_ports() -> Result<Vec<DevicePort>, String> {
    let api = api()?;
    let mut out = Vec::new();
    let mut n: c_int = 0;
    // SAFETY: the list and its devices stay valid until freed below.
    let list = unsafe { (api.get_device_list)(&mut n) };
    if list.is_null() {
        return Err(format!(
            "no RDMA devices (ibv_get_device_list: {}; are the RDMA kernel modules loaded?)",
            io::Error::last_os_error()
        ));
    }
    for i in 0..n.max(0) as usize {
        // SAFETY: n entries.
        let dev = unsafe { *list.add(i) };
        // SAFETY: a device of the list; the name is a NUL-terminated string it owns.
        let name = unsafe { CStr::from_ptr((api.get_device_name)(dev)) }
            .to_string_lossy()
            .into_owned();
        // SAFETY: opening a listed device; closed below.
        let ctx = unsafe { (api.open_device)(dev) };
        if ctx.is_null() {
            continue;
        }
        let mut attr = ibv_port_attr::default();
        // SAFETY: an open context and a zeroed attribute block of the full size.
        let ok = unsafe { (api.query_port)(ctx, 1, &mut attr) } == 0;
        if ok {
            out.push(DevicePort {
                pci: pci_of(&name),
                name,
                port: 1,
                link: link_name(attr.link_layer).into(),
                active: attr.state == PORT_ACTIVE,
            });
        }
        close(ctx);
    }
    // SAFETY: the list from get_device_list.
    unsafe { (api.free_device_list)(list) };
    if out.is_empty() {
        return Err("no RDMA devices".into());
    }
    Ok(out)
}

fn close(ctx: *mut ibv_context) {
    if let Ok(lib) = Library::open(&["libibverbs.so.1"]) {
        // SAFETY: ibv_close_device's declared type; ctx is an open context.
        if let Ok(f) = unsafe { lib.get::<calls::CloseDevice>("ibv_close_device") } {
            unsafe { f(ctx) };
        }
        std::mem::forget(lib);
    }
}

fn link_name(layer: u8) -> &'static str {
    if layer == LINK_LAYER_ETHERNET {
        "RoCE"
    } else {
        "InfiniBand"
    }
}

/// The local rank on this host, from the launcher (for rail alignment).
fn local_rank() -> usize {
    [
        "LOCAL_RANK",
        "SLURM_LOCALID",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "MPI_LOCALRANKID",
    ]
    .iter()
    .find_map(|v| std::env::var(v).ok()?.parse().ok())
    .unwrap_or(0)
}

/// The device and port this process uses, opened once.
pub(crate) struct VerbsFabric {
    api: &'static Api,
    ctx: usize,
    pd: usize,
    port: u8,
    lid: u16,
    gid: ibv_gid,
    gid_index: u8,
    mtu: u32,
    roce: bool,
    device: String,
    cfg: RdmaConfig,
    cache: Arc<RegCache<usize>>,
}

/// The fabric, or one line saying why verbs cannot be used.
pub(crate) fn open(cfg: &RdmaConfig) -> Result<Arc<VerbsFabric>, String> {
    static FABRIC: OnceLock<Result<Arc<VerbsFabric>, String>> = OnceLock::new();
    if cfg.ib_disabled {
        return Err("turned off by NCCL_IB_DISABLE=1".into());
    }
    FABRIC
        .get_or_init(|| open_uncached(cfg).map(Arc::new))
        .clone()
}

fn open_uncached(cfg: &RdmaConfig) -> Result<VerbsFabric, String> {
    let api = api()?;
    let ports = device_ports()?;
    let chosen = choose_port(&ports, cfg, local_rank())?;
    open_device(api, chosen, cfg)
}

/// The port local rank `local` uses: among the active ports `NCCL_IB_HCA` allows, the one on
/// the PCI function of the rank's network interface (its socket traffic leaves there), else the
/// rank's rail (`local` mod the usable ports, the same on every host, so rails line up).
pub fn choose_port<'a>(
    ports: &'a [DevicePort],
    cfg: &RdmaConfig,
    local: usize,
) -> Result<&'a DevicePort, String> {
    let usable: Vec<&DevicePort> = ports
        .iter()
        .filter(|p| p.active && cfg.hca_allows(&p.name, p.port))
        .collect();
    if usable.is_empty() {
        return Err(format!(
            "no active port among {} allowed by NCCL_IB_HCA",
            ports
                .iter()
                .map(|p| format!("{}:{}", p.name, p.port))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    let via = cfg.interface.as_deref().and_then(|ifname| {
        strata_topology::sysfs::pci_of_interface(std::path::Path::new("/"), ifname)
    });
    Ok(usable
        .iter()
        .find(|p| p.pci.is_some() && p.pci == via)
        .copied()
        .unwrap_or(usable[local % usable.len()]))
}

fn open_device(
    api: &'static Api,
    want: &DevicePort,
    cfg: &RdmaConfig,
) -> Result<VerbsFabric, String> {
    let mut n: c_int = 0;
    // SAFETY: as in device_ports.
    let list = unsafe { (api.get_device_list)(&mut n) };
    if list.is_null() {
        return Err("ibv_get_device_list failed".into());
    }
    let dev = (0..n.max(0) as usize)
        // SAFETY: n entries, each a listed device.
        .map(|i| unsafe { *list.add(i) })
        .find(|&d| {
            unsafe { CStr::from_ptr((api.get_device_name)(d)) }.to_bytes() == want.name.as_bytes()
        });
    // SAFETY: a listed device (the list must outlive the open).
    let ctx = dev.map_or(std::ptr::null_mut(), |d| unsafe { (api.open_device)(d) });
    // SAFETY: the list from get_device_list.
    unsafe { (api.free_device_list)(list) };
    if ctx.is_null() {
        return Err(format!(
            "cannot open {}: {}",
            want.name,
            io::Error::last_os_error()
        ));
    }
    let mut attr = ibv_port_attr::default();
    // SAFETY: an open context; the attribute block is the full size.
    if unsafe { (api.query_port)(ctx, want.port, &mut attr) } != 0 {
        return Err(format!("{}: ibv_query_port failed", want.name));
    }
    let roce = attr.link_layer == LINK_LAYER_ETHERNET;
    let gid_at = |i: c_int| {
        let mut g = ibv_gid::default();
        // SAFETY: an open context and an out-parameter.
        (unsafe { (api.query_gid)(ctx, want.port, i, &mut g) } == 0).then_some(g)
    };
    let gid_index = match cfg.gid_index {
        Some(i) => i,
        None if roce => pick_roce_gid(&want.name, want.port, attr.gid_tbl_len, &gid_at),
        None => 0,
    };
    let gid = gid_at(c_int::from(gid_index))
        .ok_or_else(|| format!("{}: no GID at index {gid_index}", want.name))?;
    // SAFETY: an open context.
    let pd = unsafe { (api.alloc_pd)(ctx) };
    if pd.is_null() {
        return Err(format!("{}: ibv_alloc_pd failed", want.name));
    }
    let device = if roce {
        format!(
            "{} port {} (RoCE, GID index {gid_index})",
            want.name, want.port
        )
    } else {
        format!(
            "{} port {} (InfiniBand, LID {:#x})",
            want.name, want.port, attr.lid
        )
    };
    let dereg = api.dereg_mr;
    Ok(VerbsFabric {
        api,
        ctx: ctx as usize,
        pd: pd as usize,
        port: want.port,
        lid: attr.lid,
        gid,
        gid_index,
        mtu: attr.active_mtu,
        roce,
        device,
        cfg: cfg.clone(),
        // SAFETY: each handle is an ibv_mr this cache registered.
        cache: RegCache::new(move |mr: usize| unsafe {
            dereg(mr as *mut ibv_mr);
        }),
    })
}

/// NCCL's choice when `NCCL_IB_GID_INDEX` is unset: the first RoCE v2 GID (sysfs says which),
/// else the first IPv4-mapped one, else index 0.
fn pick_roce_gid(dev: &str, port: u8, len: c_int, gid_at: &dyn Fn(c_int) -> Option<ibv_gid>) -> u8 {
    let nonzero = |i: c_int| gid_at(i).filter(|g| g.raw != [0; 16]);
    let v2 = (0..len.min(256)).find(|&i| {
        std::fs::read_to_string(format!(
            "/sys/class/infiniband/{dev}/ports/{port}/gid_attrs/types/{i}"
        ))
        .is_ok_and(|t| t.trim() == "RoCE v2")
            && nonzero(i).is_some()
    });
    let mapped = || {
        (0..len.min(256)).find(|&i| {
            nonzero(i).is_some_and(|g| g.raw[..12] == [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff])
        })
    };
    v2.or_else(mapped).unwrap_or(0) as u8
}

// SAFETY: the context and PD are thread-safe verbs objects; the fabric never frees them.
unsafe impl Send for VerbsFabric {}
// SAFETY: as above.
unsafe impl Sync for VerbsFabric {}

impl VerbsFabric {
    /// Registers `len` bytes at `offset` of a dma-buf (GPU memory exported by
    /// `cuMemGetHandleForAddressRange`), which requests name as `iova`.
    pub(crate) fn register_dmabuf(
        &self,
        fd: RawFd,
        offset: u64,
        len: usize,
        iova: u64,
    ) -> io::Result<Region> {
        let Some(reg) = self.api.reg_dmabuf_mr else {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "this libibverbs has no ibv_reg_dmabuf_mr (rdma-core 34 or later): GPU memory needs nvidia-peermem",
            ));
        };
        self.cache.get(iova as *mut u8, len, || {
            // SAFETY: our PD; the kernel checks the descriptor and range.
            let mr = unsafe {
                reg(
                    self.pd as *mut ibv_pd,
                    offset,
                    len,
                    iova,
                    fd,
                    access::LOCAL_WRITE | access::REMOTE_WRITE,
                )
            };
            self.region_of(mr, iova, len)
        })
    }

    fn region_of(&self, mr: *mut ibv_mr, addr: u64, len: usize) -> io::Result<(Region, usize)> {
        if mr.is_null() {
            return Err(io::Error::other(format!(
                "{}: registering {len} bytes failed: {}",
                self.device,
                io::Error::last_os_error()
            )));
        }
        // SAFETY: a registration the library returned.
        let (lkey, rkey) = unsafe { ((*mr).lkey, (*mr).rkey) };
        Ok((
            Region {
                addr,
                len,
                local: u64::from(lkey),
                rkey: u64::from(rkey),
                remote_base: addr,
            },
            mr as usize,
        ))
    }
}

impl Fabric for VerbsFabric {
    fn kind(&self) -> ProviderKind {
        ProviderKind::Verbs
    }

    fn device(&self) -> &str {
        &self.device
    }

    fn register(&self, ptr: *mut u8, len: usize) -> io::Result<Region> {
        self.cache.get(ptr, len, || {
            // SAFETY: our PD; the caller's memory stays mapped while registered.
            let mr = unsafe {
                (self.api.reg_mr)(
                    self.pd as *mut ibv_pd,
                    ptr as *mut c_void,
                    len,
                    access::LOCAL_WRITE | access::REMOTE_WRITE,
                )
            };
            self.region_of(mr, ptr as u64, len)
        })
    }

    fn deregister(&self, region: &Region) {
        self.cache.put(region);
    }

    fn link(&self, lanes: usize, depth: usize) -> io::Result<Box<dyn Link>> {
        VerbsLink::new(self, lanes, depth).map(|l| Box::new(l) as Box<dyn Link>)
    }
}

/// One lane's address, as the peer needs it.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct LaneAddress {
    qpn: u32,
    psn: u32,
    lid: u16,
    gid: [u8; 16],
    mtu: u32,
}

/// A connection: queue pairs on one completion queue with a completion channel.
struct VerbsLink {
    api: &'static Api,
    ctx: *mut ibv_context,
    channel: *mut ibv_comp_channel,
    cq: *mut ibv_cq,
    qps: Vec<*mut ibv_qp>,
    psns: Vec<u32>,
    local: Vec<LaneAddress>,
    port: u8,
    roce: bool,
    gid_index: u8,
    cfg: RdmaConfig,
    armed: bool,
    events: u32,
    /// Completions taken while arming, handed out by the next poll.
    stash: Vec<ibv_wc>,
}

// SAFETY: verbs objects may be used from any thread; the link is used by one at a time.
unsafe impl Send for VerbsLink {}

fn os_err(what: &str) -> io::Error {
    let e = io::Error::last_os_error();
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

impl VerbsLink {
    fn new(f: &VerbsFabric, lanes: usize, depth: usize) -> io::Result<Self> {
        let api = f.api;
        let ctx = f.ctx as *mut ibv_context;
        // SAFETY: an open context.
        let channel = unsafe { (api.create_comp_channel)(ctx) };
        if channel.is_null() {
            return Err(os_err("ibv_create_comp_channel"));
        }
        // SAFETY: the channel's descriptor; made non-blocking so polling it never waits.
        unsafe {
            let fd = (*channel).fd;
            libc::fcntl(
                fd,
                libc::F_SETFL,
                libc::fcntl(fd, libc::F_GETFL) | libc::O_NONBLOCK,
            );
        }
        let mut link = Self {
            api,
            ctx,
            channel,
            cq: std::ptr::null_mut(),
            qps: Vec::new(),
            psns: Vec::new(),
            local: Vec::new(),
            port: f.port,
            roce: f.roce,
            gid_index: f.gid_index,
            cfg: f.cfg.clone(),
            armed: false,
            events: 0,
            stash: Vec::new(),
        };
        let cqe = (2 * depth * lanes) as c_int;
        // SAFETY: an open context and our channel.
        link.cq = unsafe { (api.create_cq)(ctx, cqe, std::ptr::null_mut(), channel, 0) };
        if link.cq.is_null() {
            return Err(os_err("ibv_create_cq"));
        }
        for _ in 0..lanes {
            let mut init = ibv_qp_init_attr {
                qp_context: std::ptr::null_mut(),
                send_cq: link.cq,
                recv_cq: link.cq,
                srq: std::ptr::null_mut(),
                cap: ibv_qp_cap {
                    max_send_wr: depth as u32,
                    max_recv_wr: depth as u32,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                },
                qp_type: QPT_RC,
                sq_sig_all: 0,
            };
            // SAFETY: our PD and attributes.
            let qp = unsafe { (api.create_qp)(f.pd as *mut ibv_pd, &mut init) };
            if qp.is_null() {
                return Err(os_err("ibv_create_qp"));
            }
            link.qps.push(qp);
            let mut a = ibv_qp_attr {
                qp_state: qp_state::INIT,
                pkey_index: 0,
                port_num: f.port,
                qp_access_flags: (access::LOCAL_WRITE | access::REMOTE_WRITE) as u32,
                ..Default::default()
            };
            link.modify(qp, &mut a, attr::TO_INIT, "INIT")?;
            let mut psn = [0u8; 4];
            let _ = getrandom::fill(&mut psn);
            let psn = u32::from_le_bytes(psn) & 0xff_ffff;
            link.psns.push(psn);
            link.local.push(LaneAddress {
                // SAFETY: a QP the library returned.
                qpn: unsafe { (*qp).qp_num },
                psn,
                lid: f.lid,
                gid: f.gid.raw,
                mtu: f.mtu,
            });
        }
        Ok(link)
    }

    fn modify(
        &self,
        qp: *mut ibv_qp,
        a: &mut ibv_qp_attr,
        mask: c_int,
        to: &str,
    ) -> io::Result<()> {
        // SAFETY: our QP and a complete attribute block.
        let r = unsafe { (self.api.modify_qp)(qp, a, mask) };
        if r != 0 {
            return Err(io::Error::other(format!(
                "ibv_modify_qp to {to}: {}",
                io::Error::from_raw_os_error(r)
            )));
        }
        Ok(())
    }

    fn ops(&self) -> &ContextOps {
        // SAFETY: an open context.
        unsafe { &(*self.ctx).ops }
    }

    fn lane_of_qpn(&self, qpn: u32) -> usize {
        self.local.iter().position(|l| l.qpn == qpn).unwrap_or(0)
    }

    fn status_text(&self, status: u32) -> String {
        // SAFETY: returns a static string.
        let s = unsafe { (self.api.wc_status_str)(status) };
        if s.is_null() {
            return "unknown status".into();
        }
        // SAFETY: a NUL-terminated static string.
        unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
    }

    fn error_of(&self, wc: &ibv_wc) -> io::Error {
        let what = if wc.opcode == wc_opcode::RECV_RDMA_WITH_IMM {
            "receive"
        } else {
            "RDMA write"
        };
        let kind = match wc.status {
            wc_status::RETRY_EXC_ERR | wc_status::RNR_RETRY_EXC_ERR => io::ErrorKind::TimedOut,
            _ => io::ErrorKind::Other,
        };
        io::Error::new(
            kind,
            format!(
                "{what} on lane {} failed: {} ({}, vendor error {:#x})",
                self.lane_of_qpn(wc.qp_num),
                self.status_text(wc.status),
                wc_status::name(wc.status),
                wc.vendor_err
            ),
        )
    }

    fn take_event(&mut self) {
        if !self.armed {
            return;
        }
        let mut cq: *mut ibv_cq = std::ptr::null_mut();
        let mut ctx: *mut c_void = std::ptr::null_mut();
        // SAFETY: our channel (non-blocking) and out-parameters.
        if unsafe { (self.api.get_cq_event)(self.channel, &mut cq, &mut ctx) } == 0 {
            self.events += 1;
            self.armed = false;
        }
    }

    fn poll_raw(&mut self, buf: &mut [ibv_wc]) -> io::Result<usize> {
        let poll = self
            .ops()
            .poll_cq
            .ok_or_else(|| io::Error::other("no poll_cq"))?;
        // SAFETY: our CQ and an array of buf.len() entries.
        let n = unsafe { poll(self.cq, buf.len() as c_int, buf.as_mut_ptr()) };
        if n < 0 {
            return Err(io::Error::other(format!(
                "polling the completion queue failed ({})",
                io::Error::from_raw_os_error(-n)
            )));
        }
        Ok(n as usize)
    }
}

impl Link for VerbsLink {
    fn address(&self) -> Vec<u8> {
        serde_json::to_vec(&self.local).unwrap_or_default()
    }

    fn connect(&mut self, remote: &[u8]) -> io::Result<()> {
        let peers: Vec<LaneAddress> = serde_json::from_slice(remote).map_err(|e| {
            io::Error::new(io::ErrorKind::InvalidData, format!("peer address: {e}"))
        })?;
        if peers.len() != self.qps.len() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "the peer has {} lanes, this side {}",
                    peers.len(),
                    self.qps.len()
                ),
            ));
        }
        for (lane, p) in peers.iter().enumerate() {
            let qp = self.qps[lane];
            let global = self.roce || p.lid == 0;
            let mut a = ibv_qp_attr {
                qp_state: qp_state::RTR,
                path_mtu: p.mtu.min(self.local[lane].mtu),
                dest_qp_num: p.qpn,
                rq_psn: p.psn,
                max_dest_rd_atomic: 1,
                min_rnr_timer: 12,
                ah_attr: ibv_ah_attr {
                    grh: ibv_global_route {
                        dgid: ibv_gid { raw: p.gid },
                        flow_label: 0,
                        sgid_index: self.gid_index,
                        hop_limit: 255,
                        traffic_class: self.cfg.traffic_class,
                    },
                    dlid: p.lid,
                    sl: self.cfg.service_level,
                    src_path_bits: 0,
                    static_rate: 0,
                    is_global: u8::from(global),
                    port_num: self.port,
                },
                ..Default::default()
            };
            self.modify(qp, &mut a, attr::TO_RTR, "RTR")?;
            let mut a = ibv_qp_attr {
                qp_state: qp_state::RTS,
                timeout: self.cfg.timeout,
                retry_cnt: self.cfg.retry_cnt,
                rnr_retry: 7,
                sq_psn: self.psns[lane],
                max_rd_atomic: 1,
                ..Default::default()
            };
            self.modify(qp, &mut a, attr::TO_RTS, "RTS")?;
        }
        Ok(())
    }

    fn write(
        &mut self,
        lane: usize,
        region: &Region,
        src: u64,
        len: usize,
        dst: u64,
        rkey: u64,
        imm: u32,
        wr_id: u64,
    ) -> io::Result<bool> {
        let mut sge = ibv_sge {
            addr: src,
            length: len as u32,
            lkey: region.local as u32,
        };
        let mut wr = ibv_send_wr {
            wr_id,
            sg_list: &mut sge,
            num_sge: 1,
            opcode: wr_opcode::RDMA_WRITE_WITH_IMM,
            send_flags: SEND_SIGNALED,
            imm_data: imm.to_be(),
            rdma: RdmaTarget {
                remote_addr: dst,
                rkey: rkey as u32,
            },
            ..Default::default()
        };
        let post = self
            .ops()
            .post_send
            .ok_or_else(|| io::Error::other("no post_send"))?;
        let mut bad: *mut ibv_send_wr = std::ptr::null_mut();
        // SAFETY: our QP; the request and its list live across the call.
        let r = unsafe { post(self.qps[lane], &mut wr, &mut bad) };
        if r != 0 {
            return Err(io::Error::other(format!(
                "ibv_post_send on lane {lane}: {}",
                io::Error::from_raw_os_error(r)
            )));
        }
        Ok(true)
    }

    fn post_recv(&mut self, lane: usize) -> io::Result<()> {
        let mut wr = ibv_recv_wr {
            wr_id: lane as u64,
            next: std::ptr::null_mut(),
            sg_list: std::ptr::null_mut(),
            num_sge: 0,
        };
        let post = self
            .ops()
            .post_recv
            .ok_or_else(|| io::Error::other("no post_recv"))?;
        let mut bad: *mut ibv_recv_wr = std::ptr::null_mut();
        // SAFETY: our QP and a request without buffers (writes with immediate data need none).
        let r = unsafe { post(self.qps[lane], &mut wr, &mut bad) };
        if r != 0 {
            return Err(io::Error::other(format!(
                "ibv_post_recv on lane {lane}: {}",
                io::Error::from_raw_os_error(r)
            )));
        }
        Ok(())
    }

    fn poll(&mut self, out: &mut Vec<Completion>) -> io::Result<()> {
        self.take_event();
        let mut batch = std::mem::take(&mut self.stash);
        let mut buf = [ibv_wc::default(); 32];
        loop {
            let n = self.poll_raw(&mut buf)?;
            batch.extend_from_slice(&buf[..n]);
            if n < buf.len() {
                break;
            }
        }
        // The first error that is not a flush is the cause; flushes only follow it.
        let failed = batch
            .iter()
            .filter(|w| w.status != wc_status::SUCCESS)
            .min_by_key(|w| w.status == wc_status::WR_FLUSH_ERR);
        if let Some(w) = failed {
            return Err(self.error_of(w));
        }
        out.extend(batch.iter().map(|w| {
            if w.opcode == wc_opcode::RECV_RDMA_WITH_IMM {
                Completion::Arrived {
                    imm: u32::from_be(w.imm_data),
                }
            } else {
                Completion::Sent { wr_id: w.wr_id }
            }
        }));
        Ok(())
    }

    fn arm(&mut self) -> io::Result<Armed> {
        if !self.stash.is_empty() {
            return Ok(Armed::Busy);
        }
        if !self.armed {
            let notify = self
                .ops()
                .req_notify_cq
                .ok_or_else(|| io::Error::other("no req_notify_cq"))?;
            // SAFETY: our CQ, which has a channel.
            let r = unsafe { notify(self.cq, 0) };
            if r != 0 {
                return Err(io::Error::other(format!(
                    "ibv_req_notify_cq: {}",
                    io::Error::from_raw_os_error(r)
                )));
            }
            self.armed = true;
        }
        // A completion that came before the request would not signal: look once more.
        let mut one = [ibv_wc::default(); 1];
        if self.poll_raw(&mut one)? == 1 {
            self.stash.push(one[0]);
            return Ok(Armed::Busy);
        }
        // SAFETY: our channel.
        Ok(Armed::Sleep(unsafe { (*self.channel).fd }))
    }
}

impl Drop for VerbsLink {
    fn drop(&mut self) {
        self.take_event();
        // SAFETY: our objects, destroyed children first; events acknowledged before the CQ goes.
        unsafe {
            for &qp in &self.qps {
                (self.api.destroy_qp)(qp);
            }
            if !self.cq.is_null() {
                (self.api.ack_cq_events)(self.cq, self.events);
                (self.api.destroy_cq)(self.cq);
            }
            (self.api.destroy_comp_channel)(self.channel);
        }
    }
}
