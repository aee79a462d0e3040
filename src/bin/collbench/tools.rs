//! The subcommands that print without running a job: layout, explain and topo.

use super::*;

#[derive(clap::Args, Debug, Clone)]
pub(super) struct ExplainArgs {
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
    /// Price every size class from --min-size up to --size for every collective in --ops
    /// and write the choices as a tuning file (STRATA_TUNING_FILE), so that no rank prices
    /// anything at run time.
    #[arg(long = "write-tuning")]
    write_tuning: Option<std::path::PathBuf>,
    /// With --write-tuning: the collectives, comma separated.
    #[arg(long, default_value = "all_reduce,all_gather,reduce_scatter,broadcast")]
    ops: String,
    /// With --write-tuning: the smallest size priced (bytes per rank).
    #[arg(long = "min-size", default_value = "8", value_parser = parse_size)]
    min_size: usize,
}

#[derive(clap::Args, Debug, Clone)]
pub(super) struct LayoutArgs {
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
pub(super) fn layout_main(a: &LayoutArgs) -> ExitCode {
    use strata::algorithms::layout::{self, Layout, Shape};
    use strata::topology::{Tier, fabric};
    let run = || -> Result<(), String> {
        let fab = fabric::load_file(&a.topo_file).map_err(|e| e.to_string())?;
        let shape =
            Shape::of(&fab).ok_or("the planner needs a topology file with a [fat_tree] section")?;
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
            let device = scattered_devices(l.world().min(shape.total), seed);
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

/// Devices `0..n` shuffled by `seed` (Fisher-Yates with a splitmix64 stream: the same seed
/// gives the same order): a launcher that scatters a job over the fabric.
pub(super) fn scattered_devices(n: usize, seed: u64) -> Vec<usize> {
    let mut device: Vec<usize> = (0..n).collect();
    let mut x = seed;
    for i in (1..device.len()).rev() {
        x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        device.swap(i, (z % (i as u64 + 1)) as usize);
    }
    device
}

/// `collbench explain`.
pub(super) fn explain_main(a: &ExplainArgs) -> ExitCode {
    use strata::algorithms::tuner::human_bytes;
    let run = || -> Result<String, String> {
        let (tuner, source) = explain_tuner(a, &ExplainHost::here()?)?;
        if let Some(path) = &a.write_tuning {
            return write_tuning(a, &tuner, path);
        }
        let collective =
            Collective::parse(&a.op).ok_or_else(|| format!("unknown collective '{}'", a.op))?;
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

/// What `collbench explain` knows of the host it runs on, as init would: the cores a job of
/// `--np` ranks spreads over, and the cost profile `STRATA_COST_PROFILE` names.
struct ExplainHost {
    /// The cores this process may run on (`--np` binds rank r to the (r mod n)th of them).
    cores: usize,
    /// The profile and its file's name, where one is named.
    profile: Option<(strata::topology::profile::CostProfile, String)>,
}

impl ExplainHost {
    /// This host's cores, and the profile `STRATA_COST_PROFILE` names (an error where it does
    /// not load, as init fails).
    fn here() -> Result<Self, String> {
        let profile = strata::config::cost_profile_from_env()
            .map_err(|e| e.to_string())?
            .map(|(p, path)| (p, path.display().to_string()));
        Ok(Self {
            cores: super::launch::allowed_cores().len(),
            profile,
        })
    }
}

/// Per rank of `np` bound as `--np` binds them (rank r on core r mod `cores`), the core it
/// shares with another rank; all `None` where none shares one.
fn shared_cores_of_np(np: usize, cores: usize) -> Vec<Option<u32>> {
    if cores == 0 || np <= cores {
        return vec![None; np];
    }
    // Core c holds the ranks c, c + cores, ...: more than one wherever np > cores + c.
    (0..np)
        .map(|r| {
            let c = super::launch::core_of_rank(r, cores);
            (np > cores + c).then_some(c as u32)
        })
        .collect()
}

/// The tuner of the communicator `collbench explain` describes, and where its fabric came
/// from. On one host its ranks share cores as `--np` would bind them on `host`; the
/// profile, where there is one, prices as init prices with it.
fn explain_tuner(
    a: &ExplainArgs,
    host: &ExplainHost,
) -> Result<(strata::algorithms::tuner::Tuner, String), String> {
    use strata::algorithms::Hierarchy;
    use strata::algorithms::tuner::Tuner;
    use strata::topology::{TierCosts, fabric};
    let path = a
        .topo_file
        .clone()
        .or_else(|| std::env::var_os("STRATA_TOPO_FILE").map(Into::into));
    // Ranks per core and the cores ranks share: a fabric's ranks have a device each.
    let mut ranks_per_core = 1.0;
    let mut shared = Vec::new();
    let (hierarchy, costs, mut source, local) = match path {
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
            let h = Hierarchy::on_fabric(&fab, &devices);
            (h, fab.tiers, path.display().to_string(), per_host.min(np))
        }
        None => {
            let np = a.np.unwrap_or(8);
            if host.cores > 0 {
                ranks_per_core = np as f64 / host.cores as f64;
            }
            shared = shared_cores_of_np(np, host.cores);
            (
                Hierarchy::single_host(np),
                TierCosts::default(),
                "one host".into(),
                np,
            )
        }
    };
    // The runtime's ring slicing, which the choice takes into account as a run would.
    let pipeline = match std::env::var("STRATA_RING_PIPELINE") {
        Ok(v) => v
            .trim()
            .parse()
            .map_err(|_| format!("STRATA_RING_PIPELINE={v} is not a number of bytes"))?,
        Err(_) => strata::config::RING_PIPELINE_BYTES,
    };
    let costs = match &host.profile {
        Some((profile, file)) => {
            source.push_str(&format!(", priced with the profile {file}"));
            profile.apply(costs, ranks_per_core)
        }
        None => costs,
    };
    if shared.iter().any(Option::is_some) {
        source.push_str(&format!(
            ", {ranks_per_core:.2} ranks per core (rank r on core r mod {})",
            host.cores
        ));
    }
    let tuner = Tuner::new(hierarchy, costs, !a.launcher_order)
        .with_ring_pipeline(pipeline, local)
        .with_shared_cores(shared);
    Ok((tuner, source))
}

/// `collbench explain --write-tuning`: the choice of every size class of every collective,
/// runs of equal choices merged into one rule, written as a tuning file.
fn write_tuning(
    a: &ExplainArgs,
    tuner: &strata::algorithms::tuner::Tuner,
    path: &std::path::Path,
) -> Result<String, String> {
    use strata::algorithms::tuner::{class_bytes, human_bytes, size_class};
    let started = std::time::Instant::now();
    let (first, last) = (size_class(a.min_size), size_class(a.size.max(a.min_size)));
    let mut rules = Vec::new();
    let mut report = String::new();
    for op in a.ops.split(',').map(str::trim).filter(|o| !o.is_empty()) {
        let collective =
            Collective::parse(op).ok_or_else(|| format!("unknown collective '{op}'"))?;
        // (first class, algorithm) of the current run of equal choices.
        let mut run: Option<(u32, String)> = None;
        for class in first..=last {
            let chosen = tuner.explain(collective, class_bytes(class)).chosen.name();
            report.push_str(&format!(
                "{collective} {:>9}: {chosen}\n",
                human_bytes(class_bytes(class))
            ));
            match &run {
                Some((_, alg)) if *alg == chosen => {}
                _ => {
                    if let Some((from, alg)) = run.take() {
                        rules.push(tuning_rule(collective, from, class - 1, first, false, &alg));
                    }
                    run = Some((class, chosen));
                }
            }
        }
        if let Some((from, alg)) = run {
            // The last run stays open-ended: beyond the largest size priced, the choice for
            // bandwidth-bound messages holds.
            rules.push(tuning_rule(collective, from, last, first, true, &alg));
        }
    }
    let text = serde_json::to_string_pretty(&serde_json::json!({ "rules": rules }))
        .map_err(|e| e.to_string())?;
    std::fs::write(path, text + "\n").map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(format!(
        "# collbench explain --write-tuning: {} ranks, {} rules written to {} in {:.1} s\n{report}",
        tuner.hierarchy().len(),
        rules.len(),
        path.display(),
        started.elapsed().as_secs_f64()
    ))
}

/// One tuning-file rule for the size classes `from..=to` (a class c holds the sizes in
/// (2^(c−1), 2^c]); the first class starts at 0, and an `open` last one has no upper end.
fn tuning_rule(
    collective: Collective,
    from: u32,
    to: u32,
    first: u32,
    open: bool,
    algorithm: &str,
) -> serde_json::Value {
    use strata::algorithms::tuner::class_bytes;
    let mut rule = serde_json::json!({ "collective": collective.name(), "algorithm": algorithm });
    if from > first {
        rule["min_bytes"] = (class_bytes(from - 1) + 1).into();
    }
    if !open {
        rule["max_bytes"] = class_bytes(to).into();
    }
    rule
}

/// The devices of `np` ranks dealt round-robin over the leaves of `fab` (rank r goes to leaf
/// r mod leaves), each leaf filling its devices in order.
pub(super) fn cyclic_devices(
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
            if out.len() < np
                && let Some(d) = q.pop_front()
            {
                out.push(d);
            }
        }
    }
    out
}

#[derive(clap::Args, Debug, Clone)]
pub(super) struct TopoArgs {
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
pub(super) fn load_hwloc_xml(
    p: &std::path::Path,
) -> Result<strata::topology::HostTopology, String> {
    strata::topology::hwloc::load_xml(p).map_err(|e| e.to_string())
}

#[cfg(not(feature = "hwloc"))]
pub(super) fn load_hwloc_xml(
    _: &std::path::Path,
) -> Result<strata::topology::HostTopology, String> {
    Err(
        "this collbench was built without hwloc; rebuild with --features hwloc \
         (needs Debian's libhwloc-dev and libudev-dev)"
            .into(),
    )
}

/// What each local rank would use between hosts under `STRATA_TRANSPORT`.
fn rdma_choices(
    inv: &strata::rdma::Inventory,
    cfg: &strata::Config,
    gpus: &[strata::topology::GpuInfo],
) -> Vec<String> {
    use strata::TransportPolicy as P;
    (0..gpus.len().max(1))
        .map(|local| {
            // Local rank i drives GPU i, as one process per GPU does.
            let near = gpus
                .get(local)
                .map(|g| g.nearest_nics.clone())
                .unwrap_or_default();
            let verbs = inv.verbs.as_ref().ok().and_then(|ports| {
                strata::rdma::verbs::choose_port(ports, &cfg.rdma, local, &near).ok()
            });
            let ofi = inv.chosen.ofi.as_ref();
            let pick = match cfg.transport {
                P::Tcp | P::Shm => None,
                P::Verbs => verbs.map(|p| format!("verbs {} port {}", p.name, p.port)),
                P::Ofi => ofi.map(|o| format!("ofi {o}")),
                P::Auto | P::Rdma => verbs
                    .map(|p| format!("verbs {} port {}", p.name, p.port))
                    .or_else(|| {
                        ofi.filter(|_| cfg.transport == P::Rdma || inv.chosen.ofi_hardware)
                            .map(|o| format!("ofi {o}"))
                    }),
            };
            format!(
                "local rank {local}: {}",
                pick.unwrap_or_else(|| "TCP (no RDMA for it)".into())
            )
        })
        .collect()
}

/// The RDMA section of `collbench topo`.
fn render_rdma(
    inv: &strata::rdma::Inventory,
    cfg: &strata::Config,
    gpus: &[strata::topology::GpuInfo],
) -> String {
    let mut out = String::from("RDMA (between hosts)\n");
    match &inv.verbs {
        Ok(ports) => {
            for p in ports {
                out += &format!(
                    "  verbs {} port {}: {}, {}{}\n",
                    p.name,
                    p.port,
                    p.link,
                    if p.active { "active" } else { "down" },
                    p.pci
                        .as_ref()
                        .map(|b| format!(", PCI {b}"))
                        .unwrap_or_default()
                );
            }
        }
        Err(e) => out += &format!("  verbs: {e}\n"),
    }
    match &inv.ofi {
        Ok(provs) => {
            for p in provs {
                out += &format!(
                    "  ofi {} on {}{}\n",
                    p.provider,
                    p.domain,
                    if p.hardware { "" } else { " (software)" }
                );
            }
        }
        Err(e) => out += &format!("  ofi: {e}\n"),
    }
    out += &format!(
        "  STRATA_TRANSPORT={}:\n",
        format!("{:?}", cfg.transport).to_lowercase()
    );
    for line in rdma_choices(inv, cfg, gpus) {
        out += &format!("    {line}\n");
    }
    out
}

/// `collbench topo`.
pub(super) fn topo_main(t: &TopoArgs) -> ExitCode {
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
        // RDMA is this machine's, whatever file describes the host.
        let cfg = strata::Config::from_env().map_err(|e| e.to_string())?;
        let rdma = strata::rdma::inventory(&cfg.rdma);
        let gpus = host.gpus();
        if t.json {
            let mut v = serde_json::to_value(&r).map_err(|e| e.to_string())?;
            v["rdma"] = serde_json::to_value(&rdma).map_err(|e| e.to_string())?;
            v["rdma_per_local_rank"] = rdma_choices(&rdma, &cfg, &gpus).into();
            serde_json::to_string_pretty(&v).map_err(|e| e.to_string())
        } else {
            Ok(format!(
                "{}\n{}",
                report::render(&r, &host),
                render_rdma(&rdma, &cfg, &gpus)
            ))
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        explain: ExplainArgs,
    }

    /// The written file parses as a tuning file, and its rules pick what the tuner picks for
    /// every size class it covers (a run of equal choices is one rule).
    #[test]
    fn write_tuning_writes_the_tuners_choices() {
        let dir = std::env::temp_dir().join(format!("collbench-tuning-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("tuning.json");
        let topo = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/examples/topology/emulated-fat-tree.toml"
        );
        let cli = Cli::parse_from([
            "explain",
            "--topo-file",
            topo,
            "--cyclic",
            "--size",
            "16M",
            "--ops",
            "all_reduce,broadcast",
            "--write-tuning",
            path.to_str().unwrap(),
        ]);
        let here = ExplainHost {
            cores: 2,
            profile: None,
        };
        let (tuner, _) = explain_tuner(&cli.explain, &here).unwrap();
        let report = write_tuning(&cli.explain, &tuner, &path).unwrap();
        assert!(report.contains("rules written"), "{report}");
        let text = std::fs::read_to_string(&path).unwrap();
        let rules = strata::tuning::parse_rules(&text).unwrap();
        let ruled = tuner.clone_with_rules(rules);
        for collective in [Collective::AllReduce, Collective::Broadcast] {
            for class in 3..=24 {
                let bytes = 1usize << class;
                for b in [bytes / 2 + 1, bytes] {
                    assert_eq!(
                        ruled.choose(collective, b),
                        tuner.explain(collective, bytes).chosen,
                        "{collective} at {b} B:\n{text}"
                    );
                }
            }
            // The last rule is open-ended.
            assert_eq!(
                ruled.choose(collective, 1 << 30),
                tuner.explain(collective, 1 << 24).chosen
            );
        }
        std::fs::remove_dir_all(&dir).ok();
    }

    /// On one host explain prices what `--np` would run: its ranks share cores as `--np`
    /// binds them, and a profile prices with its figures for that many ranks per core.
    #[test]
    fn explain_on_one_host_prices_its_shared_cores_with_the_profile() {
        use strata::topology::{TierCosts, profile::parse_profile};
        assert_eq!(shared_cores_of_np(3, 2), vec![Some(0), None, Some(0)]);
        assert_eq!(
            shared_cores_of_np(4, 2),
            vec![Some(0), Some(1), Some(0), Some(1)]
        );
        assert_eq!(shared_cores_of_np(2, 2), vec![None, None]);
        assert_eq!(shared_cores_of_np(5, 0), vec![None; 5]);
        let text = "[tiers]\ncall_us = 1.0\n[tiers.host]\nlatency_us = 0.5\nbandwidth_gbps = 10.0\n\
                    [shared_core]\nranks_per_core = 2.0\n[shared_core.tiers]\ncore_wait_us = 0.8\n\
                    [shared_core.tiers.host]\nlatency_us = 1.5\nbandwidth_gbps = 5.0\n";
        let profile = parse_profile(text, "p.toml").unwrap();
        let cli = Cli::parse_from(["explain", "--np", "3", "--size", "64"]);
        let host = |cores| ExplainHost {
            cores,
            profile: Some((profile.clone(), "p.toml".into())),
        };
        let (shared, source) = explain_tuner(&cli.explain, &host(2)).unwrap();
        assert!(shared.shares_cores());
        assert_eq!(shared.costs(), profile.apply(TierCosts::default(), 1.5));
        assert!((shared.costs().core_wait_us - 0.4).abs() < 1e-12);
        assert!(
            source.contains("p.toml") && source.contains("1.50 ranks per core"),
            "{source}"
        );
        // With a core per rank: the profile's own tiers, and no turns to wait for.
        let (free, source) = explain_tuner(&cli.explain, &host(4)).unwrap();
        assert!(!free.shares_cores());
        assert_eq!(free.costs(), profile.apply(TierCosts::default(), 0.75));
        assert_eq!(free.costs().core_wait_us, 0.0);
        assert!(!source.contains("ranks per core"), "{source}");
        // A ring's steps keep every rank busy, so on the shared core each waits its turn: it
        // costs more than the same figures priced with a core per rank.
        let ring = |t: &strata::algorithms::tuner::Tuner| {
            t.price(Collective::AllReduce, Algorithm::Ring, 64)
                .seconds
                .unwrap()
        };
        let same_costs = free.with_costs(shared.costs());
        assert!(
            ring(&shared) > ring(&same_costs) + 1e-6,
            "{} against {}",
            ring(&shared),
            ring(&same_costs)
        );
        // Without a profile the defaults price, as init's would before its probe.
        let bare = ExplainHost {
            cores: 2,
            profile: None,
        };
        let (plain, source) = explain_tuner(&cli.explain, &bare).unwrap();
        assert_eq!(plain.costs(), TierCosts::default());
        assert!(
            plain.shares_cores() && !source.contains("profile"),
            "{source}"
        );
    }
}
