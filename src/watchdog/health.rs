//! A communicator's health record: the fault that broke it, what it is doing, and the
//! flight recorder of its last operations, written out as JSON after a fault.

use crate::bootstrap::PeerInfo;
use crate::error::Error;
use crate::executor::Header;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::os::unix::net::UnixDatagram;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Operations the flight recorder keeps per communicator.
const FLIGHT_RECORDS: usize = 256;

/// What one rank last reported about its work.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Progress {
    /// Sequence number of the last collective started.
    pub started: u64,
    /// Sequence number of the last collective that finished successfully.
    pub finished: u64,
    /// The collective in progress, if any, e.g. `all_reduce #12 (float, sum, 1024 elements)`.
    pub current: Option<String>,
}

impl Progress {
    /// "in all_reduce #12 (...)" or "idle after #11".
    pub fn describe(&self) -> String {
        match &self.current {
            Some(op) => format!("in {op}"),
            None => format!("idle after collective #{}", self.finished),
        }
    }
}

/// One operation as the flight recorder keeps it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FlightRecord {
    /// Sequence number (collectives; 0 for point-to-point).
    pub seq: u64,
    /// What the call was.
    pub op: String,
    /// Start, microseconds since the Unix epoch (comparable across hosts with synced clocks).
    pub start_us: u64,
    /// End, if it ended.
    pub end_us: Option<u64>,
    /// The error it ended with, if any.
    pub error: Option<String>,
}

/// Microseconds since the Unix epoch, read straight from the (vDSO) clock: a call reads it
/// twice, and `SystemTime` arithmetic cost more than the read.
fn now_us() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid timespec to write.
    if unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut t) } != 0 {
        return SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as u64);
    }
    t.tv_sec as u64 * 1_000_000 + t.tv_nsec as u64 / 1_000
}

/// The flight recorder's clock. Where the CPU's time-stamp counter is invariant (x86-64 with
/// `constant_tsc` and `nonstop_tsc`), a call reads the counter (11 ns on the 2-core EPYC VM
/// against 27 ns for the wall clock) and a reading becomes microseconds since the epoch only
/// when a record is read, at the counter's rate between the recorder's start and then.
/// Elsewhere a stamp is the wall clock itself.
#[derive(Clone, Copy)]
struct Clock {
    /// (counter, wall-clock µs) when the recorder started; `None`: stamps are wall clock.
    origin: Option<(u64, u64)>,
}

impl Default for Clock {
    fn default() -> Self {
        Self {
            origin: invariant_tsc().then(|| (tsc(), now_us())),
        }
    }
}

impl Clock {
    fn stamp(&self) -> u64 {
        match self.origin {
            Some(_) => tsc(),
            None => now_us(),
        }
    }

    fn micros(&self, stamp: u64) -> u64 {
        let Some((t0, w0)) = self.origin else {
            return stamp;
        };
        let (t1, w1) = (tsc(), now_us());
        if t1 <= t0 || w1 <= w0 {
            return w0;
        }
        let ticks_per_us = (t1 - t0) as f64 / (w1 - w0) as f64;
        w0 + (stamp.saturating_sub(t0) as f64 / ticks_per_us) as u64
    }
}

/// Whether the time-stamp counter ticks at one rate on every core, in every power state.
fn invariant_tsc() -> bool {
    static INVARIANT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *INVARIANT.get_or_init(|| {
        cfg!(target_arch = "x86_64")
            && std::fs::read_to_string("/proc/cpuinfo").is_ok_and(|c| {
                let flags = c.lines().find(|l| l.starts_with("flags")).unwrap_or("");
                let has = |f: &str| flags.split_whitespace().any(|w| w == f);
                has("constant_tsc") && has("nonstop_tsc")
            })
    })
}

fn tsc() -> u64 {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: rdtsc has no preconditions on x86-64.
    return unsafe { core::arch::x86_64::_rdtsc() };
    #[cfg(not(target_arch = "x86_64"))]
    0
}

/// What a rank is doing and has done, as kept under one lock (a call takes it once as it
/// starts and once as it ends): the headers are formatted only when someone asks.
#[derive(Default)]
struct Now {
    started: u64,
    finished: u64,
    current: Option<Header>,
    flight: VecDeque<Kept>,
    clock: Clock,
}

/// A flight record as kept (formatted into a [`FlightRecord`] when read), so that a call
/// allocates and formats nothing to be recorded.
struct Kept {
    seq: u64,
    op: Header,
    /// [`Clock`] stamps.
    start: u64,
    end: Option<u64>,
    error: Option<String>,
}

/// The health of one communicator, shared by its calls, its watchdog and other threads.
#[derive(Default)]
pub(crate) struct Health {
    /// Set by `Communicator::abort` or by a recorded fault: waiting calls give up.
    pub interrupt: AtomicBool,
    /// `Communicator::abort` was called.
    pub user_abort: AtomicBool,
    /// Set once `fault` holds an error, so healthy calls skip the lock.
    pub has_failed: AtomicBool,
    fault: Mutex<Option<Error>>,
    progress: Mutex<Now>,
    /// Wakes the watchdog thread so that it announces a fault at once.
    pub(super) waker: Mutex<Option<UnixDatagram>>,
}

impl Health {
    /// Records `e` as the fault that broke the communicator unless one is already recorded,
    /// and interrupts the call in progress. True when `e` is the first.
    pub fn record_fault(&self, e: &Error) -> bool {
        let first = match self.fault.lock() {
            Ok(mut f) if f.is_none() => {
                *f = Some(e.clone());
                true
            }
            _ => false,
        };
        self.has_failed.store(true, Ordering::Release);
        self.interrupt.store(true, Ordering::Release);
        if first && let Ok(Some(w)) = self.waker.lock().as_deref() {
            let _ = w.send(&[1]);
        }
        first
    }

    /// The recorded fault, if any; never blocks for long.
    pub fn fault(&self) -> Option<Error> {
        if !self.has_failed.load(Ordering::Acquire) {
            return None;
        }
        self.fault.lock().ok().and_then(|g| g.clone())
    }

    /// Stops the call in progress and every later one.
    pub fn abort(&self) {
        self.user_abort.store(true, Ordering::Release);
        self.interrupt.store(true, Ordering::Release);
    }

    /// A call starts: a collective (its sequence number moves `started`) or a point-to-point
    /// transfer ([`Header::call_seq`] 0).
    pub fn op_started(&self, op: &Header) {
        let seq = op.call_seq();
        if let Ok(mut p) = self.progress.lock() {
            if seq > 0 {
                p.started = seq;
            }
            p.current = Some(*op);
            if p.flight.len() == FLIGHT_RECORDS {
                p.flight.pop_front();
            }
            let start = p.clock.stamp();
            p.flight.push_back(Kept {
                seq,
                op: *op,
                start,
                end: None,
                error: None,
            });
        }
    }

    /// The call that [`Health::op_started`] announced ended.
    pub fn op_finished(&self, seq: u64, error: Option<&Error>) {
        if let Ok(mut p) = self.progress.lock() {
            if seq > 0 && error.is_none() {
                p.finished = seq;
            }
            p.current = None;
            let stamp = p.clock.stamp();
            if let Some(last) = p.flight.back_mut() {
                last.end = Some(stamp);
                last.error = error.map(|e| e.to_string());
            }
        }
    }

    /// What this rank is doing now.
    pub fn progress(&self) -> Progress {
        self.progress
            .lock()
            .map(|p| Progress {
                started: p.started,
                finished: p.finished,
                current: p.current.map(|h| h.describe()),
            })
            .unwrap_or_default()
    }

    /// The flight recorder's records, oldest first.
    pub fn flight_records(&self) -> Vec<FlightRecord> {
        self.progress
            .lock()
            .map(|p| {
                p.flight
                    .iter()
                    .map(|k| FlightRecord {
                        seq: k.seq,
                        op: k.op.describe(),
                        start_us: p.clock.micros(k.start),
                        end_us: k.end.map(|e| p.clock.micros(e)),
                        error: k.error.clone(),
                    })
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// After a fault, writes this rank's flight record as JSON into `dir` (`STRATA_TRACE_DIR`;
/// nothing when unset) and logs where, or why it could not.
pub(crate) fn dump_trace(
    dir: Option<&std::path::Path>,
    comm_id: &str,
    me: &PeerInfo,
    health: &Health,
) {
    let Some(dir) = dir else { return };
    match write_trace(dir, comm_id, me, health) {
        Ok(path) => tracing::info!(
            rank = me.rank,
            "flight record written to {}",
            path.display()
        ),
        Err(e) => tracing::warn!(rank = me.rank, "writing the flight record: {e}"),
    }
}

/// Writes the JSON file and returns its path.
fn write_trace(
    dir: &std::path::Path,
    comm_id: &str,
    me: &PeerInfo,
    health: &Health,
) -> std::io::Result<std::path::PathBuf> {
    #[derive(Serialize)]
    struct Trace<'a> {
        comm: &'a str,
        rank: usize,
        host: &'a str,
        pid: u32,
        written_us: u64,
        fault: Option<String>,
        progress: Progress,
        operations: Vec<FlightRecord>,
    }
    let trace = Trace {
        comm: comm_id,
        rank: me.rank,
        host: &me.host.hostname,
        pid: me.pid,
        written_us: now_us(),
        fault: health.fault().map(|e| e.to_string()),
        progress: health.progress(),
        operations: health.flight_records(),
    };
    std::fs::create_dir_all(dir)?;
    let path = dir.join(format!("strata-{comm_id}-rank{}.json", me.rank));
    let body = serde_json::to_vec_pretty(&trace).map_err(std::io::Error::other)?;
    std::fs::write(&path, body)?;
    Ok(path)
}
