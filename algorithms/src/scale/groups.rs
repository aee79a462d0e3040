//! Pricing a collective that every group of one kind runs at the same time (the TP, CP, PP
//! or DP groups of a training step), so that groups sharing an uplink slow each other down.

use strata_topology::fabric::TierCosts;

use super::{Pricer, Query};
use crate::builders;
use crate::hierarchy::Hierarchy;
use crate::schedule::{Buf, Collective, Op, RankSchedule, Region};
use crate::{Algorithm, PlanError};

/// What every group of one kind does at once.
#[derive(Clone, Copy, Debug)]
pub struct GroupQuery<'a> {
    /// The whole job's ranks.
    pub hierarchy: &'a Hierarchy,
    /// What each tier costs.
    pub costs: TierCosts,
    /// The collective each group runs; [`Collective::Send`] is a pipeline hand-off (member
    /// i sends to member i + 1, all at once).
    pub collective: Collective,
    /// How (a flat algorithm, over each group in group order).
    pub algorithm: Algorithm,
    /// Elements per rank.
    pub count: usize,
    /// Bytes per element.
    pub elem_bytes: usize,
    /// Pipeline chunk, elements.
    pub chunk_elems: usize,
}

/// Seconds until the last member of the last group finishes, every group of `groups` (real
/// ranks, in group order) running `q` at once.
pub fn price_groups(q: &GroupQuery, groups: &[Vec<usize>]) -> Result<f64, String> {
    let algorithm = q.algorithm.normalized();
    if q.collective != Collective::Send && !algorithm.supports(q.collective) {
        return Err(PlanError::Unsupported(q.collective, algorithm).to_string());
    }
    if algorithm.is_hierarchical() {
        return Err(format!(
            "{algorithm}: groups are priced with flat algorithms"
        ));
    }
    let p = q.hierarchy.len();
    let mut pricer = Pricer::new(&Query {
        hierarchy: q.hierarchy,
        costs: q.costs,
        ordered: false,
        collective: q.collective,
        algorithm,
        count: q.count,
        elem_bytes: q.elem_bytes,
        root: 0,
        chunk_elems: q.chunk_elems,
    });
    let chunk = q.chunk_elems.max(1);
    // Elements each member holds in all, by rank.
    let mut len = vec![q.count; p];
    let per_group = |n: usize, g: &Vec<usize>| n * g.len();
    match (q.collective, algorithm) {
        (Collective::AllReduce, Algorithm::Ring) => {
            pricer.ring(groups, &len, true)?;
            pricer.ring(groups, &len, false)?;
        }
        (Collective::AllGather | Collective::ReduceScatter, Algorithm::Ring) => {
            for g in groups {
                for &r in g {
                    len[r] = per_group(q.count, g);
                }
            }
            pricer.ring(groups, &len, q.collective == Collective::ReduceScatter)?;
        }
        (Collective::Send, _) => pricer.materialized(groups, &len, |d, me, n| {
            let mut s = RankSchedule::default();
            let mut ops = Vec::new();
            if me + 1 < d {
                ops.push(Op::Send {
                    peer: me + 1,
                    src: Region::new(Buf::Input, 0, n),
                });
            }
            if me > 0 {
                ops.push(Op::Recv {
                    peer: me - 1,
                    dst: Region::new(Buf::Output, 0, n),
                });
            }
            s.step(ops);
            s
        })?,
        (c, a) => pricer.materialized(groups, &len, |d, me, n| {
            builders::build(c, a, d, me, n, 0, chunk).unwrap_or_default()
        })?,
    }
    Ok(pricer.finish())
}
