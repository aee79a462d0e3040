//! The cost model: prices schedules from α (seconds per message), β (seconds per byte) and γ
//! (seconds per reduced byte), given per ordered pair of ranks.
//!
//! Pricing runs every rank's schedule through the simulator's time-ordered engine. A transfer
//! starts when both ends have reached the step that holds it and the sender's send port and
//! the receiver's receive port are free (each rank sends one message and receives one at a
//! time, full duplex). It takes α + bytes·β; a reducing receive keeps the receiver busy for
//! bytes·γ more. A step ends when its last operation does; local copies are free, and local
//! reductions take bytes·γ each when their step starts. On a flat network this reproduces
//! the textbook closed forms ([`closed_form`]) exactly, and because α, β and γ are per pair,
//! the same function prices a schedule on a tiered fabric. The flow-level engines that price
//! a [`FabricModel`] (`fluid`, and the fast pricing checked against it) run a host's reducing
//! receive beside its data instead, as the runtime does ([`reduced_at`]).
//!
//! Contention: the messages that cross one shared uplink ([`Network::uplinks`]) in the same
//! step of their senders' schedules are counted from the schedules before timing; each such
//! message moves at no more than the uplink's bandwidth divided by that count. On a
//! [`FabricModel`] only oversubscribed uplinks are shared, since a full-bisection uplink
//! never carries more than its ranks can send.

use crate::hierarchy::Hierarchy;
use crate::schedule::{Collective, RankSchedule};
use crate::sim;
use crate::{Algorithm, algorithms_for};
use strata_topology::Tier;
use strata_topology::fabric::TierCosts;

/// The cost of sending from one rank to another.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LinkCost {
    /// Seconds per message (latency).
    pub alpha: f64,
    /// Seconds per byte (inverse bandwidth).
    pub beta: f64,
    /// Seconds per byte reduced at the receiver.
    pub gamma: f64,
    /// Whether a receive that reduces does so after its data rather than beside it
    /// ([`reduced_at`]): false on a host, true on GPUs.
    pub reduces_after_data: bool,
}

/// The piece a receive that reduces trails its data by: the runtime reduces what has arrived
/// as it arrives (a shared-memory slot, `STRATA_SHM_SLOT_SIZE`'s default, or what one socket
/// read returns), so the last piece is reduced after the last byte.
pub const REDUCE_PIECE_BYTES: f64 = 8192.0;

/// When a receive that reduces `bytes` over `link` is done, in the flow-level engines: its
/// data moves from `start` to `arrive`, and its receiver's reductions are free from `free`.
/// The runtime reduces each piece as it arrives, so the reduction runs beside the data and
/// ends after the later of the whole reduction (from when both data and receiver are there)
/// and one piece's after the last byte. A link that reduces after its data
/// (`reduces_after_data`, GPUs) starts the whole reduction at the last byte. A message of one
/// piece or less is reduced after it has arrived, as the step engine and the closed forms price
/// every reducing receive.
pub fn reduced_at(link: &LinkCost, bytes: f64, (start, arrive): (f64, f64), free: f64) -> f64 {
    if link.reduces_after_data {
        return arrive.max(free) + bytes * link.gamma;
    }
    let whole = start.max(free) + bytes * link.gamma;
    let last_piece = arrive.max(free) + bytes.min(REDUCE_PIECE_BYTES) * link.gamma;
    whole.max(last_piece)
}

/// A shared uplink on the path of a message.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Uplink {
    /// Which uplink (and direction): equal ids are the same link.
    pub id: u64,
    /// Seconds per byte of the whole uplink.
    pub seconds_per_byte: f64,
    /// The fraction of its rate that two or more flows sharing it get together.
    pub shared_efficiency: f64,
}

impl Uplink {
    /// Seconds per byte each of `flows` messages crossing it at once gets.
    pub fn shared_beta(&self, flows: u32) -> f64 {
        if flows <= 1 {
            self.seconds_per_byte
        } else {
            f64::from(flows) * self.seconds_per_byte / self.shared_efficiency
        }
    }
}

/// Link costs for every ordered pair of ranks, and the shared uplinks between them.
pub trait Network {
    /// The cost of a message from `from` to `to`.
    fn link(&self, from: usize, to: usize) -> LinkCost;

    /// The shared uplinks a message from `from` to `to` crosses, written into `out` (cleared
    /// first). The messages that cross an uplink at once share it. The default has none.
    fn uplinks(&self, from: usize, to: usize, out: &mut Vec<Uplink>) {
        let _ = (from, to);
        out.clear();
    }

    /// Whether a message from `from` to `to` leaves its host, sharing the ranks' network
    /// ports rather than their local ones. The default: every message does.
    fn crosses_hosts(&self, from: usize, to: usize) -> bool {
        let _ = (from, to);
        true
    }

    /// Seconds per byte a rank's local copies take (`r`'s own memory). The default: copies
    /// are free.
    fn copy_beta(&self, r: usize) -> f64 {
        let _ = r;
        0.0
    }

    /// Seconds a message of `bytes` from `from` to `to` pays before its copies overlap, on top
    /// of its latency ([`strata_topology::SlotFill`]). The default: nothing.
    fn fill_seconds(&self, from: usize, to: usize, bytes: f64) -> f64 {
        let _ = (from, to, bytes);
        0.0
    }

    /// The core rank `r` shares with other ranks of its host, where it shares one (an id
    /// unique in the job). Ranks on one core take turns: their copies through host memory
    /// share its copy rate, and their reductions run one at a time. The default: every rank
    /// has a core of its own.
    fn shared_core(&self, r: usize) -> Option<u32> {
        let _ = r;
        None
    }

    /// Seconds a message waits, after its latency, for a turn on a shared core: where a rank
    /// at either end shares its core ([`Network::shared_core`]) with a rank outside the message
    /// that has messages of its own in flight, the core runs that rank first. Priced by the
    /// flow-level engine only. The default: nothing.
    fn core_wait(&self) -> f64 {
        0.0
    }

    /// CPU seconds each end of a message from `from` to `to` spends on it (LogP's o): a
    /// rank's messages pay it one after another, and so do those of the ranks sharing its
    /// core ([`Network::shared_core`]). Priced by the flow-level engine only. The default:
    /// nothing.
    fn message_cpu(&self, from: usize, to: usize) -> f64 {
        let _ = (from, to);
        0.0
    }

    /// Whether schedules on this network are timed by flows sharing links over time
    /// (`fluid`) instead of step by step with sharers counted per step index. The default
    /// (step by step) is what the closed-form costs describe.
    fn flow_level(&self) -> bool {
        false
    }
}

/// The fabric of a communicator as the cost model sees it: α and β of the tier joining each
/// pair, γ from the reduction speed, and every group's uplink with capacity
/// `ranks in the group × bandwidth of the tier above ÷ its oversubscription`.
#[derive(Clone, Debug)]
pub struct FabricModel<'a> {
    /// Where the ranks sit.
    pub hierarchy: &'a Hierarchy,
    /// What each tier offers.
    pub costs: TierCosts,
    /// Per rank, the core it shares with other ranks, if it does ([`Network::shared_core`]);
    /// empty where no rank is known to share one.
    pub shared_cores: &'a [Option<u32>],
}

impl FabricModel<'_> {
    /// The α, β, γ of `tier`. On a host, a receive's reduction runs beside its data
    /// ([`reduced_at`]): the receiving core reduces each piece while the sending core copies
    /// the next. On GPUs ([`TierCosts::device_reductions`], or a fabric with an NVLink tier)
    /// it does not: the units that move a byte also reduce it, and pricing the two one after
    /// the other is what puts NCCL's ring on NVLink at its measured 365-370 GB/s of bus
    /// bandwidth (docs/topology.md).
    pub fn tier_cost(&self, tier: Tier) -> LinkCost {
        let l = self.costs.link(tier);
        let gamma = 1.0 / (self.costs.reduce_gbps * 1e9);
        LinkCost {
            alpha: l.latency_us * 1e-6,
            beta: 1.0 / (l.bandwidth_gbps * 1e9),
            gamma,
            reduces_after_data: self.costs.device_reductions || self.costs.nvlink.is_some(),
        }
    }
}

impl Network for FabricModel<'_> {
    fn link(&self, from: usize, to: usize) -> LinkCost {
        self.tier_cost(self.hierarchy.tier(from, to))
    }

    fn uplinks(&self, from: usize, to: usize, out: &mut Vec<Uplink>) {
        out.clear();
        self.hierarchy
            .for_each_uplink(from, to, |id, level, ranks| {
                let l = self.costs.link(self.hierarchy.level_tier(level));
                if l.oversubscription > 1.0 {
                    let bytes_per_s = ranks as f64 * l.bandwidth_gbps * 1e9 / l.oversubscription;
                    out.push(Uplink {
                        id,
                        seconds_per_byte: 1.0 / bytes_per_s,
                        shared_efficiency: l.shared_efficiency,
                    });
                }
            });
    }

    fn crosses_hosts(&self, from: usize, to: usize) -> bool {
        self.hierarchy.tier(from, to) > Tier::Host
    }

    fn copy_beta(&self, _: usize) -> f64 {
        self.costs.copy_gbps.map_or(0.0, |g| 1.0 / (g * 1e9))
    }

    fn fill_seconds(&self, from: usize, to: usize, bytes: f64) -> f64 {
        match self.costs.slot_fill {
            Some(f) if self.hierarchy.tier(from, to) <= Tier::Host => f.seconds(bytes),
            _ => 0.0,
        }
    }

    fn shared_core(&self, r: usize) -> Option<u32> {
        self.shared_cores.get(r).copied().flatten()
    }

    fn core_wait(&self) -> f64 {
        self.costs.core_wait_us * 1e-6
    }

    fn message_cpu(&self, from: usize, to: usize) -> f64 {
        self.costs.link(self.hierarchy.tier(from, to)).cpu_us * 1e-6
    }

    fn flow_level(&self) -> bool {
        true
    }
}

/// Every pair of ranks has the same link: the model of the closed forms.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Flat(pub LinkCost);

impl Network for Flat {
    fn link(&self, _: usize, _: usize) -> LinkCost {
        self.0
    }
}

impl<F: Fn(usize, usize) -> LinkCost> Network for F {
    fn link(&self, from: usize, to: usize) -> LinkCost {
        self(from, to)
    }
}

/// What a schedule costs.
#[derive(Clone, Debug, PartialEq)]
pub struct Estimate {
    /// Seconds until the last rank finishes.
    pub seconds: f64,
    /// Seconds until each rank finishes.
    pub per_rank: Vec<f64>,
}

/// Prices one schedule per rank, with elements of `elem_bytes` bytes.
pub fn price(
    schedules: &[RankSchedule],
    elem_bytes: usize,
    net: &dyn Network,
) -> Result<Estimate, String> {
    let per_rank = sim::time(schedules, net, elem_bytes as f64)?;
    let seconds = per_rank.iter().copied().fold(0.0, f64::max);
    Ok(Estimate { seconds, per_rank })
}

/// Builds and prices `algorithm` for `collective` on `nranks` ranks.
#[allow(clippy::too_many_arguments)]
pub fn price_algorithm(
    collective: Collective,
    algorithm: Algorithm,
    nranks: usize,
    count: usize,
    root: usize,
    chunk_elems: usize,
    elem_bytes: usize,
    net: &dyn Network,
) -> Result<Estimate, String> {
    let scheds = sim::schedules(collective, algorithm, nranks, count, root, chunk_elems)?;
    price(&scheds, elem_bytes, net)
}

/// Every algorithm for `collective`, cheapest first, with its estimated seconds: the
/// explanation behind a choice.
pub fn rank_algorithms(
    collective: Collective,
    nranks: usize,
    count: usize,
    chunk_elems: usize,
    elem_bytes: usize,
    net: &dyn Network,
) -> Vec<(Algorithm, f64)> {
    let mut out: Vec<(Algorithm, f64)> = algorithms_for(collective)
        .iter()
        .filter_map(|&a| {
            price_algorithm(
                collective,
                a,
                nranks,
                count,
                0,
                chunk_elems,
                elem_bytes,
                net,
            )
            .ok()
            .map(|e| (a, e.seconds))
        })
        .collect();
    out.sort_by(|a, b| a.1.total_cmp(&b.1));
    out
}

/// The closed forms of `REFERENCE.md` for an all-reduce of `n` bytes over `p` ranks on a
/// flat network (p a power of two, n divisible by p).
pub mod closed_form {
    use super::LinkCost;

    fn lg(p: usize) -> f64 {
        (p as f64).log2()
    }

    /// Recursive doubling: lg p·α + n·lg p·β + n·lg p·γ.
    pub fn recursive_doubling(p: usize, n: f64, l: LinkCost) -> f64 {
        lg(p) * l.alpha + n * lg(p) * l.beta + n * lg(p) * l.gamma
    }

    /// Rabenseifner: 2·lg p·α + 2n(p−1)/p·β + n(p−1)/p·γ.
    pub fn rabenseifner(p: usize, n: f64, l: LinkCost) -> f64 {
        let f = (p as f64 - 1.0) / p as f64;
        2.0 * lg(p) * l.alpha + 2.0 * n * f * l.beta + n * f * l.gamma
    }

    /// Ring: 2(p−1)·α + 2n(p−1)/p·β + n(p−1)/p·γ.
    pub fn ring(p: usize, n: f64, l: LinkCost) -> f64 {
        let f = (p as f64 - 1.0) / p as f64;
        2.0 * (p as f64 - 1.0) * l.alpha + 2.0 * n * f * l.beta + n * f * l.gamma
    }

    /// Binomial reduce + broadcast: 2·lg p·α + 2n·lg p·β + n·lg p·γ.
    pub fn binomial_reduce_broadcast(p: usize, n: f64, l: LinkCost) -> f64 {
        2.0 * lg(p) * l.alpha + 2.0 * n * lg(p) * l.beta + n * lg(p) * l.gamma
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LINK: LinkCost = LinkCost {
        alpha: 1.7e-6,
        beta: 1.0 / 12.5e9,
        gamma: 1.0 / 40e9,
        reduces_after_data: false,
    };

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-12 * a.abs().max(b.abs())
    }

    fn all_reduce(a: Algorithm, p: usize, elems: usize) -> f64 {
        price_algorithm(Collective::AllReduce, a, p, elems, 0, elems, 4, &Flat(LINK))
            .unwrap()
            .seconds
    }

    #[test]
    fn flat_network_reproduces_the_closed_forms() {
        for p in [2, 4, 8, 16, 64] {
            for elems in [p, 64 * p, 4096 * p] {
                let n = (elems * 4) as f64;
                let cases = [
                    (
                        Algorithm::RecursiveDoubling,
                        closed_form::recursive_doubling(p, n, LINK),
                    ),
                    (
                        Algorithm::Rabenseifner,
                        closed_form::rabenseifner(p, n, LINK),
                    ),
                    (Algorithm::Ring, closed_form::ring(p, n, LINK)),
                ];
                for (a, want) in cases {
                    let got = all_reduce(a, p, elems);
                    assert!(close(got, want), "{a} p={p} n={n}: {got} vs {want}");
                }
                // Binomial reduce then binomial broadcast, run back to back.
                let scheds: Vec<RankSchedule> = (0..p)
                    .map(|r| {
                        let mut s = crate::builders::binomial_reduce(p, r, elems, 0);
                        s.append(crate::builders::binomial_broadcast(p, r, elems, 0));
                        s
                    })
                    .collect();
                let got = price(&scheds, 4, &Flat(LINK)).unwrap().seconds;
                let want = closed_form::binomial_reduce_broadcast(p, n, LINK);
                assert!(close(got, want), "binomial p={p} n={n}: {got} vs {want}");
            }
        }
    }

    /// A receive that reduces beside its data ends one piece's reduction after its last
    /// byte, or its whole reduction after its first, whichever is later; what it cannot hide
    /// comes after. Hosts hide it all; GPUs (a fabric with NVLink) none of it.
    #[test]
    fn a_reduction_runs_beside_its_data_on_hosts_and_after_it_on_gpus() {
        let piece = REDUCE_PIECE_BYTES;
        let link = |gamma, reduces_after_data| LinkCost {
            alpha: 0.0,
            beta: 1e-9,
            gamma,
            reduces_after_data,
        };
        let bytes = 1e6;
        // Data 1 ms (from 1 to 1.001 s): the faster reduction ends a piece after it.
        let fast = link(1e-10, false);
        let t = reduced_at(&fast, bytes, (1.0, 1.001), 0.0);
        assert!((t - (1.001 + piece * 1e-10)).abs() < 1e-15, "{t}");
        // The slower one ends its whole reduction after the first byte.
        let slow = link(3e-9, false);
        let t = reduced_at(&slow, bytes, (1.0, 1.001), 0.0);
        assert!((t - 1.003).abs() < 1e-12, "{t}");
        // Nor before the receiver is free.
        let t = reduced_at(&slow, bytes, (1.0, 1.001), 1.5);
        assert!((t - 1.503).abs() < 1e-12, "{t}");
        // None of it hidden: after the data, as the step engine prices it.
        let serial = link(1e-10, true);
        let t = reduced_at(&serial, bytes, (1.0, 1.001), 0.0);
        assert!((t - (1.001 + bytes * 1e-10)).abs() < 1e-12, "{t}");
        // A message of one piece is reduced after it has arrived.
        let t = reduced_at(&fast, 1000.0, (1.0, 1.000001), 0.0);
        assert!((t - (1.000001 + 1000.0 * 1e-10)).abs() < 1e-15, "{t}");

        let h = Hierarchy::single_host(2);
        let host = FabricModel {
            hierarchy: &h,
            costs: TierCosts::default(),
            shared_cores: &[],
        };
        assert!(!host.link(0, 1).reduces_after_data);
        let gpus = FabricModel {
            costs: TierCosts {
                nvlink: Some(TierCosts::default().host),
                ..TierCosts::default()
            },
            ..host.clone()
        };
        assert!(gpus.link(0, 1).reduces_after_data);
        // GPUs without NVLink (one per host, or a file without the tier) reduce alike.
        let devices = FabricModel {
            costs: TierCosts {
                device_reductions: true,
                ..TierCosts::default()
            },
            ..host.clone()
        };
        assert!(devices.link(0, 1).reduces_after_data);
    }

    #[test]
    fn traffic_reports_steps_bytes_and_peers() {
        let s = crate::builders::composed_all_reduce(
            crate::ReduceScatterPart::Ring,
            crate::AllGatherPart::Ring,
            4,
            1,
            400,
        );
        let t = s.totals();
        assert_eq!(t.sent, 2 * 3 * 100);
        assert_eq!(t.received, 2 * 3 * 100);
        assert_eq!(t.reduced, 3 * 100);
        assert_eq!(t.messages, 6);
        let steps = s.traffic();
        assert_eq!(steps[0].sends, vec![(2, 100)]);
        assert_eq!(steps[0].recvs, vec![(0, 100)]);
        assert_eq!(steps[0].reduced, 100);
        let rd = crate::builders::recursive_doubling_all_reduce(8, 5, 10).totals();
        assert_eq!((rd.messages, rd.sent, rd.reduced), (3, 30, 30));
    }

    /// The step engine's ports take one message at a time, so one-shot's p − 1 messages go
    /// out one after another, and its p − 1 local reductions follow.
    #[test]
    fn one_shot_on_a_flat_network_sends_one_message_at_a_time() {
        for p in [2, 4, 8] {
            for elems in [1, 4096] {
                let (n, m) = ((elems * 4) as f64, (p - 1) as f64);
                let want = m * (LINK.alpha + n * LINK.beta) + m * n * LINK.gamma;
                let got = all_reduce(Algorithm::OneShot, p, elems);
                assert!(close(got, want), "p={p} n={n}: {got} vs {want}");
            }
        }
    }

    #[test]
    fn latency_and_bandwidth_regimes_pick_the_expected_algorithm() {
        let net = Flat(LINK);
        let small = rank_algorithms(Collective::AllReduce, 16, 2, 1 << 16, 4, &net);
        assert_eq!(small[0].0, Algorithm::RecursiveDoubling, "{small:?}");
        let large = rank_algorithms(Collective::AllReduce, 16, 16 << 20, 1 << 16, 4, &net);
        assert!(
            matches!(
                large[0].0,
                Algorithm::Rabenseifner | Algorithm::Ring | Algorithm::Composed(..)
            ),
            "{large:?}"
        );
        let rd = large
            .iter()
            .find(|(a, _)| *a == Algorithm::RecursiveDoubling)
            .unwrap();
        assert!(rd.1 > 2.0 * large[0].1, "{large:?}");
    }

    #[test]
    fn a_slow_pair_slows_exactly_the_schedules_that_use_it() {
        // Ranks 0-3 and 4-7 on two leaves; crossing costs 10x in β.
        let tiered = |a: usize, b: usize| LinkCost {
            beta: if a / 4 == b / 4 {
                LINK.beta
            } else {
                10.0 * LINK.beta
            },
            ..LINK
        };
        let flat = price_algorithm(
            Collective::AllGather,
            Algorithm::Ring,
            8,
            1 << 16,
            0,
            1,
            4,
            &Flat(LINK),
        )
        .unwrap()
        .seconds;
        let slow = price_algorithm(
            Collective::AllGather,
            Algorithm::Ring,
            8,
            1 << 16,
            0,
            1,
            4,
            &tiered,
        )
        .unwrap()
        .seconds;
        assert!(slow > 5.0 * flat, "{slow} vs {flat}");
    }
}
