//! Discovery from Linux sysfs: NUMA nodes, the PCIe tree above every GPU and NIC, and each
//! NIC's ports (InfiniBand devices with their link layer, rate and state; plain network
//! interfaces with their speed).
//!
//! Every path is read under a root (`/` on a real host), so tests build fake sysfs trees in
//! temporary folders. Missing files mean "unknown", never an error.

use crate::host::{HostTopology, LinkLayer, NetInfo, NumaNode, PciKind, PciNode};
use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::path::{Path, PathBuf};

fn read(path: &Path) -> Option<String> {
    // sysfs attributes are small; refuse anything that is not.
    let meta = fs::metadata(path).ok()?;
    if meta.len() > 1 << 16 {
        return None;
    }
    fs::read_to_string(path).ok().map(|s| s.trim().to_string())
}

/// Whether `s` looks like a PCI address `dddd:bb:dd.f`.
fn is_bus_id(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 12
        && b[4] == b':'
        && b[7] == b':'
        && b[10] == b'.'
        && s.chars()
            .enumerate()
            .all(|(i, c)| matches!(i, 4 | 7 | 10) || c.is_ascii_hexdigit())
}

struct Device {
    class: u32,
    numa: Option<u32>,
    /// Bus ids from the root port down to this device, inclusive.
    path: Vec<String>,
    link_speed: Option<String>,
    link_width: Option<u32>,
}

fn pci_device(root: &Path, bus_id: &str) -> Option<Device> {
    let link = root.join("sys/bus/pci/devices").join(bus_id);
    let real = fs::canonicalize(&link).ok()?;
    let path: Vec<String> = real
        .components()
        .filter_map(|c| c.as_os_str().to_str())
        .filter(|c| is_bus_id(c))
        .map(str::to_ascii_lowercase)
        .collect();
    let class = read(&real.join("class"))
        .and_then(|c| u32::from_str_radix(c.trim_start_matches("0x"), 16).ok())?;
    let numa = read(&real.join("numa_node"))
        .and_then(|n| n.parse::<i64>().ok())
        .and_then(|n| u32::try_from(n).ok());
    Some(Device {
        class,
        numa,
        path,
        link_speed: read(&real.join("current_link_speed")),
        link_width: read(&real.join("current_link_width")).and_then(|w| w.parse().ok()),
    })
}

/// The PCI function behind `class_dir/<name>/device`: the device itself, or the nearest PCI
/// ancestor for devices on a bus below PCI (virtio-net's `virtio0`).
fn bus_id_of(class_entry: &Path) -> Option<String> {
    let real = fs::canonicalize(class_entry.join("device")).ok()?;
    real.components()
        .rev()
        .filter_map(|c| c.as_os_str().to_str())
        .find(|c| is_bus_id(c))
        .map(str::to_ascii_lowercase)
}

/// The PCI function of network interface `name` (`eth0`), if it has one.
pub fn pci_of_interface(root: &Path, name: &str) -> Option<String> {
    if name.is_empty() || name.contains('/') || name.contains("..") {
        return None;
    }
    bus_id_of(&root.join("sys/class/net").join(name))
}

fn entries(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = fs::read_dir(dir)
        .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    v.sort();
    v
}

/// Network details of every NIC, by bus id: RDMA devices first (they carry the link layer),
/// then plain interfaces for speed and name where RDMA said nothing.
fn nic_details(root: &Path) -> HashMap<String, NetInfo> {
    let mut out: HashMap<String, NetInfo> = HashMap::new();
    for dev in entries(&root.join("sys/class/infiniband")) {
        let Some(bus) = bus_id_of(&dev) else { continue };
        let name = dev.file_name().and_then(|n| n.to_str()).map(str::to_string);
        // The first active port, else the first port.
        let ports = entries(&dev.join("ports"));
        let active = ports
            .iter()
            .find(|p| read(&p.join("state")).is_some_and(|s| s.contains("ACTIVE")))
            .or(ports.first());
        let mut info = NetInfo {
            name,
            ..Default::default()
        };
        if let Some(p) = active {
            info.port = p
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.parse().ok());
            // "400 Gb/sec (4X NDR)"
            info.speed_gbps = read(&p.join("rate"))
                .and_then(|r| r.split_whitespace().next().and_then(|x| x.parse().ok()));
            info.link_layer = read(&p.join("link_layer")).map(|l| match l.as_str() {
                "InfiniBand" => LinkLayer::InfiniBand,
                "Ethernet" => LinkLayer::Ethernet,
                _ => LinkLayer::Unknown,
            });
        }
        out.entry(bus).or_insert(info);
    }
    for dev in entries(&root.join("sys/class/net")) {
        let Some(bus) = bus_id_of(&dev) else { continue };
        let info = out.entry(bus).or_default();
        if info.name.is_none() {
            info.name = dev.file_name().and_then(|n| n.to_str()).map(str::to_string);
        }
        if info.speed_gbps.is_none() {
            // Mb/s; -1 when the link is down.
            info.speed_gbps = read(&dev.join("speed"))
                .and_then(|s| s.parse::<f64>().ok())
                .filter(|s| *s > 0.0)
                .map(|s| s / 1000.0);
        }
        if info.link_layer.is_none() {
            info.link_layer = Some(LinkLayer::Ethernet);
        }
    }
    out
}

/// Reads the host under `root` (`Path::new("/")` for this machine).
pub fn discover(root: &Path) -> HostTopology {
    let mut numa: BTreeMap<u32, NumaNode> = BTreeMap::new();
    for node in entries(&root.join("sys/devices/system/node")) {
        let Some(id) = node
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_prefix("node"))
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        numa.insert(
            id,
            NumaNode {
                id,
                cpus: read(&node.join("cpulist")).unwrap_or_default(),
                pci: Vec::new(),
            },
        );
    }
    let nets = nic_details(root);
    // Every GPU and NIC, and the bridges above them.
    let mut devices: BTreeMap<String, Device> = BTreeMap::new();
    for dev in entries(&root.join("sys/bus/pci/devices")) {
        let Some(bus) = dev
            .file_name()
            .and_then(|n| n.to_str())
            .map(str::to_ascii_lowercase)
        else {
            continue;
        };
        let Some(d) = pci_device(root, &bus) else {
            continue;
        };
        if matches!(PciKind::from_class(d.class), PciKind::Gpu | PciKind::Nic) {
            devices.insert(bus, d);
        }
    }
    let mut nodes: BTreeMap<String, (PciNode, Option<String>, u32)> = BTreeMap::new();
    let default_numa = numa.keys().next().copied().unwrap_or(0);
    for (bus, d) in &devices {
        let node_numa = d.numa.unwrap_or(default_numa);
        for (i, id) in d.path.iter().enumerate() {
            if nodes.contains_key(id) {
                continue;
            }
            let parent = i.checked_sub(1).map(|j| d.path[j].clone());
            let (class, speed, width) = if id == bus {
                (d.class, d.link_speed.clone(), d.link_width)
            } else {
                match pci_device(root, id) {
                    Some(b) => (b.class, b.link_speed, b.link_width),
                    None => (0x060400, None, None),
                }
            };
            let pn = PciNode {
                bus_id: id.clone(),
                class,
                link_speed: speed,
                link_width: width,
                net: if id == bus && PciKind::from_class(class) == PciKind::Nic {
                    nets.get(id).cloned()
                } else {
                    None
                },
                nvlinks: Vec::new(),
                children: Vec::new(),
            };
            nodes.insert(id.clone(), (pn, parent, node_numa));
        }
    }
    // Attach children to parents, deepest first.
    let mut order: Vec<String> = nodes.keys().cloned().collect();
    let depth = |id: &String, nodes: &BTreeMap<String, (PciNode, Option<String>, u32)>| {
        let mut d = 0;
        let mut cur = nodes.get(id).and_then(|n| n.1.clone());
        while let Some(p) = cur {
            d += 1;
            cur = nodes.get(&p).and_then(|n| n.1.clone());
        }
        d
    };
    order.sort_by_key(|id| std::cmp::Reverse(depth(id, &nodes)));
    for id in order {
        let Some((node, parent, n)) = nodes.remove(&id) else {
            continue;
        };
        match parent.and_then(|p| nodes.get_mut(&p)) {
            Some(p) => {
                p.0.children.push(node);
                p.0.children.sort_by(|a, b| a.bus_id.cmp(&b.bus_id));
            }
            None => {
                numa.entry(n)
                    .or_insert_with(|| NumaNode {
                        id: n,
                        cpus: String::new(),
                        pci: Vec::new(),
                    })
                    .pci
                    .push(node);
            }
        }
    }
    for n in numa.values_mut() {
        n.pci.sort_by(|a, b| a.bus_id.cmp(&b.bus_id));
    }
    HostTopology {
        numa: numa.into_values().collect(),
        source: format!("sysfs:{}", root.display()),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::host::PciDistance;
    use std::os::unix::fs::symlink;

    /// A fake sysfs tree in a fresh temporary folder, removed on drop.
    pub(crate) struct FakeSys {
        pub(crate) root: PathBuf,
    }

    impl Drop for FakeSys {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.root);
        }
    }

    impl FakeSys {
        pub(crate) fn new(tag: &str) -> Self {
            let root = std::env::temp_dir().join(format!(
                "strata-sysfs-{tag}-{}-{:?}",
                std::process::id(),
                std::thread::current().id()
            ));
            let _ = fs::remove_dir_all(&root);
            fs::create_dir_all(&root).unwrap();
            Self { root }
        }

        fn write(&self, rel: &str, text: &str) {
            let p = self.root.join(rel);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(p, text).unwrap();
        }

        pub(crate) fn numa(&self, id: u32, cpus: &str) {
            self.write(&format!("sys/devices/system/node/node{id}/cpulist"), cpus);
        }

        /// A PCI function at `path` (bus ids from the root port down), with its class.
        pub(crate) fn pci(&self, path: &[&str], class: u32, numa: i32) -> PathBuf {
            let mut dir = self.root.join("sys/devices/pci0000:00");
            for (i, id) in path.iter().enumerate() {
                dir = dir.join(id);
                let cls = if i + 1 == path.len() { class } else { 0x060400 };
                fs::create_dir_all(&dir).unwrap();
                fs::write(dir.join("class"), format!("0x{cls:06x}\n")).unwrap();
                fs::write(dir.join("numa_node"), format!("{numa}\n")).unwrap();
                let link = self.root.join("sys/bus/pci/devices").join(id);
                fs::create_dir_all(link.parent().unwrap()).unwrap();
                if !link.exists() {
                    symlink(&dir, &link).unwrap();
                }
            }
            fs::write(dir.join("current_link_speed"), "32.0 GT/s PCIe\n").unwrap();
            fs::write(dir.join("current_link_width"), "16\n").unwrap();
            dir
        }

        /// An RDMA device over the PCI function at `dev`.
        pub(crate) fn rdma(&self, name: &str, dev: &Path, layer: &str, rate: &str) {
            let d = self.root.join("sys/class/infiniband").join(name);
            fs::create_dir_all(d.join("ports/1")).unwrap();
            symlink(dev, d.join("device")).unwrap();
            fs::write(d.join("ports/1/link_layer"), format!("{layer}\n")).unwrap();
            fs::write(d.join("ports/1/rate"), format!("{rate}\n")).unwrap();
            fs::write(d.join("ports/1/state"), "4: ACTIVE\n").unwrap();
        }

        /// A network interface over the PCI function at `dev`.
        pub(crate) fn netdev(&self, name: &str, dev: &Path, speed_mbps: i64) {
            let d = self.root.join("sys/class/net").join(name);
            fs::create_dir_all(&d).unwrap();
            symlink(dev, d.join("device")).unwrap();
            fs::write(d.join("speed"), format!("{speed_mbps}\n")).unwrap();
        }
    }

    #[test]
    fn infiniband_host_with_two_numa_nodes() {
        let fs_ = FakeSys::new("ib");
        fs_.numa(0, "0-15");
        fs_.numa(1, "16-31");
        let gpu0 = ["0000:00:01.0", "0000:01:00.0", "0000:02:00.0"];
        let nic0 = ["0000:00:01.0", "0000:01:00.0", "0000:03:00.0"];
        let gpu1 = ["0000:80:01.0", "0000:81:00.0", "0000:82:00.0"];
        let nic1 = ["0000:80:01.0", "0000:81:00.0", "0000:83:00.0"];
        fs_.pci(&gpu0, 0x030200, 0);
        let n0 = fs_.pci(&nic0, 0x020700, 0);
        fs_.pci(&gpu1, 0x030200, 1);
        let n1 = fs_.pci(&nic1, 0x020700, 1);
        fs_.pci(&["0000:00:1f.0"], 0x060100, 0); // an ISA bridge: ignored
        fs_.rdma("mlx5_0", &n0, "InfiniBand", "400 Gb/sec (4X NDR)");
        fs_.rdma("mlx5_1", &n1, "InfiniBand", "400 Gb/sec (4X NDR)");
        let t = discover(&fs_.root);
        assert_eq!(t.numa.len(), 2);
        assert_eq!(t.numa[1].cpus, "16-31");
        let gpus = t.gpus();
        assert_eq!(gpus.len(), 2);
        assert_eq!(gpus[0].nearest_nics, vec!["0000:03:00.0"]);
        assert_eq!(gpus[1].nearest_nics, vec!["0000:83:00.0"]);
        assert_eq!(gpus[1].numa, 1);
        let nics = t.nics();
        assert_eq!(nics[0].net.name.as_deref(), Some("mlx5_0"));
        assert_eq!(nics[0].net.speed_gbps, Some(400.0));
        assert_eq!(nics[0].link_layer, LinkLayer::InfiniBand);
        assert_eq!(
            t.distance("0000:02:00.0", "0000:83:00.0"),
            Some(PciDistance::AcrossSockets)
        );
    }

    #[test]
    fn roce_nic_reports_ethernet_link_layer() {
        let fs_ = FakeSys::new("roce");
        fs_.numa(0, "0-7");
        let n = fs_.pci(&["0000:00:02.0", "0000:05:00.0"], 0x020000, 0);
        fs_.rdma("mlx5_0", &n, "Ethernet", "200 Gb/sec (4X HDR)");
        fs_.netdev("eth2", &n, 200_000);
        let t = discover(&fs_.root);
        let nics = t.nics();
        assert_eq!(nics.len(), 1);
        assert_eq!(nics[0].link_layer, LinkLayer::Ethernet);
        assert_eq!(nics[0].net.name.as_deref(), Some("mlx5_0"));
        assert_eq!(nics[0].net.speed_gbps, Some(200.0));
        assert!(t.gpus().is_empty());
    }

    #[test]
    fn host_without_nics_or_gpus_and_an_empty_root() {
        let fs_ = FakeSys::new("bare");
        fs_.numa(0, "0-1");
        fs_.pci(&["0000:00:01.0"], 0x010802, -1); // an NVMe drive only
        let t = discover(&fs_.root);
        assert_eq!(t.numa.len(), 1);
        assert!(t.gpus().is_empty() && t.nics().is_empty());
        let empty = FakeSys::new("empty");
        assert_eq!(discover(&empty.root).numa.len(), 0);
        let plain = FakeSys::new("eth");
        let n = plain.pci(&["0000:00:03.0"], 0x020000, -1);
        // virtio-net: the interface's device is a virtio node below the PCI function.
        let virtio = n.join("virtio0");
        fs::create_dir_all(&virtio).unwrap();
        plain.netdev("ens3", &virtio, -1);
        let t = discover(&plain.root);
        let nics = t.nics();
        assert_eq!(nics.len(), 1);
        assert_eq!(nics[0].net.name.as_deref(), Some("ens3"));
        assert_eq!(
            pci_of_interface(&plain.root, "ens3").as_deref(),
            Some("0000:00:03.0")
        );
        assert_eq!(pci_of_interface(&plain.root, "lo"), None);
        assert_eq!(pci_of_interface(&plain.root, "../x"), None);
        assert_eq!(nics[0].net.speed_gbps, None);
        assert_eq!(nics[0].numa, 0);
    }

    #[test]
    fn this_machine_reads_without_failing() {
        let t = discover(Path::new("/"));
        assert!(!t.numa.is_empty() || !Path::new("/sys/devices/system/node").exists());
    }
}
