//! The `Schedule`: for one rank, an ordered list of steps over regions of its buffers.
//!
//! A schedule is pure data. Sizes and offsets are in *elements*; the runtime multiplies by the
//! element size. Every operation of a step may progress concurrently; a step starts once the
//! previous one has finished. Pipelining across chunks is expressed by the schedule itself (a
//! pipelined chain sends chunk `t-1` while receiving chunk `t` in the same step).

use std::fmt;

/// Which of a rank's buffers a region lives in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Buf {
    /// The caller's send buffer (read only, except where it aliases `Output` in-place).
    Input,
    /// The caller's receive buffer.
    Output,
    /// Library-owned scratch memory of `RankSchedule::scratch_elems` elements.
    Scratch,
}

/// A contiguous range of elements in one buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Region {
    /// The buffer.
    pub buf: Buf,
    /// First element.
    pub offset: usize,
    /// Number of elements.
    pub len: usize,
}

impl Region {
    /// A region of `len` elements at `offset` in `buf`.
    pub const fn new(buf: Buf, offset: usize, len: usize) -> Self {
        Self { buf, offset, len }
    }

    /// One past the last element.
    pub const fn end(&self) -> usize {
        self.offset + self.len
    }
}

/// One operation of a step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// Send `src` to `peer`.
    Send {
        /// Destination rank.
        peer: usize,
        /// What to send.
        src: Region,
    },
    /// Receive `dst.len` elements from `peer` into `dst`.
    Recv {
        /// Source rank.
        peer: usize,
        /// Where the data lands.
        dst: Region,
    },
    /// Receive `dst.len` elements from `peer` and store `reduce(src, incoming)` into `dst`.
    /// `src` and `dst` have the same length and are either the same region or disjoint.
    RecvReduce {
        /// Source rank.
        peer: usize,
        /// Local operand.
        src: Region,
        /// Result.
        dst: Region,
    },
    /// Copy `src` to `dst` locally (skipped by the runtime when they are the same memory).
    Copy {
        /// From.
        src: Region,
        /// To.
        dst: Region,
    },
    /// Store `reduce(src, with)` into `dst` locally. The three have the same length; `dst`
    /// is `src` or disjoint from it, and `with` is disjoint from `dst`.
    Reduce {
        /// First operand.
        src: Region,
        /// Second operand.
        with: Region,
        /// Result.
        dst: Region,
    },
    /// Apply the reduction's final step (division for `avg`) to a fully reduced region.
    Finalize {
        /// The region holding a complete reduction result.
        region: Region,
    },
}

impl Op {
    /// The peer this operation talks to, if any.
    pub fn peer(&self) -> Option<usize> {
        match self {
            Op::Send { peer, .. } | Op::Recv { peer, .. } | Op::RecvReduce { peer, .. } => {
                Some(*peer)
            }
            Op::Copy { .. } | Op::Reduce { .. } | Op::Finalize { .. } => None,
        }
    }

    /// Elements sent by this operation.
    pub fn elems_sent(&self) -> usize {
        match self {
            Op::Send { src, .. } => src.len,
            _ => 0,
        }
    }

    /// Elements received by this operation.
    pub fn elems_received(&self) -> usize {
        match self {
            Op::Recv { dst, .. } | Op::RecvReduce { dst, .. } => dst.len,
            _ => 0,
        }
    }
}

/// Operations that may all progress at the same time.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Step {
    /// The operations.
    pub ops: Vec<Op>,
}

impl Step {
    /// Elements this step copies locally ([`Op::Copy`] between different regions), which
    /// the timing engines charge at the step's start.
    pub fn elems_copied_locally(&self) -> usize {
        self.ops
            .iter()
            .map(|op| match op {
                Op::Copy { src, dst } if src != dst => dst.len,
                _ => 0,
            })
            .sum()
    }

    /// Elements this step reduces locally ([`Op::Reduce`]), which the timing engines charge
    /// at the step's start.
    pub fn elems_reduced_locally(&self) -> usize {
        self.ops
            .iter()
            .map(|op| match op {
                Op::Reduce { dst, .. } => dst.len,
                _ => 0,
            })
            .sum()
    }
}

/// Everything one rank does for one collective.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RankSchedule {
    /// Steps in order.
    pub steps: Vec<Step>,
    /// Elements of scratch memory the schedule uses.
    pub scratch_elems: usize,
}

impl RankSchedule {
    pub(crate) fn step(&mut self, mut ops: Vec<Op>) {
        ops.retain(|op| !is_empty_transfer(op));
        if !ops.is_empty() {
            self.steps.push(Step { ops });
        }
    }

    /// Ranks this schedule sends to, sorted and without repeats.
    pub fn send_peers(&self) -> Vec<usize> {
        self.peers(|op| matches!(op, Op::Send { .. }))
    }

    /// Ranks this schedule receives from, sorted and without repeats.
    pub fn recv_peers(&self) -> Vec<usize> {
        self.peers(|op| matches!(op, Op::Recv { .. } | Op::RecvReduce { .. }))
    }

    /// Ranks that rank `rank` of `p` exchanges headers with in a call of this schedule: those
    /// it sends to or receives from, and both of its ring neighbours; sorted, without itself.
    pub fn header_peers(&self, rank: usize, p: usize) -> Vec<usize> {
        let mut peers = self.send_peers();
        peers.extend(self.recv_peers());
        if p > 1 {
            peers.extend([(rank + 1) % p, (rank + p - 1) % p]);
        }
        peers.sort_unstable();
        peers.dedup();
        peers.retain(|&q| q != rank);
        peers
    }

    fn peers(&self, keep: impl Fn(&Op) -> bool) -> Vec<usize> {
        let mut peers: Vec<usize> = self
            .steps
            .iter()
            .flat_map(|s| s.ops.iter())
            .filter(|op| keep(op))
            .filter_map(Op::peer)
            .collect();
        peers.sort_unstable();
        peers.dedup();
        peers
    }

    /// Steps that send or receive (local ones, such as a final division, not counted).
    pub fn message_steps(&self) -> usize {
        self.steps
            .iter()
            .filter(|st| st.ops.iter().any(|op| op.peer().is_some()))
            .count()
    }

    /// Total elements this rank sends.
    pub fn elems_sent(&self) -> usize {
        self.steps
            .iter()
            .flat_map(|s| &s.ops)
            .map(Op::elems_sent)
            .sum()
    }

    /// What each step sends, receives and reduces: the inputs of the cost model.
    pub fn traffic(&self) -> Vec<StepTraffic> {
        self.steps
            .iter()
            .map(|st| {
                let mut t = StepTraffic::default();
                for op in &st.ops {
                    match op {
                        Op::Send { peer, src } => t.sends.push((*peer, src.len)),
                        Op::Recv { peer, dst } => t.recvs.push((*peer, dst.len)),
                        Op::RecvReduce { peer, dst, .. } => {
                            t.recvs.push((*peer, dst.len));
                            t.reduced += dst.len;
                        }
                        Op::Reduce { dst, .. } => t.reduced += dst.len,
                        Op::Copy { .. } | Op::Finalize { .. } => {}
                    }
                }
                t
            })
            .collect()
    }

    /// Totals over all steps.
    pub fn totals(&self) -> Traffic {
        let mut total = Traffic::default();
        for t in self.traffic() {
            total.steps += 1;
            total.messages += t.sends.len();
            total.sent += t.sends.iter().map(|s| s.1).sum::<usize>();
            total.received += t.recvs.iter().map(|s| s.1).sum::<usize>();
            total.reduced += t.reduced;
        }
        total
    }

    /// Renames every peer `q` to `f(q)`: builders work on virtual ranks (relative to a root,
    /// or folded onto a power of two) and relabel at the end.
    pub(crate) fn map_peers(&mut self, f: impl Fn(usize) -> usize) {
        for op in self.steps.iter_mut().flat_map(|s| s.ops.iter_mut()) {
            match op {
                Op::Send { peer, .. } | Op::Recv { peer, .. } | Op::RecvReduce { peer, .. } => {
                    *peer = f(*peer)
                }
                Op::Copy { .. } | Op::Reduce { .. } | Op::Finalize { .. } => {}
            }
        }
    }

    /// Appends `other`'s steps after this schedule's and takes the larger scratch.
    #[cfg(test)]
    pub(crate) fn append(&mut self, other: RankSchedule) {
        self.steps.extend(other.steps);
        self.scratch_elems = self.scratch_elems.max(other.scratch_elems);
    }
}

/// The traffic of one step of one rank, in elements.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StepTraffic {
    /// (peer, elements) for every send, in order.
    pub sends: Vec<(usize, usize)>,
    /// (peer, elements) for every receive, in order.
    pub recvs: Vec<(usize, usize)>,
    /// Elements combined with the reduction operator.
    pub reduced: usize,
}

/// Totals over a whole schedule, in elements.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Traffic {
    /// Steps.
    pub steps: usize,
    /// Messages sent.
    pub messages: usize,
    /// Elements sent.
    pub sent: usize,
    /// Elements received.
    pub received: usize,
    /// Elements reduced.
    pub reduced: usize,
}

/// Zero-length transfers and copies are dropped; zero-length messages are never sent.
fn is_empty_transfer(op: &Op) -> bool {
    match op {
        Op::Send { src, .. } => src.len == 0,
        Op::Recv { dst, .. } | Op::RecvReduce { dst, .. } => dst.len == 0,
        Op::Copy { src, .. } | Op::Reduce { src, .. } => src.len == 0,
        Op::Finalize { region } => region.len == 0,
    }
}

/// The collective operations strata schedules.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Collective {
    /// Every rank ends with the reduction of all inputs.
    AllReduce,
    /// Every rank ends with the root's input.
    Broadcast,
    /// The root ends with the reduction of all inputs.
    Reduce,
    /// Every rank ends with the concatenation of all inputs.
    AllGather,
    /// Rank r ends with block r of the reduction of all inputs.
    ReduceScatter,
    /// Rank r sends its block j to rank j.
    AllToAll,
    /// The root ends with the concatenation of all inputs.
    Gather,
    /// Rank r ends with block r of the root's input.
    Scatter,
    /// Nobody leaves before everybody has arrived.
    Barrier,
    /// A point-to-point send.
    Send,
    /// A point-to-point receive.
    Recv,
}

impl Collective {
    /// Every collective, in a stable order.
    pub const ALL: [Collective; 11] = [
        Collective::AllReduce,
        Collective::Broadcast,
        Collective::Reduce,
        Collective::AllGather,
        Collective::ReduceScatter,
        Collective::AllToAll,
        Collective::Gather,
        Collective::Scatter,
        Collective::Barrier,
        Collective::Send,
        Collective::Recv,
    ];

    /// The collectives that move the caller's buffers (all but barrier, send and recv).
    pub const WITH_BUFFERS: [Collective; 8] = [
        Collective::AllReduce,
        Collective::Broadcast,
        Collective::Reduce,
        Collective::AllGather,
        Collective::ReduceScatter,
        Collective::AllToAll,
        Collective::Gather,
        Collective::Scatter,
    ];

    /// The snake_case name used on the command line and in errors.
    pub fn name(self) -> &'static str {
        match self {
            Collective::AllReduce => "all_reduce",
            Collective::Broadcast => "broadcast",
            Collective::Reduce => "reduce",
            Collective::AllGather => "all_gather",
            Collective::ReduceScatter => "reduce_scatter",
            Collective::AllToAll => "all_to_all",
            Collective::Gather => "gather",
            Collective::Scatter => "scatter",
            Collective::Barrier => "barrier",
            Collective::Send => "send",
            Collective::Recv => "recv",
        }
    }

    /// Parses a name as printed by [`Collective::name`] (dashes and no separators accepted).
    pub fn parse(s: &str) -> Option<Self> {
        let norm: String = s.chars().filter(|c| c.is_ascii_alphanumeric()).collect();
        Self::ALL
            .into_iter()
            .find(|c| c.name().replace('_', "").eq_ignore_ascii_case(&norm))
    }

    /// Whether the collective combines values with a reduction operator.
    pub fn reduces(self) -> bool {
        matches!(
            self,
            Collective::AllReduce | Collective::Reduce | Collective::ReduceScatter
        )
    }

    /// Whether the collective has a root rank.
    pub fn rooted(self) -> bool {
        matches!(
            self,
            Collective::Broadcast | Collective::Reduce | Collective::Gather | Collective::Scatter
        )
    }

    /// A stable numeric code for wire headers.
    pub fn code(self) -> u8 {
        Self::ALL.iter().position(|c| *c == self).unwrap_or(0) as u8
    }

    /// The inverse of [`Collective::code`].
    pub fn from_code(code: u8) -> Option<Self> {
        Self::ALL.get(code as usize).copied()
    }

    /// Elements of the input and output buffers rank `rank` needs for `count`, following
    /// NCCL's conventions (count is per rank for gather-like and scatter-like collectives).
    pub fn buffer_elems(
        self,
        count: usize,
        nranks: usize,
        rank: usize,
        root: usize,
    ) -> (usize, usize) {
        let is_root = rank == root;
        match self {
            Collective::AllReduce => (count, count),
            Collective::Broadcast => (if is_root { count } else { 0 }, count),
            Collective::Reduce => (count, if is_root { count } else { 0 }),
            Collective::AllGather => (count, count * nranks),
            Collective::ReduceScatter => (count * nranks, count),
            Collective::AllToAll => (count * nranks, count * nranks),
            Collective::Gather => (count, if is_root { count * nranks } else { 0 }),
            Collective::Scatter => (if is_root { count * nranks } else { 0 }, count),
            Collective::Barrier => (0, 0),
            Collective::Send => (count, 0),
            Collective::Recv => (0, count),
        }
    }
}

impl fmt::Display for Collective {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collective_lists_and_codes_agree() {
        assert_eq!(Collective::WITH_BUFFERS[..], Collective::ALL[..8]);
        assert!(
            Collective::ALL[8..]
                .iter()
                .all(|c| !Collective::WITH_BUFFERS.contains(c))
        );
        for c in Collective::ALL {
            assert_eq!(Collective::from_code(c.code()), Some(c));
            assert_eq!(Collective::parse(c.name()), Some(c));
        }
        assert_eq!(Collective::parse("AllReduce"), Some(Collective::AllReduce));
    }
}
