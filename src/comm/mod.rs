//! The `Communicator`: the one type most users touch.

use crate::bootstrap::{self, JobRoot, UniqueId};
use crate::config::{Config, RankOrder};
use crate::connection::{self, CommListener, Connection, ControlFrame};
use crate::dtype::{DataType, Element, ReduceOp};
use crate::error::{Error, RankList, Result};
use crate::executor::{
    self, Buffers, HEADER_BYTES, Header, OpRun, SMALL_MAX_BYTES, SmallDoubling, SmallOneShot,
};
use crate::reduce::{self, Combine};
use crate::status::JobStatus;
use crate::watchdog::{self, FlightRecord, Health, Progress, Watchdog, WatchdogSetup};
use crate::wire::{PeerInfo, Secret};
use listening::Listening;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use strata_algorithms::layout::{GroupKind, Layout};
use strata_algorithms::schedule::{Buf, Op, Region, Step};
use strata_algorithms::tuner::{Explanation, Tuner};
use strata_algorithms::{Algorithm, Collective, Hierarchy, Plan, RankSchedule, valid_names};
use strata_topology::{HostIdentity, RankPlace, Tier, TierCosts, TierMatrix};

/// Most schedules kept per communicator.
const SCHEDULE_CACHE: usize = 512;
/// How long destroying a communicator waits for its connections' last data to be delivered.
const FINISH_SENDING: Duration = Duration::from_secs(5);

/// One collective call, independent of the buffers.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CallSpec {
    /// The collective.
    pub collective: Collective,
    /// Element type.
    pub dtype: DataType,
    /// Elements, with NCCL's meaning (per rank for gather-like and scatter-like collectives).
    pub count: usize,
    /// Reduction (ignored by collectives that do not reduce).
    pub op: ReduceOp,
    /// Root of rooted collectives (ignored otherwise).
    pub root: usize,
}

impl CallSpec {
    /// A call of `collective` on `count` elements of `dtype`, summing, rooted at 0.
    pub fn new(collective: Collective, dtype: DataType, count: usize) -> Self {
        Self {
            collective,
            dtype,
            count,
            op: ReduceOp::Sum,
            root: 0,
        }
    }

    /// Byte offsets of the input and of the output inside the single buffer of an in-place
    /// call by `rank` (NCCL's rules: all_gather and gather put the input at block `rank`,
    /// reduce_scatter and scatter put the output there).
    pub fn in_place_offsets(&self, rank: usize) -> (usize, usize) {
        let block = self.count * self.dtype.size();
        let is_root = rank == self.root;
        match self.collective {
            Collective::AllGather => (rank * block, 0),
            Collective::Gather if is_root => (rank * block, 0),
            Collective::ReduceScatter => (0, rank * block),
            Collective::Scatter if is_root => (0, rank * block),
            _ => (0, 0),
        }
    }
}

struct State {
    conns: Vec<Option<Connection>>,
    seq: u64,
    /// Collectives enqueued on device buffers as stream programs (numbered apart from the
    /// host calls, whose `seq` the ranks compare).
    device_seq: u64,
    /// Which peers this rank hears from late, call after call.
    stragglers: crate::watchdog::stragglers::Stragglers,
    /// When the straggler view was last copied to the health record ([`coarse_now`] time).
    ///
    /// [`coarse_now`]: crate::watchdog::stragglers::coarse_now
    stragglers_published: Duration,
    /// Seconds per tick of the flight recorder's clock, as the straggler accounting last
    /// measured it (0 before it has).
    seconds_per_tick: f64,
    /// Calls the straggler accounting has folded in (not set aside), which time the
    /// measurements of `seconds_per_tick`.
    folds: u64,
    p2p_sent: HashMap<usize, u64>,
    p2p_received: HashMap<usize, u64>,
    scratch: Vec<u64>,
    staging: Vec<u64>,
    schedules: HashMap<Plan, Arc<CachedPlan>>,
    /// What the previous call was made of: the same call again (a training loop's usual
    /// case) skips choosing, planning, hashing and encoding.
    last_call: Option<Box<LastCall>>,
    /// The tuner's choice for the previous call's (collective, bytes): a repeated call skips
    /// the tuner's lock and table.
    last_choice: Option<(Collective, usize, Algorithm)>,
    /// Calls the small all-reduce path ran.
    small_calls: u64,
    /// Near-tie trials by (collective, size class) ([`trial`]).
    trials: HashMap<trial::TrialKey, trial::Trial>,
    /// Set while the ranks agree on a trial's outcome: that call takes part in no trial.
    agreeing: bool,
    exec: executor::ExecBuffers,
    splits: u64,
    /// The peer the last receive from any source took its message from.
    any_source_last: usize,
    shrinks: u64,
}

/// A schedule and what a call needs besides it, built once per (collective, algorithm, count).
struct CachedPlan {
    sched: RankSchedule,
    /// Ranks this rank exchanges headers with: its schedule's peers and both ring neighbours.
    exchange: Vec<usize>,
    /// The small path, which runs all-reduces of up to [`SMALL_MAX_BYTES`] without the step
    /// machinery, where one applies.
    small: Option<SmallPath>,
}

/// A call's spec and everything derived from it but its sequence number.
struct LastCall {
    spec: CallSpec,
    /// The word of [`Inner::algo_choice`] it was derived under: a later explicit choice
    /// derives again.
    forced: u8,
    /// Its header, with sequence number 0, and that header encoded.
    header: Header,
    encoded: [u8; HEADER_BYTES],
    cached: Arc<CachedPlan>,
    /// Whether a near-tie trial of its size class chose its algorithm ([`trial`]): such a
    /// call is derived afresh every time, and timed.
    in_trial: bool,
}

/// A small all-reduce path and its peers.
enum SmallPath {
    /// Recursive doubling, where this rank's part is one plain exchange per step (every rank
    /// at a power-of-two rank count).
    Doubling(SmallDoubling),
    /// One-shot.
    OneShot(SmallOneShot),
}

impl State {
    /// Whether a connection to every one of `peers` is open.
    fn connected_to(&self, peers: &[usize]) -> bool {
        peers.iter().all(|&q| self.conns[q].is_some())
    }
}

impl CachedPlan {
    fn new(plan: &Plan, sched: RankSchedule, rank: usize, p: usize) -> Self {
        let exchange = sched.header_peers(rank, p);
        let small = match (plan.collective, plan.algorithm) {
            (Collective::AllReduce, Algorithm::RecursiveDoubling) => {
                SmallDoubling::from_schedule(&sched, &exchange).map(SmallPath::Doubling)
            }
            (Collective::AllReduce, Algorithm::OneShot) => {
                SmallOneShot::from_schedule(&sched, p, plan.count).map(SmallPath::OneShot)
            }
            _ => None,
        };
        Self {
            sched,
            exchange,
            small,
        }
    }
}

pub(crate) struct Inner {
    rank: usize,
    size: usize,
    comm_id: String,
    secret: Secret,
    peers: Vec<PeerInfo>,
    cfg: Config,
    listener: Listening,
    /// Abort flags, the fault that broke the communicator, progress and the flight record.
    health: Arc<Health>,
    /// Heartbeats to the ring neighbours (none for one rank or with heartbeats off); held
    /// for its life and its goodbye on drop.
    _watchdog: Option<Watchdog>,
    /// Deadline of each call, ms (`STRATA_TIMEOUT`, or [`Communicator::set_timeout`]).
    timeout_ms: AtomicU64,
    state: Mutex<State>,
    /// The algorithm chosen per collective (`STRATA_ALGO`, `NCCL_ALGO` or
    /// [`Communicator::set_algorithm`]), indexed by `Collective::code`: 0 for automatic, else
    /// the algorithm's code + 1.
    algo_choice: [AtomicU8; Collective::ALL.len()],
    /// Schedules built so far (repeated shapes reuse the cached one).
    schedules_built: AtomicU64,
    /// The tier between every pair of ranks, identical on every rank.
    tiers: TierMatrix,
    /// Prices algorithms on those tiers and chooses one per collective and size class.
    tuner: Tuner,
    spin: executor::SpinPolicy,
    /// Bytes sent ahead so far ([`Config::send_ahead`]).
    sent_ahead: AtomicU64,
    /// The most ranks of this communicator on one host, the same on every rank: what the ring
    /// all-reduce's slice is computed from.
    fullest_host: usize,
    /// The progress thread of stream-ordered calls on device buffers, started by the first.
    gpu: std::sync::OnceLock<device::StreamQueue>,
    /// Takes the census of a call that timed out (shared with the listener, which answers
    /// the other ranks' questions).
    diagnoser: Arc<crate::diagnosis::Diagnoser>,
    /// Answers the live view's questions (shared with the listener).
    status: Arc<crate::status::StatusSource>,
    /// The job's bootstrap root and its address, kept open for status clients while this
    /// communicator lives (rank 0 of [`Communicator::from_env`] only).
    job_root: std::sync::OnceLock<(std::net::SocketAddr, crate::bootstrap::JobRoot)>,
    /// This communicator's counters for the metrics exporters (`STRATA_METRICS_PORT`,
    /// `STRATA_METRICS_FILE`); none when neither is set.
    metrics: Option<Arc<crate::metrics::CommMetrics>>,
}

/// The four communicators of a 4D parallel layout ([`Communicator::split_layout`]).
pub struct LayoutComms {
    /// This rank's tensor-parallel group.
    pub tp: Communicator,
    /// Its context-parallel group.
    pub cp: Communicator,
    /// Its pipeline-parallel group.
    pub pp: Communicator,
    /// Its data-parallel group.
    pub dp: Communicator,
}

/// One point-to-point transfer of a [`Communicator::send_recv`] batch.
pub enum Transfer<'a> {
    /// Send `data` (elements of `dtype`) to `peer`.
    Send {
        /// The receiving rank.
        peer: usize,
        /// Element type, checked against the receiver's.
        dtype: DataType,
        /// What to send.
        data: &'a [u8],
    },
    /// Receive `data.len()` bytes (elements of `dtype`) from `peer`.
    Recv {
        /// The sending rank.
        peer: usize,
        /// Element type, checked against the sender's.
        dtype: DataType,
        /// Where the data lands.
        data: &'a mut [u8],
    },
}

impl Transfer<'_> {
    /// (peer, element type, bytes).
    fn parts(&self) -> (usize, DataType, usize) {
        match self {
            Transfer::Send { peer, dtype, data } => (*peer, *dtype, data.len()),
            Transfer::Recv { peer, dtype, data } => (*peer, *dtype, data.len()),
        }
    }

    fn is_send(&self) -> bool {
        matches!(self, Transfer::Send { .. })
    }

    fn verb(&self) -> &'static str {
        if self.is_send() { "send" } else { "recv" }
    }

    /// The buffer's address (a send's is only ever read).
    fn ptr(&mut self) -> *mut u8 {
        match self {
            Transfer::Send { data, .. } => data.as_ptr() as *mut u8,
            Transfer::Recv { data, .. } => data.as_mut_ptr(),
        }
    }
}

/// A group of ranks that run collectives together.
///
/// All methods take `&self`; calls on one communicator are serialised, and [`abort`]
/// (`Communicator::abort`) may be called from any thread at any time.
///
/// [`abort`]: Communicator::abort
pub struct Communicator {
    inner: Arc<Inner>,
}

fn comm_id_of(secret: &Secret, label: &[u8]) -> String {
    let mut h = blake3::Hasher::new();
    h.update(b"strata comm id");
    h.update(secret);
    h.update(label);
    h.finalize().to_hex()[..24].to_string()
}

mod collectives;
pub(crate) mod device;
mod engine;
mod grow;
mod init;
mod listening;
mod membership;
mod p2p;
pub(crate) mod probe;
mod shrink;
mod trial;
pub use trial::tuner_trial_calls;

impl Communicator {
    /// This rank.
    pub fn rank(&self) -> usize {
        self.inner.rank
    }

    /// Number of ranks.
    pub fn size(&self) -> usize {
        self.inner.size
    }

    /// What every rank said about itself at init.
    pub fn peers(&self) -> &[PeerInfo] {
        &self.inner.peers
    }

    /// The configuration in force.
    pub fn config(&self) -> &Config {
        &self.inner.cfg
    }

    /// The transport of the connection to `peer` (`shm`, `inproc`, `tcp`, `verbs`, `ofi`), once
    /// a call has opened it; `None` before.
    pub fn transport_to(&self, peer: usize) -> Option<&'static str> {
        let st = self.inner.state.lock().ok()?;
        st.conns.get(peer)?.as_ref().map(|c| c.data.name())
    }

    /// Makes the call in progress (from another thread) and every later call fail with
    /// `Aborted`. Returns at once; the waiting call notices within 50 ms.
    pub fn abort(&self) {
        self.inner.health.abort();
    }

    /// The error that broke this communicator, if any: the fault this rank or its watchdog
    /// found or heard of (`PeerFailed`, `Timeout`, `Mismatch`, ...), else `Aborted` after
    /// [`Communicator::abort`]. Never blocks; safe from any thread while a call runs.
    pub fn async_error(&self) -> Option<Error> {
        if let Some(e) = self.inner.health.fault() {
            return Some(e);
        }
        if self.inner.health.user_abort.load(Ordering::Acquire) {
            return Some(Error::Aborted(None));
        }
        None
    }

    /// How many questions this rank has asked other ranks while diagnosing timeouts (each
    /// diagnosis asks its tree parent once and its children once per call; see the README's
    /// "Faults"). For tests and benchmarks.
    #[doc(hidden)]
    pub fn diagnosis_questions_asked(&self) -> usize {
        self.inner.diagnoser.questions_asked()
    }

    /// Bytes this rank has sent ahead of their step ([`Config::send_ahead`]). For tests and
    /// benchmarks.
    #[doc(hidden)]
    pub fn bytes_sent_ahead(&self) -> u64 {
        self.inner.sent_ahead.load(Ordering::Relaxed)
    }

    /// Sets the deadline of the calls that follow (initially `STRATA_TIMEOUT`). A call that
    /// overruns it fails with a diagnosed [`Error::Timeout`] and breaks the communicator.
    pub fn set_timeout(&self, timeout: Duration) -> Result<()> {
        if timeout.is_zero() {
            return Err(Error::InvalidArgument(
                "a call's timeout must be positive".into(),
            ));
        }
        let ms = timeout.as_millis().clamp(1, u128::from(u64::MAX)) as u64;
        self.inner.timeout_ms.store(ms, Ordering::Relaxed);
        Ok(())
    }

    /// The peers this rank names as persistently slow (see [`crate::watchdog::stragglers`]):
    /// each rank names the peers it stalls on that hardly stall themselves, so ask every
    /// rank, or read the `warn` lines, for the whole picture. Empty while no one is slow.
    /// Does not wait for a call in progress.
    pub fn stragglers(&self) -> Vec<crate::Straggler> {
        self.inner.health.stragglers()
    }

    /// The deadline of each call.
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.inner.timeout_ms.load(Ordering::Relaxed))
    }

    /// What this rank is doing now (the last collective started and finished, and the one in
    /// progress), as its watchdog reports it to its neighbours.
    pub fn progress(&self) -> Progress {
        self.inner.health.progress()
    }

    /// The flight recorder: this communicator's last operations with their start and end
    /// times and errors, oldest first. After a fault each rank also writes them to
    /// `STRATA_TRACE_DIR`.
    pub fn flight_records(&self) -> Vec<FlightRecord> {
        self.inner.health.flight_records()
    }

    /// The algorithm used for `collective` on `bytes` per rank: the chosen one (see
    /// [`Communicator::set_algorithm`] and `STRATA_ALGO`), else a tuning-file rule's, else the
    /// fastest of those the model priced alike once host calls of the size class timed them,
    /// else the tuner's cheapest for the size class ([`Communicator::explain`] says why).
    pub fn algorithm_for(&self, collective: Collective, bytes: usize) -> Algorithm {
        self.forced_algorithm(collective)
            .or_else(|| self.trial_decision(collective, bytes))
            .unwrap_or_else(|| self.inner.tuner.choose(collective, bytes))
    }

    /// The algorithm set for `collective` by `STRATA_ALGO` or [`Communicator::set_algorithm`].
    fn forced_algorithm(&self, collective: Collective) -> Option<Algorithm> {
        self.forced_word(collective)
            .checked_sub(1)
            .and_then(Algorithm::from_code)
    }

    /// The raw word behind [`Communicator::forced_algorithm`]: 0, or an algorithm's code
    /// plus one.
    fn forced_word(&self, collective: Collective) -> u8 {
        self.inner.algo_choice[collective.code() as usize].load(Ordering::Relaxed)
    }

    /// Host calls of `collective` at `bytes` per rank that a near-tie trial would take before
    /// its winner runs, from the first call of the size class: 0 where none runs (an explicit
    /// choice, a rule, trials off, or no rival priced near the choice).
    pub fn tuner_trial_calls(&self, collective: Collective, bytes: usize) -> usize {
        let choice = self.inner.tuner.choose_with_rivals(collective, bytes);
        if choice.len() < 2
            || !self.inner.cfg.tuner_trials
            || self.forced_algorithm(collective).is_some()
        {
            return 0;
        }
        trial::tuner_trial_calls(bytes, choice.len())
    }

    /// The tuner's ranked table for `collective` at `bytes` per rank, with predicted times on
    /// this communicator's fabric and the reason for its choice. An explicit choice
    /// (`STRATA_ALGO`, [`Communicator::set_algorithm`]) is not reflected here; see
    /// [`Communicator::algorithm_for`].
    pub fn explain(&self, collective: Collective, bytes: usize) -> Explanation {
        let mut e = self.inner.tuner.explain(collective, bytes);
        let choice = self.inner.tuner.choose_with_rivals(collective, bytes);
        let trial_calls = self.tuner_trial_calls(collective, bytes);
        if let Some(won) = self.trial_decision(collective, bytes) {
            e.notes.push(format!(
                "host calls of this size class timed the {} priced alike and kept {won}",
                choice.len()
            ));
        } else if trial_calls > 0 {
            let names: Vec<String> = choice.all().map(|a| a.to_string()).collect();
            e.notes.push(format!(
                "{} are priced within {:.0}% of the choice: the first {trial_calls} host calls \
                 of this size class take turns among them and keep the fastest, every rank \
                 agreeing (STRATA_TUNER_TRIALS=0 keeps the model's choice)",
                names.join(", "),
                strata_algorithms::tuner::NEAR_TIE * 100.0,
            ));
        }
        if let Some(choice) = self.kernel_choice() {
            e.notes.push(choice.describe());
            let es = 4;
            let spec = CallSpec::new(collective, DataType::Float32, bytes / es);
            if let Some(name) = self.device_kernel_for(&spec) {
                e.notes.push(format!(
                    "on device buffers this call runs as one kernel: {name}"
                ));
            }
        }
        e
    }

    /// The cost model's predicted seconds for `algorithm` running `collective` at `bytes`
    /// per rank on this communicator, or why it cannot run here.
    pub fn predict(
        &self,
        collective: Collective,
        algorithm: Algorithm,
        bytes: usize,
    ) -> std::result::Result<f64, String> {
        self.inner.tuner.price(collective, algorithm, bytes).seconds
    }

    /// The cost model this communicator chooses with: its costs
    /// ([`strata_algorithms::tuner::Tuner::costs`]), and a model of the same ranks with other
    /// costs ([`strata_algorithms::tuner::Tuner::with_costs`]), as `collbench calibrate` fits.
    pub fn cost_model(&self) -> &Tuner {
        &self.inner.tuner
    }

    /// The most ranks per core of any of its hosts, as init measured them (0: unknown): above
    /// 1, ranks share cores and a cost profile's shared-core figures price them.
    pub fn ranks_per_core(&self) -> f64 {
        probe::ranks_per_core(&self.inner.peers)
    }

    /// The hierarchy this communicator's schedules follow (topology order, levels, rails).
    pub fn hierarchy(&self) -> &Hierarchy {
        self.inner.tuner.hierarchy()
    }

    /// Chooses the algorithm for `collective` from now on (`None`: automatic again), as
    /// `STRATA_ALGO` does at init. Every rank must make the same choice before its next call
    /// of that collective; ranks that disagree fail that call with a mismatch error.
    pub fn set_algorithm(
        &self,
        collective: Collective,
        algorithm: Option<Algorithm>,
    ) -> Result<()> {
        if let Some(a) = algorithm
            && !a.supports(collective)
        {
            return Err(Error::InvalidArgument(format!(
                "algorithm '{a}' cannot run {collective}; valid: {}",
                valid_names(collective)
            )));
        }
        let code = algorithm.map_or(0, |a| a.code() + 1);
        self.inner.algo_choice[collective.code() as usize].store(code, Ordering::Relaxed);
        Ok(())
    }

    /// The tier joining ranks `a` and `b` of this communicator (every rank computes the same).
    pub fn tier(&self, a: usize, b: usize) -> Tier {
        self.inner.tiers.tier(a, b)
    }

    /// The tiers of this communicator, with their digest.
    pub fn tiers(&self) -> &TierMatrix {
        &self.inner.tiers
    }

    /// How many calls ran on the small all-reduce path (recursive doubling without the step
    /// machinery), for tests.
    #[doc(hidden)]
    pub fn small_path_calls(&self) -> u64 {
        self.inner.state.lock().map_or(0, |st| st.small_calls)
    }

    /// The slice a ring all-reduce of `message_bytes` runs with on this communicator, in
    /// bytes (0: block by block), the same on every rank (it counts the fullest host); see
    /// [`Config::ring_slice_bytes`].
    pub fn ring_slice_bytes(&self, message_bytes: usize) -> usize {
        let inner = &*self.inner;
        inner
            .cfg
            .ring_slice_bytes(inner.size, inner.fullest_host, message_bytes)
    }

    /// How many schedules this communicator has built. A repeated (collective, algorithm,
    /// count, root) reuses its cached schedule, so this stops growing in a steady loop.
    pub fn schedules_built(&self) -> u64 {
        self.inner.schedules_built.load(Ordering::Relaxed)
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Ok(st) = self.state.get_mut() {
            // Data the NIC still holds is delivered before the goodbye and the teardown: the
            // last call's sends may complete at this rank before the peer has them. A
            // communicator that failed or was aborted owes no one its data and goes at once.
            let broken =
                self.health.fault().is_some() || self.health.user_abort.load(Ordering::Acquire);
            let within = if broken {
                Duration::ZERO
            } else {
                FINISH_SENDING
            };
            let deadline = Instant::now() + within;
            for c in st.conns.iter_mut().flatten() {
                let left = deadline.saturating_duration_since(Instant::now());
                if !c.finish_sending(left) && !broken {
                    tracing::warn!(
                        "rank {}: data to rank {} was still on its way after {FINISH_SENDING:?}; \
                         destroying the communicator drops it",
                        self.rank,
                        c.peer
                    );
                }
                c.send_control(&ControlFrame::Goodbye);
            }
        }
        // A peer that connected but that no call of this rank used yet hears it too, instead
        // of seeing its connection close as if this process had died.
        for mut c in self.listener.take_all() {
            c.send_control(&ControlFrame::Goodbye);
        }
    }
}

fn grow(v: &mut Vec<u64>, bytes: usize) {
    let words = bytes.div_ceil(8);
    if v.len() < words {
        v.resize(words, 0);
    }
}

fn same_len(a: usize, b: usize, what: &str) -> Result<()> {
    if a != b {
        return Err(Error::InvalidArgument(format!(
            "{what}: lengths {a} and {b} differ"
        )));
    }
    Ok(())
}

fn need(have: usize, want: usize, what: &str) -> Result<()> {
    if have < want {
        return Err(Error::InvalidArgument(format!(
            "{what} holds {have} bytes but the call needs {want}"
        )));
    }
    Ok(())
}
