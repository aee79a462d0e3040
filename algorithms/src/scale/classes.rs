//! Ranks that a schedule and the fabric cannot tell apart, found by colour refinement, and the
//! schedule folded onto one representative rank per class.
//!
//! Two positions get the same colour when they start at the same time and their transfers,
//! step by step and in order, have the same kinds and sizes and go to peers of the same
//! colour, which meet them in the same step, over links of the same cost and through shared
//! uplinks of the same colours; an uplink's colour says which colours of rank cross it with
//! which transfer. Colours are
//! refined until no class splits (O(transfers) a round, a few rounds). In the partition that
//! remains, every member of a class sends and receives alike at every step, so one member
//! per class stands for all: its flow for a send stands for the same send of every member,
//! which puts `|class| / |receiving class|` flows on a receiving member's port and
//! `|class| × crossings / |uplink class|` flows on each uplink of a class it crosses
//! ([`Folded`]). [`super::quotient`] times the folded schedule by flows.
//!
//! Matching is by order, as the runtime matches: the k-th send from x to y meets the k-th
//! receive at y from x.

use std::collections::HashMap;

use super::lockstep::{Compact, Kind, Transfer};
use crate::cost::{LinkCost, Network, Uplink};

/// Most transfers colour refinement visits, over all its rounds, before it gives up on a
/// schedule (a few seconds on this kind of machine).
pub(super) const MAX_REFINED_TRANSFERS: usize = 20_000_000;

/// Most rounds of colour refinement above [`super::FLOW_PHASE_MAX_RANKS`] ranks. Schedules
/// that fold well settle in a few (recursive doubling 2, Bruck 3, a double binary tree on
/// 1,024 ranks 9 to 11).
pub(super) const MAX_ROUNDS_AT_SCALE: usize = 16;

/// The send of a class's representative, as a flow that stands for the class.
pub(super) struct SendFlow {
    /// The class that receives it.
    pub to_class: u32,
    /// The receiving representative's operation that must be reached before it starts.
    pub to_op: u32,
    /// The link between a sender and its receiver.
    pub link: LinkCost,
    /// Whether it leaves the host (which port it uses).
    pub off_host: bool,
    /// How many of these flows arrive at one member of the receiving class.
    pub recv_weight: f64,
    /// The uplink classes it crosses, with how many of these flows cross one uplink of each.
    pub uplinks: Vec<(u32, f64)>,
    /// The receiving representative's operations it completes (more than one where members
    /// of the receiving class each take this send from several senders).
    pub completes: Vec<u32>,
}

/// A set of schedules folded onto one representative per class of alike ranks.
pub(super) struct Folded {
    /// Each position's class.
    pub class_of: Vec<u32>,
    /// Each class's representative position.
    pub reps: Vec<usize>,
    /// Per class, per transfer of its representative: the flow of a send (`None` for a
    /// receive).
    pub sends: Vec<Vec<Option<SendFlow>>>,
    /// Per class, per transfer of its representative: for a receive, the (class, transfer)
    /// sends whose flows wait for it (empty for a send).
    pub fed_by: Vec<Vec<Vec<(u32, u32)>>>,
    /// Per uplink class: (bytes per second, shared efficiency).
    pub uplink_classes: Vec<(f64, f64)>,
}

impl Folded {
    /// Classes in all.
    pub fn classes(&self) -> usize {
        self.reps.len()
    }
}

/// Mixes `v` into the hash `h` (SplitMix64's finaliser over a combination).
fn mix(h: u64, v: u64) -> u64 {
    let mut z = h
        .rotate_left(23)
        .wrapping_add(v)
        .wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn distinct(colors: &[u64]) -> usize {
    let mut v = colors.to_vec();
    v.sort_unstable();
    v.dedup();
    v.len()
}

/// Dense class ids in order of first appearance, and each class's first member.
fn dense(colors: &[u64]) -> (Vec<u32>, Vec<usize>) {
    let mut ids: HashMap<u64, u32> = HashMap::new();
    let mut first = Vec::new();
    let of = colors
        .iter()
        .enumerate()
        .map(|(x, c)| {
            *ids.entry(*c).or_insert_with(|| {
                first.push(x);
                first.len() as u32 - 1
            })
        })
        .collect();
    (of, first)
}

/// Where every transfer's flow goes through shared uplinks, and the cost of its link.
struct Paths {
    /// Each position's first transfer in the global numbering.
    offset: Vec<usize>,
    /// Per global transfer: its uplinks, `path[path_at[g]..path_at[g + 1]]`.
    path_at: Vec<u32>,
    path: Vec<u32>,
    /// Per global transfer: a hash of its link's cost and port.
    link_sig: Vec<u64>,
    /// Per global transfer: the index of the transfer that meets it at its peer
    /// (`u32::MAX`: none).
    partner: Vec<u32>,
    /// Per uplink: the sends that cross it, as (position, transfer index).
    crossing_at: Vec<u32>,
    crossing: Vec<(u32, u32)>,
    /// Per uplink: its cost and sharing (the first copy seen).
    info: Vec<Uplink>,
}

impl Paths {
    fn new(scheds: &[Compact], net: &dyn Network) -> Self {
        let mut offset = Vec::with_capacity(scheds.len() + 1);
        let mut total = 0usize;
        for s in scheds {
            offset.push(total);
            total += s.transfers.len();
        }
        offset.push(total);
        let mut ids: HashMap<u64, u32> = HashMap::new();
        let mut info = Vec::new();
        let mut path_at = Vec::with_capacity(total + 1);
        let mut path = Vec::new();
        let mut link_sig = Vec::with_capacity(total);
        let mut ups = Vec::new();
        for (x, s) in scheds.iter().enumerate() {
            for t in &s.transfers {
                path_at.push(path.len() as u32);
                let (from, to) = if t.sends() {
                    (x, t.peer())
                } else {
                    (t.peer(), x)
                };
                link_sig.push(link_signature(net, from, to));
                net.uplinks(from, to, &mut ups);
                for u in &ups {
                    let id = *ids.entry(u.id).or_insert_with(|| {
                        info.push(*u);
                        info.len() as u32 - 1
                    });
                    path.push(id);
                }
            }
        }
        path_at.push(path.len() as u32);
        // Sends by uplink (counting sort).
        let mut count = vec![0u32; info.len() + 1];
        for (x, s) in scheds.iter().enumerate() {
            for (t, tr) in s.transfers.iter().enumerate() {
                if tr.sends() {
                    let g = offset[x] + t;
                    for &u in &path[path_at[g] as usize..path_at[g + 1] as usize] {
                        count[u as usize + 1] += 1;
                    }
                }
            }
        }
        for u in 0..info.len() {
            count[u + 1] += count[u];
        }
        let crossing_at = count.clone();
        let mut crossing = vec![(0u32, 0u32); *count.last().unwrap_or(&0) as usize];
        for (x, s) in scheds.iter().enumerate() {
            for (t, tr) in s.transfers.iter().enumerate() {
                if tr.sends() {
                    let g = offset[x] + t;
                    for &u in &path[path_at[g] as usize..path_at[g + 1] as usize] {
                        crossing[count[u as usize] as usize] = (x as u32, t as u32);
                        count[u as usize] += 1;
                    }
                }
            }
        }
        Self {
            offset,
            path_at,
            path,
            link_sig,
            partner: partners(scheds),
            crossing_at,
            crossing,
            info,
        }
    }

    fn path(&self, g: usize) -> &[u32] {
        &self.path[self.path_at[g] as usize..self.path_at[g + 1] as usize]
    }
}

/// Per global transfer, the index of the transfer that meets it at its peer: the k-th send
/// from x to y meets the k-th receive at y from x (`u32::MAX` where there is none).
fn partners(scheds: &[Compact]) -> Vec<u32> {
    // Each position's transfers sorted by (peer, direction, index).
    let sorted: Vec<Vec<(u32, bool, u32)>> = scheds
        .iter()
        .map(|s| {
            let mut v: Vec<(u32, bool, u32)> = s
                .transfers
                .iter()
                .enumerate()
                .map(|(t, tr)| (tr.peer() as u32, tr.sends(), t as u32))
                .collect();
            v.sort_unstable();
            v
        })
        .collect();
    let mut out = Vec::new();
    for (x, s) in scheds.iter().enumerate() {
        let mine = &sorted[x];
        for (t, tr) in s.transfers.iter().enumerate() {
            let key = (tr.peer() as u32, tr.sends());
            let first = mine.partition_point(|e| (e.0, e.1) < key);
            let at = mine.partition_point(|e| (e.0, e.1, e.2) < (key.0, key.1, t as u32));
            let theirs = sorted.get(tr.peer()).map_or(&[][..], Vec::as_slice);
            let want = (x as u32, !tr.sends());
            let from = theirs.partition_point(|e| (e.0, e.1) < want);
            out.push(
                theirs
                    .get(from + at - first)
                    .filter(|e| (e.0, e.1) == want)
                    .map_or(u32::MAX, |e| e.2),
            );
        }
    }
    out
}

/// A hash of the cost of the link from `from` to `to` and of whether it leaves the host.
fn link_signature(net: &dyn Network, from: usize, to: usize) -> u64 {
    let l = net.link(from, to);
    let h = mix(mix(l.alpha.to_bits(), l.beta.to_bits()), l.gamma.to_bits());
    mix(h, net.crosses_hosts(from, to) as u64)
}

/// The hash of one transfer's kind and length, as refinement mixes it in.
fn kind_and_length(s: &Compact, t: &Transfer) -> u64 {
    let kind = match t.kind() {
        Kind::Send => 0,
        Kind::Recv => 1,
        Kind::RecvReduce => 2,
    };
    kind | s.elems(t) << 2
}

/// Whether the positions take more than `max_classes` colours already in a coarse first round
/// of refinement: each one's start, steps, and every transfer's kind, length and link, without
/// its peer's colour, the step it meets the peer in, or its uplinks. Refinement only splits
/// colours, and its first round mixes in all of this and more, so then [`refine`] would give
/// up in its first round too, after building the [`Paths`] it needs: ten times the cost for
/// the all-gathers by recursive doubling and Bruck on the 24,576-rank example fabric (16,388
/// and 24,576 colours), about 0.03 s here against 0.2-0.5 s.
pub(super) fn too_many_classes(
    scheds: &[Compact],
    start: &[f64],
    net: &dyn Network,
    max_classes: usize,
) -> bool {
    if scheds.len() <= max_classes {
        return false;
    }
    let coarse: Vec<u64> = scheds
        .iter()
        .enumerate()
        .map(|(x, s)| {
            let mut h = mix(mix(1, start[x].to_bits()), s.steps() as u64);
            for si in 0..s.steps() {
                h = mix(h, u64::MAX - si as u64);
                for t in s.step(si) {
                    let (from, to) = if t.sends() {
                        (x, t.peer())
                    } else {
                        (t.peer(), x)
                    };
                    h = mix(h, kind_and_length(s, t));
                    h = mix(h, link_signature(net, from, to));
                }
            }
            h
        })
        .collect();
    distinct(&coarse) > max_classes
}

/// The number of classes full refinement settles on, with no limit and no coarse round first.
#[cfg(test)]
pub(super) fn refined_classes(scheds: &[Compact], start: &[f64], net: &dyn Network) -> usize {
    let paths = Paths::new(scheds, net);
    refine(scheds, start, &paths, usize::MAX).map_or(usize::MAX, |(r, _)| distinct(&r))
}

/// Colours of positions and uplinks that no round of refinement splits further; `None`
/// once the positions take more than `max_classes` colours, the rounds more than
/// [`MAX_REFINED_TRANSFERS`] transfers in all, or (above [`super::FLOW_PHASE_MAX_RANKS`]
/// ranks) more than [`MAX_ROUNDS_AT_SCALE`] rounds: a ring or a chain whose ranks differ
/// refines one hop a round, so its classes take p / 2 rounds to settle, all to find that
/// every rank is its own class.
fn refine(
    scheds: &[Compact],
    start: &[f64],
    paths: &Paths,
    max_classes: usize,
) -> Option<(Vec<u64>, Vec<u64>)> {
    let per_round = paths.link_sig.len().max(1);
    let mut rounds_left = MAX_REFINED_TRANSFERS / per_round;
    if scheds.len() > super::FLOW_PHASE_MAX_RANKS {
        rounds_left = rounds_left.min(MAX_ROUNDS_AT_SCALE);
    }
    let p = scheds.len();
    let mut rank: Vec<u64> = (0..p).map(|x| mix(1, start[x].to_bits())).collect();
    let mut up: Vec<u64> = paths
        .info
        .iter()
        .map(|u| {
            mix(
                mix(2, u.seconds_per_byte.to_bits()),
                u.shared_efficiency.to_bits(),
            )
        })
        .collect();
    let mut classes = distinct(&rank) + distinct(&up);
    let mut colors = Vec::new();
    let mut seen: Vec<(u64, u32)> = Vec::new();
    loop {
        if rounds_left == 0 {
            return None;
        }
        rounds_left -= 1;
        let next_rank: Vec<u64> = (0..p)
            .map(|x| {
                let s = &scheds[x];
                let mut h = mix(rank[x], s.steps() as u64);
                for si in 0..s.steps() {
                    h = mix(h, u64::MAX - si as u64);
                    let base = s.bounds[si] as usize;
                    for (k, t) in s.step(si).iter().enumerate() {
                        let g = paths.offset[x] + base + k;
                        h = mix(h, kind_and_length(s, t));
                        h = mix(h, rank[t.peer()]);
                        // The step (not the place in it) where the peer meets this transfer:
                        // a step's operations all start together, so senders whose receives
                        // sit in one step of a peer in different order are still alike.
                        let j = paths.partner[g];
                        let meets = if j == u32::MAX {
                            u64::MAX
                        } else {
                            step_of(&scheds[t.peer()], j as usize) as u64
                        };
                        h = mix(h, meets);
                        h = mix(h, paths.link_sig[g]);
                        colors.clear();
                        colors.extend(paths.path(g).iter().map(|&u| up[u as usize]));
                        colors.sort_unstable();
                        for &c in &colors {
                            h = mix(h, c);
                        }
                    }
                }
                h
            })
            .collect();
        let next_up: Vec<u64> = (0..up.len())
            .map(|u| {
                let (a, b) = (
                    paths.crossing_at[u] as usize,
                    paths.crossing_at[u + 1] as usize,
                );
                seen.clear();
                seen.extend(
                    paths.crossing[a..b]
                        .iter()
                        .map(|&(x, t)| (rank[x as usize], t)),
                );
                seen.sort_unstable();
                seen.iter()
                    .fold(up[u], |h, &(c, t)| mix(mix(h, c), t as u64))
            })
            .collect();
        let ranks = distinct(&next_rank);
        if ranks > max_classes {
            return None;
        }
        let n = ranks + distinct(&next_up);
        rank = next_rank;
        up = next_up;
        if n == classes {
            return Some((rank, up));
        }
        classes = n;
    }
}

fn step_of(s: &Compact, t: usize) -> usize {
    s.bounds.partition_point(|&b| b as usize <= t) - 1
}

/// Folds `scheds` (one per position, entering at `start`) onto its classes; `None` when
/// they take more than `max_classes` or the classes turn out not to be alike after all (a
/// class member that takes one send in two different steps), an error when the schedules
/// do not match up (a send without its receive).
pub(super) fn fold(
    scheds: &[Compact],
    net: &dyn Network,
    start: &[f64],
    max_classes: usize,
) -> Result<Option<Folded>, String> {
    if too_many_classes(scheds, start, net, max_classes) {
        return Ok(None);
    }
    let paths = Paths::new(scheds, net);
    let Some((rank_colors, up_colors)) = refine(scheds, start, &paths, max_classes) else {
        return Ok(None);
    };
    let (class_of, reps) = dense(&rank_colors);
    let (up_class, up_first) = dense(&up_colors);
    let mut size = vec![0usize; reps.len()];
    for &c in &class_of {
        size[c as usize] += 1;
    }
    let mut up_size = vec![0usize; up_first.len()];
    for &c in &up_class {
        up_size[c as usize] += 1;
    }
    let unmatched = |x: usize, t: usize| {
        format!("rank {x}'s transfer {t} has no matching transfer at its peer")
    };
    let mut sends: Vec<Vec<Option<SendFlow>>> = Vec::with_capacity(reps.len());
    let mut back: Vec<Vec<(u32, u32)>> = Vec::with_capacity(reps.len());
    for (c, &r) in reps.iter().enumerate() {
        let s = &scheds[r];
        let mut flows = Vec::with_capacity(s.transfers.len());
        let mut from = Vec::with_capacity(s.transfers.len());
        for (t, tr) in s.transfers.iter().enumerate() {
            let q = tr.peer();
            let j = paths.partner[paths.offset[r] + t];
            if j == u32::MAX {
                return Err(unmatched(r, t));
            }
            let j = j as usize;
            let other = class_of[q];
            if !tr.sends() {
                flows.push(None);
                from.push((other, j as u32));
                continue;
            }
            let rep = &scheds[reps[other as usize]];
            let rep_recv = rep.transfers.get(j);
            if rep_recv.is_none_or(|x| x.sends() || rep.elems(x) != s.elems(tr)) {
                return Ok(None);
            }
            let mut uplinks: Vec<(u32, f64)> = Vec::new();
            for &u in paths.path(paths.offset[r] + t) {
                let uc = up_class[u as usize];
                let w = size[c] as f64 / up_size[uc as usize] as f64;
                match uplinks.iter_mut().find(|(x, _)| *x == uc) {
                    Some((_, v)) => *v += w,
                    None => uplinks.push((uc, w)),
                }
            }
            flows.push(Some(SendFlow {
                to_class: other,
                to_op: j as u32,
                link: net.link(r, q),
                off_host: net.crosses_hosts(r, q),
                recv_weight: size[c] as f64 / size[other as usize] as f64,
                uplinks,
                completes: Vec::new(),
            }));
            from.push((u32::MAX, 0));
        }
        sends.push(flows);
        back.push(from);
    }
    // Which flows complete each receive, and which wait for it.
    let mut fed_by: Vec<Vec<Vec<(u32, u32)>>> = reps
        .iter()
        .map(|&r| vec![Vec::new(); scheds[r].transfers.len()])
        .collect();
    for (c, flows) in sends.iter().enumerate() {
        for (t, f) in flows.iter().enumerate() {
            if let Some(f) = f {
                fed_by[f.to_class as usize][f.to_op as usize].push((c as u32, t as u32));
            }
        }
    }
    for (b, from) in back.iter().enumerate() {
        for (j, &(a, t)) in from.iter().enumerate() {
            if a == u32::MAX {
                continue;
            }
            let Some(flow) = sends[a as usize]
                .get_mut(t as usize)
                .and_then(Option::as_mut)
                .filter(|f| f.to_class as usize == b)
            else {
                return Ok(None);
            };
            let rb = &scheds[reps[b]];
            if step_of(rb, j) != step_of(rb, flow.to_op as usize) {
                return Ok(None);
            }
            flow.completes.push(j as u32);
        }
    }
    let uplink_classes = up_first
        .iter()
        .map(|&u| {
            let i = &paths.info[u];
            (1.0 / i.seconds_per_byte, i.shared_efficiency)
        })
        .collect();
    Ok(Some(Folded {
        class_of,
        reps,
        sends,
        fed_by,
        uplink_classes,
    }))
}
