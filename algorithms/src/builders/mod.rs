//! Schedule builders: one function per (collective, algorithm).
//!
//! Each builder produces the schedule of one rank. They handle any rank count ≥ 1 and any
//! element count, including 0 and counts smaller than the number of ranks. Builders for
//! rooted collectives work on ranks relative to the root and relabel peers at the end;
//! recursive halving and doubling fold the ranks beyond the largest power of two into
//! partners.

pub mod exchange;
pub mod hier;
pub mod recursive;
pub mod ring;
pub mod tree;

pub use exchange::*;
pub(crate) use hier::along_topology;
pub use hier::{
    hierarchical_all_gather, hierarchical_all_reduce, hierarchical_broadcast,
    hierarchical_reduce_scatter,
};
pub use recursive::*;
pub use ring::*;
pub use tree::*;

use crate::schedule::{Buf, Collective, Op, RankSchedule, Region};
use crate::{Algorithm, AllGatherPart, ReduceScatterPart};

/// Splits `n` elements into `parts` contiguous blocks whose sizes differ by at most one.
/// `i == parts` gives `(n, 0)`, the end of the last block.
pub fn block(n: usize, parts: usize, i: usize) -> (usize, usize) {
    let base = n / parts;
    let extra = n % parts;
    let offset = i * base + i.min(extra);
    let len = if i < parts {
        base + usize::from(i < extra)
    } else {
        0
    };
    (offset, len)
}

/// A vector cut into `parts` blocks laid out back to back in `buf` from element `base`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Blocks {
    buf: Buf,
    base: usize,
    total: usize,
    parts: usize,
    /// Every block has this length (NCCL's per-rank count); else sizes follow [`block`].
    each: Option<usize>,
}

impl Blocks {
    /// `parts` blocks of `each` elements.
    pub(crate) fn uniform(buf: Buf, base: usize, parts: usize, each: usize) -> Self {
        Self {
            buf,
            base,
            total: parts * each,
            parts,
            each: Some(each),
        }
    }

    /// `total` elements split by [`block`].
    pub(crate) fn split(buf: Buf, base: usize, total: usize, parts: usize) -> Self {
        Self {
            buf,
            base,
            total,
            parts,
            each: None,
        }
    }

    fn start(&self, i: usize) -> usize {
        match self.each {
            Some(e) => i * e,
            None => block(self.total, self.parts, i).0,
        }
    }

    /// Blocks `a..b` as one region.
    pub(crate) fn range(&self, a: usize, b: usize) -> Region {
        let (s, e) = (self.start(a), self.start(b));
        Region::new(self.buf, self.base + s, e - s)
    }

    /// Block `i`.
    pub(crate) fn one(&self, i: usize) -> Region {
        self.range(i, i + 1)
    }

    /// Every block.
    pub(crate) fn all(&self) -> Region {
        self.range(0, self.parts)
    }

    /// The blocks that hold elements, when some do not (`None` when all do): fewer elements
    /// than blocks leave all but the first `total` empty.
    pub(crate) fn nonempty(&self) -> Option<std::ops::Range<usize>> {
        match self.each {
            Some(0) => Some(0..0),
            Some(_) => None,
            None if self.total < self.parts => Some(0..self.total),
            None => None,
        }
    }
}

/// Folding `p` ranks onto the largest power of two `pof2 ≤ p`: the first `2·rem` ranks pair
/// up, each even one handing its data to the odd one after it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Fold {
    pub(crate) pof2: usize,
    pub(crate) rem: usize,
}

impl Fold {
    pub(crate) fn new(p: usize) -> Self {
        let pof2 = prev_power_of_two(p);
        Self {
            pof2,
            rem: p - pof2,
        }
    }

    /// The virtual rank of real rank `r`, or `None` for a rank that sits out.
    pub(crate) fn virt(&self, r: usize) -> Option<usize> {
        if r < 2 * self.rem {
            (r % 2 == 1).then_some(r / 2)
        } else {
            Some(r - self.rem)
        }
    }

    /// The real rank of virtual rank `u`.
    pub(crate) fn real(&self, u: usize) -> usize {
        if u < self.rem {
            2 * u + 1
        } else {
            u + self.rem
        }
    }

    /// The first real block of virtual block `u`; `u == pof2` gives p.
    pub(crate) fn first_block(&self, u: usize) -> usize {
        if u < self.rem { 2 * u } else { u + self.rem }
    }
}

/// The largest power of two ≤ `p` (1 for p ≤ 1).
pub(crate) fn prev_power_of_two(p: usize) -> usize {
    if p <= 1 {
        1
    } else {
        1 << (usize::BITS - 1 - p.leading_zeros())
    }
}

/// The lowest set bit of `v` (v > 0).
pub(crate) fn lowbit(v: usize) -> usize {
    v & v.wrapping_neg()
}

pub(crate) fn modp(x: isize, p: usize) -> usize {
    x.rem_euclid(p as isize) as usize
}

/// A copy, or nothing when source and destination are the same memory.
pub(crate) fn copy(src: Region, dst: Region) -> Option<Op> {
    (src != dst).then_some(Op::Copy { src, dst })
}

/// A step that copies `input` to `output` (none when they are the same memory): the whole
/// schedule of a lone rank of a collective that only moves data.
pub(crate) fn copy_step(s: &mut RankSchedule, input: Region, output: Region) {
    s.step(copy(input, output).into_iter().collect());
}

/// The whole schedule of a lone rank: its input becomes its output, finalized.
pub(crate) fn one_rank(s: &mut RankSchedule, input: Region, output: Region) {
    copy_step(s, input, output);
    s.step(vec![Op::Finalize { region: output }]);
}

/// A folded rank's schedule: hand `input` to `partner`, then receive the result into `output`.
pub(crate) fn sit_out(s: &mut RankSchedule, partner: usize, input: Region, output: Region) {
    s.step(vec![Op::Send {
        peer: partner,
        src: input,
    }]);
    s.step(vec![Op::Recv {
        peer: partner,
        dst: output,
    }]);
}

/// Block ranges `[a, a + len)` modulo `p`, cut where they wrap: one or two `(start, end)`.
pub(crate) fn wrapped(a: usize, len: usize, p: usize) -> Vec<(usize, usize)> {
    if a + len <= p {
        vec![(a, a + len)]
    } else {
        vec![(a, p), (0, a + len - p)]
    }
}

/// A reduce-scatter followed by an all-gather over the same `p` blocks of the output: the
/// all-reduce of Rabenseifner, Patarasuk and Yuan, with either half chosen independently.
pub fn composed_all_reduce(
    rs: ReduceScatterPart,
    ag: AllGatherPart,
    p: usize,
    r: usize,
    n: usize,
) -> RankSchedule {
    let input = Blocks::split(Buf::Input, 0, n, p);
    let out = Blocks::split(Buf::Output, 0, n, p);
    let mut s = RankSchedule::default();
    match rs {
        ReduceScatterPart::Ring => {
            ring::ring_reduce_scatter_core(&mut s, p, r, input, ring::Partials::In(out), out.one(r))
        }
        ReduceScatterPart::Halving => {
            recursive::halving_reduce_scatter_core(&mut s, p, r, input, out, out.one(r))
        }
        ReduceScatterPart::Pairwise => {
            exchange::pairwise_reduce_scatter_core(&mut s, p, r, input, out.one(r))
        }
    }
    all_gather_core(ag)(&mut s, p, r, out.one(r), out);
    s
}

/// An all-gather core: rank `me` contributes `own` as block `me` of `out`.
type AllGatherCore = fn(&mut RankSchedule, usize, usize, Region, Blocks);

fn all_gather_core(ag: AllGatherPart) -> AllGatherCore {
    match ag {
        AllGatherPart::Ring => ring::ring_all_gather_core,
        AllGatherPart::Doubling => recursive::doubling_all_gather_core,
        AllGatherPart::Bruck => exchange::bruck_all_gather_core,
    }
}

/// The all-gather collective of `n` elements per rank with `ag`.
pub fn all_gather(ag: AllGatherPart, p: usize, r: usize, n: usize) -> RankSchedule {
    let mut s = RankSchedule::default();
    let out = Blocks::uniform(Buf::Output, 0, p, n);
    all_gather_core(ag)(&mut s, p, r, Region::new(Buf::Input, 0, n), out);
    s
}

fn point_to_point(send: bool, peer: usize, n: usize) -> RankSchedule {
    let mut s = RankSchedule::default();
    s.step(vec![if send {
        Op::Send {
            peer,
            src: Region::new(Buf::Input, 0, n),
        }
    } else {
        Op::Recv {
            peer,
            dst: Region::new(Buf::Output, 0, n),
        }
    }]);
    s
}

/// The schedule of rank `r` for (collective, algorithm), or `None` if the pair has none.
pub(crate) fn build(
    collective: Collective,
    algorithm: Algorithm,
    p: usize,
    r: usize,
    n: usize,
    root: usize,
    chunk: usize,
) -> Option<RankSchedule> {
    use Algorithm as A;
    use Collective as C;
    Some(match (collective, algorithm) {
        (C::AllReduce, A::Ring) => {
            composed_all_reduce(ReduceScatterPart::Ring, AllGatherPart::Ring, p, r, n)
        }
        (C::AllReduce, A::Tree) => double_binary_tree_all_reduce(p, r, n, chunk),
        (C::AllReduce, A::RecursiveDoubling) => recursive_doubling_all_reduce(p, r, n),
        (C::AllReduce, A::Rabenseifner) => rabenseifner_all_reduce(p, r, n),
        (C::AllReduce, A::Composed(rs, ag)) => composed_all_reduce(rs, ag, p, r, n),
        (C::AllReduce, A::OneShot) => one_shot_all_reduce(p, r, n),
        (C::AllGather, A::Ring) => all_gather(AllGatherPart::Ring, p, r, n),
        (C::AllGather, A::RecursiveDoubling) => all_gather(AllGatherPart::Doubling, p, r, n),
        (C::AllGather, A::Bruck) => all_gather(AllGatherPart::Bruck, p, r, n),
        (C::ReduceScatter, A::Ring) => ring_reduce_scatter(p, r, n),
        (C::ReduceScatter, A::RecursiveHalving) => recursive_halving_reduce_scatter(p, r, n),
        (C::ReduceScatter, A::Pairwise) => pairwise_reduce_scatter(p, r, n),
        (C::Broadcast, A::Chain) => chain_broadcast(p, r, n, root, chunk),
        (C::Broadcast, A::BinomialTree) => binomial_broadcast(p, r, n, root),
        (C::Broadcast, A::ScatterAllGather) => scatter_allgather_broadcast(p, r, n, root),
        (C::Reduce, A::BinomialTree) => binomial_reduce(p, r, n, root),
        (C::Reduce, A::ReduceScatterGather) => reduce_scatter_gather_reduce(p, r, n, root),
        (C::AllToAll, A::Pairwise) => pairwise_all_to_all(p, r, n),
        (C::AllToAll, A::Bruck) => bruck_all_to_all(p, r, n),
        (C::Gather, A::Linear) => linear_gather(p, r, n, root),
        (C::Gather, A::BinomialTree) => binomial_gather(p, r, n, root),
        (C::Scatter, A::Linear) => linear_scatter(p, r, n, root),
        (C::Scatter, A::BinomialTree) => binomial_scatter(p, r, n, root),
        (C::Barrier, A::Dissemination) => dissemination_barrier(p, r),
        (C::Send, A::Direct) => point_to_point(true, root, n),
        (C::Recv, A::Direct) => point_to_point(false, root, n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_cover_exactly() {
        for n in 0..40 {
            for parts in 1..10 {
                let mut next = 0;
                for i in 0..parts {
                    let (off, len) = block(n, parts, i);
                    assert_eq!(off, next);
                    next += len;
                }
                assert_eq!(next, n);
                assert_eq!(block(n, parts, parts), (n, 0));
            }
        }
    }

    #[test]
    fn fold_maps_every_rank_once() {
        for p in 1..70 {
            let f = Fold::new(p);
            assert!(f.pof2.is_power_of_two() && f.pof2 <= p && 2 * f.pof2 > p);
            let mut seen = vec![false; f.pof2];
            for r in 0..p {
                if let Some(u) = f.virt(r) {
                    assert!(!seen[u]);
                    seen[u] = true;
                    assert_eq!(f.real(u), r);
                }
            }
            assert!(seen.iter().all(|s| *s));
            assert_eq!(f.first_block(f.pof2), p);
        }
    }
}
