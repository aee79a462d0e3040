//! NCCL's topology XML (`NCCL_TOPO_FILE`): import into a [`HostTopology`], and export of one.
//!
//! The format: `<system version="1">` holds `<cpu numaid affinity …>` elements, each holding
//! nested `<pci busid class link_speed link_width>` elements; a GPU's `<pci>` holds
//! `<gpu …><nvlink target count tclass/></gpu>`, a NIC's holds `<nic><net name dev speed port
//! …/></nic>`. Elements and attributes strata does not use are ignored.

use crate::error::{MAX_INPUT_BYTES, TopoError};
use crate::host::{HostTopology, NetInfo, NumaNode, NvLink, PciNode};
use std::fmt::Write;

/// The class of an NVSwitch in NCCL's `tclass` attribute.
const NVSWITCH_CLASS: u32 = 0x068000;
/// Deepest PCI nesting accepted; real trees are a handful of levels.
const MAX_DEPTH: usize = 32;

struct Ctx<'a> {
    doc: &'a roxmltree::Document<'a>,
    file: &'a str,
}

impl Ctx<'_> {
    fn err(&self, node: roxmltree::Node, message: impl Into<String>) -> TopoError {
        let line = self.doc.text_pos_at(node.range().start).row;
        TopoError::at(self.file, line, message)
    }

    fn required<'n>(
        &self,
        node: roxmltree::Node<'n, '_>,
        attr: &str,
    ) -> Result<&'n str, TopoError> {
        node.attribute(attr).ok_or_else(|| {
            self.err(
                node,
                format!("<{}> needs a '{attr}' attribute", node.tag_name().name()),
            )
        })
    }

    fn number<T: std::str::FromStr>(
        &self,
        node: roxmltree::Node,
        attr: &str,
        text: &str,
    ) -> Result<T, TopoError> {
        text.trim().parse().map_err(|_| {
            self.err(
                node,
                format!("'{attr}' is '{text}'; expected a decimal number"),
            )
        })
    }

    fn hex(&self, node: roxmltree::Node, attr: &str, text: &str) -> Result<u32, TopoError> {
        let t = text.trim();
        let digits = t
            .strip_prefix("0x")
            .or_else(|| t.strip_prefix("0X"))
            .unwrap_or(t);
        u32::from_str_radix(digits, 16).map_err(|_| {
            self.err(
                node,
                format!("'{attr}' is '{text}'; expected a hexadecimal number such as 0x030200"),
            )
        })
    }
}

/// Parses NCCL topology XML. `file` names the input in errors.
pub fn parse(text: &str, file: &str) -> Result<HostTopology, TopoError> {
    if text.len() > MAX_INPUT_BYTES {
        return Err(TopoError::at(file, 0, "input too large"));
    }
    let opts = roxmltree::ParsingOptions {
        allow_dtd: false,
        nodes_limit: 1 << 20,
    };
    let doc = roxmltree::Document::parse_with_options(text, opts)
        .map_err(|e| TopoError::at(file, e.pos().row, format!("not well-formed XML: {e}")))?;
    let cx = Ctx { doc: &doc, file };
    let root = doc.root_element();
    if root.tag_name().name() != "system" {
        return Err(cx.err(
            root,
            format!(
                "root element is <{}>; expected <system>",
                root.tag_name().name()
            ),
        ));
    }
    let mut numa = Vec::new();
    for cpu in root.children().filter(|n| n.has_tag_name("cpu")) {
        let id = cx.number(cpu, "numaid", cx.required(cpu, "numaid")?)?;
        let mut pci = Vec::new();
        for p in cpu.children().filter(|n| n.has_tag_name("pci")) {
            pci.push(parse_pci(&cx, p, 0)?);
        }
        numa.push(NumaNode {
            id,
            cpus: cpu.attribute("affinity").unwrap_or_default().to_string(),
            pci,
        });
    }
    numa.sort_by_key(|n| n.id);
    Ok(HostTopology {
        numa,
        source: format!("nccl-xml:{file}"),
    })
}

fn parse_pci(cx: &Ctx, node: roxmltree::Node, depth: usize) -> Result<PciNode, TopoError> {
    if depth > MAX_DEPTH {
        return Err(cx.err(node, format!("PCI tree deeper than {MAX_DEPTH} levels")));
    }
    let bus_id = cx.required(node, "busid")?.trim().to_ascii_lowercase();
    let class = cx.hex(node, "class", cx.required(node, "class")?)?;
    let link_width = match node.attribute("link_width") {
        Some(w) => Some(cx.number(node, "link_width", w)?),
        None => None,
    };
    let mut out = PciNode {
        bus_id,
        class,
        link_speed: node.attribute("link_speed").map(str::to_string),
        link_width,
        net: None,
        nvlinks: Vec::new(),
        children: Vec::new(),
    };
    for child in node.children().filter(|n| n.is_element()) {
        match child.tag_name().name() {
            "pci" => out.children.push(parse_pci(cx, child, depth + 1)?),
            "gpu" => {
                for l in child.children().filter(|n| n.has_tag_name("nvlink")) {
                    let tclass = match l.attribute("tclass") {
                        Some(t) => cx.hex(l, "tclass", t)?,
                        None => 0,
                    };
                    out.nvlinks.push(NvLink {
                        target: cx.required(l, "target")?.trim().to_ascii_lowercase(),
                        count: cx.number(l, "count", l.attribute("count").unwrap_or("1"))?,
                        to_switch: tclass == NVSWITCH_CLASS,
                    });
                }
            }
            "nic" => {
                if let Some(net) = child.children().find(|n| n.has_tag_name("net")) {
                    // NCCL gives speed in Mb/s.
                    let speed = match net.attribute("speed") {
                        Some(s) => Some(cx.number::<f64>(net, "speed", s)? / 1000.0),
                        None => None,
                    };
                    let port = match net.attribute("port") {
                        Some(p) => Some(cx.number(net, "port", p)?),
                        None => None,
                    };
                    out.net = Some(NetInfo {
                        name: net.attribute("name").map(str::to_string),
                        port,
                        speed_gbps: speed,
                        link_layer: None,
                    });
                }
            }
            _ => {}
        }
    }
    Ok(out)
}

/// Reads an NCCL topology XML file.
pub fn load(path: &std::path::Path) -> Result<HostTopology, TopoError> {
    let text = crate::error::read_file(path)?;
    parse(&text, &path.display().to_string())
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('"', "&quot;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Writes `topo` as NCCL topology XML that [`parse`] (and NCCL) read back.
pub fn export(topo: &HostTopology) -> String {
    fn pci(out: &mut String, n: &PciNode, indent: usize) {
        let pad = " ".repeat(indent);
        let _ = write!(
            out,
            "{pad}<pci busid=\"{}\" class=\"0x{:06x}\"",
            escape(&n.bus_id),
            n.class
        );
        if let Some(s) = &n.link_speed {
            let _ = write!(out, " link_speed=\"{}\"", escape(s));
        }
        if let Some(w) = n.link_width {
            let _ = write!(out, " link_width=\"{w}\"");
        }
        let has_body = !n.children.is_empty() || n.net.is_some() || !n.nvlinks.is_empty();
        if !has_body {
            out.push_str("/>\n");
            return;
        }
        out.push_str(">\n");
        if !n.nvlinks.is_empty() {
            let _ = writeln!(out, "{pad}  <gpu>");
            for l in &n.nvlinks {
                let tclass = if l.to_switch {
                    NVSWITCH_CLASS
                } else {
                    0x030200
                };
                let _ = writeln!(
                    out,
                    "{pad}    <nvlink target=\"{}\" count=\"{}\" tclass=\"0x{tclass:06x}\"/>",
                    escape(&l.target),
                    l.count
                );
            }
            let _ = writeln!(out, "{pad}  </gpu>");
        }
        if let Some(net) = &n.net {
            let _ = write!(out, "{pad}  <nic>\n{pad}    <net");
            if let Some(name) = &net.name {
                let _ = write!(out, " name=\"{}\"", escape(name));
            }
            if let Some(s) = net.speed_gbps {
                let _ = write!(out, " speed=\"{}\"", (s * 1000.0).round() as u64);
            }
            if let Some(p) = net.port {
                let _ = write!(out, " port=\"{p}\"");
            }
            let _ = write!(out, "/>\n{pad}  </nic>\n");
        }
        for c in &n.children {
            pci(out, c, indent + 2);
        }
        let _ = writeln!(out, "{pad}</pci>");
    }
    let mut out = String::from("<system version=\"1\">\n");
    for numa in &topo.numa {
        let _ = writeln!(
            out,
            "  <cpu numaid=\"{}\" affinity=\"{}\">",
            numa.id,
            escape(&numa.cpus)
        );
        for n in &numa.pci {
            pci(&mut out, n, 4);
        }
        out.push_str("  </cpu>\n");
    }
    out.push_str("</system>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::{LinkLayer, PciDistance};
    use proptest::prelude::*;

    fn fixture(name: &str) -> HostTopology {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("testdata")
            .join(name);
        load(&path).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn ndv5_pairs_every_gpu_with_the_nic_under_its_own_switch() {
        let t = fixture("azure-ndv5-h100-nccl-topo.xml");
        let gpus = t.gpus();
        let nics = t.nics();
        assert_eq!((gpus.len(), nics.len(), t.numa.len()), (8, 8, 2));
        assert!(nics.iter().all(|n| n.link_layer == LinkLayer::InfiniBand));
        let mut used = std::collections::HashSet::new();
        for g in &gpus {
            assert_eq!(g.nearest_nics.len(), 1, "{g:?}");
            let nic = &g.nearest_nics[0];
            assert!(used.insert(nic.clone()), "{nic} serves two GPUs");
            assert_eq!(
                t.distance(&g.bus_id, nic),
                Some(PciDistance::SameSwitch { levels_up: 0 })
            );
        }
        // GPU 0001:00:00.0 sits with NIC 0101:00:00.0 under switch ffff:ff:01.0 on NUMA 0.
        assert_eq!(gpus[0].nearest_nics, vec!["0101:00:00.0".to_string()]);
        assert_eq!(gpus[0].numa, 0);
        assert_eq!(
            t.distance("0001:00:00.0", "0102:00:00.0"),
            Some(PciDistance::SameNuma)
        );
        assert_eq!(
            t.distance("0001:00:00.0", "0105:00:00.0"),
            Some(PciDistance::AcrossSockets)
        );
    }

    #[test]
    fn ndv4_switches_share_two_nics_between_two_gpus() {
        let t = fixture("azure-ndv4-a100-nccl-topo.xml");
        let gpus = t.gpus();
        assert_eq!((gpus.len(), t.nics().len(), t.numa.len()), (8, 8, 4));
        for g in &gpus {
            assert_eq!(g.nearest_nics.len(), 2, "{g:?}");
        }
        let by_bus = |b: &str| {
            gpus.iter()
                .find(|g| g.bus_id == b)
                .unwrap()
                .nearest_nics
                .clone()
        };
        assert_eq!(by_bus("0003:00:00.0"), vec!["0103:00:00.0", "0104:00:00.0"]);
        assert_eq!(by_bus("0004:00:00.0"), by_bus("0003:00:00.0"));
        assert_eq!(by_bus("000d:00:00.0"), vec!["0107:00:00.0", "0108:00:00.0"]);
    }

    #[test]
    fn export_round_trips() {
        for f in [
            "azure-ndv5-h100-nccl-topo.xml",
            "azure-ndv4-a100-nccl-topo.xml",
        ] {
            let t = fixture(f);
            let back = parse(&export(&t), "export").unwrap();
            assert_eq!(back.numa, t.numa, "{f}");
        }
        let with_net = r#"<system version="1"><cpu numaid="0" affinity="ff">
            <pci busid="0000:01:00.0" class="0x030200"><gpu dev="0" sm="90">
              <nvlink target="0000:02:00.0" count="18" tclass="0x068000"/></gpu></pci>
            <pci busid="0000:03:00.0" class="0x020700"><nic>
              <net name="mlx5_0" dev="0" speed="400000" port="1"/></nic></pci>
            </cpu></system>"#;
        let t = parse(with_net, "inline").unwrap();
        let g = &t.gpus()[0];
        assert_eq!(
            g.nvlinks,
            vec![NvLink {
                target: "0000:02:00.0".into(),
                count: 18,
                to_switch: true
            }]
        );
        let n = &t.nics()[0];
        assert_eq!(n.net.name.as_deref(), Some("mlx5_0"));
        assert_eq!(n.net.speed_gbps, Some(400.0));
        assert_eq!(parse(&export(&t), "again").unwrap().numa, t.numa);
    }

    #[test]
    fn errors_name_file_line_and_what_was_expected() {
        let e = parse("<system>\n<cpu>\n</cpu></system>", "a.xml").unwrap_err();
        assert_eq!((e.file.as_str(), e.line), ("a.xml", 2));
        assert!(e.message.contains("numaid"), "{e}");
        let e = parse(
            "<system><cpu numaid=\"0\">\n\n<pci busid=\"x\" class=\"zz\"/></cpu></system>",
            "b.xml",
        )
        .unwrap_err();
        assert_eq!(e.line, 3);
        assert!(e.message.contains("hexadecimal"), "{e}");
        let e = parse("<topology/>", "c.xml").unwrap_err();
        assert!(
            e.to_string()
                .starts_with("c.xml:1: root element is <topology>"),
            "{e}"
        );
        let e = parse("<system><cpu", "d.xml").unwrap_err();
        assert!(e.message.contains("not well-formed"), "{e}");
        let deep = format!(
            "<system><cpu numaid=\"0\">{}{}</cpu></system>",
            "<pci busid=\"a\" class=\"0x060400\">".repeat(40),
            "</pci>".repeat(40)
        );
        assert!(
            parse(&deep, "deep.xml")
                .unwrap_err()
                .message
                .contains("deeper")
        );
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
            let text = String::from_utf8_lossy(&bytes);
            let _ = parse(&text, "fuzz");
        }

        #[test]
        fn mangled_fixtures_never_panic(cut in 0usize..3305, insert in "[<>\"=/a-z0-9 ]{0,12}") {
            let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("testdata/azure-ndv5-h100-nccl-topo.xml");
            let text = std::fs::read_to_string(path).unwrap();
            let cut = text.char_indices().map(|(i, _)| i).take_while(|&i| i <= cut).last().unwrap_or(0);
            let mangled = format!("{}{}{}", &text[..cut], insert, &text[cut..]);
            let _ = parse(&mangled, "fuzz");
        }
    }
}
