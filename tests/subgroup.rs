//! Sub-communicators made by their members alone (`Communicator::subgroup`, what PyTorch's
//! `new_group` uses): ranks as threads of one process, over the in-process transport and over
//! TCP through the parent's listener.

use std::time::{Duration, Instant};
use strata::{Communicator, Error, ReduceOp, TransportPolicy};

mod in_process;
use in_process::*;

/// Groups [3, 1] (in that order) and [0, 2, 4] of 5 ranks, rank 4 making its group 300 ms
/// after the others: each member all-gathers its parent rank and all-reduces it.
fn two_groups_from_their_members(transport: TransportPolicy) {
    let comms = init_threads(5, transport);
    let out = on_all(&comms, |comm| {
        let r = comm.rank();
        let (members, tag): (&[usize], &str) = if r % 2 == 1 {
            (&[3, 1], "odd")
        } else {
            (&[0, 2, 4], "even")
        };
        if r == 4 {
            std::thread::sleep(Duration::from_millis(300));
        }
        let sub = comm.subgroup(members, tag).unwrap();
        let mut all = vec![0u64; sub.size()];
        sub.all_gather(&[r as u64], &mut all).unwrap();
        let mut sum = [r as u64];
        sub.all_reduce_in_place(&mut sum, ReduceOp::Sum).unwrap();
        // The parent still works beside its children.
        let mut total = [1u64];
        comm.all_reduce_in_place(&mut total, ReduceOp::Sum).unwrap();
        (sub.rank(), all, sum[0], total[0])
    });
    assert_eq!(
        out,
        vec![
            (0, vec![0, 2, 4], 6, 5),
            (1, vec![3, 1], 4, 5),
            (1, vec![0, 2, 4], 6, 5),
            (0, vec![3, 1], 4, 5),
            (2, vec![0, 2, 4], 6, 5),
        ]
    );
}

#[test]
fn subgroups_made_by_their_members_alone_compute_in_their_own_rank_order() {
    two_groups_from_their_members(TransportPolicy::Auto);
}

#[test]
fn subgroups_connect_over_tcp_through_the_parents_listener() {
    two_groups_from_their_members(TransportPolicy::Tcp);
}

#[test]
fn a_subgroup_keeps_working_after_its_parent_is_gone() {
    let comms = init_threads(3, TransportPolicy::Tcp);
    let subs = on_all(&comms, |c| c.subgroup(&[0, 1, 2], "all").unwrap());
    drop(comms);
    let sums = on_all(&subs, |s| {
        let mut v = [s.rank() as u64 + 1];
        s.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
        v[0]
    });
    assert_eq!(sums, vec![6, 6, 6]);
}

#[test]
fn bad_member_lists_and_a_reused_tag_are_refused_with_the_reason() {
    let comms = init_threads(3, TransportPolicy::Tcp);
    let c = &comms[1];
    let invalid = |r: strata::Result<Communicator>| match r {
        Err(Error::InvalidArgument(m)) => m,
        Err(e) => panic!("not an invalid argument: {e}"),
        Ok(_) => panic!("accepted"),
    };
    assert!(invalid(c.subgroup(&[0, 2], "x")).contains("not among"));
    assert!(invalid(c.subgroup(&[1, 1], "x")).contains("distinct"));
    assert!(invalid(c.subgroup(&[1, 3], "x")).contains("below 3"));
    let first = c.subgroup(&[1], "solo").unwrap();
    assert!(invalid(c.subgroup(&[1], "solo")).contains("served already"));
    drop(first);
    // Once the first is gone, its tag is free again.
    let again = c.subgroup(&[1], "solo").unwrap();
    assert_eq!((again.rank(), again.size()), (0, 1));
}

#[test]
fn members_that_disagree_on_the_list_fail_their_first_call_instead_of_mixing_ranks() {
    let comms = init_threads_configured(loopback_id(), 2, |_| {
        let mut c = cfg(TransportPolicy::Tcp);
        c.handshake_timeout = Duration::from_secs(1);
        c.timeout = Duration::from_secs(2);
        c
    });
    let started = Instant::now();
    let results = on_all(&comms, |comm| {
        let members: &[usize] = if comm.rank() == 0 { &[0, 1] } else { &[1, 0] };
        let sub = comm.subgroup(members, "g").unwrap();
        let mut v = [1u64];
        sub.all_reduce_in_place(&mut v, ReduceOp::Sum)
            .map(|_| v[0])
            .map_err(|e| e.to_string())
    });
    for (r, res) in results.iter().enumerate() {
        assert!(
            res.is_err(),
            "rank {r} computed {res:?} with a table its peer does not share"
        );
        println!("rank {r}: {}", res.as_ref().unwrap_err());
    }
    assert!(started.elapsed() < Duration::from_secs(30));
}

#[test]
fn a_member_that_destroys_its_subgroup_at_once_is_no_fault_of_the_others() {
    let comms = init_threads(3, TransportPolicy::Tcp);
    let errors = on_all(&comms, |comm| {
        let sub = comm.subgroup(&[0, 1, 2], "brief").unwrap();
        if comm.rank() == 0 {
            // Gone before the others' watchdog links to it arrive.
            drop(sub);
            return None;
        }
        std::thread::sleep(Duration::from_millis(500));
        sub.async_error().map(|e| e.to_string())
    });
    assert_eq!(errors, vec![None, None, None]);
}
