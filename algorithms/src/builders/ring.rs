//! Ring and chain schedules: every rank talks only to its two ring neighbours.

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
    let (next, prev) = ((me + 1) % p, (me + p - 1) % p);
    let partial = |k: usize, c: usize| match partials {
        Partials::In(b) => b.one(c),
        Partials::PingPong { base, max_len } => {
            Region::new(Buf::Scratch, base + (k % 2) * max_len, input.one(c).len)
        }
    };
    for step in 0..p - 1 {
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

/// Ring all-gather: rank `me` contributes `own` as block `me` of `out`; every step passes one
/// block on to the next rank.
pub(crate) fn ring_all_gather_core(
    s: &mut RankSchedule,
    p: usize,
    me: usize,
    own: Region,
    out: Blocks,
) {
    let mut first: Vec<Op> = copy(own, out.one(me)).into_iter().collect();
    let (next, prev) = ((me + 1) % p, (me + p - 1) % p);
    for step in 0..p.saturating_sub(1) {
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
