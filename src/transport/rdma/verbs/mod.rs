//! The verbs provider: InfiniBand and RoCE through `libibverbs.so.1`, loaded at run time and
//! called through strata's own declarations (`strata-ibverbs-abi`), as NCCL's `ibvwrap` does.
//!
//! One device and port per process (the NIC its traffic leaves by when that is an RDMA device,
//! else the local rank's rail: local rank mod the usable devices, the same on every host), one
//! protection domain, reliable-connected queue pairs (one per lane) on one completion queue per
//! connection, and a completion channel to sleep on.

mod link;

use super::regcache::RegCache;
use super::{Fabric, Link, ProviderKind, RdmaConfig, Region, dl::Library};
use link::VerbsLink;
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
    close_device: calls::CloseDevice,
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
                close_device: lib.get("ibv_close_device")?,
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
        // SAFETY: a context opened above and used no more.
        unsafe { (api.close_device)(ctx) };
    }
    // SAFETY: the list from get_device_list.
    unsafe { (api.free_device_list)(list) };
    if out.is_empty() {
        return Err("no RDMA devices".into());
    }
    Ok(out)
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
    /// The NIC's PCI bus id, where sysfs shows it.
    pci: Option<String>,
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
    // The NICs nearest this rank's GPU (by PCIe distance, from the host model), if it has one.
    let near = crate::gpu::current_gpu_bus_id()
        .map(|gpu| strata_topology::sysfs::discover(std::path::Path::new("/")).nearest_nics(&gpu))
        .unwrap_or_default();
    let chosen = choose_port(&ports, cfg, local_rank(), &near)?;
    open_device(api, chosen, cfg)
}

/// The port local rank `local` uses, among the active ports `NCCL_IB_HCA` allows: one of the
/// NICs `near` its GPU (PCI bus ids, nearest first; ties shared out by local rank), else the
/// one on the PCI function of the rank's network interface (its socket traffic leaves
/// there), else the rank's rail (`local` mod the usable ports, the same on every host, so
/// rails line up).
pub fn choose_port<'a>(
    ports: &'a [DevicePort],
    cfg: &RdmaConfig,
    local: usize,
    near: &[String],
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
    let nearest: Vec<&DevicePort> = usable
        .iter()
        .copied()
        .filter(|p| p.pci.as_ref().is_some_and(|b| near.contains(b)))
        .collect();
    if !nearest.is_empty() {
        return Ok(nearest[local % nearest.len()]);
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
        pci: want.pci.clone(),
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
    /// The NIC's PCI bus id, where sysfs shows it (not on the stand-in).
    pub(crate) fn pci_bus(&self) -> Option<&str> {
        self.pci.as_deref()
    }

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

#[cfg(test)]
mod tests {
    use super::*;

    fn port(name: &str, pci: &str, active: bool) -> DevicePort {
        DevicePort {
            name: name.into(),
            port: 1,
            link: "InfiniBand".into(),
            active,
            pci: Some(pci.into()),
        }
    }

    #[test]
    fn the_nic_nearest_the_gpu_wins_then_the_rail() {
        let ports = [
            port("mlx5_0", "0000:0c:00.0", true),
            port("mlx5_1", "0000:2a:00.0", true),
            port("mlx5_2", "0000:41:00.0", false),
            port("mlx5_3", "0000:5d:00.0", true),
        ];
        let cfg = RdmaConfig::default();
        // Near a GPU: that NIC, whatever the local rank.
        let near = vec!["0000:2a:00.0".to_string()];
        assert_eq!(choose_port(&ports, &cfg, 0, &near).unwrap().name, "mlx5_1");
        assert_eq!(choose_port(&ports, &cfg, 3, &near).unwrap().name, "mlx5_1");
        // Two tie: shared out by local rank.
        let two = vec!["0000:0c:00.0".to_string(), "0000:5d:00.0".to_string()];
        assert_eq!(choose_port(&ports, &cfg, 1, &two).unwrap().name, "mlx5_3");
        // No GPU: the rail, skipping the port that is down.
        let rails: Vec<&str> = (0..4)
            .map(|l| choose_port(&ports, &cfg, l, &[]).unwrap().name.as_str())
            .collect();
        assert_eq!(rails, ["mlx5_0", "mlx5_1", "mlx5_3", "mlx5_0"]);
        // A nearest NIC that NCCL_IB_HCA excludes is not used.
        let cfg = RdmaConfig {
            hca: vec![crate::config::HcaFilter {
                name: "mlx5_1".into(),
                port: None,
            }],
            hca_exclude: true,
            hca_exact: true,
            ..Default::default()
        };
        assert_eq!(choose_port(&ports, &cfg, 0, &near).unwrap().name, "mlx5_0");
        let none: Vec<DevicePort> = vec![port("mlx5_0", "0000:0c:00.0", false)];
        assert!(
            choose_port(&none, &cfg, 0, &[])
                .unwrap_err()
                .contains("no active port")
        );
    }
}
