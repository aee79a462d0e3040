//! Fast pricing's closed forms against its own engine, and what it refuses.

use super::*;
use crate::hierarchy::tests::fat_tree;
use crate::tuner::tests::emulated_costs;

fn query(h: &Hierarchy, costs: TierCosts, algorithm: Algorithm, count: usize) -> Query<'_> {
    Query {
        hierarchy: h,
        costs,
        ordered: true,
        collective: Collective::AllReduce,
        algorithm,
        count,
        elem_bytes: 4,
        root: 0,
        chunk_elems: 1 << 17,
    }
}

/// The closed form of a pairwise exchange (used above 2,048 ranks) against the step by step
/// one, on a fat tree whose leaf and pod uplinks are oversubscribed.
#[test]
fn pairwise_closed_form_matches_step_by_step() {
    for (per_host, hosts, leaves, pods) in [(4, 2, 4, 2), (8, 2, 12, 3), (2, 4, 6, 1)] {
        let h = fat_tree(per_host, hosts, leaves, pods, None);
        for total in [64 * h.len(), 1 << 22] {
            let q = query(&h, emulated_costs(), Algorithm::Pairwise, 0);
            let mut a = Pricer::new(&q);
            a.pairwise_stepwise(total);
            let mut b = Pricer::new(&q);
            b.pairwise_closed(total);
            let (x, y) = (a.finish(), b.finish());
            assert!(
                (y / x - 1.0).abs() < 0.01,
                "{} ranks, {total}: {x} vs {y}",
                h.len()
            );
        }
    }
}

/// The closed form of ring phases against the same phases run message by message on the
/// engine, with contended uplinks.
#[test]
fn ring_closed_form_matches_the_engine() {
    let h = fat_tree(2, 2, 4, 2, None);
    let q = query(&h, emulated_costs(), Algorithm::Ring, 1 << 20);
    let group = (0..h.len()).collect::<Vec<_>>();
    let len = vec![1 << 20; h.len()];
    for reduces in [true, false] {
        let mut closed = Pricer::new(&q);
        closed
            .ring(std::slice::from_ref(&group), &len, reduces)
            .unwrap();
        let mut engine = Pricer::new(&q);
        engine
            .materialized(std::slice::from_ref(&group), &len, |d, me, n| {
                let blocks = Blocks::split(Buf::Output, 0, n, d);
                let mut s = RankSchedule::default();
                if reduces {
                    let input = Blocks::split(Buf::Input, 0, n, d);
                    builders::ring_reduce_scatter_core(
                        &mut s,
                        d,
                        me,
                        input,
                        builders::Partials::In(blocks),
                        blocks.one(me),
                    );
                } else {
                    builders::ring_all_gather_core(&mut s, d, me, blocks.one(me), blocks);
                }
                s
            })
            .unwrap();
        let (x, y) = (engine.finish(), closed.finish());
        assert!((y / x - 1.0).abs() < 0.01, "reduces={reduces}: {x} vs {y}");
    }
}

#[test]
fn refuses_what_it_cannot_price_and_prices_one_rank_at_zero() {
    let h = fat_tree(1, 2, 3, 1, None);
    // Six ranks, one per host: hierarchical schedules run; an unsupported pair does not.
    let mut q = query(&h, emulated_costs(), Algorithm::Bruck, 1024);
    assert!(price(&q).unwrap_err().contains("bruck"));
    q.collective = Collective::AllGather;
    assert!(price(&q).unwrap() > 0.0);
    let one = Hierarchy::single_host(1);
    assert_eq!(
        price(&query(&one, emulated_costs(), Algorithm::Ring, 8)),
        Ok(0.0)
    );
}
