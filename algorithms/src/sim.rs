//! An in-memory executor that runs every rank's schedule in one process and checks it.
//!
//! Sends complete only when the matching receive is at the head of the peer's current step
//! (rendezvous), which is stricter than any buffered transport: a schedule that passes here
//! cannot deadlock on bounded buffers. The simulator also rejects message size mismatches,
//! operations of one step that touch overlapping memory, and wrong results. The reduction is
//! wrapping addition on `u64` and the final step multiplies by 3, so a missing, repeated or
//! early `Finalize` shows up in the result.

use crate::schedule::{Buf, Collective, Op, RankSchedule, Region};
use crate::{Algorithm, Plan, plan};

/// The final step applied by `Finalize` in the simulator.
pub const FINALIZE_FACTOR: u64 = 3;

/// How the simulated caller lays out its buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Separate input and output buffers.
    OutOfPlace,
    /// NCCL's in-place layout for the collective.
    InPlace,
}

struct RankMem {
    mem: Vec<u64>,
    input: usize,
    output: usize,
    scratch: usize,
}

impl RankMem {
    fn base(&self, buf: Buf) -> usize {
        match buf {
            Buf::Input => self.input,
            Buf::Output => self.output,
            Buf::Scratch => self.scratch,
        }
    }
    fn span(&self, r: &Region) -> (usize, usize) {
        let b = self.base(r.buf) + r.offset;
        (b, b + r.len)
    }
}

/// Deterministic input element for (rank, index).
pub fn input_value(rank: usize, i: usize) -> u64 {
    (rank as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ (i as u64).wrapping_mul(0xBF58_476D_1CE4_E5B9)
}

/// Runs `collective` with `algorithm` for every rank and checks the result.
/// Returns the schedules on success so callers can inspect them.
pub fn check(
    collective: Collective,
    algorithm: Algorithm,
    nranks: usize,
    count: usize,
    root: usize,
    placement: Placement,
) -> Result<Vec<RankSchedule>, String> {
    let schedules: Vec<RankSchedule> = (0..nranks)
        .map(|rank| {
            plan(&Plan {
                collective,
                algorithm,
                nranks,
                rank,
                count,
                root,
                chunk_elems: 3,
            })
            .map_err(|e| e.to_string())
        })
        .collect::<Result<_, _>>()?;
    let mut mems: Vec<RankMem> = (0..nranks)
        .map(|r| {
            layout(
                collective,
                nranks,
                r,
                count,
                root,
                placement,
                schedules[r].scratch_elems,
            )
        })
        .collect();
    let inputs: Vec<Vec<u64>> = (0..nranks)
        .map(|r| {
            let (ilen, _) = collective.buffer_elems(count, nranks, r, root);
            (0..ilen).map(|i| input_value(r, i)).collect()
        })
        .collect();
    for (r, m) in mems.iter_mut().enumerate() {
        let b = m.input;
        m.mem[b..b + inputs[r].len()].copy_from_slice(&inputs[r]);
    }
    run(&schedules, &mut mems)?;
    for (r, m) in mems.iter().enumerate() {
        let expect = reference(collective, nranks, r, count, root, &inputs);
        let (_, olen) = collective.buffer_elems(count, nranks, r, root);
        let got = &m.mem[m.output..m.output + olen];
        if let Some(expect) = expect {
            if got != expect.as_slice() {
                let at = got
                    .iter()
                    .zip(&expect)
                    .position(|(a, b)| a != b)
                    .unwrap_or(0);
                return Err(format!(
                    "{collective}/{algorithm} p={nranks} n={count} root={root} {placement:?}: rank {r} wrong at element {at}"
                ));
            }
        }
    }
    Ok(schedules)
}

fn layout(
    c: Collective,
    p: usize,
    r: usize,
    n: usize,
    root: usize,
    pl: Placement,
    scratch: usize,
) -> RankMem {
    let (ilen, olen) = c.buffer_elems(n, p, r, root);
    let in_place_offset: Option<(bool, usize)> = match (pl, c) {
        (Placement::OutOfPlace, _) => None,
        // (input lives inside output?, offset)
        (_, Collective::AllReduce) => Some((true, 0)),
        (_, Collective::Broadcast | Collective::Reduce) if r == root => Some((true, 0)),
        (_, Collective::AllGather) => Some((true, r * n)),
        (_, Collective::Gather) if r == root => Some((true, r * n)),
        (_, Collective::ReduceScatter) => Some((false, r * n)),
        (_, Collective::Scatter) if r == root => Some((false, r * n)),
        _ => None,
    };
    let (input, output, used) = match in_place_offset {
        None => (0, ilen, ilen + olen),
        Some((true, off)) => (off, 0, olen),
        Some((false, off)) => (0, off, ilen),
    };
    RankMem {
        mem: vec![0xDEAD_BEEF; used + scratch],
        input,
        output,
        scratch: used,
    }
}

fn reference(
    c: Collective,
    p: usize,
    r: usize,
    n: usize,
    root: usize,
    inputs: &[Vec<u64>],
) -> Option<Vec<u64>> {
    let sum = |idx: usize| {
        inputs
            .iter()
            .fold(0u64, |a, v| a.wrapping_add(v[idx]))
            .wrapping_mul(FINALIZE_FACTOR)
    };
    Some(match c {
        Collective::AllReduce => (0..n).map(sum).collect(),
        Collective::Reduce if r == root => (0..n).map(sum).collect(),
        Collective::Broadcast => inputs[root].clone(),
        Collective::AllGather => (0..p * n)
            .map(|k| inputs[k / n.max(1)][k % n.max(1)])
            .collect(),
        Collective::Gather if r == root => (0..p * n)
            .map(|k| inputs[k / n.max(1)][k % n.max(1)])
            .collect(),
        Collective::ReduceScatter => (0..n).map(|i| sum(r * n + i)).collect(),
        Collective::AllToAll => (0..p * n)
            .map(|k| inputs[k / n.max(1)][r * n + k % n.max(1)])
            .collect(),
        Collective::Scatter => inputs[root][r * n..(r + 1) * n].to_vec(),
        _ => return None,
    })
}

fn reads(op: &Op) -> Option<&Region> {
    match op {
        Op::Send { src, .. } | Op::RecvReduce { src, .. } | Op::Copy { src, .. } => Some(src),
        Op::Finalize { region } => Some(region),
        Op::Recv { .. } => None,
    }
}

fn writes(op: &Op) -> Option<&Region> {
    match op {
        Op::Recv { dst, .. } | Op::RecvReduce { dst, .. } | Op::Copy { dst, .. } => Some(dst),
        Op::Finalize { region } => Some(region),
        Op::Send { .. } => None,
    }
}

fn overlap(a: (usize, usize), b: (usize, usize)) -> bool {
    a.0 < b.1 && b.0 < a.1 && a.0 < a.1 && b.0 < b.1
}

fn check_step_conflicts(rank: usize, si: usize, ops: &[Op], m: &RankMem) -> Result<(), String> {
    // A copy onto itself (in place) is skipped by the runtime and touches nothing.
    let is_noop = |op: &Op| matches!(op, Op::Copy { src, dst } if m.span(src) == m.span(dst));
    let ops: Vec<&Op> = ops.iter().filter(|op| !is_noop(op)).collect();
    for (i, a) in ops.iter().enumerate() {
        let Some(w) = writes(a) else { continue };
        let w = m.span(w);
        if w.1 > m.mem.len() {
            return Err(format!(
                "rank {rank} step {si}: {a:?} writes past its buffer"
            ));
        }
        for (j, b) in ops.iter().enumerate() {
            if i == j {
                continue;
            }
            let touches = [reads(b), writes(b)]
                .into_iter()
                .flatten()
                .any(|r| overlap(w, m.span(r)));
            if touches {
                return Err(format!(
                    "rank {rank} step {si}: {a:?} and {b:?} touch the same memory"
                ));
            }
        }
    }
    Ok(())
}

/// Executes the schedules to completion or reports why they cannot complete.
fn run(schedules: &[RankSchedule], mems: &mut [RankMem]) -> Result<(), String> {
    let p = schedules.len();
    let mut step = vec![0usize; p];
    let mut done: Vec<Vec<bool>> = (0..p)
        .map(|r| vec![false; op_count(&schedules[r], 0)])
        .collect();
    for (r, s) in schedules.iter().enumerate() {
        for (si, st) in s.steps.iter().enumerate() {
            check_step_conflicts(r, si, &st.ops, &mems[r])?;
        }
    }
    loop {
        let mut progressed = false;
        for r in 0..p {
            let Some(st) = schedules[r].steps.get(step[r]) else {
                continue;
            };
            for (i, op) in st.ops.iter().enumerate() {
                if done[r][i] {
                    continue;
                }
                match op {
                    Op::Copy { src, dst } => {
                        let (s, d) = (mems[r].span(src), mems[r].span(dst));
                        mems[r].mem.copy_within(s.0..s.1, d.0);
                        done[r][i] = true;
                    }
                    Op::Finalize { region } => {
                        let (a, b) = mems[r].span(region);
                        for x in &mut mems[r].mem[a..b] {
                            *x = x.wrapping_mul(FINALIZE_FACTOR);
                        }
                        done[r][i] = true;
                    }
                    Op::Send { peer, src } => {
                        // Only the first pending send to this peer may move.
                        if st.ops[..i]
                            .iter()
                            .zip(&done[r])
                            .any(|(o, d)| !d && matches!(o, Op::Send { peer: q, .. } if q == peer))
                        {
                            continue;
                        }
                        let q = *peer;
                        if q >= p || q == r {
                            return Err(format!("rank {r} sends to invalid peer {q}"));
                        }
                        let Some(qst) = schedules[q].steps.get(step[q]) else {
                            continue;
                        };
                        let head = qst.ops.iter().enumerate().find(|(j, o)| {
                            !done[q][*j] && matches!(o, Op::Recv { peer, .. } | Op::RecvReduce { peer, .. } if *peer == r)
                        });
                        let Some((j, rop)) = head else { continue };
                        let s = mems[r].span(src);
                        let data: Vec<u64> = mems[r].mem[s.0..s.1].to_vec();
                        match rop {
                            Op::Recv { dst, .. } => {
                                if dst.len != data.len() {
                                    return Err(size_err(r, q, data.len(), dst.len));
                                }
                                let d = mems[q].span(dst);
                                mems[q].mem[d.0..d.1].copy_from_slice(&data);
                            }
                            Op::RecvReduce { src: lsrc, dst, .. } => {
                                if dst.len != data.len() || lsrc.len != dst.len {
                                    return Err(size_err(r, q, data.len(), dst.len));
                                }
                                let ls = mems[q].span(lsrc);
                                let d = mems[q].span(dst);
                                let local: Vec<u64> = mems[q].mem[ls.0..ls.1].to_vec();
                                for (k, x) in mems[q].mem[d.0..d.1].iter_mut().enumerate() {
                                    *x = local[k].wrapping_add(data[k]);
                                }
                            }
                            _ => {
                                return Err(format!(
                                    "rank {q}: internal: the matched operation is not a receive"
                                ));
                            }
                        }
                        done[r][i] = true;
                        done[q][j] = true;
                        progressed = true;
                    }
                    Op::Recv { .. } | Op::RecvReduce { .. } => {}
                }
            }
            if done[r].iter().all(|d| *d) {
                step[r] += 1;
                done[r] = vec![false; op_count(&schedules[r], step[r])];
                progressed = true;
            }
        }
        if (0..p).all(|r| step[r] >= schedules[r].steps.len()) {
            return Ok(());
        }
        if !progressed {
            let stuck: Vec<String> = (0..p)
                .filter(|&r| step[r] < schedules[r].steps.len())
                .take(8)
                .map(|r| {
                    format!(
                        "rank {r} at step {}: {:?}",
                        step[r], schedules[r].steps[step[r]].ops
                    )
                })
                .collect();
            return Err(format!("deadlock: {}", stuck.join("; ")));
        }
    }
}

fn op_count(s: &RankSchedule, step: usize) -> usize {
    s.steps.get(step).map_or(0, |st| st.ops.len())
}

fn size_err(from: usize, to: usize, sent: usize, expected: usize) -> String {
    format!("rank {from} sends {sent} elements to rank {to}, which expects {expected}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithms_for;
    use proptest::prelude::*;

    const COLLECTIVES: [Collective; 8] = Collective::WITH_BUFFERS;

    #[test]
    fn every_collective_small_shapes() {
        for c in COLLECTIVES {
            for &a in algorithms_for(c) {
                for p in 1..=9 {
                    for n in [0, 1, 2, 5, 7, 16, 17] {
                        for root in [0, p / 2, p - 1] {
                            for pl in [Placement::OutOfPlace, Placement::InPlace] {
                                if c == Collective::AllToAll && pl == Placement::InPlace {
                                    continue; // the runtime gives all-to-all a private input copy
                                }
                                check(c, a, p, n, root, pl).unwrap();
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn barrier_completes() {
        for p in 1..=33 {
            check(
                Collective::Barrier,
                Algorithm::Dissemination,
                p,
                0,
                0,
                Placement::OutOfPlace,
            )
            .unwrap();
        }
    }

    #[test]
    fn detects_a_wrong_schedule() {
        // A ring all-reduce whose all-gather is dropped must fail the result check.
        let mut s = crate::builders::ring_all_reduce(3, 0, 9);
        s.steps.truncate(3);
        let all: Vec<RankSchedule> = (0..3)
            .map(|r| {
                let mut s = crate::builders::ring_all_reduce(3, r, 9);
                s.steps.truncate(3);
                s
            })
            .collect();
        let mut mems: Vec<RankMem> = (0..3)
            .map(|r| layout(Collective::AllReduce, 3, r, 9, 0, Placement::OutOfPlace, 0))
            .collect();
        run(&all, &mut mems).unwrap();
        assert_ne!(mems[0].mem[9..18], mems[1].mem[9..18]);
        // A lone send with no receiver deadlocks and is reported.
        let lone = vec![
            {
                let mut s = RankSchedule::default();
                s.step(vec![Op::Send {
                    peer: 1,
                    src: Region::new(Buf::Input, 0, 1),
                }]);
                s
            },
            RankSchedule::default(),
        ];
        let mut mems: Vec<RankMem> = (0..2)
            .map(|r| layout(Collective::AllReduce, 2, r, 1, 0, Placement::OutOfPlace, 0))
            .collect();
        assert!(run(&lone, &mut mems).unwrap_err().contains("deadlock"));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        #[test]
        fn random_shapes(ci in 0usize..8, p in 1usize..=64, n in 0usize..300, root_seed in 0usize..1000, in_place: bool) {
            let c = COLLECTIVES[ci];
            let root = root_seed % p;
            let pl = if in_place && c != Collective::AllToAll { Placement::InPlace } else { Placement::OutOfPlace };
            for &a in algorithms_for(c) {
                prop_assert!(check(c, a, p, n, root, pl).is_ok(), "{:?}", check(c, a, p, n, root, pl).err());
            }
        }
    }
}
