//! Compiling a rank's schedule into lanes of device operations: each step's operations
//! grouped by peer and direction (every operation of a step may progress at once), transfers
//! cut into pieces of one slot, numbered per ordered pair.

use super::{DeviceTransfer, Slots};
use crate::dtype::DataType;
use crate::reduce::Combine;
use std::collections::HashMap;
use strata_algorithms::schedule::{Buf, Op, Region};
use strata_algorithms::{Algorithm, RankSchedule};

/// Where a program's operand lives: one of the call's buffers, or a slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Loc {
    /// Bytes from the start of a call buffer.
    Buffer(Buf, usize),
    /// A device address (a point-to-point transfer's buffer).
    Addr(u64),
}

/// One instruction of a lane. Piece numbers are relative to the pair's counter at the start
/// of the call.
#[derive(Clone, Copy, Debug)]
pub(super) enum Instr {
    /// Send piece `n` to `peer`: wait for its slot, copy `bytes` from `src`, signal.
    Send {
        peer: usize,
        n: u64,
        src: Loc,
        bytes: usize,
    },
    /// Receive piece `n` from `peer` into `dst`, then hand the slot back.
    Recv {
        peer: usize,
        n: u64,
        dst: Loc,
        bytes: usize,
    },
    /// Receive piece `n` from `peer` and store `src op piece` into `dst`.
    RecvReduce {
        peer: usize,
        n: u64,
        src: Loc,
        dst: Loc,
        elems: usize,
    },
    /// A local copy.
    Copy { src: Loc, dst: Loc, bytes: usize },
    /// `dst = a op b`, locally.
    Combine {
        dst: Loc,
        a: Loc,
        b: Loc,
        elems: usize,
    },
    /// `region /= ranks` (avg's last step).
    Divide { region: Loc, elems: usize },
}

/// A call compiled: steps of lanes, and how far it moves each pair's counters.
pub(super) struct Compiled {
    pub steps: Vec<Vec<Vec<Instr>>>,
    /// Pieces sent to each rank.
    pub sent: Vec<u64>,
    /// Pieces received from each rank.
    pub received: Vec<u64>,
    /// The algorithm whose steps these are.
    pub algorithm: Algorithm,
    pub scratch_bytes: usize,
    pub lanes: usize,
}

/// A batch of point-to-point transfers compiled as one step: every transfer of the batch
/// may progress at once (a group's sends and receives), the sends to one peer in order on
/// one lane and the receives from one peer on another. Empty transfers are left out.
pub(super) fn compile_transfers(transfers: &[DeviceTransfer], p: usize, slots: Slots) -> Compiled {
    let (mut sent, mut received) = (vec![0u64; p], vec![0u64; p]);
    let mut lanes: Vec<Vec<Instr>> = Vec::new();
    let mut lane_of: HashMap<(usize, bool), usize> = HashMap::new();
    for &DeviceTransfer {
        peer,
        ptr,
        bytes,
        send,
    } in transfers.iter().filter(|t| t.bytes > 0)
    {
        let l = *lane_of.entry((peer, send)).or_insert_with(|| {
            lanes.push(Vec::new());
            lanes.len() - 1
        });
        let at = |first: usize| Loc::Addr(ptr + first as u64);
        if send {
            push_pieces(
                &mut lanes[l],
                &mut sent[peer],
                bytes,
                slots.bytes,
                |first, len, n| Instr::Send {
                    peer,
                    n,
                    src: at(first),
                    bytes: len,
                },
            );
        } else {
            let counter = &mut received[peer];
            push_pieces(
                &mut lanes[l],
                counter,
                bytes,
                slots.bytes,
                |first, len, n| Instr::Recv {
                    peer,
                    n,
                    dst: at(first),
                    bytes: len,
                },
            );
        }
    }
    let count = lanes.len().max(1);
    Compiled {
        steps: if lanes.is_empty() {
            Vec::new()
        } else {
            vec![lanes]
        },
        sent,
        received,
        algorithm: Algorithm::Direct,
        scratch_bytes: 0,
        lanes: count,
    }
}

/// Cuts a transfer of `len` units into pieces of at most `piece`, each numbered from the pair's
/// `counter` on, and appends `make(first unit, units, piece number)` for each to `lane`.
fn push_pieces(
    lane: &mut Vec<Instr>,
    counter: &mut u64,
    len: usize,
    piece: usize,
    make: impl Fn(usize, usize, u64) -> Instr,
) {
    let piece = piece.max(1);
    for first in (0..len).step_by(piece) {
        lane.push(make(first, piece.min(len - first), *counter));
        *counter += 1;
    }
}

/// How a call's reductions are done.
#[derive(Clone, Copy)]
pub(super) struct Arith {
    pub dtype: DataType,
    pub combine: Combine,
    pub divide_by: Option<usize>,
}

pub(super) fn compile(
    sched: &RankSchedule,
    p: usize,
    es: usize,
    slots: Slots,
    algorithm: Algorithm,
    arith: Arith,
) -> Compiled {
    let piece_elems = (slots.bytes / es).max(1);
    let (mut sent, mut received) = (vec![0u64; p], vec![0u64; p]);
    let at = |r: &Region, elem: usize| Loc::Buffer(r.buf, (r.offset + elem) * es);
    let mut steps = Vec::with_capacity(sched.steps.len());
    let mut lanes_max = 1;
    for step in &sched.steps {
        // Lane 0: local work; then one lane per (peer, direction), in order of appearance.
        let mut lanes: Vec<Vec<Instr>> = vec![Vec::new()];
        let mut lane_of: HashMap<(usize, bool), usize> = HashMap::new();
        let mut lane = |key: (usize, bool), lanes: &mut Vec<Vec<Instr>>| {
            *lane_of.entry(key).or_insert_with(|| {
                lanes.push(Vec::new());
                lanes.len() - 1
            })
        };
        for op in &step.ops {
            match *op {
                Op::Send { peer, src } => {
                    let l = lane((peer, true), &mut lanes);
                    let counter = &mut sent[peer];
                    push_pieces(
                        &mut lanes[l],
                        counter,
                        src.len,
                        piece_elems,
                        |first, len, n| Instr::Send {
                            peer,
                            n,
                            src: at(&src, first),
                            bytes: len * es,
                        },
                    );
                }
                Op::Recv { peer, dst } => {
                    let l = lane((peer, false), &mut lanes);
                    let counter = &mut received[peer];
                    push_pieces(
                        &mut lanes[l],
                        counter,
                        dst.len,
                        piece_elems,
                        |first, len, n| Instr::Recv {
                            peer,
                            n,
                            dst: at(&dst, first),
                            bytes: len * es,
                        },
                    );
                }
                Op::RecvReduce { peer, src, dst } => {
                    let l = lane((peer, false), &mut lanes);
                    let counter = &mut received[peer];
                    push_pieces(
                        &mut lanes[l],
                        counter,
                        dst.len,
                        piece_elems,
                        |first, len, n| Instr::RecvReduce {
                            peer,
                            n,
                            src: at(&src, first),
                            dst: at(&dst, first),
                            elems: len,
                        },
                    );
                }
                Op::Copy { src, dst } => {
                    if src != dst && src.len > 0 {
                        lanes[0].push(Instr::Copy {
                            src: at(&src, 0),
                            dst: at(&dst, 0),
                            bytes: src.len * es,
                        });
                    }
                }
                Op::Reduce { src, with, dst } => {
                    if dst.len > 0 {
                        lanes[0].push(Instr::Combine {
                            dst: at(&dst, 0),
                            a: at(&src, 0),
                            b: at(&with, 0),
                            elems: dst.len,
                        });
                    }
                }
                Op::Finalize { region } => {
                    if arith.divide_by.is_some() && region.len > 0 {
                        lanes[0].push(Instr::Divide {
                            region: at(&region, 0),
                            elems: region.len,
                        });
                    }
                }
            }
        }
        if lanes[0].is_empty() {
            lanes.remove(0);
        }
        lanes_max = lanes_max.max(lanes.len());
        steps.push(lanes);
    }
    Compiled {
        steps,
        sent,
        received,
        algorithm,
        scratch_bytes: sched.scratch_elems * es,
        lanes: lanes_max,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_algorithms::Collective;
    use strata_algorithms::Plan;

    /// Every send piece has a receive piece of the same size, numbered alike on both sides,
    /// for every algorithm of every collective at 2 to 5 ranks.
    #[test]
    fn pieces_pair_up_across_ranks() {
        let slots = Slots {
            count: 2,
            bytes: 24,
        };
        let arith = Arith {
            dtype: DataType::Float32,
            combine: Combine::Sum,
            divide_by: None,
        };
        let mut checked = 0;
        for p in 2..=5 {
            for c in Collective::WITH_BUFFERS {
                for &a in strata_algorithms::algorithms_for(c) {
                    let progs: Option<Vec<Compiled>> = (0..p)
                        .map(|rank| {
                            let plan = Plan {
                                collective: c,
                                algorithm: a,
                                nranks: p,
                                rank,
                                count: 37,
                                root: 1 % p,
                                chunk_elems: 5,
                            };
                            let s = strata_algorithms::plan(&plan).ok()?;
                            Some(compile(&s, p, 4, slots, a, arith))
                        })
                        .collect();
                    let Some(progs) = progs else { continue };
                    let pieces = |r: usize, send: bool, q: usize| -> Vec<usize> {
                        progs[r]
                            .steps
                            .iter()
                            .flatten()
                            .flatten()
                            .filter_map(|i| match *i {
                                Instr::Send { peer, bytes, .. } if send && peer == q => Some(bytes),
                                Instr::Recv { peer, bytes, .. } if !send && peer == q => {
                                    Some(bytes)
                                }
                                Instr::RecvReduce { peer, elems, .. } if !send && peer == q => {
                                    Some(elems * 4)
                                }
                                _ => None,
                            })
                            .collect()
                    };
                    for r in 0..p {
                        for q in (0..p).filter(|&q| q != r) {
                            assert_eq!(
                                pieces(r, true, q),
                                pieces(q, false, r),
                                "{c}/{a} p={p}: {r} -> {q}"
                            );
                            assert_eq!(progs[r].sent[q], progs[q].received[r]);
                            assert!(pieces(r, true, q).iter().all(|&b| b <= 24));
                        }
                    }
                    checked += 1;
                }
            }
        }
        assert!(checked > 60, "only {checked} plans compiled");
    }
}
