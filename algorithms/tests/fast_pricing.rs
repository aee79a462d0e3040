//! Fast pricing (`scale::price`) against the full flow-level simulation (`cost::price` on a
//! `FabricModel`), for every collective and algorithm, on the repo's Meta-like fabric, on the
//! emulated fat tree, and on irregular shapes with oversubscribed uplinks.

use strata_algorithms::cost::{FabricModel, price};
use strata_algorithms::hierarchy::Hierarchy;
use strata_algorithms::scale::{self, Query};
use strata_algorithms::{Algorithm, Collective, algorithms_for, sim};
use strata_topology::Tier;
use strata_topology::fabric::{self, Fabric, TierCosts};

const CHUNK: usize = (512 << 10) / 4;

/// How far fast pricing may be from the full simulation, either way, for every collective
/// and algorithm, contended uplinks and irregular shapes included. Schedules that can be
/// built are timed by flows on their classes of alike ranks, which is the full simulation's
/// own rule (exact up to rounding); the closed forms of ring and pairwise phases stay within
/// it on regular shapes.
const TOLERANCE: f64 = 0.01;

fn file(name: &str) -> Fabric {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/topology")
        .join(name);
    fabric::load_file(&path).expect("repo fabric file")
}

/// The first `np` devices of `fab` (or dealt round-robin over its leaves when `cyclic`).
fn on_fabric(fab: &Fabric, np: usize, cyclic: bool) -> Hierarchy {
    let per_host = fab.gpus_per_host.max(1);
    let hosts = fab.hosts();
    let devices: Vec<usize> = if cyclic {
        // Host h of each leaf in turn: ranks scattered across leaves.
        let (leaves, _) = fab.counts();
        let per_leaf = hosts / leaves;
        (0..np)
            .map(|r| {
                let host = (r % leaves) * per_leaf + (r / leaves) % per_leaf;
                host * per_host + r / hosts
            })
            .collect()
    } else {
        (0..np).collect()
    };
    Hierarchy::on_fabric(fab, &devices)
}

/// Hosts of `gpus[h]` ranks, `hosts_per_leaf` hosts per leaf (the last leaf takes what is
/// left), `leaves_per_pod` leaves per pod.
fn irregular(gpus: &[usize], hosts_per_leaf: usize, leaves_per_pod: usize) -> Hierarchy {
    let mut keys = Vec::new();
    for (h, &g) in gpus.iter().enumerate() {
        let leaf = h / hosts_per_leaf;
        let pod = leaf / leaves_per_pod;
        for _ in 0..g {
            keys.push(vec![
                format!("{pod:04}"),
                format!("{leaf:04}"),
                format!("{h:06}"),
            ]);
        }
    }
    let k = keys.clone();
    Hierarchy::from_keys(&keys, move |a, b| {
        let (x, y) = (&k[a], &k[b]);
        if x[2] == y[2] {
            Tier::NvLink
        } else if x[1] == y[1] {
            Tier::Leaf
        } else if x[0] == y[0] {
            Tier::Pod
        } else {
            Tier::Aggregation
        }
    })
}

/// The Meta-like tiers with the leaf uplinks oversubscribed 3:1 as well, so that contention
/// shows inside one pod.
fn oversubscribed() -> TierCosts {
    let mut costs = file("meta-24k-h100.toml").tiers;
    costs.pod.oversubscription = 3.0;
    costs.pod.shared_efficiency = 0.8;
    costs
}

struct Case<'a> {
    name: String,
    hierarchy: Hierarchy,
    costs: TierCosts,
    ordered: bool,
    collectives: &'a [Collective],
    sizes: &'a [usize],
}

const ALL: &[Collective] = &[
    Collective::AllReduce,
    Collective::AllGather,
    Collective::ReduceScatter,
    Collective::Broadcast,
    Collective::Reduce,
    Collective::AllToAll,
    Collective::Gather,
    Collective::Scatter,
    Collective::Barrier,
];

/// Prices every algorithm of every collective of `case` both ways; returns the mismatches.
fn compare(case: &Case) -> Vec<String> {
    let mut bad = Vec::new();
    let h = &case.hierarchy;
    let net = FabricModel {
        hierarchy: h,
        costs: case.costs,
        shared_cores: &[],
    };
    let root = h.len() / 3;
    for &c in case.collectives {
        for &a in algorithms_for(c) {
            for &bytes in case.sizes {
                let count = bytes / 4;
                let Ok(s) = sim::schedules_on(c, a, h, case.ordered, count, root, CHUNK) else {
                    // Not runnable here (a hierarchical algorithm on irregular groups): fast
                    // pricing must refuse it too.
                    let q = query(case, c, a, count, root);
                    if scale::price(&q).is_ok() {
                        bad.push(format!("{}: {c} {a}: priced but cannot run", case.name));
                    }
                    continue;
                };
                let full = price(&s, 4, &net).expect("full simulation").seconds;
                let fast = match scale::price(&query(case, c, a, count, root)) {
                    Ok(t) => t,
                    Err(e) => {
                        bad.push(format!("{}: {c} {a} {bytes} B: {e}", case.name));
                        continue;
                    }
                };
                let err = (fast - full) / full;
                if err.abs() > TOLERANCE {
                    bad.push(format!(
                        "{}: {c} {a} {bytes} B: full {:.3} us, fast {:.3} us ({:+.2}%)",
                        case.name,
                        full * 1e6,
                        fast * 1e6,
                        err * 100.0
                    ));
                }
            }
        }
    }
    bad
}

fn query<'a>(case: &'a Case, c: Collective, a: Algorithm, count: usize, root: usize) -> Query<'a> {
    Query {
        hierarchy: &case.hierarchy,
        costs: case.costs,
        ordered: case.ordered,
        collective: c,
        algorithm: a,
        count,
        elem_bytes: 4,
        root,
        chunk_elems: CHUNK,
    }
}

fn run(cases: Vec<Case>) {
    let bad: Vec<String> = cases.iter().flat_map(compare).collect();
    assert!(
        bad.is_empty(),
        "{} mismatches:\n{}",
        bad.len(),
        bad.join("\n")
    );
}

const SIZES: &[usize] = &[8, 64 << 10, 64 << 20];

#[test]
fn meta_fabric_every_collective_up_to_256_ranks() {
    let fab = file("meta-24k-h100.toml");
    let cases = [2, 3, 7, 8, 12, 16, 24, 50, 100, 128, 200, 256]
        .into_iter()
        .map(|np| Case {
            name: format!("meta {np} ranks"),
            hierarchy: on_fabric(&fab, np, false),
            costs: fab.tiers,
            ordered: true,
            collectives: ALL,
            sizes: SIZES,
        })
        .collect();
    run(cases);
}

#[test]
fn meta_fabric_all_reduce_gather_scatter_at_1000_and_1024_ranks() {
    let fab = file("meta-24k-h100.toml");
    let cases = [1000, 1024]
        .into_iter()
        .map(|np| Case {
            name: format!("meta {np} ranks"),
            hierarchy: on_fabric(&fab, np, false),
            costs: fab.tiers,
            ordered: true,
            collectives: &[
                Collective::AllReduce,
                Collective::AllGather,
                Collective::ReduceScatter,
            ],
            sizes: &[64 << 10, 64 << 20],
        })
        .collect();
    run(cases);
}

#[test]
fn emulated_fat_tree_every_rank_count_both_orders() {
    let fab = file("emulated-fat-tree.toml");
    let mut cases = Vec::new();
    for np in 2..=fab.ranks() {
        for (cyclic, ordered) in [(false, true), (true, true), (true, false)] {
            cases.push(Case {
                name: format!("emulated {np} ranks cyclic={cyclic} ordered={ordered}"),
                hierarchy: on_fabric(&fab, np, cyclic),
                costs: fab.tiers,
                ordered,
                collectives: ALL,
                sizes: &[8, 64 << 10, 16 << 20],
            });
        }
    }
    run(cases);
}

#[test]
fn irregular_shapes_with_oversubscribed_leaves() {
    let cases = vec![
        // Hosts with different GPU counts.
        Case {
            name: "hosts of 8, 4, 6 and 2 GPUs".into(),
            hierarchy: irregular(&[8, 4, 8, 6, 8, 2, 8, 8, 4, 8], 2, 3),
            costs: oversubscribed(),
            ordered: true,
            collectives: ALL,
            sizes: SIZES,
        },
        // A last leaf half full.
        Case {
            name: "last leaf half full".into(),
            hierarchy: irregular(&[8; 14], 4, 2),
            costs: oversubscribed(),
            ordered: true,
            collectives: ALL,
            sizes: SIZES,
        },
        // Regular, oversubscribed: every hierarchical algorithm runs.
        Case {
            name: "regular 4 x 2 x 4 x 2".into(),
            hierarchy: irregular(&[4; 16], 2, 4),
            costs: oversubscribed(),
            ordered: true,
            collectives: ALL,
            sizes: SIZES,
        },
    ];
    run(cases);
}
