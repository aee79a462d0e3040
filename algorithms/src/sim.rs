//! An in-memory executor that runs every rank's schedule in one process, to check it or to
//! time it.
//!
//! A send completes only when the matching receive is the first pending receive from that
//! sender in the receiver's current step (rendezvous), which is stricter than any buffered
//! transport: a schedule that completes here cannot deadlock on bounded buffers. Transfers
//! are executed in time order from a priority queue, so the same engine checks results
//! ([`check`]) and prices schedules ([`crate::cost::price`]). When nothing can move, the
//! engine names the ranks that wait on each other in a cycle, or the rank that waits on one
//! that has already finished.
//!
//! The checker also rejects regions outside their buffer, message size mismatches,
//! operations of one step that touch the same memory, and wrong results. Its reduction is
//! wrapping addition on `u64` and its final step multiplies by 3, so a missing, repeated or
//! early `Finalize` shows up in the result.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap, HashSet};

use crate::cost::{Network, Uplink};
use crate::hierarchy::Hierarchy;
use crate::schedule::{Buf, Collective, Op, RankSchedule, Region};
use crate::{Algorithm, Plan, plan_on};

/// The final step applied by `Finalize` in the simulator.
pub const FINALIZE_FACTOR: u64 = 3;

/// How the simulated caller lays out its buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Separate input and output buffers.
    OutOfPlace,
    /// NCCL's in-place layout for the collective.
    InPlace,
}

/// What the engine does besides keeping time: move data, or nothing.
pub(crate) trait Effects {
    /// Runs a local operation (`Copy`, `Reduce` or `Finalize`) of `rank`.
    fn local(&mut self, rank: usize, op: &Op);
    /// Moves the data of a matched send (`from`) and receive (`to`).
    fn transfer(&mut self, from: usize, send: &Region, to: usize, recv: &Op);
}

/// Effects that only keep time.
pub(crate) struct TimeOnly;

impl Effects for TimeOnly {
    fn local(&mut self, _: usize, _: &Op) {}
    fn transfer(&mut self, _: usize, _: &Region, _: usize, _: &Op) {}
}

#[derive(Clone, Debug, Default)]
struct RankState {
    step: usize,
    /// When the current step started and when its last operation so far ends.
    start: f64,
    end: f64,
    pending: usize,
    done: Vec<bool>,
    send_free: f64,
    recv_free: f64,
    finished: bool,
}

/// A heap entry that pops earliest first: `at`, then `key`, both smallest first. The timing
/// engines keep their pending events in `BinaryHeap<Earliest<_>>` (a max-heap, hence the
/// reversed order).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Earliest<K> {
    pub at: f64,
    pub key: K,
}

impl<K: Ord> PartialEq for Earliest<K> {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl<K: Ord> Eq for Earliest<K> {}
impl<K: Ord> PartialOrd for Earliest<K> {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl<K: Ord> Ord for Earliest<K> {
    fn cmp(&self, o: &Self) -> Ordering {
        o.at.total_cmp(&self.at).then(o.key.cmp(&self.key))
    }
}

/// A send/receive pair that can be matched, keyed (sender, receiver) by its earliest start.
type Candidate = Earliest<(usize, usize)>;

struct Engine<'a> {
    scheds: &'a [RankSchedule],
    ranks: Vec<RankState>,
    heap: BinaryHeap<Candidate>,
    queued: HashSet<(usize, usize)>,
    net: Option<(&'a dyn Network, f64)>,
    /// Messages per (sender's step, uplink id), counted before timing.
    sharing: HashMap<(usize, u64), u32>,
    uplinks: Vec<Uplink>,
}

impl Engine<'_> {
    fn ops(&self, r: usize) -> &[Op] {
        self.scheds[r]
            .steps
            .get(self.ranks[r].step)
            .map_or(&[], |s| &s.ops)
    }

    fn pending_send(&self, from: usize, to: usize) -> Option<usize> {
        let done = &self.ranks[from].done;
        self.ops(from).iter().enumerate().position(|(i, op)| {
            // A rank that has not entered its step yet has no `done` flags: nothing pending.
            done.get(i) == Some(&false) && matches!(op, Op::Send { peer, .. } if *peer == to)
        })
    }

    fn pending_recv(&self, to: usize, from: usize) -> Option<usize> {
        let done = &self.ranks[to].done;
        self.ops(to).iter().enumerate().position(|(i, op)| {
            done.get(i) == Some(&false)
                && matches!(op, Op::Recv { peer, .. } | Op::RecvReduce { peer, .. } if *peer == from)
        })
    }

    fn earliest(&self, from: usize, to: usize) -> f64 {
        let (a, b) = (&self.ranks[from], &self.ranks[to]);
        a.start.max(b.start).max(a.send_free).max(b.recv_free)
    }

    fn try_match(&mut self, from: usize, to: usize) {
        if self.ranks[from].finished
            || self.ranks[to].finished
            || self.queued.contains(&(from, to))
            || self.pending_send(from, to).is_none()
            || self.pending_recv(to, from).is_none()
        {
            return;
        }
        self.queued.insert((from, to));
        let at = self.earliest(from, to);
        self.heap.push(Candidate {
            at,
            key: (from, to),
        });
    }

    /// Starts rank `r`'s current step (skipping steps with no transfers).
    fn enter(&mut self, r: usize, fx: &mut dyn Effects) {
        loop {
            let Some(step) = self.scheds[r].steps.get(self.ranks[r].step) else {
                self.ranks[r].finished = true;
                return;
            };
            // Local reductions and copies run when the step starts, one after another,
            // before its transfers.
            let reducing = match (self.net, step.elems_reduced_locally()) {
                (Some((net, elem_bytes)), elems) if elems > 0 => {
                    elems as f64 * elem_bytes * net.link(r, r).gamma
                }
                _ => 0.0,
            } + match (self.net, step.elems_copied_locally()) {
                (Some((net, elem_bytes)), elems) if elems > 0 => {
                    elems as f64 * elem_bytes * net.copy_beta(r)
                }
                _ => 0.0,
            };
            let st = &mut self.ranks[r];
            st.end += reducing;
            st.start = st.end;
            st.done = vec![false; step.ops.len()];
            st.pending = 0;
            for (i, op) in step.ops.iter().enumerate() {
                if op.peer().is_none() {
                    fx.local(r, op);
                    st.done[i] = true;
                } else {
                    st.pending += 1;
                }
            }
            if st.pending > 0 {
                break;
            }
            st.step += 1;
        }
        let peers: Vec<(usize, bool)> = self
            .ops(r)
            .iter()
            .filter_map(|op| op.peer().map(|q| (q, matches!(op, Op::Send { .. }))))
            .collect();
        for (q, sends) in peers {
            if sends {
                self.try_match(r, q);
            } else {
                self.try_match(q, r);
            }
        }
    }

    fn mark_done(&mut self, r: usize, i: usize, end: f64) {
        let st = &mut self.ranks[r];
        st.done[i] = true;
        st.pending -= 1;
        st.end = st.end.max(end);
    }

    fn advance_if_done(&mut self, r: usize, fx: &mut dyn Effects) {
        let st = &mut self.ranks[r];
        if st.pending == 0 && !st.finished {
            st.step += 1;
            self.enter(r, fx);
        }
    }

    fn run(mut self, fx: &mut dyn Effects) -> Result<Vec<f64>, String> {
        for r in 0..self.scheds.len() {
            self.enter(r, fx);
        }
        while let Some(c) = self.heap.pop() {
            let (from, to) = c.key;
            let at = self.earliest(from, to);
            if at > c.at {
                self.heap.push(Candidate { at, key: c.key });
                continue;
            }
            self.queued.remove(&(from, to));
            let (Some(i), Some(j)) = (self.pending_send(from, to), self.pending_recv(to, from))
            else {
                return Err(format!("internal: transfer {} -> {} vanished", from, to));
            };
            let Op::Send { src, .. } = self.ops(from)[i] else {
                unreachable!("pending_send returns sends")
            };
            let recv = self.ops(to)[j].clone();
            let (dst, reduces) = match &recv {
                Op::RecvReduce { dst, .. } => (*dst, true),
                Op::Recv { dst, .. } => (*dst, false),
                _ => unreachable!("pending_recv returns receives"),
            };
            if dst.len != src.len {
                return Err(format!(
                    "rank {} sends {} elements to rank {}, which expects {} (its step {})",
                    from, src.len, to, dst.len, self.ranks[to].step
                ));
            }
            fx.transfer(from, &src, to, &recv);
            let (finish, recv_end) = match self.net {
                Some((net, elem_bytes)) => {
                    let link = net.link(from, to);
                    let bytes = src.len as f64 * elem_bytes;
                    let mut beta = link.beta;
                    if !self.sharing.is_empty() {
                        let step = self.ranks[from].step;
                        net.uplinks(from, to, &mut self.uplinks);
                        for up in &self.uplinks {
                            let k = self.sharing.get(&(step, up.id)).copied().unwrap_or(1);
                            beta = beta.max(up.shared_beta(k));
                        }
                    }
                    let finish = at + link.alpha + net.fill_seconds(from, to, bytes) + bytes * beta;
                    let extra = if reduces { bytes * link.gamma } else { 0.0 };
                    (finish, finish + extra)
                }
                None => (0.0, 0.0),
            };
            self.ranks[from].send_free = finish;
            self.ranks[to].recv_free = recv_end;
            // Both ends are marked before either moves on, so that a rank entering its next
            // step never matches the other end's operation that just completed.
            self.mark_done(from, i, finish);
            self.mark_done(to, j, recv_end);
            self.advance_if_done(from, fx);
            self.advance_if_done(to, fx);
            self.try_match(from, to);
        }
        if let Some(stuck) = self.ranks.iter().position(|s| !s.finished) {
            return Err(self.explain_stall(stuck));
        }
        Ok(self.ranks.iter().map(|s| s.end).collect())
    }

    /// Follows "waits on" edges from `start` until a rank repeats (a cycle) or a finished
    /// rank is reached.
    fn explain_stall(&self, start: usize) -> String {
        let waits_on = |r: usize| {
            let done = &self.ranks[r].done;
            self.ops(r)
                .iter()
                .enumerate()
                .find(|(i, op)| !done[*i] && op.peer().is_some())
                .map(|(_, op)| (op.peer().unwrap_or(r), op.clone()))
        };
        let mut path: Vec<usize> = Vec::new();
        let mut r = start;
        loop {
            if let Some(k) = path.iter().position(|&x| x == r) {
                let cycle: Vec<String> = path[k..]
                    .iter()
                    .map(|&x| {
                        let (_, op) = waits_on(x).expect("stuck ranks wait on someone");
                        format!("rank {x} (step {}: {op:?})", self.ranks[x].step)
                    })
                    .collect();
                return format!("deadlock: {} wait on each other", cycle.join(" -> "));
            }
            if self.ranks[r].finished {
                let w = path.last().copied().unwrap_or(start);
                let (_, op) = waits_on(w).expect("stuck ranks wait on someone");
                return format!(
                    "deadlock: rank {w} (step {}: {op:?}) waits on rank {r}, which has finished",
                    self.ranks[w].step
                );
            }
            path.push(r);
            match waits_on(r) {
                Some((q, _)) => r = q,
                None => return format!("internal: rank {r} is stuck with nothing pending"),
            }
        }
    }
}

/// Checks that every peer exists and is not the rank itself.
fn check_peers(schedules: &[RankSchedule]) -> Result<(), String> {
    let p = schedules.len();
    for (r, s) in schedules.iter().enumerate() {
        for (si, st) in s.steps.iter().enumerate() {
            for op in &st.ops {
                if let Some(q) = op.peer()
                    && (q >= p || q == r)
                {
                    return Err(format!("rank {r} step {si}: invalid peer {q} in {op:?}"));
                }
            }
        }
    }
    Ok(())
}

/// Runs `schedules` in time order on `net` and returns when each rank finishes.
pub(crate) fn time(
    schedules: &[RankSchedule],
    net: &dyn Network,
    elem_bytes: f64,
) -> Result<Vec<f64>, String> {
    check_peers(schedules)?;
    if net.flow_level() {
        return crate::fluid::time(schedules, net, elem_bytes);
    }
    let sharing = count_sharing(schedules, net);
    execute(schedules, &mut TimeOnly, Some((net, elem_bytes)), sharing)
}

/// How many messages cross each shared uplink in each step (by the sender's step index).
fn count_sharing(schedules: &[RankSchedule], net: &dyn Network) -> HashMap<(usize, u64), u32> {
    let mut sharing = HashMap::new();
    let mut links = Vec::new();
    for (r, s) in schedules.iter().enumerate() {
        for (si, st) in s.steps.iter().enumerate() {
            for op in &st.ops {
                if let Op::Send { peer, .. } = op {
                    net.uplinks(r, *peer, &mut links);
                    for up in &links {
                        *sharing.entry((si, up.id)).or_insert(0u32) += 1;
                    }
                }
            }
        }
    }
    sharing
}

/// The most messages that cross one shared uplink in one step of `schedules` on `net`.
pub fn max_sharing(schedules: &[RankSchedule], net: &dyn Network) -> u32 {
    if check_peers(schedules).is_err() {
        return 0;
    }
    count_sharing(schedules, net)
        .values()
        .copied()
        .max()
        .unwrap_or(0)
}

fn execute(
    schedules: &[RankSchedule],
    fx: &mut dyn Effects,
    net: Option<(&dyn Network, f64)>,
    sharing: HashMap<(usize, u64), u32>,
) -> Result<Vec<f64>, String> {
    check_peers(schedules)?;
    Engine {
        scheds: schedules,
        ranks: vec![RankState::default(); schedules.len()],
        heap: BinaryHeap::new(),
        queued: HashSet::new(),
        net,
        sharing,
        uplinks: Vec::new(),
    }
    .run(fx)
}

struct RankMem {
    mem: Vec<u64>,
    input: (usize, usize),
    output: (usize, usize),
    scratch: (usize, usize),
}

impl RankMem {
    fn span(&self, r: &Region) -> (usize, usize) {
        let base = match r.buf {
            Buf::Input => self.input.0,
            Buf::Output => self.output.0,
            Buf::Scratch => self.scratch.0,
        };
        (base + r.offset, base + r.offset + r.len)
    }

    fn limit(&self, buf: Buf) -> usize {
        match buf {
            Buf::Input => self.input.1,
            Buf::Output => self.output.1,
            Buf::Scratch => self.scratch.1,
        }
    }
}

struct Data<'a> {
    mems: &'a mut [RankMem],
}

impl Effects for Data<'_> {
    fn local(&mut self, r: usize, op: &Op) {
        let m = &mut self.mems[r];
        match op {
            Op::Copy { src, dst } => {
                let (s, d) = (m.span(src), m.span(dst));
                m.mem.copy_within(s.0..s.1, d.0);
            }
            Op::Reduce { src, with, dst } => {
                let (a, b, d) = (m.span(src), m.span(with), m.span(dst));
                for k in 0..d.1 - d.0 {
                    m.mem[d.0 + k] = m.mem[a.0 + k].wrapping_add(m.mem[b.0 + k]);
                }
            }
            Op::Finalize { region } => {
                let (a, b) = m.span(region);
                for x in &mut m.mem[a..b] {
                    *x = x.wrapping_mul(FINALIZE_FACTOR);
                }
            }
            _ => {}
        }
    }

    fn transfer(&mut self, from: usize, send: &Region, to: usize, recv: &Op) {
        let s = self.mems[from].span(send);
        let data: Vec<u64> = self.mems[from].mem[s.0..s.1].to_vec();
        let m = &mut self.mems[to];
        match recv {
            Op::Recv { dst, .. } => {
                let d = m.span(dst);
                m.mem[d.0..d.1].copy_from_slice(&data);
            }
            Op::RecvReduce { src, dst, .. } => {
                let (ls, d) = (m.span(src), m.span(dst));
                let local: Vec<u64> = m.mem[ls.0..ls.1].to_vec();
                for (k, x) in m.mem[d.0..d.1].iter_mut().enumerate() {
                    *x = local[k].wrapping_add(data[k]);
                }
            }
            _ => {}
        }
    }
}

/// Deterministic input element for (rank, index).
pub fn input_value(rank: usize, i: usize) -> u64 {
    (rank as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ (i as u64).wrapping_mul(0xBF58_476D_1CE4_E5B9)
}

/// Builds every rank's schedule for the given shape, all ranks on one host (hierarchical
/// algorithms then have a single level).
pub fn schedules(
    collective: Collective,
    algorithm: Algorithm,
    nranks: usize,
    count: usize,
    root: usize,
    chunk_elems: usize,
) -> Result<Vec<RankSchedule>, String> {
    let h = Hierarchy::single_host(nranks);
    schedules_on(collective, algorithm, &h, false, count, root, chunk_elems)
}

/// Builds every rank's schedule on a communicator laid out as `h` ([`crate::plan_on`]).
#[allow(clippy::too_many_arguments)]
pub fn schedules_on(
    collective: Collective,
    algorithm: Algorithm,
    h: &Hierarchy,
    ordered: bool,
    count: usize,
    root: usize,
    chunk_elems: usize,
) -> Result<Vec<RankSchedule>, String> {
    let nranks = h.len();
    (0..nranks)
        .map(|rank| {
            plan_on(
                &Plan {
                    collective,
                    algorithm,
                    nranks,
                    rank,
                    count,
                    root,
                    chunk_elems,
                },
                h,
                ordered,
            )
            .map_err(|e| e.to_string())
        })
        .collect()
}

/// [`check`] on a communicator laid out as `h`, in topology order when `ordered`.
pub fn check_on(
    collective: Collective,
    algorithm: Algorithm,
    h: &Hierarchy,
    ordered: bool,
    count: usize,
    root: usize,
    placement: Placement,
) -> Result<Vec<RankSchedule>, String> {
    let what = format!(
        "{collective}/{algorithm} on {} ordered={ordered} n={count} root={root} {placement:?}",
        h.describe()
    );
    let scheds = schedules_on(collective, algorithm, h, ordered, count, root, 3)
        .map_err(|e| format!("{what}: {e}"))?;
    check_schedules(collective, &scheds, count, root, placement)
        .map_err(|e| format!("{what}: {e}"))?;
    Ok(scheds)
}

/// Runs `collective` with `algorithm` for every rank and checks the result against a plain
/// reference. Returns the schedules on success so callers can inspect them.
pub fn check(
    collective: Collective,
    algorithm: Algorithm,
    nranks: usize,
    count: usize,
    root: usize,
    placement: Placement,
) -> Result<Vec<RankSchedule>, String> {
    let what = format!("{collective}/{algorithm} p={nranks} n={count} root={root} {placement:?}");
    // Chunks of 3 elements, so pipelined schedules pipeline even at small counts.
    let scheds = schedules(collective, algorithm, nranks, count, root, 3)?;
    check_schedules(collective, &scheds, count, root, placement)
        .map_err(|e| format!("{what}: {e}"))?;
    Ok(scheds)
}

/// Checks given schedules (one per rank) for `collective`.
pub fn check_schedules(
    collective: Collective,
    scheds: &[RankSchedule],
    count: usize,
    root: usize,
    placement: Placement,
) -> Result<(), String> {
    let nranks = scheds.len();
    let mut mems: Vec<RankMem> = (0..nranks)
        .map(|r| {
            layout(
                collective,
                nranks,
                r,
                count,
                root,
                placement,
                scheds[r].scratch_elems,
            )
        })
        .collect();
    let inputs: Vec<Vec<u64>> = (0..nranks)
        .map(|r| {
            let (ilen, _) = collective.buffer_elems(count, nranks, r, root);
            (0..ilen).map(|i| input_value(r, i)).collect()
        })
        .collect();
    for (r, m) in mems.iter_mut().enumerate() {
        let b = m.input.0;
        m.mem[b..b + inputs[r].len()].copy_from_slice(&inputs[r]);
        for (si, st) in scheds[r].steps.iter().enumerate() {
            check_step(r, si, &st.ops, m)?;
        }
    }
    execute(scheds, &mut Data { mems: &mut mems }, None, HashMap::new())?;
    // Element-wise sums of every input, computed once (not once per rank).
    let mut totals = vec![
        0u64;
        if collective.reduces() {
            inputs[0].len()
        } else {
            0
        }
    ];
    for v in inputs.iter().filter(|_| collective.reduces()) {
        for (t, x) in totals.iter_mut().zip(v) {
            *t = t.wrapping_add(*x);
        }
    }
    for (r, m) in mems.iter().enumerate() {
        let Some(expect) = reference(collective, nranks, r, count, root, &inputs, &totals) else {
            continue;
        };
        let got = &m.mem[m.output.0..m.output.0 + m.output.1];
        if got != expect.as_slice() {
            let at = got
                .iter()
                .zip(&expect)
                .position(|(a, b)| a != b)
                .unwrap_or(0);
            return Err(format!("rank {r} wrong at element {at}"));
        }
    }
    Ok(())
}

fn layout(
    c: Collective,
    p: usize,
    r: usize,
    n: usize,
    root: usize,
    pl: Placement,
    scratch: usize,
) -> RankMem {
    let (ilen, olen) = c.buffer_elems(n, p, r, root);
    let in_place_offset: Option<(bool, usize)> = match (pl, c) {
        (Placement::OutOfPlace, _) => None,
        // (input lives inside output?, offset)
        (_, Collective::AllReduce) => Some((true, 0)),
        (_, Collective::Broadcast | Collective::Reduce) if r == root => Some((true, 0)),
        (_, Collective::AllGather) => Some((true, r * n)),
        (_, Collective::Gather) if r == root => Some((true, r * n)),
        (_, Collective::ReduceScatter) => Some((false, r * n)),
        (_, Collective::Scatter) if r == root => Some((false, r * n)),
        _ => None,
    };
    let (input, output, used) = match in_place_offset {
        None => (0, ilen, ilen + olen),
        Some((true, off)) => (off, 0, olen),
        Some((false, off)) => (0, off, ilen),
    };
    RankMem {
        mem: vec![0xDEAD_BEEF; used + scratch],
        input: (input, ilen),
        output: (output, olen),
        scratch: (used, scratch),
    }
}

fn reference(
    c: Collective,
    p: usize,
    r: usize,
    n: usize,
    root: usize,
    inputs: &[Vec<u64>],
    totals: &[u64],
) -> Option<Vec<u64>> {
    let sum = |idx: usize| totals[idx].wrapping_mul(FINALIZE_FACTOR);
    let nn = n.max(1);
    Some(match c {
        Collective::AllReduce => (0..n).map(sum).collect(),
        Collective::Reduce if r == root => (0..n).map(sum).collect(),
        Collective::Broadcast => inputs[root].clone(),
        Collective::AllGather => (0..p * n).map(|k| inputs[k / nn][k % nn]).collect(),
        Collective::Gather if r == root => (0..p * n).map(|k| inputs[k / nn][k % nn]).collect(),
        Collective::ReduceScatter => (0..n).map(|i| sum(r * n + i)).collect(),
        Collective::AllToAll => (0..p * n).map(|k| inputs[k / nn][r * n + k % nn]).collect(),
        Collective::Scatter => inputs[root][r * n..(r + 1) * n].to_vec(),
        _ => return None,
    })
}

fn reads(op: &Op) -> [Option<&Region>; 2] {
    match op {
        Op::Send { src, .. } | Op::RecvReduce { src, .. } | Op::Copy { src, .. } => {
            [Some(src), None]
        }
        Op::Reduce { src, with, .. } => [Some(src), Some(with)],
        Op::Finalize { region } => [Some(region), None],
        Op::Recv { .. } => [None, None],
    }
}

fn writes(op: &Op) -> Option<&Region> {
    match op {
        Op::Recv { dst, .. }
        | Op::RecvReduce { dst, .. }
        | Op::Copy { dst, .. }
        | Op::Reduce { dst, .. } => Some(dst),
        Op::Finalize { region } => Some(region),
        Op::Send { .. } => None,
    }
}

fn overlap(a: (usize, usize), b: (usize, usize)) -> bool {
    a.0 < b.1 && b.0 < a.1 && a.0 < a.1 && b.0 < b.1
}

/// Rejects regions outside their buffer and operations of one step that write memory another
/// operation of the step touches.
fn check_step(rank: usize, si: usize, ops: &[Op], m: &RankMem) -> Result<(), String> {
    for op in ops {
        let [a, b] = reads(op);
        for r in [a, b, writes(op)].into_iter().flatten() {
            if r.end() > m.limit(r.buf) {
                return Err(format!(
                    "rank {rank} step {si}: {op:?} goes past the end of {:?} ({} elements)",
                    r.buf,
                    m.limit(r.buf)
                ));
            }
        }
    }
    // A copy onto itself (in place) is skipped by the runtime and touches nothing.
    let is_noop = |op: &Op| matches!(op, Op::Copy { src, dst } if m.span(src) == m.span(dst));
    let ops: Vec<&Op> = ops.iter().filter(|op| !is_noop(op)).collect();
    // Sorting by start finds every overlap of a write with a neighbour in O(k log k).
    let mut spans: Vec<((usize, usize), usize, bool)> = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        if let Some(w) = writes(op) {
            spans.push((m.span(w), i, true));
        }
        for rd in reads(op).into_iter().flatten() {
            spans.push((m.span(rd), i, false));
        }
    }
    spans.retain(|(s, _, _)| s.0 < s.1);
    spans.sort_unstable();
    for (k, (a, i, wa)) in spans.iter().enumerate() {
        for (b, j, wb) in spans[k + 1..].iter() {
            if b.0 >= a.1 {
                break;
            }
            if i != j && (*wa || *wb) && overlap(*a, *b) {
                return Err(format!(
                    "rank {rank} step {si}: {:?} and {:?} touch the same memory",
                    ops[*i], ops[*j]
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithms_for;
    use proptest::prelude::*;

    const COLLECTIVES: [Collective; 8] = Collective::WITH_BUFFERS;

    fn placements(c: Collective) -> &'static [Placement] {
        if c == Collective::AllToAll {
            // The runtime gives all-to-all a private input copy when called in place.
            &[Placement::OutOfPlace]
        } else {
            &[Placement::OutOfPlace, Placement::InPlace]
        }
    }

    #[test]
    fn every_algorithm_small_shapes() {
        for c in COLLECTIVES {
            for &a in algorithms_for(c) {
                for p in (1..=9).filter(|&p| a.runs_on(p)) {
                    for n in [0, 1, 2, 5, 7, 16, 17] {
                        for root in [0, p / 2, p - 1] {
                            for &pl in placements(c) {
                                check(c, a, p, n, root, pl).unwrap();
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn barrier_completes() {
        for p in 1..=33 {
            let s = check(
                Collective::Barrier,
                Algorithm::Dissemination,
                p,
                0,
                0,
                Placement::OutOfPlace,
            )
            .unwrap();
            let rounds = (p as f64).log2().ceil() as usize;
            assert!(s.iter().all(|s| s.steps.len() == rounds));
        }
    }

    /// The ranks of `p` laid out for a ring all-reduce whose all-gather is cut short.
    fn truncated_ring(p: usize, n: usize, keep: usize) -> Vec<RankSchedule> {
        (0..p)
            .map(|r| {
                let mut s = crate::builders::composed_all_reduce(
                    crate::ReduceScatterPart::Ring,
                    crate::AllGatherPart::Ring,
                    p,
                    r,
                    n,
                );
                s.steps.truncate(keep);
                s
            })
            .collect()
    }

    #[test]
    fn detects_wrong_results_unmatched_messages_and_cycles() {
        let e = check_schedules(
            Collective::AllReduce,
            &truncated_ring(3, 9, 3),
            9,
            0,
            Placement::OutOfPlace,
        )
        .unwrap_err();
        assert!(e.contains("wrong at element"), "{e}");

        let send = |peer| Op::Send {
            peer,
            src: Region::new(Buf::Input, 0, 1),
        };
        let recv = |peer| Op::Recv {
            peer,
            dst: Region::new(Buf::Output, 0, 1),
        };
        let one = |ops: Vec<Vec<Op>>| {
            let mut s = RankSchedule::default();
            for o in ops {
                s.step(o);
            }
            s
        };
        // A lone send with no receiver.
        let lone = vec![one(vec![vec![send(1)]]), RankSchedule::default()];
        let e =
            check_schedules(Collective::AllReduce, &lone, 1, 0, Placement::OutOfPlace).unwrap_err();
        assert!(e.contains("rank 0") && e.contains("has finished"), "{e}");
        // Three ranks that each receive before they send: a cycle 0 -> 2 -> 1 -> 0.
        let cyc: Vec<RankSchedule> = (0..3)
            .map(|r| one(vec![vec![recv((r + 2) % 3)], vec![send((r + 1) % 3)]]))
            .collect();
        let e =
            check_schedules(Collective::AllReduce, &cyc, 1, 0, Placement::OutOfPlace).unwrap_err();
        assert!(e.contains("wait on each other"), "{e}");
        assert!(
            e.contains("rank 0") && e.contains("rank 1") && e.contains("rank 2"),
            "{e}"
        );
        // Sizes that disagree.
        let bad = vec![
            one(vec![vec![Op::Send {
                peer: 1,
                src: Region::new(Buf::Input, 0, 1),
            }]]),
            one(vec![vec![Op::Recv {
                peer: 0,
                dst: Region::new(Buf::Output, 0, 2),
            }]]),
        ];
        let e =
            check_schedules(Collective::AllReduce, &bad, 2, 0, Placement::OutOfPlace).unwrap_err();
        assert!(e.contains("expects 2"), "{e}");
        // Out of bounds and overlapping writes.
        let oob = vec![one(vec![vec![Op::Copy {
            src: Region::new(Buf::Input, 0, 1),
            dst: Region::new(Buf::Output, 1, 1),
        }]])];
        let e =
            check_schedules(Collective::AllReduce, &oob, 1, 0, Placement::OutOfPlace).unwrap_err();
        assert!(e.contains("past the end"), "{e}");
        let clash = vec![one(vec![vec![
            Op::Copy {
                src: Region::new(Buf::Input, 0, 2),
                dst: Region::new(Buf::Output, 0, 2),
            },
            Op::Finalize {
                region: Region::new(Buf::Output, 1, 1),
            },
        ]])];
        let e = check_schedules(Collective::AllReduce, &clash, 2, 0, Placement::OutOfPlace)
            .unwrap_err();
        assert!(e.contains("touch the same memory"), "{e}");
    }

    /// Spot checks far beyond the proptest range: every algorithm at 1,000 ranks; the
    /// logarithmic ones at 4,096 as well (Bruck all-to-all excepted: its p/2 block copies per
    /// round make it take 12 s there, for nothing the 1,000-rank run does not cover).
    #[test]
    fn large_rank_counts() {
        for c in COLLECTIVES {
            for &a in algorithms_for(c).iter().filter(|a| a.runs_on(1000)) {
                check(c, a, 1000, 3, 17, Placement::OutOfPlace).unwrap();
            }
        }
        let big = [
            (Collective::AllReduce, Algorithm::RecursiveDoubling, 3),
            (Collective::AllReduce, Algorithm::Rabenseifner, 5000),
            (Collective::AllReduce, Algorithm::Tree, 40),
            (
                Collective::AllReduce,
                Algorithm::Composed(
                    crate::ReduceScatterPart::Halving,
                    crate::AllGatherPart::Bruck,
                ),
                4099,
            ),
            (Collective::AllGather, Algorithm::RecursiveDoubling, 1),
            (Collective::AllGather, Algorithm::Bruck, 1),
            (Collective::ReduceScatter, Algorithm::RecursiveHalving, 1),
            (Collective::Broadcast, Algorithm::BinomialTree, 2),
            (Collective::Reduce, Algorithm::BinomialTree, 2),
            (Collective::Reduce, Algorithm::ReduceScatterGather, 4096),
            (Collective::Gather, Algorithm::BinomialTree, 1),
            (Collective::Scatter, Algorithm::BinomialTree, 1),
        ];
        for (c, a, n) in big {
            check(c, a, 4096, n, 4095, Placement::InPlace.min_for(c)).unwrap();
        }
        check(
            Collective::Barrier,
            Algorithm::Dissemination,
            4096,
            0,
            0,
            Placement::OutOfPlace,
        )
        .unwrap();
    }

    impl Placement {
        fn min_for(self, c: Collective) -> Placement {
            if c == Collective::AllToAll {
                Placement::OutOfPlace
            } else {
                self
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1000))]
        #[test]
        fn random_shapes(ci in 0usize..8, p in 1usize..=64, n in 0usize..300,
                         root_seed in 0usize..1000, in_place: bool) {
            let c = COLLECTIVES[ci];
            let root = root_seed % p;
            let pl = if in_place { Placement::InPlace.min_for(c) } else { Placement::OutOfPlace };
            for &a in algorithms_for(c).iter().filter(|a| a.runs_on(p)) {
                let r = check(c, a, p, n, root, pl);
                prop_assert!(r.is_ok(), "{:?}", r.err());
            }
        }
    }
}
