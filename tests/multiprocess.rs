//! Multi-process tests: every collective × type × reduction at 1, 2, 3, 4, 7 and 8 ranks, and
//! every algorithm of every collective at 1, 2, 3, 5 and 8 ranks, each rank its own process,
//! over shared memory and over forced TCP; mismatched calls and algorithms; the init deadline.
//!
//! The test binary re-runs itself as the ranks: a test function started with
//! `STRATA_TEST_WORKER` set does the rank's part and exits; otherwise it spawns the ranks, waits
//! for them under an outer deadline (killing them if it passes) and checks every exit status.

#[macro_use]
mod common;

use common::*;
use std::time::{Duration, Instant};
use strata::{CallSpec, Collective, Communicator, DataType, Error, ReduceOp, UniqueId};

matrix_test!(matrix_1_rank, 1, true, &[]);
matrix_test!(matrix_2_ranks_shm, 2, true, &[]);
matrix_test!(matrix_3_ranks_shm, 3, true, &[]);
matrix_test!(matrix_4_ranks_shm, 4, true, &[]);
matrix_test!(matrix_7_ranks_shm, 7, true, &[]);
matrix_test!(matrix_8_ranks_shm, 8, true, &[]);
matrix_test!(matrix_3_ranks_tcp, 3, true, &[("STRATA_TRANSPORT", "tcp")]);
matrix_test!(
    matrix_4_ranks_tcp_one_stream,
    4,
    false,
    &[("STRATA_TRANSPORT", "tcp"), ("STRATA_TCP_STREAMS", "1")]
);

/// Every algorithm of every collective, chosen with `Communicator::set_algorithm`, at counts
/// around the block and chunk boundaries (chunks are 4 KiB in these runs, so the tree and the
/// chain pipeline), in and out of place, for f32 sum, bf16 avg and i32 max.
fn algorithm_matrix(w: &Worker) {
    let cases = [
        (DataType::Float32, ReduceOp::Sum),
        (DataType::Bfloat16, ReduceOp::Avg),
        (DataType::Int32, ReduceOp::Max),
    ];
    let regular = w.comm.hierarchy().dims().is_some();
    if std::env::var_os("STRATA_TEST_LEAVES").is_some() && w.n > 4 {
        assert!(
            !w.comm.hierarchy().is_launcher_order(),
            "{}",
            w.comm.hierarchy().describe()
        );
        assert_eq!(
            regular,
            w.n.is_multiple_of(4),
            "{}",
            w.comm.hierarchy().describe()
        );
    }
    for c in COLLECTIVES {
        for &algo in strata::algorithms::algorithms_for(c) {
            w.comm.set_algorithm(c, Some(algo)).unwrap();
            if algo.is_hierarchical() && !regular {
                let buf = vec![0u8; 4 * 8 * w.n];
                let mut out = vec![0u8; 4 * 8 * w.n];
                let e = w
                    .comm
                    .call_bytes(
                        CallSpec {
                            collective: c,
                            dtype: DataType::Float32,
                            count: 8,
                            op: ReduceOp::Sum,
                            root: 0,
                        },
                        Some(&buf),
                        &mut out,
                    )
                    .unwrap_err()
                    .to_string();
                assert!(e.contains("same number of ranks"), "{e}");
                continue;
            }
            for (k, &count) in [0usize, 1, 5, 4099, 70_001].iter().enumerate() {
                for (dtype, op) in cases {
                    if !c.reduces() && dtype != DataType::Float32 {
                        continue;
                    }
                    let root = (k + 1) % w.n;
                    for in_place in [false, true] {
                        let spec = CallSpec {
                            collective: c,
                            dtype,
                            count,
                            op,
                            root,
                        };
                        run_checked(w, spec, in_place)
                            .unwrap_or_else(|e| panic!("{} ranks, {algo}: {e}", w.n));
                    }
                }
            }
        }
        w.comm.set_algorithm(c, None).unwrap();
    }
    // A steady loop builds its schedule once: in its first call, or past a near-tie trial of
    // its size class, which builds each rival's schedule.
    let send = vec![1f32; 3000];
    let mut recv = vec![0f32; 3000];
    for _ in 0..w
        .comm
        .tuner_trial_calls(Collective::AllReduce, 3000 * 4)
        .max(1)
    {
        w.comm.all_reduce(&send, &mut recv, ReduceOp::Sum).unwrap();
    }
    let built = w.comm.schedules_built();
    for _ in 0..20 {
        w.comm.all_reduce(&send, &mut recv, ReduceOp::Sum).unwrap();
    }
    assert_eq!(
        w.comm.schedules_built(),
        built,
        "a repeated call rebuilt its schedule"
    );
    assert!(recv.iter().all(|&x| x == w.n as f32));
}

macro_rules! algorithm_test {
    ($name:ident, $n:expr, $env:expr) => {
        #[test]
        fn $name() {
            if let Some(w) = worker() {
                algorithm_matrix(&w);
                return;
            }
            if is_worker() {
                return;
            }
            let mut env: Vec<(&str, &str)> = vec![("STRATA_CHUNK_SIZE", "4096")];
            env.extend_from_slice($env);
            assert_all_ok(&spawn(
                stringify!($name),
                $n,
                $n,
                &env,
                Duration::from_secs(300),
            ));
        }
    };
}

algorithm_test!(algorithms_1_rank, 1, &[]);
algorithm_test!(algorithms_2_ranks_shm, 2, &[]);
algorithm_test!(algorithms_3_ranks_shm, 3, &[]);
algorithm_test!(algorithms_5_ranks_shm, 5, &[]);
algorithm_test!(algorithms_8_ranks_shm, 8, &[]);
algorithm_test!(algorithms_2_ranks_tcp, 2, &[("STRATA_TRANSPORT", "tcp")]);
algorithm_test!(algorithms_3_ranks_tcp, 3, &[("STRATA_TRANSPORT", "tcp")]);
algorithm_test!(algorithms_5_ranks_tcp, 5, &[("STRATA_TRANSPORT", "tcp")]);
algorithm_test!(algorithms_8_ranks_tcp, 8, &[("STRATA_TRANSPORT", "tcp")]);
// Ranks dealt over 4 leaves: rings run in topology order and the hierarchical algorithms
// over 2 × 4 rails; with 6 ranks the leaves hold 2, 2, 1 and 1 and the hierarchical ones
// must refuse.
algorithm_test!(
    algorithms_8_ranks_on_4_leaves_tcp,
    8,
    &[("STRATA_TRANSPORT", "tcp"), ("STRATA_TEST_LEAVES", "4")]
);
algorithm_test!(
    algorithms_6_ranks_on_4_uneven_leaves_shm,
    6,
    &[("STRATA_TEST_LEAVES", "4")]
);

#[test]
fn mismatched_algorithms_fail_naming_both() {
    if let Some(w) = worker() {
        let algo = if w.rank == 1 {
            strata::Algorithm::Rabenseifner
        } else {
            strata::Algorithm::Ring
        };
        w.comm
            .set_algorithm(Collective::AllReduce, Some(algo))
            .unwrap();
        let mut buf = vec![1f32; 1000];
        match w.comm.all_reduce_in_place(&mut buf, ReduceOp::Sum) {
            Err(Error::Mismatch(m)) => {
                assert!(
                    m.contains("rhd") && m.contains("ring"),
                    "rank {}: {m}",
                    w.rank
                );
                println!("rank {}: {m}", w.rank);
            }
            other => panic!("rank {}: expected a mismatch, got {other:?}", w.rank),
        }
        // Linger so the others read this rank's poison before it goes.
        std::thread::sleep(Duration::from_secs(2));
        return;
    }
    if is_worker() {
        return;
    }
    assert_all_ok(&spawn(
        "mismatched_algorithms_fail_naming_both",
        3,
        3,
        &[],
        Duration::from_secs(60),
    ));
}

#[test]
fn unknown_algorithm_in_strata_algo_fails_init_listing_the_valid_ones() {
    if is_worker() {
        let rank: usize = std::env::var("STRATA_TEST_RANK").unwrap().parse().unwrap();
        let id = UniqueId::from_hex(&std::env::var("STRATA_TEST_ID").unwrap()).unwrap();
        match Communicator::init(&id, 1, rank) {
            Err(Error::InvalidArgument(m)) => {
                assert!(
                    m.contains("'quantum'") && m.contains("valid: ring, tree, rd"),
                    "{m}"
                );
            }
            other => panic!("expected InvalidArgument, got {:?}", other.map(|_| ())),
        }
        return;
    }
    assert_all_ok(&spawn(
        "unknown_algorithm_in_strata_algo_fails_init_listing_the_valid_ones",
        1,
        1,
        &[("STRATA_ALGO", "allreduce:quantum")],
        Duration::from_secs(60),
    ));
}

#[test]
fn mismatched_collectives_fail_on_every_rank_naming_both_calls() {
    if let Some(w) = worker() {
        let mut buf = vec![1f32; 1000];
        let t = Instant::now();
        let r = if w.rank == 2 {
            w.comm.broadcast_in_place(&mut buf, 0)
        } else {
            w.comm.all_reduce_in_place(&mut buf, ReduceOp::Sum)
        };
        match r {
            Err(Error::Mismatch(m)) => {
                assert!(
                    m.contains("all_reduce #1") && m.contains("broadcast #1"),
                    "rank {}: {m}",
                    w.rank
                );
                assert!(
                    t.elapsed() < Duration::from_secs(10),
                    "rank {} relied on the deadline: {:?}",
                    w.rank,
                    t.elapsed()
                );
                println!("rank {}: {m}", w.rank);
            }
            other => panic!("rank {}: expected a mismatch, got {other:?}", w.rank),
        }
        // The communicator stays failed, and later calls say why.
        assert!(matches!(w.comm.barrier(), Err(Error::Mismatch(_))));
        // Stay up a moment, as a process handling the error would, so that slower ranks still
        // reach this one (a process that exits at once is covered by the next test).
        std::thread::sleep(Duration::from_secs(2));
        return;
    }
    if is_worker() {
        return;
    }
    let env = [("STRATA_TIMEOUT", "60")];
    assert_all_ok(&spawn(
        "mismatched_collectives_fail_on_every_rank_naming_both_calls",
        4,
        4,
        &env,
        Duration::from_secs(60),
    ));
}

#[test]
fn mismatched_types_and_counts_are_named() {
    if let Some(w) = worker() {
        // Same collective, different type on rank 1.
        let r = if w.rank == 1 {
            let mut v = vec![0i32; 64];
            w.comm.all_reduce_in_place(&mut v, ReduceOp::Sum)
        } else {
            let mut v = vec![0f32; 64];
            w.comm.all_reduce_in_place(&mut v, ReduceOp::Sum)
        };
        match r {
            Err(Error::Mismatch(m)) => assert!(m.contains("int32") && m.contains("float"), "{m}"),
            other => panic!("rank {}: expected a mismatch, got {other:?}", w.rank),
        }
        return;
    }
    if is_worker() {
        return;
    }
    assert_all_ok(&spawn(
        "mismatched_types_and_counts_are_named",
        2,
        2,
        &[],
        Duration::from_secs(60),
    ));
}

#[test]
fn init_deadline_names_the_missing_rank() {
    if is_worker() {
        let rank: usize = std::env::var("STRATA_TEST_RANK").unwrap().parse().unwrap();
        let n: usize = std::env::var("STRATA_TEST_NRANKS")
            .unwrap()
            .parse()
            .unwrap();
        let id = UniqueId::from_hex(&std::env::var("STRATA_TEST_ID").unwrap()).unwrap();
        let t = Instant::now();
        match Communicator::init(&id, n, rank) {
            Err(Error::Timeout { waiting_on, op, .. }) => {
                assert_eq!(waiting_on, vec![2], "{op}");
                assert!(op.contains("rank 2 never arrived"), "{op}");
                assert!(
                    t.elapsed() < Duration::from_secs(10),
                    "took {:?}",
                    t.elapsed()
                );
            }
            Err(e) => panic!("rank {rank}: unexpected error {e}"),
            Ok(_) => panic!("rank {rank}: init succeeded without rank 2"),
        }
        return;
    }
    // The parent's root also needs the short deadline.
    // SAFETY: read by the root thread started just after.
    unsafe { std::env::set_var("STRATA_INIT_TIMEOUT", "2") };
    let results = spawn(
        "init_deadline_names_the_missing_rank",
        3,
        2,
        &[("STRATA_INIT_TIMEOUT", "2")],
        Duration::from_secs(60),
    );
    // SAFETY: as above.
    unsafe { std::env::remove_var("STRATA_INIT_TIMEOUT") };
    assert_all_ok(&results);
}

#[test]
fn a_killed_peer_is_reported_not_waited_out() {
    if let Some(w) = worker() {
        let mut v = vec![1f32; 1 << 16];
        w.comm.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
        if w.rank == 1 {
            // Die without a goodbye, as a crashed process would.
            std::process::exit(3);
        }
        let t = Instant::now();
        let r = w.comm.all_reduce_in_place(&mut v, ReduceOp::Sum);
        match r {
            Err(Error::PeerFailed { rank: 1, .. }) => {}
            Err(Error::PeerFailed { reason, .. }) if reason.contains("rank 1") => {}
            other => panic!(
                "rank {}: expected rank 1 to be named, got {other:?}",
                w.rank
            ),
        }
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "took {:?}",
            t.elapsed()
        );
        return;
    }
    if is_worker() {
        return;
    }
    let res = spawn(
        "a_killed_peer_is_reported_not_waited_out",
        3,
        3,
        &[("STRATA_TIMEOUT", "120")],
        Duration::from_secs(60),
    );
    assert!(!res[1].0, "rank 1 was meant to die");
    assert!(res[0].0, "rank 0:\n{}", res[0].1);
    assert!(res[2].0, "rank 2:\n{}", res[2].1);
}

#[test]
fn from_env_joins_with_torchrun_variables() {
    if is_worker() {
        let rank = std::env::var("STRATA_TEST_RANK").unwrap();
        // SAFETY: single-threaded here; torchrun would have set these before exec.
        unsafe {
            std::env::set_var("RANK", &rank);
            std::env::set_var("WORLD_SIZE", std::env::var("STRATA_TEST_NRANKS").unwrap());
        }
        let comm = Communicator::from_env().unwrap_or_else(|e| panic!("rank {rank}: {e}"));
        let mut v = vec![comm.rank() as u64 + 1; 1000];
        comm.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
        assert!(v.iter().all(|x| *x == 6), "{:?}", &v[..4]);
        assert_eq!(comm.size(), 3);
        return;
    }
    // torchrun's store owns MASTER_PORT; strata's root listens on MASTER_PORT + 1.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port() - 1
    };
    let port = port.to_string();
    let env = [
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", port.as_str()),
        ("STRATA_SECRET", "000102030405060708090a0b0c0d0e0f"),
    ];
    assert_all_ok(&spawn(
        "from_env_joins_with_torchrun_variables",
        3,
        3,
        &env,
        Duration::from_secs(60),
    ));
}

#[test]
fn connecting_to_a_rank_that_has_exited_fails_fast() {
    if let Some(w) = worker() {
        // Rank 2 leaves before anyone connects to it; rank 0's recursive-doubling partner in
        // the second step is rank 2, so rank 0 must report it instead of retrying to connect.
        if w.rank == 2 {
            drop(w);
            return;
        }
        std::thread::sleep(Duration::from_millis(300));
        let t = Instant::now();
        let mut v = vec![1f32; 16];
        match w.comm.all_reduce_in_place(&mut v, ReduceOp::Sum) {
            Err(Error::PeerFailed { .. }) | Err(Error::Mismatch(_)) => {}
            other => panic!(
                "rank {}: expected a failure naming a peer, got {other:?}",
                w.rank
            ),
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "rank {} took {:?}",
            w.rank,
            t.elapsed()
        );
        return;
    }
    if is_worker() {
        return;
    }
    let env = [("STRATA_TIMEOUT", "120"), ("STRATA_ALGO", "all_reduce:rd")];
    assert_all_ok(&spawn(
        "connecting_to_a_rank_that_has_exited_fails_fast",
        4,
        4,
        &env,
        Duration::from_secs(60),
    ));
}

/// Every rank computes the same tiers: the digests gathered from all ranks agree, with a
/// fabric file (every rank placed) and without one (two tiers).
fn tier_digests_agree(w: &Worker, fabric: bool) {
    let tiers = w.comm.tiers();
    assert_eq!(tiers.fabric_known(), fabric);
    assert_eq!(tiers.len(), w.n);
    // The example file's aggregation layer is 1:7; without a file the default is 1:1.
    let agg = tiers.link(strata::topology::Tier::Aggregation);
    assert_eq!(agg.oversubscription, if fabric { 7.0 } else { 1.0 });
    for b in 0..w.n {
        let want = if b == w.rank {
            strata::topology::Tier::SameDevice
        } else {
            strata::topology::Tier::Host
        };
        assert_eq!(w.comm.tier(w.rank, b), want, "rank {} to {b}", w.rank);
    }
    let digest: Vec<u8> = tiers.digest().into_bytes();
    let mut all = vec![0u8; digest.len() * w.n];
    w.comm.all_gather(&digest, &mut all).unwrap();
    for (r, d) in all.chunks(digest.len()).enumerate() {
        assert_eq!(
            d,
            &digest[..],
            "rank {r} computed other tiers than rank {}",
            w.rank
        );
    }
}

#[test]
fn tiers_agree_with_a_fabric_file() {
    if let Some(w) = worker() {
        tier_digests_agree(&w, true);
        return;
    }
    if is_worker() {
        return;
    }
    let file = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/topology/meta-24k-h100.toml"
    );
    assert_all_ok(&spawn(
        "tiers_agree_with_a_fabric_file",
        4,
        4,
        &[("STRATA_TOPO_FILE", file)],
        Duration::from_secs(60),
    ));
}

#[test]
fn tiers_agree_without_fabric_information() {
    if let Some(w) = worker() {
        tier_digests_agree(&w, false);
        return;
    }
    if is_worker() {
        return;
    }
    assert_all_ok(&spawn(
        "tiers_agree_without_fabric_information",
        3,
        3,
        &[],
        Duration::from_secs(60),
    ));
}

#[test]
fn a_bad_fabric_file_fails_init_naming_file_and_line() {
    if is_worker() {
        let id = UniqueId::from_hex(&std::env::var("STRATA_TEST_ID").unwrap()).unwrap();
        match Communicator::init(&id, 1, 0) {
            Err(Error::InvalidArgument(m)) => {
                assert!(m.contains("STRATA_TOPO_FILE") && m.contains(":2:"), "{m}");
            }
            other => panic!("expected InvalidArgument, got {:?}", other.map(|_| ())),
        }
        return;
    }
    let path = std::env::temp_dir().join(format!("strata-bad-topo-{}.toml", std::process::id()));
    std::fs::write(&path, "gpus_per_host = 8\n[fat_tree\n").unwrap();
    let results = spawn(
        "a_bad_fabric_file_fails_init_naming_file_and_line",
        1,
        1,
        &[("STRATA_TOPO_FILE", path.to_str().unwrap())],
        Duration::from_secs(60),
    );
    let _ = std::fs::remove_file(&path);
    assert_all_ok(&results);
}
