//! Fast pricing: what a schedule costs on a fabric of tens of thousands of ranks, without the
//! flow-level simulation of every message.
//!
//! The full simulation (`crate::cost::price` on a [`FabricModel`]) is the reference; it
//! shares every link by time and costs O(messages × flows in flight). This module prices the
//! same schedules in these ways, each checked against it (`tests/fast_pricing.rs`, 1% for
//! every algorithm up to 1,024 ranks, contended uplinks and irregular shapes included):
//!
//! * **Flows on classes of alike ranks** ([`classes`], [`quotient`]): a schedule that can be
//!   built is folded onto one representative per class of ranks that the fabric and the
//!   schedule cannot tell apart (colour refinement), and timed by the full simulation's own
//!   rule, each flow standing for its class's alike flows on the ports and uplinks they
//!   share. That is exact; it costs what the classes cost, so recursive doubling on a
//!   regular fat tree is one class at any size, and a tree whose every rank differs is as
//!   dear as the full simulation (bounded by [`FOLD_MAX_CLASSES`] and [`FOLD_MAX_WORK`]).
//! * **Ring phases in closed form.** In a ring reduce-scatter or all-gather every step moves
//!   the same pattern (member i to member i + 1), so the phase takes `(d − 1) × W` after its
//!   group's last member starts, where W is the slowest member's step (its send, or its
//!   receive plus the reduction) with the uplink sharing of one step. This is the longest path
//!   of the max-plus recurrence, which stays at the slowest member; it costs O(p) however many
//!   steps the ring has, instead of O(p²) messages. Members that enter at different times
//!   overlap otherwise, so up to [`FLOW_PHASE_MAX_RANKS`] such a phase is built and folded.
//! * **Pairwise phases**: built and folded up to [`FLOW_PHASE_MAX_RANKS`] ranks; step by step
//!   on a vector of entry times up to [`PAIRWISE_STEPWISE_MAX`], O(p) per step; beyond, in
//!   closed form with every rank in step: each step's slowest message, over the most
//!   expensive tier or the most shared uplink.
//! * **What folds into too many classes** on a lean max-plus engine ([`lockstep`]): every
//!   operation of every rank timed once, ports shared by processor sharing among a step's
//!   messages, shared uplinks among the messages that overlap on them (iterated to a fixed
//!   point). That is an approximation (a few percent where ranks drift apart on contended
//!   uplinks). Up to the 1,024 ranks the tests reach, only phases of over a million transfers
//!   and rings or chains whose ranks all differ use it (those do not settle within
//!   [`classes::MAX_ROUNDS_AT_SCALE`] rounds above [`FLOW_PHASE_MAX_RANKS`] ranks); beyond,
//!   trees and Bruck too.
//!
//! One-shot all-reduces, on a few ranks only, are priced by the full simulation itself.
//!
//! Pipelined trees are priced with enough chunks to reach their steady state and extended
//! linearly to the real chunk count. Composed all-reduces up to [`FLOW_PHASE_MAX_RANKS`] are
//! built whole (their halves overlap where ranks finish the first at different times); above,
//! they and hierarchical algorithms are cut into phases, each starting from the times the
//! previous one ended at (a vector over ranks), so a hierarchical all-reduce at 24,576 ranks
//! prices its 191-step pod rings in closed form and its halving and tree phases folded.

mod classes;
mod compact;
mod groups;
mod lockstep;
mod quotient;
mod sharing;
mod stepwise;

pub use groups::{GroupQuery, price_groups};

use lockstep::Compact;

use strata_topology::Tier;
use strata_topology::fabric::TierCosts;

use crate::builders::{self, Blocks, block, hier};
use crate::cost::{FabricModel, Network, Uplink, reduced_at};
use crate::hierarchy::Hierarchy;
use crate::schedule::{Buf, Collective, RankSchedule};
use crate::{Algorithm, AllGatherPart, HierPart, Plan, PlanError, ReduceScatterPart, plan_on};

/// Most transfers fast pricing holds for one phase (8 bytes each); above it a phase is
/// refused rather than filling memory.
pub const MAX_MATERIALIZED_OPS: usize = 24_000_000;

/// Most transfers a phase may hold to be timed by flows on its classes of alike ranks.
pub const FOLD_MAX_TRANSFERS: usize = 1_000_000;

/// Most classes of alike ranks a phase may fold into to be timed by flows.
pub const FOLD_MAX_CLASSES: usize = 1024;

/// Most (transfers of the representatives × classes) a folded phase may hold to be timed by
/// flows: a flow-level simulation costs about that many steps of max-min sharing (a double
/// binary tree on 1,024 ranks that fold into 1,024 classes, 4 × 10⁸: a few tenths of a
/// second).
pub const FOLD_MAX_WORK: usize = 500_000_000;

/// Up to this many ranks, phases that cost O(p²) transfers to build (a pairwise exchange,
/// a ring whose members enter at different times) are built and timed by flows.
pub const FLOW_PHASE_MAX_RANKS: usize = 256;

/// Above this many ranks a recursive-doubling all-reduce is priced step by step on the
/// vector of times (O(p lg p), milliseconds at 24,576 ranks, and equal to its folded schedule
/// in the tests) instead of built and folded (O(p lg p) transfers to build and refine:
/// 0.18 s at 24,576).
pub const STEPWISE_DOUBLING_ABOVE: usize = 1024;

/// Up to this many ranks a pairwise exchange is priced step by step (O(p²)); beyond, in
/// closed form.
pub const PAIRWISE_STEPWISE_MAX: usize = 2048;

/// One pricing question: a collective, an algorithm and a buffer on a communicator.
#[derive(Clone, Copy, Debug)]
pub struct Query<'a> {
    /// Where the ranks sit.
    pub hierarchy: &'a Hierarchy,
    /// What each tier costs.
    pub costs: TierCosts,
    /// Whether flat schedules run in topology order.
    pub ordered: bool,
    /// The collective.
    pub collective: Collective,
    /// The algorithm.
    pub algorithm: Algorithm,
    /// Elements per rank.
    pub count: usize,
    /// Bytes per element.
    pub elem_bytes: usize,
    /// Root (rooted collectives).
    pub root: usize,
    /// Pipeline chunk, elements.
    pub chunk_elems: usize,
}

/// Predicted seconds until the last rank finishes `q`, priced as the module documentation
/// says.
pub fn price(q: &Query) -> Result<f64, String> {
    let p = q.hierarchy.len();
    let algorithm = q.algorithm.normalized();
    if !algorithm.supports(q.collective) {
        return Err(PlanError::Unsupported(q.collective, algorithm).to_string());
    }
    algorithm.check_ranks(p).map_err(|e| e.to_string())?;
    if algorithm == Algorithm::OneShot {
        // A few ranks at most: the full simulation costs no more than a shortcut would, and
        // it times the local reductions that the lean engines leave out.
        let net = FabricModel {
            hierarchy: q.hierarchy,
            costs: q.costs,
            shared_cores: &[],
        };
        let scheds = crate::sim::schedules_on(
            q.collective,
            algorithm,
            q.hierarchy,
            q.ordered,
            q.count,
            q.root,
            q.chunk_elems,
        )?;
        return Ok(crate::cost::price(&scheds, q.elem_bytes, &net)?.seconds);
    }
    let mut pricer = Pricer::new(q);
    if p <= 1 {
        return Ok(0.0);
    }
    match (q.collective, algorithm) {
        (Collective::AllReduce, Algorithm::Hierarchical(part)) => pricer.hier_all_reduce(part)?,
        (Collective::AllReduce, Algorithm::Ring) => {
            let g = [pricer.flat_group()];
            let step = pricer.ring_step(&g);
            pricer.ring_with(&g, &step, &vec![q.count; p], true)?;
            pricer.ring_with(&g, &step, &vec![q.count; p], false)?;
        }
        // Small enough to build whole: its halves overlap where ranks finish the first at
        // different times, which pricing them one after the other would miss.
        (Collective::AllReduce, Algorithm::Composed(..)) if p <= FLOW_PHASE_MAX_RANKS => {
            pricer.whole()?
        }
        (Collective::AllReduce, Algorithm::Composed(rs, ag)) => pricer.composed(rs, ag)?,
        (Collective::AllGather, Algorithm::Ring) => {
            let g = pricer.flat_group();
            pricer.ring(&[g], &vec![q.count * p; p], false)?;
        }
        (Collective::ReduceScatter, Algorithm::Ring) => {
            let g = pricer.flat_group();
            pricer.ring(&[g], &vec![q.count * p; p], true)?;
        }
        (Collective::ReduceScatter, Algorithm::Pairwise) => {
            pricer.pairwise(q.count * p)?;
        }
        (Collective::AllReduce, Algorithm::RecursiveDoubling) if p > STEPWISE_DOUBLING_ABOVE => {
            pricer.doubling_stepwise(q.count)
        }
        (c, a) if is_pipelined(c, a) => pricer.pipelined()?,
        _ => pricer.whole()?,
    }
    Ok(pricer.finish())
}

/// Whether [`price`] prices `algorithm` for `collective` as a pipeline of chunks (a double
/// binary tree all-reduce, a chain broadcast): on the engine with every chunk of every rank,
/// the dearest pricing at scale.
pub fn is_pipelined(collective: Collective, algorithm: Algorithm) -> bool {
    matches!(
        (collective, algorithm.normalized()),
        (Collective::AllReduce, Algorithm::Tree) | (Collective::Broadcast, Algorithm::Chain)
    )
}

/// A time below which [`price`] cannot come for `q`, found in O(lg p), where one is known:
/// for a recursive-doubling all-reduce, one rank's own messages alone, each at its link's
/// α + bytes·β plus its reduction, with no sharing and no waiting on peers. Above
/// [`crate::tuner::RUNTIME_PRICING_MAX_RANKS`] ranks the tuner's first call skips pricing
/// recursive doubling when this already exceeds what it priced.
pub fn lower_bound(q: &Query) -> Option<f64> {
    match (q.collective, q.algorithm.normalized()) {
        (Collective::AllReduce, Algorithm::RecursiveDoubling) => {
            let bytes = q.count as f64 * q.elem_bytes as f64;
            let p = q.hierarchy.len();
            Some(if p > 1 {
                stepwise::doubling_own_messages(&Positions::for_query(q), p, bytes)
            } else {
                0.0
            })
        }
        _ => None,
    }
}

/// One step of ring phases: per member (groups concatenated), its link to the next member
/// and its slowest uplink share (0 when it crosses none).
struct RingStep {
    links: Vec<crate::cost::LinkCost>,
    uplink_beta: Vec<f64>,
}

/// Where a flat schedule's members sit: topology positions (`order`) or launcher ranks.
struct Positions<'a> {
    net: FabricModel<'a>,
    order: Option<&'a [usize]>,
    /// The α, β, γ of every tier, by `Tier as usize`.
    tier_cost: [crate::cost::LinkCost; 6],
}

impl<'a> Positions<'a> {
    /// Where `q`'s schedules place their members: topology order for flat schedules that
    /// run in it and for hierarchical ones (built over real ranks, their groups over
    /// positions), launcher ranks otherwise.
    fn for_query(q: &Query<'a>) -> Self {
        let h = q.hierarchy;
        let flat_topo = q.ordered
            && !h.is_launcher_order()
            && (matches!(
                q.collective,
                Collective::AllReduce | Collective::Broadcast | Collective::Reduce
            ) || (matches!(
                q.collective,
                Collective::AllGather | Collective::ReduceScatter
            ) && q.algorithm.normalized() == Algorithm::Ring));
        let topo = flat_topo || q.algorithm.is_hierarchical();
        let net = FabricModel {
            hierarchy: h,
            costs: q.costs,
            shared_cores: &[],
        };
        let tier_cost = [
            Tier::SameDevice,
            Tier::NvLink,
            Tier::Host,
            Tier::Leaf,
            Tier::Pod,
            Tier::Aggregation,
        ]
        .map(|t| net.tier_cost(t));
        Self {
            net,
            order: topo.then(|| h.order()),
            tier_cost,
        }
    }

    fn real(&self, x: usize) -> usize {
        self.order.map_or(x, |o| o[x])
    }
}

impl Network for Positions<'_> {
    fn link(&self, from: usize, to: usize) -> crate::cost::LinkCost {
        let tier = self.net.hierarchy.tier(self.real(from), self.real(to));
        self.tier_cost[tier as usize]
    }
    fn uplinks(&self, from: usize, to: usize, out: &mut Vec<Uplink>) {
        self.net.uplinks(self.real(from), self.real(to), out)
    }
    fn crosses_hosts(&self, from: usize, to: usize) -> bool {
        self.net.crosses_hosts(self.real(from), self.real(to))
    }
}

/// The running state of one pricing: when each member (by position) is free.
struct Pricer<'a> {
    q: Query<'a>,
    net: Positions<'a>,
    /// Whether positions are the topology order (else launcher ranks).
    topo: bool,
    free: Vec<f64>,
    /// A phase of this pricing did not fold (too many classes or flows): later phases of
    /// the same shape (a pipelined tree's second run) go straight to the lock-step engine.
    fold_declined: bool,
}

impl<'a> Pricer<'a> {
    fn new(q: &Query<'a>) -> Self {
        let net = Positions::for_query(q);
        Self {
            q: *q,
            topo: net.order.is_some(),
            net,
            free: vec![0.0; q.hierarchy.len()],
            fold_declined: false,
        }
    }

    fn finish(&self) -> f64 {
        self.free.iter().copied().fold(0.0, f64::max)
    }

    fn p(&self) -> usize {
        self.q.hierarchy.len()
    }

    /// Every member, in the order flat schedules use.
    fn flat_group(&self) -> Vec<usize> {
        (0..self.p()).collect()
    }

    fn root_position(&self) -> usize {
        if self.topo && self.q.collective.rooted() {
            self.q.hierarchy.position(self.q.root)
        } else {
            self.q.root
        }
    }

    /// Ring reduce-scatter (`reduces`) or all-gather phases over `groups` at once; the member
    /// at position x holds `len[x]` elements in all, split into d blocks.
    fn ring<G: AsRef<[usize]>>(
        &mut self,
        groups: &[G],
        len: &[usize],
        reduces: bool,
    ) -> Result<(), String> {
        let step = self.ring_step(groups);
        self.ring_with(groups, &step, len, reduces)
    }

    /// One step of ring phases over `groups` at once: each member's link to the next, and
    /// its slowest share of the shared uplinks it crosses (most cross none). The same for
    /// every step and for both halves of an all-reduce, so it is computed once.
    fn ring_step<G: AsRef<[usize]>>(&self, groups: &[G]) -> RingStep {
        let h = self.q.hierarchy;
        // Messages on each uplink, by dense index.
        let mut sharing = vec![0u32; h.uplink_count()];
        let members = groups.iter().map(|g| g.as_ref().len()).sum();
        let mut links = Vec::with_capacity(members);
        let mut crossing: Vec<(usize, usize, Uplink)> = Vec::with_capacity(members);
        let mut ups = Vec::new();
        for g in groups.iter().map(AsRef::as_ref) {
            for (i, &x) in g.iter().enumerate() {
                let y = g[(i + 1) % g.len()];
                links.push(self.net.link(x, y));
                self.net.uplinks(x, y, &mut ups);
                for u in &ups {
                    let at = h.uplink_index(u.id);
                    sharing[at] += 1;
                    crossing.push((links.len() - 1, at, *u));
                }
            }
        }
        let mut uplink_beta = vec![0.0f64; links.len()];
        for (k, at, u) in &crossing {
            let b = u.shared_beta(sharing[*at]);
            uplink_beta[*k] = uplink_beta[*k].max(b);
        }
        RingStep { links, uplink_beta }
    }

    /// [`Pricer::ring`] with its step already known. When some block is empty its steps are
    /// skipped, which the closed form cannot express, and when members enter at different
    /// times they overlap differently than it assumes: such a phase runs on the engine (if
    /// it is small enough to build; uneven entries up to [`FLOW_PHASE_MAX_RANKS`] ranks).
    fn ring_with<G: AsRef<[usize]>>(
        &mut self,
        groups: &[G],
        step: &RingStep,
        len: &[usize],
        reduces: bool,
    ) -> Result<(), String> {
        let uneven = |g: &[usize]| {
            g.iter().any(|&x| len[x] < g.len())
                || (self.p() <= FLOW_PHASE_MAX_RANKS
                    && g.iter().any(|&x| self.free[x] != self.free[g[0]]))
        };
        if groups.iter().map(AsRef::as_ref).any(uneven) {
            return self.materialized(groups, len, |d, me, n| {
                let blocks = Blocks::split(Buf::Output, 0, n, d);
                let mut s = RankSchedule::default();
                if reduces {
                    let input = Blocks::split(Buf::Input, 0, n, d);
                    let partials = builders::Partials::In(blocks);
                    builders::ring_reduce_scatter_core(
                        &mut s,
                        d,
                        me,
                        input,
                        partials,
                        blocks.one(me),
                    );
                } else {
                    builders::ring_all_gather_core(&mut s, d, me, blocks.one(me), blocks);
                }
                s
            });
        }
        let eb = self.q.elem_bytes as f64;
        let mut k = 0;
        for g in groups.iter().map(AsRef::as_ref) {
            let d = g.len();
            let mut w: f64 = 0.0;
            for &x in g {
                let link = step.links[k];
                let beta = link.beta.max(step.uplink_beta[k]);
                k += 1;
                let bytes = len[x].div_ceil(d) as f64 * eb;
                let send = link.alpha + bytes * beta;
                let recv = if reduces {
                    reduced_at(&link, bytes, (link.alpha, send), 0.0)
                } else {
                    send
                };
                // Member i's step holds its send; member i + 1's, its receive from i.
                w = w.max(send).max(recv);
            }
            if d < 2 {
                continue;
            }
            let start = g.iter().map(|&x| self.free[x]).fold(0.0, f64::max);
            for &x in g {
                self.free[x] = start + (d - 1) as f64 * w;
            }
        }
        Ok(())
    }

    /// Pairwise-exchange reduce-scatter over all ranks of `total` elements split into p
    /// blocks (empty blocks are not sent): built and run on the engine up to
    /// [`FLOW_PHASE_MAX_RANKS`] ranks, step by step up to [`PAIRWISE_STEPWISE_MAX`], in
    /// closed form beyond (topology order only).
    fn pairwise(&mut self, total: usize) -> Result<(), String> {
        let p = self.p();
        if p <= FLOW_PHASE_MAX_RANKS {
            let input = Blocks::split(Buf::Input, 0, total, p);
            let out = Blocks::split(Buf::Output, 0, total, p);
            let scheds = self.compact(|x| {
                let mut s = RankSchedule::default();
                builders::pairwise_reduce_scatter_core(&mut s, p, x, input, out.one(x));
                Ok(s)
            })?;
            self.run(&scheds)
        } else if p <= PAIRWISE_STEPWISE_MAX {
            self.pairwise_stepwise(total);
            Ok(())
        } else if self.topo || self.q.hierarchy.is_launcher_order() {
            self.pairwise_closed(total);
            Ok(())
        } else {
            Err(format!(
                "not priced above {PAIRWISE_STEPWISE_MAX} ranks in launcher order: a pairwise \
                 exchange costs O(p²) to price there"
            ))
        }
    }

    /// Prices schedules (one per position) from the current times: by flows on their
    /// classes of alike ranks ([`classes`], [`quotient`]) when they hold at most
    /// [`FOLD_MAX_TRANSFERS`] transfers and fold into at most [`FOLD_MAX_CLASSES`] classes
    /// whose flows are few enough to time ([`FOLD_MAX_WORK`]), else on the lock-step engine.
    fn run(&mut self, scheds: &[Compact]) -> Result<(), String> {
        let eb = self.q.elem_bytes as f64;
        let total: usize = scheds.iter().map(Compact::len).sum();
        if total <= FOLD_MAX_TRANSFERS && !self.fold_declined {
            if let Some(folded) = classes::fold(scheds, &self.net, &self.free, FOLD_MAX_CLASSES)? {
                let flows: usize = folded.reps.iter().map(|&r| scheds[r].len()).sum();
                if flows.saturating_mul(folded.classes()) <= FOLD_MAX_WORK {
                    self.free = quotient::time(scheds, &folded, eb, &self.free)?;
                    return Ok(());
                }
            }
            self.fold_declined = true;
        }
        self.free = lockstep::time(scheds, &self.net, eb, &self.free)?;
        Ok(())
    }

    /// Builds every position's schedule with `build(x)`, keeping only what timing needs, and
    /// refuses once they hold more than [`MAX_MATERIALIZED_OPS`] transfers.
    fn compact(
        &self,
        mut build: impl FnMut(usize) -> Result<RankSchedule, String>,
    ) -> Result<Vec<Compact>, String> {
        let p = self.p();
        let mut out = Vec::with_capacity(p);
        let mut total = 0usize;
        for x in 0..p {
            let c = Compact::new(&build(x)?, x, &self.net);
            total += c.len();
            if total > MAX_MATERIALIZED_OPS
                || (x == 0 && c.len().saturating_mul(p) > 2 * MAX_MATERIALIZED_OPS)
            {
                return Err(too_big(c.len().saturating_mul(p)));
            }
            out.push(c);
        }
        Ok(out)
    }

    /// Builds position `x`'s whole schedule for the query at `count` elements.
    fn build(&self, x: usize, count: usize) -> Result<RankSchedule, String> {
        let q = &self.q;
        if let Algorithm::Hierarchical(part) = q.algorithm.normalized() {
            let r = q.hierarchy.order()[x];
            let h = q.hierarchy;
            // Timing sees transfers only: leave out each rank's p copies into and out of
            // rail order, O(p²) for the communicator.
            let unordered: Option<hier::RailBuilder> = match q.collective {
                Collective::AllGather => Some(hier::all_gather_with),
                Collective::ReduceScatter => Some(hier::reduce_scatter_with),
                _ => None,
            };
            if let Some(build) = unordered {
                let mut s = build(h, part, r, count, hier::RailCopies::Omit).ok_or_else(|| {
                    PlanError::NotHierarchical(q.algorithm, h.describe()).to_string()
                })?;
                s.map_peers(|r| h.position(r));
                return Ok(s);
            }
            let mut s = plan_on(
                &Plan {
                    collective: q.collective,
                    algorithm: q.algorithm,
                    nranks: self.p(),
                    rank: r,
                    count,
                    root: q.root,
                    chunk_elems: q.chunk_elems,
                },
                q.hierarchy,
                true,
            )
            .map_err(|e| e.to_string())?;
            let pos = |r: usize| q.hierarchy.position(r);
            s.map_peers(pos);
            return Ok(s);
        }
        builders::build(
            q.collective,
            q.algorithm.normalized(),
            self.p(),
            x,
            count,
            self.root_position(),
            q.chunk_elems.max(1),
        )
        .ok_or_else(|| PlanError::Unsupported(q.collective, q.algorithm).to_string())
    }

    /// The whole schedule on the engine, refused early when it would be too big.
    fn whole(&mut self) -> Result<(), String> {
        self.whole_at(self.q.count)
    }

    fn whole_at(&mut self, count: usize) -> Result<(), String> {
        let scheds = self.compact(|x| self.build(x, count))?;
        self.run(&scheds)
    }

    /// A schedule pipelined in chunks (double binary tree, chain): once its pipeline is full
    /// every further chunk adds the same time (in a steady state that repeats every one, two
    /// or four chunks), so it is priced on the engine with enough chunks to fill the pipeline
    /// and extended linearly. Whole chunks are taken off the front, so the last, partial
    /// chunk stays as it is.
    fn pipelined(&mut self) -> Result<(), String> {
        const PERIOD: usize = 4;
        let q = self.q;
        let chunk = q.chunk_elems.max(1);
        // Pipelines side by side: the tree runs one per half of the buffer.
        let lanes = if q.collective == Collective::AllReduce {
            2
        } else {
            1
        };
        let chunks = block(q.count, lanes, 0).1.div_ceil(chunk);
        let fill = 4 * prev_log2(self.p()) + 8;
        if chunks <= fill + 2 * PERIOD {
            return self.whole();
        }
        // Price with `fill .. fill + PERIOD` chunks, aligned so that the chunks left out are
        // a whole number of periods.
        let left_out = (chunks - fill) / PERIOD * PERIOD;
        let start = self.free.clone();
        self.whole_at(q.count - left_out * lanes * chunk)?;
        let long = self.finish();
        self.free.clone_from(&start);
        self.whole_at(q.count - (left_out + PERIOD) * lanes * chunk)?;
        let short = self.finish();
        let total = long + (left_out / PERIOD) as f64 * (long - short);
        self.free.iter_mut().for_each(|t| *t = total);
        Ok(())
    }

    /// A reduce-scatter then an all-gather over the same blocks: ring and pairwise halves
    /// priced as phases, the others on the engine.
    fn composed(&mut self, rs: ReduceScatterPart, ag: AllGatherPart) -> Result<(), String> {
        let (p, n) = (self.p(), self.q.count);
        match rs {
            ReduceScatterPart::Ring => self.ring(&[self.flat_group()], &vec![n; p], true)?,
            ReduceScatterPart::Pairwise => self.pairwise(n)?,
            ReduceScatterPart::Halving => {
                let input = Blocks::split(Buf::Input, 0, n, p);
                let out = Blocks::split(Buf::Output, 0, n, p);
                let scheds = self.compact(|x| {
                    let mut s = RankSchedule::default();
                    builders::halving_reduce_scatter_core(&mut s, p, x, input, out, out.one(x));
                    Ok(s)
                })?;
                self.run(&scheds)?;
            }
        }
        match ag {
            AllGatherPart::Ring => self.ring(&[self.flat_group()], &vec![n; p], false)?,
            AllGatherPart::Doubling | AllGatherPart::Bruck => {
                let out = Blocks::split(Buf::Output, 0, n, p);
                let core = if ag == AllGatherPart::Doubling {
                    builders::doubling_all_gather_core
                } else {
                    builders::bruck_all_gather_core
                };
                let scheds = self.compact(|x| {
                    let mut s = RankSchedule::default();
                    core(&mut s, p, x, out.one(x), out);
                    Ok(s)
                })?;
                self.run(&scheds)?;
            }
        }
        Ok(())
    }

    /// The hierarchical all-reduce of `crate::builders::hier`, level by level.
    fn hier_all_reduce(&mut self, part: HierPart) -> Result<(), String> {
        let h = self.q.hierarchy;
        let algorithm = Algorithm::Hierarchical(part);
        let dims: Vec<usize> = h
            .dims()
            .ok_or_else(|| PlanError::NotHierarchical(algorithm, h.describe()).to_string())?
            .iter()
            .map(|d| d.0)
            .collect();
        let p = self.p();
        let m = dims.len();
        if m == 0 {
            return Ok(());
        }
        let mut stride = vec![1; m];
        for l in 1..m {
            stride[l] = stride[l - 1] * dims[l - 1];
        }
        let coord = |x: usize, l: usize| (x / stride[l]) % dims[l];
        // Every level's groups, laid end to end (a group is `dims[l]` consecutive entries).
        let members: Vec<Vec<usize>> = (0..m)
            .map(|l| {
                let (d, step) = (dims[l], stride[l]);
                let mut all = Vec::with_capacity(p);
                for base in (0..p).filter(|&x| coord(x, l) == 0) {
                    all.extend((0..d).map(|k| base + k * step));
                }
                all
            })
            .collect();
        let level_groups: Vec<Vec<&[usize]>> = members
            .iter()
            .zip(&dims)
            .map(|(all, &d)| all.chunks(d).collect())
            .collect();
        // Ring levels' steps, each shared by the level's reduce-scatter and all-gather.
        let steps: Vec<Option<RingStep>> = level_groups
            .iter()
            .enumerate()
            .map(|(l, gs)| {
                let rings = match part {
                    HierPart::Rhd => false,
                    HierPart::Tree => l + 1 < m,
                    HierPart::Ring => true,
                };
                rings.then(|| self.ring_step(gs))
            })
            .collect();
        // Elements each position holds entering level l (its shard of the levels below).
        let mut len = vec![self.q.count; p];
        let mut shards = Vec::with_capacity(m);
        for (l, &d_l) in dims.iter().enumerate().take(m - 1) {
            let gs = &level_groups[l];
            match &steps[l] {
                Some(step) => self.ring_with(gs, step, &len, true)?,
                None => self.materialized(gs, &len, |d, me, n| {
                    let input = Blocks::split(Buf::Input, 0, n, d);
                    let acc = Blocks::split(Buf::Output, 0, n, d);
                    let mut s = RankSchedule::default();
                    builders::halving_reduce_scatter_core(&mut s, d, me, input, acc, acc.one(me));
                    s
                })?,
            }
            shards.push(len.clone());
            for (x, n) in len.iter_mut().enumerate() {
                *n = block(*n, d_l, coord(x, l)).1;
            }
        }
        let top = &level_groups[m - 1];
        let chunk = self.q.chunk_elems.max(1);
        match (part, &steps[m - 1]) {
            (HierPart::Ring, Some(step)) => {
                self.ring_with(top, step, &len, true)?;
                self.ring_with(top, step, &len, false)?;
            }
            (HierPart::Tree, _) => self.materialized(top, &len, |d, me, n| {
                builders::double_binary_tree_all_reduce(d, me, n, chunk)
            })?,
            _ => self.materialized(top, &len, builders::rabenseifner_all_reduce)?,
        }
        for l in (0..m - 1).rev() {
            let (gs, len) = (&level_groups[l], &shards[l]);
            match &steps[l] {
                Some(step) => self.ring_with(gs, step, len, false)?,
                None => self.materialized(gs, len, |d, me, n| {
                    let out = Blocks::split(Buf::Output, 0, n, d);
                    let mut s = RankSchedule::default();
                    builders::doubling_all_gather_core(&mut s, d, me, out.one(me), out);
                    s
                })?,
            }
        }
        Ok(())
    }

    /// One phase built per group member by `build(d, me, elements)` and run on the engine.
    fn materialized<G: AsRef<[usize]>>(
        &mut self,
        groups: &[G],
        len: &[usize],
        build: impl Fn(usize, usize, usize) -> RankSchedule,
    ) -> Result<(), String> {
        // Each position's group and its index in it.
        let mut member = vec![(0, 0); self.p()];
        for (gi, g) in groups.iter().enumerate() {
            for (me, &x) in g.as_ref().iter().enumerate() {
                member[x] = (gi, me);
            }
        }
        let scheds = self.compact(|x| {
            let (gi, me) = member[x];
            let g = groups[gi].as_ref();
            let mut s = build(g.len(), me, len[x]);
            s.map_peers(|k| g[k]);
            Ok(s)
        })?;
        self.run(&scheds)
    }
}

/// ⌊lg p⌋.
fn prev_log2(p: usize) -> usize {
    (usize::BITS - 1 - p.max(1).leading_zeros()) as usize
}

fn too_big(ops: usize) -> String {
    format!(
        "not priced: its schedules hold {ops} operations, more than fast pricing builds \
         ({MAX_MATERIALIZED_OPS})"
    )
}

#[cfg(test)]
mod tests;
