//! The tier between every pair of ranks of a communicator.
//!
//! At init every rank publishes a [`RankPlace`] (its GPU, NIC and switch path) beside its
//! [`HostIdentity`]; every rank then builds the same [`TierMatrix`] from the same list. It
//! stores one small tuple per rank and computes an entry on demand instead of holding p × p
//! tiers, so it stays small at 100,000 ranks; its digest covers everything the tiers and
//! their costs depend on, so equal digests mean equal matrices.

use crate::fabric::{Fabric, Layout, TierCosts, TierLink, slurm_switch_path, tier_from_paths};
use crate::{HostIdentity, Tier};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// Where one rank sits, as it tells the others at init.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RankPlace {
    /// PCI bus id of its GPU, if it uses one.
    #[serde(default)]
    pub gpu: Option<String>,
    /// PCI bus id of its NIC, if known.
    #[serde(default)]
    pub nic: Option<String>,
    /// Switches above its host, top first (`[pod, leaf]` or Slurm's path); empty if unknown.
    #[serde(default)]
    pub switches: Vec<String>,
}

impl RankPlace {
    /// The switch path of `host_name` / `rank` in `fabric`: `["pod<P>", "leaf<L>"]`.
    pub fn from_fabric(fabric: &Fabric, host_name: &str, rank: usize) -> Option<Vec<String>> {
        let place = match &fabric.layout {
            Layout::Named { .. } => fabric.place_of(host_name)?,
            Layout::FatTree { .. } => fabric.place(rank / fabric.gpus_per_host.max(1))?,
        };
        Some(vec![
            format!("pod{}", place.pod),
            format!("leaf{}", place.leaf),
        ])
    }

    /// The switch path from Slurm's `SLURM_TOPOLOGY_ADDR` and `SLURM_TOPOLOGY_ADDR_PATTERN`
    /// values, when both are set and agree.
    pub fn from_slurm(addr: Option<&str>, pattern: Option<&str>) -> Option<Vec<String>> {
        let path = slurm_switch_path(addr?, pattern?).ok()?;
        (!path.is_empty()).then_some(path)
    }
}

/// The tiers of a communicator, computed identically on every rank.
#[derive(Clone, Debug, PartialEq)]
pub struct TierMatrix {
    /// Per rank: host index (first-seen order), GPU, and switch path.
    ranks: Vec<(usize, Option<String>, Vec<String>)>,
    /// Whether every rank has a switch path (otherwise ranks on different hosts are just
    /// "network").
    fabric_known: bool,
    hosts: usize,
    costs: TierCosts,
}

impl TierMatrix {
    /// Builds the matrix from every rank's host identity and place, in rank order, with the
    /// cost of each tier (from the fabric file, or defaults).
    pub fn new(ranks: &[(HostIdentity, RankPlace)], costs: TierCosts) -> Self {
        let mut host_ids: Vec<&HostIdentity> = Vec::new();
        let mut out = Vec::with_capacity(ranks.len());
        // Hosts are few; a map from boot id + netns keeps this linear in ranks.
        let mut index: HashMap<(&str, &str), usize> = HashMap::new();
        for (h, place) in ranks {
            let key = (h.boot_id.as_str(), h.netns.as_str());
            let id = if h.boot_id.is_empty() {
                // Unknown identity: a host of its own.
                host_ids.push(h);
                host_ids.len() - 1
            } else {
                *index.entry(key).or_insert_with(|| {
                    host_ids.push(h);
                    host_ids.len() - 1
                })
            };
            out.push((id, place.gpu.clone(), place.switches.clone()));
        }
        let fabric_known = !out.is_empty() && out.iter().all(|r| !r.2.is_empty());
        Self {
            ranks: out,
            fabric_known,
            hosts: host_ids.len(),
            costs,
        }
    }

    /// Number of ranks.
    pub fn len(&self) -> usize {
        self.ranks.len()
    }

    /// Whether the map has no ranks.
    pub fn is_empty(&self) -> bool {
        self.ranks.is_empty()
    }

    /// Number of distinct hosts.
    pub fn hosts(&self) -> usize {
        self.hosts
    }

    /// Whether ranks on different hosts are placed by a fabric; if not, they are all
    /// [`Tier::Aggregation`] ("the network").
    pub fn fabric_known(&self) -> bool {
        self.fabric_known
    }

    /// The tier joining ranks `a` and `b` (out-of-range ranks read as the network).
    pub fn tier(&self, a: usize, b: usize) -> Tier {
        let (Some(x), Some(y)) = (self.ranks.get(a), self.ranks.get(b)) else {
            return Tier::Aggregation;
        };
        if a == b {
            return Tier::SameDevice;
        }
        if x.0 == y.0 {
            return match (&x.1, &y.1) {
                (Some(g), Some(h)) if g == h => Tier::SameDevice,
                _ => Tier::Host,
            };
        }
        if self.fabric_known {
            tier_from_paths(&x.2, &y.2)
        } else {
            Tier::Aggregation
        }
    }

    /// Where rank `r` sits: its host index (hosts numbered in order of first appearance), its
    /// GPU and its switch path (top first; empty when the fabric is unknown).
    pub fn place(&self, r: usize) -> Option<(usize, Option<&str>, &[String])> {
        self.ranks
            .get(r)
            .map(|(h, g, p)| (*h, g.as_deref(), p.as_slice()))
    }

    /// The cost of every tier.
    pub fn costs(&self) -> TierCosts {
        self.costs
    }

    /// What `tier` offers each endpoint.
    pub fn link(&self, tier: Tier) -> TierLink {
        self.costs.link(tier)
    }

    /// How many ordered pairs of distinct ranks each tier joins, narrowest first, from the
    /// point of view of rank `me`.
    pub fn census(&self, me: usize) -> Vec<(Tier, usize)> {
        let mut counts: Vec<(Tier, usize)> = Vec::new();
        for b in 0..self.len() {
            if b == me {
                continue;
            }
            let t = self.tier(me, b);
            match counts.iter_mut().find(|(x, _)| *x == t) {
                Some(c) => c.1 += 1,
                None => counts.push((t, 1)),
            }
        }
        counts.sort();
        counts
    }

    /// A digest of everything the tiers depend on: equal digests, equal tier matrices.
    pub fn digest(&self) -> String {
        let mut h = blake3::Hasher::new();
        h.update(b"strata tier map v1");
        h.update(&[u8::from(self.fabric_known)]);
        h.update(
            serde_json::to_string(&self.costs)
                .unwrap_or_default()
                .as_bytes(),
        );
        for (host, gpu, path) in &self.ranks {
            h.update(&(*host as u64).to_le_bytes());
            h.update(gpu.as_deref().unwrap_or("-").as_bytes());
            h.update(&[0]);
            for s in path {
                h.update(s.as_bytes());
                h.update(&[1]);
            }
            h.update(&[2]);
        }
        h.finalize().to_hex()[..32].to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(n: &str) -> HostIdentity {
        HostIdentity {
            hostname: n.into(),
            boot_id: format!("boot-{n}"),
            netns: "net:[1]".into(),
        }
    }

    fn place(path: &[&str]) -> RankPlace {
        RankPlace {
            switches: path.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn tiers_from_paths_and_hosts() {
        let ranks = vec![
            (host("a"), place(&["p0", "l0"])),
            (host("a"), place(&["p0", "l0"])),
            (host("b"), place(&["p0", "l0"])),
            (host("c"), place(&["p0", "l1"])),
            (host("d"), place(&["p1", "l2"])),
        ];
        let m = TierMatrix::new(&ranks, TierCosts::default());
        assert!(m.fabric_known());
        assert_eq!(m.hosts(), 4);
        assert_eq!(m.tier(0, 0), Tier::SameDevice);
        assert_eq!(m.tier(0, 1), Tier::Host);
        assert_eq!(m.tier(0, 2), Tier::Leaf);
        assert_eq!(m.tier(0, 3), Tier::Pod);
        assert_eq!(m.tier(0, 4), Tier::Aggregation);
        assert_eq!(m.tier(3, 0), m.tier(0, 3));
        assert_eq!(
            m.census(0),
            vec![
                (Tier::Host, 1),
                (Tier::Leaf, 1),
                (Tier::Pod, 1),
                (Tier::Aggregation, 1)
            ]
        );
        // One rank without a path: two tiers only, and a different digest.
        let mut partial = ranks.clone();
        partial[4].1 = RankPlace::default();
        let p = TierMatrix::new(&partial, TierCosts::default());
        assert!(!p.fabric_known());
        assert_eq!(p.tier(0, 3), Tier::Aggregation);
        assert_eq!(p.tier(0, 1), Tier::Host);
        assert_ne!(p.digest(), m.digest());
        assert_eq!(
            TierMatrix::new(&ranks, TierCosts::default()).digest(),
            m.digest()
        );
        let mut dearer = TierCosts::default();
        dearer.aggregation.oversubscription = 7.0;
        let d = TierMatrix::new(&ranks, dearer);
        assert_ne!(d.digest(), m.digest(), "the costs are part of the digest");
        assert_eq!(d.link(Tier::Aggregation).oversubscription, 7.0);
    }

    #[test]
    fn places_from_a_fabric_and_from_slurm() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let f =
            crate::fabric::load_file(&dir.join("../examples/topology/meta-24k-h100.toml")).unwrap();
        assert_eq!(
            RankPlace::from_fabric(&f, "any", 3_072 + 17),
            Some(vec!["pod1".to_string(), "leaf193".to_string()])
        );
        assert_eq!(RankPlace::from_fabric(&f, "any", 24_576), None);
        assert_eq!(
            RankPlace::from_slurm(Some("s0.s4.node7"), Some("switch.switch.node")),
            Some(vec!["s0".to_string(), "s4".to_string()])
        );
        assert_eq!(RankPlace::from_slurm(Some("node7"), None), None);
    }
}
