//! The tuner's tests.

use super::*;
use crate::HierPart;
use crate::hierarchy::tests::fat_tree;
use strata_topology::fabric::TierLink;

/// The emulated fat tree of `scripts/fattree.sh`: 1 Gbit/s host links, 2 hosts per leaf,
/// 500 Mbit/s leaf uplinks (4:1), 50 µs per message.
pub(crate) fn emulated_costs() -> TierCosts {
    let link = |oversubscription| TierLink {
        bandwidth_gbps: 0.125,
        latency_us: 50.0,
        oversubscription,
        shared_efficiency: 1.0,
        cpu_us: 0.0,
    };
    TierCosts {
        leaf: link(1.0),
        pod: link(4.0),
        aggregation: link(4.0),
        ..TierCosts::default()
    }
}

/// Items mapped on two threads come back in order, each mapped once.
#[test]
fn map_in_order_keeps_order_on_threads() {
    let calls = std::sync::atomic::AtomicUsize::new(0);
    let items: Vec<usize> = (0..100).collect();
    let out = map_in_order(&items, EXPLAIN_THREADS, |&x| {
        calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        x * x
    });
    assert_eq!(out, items.iter().map(|x| x * x).collect::<Vec<_>>());
    assert_eq!(calls.into_inner(), 100);
    assert_eq!(map_in_order(&items[..1], 8, |&x| x + 1), vec![1]);
    assert!(map_in_order(&items[..0], 2, |&x| x).is_empty());
}

fn scattered() -> Vec<usize> {
    (0..8).map(|r| (r % 4) * 2 + r / 4).collect()
}

#[test]
fn a_ring_the_runtime_slices_wins_a_near_tie() {
    let h = Hierarchy::single_host(4);
    let plain = Tuner::new(h.clone(), TierCosts::default(), true);
    let sliced = plain
        .clone_with_rules(Vec::new())
        .with_ring_pipeline(4 << 20, 4);
    let big = 64 << 20;
    // The model alone prefers recursive halving/doubling by a few latencies.
    let e = plain.explain(Collective::AllReduce, big);
    assert_ne!(e.chosen, Algorithm::Ring);
    let ring = |e: &Explanation| {
        let t = |a| {
            e.ranked
                .iter()
                .find(|p| p.algorithm == a)
                .unwrap()
                .seconds
                .clone()
        };
        t(Algorithm::Ring).unwrap() / t(e.ranked[0].algorithm).unwrap()
    };
    assert!(ring(&e) <= 1.0 + SLICED_RING_TOLERANCE, "{}", e.render());
    let e = sliced.explain(Collective::AllReduce, big);
    assert_eq!(e.chosen, Algorithm::Ring);
    assert!(e.reason.contains("slice by slice"), "{}", e.reason);
    assert_eq!(sliced.choose(Collective::AllReduce, big), Algorithm::Ring);
    // Blocks that fit the budget are not sliced: the model's choice stands; so does a
    // rule's, and other collectives are untouched.
    let small = 1 << 20;
    assert_eq!(
        sliced.explain(Collective::AllReduce, small).chosen,
        plain.explain(Collective::AllReduce, small).chosen
    );
    let ruled = sliced.clone_with_rules(vec![Rule {
        collective: Collective::AllReduce,
        min_bytes: 0,
        max_bytes: usize::MAX,
        algorithm: Algorithm::Tree,
    }]);
    assert_eq!(ruled.choose(Collective::AllReduce, big), Algorithm::Tree);
    assert_eq!(
        sliced.explain(Collective::AllGather, big).chosen,
        plain.explain(Collective::AllGather, big).chosen
    );
}

#[test]
fn contention_makes_a_blind_ring_twice_as_slow_on_scattered_ranks() {
    let h = fat_tree(1, 2, 4, 1, Some(&scattered()));
    let blind = Tuner::new(h.clone(), emulated_costs(), false);
    let ordered = Tuner::new(h, emulated_costs(), true);
    let bytes = 64 << 20;
    let t = |tu: &Tuner, a: Algorithm| {
        let e = tu.explain(Collective::AllReduce, bytes);
        let p = e.ranked.iter().find(|p| p.algorithm == a).unwrap().clone();
        (p.seconds.unwrap(), p.max_sharing.unwrap())
    };
    let (blind_ring, blind_share) = t(&blind, Algorithm::Ring);
    let (ordered_ring, ordered_share) = t(&ordered, Algorithm::Ring);
    // Every blind hop leaves its leaf: two flows per uplink; ordered, one.
    assert_eq!((blind_share, ordered_share), (2, 1));
    let ratio = blind_ring / ordered_ring;
    assert!((1.9..2.1).contains(&ratio), "{ratio}");
    // Hierarchical all-reduce moves 1.5n across each uplink instead of the ring's 1.75n,
    // but its phases inside the leaves come on top: (0.5n + 0.5n)/125 MB/s.
    let (hier, hier_share) = t(&ordered, Algorithm::Hierarchical(HierPart::Ring));
    assert_eq!(hier_share, 2, "two rails share each uplink");
    let n = bytes as f64;
    let want = 1.5 * n / 62.5e6 + n / 125e6;
    assert!((hier / want - 1.0).abs() < 0.01, "{hier} vs {want}");
    let e = ordered.explain(Collective::AllReduce, bytes);
    assert_eq!(e.chosen, e.ranked[0].algorithm);
    assert_eq!(ordered.choose(Collective::AllReduce, bytes), e.chosen);
    let chosen = e.ranked[0].seconds.clone().unwrap();
    assert!(blind_ring / chosen >= 1.9, "{}", e.render());
    assert!(e.render().contains("choice:"), "{}", e.render());
}

#[test]
fn small_messages_choose_few_steps_and_choices_are_cached_per_class() {
    let h = fat_tree(1, 2, 4, 1, Some(&scattered()));
    let tu = Tuner::new(h, emulated_costs(), true);
    let small = tu.explain(Collective::AllReduce, 8);
    let best = small.ranked[0].clone();
    assert!(best.steps.unwrap() <= 6, "{}", small.render());
    assert_eq!(tu.choose(Collective::AllReduce, 5), best.algorithm);
    assert_eq!(tu.choose(Collective::AllReduce, 8), best.algorithm);
    assert_eq!(tu.cache.lock().unwrap().len(), 1);
    assert_eq!((size_class(0), size_class(8), size_class(9)), (0, 3, 4));
}

/// On one host the flow-level model sends one-shot's messages side by side: one latency
/// instead of lg p. It wins small all-reduces, loses large ones to its (p − 1)-fold
/// traffic, and is refused, with the reason, above its rank limit.
#[test]
fn one_shot_wins_small_all_reduces_on_a_few_ranks_only() {
    let on_host = |p| Tuner::new(Hierarchy::single_host(p), TierCosts::default(), false);
    for p in [3, 4, 8] {
        let tu = on_host(p);
        let small = tu.explain(Collective::AllReduce, 8);
        assert_eq!(small.chosen, Algorithm::OneShot, "{}", small.render());
        let large = tu.explain(Collective::AllReduce, 64 << 20);
        assert_ne!(large.chosen, Algorithm::OneShot, "{}", large.render());
    }
    let nine = on_host(9).explain(Collective::AllReduce, 8);
    assert_ne!(nine.chosen, Algorithm::OneShot);
    let refused = nine
        .ranked
        .iter()
        .find(|p| p.algorithm == Algorithm::OneShot)
        .unwrap();
    let why = refused.seconds.clone().unwrap_err();
    assert!(why.contains("at most 8 ranks, not 9"), "{why}");
}

#[test]
fn rules_override_prices_and_irregular_hierarchies_skip_hierarchical_algorithms() {
    let h = fat_tree(1, 2, 4, 1, None);
    let tu = Tuner::new(h, emulated_costs(), true).with_rules(vec![Rule {
        collective: Collective::AllReduce,
        min_bytes: 0,
        max_bytes: 1024,
        algorithm: Algorithm::Tree,
    }]);
    assert_eq!(tu.choose(Collective::AllReduce, 1000), Algorithm::Tree);
    assert!(
        tu.explain(Collective::AllReduce, 10)
            .reason
            .contains("tuning file")
    );
    assert_ne!(tu.choose(Collective::AllReduce, 1 << 20), Algorithm::Tree);
    let keys: Vec<Vec<String>> = [0, 0, 1].iter().map(|h| vec![format!("h{h}")]).collect();
    let k = keys.clone();
    let h = Hierarchy::from_keys(&keys, move |a, b| {
        if k[a] == k[b] {
            strata_topology::Tier::Host
        } else {
            strata_topology::Tier::Leaf
        }
    });
    let e = Tuner::new(h, TierCosts::default(), true).explain(Collective::AllReduce, 1 << 20);
    let hier = e
        .ranked
        .iter()
        .find(|p| p.algorithm.is_hierarchical())
        .unwrap();
    assert!(hier.seconds.is_err());
    assert!(e.ranked.last().unwrap().seconds.is_err());
    assert!(!e.chosen.is_hierarchical());
}

/// Above [`RUNTIME_PRICING_MAX_RANKS`] the first call of a size class prices recursive
/// doubling (step by step), so a small all-reduce at scale gets a latency-bound algorithm
/// rather than a ring of thousands of steps, and leaves a ring of fewer elements than
/// ranks (O(p²) to price) unpriced; a large one prices the rings again.
#[test]
fn at_scale_the_first_call_prices_recursive_doubling_and_not_sparse_rings() {
    let h = fat_tree(8, 4, 16, 4, None);
    assert!(h.len() > RUNTIME_PRICING_MAX_RANKS);
    let t = Tuner::new(h, emulated_costs(), true);
    let priced = |e: &Explanation, a: Algorithm| {
        e.ranked
            .iter()
            .find(|p| p.algorithm == a)
            .is_some_and(|p| p.seconds.is_ok())
    };
    let small = t.decide(Collective::AllReduce, 8, false);
    assert_eq!(
        small.chosen,
        Algorithm::RecursiveDoubling,
        "{}",
        small.render()
    );
    assert!(!priced(&small, Algorithm::Ring));
    assert!(!priced(&small, Algorithm::Tree));
    let large = t.decide(Collective::AllReduce, 64 << 20, false);
    assert!(priced(&large, Algorithm::Ring), "{}", large.render());
    // Recursive doubling's own messages alone outlast the ring: not priced, and said so.
    let rd = large
        .ranked
        .iter()
        .find(|p| p.algorithm == Algorithm::RecursiveDoubling)
        .expect("listed");
    let why = rd.seconds.as_ref().expect_err("ruled out by its bound");
    assert!(why.contains("own messages alone"), "{why}");
    let bound = t
        .lower_bound(
            Collective::AllReduce,
            Algorithm::RecursiveDoubling,
            64 << 20,
        )
        .expect("recursive doubling has a bound");
    let full = t.price(
        Collective::AllReduce,
        Algorithm::RecursiveDoubling,
        64 << 20,
    );
    assert!(bound <= *full.seconds.as_ref().expect("priced"));
    // So pricing it in full would not have changed the choice.
    let chosen = large.ranked.first().expect("something priced");
    assert_eq!(chosen.algorithm, large.chosen);
    assert!(*chosen.seconds.as_ref().expect("priced") < bound);
    assert_eq!(
        t.choose(Collective::AllReduce, 8),
        Algorithm::RecursiveDoubling
    );
}

/// The fullest host is found whatever the nesting: one host, hosts under leaves, one rank
/// per host.
#[test]
fn fullest_host_counts_the_ranks_that_share_a_hosts_caches() {
    assert_eq!(fullest_host(&Hierarchy::single_host(3)), 3);
    assert_eq!(fullest_host(&Hierarchy::single_host(1)), 1);
    assert_eq!(fullest_host(&fat_tree(4, 2, 2, 1, None)), 4);
    assert_eq!(fullest_host(&fat_tree(1, 2, 4, 1, None)), 1);
    // Hosts of 3 and 1 ranks.
    let keys: Vec<Vec<String>> = ["a", "a", "b", "a"]
        .iter()
        .map(|h| vec![h.to_string()])
        .collect();
    let k = keys.clone();
    let h = Hierarchy::from_keys(
        &keys,
        |x, y| {
            if k[x] == k[y] { Tier::Host } else { Tier::Leaf }
        },
    );
    assert_eq!(fullest_host(&h), 3);
}

/// Costs with local copies at 10 GB/s, without and with caches that end at 16 MiB (5 GB/s
/// more per byte beyond).
fn with_and_without_a_cache() -> (TierCosts, TierCosts) {
    let plain = TierCosts {
        copy_gbps: Some(10.0),
        ..TierCosts::default()
    };
    let cached = TierCosts {
        memory: Some(strata_topology::MemoryTier {
            cache_mib: 16.0,
            miss_gbps: 5.0,
        }),
        ..plain
    };
    (plain, cached)
}

/// With `memory`, a call whose buffers outgrow the caches is priced as the share beyond
/// them costs more per byte; one that fits, and a model without `memory`, are unchanged.
#[test]
fn buffers_beyond_the_cache_cost_their_miss_rate() {
    let (plain, cached) = with_and_without_a_cache();
    let two = |c| Tuner::new(Hierarchy::single_host(2), c, false);
    let (a, b) = (two(plain), two(cached));
    let price = |t: &Tuner, bytes| {
        t.price(Collective::AllReduce, Algorithm::Ring, bytes)
            .seconds
            .unwrap()
    };
    // 2 ranks × (input + output) of 2 MiB = 8 MiB: in cache.
    assert_eq!(price(&a, 2 << 20), price(&b, 2 << 20));
    // 64 MiB: 256 MiB of buffers, 15/16 of them beyond the cache.
    let miss = 1.0 - 16.0 / 256.0;
    let slower = b.costs_for(Collective::AllReduce, 64 << 20);
    let want = 1.0 / (1.0 / plain.host.bandwidth_gbps + miss / 5.0);
    assert!(
        (slower.host.bandwidth_gbps - want).abs() < 1e-12,
        "{slower:?}"
    );
    assert!(slower.memory.is_none() && slower.copy_gbps.unwrap() < 10.0);
    let ratio = price(&b, 64 << 20) / price(&a, 64 << 20);
    assert!(ratio > 1.5 && ratio < 5.0, "{ratio}");
    // An all-gather's output is every rank's input: 8 ranks of 1 MiB each hold 8 × 9 MiB.
    let eight = Tuner::new(Hierarchy::single_host(8), cached, false);
    let g = eight.costs_for(Collective::AllGather, 1 << 20);
    assert!(g.host.bandwidth_gbps < plain.host.bandwidth_gbps);
    assert_eq!(
        eight.costs_for(Collective::AllGather, 64 << 10).host,
        plain.host
    );
}

/// One-shot's scratch (a slot per rank) takes cache as the buffers do: where it pushes the
/// working set past the caches, one-shot pays the miss rate. With the slots uncounted and
/// every reduction priced after its data, one-shot of 2-64 MiB at 2 ranks was priced at
/// 0.73-0.74 of its time on the 2-core VM (`collbench calibrate --np 2`); with both mended
/// ([`crate::cost::reduced_at`]), at 0.89-1.04 of the same times.
#[test]
fn one_shots_scratch_counts_in_the_working_set() {
    let (plain, cached) = with_and_without_a_cache();
    let two = |c| Tuner::new(Hierarchy::single_host(2), c, false);
    let (a, b) = (two(plain), two(cached));
    let price = |t: &Tuner, alg, bytes| t.price(Collective::AllReduce, alg, bytes).seconds.unwrap();
    // 3 MiB: 2 ranks × (input + output) = 12 MiB fits; with one-shot's 2 slots, 24 does not.
    let bytes = 3 << 20;
    assert_eq!(b.costs_for(Collective::AllReduce, bytes).host, plain.host);
    let ratio = price(&b, Algorithm::OneShot, bytes) / price(&a, Algorithm::OneShot, bytes);
    assert!(ratio > 1.1, "{ratio}");
    let with_slots = b.costs_with_scratch(Collective::AllReduce, bytes, 2 * bytes);
    assert!(with_slots.host.bandwidth_gbps < plain.host.bandwidth_gbps);
    // 1 MiB: 8 MiB with the slots, in cache.
    assert_eq!(
        price(&a, Algorithm::OneShot, 1 << 20),
        price(&b, Algorithm::OneShot, 1 << 20)
    );
}

/// A call of no elements moves only its headers, all at once: one exchange with the
/// schedule's peers and ring neighbours, the same for every algorithm, where a call of one
/// element walks its steps. At 3 ranks on 2 cores `collbench --op all_gather -b 8` (no
/// element per rank) took 2.9-3.3 µs under ring, rd and bruck alike, and 12 B (one) 3.8-8.2.
#[test]
fn calls_of_no_elements_cost_one_exchange_of_headers() {
    let costs = TierCosts::default();
    let tu = Tuner::new(Hierarchy::single_host(3), costs, false);
    let one_exchange = (costs.host.latency_us + costs.call_us) * 1e-6;
    for c in [
        Collective::AllGather,
        Collective::ReduceScatter,
        Collective::AllReduce,
    ] {
        for &a in algorithms_for(c) {
            let Ok(one) = tu.price(c, a, PRICE_ELEM_BYTES).seconds else {
                continue;
            };
            let zero = tu.price(c, a, 0).seconds.unwrap();
            assert!(
                (zero - one_exchange).abs() < 1e-12,
                "{c} {a}: {zero} s, not one exchange ({one_exchange} s)"
            );
            assert!(
                zero < one,
                "{c} {a}: {zero} s against {one} s for one element"
            );
        }
    }
    let two = headers_only(
        &sim::schedules_on(
            Collective::AllGather,
            Algorithm::Ring,
            &Hierarchy::single_host(4),
            false,
            0,
            0,
            1,
        )
        .unwrap(),
    );
    assert!(two.iter().all(|s| s.steps.len() == 1));
    assert_eq!(two[0].send_peers(), vec![1, 3], "both ring neighbours");
    assert_eq!(two[0].recv_peers(), vec![1, 3]);
}

/// A message inside a host pays its first slot's bytes once more; one between hosts does not.
#[test]
fn a_message_inside_a_host_pays_its_first_slot() {
    let fill = strata_topology::SlotFill {
        slot_kib: 8.0,
        gbps: 4.0,
    };
    let with = TierCosts {
        slot_fill: Some(fill),
        ..TierCosts::default()
    };
    let price = |h: Hierarchy, c: TierCosts, bytes| {
        Tuner::new(h, c, false)
            .price(Collective::AllGather, Algorithm::Ring, bytes)
            .seconds
            .unwrap()
    };
    // Two ranks on one host: one message of the rank's block.
    for (bytes, paid) in [(1024usize, 1024.0), (64 << 10, 8192.0)] {
        let extra = price(Hierarchy::single_host(2), with, bytes)
            - price(Hierarchy::single_host(2), TierCosts::default(), bytes);
        let want = paid / 4e9;
        assert!(
            (extra - want).abs() < 1e-12,
            "{bytes} B: {extra} s, not {want}"
        );
    }
    // Two hosts: the leaf carries it, and the slot is the host's.
    let two_hosts = || fat_tree(1, 2, 1, 1, None);
    assert_eq!(
        price(two_hosts(), with, 1024),
        price(two_hosts(), TierCosts::default(), 1024)
    );
}

/// A trial's algorithms are the choice and then those priced within NEAR_TIE of it, at most
/// TRIAL_MAX, in price order: the cheapest of each distinct price (within PRICED_ALIKE) first,
/// then the cheapest of the rest; a rule has none.
#[test]
fn rivals_are_distinct_prices_first_within_the_near_tie_and_at_most_four() {
    let (mut saw_four, mut saw_skipped) = (false, false);
    for (p, bytes) in [2usize, 4, 6]
        .into_iter()
        .flat_map(|p| [8usize, 4 << 10, 256 << 10, 16 << 20].map(|b| (p, b)))
    {
        let tu = Tuner::new(Hierarchy::single_host(p), TierCosts::default(), false);
        let choice = tu.choose_with_rivals(Collective::AllReduce, bytes);
        let e = tu.explain(Collective::AllReduce, bytes);
        let price = |a: Algorithm| {
            let p = e.ranked.iter().find(|r| r.algorithm == a).unwrap();
            *p.seconds.as_ref().unwrap()
        };
        let all: Vec<Algorithm> = choice.all().collect();
        let what = format!("{p} ranks, {bytes} B: {all:?}");
        assert_eq!(all[0], e.chosen);
        assert_eq!(all.len(), choice.len());
        assert!(choice.len() <= TRIAL_MAX);
        let limit = price(e.chosen) * (1.0 + NEAR_TIE);
        for w in all.windows(2) {
            assert!(price(w[0]) <= price(w[1]), "{what}");
        }
        assert!(all.iter().all(|&a| price(a) <= limit), "{what}");
        let within: Vec<f64> = e
            .ranked
            .iter()
            .filter_map(|r| r.seconds.as_ref().ok().copied())
            .filter(|t| *t <= limit)
            .collect();
        // As many as fit; every distinct price represented while there is room.
        let same = |a: f64, b: f64| (a - b).abs() <= PRICED_ALIKE * b;
        let distinct = |ts: &[f64]| {
            let mut d: Vec<f64> = Vec::new();
            for &t in ts {
                if d.iter().all(|&v| !same(t, v)) {
                    d.push(t);
                }
            }
            d.len()
        };
        assert_eq!(choice.len(), within.len().min(TRIAL_MAX), "{what}");
        let taken: Vec<f64> = all.iter().map(|&a| price(a)).collect();
        assert_eq!(distinct(&taken), distinct(&within).min(TRIAL_MAX), "{what}");
        saw_four |= choice.len() == TRIAL_MAX;
        // Where the cheapest four would have repeated a price and left another out.
        let cheapest: Vec<f64> = within.iter().copied().take(TRIAL_MAX).collect();
        saw_skipped |= distinct(&cheapest) < distinct(&taken);
    }
    assert!(
        saw_four,
        "the premise: some size has four or more near ties"
    );
    assert!(
        saw_skipped,
        "the premise: somewhere the cheapest four repeat a price (tree, hier_tree on one host)"
    );
    let tu = Tuner::new(Hierarchy::single_host(4), TierCosts::default(), false);
    let ruled = tu.clone_with_rules(vec![Rule {
        collective: Collective::AllReduce,
        min_bytes: 0,
        max_bytes: usize::MAX,
        algorithm: Algorithm::Ring,
    }]);
    let c = ruled.choose_with_rivals(Collective::AllReduce, 8);
    assert_eq!((c.chosen(), c.len()), (Algorithm::Ring, 1));
}

/// The step executor's own cost is charged to every call but the small all-reduces, which
/// skip it: at 2 ranks on the EPYC VM a reduce-scatter of 8 B (one message each way, walked
/// step by step) took 0.46-0.49 µs and a one-shot or rd all-reduce of 8 B 0.22.
#[test]
fn the_small_all_reduce_path_skips_the_executors_cost() {
    let plain = TierCosts::default();
    let walked = TierCosts {
        schedule_us: 0.25,
        ..plain
    };
    for p in [2, 4, 6] {
        let (a, b) = (
            Tuner::new(Hierarchy::single_host(p), plain, false),
            Tuner::new(Hierarchy::single_host(p), walked, false),
        );
        for (c, algo, bytes) in [
            (Collective::AllReduce, Algorithm::OneShot, 8),
            (Collective::AllReduce, Algorithm::RecursiveDoubling, 4096),
            (Collective::AllReduce, Algorithm::RecursiveDoubling, 8192),
            (Collective::AllReduce, Algorithm::Ring, 8),
            (Collective::ReduceScatter, Algorithm::Ring, 8),
            (Collective::AllGather, Algorithm::RecursiveDoubling, 0),
        ] {
            let extra =
                b.price(c, algo, bytes).seconds.unwrap() - a.price(c, algo, bytes).seconds.unwrap();
            let small = algo.takes_small_path(c, p, bytes);
            let want = if small { 0.0 } else { 0.25e-6 };
            assert!(
                (extra - want).abs() < 1e-15,
                "{p} ranks, {c} {algo} {bytes} B: {extra}"
            );
        }
    }
    assert!(Algorithm::OneShot.takes_small_path(Collective::AllReduce, 6, 8));
    assert!(!Algorithm::RecursiveDoubling.takes_small_path(Collective::AllReduce, 6, 8));
    assert!(Algorithm::RecursiveDoubling.takes_small_path(Collective::AllReduce, 4, 4096));
    assert!(!Algorithm::RecursiveDoubling.takes_small_path(Collective::AllReduce, 4, 4097));
    assert!(!Algorithm::OneShot.takes_small_path(Collective::AllReduce, 9, 8));
    assert!(!Algorithm::OneShot.takes_small_path(Collective::AllReduce, 2, 0));
    assert!(!Algorithm::RecursiveDoubling.takes_small_path(Collective::AllGather, 2, 8));
}
