//! A communicator's health record: the fault that broke it, what it is doing, and the
//! flight recorder of its last operations, written out as JSON after a fault.

use crate::error::Error;
use crate::wire::{HEADER_BYTES, PeerInfo, Progress};
use serde::{Deserialize, Serialize};
use std::os::unix::net::UnixDatagram;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};

use super::flight::{Recorder, now_us};

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
    recorder: Recorder,
    /// The peers this rank names as stragglers now (changed only when one is named or
    /// recovers), for the flight record.
    stragglers: Mutex<Vec<super::Straggler>>,
    /// This rank's own stall share, per mille (what its headers carry), for the metrics.
    own_share: AtomicU16,
    /// Wakes the watchdog thread so that it announces a fault at once.
    pub(super) waker: Mutex<Option<UnixDatagram>>,
    /// Whom the call in progress is blocked on, written by the executor's waits.
    pub waits: std::sync::Arc<crate::executor::WaitBoard>,
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

    /// A call starts: a collective (its sequence number `call_seq` moves `started`) or a
    /// point-to-point transfer ([`Header::call_seq`](crate::wire::Header::call_seq) 0),
    /// with its header `encoded`. Callers hold the communicator's state lock.
    pub fn op_started(&self, call_seq: u64, encoded: &[u8; HEADER_BYTES]) {
        self.recorder.start(call_seq, encoded);
    }

    /// The call that [`Health::op_started`] announced ended. Callers hold the state lock.
    /// Returns how long the call ran, in ticks of the recorder's clock
    /// ([`Health::seconds_per_tick`]).
    pub fn op_finished(&self, seq: u64, error: Option<&Error>) -> u64 {
        self.recorder.finish(seq, error)
    }

    /// Seconds per tick of what [`Health::op_finished`] returns (`None` until the clock
    /// has ticked); reads two clocks.
    pub fn seconds_per_tick(&self) -> Option<f64> {
        self.recorder.seconds_per_tick()
    }

    /// A call on device buffers was enqueued (header `encoded`); its number for
    /// [`Health::device_op_finished`]. Callers hold the state lock, as for host calls.
    pub fn device_op_started(&self, encoded: &[u8; HEADER_BYTES]) -> u64 {
        self.recorder.start_device(encoded)
    }

    /// The device call numbered `number` ended on its stream (any thread).
    pub fn device_op_finished(&self, number: u64, error: Option<&Error>) {
        self.recorder.finish_device(number, error);
    }

    /// What this rank is doing now.
    pub fn progress(&self) -> Progress {
        self.recorder.progress()
    }

    /// The host call in progress and how long it has run, if any.
    pub fn current_call(&self) -> Option<(crate::wire::Header, std::time::Duration)> {
        self.recorder.current_call()
    }

    /// The flight recorder's records, oldest first.
    pub fn flight_records(&self) -> Vec<FlightRecord> {
        self.recorder.records()
    }

    /// Replaces the stragglers this rank names.
    pub fn set_stragglers(&self, now: Vec<super::Straggler>) {
        if let Ok(mut s) = self.stragglers.lock() {
            *s = now;
        }
    }

    /// Notes this rank's own stall share, per mille.
    pub fn set_own_stall_share(&self, per_mille: u16) {
        self.own_share.store(per_mille, Ordering::Relaxed);
    }

    /// This rank's own stall share, 0 to 1.
    pub fn own_stall_share(&self) -> f64 {
        f64::from(self.own_share.load(Ordering::Relaxed)) / 1000.0
    }

    /// The stragglers this rank names.
    pub fn stragglers(&self) -> Vec<super::Straggler> {
        self.stragglers
            .lock()
            .map(|s| s.clone())
            .unwrap_or_default()
    }
}

/// After a fault, or when a straggler is named or recovers, writes this rank's flight record
/// as JSON into `dir` (`STRATA_TRACE_DIR`; nothing when unset) and logs where, or why it
/// could not. `root` is rank 0, whose process
/// names the job in the file name (see [`trace_file_name`]).
pub(crate) fn dump_trace(
    dir: Option<&std::path::Path>,
    comm_id: &str,
    me: &PeerInfo,
    root: &PeerInfo,
    health: &Health,
) {
    let Some(dir) = dir else { return };
    match write_trace(dir, comm_id, me, root, health) {
        Ok(path) => tracing::info!(
            rank = me.rank,
            "flight record written to {}",
            path.display()
        ),
        Err(e) => tracing::warn!(rank = me.rank, "writing the flight record: {e}"),
    }
}

/// `strata-<comm>-job<pid of rank 0>-rank<r>.json`: the communicator's id alone repeats when
/// a job is rerun on the same rendezvous address (its secret then derives from the address),
/// and the rerun would overwrite the last job's traces; rank 0's process id, which every rank
/// knows, tells the runs apart and keeps one job's files together.
pub(crate) fn trace_file_name(comm_id: &str, root_pid: u32, rank: usize) -> String {
    format!("strata-{comm_id}-job{root_pid}-rank{rank}.json")
}

/// Writes the JSON file and returns its path.
fn write_trace(
    dir: &std::path::Path,
    comm_id: &str,
    me: &PeerInfo,
    root: &PeerInfo,
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
        stragglers: Vec<super::Straggler>,
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
        stragglers: health.stragglers(),
        operations: health.flight_records(),
    };
    std::fs::create_dir_all(dir)?;
    let path = dir.join(trace_file_name(comm_id, root.pid, me.rank));
    let body = serde_json::to_vec_pretty(&trace).map_err(std::io::Error::other)?;
    std::fs::write(&path, body)?;
    Ok(path)
}
