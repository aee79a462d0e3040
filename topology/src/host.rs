//! The inside of one host: NUMA nodes, the PCIe tree under each, GPUs, NICs and NVLink.
//!
//! Every source (NCCL topology XML, sysfs, hwloc) produces a [`HostTopology`]; the questions
//! strata asks of it — which NIC is nearest a GPU, which GPUs share NVLink — are answered here
//! once for all of them.

use serde::{Deserialize, Serialize};

/// What a PCI function is, from its class code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PciKind {
    /// A bridge or switch port (class 0x0604).
    Bridge,
    /// A GPU (class 0x0300 display or 0x0302 3D controller).
    Gpu,
    /// A network controller: InfiniBand (0x0207) or Ethernet (0x0200).
    Nic,
    /// Anything else.
    Other,
}

impl PciKind {
    /// Classifies a PCI class code (24 bits: class, subclass, programming interface).
    pub fn from_class(class: u32) -> Self {
        match class >> 8 {
            0x0604 => PciKind::Bridge,
            0x0300 | 0x0302 => PciKind::Gpu,
            0x0200 | 0x0207 => PciKind::Nic,
            _ => PciKind::Other,
        }
    }
}

/// The link layer of a NIC port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum LinkLayer {
    /// InfiniBand.
    InfiniBand,
    /// Ethernet; an RDMA device with this link layer is RoCE.
    Ethernet,
    /// Not reported.
    Unknown,
}

impl LinkLayer {
    /// The name used in reports.
    pub fn name(self) -> &'static str {
        match self {
            LinkLayer::InfiniBand => "InfiniBand",
            LinkLayer::Ethernet => "Ethernet",
            LinkLayer::Unknown => "unknown",
        }
    }
}

/// A NIC's network-facing details, where the source knows them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NetInfo {
    /// Device name (`mlx5_0`, `eth0`).
    pub name: Option<String>,
    /// Port number (1-based for InfiniBand).
    pub port: Option<u32>,
    /// Port speed in Gb/s.
    pub speed_gbps: Option<f64>,
    /// The port's link layer.
    pub link_layer: Option<LinkLayer>,
}

/// An NVLink connection from a GPU.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NvLink {
    /// Bus id of the peer GPU, or of the NVSwitch.
    pub target: String,
    /// Number of links.
    pub count: u32,
    /// Whether the target is an NVSwitch rather than a GPU.
    pub to_switch: bool,
}

/// One PCI function and what hangs below it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PciNode {
    /// `dddd:bb:dd.f`, lower case.
    pub bus_id: String,
    /// The 24-bit class code.
    pub class: u32,
    /// Link speed as the source gave it (`32.0 GT/s PCIe`).
    pub link_speed: Option<String>,
    /// Link width in lanes.
    pub link_width: Option<u32>,
    /// Network details for NICs.
    pub net: Option<NetInfo>,
    /// NVLinks for GPUs.
    pub nvlinks: Vec<NvLink>,
    /// Functions behind this one (for bridges).
    pub children: Vec<PciNode>,
}

impl PciNode {
    /// The node's kind, from its class.
    pub fn kind(&self) -> PciKind {
        PciKind::from_class(self.class)
    }
}

/// A NUMA node: its CPUs and the PCIe tree attached to it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NumaNode {
    /// The NUMA node id.
    pub id: u32,
    /// Its CPUs, as the source gave them (a hex mask or a cpulist).
    pub cpus: String,
    /// Top-level PCI functions (root ports or switches) under this node.
    pub pci: Vec<PciNode>,
}

/// Everything strata knows about the inside of one host.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HostTopology {
    /// NUMA nodes in id order.
    pub numa: Vec<NumaNode>,
    /// Where this came from (`nccl-xml:/path`, `sysfs`).
    pub source: String,
}

/// A GPU as seen from the host model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GpuInfo {
    /// PCI bus id.
    pub bus_id: String,
    /// NUMA node it is attached to.
    pub numa: u32,
    /// Bus ids of the NICs nearest to it (see [`HostTopology::nearest_nics`]).
    pub nearest_nics: Vec<String>,
    /// Its NVLinks.
    pub nvlinks: Vec<NvLink>,
}

/// A NIC as seen from the host model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NicInfo {
    /// PCI bus id.
    pub bus_id: String,
    /// NUMA node it is attached to.
    pub numa: u32,
    /// Network details.
    pub net: NetInfo,
    /// InfiniBand, or Ethernet, by class when the port does not say.
    pub link_layer: LinkLayer,
}

/// How far apart two PCI functions of one host are, nearest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum PciDistance {
    /// Behind a common PCIe switch; `levels_up` counts bridges from the deeper of the two to
    /// the nearest common one (fewer is nearer).
    SameSwitch {
        /// Bridges between the devices and their nearest common switch.
        levels_up: u32,
    },
    /// Under the same NUMA node's root complex, no common switch.
    SameNuma,
    /// On different NUMA nodes (across the inter-socket link).
    AcrossSockets,
}

/// A function found by walking the tree: the node, its NUMA node and its ancestors' bus ids.
struct Found<'a> {
    node: &'a PciNode,
    numa: u32,
    path: Vec<&'a str>,
}

impl HostTopology {
    fn walk(&self) -> Vec<Found<'_>> {
        fn visit<'a>(n: &'a PciNode, numa: u32, path: &mut Vec<&'a str>, out: &mut Vec<Found<'a>>) {
            out.push(Found {
                node: n,
                numa,
                path: path.clone(),
            });
            path.push(&n.bus_id);
            for c in &n.children {
                visit(c, numa, path, out);
            }
            path.pop();
        }
        let mut out = Vec::new();
        for numa in &self.numa {
            for n in &numa.pci {
                visit(n, numa.id, &mut Vec::new(), &mut out);
            }
        }
        out
    }

    fn find(&self, bus_id: &str) -> Option<Found<'_>> {
        let want = bus_id.to_ascii_lowercase();
        self.walk().into_iter().find(|f| f.node.bus_id == want)
    }

    /// The GPUs, in bus-id order, each with its nearest NICs.
    pub fn gpus(&self) -> Vec<GpuInfo> {
        let mut gpus: Vec<GpuInfo> = self
            .walk()
            .into_iter()
            .filter(|f| f.node.kind() == PciKind::Gpu)
            .map(|f| GpuInfo {
                bus_id: f.node.bus_id.clone(),
                numa: f.numa,
                nearest_nics: self.nearest_nics(&f.node.bus_id),
                nvlinks: f.node.nvlinks.clone(),
            })
            .collect();
        gpus.sort_by(|a, b| a.bus_id.cmp(&b.bus_id));
        gpus
    }

    /// The NICs, in bus-id order.
    pub fn nics(&self) -> Vec<NicInfo> {
        let mut nics: Vec<NicInfo> = self
            .walk()
            .into_iter()
            .filter(|f| f.node.kind() == PciKind::Nic)
            .map(|f| {
                let net = f.node.net.clone().unwrap_or_default();
                let by_class = if f.node.class >> 8 == 0x0207 {
                    LinkLayer::InfiniBand
                } else {
                    LinkLayer::Ethernet
                };
                NicInfo {
                    bus_id: f.node.bus_id.clone(),
                    numa: f.numa,
                    link_layer: net.link_layer.unwrap_or(by_class),
                    net,
                }
            })
            .collect();
        nics.sort_by(|a, b| a.bus_id.cmp(&b.bus_id));
        nics
    }

    /// How far apart two functions are, or `None` if either is not in the model.
    pub fn distance(&self, a: &str, b: &str) -> Option<PciDistance> {
        let (fa, fb) = (self.find(a)?, self.find(b)?);
        if fa.numa != fb.numa {
            return Some(PciDistance::AcrossSockets);
        }
        let common = fa
            .path
            .iter()
            .zip(&fb.path)
            .take_while(|(x, y)| x == y)
            .count();
        if common == 0 {
            return Some(PciDistance::SameNuma);
        }
        let up = (fa.path.len().max(fb.path.len()) - common) as u32;
        Some(PciDistance::SameSwitch { levels_up: up })
    }

    /// The NICs nearest the function `bus_id` by PCIe distance: all those that tie for
    /// nearest (same switch, then same NUMA node, then across sockets).
    pub fn nearest_nics(&self, bus_id: &str) -> Vec<String> {
        let ranked: Vec<(PciDistance, String)> = self
            .nics()
            .into_iter()
            .filter_map(|n| Some((self.distance(bus_id, &n.bus_id)?, n.bus_id)))
            .collect();
        let Some(best) = ranked.iter().map(|(d, _)| *d).min() else {
            return Vec::new();
        };
        ranked
            .into_iter()
            .filter(|(d, _)| *d == best)
            .map(|(_, b)| b)
            .collect()
    }
}
