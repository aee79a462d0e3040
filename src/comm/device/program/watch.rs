//! Watching the stream programs in flight. A call the stream has reached that has not finished
//! within the communicator's timeout, or any call in flight when the communicator is aborted
//! or fails (a dead peer, a timeout elsewhere), makes the monitor release every word this
//! rank's streams wait on, so they drain (with undefined results, as after NCCL's abort) and
//! `async_error` says why. The monitor polls events (`cuEventQuery`) every few milliseconds;
//! it never waits on the GPU while the calls are healthy.

use super::layout::{CALL_WORDS, Layout};
use super::net::HostWords;
use crate::comm::CallSpec;
use crate::error::{Error, RankList, Result};
use crate::gpu::driver::{call, set_device};
use crate::gpu::memory::PinnedBuffer;
use crate::gpu::{Event, Stream};
use crate::watchdog::Health;
use crate::wire::Header;
use cudarc::driver::sys;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use strata_algorithms::Algorithm;

/// How often the monitor looks while calls are in flight.
const TICK: Duration = Duration::from_millis(10);

/// One call in flight: events recorded where it starts and ends on its stream.
pub(super) struct InFlight {
    pub start: Event,
    pub end: Event,
    /// When the monitor first saw the stream reach the call.
    pub started: Option<Instant>,
    pub timeout: Duration,
    /// The call, named only if it times out.
    pub what: CallName,
    /// Its flight-recorder entry, stamped when it ends.
    pub record: Option<u64>,
}

/// What a call in flight is, kept as data and put into words only for a timeout's error.
#[derive(Clone, Copy)]
pub(super) enum CallName {
    /// A collective and the algorithm whose steps it runs.
    Collective(CallSpec, Algorithm),
    /// A batch of point-to-point transfers.
    Transfers { count: usize, bytes: usize },
    /// A collective run as one low-latency kernel.
    Kernel(CallSpec, super::kernel::Variant),
}

impl CallName {
    /// `all_reduce (float sum, 1024 elements, ring) on device buffers`.
    fn describe(&self) -> String {
        match self {
            CallName::Collective(spec, algorithm) => format!(
                "{} ({} {}, {} elements, {}) on device buffers",
                spec.collective,
                spec.dtype,
                spec.op,
                spec.count,
                algorithm.name()
            ),
            CallName::Transfers { count, bytes } => {
                format!("{count} point-to-point transfers ({bytes} bytes) on device buffers")
            }
            CallName::Kernel(spec, variant) => format!(
                "{} ({} {}, {} elements, {} kernel) on device buffers",
                spec.collective,
                spec.dtype,
                spec.op,
                spec.count,
                variant.name()
            ),
        }
    }
}

/// What the monitor and the enqueueing threads share.
pub(super) struct Watch {
    pending: Mutex<VecDeque<InFlight>>,
    /// Events of finished calls, for the next ones.
    spare: Mutex<Vec<Event>>,
    cv: Condvar,
    stop: AtomicBool,
    health: Arc<Health>,
    /// Values that satisfy every wait enqueued so far: the *filled* words of ranks 0..p, then
    /// their *credit* words, as this rank's flag area holds them.
    release_to: Mutex<Vec<u32>>,
    /// Every rank's program buffer as this process maps it (this rank's own included; 0 for
    /// a rank on another host): the flag areas the diagnosis reads.
    bases: Vec<u64>,
    /// With ranks on other hosts: the host words their waits are on, and the count of calls
    /// in flight that keeps the GPUDirect progress thread polling.
    net: Option<(Arc<HostWords>, Arc<AtomicU32>)>,
    me: usize,
    layout: Layout,
    device: i32,
    /// The kernels' abort word (a host address of pinned memory), set after a fault.
    abort: Option<usize>,
}

impl Watch {
    /// Watches the calls of rank `me` on `device`; `bases` are every rank's program buffer
    /// as this process maps it (0 for ranks on other hosts, whose waits are on `net`'s words).
    pub fn new(
        health: Arc<Health>,
        bases: Vec<u64>,
        me: usize,
        layout: Layout,
        device: i32,
        net: Option<(Arc<HostWords>, Arc<AtomicU32>)>,
        abort: Option<usize>,
    ) -> Arc<Self> {
        let p = bases.len();
        Arc::new(Self {
            pending: Mutex::default(),
            spare: Mutex::default(),
            cv: Condvar::new(),
            stop: AtomicBool::new(false),
            health,
            release_to: Mutex::new(vec![0; 2 * p]),
            bases,
            net,
            me,
            layout,
            device,
            abort,
        })
    }

    /// An event for a new call (recycled when one is free).
    pub fn event(&self) -> Result<Event> {
        match self.spare.lock().ok().and_then(|mut s| s.pop()) {
            Some(e) => Ok(e),
            None => Event::new(false),
        }
    }

    /// A call was enqueued; after it, the counters stand at `sent` and `received` pieces.
    pub fn track(&self, call: InFlight, sent: &[u64], received: &[u64]) {
        if let Ok(mut r) = self.release_to.lock() {
            let p = sent.len();
            for q in 0..p {
                r[q] = received[q] as u32;
                r[p + q] = sent[q] as u32;
            }
        }
        if let Ok(mut pending) = self.pending.lock() {
            pending.push_back(call);
        }
        self.cv.notify_all();
    }

    /// Starts the monitor thread; it ends when [`Watch::stop`] is called.
    pub fn start(self: &Arc<Self>) -> Result<std::thread::JoinHandle<()>> {
        let watch = self.clone();
        let release = Release::new(watch.device, watch.layout.flag_words())?;
        std::thread::Builder::new()
            .name("strata-gpu-watch".into())
            .spawn(move || watch.run(release))
            .map_err(|e| Error::io("spawning the GPU call monitor", e))
    }

    /// Stops the monitor thread.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        self.cv.notify_all();
    }

    fn run(&self, release: Release) {
        let _ = set_device(self.device);
        let mut last_release: Option<Instant> = None;
        while !self.stop.load(Ordering::Acquire) {
            let Ok(mut pending) = self.pending.lock() else {
                return;
            };
            // Retire the calls that finished, in order.
            while pending
                .front()
                .is_some_and(|c| c.end.is_complete().unwrap_or(true))
            {
                if let Some(done) = pending.pop_front() {
                    if let Some((_, busy)) = &self.net {
                        busy.fetch_sub(1, Ordering::AcqRel);
                    }
                    if let Some(number) = done.record {
                        // After a fault or an abort the stream was released, not completed.
                        let released = self.health.interrupt.load(Ordering::Acquire);
                        let fault =
                            released.then(|| self.health.fault().unwrap_or(Error::Aborted(None)));
                        self.health.device_op_finished(number, fault.as_ref());
                    }
                    if let Ok(mut spare) = self.spare.lock() {
                        spare.extend([done.start, done.end]);
                    }
                }
            }
            if pending.is_empty() {
                last_release = None;
                let _ = self.cv.wait_timeout(pending, Duration::from_millis(200));
                continue;
            }
            let now = Instant::now();
            for c in pending.iter_mut() {
                if c.started.is_none() {
                    if !c.start.is_complete().unwrap_or(true) {
                        break;
                    }
                    c.started = Some(now);
                }
            }
            let overdue = pending
                .iter()
                .find(|c| c.started.is_some_and(|s| now.duration_since(s) > c.timeout))
                .map(|c| (c.what, c.timeout));
            drop(pending);
            if let Some((what, timeout)) = overdue
                && !self.health.interrupt.load(Ordering::Acquire)
            {
                let (waiting_on, diagnosis, mismatch) = self.diagnose(&release);
                let e = match mismatch {
                    Some(m) => Error::Mismatch(format!(
                        "{} did not finish within {:.1} s: {m}",
                        what.describe(),
                        timeout.as_secs_f64()
                    )),
                    None => Error::Timeout {
                        op: what.describe(),
                        seq: 0,
                        waiting_on,
                        after_s: timeout.as_secs_f64(),
                        diagnosis,
                    },
                };
                if self.health.record_fault(&e) {
                    tracing::warn!("{e}");
                }
            }
            // A failed or aborted communicator: let its streams drain, and keep them free of
            // the late writes of peers that are still running.
            if self.health.interrupt.load(Ordering::Acquire)
                && last_release.is_none_or(|t| t.elapsed() >= TICK)
            {
                if let Some(word) = self.abort {
                    // SAFETY: the kernels' pinned abort word, alive as long as the programs
                    // (which stop this thread before they go).
                    unsafe { &*(word as *const AtomicU32) }.store(1, Ordering::Release);
                }
                if let Ok(values) = self.release_to.lock().map(|v| v.clone()) {
                    tracing::debug!(?values, "releasing the stream programs in flight");
                    release.write(self.bases[self.me], &values);
                    if let Some((words, _)) = &self.net {
                        words.release(&values);
                    }
                }
                last_release = Some(Instant::now());
            }
            std::thread::sleep(TICK);
        }
    }

    /// After a timeout: who waits on whom among the ranks of this host, read from every
    /// rank's flag area (each rank's stream publishes what its current call waits for as the
    /// call starts). Follows the waits from this rank to the ranks that wait on no one — the
    /// ones holding the others up (not in the call, or stuck outside strata) — and names
    /// them; where the waits go round in a circle, names the ranks this one waits on. Also
    /// returns, when two ranks of the host are in their n-th device call with different
    /// arguments, what each called.
    fn diagnose(&self, release: &Release) -> (Vec<usize>, Option<String>, Option<String>) {
        let layout = self.layout;
        let p = self.bases.len();
        // What each rank of this host waits on, and the call its stream is in; None for ranks
        // on other hosts (their flag areas are theirs: their own monitors report on them).
        let mut waits: Vec<Option<Vec<usize>>> = Vec::with_capacity(p);
        let mut calls: Vec<Option<Header>> = Vec::with_capacity(p);
        for &base in &self.bases {
            if base == 0 {
                waits.push(None);
                calls.push(None);
                continue;
            }
            let w = match release.read(base, layout.flag_words()) {
                Ok(w) => w,
                Err(e) => return (Vec::new(), Some(format!("no diagnosis: {e}")), None),
            };
            let header: Vec<u8> = w[4 * p..4 * p + CALL_WORDS]
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect();
            calls.push(Header::decode(&header));
            let behind = |have: u32, want: u32| (have.wrapping_sub(want) as i32) < 0;
            let (arrive, expect) = (4 * p + CALL_WORDS, 5 * p + CALL_WORDS);
            waits.push(Some(
                (0..p)
                    .filter(|&x| {
                        behind(w[x], w[2 * p + x])
                            || behind(w[p + x], w[3 * p + x])
                            || super::kernel::behind(w[arrive + x], w[expect + x])
                    })
                    .collect(),
            ));
        }
        let mismatch = mismatched(&calls);
        let mine = waits[self.me].clone().unwrap_or_default();
        let mut seen = vec![false; p];
        seen[self.me] = true;
        let mut chain = Vec::new();
        let mut todo: Vec<usize> = mine.clone();
        let (mut culprits, mut elsewhere) = (Vec::new(), Vec::new());
        while let Some(q) = todo.pop() {
            if std::mem::replace(&mut seen[q], true) {
                continue;
            }
            match &waits[q] {
                None => elsewhere.push(q),
                Some(w) if w.is_empty() => culprits.push(q),
                Some(w) => {
                    chain.push(format!("rank {q} waits on {}", RankList(w)));
                    todo.extend(w);
                }
            }
        }
        culprits.sort_unstable();
        elsewhere.sort_unstable();
        if culprits.is_empty() && elsewhere.is_empty() {
            return (mine, None, mismatch);
        }
        let mut text = format!("rank {} waits on {}", self.me, RankList(&mine));
        for c in chain {
            text.push_str("; ");
            text.push_str(&c);
        }
        if !culprits.is_empty() {
            text.push_str(&format!(
                "; {} {} on no one in this call (not in it, or held up outside strata)",
                RankList(&culprits),
                if culprits.len() == 1 { "waits" } else { "wait" }
            ));
        }
        if !elsewhere.is_empty() {
            text.push_str(&format!(
                "; {} {} on another host, whose flags this host cannot read",
                RankList(&elsewhere),
                if elsewhere.len() == 1 { "is" } else { "are" }
            ));
        }
        culprits.extend(elsewhere);
        culprits.sort_unstable();
        (culprits, Some(text), mismatch)
    }
}

/// Two ranks in their n-th device call with different arguments (collective, type, operator,
/// count, root or algorithm): `rank 0 is in all_reduce #3 (...) and rank 2 in all_reduce #3
/// (...)`. Ranks in different calls are not compared (one may just be behind).
fn mismatched(calls: &[Option<Header>]) -> Option<String> {
    let known: Vec<(usize, Header)> = calls
        .iter()
        .enumerate()
        .filter_map(|(r, h)| h.map(|h| (r, h)))
        .collect();
    for (i, (a, ha)) in known.iter().enumerate() {
        for (b, hb) in &known[i + 1..] {
            if ha.seq == hb.seq && ha != hb {
                return Some(format!(
                    "rank {a} is in {} and rank {b} in {}",
                    ha.describe(),
                    hb.describe()
                ));
            }
        }
    }
    None
}

/// How long the monitor waits for a copy of a flag area after a timeout. A copy that does
/// not come back in this time is queued behind work that cannot move; the diagnosis then goes
/// without it rather than hold up the release. (On an H200 with three ranks time-sliced on it,
/// one rank's monitor never released its stream when the read had no deadline; a read that
/// never finished is the likely cause, not a proven one.)
const READ_DEADLINE: Duration = Duration::from_secs(1);

/// The monitor's streams and pinned words for writing and reading the flag area: one pair
/// each way, so a read that cannot finish never holds a release back behind it on a stream.
struct Release {
    writes: Stream,
    written: PinnedBuffer,
    reads: Stream,
    read_into: PinnedBuffer,
    read_done: Event,
    /// A read missed its deadline: its copy may still land in `read_into`, so no other read
    /// is tried.
    stuck: std::cell::Cell<bool>,
}

impl Release {
    fn new(device: i32, words: usize) -> Result<Self> {
        set_device(device)?;
        Ok(Self {
            writes: Stream::new(device)?,
            written: PinnedBuffer::new(4 * words.max(1))?,
            reads: Stream::new(device)?,
            read_into: PinnedBuffer::new(4 * words.max(1))?,
            read_done: Event::new(false)?,
            stuck: std::cell::Cell::new(false),
        })
    }

    /// Writes `values` over the flag area at `flags`, on the monitor's stream (no waiting).
    fn write(&self, flags: u64, values: &[u32]) {
        let n = values.len().min(self.written.len() / 4);
        // SAFETY: the pinned buffer holds at least `n` words; only this thread writes it, and
        // the copy before has finished or reads what this one writes too (same values).
        unsafe { std::ptr::copy_nonoverlapping(values.as_ptr(), self.written.as_ptr().cast(), n) };
        // SAFETY: the flag area is `n` words of this communicator's program buffer, alive
        // while the monitor runs; the source is pinned memory of that size.
        let _ = call("cuMemcpyHtoDAsync", || unsafe {
            sys::cuMemcpyHtoDAsync_v2(
                flags,
                self.written.as_ptr().cast(),
                4 * n,
                self.writes.raw(),
            )
        });
    }

    /// Reads `words` words of the flag area (after a fault), waiting at most
    /// [`READ_DEADLINE`] for the copy.
    fn read(&self, flags: u64, words: usize) -> Result<Vec<u32>> {
        if self.stuck.get() {
            return Err(Error::Transport(
                "an earlier read of the flag areas never finished".into(),
            ));
        }
        let n = words.min(self.read_into.len() / 4);
        // SAFETY: as in `write`, the other way.
        call("cuMemcpyDtoHAsync", || unsafe {
            sys::cuMemcpyDtoHAsync_v2(
                self.read_into.as_ptr().cast(),
                flags,
                4 * n,
                self.reads.raw(),
            )
        })?;
        self.read_done.record(&self.reads)?;
        let asked = Instant::now();
        while !self.read_done.is_complete()? {
            if asked.elapsed() > READ_DEADLINE {
                self.stuck.set(true);
                return Err(Error::Transport(format!(
                    "a copy of the flag area did not come back within {:.0} s (the GPU queue it \
                     went through is held)",
                    READ_DEADLINE.as_secs_f64()
                )));
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        let mut out = vec![0u32; n];
        // SAFETY: `n` words just copied into the pinned buffer.
        unsafe {
            std::ptr::copy_nonoverlapping(self.read_into.as_ptr().cast(), out.as_mut_ptr(), n)
        };
        Ok(out)
    }
}
