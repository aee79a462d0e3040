//! The small one-shot all-reduce: every rank sends its header and data to every other rank,
//! gathers theirs, and folds the p vectors in the schedule's order (rank order, or the
//! topology's where rings follow it), without the step machinery (no schedule walk, no
//! per-peer state vectors, no allocation after the first call).
//!
//! It puts on the wire what the general executor puts there for the one-shot schedule — to
//! each peer, the header and the whole vector in one write — and reduces in the schedule's
//! order, so a rank on this path and a rank on the general path produce the same bits and
//! meet the same header checks. A peer's data is only kept once its header matched, and
//! nothing is reduced until every header has, so a mismatched call changes no output.

use super::*;
use strata_algorithms::ONE_SHOT_MAX_RANKS;

/// Who a rank sends to and receives from in a small one-shot all-reduce, and where each
/// vector goes, as in the general one-shot schedule (whose slots follow the ranks' positions
/// in the ring order, which the fold follows).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SmallOneShot {
    /// Every other rank, in the order this rank sends to them.
    pub peers: Vec<usize>,
    /// The slot of each of `peers`' vectors.
    pub slots: Vec<usize>,
    /// The slot of this rank's own vector.
    pub own: usize,
}

impl SmallOneShot {
    /// The small path's peers and slots, or `None` when `sched` (of `count` elements) is not
    /// a one-shot schedule: one step that copies this rank's input to its slot, sends it to
    /// every other rank and receives each one's into its slot, then local steps only.
    pub fn from_schedule(sched: &RankSchedule, nranks: usize, count: usize) -> Option<Self> {
        let (first, rest) = sched.steps.split_first()?;
        let later_messages = rest.iter().flat_map(|s| &s.ops).any(|o| o.peer().is_some());
        if !(2..=ONE_SHOT_MAX_RANKS).contains(&nranks) || later_messages || count == 0 {
            return None;
        }
        let slot_of = |r: &Region| (r.buf == Buf::Scratch).then_some(r.offset / count);
        let own = first.ops.iter().find_map(|op| match op {
            Op::Copy { dst, .. } => slot_of(dst),
            _ => None,
        })?;
        let mut peers = Vec::new();
        let mut slots = Vec::new();
        for op in &first.ops {
            if let Op::Send { peer, .. } = op {
                let slot = first.ops.iter().find_map(|op| match op {
                    Op::Recv { peer: q, dst } if q == peer => slot_of(dst),
                    _ => None,
                })?;
                peers.push(*peer);
                slots.push(slot);
            }
        }
        let mut all: Vec<usize> = slots.iter().copied().chain([own]).collect();
        all.sort_unstable();
        let receives = first
            .ops
            .iter()
            .filter(|op| matches!(op, Op::Recv { .. }))
            .count();
        (all == (0..nranks).collect::<Vec<_>>() && receives == peers.len()).then_some(Self {
            peers,
            slots,
            own,
        })
    }
}

/// Bytes sent to or received from each peer so far (header and data together).
type Progress = [usize; ONE_SHOT_MAX_RANKS];

impl OpRun<'_> {
    /// Runs a small one-shot all-reduce of `bytes` (≤ [`SMALL_MAX_BYTES`], whole elements)
    /// from `input` to `output` (which may be the same memory) with the peers of `plan`;
    /// `header` is this call's header encoded, which every peer's must equal byte for byte.
    ///
    /// # Safety
    /// `input` must be readable and `output` writable for `bytes` bytes for the whole call.
    pub(crate) unsafe fn run_small_one_shot(
        &mut self,
        plan: &SmallOneShot,
        (input, output, bytes): (*const u8, *mut u8, usize),
        header: &[u8; HEADER_BYTES],
        announce: impl FnOnce(),
    ) -> Result<()> {
        let p = plan.peers.len() + 1;
        if bytes > SMALL_MAX_BYTES || !bytes.is_multiple_of(self.dtype.size()) || p < 2 {
            announce();
            return Err(Error::Transport(format!(
                "internal: {bytes} bytes on {p} ranks given to the small one-shot all-reduce"
            )));
        }
        // One slot of `bytes` per rank, in rank order; kept from call to call.
        let mut slots = std::mem::take(&mut self.reuse.gathered);
        if slots.len() < p * bytes {
            slots.resize(p * bytes, 0);
        }
        // SAFETY: the caller's input, readable for `bytes`; nothing writes the output (which
        // may be the same memory) before every send has finished.
        let data = unsafe { std::slice::from_raw_parts(input, bytes) };
        let result = self.gather_small(plan, header, data, &mut slots, announce);
        if result.is_ok() {
            let own = plan.own * bytes;
            crate::copy::copy(&mut slots[own..own + bytes], data);
            // SAFETY: the caller's output, writable for `bytes`; `slots` is ours.
            let out = unsafe { std::slice::from_raw_parts_mut(output, bytes) };
            let (dtype, combine) = (self.dtype, self.combine);
            reduce::reduce_into(
                dtype,
                combine,
                out,
                &slots[..bytes],
                &slots[bytes..2 * bytes],
            );
            for q in 2..p {
                reduce::reduce_in_place(dtype, combine, out, &slots[q * bytes..(q + 1) * bytes]);
            }
            if let Some(n) = self.divide_by {
                reduce::divide(dtype, out, n);
            }
        }
        self.reuse.gathered = slots;
        result
    }

    /// Sends `header` and `data` to every peer and gathers each peer's data into its slot
    /// (of `data.len()` bytes), checking that its header is the same as `header` first.
    fn gather_small(
        &mut self,
        plan: &SmallOneShot,
        header: &[u8; HEADER_BYTES],
        data: &[u8],
        slots: &mut [u8],
        announce: impl FnOnce(),
    ) -> Result<()> {
        let total = HEADER_BYTES + data.len();
        let peers = &plan.peers;
        let (mut out, mut got): (Progress, Progress) = Default::default();
        let mut announce = Some(announce);
        for (i, &q) in peers.iter().enumerate() {
            let posted = self.conn(q).map(|c| c.data.send_some_pair(header, data));
            // The first message is out (or failed): the call is now announced, before
            // anything can fail or wait.
            if let Some(announce) = announce.take() {
                announce();
            }
            out[i] = posted?.map_err(|e| self.io_err(q, e))?;
        }
        let mut idle = 0u32;
        let mut waits = [(0usize, Direction::Recv); 2 * ONE_SHOT_MAX_RANKS];
        loop {
            let mut progressed = false;
            let mut n = 0;
            for (i, &q) in peers.iter().enumerate() {
                if out[i] < total {
                    let c = &mut self.conn(q)?.data;
                    let sent = if out[i] < HEADER_BYTES {
                        c.send_some_pair(&header[out[i]..], data)
                    } else {
                        c.send_some(&data[out[i] - HEADER_BYTES..])
                    }
                    .map_err(|e| self.io_err(q, e))?;
                    out[i] += sent;
                    progressed |= sent > 0;
                    if out[i] < total {
                        waits[n] = (q, Direction::Send);
                        n += 1;
                    }
                }
                if got[i] < total {
                    let at = plan.slots[i] * data.len();
                    let slot = &mut slots[at..at + data.len()];
                    let moved = self.recv_small(q, (got[i], total), header, slot)?;
                    got[i] += moved;
                    progressed |= moved > 0;
                    if got[i] < total {
                        waits[n] = (q, Direction::Recv);
                        n += 1;
                    }
                }
            }
            if n == 0 {
                self.reuse.step_done();
                return Ok(());
            }
            self.end_round(progressed, &mut idle, &waits[..n])?;
        }
    }

    /// Reads what has arrived from `peer` of its `total` bytes, `got` of them already read:
    /// header bytes are compared with `expected` (a differing header is a mismatch error,
    /// and none of that peer's data is kept), data goes to `slot`. Returns the bytes read.
    fn recv_small(
        &mut self,
        peer: usize,
        (got, total): (usize, usize),
        expected: &[u8; HEADER_BYTES],
        slot: &mut [u8],
    ) -> Result<usize> {
        let es = self.dtype.size();
        let mut pos = got;
        let mut head = [0u8; HEADER_BYTES];
        let mut wrong = false;
        let n = self
            .conn(peer)?
            .data
            .recv_some(total - got, es, &mut |mut incoming| {
                if pos < HEADER_BYTES {
                    let k = incoming.len().min(HEADER_BYTES - pos);
                    head[pos..pos + k].copy_from_slice(&incoming[..k]);
                    wrong |= !same_call_bytes(&incoming[..k], expected, pos);
                    (pos, incoming) = (pos + k, &incoming[k..]);
                }
                if wrong || incoming.is_empty() {
                    return;
                }
                let at = pos - HEADER_BYTES;
                crate::copy::copy(&mut slot[at..at + incoming.len()], incoming);
                pos += incoming.len();
            })
            .map_err(|e| self.io_err(peer, e))?;
        if !wrong && got < HEADER_BYTES && got + n >= HEADER_BYTES {
            // The sender's stall share, where its bytes came in this read (nearly always:
            // a header arrives whole).
            if got <= STALL_BYTES.start {
                let b = &head[STALL_BYTES];
                self.reuse
                    .note_stall_share(peer, u16::from_le_bytes([b[0], b[1]]));
            }
        }
        if wrong {
            // The bytes of this header that arrived in this read are in `head`; those that
            // arrived before matched. Describe the peer's call if the whole header is here.
            let mut seen = *expected;
            seen[got..(got + n).min(HEADER_BYTES)]
                .copy_from_slice(&head[got..(got + n).min(HEADER_BYTES)]);
            return Err(self.small_mismatch(peer, (got + n >= HEADER_BYTES).then_some(&seen)));
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use strata_algorithms::{Algorithm, Collective, Plan};

    fn schedule(algorithm: Algorithm, nranks: usize, rank: usize, count: usize) -> RankSchedule {
        strata_algorithms::plan(&Plan {
            collective: Collective::AllReduce,
            algorithm,
            nranks,
            rank,
            count,
            root: 0,
            chunk_elems: 1,
        })
        .unwrap()
    }

    #[test]
    fn peers_and_slots_come_from_the_schedule() {
        let s = schedule(Algorithm::OneShot, 4, 1, 3);
        let plan = SmallOneShot::from_schedule(&s, 4, 3).unwrap();
        assert_eq!(plan.peers, vec![2, 3, 0]);
        assert_eq!(plan.slots, vec![2, 3, 0]);
        assert_eq!(plan.own, 1);
        // Nothing to send, or not one-shot: no small one-shot path.
        let empty = schedule(Algorithm::OneShot, 4, 1, 0);
        assert_eq!(SmallOneShot::from_schedule(&empty, 4, 0), None);
        let doubling = schedule(Algorithm::RecursiveDoubling, 4, 1, 3);
        assert_eq!(SmallOneShot::from_schedule(&doubling, 4, 3), None);
    }
}
