//! The fabric between hosts: which leaf switch and which pod each host hangs under, and what
//! each tier costs per endpoint.
//!
//! Sources: strata's own topology file (TOML or JSON) describing a fat tree compactly or as
//! explicit leaves of hosts, and Slurm's `topology.conf` (tree and block plugins).

use crate::error::{MAX_INPUT_BYTES, TopoError};
use crate::{Tier, hostlist};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

pub use crate::costs::{MemoryTier, SlotFill, TierCosts, TierLink};

/// Where a host sits in the fabric.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Place {
    /// Global index of its pod.
    pub pod: usize,
    /// Global index of its leaf switch.
    pub leaf: usize,
}

impl Place {
    /// The tier joining two different hosts at these places.
    pub fn tier_to(&self, other: &Place) -> Tier {
        if self.leaf == other.leaf {
            Tier::Leaf
        } else if self.pod == other.pod {
            Tier::Pod
        } else {
            Tier::Aggregation
        }
    }
}

/// How hosts are laid out.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Layout {
    /// A regular fat tree: host h is under leaf h / hosts_per_leaf, in pod
    /// leaf / leaves_per_pod.
    FatTree {
        /// Hosts under each leaf switch.
        hosts_per_leaf: usize,
        /// Leaves per pod.
        leaves_per_pod: usize,
        /// Pods.
        pods: usize,
    },
    /// Named hosts at explicit places, in file order.
    Named {
        /// Host names in order.
        hosts: Vec<String>,
        /// The place of each host, same order.
        places: Vec<Place>,
    },
}

/// The fabric strata routes over.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Fabric {
    /// Ranks (GPUs) per host, for mapping a rank to its host.
    pub gpus_per_host: usize,
    /// Where hosts are.
    pub layout: Layout,
    /// What each tier costs.
    pub tiers: TierCosts,
    /// Where this came from.
    pub source: String,
}

/// Largest fabric accepted: 16 M hosts.
const MAX_FABRIC_HOSTS: usize = 1 << 24;

impl Fabric {
    /// Number of hosts.
    pub fn hosts(&self) -> usize {
        match &self.layout {
            Layout::FatTree {
                hosts_per_leaf,
                leaves_per_pod,
                pods,
            } => hosts_per_leaf * leaves_per_pod * pods,
            Layout::Named { hosts, .. } => hosts.len(),
        }
    }

    /// Number of ranks (hosts × GPUs per host).
    pub fn ranks(&self) -> usize {
        self.hosts() * self.gpus_per_host
    }

    /// The place of host index `h`.
    pub fn place(&self, h: usize) -> Option<Place> {
        match &self.layout {
            Layout::FatTree {
                hosts_per_leaf,
                leaves_per_pod,
                ..
            } => (h < self.hosts()).then(|| {
                let leaf = h / hosts_per_leaf;
                Place {
                    leaf,
                    pod: leaf / leaves_per_pod,
                }
            }),
            Layout::Named { places, .. } => places.get(h).copied(),
        }
    }

    /// The place of the host called `name` (named layouts only).
    pub fn place_of(&self, name: &str) -> Option<Place> {
        match &self.layout {
            Layout::Named { hosts, places } => {
                hosts.iter().position(|h| h == name).map(|i| places[i])
            }
            Layout::FatTree { .. } => None,
        }
    }

    /// The tier joining ranks `a` and `b` when ranks fill hosts in order, `gpus_per_host` each.
    pub fn rank_tier(&self, a: usize, b: usize) -> Option<Tier> {
        let g = self.gpus_per_host.max(1);
        let (ha, hb) = (a / g, b / g);
        if a == b {
            return (a < self.ranks()).then_some(Tier::SameDevice);
        }
        if ha == hb {
            return (ha < self.hosts()).then_some(if self.tiers.nvlink.is_some() {
                Tier::NvLink
            } else {
                Tier::Host
            });
        }
        Some(self.place(ha)?.tier_to(&self.place(hb)?))
    }

    /// Counts of leaves and pods.
    pub fn counts(&self) -> (usize, usize) {
        match &self.layout {
            Layout::FatTree {
                leaves_per_pod,
                pods,
                ..
            } => (leaves_per_pod * pods, *pods),
            Layout::Named { places, .. } => {
                let leaves: std::collections::HashSet<usize> =
                    places.iter().map(|p| p.leaf).collect();
                let pods: std::collections::HashSet<usize> = places.iter().map(|p| p.pod).collect();
                (leaves.len(), pods.len())
            }
        }
    }
}

/// strata's topology file.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileSpec {
    #[serde(default = "one_usize")]
    gpus_per_host: usize,
    #[serde(default)]
    fat_tree: Option<FatTreeSpec>,
    #[serde(default)]
    leaves: Option<Vec<LeafSpec>>,
    #[serde(default)]
    tiers: TierCosts,
}

fn one_usize() -> usize {
    1
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FatTreeSpec {
    hosts_per_leaf: usize,
    leaves_per_pod: usize,
    pods: usize,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LeafSpec {
    /// Hostlist expression of the hosts under this leaf.
    hosts: String,
    /// Pod name; leaves without one are pods of their own.
    #[serde(default)]
    pod: Option<String>,
}

fn line_of(text: &str, offset: usize) -> u32 {
    text[..offset.min(text.len())].matches('\n').count() as u32 + 1
}

/// Reads strata's own files: JSON when `text` starts with `{`, TOML otherwise; errors name
/// `file` and the line.
pub(crate) fn parse_toml_or_json<T: serde::de::DeserializeOwned>(
    text: &str,
    file: &str,
) -> Result<T, TopoError> {
    if text.len() > MAX_INPUT_BYTES {
        return Err(TopoError::at(file, 0, "input too large"));
    }
    if text.trim_start().starts_with('{') {
        serde_json::from_str(text).map_err(|e| TopoError::at(file, e.line() as u32, e.to_string()))
    } else {
        toml::from_str(text).map_err(|e| {
            let line = e.span().map_or(0, |s| line_of(text, s.start));
            TopoError::at(file, line, e.message().to_string())
        })
    }
}

/// Parses strata's topology file: JSON when it starts with `{`, TOML otherwise.
///
/// ```toml
/// gpus_per_host = 8
/// [fat_tree]            # or: [[leaves]] hosts = "node[001-016]"  pod = "p0"
/// hosts_per_leaf = 2
/// leaves_per_pod = 192
/// pods = 8
/// [tiers.aggregation]
/// bandwidth_gbps = 50.0
/// latency_us = 5.0
/// oversubscription = 7.0
/// ```
pub fn parse_file(text: &str, file: &str) -> Result<Fabric, TopoError> {
    let spec: FileSpec = parse_toml_or_json(text, file)?;
    let bad = |m: String| TopoError::at(file, 0, m);
    if spec.gpus_per_host == 0 || spec.gpus_per_host > 1024 {
        return Err(bad(format!(
            "gpus_per_host is {}; expected 1 to 1024",
            spec.gpus_per_host
        )));
    }
    spec.tiers.check().map_err(bad)?;
    let layout = match (spec.fat_tree, spec.leaves) {
        (Some(f), None) => {
            let hosts = f
                .hosts_per_leaf
                .checked_mul(f.leaves_per_pod)
                .and_then(|x| x.checked_mul(f.pods));
            if f.hosts_per_leaf == 0 || f.leaves_per_pod == 0 || f.pods == 0 {
                return Err(bad("fat_tree: every count must be at least 1".into()));
            }
            if hosts.is_none_or(|h| h > MAX_FABRIC_HOSTS) {
                return Err(bad(format!("fat_tree: more than {MAX_FABRIC_HOSTS} hosts")));
            }
            Layout::FatTree {
                hosts_per_leaf: f.hosts_per_leaf,
                leaves_per_pod: f.leaves_per_pod,
                pods: f.pods,
            }
        }
        (None, Some(leaves)) => {
            let mut hosts = Vec::new();
            let mut places = Vec::new();
            let mut pods: HashMap<String, usize> = HashMap::new();
            for (i, leaf) in leaves.iter().enumerate() {
                let pod = match &leaf.pod {
                    Some(p) => {
                        let next = pods.len() + leaves.len();
                        *pods.entry(p.clone()).or_insert(next)
                    }
                    None => i,
                };
                let names = hostlist::expand(&leaf.hosts)
                    .map_err(|e| bad(format!("leaves[{i}].hosts: {e}")))?;
                if hosts.len() + names.len() > MAX_FABRIC_HOSTS {
                    return Err(bad(format!("more than {MAX_FABRIC_HOSTS} hosts")));
                }
                for n in names {
                    hosts.push(n);
                    places.push(Place { pod, leaf: i });
                }
            }
            named(hosts, places, file)?
        }
        _ => {
            return Err(bad(
                "expected exactly one of [fat_tree] and [[leaves]]".into()
            ));
        }
    };
    Ok(Fabric {
        gpus_per_host: spec.gpus_per_host,
        layout,
        tiers: spec.tiers,
        source: format!("topology-file:{file}"),
    })
}

fn named(hosts: Vec<String>, places: Vec<Place>, file: &str) -> Result<Layout, TopoError> {
    let mut seen = std::collections::HashSet::new();
    for h in &hosts {
        if !seen.insert(h.as_str()) {
            return Err(TopoError::at(file, 0, format!("host {h} is listed twice")));
        }
    }
    Ok(Layout::Named { hosts, places })
}

/// Reads strata's topology file.
pub fn load_file(path: &std::path::Path) -> Result<Fabric, TopoError> {
    let text = crate::error::read_file(path)?;
    parse_file(&text, &path.display().to_string())
}

/// Parses Slurm's `topology.conf`. Tree plugin: a switch with `Nodes=` is a leaf, its parent
/// switch (the one listing it in `Switches=`) is its pod, and anything higher is the
/// aggregation layer. Block plugin: each `BlockName=` is a pod of one leaf.
pub fn parse_slurm(text: &str, file: &str) -> Result<Fabric, TopoError> {
    if text.len() > MAX_INPUT_BYTES {
        return Err(TopoError::at(file, 0, "input too large"));
    }
    struct Switch {
        line: u32,
        nodes: Vec<String>,
        children: Vec<String>,
    }
    let mut switches: Vec<(String, Switch)> = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = (i + 1) as u32;
        let content = raw.split('#').next().unwrap_or("").trim();
        if content.is_empty() {
            continue;
        }
        let mut name = None;
        let mut sw = Switch {
            line,
            nodes: Vec::new(),
            children: Vec::new(),
        };
        for field in content.split_whitespace() {
            let (k, v) = field
                .split_once('=')
                .ok_or_else(|| TopoError::at(file, line, format!("'{field}' is not Key=Value")))?;
            let expand = |v: &str| hostlist::expand(v).map_err(|e| TopoError::at(file, line, e));
            match k.to_ascii_lowercase().as_str() {
                "switchname" | "blockname" => name = Some(v.to_string()),
                "nodes" => sw.nodes = expand(v)?,
                "switches" => sw.children = expand(v)?,
                "linkspeed" | "blocksizes" => {}
                _ => {
                    return Err(TopoError::at(
                        file,
                        line,
                        format!(
                            "unknown key '{k}'; expected SwitchName, BlockName, Nodes, Switches, LinkSpeed or BlockSizes"
                        ),
                    ));
                }
            }
        }
        match name {
            Some(n) => switches.push((n, sw)),
            None if content.to_ascii_lowercase().starts_with("blocksizes") => {}
            None => {
                return Err(TopoError::at(
                    file,
                    line,
                    "expected SwitchName= or BlockName= on this line",
                ));
            }
        }
    }
    let index: HashMap<&str, usize> = switches
        .iter()
        .enumerate()
        .map(|(i, (n, _))| (n.as_str(), i))
        .collect();
    let mut parent: Vec<Option<usize>> = vec![None; switches.len()];
    for (i, (_, sw)) in switches.iter().enumerate() {
        for c in &sw.children {
            let &j = index.get(c.as_str()).ok_or_else(|| {
                TopoError::at(file, sw.line, format!("switch '{c}' is not defined"))
            })?;
            parent[j] = Some(i);
        }
    }
    let mut hosts = Vec::new();
    let mut places = Vec::new();
    for (i, (_, sw)) in switches.iter().enumerate() {
        for n in &sw.nodes {
            hosts.push(n.clone());
            places.push(Place {
                leaf: i,
                pod: parent[i].unwrap_or(i),
            });
        }
    }
    if hosts.is_empty() {
        return Err(TopoError::at(file, 0, "no switch lists any Nodes="));
    }
    Ok(Fabric {
        gpus_per_host: 1,
        layout: named(hosts, places, file)?,
        tiers: TierCosts::default(),
        source: format!("slurm:{file}"),
    })
}

/// This host's switch path from `SLURM_TOPOLOGY_ADDR` (`s0.s4.node7`) and
/// `SLURM_TOPOLOGY_ADDR_PATTERN` (`switch.switch.node`): the switches, top first.
pub fn slurm_switch_path(addr: &str, pattern: &str) -> Result<Vec<String>, String> {
    let parts: Vec<&str> = addr.split('.').collect();
    let kinds: Vec<&str> = pattern.split('.').collect();
    if parts.len() != kinds.len() {
        return Err(format!(
            "SLURM_TOPOLOGY_ADDR '{addr}' has {} parts but the pattern '{pattern}' has {}",
            parts.len(),
            kinds.len()
        ));
    }
    Ok(parts
        .iter()
        .zip(&kinds)
        .filter(|(_, k)| **k == "switch")
        .map(|(p, _)| p.to_string())
        .collect())
}

/// The tier joining two hosts from their switch paths (top first): sharing the last switch is
/// the same leaf, the one above it the same pod, anything else the aggregation layer.
pub fn tier_from_paths(a: &[String], b: &[String]) -> Tier {
    match (a.last(), b.last()) {
        (Some(x), Some(y)) if x == y => Tier::Leaf,
        _ if a.len() >= 2 && b.len() >= 2 && a[a.len() - 2] == b[b.len() - 2] => Tier::Pod,
        _ => Tier::Aggregation,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn meta() -> Fabric {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../examples/topology/meta-24k-h100.toml");
        load_file(&path).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn the_meta_like_cluster_loads_and_places_ranks() {
        let t0 = std::time::Instant::now();
        let f = meta();
        assert!(t0.elapsed() < std::time::Duration::from_secs(1));
        assert_eq!(
            (f.ranks(), f.hosts(), f.counts()),
            (24_576, 3_072, (1_536, 8))
        );
        let t = |a, b| f.rank_tier(a, b).unwrap();
        assert_eq!(t(0, 0), Tier::SameDevice);
        assert_eq!(t(0, 7), Tier::NvLink);
        assert_eq!(t(0, 8), Tier::Leaf); // the other server of the rack
        assert_eq!(t(0, 16), Tier::Pod); // next rack
        assert_eq!(t(0, 3_071), Tier::Pod); // last GPU of pod 0
        assert_eq!(t(0, 3_072), Tier::Aggregation); // first GPU of pod 1
        assert_eq!(t(24_575, 24_560), Tier::Leaf);
        assert_eq!(t(24_575, 24_559), Tier::Pod);
        assert_eq!(f.rank_tier(0, 24_576), None);
        let agg = f.tiers.link(Tier::Aggregation);
        assert_eq!(agg.oversubscription, 7.0);
        assert!((agg.effective_gbps() - agg.bandwidth_gbps / 7.0).abs() < 1e-9);
    }

    #[test]
    fn explicit_leaves_json_and_errors() {
        let f = parse_file(
            r#"{"gpus_per_host": 2, "leaves": [
                {"hosts": "a[1-2]", "pod": "p"}, {"hosts": "b1", "pod": "p"}, {"hosts": "c1"}]}"#,
            "x.json",
        )
        .unwrap();
        assert_eq!(f.hosts(), 4);
        let place = |n| f.place_of(n).unwrap();
        assert_eq!(place("a1").tier_to(&place("a2")), Tier::Leaf);
        assert_eq!(place("a1").tier_to(&place("b1")), Tier::Pod);
        assert_eq!(place("a1").tier_to(&place("c1")), Tier::Aggregation);
        assert_eq!(f.rank_tier(0, 1), Some(Tier::Host));
        let e = parse_file(
            "gpus_per_host = 8\n[fat_tree]\nhosts_per_leaf = \"two\"\n",
            "y.toml",
        )
        .unwrap_err();
        assert_eq!((e.file.as_str(), e.line), ("y.toml", 3));
        let e = parse_file(
            "[fat_tree]\nhosts_per_leaf = 2\nleaves_per_pod = 0\npods = 1\n",
            "z.toml",
        )
        .unwrap_err();
        assert!(e.message.contains("at least 1"), "{e}");
        let e = parse_file("gpus_per_host = 8\n", "w.toml").unwrap_err();
        assert!(e.message.contains("exactly one"), "{e}");
        let e = parse_file(
            "[fat_tree]\nhosts_per_leaf = 99999999\nleaves_per_pod = 99999999\npods = 99999999\n",
            "v.toml",
        )
        .unwrap_err();
        assert!(e.message.contains("more than"), "{e}");
        let e = parse_file("bogus = 1\n", "u.toml").unwrap_err();
        assert_eq!(e.line, 1);
        let tree = "[fat_tree]\nhosts_per_leaf = 2\nleaves_per_pod = 2\npods = 1\n";
        let f = parse_file(
            &format!(
                "{tree}[tiers.pod]\nbandwidth_gbps = 1\nlatency_us = 1\nshared_efficiency = 0.8\n"
            ),
            "s.toml",
        )
        .unwrap();
        assert_eq!(f.tiers.pod.shared_efficiency, 0.8);
        assert_eq!(f.tiers.leaf.shared_efficiency, 1.0);
        for bad in ["0", "1.5", "-1"] {
            let e = parse_file(&format!("{tree}[tiers.pod]\nbandwidth_gbps = 1\nlatency_us = 1\nshared_efficiency = {bad}\n"), "s.toml").unwrap_err();
            assert!(e.message.contains("shared_efficiency"), "{bad}: {e}");
        }
    }

    #[test]
    fn slurm_tree_and_block_plugins() {
        let conf = "# two leaves under one spine, a third leaf under another\n\
            SwitchName=s0 Nodes=node[01-04] LinkSpeed=100\n\
            SwitchName=s1 Nodes=node[05-08]\n\
            SwitchName=s2 Nodes=node[09-10]\n\
            SwitchName=spine0 Switches=s[0-1]\n\
            SwitchName=spine1 Switches=s2\n\
            SwitchName=top Switches=spine[0-1]\n";
        let f = parse_slurm(conf, "topology.conf").unwrap();
        assert_eq!(f.hosts(), 10);
        let p = |n| f.place_of(n).unwrap();
        assert_eq!(p("node01").tier_to(&p("node04")), Tier::Leaf);
        assert_eq!(p("node01").tier_to(&p("node05")), Tier::Pod);
        assert_eq!(p("node01").tier_to(&p("node10")), Tier::Aggregation);
        let blocks = parse_slurm(
            "BlockName=b1 Nodes=n[1-2]\nBlockName=b2 Nodes=n[3-4]\nBlockSizes=2,4\n",
            "t",
        )
        .unwrap();
        let p = |n| blocks.place_of(n).unwrap();
        assert_eq!(p("n1").tier_to(&p("n2")), Tier::Leaf);
        assert_eq!(p("n1").tier_to(&p("n3")), Tier::Aggregation);
        let e = parse_slurm(
            "SwitchName=s0 Nodes=a\nSwitchName=s1 Switches=s9\n",
            "bad.conf",
        )
        .unwrap_err();
        assert_eq!(
            (e.line, e.message.as_str()),
            (2, "switch 's9' is not defined")
        );
        let e = parse_slurm("SwitchName=s0 Nodes=a[1-\n", "bad2.conf").unwrap_err();
        assert_eq!(e.line, 1);
        let e = parse_slurm("SwitchName=s0 Colour=red\n", "bad3.conf").unwrap_err();
        assert!(e.message.contains("unknown key 'Colour'"), "{e}");
    }

    #[test]
    fn slurm_topology_addr() {
        let a = slurm_switch_path("s0.s4.node7", "switch.switch.node").unwrap();
        assert_eq!(a, ["s0", "s4"]);
        let b = slurm_switch_path("s0.s5.node9", "switch.switch.node").unwrap();
        let c = slurm_switch_path("s1.s6.node1", "switch.switch.node").unwrap();
        assert_eq!(tier_from_paths(&a, &a), Tier::Leaf);
        assert_eq!(tier_from_paths(&a, &b), Tier::Pod);
        assert_eq!(tier_from_paths(&a, &c), Tier::Aggregation);
        assert!(slurm_switch_path("s0.node1", "switch.switch.node").is_err());
    }

    proptest! {
        #[test]
        fn parsers_never_panic(text in "[ -~\\n]{0,300}") {
            let _ = parse_file(&text, "fuzz");
            let _ = parse_slurm(&text, "fuzz");
        }
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let text = String::from_utf8_lossy(&bytes);
            let _ = parse_file(&text, "fuzz");
            let _ = parse_slurm(&text, "fuzz");
        }
    }
}
