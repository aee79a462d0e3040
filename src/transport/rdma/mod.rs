//! RDMA between hosts: one protocol ([`protocol::RdmaTransport`]) over two providers, InfiniBand
//! / RoCE verbs (`libibverbs.so.1`) and libfabric (`libfabric.so.1`), both loaded at run time.
//!
//! A provider offers what the protocol needs and nothing more ([`Fabric`], [`Link`]): memory
//! registration with remote keys, a connection of several lanes (queue pairs or endpoints),
//! RDMA write with 32 bits of immediate data that completes a receive at the target, and one
//! completion queue per connection with a descriptor to sleep on.

mod connect;
mod dl;
#[cfg(test)]
mod loopback;
pub mod ofi;
pub(crate) mod protocol;
pub mod regcache;
pub mod verbs;

pub use crate::config::{HcaFilter, RdmaConfig};
pub(crate) use connect::{CONNECTOR, provider_between};

use serde::{Deserialize, Serialize};
use std::io;
use std::os::fd::RawFd;
use std::sync::Arc;

/// Which provider a connection uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ProviderKind {
    /// InfiniBand or RoCE verbs through `libibverbs.so.1`.
    Verbs,
    /// libfabric through `libfabric.so.1` (EFA, cxi, verbs, tcp, ...).
    Ofi,
}

impl ProviderKind {
    /// `verbs` or `ofi`.
    pub fn name(self) -> &'static str {
        match self {
            ProviderKind::Verbs => "verbs",
            ProviderKind::Ofi => "ofi",
        }
    }
}

/// A registered memory region: what a request names it by, locally and remotely.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Region {
    /// Start address.
    pub addr: u64,
    /// Bytes.
    pub len: usize,
    /// The local descriptor (verbs: the lkey; libfabric: the `fi_mr_desc` pointer).
    pub local: u64,
    /// The key a peer names in its writes.
    pub rkey: u64,
    /// The address a peer names in its writes for `addr` (libfabric providers without
    /// `FI_MR_VIRT_ADDR` address regions from 0).
    pub remote_base: u64,
}

/// What one completion says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Completion {
    /// A write posted with this id is complete at the initiator.
    Sent { wr_id: u64 },
    /// A peer's write with immediate data landed; `imm` is its immediate data.
    Arrived { imm: u32 },
}

/// Whether a connection may sleep on its descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Armed {
    /// Completions are pending already: poll again, do not sleep.
    Busy,
    /// Sleep until this descriptor is readable.
    Sleep(RawFd),
    /// The provider has no descriptor: sleep briefly and poll.
    Poll,
}

/// One RDMA write with immediate data: `len` bytes at `src` (inside `region`) to `dst` under
/// `rkey`, on `lane`; its completion reports `wr_id`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Write {
    /// The queue pair or endpoint.
    pub lane: usize,
    /// The registered region holding the source.
    pub region: Region,
    /// Source address.
    pub src: u64,
    /// Bytes.
    pub len: usize,
    /// Destination address, as the peer names it.
    pub dst: u64,
    /// The destination region's key.
    pub rkey: u64,
    /// Immediate data (verbs) or remote CQ data (libfabric).
    pub imm: u32,
    /// What the completion reports.
    pub wr_id: u64,
}

/// A provider opened on one device (per process): registration, and new connections.
pub(crate) trait Fabric: Send + Sync {
    /// The provider.
    fn kind(&self) -> ProviderKind;
    /// The device (and port or provider) for messages: `mlx5_0 port 1 (InfiniBand)`.
    fn device(&self) -> &str;
    /// Registers `[ptr, ptr + len)` for local use and remote writes (through the cache).
    fn register(&self, ptr: *mut u8, len: usize) -> io::Result<Region>;
    /// Releases a registration made by `register`.
    fn deregister(&self, region: &Region);
    /// A new, unconnected connection of `lanes` lanes, each taking `depth` requests.
    fn link(&self, lanes: usize, depth: usize) -> io::Result<Box<dyn Link>>;
}

/// One connection's lanes and completion queue.
pub(crate) trait Link: Send {
    /// This side's addresses (sent to the peer through the bootstrap connection).
    fn address(&self) -> Vec<u8>;
    /// Connects every lane to the peer's `address`; receives may be posted afterwards.
    fn connect(&mut self, remote: &[u8]) -> io::Result<()>;
    /// Posts `w`. `Ok(false)`: the provider has no room now (nothing was posted; try again
    /// after polling).
    fn write(&mut self, w: &Write) -> io::Result<bool>;
    /// Posts a receive on `lane` for one incoming write with immediate data.
    fn post_recv(&mut self, lane: usize) -> io::Result<()>;
    /// Appends the completions that are ready; an error completion is an `Err` that names
    /// the device and the provider's status text.
    fn poll(&mut self, out: &mut Vec<Completion>) -> io::Result<()>;
    /// Prepares to sleep.
    fn arm(&mut self) -> io::Result<Armed>;
}

/// The fabric of `kind` for this process, opened once; `Err` says in one line why not.
pub(crate) fn open(kind: ProviderKind, cfg: &RdmaConfig) -> Result<Arc<dyn Fabric>, String> {
    match kind {
        ProviderKind::Verbs => verbs::open(cfg).map(|f| f as Arc<dyn Fabric>),
        ProviderKind::Ofi => ofi::open(cfg).map(|f| f as Arc<dyn Fabric>),
    }
}

/// What RDMA this process has: for `collbench topo` and for choosing a transport.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct RdmaCaps {
    /// The verbs device this process would use, if any.
    pub verbs: Option<String>,
    /// The libfabric provider and domain this process would use, if any.
    pub ofi: Option<String>,
    /// Whether that libfabric provider is a hardware one (not tcp, udp, sockets or shm).
    pub ofi_hardware: bool,
}

/// Probes the providers `which` names (each opened once per process) and says what is usable,
/// with the reason for each that is not.
pub fn probe_some(cfg: &RdmaConfig, verbs: bool, ofi: bool) -> (RdmaCaps, Vec<String>) {
    let mut caps = RdmaCaps::default();
    let mut why = Vec::new();
    if verbs {
        match open(ProviderKind::Verbs, cfg) {
            Ok(f) => caps.verbs = Some(f.device().to_string()),
            Err(e) => why.push(format!("verbs: {e}")),
        }
    }
    if ofi {
        match ofi::open(cfg) {
            Ok(f) => {
                caps.ofi = Some(f.device().to_string());
                caps.ofi_hardware = f.hardware();
            }
            Err(e) => why.push(format!("ofi: {e}")),
        }
    }
    (caps, why)
}

/// Probes both providers.
pub fn probe(cfg: &RdmaConfig) -> (RdmaCaps, Vec<String>) {
    probe_some(cfg, true, true)
}

/// Where RDMA hardware would show itself: InfiniBand / RoCE / EFA devices, Slingshot (cxi),
/// Omni-Path (hfi1). Checked before `auto` loads any library, since `fi_getinfo` alone takes
/// ~0.4 s on a machine with none.
fn rdma_hardware_present() -> Option<String> {
    let listed = |dir: &str| {
        std::fs::read_dir(dir)
            .ok()
            .and_then(|mut d| d.next())
            .is_some()
    };
    if listed("/sys/class/infiniband") || listed("/sys/class/cxi") {
        return Some("device".into());
    }
    std::fs::read_dir("/dev")
        .ok()?
        .flatten()
        .any(|e| e.file_name().to_string_lossy().starts_with("hfi1_"))
        .then(|| "hfi1".into())
}

/// What this rank tells the others about its RDMA, under `cfg.transport`: nothing when RDMA is
/// off (`tcp`, `shm`); an error naming the cause when `rdma`, `verbs` or `ofi` asks for a
/// provider that cannot be used; under `auto`, whatever is usable, and one line (once per
/// process) saying why RDMA is not.
pub(crate) fn caps_for(cfg: &crate::config::Config) -> crate::error::Result<RdmaCaps> {
    use crate::config::TransportPolicy as P;
    use crate::error::Error;
    if matches!(cfg.transport, P::Tcp | P::Shm) {
        return Ok(RdmaCaps::default());
    }
    // Under auto, a machine with no RDMA hardware (and no provider asked for) skips the
    // libraries altogether.
    if cfg.transport == P::Auto
        && cfg.rdma.ofi_provider.is_none()
        && rdma_hardware_present().is_none()
    {
        static SAID: std::sync::Once = std::sync::Once::new();
        SAID.call_once(|| {
            tracing::info!(
                "no RDMA between hosts, TCP instead (no /sys/class/infiniband, /sys/class/cxi \
                 or /dev/hfi1_*)"
            )
        });
        return Ok(RdmaCaps::default());
    }
    let (caps, why) = probe_some(
        &cfg.rdma,
        cfg.transport != P::Ofi,
        cfg.transport != P::Verbs,
    );
    let missing = |what: &str| {
        Error::Unsupported(format!(
            "STRATA_TRANSPORT={what} but {}",
            why.iter()
                .filter(|w| what == "rdma" || w.starts_with(what))
                .cloned()
                .collect::<Vec<_>>()
                .join("; ")
        ))
    };
    match cfg.transport {
        P::Verbs if caps.verbs.is_none() => return Err(missing("verbs")),
        P::Ofi if caps.ofi.is_none() => return Err(missing("ofi")),
        P::Rdma if caps.verbs.is_none() && caps.ofi.is_none() => return Err(missing("rdma")),
        P::Auto if caps.verbs.is_none() && !caps.ofi_hardware => {
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                let ofi = caps
                    .ofi
                    .as_ref()
                    .map(|o| format!("ofi: {o} is not RDMA hardware"));
                tracing::info!(
                    "no RDMA between hosts, TCP instead ({})",
                    why.iter()
                        .cloned()
                        .chain(ofi)
                        .collect::<Vec<_>>()
                        .join("; ")
                );
            });
        }
        _ => {}
    }
    Ok(caps)
}

/// The provider a connection between `me` and `peer` uses under `policy`, if RDMA.
pub(crate) fn choose(
    policy: crate::config::TransportPolicy,
    me: &RdmaCaps,
    peer: &RdmaCaps,
    same_host: bool,
) -> Option<ProviderKind> {
    use crate::config::TransportPolicy as P;
    let verbs = me.verbs.is_some() && peer.verbs.is_some();
    let ofi = me.ofi.is_some() && peer.ofi.is_some();
    match policy {
        P::Tcp | P::Shm => None,
        P::Auto if same_host => None,
        P::Auto if verbs => Some(ProviderKind::Verbs),
        P::Auto if ofi && me.ofi_hardware && peer.ofi_hardware => Some(ProviderKind::Ofi),
        P::Auto => None,
        P::Rdma if verbs || !ofi => Some(ProviderKind::Verbs),
        P::Rdma => Some(ProviderKind::Ofi),
        P::Verbs => Some(ProviderKind::Verbs),
        P::Ofi => Some(ProviderKind::Ofi),
    }
}

/// What RDMA this machine offers, for `collbench topo`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Inventory {
    /// Every verbs device's first port, or why there are none.
    pub verbs: Result<Vec<verbs::DevicePort>, String>,
    /// libfabric's reliable-datagram providers with RMA, or why there are none.
    pub ofi: Result<Vec<ofi::ProviderInfo>, String>,
    /// What this process would use: the verbs device and libfabric provider it opens.
    pub chosen: RdmaCaps,
    /// Why a provider cannot be used.
    pub unusable: Vec<String>,
}

/// Lists the RDMA devices and providers, and which this process would use under `cfg`.
pub fn inventory(cfg: &RdmaConfig) -> Inventory {
    let (chosen, unusable) = probe(cfg);
    Inventory {
        verbs: verbs::device_ports(),
        ofi: ofi::providers(cfg.ofi_provider.as_deref()),
        chosen,
        unusable,
    }
}

/// Memory behind a dma-buf descriptor (GPU memory exported with
/// `cuMemGetHandleForAddressRange`) registered with this process's verbs device, so RDMA can
/// read and write it directly; the registration is cached and released on drop.
pub struct DmabufRegion {
    fabric: Arc<verbs::VerbsFabric>,
    region: Region,
}

impl DmabufRegion {
    /// Registers `len` bytes at `offset` of the dma-buf `fd`, which requests name as `iova`.
    pub fn register(
        cfg: &RdmaConfig,
        fd: RawFd,
        offset: u64,
        len: usize,
        iova: u64,
    ) -> crate::error::Result<Self> {
        let fabric = verbs::open(cfg)
            .map_err(|e| crate::error::Error::Unsupported(format!("verbs: {e}")))?;
        let region = fabric
            .register_dmabuf(fd, offset, len, iova)
            .map_err(|e| crate::error::Error::io(format!("verbs {}", fabric.device()), e))?;
        Ok(Self { fabric, region })
    }

    /// The key peers name in writes to this memory.
    pub fn rkey(&self) -> u64 {
        self.region.rkey
    }

    /// The key local requests use.
    pub fn lkey(&self) -> u64 {
        self.region.local
    }
}

impl Drop for DmabufRegion {
    fn drop(&mut self) {
        self.fabric.deregister(&self.region);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::TransportPolicy as P;

    fn caps(verbs: bool, ofi: Option<bool>) -> RdmaCaps {
        RdmaCaps {
            verbs: verbs.then(|| "mlx5_0 port 1".into()),
            ofi: ofi.map(|_| "efa on rdmap0".into()),
            ofi_hardware: ofi == Some(true),
        }
    }

    #[test]
    fn auto_prefers_verbs_then_hardware_libfabric_then_tcp_and_never_within_a_host() {
        let both = caps(true, Some(true));
        assert_eq!(
            choose(P::Auto, &both, &both, false),
            Some(ProviderKind::Verbs)
        );
        assert_eq!(
            choose(P::Auto, &both, &both, true),
            None,
            "shared memory inside a host"
        );
        let efa = caps(false, Some(true));
        assert_eq!(choose(P::Auto, &both, &efa, false), Some(ProviderKind::Ofi));
        let tcp_only = caps(false, Some(false));
        assert_eq!(
            choose(P::Auto, &tcp_only, &tcp_only, false),
            None,
            "software ofi: TCP"
        );
        assert_eq!(choose(P::Auto, &both, &caps(false, None), false), None);
        for p in [P::Tcp, P::Shm] {
            assert_eq!(choose(p, &both, &both, false), None);
        }
    }

    #[test]
    fn forced_policies_apply_to_every_pair() {
        let tcp_only = caps(false, Some(false));
        assert_eq!(
            choose(P::Ofi, &tcp_only, &tcp_only, true),
            Some(ProviderKind::Ofi)
        );
        assert_eq!(
            choose(P::Rdma, &tcp_only, &tcp_only, true),
            Some(ProviderKind::Ofi)
        );
        let both = caps(true, Some(false));
        assert_eq!(
            choose(P::Rdma, &both, &both, true),
            Some(ProviderKind::Verbs)
        );
        assert_eq!(
            choose(P::Verbs, &tcp_only, &tcp_only, false),
            Some(ProviderKind::Verbs)
        );
    }
}
