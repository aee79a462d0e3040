//! Recursive doubling and halving: lg p exchanges between partners `u ^ 2^k`.
//!
//! They run on a power of two of virtual ranks. With p not a power of two, the first
//! 2·(p − p') ranks pair up: each even one hands its data to the odd one after it
//! and sits out; the odd one hands back what the even one needs at the end.

use super::{Blocks, Fold, copy, one_rank, sit_out};
use crate::schedule::{Buf, Op, RankSchedule, Region};

/// The region of virtual blocks `a..b` of a layout.
type VRange<'a> = &'a dyn Fn(&Blocks, usize, usize) -> Region;

/// Recursive halving among `pof2` virtual ranks: virtual rank `u` ends with virtual block `u`
/// reduced (not finalized) in `acc`, or in `last` when given. The first exchange reads
/// `first`; later ones read and write `acc`.
#[allow(clippy::too_many_arguments)]
fn halving_steps(
    s: &mut RankSchedule,
    pof2: usize,
    u: usize,
    peer: &dyn Fn(usize) -> usize,
    vr: VRange<'_>,
    first: Blocks,
    acc: Blocks,
    last: Option<Region>,
) {
    let (mut lo, mut hi) = (0, pof2);
    let mut cur = first;
    let mut mask = pof2 / 2;
    while mask > 0 {
        let partner = peer(u ^ mask);
        let mid = lo + (hi - lo) / 2;
        let (keep, give) = if u & mask == 0 {
            ((lo, mid), (mid, hi))
        } else {
            ((mid, hi), (lo, mid))
        };
        let dst = match last {
            Some(d) if mask == 1 => d,
            _ => vr(&acc, keep.0, keep.1),
        };
        s.step(vec![
            Op::Send {
                peer: partner,
                src: vr(&cur, give.0, give.1),
            },
            Op::RecvReduce {
                peer: partner,
                src: vr(&cur, keep.0, keep.1),
                dst,
            },
        ]);
        cur = acc;
        (lo, hi) = keep;
        mask >>= 1;
    }
}

/// Recursive doubling among `pof2` virtual ranks: each holds virtual block `u` of `out` and
/// ends with all of them.
fn doubling_steps(
    s: &mut RankSchedule,
    pof2: usize,
    u: usize,
    peer: &dyn Fn(usize) -> usize,
    vr: VRange<'_>,
    out: Blocks,
) {
    let mut mask = 1;
    while mask < pof2 {
        let lo = u & !(mask - 1);
        let plo = lo ^ mask;
        s.step(vec![
            Op::Send {
                peer: peer(u ^ mask),
                src: vr(&out, lo, lo + mask),
            },
            Op::Recv {
                peer: peer(u ^ mask),
                dst: vr(&out, plo, plo + mask),
            },
        ]);
        mask <<= 1;
    }
}

/// Recursive-halving reduce-scatter of the `p` blocks of `input`: rank `me` ends with block
/// `me`, reduced and finalized, in `dst`. `acc` is a full-size accumulator (it may be the
/// buffer `dst` lives in). Safe when `dst` aliases block `me` of the input.
pub(crate) fn halving_reduce_scatter_core(
    s: &mut RankSchedule,
    p: usize,
    me: usize,
    input: Blocks,
    acc: Blocks,
    dst: Region,
) {
    if p == 1 {
        return one_rank(s, input.one(0), dst);
    }
    let fold = Fold::new(p);
    let peer = |u: usize| fold.real(u);
    let vr = |b: &Blocks, a: usize, z: usize| b.range(fold.first_block(a), fold.first_block(z));
    match fold.virt(me) {
        None => sit_out(s, me + 1, input.all(), dst),
        Some(u) if u < fold.rem => {
            s.step(vec![Op::RecvReduce {
                peer: me - 1,
                src: input.all(),
                dst: acc.all(),
            }]);
            halving_steps(s, fold.pof2, u, &peer, &vr, acc, acc, None);
            s.step(vec![Op::Finalize {
                region: acc.range(me - 1, me + 1),
            }]);
            let mut ops = vec![Op::Send {
                peer: me - 1,
                src: acc.one(me - 1),
            }];
            ops.extend(copy(acc.one(me), dst));
            s.step(ops);
        }
        Some(u) => {
            halving_steps(s, fold.pof2, u, &peer, &vr, input, acc, Some(dst));
            s.step(vec![Op::Finalize { region: dst }]);
        }
    }
}

/// Recursive-doubling all-gather: rank `me` contributes `own` as block `me` of `out`.
pub(crate) fn doubling_all_gather_core(
    s: &mut RankSchedule,
    p: usize,
    me: usize,
    own: Region,
    out: Blocks,
) {
    let fold = Fold::new(p);
    let peer = |u: usize| fold.real(u);
    let vr = |b: &Blocks, a: usize, z: usize| b.range(fold.first_block(a), fold.first_block(z));
    match fold.virt(me) {
        None => {
            let mut ops = vec![Op::Send {
                peer: me + 1,
                src: own,
            }];
            ops.extend(copy(own, out.one(me)));
            s.step(ops);
            s.step(vec![
                Op::Recv {
                    peer: me + 1,
                    dst: out.range(0, me),
                },
                Op::Recv {
                    peer: me + 1,
                    dst: out.range(me + 1, p),
                },
            ]);
        }
        Some(u) => {
            let mut first: Vec<Op> = copy(own, out.one(me)).into_iter().collect();
            if u < fold.rem {
                first.push(Op::Recv {
                    peer: me - 1,
                    dst: out.one(me - 1),
                });
            }
            s.step(first);
            doubling_steps(s, fold.pof2, u, &peer, &vr, out);
            if u < fold.rem {
                s.step(vec![
                    Op::Send {
                        peer: me - 1,
                        src: out.range(0, me - 1),
                    },
                    Op::Send {
                        peer: me - 1,
                        src: out.range(me, p),
                    },
                ]);
            }
        }
    }
}

/// Recursive-halving reduce-scatter of `n` elements per rank; sums accumulate in scratch.
pub fn recursive_halving_reduce_scatter(p: usize, r: usize, n: usize) -> RankSchedule {
    let mut s = RankSchedule::default();
    let input = Blocks::uniform(Buf::Input, 0, p, n);
    let acc = Blocks::uniform(Buf::Scratch, 0, p, n);
    halving_reduce_scatter_core(&mut s, p, r, input, acc, Region::new(Buf::Output, 0, n));
    if p > 2 {
        s.scratch_elems = p * n;
    }
    s
}

/// Rabenseifner's all-reduce: recursive-halving reduce-scatter, then recursive-doubling
/// all-gather, over blocks of the power-of-two virtual ranks. Folded ranks send their input
/// to their partner first and get the whole result back at the end.
pub fn rabenseifner_all_reduce(p: usize, r: usize, n: usize) -> RankSchedule {
    let mut s = RankSchedule::default();
    let input = Region::new(Buf::Input, 0, n);
    let out = Region::new(Buf::Output, 0, n);
    if p == 1 {
        one_rank(&mut s, input, out);
        return s;
    }
    let fold = Fold::new(p);
    let vin = Blocks::split(Buf::Input, 0, n, fold.pof2);
    let vout = Blocks::split(Buf::Output, 0, n, fold.pof2);
    let peer = |u: usize| fold.real(u);
    let vr = |b: &Blocks, a: usize, z: usize| b.range(a, z);
    match fold.virt(r) {
        None => sit_out(&mut s, r + 1, input, out),
        Some(u) => {
            let folded = u < fold.rem;
            if folded {
                s.step(vec![Op::RecvReduce {
                    peer: r - 1,
                    src: input,
                    dst: out,
                }]);
            }
            let first = if folded { vout } else { vin };
            halving_steps(&mut s, fold.pof2, u, &peer, &vr, first, vout, None);
            s.step(vec![Op::Finalize {
                region: vout.one(u),
            }]);
            doubling_steps(&mut s, fold.pof2, u, &peer, &vr, vout);
            if folded {
                s.step(vec![Op::Send {
                    peer: r - 1,
                    src: out,
                }]);
            }
        }
    }
    s
}

/// Recursive-doubling all-reduce: lg p exchanges of the whole buffer, latency-optimal for small
/// messages. Folded ranks hand their input to their partner and get the result back.
///
/// Every exchange reduces into the other half of a two-block scratch, so a step never writes
/// what it sends; the result is copied to the output once, so the schedule is safe in place.
pub fn recursive_doubling_all_reduce(p: usize, r: usize, n: usize) -> RankSchedule {
    let mut s = RankSchedule::default();
    let out = Region::new(Buf::Output, 0, n);
    let input = Region::new(Buf::Input, 0, n);
    if p == 1 {
        one_rank(&mut s, input, out);
        return s;
    }
    let fold = Fold::new(p);
    let scratch = |k: usize| Region::new(Buf::Scratch, (k % 2) * n, n);
    s.scratch_elems = 2 * n;
    let (mut cur, mut k) = (input, 0);
    let Some(u) = fold.virt(r) else {
        sit_out(&mut s, r + 1, input, out);
        s.scratch_elems = 0;
        return s;
    };
    let folded = u < fold.rem;
    if folded {
        s.step(vec![Op::RecvReduce {
            peer: r - 1,
            src: input,
            dst: scratch(0),
        }]);
        cur = scratch(0);
        k = 1;
    }
    let mut mask = 1;
    while mask < fold.pof2 {
        let partner = fold.real(u ^ mask);
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
    if folded {
        s.step(vec![Op::Send {
            peer: r - 1,
            src: out,
        }]);
    }
    s
}
