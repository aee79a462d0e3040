//! A rank's schedule as much as timing needs: its transfers, step by step, in 8 bytes each.
//!
//! A pipelined tree at 24,576 ranks holds 12.6 million transfers; at 8 bytes instead of an
//! [`Op`]'s 64 (or the 16 of a peer, a kind and a length) they fit where the engines can walk
//! them. A schedule moves few distinct lengths (a chunk and the last, shorter one; a block
//! per round), so each transfer names its length by an index into its rank's table.

use std::collections::HashMap;

use crate::cost::Network;
use crate::schedule::{Op, RankSchedule};

/// What a transfer does at this end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Send,
    Recv,
    RecvReduce,
}

/// Bits of [`Transfer::meta`]: the kind, whether it leaves the host, then the length's index.
const KIND_BITS: u32 = 0b11;
const OFF_HOST_BIT: u32 = 0b100;
const LEN_SHIFT: u32 = 3;

/// Distinct lengths a rank's table is scanned for; past them, they are looked up in a map.
const SCANNED_LENGTHS: usize = 16;

/// Most distinct lengths one rank's schedule may move.
const MAX_LENGTHS: usize = 1 << (32 - LEN_SHIFT);

/// One transfer of a rank's schedule.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Transfer {
    peer: u32,
    /// Kind, off-host flag and length index, packed.
    meta: u32,
}

impl Transfer {
    pub(crate) fn peer(&self) -> usize {
        self.peer as usize
    }

    pub(crate) fn kind(&self) -> Kind {
        match self.meta & KIND_BITS {
            0 => Kind::Send,
            1 => Kind::Recv,
            _ => Kind::RecvReduce,
        }
    }

    pub(crate) fn sends(&self) -> bool {
        self.meta & KIND_BITS == 0
    }

    /// Whether the transfer leaves its rank's host (the rank's network port rather than its
    /// local one).
    pub(crate) fn off_host(&self) -> bool {
        self.meta & OFF_HOST_BIT != 0
    }

    pub(super) fn length_index(&self) -> usize {
        (self.meta >> LEN_SHIFT) as usize
    }
}

/// A rank's schedule without its local operations and empty steps.
#[derive(Clone, Debug, Default)]
pub(crate) struct Compact {
    pub(super) transfers: Vec<Transfer>,
    /// Where each step starts in `transfers`, and the end.
    pub(super) bounds: Vec<u32>,
    /// The distinct lengths its transfers move, in elements.
    lengths: Vec<u64>,
}

impl Compact {
    /// Rank `r`'s schedule `s` on `net` (which says which transfers leave the host).
    pub(crate) fn new(s: &RankSchedule, r: usize, net: &dyn Network) -> Self {
        let mut c = Compact {
            transfers: Vec::new(),
            bounds: vec![0],
            lengths: Vec::new(),
        };
        // A few lengths are scanned; past `SCANNED_LENGTHS`, a map finds each one's index.
        let mut index: HashMap<u64, u32> = HashMap::new();
        for st in &s.steps {
            for op in &st.ops {
                let (peer, kind, elems) = match op {
                    Op::Send { peer, src } => (*peer, 0, src.len),
                    Op::Recv { peer, dst } => (*peer, 1, dst.len),
                    Op::RecvReduce { peer, dst, .. } => (*peer, 2, dst.len),
                    // Local reductions are in one-shot schedules only, which fast pricing
                    // hands to the full simulation.
                    Op::Copy { .. } | Op::Reduce { .. } | Op::Finalize { .. } => continue,
                };
                let elems = elems as u64;
                let lengths = &mut c.lengths;
                let at = if lengths.len() < SCANNED_LENGTHS {
                    lengths.iter().position(|&l| l == elems).unwrap_or_else(|| {
                        lengths.push(elems);
                        lengths.len() - 1
                    })
                } else {
                    if index.is_empty() {
                        index.extend(lengths.iter().enumerate().map(|(i, &l)| (l, i as u32)));
                    }
                    *index.entry(elems).or_insert_with(|| {
                        lengths.push(elems);
                        (lengths.len() - 1) as u32
                    }) as usize
                };
                // A rank holds at most `MAX_MATERIALIZED_OPS` transfers, far fewer.
                debug_assert!(at < MAX_LENGTHS);
                let off = if net.crosses_hosts(r, peer) {
                    OFF_HOST_BIT
                } else {
                    0
                };
                c.transfers.push(Transfer {
                    peer: peer as u32,
                    meta: kind | off | (at as u32) << LEN_SHIFT,
                });
            }
            let end = c.transfers.len() as u32;
            if end > *c.bounds.last().unwrap_or(&0) {
                c.bounds.push(end);
            }
        }
        c
    }

    /// The distinct lengths its transfers move, in elements, by [`Transfer::length_index`].
    pub(super) fn lengths(&self) -> &[u64] {
        &self.lengths
    }

    /// Elements `t` (one of this schedule's transfers) moves.
    pub(crate) fn elems(&self, t: &Transfer) -> u64 {
        self.lengths[t.length_index()]
    }

    /// Transfers in all.
    pub(crate) fn len(&self) -> usize {
        self.transfers.len()
    }

    pub(super) fn steps(&self) -> usize {
        self.bounds.len() - 1
    }

    pub(super) fn step(&self, i: usize) -> &[Transfer] {
        match (self.bounds.get(i), self.bounds.get(i + 1)) {
            (Some(&a), Some(&b)) => &self.transfers[a as usize..b as usize],
            _ => &[],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost::FabricModel;
    use crate::hierarchy::tests::fat_tree;
    use crate::schedule::{Buf, Region};
    use strata_topology::fabric::TierCosts;

    /// Every transfer keeps its peer, kind, length and whether it leaves the host, past the
    /// lengths found by scanning and into those found through the map; local operations and
    /// empty steps are left out.
    #[test]
    fn transfers_keep_peer_kind_length_and_host() {
        let h = fat_tree(4, 2, 2, 1, None);
        let net = FabricModel {
            hierarchy: &h,
            costs: TierCosts::default(),
            shared_cores: &[],
        };
        let mut s = RankSchedule::default();
        let mut expected = Vec::new();
        for k in 0..40usize {
            let peer = (k % 15) + 1;
            let len = 1000 + (k * 7) % 33;
            let region = Region::new(Buf::Output, 0, len);
            let (op, kind) = match k % 3 {
                0 => (Op::Send { peer, src: region }, Kind::Send),
                1 => (Op::Recv { peer, dst: region }, Kind::Recv),
                _ => (
                    Op::RecvReduce {
                        peer,
                        src: region,
                        dst: region,
                    },
                    Kind::RecvReduce,
                ),
            };
            s.step(vec![op, Op::Finalize { region }]);
            s.step(vec![]);
            expected.push((
                peer,
                kind,
                len as u64,
                h.tier(0, peer) > strata_topology::Tier::Host,
            ));
        }
        let c = Compact::new(&s, 0, &net);
        assert_eq!((c.len(), c.steps()), (40, 40));
        assert!(
            c.lengths().len() > 16,
            "the map past the scanned lengths is exercised"
        );
        for (k, (peer, kind, len, off)) in expected.into_iter().enumerate() {
            let t = &c.step(k)[0];
            assert_eq!(
                (t.peer(), t.kind(), c.elems(t), t.off_host()),
                (peer, kind, len, off)
            );
            assert_eq!(t.sends(), kind == Kind::Send);
        }
        assert!(c.transfers.iter().any(|t| t.off_host()));
        assert!(c.transfers.iter().any(|t| !t.off_host()));
    }
}
