//! Flow-level timing of a folded schedule ([`super::classes`]): the rules of the full
//! simulation (`crate::fluid`), one representative per class of alike ranks.
//!
//! A flow starts α after its sender and its receiver have both entered the steps that hold
//! it, and between events every flow moves at its max-min fair share of its link, the
//! sender's and receiver's ports and the shared uplinks it crosses, where it counts as the
//! number of alike flows it stands for ([`crate::fluid::share`]). A reducing receive ends
//! `bytes × γ` after its data, one reduction at a time per rank. Since alike ranks move
//! alike, the times are those of the full simulation, at the cost of the classes instead of
//! the ranks.
//!
//! An event re-shares only the flows connected to what it changed (through the resources
//! they share), and the next start and finish come from heaps, so an event costs what its
//! connected flows cost, not what every flow in flight costs.

use std::collections::{BinaryHeap, HashMap};

use super::classes::Folded;
use super::lockstep::{Compact, Kind};
use crate::cost::reduced_at;
use crate::fluid::{Demand, Resource, share};
use crate::sim::Earliest;

/// Relative slack when comparing times.
const EPS: f64 = 1e-12;

struct Flow {
    class: u32,
    op: u32,
    bytes: f64,
    /// When it starts to move data.
    start: f64,
    /// Bytes left at `updated`, moving at `demand.rate` since.
    remaining: f64,
    updated: f64,
    /// Set from the engine's counter at every new rate (never reused, not even by a flow
    /// that takes a finished one's id), so stale finish events are known.
    version: u64,
    demand: Demand,
}

#[derive(Default)]
struct ClassState {
    step: usize,
    entered: f64,
    end: f64,
    pending: usize,
    reduce_free: f64,
    finished: bool,
}

struct Engine<'a> {
    scheds: &'a [Compact],
    folded: &'a Folded,
    elem_bytes: f64,
    state: Vec<ClassState>,
    /// Per class, per transfer of its representative: its flow was started.
    started: Vec<Vec<bool>>,
    now: f64,
    /// Flows by id (waiting for their start, or moving data); `None` once finished.
    flows: Vec<Option<Flow>>,
    free_ids: Vec<u32>,
    /// Waiting flows by start time; moving flows by finish time (with the version).
    starts: BinaryHeap<Earliest<u32>>,
    finishes: BinaryHeap<Earliest<(u32, u64)>>,
    versions: u64,
    done: BinaryHeap<Earliest<(u32, u32)>>,
    resources: Vec<Resource>,
    /// Per resource, the moving flows that use it.
    on: Vec<Vec<u32>>,
    /// (class, sends, off host) → port.
    ports: HashMap<(u32, bool, bool), usize>,
    /// Uplink class → resource.
    uplinks: Vec<Option<usize>>,
    frozen: Vec<bool>,
    /// Scratch for re-sharing: resources to visit, flows found, their demands.
    dirty: Vec<usize>,
    seen_res: Vec<bool>,
    seen_flow: Vec<bool>,
    component: Vec<u32>,
    visited: Vec<usize>,
    demands: Vec<Demand>,
}

/// Times `scheds` (one per position, entering at `start`) folded as `folded`; returns when
/// each position finishes.
pub(super) fn time(
    scheds: &[Compact],
    folded: &Folded,
    elem_bytes: f64,
    start: &[f64],
) -> Result<Vec<f64>, String> {
    let n = folded.classes();
    let mut e = Engine {
        scheds,
        folded,
        elem_bytes,
        state: (0..n).map(|_| ClassState::default()).collect(),
        started: folded
            .reps
            .iter()
            .map(|&r| vec![false; scheds[r].transfers.len()])
            .collect(),
        now: 0.0,
        flows: Vec::new(),
        free_ids: Vec::new(),
        starts: BinaryHeap::new(),
        finishes: BinaryHeap::new(),
        versions: 0,
        done: BinaryHeap::new(),
        resources: Vec::new(),
        on: Vec::new(),
        ports: HashMap::new(),
        uplinks: vec![None; folded.uplink_classes.len()],
        frozen: Vec::new(),
        dirty: Vec::new(),
        seen_res: Vec::new(),
        seen_flow: Vec::new(),
        component: Vec::new(),
        visited: Vec::new(),
        demands: Vec::new(),
    };
    for c in 0..n {
        e.enter(c, start[folded.reps[c]]);
    }
    e.run();
    if let Some(c) = e.state.iter().position(|s| !s.finished) {
        return Err(format!(
            "rank {} never finishes its step {}: a peer never posts the matching operation",
            folded.reps[c], e.state[c].step
        ));
    }
    Ok(folded
        .class_of
        .iter()
        .map(|&c| e.state[c as usize].end)
        .collect())
}

impl Engine<'_> {
    fn sched(&self, c: usize) -> &Compact {
        &self.scheds[self.folded.reps[c]]
    }

    /// Whether class `c` is in the step that holds its transfer `t`.
    fn at(&self, c: usize, t: usize) -> bool {
        let s = self.sched(c);
        let st = &self.state[c];
        !st.finished && (s.bounds[st.step] as usize..s.bounds[st.step + 1] as usize).contains(&t)
    }

    /// Enters class `c`'s current step at `at` and starts the flows it can.
    fn enter(&mut self, c: usize, at: f64) {
        let s = &self.scheds[self.folded.reps[c]];
        let st = &mut self.state[c];
        if st.step >= s.steps() {
            st.finished = true;
            st.end = st.end.max(at);
            return;
        }
        st.entered = at;
        st.end = st.end.max(at);
        let (a, b) = (s.bounds[st.step] as usize, s.bounds[st.step + 1] as usize);
        st.pending = b - a;
        for t in a..b {
            if s.transfers[t].sends() {
                self.try_start(c, t);
            } else {
                for k in 0..self.folded.fed_by[c][t].len() {
                    let (from, op) = self.folded.fed_by[c][t][k];
                    self.try_start(from as usize, op as usize);
                }
            }
        }
    }

    /// Starts class `c`'s flow for its send `t` if both ends have reached it.
    fn try_start(&mut self, c: usize, t: usize) {
        let Some(f) = self.folded.sends[c][t].as_ref() else {
            return;
        };
        let to = f.to_class as usize;
        if self.started[c][t] || !self.at(c, t) || !self.at(to, f.to_op as usize) {
            return;
        }
        self.started[c][t] = true;
        let sched = self.sched(c);
        let bytes = sched.elems(&sched.transfers[t]) as f64 * self.elem_bytes;
        let start = self.state[c].entered.max(self.state[to].entered) + f.link.alpha;
        let mut uses = vec![
            (self.port(c as u32, true, f.off_host), 1.0),
            (self.port(f.to_class, false, f.off_host), f.recv_weight),
        ];
        for &(u, w) in &f.uplinks {
            let res = match self.uplinks[u as usize] {
                Some(r) => r,
                None => {
                    let (rate, eff) = self.folded.uplink_classes[u as usize];
                    let r = self.resource(rate, eff);
                    self.uplinks[u as usize] = Some(r);
                    r
                }
            };
            uses.push((res, w));
        }
        let cap = if f.link.beta > 0.0 {
            1.0 / f.link.beta
        } else {
            f64::INFINITY
        };
        let flow = Flow {
            class: c as u32,
            op: t as u32,
            bytes,
            start,
            remaining: bytes,
            updated: start,
            version: 0,
            demand: Demand {
                cap,
                rate: 0.0,
                uses,
            },
        };
        let id = match self.free_ids.pop() {
            Some(id) => {
                self.flows[id as usize] = Some(flow);
                id
            }
            None => {
                self.flows.push(Some(flow));
                self.seen_flow.push(false);
                self.flows.len() as u32 - 1
            }
        };
        self.starts.push(Earliest { at: start, key: id });
    }

    fn resource(&mut self, capacity: f64, shared_efficiency: f64) -> usize {
        self.resources
            .push(Resource::new(capacity, shared_efficiency));
        self.on.push(Vec::new());
        self.seen_res.push(false);
        self.resources.len() - 1
    }

    fn port(&mut self, class: u32, sends: bool, off_host: bool) -> usize {
        let next = self.resources.len();
        let id = *self.ports.entry((class, sends, off_host)).or_insert(next);
        if id == next {
            self.resource(f64::INFINITY, 1.0);
        }
        id
    }

    fn run(&mut self) {
        loop {
            let next_start = self.starts.peek().map_or(f64::INFINITY, |e| e.at);
            let next_finish = self.next_finish();
            let next_done = self.done.peek().map_or(f64::INFINITY, |d| d.at);
            let next = next_start.min(next_finish).min(next_done);
            if !next.is_finite() {
                return;
            }
            self.now = self.now.max(next);
            let tol = EPS * self.now.max(1e-9);
            // Flows that deliver their last byte now.
            while self.next_finish() <= self.now + tol {
                let Some(e) = self.finishes.pop() else { break };
                let id = e.key.0 as usize;
                let Some(f) = self.flows[id].take() else {
                    continue;
                };
                self.free_ids.push(id as u32);
                for &(u, _) in &f.demand.uses {
                    let on = &mut self.on[u];
                    if let Some(k) = on.iter().position(|&x| x as usize == id) {
                        on.swap_remove(k);
                    }
                    self.dirty.push(u);
                }
                self.finish(&f);
            }
            // Flows whose α has elapsed start moving data.
            while self.starts.peek().is_some_and(|e| e.at <= self.now + tol) {
                let Some(e) = self.starts.pop() else { break };
                let id = e.key as usize;
                let zero = self.flows[id].as_ref().is_some_and(|f| f.bytes == 0.0);
                if zero {
                    if let Some(f) = self.flows[id].take() {
                        self.free_ids.push(id as u32);
                        self.finish(&f);
                    }
                    continue;
                }
                if let Some(f) = self.flows[id].as_mut() {
                    f.updated = self.now;
                    for &(u, _) in &f.demand.uses {
                        self.on[u].push(id as u32);
                        self.dirty.push(u);
                    }
                }
            }
            // Completions due now may move classes to their next step, which starts flows.
            while let Some(d) = self.done.peek().copied() {
                if d.at > self.now + tol {
                    break;
                }
                self.done.pop();
                self.complete(d.key.0 as usize, d.at);
            }
            if !self.dirty.is_empty() {
                self.reshare();
            }
        }
    }

    /// When the next moving flow finishes (stale events dropped).
    fn next_finish(&mut self) -> f64 {
        while let Some(e) = self.finishes.peek() {
            let (id, version) = e.key;
            if self.flows[id as usize]
                .as_ref()
                .is_some_and(|f| f.version == version)
            {
                return e.at;
            }
            self.finishes.pop();
        }
        f64::INFINITY
    }

    /// New fair rates for the moving flows connected to the resources an event touched.
    fn reshare(&mut self) {
        self.component.clear();
        self.visited.clear();
        while let Some(u) = self.dirty.pop() {
            if self.seen_res[u] {
                continue;
            }
            self.seen_res[u] = true;
            self.visited.push(u);
            for &id in &self.on[u] {
                if self.seen_flow[id as usize] {
                    continue;
                }
                self.seen_flow[id as usize] = true;
                self.component.push(id);
                if let Some(f) = self.flows[id as usize].as_ref() {
                    self.dirty.extend(f.demand.uses.iter().map(|&(r, _)| r));
                }
            }
        }
        for &u in &self.visited {
            self.seen_res[u] = false;
        }
        // Data moved until now at the old rates; then the new rates.
        self.demands.clear();
        for &id in &self.component {
            self.seen_flow[id as usize] = false;
            if let Some(f) = self.flows[id as usize].as_mut() {
                if f.demand.rate.is_infinite() {
                    f.remaining = 0.0;
                } else {
                    f.remaining -= f.demand.rate * (self.now - f.updated);
                }
                f.updated = self.now;
                self.demands.push(std::mem::take(&mut f.demand));
            }
        }
        share(&mut self.resources, &mut self.demands, &mut self.frozen);
        for (k, d) in self.demands.drain(..).enumerate() {
            let id = self.component[k];
            if let Some(f) = self.flows[id as usize].as_mut() {
                f.demand = d;
                self.versions += 1;
                f.version = self.versions;
                let rate = f.demand.rate;
                let at = if rate.is_infinite() || f.remaining <= f.bytes * 1e-9 {
                    self.now
                } else {
                    self.now + f.remaining / rate
                };
                self.finishes.push(Earliest {
                    at,
                    key: (id, f.version),
                });
            }
        }
    }

    /// A flow has delivered its last byte: its send is done, and so are the receives it
    /// completes, each after its reduction where it reduces.
    fn finish(&mut self, f: &Flow) {
        let (c, t) = (f.class as usize, f.op as usize);
        self.done.push(Earliest {
            at: self.now,
            key: (f.class, f.op),
        });
        let Some(flow) = self.folded.sends[c][t].as_ref() else {
            return;
        };
        let to = flow.to_class as usize;
        let rs = &self.scheds[self.folded.reps[to]];
        for &j in &flow.completes {
            let mut at = self.now;
            if rs.transfers[j as usize].kind() == Kind::RecvReduce {
                let st = &mut self.state[to];
                at = reduced_at(&flow.link, f.bytes, (f.start, at), st.reduce_free);
                st.reduce_free = at;
            }
            self.done.push(Earliest {
                at,
                key: (flow.to_class, j),
            });
        }
    }

    fn complete(&mut self, c: usize, at: f64) {
        let st = &mut self.state[c];
        st.pending -= 1;
        st.end = st.end.max(at);
        if st.pending == 0 {
            st.step += 1;
            self.enter(c, at);
        }
    }
}
