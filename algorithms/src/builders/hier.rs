//! Hierarchical schedules over a regular [`Hierarchy`], and flat schedules laid along the
//! topology order.
//!
//! A regular hierarchy gives each rank mixed-radix coordinates `c_0 … c_{m-1}` (innermost
//! first, over the topology order). The group of level `l` is the ranks that differ from this
//! one only in `c_l`; groups of upper levels are *rails*: local rank i of a host talks to local
//! rank i of other hosts, so each upper-tier flow carries a shard, not the whole vector.
//!
//! * all-reduce: reduce-scatter inside each level from the innermost out, each on the shard
//!   the previous one left; an all-reduce of the last shard across the top level; all-gather
//!   back level by level.
//! * reduce-scatter: the input is copied into scratch in *rail order* (c_0 slowest, so every
//!   group's share is contiguous), reduce-scattered level by level from the innermost out; the
//!   last level lands in the output.
//! * all-gather: gathered into scratch in rail order from the top level in, so each upper-tier
//!   flow carries one rank's block exactly once; then copied into the output in rank order.
//! * broadcast: across the top level along the root's rail, then down each level from the
//!   rank that holds the data.

use super::ring::Partials;
use super::{Blocks, copy, copy_step, one_rank};
use crate::hierarchy::Hierarchy;
use crate::schedule::{Buf, Op, RankSchedule, Region};
use crate::{AllGatherPart, HierPart, ReduceScatterPart};

/// This rank's coordinates and groups in a regular hierarchy.
struct Rails<'a> {
    h: &'a Hierarchy,
    dims: Vec<usize>,
    /// Position strides of each level (product of the radices below it).
    stride: Vec<usize>,
    /// This rank's position and coordinates.
    pos: usize,
    coords: Vec<usize>,
}

/// Mixed-radix digits of position `v`, innermost first.
fn coords_of(mut v: usize, dims: &[usize]) -> Vec<usize> {
    dims.iter()
        .map(|&d| {
            let c = v % d;
            v /= d;
            c
        })
        .collect()
}

impl<'a> Rails<'a> {
    fn new(h: &'a Hierarchy, rank: usize) -> Option<Self> {
        let dims: Vec<usize> = h.dims()?.iter().map(|d| d.0).collect();
        let mut stride = Vec::with_capacity(dims.len());
        let mut acc = 1;
        for &d in &dims {
            stride.push(acc);
            acc *= d;
        }
        let pos = h.position(rank);
        let coords = coords_of(pos, &dims);
        Some(Self {
            h,
            dims,
            stride,
            pos,
            coords,
        })
    }

    /// The rail index of real rank `q` ([`Rails::rail_index`] of its coordinates).
    fn rail_of(&self, q: usize) -> usize {
        let mut v = self.h.position(q);
        self.dims.iter().fold(0, |u, &d| {
            let c = v % d;
            v /= d;
            u * d + c
        })
    }

    /// Copies of every rank's `n`-element block between rank order and rail order: from the
    /// input into scratch (`into_rails`), or from scratch into the output.
    fn rail_copies(&self, n: usize, into_rails: bool) -> Vec<Op> {
        (0..self.h.len())
            .filter_map(|q| {
                let rail = Region::new(Buf::Scratch, self.rail_of(q) * n, n);
                if into_rails {
                    copy(Region::new(Buf::Input, q * n, n), rail)
                } else {
                    copy(rail, Region::new(Buf::Output, q * n, n))
                }
            })
            .collect()
    }

    fn levels(&self) -> usize {
        self.dims.len()
    }

    /// The real ranks of this rank's level-`l` group, by coordinate.
    fn group(&self, l: usize) -> Vec<usize> {
        let base = self.pos - self.coords[l] * self.stride[l];
        (0..self.dims[l])
            .map(|k| self.h.order()[base + k * self.stride[l]])
            .collect()
    }

    /// Blocks of one rank in rail order (c_0 slowest) for a given level: the rail index.
    fn rail_index(&self, coords: &[usize]) -> usize {
        coords.iter().zip(&self.dims).fold(0, |u, (c, d)| u * d + c)
    }

    /// Rail blocks per part at level `l`: the product of the radices above it.
    fn rail_span(&self, l: usize) -> usize {
        self.dims[l + 1..].iter().product()
    }
}

/// Appends `phase` (built over group indices) to `s`, with peers renamed to real ranks and,
/// unless `keep_finalize`, without its `Finalize` operations.
fn append_phase(
    s: &mut RankSchedule,
    mut phase: RankSchedule,
    group: &[usize],
    keep_finalize: bool,
) {
    phase.map_peers(|q| group[q]);
    for mut st in phase.steps {
        st.ops
            .retain(|op| keep_finalize || !matches!(op, Op::Finalize { .. }));
        s.step(st.ops);
    }
    s.scratch_elems = s.scratch_elems.max(phase.scratch_elems);
}

/// Moves a schedule built for buffers at offset 0 onto `input` and `output` regions: element
/// x of the input becomes element x of `input`, and so on. Copies that become no-ops go.
fn relocate(sched: &mut RankSchedule, input: Region, output: Region) {
    for op in sched.steps.iter_mut().flat_map(|s| s.ops.iter_mut()) {
        let moved = |r: &mut Region| {
            let to = if r.buf == Buf::Input { input } else { output };
            if r.buf != Buf::Scratch {
                *r = Region::new(to.buf, to.offset + r.offset, r.len);
            }
        };
        match op {
            Op::Send { src, .. } => moved(src),
            Op::Recv { dst, .. } => moved(dst),
            Op::RecvReduce { src, dst, .. } => {
                moved(src);
                moved(dst);
            }
            Op::Copy { src, dst } => {
                moved(src);
                moved(dst);
            }
            Op::Reduce { src, with, dst } => {
                moved(src);
                moved(with);
                moved(dst);
            }
            Op::Finalize { region } => moved(region),
        }
    }
    for st in &mut sched.steps {
        st.ops
            .retain(|op| !matches!(op, Op::Copy { src, dst } if src == dst));
    }
    sched.steps.retain(|st| !st.ops.is_empty());
}

fn reduce_scatter_part(part: HierPart) -> ReduceScatterPart {
    match part {
        HierPart::Ring | HierPart::Tree => ReduceScatterPart::Ring,
        HierPart::Rhd => ReduceScatterPart::Halving,
    }
}

fn all_gather_part(part: HierPart) -> AllGatherPart {
    match part {
        HierPart::Ring | HierPart::Tree => AllGatherPart::Ring,
        HierPart::Rhd => AllGatherPart::Doubling,
    }
}

/// One reduce-scatter phase of `d` members over `input` into `acc`'s block `me`.
fn reduce_scatter_phase(
    part: ReduceScatterPart,
    d: usize,
    me: usize,
    input: Blocks,
    acc: Blocks,
    dst: Region,
) -> RankSchedule {
    let mut ph = RankSchedule::default();
    match part {
        ReduceScatterPart::Halving => {
            super::halving_reduce_scatter_core(&mut ph, d, me, input, acc, dst)
        }
        _ => super::ring_reduce_scatter_core(&mut ph, d, me, input, Partials::In(acc), dst),
    }
    ph
}

/// One all-gather phase: `own` becomes block `me` of `out` on all `d` members.
fn all_gather_phase(
    part: AllGatherPart,
    d: usize,
    me: usize,
    own: Region,
    out: Blocks,
) -> RankSchedule {
    let mut ph = RankSchedule::default();
    match part {
        AllGatherPart::Doubling => super::doubling_all_gather_core(&mut ph, d, me, own, out),
        _ => super::ring_all_gather_core(&mut ph, d, me, own, out),
    }
    ph
}

/// Hierarchical all-reduce of `n` elements: see the module documentation.
pub fn hierarchical_all_reduce(
    h: &Hierarchy,
    part: HierPart,
    r: usize,
    n: usize,
    chunk: usize,
) -> Option<RankSchedule> {
    let rails = Rails::new(h, r)?;
    let mut s = RankSchedule::default();
    let m = rails.levels();
    if m == 0 {
        one_rank(
            &mut s,
            Region::new(Buf::Input, 0, n),
            Region::new(Buf::Output, 0, n),
        );
        return Some(s);
    }
    let mut cur = Region::new(Buf::Output, 0, n);
    let mut src_buf = Buf::Input;
    let mut shards = Vec::with_capacity(m);
    for l in 0..m - 1 {
        let (d, me) = (rails.dims[l], rails.coords[l]);
        let input = Blocks::split(src_buf, cur.offset, cur.len, d);
        let acc = Blocks::split(Buf::Output, cur.offset, cur.len, d);
        let ph = reduce_scatter_phase(reduce_scatter_part(part), d, me, input, acc, acc.one(me));
        append_phase(&mut s, ph, &rails.group(l), false);
        shards.push(cur);
        cur = acc.one(me);
        src_buf = Buf::Output;
    }
    let (d, me) = (rails.dims[m - 1], rails.coords[m - 1]);
    let mut top = match part {
        HierPart::Ring => {
            super::composed_all_reduce(ReduceScatterPart::Ring, AllGatherPart::Ring, d, me, cur.len)
        }
        HierPart::Rhd => super::rabenseifner_all_reduce(d, me, cur.len),
        HierPart::Tree => super::double_binary_tree_all_reduce(d, me, cur.len, chunk),
    };
    relocate(&mut top, Region::new(src_buf, cur.offset, cur.len), cur);
    append_phase(&mut s, top, &rails.group(m - 1), true);
    for l in (0..m - 1).rev() {
        let (d, me) = (rails.dims[l], rails.coords[l]);
        let out = Blocks::split(Buf::Output, shards[l].offset, shards[l].len, d);
        let ph = all_gather_phase(all_gather_part(part), d, me, out.one(me), out);
        append_phase(&mut s, ph, &rails.group(l), true);
    }
    Some(s)
}

/// Whether a hierarchical reduce-scatter or all-gather holds its copies between rank order
/// and rail order: p of them per rank, O(p²) to build for a whole communicator. The runtime
/// needs them; pricing, which times transfers only, leaves them out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RailCopies {
    Include,
    Omit,
}

/// [`reduce_scatter_with`] or [`all_gather_with`].
pub(crate) type RailBuilder =
    fn(&Hierarchy, HierPart, usize, usize, RailCopies) -> Option<RankSchedule>;

/// Hierarchical reduce-scatter of `n` elements per rank (input in rank order).
pub fn hierarchical_reduce_scatter(
    h: &Hierarchy,
    part: HierPart,
    r: usize,
    n: usize,
) -> Option<RankSchedule> {
    reduce_scatter_with(h, part, r, n, RailCopies::Include)
}

/// [`hierarchical_reduce_scatter`], with or without its rail copies.
pub(crate) fn reduce_scatter_with(
    h: &Hierarchy,
    part: HierPart,
    r: usize,
    n: usize,
    copies: RailCopies,
) -> Option<RankSchedule> {
    let rails = Rails::new(h, r)?;
    let p = h.len();
    let m = rails.levels();
    let mut s = RankSchedule::default();
    let output = Region::new(Buf::Output, 0, n);
    if m == 0 {
        one_rank(&mut s, Region::new(Buf::Input, 0, n), output);
        return Some(s);
    }
    if copies == RailCopies::Include {
        s.step(rails.rail_copies(n, true));
    }
    s.scratch_elems = p * n;
    let mut start = 0; // first rail block of this rank's share
    for l in 0..m {
        let (d, me) = (rails.dims[l], rails.coords[l]);
        let each = rails.rail_span(l) * n;
        let blocks = Blocks::uniform(Buf::Scratch, start * n, d, each);
        let last = l == m - 1;
        let dst = if last { output } else { blocks.one(me) };
        let ph = reduce_scatter_phase(reduce_scatter_part(part), d, me, blocks, blocks, dst);
        append_phase(&mut s, ph, &rails.group(l), last);
        start += me * rails.rail_span(l);
    }
    Some(s)
}

/// Hierarchical all-gather of `n` elements per rank (output in rank order).
pub fn hierarchical_all_gather(
    h: &Hierarchy,
    part: HierPart,
    r: usize,
    n: usize,
) -> Option<RankSchedule> {
    all_gather_with(h, part, r, n, RailCopies::Include)
}

/// [`hierarchical_all_gather`], with or without its rail copies.
pub(crate) fn all_gather_with(
    h: &Hierarchy,
    part: HierPart,
    r: usize,
    n: usize,
    copies: RailCopies,
) -> Option<RankSchedule> {
    let rails = Rails::new(h, r)?;
    let p = h.len();
    let m = rails.levels();
    let mut s = RankSchedule::default();
    if m == 0 {
        copy_step(
            &mut s,
            Region::new(Buf::Input, 0, n),
            Region::new(Buf::Output, 0, n),
        );
        return Some(s);
    }
    let mine = rails.rail_index(&rails.coords);
    let mut own = Region::new(Buf::Input, 0, n);
    for l in (0..m).rev() {
        let (d, me) = (rails.dims[l], rails.coords[l]);
        let each = rails.rail_span(l) * n;
        // The rail blocks that share this rank's coordinates below level l.
        let span = d * rails.rail_span(l);
        let first = mine / span * span;
        let out = Blocks::uniform(Buf::Scratch, first * n, d, each);
        let ph = all_gather_phase(all_gather_part(part), d, me, own, out);
        append_phase(&mut s, ph, &rails.group(l), true);
        own = out.all();
    }
    if copies == RailCopies::Include {
        s.step(rails.rail_copies(n, false));
    }
    s.scratch_elems = s.scratch_elems.max(p * n);
    Some(s)
}

/// Hierarchical broadcast of `n` elements from `root`.
pub fn hierarchical_broadcast(
    h: &Hierarchy,
    part: HierPart,
    r: usize,
    n: usize,
    root: usize,
    chunk: usize,
) -> Option<RankSchedule> {
    let rails = Rails::new(h, r)?;
    let root_rails = Rails::new(h, root)?;
    let m = rails.levels();
    let mut s = RankSchedule::default();
    let (input, output) = (
        Region::new(Buf::Input, 0, n),
        Region::new(Buf::Output, 0, n),
    );
    if m == 0 {
        copy_step(&mut s, input, output);
        return Some(s);
    }
    let mut first_phase = true;
    for l in (0..m).rev() {
        // Only ranks that agree with the root below level l take part in phase l.
        if rails.coords[..l] != root_rails.coords[..l] {
            continue;
        }
        let (d, me, sub_root) = (rails.dims[l], rails.coords[l], root_rails.coords[l]);
        let mut ph = match part {
            HierPart::Ring => super::chain_broadcast(d, me, n, sub_root, chunk),
            HierPart::Tree => super::binomial_broadcast(d, me, n, sub_root),
            HierPart::Rhd => super::scatter_allgather_broadcast(d, me, n, sub_root),
        };
        let from = if r == root && first_phase {
            input
        } else {
            output
        };
        relocate(&mut ph, from, output);
        append_phase(&mut s, ph, &rails.group(l), true);
        first_phase = false;
    }
    Some(s)
}

/// A flat schedule built over positions of the topology order, with peers renamed to real
/// ranks and, where a buffer is laid out by rank (`blocks`: the buffer and its block length),
/// every block moved to its real rank. `None` when a region spans several blocks (the
/// schedule then has to run in launcher order).
pub(crate) fn along_topology(
    mut sched: RankSchedule,
    order: &[usize],
    blocks: Option<(Buf, usize)>,
) -> Option<RankSchedule> {
    sched.map_peers(|q| order[q]);
    let Some((buf, each)) = blocks.filter(|b| b.1 > 0) else {
        return Some(sched);
    };
    for op in sched.steps.iter_mut().flat_map(|s| s.ops.iter_mut()) {
        let regions: Vec<&mut Region> = match op {
            Op::Send { src, .. } => vec![src],
            Op::Recv { dst, .. } => vec![dst],
            Op::RecvReduce { src, dst, .. } | Op::Copy { src, dst } => vec![src, dst],
            Op::Reduce { src, with, dst } => vec![src, with, dst],
            Op::Finalize { region } => vec![region],
        };
        for reg in regions.into_iter().filter(|r| r.buf == buf && r.len > 0) {
            let (b, within) = (reg.offset / each, reg.offset % each);
            if within + reg.len > each {
                return None;
            }
            reg.offset = order[b] * each + within;
        }
    }
    Some(sched)
}

#[cfg(test)]
mod tests {
    use crate::hierarchy::tests::fat_tree;
    use crate::sim::{Placement, check_on};
    use crate::{Algorithm, Collective, Hierarchy, algorithms_for};
    use strata_topology::Tier;

    /// A deterministic shuffle of 0..p.
    fn shuffled(p: usize, seed: u64) -> Vec<usize> {
        let mut v: Vec<usize> = (0..p).collect();
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        for i in (1..p).rev() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            v.swap(i, (x % (i as u64 + 1)) as usize);
        }
        v
    }

    /// Without its rail copies a hierarchical reduce-scatter or all-gather keeps every
    /// transfer, step for step (pricing builds it so); with them, every rank's block is
    /// copied once each way.
    #[test]
    fn rail_copies_are_all_that_pricing_leaves_out() {
        use super::{RailBuilder, RailCopies, all_gather_with, reduce_scatter_with};
        use crate::HierPart;
        use crate::schedule::Op;
        let transfers = |s: &crate::schedule::RankSchedule| -> Vec<Vec<Op>> {
            s.steps
                .iter()
                .map(|st| {
                    let ops = st.ops.iter().filter(|op| op.peer().is_some());
                    ops.cloned().collect::<Vec<_>>()
                })
                .filter(|ops| !ops.is_empty())
                .collect()
        };
        let copies = |s: &crate::schedule::RankSchedule| {
            let ops = s.steps.iter().flat_map(|st| st.ops.iter());
            ops.filter(|op| matches!(op, Op::Copy { .. })).count()
        };
        let h = fat_tree(2, 2, 3, 2, Some(&shuffled(24, 7)));
        for part in [HierPart::Ring, HierPart::Rhd, HierPart::Tree] {
            for r in 0..h.len() {
                for build in [all_gather_with as RailBuilder, reduce_scatter_with] {
                    let with = build(&h, part, r, 5, RailCopies::Include).unwrap();
                    let without = build(&h, part, r, 5, RailCopies::Omit).unwrap();
                    assert_eq!(transfers(&with), transfers(&without), "{part:?} rank {r}");
                    assert!(copies(&with) >= copies(&without) + h.len() - 1);
                }
            }
        }
    }

    const COLLECTIVES: [Collective; 5] = [
        Collective::AllReduce,
        Collective::AllGather,
        Collective::ReduceScatter,
        Collective::Broadcast,
        Collective::Reduce,
    ];

    fn check_all(h: &Hierarchy, counts: &[usize]) {
        let p = h.len();
        for c in COLLECTIVES {
            for &a in algorithms_for(c).iter().filter(|a| a.runs_on(p)) {
                for ordered in [false, true] {
                    for &n in counts {
                        for placement in [Placement::OutOfPlace, Placement::InPlace] {
                            for root in [0, p / 2, p - 1] {
                                if let Err(e) = check_on(c, a, h, ordered, n, root, placement) {
                                    panic!("{e}");
                                }
                                if !c.rooted() {
                                    break;
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn every_algorithm_on_fat_trees_in_any_rank_order() {
        let shapes = [
            (1, 2, 4, 1),
            (2, 2, 2, 1),
            (3, 1, 2, 2),
            (2, 3, 1, 1),
            (1, 5, 1, 1),
            (3, 2, 1, 2),
            (1, 1, 1, 1),
        ];
        for (i, &(g, hl, lp, pods)) in shapes.iter().enumerate() {
            let p = g * hl * lp * pods;
            for seed in 0..3 {
                let place = shuffled(p, seed * 31 + i as u64);
                let place = if seed == 0 { None } else { Some(&place[..]) };
                check_all(&fat_tree(g, hl, lp, pods, place), &[0, 1, 5, 13, 40]);
            }
        }
    }

    #[test]
    fn four_levels_at_48_ranks() {
        let place = shuffled(48, 7);
        check_all(&fat_tree(4, 2, 3, 2, Some(&place)), &[0, 7, 97]);
    }

    #[test]
    fn irregular_groups_refuse_hierarchical_algorithms_and_still_order_rings() {
        // Hosts of 2, 3 and 1 ranks, dealt out of order.
        let h = crate::hierarchy::tests::hosts_dealt_out_of_order();
        assert_eq!(h.order(), &[1, 4, 0, 3, 5, 2]);
        for c in COLLECTIVES {
            for &a in algorithms_for(c) {
                let r = check_on(c, a, &h, true, 11, 3, Placement::OutOfPlace);
                match (a.is_hierarchical(), r) {
                    (true, Err(e)) => assert!(e.contains("same number of ranks"), "{e}"),
                    (true, Ok(_)) => panic!("{c}/{a} ran on an irregular hierarchy"),
                    (false, r) => {
                        r.unwrap();
                    }
                }
            }
        }
    }

    #[test]
    fn ordered_rings_cross_each_leaf_boundary_once_and_rails_stay_on_their_rail() {
        // 8 hosts of 2 ranks, 2 hosts per leaf, ranks dealt round-robin over the leaves.
        let place: Vec<usize> = (0..16)
            .map(|r| ((r % 4) * 2 + (r / 4) % 2) * 2 + r / 8)
            .collect();
        let h = fat_tree(2, 2, 4, 1, Some(&place));
        let leaf_crossings = |ordered: bool| {
            let s = crate::sim::schedules_on(
                Collective::AllGather,
                Algorithm::Ring,
                &h,
                ordered,
                4,
                0,
                4,
            )
            .unwrap();
            (0..16)
                .filter(|&r| {
                    let next = s[r].send_peers()[0];
                    h.tier(r, next) >= Tier::Pod
                })
                .count()
        };
        assert_eq!(leaf_crossings(true), 4, "one ring edge out of each leaf");
        assert_eq!(
            leaf_crossings(false),
            16,
            "launcher order crosses at every hop"
        );
        // Hierarchical all-reduce: every message that leaves a host goes to the same local
        // index on another host.
        let s = crate::sim::schedules_on(
            Collective::AllReduce,
            Algorithm::Hierarchical(crate::HierPart::Ring),
            &h,
            true,
            64,
            0,
            4,
        )
        .unwrap();
        for (r, sched) in s.iter().enumerate() {
            for q in sched.send_peers() {
                if h.tier(r, q) != Tier::Host {
                    assert_eq!(h.position(r) % 2, h.position(q) % 2, "{r} -> {q}");
                }
            }
        }
    }
}
