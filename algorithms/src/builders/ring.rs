//! Ring and chain schedules: every rank talks only to its two ring neighbours.

use std::ops::Range;

use super::{Blocks, copy, modp, one_rank};
use crate::schedule::{Buf, Op, RankSchedule, Region};

/// Where a ring reduce-scatter keeps its partial sums.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Partials {
    /// At each block's own place in a full-size buffer (the all-reduce output).
    In(Blocks),
    /// In two scratch blocks from `base`, used in turn so a step never writes what it sends.
    PingPong { base: usize, max_len: usize },
}

/// Ring reduce-scatter of the `p` blocks of `input`: rank `me` ends with block `me`, reduced
/// over all ranks and finalized, in `dst`. Reads each input block once, so it is safe when
/// `dst` or the partials alias the input.
pub(crate) fn ring_reduce_scatter_core(
    s: &mut RankSchedule,
    p: usize,
    me: usize,
    input: Blocks,
    partials: Partials,
    dst: Region,
) {
    if p == 1 {
        return one_rank(s, input.one(0), dst);
    }
    let held = match partials {
        Partials::In(b) => either(input.nonempty(), b.nonempty()),
        Partials::PingPong { .. } => input.nonempty(),
    };
    let steps = ring_steps(p, me, held, [1, 2]);
    ring_reduce_scatter_steps(s, p, me, input, partials, dst, steps);
}

/// [`ring_reduce_scatter_core`] over the given steps (of `0..p - 1`, in order).
fn ring_reduce_scatter_steps(
    s: &mut RankSchedule,
    p: usize,
    me: usize,
    input: Blocks,
    partials: Partials,
    dst: Region,
    steps: impl Iterator<Item = usize>,
) {
    let (next, prev) = ((me + 1) % p, (me + p - 1) % p);
    let partial = |k: usize, c: usize| match partials {
        Partials::In(b) => b.one(c),
        Partials::PingPong { base, max_len } => {
            Region::new(Buf::Scratch, base + (k % 2) * max_len, input.one(c).len)
        }
    };
    for step in steps {
        let send_c = modp(me as isize - step as isize - 1, p);
        let recv_c = modp(me as isize - step as isize - 2, p);
        let src = if step == 0 {
            input.one(send_c)
        } else {
            partial(step - 1, send_c)
        };
        let into = if step == p - 2 {
            dst
        } else {
            partial(step, recv_c)
        };
        s.step(vec![
            Op::Send { peer: next, src },
            Op::RecvReduce {
                peer: prev,
                src: input.one(recv_c),
                dst: into,
            },
        ]);
    }
    s.step(vec![Op::Finalize { region: dst }]);
    if let Partials::PingPong { base, max_len } = partials
        && p > 2
    {
        s.scratch_elems = s.scratch_elems.max(base + 2 * max_len);
    }
}

/// The steps of a ring phase over `p` members that member `me` visits, in order. When only
/// the blocks in `held` hold elements, those are the steps where `me` sends or receives one
/// of them (block c moves at the steps where `me − step − lag ≡ c` for a lag in `lags`), and
/// the first and the last: every other step holds only empty transfers, which
/// [`RankSchedule::step`] drops anyway. A ring of 24,576 members over 2 elements then costs a
/// member a handful of steps instead of 24,575. `None` visits every step.
fn ring_steps(
    p: usize,
    me: usize,
    held: Option<Range<usize>>,
    lags: [usize; 2],
) -> std::vec::IntoIter<usize> {
    let all = p.saturating_sub(1);
    let mut steps: Vec<usize> = match held {
        Some(blocks) if 2 * blocks.len() + 2 < all => {
            let moves =
                blocks.flat_map(|c| lags.map(|lag| modp(me as isize - (c + lag) as isize, p)));
            moves.chain([0, all - 1]).filter(|&t| t < all).collect()
        }
        _ => return (0..all).collect::<Vec<_>>().into_iter(),
    };
    steps.sort_unstable();
    steps.dedup();
    steps.into_iter()
}

/// The blocks either of two block sets holds (a range covering both), or `None` when either
/// holds every block.
fn either(a: Option<Range<usize>>, b: Option<Range<usize>>) -> Option<Range<usize>> {
    let (a, b) = (a?, b?);
    Some(a.start.min(b.start)..a.end.max(b.end))
}

/// Ring all-gather: rank `me` contributes `own` as block `me` of `out`; every step passes one
/// block on to the next rank.
pub(crate) fn ring_all_gather_core(
    s: &mut RankSchedule,
    p: usize,
    me: usize,
    own: Region,
    out: Blocks,
) {
    let steps = ring_steps(p, me, out.nonempty(), [0, 1]);
    ring_all_gather_steps(s, p, me, own, out, steps);
}

/// [`ring_all_gather_core`] over the given steps (of `0..p - 1`, in order, the first
/// included).
fn ring_all_gather_steps(
    s: &mut RankSchedule,
    p: usize,
    me: usize,
    own: Region,
    out: Blocks,
    steps: impl Iterator<Item = usize>,
) {
    let mut first: Vec<Op> = copy(own, out.one(me)).into_iter().collect();
    let (next, prev) = ((me + 1) % p, (me + p - 1) % p);
    for step in steps {
        let send_c = modp(me as isize - step as isize, p);
        let recv_c = modp(me as isize - step as isize - 1, p);
        let src = if step == 0 { own } else { out.one(send_c) };
        let mut ops = std::mem::take(&mut first);
        ops.push(Op::Send { peer: next, src });
        ops.push(Op::Recv {
            peer: prev,
            dst: out.one(recv_c),
        });
        s.step(ops);
    }
    s.step(first);
}

/// Ring reduce-scatter of `n` elements per rank; partials ping-pong between two scratch
/// blocks.
pub fn ring_reduce_scatter(p: usize, r: usize, n: usize) -> RankSchedule {
    let mut s = RankSchedule::default();
    let input = Blocks::uniform(Buf::Input, 0, p, n);
    let partials = Partials::PingPong {
        base: 0,
        max_len: n,
    };
    ring_reduce_scatter_core(
        &mut s,
        p,
        r,
        input,
        partials,
        Region::new(Buf::Output, 0, n),
    );
    s
}

/// Pipelined chain broadcast: the root's data flows along the ring starting at the root in
/// chunks of `chunk` elements, each rank forwarding chunk `t-1` while it receives chunk `t`.
pub fn chain_broadcast(p: usize, r: usize, n: usize, root: usize, chunk: usize) -> RankSchedule {
    let mut s = RankSchedule::default();
    let chunk = chunk.max(1);
    let nchunks = n.div_ceil(chunk);
    let piece = |buf: Buf, t: usize| Region::new(buf, t * chunk, chunk.min(n - t * chunk));
    let pos = (r + p - root) % p;
    let (next, prev) = ((r + 1) % p, (r + p - 1) % p);
    if pos == 0 {
        let mut ops: Vec<Op> = copy(
            Region::new(Buf::Input, 0, n),
            Region::new(Buf::Output, 0, n),
        )
        .into_iter()
        .collect();
        if p > 1 {
            ops.extend((0..nchunks).map(|t| Op::Send {
                peer: next,
                src: piece(Buf::Input, t),
            }));
        }
        s.step(ops);
    } else if pos == p - 1 {
        s.step(
            (0..nchunks)
                .map(|t| Op::Recv {
                    peer: prev,
                    dst: piece(Buf::Output, t),
                })
                .collect(),
        );
    } else {
        for t in 0..=nchunks {
            let mut ops = Vec::with_capacity(2);
            if t < nchunks {
                ops.push(Op::Recv {
                    peer: prev,
                    dst: piece(Buf::Output, t),
                });
            }
            if t > 0 {
                ops.push(Op::Send {
                    peer: next,
                    src: piece(Buf::Output, t - 1),
                });
            }
            s.step(ops);
        }
    }
    s
}

/// The smallest slice of a sliced ring all-reduce, in bytes.
pub const RING_SLICE_MIN_BYTES: usize = 64 << 10;

/// The slice, in bytes, of a ring all-reduce of `message_bytes` per rank over `nranks` ranks,
/// `local_ranks` of them on the host, whose ranks keep `pipeline_bytes` in flight together
/// (0: the ring runs block by block). A rank has a slice in flight in each of its ring's
/// 2p - 2 steps, so the host's ranks share the budget out as `local_ranks × (2p - 2)` slices,
/// each at least [`RING_SLICE_MIN_BYTES`]. A ring whose blocks, one per local rank, already
/// fit in the budget is not sliced: slicing would only add steps.
pub fn ring_slice_bytes(
    pipeline_bytes: usize,
    nranks: usize,
    local_ranks: usize,
    message_bytes: usize,
) -> usize {
    let local = local_ranks.max(1);
    if pipeline_bytes == 0 || nranks < 2 || message_bytes.div_ceil(nranks) * local <= pipeline_bytes
    {
        return 0;
    }
    (pipeline_bytes / (local * (2 * nranks - 2))).max(RING_SLICE_MIN_BYTES)
}

/// Ring all-reduce run slice by slice, as NCCL's ring runs: each of the `p` blocks is cut
/// into slices of at most `slice` elements, and a slice moves on to its next ring step as
/// soon as its previous one is done, while later slices follow behind it. A rank therefore
/// sends a partial sum one step after it computed it, while it is still in cache, instead of
/// after the whole block. With one slice per block it is the plain ring. Bytes on every
/// link are the same as the plain ring's; the schedule has `slices + 2p - 3` transfer steps.
pub fn ring_pipelined_all_reduce(p: usize, me: usize, n: usize, slice: usize) -> RankSchedule {
    let input = Blocks::split(Buf::Input, 0, n, p);
    let out = Blocks::split(Buf::Output, 0, n, p);
    let mut s = RankSchedule::default();
    if p == 1 {
        one_rank(&mut s, input.one(0), out.one(0));
        return s;
    }
    let slices = input.one(0).len.div_ceil(slice.max(1)).max(1);
    // Slice `j` of block `c` of `blocks`.
    let piece = |blocks: &Blocks, c: usize, j: usize| {
        let b = blocks.one(c);
        let (off, len) = super::block(b.len, slices, j);
        Region::new(b.buf, b.offset + off, len)
    };
    let (next, prev) = ((me + 1) % p, (me + p - 1) % p);
    let block_at = |k: usize| modp(me as isize - k as isize, p);
    // Ring step `k` of one slice: steps 0..p-1 reduce-scatter, p-1..2p-2 all-gather.
    let stage = |k: usize, j: usize| -> [Op; 2] {
        if k + 1 < p {
            let sent = block_at(k + 1);
            let received = block_at(k + 2);
            let src = if k == 0 {
                piece(&input, sent, j)
            } else {
                piece(&out, sent, j)
            };
            [
                Op::Send { peer: next, src },
                Op::RecvReduce {
                    peer: prev,
                    src: piece(&input, received, j),
                    dst: piece(&out, received, j),
                },
            ]
        } else {
            let a = k + 1 - p;
            [
                Op::Send {
                    peer: next,
                    src: piece(&out, block_at(a), j),
                },
                Op::Recv {
                    peer: prev,
                    dst: piece(&out, block_at(a + 1), j),
                },
            ]
        }
    };
    let stages = 2 * p - 2;
    for t in 0..slices + stages - 1 {
        let first = (t + 1).saturating_sub(stages);
        let ops = (first..slices.min(t + 1))
            .flat_map(|j| stage(t - j, j))
            .collect();
        s.step(ops);
        // The slice whose reduction completed in this step is finalized before it is sent.
        if let Some(j) = t.checked_sub(p - 2).filter(|&j| j < slices) {
            s.step(vec![Op::Finalize {
                region: piece(&out, me, j),
            }]);
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::Collective;
    use crate::sim::{Placement, check_schedules};

    #[test]
    fn pipelined_ring_all_reduce_is_exact_for_every_shape() {
        for p in 1..=7usize {
            for n in [0, 1, p.saturating_sub(1), p, 2 * p + 1, 37, 100] {
                for slice in [1, 2, 3, 5, 1000] {
                    let scheds: Vec<_> = (0..p)
                        .map(|r| ring_pipelined_all_reduce(p, r, n, slice))
                        .collect();
                    for placement in [Placement::OutOfPlace, Placement::InPlace] {
                        check_schedules(Collective::AllReduce, &scheds, n, 0, placement)
                            .unwrap_or_else(|e| panic!("p={p} n={n} slice={slice}: {e}"));
                    }
                }
            }
        }
    }

    #[test]
    fn pipelined_ring_overlaps_slices_and_moves_the_plain_rings_bytes() {
        let (p, n) = (4, 4 * 12);
        for r in 0..p {
            let plain = composed_plain(p, r, n);
            let piped = ring_pipelined_all_reduce(p, r, n, 4);
            assert_eq!(piped.elems_sent(), plain.elems_sent());
            assert_eq!(piped.totals().received, plain.totals().received);
            // 3 slices per block, 2p - 2 = 6 ring steps: 3 + 6 - 1 transfer steps, and a
            // full step carries one send per slice in flight.
            let transfer: Vec<_> = piped
                .steps
                .iter()
                .filter(|s| s.ops.iter().any(|op| op.peer().is_some()))
                .collect();
            assert_eq!(transfer.len(), 8);
            let most = transfer
                .iter()
                .map(|s| s.ops.iter().filter(|op| op.elems_sent() > 0).count())
                .max();
            assert_eq!(most, Some(3));
        }
        // One slice per block is the plain ring, step for step.
        for r in 0..p {
            let one = ring_pipelined_all_reduce(p, r, n, n);
            let transfers = |s: &RankSchedule| -> Vec<Vec<Op>> {
                s.steps
                    .iter()
                    .filter(|st| st.ops.iter().any(|op| op.peer().is_some()))
                    .map(|st| st.ops.clone())
                    .collect()
            };
            assert_eq!(transfers(&one), transfers(&composed_plain(p, r, n)));
        }
    }

    #[test]
    fn sparse_rings_visit_fewer_steps_and_build_the_same_schedules() {
        for p in 1..=13usize {
            for n in [0, 1, 2, 3, p / 2, p.saturating_sub(1), p, 2 * p + 1] {
                let split = |buf| Blocks::split(buf, 0, n, p);
                let uniform = |buf| Blocks::uniform(buf, 0, p, n);
                for (input, acc) in [
                    (split(Buf::Input), split(Buf::Output)),
                    (uniform(Buf::Input), uniform(Buf::Output)),
                ] {
                    for me in 0..p {
                        let partial_sets = [
                            Partials::In(acc),
                            Partials::PingPong {
                                base: 0,
                                max_len: n,
                            },
                        ];
                        for partials in partial_sets {
                            let dst = acc.one(me);
                            let mut fast = RankSchedule::default();
                            ring_reduce_scatter_core(&mut fast, p, me, input, partials, dst);
                            let mut every = RankSchedule::default();
                            if p == 1 {
                                one_rank(&mut every, input.one(0), dst);
                            } else {
                                let all = 0..p - 1;
                                ring_reduce_scatter_steps(
                                    &mut every, p, me, input, partials, dst, all,
                                );
                            }
                            assert_eq!(fast, every, "reduce-scatter p={p} n={n} me={me}");
                        }
                        let mut fast = RankSchedule::default();
                        ring_all_gather_core(&mut fast, p, me, acc.one(me), acc);
                        let mut every = RankSchedule::default();
                        let all = 0..p.saturating_sub(1);
                        ring_all_gather_steps(&mut every, p, me, acc.one(me), acc, all);
                        assert_eq!(fast, every, "all-gather p={p} n={n} me={me}");
                    }
                }
            }
        }
        // Two elements over 1,000 members: each member visits at most six steps.
        let blocks = Blocks::split(Buf::Output, 0, 2, 1000);
        for me in [0, 1, 2, 500, 999] {
            assert!(ring_steps(1000, me, blocks.nonempty(), [1, 2]).len() <= 6);
        }
    }

    fn composed_plain(p: usize, r: usize, n: usize) -> RankSchedule {
        crate::builders::composed_all_reduce(
            crate::ReduceScatterPart::Ring,
            crate::AllGatherPart::Ring,
            p,
            r,
            n,
        )
    }
}
