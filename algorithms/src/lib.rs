//! strata-algorithms: pure collective schedules, their cost, and an in-memory checker.
//!
//! From (collective, algorithm, ranks, count, root) this crate builds a [`RankSchedule`]: the
//! ordered steps one rank performs. Nothing here does I/O, spawns threads or reads clocks, so
//! every schedule can be checked in memory ([`sim`]), priced ([`cost`]) and run unchanged by
//! the runtime.

pub mod builders;
pub mod cost;
mod fluid;
pub mod hierarchy;
pub mod layout;
pub mod scale;
pub mod schedule;
pub mod sim;
pub mod tuner;

pub use hierarchy::Hierarchy;
pub use schedule::{Buf, Collective, Op, RankSchedule, Region, Step, StepTraffic, Traffic};

use std::fmt;

/// The reduce-scatter half of a composed all-reduce.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ReduceScatterPart {
    /// Ring reduce-scatter: p − 1 steps of n/p.
    Ring,
    /// Recursive halving: lg p steps of n/2, n/4, …
    Halving,
    /// Pairwise exchange: p − 1 steps, each with a different peer.
    Pairwise,
}

/// The all-gather half of a composed all-reduce.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AllGatherPart {
    /// Ring all-gather.
    Ring,
    /// Recursive doubling.
    Doubling,
    /// Bruck's algorithm: ⌈lg p⌉ steps for any p.
    Bruck,
}

impl ReduceScatterPart {
    /// Every reduce-scatter part.
    pub const ALL: [ReduceScatterPart; 3] = [Self::Ring, Self::Halving, Self::Pairwise];

    /// The name used in composed algorithm names.
    pub fn name(self) -> &'static str {
        match self {
            Self::Ring => "ring",
            Self::Halving => "halving",
            Self::Pairwise => "pairwise",
        }
    }
}

impl AllGatherPart {
    /// Every all-gather part.
    pub const ALL: [AllGatherPart; 3] = [Self::Ring, Self::Doubling, Self::Bruck];

    /// The name used in composed algorithm names.
    pub fn name(self) -> &'static str {
        match self {
            Self::Ring => "ring",
            Self::Doubling => "rd",
            Self::Bruck => "bruck",
        }
    }
}

/// The algorithm a hierarchical schedule runs inside each level of the hierarchy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum HierPart {
    /// Rings in every level (chains for broadcast).
    Ring,
    /// Recursive halving and doubling in every level (Rabenseifner at the top of an
    /// all-reduce, van de Geijn for broadcast).
    Rhd,
    /// Rings in the lower levels and a double binary tree across the top (binomial trees for
    /// broadcast), as NCCL combines them.
    Tree,
}

impl HierPart {
    fn name(self) -> &'static str {
        match self {
            HierPart::Ring => "hier_ring",
            HierPart::Rhd => "hier_rhd",
            HierPart::Tree => "hier_tree",
        }
    }
}

/// An algorithm. Not every algorithm applies to every collective; see [`algorithms_for`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Algorithm {
    /// Ring (all-reduce, all-gather, reduce-scatter).
    Ring,
    /// Double binary tree, pipelined by chunks (all-reduce; NCCL's "tree").
    Tree,
    /// Recursive doubling (all-reduce, all-gather).
    RecursiveDoubling,
    /// Recursive halving (reduce-scatter).
    RecursiveHalving,
    /// Rabenseifner: recursive-halving reduce-scatter + recursive-doubling all-gather
    /// (all-reduce).
    Rabenseifner,
    /// A reduce-scatter followed by an all-gather (all-reduce).
    Composed(ReduceScatterPart, AllGatherPart),
    /// Bruck (all-gather, all-to-all).
    Bruck,
    /// Pairwise exchange (reduce-scatter, all-to-all).
    Pairwise,
    /// Pipelined chain along the ring from the root (broadcast; NCCL's ring broadcast).
    Chain,
    /// Binomial tree (broadcast, reduce, gather, scatter).
    BinomialTree,
    /// Binomial scatter + ring all-gather, van de Geijn (broadcast).
    ScatterAllGather,
    /// Recursive-halving reduce-scatter + binomial gather (reduce).
    ReduceScatterGather,
    /// Direct exchange with the root (gather, scatter).
    Linear,
    /// Dissemination (barrier).
    Dissemination,
    /// A single point-to-point transfer (send, recv).
    Direct,
    /// Composed across the levels of the topology along rails (all-reduce, all-gather,
    /// reduce-scatter, broadcast); needs every group of a level to have the same shape.
    Hierarchical(HierPart),
    /// Every rank sends its whole vector to every other rank and reduces all of them itself,
    /// in rank order (all-reduce, on at most [`ONE_SHOT_MAX_RANKS`] ranks).
    OneShot,
}

/// The most ranks [`Algorithm::OneShot`] runs on: each rank sends and receives p − 1 whole
/// vectors, and the cost model, which charges a message's latency once however many go out
/// together, does not price that per-message work (nor its p² connections).
pub const ONE_SHOT_MAX_RANKS: usize = 8;

/// Largest all-reduce, in bytes per rank, that the runtime runs on its small path (see
/// [`Algorithm::takes_small_path`]).
pub const SMALL_PATH_MAX_BYTES: usize = 4096;

use AllGatherPart as Ag;
use ReduceScatterPart as Rs;

impl Algorithm {
    /// Whether the runtime runs a call of `collective` at `bytes` per rank over `nranks`
    /// ranks on its small path, without walking the schedule step by step: an all-reduce of
    /// 1 B to [`SMALL_PATH_MAX_BYTES`] under recursive doubling at a power-of-two rank count
    /// (elsewhere some ranks fold in and out), or under one-shot on 2 to
    /// [`ONE_SHOT_MAX_RANKS`] ranks. The cost model charges every other call the step
    /// executor's own cost.
    pub fn takes_small_path(self, collective: Collective, nranks: usize, bytes: usize) -> bool {
        collective == Collective::AllReduce
            && (1..=SMALL_PATH_MAX_BYTES).contains(&bytes)
            && match self {
                Algorithm::RecursiveDoubling => nranks.is_power_of_two() && nranks >= 2,
                Algorithm::OneShot => (2..=ONE_SHOT_MAX_RANKS).contains(&nranks),
                _ => false,
            }
    }

    /// Every algorithm, in a stable order (the wire code is the index).
    pub const ALL: [Algorithm; 26] = [
        Algorithm::Ring,
        Algorithm::Tree,
        Algorithm::RecursiveDoubling,
        Algorithm::RecursiveHalving,
        Algorithm::Rabenseifner,
        Algorithm::Composed(Rs::Ring, Ag::Doubling),
        Algorithm::Composed(Rs::Ring, Ag::Bruck),
        Algorithm::Composed(Rs::Halving, Ag::Ring),
        Algorithm::Composed(Rs::Halving, Ag::Bruck),
        Algorithm::Composed(Rs::Pairwise, Ag::Ring),
        Algorithm::Composed(Rs::Pairwise, Ag::Doubling),
        Algorithm::Composed(Rs::Pairwise, Ag::Bruck),
        Algorithm::Bruck,
        Algorithm::Pairwise,
        Algorithm::Chain,
        Algorithm::BinomialTree,
        Algorithm::ScatterAllGather,
        Algorithm::ReduceScatterGather,
        Algorithm::Linear,
        Algorithm::Dissemination,
        Algorithm::Direct,
        // Kept after the others so that adding a composition never renumbers them.
        Algorithm::Composed(Rs::Ring, Ag::Ring),
        Algorithm::Hierarchical(HierPart::Ring),
        Algorithm::Hierarchical(HierPart::Rhd),
        Algorithm::Hierarchical(HierPart::Tree),
        Algorithm::OneShot,
    ];

    /// The name used on the command line and in `STRATA_ALGO`.
    pub fn name(self) -> String {
        match self {
            Algorithm::Composed(rs, ag) => match self.normalized() {
                Algorithm::Composed(..) => format!("{}+{}", rs.name(), ag.name()),
                other => other.name(),
            },
            other => other.simple_name().to_string(),
        }
    }

    fn simple_name(self) -> &'static str {
        match self {
            Algorithm::Ring => "ring",
            Algorithm::Tree => "tree",
            Algorithm::RecursiveDoubling => "rd",
            Algorithm::RecursiveHalving => "halving",
            Algorithm::Rabenseifner => "rhd",
            Algorithm::Composed(..) => "composed",
            Algorithm::Bruck => "bruck",
            Algorithm::Pairwise => "pairwise",
            Algorithm::Chain => "chain",
            Algorithm::BinomialTree => "binomial",
            Algorithm::ScatterAllGather => "scatter_allgather",
            Algorithm::ReduceScatterGather => "reduce_scatter_gather",
            Algorithm::Linear => "linear",
            Algorithm::Dissemination => "dissemination",
            Algorithm::Direct => "direct",
            Algorithm::Hierarchical(h) => h.name(),
            Algorithm::OneShot => "one_shot",
        }
    }

    /// The canonical form: ring + ring is [`Algorithm::Ring`], halving + doubling is
    /// [`Algorithm::Rabenseifner`].
    pub fn normalized(self) -> Algorithm {
        match self {
            Algorithm::Composed(Rs::Ring, Ag::Ring) => Algorithm::Ring,
            Algorithm::Composed(Rs::Halving, Ag::Doubling) => Algorithm::Rabenseifner,
            other => other,
        }
    }

    /// Parses a name printed by [`Algorithm::name`], or a long alias (`recursive_doubling`,
    /// `rabenseifner`, `double_binary_tree`, `rs+ag` with any parts). Case and `-`/`_` do not
    /// matter.
    pub fn parse(s: &str) -> Option<Self> {
        let norm = s.trim().to_ascii_lowercase().replace('-', "_");
        if let Some((rs, ag)) = norm.split_once('+') {
            let rs = Rs::ALL.into_iter().find(|p| p.name() == rs.trim())?;
            let ag = Ag::ALL.into_iter().find(|p| {
                p.name() == ag.trim() || (p == &Ag::Doubling && ag.trim() == "doubling")
            })?;
            return Some(Algorithm::Composed(rs, ag).normalized());
        }
        let alias = match norm.as_str() {
            "recursive_doubling" => Some(Algorithm::RecursiveDoubling),
            "recursive_halving" => Some(Algorithm::RecursiveHalving),
            "rabenseifner" | "halving_doubling" => Some(Algorithm::Rabenseifner),
            "double_binary_tree" | "dbt" => Some(Algorithm::Tree),
            "vandegeijn" | "van_de_geijn" => Some(Algorithm::ScatterAllGather),
            "binomial_tree" => Some(Algorithm::BinomialTree),
            "oneshot" => Some(Algorithm::OneShot),
            _ => None,
        };
        alias.or_else(|| {
            Self::ALL
                .into_iter()
                .filter(|a| !matches!(a, Algorithm::Composed(..)))
                .find(|a| a.simple_name() == norm)
        })
    }

    /// Parses `s` as an algorithm for `collective`, accepting NCCL's `NCCL_ALGO` words where
    /// they mean the same thing: `ring` is the chain for broadcast, `tree` is the binomial
    /// tree for broadcast and reduce.
    pub fn parse_for(collective: Collective, s: &str) -> Option<Self> {
        let a = Self::parse(s)?;
        let a = match (collective, a) {
            (Collective::Broadcast, Algorithm::Ring) => Algorithm::Chain,
            (Collective::Broadcast | Collective::Reduce, Algorithm::Tree) => {
                Algorithm::BinomialTree
            }
            _ => a,
        };
        a.supports(collective).then_some(a)
    }

    /// Whether this algorithm has a schedule for `collective`.
    pub fn supports(self, collective: Collective) -> bool {
        algorithms_for(collective).contains(&self.normalized())
    }

    /// The most ranks this algorithm runs on, where it has a limit.
    pub fn max_ranks(self) -> Option<usize> {
        (self == Algorithm::OneShot).then_some(ONE_SHOT_MAX_RANKS)
    }

    /// Whether this algorithm runs on `nranks` ranks ([`Algorithm::max_ranks`]).
    pub fn runs_on(self, nranks: usize) -> bool {
        self.check_ranks(nranks).is_ok()
    }

    /// Why this algorithm does not run on `nranks` ranks, if it does not.
    pub fn check_ranks(self, nranks: usize) -> Result<(), PlanError> {
        match self.max_ranks() {
            Some(max) if nranks > max => Err(PlanError::TooManyRanks {
                algorithm: self,
                max,
                nranks,
            }),
            _ => Ok(()),
        }
    }

    /// Whether this is a hierarchical composition (it needs a regular [`Hierarchy`]).
    pub fn is_hierarchical(self) -> bool {
        matches!(self, Algorithm::Hierarchical(_))
    }

    /// A stable numeric code for wire headers.
    pub fn code(self) -> u8 {
        let a = self.normalized();
        Self::ALL.iter().position(|x| *x == a).unwrap_or(0) as u8
    }

    /// The inverse of [`Algorithm::code`]: `None` for a code it never gives (that of a
    /// spelling with a shorter name, such as `ring+ring` for `ring`), so that every algorithm
    /// has one code.
    pub fn from_code(code: u8) -> Option<Self> {
        Self::ALL
            .get(code as usize)
            .copied()
            .filter(|a| a.normalized() == *a)
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

/// The algorithms that can run `collective`, default first.
pub fn algorithms_for(collective: Collective) -> &'static [Algorithm] {
    use Algorithm::*;
    match collective {
        Collective::AllReduce => &[
            Ring,
            Tree,
            RecursiveDoubling,
            Rabenseifner,
            Composed(Rs::Ring, Ag::Doubling),
            Composed(Rs::Ring, Ag::Bruck),
            Composed(Rs::Halving, Ag::Ring),
            Composed(Rs::Halving, Ag::Bruck),
            Composed(Rs::Pairwise, Ag::Ring),
            Composed(Rs::Pairwise, Ag::Doubling),
            Composed(Rs::Pairwise, Ag::Bruck),
            Hierarchical(HierPart::Ring),
            Hierarchical(HierPart::Rhd),
            Hierarchical(HierPart::Tree),
            OneShot,
        ],
        Collective::AllGather => &[
            Ring,
            RecursiveDoubling,
            Bruck,
            Hierarchical(HierPart::Ring),
            Hierarchical(HierPart::Rhd),
        ],
        Collective::ReduceScatter => &[
            Ring,
            RecursiveHalving,
            Pairwise,
            Hierarchical(HierPart::Ring),
            Hierarchical(HierPart::Rhd),
        ],
        Collective::Broadcast => &[
            Chain,
            BinomialTree,
            ScatterAllGather,
            Hierarchical(HierPart::Ring),
            Hierarchical(HierPart::Rhd),
            Hierarchical(HierPart::Tree),
        ],
        Collective::Reduce => &[BinomialTree, ReduceScatterGather],
        Collective::AllToAll => &[Pairwise, Bruck],
        Collective::Gather | Collective::Scatter => &[Linear, BinomialTree],
        Collective::Barrier => &[Dissemination],
        Collective::Send | Collective::Recv => &[Direct],
    }
}

/// The names of [`algorithms_for`] `collective`, comma separated, for error messages.
pub fn valid_names(collective: Collective) -> String {
    algorithms_for(collective)
        .iter()
        .map(|a| a.name())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Everything a schedule depends on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Plan {
    /// What to do.
    pub collective: Collective,
    /// How.
    pub algorithm: Algorithm,
    /// Number of ranks.
    pub nranks: usize,
    /// The rank whose schedule is built.
    pub rank: usize,
    /// Elements, with NCCL's meaning for `collective` (per rank for gather-like ones).
    pub count: usize,
    /// Root rank for rooted collectives; the peer for send and recv; ignored otherwise.
    pub root: usize,
    /// Pipeline chunk in elements for algorithms that pipeline at schedule level.
    pub chunk_elems: usize,
}

/// Why a plan cannot be built.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PlanError {
    /// The algorithm has no schedule for the collective.
    Unsupported(Collective, Algorithm),
    /// Rank, root or rank count out of range.
    OutOfRange(String),
    /// A hierarchical algorithm on a communicator whose groups are not all the same shape.
    NotHierarchical(Algorithm, String),
    /// An algorithm that runs on at most `max` ranks, given `nranks`.
    TooManyRanks {
        /// The algorithm.
        algorithm: Algorithm,
        /// The most ranks it runs on.
        max: usize,
        /// The ranks of the plan.
        nranks: usize,
    },
}

impl fmt::Display for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlanError::Unsupported(c, a) => write!(
                f,
                "algorithm '{a}' cannot run {c}; valid: {}",
                valid_names(*c)
            ),
            PlanError::OutOfRange(m) => f.write_str(m),
            PlanError::NotHierarchical(a, why) => write!(
                f,
                "algorithm '{a}' needs every host, leaf and pod to hold the same number of \
                 ranks: {why}"
            ),
            PlanError::TooManyRanks {
                algorithm,
                max,
                nranks,
            } => write!(
                f,
                "algorithm '{algorithm}' sends every rank's whole vector to every other rank and \
                 runs on at most {max} ranks, not {nranks}"
            ),
        }
    }
}

impl std::error::Error for PlanError {}

/// Builds the schedule of `plan.rank` with ranks in launcher order. Hierarchical algorithms
/// need [`plan_on`].
pub fn plan(plan: &Plan) -> Result<RankSchedule, PlanError> {
    plan_in_launcher_order(plan, None)
}

/// Builds the schedule of `plan.rank` on a communicator laid out as `h`. Hierarchical
/// algorithms follow its levels. With `ordered`, flat all-reduce, broadcast and reduce
/// schedules and ring all-gather and reduce-scatter run over the topology order (a ring
/// visits every rank of a host and of a leaf before it leaves them); other flat schedules,
/// and all of them without `ordered`, keep the launcher's order.
pub fn plan_on(plan: &Plan, h: &Hierarchy, ordered: bool) -> Result<RankSchedule, PlanError> {
    plan_with(plan, h, ordered, None)
}

/// The schedule the runtime executes for `plan`: [`plan_on`]'s, except that a flat ring
/// all-reduce runs sliced ([`builders::ring_pipelined_all_reduce`]) with slices of
/// `ring_slice_elems` (0: step by step). The cost model prices [`plan_on`]'s form: the same
/// bytes over the same links in the same ring order; slicing changes when a rank sends what
/// it reduced (a step later, from cache, instead of a whole block later), which a model of
/// links does not see.
pub fn plan_to_run_on(
    plan: &Plan,
    h: &Hierarchy,
    ordered: bool,
    ring_slice_elems: usize,
) -> Result<RankSchedule, PlanError> {
    plan_with(
        plan,
        h,
        ordered,
        (ring_slice_elems > 0).then_some(ring_slice_elems),
    )
}

fn plan_in_launcher_order(
    plan: &Plan,
    ring_slice: Option<usize>,
) -> Result<RankSchedule, PlanError> {
    validate(plan)?;
    if plan.algorithm.is_hierarchical() {
        return Err(PlanError::NotHierarchical(
            plan.algorithm,
            "no hierarchy was given".into(),
        ));
    }
    build_flat(plan, plan.rank, plan.root, ring_slice)
}

/// The flat schedule of `plan` for the rank at ring position `pos` (root at `root`).
fn build_flat(
    plan: &Plan,
    pos: usize,
    root: usize,
    ring_slice: Option<usize>,
) -> Result<RankSchedule, PlanError> {
    let (collective, algorithm) = (plan.collective, plan.algorithm.normalized());
    let (p, n) = (plan.nranks, plan.count);
    if let (Some(slice), Collective::AllReduce, Algorithm::Ring) =
        (ring_slice, collective, algorithm)
    {
        return Ok(builders::ring_pipelined_all_reduce(p, pos, n, slice));
    }
    builders::build(
        collective,
        algorithm,
        p,
        pos,
        n,
        root,
        plan.chunk_elems.max(1),
    )
    .ok_or(PlanError::Unsupported(collective, plan.algorithm))
}

fn plan_with(
    plan: &Plan,
    h: &Hierarchy,
    ordered: bool,
    ring_slice: Option<usize>,
) -> Result<RankSchedule, PlanError> {
    validate(plan)?;
    let Plan {
        collective,
        algorithm,
        nranks: p,
        rank: r,
        count: n,
        root,
        chunk_elems,
    } = *plan;
    if h.len() != p {
        return Err(PlanError::OutOfRange(format!(
            "the hierarchy has {} ranks, the plan {p}",
            h.len()
        )));
    }
    let chunk = chunk_elems.max(1);
    let algorithm = algorithm.normalized();
    if let Algorithm::Hierarchical(part) = algorithm {
        let built = match collective {
            Collective::AllReduce => builders::hierarchical_all_reduce(h, part, r, n, chunk),
            Collective::AllGather => builders::hierarchical_all_gather(h, part, r, n),
            Collective::ReduceScatter => builders::hierarchical_reduce_scatter(h, part, r, n),
            Collective::Broadcast => builders::hierarchical_broadcast(h, part, r, n, root, chunk),
            _ => return Err(PlanError::Unsupported(collective, algorithm)),
        };
        return built.ok_or_else(|| PlanError::NotHierarchical(algorithm, h.describe()));
    }
    let blocks = match (collective, algorithm) {
        (Collective::AllReduce | Collective::Broadcast | Collective::Reduce, _) => Some(None),
        (Collective::AllGather, Algorithm::Ring) => Some(Some((Buf::Output, n))),
        (Collective::ReduceScatter, Algorithm::Ring) => Some(Some((Buf::Input, n))),
        _ => None,
    };
    let Some(blocks) = blocks.filter(|_| ordered && !h.is_launcher_order()) else {
        return plan_in_launcher_order(plan, ring_slice);
    };
    let root_pos = if collective.rooted() {
        h.position(root)
    } else {
        root
    };
    let sched = build_flat(plan, h.position(r), root_pos, ring_slice)?;
    builders::along_topology(sched, h.order(), blocks).ok_or_else(|| {
        PlanError::OutOfRange(format!(
            "internal: {algorithm} for {collective} cannot be laid along the topology"
        ))
    })
}

fn validate(plan: &Plan) -> Result<(), PlanError> {
    let Plan {
        collective,
        algorithm,
        nranks: p,
        rank: r,
        root,
        ..
    } = *plan;
    if p == 0 || r >= p {
        return Err(PlanError::OutOfRange(format!(
            "rank {r} out of range for {p} ranks"
        )));
    }
    if (collective.rooted() || matches!(collective, Collective::Send | Collective::Recv))
        && root >= p
    {
        return Err(PlanError::OutOfRange(format!(
            "root/peer {root} out of range for {p} ranks"
        )));
    }
    if !algorithm.supports(collective) {
        return Err(PlanError::Unsupported(collective, algorithm));
    }
    algorithm.check_ranks(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_codes_are_unique() {
        let mut names = std::collections::HashSet::new();
        for (i, a) in Algorithm::ALL.iter().enumerate() {
            let a = a.normalized();
            assert_eq!(Algorithm::parse(&a.name()), Some(a), "{a}");
            assert_eq!(Algorithm::from_code(a.code()), Some(a));
            if a == Algorithm::ALL[i] {
                assert!(names.insert(a.name()), "duplicate name {a}");
            }
        }
        assert_eq!(Algorithm::parse("ring+ring"), Some(Algorithm::Ring));
        assert_eq!(
            Algorithm::parse("Halving+Doubling"),
            Some(Algorithm::Rabenseifner)
        );
        assert_eq!(
            Algorithm::parse("pairwise+bruck"),
            Some(Algorithm::Composed(Rs::Pairwise, Ag::Bruck))
        );
        assert_eq!(Algorithm::parse("bogus"), None);
        assert_eq!(Algorithm::parse("ring+bogus"), None);
    }

    #[test]
    fn every_listed_algorithm_supports_its_collective_and_nccl_words_map() {
        for c in Collective::ALL {
            for a in algorithms_for(c) {
                assert!(a.supports(c));
                assert_eq!(Algorithm::parse_for(c, &a.name()), Some(*a));
            }
        }
        assert_eq!(
            Algorithm::parse_for(Collective::Broadcast, "ring"),
            Some(Algorithm::Chain)
        );
        assert_eq!(
            Algorithm::parse_for(Collective::Reduce, "Tree"),
            Some(Algorithm::BinomialTree)
        );
        assert_eq!(
            Algorithm::parse_for(Collective::AllReduce, "tree"),
            Some(Algorithm::Tree)
        );
        assert_eq!(Algorithm::parse_for(Collective::AllGather, "tree"), None);
    }

    #[test]
    fn plan_rejects_bad_arguments() {
        let base = Plan {
            collective: Collective::AllReduce,
            algorithm: Algorithm::Ring,
            nranks: 4,
            rank: 0,
            count: 8,
            root: 0,
            chunk_elems: 4,
        };
        assert!(plan(&Plan { rank: 4, ..base }).is_err());
        assert!(plan(&Plan { nranks: 0, ..base }).is_err());
        let e = plan(&Plan {
            algorithm: Algorithm::Chain,
            ..base
        })
        .unwrap_err()
        .to_string();
        assert!(e.contains("valid: ring, tree, rd, rhd"), "{e}");
        assert!(
            plan(&Plan {
                collective: Collective::Broadcast,
                algorithm: Algorithm::Chain,
                root: 9,
                ..base
            })
            .is_err()
        );
    }

    #[test]
    fn the_ring_the_runtime_runs_is_sliced_and_laid_along_the_topology() {
        use crate::sim::{Placement, check_schedules};
        // Hosts dealt out of order: the ring runs in topology order.
        let h = crate::hierarchy::tests::hosts_dealt_out_of_order();
        let n = 6 * 9 + 4;
        let base = Plan {
            collective: Collective::AllReduce,
            algorithm: Algorithm::Ring,
            nranks: 6,
            rank: 0,
            count: n,
            root: 0,
            chunk_elems: 4,
        };
        let run = |slice: usize| -> Vec<RankSchedule> {
            (0..6)
                .map(|rank| plan_to_run_on(&Plan { rank, ..base }, &h, true, slice).unwrap())
                .collect()
        };
        for placement in [Placement::OutOfPlace, Placement::InPlace] {
            check_schedules(Collective::AllReduce, &run(3), n, 0, placement).unwrap();
        }
        for rank in 0..6 {
            let plain = plan_on(&Plan { rank, ..base }, &h, true).unwrap();
            let sliced = &run(3)[rank];
            // The same neighbours in the topology's ring, more steps.
            assert_eq!(sliced.send_peers(), plain.send_peers());
            assert_eq!(sliced.recv_peers(), plain.recv_peers());
            assert!(sliced.steps.len() > plain.steps.len());
            // Slice 0 is the plain ring.
            assert_eq!(run(0)[rank], plain);
        }
    }
}
