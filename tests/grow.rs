//! A communicator grows: rank 0 of three makes an id (`grow_id`), a new process joins with it,
//! and the four all-reduce, the three keeping their numbers; the old communicator still
//! works; growing to fewer ranks, or with no id or several, is refused on every rank.

mod common;

use common::{assert_all_ok, spawn};
use std::time::{Duration, Instant};
use strata::{Communicator, Error, ReduceOp, UniqueId};

const OLD: usize = 3;
const NEW: usize = 4;

#[test]
fn three_ranks_grow_to_four_and_the_new_one_joins_after_them() {
    let name = "three_ranks_grow_to_four_and_the_new_one_joins_after_them";
    if std::env::var_os(common::WORKER).is_some() {
        let rank: usize = std::env::var("STRATA_TEST_RANK").unwrap().parse().unwrap();
        let handoff = std::path::PathBuf::from(std::env::var("STRATA_TEST_HANDOFF").unwrap());
        let grown = if rank < OLD {
            let id = UniqueId::from_hex(&std::env::var("STRATA_TEST_ID").unwrap()).unwrap();
            let old = Communicator::init(&id, OLD, rank).unwrap();
            let refused = |r: Result<Communicator, Error>, why: &str| match r {
                Err(Error::InvalidArgument(m)) => assert!(m.contains(why), "{m}"),
                Err(e) => panic!("{why}: {e}"),
                Ok(_) => panic!("{why}: succeeded"),
            };
            refused(old.grow(None, OLD - 1), "already has 3");
            refused(old.grow(None, NEW), "no rank passed an id");
            // Every rank passing one (here, the init id) is as wrong as none.
            refused(old.grow(Some(&id), NEW), "exactly one may");
            let gid = (rank == 0).then(|| old.grow_id().unwrap());
            if let Some(gid) = &gid {
                // The spare learns the id out of band: here, a file.
                let tmp = handoff.with_extension("tmp");
                std::fs::write(&tmp, gid.to_hex()).unwrap();
                std::fs::rename(&tmp, &handoff).unwrap();
            }
            let grown = old.grow(gid.as_ref(), NEW).unwrap();
            // The old communicator is still whole.
            let mut x = vec![1u32; 100];
            old.all_reduce_in_place(&mut x, ReduceOp::Sum).unwrap();
            assert!(x.iter().all(|&v| v == OLD as u32));
            grown
        } else {
            let start = Instant::now();
            let hex = loop {
                if let Ok(h) = std::fs::read_to_string(&handoff) {
                    break h;
                }
                assert!(start.elapsed() < Duration::from_secs(30), "no id came");
                std::thread::sleep(Duration::from_millis(20));
            };
            Communicator::init(&UniqueId::from_hex(&hex).unwrap(), NEW, rank).unwrap()
        };
        assert_eq!((grown.rank(), grown.size()), (rank, NEW));
        let mut x = vec![rank as u64 + 1; 1 << 16];
        grown.all_reduce_in_place(&mut x, ReduceOp::Sum).unwrap();
        assert!(x.iter().all(|&v| v == 10), "{}", x[0]);
        println!("GROWN rank {rank} of {}", grown.size());
        return;
    }
    let handoff = std::env::temp_dir().join(format!("strata-grow-{}", std::process::id()));
    let _ = std::fs::remove_file(&handoff);
    let path = handoff.to_string_lossy().to_string();
    let ranks = spawn(
        name,
        NEW,
        NEW,
        &[("STRATA_TEST_HANDOFF", &path)],
        Duration::from_secs(60),
    );
    let _ = std::fs::remove_file(&handoff);
    assert_all_ok(&ranks);
    for (r, (_, out)) in ranks.iter().enumerate() {
        assert!(out.contains(&format!("GROWN rank {r} of {NEW}")), "{out}");
    }
}
