//! The RDMA protocol, the same over every provider (as NCCL's `net_ib` and aws-ofi-nccl do it):
//!
//! * each direction of a connection has `slots` receive slots of `slot_size` bytes in the
//!   receiver's registered memory;
//! * the receiver grants a slot by writing a clear-to-send entry (the slot's address, key, size,
//!   index and sequence number) into a ring in the sender's registered memory, with an RDMA write
//!   carrying immediate data, so the grant is also a completion at the sender;
//! * the sender copies data into its own registered staging slot and RDMA-writes it into the
//!   granted slot, with the slot and the length as immediate data;
//! * the receiver hands the slot's bytes to the executor in order and grants the slot again for
//!   the sequence number `slots` later. Grants are credits: nothing is written that the receiver
//!   has not granted;
//! * slot `i` travels on lane `i mod lanes`, so a large message is spread over every queue pair or
//!   endpoint of the connection.
//!
//! The accepting side grants nothing until something has arrived from the connecting side, so
//! no grant is ever written to a queue pair that is not yet ready to receive. Every wait is the
//! executor's (bounded by the operation's deadline and the abort flag); a completion error fails
//! the connection with the provider's words, the device and the lane.

use super::{Armed, Completion, Fabric, Link, ProviderKind, RdmaConfig, Region, Write};
use crate::transport::{Direction, Transport, Wait, whole_elements};
use serde::{Deserialize, Serialize};
use std::io;
use std::sync::Arc;
use std::time::Duration;

/// Bytes of one clear-to-send entry.
const CTS_BYTES: usize = 32;
/// Immediate data: a grant (else data).
const IMM_CTS: u32 = 1 << 31;
/// Work-request id: a grant's write (else a data write); the low bits are the slot.
const WR_CTS: u64 = 1 << 32;
/// How long to sleep between polls when the provider has no descriptor to sleep on.
const POLL_SLEEP: Duration = Duration::from_micros(50);

/// A clear-to-send entry, as it lies in the sender's ring.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Grant {
    addr: u64,
    rkey: u64,
    size: u32,
    slot: u32,
    seq: u32,
    _pad: u32,
}

/// What each side tells the other when the connection is set up (through the authenticated
/// bootstrap connection).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct RdmaSetup {
    /// The provider both sides use.
    pub provider: ProviderKind,
    /// The sender's device, for messages.
    pub device: String,
    /// Lanes, slots and slot size (the connecting side's choice; the other adopts it).
    pub lanes: usize,
    /// Slots per direction.
    pub slots: usize,
    /// Bytes per slot.
    pub slot_size: usize,
    /// The provider's addresses of the lanes.
    pub address: Vec<u8>,
    /// Where grants for this side go (its clear-to-send ring), as the peer names it.
    pub cts_addr: u64,
    /// The ring's key.
    pub cts_key: u64,
}

/// Anonymous page-aligned memory that is registered for the life of the connection.
struct Buffer {
    ptr: *mut u8,
    len: usize,
}

impl Buffer {
    fn new(len: usize) -> io::Result<Self> {
        // SAFETY: an anonymous private mapping; checked below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Self {
            ptr: p as *mut u8,
            len,
        })
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        super::regcache::invalidate(self.ptr, self.len);
        // SAFETY: mapped in new with this length.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
    }
}

/// A buffer and its registration.
struct Registered {
    buf: Buffer,
    region: Region,
}

impl Registered {
    fn new(fabric: &dyn Fabric, len: usize) -> io::Result<Self> {
        let buf = Buffer::new(len)?;
        let region = fabric.register(buf.ptr, len)?;
        Ok(Self { buf, region })
    }

    /// The address of byte `off`, as this process sees it.
    fn at(&self, off: usize) -> u64 {
        self.buf.ptr as u64 + off as u64
    }

    /// The address of byte `off`, as a peer names it in a write.
    fn remote_at(&self, off: usize) -> u64 {
        self.region.remote_base + off as u64
    }
}

/// One RDMA connection's data path.
pub(crate) struct RdmaTransport {
    name: &'static str,
    fabric: Arc<dyn Fabric>,
    link: Option<Box<dyn Link>>,
    lanes: usize,
    slots: usize,
    slot_size: usize,
    /// Send-queue depth per lane.
    depth: usize,
    /// Receive slots the peer writes data into.
    rx: Registered,
    /// The clear-to-send ring the peer writes grants into.
    cts_in: Registered,
    /// Staging for outgoing data.
    tx: Registered,
    /// Staging for outgoing grants.
    cts_out: Registered,
    /// The peer's clear-to-send ring.
    peer_cts: (u64, u64),
    /// Bytes landed in each receive slot, not yet consumed.
    rx_len: Vec<Option<usize>>,
    rx_seq: u32,
    rx_offset: usize,
    tx_seq: u32,
    tx_grant: Vec<Option<Grant>>,
    tx_busy: Vec<bool>,
    /// Writes posted and not yet complete, per lane.
    outstanding: Vec<usize>,
    /// Grants waiting for room on their lane: (slot, seq).
    pending_grants: std::collections::VecDeque<(usize, u32)>,
    /// Whether this side may grant (the connecting side at once, the other after the first
    /// arrival).
    started: bool,
    error: Option<(io::ErrorKind, String)>,
    scratch: Vec<Completion>,
}

// SAFETY: the raw pointers are to memory this transport owns; it is used by one thread at a time.
unsafe impl Send for RdmaTransport {}

impl RdmaTransport {
    /// A transport on `fabric` with `cfg`'s geometry (or the peer's, when accepting), not yet
    /// connected.
    pub fn new(
        fabric: Arc<dyn Fabric>,
        lanes: usize,
        slots: usize,
        slot_size: usize,
    ) -> io::Result<Self> {
        if !(1..=16).contains(&lanes)
            || !(2..=128).contains(&slots)
            || slot_size == 0
            || slot_size > 8 << 20
            || !slot_size.is_multiple_of(4096)
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("bad RDMA geometry: {lanes} lanes, {slots} slots of {slot_size} bytes"),
            ));
        }
        let depth = 4 * slots + 4;
        let link = fabric.link(lanes, depth)?;
        let f = fabric.as_ref();
        Ok(Self {
            name: fabric.kind().name(),
            link: Some(link),
            lanes,
            slots,
            slot_size,
            depth,
            rx: Registered::new(f, slots * slot_size)?,
            cts_in: Registered::new(f, slots * CTS_BYTES)?,
            tx: Registered::new(f, slots * slot_size)?,
            cts_out: Registered::new(f, slots * CTS_BYTES)?,
            peer_cts: (0, 0),
            rx_len: vec![None; slots],
            rx_seq: 0,
            rx_offset: 0,
            tx_seq: 0,
            tx_grant: vec![None; slots],
            tx_busy: vec![false; slots],
            outstanding: vec![0; lanes],
            pending_grants: Default::default(),
            started: false,
            error: None,
            scratch: Vec::new(),
            fabric,
        })
    }

    /// A transport with the geometry `cfg` asks for.
    pub fn from_config(fabric: Arc<dyn Fabric>, cfg: &RdmaConfig) -> io::Result<Self> {
        Self::new(fabric, cfg.lanes, cfg.slots, cfg.slot_size)
    }

    /// The accepting side of a connection: a transport with the connecting side's geometry,
    /// connected to it, so it can receive before the reply goes back.
    pub fn accept(theirs: &RdmaSetup, cfg: &RdmaConfig) -> Result<Self, String> {
        let fabric = super::open(theirs.provider, cfg)?;
        let mut t = Self::new(fabric, theirs.lanes, theirs.slots, theirs.slot_size)
            .map_err(|e| e.to_string())?;
        t.connect(theirs, false).map_err(|e| e.to_string())?;
        Ok(t)
    }

    /// What the peer needs to know about this side.
    pub fn setup(&self) -> RdmaSetup {
        RdmaSetup {
            provider: self.fabric.kind(),
            device: self.fabric.device().to_string(),
            lanes: self.lanes,
            slots: self.slots,
            slot_size: self.slot_size,
            address: self.link.as_ref().map(|l| l.address()).unwrap_or_default(),
            cts_addr: self.cts_in.remote_at(0),
            cts_key: self.cts_in.region.rkey,
        }
    }

    /// Connects to the peer described by `remote` and posts the receives. The connecting side
    /// (`grant_now`) grants its slots at once; the accepting side waits for the first arrival.
    pub fn connect(&mut self, remote: &RdmaSetup, grant_now: bool) -> io::Result<()> {
        if remote.provider != self.fabric.kind()
            || remote.lanes != self.lanes
            || remote.slots != self.slots
            || remote.slot_size != self.slot_size
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "RDMA setup mismatch: this side {} with {} lanes and {} slots of {} bytes, \
                     the peer {} with {} lanes and {} slots of {} bytes",
                    self.name,
                    self.lanes,
                    self.slots,
                    self.slot_size,
                    remote.provider.name(),
                    remote.lanes,
                    remote.slots,
                    remote.slot_size
                ),
            ));
        }
        self.peer_cts = (remote.cts_addr, remote.cts_key);
        let lanes = self.lanes;
        let per_lane = 2 * self.slots.div_ceil(lanes) + 2;
        let link = self.link_mut()?;
        link.connect(&remote.address)?;
        for lane in 0..lanes {
            for _ in 0..per_lane {
                link.post_recv(lane)?;
            }
        }
        if grant_now {
            self.start()?;
        }
        Ok(())
    }

    fn link_mut(&mut self) -> io::Result<&mut Box<dyn Link>> {
        self.link
            .as_mut()
            .ok_or_else(|| io::Error::other("RDMA connection closed"))
    }

    /// Starts granting: every slot, for the first `slots` sequence numbers.
    fn start(&mut self) -> io::Result<()> {
        self.started = true;
        for slot in 0..self.slots {
            self.pending_grants.push_back((slot, slot as u32));
        }
        self.flush_grants()
    }

    fn lane_of(&self, slot: usize) -> usize {
        slot % self.lanes
    }

    /// Writes the grants whose lanes have room.
    fn flush_grants(&mut self) -> io::Result<()> {
        while let Some(&(slot, seq)) = self.pending_grants.front() {
            let lane = self.lane_of(slot);
            if self.outstanding[lane] >= self.depth {
                break;
            }
            let grant = Grant {
                addr: self.rx.remote_at(slot * self.slot_size),
                rkey: self.rx.region.rkey,
                size: self.slot_size as u32,
                slot: slot as u32,
                seq,
                _pad: 0,
            };
            let off = slot * CTS_BYTES;
            // SAFETY: the entry lies inside cts_out; the previous grant of this slot has been
            // read by the peer (it has since written data into the slot).
            unsafe { std::ptr::write_volatile(self.cts_out.at(off) as *mut Grant, grant) };
            let w = Write {
                lane,
                region: self.cts_out.region,
                src: self.cts_out.at(off),
                len: CTS_BYTES,
                dst: self.peer_cts.0 + off as u64,
                rkey: self.peer_cts.1,
                imm: IMM_CTS | ((slot as u32) << 24) | (seq & 0xff_ffff),
                wr_id: WR_CTS | slot as u64,
            };
            let posted = self.link_mut()?.write(&w)?;
            if !posted {
                break;
            }
            self.pending_grants.pop_front();
            self.outstanding[lane] += 1;
        }
        Ok(())
    }

    fn fail(&mut self, e: io::Error) -> io::Error {
        let kind = e.kind();
        let text = format!("{} {}: {e}", self.name, self.fabric.device());
        self.error = Some((kind, text.clone()));
        io::Error::new(kind, text)
    }

    fn check(&self) -> io::Result<()> {
        match &self.error {
            Some((k, t)) => Err(io::Error::new(*k, t.clone())),
            None => Ok(()),
        }
    }

    /// Reaps completions: frees send slots, records landed data and arrived grants, re-posts
    /// receives and sends the grants that waited for room. The completions a poll returned
    /// before an error completion are handled before the error is: data that landed before the
    /// peer went away is still delivered ([`Transport::recv_some`]).
    fn progress(&mut self) -> io::Result<()> {
        self.check()?;
        let mut done = std::mem::take(&mut self.scratch);
        done.clear();
        let polled = self.link_mut()?.poll(&mut done);
        let handled = done.iter().try_for_each(|c| self.handle(*c));
        self.scratch = done;
        if let Err(e) = polled {
            return Err(self.fail(e));
        }
        handled.and_then(|_| self.flush_grants()).map_err(|e| {
            if self.error.is_some() {
                e
            } else {
                self.fail(e)
            }
        })
    }

    fn handle(&mut self, c: Completion) -> io::Result<()> {
        match c {
            Completion::Sent { wr_id } => {
                let slot = (wr_id & 0xffff_ffff) as usize;
                if slot >= self.slots {
                    return Err(io::Error::other(format!(
                        "completion for unknown slot {slot}"
                    )));
                }
                let lane = self.lane_of(slot);
                self.outstanding[lane] = self.outstanding[lane].saturating_sub(1);
                if wr_id & WR_CTS == 0 {
                    self.tx_busy[slot] = false;
                }
            }
            Completion::Arrived { imm } => {
                let slot = ((imm >> 24) & 0x7f) as usize;
                if slot >= self.slots {
                    return Err(protocol(format!(
                        "the peer wrote to slot {slot} of {}",
                        self.slots
                    )));
                }
                let lane = self.lane_of(slot);
                if imm & IMM_CTS != 0 {
                    // SAFETY: the entry lies inside cts_in; the peer's write of it is complete
                    // (its immediate data arrived after it).
                    let g = unsafe {
                        std::ptr::read_volatile(self.cts_in.at(slot * CTS_BYTES) as *const Grant)
                    };
                    if g.slot as usize != slot
                        || g.seq & 0xff_ffff != imm & 0xff_ffff
                        || g.size == 0
                        || self.tx_grant[slot].is_some()
                    {
                        return Err(protocol(format!(
                            "a malformed grant for slot {slot}: {g:?}"
                        )));
                    }
                    self.tx_grant[slot] = Some(g);
                } else {
                    let len = (imm & 0xff_ffff) as usize;
                    if len > self.slot_size || self.rx_len[slot].is_some() {
                        return Err(protocol(format!(
                            "{len} bytes into slot {slot}, which is not free"
                        )));
                    }
                    self.rx_len[slot] = Some(len);
                }
                // Recorded first: a receive that cannot be re-posted (the peer has gone) fails
                // the connection, but what already landed is still delivered.
                self.link_mut()?.post_recv(lane)?;
                if !self.started {
                    self.start()?;
                }
            }
        }
        Ok(())
    }
}

fn protocol(what: String) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("RDMA protocol error: {what}"),
    )
}

impl Transport for RdmaTransport {
    fn name(&self) -> &'static str {
        self.name
    }

    fn send_some(&mut self, data: &[u8]) -> io::Result<usize> {
        self.progress()?;
        let mut sent = 0;
        while sent < data.len() {
            let slot = self.tx_seq as usize % self.slots;
            let lane = self.lane_of(slot);
            let Some(g) = self.tx_grant[slot] else { break };
            if self.tx_busy[slot] || self.outstanding[lane] >= self.depth {
                break;
            }
            if g.seq != self.tx_seq {
                let e = protocol(format!(
                    "grant {} for slot {slot}, expected {}",
                    g.seq, self.tx_seq
                ));
                return Err(self.fail(e));
            }
            let n = self.slot_size.min(g.size as usize).min(data.len() - sent);
            let off = slot * self.slot_size;
            // SAFETY: the staging slot is not being sent (tx_busy is false) and holds n bytes.
            unsafe {
                crate::copy::copy_nonoverlapping(
                    data.as_ptr().add(sent),
                    self.tx.at(off) as *mut u8,
                    n,
                )
            };
            let w = Write {
                lane,
                region: self.tx.region,
                src: self.tx.at(off),
                len: n,
                dst: g.addr,
                rkey: g.rkey,
                imm: ((slot as u32) << 24) | n as u32,
                wr_id: slot as u64,
            };
            let posted = self.link_mut()?.write(&w);
            match posted {
                Ok(true) => {}
                Ok(false) => break,
                Err(e) => return Err(self.fail(e)),
            }
            self.outstanding[lane] += 1;
            self.tx_busy[slot] = true;
            self.tx_grant[slot] = None;
            self.tx_seq = self.tx_seq.wrapping_add(1);
            sent += n;
        }
        Ok(sent)
    }

    fn recv_some(
        &mut self,
        max: usize,
        granule: usize,
        f: &mut dyn FnMut(&[u8]),
    ) -> io::Result<usize> {
        // Bytes that landed before the connection failed (a peer that sent its last message
        // and exited) are delivered first; the failure is reported once none are left.
        let progressed = self.progress();
        let mut consumed = 0;
        while consumed < max {
            let slot = self.rx_seq as usize % self.slots;
            let Some(len) = self.rx_len[slot] else { break };
            let take = whole_elements(len - self.rx_offset, max - consumed, granule, consumed)?;
            if take == 0 {
                break;
            }
            let at = self.rx.at(slot * self.slot_size + self.rx_offset);
            // SAFETY: the slot's first `len` bytes were written by the peer and are not
            // granted again until consumed.
            f(unsafe { std::slice::from_raw_parts(at as *const u8, take) });
            consumed += take;
            self.rx_offset += take;
            if self.rx_offset == len {
                self.rx_offset = 0;
                self.rx_len[slot] = None;
                let next = self.rx_seq.wrapping_add(self.slots as u32);
                self.rx_seq = self.rx_seq.wrapping_add(1);
                self.pending_grants.push_back((slot, next));
            }
        }
        if let Err(e) = progressed {
            return if consumed > 0 { Ok(consumed) } else { Err(e) };
        }
        if let Err(e) = self.flush_grants() {
            let e = self.fail(e);
            return if consumed > 0 { Ok(consumed) } else { Err(e) };
        }
        Ok(consumed)
    }

    fn peek(&mut self, dst: &mut [u8]) -> io::Result<usize> {
        // As in recv_some: what landed before a failure is still there to look at.
        let progressed = self.progress();
        let (mut seq, mut offset, mut done) = (self.rx_seq, self.rx_offset, 0);
        while done < dst.len() {
            let slot = seq as usize % self.slots;
            let Some(len) = self.rx_len[slot] else { break };
            let take = (len - offset).min(dst.len() - done);
            let at = self.rx.at(slot * self.slot_size + offset);
            // SAFETY: the slot's first `len` bytes were written by the peer and are not granted
            // again until consumed, which peeking never does.
            crate::copy::copy(&mut dst[done..done + take], unsafe {
                std::slice::from_raw_parts(at as *const u8, take)
            });
            done += take;
            offset = 0;
            seq = seq.wrapping_add(1);
            if seq.wrapping_sub(self.rx_seq) as usize >= self.slots {
                break;
            }
        }
        match progressed {
            Err(e) if done == 0 => Err(e),
            _ => Ok(done),
        }
    }

    fn wait_for(&mut self, dir: Direction) -> Wait {
        let ready = match dir {
            Direction::Recv => self.rx_len[self.rx_seq as usize % self.slots].is_some(),
            Direction::Send => {
                let slot = self.tx_seq as usize % self.slots;
                self.tx_grant[slot].is_some() && !self.tx_busy[slot]
            }
        };
        if ready || self.error.is_some() {
            return Wait::Within(Duration::ZERO);
        }
        self.arm()
    }

    fn sending(&mut self) -> io::Result<bool> {
        self.progress()?;
        Ok(self.tx_busy.iter().any(|&b| b))
    }

    fn background(&mut self) -> io::Result<Option<Wait>> {
        // A failure is reported here even with bytes still to deliver: the call may not read
        // this connection again before its deadline (a failed write of this rank's own leaves
        // its peer waiting), and deferring it would hang every rank until then.
        self.progress()?;
        Ok(Some(self.arm()))
    }
}

impl RdmaTransport {
    /// Arms the completion queue and says what to sleep on until the next completion.
    fn arm(&mut self) -> Wait {
        match self.link.as_mut().map(|l| l.arm()) {
            Some(Ok(Armed::Sleep(fd))) => Wait::Fd {
                fd,
                events: libc::POLLIN,
            },
            Some(Ok(Armed::Poll)) => Wait::Within(POLL_SLEEP),
            Some(Ok(Armed::Busy)) => Wait::Within(Duration::ZERO),
            Some(Err(e)) => {
                let _ = self.fail(e);
                Wait::Within(Duration::ZERO)
            }
            None => Wait::Within(Duration::ZERO),
        }
    }
}

impl Drop for RdmaTransport {
    fn drop(&mut self) {
        // The lanes go first, so nothing writes into the regions once they are released.
        self.link = None;
        for r in [&self.rx, &self.cts_in, &self.tx, &self.cts_out] {
            self.fabric.deregister(&r.region);
        }
    }
}
