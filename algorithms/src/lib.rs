//! strata-algorithms: pure collective schedules.
//!
//! From (collective, algorithm, ranks, count, root) this crate builds a [`RankSchedule`]: the
//! ordered steps one rank performs. Nothing here does I/O, spawns threads or reads clocks, so
//! every schedule can be checked in memory ([`sim`]) and run unchanged by the runtime.

pub mod builders;
pub mod schedule;
pub mod sim;

pub use schedule::{Buf, Collective, Op, RankSchedule, Region, Step};

use std::fmt;

/// An algorithm family. Not every algorithm applies to every collective; see
/// [`Algorithm::supports`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Algorithm {
    /// Ring (all-reduce, all-gather, reduce-scatter).
    Ring,
    /// Recursive doubling (all-reduce).
    RecursiveDoubling,
    /// Pipelined chain along the ring from the root (broadcast).
    Chain,
    /// Binomial tree (reduce).
    BinomialTree,
    /// Pairwise exchange (all-to-all).
    Pairwise,
    /// Direct exchange with the root (gather, scatter).
    Linear,
    /// Dissemination (barrier).
    Dissemination,
    /// A single point-to-point transfer (send, recv).
    Direct,
}

impl Algorithm {
    /// Every algorithm.
    pub const ALL: [Algorithm; 8] = [
        Algorithm::Ring,
        Algorithm::RecursiveDoubling,
        Algorithm::Chain,
        Algorithm::BinomialTree,
        Algorithm::Pairwise,
        Algorithm::Linear,
        Algorithm::Dissemination,
        Algorithm::Direct,
    ];

    /// The name used on the command line and in `STRATA_ALGO`.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Ring => "ring",
            Algorithm::RecursiveDoubling => "rd",
            Algorithm::Chain => "chain",
            Algorithm::BinomialTree => "binomial",
            Algorithm::Pairwise => "pairwise",
            Algorithm::Linear => "linear",
            Algorithm::Dissemination => "dissemination",
            Algorithm::Direct => "direct",
        }
    }

    /// Parses a name printed by [`Algorithm::name`].
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|a| a.name().eq_ignore_ascii_case(s.trim()))
    }

    /// Whether this algorithm has a schedule for `collective`.
    pub fn supports(self, collective: Collective) -> bool {
        algorithms_for(collective).contains(&self)
    }

    /// A stable numeric code for wire headers.
    pub fn code(self) -> u8 {
        Self::ALL.iter().position(|a| *a == self).unwrap_or(0) as u8
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The algorithms that can run `collective`, default first.
pub fn algorithms_for(collective: Collective) -> &'static [Algorithm] {
    match collective {
        Collective::AllReduce => &[Algorithm::Ring, Algorithm::RecursiveDoubling],
        Collective::AllGather | Collective::ReduceScatter => &[Algorithm::Ring],
        Collective::Broadcast => &[Algorithm::Chain],
        Collective::Reduce => &[Algorithm::BinomialTree],
        Collective::AllToAll => &[Algorithm::Pairwise],
        Collective::Gather | Collective::Scatter => &[Algorithm::Linear],
        Collective::Barrier => &[Algorithm::Dissemination],
        Collective::Send | Collective::Recv => &[Algorithm::Direct],
    }
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
}

impl fmt::Display for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlanError::Unsupported(c, a) => {
                let valid: Vec<&str> = algorithms_for(*c).iter().map(|a| a.name()).collect();
                write!(
                    f,
                    "algorithm '{a}' cannot run {c}; valid: {}",
                    valid.join(", ")
                )
            }
            PlanError::OutOfRange(m) => f.write_str(m),
        }
    }
}

impl std::error::Error for PlanError {}

/// Builds the schedule of `plan.rank`.
pub fn plan(plan: &Plan) -> Result<RankSchedule, PlanError> {
    let Plan {
        collective,
        algorithm,
        nranks: p,
        rank: r,
        count: n,
        root,
        chunk_elems,
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
    use builders::*;
    Ok(match collective {
        Collective::AllReduce if algorithm == Algorithm::RecursiveDoubling => {
            recursive_doubling_all_reduce(p, r, n)
        }
        Collective::AllReduce => ring_all_reduce(p, r, n),
        Collective::Broadcast => chain_broadcast(p, r, n, root, chunk_elems),
        Collective::Reduce => binomial_reduce(p, r, n, root),
        Collective::AllGather => ring_all_gather(p, r, n),
        Collective::ReduceScatter => ring_reduce_scatter(p, r, n),
        Collective::AllToAll => pairwise_all_to_all(p, r, n),
        Collective::Gather => linear_gather(p, r, n, root),
        Collective::Scatter => linear_scatter(p, r, n, root),
        Collective::Barrier => dissemination_barrier(p, r),
        Collective::Send => {
            let mut s = RankSchedule::default();
            s.step(vec![Op::Send {
                peer: root,
                src: Region::new(Buf::Input, 0, n),
            }]);
            s
        }
        Collective::Recv => {
            let mut s = RankSchedule::default();
            s.step(vec![Op::Recv {
                peer: root,
                dst: Region::new(Buf::Output, 0, n),
            }]);
            s
        }
    })
}
