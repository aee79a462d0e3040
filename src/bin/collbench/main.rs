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
    /// Run this many ranks as threads of this one process (with --device cuda they share the
    /// GPUs of their host, rank r on GPU r mod GPUs, reaching each other's memory directly).
    #[arg(long, default_value_t = 0)]
    threads: usize,
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
    /// Warm-up iterations per size: at least this many, and as many as a near-tie trial of
    /// the size or the first lap of every slot ring takes, so that the timed calls see the
    /// steady state (0: none at all).
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
    /// all (every one the collective has), or a comma-separated list of these (all,auto):
    /// one table per algorithm, in that order.
    #[arg(short = 'A', long = "algo", default_value = "auto")]
    algo: String,
    /// Time only the out-of-place call (halves the run time of long sweeps).
    #[arg(long = "no-in-place")]
    no_in_place: bool,
    /// Where the buffers live: host, or cuda (GPU buffers enqueued on a stream and timed with
    /// CUDA events; each rank uses the GPU of its position on its host).
    #[arg(long, default_value = "host", value_parser = ["host", "cuda"])]
    device: String,
    /// Root of rooted collectives.
    #[arg(short = 'r', long = "root", default_value_t = 0)]
    root: usize,
    /// After the table, the bytes each rank reads and writes per byte of the message (from
    /// its schedule) beside this host's memcpy rate: how far each row is from the memory
    /// bandwidth limit.
    #[arg(long)]
    memory: bool,
    /// Also write the results as JSON to this file.
    #[arg(short = 'J', long = "json")]
    json: Option<std::path::PathBuf>,
    /// Give up (and kill the ranks) after this many seconds, with --np.
    #[arg(long)]
    timeout: Option<f64>,
    /// With --np: bind each spawned rank to a core (`core`: one of its own when there are at
    /// least as many cores as ranks, as mpirun does, else core `rank mod cores`), or leave
    /// placement to the scheduler (`none`).
    #[arg(long = "bind-to", default_value = "core", value_parser = ["core", "none"])]
    bind_to: String,
    #[command(subcommand)]
    command: Option<Subcommand>,
}

/// The launcher's flags, also accepted after a subcommand that runs a job
/// (`collbench health --np 4` as well as `collbench --np 4 health`).
#[derive(clap::Args, Debug, Clone, Default)]
struct LaunchArgs {
    /// Spawn this many ranks on this host (as --np before the subcommand).
    #[arg(long = "np")]
    np: Option<usize>,
    /// Give up after this many seconds, with --np (as --timeout before the subcommand).
    #[arg(long = "timeout")]
    timeout: Option<f64>,
    /// Bind spawned ranks: core or none (as --bind-to before the subcommand).
    #[arg(long = "bind-to", value_parser = ["core", "none"])]
    bind_to: Option<String>,
}

impl Args {
    /// Parses the command line, taking launcher flags given after a job's subcommand as if
    /// they came before it (the later one wins when both are given).
    fn from_command_line() -> Self {
        let mut args = Args::parse();
        let launch = match &args.command {
            Some(Subcommand::Health(h)) => Some(h.launch.clone()),
            Some(Subcommand::Calibrate(c)) => Some(c.launch.clone()),
            _ => None,
        };
        if let Some(launch) = launch {
            args.np = launch.np.unwrap_or(args.np);
            args.timeout = launch.timeout.or(args.timeout);
            args.bind_to = launch.bind_to.unwrap_or(args.bind_to);
        }
        args
    }
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
    /// Price the communication of one training step of a [TP, CP, PP, DP] job on a fabric,
    /// for the planned placement and a scattered one.
    Simulate(SimulateArgs),
    /// Draw bus bandwidth and time against message size as an SVG from one or more --json
    /// result files.
    Plot(PlotArgs),
    /// Screen the job's hosts before it starts (with --np or under a launcher): each host's
    /// memory and internal rate, and each host's network rate in ceil(log2 hosts) rounds of
    /// pairwise exchanges, against the median; names what is out of line and exits 3 then.
    Health(HealthArgs),
    /// The live view of a running job, asked of its own ranks from any host without stopping
    /// it: each rank's call and how long it has been in it, whom it waits on, stragglers,
    /// faults, and who holds the job up. Exits 3 when someone does.
    Status(StatusArgs),
    /// Fit the cost model to this machine (with --np or under a launcher): time every
    /// algorithm of all-reduce, all-gather and reduce-scatter from 8 B to 64 MiB, print each
    /// one's measured time beside the model's prediction before and after, and write the
    /// figures of every tier the job spans as a cost profile (STRATA_COST_PROFILE).
    Calibrate(CalibrateArgs),
}

mod bench;
mod calibrate;
mod device;
mod fit;
mod health;
mod launch;
mod memory;
mod plot;
mod simulate;
mod status;
mod tools;

use bench::*;
use calibrate::*;
use health::*;
use launch::*;
use plot::*;
use simulate::*;
use status::*;
use tools::*;

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
    /// Whether strata's tuner chose `algorithm` (`--algo auto`) rather than `--algo` naming it.
    tuned: bool,
    /// The cost model's prediction for this row's algorithm and size, µs.
    predicted_us: Option<f64>,
    size_bytes: usize,
    count: usize,
    out_of_place: Measure,
    /// Absent with --no-in-place.
    in_place: Option<Measure>,
    /// With --memory: bytes this rank reads and writes per byte of the message, in the
    /// buffers, from cache and in the ring's slots.
    #[serde(skip_serializing_if = "Option::is_none")]
    memory_traffic_per_byte: Option<memory::Traffic>,
    /// With --device cuda on the CUDA driver stand-in: what rank 0's out-of-place calls did
    /// per call (logic-level, never GPU speed).
    #[serde(skip_serializing_if = "Option::is_none")]
    standin_per_call: Option<device::PerCall>,
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
    let args = Args::from_command_line();
    match &args.command {
        Some(Subcommand::Topo(t)) => return topo_main(t),
        Some(Subcommand::Layout(l)) => return layout_main(l),
        Some(Subcommand::Explain(e)) => return explain_main(e),
        Some(Subcommand::Simulate(s)) => return simulate_main(s),
        Some(Subcommand::Plot(p)) => return plot_main(p),
        Some(Subcommand::Status(s)) => return status_main(s),
        Some(Subcommand::Health(_) | Subcommand::Calibrate(_)) | None => {}
    }
    if let Ok(id_hex) = std::env::var(ENV_ID) {
        return child_main(&args, &id_hex);
    }
    if args.threads > 0 && args.np > 0 {
        eprintln!(
            "collbench: --threads and --np exclude each other (ranks as threads or as processes)"
        );
        return ExitCode::FAILURE;
    }
    if args.threads > 0 {
        return threads_main(&args);
    }
    if args.np > 0 {
        return spawn_main(&args);
    }
    let comm = match strata::launcher::detect() {
        Ok(Some(info)) => {
            bind_launched_rank(&args, &info);
            Communicator::from_env()
        }
        Ok(None) => UniqueId::new().and_then(|id| Communicator::init(&id, 1, 0)),
        Err(e) => Err(e),
    };
    match comm {
        Ok(comm) => rank_main(&args, &comm),
        Err(e) => {
            eprintln!("collbench: init failed: {e}");
            ExitCode::FAILURE
        }
    }
}

/// What a rank runs: the health check, or the benchmark.
fn rank_main(args: &Args, comm: &Communicator) -> ExitCode {
    match &args.command {
        Some(Subcommand::Health(h)) => health_main(h, comm),
        Some(Subcommand::Calibrate(c)) => calibrate_main(c, comm),
        _ => bench_main(args, comm),
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

    /// `--algo all` runs what can run on the communicator: one-shot up to 8 ranks only.
    #[test]
    fn algo_all_leaves_out_what_cannot_run_on_this_many_ranks() {
        let all = |n| parse_algos("all", Collective::AllReduce, n).unwrap();
        let one_shot = Some(strata::Algorithm::OneShot);
        assert!(all(8).contains(&one_shot));
        assert!(!all(9).contains(&one_shot));
        assert_eq!(all(8).len(), all(9).len() + 1);
        assert!(parse_algos("one_shot", Collective::AllGather, 4).is_err());
    }

    /// A list may name auto and all beside names, in its own order, each algorithm once.
    #[test]
    fn algo_lists_mix_auto_all_and_names() {
        let parse = |s| parse_algos(s, Collective::AllReduce, 4).unwrap();
        let all = parse("all");
        let both = parse("all,auto");
        assert_eq!(both.len(), all.len() + 1);
        assert_eq!(
            (both[..all.len()].to_vec(), both[all.len()]),
            (all.clone(), None)
        );
        let rd = Some(strata::Algorithm::RecursiveDoubling);
        assert_eq!(parse("auto,rd,auto,rd"), vec![None, rd]);
        assert_eq!(parse("rd,all")[0], rd);
        assert_eq!(parse("rd,all").len(), all.len());
        let e = parse_algos("auto,nope", Collective::AllReduce, 4).unwrap_err();
        assert!(e.contains("'nope'"), "{e}");
    }

    #[test]
    fn nccl_tests_bus_factors() {
        assert_eq!(bus_factor(Collective::AllReduce, 4), 1.5);
        assert_eq!(bus_factor(Collective::AllGather, 4), 0.75);
        assert_eq!(bus_factor(Collective::Broadcast, 4), 1.0);
    }
}
