//! A rank that is alive but persistently late is named, and a clean run names no one: four
//! ranks all-reduce 1 MiB (ring) 120 times; in one run rank 2 sleeps 15 ms before each call,
//! as a rank with a slow GPU, a throttled CPU or a bad cable would start each call late.

mod common;

use common::{assert_all_ok, is_worker, spawn, worker};
use std::time::Duration;
use strata::{Algorithm, Collective, ReduceOp};

const SLOW: usize = 2;

#[test]
fn a_persistently_late_rank_is_named_and_a_clean_run_names_no_one() {
    if let Some(w) = worker() {
        let slow = std::env::var("STRATA_TEST_SLOW").is_ok_and(|v| v == "1");
        w.comm
            .set_algorithm(Collective::AllReduce, Some(Algorithm::Ring))
            .unwrap();
        let mut buf = vec![1f32; 1 << 18];
        for _ in 0..120 {
            if slow && w.rank == SLOW {
                std::thread::sleep(Duration::from_millis(15));
            }
            buf.fill(1.0);
            w.comm.all_reduce_in_place(&mut buf, ReduceOp::Sum).unwrap();
            assert!(buf.iter().all(|&x| x == w.n as f32));
        }
        let seen: Vec<usize> = w.comm.stragglers().iter().map(|s| s.rank).collect();
        println!("VIEW {seen:?} {:?}", w.comm.stragglers());
        return;
    }
    if is_worker() {
        return;
    }
    let name = "a_persistently_late_rank_is_named_and_a_clean_run_names_no_one";
    for slow in ["1", "0"] {
        let ranks = spawn(
            name,
            4,
            4,
            // Warnings are shown under NCCL_DEBUG=WARN (or STRATA_LOG=warn), as in NCCL.
            &[("STRATA_TEST_SLOW", slow), ("NCCL_DEBUG", "WARN")],
            Duration::from_secs(120),
        );
        assert_all_ok(&ranks);
        let mut named = std::collections::BTreeSet::new();
        for (r, (_, out)) in ranks.iter().enumerate() {
            let view = out
                .lines()
                .find_map(|l| l.split_once("VIEW ").map(|(_, v)| v.to_string()))
                .unwrap_or_else(|| panic!("rank {r}: {out}"));
            println!("slow={slow} rank {r}: {view}");
            for l in out.lines().filter(|l| l.contains("straggler")) {
                println!("  {l}");
            }
            let list = view.split(']').next().unwrap_or("").trim_start_matches('[');
            named.extend(
                list.split(',')
                    .filter_map(|x| x.trim().parse::<usize>().ok()),
            );
        }
        let warned = ranks.iter().any(|(_, out)| {
            out.contains(&format!("rank {SLOW} (host")) && out.contains("is a straggler")
        });
        if slow == "1" {
            assert_eq!(named, [SLOW].into(), "the slow rank alone is named");
            assert!(warned, "no warn line named rank {SLOW}");
        } else {
            assert!(named.is_empty(), "a clean run named {named:?}");
            assert!(
                ranks.iter().all(|(_, out)| !out.contains("straggler")),
                "a clean run warned"
            );
        }
    }
}
