//! The rank tree, ranks as threads. Bootstrap: every rank gets the same table through a tree
//! three levels deep, and a rank missing inside the tree is named by every rank that arrived,
//! including those cut off below it. Diagnosis: a rank that skips a collective is named, with
//! what it does, by all 63 others, from one census taken over the tree. The live view of 74
//! ranks comes back through all three levels.

mod in_process;

use in_process::*;
use std::time::{Duration, Instant};
use strata::bootstrap::{TREE_FANOUT, tree_depth};
use strata::{Communicator, Config, Error, ReduceOp, TransportPolicy};

/// The shared thread configuration with `init_timeout` for start-up.
fn tree_cfg(init_timeout: Duration) -> Config {
    let mut c = cfg(TransportPolicy::Auto);
    c.init_timeout = init_timeout;
    c
}

/// `n` ranks as threads, initialised at once.
fn init_all(n: usize) -> Vec<Communicator> {
    init_threads_configured(loopback_id(), n, |_| tree_cfg(Duration::from_secs(60)))
}

#[test]
fn seventy_four_ranks_join_through_a_three_level_tree_and_reduce() {
    let n = 74; // rank 0, its 8 children, their 64, and one rank on a third level
    assert_eq!(tree_depth(n), 3);
    let comms = init_all(n);
    let table: Vec<_> = comms[0].peers().iter().map(|p| p.listen).collect();
    for c in &comms {
        assert_eq!(c.size(), n);
        let mine: Vec<_> = c.peers().iter().map(|p| p.listen).collect();
        assert_eq!(mine, table, "rank {} got a different table", c.rank());
        assert_eq!(c.peers()[c.rank()].rank, c.rank());
    }
    let sums: Vec<u64> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .map(|c| {
                s.spawn(move || {
                    let mut v = [c.rank() as u64 + 1; 3];
                    c.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
                    v[2]
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(
        sums.iter().all(|&s| s == (n * (n + 1) / 2) as u64),
        "{sums:?}"
    );
    // The live view, asked of a rank on the second level, comes back through all three.
    let view = comms[37].status(Duration::from_secs(5));
    let ranks: Vec<usize> = view.ranks.iter().map(|r| r.rank).collect();
    assert_eq!(ranks, (0..n).collect::<Vec<_>>(), "{:?}", view.silent);
    assert!(view.silent.is_empty() && view.unasked == 0);
    assert!(
        view.ranks
            .iter()
            .all(|r| r.call.is_none() && r.finished == 1)
    );
    assert!(view.holding_up.is_empty(), "{:?}", view.holding_up);
    println!("status of {n} ranks in {:.3} s", view.asked_in_s);
}

#[test]
fn a_rank_missing_inside_the_tree_is_named_by_every_rank_that_arrived() {
    // Rank 1 never comes: its children (9..=16) can reach nobody but the directory, and the
    // rest learn it over the tree.
    let n = 2 + 2 * TREE_FANOUT;
    let missing = 1;
    let id = loopback_id();
    let started = Instant::now();
    let results: Vec<(usize, Result<Communicator, Error>, Duration)> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .filter(|&r| r != missing)
            .map(|r| {
                s.spawn(move || {
                    let res =
                        Communicator::init_with_config(&id, n, r, tree_cfg(Duration::from_secs(2)));
                    (r, res, started.elapsed())
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(results.len(), n - 1);
    for (rank, res, took) in results {
        match res {
            Err(Error::Timeout { waiting_on, op, .. }) => {
                assert_eq!(waiting_on, vec![missing], "rank {rank}: {op}");
                assert!(op.contains("rank 1 never arrived"), "rank {rank}: {op}");
            }
            Err(e) => panic!("rank {rank}: expected a timeout naming rank 1, got {e}"),
            Ok(_) => panic!("rank {rank}: init succeeded without rank 1"),
        }
        // The deadline is 2 s; a rank waiting on its parent allows 5 s of grace on top.
        assert!(took < Duration::from_secs(10), "rank {rank} took {took:?}");
    }
}

#[test]
fn a_rank_that_skips_a_collective_is_named_by_all_63_others_through_the_tree() {
    let n = 64;
    let skipper = 37;
    let comms = init_all(n);
    let errors: Vec<(usize, Option<Error>)> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .map(|c| {
                s.spawn(move || {
                    let mut v = [1u32; 16];
                    c.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
                    if c.rank() == skipper {
                        // Busy elsewhere until the others have given up.
                        let t = Instant::now();
                        while c.async_error().is_none() && t.elapsed() < Duration::from_secs(30) {
                            std::thread::sleep(Duration::from_millis(20));
                        }
                        return (c.rank(), None);
                    }
                    c.set_timeout(Duration::from_secs(3)).unwrap();
                    let err = c.all_reduce_in_place(&mut v, ReduceOp::Sum).err();
                    (c.rank(), err)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let host = &comms[skipper].peers()[skipper].host.hostname;
    for (rank, err) in errors {
        if rank == skipper {
            continue;
        }
        let text = err.as_ref().map(ToString::to_string).unwrap_or_default();
        match &err {
            Some(Error::Timeout {
                waiting_on,
                seq: 2,
                diagnosis: Some(_),
                ..
            }) => assert_eq!(waiting_on, &[skipper], "rank {rank}: {text}"),
            other => panic!("rank {rank}: expected a diagnosed timeout, got {other:?}"),
        }
        for want in [
            format!(
                "rank {skipper} (host {host}, pid {}) is idle after collective #1",
                std::process::id()
            ),
            "ranks 0-36,38-63 wait on it".to_string(),
        ] {
            assert!(text.contains(&want), "rank {rank}: '{want}' not in: {text}");
        }
    }
    // One census over the tree: each rank asks its parent once and its children once, so
    // about 2 (p − 1) questions in all, not the (p − 1)² of every rank asking every rank.
    let asked: Vec<usize> = comms
        .iter()
        .map(|c| c.diagnosis_questions_asked())
        .collect();
    let most = asked.iter().copied().max().unwrap_or(0);
    let total: usize = asked.iter().sum();
    println!("diagnosis questions: {total} in all, at most {most} from one rank");
    assert!(
        most <= 1 + TREE_FANOUT,
        "a rank asked {most} questions: {asked:?}"
    );
    assert!(total <= 2 * (n - 1), "{total} questions in all: {asked:?}");
}
