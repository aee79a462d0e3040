//! collbench: an nccl-tests-style benchmark of strata's collectives.
//!
//! `collbench --np 4` spawns 4 ranks of itself on this host; under torchrun, srun or mpirun it
//! joins from the launcher's variables instead. Results are checked by default (`-c 1`) and
//! the process exits non-zero when any element is wrong.

use clap::Parser;
use serde::Serialize;
use std::process::{Child, Command, ExitCode};
use std::time::{Duration, Instant};
use strata::check;
use strata::{Algorithm, CallSpec, Collective, Communicator, DataType, ReduceOp, UniqueId};

/// Environment variables a spawning parent hands its children.
const ENV_ID: &str = "STRATA_COLLBENCH_ID";
const ENV_RANK: &str = "STRATA_COLLBENCH_RANK";
const ENV_NRANKS: &str = "STRATA_COLLBENCH_NRANKS";

#[derive(Parser, Debug, Clone)]
#[command(
    name = "collbench",
    version,
    about = "nccl-tests-style benchmark for strata collectives"
)]
struct Args {
    /// Spawn this many ranks on this host (0: join from launcher variables, else run 1 rank).
    #[arg(long, default_value_t = 0)]
    np: usize,
    /// The collective: all_reduce, broadcast, reduce, all_gather, reduce_scatter, all_to_all,
    /// gather, scatter, send_recv.
    #[arg(long = "op", default_value = "all_reduce")]
    collective: String,
    /// Smallest size in bytes (K, M, G suffixes).
    #[arg(short = 'b', long = "minbytes", default_value = "8", value_parser = parse_size)]
    min_bytes: usize,
    /// Largest size in bytes.
    #[arg(short = 'e', long = "maxbytes", default_value = "64M", value_parser = parse_size)]
    max_bytes: usize,
    /// Multiply the size by this factor between rows (when > 1).
    #[arg(short = 'f', long = "stepfactor", default_value_t = 2)]
    step_factor: usize,
    /// Add this many bytes between rows (when the factor is 1).
    #[arg(short = 'i', long = "stepbytes", default_value = "1M", value_parser = parse_size)]
    step_bytes: usize,
    /// Timed iterations per size.
    #[arg(short = 'n', long = "iters", default_value_t = 20)]
    iters: usize,
    /// Warm-up iterations per size.
    #[arg(short = 'w', long = "warmup_iters", default_value_t = 5)]
    warmup: usize,
    /// Check results (1) or not (0).
    #[arg(short = 'c', long = "check", default_value_t = 1)]
    check: u8,
    /// Reduction: sum, prod, min, max, avg, premulsum, or all.
    #[arg(short = 'o', long = "redop", default_value = "sum")]
    redop: String,
    /// Element type (float, half, bfloat16, double, int8, uint8, int32, uint32, int64, uint64,
    /// f8e4m3, f8e5m2) or all.
    #[arg(short = 'd', long = "datatype", default_value = "float")]
    dtype: String,
    /// Algorithm: auto (strata's choice per size), a name (ring, tree, rd, rhd, bruck, ...),
    /// a comma-separated list, or all: one table per algorithm of the collective.
    #[arg(short = 'A', long = "algo", default_value = "auto")]
    algo: String,
    /// Time only the out-of-place call (halves the run time of long sweeps).
    #[arg(long = "no-in-place")]
    no_in_place: bool,
    /// Root of rooted collectives.
    #[arg(short = 'r', long = "root", default_value_t = 0)]
    root: usize,
    /// Also write the results as JSON to this file.
    #[arg(short = 'J', long = "json")]
    json: Option<std::path::PathBuf>,
    /// Give up (and kill the ranks) after this many seconds, with --np.
    #[arg(long)]
    timeout: Option<f64>,
    #[command(subcommand)]
    command: Option<Subcommand>,
}

#[derive(clap::Subcommand, Debug, Clone)]
enum Subcommand {
    /// Print what strata sees: the host as a tree, GPU-to-NIC affinity, the fabric and the
    /// tier of every rank-pair class.
    Topo(TopoArgs),
    /// Place a [TP, CP, PP, DP] job on a fabric: the planner's order and, for comparison, a
    /// scattered one, with the widest tier each kind of group spans.
    Layout(LayoutArgs),
    /// Price every algorithm of a collective at one size on a fabric and say which the tuner
    /// picks and why.
    Explain(ExplainArgs),
}

#[derive(clap::Args, Debug, Clone)]
struct ExplainArgs {
    /// The collective.
    #[arg(long = "op", default_value = "all_reduce")]
    op: String,
    /// Bytes per rank (K, M, G suffixes), NCCL's count × element size.
    #[arg(long, default_value = "64M", value_parser = parse_size)]
    size: usize,
    /// The fabric (default: STRATA_TOPO_FILE; without either, one host).
    #[arg(long = "topo-file")]
    topo_file: Option<std::path::PathBuf>,
    /// Ranks: the first N devices of the fabric (default: all, up to 256), or N ranks on
    /// one host.
    #[arg(long)]
    np: Option<usize>,
    /// Deal the ranks round-robin over the leaves instead of filling each host in turn.
    #[arg(long)]
    cyclic: bool,
    /// Price flat schedules in launcher order (STRATA_RANK_ORDER=launcher).
    #[arg(long = "launcher-order")]
    launcher_order: bool,
}

#[derive(clap::Args, Debug, Clone)]
struct LayoutArgs {
    /// The fabric: a strata topology file with a `[fat_tree]` section.
    #[arg(long = "topo-file")]
    topo_file: std::path::PathBuf,
    /// Tensor-parallel size.
    #[arg(long, default_value_t = 1)]
    tp: usize,
    /// Context-parallel size.
    #[arg(long, default_value_t = 1)]
    cp: usize,
    /// Pipeline-parallel size.
    #[arg(long, default_value_t = 1)]
    pp: usize,
    /// Data-parallel size.
    #[arg(long, default_value_t = 1)]
    dp: usize,
    /// Also report a launcher order shuffled with this seed.
    #[arg(long)]
    scatter: Option<u64>,
}

/// `collbench layout`.
fn layout_main(a: &LayoutArgs) -> ExitCode {
    use strata::algorithms::layout::{self, Layout, Shape};
    use strata::topology::{Tier, fabric};
    let run = || -> Result<(), String> {
        let fab = fabric::load_file(&a.topo_file).map_err(|e| e.to_string())?;
        let fabric::Layout::FatTree {
            hosts_per_leaf,
            leaves_per_pod,
            ..
        } = fab.layout
        else {
            return Err("the planner needs a topology file with a [fat_tree] section".into());
        };
        let per_host = fab.gpus_per_host;
        let shape = Shape {
            per_host,
            per_leaf: per_host * hosts_per_leaf,
            per_pod: per_host * hosts_per_leaf * leaves_per_pod,
            total: fab.ranks(),
        };
        let l = Layout::new(a.tp, a.cp, a.pp, a.dp)?;
        let tier = |x: usize, y: usize| fab.rank_tier(x, y).unwrap_or(Tier::Aggregation);
        let nvlink = fab.tiers.nvlink.is_some();
        println!("# {l} on {} ({} devices)", fab.source, shape.total);
        let plan = layout::plan_placement(&l, &shape);
        for c in &plan.cannot {
            println!("# cannot: {c}");
        }
        let show = |title: &str, device: &[usize]| -> Result<(), String> {
            println!("{title}");
            for p in layout::placement_report(&l, device, &tier, nvlink)? {
                println!(
                    "  {:<3} {:>6} groups of {:<5} widest tier {:<12} {}",
                    p.kind.to_string(),
                    p.groups,
                    p.size,
                    format!("{:?}", p.widest),
                    p.warning
                        .map_or("ok".to_string(), |w| format!("WARNING: {w}"))
                );
            }
            Ok(())
        };
        if plan.device.len() == l.world() {
            show(
                "planned order (global rank r on device r in topology order):",
                &plan.device,
            )?;
        }
        if let Some(seed) = a.scatter {
            let mut device: Vec<usize> = (0..l.world().min(shape.total)).collect();
            // Fisher-Yates with a splitmix64 stream: the same seed gives the same order.
            let mut x = seed;
            for i in (1..device.len()).rev() {
                x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
                let mut z = x;
                z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
                z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
                z ^= z >> 31;
                device.swap(i, (z % (i as u64 + 1)) as usize);
            }
            if device.len() == l.world() {
                show(&format!("scattered launcher order (seed {seed}):"), &device)?;
            }
        }
        Ok(())
    };
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("collbench layout: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `collbench explain`.
fn explain_main(a: &ExplainArgs) -> ExitCode {
    use strata::algorithms::Hierarchy;
    use strata::algorithms::tuner::{Tuner, human_bytes};
    use strata::topology::{Tier, TierCosts, fabric};
    let run = || -> Result<String, String> {
        let collective =
            Collective::parse(&a.op).ok_or_else(|| format!("unknown collective '{}'", a.op))?;
        let path = a
            .topo_file
            .clone()
            .or_else(|| std::env::var_os("STRATA_TOPO_FILE").map(Into::into));
        let (hierarchy, costs, source) = match path {
            Some(path) => {
                let fab = fabric::load_file(&path).map_err(|e| e.to_string())?;
                let np = a.np.unwrap_or(fab.ranks().min(256));
                if np == 0 || np > fab.ranks() {
                    return Err(format!("--np {np}: the fabric has {} devices", fab.ranks()));
                }
                let per_host = fab.gpus_per_host.max(1);
                let devices = if a.cyclic {
                    cyclic_devices(np, per_host, &fab)
                } else {
                    (0..np).collect()
                };
                let keys: Vec<Vec<String>> = devices
                    .iter()
                    .map(|&d| {
                        let host = d / per_host;
                        let place = fab.place(host).unwrap_or(fabric::Place { pod: 0, leaf: 0 });
                        vec![
                            format!("{:06}", place.pod),
                            format!("{:06}", place.leaf),
                            format!("{host:08}"),
                        ]
                    })
                    .collect();
                let tier = |x: usize, y: usize| {
                    fab.rank_tier(devices[x], devices[y])
                        .unwrap_or(Tier::Aggregation)
                };
                let h = Hierarchy::from_keys(&keys, tier);
                (h, fab.tiers, path.display().to_string())
            }
            None => {
                let np = a.np.unwrap_or(8);
                (
                    Hierarchy::single_host(np),
                    TierCosts::default(),
                    "one host".into(),
                )
            }
        };
        let tuner = Tuner::new(hierarchy, costs, !a.launcher_order);
        let e = tuner.explain(collective, a.size);
        Ok(format!(
            "# collbench explain: {collective}, {} per rank, fabric {source}{}\n{}",
            human_bytes(a.size),
            if a.cyclic {
                ", ranks dealt round-robin over leaves"
            } else {
                ""
            },
            e.render()
        ))
    };
    match run() {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("collbench explain: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The devices of `np` ranks dealt round-robin over the leaves of `fab` (rank r goes to leaf
/// r mod leaves), each leaf filling its devices in order.
fn cyclic_devices(
    np: usize,
    per_host: usize,
    fab: &strata::topology::fabric::Fabric,
) -> Vec<usize> {
    let hosts = fab.hosts();
    let mut by_leaf: std::collections::BTreeMap<usize, Vec<usize>> = Default::default();
    for h in 0..hosts {
        if let Some(p) = fab.place(h) {
            by_leaf
                .entry(p.leaf)
                .or_default()
                .extend((0..per_host).map(|g| h * per_host + g));
        }
    }
    let mut queues: Vec<std::collections::VecDeque<usize>> =
        by_leaf.into_values().map(Into::into).collect();
    let mut out = Vec::with_capacity(np);
    while out.len() < np && queues.iter().any(|q| !q.is_empty()) {
        for q in queues.iter_mut() {
            if out.len() < np {
                if let Some(d) = q.pop_front() {
                    out.push(d);
                }
            }
        }
    }
    out
}

#[derive(clap::Args, Debug, Clone)]
struct TopoArgs {
    /// Read the host from this NCCL topology XML file instead of sysfs.
    #[arg(long = "nccl-xml")]
    nccl_xml: Option<std::path::PathBuf>,
    /// Read the host from this hwloc XML export (`lstopo --of xml`); needs the hwloc feature.
    #[arg(long = "hwloc-xml")]
    hwloc_xml: Option<std::path::PathBuf>,
    /// Also write the host model as NCCL topology XML to this file.
    #[arg(long = "export-nccl-xml")]
    export_nccl_xml: Option<std::path::PathBuf>,
    /// Read the fabric from Slurm's topology.conf.
    #[arg(long = "slurm-topology")]
    slurm_topology: Option<std::path::PathBuf>,
    /// With --slurm-topology: the host to place (default: this host's name).
    #[arg(long)]
    host: Option<String>,
    /// Read the fabric from a strata topology file (TOML or JSON).
    #[arg(long = "topo-file")]
    topo_file: Option<std::path::PathBuf>,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

#[cfg(feature = "hwloc")]
fn load_hwloc_xml(p: &std::path::Path) -> Result<strata::topology::HostTopology, String> {
    strata::topology::hwloc::load_xml(p).map_err(|e| e.to_string())
}

#[cfg(not(feature = "hwloc"))]
fn load_hwloc_xml(_: &std::path::Path) -> Result<strata::topology::HostTopology, String> {
    Err(
        "this collbench was built without hwloc; rebuild with --features hwloc \
         (needs Debian's libhwloc-dev and libudev-dev)"
            .into(),
    )
}

/// `collbench topo`.
fn topo_main(t: &TopoArgs) -> ExitCode {
    use strata::topology::{fabric, nccl_xml, report, sysfs};
    let run = || -> Result<String, String> {
        let nccl_env = std::env::var_os("NCCL_TOPO_FILE").map(std::path::PathBuf::from);
        let mut host = match (&t.nccl_xml, &t.hwloc_xml) {
            (Some(_), Some(_)) => return Err("give --nccl-xml or --hwloc-xml, not both".into()),
            (Some(p), None) => nccl_xml::load(p).map_err(|e| e.to_string())?,
            (None, Some(p)) => load_hwloc_xml(p)?,
            (None, None) => match nccl_env {
                Some(p) => nccl_xml::load(&p).map_err(|e| format!("NCCL_TOPO_FILE: {e}"))?,
                None => sysfs::discover(std::path::Path::new("/")),
            },
        };
        // NVLinks come from NVML on this machine; a file describes another one.
        let describes_this_host = t.nccl_xml.is_none() && t.hwloc_xml.is_none();
        let nvml_note = match strata::topology::nvml::probe() {
            Ok(gpus) if describes_this_host => {
                let matched = strata::topology::nvml::merge(&mut host, &gpus);
                format!("NVML: {} GPUs, {matched} matched on PCI", gpus.len())
            }
            Ok(gpus) => format!(
                "NVML: {} GPUs on this machine (not merged into a file's host)",
                gpus.len()
            ),
            Err(reason) => reason,
        };
        if let Some(p) = &t.export_nccl_xml {
            std::fs::write(p, nccl_xml::export(&host))
                .map_err(|e| format!("writing {}: {e}", p.display()))?;
        }
        let (fab, host_name) = match (&t.slurm_topology, &t.topo_file) {
            (Some(_), Some(_)) => {
                return Err("give --slurm-topology or --topo-file, not both".into());
            }
            (Some(p), None) => {
                let text =
                    std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?;
                let f = fabric::parse_slurm(&text, &p.display().to_string())
                    .map_err(|e| e.to_string())?;
                let me = t
                    .host
                    .clone()
                    .unwrap_or_else(|| strata::topology::HostIdentity::detect().hostname);
                (Some(f), Some(me))
            }
            (None, Some(p)) => (
                Some(fabric::load_file(p).map_err(|e| e.to_string())?),
                t.host.clone(),
            ),
            (None, None) => (None, None),
        };
        let mut r = report::build(&host, fab.as_ref(), host_name.as_deref())?;
        r.notes.push(nvml_note);
        if t.json {
            serde_json::to_string_pretty(&r).map_err(|e| e.to_string())
        } else {
            Ok(report::render(&r, &host))
        }
    };
    match run() {
        Ok(text) => {
            println!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("collbench topo: {e}");
            ExitCode::FAILURE
        }
    }
}

fn parse_size(s: &str) -> Result<usize, String> {
    let s = s.trim();
    let (num, mult) = match s.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&s[..s.len() - 1], 1usize << 10),
        Some('M') => (&s[..s.len() - 1], 1 << 20),
        Some('G') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| format!("'{s}' is not a size"))
}

#[derive(Serialize, Clone, Copy, Default)]
struct Measure {
    time_us: f64,
    algbw_gbs: f64,
    busbw_gbs: f64,
    wrong: u64,
}

#[derive(Serialize)]
struct Row {
    collective: String,
    dtype: String,
    redop: String,
    root: i64,
    algorithm: String,
    /// The cost model's prediction for this row's algorithm and size, µs.
    predicted_us: Option<f64>,
    size_bytes: usize,
    count: usize,
    out_of_place: Measure,
    /// Absent with --no-in-place.
    in_place: Option<Measure>,
}

#[derive(Serialize)]
struct Report {
    nranks: usize,
    transport: String,
    rows: Vec<Row>,
    avg_busbw_gbs: f64,
    wrong: u64,
}

fn main() -> ExitCode {
    let args = Args::parse();
    match &args.command {
        Some(Subcommand::Topo(t)) => return topo_main(t),
        Some(Subcommand::Layout(l)) => return layout_main(l),
        Some(Subcommand::Explain(e)) => return explain_main(e),
        None => {}
    }
    if let Ok(id_hex) = std::env::var(ENV_ID) {
        return child_main(&args, &id_hex);
    }
    if args.np > 0 {
        return spawn_main(&args);
    }
    let comm = match strata::launcher::detect() {
        Ok(Some(_)) => Communicator::from_env(),
        Ok(None) => UniqueId::new().and_then(|id| Communicator::init(&id, 1, 0)),
        Err(e) => Err(e),
    };
    match comm {
        Ok(comm) => bench_main(&args, &comm),
        Err(e) => {
            eprintln!("collbench: init failed: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Spawns `np` ranks of this program on this host (over loopback unless told otherwise).
fn spawn_main(args: &Args) -> ExitCode {
    if std::env::var_os("STRATA_SOCKET_IFNAME").is_none()
        && std::env::var_os("NCCL_SOCKET_IFNAME").is_none()
    {
        // SAFETY: single-threaded at this point; children inherit it.
        unsafe { std::env::set_var("STRATA_SOCKET_IFNAME", "=lo") };
    }
    let id = match UniqueId::new() {
        Ok(id) => id,
        Err(e) => {
            eprintln!("collbench: {e}");
            return ExitCode::FAILURE;
        }
    };
    let exe = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("collbench: cannot find my own executable: {e}");
            return ExitCode::FAILURE;
        }
    };
    let passthrough: Vec<String> = std::env::args().skip(1).collect();
    let mut children: Vec<Child> = Vec::new();
    for rank in 0..args.np {
        let child = Command::new(&exe)
            .args(&passthrough)
            .env(ENV_ID, id.to_hex())
            .env(ENV_RANK, rank.to_string())
            .env(ENV_NRANKS, args.np.to_string())
            .spawn();
        match child {
            Ok(c) => children.push(c),
            Err(e) => {
                eprintln!("collbench: spawning rank {rank}: {e}");
                kill_all(&mut children);
                return ExitCode::FAILURE;
            }
        }
    }
    let deadline = args
        .timeout
        .map(|t| Instant::now() + Duration::from_secs_f64(t));
    let mut status: Vec<Option<bool>> = vec![None; children.len()];
    let mut failed_at: Option<Instant> = None;
    loop {
        for (r, c) in children.iter_mut().enumerate() {
            if status[r].is_none() {
                if let Ok(Some(s)) = c.try_wait() {
                    status[r] = Some(s.success());
                    if !s.success() {
                        eprintln!("collbench: rank {r} exited with {s}");
                        failed_at.get_or_insert_with(Instant::now);
                    }
                }
            }
        }
        if status.iter().all(Option::is_some) {
            break;
        }
        // After a failure, give the others a moment to report their own errors.
        let grace_over = failed_at.is_some_and(|t| t.elapsed() > Duration::from_secs(10));
        if grace_over || deadline.is_some_and(|d| Instant::now() > d) {
            eprintln!("collbench: stopping the remaining ranks");
            kill_all(&mut children);
            return ExitCode::FAILURE;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    if status.iter().all(|s| *s == Some(true)) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn kill_all(children: &mut [Child]) {
    for c in children.iter_mut() {
        let _ = c.kill();
        let _ = c.wait();
    }
}

fn child_main(args: &Args, id_hex: &str) -> ExitCode {
    let parsed = UniqueId::from_hex(id_hex);
    let rank = std::env::var(ENV_RANK)
        .ok()
        .and_then(|v| v.parse::<usize>().ok());
    let nranks = std::env::var(ENV_NRANKS)
        .ok()
        .and_then(|v| v.parse::<usize>().ok());
    let (Ok(id), Some(rank), Some(nranks)) = (parsed, rank, nranks) else {
        eprintln!("collbench: malformed {ENV_ID}/{ENV_RANK}/{ENV_NRANKS}");
        return ExitCode::FAILURE;
    };
    match Communicator::init(&id, nranks, rank) {
        Ok(comm) => bench_main(args, &comm),
        Err(e) => {
            eprintln!("collbench: rank {rank}: init failed: {e}");
            ExitCode::FAILURE
        }
    }
}

fn list<T>(
    spec: &str,
    all: Vec<T>,
    parse: impl Fn(&str) -> Option<T>,
    what: &str,
) -> Result<Vec<T>, String> {
    if spec.eq_ignore_ascii_case("all") {
        return Ok(all);
    }
    spec.split(',')
        .map(|s| parse(s).ok_or_else(|| format!("unknown {what} '{s}'")))
        .collect()
}

/// busbw / algbw for `c` on `n` ranks (nccl-tests' factors).
fn bus_factor(c: Collective, n: usize) -> f64 {
    let n = n as f64;
    match c {
        Collective::AllReduce => 2.0 * (n - 1.0) / n,
        Collective::AllGather
        | Collective::ReduceScatter
        | Collective::AllToAll
        | Collective::Gather
        | Collective::Scatter => (n - 1.0) / n,
        _ => 1.0,
    }
}

/// (count, input bytes, output bytes) for a row of `size` bytes, nccl-tests' convention: size
/// is the larger of the two buffers of a rank.
fn shape(
    c: Collective,
    size: usize,
    es: usize,
    n: usize,
    rank: usize,
    root: usize,
) -> (usize, usize, usize) {
    let elems = size / es;
    let count = match c {
        Collective::AllGather
        | Collective::ReduceScatter
        | Collective::AllToAll
        | Collective::Gather
        | Collective::Scatter => elems / n,
        _ => elems,
    };
    let (i, o) = c.buffer_elems(count, n, rank, root);
    (count, i * es, o * es)
}

fn bench_main(args: &Args, comm: &Communicator) -> ExitCode {
    match run_bench(args, comm) {
        Ok(0) => ExitCode::SUCCESS,
        Ok(wrong) => {
            if comm.rank() == 0 {
                eprintln!("collbench: {wrong} wrong elements");
            }
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("collbench: rank {}: {e}", comm.rank());
            ExitCode::FAILURE
        }
    }
}

fn run_bench(args: &Args, comm: &Communicator) -> Result<u64, String> {
    let collective = if args
        .collective
        .replace(['-', '_'], "")
        .eq_ignore_ascii_case("sendrecv")
    {
        Collective::Send
    } else {
        Collective::parse(&args.collective)
            .filter(|c| !matches!(c, Collective::Recv | Collective::Barrier | Collective::Send))
            .ok_or_else(|| format!("unknown collective '{}'", args.collective))?
    };
    let dtypes = list(
        &args.dtype,
        DataType::ALL.to_vec(),
        DataType::parse,
        "data type",
    )?;
    let algos = parse_algos(&args.algo, collective)?;
    let (n, rank) = (comm.size(), comm.rank());
    if args.root >= n {
        return Err(format!("root {} is out of range for {n} ranks", args.root));
    }
    if args.min_bytes > args.max_bytes {
        return Err("-b must not exceed -e".into());
    }
    let mut sizes = Vec::new();
    let mut s = args.min_bytes;
    while s <= args.max_bytes {
        sizes.push(s);
        let next = if args.step_factor > 1 {
            s.saturating_mul(args.step_factor)
        } else {
            s.saturating_add(args.step_bytes.max(1))
        };
        if next == s {
            break;
        }
        s = next;
    }
    let transport = std::env::var("STRATA_TRANSPORT").unwrap_or_else(|_| "auto".into());
    if rank == 0 {
        println!(
            "# collbench (strata {}): {collective}, {n} ranks, transport {transport}",
            env!("CARGO_PKG_VERSION")
        );
        println!(
            "# nccl-tests columns; algbw = size/time, busbw = algbw x {:.3}; GB = 1e9 B",
            bus_factor(collective, n)
        );
        for p in comm.peers() {
            println!(
                "#  Rank {:3} Pid {:7} on {}",
                p.rank, p.pid, p.host.hostname
            );
        }
    }
    let mut rows = Vec::new();
    let mut total_wrong = 0u64;
    let total_rows = sizes.len() * dtypes.len() * algos.len();
    let started = Instant::now();
    let mut last_progress = Instant::now();
    for &algo in &algos {
        comm.set_algorithm(collective, algo)
            .map_err(|e| e.to_string())?;
        if rank == 0 {
            print_columns(algo);
        }
        let first_row = rows.len();
        for &dtype in &dtypes {
            let ops = if collective.reduces() {
                let all = ["sum", "prod", "min", "max", "avg", "premulsum"]
                    .map(|s| ReduceOp::parse(s, dtype).unwrap_or(ReduceOp::Sum));
                list(
                    &args.redop,
                    all.to_vec(),
                    |s| ReduceOp::parse(s, dtype),
                    "reduction",
                )?
            } else {
                vec![ReduceOp::Sum]
            };
            for op in ops {
                for &size in &sizes {
                    let row = bench_row(args, comm, collective, dtype, op, size)?;
                    total_wrong += row.out_of_place.wrong + row.in_place.map_or(0, |m| m.wrong);
                    if rank == 0 {
                        print_row(&row);
                        if last_progress.elapsed() > Duration::from_secs(2) {
                            eprintln!(
                                "# collbench: {} of {} rows done, {:.0} s",
                                rows.len() + 1,
                                total_rows,
                                started.elapsed().as_secs_f64()
                            );
                            last_progress = Instant::now();
                        }
                    }
                    rows.push(row);
                }
            }
        }
        if rank == 0 && algos.len() > 1 {
            println!(
                "# Avg bus bandwidth ({}): {:.4}",
                algo.map_or("auto".into(), |a| a.name()),
                avg_busbw(&rows[first_row..])
            );
        }
    }
    // Later collectives of this process (none today) get strata's own choice again.
    comm.set_algorithm(collective, None)
        .map_err(|e| e.to_string())?;
    let avg = avg_busbw(&rows);
    if rank == 0 {
        println!(
            "# Out of bounds values : {total_wrong} {}",
            if total_wrong == 0 { "OK" } else { "FAILED" }
        );
        println!("# Avg bus bandwidth    : {avg:.4}");
        println!("#");
        if let Some(path) = &args.json {
            let report = Report {
                nranks: n,
                transport,
                rows,
                avg_busbw_gbs: avg,
                wrong: total_wrong,
            };
            let text = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
            std::fs::write(path, text).map_err(|e| format!("writing {}: {e}", path.display()))?;
        }
    }
    Ok(total_wrong)
}

fn avg_busbw(rows: &[Row]) -> f64 {
    let busbws: Vec<f64> = rows
        .iter()
        .flat_map(|r| [Some(r.out_of_place), r.in_place])
        .flatten()
        .map(|m| m.busbw_gbs)
        .collect();
    if busbws.is_empty() {
        0.0
    } else {
        busbws.iter().sum::<f64>() / busbws.len() as f64
    }
}

/// The algorithms `--algo` names for `collective` (`None`: strata's choice).
fn parse_algos(spec: &str, collective: Collective) -> Result<Vec<Option<Algorithm>>, String> {
    if spec.eq_ignore_ascii_case("auto") {
        return Ok(vec![None]);
    }
    if spec.eq_ignore_ascii_case("all") {
        let all = strata::algorithms::algorithms_for(collective);
        return Ok(all.iter().copied().map(Some).collect());
    }
    spec.split(',')
        .map(|name| {
            Algorithm::parse_for(collective, name)
                .map(Some)
                .ok_or_else(|| {
                    format!(
                        "algorithm '{name}' cannot run {collective}; valid: auto, all, {}",
                        strata::algorithms::valid_names(collective)
                    )
                })
        })
        .collect()
}

/// The column headers of one table.
fn print_columns(algo: Option<Algorithm>) {
    println!("#");
    println!(
        "# algorithm: {}",
        algo.map_or(
            "auto (strata's choice per size; see the algo column)".into(),
            |a| a.name()
        )
    );
    println!(
        "# {:>10} {:>12} {:>8} {:>9} {:>5}   {:>9} {:>7} {:>7} {:>6}   {:>9} {:>7} {:>7} {:>6}",
        "", "", "", "", "", "out-of-", "place", "", "", "in-", "place", "", ""
    );
    println!(
        "# {:>10} {:>12} {:>8} {:>9} {:>5}   {:>9} {:>7} {:>7} {:>6}   {:>9} {:>7} {:>7} {:>6}  {:>10}  algo",
        "size",
        "count",
        "type",
        "redop",
        "root",
        "time",
        "algbw",
        "busbw",
        "#wrong",
        "time",
        "algbw",
        "busbw",
        "#wrong",
        "predicted"
    );
    println!(
        "# {:>10} {:>12} {:>8} {:>9} {:>5}   {:>9} {:>7} {:>7} {:>6}   {:>9} {:>7} {:>7} {:>6}  {:>10}",
        "(B)",
        "(elements)",
        "",
        "",
        "",
        "(us)",
        "(GB/s)",
        "(GB/s)",
        "",
        "(us)",
        "(GB/s)",
        "(GB/s)",
        "",
        "(us)"
    );
}

fn print_row(r: &Row) {
    let m = |x: &Measure| {
        format!(
            "{:>9.2} {:>7.3} {:>7.3} {:>6}",
            x.time_us, x.algbw_gbs, x.busbw_gbs, x.wrong
        )
    };
    println!(
        "  {:>10} {:>12} {:>8} {:>9} {:>5}   {}   {}  {:>10}  {}",
        r.size_bytes,
        r.count,
        r.dtype,
        r.redop,
        r.root,
        m(&r.out_of_place),
        r.in_place
            .as_ref()
            .map_or(format!("{:>9} {:>7} {:>7} {:>6}", "-", "-", "-", "-"), m),
        r.predicted_us
            .map_or("-".to_string(), |p| format!("{p:.2}")),
        r.algorithm
    );
}

/// One table row: out of place, then in place, then the results checked and agreed on.
fn bench_row(
    args: &Args,
    comm: &Communicator,
    collective: Collective,
    dtype: DataType,
    op: ReduceOp,
    size: usize,
) -> Result<Row, String> {
    let (n, rank) = (comm.size(), comm.rank());
    let es = dtype.size();
    let root = args.root;
    let (count, in_bytes, out_bytes) = shape(collective, size, es, n, rank, root);
    let spec = CallSpec {
        collective,
        dtype,
        count,
        op: check::op_for_rank(op, dtype, rank),
        root,
    };
    let mut send = vec![0u8; in_bytes.max(count * es)];
    let mut recv = vec![0u8; out_bytes.max(in_bytes).max(count * es)];
    let algorithm = if collective == Collective::Send {
        Algorithm::Direct
    } else {
        comm.algorithm_for(collective, count * es)
    };
    let mut results = [Measure::default(); 2];
    let modes: &[bool] = if args.no_in_place {
        &[false]
    } else {
        &[false, true]
    };
    for (k, &in_place) in modes.iter().enumerate() {
        let once = |send: &mut [u8], recv: &mut [u8]| -> strata::Result<()> {
            if collective == Collective::Send {
                return send_recv(comm, dtype, count, send, recv);
            }
            if in_place {
                comm.call_bytes(spec, None, recv)
            } else {
                comm.call_bytes(spec, Some(&send[..in_bytes]), &mut recv[..out_bytes])
            }
        };
        for _ in 0..args.warmup {
            once(&mut send, &mut recv).map_err(|e| e.to_string())?;
        }
        comm.barrier().map_err(|e| e.to_string())?;
        let t0 = Instant::now();
        for _ in 0..args.iters {
            once(&mut send, &mut recv).map_err(|e| e.to_string())?;
        }
        let local_us = t0.elapsed().as_secs_f64() * 1e6 / args.iters.max(1) as f64;
        let mut wrong = 0u64;
        if args.check != 0 && collective != Collective::Send {
            wrong = check::run_and_check(comm, spec, in_place)
                .map_err(|e| e.to_string())?
                .wrong as u64;
        }
        let mut agg = [local_us, wrong as f64];
        let mut maxed = [0f64; 2];
        comm.all_reduce(&agg, &mut maxed, ReduceOp::Max)
            .map_err(|e| e.to_string())?;
        agg[1] = wrong as f64;
        let mut summed = [0f64; 2];
        comm.all_reduce(&agg, &mut summed, ReduceOp::Sum)
            .map_err(|e| e.to_string())?;
        let time_us = maxed[0];
        let algbw = if time_us > 0.0 {
            size as f64 / (time_us * 1e-6) / 1e9
        } else {
            0.0
        };
        results[k] = Measure {
            time_us,
            algbw_gbs: algbw,
            busbw_gbs: algbw * bus_factor(collective, n),
            wrong: summed[1] as u64,
        };
    }
    Ok(Row {
        collective: collective.to_string(),
        dtype: dtype.name().into(),
        redop: if collective.reduces() {
            op.name().into()
        } else {
            "none".into()
        },
        root: if collective.rooted() { root as i64 } else { -1 },
        algorithm: algorithm.name(),
        predicted_us: (rank == 0 && collective != Collective::Send)
            .then(|| comm.predict(collective, algorithm, count * es).ok())
            .flatten()
            .map(|s| s * 1e6),
        size_bytes: size,
        count,
        out_of_place: results[0],
        in_place: (!args.no_in_place).then_some(results[1]),
    })
}

/// The send/recv benchmark: ranks pair up (0↔1, 2↔3, ...), an odd last rank sits out.
fn send_recv(
    comm: &Communicator,
    dtype: DataType,
    count: usize,
    send: &[u8],
    recv: &mut [u8],
) -> strata::Result<()> {
    let (n, rank) = (comm.size(), comm.rank());
    let peer = rank ^ 1;
    if peer >= n {
        return Ok(());
    }
    let bytes = count * dtype.size();
    // Lower rank sends first; the pair never both block on a send.
    let (s, r) = (&send[..bytes], &mut recv[..bytes]);
    if rank < peer {
        comm.send(s, peer)?;
        comm.recv(r, peer)
    } else {
        comm.recv(r, peer)?;
        comm.send(s, peer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("64M"), Ok(64 << 20));
        assert_eq!(parse_size("8"), Ok(8));
        assert!(parse_size("x").is_err());
    }

    #[test]
    fn nccl_tests_bus_factors() {
        assert_eq!(bus_factor(Collective::AllReduce, 4), 1.5);
        assert_eq!(bus_factor(Collective::AllGather, 4), 0.75);
        assert_eq!(bus_factor(Collective::Broadcast, 4), 1.0);
    }
}
