//! The small all-reduce: recursive doubling, run without the step machinery (no schedule
//! walk, no per-peer state vectors, no allocation) wherever a rank's part is one plain
//! exchange per step — every rank at a power-of-two rank count.
//!
//! It puts on the wire exactly what the general executor puts there for the same schedule —
//! a header to every peer of the call, the header and the first message to a partner in one
//! write, then the data — so a rank on this path and a rank on the general path (or a
//! mismatched call) still meet the same header checks and produce the same errors.

use super::*;

/// Largest message (bytes per rank) the small path takes: with the default 8 KiB shared-memory
/// slots, one slot write carries the header and the data (smaller slots take it in turns).
/// At 4 KiB the small path took 0.69 µs against the general executor's 1.15 at 2 ranks.
/// The cost model prices calls by the same bound
/// ([`strata_algorithms::Algorithm::takes_small_path`]).
pub(crate) const SMALL_MAX_BYTES: usize = strata_algorithms::SMALL_PATH_MAX_BYTES;

/// Most partners (lg p) and header-only peers the small path keeps on its stack.
pub(crate) const SMALL_MAX_PEERS: usize = 32;

/// Who a rank meets in a small all-reduce, taken once from the general recursive-doubling
/// schedule so that both paths pair the same ranks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SmallDoubling {
    /// The partner of each exchange, in step order.
    pub partners: Vec<usize>,
    /// Peers that only exchange headers with this rank (ring neighbours that are not partners).
    pub header_only: Vec<usize>,
}

impl SmallDoubling {
    /// The small path's peers, or `None` when `sched` (recursive doubling for this rank) is not
    /// a plain exchange per step: at a rank count that is not a power of two, the ranks that
    /// fold run on the general executor (the others' parts are plain exchanges).
    pub fn from_schedule(sched: &RankSchedule, exchange: &[usize]) -> Option<Self> {
        let mut partners = Vec::new();
        for step in &sched.steps {
            match step.ops.as_slice() {
                // Send what is held, and reduce the partner's copy into it.
                [
                    Op::Send { peer: a, src },
                    Op::RecvReduce {
                        peer: b,
                        src: held,
                        dst,
                    },
                ] if a == b && src == held && src.len == dst.len => partners.push(*a),
                ops if ops.iter().all(|op| op.peer().is_none()) => {}
                _ => return None,
            }
        }
        let header_only: Vec<usize> = exchange
            .iter()
            .copied()
            .filter(|q| !partners.contains(q))
            .collect();
        let fits = !partners.is_empty()
            && partners.len() <= SMALL_MAX_PEERS
            && header_only.len() <= SMALL_MAX_PEERS;
        fits.then_some(Self {
            partners,
            header_only,
        })
    }
}

/// The header (sent, and expected from the partner), and the bytes to send after it, with
/// the buffer that keeps what the transport did not take at once.
type HeaderAndSource<'a> = (&'a [u8; HEADER_BYTES], *const u8, &'a mut Vec<u8>);

impl OpRun<'_> {
    /// Runs a small all-reduce of `bytes` (≤ [`SMALL_MAX_BYTES`], whole elements) from
    /// `input` to `output` (which may be the same memory) with the peers of `plan`; `header`
    /// is this call's header encoded, which every peer's must equal byte for byte.
    ///
    /// # Safety
    /// `input` must be readable and `output` writable for `bytes` bytes for the whole call.
    pub(crate) unsafe fn run_small_doubling(
        &mut self,
        plan: &SmallDoubling,
        (input, output, bytes): (*const u8, *mut u8, usize),
        header: &[u8; HEADER_BYTES],
        announce: impl FnOnce(),
    ) -> Result<()> {
        if bytes > SMALL_MAX_BYTES || !bytes.is_multiple_of(self.dtype.size()) {
            announce();
            return Err(Error::Transport(format!(
                "internal: {bytes} bytes given to the small all-reduce"
            )));
        }
        // Headers to the peers that get nothing else: sent first, read last, as the general
        // executor does. Bytes of each header sent so far.
        let mut sent = [0u8; SMALL_MAX_PEERS];
        // Kept from call to call: after the first call this allocates nothing.
        let mut spill = std::mem::take(&mut self.reuse.coalesce);
        let mut announce = Some(announce);
        let result = (|| {
            let mut cur = input;
            for &partner in &plan.partners {
                self.exchange_small(
                    partner,
                    (header, cur, &mut spill),
                    &mut announce,
                    output,
                    bytes,
                    (&plan.header_only, &mut sent),
                )?;
                cur = output;
            }
            self.finish_header_only(&plan.header_only, &mut sent, header)
        })();
        self.reuse.coalesce = spill;
        // Every path announces the call before it ends (a plan always has a partner, so the
        // first exchange has done it already).
        if let Some(announce) = announce.take() {
            announce();
        }
        result?;
        if let Some(n) = self.divide_by {
            // SAFETY: the caller's output, writable for `bytes`.
            reduce::divide(
                self.dtype,
                unsafe { std::slice::from_raw_parts_mut(output, bytes) },
                n,
            );
        }
        Ok(())
    }

    /// The error for a header from `peer` whose bytes differ from the expected ones: both
    /// calls described where the whole header (`seen`) is at hand.
    pub(super) fn small_mismatch(&self, peer: usize, seen: Option<&[u8; HEADER_BYTES]>) -> Error {
        if let Some(Err(e)) = seen.map(|h| self.check_header(peer, Header::decode(h), self.wire_in))
        {
            return e;
        }
        Error::Mismatch(format!(
            "rank {} in {} received a header from rank {peer} that differs from its own",
            self.rank,
            self.local.describe()
        ))
    }

    /// One exchange: sends the header and `bytes` from `src` to `partner` and reduces its
    /// data with `src` into `dst`, while pushing the header-only peers' headers along. What
    /// the transport does not take at once is copied to `spill` before anything is reduced,
    /// since the reduction may write what is being sent.
    fn exchange_small(
        &mut self,
        partner: usize,
        (header, src, spill): HeaderAndSource<'_>,
        announce: &mut Option<impl FnOnce()>,
        dst: *mut u8,
        bytes: usize,
        (header_only, sent): (&[usize], &mut [u8]),
    ) -> Result<()> {
        let (dtype, combine, es) = (self.dtype, self.combine, self.dtype.size());
        let total = HEADER_BYTES + bytes;
        let mut out = {
            // SAFETY: `src` is the caller's input or output, readable for `bytes`; the slice
            // ends before anything writes there.
            let data = unsafe { std::slice::from_raw_parts(src, bytes) };
            let posted = self
                .conn(partner)
                .map(|c| c.data.send_some_pair(header, data));
            // The first message is out (or failed): the call is now announced, before
            // anything can fail or wait.
            if let Some(announce) = announce.take() {
                announce();
            }
            let n = posted?.map_err(|e| self.io_err(partner, e))?;
            if n < total {
                spill.clear();
                spill.extend_from_slice(header);
                spill.extend_from_slice(data);
            }
            n
        };
        // Header and data arrive in one pass: `got` counts both.
        let mut got = 0;
        let mut head = [0u8; HEADER_BYTES];
        let mut idle = 0u32;
        loop {
            let mut progressed =
                !header_only.is_empty() && self.push_headers(header_only, sent, header)?;
            if out < total {
                let n = self
                    .conn(partner)?
                    .data
                    .send_some(&spill[out..])
                    .map_err(|e| self.io_err(partner, e))?;
                out += n;
                progressed |= n > 0;
            }
            if got < total {
                let mut pos = got;
                let mut wrong = false;
                let n = self
                    .conn(partner)?
                    .data
                    .recv_some(total - got, es, &mut |mut incoming| {
                        if pos < HEADER_BYTES {
                            let k = incoming.len().min(HEADER_BYTES - pos);
                            head[pos..pos + k].copy_from_slice(&incoming[..k]);
                            (pos, incoming) = (pos + k, &incoming[k..]);
                            wrong = pos == HEADER_BYTES && !same_call_bytes(&head, header, 0);
                        }
                        let (at, k) = (pos - HEADER_BYTES, incoming.len());
                        pos += k;
                        if wrong || k == 0 {
                            return;
                        }
                        // SAFETY: [at, at + k) lies inside the caller's `bytes`-long buffers
                        // (the header is a whole number of elements, so k is too); when `src`
                        // and `dst` are the same memory only one slice is made.
                        unsafe {
                            let out = std::slice::from_raw_parts_mut(dst.add(at), k);
                            if std::ptr::eq(src, dst) {
                                reduce::reduce_in_place(dtype, combine, out, incoming);
                            } else {
                                let a = std::slice::from_raw_parts(src.add(at), k);
                                reduce::reduce_into(dtype, combine, out, a, incoming);
                            }
                        }
                    })
                    .map_err(|e| self.io_err(partner, e))?;
                if got < HEADER_BYTES && got + n >= HEADER_BYTES {
                    if !same_call_bytes(&head, header, 0) {
                        // Other bytes are another call (the encoding is canonical: see the
                        // header's tests), and its data was not reduced.
                        return Err(self.small_mismatch(partner, Some(&head)));
                    }
                    self.reuse.note_stall_share(partner, stall_share_of(&head));
                }
                got += n;
                progressed |= n > 0;
            }
            let headers_out = header_only
                .iter()
                .zip(sent.iter())
                .all(|(_, &s)| s as usize == HEADER_BYTES);
            if out == total && got == total && headers_out {
                self.reuse.step_done();
                return Ok(());
            }
            let waits = [(partner, Direction::Recv), (partner, Direction::Send)];
            let n = if out < total { 2 } else { 1 };
            self.end_round(progressed, &mut idle, &waits[..n])?;
        }
    }

    /// Pushes the header-only peers' headers as far as their connections take them; returns
    /// whether bytes moved.
    fn push_headers(
        &mut self,
        peers: &[usize],
        sent: &mut [u8],
        header: &[u8; HEADER_BYTES],
    ) -> Result<bool> {
        let mut progressed = false;
        for (&peer, s) in peers.iter().zip(sent.iter_mut()) {
            if (*s as usize) < HEADER_BYTES {
                let n = self
                    .conn(peer)?
                    .data
                    .send_some(&header[*s as usize..])
                    .map_err(|e| self.io_err(peer, e))?;
                // At most HEADER_BYTES in all.
                *s += n as u8;
                progressed |= n > 0;
            }
        }
        Ok(progressed)
    }

    /// Finishes the header-only peers: the rest of our headers out, theirs in and checked.
    fn finish_header_only(
        &mut self,
        peers: &[usize],
        sent: &mut [u8],
        header: &[u8; HEADER_BYTES],
    ) -> Result<()> {
        if peers.is_empty() {
            return Ok(());
        }
        for &peer in peers {
            self.conn(peer)?.hdr_in.clear();
        }
        let mut read = [false; SMALL_MAX_PEERS];
        let mut idle = 0u32;
        let mut waits = [(0usize, Direction::Recv); SMALL_MAX_PEERS];
        loop {
            let mut progressed = self.push_headers(peers, sent, header)?;
            let mut n = 0;
            for (i, &peer) in peers.iter().enumerate() {
                if read[i] {
                    continue;
                }
                let mut st = PeerState {
                    peer,
                    out: None,
                    out_sent: 0,
                    expect: Some(self.wire_in),
                    in_done: false,
                };
                progressed |= self.read_header(&mut st)?;
                read[i] = st.in_done;
                if !st.in_done {
                    waits[n] = (peer, Direction::Recv);
                    n += 1;
                }
            }
            if n == 0
                && sent[..peers.len()]
                    .iter()
                    .all(|&s| s as usize == HEADER_BYTES)
            {
                self.reuse.step_done();
                return Ok(());
            }
            if n == 0 {
                waits[0] = (peers[0], Direction::Send);
                n = 1;
            }
            self.end_round(progressed, &mut idle, &waits[..n])?;
        }
    }
}
