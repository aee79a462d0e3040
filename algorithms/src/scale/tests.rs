//! Fast pricing's closed forms against its own engine, and what it refuses.

use super::*;
use crate::hierarchy::tests::fat_tree;
use crate::tuner::tests::emulated_costs;
use crate::{AllGatherPart, ReduceScatterPart};

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

/// Every position's whole schedule for `q`, in full and compact.
fn schedules(q: &Query) -> (Vec<RankSchedule>, Vec<Compact>) {
    let pricer = Pricer::new(q);
    let full: Vec<RankSchedule> = (0..q.hierarchy.len())
        .map(|x| pricer.build(x, q.count).unwrap())
        .collect();
    let compact = full
        .iter()
        .enumerate()
        .map(|(x, s)| Compact::new(s, x, &pricer.net))
        .collect();
    (full, compact)
}

/// Folded onto classes of alike ranks, a schedule times exactly as the full flow-level
/// simulation times every rank, on contended uplinks and with fan-in (trees, Bruck's
/// wrapped ranges): the folding is exact, not an approximation.
#[test]
fn folded_schedules_time_exactly_as_the_full_simulation() {
    let shapes = [
        fat_tree(2, 2, 4, 2, None),
        fat_tree(4, 2, 2, 1, None),
        fat_tree(1, 2, 3, 1, None),
        fat_tree(3, 2, 2, 1, None),
    ];
    for h in &shapes {
        for (c, a) in [
            (Collective::AllReduce, Algorithm::RecursiveDoubling),
            (Collective::AllReduce, Algorithm::Rabenseifner),
            (Collective::AllReduce, Algorithm::Tree),
            (
                Collective::AllReduce,
                Algorithm::Composed(ReduceScatterPart::Halving, AllGatherPart::Bruck),
            ),
            (
                Collective::AllReduce,
                Algorithm::Composed(ReduceScatterPart::Pairwise, AllGatherPart::Ring),
            ),
            (Collective::AllGather, Algorithm::Bruck),
            (Collective::AllToAll, Algorithm::Bruck),
            (Collective::Reduce, Algorithm::BinomialTree),
            (Collective::Broadcast, Algorithm::BinomialTree),
            // Every rank sends to the root at once: one class, many flows into one port.
            (Collective::Gather, Algorithm::Linear),
        ] {
            let mut q = query(h, emulated_costs(), a, 3 << 18);
            q.collective = c;
            q.root = h.len() / 3;
            let (full, compact) = schedules(&q);
            let pricer = Pricer::new(&q);
            let start = vec![0.0; h.len()];
            let folded = classes::fold(&compact, &pricer.net, &start, usize::MAX)
                .unwrap()
                .unwrap();
            let fast = quotient::time(&compact, &folded, 4.0, &start).unwrap();
            let reference = crate::fluid::time(&full, &pricer.net, 4.0).unwrap();
            for (x, (f, r)) in fast.iter().zip(&reference).enumerate() {
                assert!(
                    (f - r).abs() <= 1e-9 * r.abs().max(1e-12),
                    "{c} {a} on {} ranks, position {x}: folded {f}, full {r}",
                    h.len()
                );
            }
        }
    }
}

/// Ranks the fabric and the schedule cannot tell apart share a class: recursive doubling
/// on a regular fat tree in topology order is one class however many ranks it has; a
/// schedule that treats every rank differently is as many classes as ranks; and a limit on
/// classes is kept.
#[test]
fn alike_ranks_share_a_class() {
    let classes_of = |h: &Hierarchy, a: Algorithm, max: usize| {
        let q = query(h, emulated_costs(), a, 1 << 10);
        let (_, compact) = schedules(&q);
        let pricer = Pricer::new(&q);
        classes::fold(&compact, &pricer.net, &vec![0.0; h.len()], max)
            .unwrap()
            .map(|f| f.classes())
    };
    for h in [fat_tree(2, 2, 4, 2, None), fat_tree(8, 4, 4, 2, None)] {
        assert_eq!(
            classes_of(&h, Algorithm::RecursiveDoubling, usize::MAX),
            Some(1)
        );
    }
    let h = fat_tree(2, 2, 4, 2, None);
    // A tree's ranks sit at different depths of two different trees.
    let tree = classes_of(&h, Algorithm::Tree, usize::MAX).unwrap();
    assert!(tree > 4, "{tree} classes");
    assert_eq!(classes_of(&h, Algorithm::Tree, 4), None);
}

/// The coarse first round gives up on a fold only where full refinement would take more
/// classes than allowed, at every limit, and it does give up: Bruck's all-gather, whose ranks
/// all differ, at every limit below the rank count; trees and binomial broadcasts at some.
#[test]
fn the_coarse_round_gives_up_only_where_refinement_would() {
    let mut gave_up = 0;
    for h in [
        fat_tree(2, 2, 4, 2, None),
        fat_tree(4, 2, 2, 1, None),
        fat_tree(3, 2, 2, 1, None),
        fat_tree(2, 3, 5, 1, None),
    ] {
        for (c, a) in [
            (Collective::AllReduce, Algorithm::RecursiveDoubling),
            (Collective::AllReduce, Algorithm::Rabenseifner),
            (Collective::AllReduce, Algorithm::Tree),
            (Collective::AllGather, Algorithm::Bruck),
            (Collective::AllGather, Algorithm::RecursiveDoubling),
            (Collective::Broadcast, Algorithm::BinomialTree),
        ] {
            let mut q = query(&h, emulated_costs(), a, 3 << 12);
            q.collective = c;
            let (_, compact) = schedules(&q);
            let pricer = Pricer::new(&q);
            let start = vec![0.0; h.len()];
            let refined = classes::refined_classes(&compact, &start, &pricer.net);
            for max in 1..=h.len() {
                if classes::too_many_classes(&compact, &start, &pricer.net, max) {
                    gave_up += 1;
                    assert!(
                        refined > max,
                        "{c} {a} on {} ranks: gave up at {max} classes, refinement takes {refined}",
                        h.len()
                    );
                }
            }
        }
    }
    assert!(gave_up > 0, "the coarse round never gave up");
}

/// Recursive doubling step by step (what prices it above [`STEPWISE_DOUBLING_ABOVE`] ranks)
/// times it exactly as its schedule folded, which times it as the full simulation does:
/// oversubscribed leaf and pod uplinks, rank counts that are powers of two and counts whose
/// extra ranks fold, ranks placed out of order, the Meta-like fabric at 1,536 and 3,072
/// ranks, a small and a large message.
#[test]
fn doubling_step_by_step_times_as_the_folded_schedule() {
    let scattered: Vec<usize> = (0..96).map(|r| r * 5 % 96).collect();
    let mut shapes: Vec<(Hierarchy, TierCosts)> = [
        fat_tree(4, 2, 4, 2, None),
        fat_tree(8, 2, 12, 3, None),
        fat_tree(2, 4, 6, 1, None),
        fat_tree(8, 2, 3, 1, None),
        fat_tree(4, 2, 4, 3, Some(&scattered)),
    ]
    .into_iter()
    .map(|h| (h, emulated_costs()))
    .collect();
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/topology/meta-24k-h100.toml");
    let meta = strata_topology::fabric::load_file(&path).unwrap();
    for np in [1536, 3072] {
        let devices: Vec<usize> = (0..np).collect();
        shapes.push((Hierarchy::on_fabric(&meta, &devices), meta.tiers));
    }
    for (h, costs) in &shapes {
        for count in [2, 1 << 20] {
            let q = query(h, *costs, Algorithm::RecursiveDoubling, count);
            let mut folded = Pricer::new(&q);
            folded.whole().unwrap();
            let mut stepwise = Pricer::new(&q);
            stepwise.doubling_stepwise(count);
            let (x, y) = (folded.finish(), stepwise.finish());
            assert!(
                (y / x - 1.0).abs() < 1e-9,
                "{} ranks, {count} elements: folded {x}, step by step {y}",
                h.len()
            );
        }
    }
}

/// A recursive-doubling step timed once per pair gives exactly the times of the same step
/// timed message by message both ways, from uneven start times, on oversubscribed fat trees
/// and a scattered placement in launcher order (where a group holds both ends of the pairs
/// that leave it, so its up and down uplinks are each counted from both directions).
#[test]
fn a_pair_step_times_as_both_of_its_messages() {
    let scattered: Vec<usize> = (0..96).map(|r| r * 5 % 96).collect();
    for (h, ordered) in [
        (fat_tree(4, 2, 4, 2, None), true),
        (fat_tree(8, 2, 12, 3, None), true),
        (fat_tree(4, 2, 4, 3, Some(&scattered)), true),
        (fat_tree(4, 2, 4, 3, Some(&scattered)), false),
    ] {
        let mut q = query(&h, emulated_costs(), Algorithm::RecursiveDoubling, 1 << 16);
        q.ordered = ordered;
        let p = h.len();
        let fold = crate::builders::Fold::new(p);
        let mut pairs = Pricer::new(&q);
        pairs.free = (0..p).map(|x| (x * 7919 % 13) as f64 * 1e-6).collect();
        let mut both = Pricer::new(&q);
        both.free.clone_from(&pairs.free);
        let mut scratch = stepwise::StepScratch::new(h.uplink_count());
        let bytes = 4.0 * (1 << 16) as f64;
        let mut mask = 1;
        while mask < fold.pof2 {
            let ends = |u: usize| (fold.real(u), fold.real(u ^ mask));
            let pair_list: Vec<_> = (0..fold.pof2).filter(|u| u & mask == 0).map(ends).collect();
            let messages: Vec<_> = (0..fold.pof2)
                .map(|u| (ends(u).0, ends(u).1, bytes))
                .collect();
            pairs.pair_step(&pair_list, bytes, &mut scratch);
            both.exchange_step(&messages, true, &mut scratch);
            assert_eq!(pairs.free, both.free, "{p} ranks, mask {mask}");
            mask <<= 1;
        }
    }
}

/// Recursive doubling's lower bound stays at or below its price, whether folded (up to
/// 1,024 ranks) or step by step, from 8 B to 64 MiB, and is close to it where links are not
/// shared (one host).
#[test]
fn the_doubling_lower_bound_is_below_its_price() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/topology/meta-24k-h100.toml");
    let meta = strata_topology::fabric::load_file(&path).unwrap();
    let devices: Vec<usize> = (0..1536).collect();
    let scattered: Vec<usize> = (0..96).map(|r| r * 5 % 96).collect();
    let shapes = [
        (fat_tree(8, 2, 12, 3, None), emulated_costs()),
        (fat_tree(4, 2, 4, 3, Some(&scattered)), emulated_costs()),
        (Hierarchy::on_fabric(&meta, &devices), meta.tiers),
    ];
    for (h, costs) in &shapes {
        for count in [2, 1 << 14, 1 << 24] {
            let q = query(h, *costs, Algorithm::RecursiveDoubling, count);
            let bound = lower_bound(&q).expect("recursive doubling has one");
            let t = price(&q).unwrap();
            assert!(
                bound > 0.0 && bound <= t * (1.0 + 1e-12),
                "{} ranks, {count}: {bound} > {t}",
                h.len()
            );
        }
    }
    let h = Hierarchy::single_host(6);
    let q = query(
        &h,
        TierCosts::default(),
        Algorithm::RecursiveDoubling,
        1 << 20,
    );
    let (bound, t) = (lower_bound(&q).unwrap(), price(&q).unwrap());
    assert!(bound >= 0.99 * t, "one host: {bound} against {t}");
    assert!(lower_bound(&query(&h, TierCosts::default(), Algorithm::Ring, 8)).is_none());
}
