//! Stream programs: a call on device buffers among the ranks of one host, compiled from the
//! very schedule the host path runs and enqueued on the caller's stream in one go, so that
//! after enqueue no host thread, host barrier or host collective takes part in it.
//!
//! Each rank owns one device buffer, mapped by every peer through CUDA IPC at bind: a flag
//! area and, for each peer, a ring of [`Slots::count`] receive slots of [`Slots::bytes`] each.
//! Data from rank `q` to rank `r` travels in pieces of at most one slot, numbered per ordered
//! pair across the communicator's life:
//!
//! * the sender waits until its *credit* word for `r` (in its own memory, written by `r`)
//!   says that piece `n − count` has been consumed, copies the piece into `r`'s slot
//!   `n mod count` with a copy-engine copy (`cuMemcpyDtoDAsync` into the peer's mapping), and
//!   writes `n + 1` into `r`'s *filled* word for `q` (`cuStreamWriteValue32`, remote);
//! * the receiver waits until its *filled* word for `q` reaches `n + 1`
//!   (`cuStreamWaitValue32`), copies the slot into place or reduces it into place with
//!   strata's kernels, and writes `n + 1` into `q`'s credit word for `r`.
//!
//! The operations of one step may progress at the same time (the schedule's rule), so a step
//! forks into lanes, one stream each: the sends to one peer, the receives from one peer, and
//! the local work. Lanes join before the next step. Every call of the communicator starts
//! after its previous one, whatever stream that was on. Compiled programs are cached per call
//! shape; a call patches only the pair counters and the buffer addresses.

use crate::comm::{CallSpec, Communicator};
use crate::dtype::{DataType, ReduceOp};
use crate::error::{Error, Result};
use crate::gpu::driver::call;
use crate::gpu::kernels::Kernels;
use crate::gpu::stream::MemOps;
use crate::gpu::{DeviceBuffer, Event, Stream};
use crate::reduce::{self, Combine};
use crate::wire::HEADER_BYTES;

mod bind;
mod compile;
mod kernel;
mod layout;
mod net;
mod watch;

pub use kernel::{KernelChoice, KernelTiming};

use compile::{Arith, Compiled, Instr, Loc, compile, compile_transfers};
use cudarc::driver::sys;
use layout::Layout;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use strata_algorithms::schedule::Buf;
use strata_algorithms::{Algorithm, Collective};
use watch::{CallName, InFlight, Watch};

/// Receive slots per ordered pair (`STRATA_GPU_SLOTS`, default 4, 2 to 64).
const DEFAULT_SLOTS: usize = 4;

/// One transfer of a point-to-point batch on device memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceTransfer {
    /// The other rank.
    pub peer: usize,
    /// The buffer's device address.
    pub ptr: u64,
    /// Bytes.
    pub bytes: usize,
    /// A send (else a receive).
    pub send: bool,
}

/// The geometry of the receive rings.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Slots {
    /// Slots per ordered pair.
    pub count: usize,
    /// Bytes per slot.
    pub bytes: usize,
}

impl Slots {
    /// From `STRATA_GPU_SLOTS` and the chunk size (`STRATA_GPU_CHUNK`).
    pub fn from_env(chunk: usize) -> Result<Self> {
        let count = match std::env::var("STRATA_GPU_SLOTS") {
            Err(_) => DEFAULT_SLOTS,
            Ok(v) => v
                .trim()
                .parse::<usize>()
                .ok()
                .filter(|n| (2..=64).contains(n))
                .ok_or_else(|| {
                    Error::InvalidArgument(format!("STRATA_GPU_SLOTS={v}: want 2 to 64"))
                })?,
        };
        // Whole 8-byte elements in every slot, whatever the type.
        let bytes = (chunk / 8).max(1) * 8;
        Ok(Self { count, bytes })
    }
}

/// What a call's program needs that changes from call to call.
struct Bases {
    input: u64,
    output: u64,
    scratch: u64,
}

/// The stream-program path of one communicator, set up at bind.
pub(crate) struct Programs {
    device: i32,
    kernels: Kernels,
    /// Where flags and slots live in every rank's program buffer.
    layout: Layout,
    /// The GPUDirect side, when some rank is on another host (dropped before `own`, whose
    /// registration it holds).
    net: Option<net::Net>,
    /// This rank's flags and receive rings (the peers map it).
    own: DeviceBuffer,
    /// Every rank's buffer as this process addresses it (this rank's own included).
    bases: Vec<u64>,
    /// The peers' buffers opened here, closed on drop.
    opened: Vec<u64>,
    /// Which ranks are on another host (reached by GPUDirect RDMA through `net`).
    remote: Vec<bool>,
    rank: usize,
    state: Mutex<ProgramState>,
    /// The low-latency kernels' side (none where they are off or cannot serve).
    ll: Option<kernel::Ll>,
    /// Whether the driver takes stream memory operations in batches.
    batch: bool,
    /// Calls in flight, and the monitor that releases them after a fault or a timeout.
    watch: Arc<Watch>,
    monitor: Mutex<Option<std::thread::JoinHandle<()>>>,
}

// SAFETY: the raw device addresses are plain numbers; the state is behind a mutex.
unsafe impl Send for Programs {}
// SAFETY: as above.
unsafe impl Sync for Programs {}

struct ProgramState {
    /// Pieces sent to and received from each rank so far.
    sent: Vec<u64>,
    received: Vec<u64>,
    cache: HashMap<ProgramKey, Arc<Compiled>>,
    /// One stream per lane, made as needed.
    lanes: Vec<Stream>,
    /// Recorded where a step forks (one) and where each lane joins.
    fork: Event,
    joins: Vec<Event>,
    /// Recorded at the end of every call: the next one starts after it.
    last: Event,
    /// Kernel calls enqueued so far (their call numbers follow it).
    kernel_calls: u64,
}

/// What a compiled program depends on besides the communicator.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct ProgramKey {
    collective: u8,
    dtype: &'static str,
    count: usize,
    root: usize,
    algorithm: u8,
    combine: u8,
    divide: bool,
}

/// The combine kernel's operator for a call, and whether it ends with a division.
fn arith_of(spec: &CallSpec, p: usize) -> Arith {
    let (combine, divide_by) = match spec.op {
        _ if !spec.collective.reduces() => (Combine::Sum, None),
        ReduceOp::Avg => (Combine::Sum, Some(p)),
        op => (reduce::combine_of(op), None),
    };
    Arith {
        dtype: spec.dtype,
        combine,
        divide_by,
    }
}

impl Programs {
    /// Enqueues `spec` from device address `send` to `recv` on `stream`: as one low-latency
    /// kernel where the call is small enough, else as a stream program; returns the algorithm
    /// the tuner chose (whose schedule the program runs).
    pub(crate) fn enqueue(
        &self,
        comm: &Communicator,
        spec: CallSpec,
        send: u64,
        recv: u64,
        in_bytes: usize,
        stream: &Stream,
    ) -> Result<Algorithm> {
        let (algorithm, plan, record, header) = comm.derive_device_call(spec)?;
        let result = match self.kernel_for(comm, &spec) {
            Some(variant) => {
                drop(plan);
                let (p, rank) = (comm.size(), comm.rank());
                let out_elems = spec
                    .collective
                    .buffer_elems(spec.count, p, rank, spec.root)
                    .1;
                let bytes = (in_bytes, out_elems * spec.dtype.size());
                let io = (send, recv);
                self.enqueue_kernel(
                    comm,
                    spec,
                    variant,
                    Some((record, header)),
                    io,
                    bytes,
                    stream,
                )
                .map(|_| algorithm)
            }
            None => self.enqueue_planned(
                comm,
                spec,
                algorithm,
                &plan,
                Some((record, header)),
                (send, recv),
                in_bytes,
                stream,
            ),
        };
        if let Err(e) = &result {
            comm.inner.health.device_op_finished(record, Some(e));
        }
        result
    }

    /// The name of what runs `spec` on device buffers here: a kernel's (`ll_one_shot`, ...),
    /// or `None` for the stream program of the tuner's algorithm.
    pub(crate) fn kernel_name(&self, comm: &Communicator, spec: &CallSpec) -> Option<&'static str> {
        self.kernel_for(comm, spec).map(kernel::Variant::name)
    }

    /// The crossover the kernels were given at bind, if the communicator has them.
    pub(crate) fn kernel_choice(&self) -> Option<&KernelChoice> {
        self.ll.as_ref()?.choice.get()
    }

    /// Enqueues `spec` as the stream program of `algorithm`'s schedule `plan`; `record` is its
    /// flight-recorder entry and header (none for the calls timed at bind).
    #[allow(clippy::too_many_arguments)]
    fn enqueue_planned(
        &self,
        comm: &Communicator,
        spec: CallSpec,
        algorithm: Algorithm,
        plan: &crate::comm::CachedPlan,
        record: Option<(u64, [u8; HEADER_BYTES])>,
        (send, recv): (u64, u64),
        in_bytes: usize,
        stream: &Stream,
    ) -> Result<Algorithm> {
        let (p, es) = (comm.size(), spec.dtype.size());
        let arith = arith_of(&spec, p);
        let key = ProgramKey {
            collective: spec.collective.code(),
            dtype: spec.dtype.name(),
            count: spec.count,
            root: spec.root,
            algorithm: algorithm.code(),
            combine: arith.combine as u8,
            divide: arith.divide_by.is_some(),
        };
        let mut guard = self.lock_state()?;
        let st = &mut *guard;
        let compiled = match st.cache.get(&key) {
            Some(c) => c.clone(),
            None => {
                let c = Arc::new(compile(
                    &plan.sched,
                    p,
                    es,
                    self.layout.slots,
                    algorithm,
                    arith,
                ));
                if st.cache.len() >= 64 {
                    st.cache.clear();
                }
                st.cache.insert(key, c.clone());
                c
            }
        };
        let start = self.begin(st, stream)?;
        let mut input = send;
        let premul = match spec.op {
            ReduceOp::PreMulSum(s) if spec.collective.reduces() => Some(s),
            _ => None,
        };
        let private_copy = spec.collective == Collective::AllToAll && in_bytes > 0 && send == recv;
        // Scratch and staging are allocated in stream order: an ordinary allocation would
        // wait for every stream, this one's earlier work (and perhaps peers) included.
        let mut temporaries = Vec::new();
        if premul.is_some() || private_copy {
            let staging = alloc_on(stream, in_bytes)?;
            temporaries.push(staging);
            match premul {
                Some(s) => self
                    .kernels
                    .scale(&s, staging, send, in_bytes / es, stream.raw())?,
                None => copy(staging, send, in_bytes, stream.raw())?,
            }
            input = staging;
        }
        let scratch = if compiled.scratch_bytes > 0 {
            let scratch = alloc_on(stream, compiled.scratch_bytes)?;
            temporaries.push(scratch);
            scratch
        } else {
            0
        };
        let bases = Bases {
            input,
            output: recv,
            scratch,
        };
        let what = CallName::Collective(spec, compiled.algorithm);
        self.run(
            comm,
            st,
            &compiled,
            &bases,
            arith,
            stream,
            start,
            temporaries,
            what,
            record,
        )?;
        Ok(compiled.algorithm)
    }

    /// Enqueues a batch of point-to-point transfers on device memory on `stream`, all of
    /// which may progress at once (a group's sends and receives); each must match a transfer
    /// of the same size the peer makes to this rank, in the same order.
    pub(crate) fn enqueue_transfers(
        &self,
        comm: &Communicator,
        transfers: &[DeviceTransfer],
        stream: &Stream,
    ) -> Result<()> {
        let compiled = compile_transfers(transfers, comm.size(), self.layout.slots);
        if compiled.steps.is_empty() {
            return Ok(());
        }
        let mut guard = self.lock_state()?;
        let st = &mut *guard;
        let start = self.begin(st, stream)?;
        let bases = Bases {
            input: 0,
            output: 0,
            scratch: 0,
        };
        let arith = Arith {
            dtype: DataType::Uint8,
            combine: Combine::Sum,
            divide_by: None,
        };
        let what = CallName::Transfers {
            count: transfers.iter().filter(|t| t.bytes > 0).count(),
            bytes: transfers.iter().map(|t| t.bytes).sum(),
        };
        self.run(
            comm,
            st,
            &compiled,
            &bases,
            arith,
            stream,
            start,
            Vec::new(),
            what,
            None,
        )
    }

    /// The pair counters, program cache and lane streams, for one call's enqueueing.
    fn lock_state(&self) -> Result<std::sync::MutexGuard<'_, ProgramState>> {
        self.state
            .lock()
            .map_err(|_| Error::Transport("device program state poisoned".into()))
    }

    /// What every call enqueues first: it starts after the communicator's previous call
    /// (whatever stream that was on), and an event marks where it starts for the monitor.
    fn begin(&self, st: &ProgramState, stream: &Stream) -> Result<Event> {
        crate::gpu::driver::set_device(self.device)?;
        wait_event(stream, &st.last)?;
        let start = self.watch.event()?;
        start.record(stream)?;
        Ok(start)
    }

    /// Enqueues `compiled`'s steps on `stream` (forking each step of several lanes onto the
    /// lane streams and joining them back), frees `temporaries` after it, moves the pair
    /// counters on and hands the call to the monitor.
    #[allow(clippy::too_many_arguments)]
    fn run(
        &self,
        comm: &Communicator,
        st: &mut ProgramState,
        compiled: &Compiled,
        bases: &Bases,
        arith: Arith,
        stream: &Stream,
        start: Event,
        temporaries: Vec<u64>,
        what: CallName,
        record: Option<(u64, [u8; HEADER_BYTES])>,
    ) -> Result<()> {
        while st.lanes.len() < compiled.lanes {
            st.lanes.push(Stream::new(self.device)?);
            st.joins.push(Event::new(false)?);
        }
        // What this call will wait for, published for the monitors' diagnosis, and the call's
        // header, for a timeout to compare across ranks: gathered with the first step's waits
        // into one batch of memory operations (a rank alone has nobody to compare with).
        let layout = self.layout;
        let own = self.own.ptr();
        let k = layout.slots.count as u64;
        let mut ops = MemOps::new(self.batch);
        for q in 0..st.sent.len() {
            if compiled.received[q] > 0 {
                let want = st.received[q] + compiled.received[q];
                ops.write(own + layout.expect_filled(q), want);
            }
            if compiled.sent[q] > 0 {
                let want = (st.sent[q] + compiled.sent[q]).saturating_sub(k);
                ops.write(own + layout.expect_credit(q), want);
            }
        }
        if comm.size() > 1 {
            let words = header_words(&record.map_or([0; HEADER_BYTES], |r| r.1));
            for (i, &word) in words.iter().enumerate() {
                ops.write(own + layout.call() + 4 * i as u64, u64::from(word));
            }
        }
        for step in &compiled.steps {
            if let [only] = step.as_slice() {
                self.issue(only, bases, st, arith, stream, &mut ops)?;
                continue;
            }
            ops.flush(stream.raw())?;
            st.fork.record(stream)?;
            for (i, lane) in step.iter().enumerate() {
                let s = &st.lanes[i];
                wait_event(s, &st.fork)?;
                let mut lane_ops = MemOps::new(self.batch);
                self.issue(lane, bases, st, arith, s, &mut lane_ops)?;
                lane_ops.flush(s.raw())?;
                st.joins[i].record(s)?;
            }
            for join in &st.joins[..step.len()] {
                wait_event(stream, join)?;
            }
        }
        ops.flush(stream.raw())?;
        for t in temporaries {
            free_on(stream, t)?;
        }
        let end = self.watch.event()?;
        end.record(stream)?;
        st.last.record(stream)?;
        for q in 0..st.sent.len() {
            st.sent[q] += compiled.sent[q];
            st.received[q] += compiled.received[q];
        }
        if let Some(net) = &self.net {
            // The progress thread polls without sleeping until the monitor retires the call.
            net.busy.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        }
        let call = InFlight {
            start,
            end,
            started: None,
            timeout: comm.timeout(),
            what,
            record: record.map(|r| r.0),
        };
        self.watch.track(call, &st.sent, &st.received);
        Ok(())
    }

    /// Enqueues one lane's instructions on `s`. Memory operations gather in `ops` and go to
    /// the stream as one batch before the next copy or kernel (the caller flushes the rest).
    fn issue(
        &self,
        lane: &[Instr],
        bases: &Bases,
        st: &ProgramState,
        arith: Arith,
        s: &Stream,
        ops: &mut MemOps,
    ) -> Result<()> {
        let layout = self.layout;
        let (me, k) = (self.rank, layout.slots.count as u64);
        let own = self.own.ptr();
        let addr = |l: Loc| match l {
            Loc::Buffer(Buf::Input, off) => bases.input + off as u64,
            Loc::Buffer(Buf::Output, off) => bases.output + off as u64,
            Loc::Buffer(Buf::Scratch, off) => bases.scratch + off as u64,
            Loc::Addr(a) => a,
        };
        let raw = s.raw();
        for instr in lane {
            match *instr {
                Instr::Send {
                    peer,
                    n,
                    src,
                    bytes,
                } => {
                    let n = st.sent[peer] + n;
                    if n >= k {
                        // The peer has consumed piece n − k: its slot is free.
                        self.await_credit(ops, peer, n + 1 - k);
                    }
                    let slot = (n % k) as usize;
                    ops.flush(raw)?;
                    match self.net.as_ref().filter(|_| self.remote[peer]) {
                        Some(net) => {
                            // Into the outbox; the progress thread has the NIC write it into
                            // the peer's slot.
                            copy(net.outbox_slot(peer, slot), addr(src), bytes, raw)?;
                            ops.write(net.words.length(peer, slot), bytes as u64);
                            ops.write(net.words.ready(peer), n + 1);
                        }
                        None => {
                            let dst = self.bases[peer] + layout.slot(me, slot);
                            copy(dst, addr(src), bytes, raw)?;
                            ops.write(self.bases[peer] + layout.filled(me), n + 1);
                        }
                    }
                }
                Instr::Recv {
                    peer,
                    n,
                    dst,
                    bytes,
                } => {
                    let n = st.received[peer] + n;
                    self.await_piece(ops, peer, n + 1);
                    ops.flush(raw)?;
                    copy(
                        addr(dst),
                        own + layout.slot(peer, (n % k) as usize),
                        bytes,
                        raw,
                    )?;
                    self.free_slot(ops, peer, n + 1);
                }
                Instr::RecvReduce {
                    peer,
                    n,
                    src,
                    dst,
                    elems,
                } => {
                    let n = st.received[peer] + n;
                    self.await_piece(ops, peer, n + 1);
                    ops.flush(raw)?;
                    let slot = own + layout.slot(peer, (n % k) as usize);
                    self.kernels.combine(
                        arith.dtype,
                        arith.combine,
                        addr(dst),
                        addr(src),
                        slot,
                        elems,
                        raw,
                    )?;
                    self.free_slot(ops, peer, n + 1);
                }
                Instr::Copy { src, dst, bytes } => {
                    ops.flush(raw)?;
                    copy(addr(dst), addr(src), bytes, raw)?
                }
                Instr::Combine { dst, a, b, elems } => {
                    ops.flush(raw)?;
                    self.kernels.combine(
                        arith.dtype,
                        arith.combine,
                        addr(dst),
                        addr(a),
                        addr(b),
                        elems,
                        raw,
                    )?
                }
                Instr::Divide { region, elems } => {
                    ops.flush(raw)?;
                    if let Some(by) = arith.divide_by {
                        self.kernels
                            .divide(arith.dtype, addr(region), by, elems, raw)?;
                    }
                }
            }
        }
        Ok(())
    }
}

impl Programs {
    /// Adds a wait until `peer`'s piece `filled − 1` is in this rank's slot. For a remote
    /// peer the progress thread's host word says so; the stream then copies it into this
    /// rank's flag area, where every rank of the host can read it after a timeout.
    fn await_piece(&self, ops: &mut MemOps, peer: usize, filled: u64) {
        let own = self.own.ptr() + self.layout.filled(peer);
        match self.net.as_ref().filter(|_| self.remote[peer]) {
            Some(net) => {
                ops.wait(net.words.filled(peer), filled);
                ops.write(own, filled);
            }
            None => ops.wait(own, filled),
        }
    }

    /// Adds a wait until `peer` has consumed piece `credit − 1` of this rank's (its slot is
    /// free again), mirrored into the flag area as in [`Programs::await_piece`].
    fn await_credit(&self, ops: &mut MemOps, peer: usize, credit: u64) {
        let own = self.own.ptr() + self.layout.credit(peer);
        match self.net.as_ref().filter(|_| self.remote[peer]) {
            Some(net) => {
                ops.wait(net.words.credit(peer), credit);
                ops.write(own, credit);
            }
            None => ops.wait(own, credit),
        }
    }

    /// Adds handing `peer`'s slot back after piece `consumed − 1`: a write into the peer's
    /// credit word, or for a remote peer into the host word the progress thread sends on.
    fn free_slot(&self, ops: &mut MemOps, peer: usize, consumed: u64) {
        match self.net.as_ref().filter(|_| self.remote[peer]) {
            Some(net) => ops.write(net.words.consumed(peer), consumed),
            None => ops.write(self.bases[peer] + self.layout.credit(self.rank), consumed),
        }
    }

    /// How device data reaches `peer`: `direct` in this process, `ipc` on this host, `gdr`
    /// on another.
    pub(crate) fn path_to(&self, peer: usize) -> &'static str {
        if self.remote.get(peer).copied().unwrap_or(false) {
            "gdr"
        } else if self
            .bases
            .get(peer)
            .is_some_and(|b| *b != 0 && !self.opened.contains(b))
            && peer != self.rank
        {
            "direct"
        } else {
            "ipc"
        }
    }
}

impl Drop for Programs {
    fn drop(&mut self) {
        self.watch.stop();
        if let Some(m) = self.monitor.get_mut().ok().and_then(Option::take) {
            let _ = m.join();
        }
        if let Some(net) = &self.net {
            net.stop();
        }
        let _ = crate::gpu::driver::set_device(self.device);
        for &ptr in &self.opened {
            // SAFETY: mappings made by cuIpcOpenMemHandle.
            let _ = call("cuIpcCloseMemHandle", || unsafe {
                sys::cuIpcCloseMemHandle(ptr)
            });
        }
    }
}

/// A call's encoded header as the words the flag area holds it in (zeros for transfers).
fn header_words(header: &[u8; HEADER_BYTES]) -> [u32; layout::CALL_WORDS] {
    let mut words = [0u32; layout::CALL_WORDS];
    for (w, b) in words.iter_mut().zip(header.chunks_exact(4)) {
        *w = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    }
    words
}

/// `bytes` of device memory, allocated in `stream`'s order (`cuMemAllocAsync`).
fn alloc_on(stream: &Stream, bytes: usize) -> Result<u64> {
    let mut ptr = 0u64;
    // SAFETY: a valid out-pointer and a live stream.
    call("cuMemAllocAsync", || unsafe {
        sys::cuMemAllocAsync(&mut ptr, bytes.max(1), stream.raw())
    })?;
    Ok(ptr)
}

/// Frees memory from [`alloc_on`] when `stream` reaches this point.
fn free_on(stream: &Stream, ptr: u64) -> Result<()> {
    // SAFETY: allocated by cuMemAllocAsync; the work enqueued before on this stream is the
    // last to use it.
    call("cuMemFreeAsync", || unsafe {
        sys::cuMemFreeAsync(ptr, stream.raw())
    })
}

fn copy(dst: u64, src: u64, bytes: usize, s: sys::CUstream) -> Result<()> {
    if bytes == 0 || dst == src {
        return Ok(());
    }
    // SAFETY: both ranges lie in device memory (the call's buffers, which the caller vouches
    // for, or this communicator's rings and scratch) for the length of the stream's work.
    call("cuMemcpyDtoDAsync", || unsafe {
        sys::cuMemcpyDtoDAsync_v2(dst, src, bytes, s)
    })
}

fn wait_value(s: sys::CUstream, addr: u64, value: u64) -> Result<()> {
    let geq = sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32;
    // SAFETY: `addr` is a flag word of this communicator's program buffer, alive while the
    // communicator is.
    call("cuStreamWaitValue32", || unsafe {
        sys::cuStreamWaitValue32_v2(s, addr, value as u32, geq)
    })
}

fn write_value(s: sys::CUstream, addr: u64, value: u64) -> Result<()> {
    // SAFETY: as in `wait_value`, a flag word of a rank's program buffer mapped here.
    call("cuStreamWriteValue32", || unsafe {
        sys::cuStreamWriteValue32_v2(s, addr, value as u32, 0)
    })
}

fn wait_event(s: &Stream, e: &Event) -> Result<()> {
    e.make_wait(s)
}
