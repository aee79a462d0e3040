//! The 4D parallel layout of a training job: tensor (TP), context (CP), pipeline (PP) and data
//! (DP) parallel groups, in [TP, CP, PP, DP] order with TP varying fastest over the global rank,
//! as in the Llama 3 paper. With 16 GPUs and every size 2, GPU 0 shares a TP group with GPU 1,
//! a CP group with GPU 2, a PP group with GPU 4 and a DP group with GPU 8.
//!
//! Also here: the placement report (the widest tier each kind of group spans, with a warning
//! where that is wider than the group's traffic should go) and the placement planner (the
//! rank-to-device order that keeps TP inside a host, CP inside a host or leaf, PP inside a pod
//! and DP outermost).

use std::fmt;
use strata_topology::Tier;

/// One kind of parallel group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GroupKind {
    /// Tensor parallel (innermost).
    Tp,
    /// Context parallel.
    Cp,
    /// Pipeline parallel.
    Pp,
    /// Data parallel (outermost).
    Dp,
}

impl GroupKind {
    /// All four, innermost first.
    pub const ALL: [GroupKind; 4] = [GroupKind::Tp, GroupKind::Cp, GroupKind::Pp, GroupKind::Dp];

    /// The widest tier this kind of group should span: TP needs NVLink (or at least one host),
    /// CP stays in a leaf, PP in a pod; DP may cross the aggregation layer.
    pub fn widest_wanted(self) -> Tier {
        match self {
            GroupKind::Tp => Tier::NvLink,
            GroupKind::Cp => Tier::Leaf,
            GroupKind::Pp => Tier::Pod,
            GroupKind::Dp => Tier::Aggregation,
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for GroupKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            GroupKind::Tp => "TP",
            GroupKind::Cp => "CP",
            GroupKind::Pp => "PP",
            GroupKind::Dp => "DP",
        })
    }
}

/// Group sizes in [TP, CP, PP, DP] order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Layout {
    /// Tensor-parallel size.
    pub tp: usize,
    /// Context-parallel size.
    pub cp: usize,
    /// Pipeline-parallel size.
    pub pp: usize,
    /// Data-parallel size.
    pub dp: usize,
}

impl Layout {
    /// A layout; every size must be at least 1 and the product must fit in `usize`.
    pub fn new(tp: usize, cp: usize, pp: usize, dp: usize) -> Result<Self, String> {
        if [tp, cp, pp, dp].contains(&0) {
            return Err(format!(
                "layout TP {tp} CP {cp} PP {pp} DP {dp}: every size must be at least 1"
            ));
        }
        tp.checked_mul(cp)
            .and_then(|x| x.checked_mul(pp))
            .and_then(|x| x.checked_mul(dp))
            .ok_or_else(|| "layout: the world size overflows".to_string())?;
        Ok(Self { tp, cp, pp, dp })
    }

    fn sizes(&self) -> [usize; 4] {
        [self.tp, self.cp, self.pp, self.dp]
    }

    /// Ranks in the job: TP × CP × PP × DP.
    pub fn world(&self) -> usize {
        self.sizes().iter().product()
    }

    /// A rank's coordinates (t, c, p, d); TP varies fastest.
    pub fn coords(&self, rank: usize) -> [usize; 4] {
        let mut r = rank;
        let mut out = [0; 4];
        for (i, s) in self.sizes().into_iter().enumerate() {
            out[i] = r % s;
            r /= s;
        }
        out
    }

    /// The rank at coordinates (t, c, p, d).
    pub fn rank_of(&self, coords: [usize; 4]) -> usize {
        let mut r = 0;
        for (i, s) in self.sizes().into_iter().enumerate().rev() {
            r = r * s + coords[i];
        }
        r
    }

    /// The members of `rank`'s group of `kind`, in group order.
    pub fn group(&self, kind: GroupKind, rank: usize) -> Vec<usize> {
        let k = kind.index();
        let mut c = self.coords(rank);
        (0..self.sizes()[k])
            .map(|i| {
                c[k] = i;
                self.rank_of(c)
            })
            .collect()
    }

    /// For a communicator split: the group's number (`color`) and the rank's position in it
    /// (`key`).
    pub fn color_and_key(&self, kind: GroupKind, rank: usize) -> (usize, usize) {
        let k = kind.index();
        let c = self.coords(rank);
        let mut color = 0;
        for (i, s) in self.sizes().into_iter().enumerate().rev() {
            if i != k {
                color = color * s + c[i];
            }
        }
        (color, c[k])
    }

    /// Number of groups of `kind`.
    pub fn groups(&self, kind: GroupKind) -> usize {
        self.world() / self.sizes()[kind.index()]
    }

    /// The size of a group of `kind`.
    pub fn size(&self, kind: GroupKind) -> usize {
        self.sizes()[kind.index()]
    }
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "TP {} x CP {} x PP {} x DP {} = {}",
            self.tp,
            self.cp,
            self.pp,
            self.dp,
            self.world()
        )
    }
}

/// Where one kind of group lands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// The kind.
    pub kind: GroupKind,
    /// How many groups.
    pub groups: usize,
    /// Ranks per group.
    pub size: usize,
    /// The widest tier any group spans.
    pub widest: Tier,
    /// How many groups span that widest tier.
    pub groups_at_widest: usize,
    /// Set when `widest` is wider than the kind should span.
    pub warning: Option<String>,
}

/// The widest tier each kind of group spans when global rank r runs on device `device[r]`,
/// with `tier(a, b)` the tier between two devices (a tree: the widest tier of a group is the
/// widest from its first member to any other).
pub fn placement_report(
    layout: &Layout,
    device: &[usize],
    tier: &dyn Fn(usize, usize) -> Tier,
    nvlink: bool,
) -> Result<Vec<Placement>, String> {
    if device.len() != layout.world() {
        return Err(format!(
            "{layout} needs {} ranks; the placement has {}",
            layout.world(),
            device.len()
        ));
    }
    let mut out = Vec::new();
    for kind in GroupKind::ALL {
        let mut widest = Tier::SameDevice;
        let mut at_widest = 0;
        let mut seen = vec![false; layout.world()];
        for r in 0..layout.world() {
            if seen[r] {
                continue;
            }
            let members = layout.group(kind, r);
            let first = device[members[0]];
            let w = members
                .iter()
                .map(|&m| {
                    seen[m] = true;
                    tier(first, device[m])
                })
                .max()
                .unwrap_or(Tier::SameDevice);
            match w.cmp(&widest) {
                std::cmp::Ordering::Greater => {
                    widest = w;
                    at_widest = 1;
                }
                std::cmp::Ordering::Equal => at_widest += 1,
                std::cmp::Ordering::Less => {}
            }
        }
        let wanted = match kind.widest_wanted() {
            Tier::NvLink if !nvlink => Tier::Host,
            t => t,
        };
        let warning = (widest > wanted).then(|| {
            format!(
                "{at_widest} of {} {kind} groups span {widest:?}, wider than {wanted:?}",
                layout.groups(kind)
            )
        });
        out.push(Placement {
            kind,
            groups: layout.groups(kind),
            size: layout.size(kind),
            widest,
            groups_at_widest: at_widest,
            warning,
        });
    }
    Ok(out)
}

/// A fabric in the shape the planner needs: devices numbered host-major, hosts leaf-major,
/// leaves pod-major.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    /// Devices (GPUs) per host.
    pub per_host: usize,
    /// Devices per leaf switch.
    pub per_leaf: usize,
    /// Devices per pod.
    pub per_pod: usize,
    /// Devices in all.
    pub total: usize,
}

impl Shape {
    /// The shape of a fabric file with a `[fat_tree]` section (`None` for other layouts).
    pub fn of(fab: &strata_topology::fabric::Fabric) -> Option<Self> {
        let strata_topology::fabric::Layout::FatTree {
            hosts_per_leaf,
            leaves_per_pod,
            ..
        } = fab.layout
        else {
            return None;
        };
        let per_host = fab.gpus_per_host.max(1);
        Some(Self {
            per_host,
            per_leaf: per_host * hosts_per_leaf,
            per_pod: per_host * hosts_per_leaf * leaves_per_pod,
            total: fab.ranks(),
        })
    }
}

/// The planner's proposal: the device of every global rank, and what it could not do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlacementPlan {
    /// `device[r]` runs global rank r.
    pub device: Vec<usize>,
    /// Requests that cannot be met on this fabric, in words.
    pub cannot: Vec<String>,
}

/// Proposes the rank-to-device order for `layout` on `shape`: ranks in [TP, CP, PP, DP] order
/// onto devices in topology order, which nests each kind inside the smallest tier that holds
/// it. Says which groups cannot stay inside their tier (a TP group larger than a host, a
/// group that does not divide its tier evenly, a job larger than the fabric).
pub fn plan_placement(layout: &Layout, shape: &Shape) -> PlacementPlan {
    let mut cannot = Vec::new();
    if layout.world() > shape.total {
        cannot.push(format!(
            "{layout} needs {} devices; the fabric has {}",
            layout.world(),
            shape.total
        ));
    }
    // The span of each kind: TP, then TP×CP, then TP×CP×PP consecutive devices.
    let spans = [
        (GroupKind::Tp, layout.tp, shape.per_host, "a host"),
        (
            GroupKind::Cp,
            layout.tp * layout.cp,
            shape.per_leaf,
            "a leaf",
        ),
        (
            GroupKind::Pp,
            layout.tp * layout.cp * layout.pp,
            shape.per_pod,
            "a pod",
        ),
    ];
    for (kind, span, tier_size, tier_name) in spans {
        if span > tier_size {
            cannot.push(format!(
                "{kind} groups span {span} consecutive devices, more than {tier_name} ({tier_size})"
            ));
        } else if tier_size % span != 0 {
            cannot.push(format!(
                "{kind} blocks of {span} devices do not divide {tier_name} ({tier_size}): some groups straddle two"
            ));
        }
    }
    PlacementPlan {
        device: (0..layout.world().min(shape.total)).collect(),
        cannot,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama3_example_groups() {
        let l = Layout::new(2, 2, 2, 2).unwrap();
        assert_eq!(l.world(), 16);
        assert_eq!(l.group(GroupKind::Tp, 0), vec![0, 1]);
        assert_eq!(l.group(GroupKind::Cp, 0), vec![0, 2]);
        assert_eq!(l.group(GroupKind::Pp, 0), vec![0, 4]);
        assert_eq!(l.group(GroupKind::Dp, 0), vec![0, 8]);
        assert_eq!(l.group(GroupKind::Dp, 7), vec![7, 15]);
        for r in 0..16 {
            assert_eq!(l.rank_of(l.coords(r)), r);
            for k in GroupKind::ALL {
                let (color, key) = l.color_and_key(k, r);
                assert!(color < l.groups(k));
                assert_eq!(l.group(k, r)[key], r);
                // Everyone in the group has the same color.
                for m in l.group(k, r) {
                    assert_eq!(l.color_and_key(k, m).0, color);
                }
            }
        }
        assert!(Layout::new(0, 1, 1, 1).is_err());
        assert!(Layout::new(usize::MAX, 2, 1, 1).is_err());
    }

    fn meta_tier(a: usize, b: usize) -> Tier {
        // 8 GPUs per host, 16 per leaf, 3,072 per pod.
        if a == b {
            Tier::SameDevice
        } else if a / 8 == b / 8 {
            Tier::NvLink
        } else if a / 16 == b / 16 {
            Tier::Leaf
        } else if a / 3072 == b / 3072 {
            Tier::Pod
        } else {
            Tier::Aggregation
        }
    }

    const META: Shape = Shape {
        per_host: 8,
        per_leaf: 16,
        per_pod: 3072,
        total: 24_576,
    };

    #[test]
    fn the_planner_nests_the_24k_job_and_the_report_agrees() {
        let l = Layout::new(8, 2, 16, 96).unwrap();
        let plan = plan_placement(&l, &META);
        assert!(plan.cannot.is_empty(), "{:?}", plan.cannot);
        let rep = placement_report(&l, &plan.device, &meta_tier, true).unwrap();
        let widest: Vec<Tier> = rep.iter().map(|p| p.widest).collect();
        assert_eq!(
            widest,
            [Tier::NvLink, Tier::Leaf, Tier::Pod, Tier::Aggregation]
        );
        assert!(rep.iter().all(|p| p.warning.is_none()));
        // A scattered order (a fixed stride through the devices) breaks every inner group.
        let scattered: Vec<usize> = (0..l.world()).map(|r| (r * 7_919) % l.world()).collect();
        let rep = placement_report(&l, &scattered, &meta_tier, true).unwrap();
        assert_eq!(rep[0].widest, Tier::Aggregation);
        assert!(
            rep[0]
                .warning
                .as_deref()
                .unwrap()
                .contains("TP groups span Aggregation")
        );
        assert!(rep[3].warning.is_none());
    }

    #[test]
    fn the_planner_says_what_cannot_fit() {
        let plan = plan_placement(&Layout::new(16, 1, 1, 2).unwrap(), &META);
        assert!(
            plan.cannot[0].contains("TP groups span 16"),
            "{:?}",
            plan.cannot
        );
        let plan = plan_placement(&Layout::new(8, 3, 1, 1).unwrap(), &META);
        assert!(
            plan.cannot.iter().any(|c| c.contains("CP groups span 24")),
            "{:?}",
            plan.cannot
        );
        let plan = plan_placement(&Layout::new(8, 2, 16, 200).unwrap(), &META);
        assert!(
            plan.cannot[0].contains("needs 51200 devices"),
            "{:?}",
            plan.cannot
        );
        let plan = plan_placement(&Layout::new(8, 2, 5, 1).unwrap(), &META);
        assert!(
            plan.cannot
                .iter()
                .any(|c| c.contains("do not divide a pod")),
            "{:?}",
            plan.cannot
        );
        assert!(
            placement_report(&Layout::new(2, 1, 1, 1).unwrap(), &[0], &meta_tier, true).is_err()
        );
    }
}
