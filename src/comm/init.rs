//! Joining a communicator: the unique id, the root's address and secret, the fabric and
//! the algorithm choices read from the environment.

use super::*;

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
        let listener = Listening::start(listener, comm_id.clone(), rank, nranks, secret, &cfg)?;
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
            process: crate::wire::process_nonce(),
            listen,
            place,
            transports: crate::transport::publish_all(&cfg)?,
            probe: probe::measure(cfg.cost_profile.is_none()),
        };
        let peers = bootstrap::rendezvous(
            id,
            nranks,
            me,
            &cfg,
            listener.comm(),
            &listener.tree_inbox(),
        )?;
        tracing::debug!(rank, nranks, "communicator initialised");
        Self::from_parts(rank, peers, comm_id, secret, cfg, listener, costs)
    }

    /// Joins using the launcher's variables: rank and size from torchrun, Slurm, Open MPI or
    /// MPICH; the root from `STRATA_ROOT=host:port`, else `MASTER_ADDR` with port
    /// `STRATA_PORT` (default `MASTER_PORT + 1`, since torchrun's store owns `MASTER_PORT`),
    /// else, in a Slurm step, the step's first node ([`crate::launcher::slurm_root_with`]).
    /// The job secret is `STRATA_SECRET` (32 hex digits) when set, otherwise derived from the
    /// launcher's job identifiers and the root address. Rank 0 keeps the root's port open
    /// while the communicator lives, for `collbench status` ([`Communicator::job_status`]);
    /// more communicators of the same job come from [`Communicator::split`] or
    /// [`Communicator::subgroup`], or from another `from_env` once this one is dropped.
    pub fn from_env() -> Result<Self> {
        let info = crate::launcher::detect()?.ok_or_else(|| {
            Error::InvalidArgument("no launcher variables found (RANK/WORLD_SIZE, SLURM_PROCID/SLURM_NTASKS, OMPI_COMM_WORLD_*, PMI_*)".into())
        })?;
        let root = root_from_env()?;
        let secret = secret_from_env(&root)?;
        let cfg = Config::from_env()?;
        let (id, job_root) = if info.rank == 0 {
            let (id, job_root) = serve_job_root(root, secret, &cfg)?;
            (id, Some(job_root))
        } else {
            (UniqueId::from_parts(root, &secret), None)
        };
        let comm = Self::init_with_config(&id, info.size, info.rank, cfg)?;
        if let Some(job_root) = job_root {
            let _ = comm.inner.job_root.set((root, job_root));
        }
        Ok(comm)
    }

    /// The live view of this communicator: every rank's call, how long it has been in it,
    /// whom it waits on, stragglers and faults, gathered down the rank tree within `within`
    /// (ranks that do not answer by then are named as silent). The job keeps running.
    pub fn status(&self, within: Duration) -> JobStatus {
        let root = self.inner.job_root.get().map(|(addr, _)| addr.to_string());
        self.inner.status.job_status(within, root)
    }

    /// The live view of a running job from outside it (`collbench status`): its bootstrap
    /// root is `root` (`host:port`), else found as [`Communicator::from_env`] finds it, and
    /// its secret is `STRATA_SECRET`, else derived as `from_env` derives it. The root answers
    /// while rank 0 of a job started from the launcher's variables (or `collbench --np` with
    /// `STRATA_ROOT` set) runs.
    pub fn job_status(root: Option<&str>, within: Duration) -> Result<JobStatus> {
        let root = match root {
            Some(r) => resolve_root(r.trim())?,
            None => root_from_env()?,
        };
        let secret = secret_from_env(&root)?;
        let cfg = Config::from_env()?;
        crate::status::ask_job(
            root,
            secret,
            comm_id_of(&secret, b"world"),
            cfg.handshake_timeout,
            within,
        )
    }

    pub(super) fn from_parts(
        rank: usize,
        peers: Vec<PeerInfo>,
        comm_id: String,
        secret: Secret,
        cfg: Config,
        listener: Listening,
        costs: TierCosts,
    ) -> Result<Self> {
        let size = peers.len();
        let costs = probe::priced_costs(costs, &peers, cfg.cost_profile.as_deref());
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
        // Ranks that share this kernel's cores, network namespaces or not: they compete for
        // the CPU while they wait, and for its caches.
        let me = &peers[rank].host;
        let local: Vec<&crate::HostProbe> = peers
            .iter()
            .filter(|p| p.host.same_kernel(me))
            .map(|p| &p.probe)
            .collect();
        let local_ranks = local.len();
        // A rank bound to a core of its own spins while it waits even where the host has more
        // ranks than cores: at 3 ranks on 2 cores, 8 B rings took 17-28 µs with it sleeping
        // like the two that share a core, 6 µs with it spinning.
        let spin = executor::SpinPolicy::for_rank(
            local_ranks,
            probe::shares_core(&local, &peers[rank].probe),
        );
        // What slices the ring must be the same on every rank, so it counts the fullest host.
        let fullest_host = fullest_host(&peers);
        let tuner = Tuner::new(
            Hierarchy::from_tiers(&tiers),
            tiers.costs(),
            cfg.rank_order == RankOrder::Topology,
        )
        .with_rules(cfg.tuning_rules.clone())
        .with_ring_pipeline(cfg.ring_pipeline_bytes, fullest_host)
        .with_shared_cores(probe::shared_cores(&peers));
        let mut state = State {
            conns: (0..size).map(|_| None).collect(),
            seq: 0,
            device_seq: 0,
            stragglers: Default::default(),
            stragglers_published: Duration::ZERO,
            seconds_per_tick: 0.0,
            folds: 0,
            p2p_sent: HashMap::new(),
            p2p_received: HashMap::new(),
            scratch: Vec::new(),
            staging: Vec::new(),
            schedules: HashMap::new(),
            last_call: None,
            last_choice: None,
            small_calls: 0,
            trials: HashMap::new(),
            agreeing: false,
            exec: executor::ExecBuffers::with_stall_threshold(cfg.straggler_threshold),
            splits: 0,
            any_source_last: 0,
            shrinks: 0,
        };
        let health = listener.health();
        state.exec.stalls.board = Some(health.waits.clone());
        // The ranks as the timeout census and the live view reach them down the rank tree.
        let directory = Arc::new(crate::diagnosis::Directory {
            comm: comm_id.clone(),
            rank,
            peers: peers.clone(),
            secret,
            health: health.clone(),
            handshake_timeout: cfg.handshake_timeout,
        });
        let diagnoser = Arc::new(crate::diagnosis::Diagnoser::new(directory.clone()));
        listener.set_diagnoser(diagnoser.clone());
        let status = Arc::new(crate::status::StatusSource::new(directory));
        listener.set_status_source(status.clone());
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
        let metrics = if cfg.metrics_port.is_some() || cfg.metrics_file.is_some() {
            let me = &peers[rank];
            let m = Arc::new(crate::metrics::CommMetrics::new(
                &comm_id,
                rank,
                size,
                &me.host.hostname,
                health.clone(),
            ));
            let place = peers[..rank].iter().filter(|p| p.host == me.host).count();
            crate::metrics::register(&m, &cfg, place, rank)?;
            Some(m)
        } else {
            None
        };
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
                spin,
                sent_ahead: AtomicU64::new(0),
                fullest_host,
                gpu: std::sync::OnceLock::new(),
                diagnoser,
                status,
                job_root: std::sync::OnceLock::new(),
                metrics,
            }),
        })
    }
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

impl UniqueId {
    /// The id of a job whose root is given by the launcher's variables, as
    /// [`Communicator::from_env`] finds it (`STRATA_ROOT`, `MASTER_ADDR`, a Slurm step), served
    /// in this process: for a launcher that spawns the ranks itself (`collbench --np`). The
    /// root stays open for status clients until the [`JobRoot`] is dropped. `None` when no
    /// root is named.
    pub fn serve_from_env() -> Result<Option<(Self, JobRoot)>> {
        if std::env::var_os("STRATA_ROOT").is_none() && std::env::var_os("MASTER_ADDR").is_none() {
            return Ok(None);
        }
        let root = root_from_env()?;
        let secret = secret_from_env(&root)?;
        serve_job_root(root, secret, &Config::from_env()?).map(Some)
    }
}

/// Serves the job's root on `root`'s port, on every interface; the id names `root`'s address.
fn serve_job_root(root: SocketAddr, secret: Secret, cfg: &Config) -> Result<(UniqueId, JobRoot)> {
    let bind = SocketAddr::new(
        if root.is_ipv4() {
            IpAddr::from([0, 0, 0, 0])
        } else {
            IpAddr::from([0u16; 8])
        },
        root.port(),
    );
    let (served, job_root) = UniqueId::serve_job(bind, secret, cfg.init_timeout)?;
    let id = UniqueId::from_parts(
        SocketAddr::new(root.ip(), served.root_addr().port()),
        &secret,
    );
    Ok((id, job_root))
}

/// `host:port` resolved to its first IPv4 address.
fn resolve_root(s: &str) -> Result<SocketAddr> {
    s.to_socket_addrs()
        .map_err(|e| Error::InvalidArgument(format!("cannot resolve bootstrap root '{s}': {e}")))?
        .find(|a| a.is_ipv4())
        .ok_or_else(|| Error::InvalidArgument(format!("bootstrap root '{s}' has no IPv4 address")))
}

fn root_from_env() -> Result<SocketAddr> {
    let resolve = resolve_root;
    if let Ok(root) = std::env::var("STRATA_ROOT") {
        return resolve(root.trim());
    }
    let Ok(addr) = std::env::var("MASTER_ADDR") else {
        let get = |k: &str| std::env::var(k).ok();
        let Some((host, port)) = crate::launcher::slurm_root_with(get)? else {
            return Err(Error::InvalidArgument(
                "set STRATA_ROOT=host:port or MASTER_ADDR (with MASTER_PORT or STRATA_PORT), \
                 or start the ranks with srun"
                    .into(),
            ));
        };
        // Task 0 serves the root, so it must run on the step's first node.
        if let (Some("0"), Some(node)) = (get("SLURM_PROCID").as_deref(), get("SLURMD_NODENAME"))
            && node != host
        {
            return Err(Error::InvalidArgument(format!(
                "Slurm task 0 runs on {node}, not on {host}, the first node of \
                 SLURM_STEP_NODELIST, where the other tasks look for the bootstrap root; \
                 set STRATA_ROOT=host:port"
            )));
        }
        tracing::debug!(%host, port, "bootstrap root from the Slurm step");
        return resolve(&format!("{host}:{port}"));
    };
    let port = match crate::launcher::strata_port(|k| std::env::var(k).ok())? {
        Some(p) => p,
        None => {
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

/// The most ranks that share one kernel (any network namespace); a rank whose host has no
/// boot id counts alone. Every rank computes the same number from the same table.
fn fullest_host(peers: &[PeerInfo]) -> usize {
    let mut per_kernel: HashMap<&str, usize> = HashMap::new();
    for p in peers.iter().filter(|p| !p.host.boot_id.is_empty()) {
        *per_kernel.entry(p.host.boot_id.as_str()).or_default() += 1;
    }
    per_kernel.into_values().max().unwrap_or(0).max(1)
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
