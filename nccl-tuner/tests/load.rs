//! Loads `libnccl-tuner-strata.so` as NCCL does (`tests/c/load_tuner.c`, built against
//! NVIDIA's own tuner header in `tests/nccl/`) and checks the tables it writes against strata's
//! model: for the emulated fat tree (8 hosts, the spine oversubscribed 4:1) and for the same
//! tree at full bisection.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use nccl_tuner_strata::model::{self, algo, func};
use strata_algorithms::schedule::Collective;
use strata_algorithms::tuner::Tuner;
use strata_topology::fabric;

const PROTOCOLS: usize = model::PROTOCOLS;

/// `target/<profile>`, from this test binary's path.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    exe.parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps")
        .to_path_buf()
}

fn manifest(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

/// A folder holding the plugin under the name NCCL looks for, and the harness.
fn setup() -> &'static (PathBuf, PathBuf) {
    static DIR: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    DIR.get_or_init(|| {
        let built = [profile_dir().join("deps"), profile_dir()]
            .into_iter()
            .map(|d| d.join("libnccl_tuner_strata.so"))
            .find(|p| p.exists())
            .expect("cargo test builds libnccl_tuner_strata.so");
        let dir = profile_dir().join(format!("nccl-tuner-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::copy(&built, dir.join("libnccl-tuner-strata.so")).unwrap();
        let harness = dir.join("load_tuner");
        let out = Command::new("cc")
            .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-I"])
            .arg(manifest("tests/nccl"))
            .arg("-o")
            .arg(&harness)
            .arg(manifest("tests/c/load_tuner.c"))
            .arg("-ldl")
            .output()
            .expect("cc runs");
        assert!(
            out.status.success(),
            "cc failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        (dir, harness)
    })
}

/// What the harness printed.
struct Run {
    symbol: String,
    init: i32,
    logs: Vec<String>,
    constants_unchanged: bool,
    /// (func, n_bytes) → (rc, channels, table)
    calls: HashMap<(i32, usize), (i32, i32, Vec<f32>)>,
    null_rc: Option<i32>,
}

fn run(args: &[&str], env: &[(&str, &str)]) -> Run {
    let (dir, harness) = setup();
    let mut cmd = Command::new(harness);
    cmd.args(args)
        .env("LD_LIBRARY_PATH", dir)
        .env("NCCL_TUNER_PLUGIN", "strata")
        .env_remove("STRATA_TOPO_FILE")
        .env_remove("STRATA_SLURM_TOPOLOGY")
        .env_remove("STRATA_NCCL_TUNER_CACHE")
        .env_remove("SLURM_JOB_NODELIST");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("harness runs");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "harness failed:\n{text}");
    let mut r = Run {
        symbol: String::new(),
        init: -1,
        logs: Vec::new(),
        constants_unchanged: false,
        calls: HashMap::new(),
        null_rc: None,
    };
    for line in text.lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        match w.first().copied() {
            Some("symbol") => r.symbol = w[1].to_string(),
            Some("init") => r.init = w[1].parse().unwrap(),
            Some("log") => r.logs.push(line.to_string()),
            Some("constants") => r.constants_unchanged = w[1] == "unchanged",
            Some("null") => r.null_rc = Some(w[1].parse().unwrap()),
            Some("call") => {
                let n = |i: usize| w[i].parse::<i64>().unwrap();
                let cells = w[5..].iter().map(|c| c.parse().unwrap()).collect();
                r.calls.insert(
                    (n(1) as i32, n(2) as usize),
                    (n(3) as i32, n(4) as i32, cells),
                );
            }
            _ => {}
        }
    }
    r
}

/// NCCL's cheapest allowed entry among `algos` (what it will run), by algorithm.
fn nccl_choice(table: &[f32], algos: &[usize]) -> usize {
    *algos
        .iter()
        .min_by(|&&a, &&b| row_min(table, a).total_cmp(&row_min(table, b)))
        .unwrap()
}

fn row_min(table: &[f32], a: usize) -> f32 {
    table[a * PROTOCOLS..(a + 1) * PROTOCOLS]
        .iter()
        .copied()
        .filter(|&c| c >= 0.0)
        .fold(f32::INFINITY, f32::min)
}

/// The harness's table before the plugin (its stand-in for NCCL's estimate).
fn nccl_estimate(a: usize, p: usize, bytes: usize) -> f32 {
    let base = [6.8f32, 14.0, 8.4];
    let gbps = [10.0f32, 18.0, 20.0];
    let f = match a {
        algo::TREE => 1.5,
        algo::PAT => 1.2,
        _ => 1.0,
    };
    f * base[p] + bytes as f32 / (gbps[p] * 1e3)
}

fn emulated() -> PathBuf {
    manifest("../examples/topology/emulated-fat-tree.toml")
}

/// The emulated fat tree with a full-bisection spine.
fn full_bisection() -> PathBuf {
    let text = std::fs::read_to_string(emulated()).unwrap();
    let flat = text.replace("oversubscription = 4.0", "oversubscription = 1.0");
    assert_ne!(text, flat);
    let path = setup().0.join("full-bisection.toml");
    std::fs::write(&path, flat).unwrap();
    path
}

/// Checks every call of an 8-rank, 8-node communicator on `file` against strata's prices, and
/// returns NCCL's resulting choice per (func, log2 bytes per rank).
fn check_against_strata(file: &Path) -> HashMap<(i32, usize), usize> {
    let r = run(&["8", "8"], &[("STRATA_TOPO_FILE", file.to_str().unwrap())]);
    assert_eq!(
        r.symbol, "ncclTunerPlugin_v7",
        "the newest interface is found first"
    );
    assert_eq!(r.init, 0, "{:?}", r.logs);
    assert!(r.constants_unchanged);
    assert!(
        r.logs.iter().any(|l| l.contains("8 ranks on 8 nodes")),
        "{:?}",
        r.logs
    );
    let fab = fabric::load_file(file).unwrap();
    // strata's model of the same GPUs: reductions after their data.
    let tuner = Tuner::new(
        model::hierarchy(&fab, 8, &(0..8).collect::<Vec<_>>()),
        model::nccl_tiers(fab.tiers),
        true,
    );
    let mut choices = HashMap::new();
    let cases = [
        (
            func::ALL_REDUCE,
            Collective::AllReduce,
            1usize,
            vec![algo::TREE, algo::RING],
        ),
        (
            func::ALL_GATHER,
            Collective::AllGather,
            8,
            vec![algo::RING, algo::PAT],
        ),
        (
            func::REDUCE_SCATTER,
            Collective::ReduceScatter,
            8,
            vec![algo::RING, algo::PAT],
        ),
    ];
    for (f, coll, mult, algos) in cases {
        for k in 0..=28usize {
            let per_rank = 1usize << k;
            let (rc, _, table) = &r.calls[&(f, per_rank * mult)];
            assert_eq!(*rc, 0);
            // Each modelled row now sits at strata's price (µs), with NCCL's protocol ratios.
            for &a in &algos {
                let (_, alg) = model::strata_algorithm(f, a).unwrap();
                let us = tuner.price(coll, alg, per_rank).seconds.unwrap() * 1e6;
                let got = row_min(table, a) as f64;
                assert!(
                    (got / us - 1.0).abs() < 1e-4,
                    "{coll} {alg} 2^{k}: {got} vs {us}"
                );
                let row = &table[a * PROTOCOLS..(a + 1) * PROTOCOLS];
                let nccl: Vec<f32> = (0..PROTOCOLS)
                    .map(|p| nccl_estimate(a, p, per_rank * mult))
                    .collect();
                for p in 1..PROTOCOLS {
                    let want = nccl[p] / nccl[0];
                    assert!(
                        (row[p] / row[0] / want - 1.0).abs() < 1e-3,
                        "{row:?} {nccl:?}"
                    );
                }
            }
            // NCCL, taking the minimum, runs what strata's model ranks first.
            let strata_best = algos
                .iter()
                .copied()
                .min_by(|&a, &b| {
                    let s = |a| {
                        let (_, alg) = model::strata_algorithm(f, a).unwrap();
                        tuner.price(coll, alg, per_rank).seconds.unwrap()
                    };
                    s(a).total_cmp(&s(b))
                })
                .unwrap();
            let chosen = nccl_choice(table, &algos);
            assert_eq!(chosen, strata_best, "{coll} 2^{k}");
            choices.insert((f, k), chosen);
            // NVLS is not modelled: NCCL's figure stays; what NCCL forbids stays forbidden.
            for a in 0..algo::COUNT {
                if algos.contains(&a) {
                    continue;
                }
                for p in 0..PROTOCOLS {
                    let c = table[a * PROTOCOLS + p];
                    if f == func::ALL_REDUCE && a == algo::NVLS {
                        assert_eq!(c, nccl_estimate(a, p, per_rank));
                    } else {
                        assert_eq!(c, -1.0);
                    }
                }
            }
        }
    }
    // Reduce has one NCCL algorithm and no strata price: untouched.
    let (_, _, table) = &r.calls[&(func::REDUCE, 1 << 20)];
    assert_eq!(
        table[algo::RING * PROTOCOLS],
        nccl_estimate(algo::RING, 0, 1 << 20)
    );
    // Channels: one for a latency-bound message across hosts, more as it grows, then NCCL's.
    assert_eq!(r.calls[&(func::ALL_REDUCE, 8)].1, 1);
    assert!(r.calls[&(func::ALL_REDUCE, 256 << 10)].1 > 1);
    assert_eq!(r.calls[&(func::ALL_REDUCE, 1 << 28)].1, 0);
    // A reduce's pipeline carries the whole message through each link, a ring step one block.
    assert_eq!(r.calls[&(func::ALL_REDUCE, 32 << 10)].1, 1);
    assert!(r.calls[&(func::REDUCE, 32 << 10)].1 > 1);
    assert_eq!(
        r.null_rc,
        Some(4),
        "a NULL table is refused, not dereferenced"
    );
    choices
}

#[test]
fn nccl_runs_what_strata_ranks_first_on_the_oversubscribed_fat_tree() {
    let over = check_against_strata(&emulated());
    let flat = check_against_strata(&full_bisection());
    // The spine is what changes the answer: with the 4:1 spine, all-gather and reduce-scatter
    // of 1 MiB per rank go round the ring, which crosses each uplink once; at full bisection
    // PAT's log-step exchange (Bruck) wins there.
    for f in [func::ALL_GATHER, func::REDUCE_SCATTER] {
        assert_eq!(over[&(f, 20)], algo::RING);
        assert_eq!(flat[&(f, 20)], algo::PAT);
        assert_eq!(over[&(f, 0)], algo::PAT, "8 B per rank: latency decides");
    }
}

/// Above 1,024 ranks the plugin prices the communicator too (it once left NCCL's tuning
/// alone there): 2,048 ranks on 256 nodes of the Meta-like file, the rows at strata's prices,
/// and NCCL's choice strata's.
#[test]
fn a_communicator_of_2048_ranks_is_priced_at_init() {
    let file = manifest("../examples/topology/meta-24k-h100.toml");
    let r = run(
        &["2048", "256"],
        &[("STRATA_TOPO_FILE", file.to_str().unwrap())],
    );
    assert_eq!(r.init, 0, "{:?}", r.logs);
    assert!(
        r.logs
            .iter()
            .any(|l| l.contains("2048 ranks on 256 nodes on") && l.contains("priced in")),
        "{:?}",
        r.logs
    );
    let fab = fabric::load_file(&file).unwrap();
    let tuner = Tuner::new(
        model::hierarchy(&fab, 2048, &(0..256).collect::<Vec<_>>()),
        fab.tiers,
        true,
    );
    // (func, NCCL's bytes, strata's bytes per rank, algorithms)
    let cases = [
        (
            func::ALL_REDUCE,
            1usize << 16,
            1usize << 16,
            [algo::TREE, algo::RING],
        ),
        (func::ALL_REDUCE, 1 << 20, 1 << 20, [algo::TREE, algo::RING]),
        (func::ALL_GATHER, 1 << 30, 1 << 19, [algo::RING, algo::PAT]),
        (
            func::REDUCE_SCATTER,
            1 << 30,
            1 << 19,
            [algo::RING, algo::PAT],
        ),
    ];
    for (f, n_bytes, per_rank, algos) in cases {
        let (rc, _, table) = &r.calls[&(f, n_bytes)];
        assert_eq!(*rc, 0);
        let mut best = (f64::INFINITY, 0);
        for a in algos {
            let (coll, alg) = model::strata_algorithm(f, a).unwrap();
            let us = tuner.price(coll, alg, per_rank).seconds.unwrap() * 1e6;
            let got = row_min(table, a) as f64;
            assert!((got / us - 1.0).abs() < 1e-4, "{coll} {alg}: {got} vs {us}");
            if us < best.0 {
                best = (us, a);
            }
        }
        assert_eq!(nccl_choice(table, &algos), best.1, "{f} {n_bytes}");
    }
}

/// With a cache directory, the first communicator prices and keeps its table there, and the
/// next (another process, as another job's rank would be) reads it and writes the same
/// cost tables for every call.
#[test]
fn a_cached_table_is_read_instead_of_priced() {
    let file = manifest("../examples/topology/meta-24k-h100.toml");
    let cache = profile_dir().join(format!("nccl-tuner-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&cache);
    std::fs::create_dir_all(&cache).unwrap();
    let env = [
        ("STRATA_TOPO_FILE", file.to_str().unwrap()),
        ("STRATA_NCCL_TUNER_CACHE", cache.to_str().unwrap()),
    ];
    let first = run(&["2048", "256"], &env);
    let second = run(&["2048", "256"], &env);
    let tables = std::fs::read_dir(&cache).unwrap().count();
    std::fs::remove_dir_all(&cache).unwrap();
    assert_eq!((first.init, second.init), (0, 0));
    let said = |r: &Run, what: &str| r.logs.iter().any(|l| l.contains(what));
    assert!(
        said(&first, "priced in") && said(&first, "kept in"),
        "{:?}",
        first.logs
    );
    assert!(said(&second, "read from"), "{:?}", second.logs);
    assert_eq!(tables, 1);
    assert!(!first.calls.is_empty());
    assert_eq!(first.calls, second.calls);
}

#[test]
fn every_exported_interface_writes_the_same_table() {
    let file = emulated();
    let env = [("STRATA_TOPO_FILE", file.to_str().unwrap())];
    let newest = run(&["8", "8"], &env);
    for v in ["6", "5", "4", "3"] {
        let r = run(&["8", "8", v], &env);
        assert_eq!(r.symbol, format!("ncclTunerPlugin_v{v}"));
        assert_eq!(r.init, 0);
        assert_eq!(r.calls, newest.calls, "v{v}");
    }
    let r = run(&["8", "8", "2"], &env);
    assert_eq!(
        r.symbol, "",
        "v2 (algorithm and protocol outputs) is not exported"
    );
}

#[test]
fn without_a_fabric_nccls_tuning_stands() {
    let r = run(&["8", "2"], &[]);
    assert_eq!(r.init, 0);
    assert!(
        r.logs
            .iter()
            .any(|l| l.contains("NCCL's own tuning stands")),
        "{:?}",
        r.logs
    );
    for ((f, bytes), (rc, ch, table)) in &r.calls {
        assert_eq!((*rc, *ch), (0, 0));
        for a in [algo::TREE, algo::RING, algo::PAT] {
            if table[a * PROTOCOLS] >= 0.0 {
                let mult_bytes = *bytes;
                assert_eq!(
                    table[a * PROTOCOLS + 2],
                    nccl_estimate(a, 2, mult_bytes),
                    "{f}"
                );
            }
        }
    }
}

#[test]
fn a_bad_fabric_fails_init_with_the_reason() {
    let r = run(
        &["8", "8"],
        &[("STRATA_TOPO_FILE", "/nonexistent/fabric.toml")],
    );
    assert_eq!(r.init, 5, "ncclInvalidUsage");
    assert!(
        r.logs
            .iter()
            .any(|l| l.starts_with("log 2 ") && l.contains("/nonexistent/fabric.toml")),
        "{:?}",
        r.logs
    );
    // More nodes than the file describes.
    let file = emulated();
    let r = run(
        &["16", "16"],
        &[("STRATA_TOPO_FILE", file.to_str().unwrap())],
    );
    assert_eq!(r.init, 5);
    assert!(
        r.logs.iter().any(|l| l.contains("describes 8 hosts")),
        "{:?}",
        r.logs
    );
    // A communicator of 0 ranks.
    let r = run(&["0", "1"], &[("STRATA_TOPO_FILE", file.to_str().unwrap())]);
    assert_eq!(r.init, 5);
}

#[test]
fn the_library_exports_the_tuner_symbols_and_nothing_else() {
    let (dir, _) = setup();
    let out = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(dir.join("libnccl-tuner-strata.so"))
        .output();
    let Ok(out) = out else {
        panic!("nm (binutils) is needed to list the exports");
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let names: Vec<&str> = text
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2))
        .collect();
    assert_eq!(
        names,
        [
            "ncclTunerPlugin_v3",
            "ncclTunerPlugin_v4",
            "ncclTunerPlugin_v5",
            "ncclTunerPlugin_v6",
            "ncclTunerPlugin_v7"
        ]
    );
}
