//! What strata sees, for people (`collbench topo`) and for tools (its `--json`).

use crate::fabric::Fabric;
use crate::host::{GpuInfo, HostTopology, LinkLayer, NicInfo, PciKind, PciNode};
use crate::{Place, Tier};
use serde::Serialize;
use std::fmt::Write;

/// One tier of the fabric.
#[derive(Clone, Debug, Serialize)]
pub struct TierRow {
    /// The tier.
    pub tier: Tier,
    /// Bandwidth per endpoint, GB/s.
    pub bandwidth_gbps: f64,
    /// Bandwidth per endpoint with every endpoint below crossing this tier, GB/s.
    pub effective_gbps: f64,
    /// One-way latency, µs.
    pub latency_us: f64,
    /// Downlink : uplink ratio.
    pub oversubscription: f64,
}

/// An example pair of ranks joined by a tier.
#[derive(Clone, Debug, Serialize)]
pub struct PairRow {
    /// First rank.
    pub a: usize,
    /// Second rank.
    pub b: usize,
    /// The tier that joins them.
    pub tier: Tier,
}

/// The fabric in numbers.
#[derive(Clone, Debug, Serialize)]
pub struct FabricSummary {
    /// Where it came from.
    pub source: String,
    /// Hosts.
    pub hosts: usize,
    /// GPUs (ranks) per host.
    pub gpus_per_host: usize,
    /// Ranks.
    pub ranks: usize,
    /// Leaf switches.
    pub leaves: usize,
    /// Pods.
    pub pods: usize,
    /// Every tier, narrowest first.
    pub tiers: Vec<TierRow>,
    /// One rank pair per tier class, from rank 0.
    pub pairs: Vec<PairRow>,
    /// For a named host (`--host`): how many other hosts sit at each tier from it.
    pub from_host: Option<(String, Vec<(Tier, usize)>)>,
}

/// Everything `collbench topo` prints.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// Where the host model came from.
    pub host_source: String,
    /// NUMA nodes: (id, cpus).
    pub numa: Vec<(u32, String)>,
    /// GPUs with their nearest NICs.
    pub gpus: Vec<GpuInfo>,
    /// NICs.
    pub nics: Vec<NicInfo>,
    /// The fabric, when one is known.
    pub fabric: Option<FabricSummary>,
    /// What strata had to assume.
    pub notes: Vec<String>,
}

fn summarize(f: &Fabric, host: Option<&str>) -> Result<FabricSummary, String> {
    let (leaves, pods) = f.counts();
    let mut tiers: Vec<Tier> = vec![Tier::Host, Tier::Leaf, Tier::Pod, Tier::Aggregation];
    if f.tiers.nvlink.is_some() {
        tiers.insert(0, Tier::NvLink);
    }
    let tiers = tiers
        .into_iter()
        .map(|t| {
            let l = f.tiers.link(t);
            TierRow {
                tier: t,
                bandwidth_gbps: l.bandwidth_gbps,
                effective_gbps: l.effective_gbps(),
                latency_us: l.latency_us,
                oversubscription: l.oversubscription,
            }
        })
        .collect();
    // From rank 0: the first rank at each tier.
    let mut pairs = vec![PairRow {
        a: 0,
        b: 0,
        tier: Tier::SameDevice,
    }];
    let g = f.gpus_per_host.max(1);
    if g > 1 {
        pairs.push(PairRow {
            a: 0,
            b: 1,
            tier: f.rank_tier(0, 1).unwrap_or(Tier::Host),
        });
    }
    let home = f.place(0);
    for want in [Tier::Leaf, Tier::Pod, Tier::Aggregation] {
        let hit = (1..f.hosts()).find(|&h| match (home, f.place(h)) {
            (Some(a), Some(b)) => a.tier_to(&b) == want,
            _ => false,
        });
        if let Some(h) = hit {
            pairs.push(PairRow {
                a: 0,
                b: h * g,
                tier: want,
            });
        }
    }
    let from_host = match host {
        None => None,
        Some(name) => {
            let me: Place = f
                .place_of(name)
                .ok_or_else(|| format!("host '{name}' is not in {}", f.source))?;
            let mut counts: Vec<(Tier, usize)> =
                vec![(Tier::Leaf, 0), (Tier::Pod, 0), (Tier::Aggregation, 0)];
            for h in 0..f.hosts() {
                let Some(p) = f.place(h) else { continue };
                let t = me.tier_to(&p);
                if let Some(c) = counts.iter_mut().find(|(x, _)| *x == t) {
                    c.1 += 1;
                }
            }
            // This host is not its own leaf neighbour.
            counts[0].1 = counts[0].1.saturating_sub(1);
            Some((name.to_string(), counts))
        }
    };
    Ok(FabricSummary {
        source: f.source.clone(),
        hosts: f.hosts(),
        gpus_per_host: f.gpus_per_host,
        ranks: f.ranks(),
        leaves,
        pods,
        tiers,
        pairs,
        from_host,
    })
}

/// Builds the report for a host model and an optional fabric (`host`: a host name to place).
pub fn build(
    host: &HostTopology,
    fabric: Option<&Fabric>,
    host_name: Option<&str>,
) -> Result<Report, String> {
    let mut notes = Vec::new();
    let gpus = host.gpus();
    let nics = host.nics();
    if gpus.is_empty() {
        notes.push("no GPU found: host buffers only".to_string());
    }
    if nics.is_empty() {
        notes.push("no network device found on PCI".to_string());
    }
    let fabric = match fabric {
        Some(f) => Some(summarize(f, host_name)?),
        None => {
            notes.push("no fabric information: two tiers, same host and network".to_string());
            None
        }
    };
    Ok(Report {
        host_source: host.source.clone(),
        numa: host.numa.iter().map(|n| (n.id, n.cpus.clone())).collect(),
        gpus,
        nics,
        fabric,
        notes,
    })
}

fn label(n: &PciNode) -> String {
    match n.kind() {
        PciKind::Bridge => format!("{} switch/bridge", n.bus_id),
        PciKind::Gpu => {
            let mut s = format!("{} GPU", n.bus_id);
            for l in &n.nvlinks {
                let what = if l.to_switch { "NVSwitch" } else { "GPU" };
                let _ = write!(s, " [{}x NVLink to {what} {}]", l.count, l.target);
            }
            s
        }
        PciKind::Nic => {
            let net = n.net.clone().unwrap_or_default();
            let mut s = format!("{} NIC", n.bus_id);
            if let Some(name) = net.name {
                let _ = write!(s, " {name}");
            }
            let by_class = if n.class >> 8 == 0x0207 {
                LinkLayer::InfiniBand
            } else {
                LinkLayer::Ethernet
            };
            let _ = write!(s, " {}", net.link_layer.unwrap_or(by_class).name());
            if let Some(g) = net.speed_gbps {
                let _ = write!(s, " {g} Gb/s");
            }
            s
        }
        PciKind::Other => format!("{} class 0x{:06x}", n.bus_id, n.class),
    }
}

/// The report as text: the host as a tree, GPU↔NIC affinity, the fabric and its tiers.
pub fn render(r: &Report, host: &HostTopology) -> String {
    fn tree(out: &mut String, n: &PciNode, indent: usize) {
        let _ = writeln!(out, "{}{}", "  ".repeat(indent), label(n));
        for c in &n.children {
            tree(out, c, indent + 1);
        }
    }
    let mut out = String::new();
    let _ = writeln!(out, "host ({})", r.host_source);
    for n in &host.numa {
        let _ = writeln!(out, "  NUMA {} cpus {}", n.id, n.cpus);
        for p in &n.pci {
            tree(&mut out, p, 2);
        }
    }
    if !r.gpus.is_empty() {
        let _ = writeln!(out, "GPU -> nearest NICs");
        for g in &r.gpus {
            let _ = writeln!(
                out,
                "  {} (NUMA {}) -> {}",
                g.bus_id,
                g.numa,
                if g.nearest_nics.is_empty() {
                    "none".to_string()
                } else {
                    g.nearest_nics.join(", ")
                }
            );
        }
    }
    if let Some(f) = &r.fabric {
        let _ = writeln!(
            out,
            "fabric ({}): {} hosts x {} GPUs = {} ranks, {} leaves, {} pods",
            f.source, f.hosts, f.gpus_per_host, f.ranks, f.leaves, f.pods
        );
        for t in &f.tiers {
            let _ = writeln!(
                out,
                "  {:<12} {:>7.1} GB/s per endpoint ({:.1} at 1:{:.0}), {:.1} us",
                format!("{:?}", t.tier),
                t.bandwidth_gbps,
                t.effective_gbps,
                t.oversubscription,
                t.latency_us
            );
        }
        let _ = writeln!(out, "  rank pairs:");
        for p in &f.pairs {
            let _ = writeln!(out, "    {:>6} - {:<6} {:?}", p.a, p.b, p.tier);
        }
        if let Some((name, counts)) = &f.from_host {
            let _ = writeln!(out, "  from {name}:");
            for (t, c) in counts {
                let _ = writeln!(out, "    {c:>6} hosts at {t:?}");
            }
        }
    }
    for n in &r.notes {
        let _ = writeln!(out, "note: {n}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_of_a_fixture_and_the_meta_file() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let host =
            crate::nccl_xml::load(&dir.join("testdata/azure-ndv5-h100-nccl-topo.xml")).unwrap();
        let fabric =
            crate::fabric::load_file(&dir.join("../examples/topology/meta-24k-h100.toml")).unwrap();
        let r = build(&host, Some(&fabric), None).unwrap();
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["gpus"].as_array().unwrap().len(), 8);
        assert_eq!(json["gpus"][0]["bus_id"], "0001:00:00.0");
        assert_eq!(json["gpus"][0]["nearest_nics"][0], "0101:00:00.0");
        assert_eq!(json["nics"][7]["numa"], 1);
        assert_eq!(json["fabric"]["ranks"], 24_576);
        let tiers: Vec<&str> = r
            .fabric
            .as_ref()
            .unwrap()
            .pairs
            .iter()
            .map(|p| match p.tier {
                Tier::SameDevice => "dev",
                Tier::NvLink => "nvlink",
                Tier::Host => "host",
                Tier::Leaf => "leaf",
                Tier::Pod => "pod",
                Tier::Aggregation => "agg",
            })
            .collect();
        assert_eq!(tiers, ["dev", "nvlink", "leaf", "pod", "agg"]);
        let text = render(&r, &host);
        assert!(
            text.contains("0001:00:00.0 (NUMA 0) -> 0101:00:00.0"),
            "{text}"
        );
        assert!(
            text.contains("3072 hosts x 8 GPUs = 24576 ranks, 1536 leaves, 8 pods"),
            "{text}"
        );
    }

    #[test]
    fn slurm_host_counts_and_no_fabric_note() {
        let f = crate::fabric::parse_slurm(
            "SwitchName=s0 Nodes=n[1-4]\nSwitchName=s1 Nodes=n[5-8]\nSwitchName=s2 Nodes=n9\n\
             SwitchName=sp Switches=s[0-1]\n",
            "t.conf",
        )
        .unwrap();
        let r = build(&HostTopology::default(), Some(&f), Some("n2")).unwrap();
        let (_, counts) = r.fabric.unwrap().from_host.unwrap();
        assert_eq!(
            counts,
            vec![(Tier::Leaf, 3), (Tier::Pod, 4), (Tier::Aggregation, 1)]
        );
        assert!(build(&HostTopology::default(), Some(&f), Some("zz")).is_err());
        let r = build(&HostTopology::default(), None, None).unwrap();
        assert!(r.notes.iter().any(|n| n.contains("two tiers")));
    }
}
