//! Discovery through hwloc (feature `hwloc`, linked against the system's libhwloc 2.x), from
//! this machine or from an hwloc XML export (`lstopo --of xml`) of any machine.
//!
//! Binding: `hwlocality`, chosen over `hwloc2` because it is maintained (releases through
//! 2024–2025 against hwloc 2.x, a safe API with lifetimes tied to the topology, CI on Linux,
//! macOS and Windows), while `hwloc2` has had no release since 2021 and exposes raw pointers.
//!
//! hwloc's I/O tree is already the PCIe tree: host bridges are dropped (their root ports
//! become top-level functions, as sysfs shows them), PCI bridges and switches stay, and only
//! branches that lead to a GPU or NIC are kept. Each branch is attached to the NUMA node of
//! the nearest CPU-side object above it.

use crate::error::TopoError;
use crate::host::{HostTopology, LinkLayer, NetInfo, NumaNode, PciKind, PciNode};
use hwlocality::Topology;
use hwlocality::object::TopologyObject;
use hwlocality::object::attributes::{ObjectAttributes, PCIDeviceAttributes, UpstreamAttributes};
use hwlocality::object::types::{OSDeviceType, ObjectType};
use hwlocality::topology::builder::TypeFilter;
use std::collections::BTreeMap;

fn bus_id(a: &PCIDeviceAttributes) -> String {
    format!(
        "{:04x}:{:02x}:{:02x}.{:x}",
        a.domain(),
        a.bus_id(),
        a.bus_device(),
        a.function()
    )
}

fn pci_of(obj: &TopologyObject) -> Option<&PCIDeviceAttributes> {
    match obj.attributes()? {
        ObjectAttributes::PCIDevice(a) => Some(a),
        ObjectAttributes::Bridge(b) => match b.upstream_attributes()? {
            UpstreamAttributes::PCI(a) => Some(a),
        },
        _ => None,
    }
}

/// Converts an I/O object and what is below it; `None` when nothing below is a GPU or NIC.
/// A host bridge yields its children in place of itself.
fn convert(obj: &TopologyObject, out: &mut Vec<PciNode>) {
    let kids = |out: &mut Vec<PciNode>| {
        for c in obj.io_children() {
            convert(c, out);
        }
    };
    match obj.object_type() {
        ObjectType::Bridge => match pci_of(obj) {
            None => kids(out),
            Some(a) => {
                let mut children = Vec::new();
                for c in obj.io_children() {
                    convert(c, &mut children);
                }
                if !children.is_empty() {
                    out.push(PciNode {
                        bus_id: bus_id(a),
                        class: 0x060400,
                        link_speed: link_speed(a),
                        link_width: None,
                        net: None,
                        nvlinks: Vec::new(),
                        children,
                    });
                }
            }
        },
        ObjectType::PCIDevice => {
            let Some(a) = pci_of(obj) else { return };
            let class = u32::from(a.class_id()) << 8;
            let kind = PciKind::from_class(class);
            if !matches!(kind, PciKind::Gpu | PciKind::Nic) {
                return;
            }
            let mut net = None;
            if kind == PciKind::Nic {
                let mut info = NetInfo::default();
                for os in obj.io_children() {
                    let Some(ObjectAttributes::OSDevice(d)) = os.attributes() else {
                        continue;
                    };
                    let name = os.name().map(|n| n.to_string_lossy().into_owned());
                    match d.device_type() {
                        OSDeviceType::OpenFabrics => {
                            info.name = name;
                            if class >> 8 == 0x0207 {
                                info.link_layer = Some(LinkLayer::InfiniBand);
                            }
                        }
                        OSDeviceType::Network if info.name.is_none() => info.name = name,
                        _ => {}
                    }
                }
                net = Some(info);
            }
            out.push(PciNode {
                bus_id: bus_id(a),
                class,
                link_speed: link_speed(a),
                link_width: None,
                net,
                nvlinks: Vec::new(),
                children: Vec::new(),
            });
        }
        _ => {}
    }
}

fn link_speed(a: &PCIDeviceAttributes) -> Option<String> {
    let s = a.link_speed();
    (s > 0.0).then(|| format!("{s:.1} GB/s"))
}

/// The NUMA node of the nearest CPU-side ancestor of an I/O object.
fn numa_of(obj: &TopologyObject) -> u32 {
    obj.ancestors()
        .find_map(|a| a.nodeset().and_then(|n| n.first_set()))
        .map_or(0, |i| usize::from(i) as u32)
}

fn from_topology(topo: &Topology, source: String) -> HostTopology {
    let mut numa: BTreeMap<u32, NumaNode> = BTreeMap::new();
    for n in topo.objects_with_type(ObjectType::NUMANode) {
        let id = n.os_index().unwrap_or(0) as u32;
        numa.insert(
            id,
            NumaNode {
                id,
                // Displayed as `CpuSet(0-15)`; keep the list.
                cpus: n
                    .cpuset()
                    .map(|c| {
                        let s = c.to_string();
                        s.trim_start_matches("CpuSet(")
                            .trim_end_matches(')')
                            .to_string()
                    })
                    .unwrap_or_default(),
                pci: Vec::new(),
            },
        );
    }
    // Top-level I/O objects: those whose parent is a CPU-side object.
    let tops = topo
        .objects_with_type(ObjectType::Bridge)
        .chain(topo.objects_with_type(ObjectType::PCIDevice))
        .filter(|o| o.parent().is_some_and(|p| !p.object_type().is_io()));
    for top in tops {
        let mut nodes = Vec::new();
        convert(top, &mut nodes);
        let id = numa_of(top);
        numa.entry(id)
            .or_insert_with(|| NumaNode {
                id,
                cpus: String::new(),
                pci: Vec::new(),
            })
            .pci
            .extend(nodes);
    }
    for n in numa.values_mut() {
        n.pci.sort_by(|a, b| a.bus_id.cmp(&b.bus_id));
    }
    HostTopology {
        numa: numa.into_values().collect(),
        source,
    }
}

fn hwloc_err(file: &str, e: impl std::fmt::Display) -> TopoError {
    TopoError::at(file, 0, format!("hwloc: {e}"))
}

/// Reads this machine through hwloc.
pub fn discover() -> Result<HostTopology, TopoError> {
    let topo = Topology::builder()
        .with_io_type_filter(TypeFilter::KeepImportant)
        .map_err(|e| hwloc_err("this host", e))?
        .build()
        .map_err(|e| hwloc_err("this host", e))?;
    Ok(from_topology(&topo, "hwloc".into()))
}

/// Object types that describe I/O and carry no CPU or node sets.
const IO_TYPES: [&str; 4] = ["Bridge", "PCIDev", "OSDev", "Misc"];

/// An hwloc bitmap string (`0x0000000f`, `0xffffffff,0x00000003`) as 32-bit words, lowest
/// first.
fn bitmap_words(s: &str) -> Option<Vec<u32>> {
    s.split(',')
        .rev()
        .map(|w| {
            let w = w.trim();
            let digits = w.strip_prefix("0x").unwrap_or(w);
            if digits.is_empty() {
                Some(0)
            } else {
                u32::from_str_radix(digits, 16).ok()
            }
        })
        .collect()
}

fn subset(child: &[u32], parent: &[u32]) -> bool {
    child
        .iter()
        .enumerate()
        .all(|(i, w)| w & !parent.get(i).copied().unwrap_or(0) == 0)
}

/// Checks what hwloc 2.9 trusts without checking: it crashed (SIGSEGV in
/// `hwloc_bitmap_compare_first`) on an export whose Core lacked `complete_cpuset`. Every CPU-side
/// object must carry well-formed cpu and node sets, each inside its parent's.
fn validate(text: &str, file: &str) -> Result<(), TopoError> {
    let opts = roxmltree::ParsingOptions {
        allow_dtd: true,
        nodes_limit: 1 << 20,
    };
    let doc = roxmltree::Document::parse_with_options(text, opts)
        .map_err(|e| TopoError::at(file, e.pos().row, format!("not well-formed XML: {e}")))?;
    let root = doc.root_element();
    let line = |n: roxmltree::Node| doc.text_pos_at(n.range().start).row;
    if root.tag_name().name() != "topology" {
        return Err(TopoError::at(file, 1, "expected a <topology> root element"));
    }
    // hwloc 3 writes `version="3.0"` by default, which the hwloc 2 linked here refuses with a
    // bare EINVAL; say what it is and how to get a file it reads.
    let version = root.attribute("version").unwrap_or("1.0");
    let major: u32 = version
        .split('.')
        .next()
        .and_then(|m| m.trim().parse().ok())
        .unwrap_or(0);
    if major >= 3 {
        return Err(TopoError::at(
            file,
            line(root),
            format!(
                "this is an hwloc {major} XML export (<topology version=\"{version}\">), and strata \
                 is built on hwloc 2, which reads version 1 and 2 exports only; re-export it with \
                 hwloc 3's `lstopo --of v2xml FILE` or hwloc 2's `lstopo --of xml FILE`"
            ),
        ));
    }
    let sets = ["cpuset", "complete_cpuset", "nodeset", "complete_nodeset"];
    for obj in root.descendants().filter(|n| n.has_tag_name("object")) {
        let ty = obj
            .attribute("type")
            .ok_or_else(|| TopoError::at(file, line(obj), "<object> needs a 'type' attribute"))?;
        if IO_TYPES.contains(&ty) {
            continue;
        }
        let parent = obj.ancestors().skip(1).find(|a| a.has_tag_name("object"));
        for set in sets {
            let value = obj.attribute(set).ok_or_else(|| {
                TopoError::at(
                    file,
                    line(obj),
                    format!("<object type=\"{ty}\"> needs a '{set}' attribute"),
                )
            })?;
            let words = bitmap_words(value).ok_or_else(|| {
                TopoError::at(
                    file,
                    line(obj),
                    format!("'{set}' is '{value}'; expected an hwloc bitmap such as 0x0000000f"),
                )
            })?;
            if let Some(p) = parent.and_then(|p| p.attribute(set)).and_then(bitmap_words)
                && !subset(&words, &p)
            {
                return Err(TopoError::at(
                    file,
                    line(obj),
                    format!("'{set}' of this {ty} is not inside its parent's"),
                ));
            }
        }
    }
    Ok(())
}

/// Reads an hwloc XML export. strata checks the sets hwloc relies on first, then hwloc
/// validates the rest; its message is passed on.
pub fn load_xml(path: &std::path::Path) -> Result<HostTopology, TopoError> {
    let name = path.display().to_string();
    let text = crate::error::read_file(path)?;
    validate(&text, &name)?;
    let topo = Topology::builder()
        .from_xml(&text)
        .map_err(|e| hwloc_err(&name, e))?
        .with_io_type_filter(TypeFilter::KeepAll)
        .map_err(|e| hwloc_err(&name, e))?
        .build()
        .map_err(|e| hwloc_err(&name, e))?;
    Ok(from_topology(&topo, format!("hwloc-xml:{name}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::PciDistance;

    #[test]
    fn a_two_socket_export_loads_with_affinity() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("testdata/two-socket-2gpu-2nic.hwloc.xml");
        let t = load_xml(&path).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(t.numa.len(), 2, "{t:#?}");
        assert_eq!(
            (t.numa[0].cpus.as_str(), t.numa[1].cpus.as_str()),
            ("0-1", "2-3")
        );
        let gpus = t.gpus();
        assert_eq!(gpus.len(), 2, "{t:#?}");
        assert_eq!(gpus[0].bus_id, "0000:1b:00.0");
        assert_eq!(gpus[0].numa, 0);
        assert_eq!(gpus[0].nearest_nics, vec!["0000:1c:00.0"]);
        assert_eq!(gpus[1].numa, 1);
        assert_eq!(gpus[1].nearest_nics, vec!["0000:9c:00.0"]);
        let nics = t.nics();
        assert_eq!(nics[0].net.name.as_deref(), Some("mlx5_0"));
        assert_eq!(nics[0].link_layer, LinkLayer::InfiniBand);
        assert_eq!(
            t.distance("0000:1b:00.0", "0000:9c:00.0"),
            Some(PciDistance::AcrossSockets)
        );
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]
        /// Mangled exports must come back as errors or models, never as a crash (hwloc itself
        /// crashed on some before `validate` screened them).
        #[test]
        fn mangled_exports_never_crash(cut in 0usize..7000, insert in "[<>\"=/a-z0-9 ]{0,12}") {
            let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("testdata/two-socket-2gpu-2nic.hwloc.xml");
            let text = std::fs::read_to_string(path).unwrap();
            let cut = cut.min(text.len());
            let cut = (0..=cut).rev().find(|&i| text.is_char_boundary(i)).unwrap_or(0);
            let mangled = format!("{}{}{}", &text[..cut], insert, &text[cut..]);
            let file = std::env::temp_dir().join(format!(
                "strata-hwloc-fuzz-{}-{:?}.xml",
                std::process::id(),
                std::thread::current().id()
            ));
            std::fs::write(&file, mangled).unwrap();
            let _ = load_xml(&file);
            let _ = std::fs::remove_file(&file);
        }
    }

    #[test]
    fn exports_that_crashed_hwloc_are_refused_first() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("testdata/two-socket-2gpu-2nic.hwloc.xml");
        let text = std::fs::read_to_string(path).unwrap();
        // Renaming a Core's complete_cpuset made hwloc 2.9 dereference a null bitmap.
        let crashed = text.replacen(
            "<object type=\"Core\" os_index=\"1\" cpuset=\"0x00000002\" complete_cpuset",
            "<object type=\"Core\" os_index=\"1\" cpuset=\"0x00000002\" completdme_cpuset",
            1,
        );
        assert_ne!(crashed, text);
        let e = validate(&crashed, "x.xml").unwrap_err();
        assert!(e.message.contains("'complete_cpuset'"), "{e}");
        assert_eq!(e.line, 14);
        let outside = text.replacen("cpuset=\"0x00000002\"", "cpuset=\"0x00000010\"", 1);
        let e = validate(&outside, "y.xml").unwrap_err();
        assert!(e.message.contains("not inside its parent"), "{e}");
        assert!(validate(&text, "ok.xml").is_ok());
    }

    #[test]
    fn this_machine_and_bad_input() {
        let t = discover().unwrap();
        assert!(!t.numa.is_empty());
        let bad = std::env::temp_dir().join(format!("strata-bad-hwloc-{}.xml", std::process::id()));
        // Not XML at all: strata's own check answers, with the line.
        std::fs::write(&bad, "<topology version=\"2.0\"><object type=\"Nonsense\"").unwrap();
        let e = load_xml(&bad).unwrap_err();
        assert!(e.message.contains("not well-formed") && e.line == 1, "{e}");
        // Well-formed, with every set in place, but a type hwloc does not know: hwloc answers.
        let sets =
            "cpuset=\"0x1\" complete_cpuset=\"0x1\" nodeset=\"0x1\" complete_nodeset=\"0x1\"";
        std::fs::write(
            &bad,
            format!("<topology version=\"2.0\"><object type=\"Nonsense\" {sets}/></topology>"),
        )
        .unwrap();
        let e = load_xml(&bad).unwrap_err();
        assert!(e.message.starts_with("hwloc:"), "{e}");
        // An hwloc 3 export of the test host: named as such, with the way to re-export it.
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("testdata/two-socket-2gpu-2nic.hwloc.xml");
        let v2 = std::fs::read_to_string(path).unwrap();
        let v3 = v2.replace("<topology version=\"2.0\">", "<topology version=\"3.0\">");
        assert_ne!(v2, v3);
        std::fs::write(&bad, v3).unwrap();
        let e = load_xml(&bad).unwrap_err();
        let _ = std::fs::remove_file(&bad);
        assert!(e.message.contains("hwloc 3 XML export"), "{e}");
        assert!(e.message.contains("lstopo --of v2xml"), "{e}");
        assert_eq!(e.line, 6, "{e}");
        assert!(!e.message.contains("errno"), "{e}");
    }
}
