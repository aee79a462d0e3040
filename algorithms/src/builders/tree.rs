//! Tree schedules: binomial trees rooted anywhere, and NCCL-style double binary trees.
//!
//! Binomial builders work on ranks relative to the root (`v = r − root mod p`): rank v's parent
//! is v with its lowest set bit cleared, and its subtree is the range `[v, v + lowbit(v))`.

use super::{
    Blocks, block, copy, halving_reduce_scatter_core, lowbit, one_rank, prev_power_of_two,
};
use crate::schedule::{Buf, Op, RankSchedule, Region};

/// Ranks relative to `root`.
struct Relative {
    p: usize,
    root: usize,
    v: usize,
}

impl Relative {
    fn new(p: usize, r: usize, root: usize) -> Self {
        Self {
            p,
            root,
            v: (r + p - root) % p,
        }
    }

    fn real(&self, v: usize) -> usize {
        (v + self.root) % self.p
    }

    /// The size of the subtree rooted at relative rank `v`.
    fn subtree(&self, v: usize) -> usize {
        if v == 0 {
            self.p
        } else {
            lowbit(v).min(self.p - v)
        }
    }

    /// Children of `v`, largest subtree first: `v + 2^k` below its lowest set bit (below p
    /// for the root).
    fn children(&self, v: usize) -> Vec<usize> {
        let top = if v == 0 {
            prev_power_of_two(self.p.saturating_sub(1))
        } else {
            lowbit(v) / 2
        };
        std::iter::successors(Some(top), |m| Some(m / 2))
            .take_while(|&m| m > 0)
            .map(|m| v + m)
            .filter(|&c| c < self.p)
            .collect()
    }

    fn parent(&self, v: usize) -> usize {
        v - lowbit(v)
    }

    /// Relative block range `[a, b)` cut where real ranks wrap to 0, so that every piece is
    /// contiguous in a buffer laid out by real rank.
    fn pieces(&self, a: usize, b: usize) -> Vec<(usize, usize)> {
        let cut = self.p - self.root;
        if a < cut && cut < b {
            vec![(a, cut), (cut, b)]
        } else {
            vec![(a, b)]
        }
    }
}

/// Binomial broadcast: each rank receives from its parent, then sends to its children, the
/// largest subtree first, one per step.
pub fn binomial_broadcast(p: usize, r: usize, n: usize, root: usize) -> RankSchedule {
    let t = Relative::new(p, r, root);
    let mut s = RankSchedule::default();
    let (input, out) = (
        Region::new(Buf::Input, 0, n),
        Region::new(Buf::Output, 0, n),
    );
    let mut first: Vec<Op> = Vec::new();
    let src = if t.v == 0 {
        first.extend(copy(input, out));
        input
    } else {
        s.step(vec![Op::Recv {
            peer: t.real(t.parent(t.v)),
            dst: out,
        }]);
        out
    };
    for kid in t.children(t.v) {
        let mut ops = std::mem::take(&mut first);
        ops.push(Op::Send {
            peer: t.real(kid),
            src,
        });
        s.step(ops);
    }
    s.step(first);
    s
}

/// Binomial-tree reduce to `root`: in round k a rank whose relative index has bit k set sends
/// its partial result to the rank 2^k below it and leaves.
pub fn binomial_reduce(p: usize, r: usize, n: usize, root: usize) -> RankSchedule {
    let mut s = RankSchedule::default();
    let t = Relative::new(p, r, root);
    let v = t.v;
    let acc_buf = if v == 0 { Buf::Output } else { Buf::Scratch };
    let acc = Region::new(acc_buf, 0, n);
    let input = Region::new(Buf::Input, 0, n);
    let mut have_acc = false;
    let mut mask = 1;
    while mask < p {
        if v & mask != 0 {
            let src = if have_acc { acc } else { input };
            s.step(vec![Op::Send {
                peer: t.real(v - mask),
                src,
            }]);
            break;
        }
        if v + mask < p {
            let src = if have_acc { acc } else { input };
            s.step(vec![Op::RecvReduce {
                peer: t.real(v + mask),
                src,
                dst: acc,
            }]);
            have_acc = true;
        }
        mask <<= 1;
    }
    if v == 0 {
        if !have_acc {
            s.step(copy(input, acc).into_iter().collect());
        }
        s.step(vec![Op::Finalize { region: acc }]);
    } else if have_acc {
        s.scratch_elems = n;
    }
    s
}

/// Binomial gather: each rank collects its subtree's blocks (children in increasing subtree
/// size), then sends them to its parent in one message per contiguous piece. Inner ranks stage
/// their subtree in scratch; the root receives straight into its output.
pub fn binomial_gather(p: usize, r: usize, n: usize, root: usize) -> RankSchedule {
    let t = Relative::new(p, r, root);
    let mut s = RankSchedule::default();
    let input = Region::new(Buf::Input, 0, n);
    let v = t.v;
    let size = t.subtree(v);
    // Where relative blocks [a, b) (not crossing the wrap) live on this rank.
    let place = |a: usize, b: usize| {
        if v == 0 {
            Region::new(Buf::Output, t.real(a) * n, (b - a) * n)
        } else {
            Region::new(Buf::Scratch, (a - v) * n, (b - a) * n)
        }
    };
    if v != 0 && size == 1 {
        s.step(vec![Op::Send {
            peer: t.real(t.parent(v)),
            src: input,
        }]);
        return s;
    }
    s.step(copy(input, place(v, v + 1)).into_iter().collect());
    let mut kids = t.children(v);
    kids.reverse();
    for kid in kids {
        let ops = t
            .pieces(kid, kid + t.subtree(kid))
            .into_iter()
            .map(|(a, b)| Op::Recv {
                peer: t.real(kid),
                dst: place(a, b),
            })
            .collect();
        s.step(ops);
    }
    if v != 0 {
        let ops = t
            .pieces(v, v + size)
            .into_iter()
            .map(|(a, b)| Op::Send {
                peer: t.real(t.parent(v)),
                src: place(a, b),
            })
            .collect();
        s.step(ops);
        s.scratch_elems = size * n;
    }
    s
}

/// Binomial scatter: the mirror of [`binomial_gather`]; each rank receives its subtree's
/// blocks and hands each child its share, largest first.
pub fn binomial_scatter(p: usize, r: usize, n: usize, root: usize) -> RankSchedule {
    let t = Relative::new(p, r, root);
    let mut s = RankSchedule::default();
    let output = Region::new(Buf::Output, 0, n);
    let v = t.v;
    let size = t.subtree(v);
    let place = |a: usize, b: usize| {
        if v == 0 {
            Region::new(Buf::Input, t.real(a) * n, (b - a) * n)
        } else {
            Region::new(Buf::Scratch, (a - v) * n, (b - a) * n)
        }
    };
    if v != 0 {
        let dst = |a, b| if size == 1 { output } else { place(a, b) };
        let ops = t
            .pieces(v, v + size)
            .into_iter()
            .map(|(a, b)| Op::Recv {
                peer: t.real(t.parent(v)),
                dst: dst(a, b),
            })
            .collect();
        s.step(ops);
        if size == 1 {
            return s;
        }
        s.scratch_elems = size * n;
    }
    let mut first: Vec<Op> = copy(place(v, v + 1), output).into_iter().collect();
    for kid in t.children(v) {
        let mut ops = std::mem::take(&mut first);
        ops.extend(
            t.pieces(kid, kid + t.subtree(kid))
                .into_iter()
                .map(|(a, b)| Op::Send {
                    peer: t.real(kid),
                    src: place(a, b),
                }),
        );
        s.step(ops);
    }
    s.step(first);
    s
}

/// Van de Geijn's broadcast: a binomial scatter of the root's buffer in p blocks, then a ring
/// all-gather. Moves about 2n per rank instead of n·lg p, for large messages.
pub fn scatter_allgather_broadcast(p: usize, r: usize, n: usize, root: usize) -> RankSchedule {
    let t = Relative::new(p, r, root);
    let v = t.v;
    let mut s = RankSchedule::default();
    let out = Blocks::split(Buf::Output, 0, n, p);
    let input = Blocks::split(Buf::Input, 0, n, p);
    let mut first: Vec<Op> = Vec::new();
    let src = if v == 0 {
        first.extend(copy(input.all(), out.all()));
        input
    } else {
        s.step(vec![Op::Recv {
            peer: t.parent(v),
            dst: out.range(v, v + t.subtree(v)),
        }]);
        out
    };
    for kid in t.children(v) {
        let mut ops = std::mem::take(&mut first);
        ops.push(Op::Send {
            peer: kid,
            src: src.range(kid, kid + t.subtree(kid)),
        });
        s.step(ops);
    }
    s.step(first);
    super::ring_all_gather_core(&mut s, p, v, out.one(v), out);
    s.map_peers(|q| t.real(q));
    s
}

/// Reduce as a recursive-halving reduce-scatter followed by a binomial gather of the reduced
/// blocks to the root (Rabenseifner's reduce): about 2n per rank moved instead of n·lg p.
pub fn reduce_scatter_gather_reduce(p: usize, r: usize, n: usize, root: usize) -> RankSchedule {
    let t = Relative::new(p, r, root);
    let v = t.v;
    let mut s = RankSchedule::default();
    let data = if v == 0 { Buf::Output } else { Buf::Scratch };
    let acc = Blocks::split(data, 0, n, p);
    let input = Blocks::split(Buf::Input, 0, n, p);
    halving_reduce_scatter_core(&mut s, p, v, input, acc, acc.one(v));
    let mut kids = t.children(v);
    kids.reverse();
    for kid in kids {
        s.step(vec![Op::Recv {
            peer: kid,
            dst: acc.range(kid, kid + t.subtree(kid)),
        }]);
    }
    if v != 0 {
        s.step(vec![Op::Send {
            peer: t.parent(v),
            src: acc.range(v, v + t.subtree(v)),
        }]);
        s.scratch_elems = n;
    }
    s.map_peers(|q| t.real(q));
    s
}

/// The parent of position `i` (1-based) in the in-order binary tree over `1..=p`, whose root
/// is the largest power of two ≤ p and whose leaves are the odd positions.
pub fn btree_parent(p: usize, i: usize) -> Option<usize> {
    if i == prev_power_of_two(p) {
        return None;
    }
    let mut i = i;
    loop {
        let h = i.trailing_zeros();
        let up = if (i >> (h + 1)) & 1 == 1 {
            i - (1 << h)
        } else {
            i + (1 << h)
        };
        if up <= p {
            return Some(up);
        }
        i = up;
    }
}

/// The children of position `i` in [`btree_parent`]'s tree, smaller first (at most two).
pub fn btree_children(p: usize, i: usize) -> Vec<usize> {
    let h = i.trailing_zeros();
    let mut kids: Vec<usize> = (0..h)
        .flat_map(|k| [i.checked_sub(1 << k), Some(i + (1 << k))])
        .flatten()
        .filter(|&j| j >= 1 && j <= p && btree_parent(p, j) == Some(i))
        .collect();
    kids.sort_unstable();
    kids
}

fn btree_depth(p: usize, mut i: usize) -> usize {
    let mut d = 0;
    while let Some(up) = btree_parent(p, i) {
        i = up;
        d += 1;
    }
    d
}

/// The position of `rank` in tree `t` of the double binary tree. Tree 0 puts rank r at
/// position r + 1; tree 1 mirrors it (even p) or shifts it by one (odd p), so that every rank
/// that is inner in one tree is a leaf in the other.
pub fn dbt_position(p: usize, t: usize, rank: usize) -> usize {
    match (t, p % 2) {
        (0, _) => rank + 1,
        (_, 0) => p - rank,
        _ => (rank + p - 1) % p + 1,
    }
}

fn dbt_rank(p: usize, t: usize, pos: usize) -> usize {
    match (t, p % 2) {
        (0, _) => pos - 1,
        (_, 0) => p - pos,
        _ => pos % p,
    }
}

/// Double binary tree all-reduce (NCCL's "tree"): two complementary binary trees each reduce
/// one half of the buffer up to their root and broadcast it back down, pipelined in chunks of
/// `chunk` elements.
///
/// Every transfer has a global time slot that both ends agree on, and a rank's steps are its
/// slots in order, so the schedule runs in lock step and cannot deadlock. With D the tree
/// height, a rank at depth d sends chunk c up at slot c + 2(D − d) (+1 if it is its parent's
/// second child); the root finishes chunk c at slot c + 2D, and chunk c reaches depth d on the
/// way down at slot 2D + 1 + c + 2(d − 1) (+1 for a second child).
pub fn double_binary_tree_all_reduce(p: usize, r: usize, n: usize, chunk: usize) -> RankSchedule {
    let mut s = RankSchedule::default();
    let (input, out) = (
        Region::new(Buf::Input, 0, n),
        Region::new(Buf::Output, 0, n),
    );
    if p == 1 {
        one_rank(&mut s, input, out);
        return s;
    }
    let chunk = chunk.max(1);
    let height = prev_power_of_two(p).trailing_zeros() as usize;
    let down = 2 * height + 1;
    // The ops of each slot, by slot (a rank's empty slots are dropped by `step`).
    let mut slots: Vec<Vec<Op>> = Vec::new();
    let mut at = |slot: usize, op: Op| {
        if slots.len() <= slot {
            slots.resize_with(slot + 1, Vec::new);
        }
        slots[slot].push(op);
    };
    for t in 0..2 {
        let (off, len) = block(n, 2, t);
        let piece =
            |buf: Buf, c: usize| Region::new(buf, off + c * chunk, chunk.min(len - c * chunk));
        let pos = dbt_position(p, t, r);
        let parent = btree_parent(p, pos);
        let kids = btree_children(p, pos);
        let depth = btree_depth(p, pos);
        let second = parent.map_or(0, |q| usize::from(btree_children(p, q)[0] != pos));
        let rank = |i: usize| dbt_rank(p, t, i);
        let up_src = if kids.is_empty() {
            Buf::Input
        } else {
            Buf::Output
        };
        for c in 0..len.div_ceil(chunk) {
            for (k, &kid) in kids.iter().enumerate() {
                let src = if k == 0 { Buf::Input } else { Buf::Output };
                at(
                    c + 2 * (height - depth - 1) + k,
                    Op::RecvReduce {
                        peer: rank(kid),
                        src: piece(src, c),
                        dst: piece(Buf::Output, c),
                    },
                );
            }
            match parent {
                Some(q) => {
                    at(
                        c + 2 * (height - depth) + second,
                        Op::Send {
                            peer: rank(q),
                            src: piece(up_src, c),
                        },
                    );
                    at(
                        down + c + 2 * (depth - 1) + second,
                        Op::Recv {
                            peer: rank(q),
                            dst: piece(Buf::Output, c),
                        },
                    );
                }
                None => at(
                    c + 2 * height,
                    Op::Finalize {
                        region: piece(Buf::Output, c),
                    },
                ),
            }
            for (k, &kid) in kids.iter().enumerate() {
                at(
                    down + c + 2 * depth + k,
                    Op::Send {
                        peer: rank(kid),
                        src: piece(Buf::Output, c),
                    },
                );
            }
        }
    }
    for ops in slots {
        s.step(ops);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn btree_is_a_binary_tree_of_bounded_height() {
        for p in 1..300 {
            let root = prev_power_of_two(p);
            let height = root.trailing_zeros() as usize;
            for i in 1..=p {
                let kids = btree_children(p, i);
                assert!(kids.len() <= 2, "p={p} i={i} kids={kids:?}");
                assert_eq!(kids.is_empty(), i % 2 == 1, "p={p} i={i}: leaves are odd");
                for k in kids {
                    assert_eq!(btree_parent(p, k), Some(i));
                }
                assert!(btree_depth(p, i) <= height, "p={p} i={i}");
                if i != root {
                    let q = btree_parent(p, i).unwrap();
                    assert!(btree_children(p, q).contains(&i));
                }
            }
        }
    }

    #[test]
    fn double_binary_trees_are_complementary() {
        for p in 2..200 {
            for r in 0..p {
                let inner: Vec<bool> = (0..2)
                    .map(|t| !btree_children(p, dbt_position(p, t, r)).is_empty())
                    .collect();
                assert!(!(inner[0] && inner[1]), "p={p}: rank {r} is inner in both");
                for t in 0..2 {
                    assert_eq!(dbt_rank(p, t, dbt_position(p, t, r)), r);
                }
            }
        }
    }
}
