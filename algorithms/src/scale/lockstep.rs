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

pub(crate) use super::compact::{Compact, Kind, Transfer};
use super::sharing::{Scratch, Shared, processor_sharing};
use crate::cost::{Network, Uplink, reduced_at};

/// Where a rank is in its schedule. The current step's transfers are held here, so that a
/// match reads each end's state and transfers and nothing else.
#[derive(Clone, Default)]
struct RankState<'a> {
    step: usize,
    ops: &'a [Transfer],
    /// The lengths its transfers name.
    lengths: &'a [u64],
    /// When the rank entered its current step.
    entered: f64,
    /// When the last operation of the current step so far ends.
    end: f64,
    pending: usize,
    /// Which operations of the step are matched: bits for the first 64, then `matched_more`.
    matched: u64,
    matched_more: Vec<bool>,
    reduce_free: f64,
    finished: bool,
}

impl RankState<'_> {
    fn is_matched(&self, i: usize) -> bool {
        if i < 64 {
            self.matched >> i & 1 == 1
        } else {
            self.matched_more[i - 64]
        }
    }

    fn set_matched(&mut self, i: usize) {
        if i < 64 {
            self.matched |= 1 << i;
        } else {
            self.matched_more[i - 64] = true;
        }
    }
}

/// Most passes of the fixed point over uplink sharing.
const MAX_PASSES: usize = 12;

/// Above this many messages crossing shared uplinks, sharing stays at the first estimate
/// (messages per uplink per step), which is exact when ranks cross in step and pessimistic
/// when they drift; refining it costs a processor sharing of every uplink's messages per
/// pass, and up to [`MAX_PASSES`] passes of the whole schedule.
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
        // Where no crossing message would arrive elsewhere than it did, the next pass would
        // repeat this one (within what `SETTLED` allows, as a pass moves no end by more than
        // it moves an arrival): done, without timing it.
        let repeats = crossing.iter().all(|c| {
            let next = shared.get(&c.key).map_or(c.unshared, |took| {
                took.iter().fold(c.unshared, |a, (_, t)| a.max(c.start + t))
            });
            (next - c.arrive).abs() <= SETTLED * c.arrive.abs().max(1e-12)
        });
        if repeats {
            return Ok(ends);
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
    /// When it arrived in this pass, and when it would have with no uplink in its way.
    arrive: f64,
    unshared: f64,
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
    let (mut scratch, mut ends) = (Scratch::default(), Vec::new());
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
        processor_sharing(
            &mut flows,
            1.0 / up.seconds_per_byte,
            up.shared_efficiency,
            &mut scratch,
            &mut ends,
        );
        for &(k, end) in &ends {
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
                lengths: schedules[r].lengths(),
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
        scratch: Scratch::default(),
        peers: Vec::new(),
        flows: Vec::new(),
        ends: Vec::new(),
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
    ranks: Vec<RankState<'a>>,
    sharing: &'a HashMap<(usize, u64), u32>,
    through: &'a HashMap<FlowKey, Vec<(u64, f64)>>,
    crossing: Vec<Crossing>,
    uplinks: Vec<Uplink>,
    /// Pairs (sender, receiver) that may have become matchable.
    work: Vec<(usize, usize)>,
    /// [`Engine::port_ends`] per (rank, step, sends, off host), for big steps.
    ports: HashMap<PortKey, Vec<(usize, f64)>>,
    /// Buffers [`Engine::port_ends`] reuses: processor sharing's, the peers of a port, its
    /// messages and their ends.
    scratch: Scratch,
    peers: Vec<(usize, usize, usize)>,
    flows: Vec<Shared>,
    ends: Vec<(usize, f64)>,
}

impl<'a> Engine<'a> {
    fn ops(&self, r: usize) -> &'a [Transfer] {
        self.ranks[r].ops
    }

    fn unmatched(&self, r: usize, peer: usize, sends: bool) -> Option<usize> {
        let st = &self.ranks[r];
        if st.finished {
            return None;
        }
        self.ops(r)
            .iter()
            .enumerate()
            .position(|(i, op)| op.peer() == peer && op.sends() == sends && !st.is_matched(i))
    }

    /// Whether operation `i` of `r`'s current step leaves the host.
    fn off_host(&self, r: usize, i: usize) -> bool {
        self.ranks[r].ops[i].off_host()
    }

    /// Bytes operation `i` of `r`'s current step moves.
    fn bytes(&self, r: usize, i: usize) -> f64 {
        let st = &self.ranks[r];
        st.lengths[st.ops[i].length_index()] as f64 * self.elem_bytes
    }

    /// When each message of `r`'s current step through one of its ports (`sends`, `off_host`)
    /// ends, if the port carries more than one at once, written into `self.ends` (cleared
    /// first): the port is shared equally among the messages moving through it (processor
    /// sharing at the fastest of their links). A message starts α after both ends are in
    /// their steps; a peer not yet in the step that holds the match is assumed to start with
    /// this rank. Messages to one peer run at once as far as the peer's current step holds
    /// their matches (a chain's root posts every chunk to a neighbour that takes one per
    /// step). Writes (operation index, end) pairs; none when the port carries one message.
    fn port_ends(&mut self, r: usize, sends: bool, off_host: bool) {
        self.ends.clear();
        let mine = self.ops(r);
        let on_port = |op: &Transfer| op.sends() == sends && op.off_host() == off_host;
        // Most ports carry one message in a step: nothing to share.
        if mine.iter().filter(|op| on_port(op)).nth(1).is_none() {
            return;
        }
        let entered = self.ranks[r].entered;
        // (peer, messages at once, counted so far)
        let mut peers = std::mem::take(&mut self.peers);
        let mut flows = std::mem::take(&mut self.flows);
        peers.clear();
        flows.clear();
        let mut beta = f64::INFINITY;
        for (i, op) in mine.iter().enumerate() {
            if !on_port(op) {
                continue;
            }
            let q = op.peer();
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
                self.ranks[q].entered.max(entered)
            } else {
                entered
            };
            flows.push(Shared {
                op: i,
                start: ready + link.alpha,
                bytes: self.bytes(r, i),
                cap: 1.0 / link.beta,
            });
        }
        if flows.len() >= 2 {
            processor_sharing(
                &mut flows,
                1.0 / beta,
                1.0,
                &mut self.scratch,
                &mut self.ends,
            );
        }
        self.peers = peers;
        self.flows = flows;
    }

    /// [`Engine::port_ends`] for the message of operation `op` of `r`'s current step (0 when
    /// its port carries one message), computed once per step for steps with many operations.
    fn port_end(&mut self, r: usize, sends: bool, op: usize) -> f64 {
        let find = |ends: &[(usize, f64)]| ends.iter().find(|e| e.0 == op).map_or(0.0, |e| e.1);
        let off_host = self.off_host(r, op);
        if self.ops(r).len() <= 8 {
            self.port_ends(r, sends, off_host);
            return find(&self.ends);
        }
        let key = (r, self.ranks[r].step, sends, off_host);
        if !self.ports.contains_key(&key) {
            self.port_ends(r, sends, off_host);
            self.ports.insert(key, self.ends.clone());
        }
        self.ports.get(&key).map_or(0.0, |e| find(e))
    }

    /// Enters rank `r`'s next step (every step of a [`Compact`] has transfers).
    fn enter(&mut self, r: usize) {
        let st = &mut self.ranks[r];
        if st.step >= self.scheds[r].steps() {
            st.finished = true;
            st.ops = &[];
            return;
        }
        st.entered = st.end;
        let (sched, step) = (&self.scheds[r], st.step);
        let (from, to) = (sched.bounds[step] as usize, sched.bounds[step + 1] as usize);
        let ops = &sched.transfers[from..to];
        st.ops = ops;
        st.matched = 0;
        st.matched_more.clear();
        st.matched_more.resize(ops.len().saturating_sub(64), false);
        st.pending = ops.len();
        for op in ops {
            let q = op.peer();
            self.work.push(if op.sends() { (r, q) } else { (q, r) });
        }
    }

    /// Matches every operation the two ranks' current steps hold between them, from `from`
    /// to `to`, in order, and times each (the steps they enter meanwhile included).
    fn try_match(&mut self, from: usize, to: usize) {
        while let (Some(i), Some(j)) = (
            self.unmatched(from, to, true),
            self.unmatched(to, from, false),
        ) {
            self.transfer(from, to, i, j);
        }
    }

    /// Times the transfer of operation `i` of `from`'s step to operation `j` of `to`'s.
    fn transfer(&mut self, from: usize, to: usize, i: usize, j: usize) {
        let reduces = self.ops(to)[j].kind() == Kind::RecvReduce;
        let link = self.net.link(from, to);
        let ports = self
            .port_end(from, true, i)
            .max(self.port_end(to, false, j));
        let bytes = self.bytes(from, i);
        let start = self.ranks[from].entered.max(self.ranks[to].entered) + link.alpha;
        let mut arrive = (start + bytes * link.beta).max(ports);
        self.net.uplinks(from, to, &mut self.uplinks);
        if !self.uplinks.is_empty() && bytes > 0.0 {
            let key = (from as u32, self.ranks[from].step as u32, i as u32);
            // What it gets apart from the uplinks: its link, or its share of a port.
            let cap = bytes / (arrive - start).max(f64::MIN_POSITIVE);
            let unshared = arrive;
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
            // Past the most that are refined, the count is all the caller needs.
            if self.crossing.len() <= MAX_REFINED_CROSSINGS {
                self.crossing.push(Crossing {
                    key,
                    start,
                    arrive,
                    unshared,
                    bytes,
                    cap,
                    uplinks: self.uplinks.clone(),
                });
            }
        }
        let recv_end = if reduces {
            let st = &mut self.ranks[to];
            st.reduce_free = reduced_at(&link, bytes, (start, arrive), st.reduce_free);
            st.reduce_free
        } else {
            arrive
        };
        self.ranks[from].set_matched(i);
        self.ranks[to].set_matched(j);
        self.done(from, arrive);
        self.done(to, recv_end);
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
