//! Flow-level timing: every message in flight is a flow, and the flows active at one moment
//! share the links they cross, max-min fairly.
//!
//! The step-indexed engine in [`crate::sim`] serialises each rank's sends and receives and
//! counts an uplink's sharers by step index. That is exact for schedules whose ranks move in
//! lock step (rings, recursive doubling), but pipelined schedules (trees, hierarchical
//! compositions) drift apart: their messages overlap in time differently than their step
//! indices suggest, and a rank receiving from two children at once takes the two messages in
//! parallel when they arrive through different uplinks. Here contention is counted by time:
//! a message becomes a flow α after both ends reach the step that holds it, and between
//! events the rate of every flow is its max-min fair share of
//!
//! * its own link (`1 / β` of the pair),
//! * the sender's transmit port and the receiver's receive port (one per rank for messages
//!   that leave the host, one for those that stay on it),
//! * every shared uplink it crosses ([`Network::uplinks`]).
//!
//! A receive that reduces runs its reduction beside its data, as the runtime reduces each
//! piece as it arrives: it finishes after the whole `bytes × γ` and one piece's after its
//! last byte ([`crate::cost::reduced_at`]). A local reduction holds up its step's start by
//! `bytes × γ`, and a rank's reductions run one at a time.
//!
//! Ranks that share a core ([`Network::shared_core`]) take turns on it: the messages inside
//! the host that they send or receive also share the core, which copies `2 / β` bytes a
//! second (what one rank sending and receiving at once uses), and their reductions run one
//! at a time, as one rank's do. A message whose sender or receiver shares its core with a rank
//! outside the message that has messages of its own in flight waits, after its α, for a turn
//! on that core ([`Network::core_wait`]).
//!
//! Each end of a message also spends CPU time on it ([`Network::message_cpu`], LogP's o): the
//! sender from when it reaches the step, the receiver once the message has come α later, each
//! in the first free stretch of its CPU (its core, where ranks share one). So a rank's
//! messages, and those of the ranks on its core, pay it one after another: a rank that sends
//! to seven peers at once pays it seven times before the last one leaves.

use std::collections::{BinaryHeap, HashMap};

use crate::cost::{LinkCost, Network, Uplink};
use crate::schedule::{Op, RankSchedule};
use crate::sim::Earliest;

/// Relative slack when comparing times and remaining bytes.
const EPS: f64 = 1e-12;

/// When operation `key.1` of rank `key.0` completes.
type Done = Earliest<(usize, usize)>;

/// A message between matching operations of two ranks.
struct Flow {
    from: usize,
    to: usize,
    send_op: usize,
    recv_op: usize,
    bytes: f64,
    reduces: bool,
    /// When it starts to move data (both ends ready, plus α, plus a turn on a shared core).
    start: f64,
    /// Whether its wait for a shared core's turn has been priced.
    core_checked: bool,
    remaining: f64,
    demand: Demand,
}

impl AsMut<Demand> for Flow {
    fn as_mut(&mut self) -> &mut Demand {
        &mut self.demand
    }
}

/// What a flow asks of the links it crosses, and the rate it gets.
#[derive(Default)]
pub(crate) struct Demand {
    /// Its own link's rate alone, bytes per second.
    pub cap: f64,
    pub rate: f64,
    /// The resources it uses (indices) and how many flows it stands for on each (1 here;
    /// a class of alike flows in fast pricing's engine). The first two are the sender's and
    /// the receiver's ports.
    pub uses: Vec<(usize, f64)>,
}

impl AsMut<Demand> for Demand {
    fn as_mut(&mut self) -> &mut Demand {
        self
    }
}

/// Something flows share: a port or an uplink, with its capacity in bytes per second.
pub(crate) struct Resource {
    pub capacity: f64,
    /// The fraction of `capacity` two or more flows get together.
    pub shared_efficiency: f64,
    /// Scratch for the fair-share computation.
    left: f64,
    /// Flows on it (weighted), then those not yet frozen.
    load: f64,
    users: f64,
}

impl Resource {
    /// A resource of `capacity` bytes per second.
    pub(crate) fn new(capacity: f64, shared_efficiency: f64) -> Self {
        Self {
            capacity,
            shared_efficiency,
            left: 0.0,
            load: 0.0,
            users: 0.0,
        }
    }
}

/// Max-min fair rates for `flows` over `resources` (progressive filling). A port's capacity
/// is the fastest link among the flows using it: a rank sends no faster than its own link.
/// A resource that two or more flows use gives them `shared_efficiency` of its capacity.
/// Only the resources `flows` use are touched, so a caller may pass one connected component
/// of flows (those that share nothing with the rest keep their rates).
pub(crate) fn share<F: AsMut<Demand>>(
    resources: &mut [Resource],
    flows: &mut [F],
    frozen: &mut Vec<bool>,
) {
    for f in flows.iter_mut() {
        let f = f.as_mut();
        for &(u, _) in &f.uses {
            resources[u].load = 0.0;
        }
        for &(u, _) in &f.uses[..2] {
            resources[u].capacity = 0.0;
        }
    }
    for f in flows.iter_mut() {
        let f = f.as_mut();
        for &(u, _) in &f.uses[..2] {
            let res = &mut resources[u];
            res.capacity = res.capacity.max(f.cap);
        }
    }
    for f in flows.iter_mut() {
        let f = f.as_mut();
        f.rate = 0.0;
        for &(u, w) in &f.uses {
            resources[u].load += w;
        }
    }
    for f in flows.iter_mut() {
        for &(u, _) in &f.as_mut().uses {
            let res = &mut resources[u];
            res.users = res.load;
            res.left = if res.load > 1.0 + 1e-9 {
                res.capacity * res.shared_efficiency
            } else {
                res.capacity
            };
        }
    }
    frozen.clear();
    frozen.resize(flows.len(), false);
    let mut unfrozen = flows.len();
    while unfrozen > 0 {
        let mut inc = f64::INFINITY;
        for (k, f) in flows.iter_mut().enumerate() {
            if frozen[k] {
                continue;
            }
            let f = f.as_mut();
            inc = inc.min(f.cap - f.rate);
            for &(u, _) in &f.uses {
                // Every unfrozen flow grows by `inc`, taking `inc` per flow it stands for.
                let res = &resources[u];
                inc = inc.min(res.left / res.users);
            }
        }
        if !inc.is_finite() {
            // Nothing limits these flows (zero-cost links): they finish at once.
            for (k, f) in flows.iter_mut().enumerate() {
                if !frozen[k] {
                    f.as_mut().rate = f64::INFINITY;
                }
            }
            break;
        }
        for (k, f) in flows.iter_mut().enumerate() {
            if !frozen[k] {
                let f = f.as_mut();
                f.rate += inc;
                for &(u, w) in &f.uses {
                    resources[u].left -= inc * w;
                }
            }
        }
        for (k, f) in flows.iter_mut().enumerate() {
            if frozen[k] {
                continue;
            }
            let f = f.as_mut();
            let saturated = f.rate >= f.cap * (1.0 - 1e-9)
                || f.uses.iter().any(|&(u, _)| {
                    let res = &resources[u];
                    res.left <= res.capacity * 1e-9
                });
            if saturated {
                frozen[k] = true;
                unfrozen -= 1;
                for &(u, w) in &f.uses {
                    resources[u].users -= w;
                }
            }
        }
    }
}

#[derive(Default)]
struct RankState {
    step: usize,
    /// When the rank entered its current step.
    entered: f64,
    /// Completion time of the step's operations so far.
    end: f64,
    pending: usize,
    /// Per operation of the current step: matched into a flow (or local).
    matched: Vec<bool>,
    reduce_free: f64,
    finished: bool,
    /// Its flows matched and not yet delivered.
    in_flight: usize,
}

/// The CPU a rank spends its messages' CPU time on.
#[derive(Clone, Copy, Hash, PartialEq, Eq)]
enum Cpu {
    /// A core that ranks share.
    Core(u32),
    /// A rank with a core of its own.
    Rank(usize),
}

/// Which port of a rank a message uses.
#[derive(Clone, Copy, Hash, PartialEq, Eq)]
enum Port {
    Send {
        rank: usize,
        off_host: bool,
    },
    Recv {
        rank: usize,
        off_host: bool,
    },
    Uplink(u64),
    /// A core that ranks share.
    Core(u32),
}

struct Engine<'a> {
    scheds: &'a [RankSchedule],
    net: &'a dyn Network,
    elem_bytes: f64,
    ranks: Vec<RankState>,
    now: f64,
    /// Matched flows that have not started yet, and those moving data.
    waiting: Vec<Flow>,
    active: Vec<Flow>,
    done: BinaryHeap<Done>,
    resources: Vec<Resource>,
    ports: HashMap<Port, usize>,
    uplinks: Vec<Uplink>,
    frozen: Vec<bool>,
    /// Per shared core, when the reductions of its ranks so far end.
    core_free: HashMap<u32, f64>,
    /// Per shared core, its ranks (empty where no rank shares one or nothing waits for a
    /// turn).
    core_ranks: HashMap<u32, Vec<usize>>,
    /// What a message waits for its turn on a shared core ([`Network::core_wait`]).
    core_wait: f64,
    /// Per CPU, the stretches it spends on messages ([`Network::message_cpu`]): sorted,
    /// disjoint `(from, to)` intervals.
    cpu_busy: HashMap<Cpu, Vec<(f64, f64)>>,
}

/// Runs `schedules` on `net` with flows sharing links by time and returns when each rank
/// finishes.
pub(crate) fn time(
    schedules: &[RankSchedule],
    net: &dyn Network,
    elem_bytes: f64,
) -> Result<Vec<f64>, String> {
    let mut e = Engine {
        scheds: schedules,
        net,
        elem_bytes,
        ranks: (0..schedules.len()).map(|_| RankState::default()).collect(),
        now: 0.0,
        waiting: Vec::new(),
        active: Vec::new(),
        done: BinaryHeap::new(),
        resources: Vec::new(),
        ports: HashMap::new(),
        uplinks: Vec::new(),
        frozen: Vec::new(),
        core_free: HashMap::new(),
        core_ranks: HashMap::new(),
        core_wait: net.core_wait(),
        cpu_busy: HashMap::new(),
    };
    if e.core_wait > 0.0 {
        for r in 0..schedules.len() {
            if let Some(c) = net.shared_core(r) {
                e.core_ranks.entry(c).or_default().push(r);
            }
        }
    }
    for r in 0..schedules.len() {
        e.enter(r, 0.0);
    }
    e.run()?;
    if let Some(r) = e.ranks.iter().position(|s| !s.finished) {
        return Err(format!(
            "rank {r} never finishes its step {}: a peer never posts the matching operation",
            e.ranks[r].step
        ));
    }
    Ok(e.ranks.iter().map(|s| s.end).collect())
}

impl Engine<'_> {
    fn ops(&self, r: usize) -> &[Op] {
        self.scheds[r]
            .steps
            .get(self.ranks[r].step)
            .map_or(&[], |s| &s.ops)
    }

    /// The first unmatched operation of `r`'s current step that talks to `peer` and sends
    /// (or receives).
    fn unmatched(&self, r: usize, peer: usize, sends: bool) -> Option<usize> {
        let st = &self.ranks[r];
        if st.finished {
            return None;
        }
        self.ops(r).iter().enumerate().position(|(i, op)| {
            !st.matched.get(i).copied().unwrap_or(true)
                && op.peer() == Some(peer)
                && matches!(op, Op::Send { .. }) == sends
        })
    }

    /// Enters rank `r`'s next step with work in it at time `at`, and matches what it can.
    fn enter(&mut self, r: usize, mut at: f64) {
        loop {
            let Some(step) = self.scheds[r].steps.get(self.ranks[r].step) else {
                self.ranks[r].finished = true;
                return;
            };
            // Local reductions and copies run when the step starts, after the rank's
            // earlier ones and before its transfers.
            let reduced = step.elems_reduced_locally();
            let copied = step.elems_copied_locally();
            if reduced > 0 || copied > 0 {
                let gamma = self.net.link(r, r).gamma;
                let delta = self.net.copy_beta(r);
                let work = (reduced as f64 * gamma + copied as f64 * delta) * self.elem_bytes;
                at = self.local_work(r, at, work);
            }
            let st = &mut self.ranks[r];
            st.entered = at;
            st.end = st.end.max(at);
            st.matched = step.ops.iter().map(|op| op.peer().is_none()).collect();
            st.pending = step.ops.iter().filter(|op| op.peer().is_some()).count();
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

    /// Turns the first unmatched send of `from` to `to` and receive of `to` from `from` into
    /// a flow, if both ranks have reached them.
    fn try_match(&mut self, from: usize, to: usize) {
        let (Some(i), Some(j)) = (
            self.unmatched(from, to, true),
            self.unmatched(to, from, false),
        ) else {
            return;
        };
        let elems = match &self.ops(from)[i] {
            Op::Send { src, .. } => src.len,
            _ => unreachable!("unmatched(.., true) returns sends"),
        };
        let reduces = matches!(self.ops(to)[j], Op::RecvReduce { .. });
        self.ranks[from].matched[i] = true;
        self.ranks[to].matched[j] = true;
        self.ranks[from].in_flight += 1;
        self.ranks[to].in_flight += 1;
        let link = self.net.link(from, to);
        let bytes = elems as f64 * self.elem_bytes;
        let cpu = self.net.message_cpu(from, to);
        let mut ready = self.ranks[from].entered;
        if cpu > 0.0 {
            ready = self.spend_cpu(from, ready, cpu);
        }
        let mut start =
            ready.max(self.ranks[to].entered) + link.alpha + self.net.fill_seconds(from, to, bytes);
        if cpu > 0.0 {
            start = self.spend_cpu(to, start, cpu);
        }
        let off_host = self.net.crosses_hosts(from, to);
        let mut uses = [
            self.port(Port::Send {
                rank: from,
                off_host,
            }),
            self.port(Port::Recv { rank: to, off_host }),
        ]
        .map(|u| (u, 1.0))
        .to_vec();
        if !off_host {
            // Copies through host memory run on the ranks' cores.
            let copy_rate = if link.beta > 0.0 {
                2.0 / link.beta
            } else {
                f64::INFINITY
            };
            let cores = [self.net.shared_core(from), self.net.shared_core(to)];
            let uses_of = match cores {
                [Some(a), Some(b)] if a == b => vec![(a, 2.0)],
                _ => cores.into_iter().flatten().map(|c| (c, 1.0)).collect(),
            };
            for (c, weight) in uses_of {
                let fresh = !self.ports.contains_key(&Port::Core(c));
                let res = self.port(Port::Core(c));
                let core = &mut self.resources[res];
                core.capacity = if fresh {
                    copy_rate
                } else {
                    core.capacity.max(copy_rate)
                };
                uses.push((res, weight));
            }
        }
        self.net.uplinks(from, to, &mut self.uplinks);
        for k in 0..self.uplinks.len() {
            let up = self.uplinks[k];
            let res = self.port(Port::Uplink(up.id));
            self.resources[res].capacity = 1.0 / up.seconds_per_byte;
            self.resources[res].shared_efficiency = up.shared_efficiency;
            uses.push((res, 1.0));
        }
        self.waiting.push(Flow {
            from,
            to,
            send_op: i,
            recv_op: j,
            bytes,
            reduces,
            start,
            core_checked: false,
            remaining: bytes,
            demand: Demand {
                cap: if link.beta > 0.0 {
                    1.0 / link.beta
                } else {
                    f64::INFINITY
                },
                rate: 0.0,
                uses,
            },
        });
    }

    /// Spends `seconds` of rank `r`'s CPU (its shared core's, where it shares one) on a
    /// message, in the first free stretch from `at` on; returns when that ends.
    fn spend_cpu(&mut self, r: usize, at: f64, seconds: f64) -> f64 {
        let key = self.net.shared_core(r).map_or(Cpu::Rank(r), Cpu::Core);
        let busy = self.cpu_busy.entry(key).or_default();
        // Disjoint and sorted by start, so sorted by end too.
        let mut i = busy.partition_point(|&(_, end)| end <= at);
        let mut t = at;
        while i < busy.len() && busy[i].0 < t + seconds {
            t = t.max(busy[i].1);
            i += 1;
        }
        if i > 0 && busy[i - 1].1 == t {
            busy[i - 1].1 = t + seconds;
        } else {
            busy.insert(i, (t, t + seconds));
        }
        t + seconds
    }

    fn port(&mut self, p: Port) -> usize {
        let next = self.resources.len();
        let id = *self.ports.entry(p).or_insert(next);
        if id == next {
            self.resources.push(Resource::new(f64::INFINITY, 1.0));
        }
        id
    }

    fn share(&mut self) {
        share(&mut self.resources, &mut self.active, &mut self.frozen);
    }

    fn run(&mut self) -> Result<(), String> {
        loop {
            let next_start = self
                .waiting
                .iter()
                .map(|f| f.start)
                .fold(f64::INFINITY, f64::min);
            let next_finish = self
                .active
                .iter()
                .map(|f| self.now + f.remaining / f.demand.rate)
                .fold(f64::INFINITY, f64::min);
            let next_done = self.done.peek().map_or(f64::INFINITY, |d| d.at);
            let next = next_start.min(next_finish).min(next_done);
            if !next.is_finite() {
                return Ok(());
            }
            let dt = (next - self.now).max(0.0);
            self.now = self.now.max(next);
            let tol = EPS * self.now.max(1e-9);
            let mut changed = false;
            // Data moved since the last event; flows that reach zero finish now.
            let mut k = 0;
            while k < self.active.len() {
                let f = &mut self.active[k];
                let rate = f.demand.rate;
                if rate.is_infinite() {
                    f.remaining = 0.0;
                } else {
                    f.remaining -= rate * dt;
                }
                if f.remaining <= f.bytes * 1e-9 || f.remaining / rate <= tol {
                    let f = self.active.swap_remove(k);
                    self.finish(f);
                    changed = true;
                } else {
                    k += 1;
                }
            }
            // Flows whose α has elapsed wait for a turn on a shared core where one is due
            // (all judged before any of them moves, so their order does not count) ...
            if self.core_wait > 0.0 {
                for k in 0..self.waiting.len() {
                    let f = &self.waiting[k];
                    if f.start <= self.now + tol && !f.core_checked {
                        let waits = self.waits_for_core(f);
                        let f = &mut self.waiting[k];
                        f.core_checked = true;
                        if waits {
                            f.start = self.now + self.core_wait;
                            changed = true;
                        }
                    }
                }
            }
            // ... and then start moving data.
            let mut k = 0;
            while k < self.waiting.len() {
                if self.waiting[k].start <= self.now + tol {
                    let f = self.waiting.swap_remove(k);
                    if f.bytes == 0.0 {
                        self.finish(f);
                    } else {
                        self.active.push(f);
                    }
                    changed = true;
                } else {
                    k += 1;
                }
            }
            // Completions due now may move ranks to their next step, which matches new flows.
            while let Some(d) = self.done.peek().copied() {
                if d.at > self.now + tol {
                    break;
                }
                self.done.pop();
                self.complete(d);
                changed = true;
            }
            if changed {
                self.share();
            }
        }
    }

    /// Whether `f` waits for a turn on a core: a rank at either end shares its core with a
    /// rank outside the message that has messages of its own in flight (checked when its α
    /// has elapsed, so the messages of the same moment are all there). A message between the
    /// two ranks of one core is a hand-over between them, with no third party to wait for.
    fn waits_for_core(&self, f: &Flow) -> bool {
        [f.from, f.to].into_iter().any(|e| {
            self.net.shared_core(e).is_some_and(|c| {
                self.core_ranks.get(&c).is_some_and(|ranks| {
                    ranks
                        .iter()
                        .any(|&q| q != f.from && q != f.to && self.ranks[q].in_flight > 0)
                })
            })
        })
    }

    /// A flow has delivered its last byte at `self.now`.
    fn finish(&mut self, f: Flow) {
        self.ranks[f.from].in_flight -= 1;
        self.ranks[f.to].in_flight -= 1;
        self.done.push(Done {
            at: self.now,
            key: (f.from, f.send_op),
        });
        let mut at = self.now;
        if f.reduces {
            let link = self.net.link(f.from, f.to);
            at = self.reduce_received(f.to, &link, f.bytes, (f.start, at));
        }
        self.done.push(Done {
            at,
            key: (f.to, f.recv_op),
        });
    }

    /// Runs `seconds` of rank `r`'s own work (a reduction or a copy) from `at` on, after its
    /// earlier work and after that of the ranks sharing its core; returns when it ends.
    fn local_work(&mut self, r: usize, at: f64, seconds: f64) -> f64 {
        let end = at.max(self.work_free(r)) + seconds;
        self.busy_until(r, end)
    }

    /// Rank `r`'s reduction of `bytes` that came over `link`, their data having moved from
    /// `start` to `arrive`, run beside the data ([`crate::cost::reduced_at`]) after its
    /// earlier work and that of the ranks sharing its core. Returns when it ends.
    fn reduce_received(&mut self, r: usize, link: &LinkCost, bytes: f64, moved: (f64, f64)) -> f64 {
        let end = crate::cost::reduced_at(link, bytes, moved, self.work_free(r));
        self.busy_until(r, end)
    }

    /// When rank `r` (and the core it shares, if it does) is free for its own work.
    fn work_free(&self, r: usize) -> f64 {
        let own = self.ranks[r].reduce_free;
        match self.net.shared_core(r) {
            Some(c) => own.max(self.core_free.get(&c).copied().unwrap_or(0.0)),
            None => own,
        }
    }

    /// Rank `r` (and its shared core) busy with its own work until `end`; returns `end`.
    fn busy_until(&mut self, r: usize, end: f64) -> f64 {
        self.ranks[r].reduce_free = end;
        if let Some(c) = self.net.shared_core(r) {
            self.core_free.insert(c, end);
        }
        end
    }

    fn complete(&mut self, d: Done) {
        let rank = d.key.0;
        let st = &mut self.ranks[rank];
        st.pending -= 1;
        st.end = st.end.max(d.at);
        if st.pending == 0 {
            st.step += 1;
            self.enter(rank, d.at);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Algorithm;
    use crate::cost::{Flat, LinkCost};
    use crate::schedule::{Buf, Collective, Region, Step};

    const BETA: f64 = 1e-8; // 100 MB/s per rank
    const ALPHA: f64 = 1e-5;

    /// Every rank has its own 100 MB/s link; uplink `u` (shared, 100 MB/s) is on the path of
    /// every message listed in `paths` as (from, to, u).
    struct Test {
        paths: Vec<(usize, usize, u64)>,
        efficiency: f64,
    }

    impl Network for Test {
        fn link(&self, _: usize, _: usize) -> LinkCost {
            LinkCost {
                alpha: ALPHA,
                beta: BETA,
                gamma: 0.0,
                reduces_after_data: false,
            }
        }
        fn uplinks(&self, from: usize, to: usize, out: &mut Vec<Uplink>) {
            out.clear();
            for &(f, t, id) in &self.paths {
                if (f, t) == (from, to) {
                    out.push(Uplink {
                        id,
                        seconds_per_byte: BETA,
                        shared_efficiency: self.efficiency,
                    });
                }
            }
        }
        fn flow_level(&self) -> bool {
            true
        }
    }

    fn region(len: usize) -> Region {
        Region {
            buf: Buf::Output,
            offset: 0,
            len,
        }
    }
    fn send(peer: usize, len: usize) -> Op {
        Op::Send {
            peer,
            src: region(len),
        }
    }
    fn recv(peer: usize, len: usize) -> Op {
        Op::Recv {
            peer,
            dst: region(len),
        }
    }
    fn sched(steps: Vec<Vec<Op>>) -> RankSchedule {
        RankSchedule {
            steps: steps.into_iter().map(|ops| Step { ops }).collect(),
            scratch_elems: 0,
        }
    }
    fn finish(s: &[RankSchedule], net: &dyn Network) -> f64 {
        time(s, net, 1.0).unwrap().into_iter().fold(0.0, f64::max)
    }
    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * b.abs().max(1e-12)
    }

    /// Ranks 1 and 2 both send `n` bytes to rank 0 in one step.
    fn fan_in(n: usize) -> Vec<RankSchedule> {
        vec![
            sched(vec![vec![recv(1, n), recv(2, n)]]),
            sched(vec![vec![send(0, n)]]),
            sched(vec![vec![send(0, n)]]),
        ]
    }

    #[test]
    fn a_receiver_port_is_shared_by_its_incoming_flows() {
        let n = 1_000_000;
        let net = Test {
            paths: vec![],
            efficiency: 1.0,
        };
        // Two 1 MB messages into one 100 MB/s port: 20 ms, not 10.
        assert!(close(
            finish(&fan_in(n), &net),
            ALPHA + 2.0 * n as f64 * BETA
        ));
    }

    #[test]
    fn flows_share_an_uplink_only_while_they_overlap() {
        let n = 1_000_000;
        // Rank 0 -> 1 and rank 2 -> 3 at once, both over uplink 7: each gets half of it.
        let pair = |late: bool| {
            let mut s = vec![
                sched(vec![vec![send(1, n)]]),
                sched(vec![vec![recv(0, n)]]),
                sched(vec![vec![send(3, n)]]),
                sched(vec![vec![recv(2, n)]]),
            ];
            if late {
                // Rank 2 first takes 2 MB from rank 4 (20 ms), so its message to rank 3
                // starts after rank 0's has finished (10 ms): they never overlap.
                s[2].steps.insert(
                    0,
                    Step {
                        ops: vec![recv(4, 2 * n)],
                    },
                );
                s.push(sched(vec![vec![send(2, 2 * n)]]));
            }
            s
        };
        let shared = Test {
            paths: vec![(0, 1, 7), (2, 3, 7)],
            efficiency: 1.0,
        };
        assert!(close(
            finish(&pair(false), &shared),
            ALPHA + 2.0 * n as f64 * BETA
        ));
        let lossy = Test {
            paths: vec![(0, 1, 7), (2, 3, 7)],
            efficiency: 0.8,
        };
        assert!(close(
            finish(&pair(false), &lossy),
            ALPHA + 2.0 * n as f64 * BETA / 0.8
        ));
        // In sequence: 20 ms + α for the first, then 10 ms + α alone on the uplink.
        let t = finish(&pair(true), &lossy);
        assert!(close(t, 2.0 * ALPHA + 3.0 * n as f64 * BETA), "{t}");
    }

    #[test]
    fn fair_shares_follow_the_tightest_link() {
        let n = 1_000_000;
        // Flows 0->1 and 2->3 share uplink 7, and 2->3 and 4->5 share uplink 8. Max-min: each
        // of the three gets 50 MB/s, and everything ends at 20 ms.
        let s = vec![
            sched(vec![vec![send(1, n)]]),
            sched(vec![vec![recv(0, n)]]),
            sched(vec![vec![send(3, n)]]),
            sched(vec![vec![recv(2, n)]]),
            sched(vec![vec![send(5, n)]]),
            sched(vec![vec![recv(4, n)]]),
        ];
        let net = Test {
            paths: vec![(0, 1, 7), (2, 3, 7), (2, 3, 8), (4, 5, 8)],
            efficiency: 1.0,
        };
        assert!(close(finish(&s, &net), ALPHA + 2.0 * n as f64 * BETA));
        // Rank 4's message is half as big: it finishes at 10 ms, and 2->3 keeps 50 MB/s
        // because uplink 7 still holds it to half; all done at 20 ms again.
        let mut s = s;
        s[4] = sched(vec![vec![send(5, n / 2)]]);
        s[5] = sched(vec![vec![recv(4, n / 2)]]);
        assert!(close(finish(&s, &net), ALPHA + 2.0 * n as f64 * BETA));
    }

    /// A flat network timed by flows.
    struct FlowFlat(Flat);
    impl Network for FlowFlat {
        fn link(&self, f: usize, t: usize) -> LinkCost {
            self.0.link(f, t)
        }
        fn flow_level(&self) -> bool {
            true
        }
    }

    #[test]
    fn lock_step_schedules_cost_what_the_step_engine_says() {
        let link = LinkCost {
            alpha: ALPHA,
            beta: BETA,
            gamma: 1e-9,
            reduces_after_data: false,
        };
        for algorithm in [
            Algorithm::Ring,
            Algorithm::RecursiveDoubling,
            Algorithm::Rabenseifner,
        ] {
            for p in [2, 5, 8] {
                let s =
                    crate::sim::schedules(Collective::AllReduce, algorithm, p, 1000, 0, 0).unwrap();
                let steps = crate::sim::time(&s, &Flat(link), 4.0).unwrap();
                let flows = time(&s, &FlowFlat(Flat(link)), 4.0).unwrap();
                for (a, b) in steps.iter().zip(&flows) {
                    assert!(
                        close(*b, *a),
                        "{algorithm:?} on {p}: step engine {a}, flows {b}"
                    );
                }
            }
        }
    }

    /// One host, every link 100 MB/s and reductions at 1 GB/s; `cores[r]` is the core rank
    /// `r` shares, if any, a message waits `core_wait` for a turn on a busy one, and costs
    /// `cpu` seconds of CPU at each end.
    struct OneHost {
        cores: Vec<Option<u32>>,
        core_wait: f64,
        cpu: f64,
    }
    impl Network for OneHost {
        fn link(&self, _: usize, _: usize) -> LinkCost {
            LinkCost {
                alpha: ALPHA,
                beta: BETA,
                gamma: 1e-9,
                reduces_after_data: false,
            }
        }
        fn crosses_hosts(&self, _: usize, _: usize) -> bool {
            false
        }
        fn shared_core(&self, r: usize) -> Option<u32> {
            self.cores.get(r).copied().flatten()
        }
        fn core_wait(&self) -> f64 {
            self.core_wait
        }
        fn message_cpu(&self, _: usize, _: usize) -> f64 {
            self.cpu
        }
        fn flow_level(&self) -> bool {
            true
        }
    }

    #[test]
    fn ranks_on_one_core_take_turns_copying_and_reducing() {
        let n = 1_000_000;
        // Two pairs exchange at once; ranks 0 and 2 share a core, 1 and 3 have their own.
        let exchange = vec![
            sched(vec![vec![send(1, n), recv(1, n)]]),
            sched(vec![vec![send(0, n), recv(0, n)]]),
            sched(vec![vec![send(3, n), recv(3, n)]]),
            sched(vec![vec![send(2, n), recv(2, n)]]),
        ];
        let alone = OneHost {
            cores: vec![],
            core_wait: 0.0,
            cpu: 0.0,
        };
        let shared = OneHost {
            cores: vec![Some(0), None, Some(0), None],
            core_wait: 0.0,
            cpu: 0.0,
        };
        let bytes = n as f64 * BETA;
        assert!(close(finish(&exchange, &alone), ALPHA + bytes));
        // Core 0 sends and receives for two ranks: each flow gets half its rate.
        assert!(close(finish(&exchange, &shared), ALPHA + 2.0 * bytes));
        // One rank of a pair on a shared core, sending only: the core has room for both.
        let one_way = vec![
            sched(vec![vec![send(1, n)]]),
            sched(vec![vec![recv(0, n)]]),
            sched(vec![vec![send(3, n)]]),
            sched(vec![vec![recv(2, n)]]),
        ];
        assert!(close(finish(&one_way, &shared), ALPHA + bytes));
        // Receives that reduce: the two ranks of core 0 reduce one after the other.
        let reduce = |peer| Op::RecvReduce {
            peer,
            src: region(n),
            dst: region(n),
        };
        let reducing = vec![
            sched(vec![vec![reduce(1)]]),
            sched(vec![vec![send(0, n)]]),
            sched(vec![vec![reduce(3)]]),
            sched(vec![vec![send(2, n)]]),
        ];
        // Each reduces beside its data (10 times slower than the reduction), so alone a
        // receive ends one piece's reduction after its last byte; on core 0 the second rank's
        // reduction waits for the first's.
        let (gamma, piece) = (n as f64 * 1e-9, crate::cost::REDUCE_PIECE_BYTES * 1e-9);
        assert!(close(finish(&reducing, &alone), ALPHA + bytes + piece));
        assert!(close(
            finish(&reducing, &shared),
            ALPHA + bytes + piece + gamma
        ));
    }

    /// Three ranks, 0 and 2 on one core: in a ring step every rank has a message in flight,
    /// so the messages of 0 and 2 to and from rank 1 wait for the core's other rank; rd's
    /// fold and unfold hand over between 0 and 2, and its exchange finds rank 2 idle, so none
    /// of its messages waits.
    #[test]
    fn a_message_waits_its_turn_while_its_cores_other_rank_has_messages_in_flight() {
        const WAIT: f64 = 3e-6;
        let ring_step = vec![
            sched(vec![vec![send(1, 0), recv(2, 0)]]),
            sched(vec![vec![send(2, 0), recv(0, 0)]]),
            sched(vec![vec![send(0, 0), recv(1, 0)]]),
        ];
        let rd = vec![
            sched(vec![
                vec![recv(2, 0)],
                vec![send(1, 0), recv(1, 0)],
                vec![send(2, 0)],
            ]),
            sched(vec![vec![send(0, 0), recv(0, 0)]]),
            sched(vec![vec![send(0, 0)], vec![recv(0, 0)]]),
        ];
        let host = |cores: Vec<Option<u32>>, core_wait| OneHost {
            cores,
            core_wait,
            cpu: 0.0,
        };
        let shared = host(vec![Some(0), None, Some(0)], WAIT);
        assert!(close(finish(&ring_step, &shared), ALPHA + WAIT));
        assert!(close(finish(&rd, &shared), 3.0 * ALPHA));
        // Cores of their own, or no wait measured: α alone.
        assert!(close(finish(&ring_step, &host(vec![], WAIT)), ALPHA));
        let unmeasured = host(vec![Some(0), None, Some(0)], 0.0);
        assert!(close(finish(&ring_step, &unmeasured), ALPHA));
    }

    #[test]
    fn a_messages_cpu_time_is_paid_one_after_another_on_its_cpu() {
        const O: f64 = 2e-6;
        // Rank 0 sends to three peers at once: its CPU sends them one after another, and
        // each receiver spends O once its message has come, α after it left.
        let fan_out = vec![
            sched(vec![vec![send(1, 0), send(2, 0), send(3, 0)]]),
            sched(vec![vec![recv(0, 0)]]),
            sched(vec![vec![recv(0, 0)]]),
            sched(vec![vec![recv(0, 0)]]),
        ];
        let own = OneHost {
            cores: vec![],
            core_wait: 0.0,
            cpu: O,
        };
        let ends = time(&fan_out, &own, 1.0).unwrap();
        for (r, &end) in ends.iter().enumerate().skip(1) {
            assert!(close(end, r as f64 * O + ALPHA + O), "rank {r}: {end}");
        }
        assert!(close(ends[0], 3.0 * O + ALPHA + O), "{ends:?}");
        // Two pairs at once: with cores of their own, each pays O at both ends; with the
        // senders on one core and the receivers on another, the second message waits for the
        // first at both.
        let pairs = vec![
            sched(vec![vec![send(1, 0)]]),
            sched(vec![vec![recv(0, 0)]]),
            sched(vec![vec![send(3, 0)]]),
            sched(vec![vec![recv(2, 0)]]),
        ];
        assert!(close(finish(&pairs, &own), 2.0 * O + ALPHA));
        let cores = vec![Some(0), Some(1), Some(0), Some(1)];
        let shared = OneHost {
            cores: cores.clone(),
            core_wait: 0.0,
            cpu: O,
        };
        assert!(close(finish(&pairs, &shared), 3.0 * O + ALPHA));
        // A sender that reached its step early has spent its CPU time by the time its
        // receiver comes: only the receiver's shows.
        let late = vec![
            sched(vec![vec![send(1, 0)]]),
            sched(vec![vec![recv(2, 0)], vec![recv(0, 0)]]),
            sched(vec![vec![send(1, 0)]]),
        ];
        // 2 -> 1: O + α + O; then 0 -> 1, its send long done: α + O more.
        assert!(close(finish(&late, &own), 3.0 * O + 2.0 * ALPHA));
        // Without a CPU cost, α alone.
        let free = OneHost {
            cores,
            core_wait: 0.0,
            cpu: 0.0,
        };
        assert!(close(finish(&pairs, &free), ALPHA));
    }

    /// A receive that reduces runs its reduction beside its data: it ends one piece's
    /// reduction after its last byte where the data is the slower, and its whole reduction
    /// after its first byte where the reduction is; a message of one piece is reduced after
    /// it has arrived.
    #[test]
    fn a_reducing_receive_reduces_beside_its_data() {
        struct Reduces(f64);
        impl Network for Reduces {
            fn link(&self, _: usize, _: usize) -> LinkCost {
                LinkCost {
                    alpha: ALPHA,
                    beta: BETA,
                    gamma: self.0,
                    reduces_after_data: false,
                }
            }
            fn flow_level(&self) -> bool {
                true
            }
        }
        let reducing = |n: usize| {
            vec![
                sched(vec![vec![Op::RecvReduce {
                    peer: 1,
                    src: region(n),
                    dst: region(n),
                }]]),
                sched(vec![vec![send(0, n)]]),
            ]
        };
        let piece = crate::cost::REDUCE_PIECE_BYTES;
        let n = 1_000_000;
        let data = n as f64 * BETA;
        // The data is the slower: one piece is left when it has all arrived.
        let fast = Reduces(BETA / 10.0);
        assert!(close(
            finish(&reducing(n), &fast),
            ALPHA + data + piece * BETA / 10.0
        ));
        // The reduction is the slower: it ends when it has reduced every byte.
        let slow = Reduces(3.0 * BETA);
        assert!(close(finish(&reducing(n), &slow), ALPHA + 3.0 * data));
        // One piece: data, then its reduction.
        let small = 1000;
        assert!(close(
            finish(&reducing(small), &fast),
            ALPHA + small as f64 * (BETA + BETA / 10.0)
        ));
    }

    #[test]
    fn a_missing_partner_is_an_error_not_a_hang() {
        let s = vec![sched(vec![vec![recv(1, 10)]]), sched(vec![vec![]])];
        let err = time(
            &s,
            &Test {
                paths: vec![],
                efficiency: 1.0,
            },
            1.0,
        )
        .unwrap_err();
        assert!(err.contains("rank 0"), "{err}");
    }
}
