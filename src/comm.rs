//! The `Communicator`: the one type most users touch.

use crate::bootstrap::{self, PeerInfo, Secret, UniqueId};
use crate::config::{Config, RankOrder};
use crate::connection::{self, CommListener, Connection, ControlFrame};
use crate::dtype::{DataType, Element, ReduceOp};
use crate::error::{Error, RankList, Result};
use crate::executor::{self, Buffers, Header, OpRun};
use crate::reduce::{self, Combine};
use crate::watchdog::{self, FlightRecord, Health, Progress, Watchdog, WatchdogSetup};
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

/// Communicators up to this size ask every rank for its status when a call times out; larger
/// ones ask only the ranks the call waited on.
const DIAGNOSE_ALL_UP_TO: usize = 256;

/// Most schedules kept per communicator.
const SCHEDULE_CACHE: usize = 512;

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
    p2p_sent: HashMap<usize, u64>,
    p2p_received: HashMap<usize, u64>,
    scratch: Vec<u64>,
    staging: Vec<u64>,
    schedules: HashMap<Plan, Arc<CachedPlan>>,
    /// The plan of the previous call: repeated calls skip hashing.
    last_plan: Option<(Plan, Arc<CachedPlan>)>,
    exec: executor::ExecBuffers,
    splits: u64,
    shrinks: u64,
}

/// A schedule and what a call needs besides it, built once per (collective, algorithm, count).
struct CachedPlan {
    sched: RankSchedule,
    /// Ranks this rank exchanges headers with: its schedule's peers and both ring neighbours.
    exchange: Vec<usize>,
}

impl CachedPlan {
    fn new(sched: RankSchedule, rank: usize, p: usize) -> Self {
        let mut exchange = sched.send_peers();
        exchange.extend(sched.recv_peers());
        if p > 1 {
            exchange.extend([(rank + 1) % p, (rank + p - 1) % p]);
        }
        exchange.sort_unstable();
        exchange.dedup();
        exchange.retain(|&q| q != rank);
        Self { sched, exchange }
    }
}

struct Inner {
    rank: usize,
    size: usize,
    comm_id: String,
    secret: Secret,
    peers: Vec<PeerInfo>,
    cfg: Config,
    listener: CommListener,
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

/// This rank's place in the fabric and the cost of each tier: from the topology file named by
/// `STRATA_TOPO_FILE` (by host name, or by rank for a compact fat tree), else from Slurm's
/// `SLURM_TOPOLOGY_ADDR` and `SLURM_TOPOLOGY_ADDR_PATTERN` with default costs, else unknown.
fn detect_fabric(host: &HostIdentity, rank: usize) -> Result<(RankPlace, TierCosts)> {
    let mut place = RankPlace::default();
    let mut costs = TierCosts::default();
    if let Ok(path) = std::env::var("STRATA_TOPO_FILE") {
        let fabric = strata_topology::fabric::load_file(std::path::Path::new(&path))
            .map_err(|e| Error::InvalidArgument(format!("STRATA_TOPO_FILE: {e}")))?;
        costs = fabric.tiers;
        place.switches =
            RankPlace::from_fabric(&fabric, &host.hostname, rank).ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "STRATA_TOPO_FILE {path} does not place host {} (rank {rank})",
                    host.hostname
                ))
            })?;
    } else if let Some(path) = RankPlace::from_slurm(
        std::env::var("SLURM_TOPOLOGY_ADDR").ok().as_deref(),
        std::env::var("SLURM_TOPOLOGY_ADDR_PATTERN").ok().as_deref(),
    ) {
        place.switches = path;
    }
    Ok((place, costs))
}

/// A chosen algorithm per collective, indexed by `Collective::code`.
type AlgoChoices = [Option<Algorithm>; Collective::ALL.len()];

/// The choices from `STRATA_ALGO`, or from `NCCL_ALGO` when `STRATA_ALGO` is unset.
fn parse_algo_env() -> Result<AlgoChoices> {
    match std::env::var("STRATA_ALGO") {
        Ok(spec) => parse_algo_spec(&spec),
        Err(_) => Ok(parse_nccl_algo(
            &std::env::var("NCCL_ALGO").unwrap_or_default(),
        )),
    }
}

/// Reads NCCL's `NCCL_ALGO` (`Ring`, `Tree,Ring`, `allreduce:tree;broadcast:ring`): for each
/// collective the first listed algorithm strata has for it. Words strata does not implement
/// (NVLS, CollNet, PAT) and exclusion lists (`^…`) are skipped with a warning rather than
/// failing, since the variable was written for NCCL.
fn parse_nccl_algo(spec: &str) -> AlgoChoices {
    let mut out: AlgoChoices = Default::default();
    let spec = spec.trim();
    if spec.is_empty() {
        return out;
    }
    if spec.starts_with('^') {
        tracing::warn!("NCCL_ALGO={spec}: exclusion lists are ignored by strata");
        return out;
    }
    let items: Vec<(Option<Collective>, &str)> = if spec.contains(':') {
        spec.split(';')
            .filter_map(|item| {
                let (c, list) = item.split_once(':')?;
                match Collective::parse(c) {
                    Some(c) => Some((Some(c), list)),
                    None => {
                        tracing::warn!("NCCL_ALGO: unknown collective '{c}' ignored");
                        None
                    }
                }
            })
            .collect()
    } else {
        vec![(None, spec)]
    };
    for (only, list) in items {
        for c in Collective::ALL {
            if only.is_some_and(|o| o != c) || out[c.code() as usize].is_some() {
                continue;
            }
            out[c.code() as usize] = list
                .split(',')
                .find_map(|word| Algorithm::parse_for(c, word));
        }
        for word in list.split(',') {
            if Algorithm::parse(word).is_none() {
                tracing::warn!("NCCL_ALGO: '{}' is not implemented by strata", word.trim());
            }
        }
    }
    out
}

/// Parses `collective:algorithm;...` (the `STRATA_ALGO` syntax).
fn parse_algo_spec(spec: &str) -> Result<AlgoChoices> {
    let mut out: AlgoChoices = Default::default();
    for item in spec.split(';').map(str::trim).filter(|s| !s.is_empty()) {
        let (coll, algo) = item.split_once(':').ok_or_else(|| {
            Error::InvalidArgument(format!(
                "STRATA_ALGO item '{item}' is not collective:algorithm"
            ))
        })?;
        let coll = Collective::parse(coll).ok_or_else(|| {
            let valid: Vec<&str> = Collective::ALL.iter().map(|c| c.name()).collect();
            Error::InvalidArgument(format!(
                "STRATA_ALGO: unknown collective '{coll}'; valid: {}",
                valid.join(", ")
            ))
        })?;
        let algo = Algorithm::parse_for(coll, algo).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "STRATA_ALGO: '{algo}' cannot run {coll}; valid: {}",
                valid_names(coll)
            ))
        })?;
        out[coll.code() as usize] = Some(algo);
    }
    Ok(out)
}

impl Communicator {
    /// Joins the communicator named by `id` as `rank` of `nranks`, with configuration from the
    /// environment. Every rank must call this; it returns when all have arrived, or fails on
    /// every rank that did arrive, naming the missing ones, when `STRATA_INIT_TIMEOUT` runs out.
    pub fn init(id: &UniqueId, nranks: usize, rank: usize) -> Result<Self> {
        Self::init_with_config(id, nranks, rank, Config::from_env()?)
    }

    /// [`Communicator::init`] with an explicit configuration.
    pub fn init_with_config(
        id: &UniqueId,
        nranks: usize,
        rank: usize,
        cfg: Config,
    ) -> Result<Self> {
        if nranks == 0 || rank >= nranks {
            return Err(Error::InvalidArgument(format!(
                "rank {rank} is out of range for {nranks} ranks"
            )));
        }
        crate::init_logging();
        let secret = id.secret();
        let comm_id = comm_id_of(&secret, b"world");
        let listener = CommListener::bind(&cfg)?;
        let listen = listener
            .local_addr()
            .map_err(|e| Error::io("listener address", e))?;
        let listener = CommListener::start(listener, comm_id.clone(), rank, nranks, secret, &cfg)?;
        let host = HostIdentity::detect();
        let (mut place, costs) = detect_fabric(&host, rank)?;
        // The NIC this rank's traffic leaves by: the PCI function of its listen interface.
        place.nic = crate::config::interface_of(cfg.listen_ip).and_then(|name| {
            strata_topology::sysfs::pci_of_interface(std::path::Path::new("/"), &name)
        });
        let me = PeerInfo {
            rank,
            host,
            pid: std::process::id(),
            process: bootstrap::process_nonce(),
            listen,
            place,
        };
        let peers = bootstrap::rendezvous(id, nranks, me, &cfg)?;
        tracing::debug!(rank, nranks, "communicator initialised");
        Self::from_parts(rank, peers, comm_id, secret, cfg, listener, costs)
    }

    /// Joins using the launcher's variables: rank and size from torchrun, Slurm, Open MPI or
    /// MPICH; the root from `STRATA_ROOT=host:port`, else `MASTER_ADDR` with port
    /// `STRATA_PORT` (default `MASTER_PORT + 1`, since torchrun's store owns `MASTER_PORT`).
    /// The job secret is `STRATA_SECRET` (32 hex digits) when set, otherwise derived from the
    /// launcher's job identifiers and the root address.
    pub fn from_env() -> Result<Self> {
        let info = crate::launcher::detect()?.ok_or_else(|| {
            Error::InvalidArgument("no launcher variables found (RANK/WORLD_SIZE, SLURM_PROCID/SLURM_NTASKS, OMPI_COMM_WORLD_*, PMI_*)".into())
        })?;
        let root = root_from_env()?;
        let secret = secret_from_env(&root)?;
        let cfg = Config::from_env()?;
        let id = if info.rank == 0 {
            let bind = SocketAddr::new(
                if root.is_ipv4() {
                    IpAddr::from([0, 0, 0, 0])
                } else {
                    IpAddr::from([0u16; 8])
                },
                root.port(),
            );
            let served = UniqueId::serve(bind, secret, cfg.init_timeout)?;
            UniqueId::from_parts(
                SocketAddr::new(root.ip(), served.root_addr().port()),
                &secret,
            )
        } else {
            UniqueId::from_parts(root, &secret)
        };
        Self::init_with_config(&id, info.size, info.rank, cfg)
    }

    fn from_parts(
        rank: usize,
        peers: Vec<PeerInfo>,
        comm_id: String,
        secret: Secret,
        cfg: Config,
        listener: CommListener,
        costs: TierCosts,
    ) -> Result<Self> {
        let size = peers.len();
        let tiers = TierMatrix::new(
            &peers
                .iter()
                .map(|p| (p.host.clone(), p.place.clone()))
                .collect::<Vec<_>>(),
            costs,
        );
        if rank == 0 && tiers.hosts() > 1 && !tiers.fabric_known() {
            tracing::warn!(
                "no fabric information for {} hosts (set STRATA_TOPO_FILE, or run under Slurm's \
                 topology plugin): two tiers, same host and network",
                tiers.hosts()
            );
        }
        let tuner = Tuner::new(
            Hierarchy::from_tiers(&tiers),
            tiers.costs(),
            cfg.rank_order == RankOrder::Topology,
        )
        .with_rules(cfg.tuning_rules.clone());
        // Ranks that share this kernel's cores, network namespaces or not: they compete for
        // the CPU while they wait.
        let me = &peers[rank].host;
        let local_ranks = peers.iter().filter(|p| p.host.same_kernel(me)).count();
        let state = State {
            conns: (0..size).map(|_| None).collect(),
            seq: 0,
            p2p_sent: HashMap::new(),
            p2p_received: HashMap::new(),
            scratch: Vec::new(),
            staging: Vec::new(),
            schedules: HashMap::new(),
            last_plan: None,
            exec: Default::default(),
            splits: 0,
            shrinks: 0,
        };
        let health = listener.health();
        let timeout_ms = cfg.timeout.as_millis().clamp(1, u128::from(u64::MAX)) as u64;
        let watchdog = Watchdog::start(WatchdogSetup {
            comm_id: comm_id.clone(),
            rank,
            peers: peers.clone(),
            secret,
            cfg: cfg.clone(),
            health: health.clone(),
            incoming: listener.watchdog_inbox(),
        })?;
        Ok(Self {
            inner: Arc::new(Inner {
                rank,
                size,
                comm_id,
                secret,
                peers,
                cfg,
                listener,
                health,
                _watchdog: watchdog,
                timeout_ms: AtomicU64::new(timeout_ms),
                state: Mutex::new(state),
                algo_choice: parse_algo_env()?
                    .map(|a| AtomicU8::new(a.map_or(0, |a| a.code() + 1))),
                schedules_built: AtomicU64::new(0),
                tiers,
                tuner,
                spin: executor::SpinPolicy::for_host(local_ranks),
            }),
        })
    }

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
    /// tuner's cheapest for the size class ([`Communicator::explain`] says why).
    pub fn algorithm_for(&self, collective: Collective, bytes: usize) -> Algorithm {
        let chosen = self.inner.algo_choice[collective.code() as usize].load(Ordering::Relaxed);
        if let Some(a) = chosen.checked_sub(1).and_then(Algorithm::from_code) {
            return a;
        }
        self.inner.tuner.choose(collective, bytes)
    }

    /// The tuner's ranked table for `collective` at `bytes` per rank, with predicted times on
    /// this communicator's fabric and the reason for its choice. An explicit choice
    /// (`STRATA_ALGO`, [`Communicator::set_algorithm`]) is not reflected here; see
    /// [`Communicator::algorithm_for`].
    pub fn explain(&self, collective: Collective, bytes: usize) -> Explanation {
        self.inner.tuner.explain(collective, bytes)
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
        if let Some(a) = algorithm {
            if !a.supports(collective) {
                return Err(Error::InvalidArgument(format!(
                    "algorithm '{a}' cannot run {collective}; valid: {}",
                    valid_names(collective)
                )));
            }
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

    /// How many schedules this communicator has built. A repeated (collective, algorithm,
    /// count, root) reuses its cached schedule, so this stops growing in a steady loop.
    pub fn schedules_built(&self) -> u64 {
        self.inner.schedules_built.load(Ordering::Relaxed)
    }

    // ----- typed API -----------------------------------------------------------------------

    /// `recv = reduce(send over all ranks)`; `send` and `recv` have the same length.
    pub fn all_reduce<T: Element>(&self, send: &[T], recv: &mut [T], op: ReduceOp) -> Result<()> {
        same_len(send.len(), recv.len(), "all_reduce send and recv")?;
        self.call_typed(
            CallSpec {
                op,
                ..CallSpec::new(Collective::AllReduce, T::DTYPE, recv.len())
            },
            Some(send),
            recv,
        )
    }

    /// In-place all-reduce.
    pub fn all_reduce_in_place<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        self.call_typed::<T>(
            CallSpec {
                op,
                ..CallSpec::new(Collective::AllReduce, T::DTYPE, buf.len())
            },
            None,
            buf,
        )
    }

    /// Every rank receives `root`'s `send` into `recv` (`send` is read on the root only).
    pub fn broadcast<T: Element>(&self, send: &[T], recv: &mut [T], root: usize) -> Result<()> {
        if self.rank() == root {
            same_len(
                send.len(),
                recv.len(),
                "broadcast send and recv at the root",
            )?;
        }
        self.call_typed(
            CallSpec {
                root,
                ..CallSpec::new(Collective::Broadcast, T::DTYPE, recv.len())
            },
            Some(send),
            recv,
        )
    }

    /// In-place broadcast: `buf` on the root is sent into `buf` everywhere.
    pub fn broadcast_in_place<T: Element>(&self, buf: &mut [T], root: usize) -> Result<()> {
        self.call_typed::<T>(
            CallSpec {
                root,
                ..CallSpec::new(Collective::Broadcast, T::DTYPE, buf.len())
            },
            None,
            buf,
        )
    }

    /// The root receives the reduction into `recv`; other ranks may pass an empty `recv`.
    pub fn reduce<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        if self.rank() == root {
            same_len(send.len(), recv.len(), "reduce send and recv at the root")?;
        }
        self.call_typed(
            CallSpec {
                op,
                root,
                ..CallSpec::new(Collective::Reduce, T::DTYPE, send.len())
            },
            Some(send),
            recv,
        )
    }

    /// In-place reduce: the root's `buf` ends with the result.
    pub fn reduce_in_place<T: Element>(
        &self,
        buf: &mut [T],
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        self.call_typed::<T>(
            CallSpec {
                op,
                root,
                ..CallSpec::new(Collective::Reduce, T::DTYPE, buf.len())
            },
            None,
            buf,
        )
    }

    /// `recv` (size × `send.len()`) receives every rank's `send`, in rank order.
    pub fn all_gather<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        same_len(
            send.len() * self.size(),
            recv.len(),
            "all_gather recv (size × send)",
        )?;
        self.call_typed(
            CallSpec::new(Collective::AllGather, T::DTYPE, send.len()),
            Some(send),
            recv,
        )
    }

    /// In-place all-gather: this rank's block already sits at `buf[rank × count..]`.
    pub fn all_gather_in_place<T: Element>(&self, buf: &mut [T]) -> Result<()> {
        let count = self.per_rank(buf.len(), "all_gather_in_place buffer")?;
        self.call_typed::<T>(
            CallSpec::new(Collective::AllGather, T::DTYPE, count),
            None,
            buf,
        )
    }

    /// `recv` receives block `rank` of the reduction of every rank's `send` (size × `recv.len()`).
    pub fn reduce_scatter<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
    ) -> Result<()> {
        same_len(
            recv.len() * self.size(),
            send.len(),
            "reduce_scatter send (size × recv)",
        )?;
        self.call_typed(
            CallSpec {
                op,
                ..CallSpec::new(Collective::ReduceScatter, T::DTYPE, recv.len())
            },
            Some(send),
            recv,
        )
    }

    /// In-place reduce-scatter: the result lands in `buf[rank × count..(rank + 1) × count]`.
    pub fn reduce_scatter_in_place<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        let count = self.per_rank(buf.len(), "reduce_scatter_in_place buffer")?;
        self.call_typed::<T>(
            CallSpec {
                op,
                ..CallSpec::new(Collective::ReduceScatter, T::DTYPE, count)
            },
            None,
            buf,
        )
    }

    /// Block j of `send` goes to rank j, which stores it as block `rank` of its `recv`.
    pub fn all_to_all<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        same_len(send.len(), recv.len(), "all_to_all send and recv")?;
        let count = self.per_rank(recv.len(), "all_to_all buffers")?;
        self.call_typed(
            CallSpec::new(Collective::AllToAll, T::DTYPE, count),
            Some(send),
            recv,
        )
    }

    /// In-place all-to-all.
    pub fn all_to_all_in_place<T: Element>(&self, buf: &mut [T]) -> Result<()> {
        let count = self.per_rank(buf.len(), "all_to_all_in_place buffer")?;
        self.call_typed::<T>(
            CallSpec::new(Collective::AllToAll, T::DTYPE, count),
            None,
            buf,
        )
    }

    /// The root's `recv` (size × `send.len()`) receives every rank's `send`.
    pub fn gather<T: Element>(&self, send: &[T], recv: &mut [T], root: usize) -> Result<()> {
        if self.rank() == root {
            same_len(
                send.len() * self.size(),
                recv.len(),
                "gather recv at the root (size × send)",
            )?;
        }
        self.call_typed(
            CallSpec {
                root,
                ..CallSpec::new(Collective::Gather, T::DTYPE, send.len())
            },
            Some(send),
            recv,
        )
    }

    /// Block j of the root's `send` (size × `recv.len()`) lands in rank j's `recv`.
    pub fn scatter<T: Element>(&self, send: &[T], recv: &mut [T], root: usize) -> Result<()> {
        if self.rank() == root {
            same_len(
                recv.len() * self.size(),
                send.len(),
                "scatter send at the root (size × recv)",
            )?;
        }
        self.call_typed(
            CallSpec {
                root,
                ..CallSpec::new(Collective::Scatter, T::DTYPE, recv.len())
            },
            Some(send),
            recv,
        )
    }

    /// Waits until every rank has called `barrier`.
    pub fn barrier(&self) -> Result<()> {
        self.call_bytes(
            CallSpec::new(Collective::Barrier, DataType::Uint8, 0),
            None,
            &mut [],
        )
    }

    /// Sends `buf` to `peer`, which must call [`Communicator::recv`] with the same length.
    pub fn send<T: Element>(&self, buf: &[T], peer: usize) -> Result<()> {
        self.send_recv(&mut [Transfer::Send {
            peer,
            dtype: T::DTYPE,
            data: bytemuck::cast_slice(buf),
        }])
    }

    /// Receives `buf.len()` elements from `peer`.
    pub fn recv<T: Element>(&self, buf: &mut [T], peer: usize) -> Result<()> {
        self.send_recv(&mut [Transfer::Recv {
            peer,
            dtype: T::DTYPE,
            data: bytemuck::cast_slice_mut(buf),
        }])
    }

    /// Runs a batch of point-to-point transfers as one (NCCL's sends and receives between
    /// `ncclGroupStart` and `ncclGroupEnd`): they progress together, so a rank may send to its
    /// successor and receive from its predecessor in one batch without deadlock.
    ///
    /// Transfers between a pair of ranks match in order in each direction, and each must have
    /// the same element type and count at both ends (a mismatch fails with an error naming
    /// both). The batch runs in rounds: round k holds every peer's k-th transfer in each
    /// direction, so round k of one rank meets round k of its peers. A transfer to this rank
    /// itself pairs with the receive from itself of the same position in the batch.
    pub fn send_recv(&self, transfers: &mut [Transfer<'_>]) -> Result<()> {
        let (p, me) = (self.size(), self.rank());
        for t in transfers.iter() {
            let (peer, dtype, len) = t.parts();
            if peer >= p {
                return Err(Error::InvalidArgument(format!(
                    "{} peer {peer} is out of range for {p} ranks",
                    t.verb()
                )));
            }
            if len % dtype.size() != 0 {
                return Err(Error::InvalidArgument(format!(
                    "{} buffer of {len} bytes is not a whole number of {dtype} elements",
                    t.verb()
                )));
            }
        }
        if let Some(e) = self.async_error() {
            return Err(e);
        }
        let to_self = |want_send: bool| -> Vec<usize> {
            (0..transfers.len())
                .filter(|&i| transfers[i].parts().0 == me && transfers[i].is_send() == want_send)
                .collect()
        };
        let (sends, recvs) = (to_self(true), to_self(false));
        if sends.len() != recvs.len() {
            return Err(Error::InvalidArgument(format!(
                "rank {me} sends itself {} message(s) but receives {} from itself; a transfer \
                 to self needs its partner in the same group",
                sends.len(),
                recvs.len()
            )));
        }
        for (&si, &ri) in sends.iter().zip(&recvs) {
            let ((_, sd, sl), (_, rd, rl)) = (transfers[si].parts(), transfers[ri].parts());
            if (sd, sl) != (rd, rl) {
                return Err(Error::Mismatch(format!(
                    "rank {me} sends itself {} {sd} elements but receives {} {rd} elements",
                    sl / sd.size(),
                    rl / rd.size()
                )));
            }
        }
        for (&si, &ri) in sends.iter().zip(&recvs) {
            let src = transfers[si].ptr() as *const u8;
            let dst = transfers[ri].ptr();
            // SAFETY: both buffers hold `len` bytes (checked above) and live for the call;
            // `copy` allows them to overlap.
            unsafe { std::ptr::copy(src, dst, transfers[si].parts().2) };
        }
        // Round k: the k-th transfer with each peer in each direction.
        let mut seen: HashMap<(bool, usize), usize> = HashMap::new();
        let round: Vec<Option<usize>> = transfers
            .iter()
            .map(|t| {
                let peer = t.parts().0;
                (peer != me).then(|| {
                    let k = seen.entry((t.is_send(), peer)).or_insert(0);
                    *k += 1;
                    *k - 1
                })
            })
            .collect();
        let rounds = round.iter().flatten().max().map_or(0, |m| m + 1);
        for k in 0..rounds {
            let members: Vec<usize> = (0..transfers.len())
                .filter(|&i| round[i] == Some(k))
                .collect();
            self.run_round(transfers, &members)?;
        }
        Ok(())
    }

    /// Splits into communicators of the ranks with the same `color`, ordered by `(key, rank)`.
    /// Ranks passing `None` take part but get no communicator. Every rank must call it.
    pub fn split(&self, color: Option<u32>, key: i32) -> Result<Option<Communicator>> {
        const REC: usize = 40;
        let listener = CommListener::bind(&self.inner.cfg)?;
        let listen = listener
            .local_addr()
            .map_err(|e| Error::io("listener address", e))?;
        let mut mine = [0u8; REC];
        mine[0..8].copy_from_slice(&color.map_or(-1i64, i64::from).to_le_bytes());
        mine[8..16].copy_from_slice(&(key as i64).to_le_bytes());
        match listen.ip() {
            IpAddr::V4(ip) => {
                mine[16] = 4;
                mine[18..22].copy_from_slice(&ip.octets());
            }
            IpAddr::V6(ip) => {
                mine[16] = 6;
                mine[18..34].copy_from_slice(&ip.octets());
            }
        }
        mine[34..36].copy_from_slice(&listen.port().to_le_bytes());
        let mut all = vec![0u8; REC * self.size()];
        self.all_gather(&mine, &mut all)?;
        let split_no = {
            let mut st = self.lock_state()?;
            st.splits += 1;
            st.splits
        };
        let Some(color) = color else { return Ok(None) };
        let mut members: Vec<(i64, usize, SocketAddr)> = Vec::new();
        for (r, rec) in all.chunks_exact(REC).enumerate() {
            let c = i64::from_le_bytes(rec[0..8].try_into().unwrap_or_default());
            if c != i64::from(color) {
                continue;
            }
            let k = i64::from_le_bytes(rec[8..16].try_into().unwrap_or_default());
            let port = u16::from_le_bytes([rec[34], rec[35]]);
            let ip = if rec[16] == 6 {
                IpAddr::from(<[u8; 16]>::try_from(&rec[18..34]).unwrap_or_default())
            } else {
                IpAddr::from(<[u8; 4]>::try_from(&rec[18..22]).unwrap_or_default())
            };
            members.push((k, r, SocketAddr::new(ip, port)));
        }
        members.sort_by_key(|m| (m.0, m.1));
        let peers: Vec<PeerInfo> = members
            .iter()
            .enumerate()
            .map(|(new, (_, old, listen))| PeerInfo {
                rank: new,
                listen: *listen,
                ..self.inner.peers[*old].clone()
            })
            .collect();
        let rank = members
            .iter()
            .position(|m| m.1 == self.rank())
            .ok_or_else(|| Error::Transport("internal: split lost this rank".into()))?;
        let label = format!("{}/split{split_no}/color{color}", self.inner.comm_id);
        let comm_id = comm_id_of(&self.inner.secret, label.as_bytes());
        let listener = CommListener::start(
            listener,
            comm_id.clone(),
            rank,
            peers.len(),
            self.inner.secret,
            &self.inner.cfg,
        )?;
        Self::from_parts(
            rank,
            peers,
            comm_id,
            self.inner.secret,
            self.inner.cfg.clone(),
            listener,
            self.inner.tiers.costs(),
        )
        .map(|child| {
            // The child starts with the parent's current algorithm choices.
            for (mine, theirs) in child.inner.algo_choice.iter().zip(&self.inner.algo_choice) {
                mine.store(theirs.load(Ordering::Relaxed), Ordering::Relaxed);
            }
            Some(child)
        })
    }

    /// Makes every rank's call in progress and every later call fail, as a fault would: the
    /// watchdog carries it to all ranks. Use it before [`Communicator::shrink`] so that no
    /// survivor is still inside a call of this communicator. Returns at once.
    pub fn revoke(&self) {
        let e = Error::Aborted(Some(format!(
            "rank {} revoked the communicator",
            self.rank()
        )));
        if self.inner.health.record_fault(&e) {
            tracing::warn!(rank = self.rank(), "{e}");
        }
    }

    /// A working communicator over the ranks of this one not in `exclude`, numbered in their
    /// old order (NCCL's `ncclCommShrink`). Only the survivors call it, each with the same
    /// `exclude`; the excluded ranks take no part, so this works after they died. The
    /// lowest survivor gathers everyone's new address through its listener of this
    /// communicator, which outlives faults. Fails after `STRATA_INIT_TIMEOUT` if a survivor
    /// never calls it.
    pub fn shrink(&self, exclude: &[usize]) -> Result<Communicator> {
        let inner = &*self.inner;
        let mut gone: Vec<usize> = exclude.to_vec();
        gone.sort_unstable();
        gone.dedup();
        if let Some(&bad) = gone.iter().find(|&&r| r >= inner.size) {
            return Err(Error::InvalidArgument(format!(
                "shrink: rank {bad} is not in this communicator of {} ranks",
                inner.size
            )));
        }
        if gone.contains(&inner.rank) {
            return Err(Error::InvalidArgument(format!(
                "shrink: this rank ({}) is in the exclude list; only survivors call shrink",
                inner.rank
            )));
        }
        let survivors: Vec<usize> = (0..inner.size).filter(|r| !gone.contains(r)).collect();
        let rank = survivors
            .iter()
            .position(|&r| r == inner.rank)
            .ok_or_else(|| Error::Transport("internal: shrink lost this rank".into()))?;
        let shrink_no = {
            // A call still running (on another thread) holds the state: interrupt it first.
            let mut st = match self.inner.state.try_lock() {
                Ok(st) => st,
                Err(_) => {
                    self.revoke();
                    self.lock_state()?
                }
            };
            st.shrinks += 1;
            st.shrinks
        };
        let key = format!("shrink{shrink_no}/without{gone:?}");
        let comm_id = comm_id_of(&inner.secret, format!("{}/{key}", inner.comm_id).as_bytes());
        let listener = CommListener::bind(&inner.cfg)?;
        let listen = listener
            .local_addr()
            .map_err(|e| Error::io("listener address", e))?;
        let mine = PeerInfo {
            rank,
            listen,
            ..inner.peers[inner.rank].clone()
        };
        let root = survivors[0];
        let deadline = Instant::now() + inner.cfg.init_timeout;
        let listener = CommListener::start(
            listener,
            comm_id.clone(),
            rank,
            survivors.len(),
            inner.secret,
            &inner.cfg,
        )?;
        let peers = if root == inner.rank {
            inner
                .listener
                .shrink_join(&key, survivors.len(), mine, deadline)?
        } else {
            connection::shrink_request(
                &inner.comm_id,
                inner.rank,
                &inner.peers[root],
                &inner.secret,
                &inner.cfg,
                &key,
                survivors.len(),
                mine,
            )?
        };
        tracing::info!(
            rank = inner.rank,
            "shrunk to {} ranks without {}",
            peers.len(),
            RankList(&gone)
        );
        let child = Self::from_parts(
            rank,
            peers,
            comm_id,
            inner.secret,
            inner.cfg.clone(),
            listener,
            inner.tiers.costs(),
        )?;
        for (mine, theirs) in child.inner.algo_choice.iter().zip(&inner.algo_choice) {
            mine.store(theirs.load(Ordering::Relaxed), Ordering::Relaxed);
        }
        Ok(child)
    }

    /// Splits this communicator into the four groups of a 4D parallel layout, in [TP, CP, PP,
    /// DP] order with TP varying fastest over this communicator's ranks (see
    /// [`strata_algorithms::layout`]). Every rank must call it with the same layout, whose
    /// world size must equal this communicator's size.
    pub fn split_layout(&self, layout: &Layout) -> Result<LayoutComms> {
        if layout.world() != self.size() {
            return Err(Error::InvalidArgument(format!(
                "{layout} does not match the {} ranks of this communicator",
                self.size()
            )));
        }
        let mut parts = Vec::with_capacity(4);
        for kind in GroupKind::ALL {
            let (color, key) = layout.color_and_key(kind, self.rank());
            let color = u32::try_from(color)
                .map_err(|_| Error::InvalidArgument(format!("{layout}: too many groups")))?;
            let comm = self.split(Some(color), key as i32)?.ok_or_else(|| {
                Error::Transport(format!("internal: the {kind} split left this rank out"))
            })?;
            parts.push(comm);
        }
        let [tp, cp, pp, dp]: [Communicator; 4] = parts
            .try_into()
            .map_err(|_| Error::Transport("internal: expected four layout splits".into()))?;
        Ok(LayoutComms { tp, cp, pp, dp })
    }

    // ----- byte-level API ------------------------------------------------------------------

    /// Runs `spec` on byte buffers. `send` is `None` for the in-place form, in which `recv`
    /// holds the input at NCCL's in-place position (all_gather and gather: block `rank`/`root`
    /// of `recv`; reduce_scatter and scatter: the whole of `recv`, result in block `rank`).
    pub fn call_bytes(&self, spec: CallSpec, send: Option<&[u8]>, recv: &mut [u8]) -> Result<()> {
        let es = spec.dtype.size();
        let p = self.size();
        if matches!(spec.collective, Collective::Send | Collective::Recv) {
            return Err(Error::InvalidArgument(
                "use send/recv for point-to-point transfers".into(),
            ));
        }
        if spec.collective.rooted() && spec.root >= p {
            return Err(Error::InvalidArgument(format!(
                "root {} is out of range for {p} ranks",
                spec.root
            )));
        }
        let total = spec
            .count
            .checked_mul(p)
            .and_then(|n| n.checked_mul(es))
            .filter(|&n| n <= isize::MAX as usize);
        if total.is_none() {
            return Err(Error::InvalidArgument(format!(
                "count {} overflows for {p} ranks of {}",
                spec.count, spec.dtype
            )));
        }
        let (ilen, olen) = spec
            .collective
            .buffer_elems(spec.count, p, self.rank(), spec.root);
        let (ib, ob) = (ilen * es, olen * es);
        let (input, input_bytes, output, output_bytes): (*const u8, usize, *mut u8, usize) =
            match send {
                Some(send) => {
                    need(send.len(), ib, "send buffer")?;
                    need(recv.len(), ob, "recv buffer")?;
                    (send.as_ptr(), ib, recv.as_mut_ptr(), ob)
                }
                None => {
                    let base = recv.as_mut_ptr();
                    let (in_off, out_off) = spec.in_place_offsets(self.rank());
                    need(
                        recv.len(),
                        (in_off + ib).max(out_off + ob),
                        "in-place buffer",
                    )?;
                    // SAFETY: both offsets plus lengths were checked against recv.len().
                    unsafe { (base.add(in_off) as *const u8, ib, base.add(out_off), ob) }
                }
            };
        // SAFETY: the spans are bounds-checked views of `send`/`recv`, which outlive the call.
        unsafe { self.run(spec, input, input_bytes, output, output_bytes) }
    }

    fn call_typed<T: Element>(
        &self,
        spec: CallSpec,
        send: Option<&[T]>,
        recv: &mut [T],
    ) -> Result<()> {
        self.call_bytes(
            spec,
            send.map(bytemuck::cast_slice),
            bytemuck::cast_slice_mut(recv),
        )
    }

    fn per_rank(&self, len: usize, what: &str) -> Result<usize> {
        if len % self.size() != 0 {
            return Err(Error::InvalidArgument(format!(
                "{what} has {len} elements, not a multiple of {} ranks",
                self.size()
            )));
        }
        Ok(len / self.size())
    }

    fn lock_state(&self) -> Result<std::sync::MutexGuard<'_, State>> {
        self.inner
            .state
            .lock()
            .map_err(|_| Error::Aborted(Some("an earlier call panicked".into())))
    }

    /// Plans and executes one call.
    ///
    /// # Safety
    /// `input`/`output` must be valid for reads/writes of the given byte counts for the whole
    /// call (they may alias as NCCL's in-place rules allow).
    unsafe fn run(
        &self,
        spec: CallSpec,
        input: *const u8,
        input_bytes: usize,
        output: *mut u8,
        output_bytes: usize,
    ) -> Result<()> {
        let inner = &*self.inner;
        if let Some(e) = self.async_error() {
            return Err(e);
        }
        if let ReduceOp::PreMulSum(s) = spec.op {
            if spec.collective.reduces() && s.dtype != spec.dtype {
                return Err(Error::InvalidArgument(format!(
                    "premulsum scalar is {} but the buffers are {}",
                    s.dtype, spec.dtype
                )));
            }
        }
        let (p, rank, es) = (inner.size, inner.rank, spec.dtype.size());
        let mut guard = self.lock_state()?;
        let st = &mut *guard;
        let algorithm = self.algorithm_for(spec.collective, spec.count * es);
        let plan = Plan {
            collective: spec.collective,
            algorithm,
            nranks: p,
            rank,
            count: spec.count,
            root: spec.root,
            chunk_elems: (inner.cfg.chunk_bytes / es).max(1),
        };
        let cached = match &st.last_plan {
            Some((last, c)) if *last == plan => c.clone(),
            _ => {
                let c = match st.schedules.get(&plan) {
                    Some(c) => c.clone(),
                    None => {
                        let sched = strata_algorithms::plan_on(
                            &plan,
                            inner.tuner.hierarchy(),
                            inner.tuner.ordered(),
                        )
                        .map_err(|e| Error::InvalidArgument(e.to_string()))?;
                        inner.schedules_built.fetch_add(1, Ordering::Relaxed);
                        let c = Arc::new(CachedPlan::new(sched, rank, p));
                        if st.schedules.len() >= SCHEDULE_CACHE {
                            st.schedules.clear();
                        }
                        st.schedules.insert(plan, c.clone());
                        c
                    }
                };
                st.last_plan = Some((plan, c.clone()));
                c
            }
        };
        st.seq += 1;
        let local = Header {
            collective: spec.collective,
            seq: st.seq,
            dtype: spec.dtype,
            count: spec.count as u64,
            op: if spec.collective.reduces() {
                spec.op.code()
            } else {
                0
            },
            root: if spec.collective.rooted() {
                spec.root as u64
            } else {
                0
            },
            algorithm,
        };
        inner.health.op_started(&local);
        let result = (|| {
            self.ensure_connections(st, &cached.exchange, &local)?;
            // Inputs the schedule must not read from the caller's memory.
            let mut input = input;
            let premul = match spec.op {
                ReduceOp::PreMulSum(s) if spec.collective.reduces() => Some(s),
                _ => None,
            };
            let private_copy = spec.collective == Collective::AllToAll
                && input_bytes > 0
                && std::ptr::eq(input, output);
            if premul.is_some() || private_copy {
                grow(&mut st.staging, input_bytes);
                let staged =
                    &mut bytemuck::cast_slice_mut::<u64, u8>(&mut st.staging)[..input_bytes];
                // SAFETY: the caller guarantees input is readable for input_bytes.
                let original = unsafe { std::slice::from_raw_parts(input, input_bytes) };
                match premul {
                    Some(s) => reduce::scale(spec.dtype, staged, original, &s),
                    None => staged.copy_from_slice(original),
                }
                input = staged.as_ptr();
            }
            let scratch_bytes = cached.sched.scratch_elems * es;
            grow(&mut st.scratch, scratch_bytes);
            let bufs = Buffers {
                input,
                input_bytes,
                output,
                output_bytes,
                scratch: st.scratch.as_mut_ptr() as *mut u8,
                scratch_bytes,
                input_parts: Vec::new(),
                output_parts: Vec::new(),
            };
            let (combine, divide_by) = match spec.op {
                _ if !spec.collective.reduces() => (Combine::Sum, None),
                ReduceOp::Sum | ReduceOp::PreMulSum(_) => (Combine::Sum, None),
                ReduceOp::Prod => (Combine::Prod, None),
                ReduceOp::Min => (Combine::Min, None),
                ReduceOp::Max => (Combine::Max, None),
                ReduceOp::Avg => (Combine::Sum, Some(p)),
            };
            let dtype = if spec.collective == Collective::Barrier {
                DataType::Uint8
            } else {
                spec.dtype
            };
            self.op_run(st, local, dtype, (combine, divide_by))
                .with_headers(&cached.exchange, &cached.exchange, &[])
                .run(&cached.sched, &bufs)
        })();
        self.conclude(st, &local, result)
    }

    /// Runs one round of a [`Communicator::send_recv`] batch: at most one send to and one
    /// receive from each peer, all progressing together, each with its own header.
    fn run_round(&self, transfers: &mut [Transfer<'_>], members: &[usize]) -> Result<()> {
        let inner = &*self.inner;
        let rank = inner.rank;
        let mut guard = self.lock_state()?;
        let st = &mut *guard;
        let mut ops = Vec::with_capacity(members.len());
        let (mut input_parts, mut output_parts) = (Vec::new(), Vec::new());
        let (mut in_end, mut out_end) = (0usize, 0usize);
        let mut headers: Vec<(usize, Option<Header>, Option<Header>)> = Vec::new();
        let mut needed = Vec::with_capacity(members.len());
        let mut first = None;
        for &i in members {
            let (peer, dtype, len) = transfers[i].parts();
            let sending = transfers[i].is_send();
            let counters = if sending {
                &mut st.p2p_sent
            } else {
                &mut st.p2p_received
            };
            let seq = counters.entry(peer).or_insert(0);
            *seq += 1;
            // Both ends describe a transfer as the sender's `send` to the receiver.
            let local = Header {
                collective: if sending {
                    Collective::Send
                } else {
                    Collective::Recv
                },
                seq: *seq,
                dtype,
                count: (len / dtype.size()) as u64,
                op: 0,
                root: peer as u64,
                algorithm: Algorithm::Direct,
            };
            let wire = Header {
                collective: Collective::Send,
                root: if sending { peer } else { rank } as u64,
                ..local
            };
            let entry = match headers.iter().position(|h| h.0 == peer) {
                Some(j) => &mut headers[j],
                None => {
                    headers.push((peer, None, None));
                    headers
                        .last_mut()
                        .ok_or_else(|| Error::Transport("internal: lost a batch header".into()))?
                }
            };
            let ptr = transfers[i].ptr();
            let (header, parts, end, buf) = if sending {
                (&mut entry.1, &mut input_parts, &mut in_end, Buf::Input)
            } else {
                (&mut entry.2, &mut output_parts, &mut out_end, Buf::Output)
            };
            *header = Some(wire);
            if len > 0 {
                parts.push((*end, ptr, len));
                let region = Region::new(buf, *end, len);
                ops.push(if sending {
                    Op::Send { peer, src: region }
                } else {
                    Op::Recv { peer, dst: region }
                });
                *end += len;
            }
            needed.push(peer);
            first.get_or_insert(local);
        }
        let Some(local) = first else { return Ok(()) };
        let sched = RankSchedule {
            steps: if ops.is_empty() {
                Vec::new()
            } else {
                vec![Step { ops }]
            },
            scratch_elems: 0,
        };
        inner.health.op_started(&local);
        let result = (|| {
            self.ensure_connections(st, &needed, &local)?;
            let bufs = Buffers {
                input: std::ptr::null(),
                input_bytes: 0,
                output: std::ptr::null_mut(),
                output_bytes: 0,
                scratch: std::ptr::null_mut(),
                scratch_bytes: 0,
                input_parts,
                output_parts,
            };
            self.op_run(st, local, DataType::Uint8, (Combine::Sum, None))
                .with_headers(&[], &[], &headers)
                .run(&sched, &bufs)
        })();
        self.conclude(st, &local, result)
    }

    /// The executor's context for one call described by `local`, with no headers yet.
    fn op_run<'a>(
        &'a self,
        st: &'a mut State,
        local: Header,
        dtype: DataType,
        (combine, divide_by): (Combine, Option<usize>),
    ) -> OpRun<'a> {
        let inner = &*self.inner;
        OpRun {
            rank: inner.rank,
            peers: &inner.peers,
            conns: &mut st.conns,
            dtype,
            combine,
            divide_by,
            hdr_out: &[],
            hdr_in: &[],
            wire_out: local,
            wire_in: local,
            per_peer: &[],
            local,
            timeout: self.timeout(),
            clock: None,
            abort: &inner.health.interrupt,
            reuse: &mut st.exec,
            progress_events: 0,
            goodbye_seen: None,
            spin: inner.spin,
        }
    }

    /// Ends a call: an interruption reports the fault behind it, a collective's timeout is
    /// diagnosed, and a failure breaks the communicator and is told to the peers.
    fn conclude(&self, st: &mut State, local: &Header, result: Result<()>) -> Result<()> {
        let seq = local.call_seq();
        let result = result.map_err(|e| match e {
            Error::Aborted(None) => self.async_error().unwrap_or(Error::Aborted(None)),
            e @ Error::Timeout { .. } if seq > 0 => self.diagnose(e),
            e => e,
        });
        self.inner.health.op_finished(seq, result.as_ref().err());
        if let Err(e) = &result {
            if let Some(earlier) = self.fail(st, e, &local.describe()) {
                // Another error broke the communicator first (this one is likely its echo):
                // every rank reports that one.
                return Err(earlier);
            }
        }
        result
    }

    /// Opens (as the lower rank) or waits for (as the higher rank) every connection needed.
    fn ensure_connections(&self, st: &mut State, peers: &[usize], call: &Header) -> Result<()> {
        if peers.iter().all(|&q| st.conns[q].is_some()) {
            return Ok(());
        }
        let deadline = Instant::now() + self.timeout();
        let inner = &*self.inner;
        let me = &inner.peers[inner.rank];
        // Open every connection even after one fails, so that the failure notice reaches all
        // the peers that would otherwise wait for this rank to connect.
        let mut first_err = None;
        for &q in peers.iter().filter(|&&q| q > inner.rank) {
            if st.conns[q].is_none() {
                match connection::connect(
                    &inner.comm_id,
                    me,
                    &inner.peers[q],
                    &inner.secret,
                    &inner.cfg,
                    deadline,
                ) {
                    Ok(c) => {
                        tracing::debug!(
                            rank = inner.rank,
                            peer = q,
                            transport = c.data.name(),
                            "connected"
                        );
                        st.conns[q] = Some(c);
                    }
                    Err(e) => {
                        first_err.get_or_insert(e);
                    }
                }
            }
        }
        if let Some(e) = first_err {
            // A failure notice already received explains more than "cannot connect".
            executor::check_control(&mut st.conns, &inner.peers)?;
            return Err(e);
        }
        let started = Instant::now();
        let mut next_probe = started + Duration::from_secs(1);
        loop {
            let mut missing = Vec::new();
            for &q in peers.iter().filter(|&&q| q < inner.rank) {
                if st.conns[q].is_none() {
                    match inner.listener.take(q) {
                        Some(c) => st.conns[q] = Some(c),
                        None => missing.push(q),
                    }
                }
            }
            if missing.is_empty() {
                return Ok(());
            }
            if inner.health.interrupt.load(Ordering::Acquire) {
                return Err(self.async_error().unwrap_or(Error::Aborted(None)));
            }
            if Instant::now() >= deadline {
                return Err(Error::Timeout {
                    op: format!("{} (connecting)", call.describe()),
                    seq: call.seq,
                    waiting_on: missing,
                    after_s: started.elapsed().as_secs_f64(),
                    diagnosis: None,
                });
            }
            executor::check_control(&mut st.conns, &inner.peers)?;
            if Instant::now() >= next_probe {
                // A lower rank that is slow to connect may be gone: ask its listener.
                for &q in &missing {
                    connection::probe(
                        &inner.comm_id,
                        me,
                        &inner.peers[q],
                        &inner.secret,
                        &inner.cfg,
                    )?;
                }
                next_probe = Instant::now() + Duration::from_secs(1);
            }
            inner.listener.wait(Duration::from_millis(20));
        }
    }

    /// Turns the timeout of collective call `seq` into one that names the ranks holding
    /// everyone up: asks every rank (up to [`DIAGNOSE_ALL_UP_TO`] ranks; beyond that only the
    /// ones waited on) what it is doing, 16 at a time, each within 2 s.
    fn diagnose(&self, e: Error) -> Error {
        let Error::Timeout {
            op,
            seq,
            waiting_on,
            after_s,
            diagnosis: None,
        } = e
        else {
            return e;
        };
        let inner = &*self.inner;
        let ask: Vec<usize> = if inner.size <= DIAGNOSE_ALL_UP_TO {
            (0..inner.size).filter(|&q| q != inner.rank).collect()
        } else {
            waiting_on.clone()
        };
        let limit = Duration::from_secs(2);
        let per_thread = ask.len().div_ceil(16).max(1);
        let answers: Vec<(usize, std::result::Result<Progress, String>)> =
            std::thread::scope(|s| {
                let handles: Vec<_> = ask
                    .chunks(per_thread)
                    .map(|chunk| {
                        s.spawn(move || {
                            chunk
                                .iter()
                                .map(|&q| {
                                    let peer = &inner.peers[q];
                                    let answer = connection::query_status(
                                        &inner.comm_id,
                                        inner.rank,
                                        peer,
                                        &inner.secret,
                                        limit,
                                    );
                                    (q, answer)
                                })
                                .collect::<Vec<_>>()
                        })
                    })
                    .collect();
                handles
                    .into_iter()
                    .flat_map(|h| h.join().unwrap_or_default())
                    .collect()
            });
        let mut waiters = vec![inner.rank];
        let mut laggards: Vec<(usize, String)> = Vec::new();
        for (q, answer) in answers {
            match answer {
                // In this call, or it gave up on it already.
                Ok(p) if p.started == seq && p.finished < seq => waiters.push(q),
                // It finished this call: not what everyone waits for.
                Ok(p) if p.finished >= seq => {}
                Ok(p) if p.started > seq => {
                    laggards.push((q, format!("is already past it, {}", p.describe())))
                }
                Ok(p) => laggards.push((
                    q,
                    match p.current {
                        Some(c) => format!("is still in {c}"),
                        None => format!(
                            "is idle after collective #{} (it has not called #{seq})",
                            p.finished
                        ),
                    },
                )),
                Err(reason) => laggards.push((q, reason)),
            }
        }
        if laggards.is_empty() {
            let diagnosis = format!(
                "every rank asked is in it; the transfers from {} stalled",
                RankList(&waiting_on)
            );
            return Error::Timeout {
                op,
                seq,
                waiting_on,
                after_s,
                diagnosis: Some(diagnosis),
            };
        }
        let named: Vec<String> = laggards
            .iter()
            .map(|(q, what)| {
                let p = &inner.peers[*q];
                format!("rank {q} (host {}, pid {}) {what}", p.host.hostname, p.pid)
            })
            .collect();
        let diagnosis = format!(
            "{}; {} {} on {}",
            named.join("; "),
            RankList(&waiters),
            if waiters.len() == 1 { "waits" } else { "wait" },
            if laggards.len() == 1 { "it" } else { "them" }
        );
        Error::Timeout {
            op,
            seq,
            waiting_on: laggards.iter().map(|l| l.0).collect(),
            after_s,
            diagnosis: Some(diagnosis),
        }
    }

    /// Marks the communicator failed and tells every connected peer (the watchdog tells the
    /// rest). Returns the fault recorded earlier, if `e` was not the first.
    fn fail(&self, st: &mut State, e: &Error, desc: &str) -> Option<Error> {
        let inner = &*self.inner;
        if matches!(e, Error::Aborted(None)) {
            // `abort()` is local, as NCCL's is (`revoke()` is the one that travels).
            return inner.health.fault();
        }
        // What the peers are told: errors that name the culprit travel as they are; anything
        // else this rank ran into names this rank.
        let me = &inner.peers[inner.rank];
        let shared = match e {
            Error::PeerFailed { .. }
            | Error::Timeout { .. }
            | Error::Mismatch(_)
            | Error::Aborted(_) => e.clone(),
            other => Error::PeerFailed {
                rank: inner.rank,
                host: me.host.hostname.clone(),
                pid: me.pid,
                reason: format!("it failed {desc}: {other}"),
            },
        };
        let e = &shared;
        if !inner.health.record_fault(e) {
            return inner.health.fault();
        }
        watchdog::dump_trace(
            inner.cfg.trace_dir.as_deref(),
            &inner.comm_id,
            &inner.peers[inner.rank],
            &inner.health,
        );
        let blamed = executor::blamed(e);
        tracing::error!(rank = inner.rank, op = desc, blamed = %blamed, "{e}");
        let frame = ControlFrame::Poison { error: e.clone() };
        for c in st.conns.iter_mut().flatten() {
            c.send_control(&frame);
        }
        None
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Ok(st) = self.state.get_mut() {
            for c in st.conns.iter_mut().flatten() {
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

impl UniqueId {
    /// The id `NCCL_COMM_ID=<host>:<port>` names, if that variable is set (NCCL's way to fix the
    /// rendezvous root instead of shipping ids): every rank computes the same id, whose secret
    /// is `STRATA_SECRET`, else derived from the launcher's job ids and the address (as for
    /// [`Communicator::from_env`]). Rank 0 must serve it ([`UniqueId::serve_root`]).
    pub fn from_nccl_comm_id() -> Result<Option<Self>> {
        let Some(spec) = std::env::var("NCCL_COMM_ID")
            .ok()
            .filter(|v| !v.trim().is_empty())
        else {
            return Ok(None);
        };
        let root = spec
            .trim()
            .to_socket_addrs()
            .map_err(|e| Error::InvalidArgument(format!("NCCL_COMM_ID={spec}: {e}")))?
            .next()
            .ok_or_else(|| {
                Error::InvalidArgument(format!("NCCL_COMM_ID={spec} names no address"))
            })?;
        Ok(Some(UniqueId::from_parts(root, &secret_from_env(&root)?)))
    }

    /// Starts, in this process, the rendezvous root this id names (on its port, on every
    /// interface), for one communicator: rank 0's part when every rank computed the id itself
    /// ([`UniqueId::from_nccl_comm_id`]) and no `UniqueId::new` started a root.
    pub fn serve_root(&self) -> Result<()> {
        let root = self.root_addr();
        let any = if root.is_ipv4() {
            IpAddr::from([0, 0, 0, 0])
        } else {
            IpAddr::from([0u16; 8])
        };
        let cfg = Config::from_env()?;
        UniqueId::serve(
            SocketAddr::new(any, root.port()),
            self.secret(),
            cfg.init_timeout,
        )?;
        Ok(())
    }
}

fn root_from_env() -> Result<SocketAddr> {
    let resolve = |s: &str| -> Result<SocketAddr> {
        s.to_socket_addrs()
            .map_err(|e| {
                Error::InvalidArgument(format!("cannot resolve bootstrap root '{s}': {e}"))
            })?
            .find(|a| a.is_ipv4())
            .ok_or_else(|| {
                Error::InvalidArgument(format!("bootstrap root '{s}' has no IPv4 address"))
            })
    };
    if let Ok(root) = std::env::var("STRATA_ROOT") {
        return resolve(root.trim());
    }
    let addr = std::env::var("MASTER_ADDR").map_err(|_| {
        Error::InvalidArgument(
            "set STRATA_ROOT=host:port or MASTER_ADDR (with MASTER_PORT or STRATA_PORT)".into(),
        )
    })?;
    let port = match std::env::var("STRATA_PORT") {
        Ok(p) => p
            .trim()
            .parse::<u16>()
            .map_err(|_| Error::InvalidArgument(format!("STRATA_PORT={p} is not a port")))?,
        Err(_) => {
            let mp = std::env::var("MASTER_PORT").map_err(|_| {
                Error::InvalidArgument(
                    "MASTER_ADDR is set but neither MASTER_PORT nor STRATA_PORT".into(),
                )
            })?;
            let mp: u16 = mp
                .trim()
                .parse()
                .map_err(|_| Error::InvalidArgument(format!("MASTER_PORT={mp} is not a port")))?;
            mp.checked_add(1).ok_or_else(|| {
                Error::InvalidArgument("MASTER_PORT + 1 overflows; set STRATA_PORT".into())
            })?
        }
    };
    resolve(&format!("{}:{port}", addr.trim()))
}

fn secret_from_env(root: &SocketAddr) -> Result<Secret> {
    if let Ok(hex) = std::env::var("STRATA_SECRET") {
        return bootstrap::decode_hex(&hex)
            .and_then(|b| <Secret>::try_from(b.as_slice()).ok())
            .ok_or_else(|| Error::InvalidArgument("STRATA_SECRET must be 32 hex digits".into()));
    }
    let mut h = blake3::Hasher::new();
    h.update(b"strata job secret");
    for var in [
        "TORCHELASTIC_RUN_ID",
        "SLURM_JOB_ID",
        "SLURM_STEP_ID",
        "OMPI_MCA_ess_base_jobid",
        "PMI_ID",
        "PMIX_NAMESPACE",
    ] {
        if let Ok(v) = std::env::var(var) {
            h.update(var.as_bytes());
            h.update(v.as_bytes());
        }
    }
    h.update(root.to_string().as_bytes());
    let mut s = [0u8; 16];
    s.copy_from_slice(&h.finalize().as_bytes()[..16]);
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn algorithm_choices_parse_and_unknown_names_list_the_valid_ones() {
        let m = parse_algo_spec("allreduce:rd; broadcast:chain").unwrap();
        assert_eq!(
            m[Collective::AllReduce.code() as usize],
            Some(Algorithm::RecursiveDoubling)
        );
        assert_eq!(
            m[Collective::Broadcast.code() as usize],
            Some(Algorithm::Chain)
        );
        assert_eq!(m.iter().flatten().count(), 2);
        assert!(parse_algo_spec("").unwrap().iter().all(Option::is_none));
        let e = parse_algo_spec("all_reduce:bogus").unwrap_err().to_string();
        assert!(e.contains("valid: ring, tree, rd, rhd, ring+rd"), "{e}");
        let e = parse_algo_spec("all_gather:tree").unwrap_err().to_string();
        assert!(e.contains("valid: ring, rd, bruck"), "{e}");
        let m =
            parse_algo_spec("allreduce:rhd;allgather:bruck;broadcast:ring;reduce:tree").unwrap();
        let at = |c: Collective| m[c.code() as usize];
        assert_eq!(at(Collective::AllReduce), Some(Algorithm::Rabenseifner));
        assert_eq!(at(Collective::AllGather), Some(Algorithm::Bruck));
        assert_eq!(at(Collective::Broadcast), Some(Algorithm::Chain));
        assert_eq!(at(Collective::Reduce), Some(Algorithm::BinomialTree));
        assert!(
            parse_algo_spec("nonsense:ring")
                .unwrap_err()
                .to_string()
                .contains("all_reduce")
        );
        assert!(parse_algo_spec("ring").is_err());
    }

    #[test]
    fn nccl_algo_words_map_where_they_mean_the_same() {
        let m = parse_nccl_algo("Tree");
        let at = |m: &AlgoChoices, c: Collective| m[c.code() as usize];
        assert_eq!(at(&m, Collective::AllReduce), Some(Algorithm::Tree));
        assert_eq!(at(&m, Collective::Broadcast), Some(Algorithm::BinomialTree));
        assert_eq!(at(&m, Collective::AllGather), None);
        let m = parse_nccl_algo("NVLS,Ring");
        assert_eq!(at(&m, Collective::AllReduce), Some(Algorithm::Ring));
        assert_eq!(at(&m, Collective::Broadcast), Some(Algorithm::Chain));
        assert_eq!(at(&m, Collective::ReduceScatter), Some(Algorithm::Ring));
        let m = parse_nccl_algo("allreduce:tree,ring;allgather:ring");
        assert_eq!(at(&m, Collective::AllReduce), Some(Algorithm::Tree));
        assert_eq!(at(&m, Collective::AllGather), Some(Algorithm::Ring));
        assert_eq!(at(&m, Collective::Broadcast), None);
        assert!(parse_nccl_algo("^tree").iter().all(Option::is_none));
        assert!(parse_nccl_algo("").iter().all(Option::is_none));
    }
}
