//! Sending ahead: the sends of the next step that moves data start during the current step,
//! as far as the bytes they read are final.
//!
//! A schedule's steps run one after the other, so in a ring a block reduced in step `t` would
//! only go on to the next rank in step `t + 1`, read back from memory after the whole step. The
//! executor instead forwards each reduced chunk as soon as it is written, while it is still in
//! cache: receive, reduce and send fused, as NCCL's ring does, and a pipeline across steps for
//! any schedule (recursive doubling's next partner gets the first reduced bytes while the
//! rest still arrive). Nothing in the schedule changes, and neither do the byte streams:
//!
//! * a connection's stream keeps schedule order: a send of the next step to a peer starts only
//!   once every send of this step to that peer is done and every earlier send of the next step
//!   to it has gone out in full;
//! * a send reads only final bytes: the prefix of its source that no unfinished operation of
//!   this step still writes (a receive's written prefix is final, since no other operation of
//!   a step writes what one writes), and nothing when a local step in between writes it.
//!
//! Sending ahead never waits and does not count as progress: a full transport leaves the rest
//! to the step itself, and a rank whose own step waits still goes to sleep instead of
//! trickling bytes ahead on a core the rank it waits for may need.
//!
//! It is off unless [`crate::Config::send_ahead`] asks for it. On this project's 2-core VM it
//! sent ~90% of a ring's bytes ahead but made no difference at 2 ranks (±10%, 64 KiB to 32 MiB)
//! and made 4 ranks on 2 cores up to 1.9× slower at 32 MiB: a rank that always has data to
//! send keeps its core for its whole time slice while the rank it feeds waits for that core.
//! Capping each receive at 64 KiB, so that forwarded chunks stay in the first-level cache, was
//! slower still (1.5-1.8× at 512 KiB-4 MiB at 2 ranks).

use super::{Buffers, HEADER_BYTES, OpRun, PeerState};
use crate::error::Result;
use std::sync::atomic::Ordering;
use strata_algorithms::{Op, Step};

/// Steps with more operations than this are not looked ahead of (matching a step's writes
/// against the next step's sends costs the product of their sizes on every round).
const LOOKAHEAD_MAX_OPS: usize = 32;

/// The step after the current one, as far as sending ahead needs it.
#[derive(Clone, Copy)]
pub(super) struct NextStep<'s> {
    /// Its index in the schedule.
    pub index: usize,
    /// Its operations.
    pub ops: &'s [Op],
    /// The local steps between the current step and it.
    pub between: &'s [Step],
}

impl<'s> NextStep<'s> {
    /// The step after `steps[current]` that moves data, when sending ahead into it is worth
    /// trying.
    pub fn after(steps: &'s [Step], current: usize) -> Option<Self> {
        if steps[current].ops.len() > LOOKAHEAD_MAX_OPS {
            return None;
        }
        let index = (current + 1..steps.len())
            .find(|&i| steps[i].ops.iter().any(|op| op.peer().is_some()))?;
        let ops = &steps[index].ops[..];
        let sends = ops.iter().any(|op| matches!(op, Op::Send { .. }));
        (sends && ops.len() <= LOOKAHEAD_MAX_OPS).then_some(Self {
            index,
            ops,
            between: &steps[current + 1..index],
        })
    }
}

/// Whether the byte ranges `[a, a + a_len)` and `[b, b + b_len)` share a byte.
fn overlap(a: *const u8, a_len: usize, b: *const u8, b_len: usize) -> bool {
    let (a, b) = (a as usize, b as usize);
    a < b + b_len && b < a + a_len && a_len > 0 && b_len > 0
}

impl OpRun<'_> {
    /// How many leading bytes of `[p, p + len)` are final now: every byte that no unfinished
    /// operation of this step (`ops`, with `done` bytes and `finished` flags) will still
    /// write, up to the first that one will, and none when a local step of `between` writes
    /// any of them.
    fn final_prefix(
        &self,
        (p, len): (*mut u8, usize),
        ops: &[Op],
        done: &[usize],
        finished: &[bool],
        between: &[Step],
        bufs: &Buffers,
    ) -> Result<usize> {
        let es = self.dtype.size();
        for op in between.iter().flat_map(|s| &s.ops) {
            let written = match op {
                Op::Copy { src, dst } if bufs.span(src, es)? != bufs.span(dst, es)? => dst,
                Op::Finalize { region } if self.divide_by.is_some() => region,
                _ => continue,
            };
            let (w, wl) = bufs.span(written, es)?;
            if overlap(p, len, w, wl) {
                return Ok(0);
            }
        }
        let mut limit = len;
        for (i, op) in ops.iter().enumerate() {
            let (Op::Recv { dst, .. } | Op::RecvReduce { dst, .. }) = op else {
                continue;
            };
            if finished[i] {
                continue;
            }
            let (w, wl) = bufs.span(dst, es)?;
            if overlap(p, len, w, wl) {
                // Written so far: [w, w + done); the rest of the receive is not final yet.
                let unwritten = w as usize + done[i];
                limit = limit.min(unwritten.saturating_sub(p as usize));
            }
        }
        Ok(limit)
    }

    /// One round of sending ahead into `next` (see the module comment); `ahead` holds the
    /// bytes of each of its operations already sent. Returns whether any byte moved.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn send_ahead(
        &mut self,
        ops: &[Op],
        done: &[usize],
        finished: &[bool],
        next: &NextStep,
        ahead: &mut [usize],
        blocked: &mut Vec<usize>,
        states: &[PeerState],
        bufs: &Buffers,
    ) -> Result<bool> {
        let es = self.dtype.size();
        let mut progressed = false;
        blocked.clear();
        for (k, op) in next.ops.iter().enumerate() {
            let Op::Send { peer, src } = op else {
                continue;
            };
            let peer = *peer;
            if blocked.contains(&peer) {
                continue;
            }
            let this_step_sends = ops
                .iter()
                .enumerate()
                .any(|(i, o)| !finished[i] && matches!(o, Op::Send { peer: q, .. } if *q == peer));
            let header_owed = states
                .iter()
                .any(|s| s.peer == peer && s.out.is_some() && s.out_sent < HEADER_BYTES);
            if this_step_sends || header_owed {
                blocked.push(peer);
                continue;
            }
            let (p, len) = bufs.span(src, es)?;
            if ahead[k] < len {
                let ready = self.final_prefix((p, len), ops, done, finished, next.between, bufs)?;
                if ready > ahead[k] {
                    // SAFETY: bounds-checked span; its first `ready` bytes are final, and no
                    // operation writes them for the rest of this step.
                    let data =
                        unsafe { std::slice::from_raw_parts(p.add(ahead[k]), ready - ahead[k]) };
                    let n = self
                        .conn(peer)?
                        .data
                        .send_some(data)
                        .map_err(|e| self.io_err(peer, e))?;
                    ahead[k] += n;
                    progressed |= n > 0;
                    if let Some(count) = self.sent_ahead {
                        count.fetch_add(n as u64, Ordering::Relaxed);
                    }
                }
            }
            if ahead[k] < len {
                blocked.push(peer);
            }
        }
        Ok(progressed)
    }
}
