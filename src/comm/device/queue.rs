//! Stream-ordered execution: how a collective on device buffers waits for its stream and
//! holds the stream until its result is in place.
//!
//! Per communicator, one progress thread runs the stream-ordered calls in the order they were
//! enqueued. Enqueueing a call puts two things on each of the caller's streams and returns:
//!
//! 1. `cuLaunchHostFunc` with a function that only sets a flag and wakes the progress thread:
//!    the call's inputs are ready once the stream reaches it. (It calls no CUDA function, as
//!    the driver requires of host functions, and never blocks the driver's callback thread.)
//! 2. `cuStreamWaitValue32(flag, seq, GEQ)` on a word of pinned, device-mapped host memory:
//!    the stream stops there until the progress thread writes `seq`, which it does only after
//!    the results have been copied back to the device and that copy has completed. Work the
//!    caller enqueues afterwards, including events PyTorch records to poll for completion,
//!    cannot run before the data is there.
//!
//! A failed call still writes its `seq` (so no stream hangs forever), but first records the
//! error as the communicator's fault, which `async_error` (`ncclCommGetAsyncError`) reports.
//! Where the driver has no stream memory operations the hold is a second host function that
//! waits for the flag (it occupies the driver's callback thread meanwhile).

use crate::comm::Communicator;
use crate::error::{Error, Result};
use crate::gpu::DeviceRange;
use crate::gpu::driver::{call, check, set_device};
use crate::gpu::memory::PinnedBuffer;
use crate::gpu::stream::{Event, Stream};
use cudarc::driver::sys;
use std::collections::VecDeque;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// The host copies of a call's device ranges while the call runs.
pub struct Staged {
    /// (device start, bytes, host copy), sorted by device start, disjoint.
    ranges: Vec<(u64, usize, *mut u8)>,
}

impl Staged {
    /// The host address that stands for device address `ptr` during the call, if `ptr` lies
    /// in one of the call's ranges.
    pub fn host(&self, ptr: u64) -> Option<*mut u8> {
        let i = self.ranges.partition_point(|r| r.0 <= ptr).checked_sub(1)?;
        let (start, len, host) = self.ranges[i];
        // SAFETY: `ptr - start` lies within the range's host copy.
        (ptr < start + len as u64).then(|| unsafe { host.add((ptr - start) as usize) })
    }
}

/// What a stream-ordered job runs on the progress thread.
pub type DeviceWork = Box<dyn FnOnce(&Communicator, &Staged) -> Result<()> + Send>;

/// One elementwise collective (all_reduce, broadcast, reduce) on device buffers, pipelined
/// chunk by chunk.
pub(crate) struct Elementwise {
    /// The call.
    pub spec: crate::comm::CallSpec,
    /// Input (the output's address when in place).
    pub send: u64,
    /// Output.
    pub recv: u64,
    /// Whether this rank reads the input and writes the output.
    pub reads: bool,
    /// As above, for the output.
    pub writes: bool,
}

/// What a job does once its streams are ready.
pub(crate) enum JobKind {
    /// Stage every range through host memory, run `work` on the host copies, copy back.
    Staged(Vec<DeviceRange>, DeviceWork),
    /// A pipelined elementwise collective, staged chunk by chunk.
    Elementwise(Elementwise),
}

/// Set by the host function when the stream reaches the call.
#[derive(Default)]
struct Ready {
    done: Mutex<bool>,
    cv: Condvar,
}

struct Job {
    seq: u32,
    ready: Vec<Arc<Ready>>,
    kind: JobKind,
}

#[derive(Default)]
struct Jobs {
    queue: VecDeque<Job>,
    running: bool,
    closing: bool,
}

/// State shared by the enqueuers, the progress thread and the driver's host functions.
struct Shared {
    jobs: Mutex<Jobs>,
    cv: Condvar,
    /// The last completed `seq`, as the GPU reads it.
    flag: PinnedBuffer,
    flag_dev: u64,
    /// Whether streams wait with `cuStreamWaitValue32` (else a holding host function).
    memops: AtomicBool,
    device: i32,
}

// SAFETY: the flag is written through atomics only; the rest is synchronised.
unsafe impl Sync for Shared {}

impl Shared {
    fn flag(&self) -> &AtomicU32 {
        // SAFETY: a live, 4-byte aligned pinned allocation used only as this atomic.
        unsafe { &*(self.flag.as_ptr() as *const AtomicU32) }
    }
}

/// The progress thread of one communicator and its queue.
pub(crate) struct StreamQueue {
    shared: Arc<Shared>,
    next_seq: AtomicU32,
    enqueue_lock: Mutex<()>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    thread_id: std::sync::OnceLock<std::thread::ThreadId>,
    /// The stream-program path, when the communicator has it (set at bind).
    programs: std::sync::OnceLock<super::program::Programs>,
}

/// Bytes per pipeline chunk (`STRATA_GPU_CHUNK`, default 4 MiB).
pub(crate) fn chunk_bytes() -> usize {
    std::env::var("STRATA_GPU_CHUNK")
        .ok()
        .and_then(|v| parse_bytes(&v))
        .filter(|&b| b > 0)
        .unwrap_or(4 << 20)
}

/// `4194304`, `4096K`, `4M` or `1G`.
pub(crate) fn parse_bytes(v: &str) -> Option<usize> {
    let v = v.trim();
    let (digits, shift) = match v.as_bytes().last()? {
        b'K' | b'k' => (&v[..v.len() - 1], 10),
        b'M' | b'm' => (&v[..v.len() - 1], 20),
        b'G' | b'g' => (&v[..v.len() - 1], 30),
        _ => (v, 0),
    };
    digits.parse::<usize>().ok()?.checked_mul(1 << shift)
}

/// Chunks in flight in the pipeline.
const SLOTS: usize = 4;

impl StreamQueue {
    /// Starts the progress thread for `comm` on `device`.
    pub(crate) fn start(comm: std::sync::Weak<crate::comm::Inner>, device: i32) -> Result<Self> {
        set_device(device)?;
        let flag = PinnedBuffer::new(64)?;
        // SAFETY: a fresh allocation of at least 4 aligned bytes.
        unsafe { (flag.as_ptr() as *mut u32).write(0) };
        let flag_dev = flag.device_ptr()?;
        let shared = Arc::new(Shared {
            jobs: Mutex::new(Jobs::default()),
            cv: Condvar::new(),
            flag,
            flag_dev,
            memops: AtomicBool::new(true),
            device,
        });
        // Everything the progress thread needs from the driver's allocators is made here: an
        // allocation or free of pinned or device memory synchronises with every stream, and
        // the progress thread runs while the caller's streams wait for it.
        let stage = Stage::new(device)?;
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("strata-gpu".into())
            .spawn(move || progress(comm, s, stage))
            .map_err(|e| Error::io("starting the GPU progress thread", e))?;
        let q = Self {
            shared,
            next_seq: AtomicU32::new(0),
            enqueue_lock: Mutex::new(()),
            thread_id: std::sync::OnceLock::new(),
            programs: std::sync::OnceLock::new(),
            thread: Mutex::new(None),
        };
        let _ = q.thread_id.set(thread.thread().id());
        *q.thread.lock().unwrap_or_else(|p| p.into_inner()) = Some(thread);
        Ok(q)
    }

    /// Gives the queue the stream-program path built at bind (before any call is enqueued).
    pub(crate) fn set_programs(&self, programs: super::program::Programs) {
        let _ = self.programs.set(programs);
    }

    /// The stream-program path, if the communicator has it.
    pub(crate) fn programs(&self) -> Option<&super::program::Programs> {
        self.programs.get()
    }

    /// Whether the calling thread is this queue's progress thread.
    pub(crate) fn is_progress_thread(&self) -> bool {
        self.thread_id.get() == Some(&std::thread::current().id())
    }

    /// The device this queue's staging and copies use.
    pub(crate) fn device(&self) -> i32 {
        self.shared.device
    }

    /// Enqueues `kind` after the work already on each of `streams`; returns at once.
    pub(crate) fn enqueue(&self, streams: &[sys::CUstream], kind: JobKind) -> Result<()> {
        let _order = self.enqueue_lock.lock().unwrap_or_else(|p| p.into_inner());
        let seq = self.next_seq.load(Ordering::Relaxed).wrapping_add(1);
        let mut ready = Vec::with_capacity(streams.len());
        for &stream in streams {
            let r = Arc::new(Ready::default());
            let raw = Arc::into_raw(r.clone()) as *mut c_void;
            // SAFETY: `mark_ready` takes back the Arc handed over here, exactly once.
            if let Err(e) = call("cuLaunchHostFunc", || unsafe {
                sys::cuLaunchHostFunc(stream, Some(mark_ready), raw)
            }) {
                // SAFETY: the driver refused, so the function will never run: take it back.
                drop(unsafe { Arc::from_raw(raw as *const Ready) });
                return Err(e);
            }
            self.hold(stream, seq)?;
            ready.push(r);
        }
        self.next_seq.store(seq, Ordering::Relaxed);
        let mut jobs = self.shared.jobs.lock().unwrap_or_else(|p| p.into_inner());
        if jobs.closing {
            return Err(Error::Aborted(Some(
                "the communicator is being destroyed".into(),
            )));
        }
        jobs.queue.push_back(Job { seq, ready, kind });
        self.shared.cv.notify_all();
        Ok(())
    }

    /// Makes `stream` wait until the flag reaches `seq`.
    fn hold(&self, stream: sys::CUstream, seq: u32) -> Result<()> {
        if self.shared.memops.load(Ordering::Relaxed) {
            let flags = sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32;
            let flag = self.shared.flag_dev;
            // SAFETY: the flag is a live device-mapped word; `stream` is the caller's.
            let r = std::panic::catch_unwind(move || unsafe {
                sys::cuStreamWaitValue32_v2(stream, flag, seq, flags)
            });
            match r {
                Ok(sys::CUresult::CUDA_SUCCESS) => return Ok(()),
                Ok(sys::CUresult::CUDA_ERROR_NOT_SUPPORTED) | Err(_) => {
                    tracing::info!(
                        "no stream memory operations: holding streams in host functions"
                    );
                    self.shared.memops.store(false, Ordering::Relaxed);
                }
                Ok(other) => return check(other, "cuStreamWaitValue32"),
            }
        }
        let hold = Box::into_raw(Box::new((self.shared.clone(), seq))) as *mut c_void;
        // SAFETY: `hold_stream` takes back the box exactly once.
        call("cuLaunchHostFunc", || unsafe {
            sys::cuLaunchHostFunc(stream, Some(hold_stream), hold)
        })
        .inspect_err(|_| {
            // SAFETY: refused, so never run: take it back.
            drop(unsafe { Box::from_raw(hold as *mut (Arc<Shared>, u32)) });
        })
    }

    /// Waits until every enqueued job has completed, or `limit` passes.
    pub(crate) fn wait_idle(&self, limit: Duration) -> Result<()> {
        let deadline = std::time::Instant::now() + limit;
        let mut jobs = self.shared.jobs.lock().unwrap_or_else(|p| p.into_inner());
        while !jobs.queue.is_empty() || jobs.running {
            let now = std::time::Instant::now();
            if now >= deadline {
                return Err(Error::Timeout {
                    op: "waiting for stream-ordered calls".into(),
                    seq: 0,
                    waiting_on: vec![],
                    after_s: limit.as_secs_f64(),
                    diagnosis: None,
                });
            }
            jobs = self
                .shared
                .cv
                .wait_timeout(jobs, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        Ok(())
    }
}

impl Drop for StreamQueue {
    fn drop(&mut self) {
        {
            let mut jobs = self.shared.jobs.lock().unwrap_or_else(|p| p.into_inner());
            jobs.closing = true;
            self.shared.cv.notify_all();
        }
        let me = std::thread::current().id();
        if self.thread_id.get() != Some(&me)
            && let Some(t) = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take()
        {
            let _ = t.join();
        }
    }
}

/// The host function that marks a stream ready. Calls no CUDA function.
unsafe extern "C" fn mark_ready(data: *mut c_void) {
    // SAFETY: `enqueue` handed over one Arc reference for this call.
    let r = unsafe { Arc::from_raw(data as *const Ready) };
    *r.done.lock().unwrap_or_else(|p| p.into_inner()) = true;
    r.cv.notify_all();
}

/// The holding host function used without stream memory operations.
unsafe extern "C" fn hold_stream(data: *mut c_void) {
    // SAFETY: `hold` handed over the box for this call.
    let b = unsafe { Box::from_raw(data as *mut (Arc<Shared>, u32)) };
    let (shared, seq) = &*b;
    let mut jobs = shared.jobs.lock().unwrap_or_else(|p| p.into_inner());
    loop {
        let done = shared.flag().load(Ordering::Acquire);
        if (done.wrapping_sub(*seq) as i32) >= 0 || (jobs.closing && jobs.queue.is_empty()) {
            return;
        }
        jobs = shared
            .cv
            .wait_timeout(jobs, Duration::from_millis(50))
            .unwrap_or_else(|p| p.into_inner())
            .0;
    }
}

/// Host staging memory and the copy stream of the progress thread.
struct Stage {
    copy: Stream,
    /// The pipeline's slots, pinned so that copies run asynchronously.
    pinned: PinnedBuffer,
    /// Staging for whole calls larger than the pinned slots: ordinary memory, since the
    /// progress thread must never call the driver's allocators (see `StreamQueue::start`).
    heap: Vec<u64>,
    events: Vec<Event>,
    chunk: usize,
}

// SAFETY: the stream, events and pinned memory are used by the progress thread alone.
unsafe impl Send for Stage {}

impl Stage {
    fn new(device: i32) -> Result<Self> {
        let copy = Stream::new(device)?;
        let events = (0..SLOTS)
            .map(|_| Event::new(false))
            .collect::<Result<Vec<_>>>()?;
        let chunk = chunk_bytes().next_multiple_of(64);
        Ok(Self {
            copy,
            pinned: PinnedBuffer::new(chunk * SLOTS)?,
            heap: Vec::new(),
            events,
            chunk,
        })
    }

    /// Staging of at least `len` bytes: the pinned slots when they are large enough.
    fn reserve(&mut self, len: usize) -> Result<*mut u8> {
        if len <= self.pinned.len() {
            return Ok(self.pinned.as_ptr());
        }
        if self.heap.len() * 8 < len {
            self.heap = vec![0u64; len.div_ceil(8)];
        }
        Ok(self.heap.as_mut_ptr().cast())
    }

    fn to_host(&self, host: *mut u8, dev: u64, len: usize) -> Result<()> {
        // SAFETY: `host` is pinned staging of at least `len` bytes; `dev` a device range of
        // the caller's call.
        call("cuMemcpyDtoHAsync", || unsafe {
            sys::cuMemcpyDtoHAsync_v2(host.cast(), dev, len, self.copy.raw())
        })
    }

    fn to_device(&self, dev: u64, host: *const u8, len: usize) -> Result<()> {
        // SAFETY: as in `to_host`.
        call("cuMemcpyHtoDAsync", || unsafe {
            sys::cuMemcpyHtoDAsync_v2(dev, host.cast(), len, self.copy.raw())
        })
    }
}

/// The progress thread: runs jobs in order until the queue closes.
fn progress(comm: std::sync::Weak<crate::comm::Inner>, shared: Arc<Shared>, stage: Stage) {
    let mut stage = set_device(shared.device).map(|_| stage);
    loop {
        let job = {
            let mut jobs = shared.jobs.lock().unwrap_or_else(|p| p.into_inner());
            loop {
                if let Some(j) = jobs.queue.pop_front() {
                    jobs.running = true;
                    break Some(j);
                }
                if jobs.closing {
                    break None;
                }
                jobs = shared.cv.wait(jobs).unwrap_or_else(|p| p.into_inner());
            }
        };
        let Some(job) = job else { return };
        let seq = job.seq;
        let result = match (Communicator::upgrade(&comm), &mut stage) {
            (None, _) => Err(Error::Aborted(Some(
                "the communicator was destroyed".into(),
            ))),
            (Some(_), Err(e)) => Err(e.clone()),
            (Some(c), Ok(stage)) => {
                // A panic in a call must not leave its streams waiting forever.
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    wait_ready(&c, &job.ready).and_then(|_| run(&c, stage, job.kind))
                }))
                .unwrap_or_else(|_| {
                    Err(Error::Transport(
                        "internal: a stream-ordered call panicked".into(),
                    ))
                });
                if let Err(e) = &r {
                    c.record_stream_fault(e);
                }
                r
            }
        };
        if let Err(e) = &result {
            tracing::warn!("stream-ordered call #{seq} failed: {e}");
        }
        shared.flag().store(seq, Ordering::Release);
        let mut jobs = shared.jobs.lock().unwrap_or_else(|p| p.into_inner());
        jobs.running = false;
        shared.cv.notify_all();
    }
}

/// Waits until every stream of the job has reached it, or the communicator fails.
fn wait_ready(comm: &Communicator, ready: &[Arc<Ready>]) -> Result<()> {
    for r in ready {
        let mut done = r.done.lock().unwrap_or_else(|p| p.into_inner());
        while !*done {
            if let Some(e) = comm.async_error() {
                return Err(e);
            }
            done =
                r.cv.wait_timeout(done, Duration::from_millis(20))
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
        }
    }
    Ok(())
}

/// Runs one job on the host copies of its buffers.
fn run(comm: &Communicator, stage: &mut Stage, kind: JobKind) -> Result<()> {
    if let Some(e) = comm.async_error() {
        return Err(e);
    }
    match kind {
        JobKind::Staged(ranges, work) => run_staged(comm, stage, ranges, work),
        JobKind::Elementwise(e) => run_elementwise(comm, stage, e),
    }
}

/// Merges overlapping ranges (a range is read or written if any part of it is).
fn merge(mut ranges: Vec<DeviceRange>) -> Vec<DeviceRange> {
    ranges.retain(|r| r.len > 0);
    ranges.sort_by_key(|r| r.ptr);
    let mut out: Vec<DeviceRange> = Vec::with_capacity(ranges.len());
    for r in ranges {
        match out.last_mut() {
            Some(last) if r.ptr < last.ptr + last.len as u64 => {
                let end = (last.ptr + last.len as u64).max(r.ptr + r.len as u64);
                last.len = (end - last.ptr) as usize;
                last.read |= r.read;
                last.write |= r.write;
            }
            _ => out.push(r),
        }
    }
    out
}

fn run_staged(
    comm: &Communicator,
    stage: &mut Stage,
    ranges: Vec<DeviceRange>,
    work: DeviceWork,
) -> Result<()> {
    let ranges = merge(ranges);
    let offsets: Vec<usize> = ranges
        .iter()
        .scan(0usize, |at, r| {
            let o = *at;
            *at += r.len.next_multiple_of(64);
            Some(o)
        })
        .collect();
    let total = ranges.iter().map(|r| r.len.next_multiple_of(64)).sum();
    let base = stage.reserve(total)?;
    // SAFETY: every offset + len lies within the `total` bytes reserved.
    let host = |i: usize| unsafe { base.add(offsets[i]) };
    for (i, r) in ranges.iter().enumerate() {
        if r.read {
            stage.to_host(host(i), r.ptr, r.len)?;
        }
    }
    stage.copy.synchronize()?;
    let staged = Staged {
        ranges: ranges
            .iter()
            .enumerate()
            .map(|(i, r)| (r.ptr, r.len, host(i)))
            .collect(),
    };
    work(comm, &staged)?;
    for (i, r) in ranges.iter().enumerate() {
        if r.write {
            stage.to_device(r.ptr, host(i), r.len)?;
        }
    }
    stage.copy.synchronize()
}

/// all_reduce, broadcast or reduce in chunks: copies of later chunks to the host and of
/// earlier results to the device overlap the collective on the chunk between them.
fn run_elementwise(comm: &Communicator, stage: &mut Stage, e: Elementwise) -> Result<()> {
    let es = e.spec.dtype.size();
    let chunk = (stage.chunk / es).max(1);
    let count = e.spec.count;
    let chunks = count.div_ceil(chunk).max(1);
    let slot_bytes = chunk.min(count) * es;
    let base = stage.reserve(slot_bytes.next_multiple_of(64) * SLOTS)?;
    // SAFETY: SLOTS slots of slot_bytes (rounded) were reserved.
    let slot = |i: usize| unsafe { base.add((i % SLOTS) * slot_bytes.next_multiple_of(64)) };
    let part = |i: usize| {
        let first = i * chunk;
        (first, chunk.min(count - first))
    };
    let load = |stage: &Stage, i: usize| -> Result<()> {
        let (first, n) = part(i);
        if e.reads {
            stage.to_host(slot(i), e.send + (first * es) as u64, n * es)?;
        }
        stage.events[i % SLOTS].record(&stage.copy)
    };
    for i in 0..chunks.min(SLOTS) {
        load(stage, i)?;
    }
    for i in 0..chunks {
        stage.events[i % SLOTS].synchronize()?;
        let (first, n) = part(i);
        let spec = crate::comm::CallSpec { count: n, ..e.spec };
        // SAFETY: the slot holds n * es bytes of pinned memory that nothing else touches
        // until the copy below, which the stream orders after this call.
        let buf = unsafe { std::slice::from_raw_parts_mut(slot(i), n * es) };
        comm.call_bytes(spec, None, buf)?;
        if e.writes {
            stage.to_device(e.recv + (first * es) as u64, slot(i), n * es)?;
        }
        if i + SLOTS < chunks {
            load(stage, i + SLOTS)?;
        }
    }
    stage.copy.synchronize()
}
