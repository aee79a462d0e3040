//! The lean timing engine behind fast pricing: max-plus over the steps of every rank, with
//! contention counted per step instead of simulated over time.
//!
//! A transfer starts α after both ends have entered the steps that hold it (the rule of the
//! flow-level engine, `crate::fluid`), and moves its bytes at the slowest of
//! * its own link (`1 / β` of the pair),
//! * the sender's and receiver's ports (per direction, and apart for messages that stay on the
//!   host and those that leave it): a port that a step uses for several peers is busy from
//!   the earliest of their starts until it has moved all their bytes, so a message that
//!   shares it ends no sooner than that (work-conserving, as max-min sharing is),
//! * every shared uplink it crosses, divided among the messages that cross it at the same
//!   time (water-filling, as on a port).
//!
//! Which messages overlap on an uplink is only known once they are timed, so the engine runs
//! to a fixed point: the first pass ignores uplinks, each later pass gives every message that
//! crosses one the time sharing took it in the previous pass, until no end moves (a few
//! passes; schedules whose messages overlap alike converge in one).
//!
//! A reducing receive ends `bytes × γ` after its data arrived, one reduction at a time per
//! rank. Within a pass no duration depends on when another transfer runs, so every transfer
//! is timed once, when both of its ends are known, with no event queue: cost O(operations)
//! per pass.

use std::collections::HashMap;

use crate::cost::{Network, Uplink};
use crate::schedule::{Op, RankSchedule};

/// What a transfer does at this end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Send,
    Recv,
    RecvReduce,
}

/// One transfer of a rank's schedule, as much as timing needs (16 bytes instead of an
/// [`Op`]'s 64).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Transfer {
    pub(super) peer: u32,
    pub(super) kind: Kind,
    pub(super) elems: u64,
}

impl Transfer {
    pub(super) fn peer(&self) -> usize {
        self.peer as usize
    }

    pub(super) fn sends(&self) -> bool {
        self.kind == Kind::Send
    }
}

/// A rank's schedule without its local operations and empty steps.
#[derive(Clone, Debug, Default)]
pub(crate) struct Compact {
    pub(super) transfers: Vec<Transfer>,
    /// Where each step starts in `transfers`, and the end.
    pub(super) bounds: Vec<u32>,
}

impl Compact {
    pub(crate) fn new(s: &RankSchedule) -> Self {
        let mut c = Compact {
            transfers: Vec::new(),
            bounds: vec![0],
        };
        for st in &s.steps {
            for op in &st.ops {
                let (peer, kind, elems) = match op {
                    Op::Send { peer, src } => (*peer, Kind::Send, src.len),
                    Op::Recv { peer, dst } => (*peer, Kind::Recv, dst.len),
                    Op::RecvReduce { peer, dst, .. } => (*peer, Kind::RecvReduce, dst.len),
                    // Local reductions are in one-shot schedules only, which fast pricing
                    // hands to the full simulation.
                    Op::Copy { .. } | Op::Reduce { .. } | Op::Finalize { .. } => continue,
                };
                c.transfers.push(Transfer {
                    peer: peer as u32,
                    kind,
                    elems: elems as u64,
                });
            }
            let end = c.transfers.len() as u32;
            if end > *c.bounds.last().unwrap_or(&0) {
                c.bounds.push(end);
            }
        }
        c
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

#[derive(Clone, Default)]
struct RankState {
    step: usize,
    /// When the rank entered its current step.
    entered: f64,
    /// When the last operation of the current step so far ends.
    end: f64,
    pending: usize,
    matched: Vec<bool>,
    reduce_free: f64,
    finished: bool,
}

/// Most passes of the fixed point over uplink sharing.
const MAX_PASSES: usize = 12;

/// Above this many messages crossing shared uplinks, sharing stays at the first estimate
/// (messages per uplink per step), which is exact when ranks cross in step and pessimistic
/// when they drift; refining it costs O(classes²) per uplink and pass.
const MAX_REFINED_CROSSINGS: usize = 50_000;

/// Passes stop once no rank's end moves by more than this fraction.
const SETTLED: f64 = 1e-4;

/// Times `schedules` on `net`, every rank entering its first step at `start[rank]`; returns
/// when each rank finishes.
pub(crate) fn time(
    schedules: &[Compact],
    net: &dyn Network,
    elem_bytes: f64,
    start: &[f64],
) -> Result<Vec<f64>, String> {
    let sharing = count_sharing(schedules, net);
    let mut through: HashMap<FlowKey, Vec<(u64, f64)>> = HashMap::new();
    let mut last: Vec<f64> = Vec::new();
    for _ in 0..MAX_PASSES {
        let (ends, crossing) = pass(schedules, net, elem_bytes, start, &sharing, &through)?;
        let settled = ends.len() == last.len()
            && ends
                .iter()
                .zip(&last)
                .all(|(a, b)| (a - b).abs() <= SETTLED * a.abs().max(1e-12));
        if crossing.is_empty() || settled || crossing.len() > MAX_REFINED_CROSSINGS {
            return Ok(ends);
        }
        // Max-min across uplinks for these starts: each uplink in turn, with what the others
        // gave each message in the round before, a few rounds.
        let mut shared = HashMap::new();
        for _ in 0..2 {
            shared = share_uplinks(&crossing, &shared);
        }
        // Halfway to the new shares, so that passes do not swing between too much overlap
        // and too little.
        for (key, took) in shared.iter_mut() {
            if let Some(old) = through.get(key) {
                for (id, t) in took.iter_mut() {
                    if let Some((_, o)) = old.iter().find(|(i, _)| i == id) {
                        *t = 0.5 * (*t + o);
                    }
                }
            }
        }
        through = shared;
        last = ends;
    }
    Ok(last)
}

/// Messages per (sender's step, shared uplink), each pair of ranks once per step: the first
/// estimate of sharing, exact when every rank crosses its uplinks in the same step.
fn count_sharing(schedules: &[Compact], net: &dyn Network) -> HashMap<(usize, u64), u32> {
    let mut sharing = HashMap::new();
    let mut links = Vec::new();
    let mut peers: Vec<usize> = Vec::new();
    for (r, s) in schedules.iter().enumerate() {
        for si in 0..s.steps() {
            peers.clear();
            for t in s.step(si).iter().filter(|t| t.sends()) {
                if peers.contains(&t.peer()) {
                    continue;
                }
                peers.push(t.peer());
                net.uplinks(r, t.peer(), &mut links);
                for up in &links {
                    *sharing.entry((si, up.id)).or_insert(0u32) += 1;
                }
            }
        }
    }
    sharing
}

/// A rank's port in one of its steps: (rank, step, sends, leaves the host).
type PortKey = (usize, usize, bool, bool);

/// A message, named by its sender, the sender's step and the operation's index in it.
type FlowKey = (u32, u32, u32);

/// A message that crosses shared uplinks, as timed in one pass.
struct Crossing {
    key: FlowKey,
    start: f64,
    bytes: f64,
    /// Bytes per second it gets apart from the uplinks.
    cap: f64,
    uplinks: Vec<Uplink>,
}

/// Shares every uplink among the messages that cross it, by their starts in the last pass;
/// returns how long each message takes through each of its uplinks. On one uplink a message
/// gets no more than elsewhere: its link, its port, and what the other uplinks it crosses
/// gave it in the previous round (max-min fairness, one uplink at a time).
fn share_uplinks(
    crossing: &[Crossing],
    before: &HashMap<FlowKey, Vec<(u64, f64)>>,
) -> HashMap<FlowKey, Vec<(u64, f64)>> {
    let mut on: HashMap<u64, (Uplink, Vec<usize>)> = HashMap::new();
    for (k, c) in crossing.iter().enumerate() {
        for u in &c.uplinks {
            on.entry(u.id).or_insert((*u, Vec::new())).1.push(k);
        }
    }
    let mut through: HashMap<FlowKey, Vec<(u64, f64)>> = HashMap::new();
    for (up, users) in on.into_values() {
        let mut flows: Vec<Shared> = users
            .iter()
            .map(|&k| {
                let c = &crossing[k];
                let elsewhere = before.get(&c.key).map_or(f64::INFINITY, |ts| {
                    ts.iter()
                        .filter(|(id, _)| *id != up.id)
                        .map(|(_, t)| c.bytes / t.max(f64::MIN_POSITIVE))
                        .fold(f64::INFINITY, f64::min)
                });
                Shared {
                    op: k,
                    start: c.start,
                    bytes: c.bytes,
                    cap: c.cap.min(elsewhere),
                }
            })
            .collect();
        let ends = processor_sharing(&mut flows, 1.0 / up.seconds_per_byte, up.shared_efficiency);
        for (k, end) in ends {
            let c = &crossing[k];
            through
                .entry(c.key)
                .or_default()
                .push((up.id, end - c.start));
        }
    }
    through
}

/// One pass of the engine: each message that crosses an uplink takes at least `through` of
/// it (from the previous pass). Returns every rank's end and the messages that crossed.
fn pass(
    schedules: &[Compact],
    net: &dyn Network,
    elem_bytes: f64,
    start: &[f64],
    sharing: &HashMap<(usize, u64), u32>,
    through: &HashMap<FlowKey, Vec<(u64, f64)>>,
) -> Result<(Vec<f64>, Vec<Crossing>), String> {
    let p = schedules.len();
    let mut e = Engine {
        scheds: schedules,
        net,
        elem_bytes,
        ranks: (0..p)
            .map(|r| RankState {
                entered: start[r],
                end: start[r],
                reduce_free: start[r],
                ..RankState::default()
            })
            .collect(),
        sharing,
        through,
        crossing: Vec::new(),
        uplinks: Vec::new(),
        work: Vec::new(),
        ports: HashMap::new(),
    };
    for r in 0..p {
        e.enter(r);
    }
    while let Some((from, to)) = e.work.pop() {
        e.try_match(from, to);
    }
    if let Some(r) = e.ranks.iter().position(|s| !s.finished) {
        return Err(format!(
            "rank {r} never finishes its step {}: a peer never posts the matching operation",
            e.ranks[r].step
        ));
    }
    Ok((e.ranks.iter().map(|s| s.end).collect(), e.crossing))
}

struct Engine<'a> {
    scheds: &'a [Compact],
    net: &'a dyn Network,
    elem_bytes: f64,
    ranks: Vec<RankState>,
    sharing: &'a HashMap<(usize, u64), u32>,
    through: &'a HashMap<FlowKey, Vec<(u64, f64)>>,
    crossing: Vec<Crossing>,
    uplinks: Vec<Uplink>,
    /// Pairs (sender, receiver) that may have become matchable.
    work: Vec<(usize, usize)>,
    /// [`Engine::port_ends`] per (rank, step, sends, off host), for big steps.
    ports: HashMap<PortKey, Vec<(usize, f64)>>,
}

impl<'a> Engine<'a> {
    fn ops(&self, r: usize) -> &'a [Transfer] {
        let scheds = self.scheds;
        scheds[r].step(self.ranks[r].step)
    }

    fn unmatched(&self, r: usize, peer: usize, sends: bool) -> Option<usize> {
        let st = &self.ranks[r];
        if st.finished {
            return None;
        }
        self.ops(r).iter().enumerate().position(|(i, op)| {
            !st.matched.get(i).copied().unwrap_or(true) && op.peer() == peer && op.sends() == sends
        })
    }

    /// When each message of `r`'s current step through the port used for `peer` ends, if the
    /// port carries more than one at once: the port is shared equally among the messages
    /// moving through it (processor sharing at the fastest of their links). A message starts
    /// α after both ends are in their steps; a peer not yet in the step that holds the match
    /// is assumed to start with this rank. Messages to one peer run at once as far as the
    /// peer's current step holds their matches (a chain's root posts every chunk to a
    /// neighbour that takes one per step). Returns (operation index, end) pairs; empty when
    /// the port carries one message.
    fn port_ends(&self, r: usize, peer: usize, sends: bool) -> Vec<(usize, f64)> {
        let off_host = self.net.crosses_hosts(r, peer);
        // (peer, messages at once, counted so far)
        let mut peers: Vec<(usize, usize, usize)> = Vec::new();
        let mut beta = f64::INFINITY;
        let mut flows: Vec<Shared> = Vec::new();
        let mine = self.ops(r);
        for (i, op) in mine.iter().enumerate() {
            let q = op.peer();
            if op.sends() != sends || self.net.crosses_hosts(r, q) != off_host {
                continue;
            }
            let k = match peers.iter().position(|e| e.0 == q) {
                Some(k) => k,
                None => {
                    let same = |o: &Transfer, p: usize, s: bool| o.peer() == p && o.sends() == s;
                    let here = mine.iter().filter(|o| same(o, q, sends)).count();
                    let there = self.ops(q).iter().filter(|o| same(o, r, !sends)).count();
                    peers.push((q, here.min(there), 0));
                    peers.len() - 1
                }
            };
            let at_once = peers[k].1;
            if peers[k].2 == at_once.max(1) {
                continue;
            }
            peers[k].2 += 1;
            let link = if sends {
                self.net.link(r, q)
            } else {
                self.net.link(q, r)
            };
            beta = beta.min(link.beta);
            let ready = if at_once > 0 {
                self.ranks[q].entered.max(self.ranks[r].entered)
            } else {
                self.ranks[r].entered
            };
            flows.push(Shared {
                op: i,
                start: ready + link.alpha,
                bytes: op.elems as f64 * self.elem_bytes,
                cap: 1.0 / link.beta,
            });
        }
        if flows.len() < 2 {
            return Vec::new();
        }
        processor_sharing(&mut flows, 1.0 / beta, 1.0)
    }

    /// [`Engine::port_ends`] for the message of operation `op` (0 when its port carries one
    /// message), computed once per step for steps with many operations.
    fn port_end(&mut self, r: usize, peer: usize, sends: bool, op: usize) -> f64 {
        let find = |ends: &[(usize, f64)]| ends.iter().find(|e| e.0 == op).map_or(0.0, |e| e.1);
        if self.ops(r).len() <= 8 {
            return find(&self.port_ends(r, peer, sends));
        }
        let key = (
            r,
            self.ranks[r].step,
            sends,
            self.net.crosses_hosts(r, peer),
        );
        if !self.ports.contains_key(&key) {
            let ends = self.port_ends(r, peer, sends);
            self.ports.insert(key, ends);
        }
        self.ports.get(&key).map_or(0.0, |e| find(e))
    }

    /// Enters rank `r`'s next step (every step of a [`Compact`] has transfers).
    fn enter(&mut self, r: usize) {
        let st = &mut self.ranks[r];
        if st.step >= self.scheds[r].steps() {
            st.finished = true;
            return;
        }
        st.entered = st.end;
        let ops = self.ops(r);
        let st = &mut self.ranks[r];
        st.matched.clear();
        st.matched.resize(ops.len(), false);
        st.pending = ops.len();
        for op in ops {
            let q = op.peer();
            self.work.push(if op.sends() { (r, q) } else { (q, r) });
        }
    }

    fn try_match(&mut self, from: usize, to: usize) {
        let (Some(i), Some(j)) = (
            self.unmatched(from, to, true),
            self.unmatched(to, from, false),
        ) else {
            return;
        };
        let elems = self.ops(from)[i].elems;
        let reduces = self.ops(to)[j].kind == Kind::RecvReduce;
        let link = self.net.link(from, to);
        let ports = self
            .port_end(from, to, true, i)
            .max(self.port_end(to, from, false, j));
        let bytes = elems as f64 * self.elem_bytes;
        let start = self.ranks[from].entered.max(self.ranks[to].entered) + link.alpha;
        let mut arrive = (start + bytes * link.beta).max(ports);
        self.net.uplinks(from, to, &mut self.uplinks);
        if !self.uplinks.is_empty() && bytes > 0.0 {
            let key = (from as u32, self.ranks[from].step as u32, i as u32);
            // What it gets apart from the uplinks: its link, or its share of a port.
            let cap = bytes / (arrive - start).max(f64::MIN_POSITIVE);
            match self.through.get(&key) {
                Some(took) => arrive = took.iter().fold(arrive, |a, (_, t)| a.max(start + t)),
                None => {
                    let step = self.ranks[from].step;
                    for up in &self.uplinks {
                        let k = self.sharing.get(&(step, up.id)).copied().unwrap_or(1);
                        arrive = arrive.max(start + bytes * up.shared_beta(k));
                    }
                }
            }
            self.crossing.push(Crossing {
                key,
                start,
                bytes,
                cap,
                uplinks: self.uplinks.clone(),
            });
        }
        let recv_end = if reduces {
            let st = &mut self.ranks[to];
            st.reduce_free = st.reduce_free.max(arrive) + bytes * link.gamma;
            st.reduce_free
        } else {
            arrive
        };
        self.ranks[from].matched[i] = true;
        self.ranks[to].matched[j] = true;
        self.done(from, arrive);
        self.done(to, recv_end);
        // More operations between the two may wait in the same steps.
        self.work.push((from, to));
    }

    fn done(&mut self, r: usize, at: f64) {
        let st = &mut self.ranks[r];
        st.pending -= 1;
        st.end = st.end.max(at);
        if st.pending == 0 {
            st.step += 1;
            self.enter(r);
        }
    }
}

/// [`processor_sharing`] when every moving message gets the same rate (no cap binds, or all
/// caps are equal): in O(n log n) by virtual time, the bytes each moving message has been
/// given since the first start, so that a message ends when virtual time passes its start's
/// plus its bytes. `None` when unequal caps would bind.
fn equal_sharing(flows: &[Shared], capacity: f64, efficiency: f64) -> Option<Vec<(usize, f64)>> {
    use std::collections::BinaryHeap;
    let min_cap = flows.iter().map(|f| f.cap).fold(f64::INFINITY, f64::min);
    let max_cap = flows.iter().map(|f| f.cap).fold(0.0, f64::max);
    let share = |n: usize| {
        if n > 1 {
            capacity * efficiency / n as f64
        } else {
            capacity
        }
    };
    // Ends by virtual time, earliest first (a max-heap on the negated value).
    let mut heap: BinaryHeap<crate::sim::Earliest<usize>> = BinaryHeap::new();
    let mut ends = Vec::with_capacity(flows.len());
    let (mut now, mut virt, mut n, mut next) = (flows[0].start, 0.0, 0usize, 0);
    while next < flows.len() || n > 0 {
        while next < flows.len() && flows[next].start <= now {
            heap.push(crate::sim::Earliest {
                at: virt + flows[next].bytes,
                key: next,
            });
            n += 1;
            next += 1;
        }
        if n == 0 {
            now = flows[next].start;
            continue;
        }
        let mut rate = share(n);
        if min_cap < rate * (1.0 - 1e-9) {
            if max_cap > min_cap * (1.0 + 1e-9) {
                return None;
            }
            // Every message is held to the same cap: all still move alike.
            rate = min_cap;
        }
        let due = heap.peek().map_or(f64::INFINITY, |e| e.at);
        let finish_in = (due - virt).max(0.0) / rate;
        let arrival_in = flows.get(next).map_or(f64::INFINITY, |f| f.start - now);
        if finish_in <= arrival_in {
            now += finish_in;
            virt = due;
            while let Some(e) = heap.peek().copied() {
                if e.at > virt + flows[e.key].bytes * 1e-12 {
                    break;
                }
                heap.pop();
                ends.push((flows[e.key].op, now));
                n -= 1;
            }
        } else {
            now += arrival_in;
            virt += arrival_in * rate;
        }
    }
    Some(ends)
}

/// A message on a shared port.
struct Shared {
    op: usize,
    start: f64,
    bytes: f64,
    /// The most bytes per second it can get elsewhere (its link, the far end's port).
    cap: f64,
}

/// When each message sharing a link of `capacity` bytes per second ends: the link is divided
/// max-min fairly among the messages moving through it (water-filling under their caps), and
/// gives `efficiency` of its capacity while two or more share it. Messages alike (same start,
/// bytes and cap) move alike, so they are one class weighted by their number: the cost grows
/// with the number of classes, not of messages. Returns (operation, end) pairs.
fn processor_sharing(flows: &mut [Shared], capacity: f64, efficiency: f64) -> Vec<(usize, f64)> {
    flows.sort_by(|a, b| {
        (a.start, a.bytes, a.cap)
            .partial_cmp(&(b.start, b.bytes, b.cap))
            .unwrap_or(std::cmp::Ordering::Equal)
    });
    if !capacity.is_finite() {
        return flows.iter().map(|f| (f.op, f.start)).collect();
    }
    if let Some(ends) = equal_sharing(flows, capacity, efficiency) {
        return ends;
    }
    // Classes: (first index into flows, members, start, bytes, cap).
    let mut classes: Vec<(usize, usize, f64, f64, f64)> = Vec::new();
    for (i, f) in flows.iter().enumerate() {
        match classes.last_mut() {
            Some(c) if (c.2, c.3, c.4) == (f.start, f.bytes, f.cap) => c.1 += 1,
            _ => classes.push((i, 1, f.start, f.bytes, f.cap)),
        }
    }
    let mut ends = Vec::with_capacity(flows.len());
    // (class, bytes left per member) of the classes moving now.
    let mut moving: Vec<(usize, f64)> = Vec::new();
    let (mut now, mut next) = (classes[0].2, 0);
    let mut rates: Vec<f64> = Vec::new();
    while next < classes.len() || !moving.is_empty() {
        while next < classes.len() && classes[next].2 <= now {
            moving.push((next, classes[next].3));
            next += 1;
        }
        if moving.is_empty() {
            now = classes[next].2;
            continue;
        }
        let members: usize = moving.iter().map(|m| classes[m.0].1).sum();
        let mut left = if members > 1 {
            capacity * efficiency
        } else {
            capacity
        };
        // Water-filling: the smallest caps are met first, the rest share what is left (an
        // equal split when no cap binds, the usual case).
        rates.clear();
        let fair = left / members as f64;
        if moving.iter().all(|m| classes[m.0].4 >= fair) {
            rates.resize(moving.len(), fair);
        } else {
            let mut order: Vec<usize> = (0..moving.len()).collect();
            order.sort_by(|&a, &b| classes[moving[a].0].4.total_cmp(&classes[moving[b].0].4));
            rates.resize(moving.len(), 0.0);
            let mut unfilled = members;
            for &m in &order {
                let c = &classes[moving[m].0];
                let rate = c.4.min(left / unfilled as f64);
                rates[m] = rate;
                left -= rate * c.1 as f64;
                unfilled -= c.1;
            }
        }
        let finish_in = moving
            .iter()
            .zip(&rates)
            .map(|(m, r)| m.1 / r)
            .fold(f64::INFINITY, f64::min);
        let arrival_in = classes.get(next).map_or(f64::INFINITY, |c| c.2 - now);
        let dt = finish_in.min(arrival_in);
        now += dt;
        let mut k = 0;
        while k < moving.len() {
            moving[k].1 -= rates[k] * dt;
            let c = classes[moving[k].0];
            if moving[k].1 <= c.3 * 1e-12 {
                ends.extend(flows[c.0..c.0 + c.1].iter().map(|f| (f.op, now)));
                moving.swap_remove(k);
                rates.swap_remove(k);
            } else {
                k += 1;
            }
        }
    }
    ends
}
