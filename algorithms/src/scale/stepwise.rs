//! Pricing on the vector of times without building schedules: phases whose every step has
//! the same shape (each position exchanges with one other), O(p) a step, for the sizes where
//! building and folding them would cost more than a rank can spend on its first call.

use super::{Positions, Pricer};
use crate::builders::{Fold, block};
use crate::cost::{Network, Uplink, reduced_at};
use crate::hierarchy::Hierarchy;

/// What [`Pricer::exchange_step`] reuses from step to step.
pub(super) struct StepScratch {
    ups: Vec<Uplink>,
    /// Messages on each uplink in the current step, by dense index
    /// ([`crate::hierarchy::Hierarchy::uplink_index`]).
    sharing: Vec<u32>,
    /// The step's uplinks, message after message, with their dense index; message i's end at
    /// `ends[i]`.
    crossed: Vec<(usize, Uplink)>,
    ends: Vec<usize>,
    next: Vec<f64>,
}

impl StepScratch {
    /// Counts a step's messages on every uplink and notes the uplinks of each, from (from, to)
    /// pairs in order; with `both_ways`, each pair also stands for its reverse message,
    /// which crosses the reverse uplinks.
    fn count(
        &mut self,
        net: &Positions,
        routes: impl Iterator<Item = (usize, usize)>,
        both_ways: bool,
    ) {
        let h = net.net.hierarchy;
        self.sharing.fill(0);
        self.crossed.clear();
        self.ends.clear();
        for (x, y) in routes {
            net.uplinks(x, y, &mut self.ups);
            for u in &self.ups {
                let i = h.uplink_index(u.id);
                self.sharing[i] += 1;
                if both_ways {
                    self.sharing[Hierarchy::reverse_uplink_index(i)] += 1;
                }
                self.crossed.push((i, *u));
            }
            self.ends.push(self.crossed.len());
        }
    }

    /// The β of the step's message `m`: its link's, or its most shared uplink's share.
    fn beta(&self, m: usize, link_beta: f64) -> f64 {
        let start = if m == 0 { 0 } else { self.ends[m - 1] };
        self.crossed[start..self.ends[m]]
            .iter()
            .fold(link_beta, |b, (i, u)| {
                b.max(u.shared_beta(self.sharing[*i]))
            })
    }

    pub(super) fn new(uplinks: usize) -> Self {
        Self {
            ups: Vec::new(),
            sharing: vec![0; uplinks],
            crossed: Vec::new(),
            ends: Vec::new(),
            next: Vec::new(),
        }
    }
}

impl Pricer<'_> {
    /// Pairwise exchange in closed form, every rank in step: step k (rank x to x + k) takes
    /// its slowest message, which crosses the most expensive tier of the communicator or the
    /// most shared uplink. Each group of an oversubscribed level is a run of positions; the
    /// messages leaving a run of g positions at shift k number g − (g − k)⁺ − (g − p + k)⁺.
    pub(super) fn pairwise_closed(&mut self, total: usize) {
        let p = self.p();
        let h = self.q.hierarchy;
        let net = &self.net.net;
        let eb = self.q.elem_bytes as f64;
        let bytes = total.div_ceil(p) as f64 * eb;
        let mut tiers = vec![h.inner_tier()];
        tiers.extend((0..h.depth()).map(|l| h.level_tier(l)));
        let worst_tier = tiers
            .iter()
            .map(|&t| net.tier_cost(t))
            .map(|c| c.alpha + bytes * c.beta)
            .fold(0.0, f64::max);
        let top = net.tier_cost(*tiers.last().unwrap_or(&h.inner_tier()));
        // (group size, uplink) of every group of an oversubscribed level.
        let mut shared: Vec<(usize, Uplink)> = Vec::new();
        for l in 0..h.depth() {
            let link = self.q.costs.link(h.level_tier(l));
            if link.oversubscription > 1.0 {
                for &g in h.group_sizes(l) {
                    let g = g as usize;
                    shared.push((
                        g,
                        Uplink {
                            id: 0,
                            seconds_per_byte: link.oversubscription
                                / (g as f64 * link.bandwidth_gbps * 1e9),
                            shared_efficiency: link.shared_efficiency,
                        },
                    ));
                }
            }
        }
        let mut total_time = 0.0;
        for k in 1..p {
            let mut step = worst_tier;
            for (g, up) in &shared {
                let g = *g;
                let leaving = g - g.saturating_sub(k) - g.saturating_sub(p - k);
                if leaving > 0 {
                    let beta = up.shared_beta(leaving as u32).max(top.beta);
                    step = step.max(top.alpha + bytes * beta);
                }
            }
            total_time += reduced_at(&top, bytes, (top.alpha, step), 0.0);
        }
        let start = self.finish();
        self.free.iter_mut().for_each(|t| *t = start + total_time);
    }

    /// Pairwise exchange step by step on the vector of times, O(p) a step.
    pub(super) fn pairwise_stepwise(&mut self, total: usize) {
        let p = self.p();
        let eb = self.q.elem_bytes as f64;
        let mut scratch = StepScratch::new(self.q.hierarchy.uplink_count());
        let mut messages = Vec::with_capacity(p);
        for k in 1..p {
            messages.clear();
            for x in 0..p {
                let y = (x + k) % p;
                let bytes = block(total, p, y).1 as f64 * eb;
                if bytes > 0.0 {
                    messages.push((x, y, bytes));
                }
            }
            self.exchange_step(&messages, true, &mut scratch);
        }
    }

    /// One step on the vector of times: each of `messages` (from, to, bytes) starts when both
    /// ends are free, crosses its link at the sharing of the uplinks this step's messages
    /// cross, and, when `reduce`, is reduced at its receiver.
    pub(super) fn exchange_step(
        &mut self,
        messages: &[(usize, usize, f64)],
        reduce: bool,
        s: &mut StepScratch,
    ) {
        s.count(&self.net, messages.iter().map(|&(x, y, _)| (x, y)), false);
        s.next.clone_from(&self.free);
        for (m, &(x, y, bytes)) in messages.iter().enumerate() {
            let link = self.net.link(x, y);
            let beta = s.beta(m, link.beta);
            let start = self.free[x].max(self.free[y]) + link.alpha;
            let arrive = start + bytes * beta;
            let done = if reduce {
                reduced_at(&link, bytes, (start, arrive), start)
            } else {
                arrive
            };
            s.next[x] = s.next[x].max(arrive);
            s.next[y] = s.next[y].max(done);
        }
        std::mem::swap(&mut self.free, &mut s.next);
    }

    /// One step in which each of `pairs` exchanges `bytes` both ways and reduces what it
    /// receives: [`Pricer::exchange_step`] with the messages x → y and y → x of every pair,
    /// computed once per pair. The two cross the same link and mirrored uplinks (x's group's
    /// up and y's group's down, and the reverse), and as many messages leave each group as
    /// enter it, so the up and down uplink of a group (as wide as each other) are shared
    /// alike and both messages arrive together.
    pub(super) fn pair_step(&mut self, pairs: &[(usize, usize)], bytes: f64, s: &mut StepScratch) {
        s.count(&self.net, pairs.iter().copied(), true);
        for (m, &(x, y)) in pairs.iter().enumerate() {
            let link = self.net.link(x, y);
            let beta = s.beta(m, link.beta);
            let start = self.free[x].max(self.free[y]) + link.alpha;
            let done = reduced_at(&link, bytes, (start, start + bytes * beta), start);
            self.free[x] = self.free[x].max(done);
            self.free[y] = self.free[y].max(done);
        }
    }

    /// Recursive-doubling all-reduce of `count` elements, step by step on the vector of times
    /// (O(p) a step, O(p lg p) in all), with the schedule's pairs: ranks beyond the largest
    /// power of two fold into their odd neighbours first and get the result back last
    /// ([`Fold`]), and in each step a pair starts when both are free, exchanges over its link
    /// at the sharing of the uplinks that step's messages cross, and reduces. Local copies are
    /// free, as in the other engines.
    pub(super) fn doubling_stepwise(&mut self, count: usize) {
        let p = self.p();
        let bytes = count as f64 * self.q.elem_bytes as f64;
        let fold = Fold::new(p);
        let mut scratch = StepScratch::new(self.q.hierarchy.uplink_count());
        // The fold's messages, one way.
        let mut messages = Vec::with_capacity(fold.rem);
        // Ranks that sit out hand their input to their odd neighbour, which reduces it.
        messages.extend((0..fold.rem).map(|i| (2 * i, 2 * i + 1, bytes)));
        self.exchange_step(&messages, true, &mut scratch);
        let mut mask = 1;
        let mut pairs = Vec::with_capacity(fold.pof2 / 2);
        while mask < fold.pof2 {
            pairs.clear();
            for u in (0..fold.pof2).filter(|u| u & mask == 0) {
                pairs.push((fold.real(u), fold.real(u ^ mask)));
            }
            self.pair_step(&pairs, bytes, &mut scratch);
            mask <<= 1;
        }
        messages.clear();
        messages.extend((0..fold.rem).map(|i| (2 * i + 1, 2 * i, bytes)));
        self.exchange_step(&messages, false, &mut scratch);
    }
}

/// The messages of one rank of a recursive-doubling all-reduce of `bytes` over `p` positions
/// of `net` alone (the first rank that takes part throughout), each at its link's
/// α + bytes·β plus its reduction, with no sharing and no waiting on peers: a time its
/// pricing cannot go below, in O(lg p).
pub(super) fn doubling_own_messages(net: &Positions, p: usize, bytes: f64) -> f64 {
    let fold = Fold::new(p);
    let me = fold.real(0);
    let cost = |x: usize, y: usize, reduce: bool| {
        let l = net.link(x, y);
        let arrive = l.alpha + bytes * l.beta;
        if reduce {
            reduced_at(&l, bytes, (l.alpha, arrive), 0.0)
        } else {
            arrive
        }
    };
    // The rank before it hands its input over, and gets the result back.
    let mut t = if fold.rem > 0 {
        cost(0, me, true) + cost(me, 0, false)
    } else {
        0.0
    };
    let mut mask = 1;
    while mask < fold.pof2 {
        t += cost(me, fold.real(mask), true);
        mask <<= 1;
    }
    t
}
