//! `collbench calibrate`: times every algorithm of all-reduce, all-gather and reduce-scatter
//! from 8 B up on this job's ranks (interleaved rounds, medians, the slowest rank counting),
//! fits the cost model's figures for every tier the job spans to those times ([`super::fit`]),
//! prints each point's measured time beside what the model predicted before and after, and
//! writes the figures as a cost profile (`STRATA_COST_PROFILE`).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use strata::algorithms::tuner::human_bytes;
use strata::topology::profile::{CostProfile, Measured, SharedCore, TierPatch, load_profile};
use strata::topology::{SlotFill, Tier, TierCosts};
use strata::{CallSpec, Collective, Communicator, DataType, ReduceOp};

use super::fit::{self, Figure, Point};
use super::{LaunchArgs, parse_algos, parse_size, shape};

/// Options of `collbench calibrate`.
#[derive(clap::Args, Debug, Clone)]
pub(super) struct CalibrateArgs {
    #[command(flatten)]
    pub(super) launch: LaunchArgs,
    /// The cost profile written. An existing one is updated: figures measured with more ranks
    /// than cores on a host go to its `shared_core` part, the others to its `tiers`.
    #[arg(long, default_value = "strata-profile.toml")]
    profile: PathBuf,
    /// Collectives timed, comma-separated.
    #[arg(long = "ops", default_value = "all_reduce,all_gather,reduce_scatter")]
    ops: String,
    /// Smallest size in bytes (as collbench's -b).
    #[arg(short = 'b', long = "minbytes", default_value = "8", value_parser = parse_size)]
    min_bytes: usize,
    /// Largest size in bytes (as collbench's -e); always timed.
    #[arg(short = 'e', long = "maxbytes", default_value = "64M", value_parser = parse_size)]
    max_bytes: usize,
    /// Multiply the size by this factor between points.
    #[arg(short = 'f', long = "stepfactor", default_value_t = 8)]
    step_factor: usize,
    /// Rounds over every point, interleaved; each point's median counts.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Timed calls per point and round (as collbench's -n, and its default): the profile
    /// then predicts the figure collbench prints. With ranks sharing cores a point's time
    /// falls over its first hundred or so calls; 200 calls of a small point (the count
    /// before) timed 25-40% below collbench's 20, and 4 calls of a 4 MiB one above it. At 4
    /// ranks on 2 cores, 8 B to 64 MiB takes about 3 minutes this way (30 s before).
    #[arg(short = 'n', long = "iters", default_value_t = 20)]
    iters: usize,
    /// Untimed calls before each point's timed ones (as collbench's -w, and its default):
    /// at least this many, and as many as lap the slot rings (0: none).
    #[arg(short = 'w', long = "warmup_iters", default_value_t = 5)]
    warmup: usize,
    /// Print the comparison but write no profile.
    #[arg(long = "no-write")]
    no_write: bool,
    /// Also write every point as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Fit the measured times of an earlier `--json` file instead of timing anything (the
    /// same ranks, layout and sizes): how a change to the model is judged on the same points,
    /// whatever the host's state is now.
    #[arg(long)]
    refit: Option<PathBuf>,
}

/// One timed point as the JSON file holds it.
#[derive(Serialize, Deserialize)]
struct JsonPoint {
    collective: String,
    algorithm: String,
    size_bytes: usize,
    bytes_per_rank: usize,
    measured_us: f64,
    before_us: Option<f64>,
    after_us: Option<f64>,
}

/// What to time: a collective, an algorithm, a collbench size.
struct Plan {
    collective: Collective,
    algorithm: strata::Algorithm,
    size: usize,
    count: usize,
    in_bytes: usize,
    out_bytes: usize,
}

/// The sizes calibrate times: collbench's with the same `-b`, `-e` and `-f` (down to one
/// element), and the largest. Below one element per rank, as collbench's 8 B rows of 3 and
/// 4 ranks are, a call moves headers only (all-gather, reduce-scatter) or leaves ranks idle
/// (all-reduce), and those rows are priced too: until 2026-12-06 calibrate started at one
/// element per rank (12 B at 3 ranks, 16 B at 4) and the fit never saw them.
fn timed_sizes(a: &CalibrateArgs, es: usize) -> Vec<usize> {
    sizes(a.min_bytes.max(es), a.max_bytes, a.step_factor)
}

/// The collbench sizes: `min`, `min·f`, ... below `max`, then `max`.
fn sizes(min: usize, max: usize, factor: usize) -> Vec<usize> {
    let mut out = Vec::new();
    let mut s = min.max(1);
    while s < max {
        out.push(s);
        s = s.saturating_mul(factor.max(2));
    }
    out.push(max.max(min.max(1)));
    out
}

pub(super) fn calibrate_main(a: &CalibrateArgs, comm: &Communicator) -> ExitCode {
    match run(a, comm) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("collbench calibrate: rank {}: {e}", comm.rank());
            ExitCode::FAILURE
        }
    }
}

fn run(a: &CalibrateArgs, comm: &Communicator) -> Result<(), String> {
    let (n, rank) = (comm.size(), comm.rank());
    if n < 2 {
        return Err("calibration needs two ranks or more (--np 2, or a launcher)".into());
    }
    // An existing profile must be readable before anything is timed: it is updated, never
    // silently replaced.
    let existing = if rank == 0 && !a.no_write && a.profile.exists() {
        Some(load_profile(&a.profile).map_err(|e| format!("cannot update it: {e}"))?)
    } else {
        None
    };
    let es = DataType::Float32.size();
    let mut plans = Vec::new();
    for op in a.ops.split(',') {
        let c = Collective::parse(op.trim()).ok_or_else(|| format!("unknown collective '{op}'"))?;
        if !matches!(
            c,
            Collective::AllReduce | Collective::AllGather | Collective::ReduceScatter
        ) {
            return Err(format!(
                "calibrate times all_reduce, all_gather and reduce_scatter, not {c}"
            ));
        }
        for algorithm in parse_algos("all", c, n)?.into_iter().flatten() {
            for size in timed_sizes(a, es) {
                let (count, in_bytes, out_bytes) = shape(c, size, es, n, rank, 0);
                plans.push(Plan {
                    collective: c,
                    algorithm,
                    size,
                    count,
                    in_bytes,
                    out_bytes,
                });
            }
        }
    }
    let rounds = a.rounds.max(1);
    if rank == 0 {
        println!(
            "# collbench calibrate: {n} ranks, {} points, {rounds} interleaved rounds",
            plans.len()
        );
    }
    let started = Instant::now();
    let times = match &a.refit {
        Some(path) => refit_times(comm, path, &plans)?,
        None => time_plans(comm, &plans, rounds, (a.warmup, a.iters.max(1)))?,
    };
    for c in Collective::ALL {
        comm.set_algorithm(c, None).map_err(|e| e.to_string())?;
    }
    // Every rank stays until rank 0 has fitted and written, so that no rank's exit reads to
    // the others as a failure.
    let outcome = if rank == 0 {
        fit_and_write(a, comm, &plans, &times, existing, started)
    } else {
        Ok(())
    };
    comm.barrier().map_err(|e| e.to_string())?;
    outcome
}

/// Rank 0's part: the fit, the comparison, the profile.
fn fit_and_write(
    a: &CalibrateArgs,
    comm: &Communicator,
    plans: &[Plan],
    times: &[f64],
    existing: Option<CostProfile>,
    started: Instant,
) -> Result<(), String> {
    let (n, es) = (comm.size(), DataType::Float32.size());
    let points: Vec<Point> = plans
        .iter()
        .zip(times)
        .map(|(p, &seconds)| Point {
            collective: p.collective,
            algorithm: p.algorithm,
            bytes: p.count * es,
            seconds,
        })
        .collect();
    let measured_s = started.elapsed().as_secs_f64();
    let model = comm.cost_model();
    let before_costs = model.costs();
    let tiers = spanned_tiers(comm);
    let mut figures = fit::figures_for(&tiers);
    if model.shares_cores() {
        figures.push(Figure::CoreWait);
    }
    let fit_started = Instant::now();
    // The first slot a message fills is this job's shared-memory slot.
    let start = TierCosts {
        slot_fill: Some(SlotFill {
            slot_kib: comm.config().shm_slot_size as f64 / 1024.0,
            gbps: before_costs.slot_fill.map_or(100.0, |f| f.gbps),
        }),
        ..before_costs
    };
    let after_costs = fit::fit(model, start, &figures, &points);
    let fit_s = fit_started.elapsed().as_secs_f64();
    let before = fit::predict(model, before_costs, &points);
    let after = fit::predict(model, after_costs, &points);
    print_table(plans, &points, &before, &after);
    let (b_in, b_med) = accuracy(&points, &before);
    let (a_in, a_med) = accuracy(&points, &after);
    let rpc = comm.ranks_per_core();
    println!(
        "# within ±25% of the measured time: {:.0}% of points before, {:.0}% after; median \
         |predicted/measured - 1|: {:.0}% before, {:.0}% after",
        100.0 * b_in,
        100.0 * a_in,
        100.0 * b_med,
        100.0 * a_med
    );
    print_figures(&tiers, &after_costs);
    println!(
        "# timed in {measured_s:.1} s, fitted in {fit_s:.1} s; {rpc:.2} ranks per core on the \
         fullest host"
    );
    if let Some(path) = &a.json {
        let rows: Vec<JsonPoint> = plans
            .iter()
            .zip(&points)
            .zip(before.iter().zip(&after))
            .map(|((p, pt), (b, f))| JsonPoint {
                collective: p.collective.to_string(),
                algorithm: p.algorithm.name(),
                size_bytes: p.size,
                bytes_per_rank: pt.bytes,
                measured_us: pt.seconds * 1e6,
                before_us: b.map(|s| s * 1e6),
                after_us: f.map(|s| s * 1e6),
            })
            .collect();
        let text = serde_json::to_string_pretty(&rows).map_err(|e| e.to_string())?;
        std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    if a.no_write {
        return Ok(());
    }
    let cores = comm
        .peers()
        .iter()
        .map(|p| p.probe.cores as usize)
        .max()
        .unwrap_or(0);
    let measured = Measured {
        ranks: n,
        hosts: comm.tiers().hosts(),
        cores,
        points: points.len(),
        within_25_percent: a_in,
        median_error: a_med,
    };
    let patch = patch_of(&tiers, &after_costs);
    let mut profile = existing.unwrap_or_default();
    let part = if rpc > 1.0 {
        profile.shared_core = Some(SharedCore {
            ranks_per_core: rpc,
            tiers: patch,
            measured,
        });
        "shared_core"
    } else {
        profile.tiers = patch;
        profile.measured = Some(measured);
        "tiers"
    };
    write_profile(&a.profile, &profile)?;
    println!(
        "# wrote its {part} part to {} (STRATA_COST_PROFILE={} prices with it)",
        a.profile.display(),
        a.profile.display()
    );
    Ok(())
}

/// Every plan's median seconds over `rounds` interleaved rounds, the slowest rank's time
/// counting in each round; each point of a round makes `warmup` untimed calls, then `iters`
/// timed ones.
fn time_plans(
    comm: &Communicator,
    plans: &[Plan],
    rounds: usize,
    (warmup, iters): (usize, usize),
) -> Result<Vec<f64>, String> {
    let err = |e: strata::Error| e.to_string();
    let in_max = plans.iter().map(|p| p.in_bytes).max().unwrap_or(0);
    let out_max = plans.iter().map(|p| p.out_bytes).max().unwrap_or(0);
    let mut send = vec![1u8; in_max];
    let mut recv = vec![1u8; out_max];
    let mut local = vec![0f64; plans.len() * rounds];
    for round in 0..rounds {
        for (i, p) in plans.iter().enumerate() {
            comm.set_algorithm(p.collective, Some(p.algorithm))
                .map_err(err)?;
            let spec = CallSpec {
                collective: p.collective,
                dtype: DataType::Float32,
                count: p.count,
                op: ReduceOp::Sum,
                root: 0,
            };
            let mut once =
                || comm.call_bytes(spec, Some(&send[..p.in_bytes]), &mut recv[..p.out_bytes]);
            // As collbench warms a row up: past the first lap of every slot ring.
            let laps = comm.config().calls_to_lap_rings(comm.size(), p.size);
            for _ in 0..if warmup == 0 { 0 } else { warmup.max(laps) } {
                once().map_err(err)?;
            }
            comm.barrier().map_err(err)?;
            let t0 = Instant::now();
            for _ in 0..iters {
                once().map_err(err)?;
            }
            local[i * rounds + round] = t0.elapsed().as_secs_f64() / iters as f64;
        }
    }
    send.clear();
    let mut slowest = vec![0f64; local.len()];
    comm.all_reduce(&local, &mut slowest, ReduceOp::Max)
        .map_err(err)?;
    Ok(slowest
        .chunks(rounds)
        .map(|r| {
            let mut r = r.to_vec();
            r.sort_by(f64::total_cmp);
            let m = r.len();
            if m % 2 == 1 {
                r[m / 2]
            } else {
                (r[m / 2 - 1] + r[m / 2]) / 2.0
            }
        })
        .collect())
}

/// For `--refit`: rank 0 reads every plan's measured seconds from `path` (the other ranks
/// get none), and every rank learns whether it could, so that no rank waits on one that gave
/// up: each fails with its own error.
fn refit_times(
    comm: &Communicator,
    path: &std::path::Path,
    plans: &[Plan],
) -> Result<Vec<f64>, String> {
    let read = (comm.rank() == 0).then(|| read_times(path, plans));
    let failed = [f64::from(u8::from(matches!(read, Some(Err(_)))))];
    let mut any = [0.0];
    comm.all_reduce(&failed, &mut any, ReduceOp::Max)
        .map_err(|e| e.to_string())?;
    match read {
        Some(r) => r,
        None if any[0] > 0.0 => Err(format!(
            "rank 0 could not refit {} (its error says why)",
            path.display()
        )),
        None => Ok(Vec::new()),
    }
}

/// Every plan's measured seconds from an earlier `--json` file; an error names the first
/// plan it lacks.
fn read_times(path: &std::path::Path, plans: &[Plan]) -> Result<Vec<f64>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let rows: Vec<JsonPoint> =
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    plans
        .iter()
        .map(|p| {
            let (c, alg) = (p.collective.to_string(), p.algorithm.name());
            rows.iter()
                .find(|r| r.collective == c && r.algorithm == alg && r.size_bytes == p.size)
                .filter(|r| r.measured_us.is_finite() && r.measured_us > 0.0)
                .map(|r| r.measured_us * 1e-6)
                .ok_or_else(|| {
                    format!(
                        "{} has no measured time of {c} {alg} at {} B: refit it with the ranks, \
                         sizes and collectives it was timed with",
                        path.display(),
                        p.size
                    )
                })
        })
        .collect()
}

/// The tiers between rank 0 and the others, narrowest first.
fn spanned_tiers(comm: &Communicator) -> Vec<Tier> {
    let mut out: Vec<Tier> = Vec::new();
    for (t, _) in comm.tiers().census(0) {
        let t = if t == Tier::SameDevice { Tier::Host } else { t };
        if !out.contains(&t) {
            out.push(t);
        }
    }
    out
}

/// The fitted figures of `tiers`, γ and the call's, as a profile part.
fn patch_of(tiers: &[Tier], c: &TierCosts) -> TierPatch {
    let mut p = TierPatch {
        reduce_gbps: Some(c.reduce_gbps),
        call_us: Some(c.call_us),
        schedule_us: Some(c.schedule_us),
        copy_gbps: c.copy_gbps,
        memory: c.memory,
        slot_fill: c.slot_fill,
        core_wait_us: (c.core_wait_us > 0.0).then_some(c.core_wait_us),
        ..TierPatch::default()
    };
    for &t in tiers {
        let l = Some(c.link(t));
        match t {
            Tier::SameDevice | Tier::Host => p.host = l,
            Tier::NvLink => p.nvlink = l,
            Tier::Leaf => p.leaf = l,
            Tier::Pod => p.pod = l,
            Tier::Aggregation => p.aggregation = l,
        }
    }
    p
}

/// Writes the profile through a file beside it, so a reader never sees half of one.
fn write_profile(path: &std::path::Path, profile: &CostProfile) -> Result<(), String> {
    let comment = "strata cost profile, written by collbench calibrate; \
                   STRATA_COST_PROFILE=<this file> prices with it\n\
                   latency_us: α, bandwidth_gbps: 1/β, cpu_us: each end's CPU time per \
                   message, paid one after another on a core, reduce_gbps: 1/γ, \
                   call_us: every call, \
                   schedule_us: every call but a small all-reduce's\n\
                   memory: the share of a call's buffers on a host beyond cache_mib costs \
                   1/miss_gbps more per byte\n\
                   slot_fill: a message's first slot_kib KiB inside a host cost 1/gbps more per byte\n\
                   core_wait_us: what a message waits for its turn on a core whose other rank \
                   has messages in flight";
    let tmp = path.with_extension("toml.partial");
    std::fs::write(&tmp, profile.to_toml(comment))
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// The fraction of points predicted within ±25%, and the median relative error.
fn accuracy(points: &[Point], predicted: &[Option<f64>]) -> (f64, f64) {
    let mut errs: Vec<f64> = points
        .iter()
        .zip(predicted)
        .filter_map(|(p, t)| Some((t.as_ref()? / p.seconds - 1.0).abs()))
        .collect();
    if errs.is_empty() {
        return (0.0, f64::NAN);
    }
    errs.sort_by(f64::total_cmp);
    let within = errs.iter().filter(|e| **e <= 0.25).count() as f64 / errs.len() as f64;
    (within, errs[errs.len() / 2])
}

fn print_table(plans: &[Plan], points: &[Point], before: &[Option<f64>], after: &[Option<f64>]) {
    println!(
        "# {:<15} {:<15} {:>9} {:>11} {:>11} {:>6} {:>11} {:>6}",
        "collective", "algorithm", "size", "measured", "before", "ratio", "after", "ratio"
    );
    println!(
        "# {:<15} {:<15} {:>9} {:>11} {:>11} {:>6} {:>11} {:>6}",
        "", "", "", "(us)", "(us)", "", "(us)", ""
    );
    for ((p, pt), (b, f)) in plans.iter().zip(points).zip(before.iter().zip(after)) {
        let cell = |t: &Option<f64>| {
            t.map_or(format!("{:>11} {:>6}", "-", "-"), |s| {
                format!("{:>11.2} {:>6.2}", s * 1e6, s / pt.seconds)
            })
        };
        println!(
            "  {:<15} {:<15} {:>9} {:>11.2} {} {}",
            p.collective.to_string(),
            p.algorithm.name(),
            human_bytes(p.size),
            pt.seconds * 1e6,
            cell(b),
            cell(f)
        );
    }
}

/// The profile's name of the figures `tier` prices with.
fn tier_key(tier: Tier) -> &'static str {
    match tier {
        Tier::SameDevice | Tier::Host => "host",
        Tier::NvLink => "nvlink",
        Tier::Leaf => "leaf",
        Tier::Pod => "pod",
        Tier::Aggregation => "aggregation",
    }
}

fn print_figures(tiers: &[Tier], c: &TierCosts) {
    for &t in tiers {
        let l = c.link(t);
        println!(
            "# tiers.{}: α {:.3e} s per message, β {:.3e} s per byte ({:.2} GB/s), CPU {:.3e} s \
             per message at each end",
            tier_key(t),
            l.latency_us * 1e-6,
            1.0 / (l.bandwidth_gbps * 1e9),
            l.bandwidth_gbps,
            l.cpu_us * 1e-6
        );
    }
    let copy = c.copy_gbps.unwrap_or(f64::INFINITY);
    println!(
        "# reduction: γ {:.3e} s per byte ({:.2} GB/s); local copies {:.3e} s per byte \
         ({copy:.2} GB/s); each call {:.3e} s, and {:.3e} s more walked step by step (all but \
         a small all-reduce)",
        1.0 / (c.reduce_gbps * 1e9),
        c.reduce_gbps,
        1.0 / (copy * 1e9),
        c.call_us * 1e-6,
        c.schedule_us * 1e-6
    );
    if let Some(f) = c.slot_fill {
        println!(
            "# slot fill: a message's first {:.0} KiB inside a host cost {:.3e} s more per byte \
             ({:.2} GB/s)",
            f.slot_kib,
            1.0 / (f.gbps * 1e9),
            f.gbps
        );
    }
    if c.core_wait_us > 0.0 {
        println!(
            "# core wait: a message whose core's other rank has messages in flight waits \
             {:.3e} s for its turn",
            c.core_wait_us * 1e-6
        );
    }
    match c.memory {
        Some(m) => println!(
            "# memory: buffers beyond {:.1} MiB on a host cost {:.3e} s more per byte past it \
             ({:.2} GB/s)",
            m.cache_mib,
            1.0 / (m.miss_gbps * 1e9),
            m.miss_gbps
        ),
        None => println!("# memory: every size at the same rates (no cache edge fitted better)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_end_at_the_largest() {
        assert_eq!(sizes(8, 4096, 8), vec![8, 64, 512, 4096]);
        assert_eq!(sizes(8, 5000, 8), vec![8, 64, 512, 4096, 5000]);
        assert_eq!(sizes(64, 64, 8), vec![64]);
    }

    /// calibrate times the sizes collbench prints with the same options, whatever the rank
    /// count: 8 B first (collbench's smallest row), then 64 B, ..., and always the largest.
    #[test]
    fn calibrate_times_collbenchs_sizes() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            calibrate: CalibrateArgs,
        }
        let a = Cli::parse_from(["calibrate", "--np", "3"]).calibrate;
        let got = timed_sizes(&a, 4);
        let collbench: Vec<usize> = (0..8).map(|k| 8usize << (3 * k)).collect();
        assert_eq!(got[..8], collbench[..], "{got:?}");
        assert_eq!(got.last(), Some(&(64 << 20)));
        let a = Cli::parse_from(["calibrate", "-b", "1"]).calibrate;
        assert_eq!(timed_sizes(&a, 4)[0], 4, "one element at least");
    }
}
