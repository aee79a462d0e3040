//! Direct exchanges: one-shot, pairwise, Bruck, linear and dissemination schedules.

use super::{Blocks, copy, copy_step, one_rank, wrapped};
use crate::schedule::{Buf, Op, RankSchedule, Region};

/// One-shot all-reduce of `n` elements: rank `r` sends its whole input to every other rank
/// and receives theirs, all in one step, then reduces the `p` vectors itself in rank order,
/// so that every rank computes the same sums in the same order and ends with the same bits.
/// One dependent step instead of lg p: the choice for small messages on a few ranks. Every
/// vector lands in its own slot of scratch (this rank's copied there first), so the output
/// may alias the input.
pub fn one_shot_all_reduce(p: usize, r: usize, n: usize) -> RankSchedule {
    let mut s = RankSchedule::default();
    let (input, output) = (
        Region::new(Buf::Input, 0, n),
        Region::new(Buf::Output, 0, n),
    );
    if p == 1 {
        one_rank(&mut s, input, output);
        return s;
    }
    s.scratch_elems = p * n;
    let slot = |q: usize| Region::new(Buf::Scratch, q * n, n);
    let mut first = vec![Op::Copy {
        src: input,
        dst: slot(r),
    }];
    // Each rank starts with the rank after it, so that no rank is everyone's first.
    first.extend((1..p).map(|k| Op::Send {
        peer: (r + k) % p,
        src: input,
    }));
    first.extend((1..p).map(|k| {
        let q = (r + p - k) % p;
        Op::Recv {
            peer: q,
            dst: slot(q),
        }
    }));
    s.step(first);
    s.step(vec![Op::Reduce {
        src: slot(0),
        with: slot(1),
        dst: output,
    }]);
    for q in 2..p {
        s.step(vec![Op::Reduce {
            src: output,
            with: slot(q),
            dst: output,
        }]);
    }
    s.step(vec![Op::Finalize { region: output }]);
    s
}

/// Pairwise-exchange reduce-scatter of the `p` blocks of `input`: in step k rank `me` sends
/// block `me + k` to its owner and folds in the contribution of rank `me − k`. Rank `me` ends
/// with block `me`, finalized, in `dst`; safe when `dst` aliases block `me` of the input.
pub(crate) fn pairwise_reduce_scatter_core(
    s: &mut RankSchedule,
    p: usize,
    me: usize,
    input: Blocks,
    dst: Region,
) {
    if p == 1 {
        s.step(copy(input.one(0), dst).into_iter().collect());
    }
    for k in 1..p {
        let (to, from) = ((me + k) % p, (me + p - k) % p);
        s.step(vec![
            Op::Send {
                peer: to,
                src: input.one(to),
            },
            Op::RecvReduce {
                peer: from,
                src: if k == 1 { input.one(me) } else { dst },
                dst,
            },
        ]);
    }
    s.step(vec![Op::Finalize { region: dst }]);
}

/// Pairwise-exchange reduce-scatter of `n` elements per rank.
pub fn pairwise_reduce_scatter(p: usize, r: usize, n: usize) -> RankSchedule {
    let mut s = RankSchedule::default();
    let input = Blocks::uniform(Buf::Input, 0, p, n);
    pairwise_reduce_scatter_core(&mut s, p, r, input, Region::new(Buf::Output, 0, n));
    s
}

/// Bruck's all-gather: in round k rank `me` sends the 2^k blocks it has, starting at its own,
/// to rank `me − 2^k`; ⌈lg p⌉ rounds for any p, the last one partial. Blocks stay at their
/// final place, so a range that wraps past the last block goes as two messages.
pub(crate) fn bruck_all_gather_core(
    s: &mut RankSchedule,
    p: usize,
    me: usize,
    own: Region,
    out: Blocks,
) {
    let mut first: Vec<Op> = copy(own, out.one(me)).into_iter().collect();
    let mut dist = 1;
    while dist < p {
        let cnt = dist.min(p - dist);
        let (to, from) = ((me + p - dist) % p, (me + dist) % p);
        let mut ops = std::mem::take(&mut first);
        if dist == 1 {
            ops.push(Op::Send { peer: to, src: own });
        } else {
            ops.extend(wrapped(me, cnt, p).into_iter().map(|(a, b)| Op::Send {
                peer: to,
                src: out.range(a, b),
            }));
        }
        ops.extend(wrapped(from, cnt, p).into_iter().map(|(a, b)| Op::Recv {
            peer: from,
            dst: out.range(a, b),
        }));
        s.step(ops);
        dist <<= 1;
    }
    s.step(first);
}

/// Pairwise-exchange all-to-all: in step k rank r sends to r+k and receives from r-k.
///
/// Not safe in place; the runtime gives it a private copy of the input when asked for one.
pub fn pairwise_all_to_all(p: usize, r: usize, n: usize) -> RankSchedule {
    let mut s = RankSchedule::default();
    let in_block = |i: usize| Region::new(Buf::Input, i * n, n);
    let out_block = |i: usize| Region::new(Buf::Output, i * n, n);
    s.step(copy(in_block(r), out_block(r)).into_iter().collect());
    for k in 1..p {
        let (to, from) = ((r + k) % p, (r + p - k) % p);
        s.step(vec![
            Op::Send {
                peer: to,
                src: in_block(to),
            },
            Op::Recv {
                peer: from,
                dst: out_block(from),
            },
        ]);
    }
    s
}

/// Bruck's all-to-all: ⌈lg p⌉ rounds instead of p − 1, each moving about half the data.
///
/// Scratch holds the blocks rotated so that slot j is the one bound for rank r + j. In round
/// k every slot with bit k set moves 2^k ranks on (packed into one message); at the end slot
/// j holds the block from rank r − j. Reads the input only in its first step and writes the
/// output only in its last.
pub fn bruck_all_to_all(p: usize, r: usize, n: usize) -> RankSchedule {
    let mut s = RankSchedule::default();
    if p == 1 {
        copy_step(
            &mut s,
            Region::new(Buf::Input, 0, n),
            Region::new(Buf::Output, 0, n),
        );
        return s;
    }
    let slots = |a: usize, b: usize| Region::new(Buf::Scratch, a * n, (b - a) * n);
    let input = Blocks::uniform(Buf::Input, 0, p, n);
    let runs_of = |dist: usize| -> Vec<(usize, usize)> {
        (dist..p)
            .step_by(2 * dist)
            .map(|a| (a, (a + dist).min(p)))
            .collect()
    };
    let mut most = 0;
    let mut dist = 1;
    while dist < p {
        most = most.max(runs_of(dist).iter().map(|(a, b)| b - a).sum::<usize>());
        dist <<= 1;
    }
    let pack = p * n;
    let unpack = pack + most * n;
    s.step(vec![
        Op::Copy {
            src: input.range(r, p),
            dst: slots(0, p - r),
        },
        Op::Copy {
            src: input.range(0, r),
            dst: slots(p - r, p),
        },
    ]);
    let mut dist = 1;
    while dist < p {
        let (to, from) = ((r + dist) % p, (r + p - dist) % p);
        let runs = runs_of(dist);
        if let [(a, b)] = runs[..] {
            // One contiguous run needs no packing; it still lands beside its slots, which
            // are being sent in the same step.
            let landing = Region::new(Buf::Scratch, unpack, (b - a) * n);
            s.step(vec![
                Op::Send {
                    peer: to,
                    src: slots(a, b),
                },
                Op::Recv {
                    peer: from,
                    dst: landing,
                },
            ]);
            s.step(vec![Op::Copy {
                src: landing,
                dst: slots(a, b),
            }]);
        } else {
            let total: usize = runs.iter().map(|(a, b)| b - a).sum();
            let mut packs = Vec::new();
            let mut unpacks = Vec::new();
            let mut at = 0;
            for (a, b) in runs {
                let len = (b - a) * n;
                packs.push(Op::Copy {
                    src: slots(a, b),
                    dst: Region::new(Buf::Scratch, pack + at, len),
                });
                unpacks.push(Op::Copy {
                    src: Region::new(Buf::Scratch, unpack + at, len),
                    dst: slots(a, b),
                });
                at += len;
            }
            s.step(packs);
            s.step(vec![
                Op::Send {
                    peer: to,
                    src: Region::new(Buf::Scratch, pack, total * n),
                },
                Op::Recv {
                    peer: from,
                    dst: Region::new(Buf::Scratch, unpack, total * n),
                },
            ]);
            s.step(unpacks);
        }
        dist <<= 1;
    }
    s.step(
        (0..p)
            .map(|j| Op::Copy {
                src: slots(j, j + 1),
                dst: Region::new(Buf::Output, ((r + p - j) % p) * n, n),
            })
            .collect(),
    );
    s.scratch_elems = (p + 2 * most) * n;
    s
}

/// Linear gather: every rank sends its block straight to the root.
pub fn linear_gather(p: usize, r: usize, n: usize, root: usize) -> RankSchedule {
    let mut s = RankSchedule::default();
    let input = Region::new(Buf::Input, 0, n);
    if r == root {
        let mut ops: Vec<Op> = copy(input, Region::new(Buf::Output, r * n, n))
            .into_iter()
            .collect();
        ops.extend((0..p).filter(|&i| i != root).map(|i| Op::Recv {
            peer: i,
            dst: Region::new(Buf::Output, i * n, n),
        }));
        s.step(ops);
    } else {
        s.step(vec![Op::Send {
            peer: root,
            src: input,
        }]);
    }
    s
}

/// Linear scatter: the root sends block i straight to rank i.
pub fn linear_scatter(p: usize, r: usize, n: usize, root: usize) -> RankSchedule {
    let mut s = RankSchedule::default();
    let output = Region::new(Buf::Output, 0, n);
    if r == root {
        let mut ops: Vec<Op> = copy(Region::new(Buf::Input, r * n, n), output)
            .into_iter()
            .collect();
        ops.extend((0..p).filter(|&i| i != root).map(|i| Op::Send {
            peer: i,
            src: Region::new(Buf::Input, i * n, n),
        }));
        s.step(ops);
    } else {
        s.step(vec![Op::Recv {
            peer: root,
            dst: output,
        }]);
    }
    s
}

/// Dissemination barrier: in round k rank r signals r+2^k and waits for r-2^k; one element of
/// scratch is sent per round.
pub fn dissemination_barrier(p: usize, r: usize) -> RankSchedule {
    let mut s = RankSchedule {
        scratch_elems: 2,
        ..Default::default()
    };
    let mut dist = 1;
    while dist < p {
        s.step(vec![
            Op::Send {
                peer: (r + dist) % p,
                src: Region::new(Buf::Scratch, 0, 1),
            },
            Op::Recv {
                peer: (r + p - dist) % p,
                dst: Region::new(Buf::Scratch, 1, 1),
            },
        ]);
        dist <<= 1;
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every rank folds the p vectors in rank order, so that floating-point sums come out
    /// the same on every rank.
    #[test]
    fn one_shot_reduces_in_rank_order_on_every_rank() {
        for p in 2..=8 {
            let n = 3;
            let slot = |q: usize| Region::new(Buf::Scratch, q * n, n);
            let out = Region::new(Buf::Output, 0, n);
            for r in 0..p {
                let s = one_shot_all_reduce(p, r, n);
                let folds: Vec<(Region, Region)> = s
                    .steps
                    .iter()
                    .flat_map(|st| &st.ops)
                    .filter_map(|op| match op {
                        Op::Reduce { src, with, dst } => {
                            assert_eq!(*dst, out);
                            Some((*src, *with))
                        }
                        _ => None,
                    })
                    .collect();
                let want: Vec<(Region, Region)> = (1..p)
                    .map(|q| (if q == 1 { slot(0) } else { out }, slot(q)))
                    .collect();
                assert_eq!(folds, want, "rank {r} of {p}");
                assert_eq!(s.message_steps(), 1);
            }
        }
    }
}
