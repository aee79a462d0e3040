//! `collbench simulate`: the communication of one training step of a [TP, CP, PP, DP] job,
//! priced on a fabric file for the planned placement and for a scattered one.
//!
//! Every group of one kind runs its collective at the same time (so groups that share an
//! oversubscribed uplink slow each other down); the kinds run one after another, and the step
//! is their sum (no overlap with compute or with each other). Each kind's algorithm is the
//! cheapest of the flat ones priced.

use super::*;
use strata::algorithms::Hierarchy;
use strata::algorithms::layout::{self, GroupKind, Layout, Shape};
use strata::algorithms::scale::{GroupQuery, price_groups};
use strata::algorithms::tuner::{human_bytes, human_seconds};
use strata::algorithms::{Algorithm, Collective};
use strata::topology::Tier;
use strata::topology::fabric::{self, Fabric};

#[derive(clap::Args, Debug, Clone)]
pub(super) struct SimulateArgs {
    /// The fabric: a strata topology file with a `[fat_tree]` section.
    #[arg(long = "topo-file")]
    topo_file: std::path::PathBuf,
    /// Ranks (default: TP × CP × PP × DP, or the whole fabric when --dp is not given).
    #[arg(long)]
    np: Option<usize>,
    /// Tensor-parallel size.
    #[arg(long, default_value_t = 8)]
    tp: usize,
    /// Context-parallel size.
    #[arg(long, default_value_t = 1)]
    cp: usize,
    /// Pipeline-parallel size.
    #[arg(long, default_value_t = 1)]
    pp: usize,
    /// Data-parallel size (default: what --np leaves).
    #[arg(long)]
    dp: Option<usize>,
    /// Bytes per rank of each TP all-reduce.
    #[arg(long = "tp-bytes", default_value = "64M", value_parser = parse_size)]
    tp_bytes: usize,
    /// Bytes per rank each CP all-gather gathers (each rank's share).
    #[arg(long = "cp-bytes", default_value = "16M", value_parser = parse_size)]
    cp_bytes: usize,
    /// Bytes each pipeline stage hands to the next.
    #[arg(long = "pp-bytes", default_value = "16M", value_parser = parse_size)]
    pp_bytes: usize,
    /// Gradient bytes per rank that DP reduce-scatters and all-gathers back.
    #[arg(long = "dp-bytes", default_value = "1G", value_parser = parse_size)]
    dp_bytes: usize,
    /// Seed of the scattered placement compared with the planned one.
    #[arg(long, default_value_t = 1)]
    scatter: u64,
}

/// One kind's collective in a step.
struct Phase {
    kind: GroupKind,
    collective: Collective,
    /// Elements per rank, as the collective counts them (f32).
    count: usize,
    /// Bytes per rank, for the table.
    bytes: usize,
}

/// `collbench simulate`.
pub(super) fn simulate_main(a: &SimulateArgs) -> ExitCode {
    match simulate(a) {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("collbench simulate: {e}");
            ExitCode::FAILURE
        }
    }
}

fn simulate(a: &SimulateArgs) -> Result<String, String> {
    let started = std::time::Instant::now();
    let fab = fabric::load_file(&a.topo_file).map_err(|e| e.to_string())?;
    let shape =
        Shape::of(&fab).ok_or("simulate needs a topology file with a [fat_tree] section")?;
    let model = a.tp * a.cp * a.pp;
    let np = match (a.np, a.dp) {
        (Some(n), _) => n,
        (None, Some(dp)) => model * dp,
        (None, None) => fab.ranks(),
    };
    if model == 0 || np % model != 0 {
        return Err(format!(
            "--np {np} is not a multiple of TP × CP × PP = {model}"
        ));
    }
    let dp = a.dp.unwrap_or(np / model);
    let l = Layout::new(a.tp, a.cp, a.pp, dp)?;
    if l.world() != np {
        return Err(format!("{l} is {} ranks, not --np {np}", l.world()));
    }
    if np > fab.ranks() {
        return Err(format!("--np {np}: the fabric has {} devices", fab.ranks()));
    }
    let plan = layout::plan_placement(&l, &shape);
    let elems = |b: usize| b.div_ceil(4);
    let phases = [
        Phase {
            kind: GroupKind::Tp,
            collective: Collective::AllReduce,
            count: elems(a.tp_bytes),
            bytes: a.tp_bytes,
        },
        Phase {
            kind: GroupKind::Cp,
            collective: Collective::AllGather,
            count: elems(a.cp_bytes),
            bytes: a.cp_bytes,
        },
        Phase {
            kind: GroupKind::Pp,
            collective: Collective::Send,
            count: elems(a.pp_bytes),
            bytes: a.pp_bytes,
        },
        Phase {
            kind: GroupKind::Dp,
            collective: Collective::ReduceScatter,
            count: elems(a.dp_bytes / dp),
            bytes: a.dp_bytes,
        },
        Phase {
            kind: GroupKind::Dp,
            collective: Collective::AllGather,
            count: elems(a.dp_bytes / dp),
            bytes: a.dp_bytes,
        },
    ];
    let mut out = format!(
        "# collbench simulate: {l} on {} ({} devices)\n",
        fab.source,
        fab.ranks()
    );
    for c in &plan.cannot {
        out.push_str(&format!("# cannot: {c}\n"));
    }
    let placements = [
        ("planned placement", plan.device.clone()),
        (
            "scattered placement",
            scattered_devices(np, a.scatter)
                .into_iter()
                .map(|i| plan.device.get(i).copied().unwrap_or(i))
                .collect(),
        ),
    ];
    for (name, device) in placements {
        if device.len() != np {
            continue;
        }
        out.push_str(&format!(
            "{name}{}:\n",
            if name.starts_with("scattered") {
                format!(" (seed {})", a.scatter)
            } else {
                String::new()
            }
        ));
        out.push_str(&step_table(&fab, &l, &device, &phases)?);
    }
    out.push_str(&format!(
        "# priced in {:.1} s\n",
        started.elapsed().as_secs_f64()
    ));
    Ok(out)
}

/// The per-kind table and the step total for one placement.
fn step_table(
    fab: &Fabric,
    l: &Layout,
    device: &[usize],
    phases: &[Phase],
) -> Result<String, String> {
    let tier = |x: usize, y: usize| fab.rank_tier(x, y).unwrap_or(Tier::Aggregation);
    let h = Hierarchy::on_fabric(fab, device);
    let widest: Vec<(GroupKind, Tier)> =
        layout::placement_report(l, device, &tier, fab.tiers.nvlink.is_some())?
            .into_iter()
            .map(|p| (p.kind, p.widest))
            .collect();
    let mut out = format!(
        "  {:<4}{:>7} {:>6}  {:<12} {:<15} {:>9}  {:<10} {:>11} {:>12}\n",
        "kind",
        "groups",
        "size",
        "crosses",
        "collective",
        "bytes",
        "algorithm",
        "time",
        "busbw GB/s"
    );
    let mut total = 0.0;
    for ph in phases {
        let size = l.size(ph.kind);
        if size < 2 || ph.count == 0 {
            continue;
        }
        let groups = groups_of(l, ph.kind);
        let (algorithm, seconds) = cheapest(&h, fab, ph, &groups)?;
        total += seconds;
        let crosses = widest
            .iter()
            .find(|w| w.0 == ph.kind)
            .map_or(Tier::SameDevice, |w| w.1);
        // nccl-tests' bus bandwidth of the collective.
        let n = size as f64;
        let (moved, factor) = match ph.collective {
            Collective::AllReduce => (ph.bytes as f64, 2.0 * (n - 1.0) / n),
            Collective::Send => (ph.bytes as f64, 1.0),
            _ => (ph.count as f64 * 4.0 * n, (n - 1.0) / n),
        };
        let busbw = moved / seconds * factor / 1e9;
        let what = if ph.collective == Collective::Send {
            "send/recv".to_string()
        } else {
            ph.collective.to_string()
        };
        out.push_str(&format!(
            "  {:<4}{:>7} {:>6}  {:<12} {:<15} {:>9}  {:<10} {:>11} {:>12.1}\n",
            ph.kind.to_string(),
            groups.len(),
            size,
            strata::algorithms::hierarchy::tier_name(crosses),
            what,
            human_bytes(ph.bytes),
            algorithm.name(),
            human_seconds(seconds),
            busbw
        ));
    }
    out.push_str(&format!(
        "  step communication (kinds one after another): {}\n",
        human_seconds(total)
    ));
    Ok(out)
}

/// Every group of `kind`, members in group order.
fn groups_of(l: &Layout, kind: GroupKind) -> Vec<Vec<usize>> {
    (0..l.world())
        .filter(|&r| l.color_and_key(kind, r).1 == 0)
        .map(|r| l.group(kind, r))
        .collect()
}

/// The cheapest flat algorithm for a phase, every group running it at once.
fn cheapest(
    h: &Hierarchy,
    fab: &Fabric,
    ph: &Phase,
    groups: &[Vec<usize>],
) -> Result<(Algorithm, f64), String> {
    use Algorithm as A;
    let size = groups.first().map_or(0, Vec::len);
    let candidates: &[Algorithm] = match ph.collective {
        Collective::AllReduce if size <= 1024 => {
            &[A::Ring, A::Rabenseifner, A::RecursiveDoubling, A::Tree]
        }
        Collective::AllReduce => &[A::Ring, A::Rabenseifner, A::RecursiveDoubling],
        Collective::AllGather => &[A::Ring, A::RecursiveDoubling, A::Bruck],
        Collective::ReduceScatter => &[A::Ring, A::RecursiveHalving],
        _ => &[A::Direct],
    };
    let mut best: Option<(Algorithm, f64)> = None;
    let mut why = Vec::new();
    for &algorithm in candidates {
        let q = GroupQuery {
            hierarchy: h,
            costs: fab.tiers,
            collective: ph.collective,
            algorithm,
            count: ph.count,
            elem_bytes: 4,
            chunk_elems: (512 << 10) / 4,
        };
        match price_groups(&q, groups) {
            Ok(t) if best.is_none_or(|b| t < b.1) => best = Some((algorithm, t)),
            Ok(_) => {}
            Err(e) => why.push(format!("{algorithm}: {e}")),
        }
    }
    best.ok_or_else(|| format!("{}: nothing could be priced ({})", ph.kind, why.join("; ")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        simulate: SimulateArgs,
    }

    fn run(args: &[&str]) -> String {
        let topo = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/examples/topology/meta-24k-h100.toml"
        );
        let mut argv = vec!["simulate", "--topo-file", topo];
        argv.extend_from_slice(args);
        simulate(&Cli::parse_from(argv).simulate).unwrap()
    }

    /// (time in seconds, busbw) of the first row of `kind` and `collective` after `section`.
    fn row(text: &str, section: &str, kind: &str, collective: &str) -> (f64, f64) {
        let line = text
            .split(section)
            .nth(1)
            .and_then(|t| {
                t.lines()
                    .find(|l| l.trim_start().starts_with(kind) && l.contains(collective))
            })
            .unwrap_or_else(|| panic!("no {kind} {collective} row in {section}:\n{text}"));
        let cols: Vec<&str> = line.split_whitespace().collect();
        let busbw: f64 = cols[cols.len() - 1].parse().unwrap();
        (seconds(cols[cols.len() - 3], cols[cols.len() - 2]), busbw)
    }

    /// `7.61` `ms` as seconds.
    fn seconds(value: &str, unit: &str) -> f64 {
        let scale = match unit {
            "s" => 1.0,
            "ms" => 1e-3,
            "µs" => 1e-6,
            _ => 1e-9,
        };
        value.parse::<f64>().unwrap() * scale
    }

    /// REFERENCE.md's anchors: NCCL's all-reduce on 8×H100 over NVLink reaches 365–370 GB/s of
    /// bus bandwidth, and one 400 Gb/s NDR NIC per GPU 46–48 GB/s. Two hosts of 8 GPUs with
    /// 1 GiB messages land within 5% of them.
    #[test]
    fn anchors_nvlink_and_ndr_figures() {
        let text = run(&["--np", "16", "--tp-bytes", "1G", "--dp-bytes", "1G"]);
        let (_, nvlink) = row(&text, "planned placement:", "TP", "all_reduce");
        assert!((0.95 * 365.0..1.05 * 370.0).contains(&nvlink), "{text}");
        let (_, ndr) = row(&text, "planned placement:", "DP", "reduce_scatter");
        assert!((0.95 * 46.0..1.05 * 48.0).contains(&ndr), "{text}");
    }

    /// On two pods, the planned placement keeps TP inside a host and DP's traffic mostly
    /// inside a pod; the scattered one spreads them across the 1:7 aggregation layer and the
    /// step gets slower.
    #[test]
    fn planned_placement_beats_a_scattered_one() {
        let text = run(&["--np", "6144", "--tp", "8", "--pp", "4", "--tp-bytes", "1M"]);
        let planned = text.split("scattered").next().unwrap();
        assert!(planned.contains("nvlink       all_reduce"), "{text}");
        let step = |section: &str| {
            let line = text
                .split(section)
                .nth(1)
                .and_then(|t| t.lines().find(|l| l.contains("step communication")))
                .unwrap();
            let cols: Vec<&str> = line.split_whitespace().collect();
            seconds(cols[cols.len() - 2], cols[cols.len() - 1])
        };
        let (tp_planned, _) = row(&text, "planned placement:", "TP", "all_reduce");
        let (tp_scattered, _) = row(&text, "scattered placement", "TP", "all_reduce");
        assert!(tp_scattered > 5.0 * tp_planned, "{text}");
        assert!(
            step("scattered placement") > 2.0 * step("planned placement:"),
            "{text}"
        );
    }
}
