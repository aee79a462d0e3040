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

use std::collections::{BinaryHeap, HashMap};

use super::classes::Folded;
use super::lockstep::{Compact, Kind};
use crate::fluid::{Demand, Resource, share};
use crate::sim::Earliest;

/// Relative slack when comparing times.
const EPS: f64 = 1e-12;

struct Flow {
    class: u32,
    op: u32,
    bytes: f64,
    start: f64,
    remaining: f64,
    demand: Demand,
}

impl AsMut<Demand> for Flow {
    fn as_mut(&mut self) -> &mut Demand {
        &mut self.demand
    }
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
    waiting: Vec<Flow>,
    active: Vec<Flow>,
    done: BinaryHeap<Earliest<(u32, u32)>>,
    resources: Vec<Resource>,
    /// (class, sends, off host) → port.
    ports: HashMap<(u32, bool, bool), usize>,
    /// Uplink class → resource.
    uplinks: Vec<Option<usize>>,
    frozen: Vec<bool>,
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
        waiting: Vec::new(),
        active: Vec::new(),
        done: BinaryHeap::new(),
        resources: Vec::new(),
        ports: HashMap::new(),
        uplinks: vec![None; folded.uplink_classes.len()],
        frozen: Vec::new(),
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
        let bytes = self.sched(c).transfers[t].elems as f64 * self.elem_bytes;
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
                    self.resources.push(Resource::new(rate, eff));
                    self.uplinks[u as usize] = Some(self.resources.len() - 1);
                    self.resources.len() - 1
                }
            };
            uses.push((res, w));
        }
        let cap = if f.link.beta > 0.0 {
            1.0 / f.link.beta
        } else {
            f64::INFINITY
        };
        self.waiting.push(Flow {
            class: c as u32,
            op: t as u32,
            bytes,
            start,
            remaining: bytes,
            demand: Demand {
                cap,
                rate: 0.0,
                uses,
            },
        });
    }

    fn port(&mut self, class: u32, sends: bool, off_host: bool) -> usize {
        let next = self.resources.len();
        let id = *self.ports.entry((class, sends, off_host)).or_insert(next);
        if id == next {
            self.resources.push(Resource::new(f64::INFINITY, 1.0));
        }
        id
    }

    fn run(&mut self) {
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
                return;
            }
            let dt = (next - self.now).max(0.0);
            self.now = self.now.max(next);
            let tol = EPS * self.now.max(1e-9);
            let mut changed = false;
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
                    self.finish(&f);
                    changed = true;
                } else {
                    k += 1;
                }
            }
            let mut k = 0;
            while k < self.waiting.len() {
                if self.waiting[k].start <= self.now + tol {
                    let f = self.waiting.swap_remove(k);
                    if f.bytes == 0.0 {
                        self.finish(&f);
                    } else {
                        self.active.push(f);
                    }
                    changed = true;
                } else {
                    k += 1;
                }
            }
            while let Some(d) = self.done.peek().copied() {
                if d.at > self.now + tol {
                    break;
                }
                self.done.pop();
                self.complete(d.key.0 as usize, d.at);
                changed = true;
            }
            if changed {
                share(&mut self.resources, &mut self.active, &mut self.frozen);
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
            if rs.transfers[j as usize].kind == Kind::RecvReduce {
                let st = &mut self.state[to];
                at = at.max(st.reduce_free) + f.bytes * flow.link.gamma;
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
