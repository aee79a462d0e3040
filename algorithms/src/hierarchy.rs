//! Where the ranks of a communicator sit, in the form schedules and the cost model need: a
//! topology order (every host's ranks together, then every leaf's, then every pod's) and the
//! nested groups (host ⊂ leaf ⊂ pod ⊂ all) with the tier each level crosses.
//!
//! Ring-like schedules are built over positions in the topology order, so a ring visits every
//! rank of a host, then of a leaf, before it crosses to the next, whatever order the launcher
//! gave the ranks. When every group of a level has the same number of subgroups, the
//! hierarchy is *regular* and has mixed-radix coordinates ([`Hierarchy::dims`]), which the
//! hierarchical schedules use to talk along rails.

use strata_topology::Tier;
use strata_topology::tiers::TierMatrix;

/// One level of nesting: a partition of the ranks into groups.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Level {
    /// Group index of every rank (groups numbered in topology order).
    group_of: Vec<u32>,
    /// Ranks in each group.
    sizes: Vec<u32>,
    /// The tier joining two different groups of this level inside one group of the next
    /// level (for the last level: inside the whole communicator).
    tier_out: Tier,
    /// The dense index ([`Hierarchy::uplink_index`]) of this level's first uplink.
    uplink_base: usize,
}

/// The nesting of a communicator's ranks: see the module documentation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hierarchy {
    /// Real rank at each position of the topology order.
    order: Vec<usize>,
    /// Position of each real rank.
    pos: Vec<usize>,
    /// Partitions from the innermost (hosts) outwards, without repeats; the whole
    /// communicator is implied above the last.
    levels: Vec<Level>,
    /// The tier between two ranks of one innermost group.
    inner_tier: Tier,
    /// Mixed radices, innermost first, with their tiers, when the hierarchy is regular.
    dims: Option<Vec<(usize, Tier)>>,
}

impl Hierarchy {
    /// A communicator whose ranks all share one host: one level, launcher order.
    pub fn single_host(p: usize) -> Self {
        Self::from_keys(&vec![Vec::new(); p], |_, _| Tier::Host)
    }

    /// Builds the hierarchy from every rank's key, outermost component first (for example
    /// `[pod, leaf, host]`), and the tier between any two ranks. Ranks with equal keys share a
    /// host; ties keep launcher order.
    pub fn from_keys(keys: &[Vec<String>], tier: impl Fn(usize, usize) -> Tier) -> Self {
        let p = keys.len();
        let mut order: Vec<usize> = (0..p).collect();
        order.sort_by(|&a, &b| keys[a].cmp(&keys[b]).then(a.cmp(&b)));
        let mut pos = vec![0; p];
        for (v, &r) in order.iter().enumerate() {
            pos[r] = v;
        }
        let depth = keys.iter().map(Vec::len).max().unwrap_or(0);
        // Level i groups ranks by the first depth − i components of their key.
        let mut levels: Vec<Level> = Vec::new();
        for keep in (1..=depth).rev() {
            let mut group_of = vec![0u32; p];
            let mut sizes: Vec<u32> = Vec::new();
            let mut last: Option<&[String]> = None;
            for &r in &order {
                let k = &keys[r][..keep.min(keys[r].len())];
                if last != Some(k) {
                    sizes.push(0);
                    last = Some(k);
                }
                group_of[r] = (sizes.len() - 1) as u32;
                *sizes.last_mut().expect("pushed above") += 1;
            }
            let same_as_previous = levels
                .last()
                .is_some_and(|l: &Level| l.sizes.len() == sizes.len());
            if same_as_previous || sizes.len() == 1 {
                continue;
            }
            levels.push(Level {
                group_of,
                sizes,
                tier_out: Tier::Aggregation,
                uplink_base: 0,
            });
        }
        let mut base = 0;
        for l in &mut levels {
            l.uplink_base = base;
            base += 2 * l.sizes.len();
        }
        // The tier out of each level: between the first ranks of its first two groups that
        // share a parent group (or any two groups at the top).
        for i in 0..levels.len() {
            let parent = levels.get(i + 1).map(|l| &l.group_of);
            let l = &levels[i];
            let mut first_of_group: Vec<Option<usize>> = vec![None; l.sizes.len()];
            for &r in &order {
                first_of_group[l.group_of[r] as usize].get_or_insert(r);
            }
            let firsts: Vec<usize> = first_of_group.into_iter().flatten().collect();
            let pair = firsts.windows(2).find(|w| match parent {
                Some(par) => par[w[0]] == par[w[1]],
                None => true,
            });
            if let Some(w) = pair {
                levels[i].tier_out = tier(w[0], w[1]);
            }
        }
        let inner_tier = levels
            .first()
            .map(|l| {
                let a = order[0];
                order
                    .iter()
                    .find(|&&b| b != a && l.group_of[b] == l.group_of[a])
                    .map_or(Tier::Host, |&b| tier(a, b))
            })
            .unwrap_or_else(|| {
                if p > 1 {
                    tier(order[0], order[1])
                } else {
                    Tier::Host
                }
            });
        let mut h = Self {
            order,
            pos,
            levels,
            inner_tier,
            dims: None,
        };
        h.dims = h.regular_dims();
        h
    }

    /// Ranks on devices of a fabric file: rank r runs on device `devices[r]` (devices
    /// numbered host by host, `gpus_per_host` each). Devices off the fabric count as one
    /// more host of pod 0, leaf 0.
    pub fn on_fabric(fab: &strata_topology::fabric::Fabric, devices: &[usize]) -> Self {
        let per_host = fab.gpus_per_host.max(1);
        let keys: Vec<Vec<String>> = devices
            .iter()
            .map(|&d| {
                let host = d / per_host;
                let place = fab
                    .place(host)
                    .unwrap_or(strata_topology::fabric::Place { pod: 0, leaf: 0 });
                vec![
                    format!("{:06}", place.pod),
                    format!("{:06}", place.leaf),
                    format!("{host:08}"),
                ]
            })
            .collect();
        Self::from_keys(&keys, |x, y| {
            fab.rank_tier(devices[x], devices[y])
                .unwrap_or(Tier::Aggregation)
        })
    }

    /// The hierarchy of a communicator from its tier matrix: keys are the switch path (when
    /// the fabric is known) and the host.
    pub fn from_tiers(m: &TierMatrix) -> Self {
        let keys: Vec<Vec<String>> = (0..m.len())
            .map(|r| {
                let (host, _, path) = m.place(r).expect("rank in range");
                let mut k: Vec<String> = if m.fabric_known() {
                    (1..=path.len()).map(|i| path[..i].join("/")).collect()
                } else {
                    Vec::new()
                };
                k.push(format!("{host:08}"));
                k
            })
            .collect();
        Self::from_keys(&keys, |a, b| m.tier(a, b))
    }

    fn regular_dims(&self) -> Option<Vec<(usize, Tier)>> {
        let p = self.order.len();
        let mut dims = Vec::new();
        let mut below = 1usize; // ranks per group of the level below
        let mut tier = self.inner_tier;
        for l in &self.levels {
            let size = l.sizes[0] as usize;
            if l.sizes.iter().any(|&s| s as usize != size) || !size.is_multiple_of(below) {
                return None;
            }
            dims.push((size / below, tier));
            below = size;
            tier = l.tier_out;
        }
        if !p.is_multiple_of(below.max(1)) {
            return None;
        }
        dims.push((p / below.max(1), tier));
        dims.retain(|&(d, _)| d > 1);
        Some(dims)
    }

    /// Number of ranks.
    pub fn len(&self) -> usize {
        self.order.len()
    }

    /// Whether there are no ranks.
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// Real ranks in topology order.
    pub fn order(&self) -> &[usize] {
        &self.order
    }

    /// The position of real rank `r` in the topology order.
    pub fn position(&self, r: usize) -> usize {
        self.pos[r]
    }

    /// Whether the topology order is the launcher's order.
    pub fn is_launcher_order(&self) -> bool {
        self.order.iter().enumerate().all(|(v, &r)| v == r)
    }

    /// Mixed radices with the tier each crosses, innermost first, when every group of a level
    /// has the same shape; radices of 1 are left out, so a flat communicator has one.
    pub fn dims(&self) -> Option<&[(usize, Tier)]> {
        self.dims.as_deref()
    }

    /// The tier joining real ranks `a` and `b`, from the levels.
    pub fn tier(&self, a: usize, b: usize) -> Tier {
        if a == b {
            return Tier::SameDevice;
        }
        let mut tier = self.inner_tier;
        for l in &self.levels {
            if l.group_of[a] == l.group_of[b] {
                return tier;
            }
            tier = l.tier_out;
        }
        tier
    }

    /// The shared uplinks a message from real rank `from` to real rank `to` crosses: for
    /// every level whose groups differ, the sender's group uplink and the receiver's group
    /// downlink, as (id, level, ranks in the group). Ids are unique per (level, group,
    /// direction).
    pub fn uplinks(&self, from: usize, to: usize, out: &mut Vec<(u64, usize, usize)>) {
        out.clear();
        self.for_each_uplink(from, to, |id, level, ranks| out.push((id, level, ranks)));
    }

    /// [`Hierarchy::uplinks`] without a buffer: calls `f(id, level, ranks)` for each.
    pub fn for_each_uplink(&self, from: usize, to: usize, mut f: impl FnMut(u64, usize, usize)) {
        for (i, l) in self.levels.iter().enumerate() {
            let (ga, gb) = (l.group_of[from], l.group_of[to]);
            if ga == gb {
                break;
            }
            let id = |g: u32, down: u64| ((i as u64) << 40) | (u64::from(g) << 1) | down;
            f(id(ga, 0), i, l.sizes[ga as usize] as usize);
            f(id(gb, 1), i, l.sizes[gb as usize] as usize);
        }
    }

    /// How many uplinks there are (one up and one down per group of every level): the bound
    /// of [`Hierarchy::uplink_index`].
    pub fn uplink_count(&self) -> usize {
        self.levels.iter().map(|l| 2 * l.sizes.len()).sum()
    }

    /// A dense index below [`Hierarchy::uplink_count`] for an uplink id that
    /// [`Hierarchy::for_each_uplink`] gave, so that counting flows per uplink needs no map.
    pub fn uplink_index(&self, id: u64) -> usize {
        let level = (id >> 40) as usize;
        self.levels[level].uplink_base + (id & ((1 << 40) - 1)) as usize
    }

    /// The dense index of the uplink in the other direction of the same group (its up for a
    /// down, its down for an up): a group's two uplinks differ only in the lowest bit.
    pub fn reverse_uplink_index(index: usize) -> usize {
        index ^ 1
    }

    /// The tier a level's uplinks lead into (the tier joining its groups).
    pub fn level_tier(&self, level: usize) -> Tier {
        self.levels
            .get(level)
            .map_or(Tier::Aggregation, |l| l.tier_out)
    }

    /// Levels of nesting (hosts, leaves, pods that hold more than one group below them).
    pub fn depth(&self) -> usize {
        self.levels.len()
    }

    /// Ranks in each group of `level`, in topology order (each group is a run of positions).
    pub fn group_sizes(&self, level: usize) -> &[u32] {
        self.levels.get(level).map_or(&[], |l| &l.sizes)
    }

    /// The tier between two ranks of one innermost group.
    pub fn inner_tier(&self) -> Tier {
        self.inner_tier
    }

    /// A one-line description: `8 ranks: 2 per host × 4 leaves (regular)`.
    pub fn describe(&self) -> String {
        match self.dims() {
            Some(d) if !d.is_empty() => {
                let parts: Vec<String> = d
                    .iter()
                    .map(|(n, t)| format!("{n} over {}", tier_name(*t)))
                    .collect();
                format!("{} ranks = {}", self.len(), parts.join(" × "))
            }
            Some(_) => format!("{} rank", self.len()),
            None => format!("{} ranks, irregular groups", self.len()),
        }
    }
}

/// A tier's short name.
pub fn tier_name(t: Tier) -> &'static str {
    match t {
        Tier::SameDevice => "device",
        Tier::NvLink => "nvlink",
        Tier::Host => "host",
        Tier::Leaf => "leaf",
        Tier::Pod => "pod",
        Tier::Aggregation => "aggregation",
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Six ranks on hosts of 2, 3 and 1 ranks, dealt out of order: topology order
    /// `[1, 4, 0, 3, 5, 2]`, hosts joined by leaves.
    pub(crate) fn hosts_dealt_out_of_order() -> Hierarchy {
        let host_of = [1, 0, 2, 1, 0, 1];
        let keys: Vec<Vec<String>> = host_of.iter().map(|h| vec![format!("h{h}")]).collect();
        let k = keys.clone();
        Hierarchy::from_keys(
            &keys,
            move |a, b| {
                if k[a] == k[b] { Tier::Host } else { Tier::Leaf }
            },
        )
    }

    /// `hosts` hosts of `per_host` ranks, `hosts_per_leaf` per leaf, `leaves_per_pod` per
    /// pod; rank r sits at slot `place[r]` (identity when `None`).
    pub(crate) fn fat_tree(
        per_host: usize,
        hosts_per_leaf: usize,
        leaves_per_pod: usize,
        pods: usize,
        place: Option<&[usize]>,
    ) -> Hierarchy {
        let p = per_host * hosts_per_leaf * leaves_per_pod * pods;
        let slot = |r: usize| place.map_or(r, |pl| pl[r]);
        let keys: Vec<Vec<String>> = (0..p)
            .map(|r| {
                let s = slot(r);
                let host = s / per_host;
                let leaf = host / hosts_per_leaf;
                let pod = leaf / leaves_per_pod;
                vec![
                    format!("p{pod:04}"),
                    format!("l{leaf:04}"),
                    format!("h{host:04}"),
                ]
            })
            .collect();
        let k = keys.clone();
        Hierarchy::from_keys(&keys, move |a, b| {
            let (x, y) = (&k[a], &k[b]);
            if x[2] == y[2] {
                Tier::Host
            } else if x[1] == y[1] {
                Tier::Leaf
            } else if x[0] == y[0] {
                Tier::Pod
            } else {
                Tier::Aggregation
            }
        })
    }

    #[test]
    fn scattered_ranks_are_ordered_by_host_leaf_and_pod() {
        // 8 hosts, one rank each, 2 per leaf, 4 leaves, one pod; ranks dealt round-robin.
        let place: Vec<usize> = (0..8).map(|r| (r % 4) * 2 + r / 4).collect();
        let h = fat_tree(1, 2, 4, 1, Some(&place));
        assert_eq!(h.order(), &[0, 4, 1, 5, 2, 6, 3, 7]);
        assert_eq!(h.position(5), 3);
        assert!(!h.is_launcher_order());
        assert_eq!(h.dims(), Some(&[(2, Tier::Leaf), (4, Tier::Pod)][..]));
        assert_eq!(h.tier(0, 4), Tier::Leaf);
        assert_eq!(h.tier(0, 1), Tier::Pod);
        let mut up = Vec::new();
        h.uplinks(0, 1, &mut up);
        // Host uplink and downlink, then leaf uplink and downlink.
        assert_eq!(up.len(), 4);
        assert_eq!((up[2].1, up[2].2), (1, 2));
        h.uplinks(0, 4, &mut up);
        assert_eq!(up.len(), 2, "same leaf: only the host links");
    }

    #[test]
    fn four_tiers_and_irregular_groups() {
        let h = fat_tree(4, 2, 3, 2, None);
        assert!(h.is_launcher_order());
        assert_eq!(
            h.dims(),
            Some(
                &[
                    (4, Tier::Host),
                    (2, Tier::Leaf),
                    (3, Tier::Pod),
                    (2, Tier::Aggregation)
                ][..]
            )
        );
        assert_eq!(
            h.describe(),
            "48 ranks = 4 over host × 2 over leaf × 3 over pod × 2 over aggregation"
        );
        // A host with one rank fewer breaks regularity but not the order.
        let keys: Vec<Vec<String>> = [0, 0, 1, 1, 1]
            .iter()
            .map(|h| vec![format!("h{h}")])
            .collect();
        let k = keys.clone();
        let h = Hierarchy::from_keys(
            &keys,
            move |a, b| {
                if k[a] == k[b] { Tier::Host } else { Tier::Leaf }
            },
        );
        assert_eq!(h.dims(), None);
        assert_eq!(h.tier(0, 2), Tier::Leaf);
        assert_eq!(
            Hierarchy::single_host(3).dims(),
            Some(&[(3, Tier::Host)][..])
        );
        assert_eq!(Hierarchy::single_host(1).dims(), Some(&[][..]));
    }
}
