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
pub(super) fn explain_main(a: &ExplainArgs) -> ExitCode {
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
