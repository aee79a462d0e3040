//! The executor: runs one rank's [`RankSchedule`] over its connections.
//!
//! All operations of a step progress together through non-blocking transport calls; operations
//! of one step that use the same connection direction go in list order, which keeps each byte
//! stream in schedule order. Before its data, every connection an operation uses carries a
//! 32-byte header (sequence number, collective, type, count, op, root or ring slice) in each
//! direction, and the receiver checks it against its own call. Every wait spins briefly, then yields, then
//! sleeps on futexes or sockets for at most 50 ms at a time, checking the abort flag, the
//! deadline and the peers' control streams in between ([`wait`]). With
//! [`crate::Config::send_ahead`], the next step's sends start during the current one, each as
//! far as its bytes are final ([`ahead`]).

use crate::connection::Connection;
use crate::dtype::DataType;
use crate::error::{Error, RankList, Result};
use crate::reduce::{self, Combine};
use crate::transport::Direction;
use crate::wire::{PeerInfo, STALL_BYTES, same_call_bytes, set_stall_share, stall_share_of};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::time::{Duration, Instant};
use strata_algorithms::{Buf, Op, RankSchedule, Region};

mod ahead;
mod oneshot;
mod small;
mod stalls;
mod wait;
pub(crate) use crate::wire::{HEADER_BYTES, Header};
use ahead::NextStep;
pub(crate) use oneshot::SmallOneShot;
pub(crate) use small::{SMALL_MAX_BYTES, SmallDoubling};
pub(crate) use stalls::{StallLog, WaitBoard};
pub(crate) use wait::{SpinPolicy, check_control};

/// A first message up to this size travels in the same transport write as its header.
const COALESCE_MAX: usize = 4096;

/// The caller's buffers and the scratch memory, as raw spans.
pub(crate) struct Buffers {
    pub input: *const u8,
    pub input_bytes: usize,
    pub output: *mut u8,
    pub output_bytes: usize,
    pub scratch: *mut u8,
    pub scratch_bytes: usize,
    /// For a batch of point-to-point transfers, the caller's separate buffers laid end to end
    /// as (start in the concatenation, pointer, bytes): `Input` regions address the sends and
    /// `Output` regions the receives. Empty for a collective, which uses `input`/`output`.
    pub input_parts: Vec<(usize, *mut u8, usize)>,
    /// The receive buffers of a batch, as `input_parts`.
    pub output_parts: Vec<(usize, *mut u8, usize)>,
}

impl Buffers {
    fn span(&self, r: &Region, es: usize) -> Result<(*mut u8, usize)> {
        let parts = match r.buf {
            Buf::Input => &self.input_parts,
            Buf::Output => &self.output_parts,
            Buf::Scratch => &Vec::new(),
        };
        if !parts.is_empty() {
            let (off, len) = (r.offset * es, r.len * es);
            let i = parts.partition_point(|part| part.0 <= off);
            return match i.checked_sub(1).map(|i| parts[i]) {
                Some((start, base, cap)) if off - start + len <= cap => {
                    // SAFETY: off - start + len ≤ cap, the size of the buffer base points to.
                    Ok((unsafe { base.add(off - start) }, len))
                }
                _ => Err(Error::Transport(format!(
                    "internal: batch region {r:?} does not lie inside one buffer"
                ))),
            };
        }
        let (base, cap) = match r.buf {
            Buf::Input => (self.input as *mut u8, self.input_bytes),
            Buf::Output => (self.output, self.output_bytes),
            Buf::Scratch => (self.scratch, self.scratch_bytes),
        };
        let (off, len) = (r.offset * es, r.len * es);
        if off + len > cap {
            return Err(Error::Transport(format!(
                "internal: schedule region {r:?} exceeds its {cap}-byte buffer"
            )));
        }
        // SAFETY: off + len ≤ cap, the size of the buffer base points to.
        Ok((unsafe { base.add(off) }, len))
    }
}

/// One operation's context.
pub(crate) struct OpRun<'a> {
    pub rank: usize,
    pub peers: &'a [PeerInfo],
    pub conns: &'a mut [Option<Connection>],
    pub dtype: DataType,
    pub combine: Combine,
    /// `Some(n)` for avg: divide by n when finalising.
    pub divide_by: Option<usize>,
    /// Peers that get `wire_out` before any data.
    pub hdr_out: &'a [usize],
    /// Peers whose header must equal `wire_in` before their data is read.
    pub hdr_in: &'a [usize],
    pub wire_out: Header,
    pub wire_in: Header,
    /// Headers that differ per peer (a batch of point-to-point transfers): (peer, header to
    /// send it, header expected from it), besides `hdr_out` and `hdr_in`.
    pub per_peer: &'a [(usize, Option<Header>, Option<Header>)],
    /// This rank's own view of the call, for messages.
    pub local: Header,
    /// The call's deadline, counted from the first time it has to sleep (reading the clock on
    /// every call would cost more than a small all-reduce).
    pub timeout: Duration,
    /// (first sleep, deadline), set when the call first sleeps.
    pub clock: Option<(Instant, Instant)>,
    /// Set when the call must stop: `Communicator::abort` or a fault the watchdog recorded.
    pub abort: &'a AtomicBool,
    /// Buffers kept from call to call so that a call allocates nothing.
    pub reuse: &'a mut ExecBuffers,
    /// Rounds of the progress loop that moved something.
    pub progress_events: u64,
    /// (progress_events, when) at which a waited-on peer was first seen to have said goodbye.
    pub goodbye_seen: Option<(u64, Instant)>,
    /// Whether an idle wait has seen the abort flag once: the loop then gets one more round,
    /// so that what peers delivered before the fault (a mismatching header) is still read.
    pub abort_seen: bool,
    /// Idle polls spent spinning, then yielding, before sleeping.
    pub spin: SpinPolicy,
    /// Where sends of the next step may start during the current one ([`ahead`]), the count
    /// of bytes so sent.
    pub sent_ahead: Option<&'a AtomicU64>,
}

/// Per-call bookkeeping, kept by the communicator and reused.
#[derive(Default)]
pub(crate) struct ExecBuffers {
    states: Vec<PeerState>,
    /// A header and a small first message, sent as one.
    coalesce: Vec<u8>,
    /// Every rank's vector in a small one-shot all-reduce.
    gathered: Vec<u8>,
    step: StepState,
    /// What this call tells the straggler view ([`crate::watchdog::stragglers`]).
    pub stalls: StallLog,
}

impl ExecBuffers {
    /// Buffers whose calls count idle stretches of at least `threshold` as stalls.
    pub(crate) fn with_stall_threshold(threshold: Duration) -> Self {
        let mut b = Self::default();
        b.stalls.threshold = threshold;
        b
    }

    /// Records the stall share `peer`'s header carried.
    pub(crate) fn note_stall_share(&mut self, peer: usize, per_mille: u16) {
        self.stalls.note_share(peer, per_mille);
    }

    /// A step's loop ends: an open idle stretch ends with it.
    pub(crate) fn step_done(&mut self) {
        self.stalls.moved();
    }
}

#[derive(Default)]
struct StepState {
    done: Vec<usize>,
    finished: Vec<bool>,
    waits: Vec<(usize, Direction)>,
    busy_send: Vec<usize>,
    busy_recv: Vec<usize>,
    /// Bytes of each operation of the next step already sent ahead.
    ahead: Vec<usize>,
    /// What `ahead` held when the previous step ended, and the step it was for.
    carried: Vec<usize>,
    carried_for: Option<usize>,
    /// Peers whose next-step sends wait for something this round.
    ahead_blocked: Vec<usize>,
}

impl StepState {
    fn reset(&mut self, ops: usize, next_ops: usize) {
        self.done.clear();
        self.done.resize(ops, 0);
        self.finished.clear();
        self.finished.resize(ops, false);
        self.ahead.clear();
        self.ahead.resize(next_ops, 0);
    }
}

struct PeerState {
    peer: usize,
    out: Option<[u8; HEADER_BYTES]>,
    out_sent: usize,
    expect: Option<Header>,
    in_done: bool,
}

impl<'a> OpRun<'a> {
    /// Sets the headers: `wire_out` goes to every peer of `out_to` and `wire_in` is expected
    /// from every peer of `in_from`; `per_peer` lists headers that differ by peer.
    pub fn with_headers(
        mut self,
        out_to: &'a [usize],
        in_from: &'a [usize],
        per_peer: &'a [(usize, Option<Header>, Option<Header>)],
    ) -> Self {
        self.hdr_out = out_to;
        self.hdr_in = in_from;
        self.per_peer = per_peer;
        self
    }
}

impl OpRun<'_> {
    fn conn(&mut self, peer: usize) -> Result<&mut Connection> {
        self.conns
            .get_mut(peer)
            .and_then(Option::as_mut)
            .ok_or_else(|| Error::Transport(format!("internal: no connection to rank {peer}")))
    }

    /// This call, for messages.
    fn desc(&self) -> String {
        self.local.describe()
    }

    /// Runs the schedule to the end.
    pub fn run(&mut self, sched: &RankSchedule, bufs: &Buffers) -> Result<()> {
        let mut states = std::mem::take(&mut self.reuse.states);
        states.clear();
        let share = self.reuse.stalls.own_share;
        let mut out = self.wire_out.encode();
        set_stall_share(&mut out, share);
        let shared = self
            .hdr_out
            .iter()
            .map(|&p| (p, Some(out), None))
            .chain(self.hdr_in.iter().map(|&p| (p, None, Some(self.wire_in))));
        let own = self.per_peer.iter().map(|&(p, o, i)| {
            let encoded = o.map(|h| {
                let mut b = h.encode();
                set_stall_share(&mut b, share);
                b
            });
            (p, encoded, i)
        });
        for (peer, out, expect) in shared.chain(own) {
            let i = match states.iter().position(|s| s.peer == peer) {
                Some(i) => i,
                None => {
                    states.push(PeerState {
                        peer,
                        out: None,
                        out_sent: 0,
                        expect: None,
                        in_done: true,
                    });
                    states.len() - 1
                }
            };
            if out.is_some() {
                states[i].out = out;
            }
            if expect.is_some() {
                states[i].expect = expect;
                states[i].in_done = false;
            }
        }
        for p in &states {
            if let Some(c) = self.conns.get_mut(p.peer).and_then(Option::as_mut) {
                c.hdr_in.clear();
            }
        }
        let mut result = Ok(());
        self.reuse.step.carried_for = None;
        for (si, step) in sched.steps.iter().enumerate() {
            result = if step.ops.iter().all(|op| op.peer().is_none()) {
                step.ops.iter().try_for_each(|op| self.local_op(op, bufs))
            } else {
                let next = if self.sent_ahead.is_some() {
                    NextStep::after(&sched.steps, si)
                } else {
                    None
                };
                self.run_ops((si, &step.ops), next, bufs, &mut states)
            };
            if result.is_err() {
                break;
            }
        }
        let headers_pending = states
            .iter()
            .any(|s| !s.in_done || s.out.is_some_and(|_| s.out_sent < HEADER_BYTES));
        if result.is_ok() && headers_pending {
            result = self.run_ops((usize::MAX, &[]), None, bufs, &mut states);
        }
        self.reuse.states = states;
        result
    }

    /// Runs step `index` (its operations `ops`), sending ahead into `next`.
    fn run_ops(
        &mut self,
        (index, ops): (usize, &[Op]),
        next: Option<NextStep>,
        bufs: &Buffers,
        states: &mut [PeerState],
    ) -> Result<()> {
        let mut ss = std::mem::take(&mut self.reuse.step);
        ss.reset(ops.len(), next.map_or(0, |n| n.ops.len()));
        let mut result = self.start_step((index, ops), bufs, &mut ss);
        if result.is_ok() {
            result = self.progress_step(ops, next, bufs, states, &mut ss);
        }
        // What went ahead counts as done when the next step starts.
        std::mem::swap(&mut ss.ahead, &mut ss.carried);
        ss.carried_for = next.map(|n| n.index);
        self.reuse.step = ss;
        result
    }

    /// Takes over what the step before sent ahead of step `index`.
    fn start_step(
        &self,
        (index, ops): (usize, &[Op]),
        bufs: &Buffers,
        ss: &mut StepState,
    ) -> Result<()> {
        if ss.carried_for == Some(index) && ss.carried.len() == ops.len() {
            for (i, op) in ops.iter().enumerate() {
                if let Op::Send { src, .. } = op {
                    let len = bufs.span(src, self.dtype.size())?.1;
                    ss.done[i] = ss.carried[i];
                    ss.finished[i] = ss.done[i] == len;
                }
            }
        }
        Ok(())
    }

    fn progress_step(
        &mut self,
        ops: &[Op],
        next: Option<NextStep>,
        bufs: &Buffers,
        states: &mut [PeerState],
        ss: &mut StepState,
    ) -> Result<()> {
        let es = self.dtype.size();
        let StepState {
            done,
            finished,
            waits,
            busy_send,
            busy_recv,
            ahead,
            ahead_blocked,
            ..
        } = ss;
        // Local operations first: they never wait.
        for (i, op) in ops.iter().enumerate() {
            if op.peer().is_none() {
                self.local_op(op, bufs)?;
                finished[i] = true;
            }
        }
        let mut idle = 0u32;
        loop {
            let mut progressed = false;
            waits.clear();
            // Headers out; a small first message to the same peer rides along.
            for st in states.iter_mut() {
                if let Some(h) = st.out {
                    if st.out_sent == 0
                        && let Some(n) =
                            self.send_header_with_data(&h, st.peer, ops, done, finished, bufs)?
                    {
                        st.out_sent = n;
                        progressed |= n > 0;
                        if n < HEADER_BYTES {
                            waits.push((st.peer, Direction::Send));
                        }
                        continue;
                    }
                    if st.out_sent < HEADER_BYTES {
                        let peer = st.peer;
                        let n = self
                            .conn(peer)?
                            .data
                            .send_some(&h[st.out_sent..])
                            .map_err(|e| self.io_err(peer, e))?;
                        st.out_sent += n;
                        progressed |= n > 0;
                        if st.out_sent < HEADER_BYTES {
                            waits.push((peer, Direction::Send));
                        }
                    }
                }
            }
            busy_send.clear();
            busy_recv.clear();
            let mut all_done = true;
            for (i, op) in ops.iter().enumerate() {
                if finished[i] {
                    continue;
                }
                all_done = false;
                match op {
                    Op::Send { peer, src } => {
                        let peer = *peer;
                        if busy_send.contains(&peer) {
                            continue;
                        }
                        busy_send.push(peer);
                        let st = states.iter().find(|s| s.peer == peer);
                        if st.is_some_and(|s| s.out.is_some() && s.out_sent < HEADER_BYTES) {
                            continue;
                        }
                        let (p, len) = bufs.span(src, es)?;
                        // SAFETY: bounds-checked span that no operation of this step writes.
                        let data =
                            unsafe { std::slice::from_raw_parts(p.add(done[i]), len - done[i]) };
                        let n = self
                            .conn(peer)?
                            .data
                            .send_some(data)
                            .map_err(|e| self.io_err(peer, e))?;
                        done[i] += n;
                        progressed |= n > 0;
                        if done[i] == len {
                            finished[i] = true;
                        } else {
                            waits.push((peer, Direction::Send));
                        }
                    }
                    Op::Recv { peer, .. } | Op::RecvReduce { peer, .. } => {
                        let peer = *peer;
                        if busy_recv.contains(&peer) {
                            continue;
                        }
                        busy_recv.push(peer);
                        if let Some(si) = states.iter().position(|s| s.peer == peer && !s.in_done) {
                            progressed |= self.read_header(&mut states[si])?;
                            if !states[si].in_done {
                                waits.push((peer, Direction::Recv));
                                continue;
                            }
                        }
                        let n = self.recv_data(op, done[i], bufs)?;
                        done[i] += n;
                        progressed |= n > 0;
                        if done[i] == op.elems_received() * es {
                            finished[i] = true;
                        } else {
                            waits.push((peer, Direction::Recv));
                        }
                    }
                    // Local operations were finished before the loop.
                    Op::Copy { .. } | Op::Reduce { .. } | Op::Finalize { .. } => {}
                }
            }
            if let Some(next) = &next {
                // Not counted as progress: a rank whose own step waits should sleep rather
                // than keep its core trickling bytes ahead while the peer it waits for, which
                // may share that core, cannot run.
                self.send_ahead(
                    ops,
                    done,
                    finished,
                    next,
                    ahead,
                    ahead_blocked,
                    states,
                    bufs,
                )?;
            }
            if ops.is_empty() {
                // End of the operation: the remaining headers from peers we only exchanged
                // headers with.
                for st in states.iter_mut().filter(|s| !s.in_done) {
                    progressed |= self.read_header(st)?;
                    if !st.in_done {
                        waits.push((st.peer, Direction::Recv));
                    }
                }
            }
            if all_done && waits.is_empty() {
                self.reuse.step_done();
                return Ok(());
            }
            self.end_round(progressed, &mut idle, waits)?;
        }
    }

    /// Runs a copy, a local reduction or a finalize (which only `avg` needs).
    fn local_op(&self, op: &Op, bufs: &Buffers) -> Result<()> {
        let es = self.dtype.size();
        match op {
            Op::Reduce { src, with, dst } => {
                let (a, n) = bufs.span(src, es)?;
                let (b, _) = bufs.span(with, es)?;
                let (d, _) = bufs.span(dst, es)?;
                // SAFETY: bounds-checked spans of equal length; the schedule makes `dst` either
                // `src` or disjoint from it, and `with` disjoint from `dst` (the simulator
                // checks every schedule for that), so only one mutable slice covers `dst`.
                unsafe {
                    let b = std::slice::from_raw_parts(b, n);
                    let out = std::slice::from_raw_parts_mut(d, n);
                    if std::ptr::eq(a, d) {
                        reduce::reduce_in_place(self.dtype, self.combine, out, b);
                    } else {
                        reduce::reduce_into(
                            self.dtype,
                            self.combine,
                            out,
                            std::slice::from_raw_parts(a, n),
                            b,
                        );
                    }
                }
            }
            Op::Copy { src, dst } => {
                let (s, n) = bufs.span(src, es)?;
                let (d, _) = bufs.span(dst, es)?;
                if s != d {
                    // SAFETY: both spans were bounds-checked; `copy_overlapping` handles
                    // overlap.
                    unsafe { crate::copy::copy_overlapping(s, d, n) };
                }
            }
            Op::Finalize { region } => {
                if let Some(n) = self.divide_by {
                    let (p, len) = bufs.span(region, es)?;
                    // SAFETY: bounds-checked span of the output or scratch buffer, which no
                    // other operation of this step touches.
                    reduce::divide(
                        self.dtype,
                        unsafe { std::slice::from_raw_parts_mut(p, len) },
                        n,
                    );
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// Sends the header together with the first message of this step to `peer`, when that
    /// message is small and not started. Returns header bytes sent, or `None` when there is
    /// nothing to combine.
    fn send_header_with_data(
        &mut self,
        h: &[u8; HEADER_BYTES],
        peer: usize,
        ops: &[Op],
        done: &mut [usize],
        finished: &mut [bool],
        bufs: &Buffers,
    ) -> Result<Option<usize>> {
        let Some(i) = ops
            .iter()
            .position(|op| matches!(op, Op::Send { peer: q, .. } if *q == peer))
        else {
            return Ok(None);
        };
        let Op::Send { src, .. } = &ops[i] else {
            return Ok(None);
        };
        let (p, len) = bufs.span(src, self.dtype.size())?;
        if finished[i] || done[i] != 0 || len > COALESCE_MAX {
            return Ok(None);
        }
        let mut msg = std::mem::take(&mut self.reuse.coalesce);
        msg.clear();
        msg.extend_from_slice(h);
        // SAFETY: bounds-checked span that no operation of this step writes.
        msg.extend_from_slice(unsafe { std::slice::from_raw_parts(p, len) });
        let sent = self.conn(peer)?.data.send_some(&msg);
        self.reuse.coalesce = msg;
        let n = sent.map_err(|e| self.io_err(peer, e))?;
        if n > HEADER_BYTES {
            done[i] = n - HEADER_BYTES;
            finished[i] = done[i] == len;
        }
        Ok(Some(n.min(HEADER_BYTES)))
    }

    fn io_err(&self, peer: usize, e: std::io::Error) -> Error {
        self.peer_failed(peer, format!("connection lost during {}: {e}", self.desc()))
    }

    fn peer_failed(&self, peer: usize, reason: String) -> Error {
        let (host, pid) = self
            .peers
            .get(peer)
            .map(|p| (p.host.hostname.clone(), p.pid))
            .unwrap_or_default();
        Error::PeerFailed {
            rank: peer,
            host,
            pid,
            reason,
        }
    }

    /// Reads (part of) the header from `st.peer`; returns whether bytes arrived.
    fn read_header(&mut self, st: &mut PeerState) -> Result<bool> {
        let peer = st.peer;
        let conn = self.conn(peer)?;
        let have = conn.hdr_in.len();
        let mut buf = [0u8; HEADER_BYTES];
        let n = conn
            .data
            .recv_into(&mut buf[..HEADER_BYTES - have])
            .map_err(|e| self.io_err(peer, e))?;
        let conn = self.conn(peer)?;
        conn.hdr_in.extend_from_slice(&buf[..n]);
        if conn.hdr_in.len() < HEADER_BYTES {
            return Ok(n > 0);
        }
        let got = Header::decode(&conn.hdr_in);
        let mut whole = [0u8; HEADER_BYTES];
        whole.copy_from_slice(&conn.hdr_in);
        conn.hdr_in.clear();
        st.in_done = true;
        self.reuse.note_stall_share(peer, stall_share_of(&whole));
        let expect = st
            .expect
            .ok_or_else(|| Error::Transport("internal: header without expectation".into()))?;
        self.check_header(peer, got, expect)?;
        Ok(true)
    }

    /// The error for a header from `peer` that is not the one expected.
    fn check_header(&self, peer: usize, got: Option<Header>, expect: Header) -> Result<()> {
        if got == Some(expect) {
            return Ok(());
        }
        let who = self
            .peers
            .get(peer)
            .map(PeerInfo::describe)
            .unwrap_or_default();
        match got {
            Some(h) => Err(Error::Mismatch(format!(
                "rank {} called {}; rank {peer} ({who}) called {}",
                self.rank,
                expect.describe(),
                h.describe()
            ))),
            None => Err(Error::Mismatch(format!(
                "rank {} in {} received a malformed operation header from rank {peer} ({who}): the byte streams are out of step",
                self.rank,
                expect.describe()
            ))),
        }
    }

    fn recv_data(&mut self, op: &Op, done: usize, bufs: &Buffers) -> Result<usize> {
        let es = self.dtype.size();
        let (dtype, combine) = (self.dtype, self.combine);
        match op {
            Op::Recv { peer, dst } => {
                let (d, len) = bufs.span(dst, es)?;
                // SAFETY: bounds-checked span that only this operation touches in this step.
                let dst = unsafe { std::slice::from_raw_parts_mut(d.add(done), len - done) };
                let peer = *peer;
                self.conn(peer)?
                    .data
                    .recv_into(dst)
                    .map_err(|e| self.io_err(peer, e))
            }
            Op::RecvReduce { peer, src, dst } => {
                let (s, len) = bufs.span(src, es)?;
                let (d, dlen) = bufs.span(dst, es)?;
                if dlen != len
                    || (s != d
                        && (s as usize) < d as usize + len
                        && (d as usize) < s as usize + len)
                {
                    return Err(Error::Transport(
                        "internal: reduce operands overlap partially".into(),
                    ));
                }
                let mut pos = done;
                let peer = *peer;
                let n = self
                    .conn(peer)?
                    .data
                    .recv_some(len - done, es, &mut |incoming| {
                        let k = incoming.len();
                        // SAFETY: [pos, pos+k) lies inside both bounds-checked spans; when the
                        // spans are the same memory only one mutable slice is made.
                        unsafe {
                            let out = std::slice::from_raw_parts_mut(d.add(pos), k);
                            if s == d {
                                reduce::reduce_in_place(dtype, combine, out, incoming);
                            } else {
                                let a = std::slice::from_raw_parts(s.add(pos), k);
                                reduce::reduce_into(dtype, combine, out, a, incoming);
                            }
                        }
                        pos += k;
                    })
                    .map_err(|e| self.io_err(peer, e))?;
                Ok(n)
            }
            _ => Ok(0),
        }
    }
}

/// Names the ranks an error blames, for logs.
pub(crate) fn blamed(e: &Error) -> String {
    match e {
        Error::Timeout { waiting_on, .. } => RankList(waiting_on).to_string(),
        Error::PeerFailed { rank, .. } => format!("rank {rank}"),
        _ => String::new(),
    }
}
