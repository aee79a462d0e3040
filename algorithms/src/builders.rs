//! Schedule builders: one function per (collective, algorithm).
//!
//! Each builder produces the schedule of one rank. They handle any rank count ≥ 1 and any
//! element count, including 0 and counts smaller than the number of ranks.

use crate::schedule::{Buf, Op, RankSchedule, Region};

/// Splits `n` elements into `parts` contiguous blocks whose sizes differ by at most one.
pub fn block(n: usize, parts: usize, i: usize) -> (usize, usize) {
    let base = n / parts;
    let extra = n % parts;
    let offset = i * base + i.min(extra);
    let len = base + usize::from(i < extra);
    (offset, len)
}

fn region(buf: Buf, (offset, len): (usize, usize)) -> Region {
    Region::new(buf, offset, len)
}

fn modp(x: isize, p: usize) -> usize {
    x.rem_euclid(p as isize) as usize
}

/// Ring all-reduce: a ring reduce-scatter over `p` blocks, then a ring all-gather.
///
/// Reads each input block once (fused with the reduction), so it is safe in place.
pub fn ring_all_reduce(p: usize, r: usize, n: usize) -> RankSchedule {
    let mut s = RankSchedule::default();
    let whole = Region::new(Buf::Output, 0, n);
    if p == 1 {
        s.step(vec![Op::Copy {
            src: Region::new(Buf::Input, 0, n),
            dst: whole,
        }]);
        s.step(vec![Op::Finalize { region: whole }]);
        return s;
    }
    let (next, prev) = ((r + 1) % p, (r + p - 1) % p);
    let blk = |i: usize| block(n, p, i);
    for step in 0..p - 1 {
        let send_c = modp(r as isize - step as isize, p);
        let recv_c = modp(r as isize - step as isize - 1, p);
        let src_buf = if step == 0 { Buf::Input } else { Buf::Output };
        s.step(vec![
            Op::Send {
                peer: next,
                src: region(src_buf, blk(send_c)),
            },
            Op::RecvReduce {
                peer: prev,
                src: region(Buf::Input, blk(recv_c)),
                dst: region(Buf::Output, blk(recv_c)),
            },
        ]);
    }
    s.step(vec![Op::Finalize {
        region: region(Buf::Output, blk((r + 1) % p)),
    }]);
    for step in 0..p - 1 {
        let send_c = modp(r as isize + 1 - step as isize, p);
        let recv_c = modp(r as isize - step as isize, p);
        s.step(vec![
            Op::Send {
                peer: next,
                src: region(Buf::Output, blk(send_c)),
            },
            Op::Recv {
                peer: prev,
                dst: region(Buf::Output, blk(recv_c)),
            },
        ]);
    }
    s
}

/// Recursive-doubling all-reduce: lg p exchanges of the whole buffer, latency-optimal for small
/// messages. With p not a power of two, the first 2·(p − p') ranks pair up: each even one hands
/// its input to its odd partner, sits out, and gets the result back at the end.
///
/// Every exchange reduces into the other half of a two-block scratch, so a step never writes
/// what it sends; the result is copied to the output once, so the schedule is safe in place.
pub fn recursive_doubling_all_reduce(p: usize, r: usize, n: usize) -> RankSchedule {
    let mut s = RankSchedule::default();
    let out = Region::new(Buf::Output, 0, n);
    let input = Region::new(Buf::Input, 0, n);
    if p == 1 {
        s.step(vec![Op::Copy {
            src: input,
            dst: out,
        }]);
        s.step(vec![Op::Finalize { region: out }]);
        return s;
    }
    let pof2 = 1usize << (usize::BITS - 1 - p.leading_zeros());
    let rem = p - pof2;
    let scratch = |k: usize| Region::new(Buf::Scratch, (k % 2) * n, n);
    s.scratch_elems = 2 * n;
    let (mut cur, mut k) = (input, 0);
    let v = if r < 2 * rem {
        if r % 2 == 0 {
            s.step(vec![Op::Send {
                peer: r + 1,
                src: input,
            }]);
            s.step(vec![Op::Recv {
                peer: r + 1,
                dst: out,
            }]);
            s.scratch_elems = 0;
            return s;
        }
        s.step(vec![Op::RecvReduce {
            peer: r - 1,
            src: input,
            dst: scratch(0),
        }]);
        cur = scratch(0);
        k = 1;
        r / 2
    } else {
        r - rem
    };
    let real = |v: usize| if v < rem { 2 * v + 1 } else { v + rem };
    let mut mask = 1;
    while mask < pof2 {
        let partner = real(v ^ mask);
        let dst = scratch(k);
        s.step(vec![
            Op::Send {
                peer: partner,
                src: cur,
            },
            Op::RecvReduce {
                peer: partner,
                src: cur,
                dst,
            },
        ]);
        cur = dst;
        k += 1;
        mask <<= 1;
    }
    s.step(vec![Op::Copy { src: cur, dst: out }]);
    s.step(vec![Op::Finalize { region: out }]);
    if r < 2 * rem {
        s.step(vec![Op::Send {
            peer: r - 1,
            src: out,
        }]);
    }
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
        let mut ops = vec![Op::Copy {
            src: Region::new(Buf::Input, 0, n),
            dst: Region::new(Buf::Output, 0, n),
        }];
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

/// Binomial-tree reduce to `root`: in round k a rank whose relative index has bit k set sends
/// its partial result to the rank 2^k below it and leaves.
pub fn binomial_reduce(p: usize, r: usize, n: usize, root: usize) -> RankSchedule {
    let mut s = RankSchedule::default();
    let v = (r + p - root) % p;
    let real = |x: usize| (x + root) % p;
    let acc_buf = if v == 0 { Buf::Output } else { Buf::Scratch };
    let acc = Region::new(acc_buf, 0, n);
    let input = Region::new(Buf::Input, 0, n);
    let mut have_acc = false;
    let mut mask = 1;
    while mask < p {
        if v & mask != 0 {
            let src = if have_acc { acc } else { input };
            s.step(vec![Op::Send {
                peer: real(v - mask),
                src,
            }]);
            break;
        }
        if v + mask < p {
            let src = if have_acc { acc } else { input };
            s.step(vec![Op::RecvReduce {
                peer: real(v + mask),
                src,
                dst: acc,
            }]);
            have_acc = true;
        }
        mask <<= 1;
    }
    if v == 0 {
        if !have_acc {
            s.step(vec![Op::Copy {
                src: input,
                dst: acc,
            }]);
        }
        s.step(vec![Op::Finalize { region: acc }]);
    } else if have_acc {
        s.scratch_elems = n;
    }
    s
}

/// Ring all-gather: block r of the output is rank r's input; every step passes one block on.
pub fn ring_all_gather(p: usize, r: usize, n: usize) -> RankSchedule {
    let mut s = RankSchedule::default();
    let out_block = |i: usize| Region::new(Buf::Output, i * n, n);
    let input = Region::new(Buf::Input, 0, n);
    let mut first = vec![Op::Copy {
        src: input,
        dst: out_block(r),
    }];
    let (next, prev) = ((r + 1) % p, (r + p - 1) % p);
    for step in 0..p.saturating_sub(1) {
        let send_c = modp(r as isize - step as isize, p);
        let recv_c = modp(r as isize - step as isize - 1, p);
        let src = if step == 0 { input } else { out_block(send_c) };
        let mut ops = std::mem::take(&mut first);
        ops.push(Op::Send { peer: next, src });
        ops.push(Op::Recv {
            peer: prev,
            dst: out_block(recv_c),
        });
        s.step(ops);
    }
    s.step(first);
    s
}

/// Ring reduce-scatter: partial sums travel the ring; rank r receives block r last and
/// finishes it. Partial blocks ping-pong between two scratch blocks.
pub fn ring_reduce_scatter(p: usize, r: usize, n: usize) -> RankSchedule {
    let mut s = RankSchedule::default();
    let output = Region::new(Buf::Output, 0, n);
    let in_block = |i: usize| Region::new(Buf::Input, i * n, n);
    if p == 1 {
        s.step(vec![Op::Copy {
            src: in_block(0),
            dst: output,
        }]);
        s.step(vec![Op::Finalize { region: output }]);
        return s;
    }
    let (next, prev) = ((r + 1) % p, (r + p - 1) % p);
    let partial = |i: usize| Region::new(Buf::Scratch, (i % 2) * n, n);
    for step in 0..p - 1 {
        let send_c = modp(r as isize - step as isize - 1, p);
        let recv_c = modp(r as isize - step as isize - 2, p);
        let src = if step == 0 {
            in_block(send_c)
        } else {
            partial(step - 1)
        };
        let dst = if step == p - 2 { output } else { partial(step) };
        s.step(vec![
            Op::Send { peer: next, src },
            Op::RecvReduce {
                peer: prev,
                src: in_block(recv_c),
                dst,
            },
        ]);
    }
    s.step(vec![Op::Finalize { region: output }]);
    if p > 2 {
        s.scratch_elems = 2 * n;
    }
    s
}

/// Pairwise-exchange all-to-all: in step k rank r sends to r+k and receives from r-k.
///
/// Not safe in place; the runtime gives it a private copy of the input when asked for one.
pub fn pairwise_all_to_all(p: usize, r: usize, n: usize) -> RankSchedule {
    let mut s = RankSchedule::default();
    let in_block = |i: usize| Region::new(Buf::Input, i * n, n);
    let out_block = |i: usize| Region::new(Buf::Output, i * n, n);
    s.step(vec![Op::Copy {
        src: in_block(r),
        dst: out_block(r),
    }]);
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

/// Linear gather: every rank sends its block straight to the root.
pub fn linear_gather(p: usize, r: usize, n: usize, root: usize) -> RankSchedule {
    let mut s = RankSchedule::default();
    let input = Region::new(Buf::Input, 0, n);
    if r == root {
        let mut ops = vec![Op::Copy {
            src: input,
            dst: Region::new(Buf::Output, r * n, n),
        }];
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
        let mut ops = vec![Op::Copy {
            src: Region::new(Buf::Input, r * n, n),
            dst: output,
        }];
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
            }
        }
    }
}
