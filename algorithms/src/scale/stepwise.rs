//! Pricing on the vector of times without building schedules: phases whose every step has
//! the same shape (each position exchanges with one other), O(p) a step, for the sizes where
//! building and folding them would cost more than a rank can spend on its first call.

use super::Pricer;
use crate::builders::{Fold, block};
use crate::cost::{Network, Uplink};

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
            total_time += step + bytes * top.gamma;
        }
        let start = self.finish();
        self.free.iter_mut().for_each(|t| *t = start + total_time);
    }

    /// Pairwise exchange step by step on the vector of times, O(p) a step.
    pub(super) fn pairwise_stepwise(&mut self, total: usize) {
        let p = self.p();
        let eb = self.q.elem_bytes as f64;
        let mut ups = Vec::new();
        let mut next = vec![0.0; p];
        let mut sharing: std::collections::HashMap<u64, u32> = Default::default();
        for k in 1..p {
            sharing.clear();
            for x in (0..p).filter(|x| block(total, p, (x + k) % p).1 > 0) {
                self.net.uplinks(x, (x + k) % p, &mut ups);
                for u in &ups {
                    *sharing.entry(u.id).or_insert(0) += 1;
                }
            }
            next.copy_from_slice(&self.free);
            for x in 0..p {
                let y = (x + k) % p;
                let bytes = block(total, p, y).1 as f64 * eb;
                if bytes == 0.0 {
                    continue;
                }
                let link = self.net.link(x, y);
                self.net.uplinks(x, y, &mut ups);
                let beta = ups.iter().fold(link.beta, |b, u| {
                    b.max(u.shared_beta(sharing.get(&u.id).copied().unwrap_or(1)))
                });
                let arrive = self.free[x].max(self.free[y]) + link.alpha + bytes * beta;
                next[x] = next[x].max(arrive);
                next[y] = next[y].max(arrive + bytes * link.gamma);
            }
            std::mem::swap(&mut self.free, &mut next);
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
        let h = self.q.hierarchy;
        let mut ups = Vec::new();
        // Messages on each uplink in the current step, by dense index.
        let mut sharing = vec![0u32; h.uplink_count()];
        // One step's messages, both ways: (from, to).
        let mut pairs: Vec<(usize, usize)> = Vec::with_capacity(p);
        let mut next = Vec::with_capacity(p);
        // The step's uplinks, message after message, with their dense index; message i's
        // end at `ends[i]`.
        let mut crossed: Vec<(usize, Uplink)> = Vec::new();
        let mut ends: Vec<usize> = Vec::with_capacity(p);
        let mut step = |free: &mut Vec<f64>, pairs: &[(usize, usize)], reduce: bool| {
            sharing.fill(0);
            crossed.clear();
            ends.clear();
            for &(x, y) in pairs {
                self.net.uplinks(x, y, &mut ups);
                for u in &ups {
                    let i = h.uplink_index(u.id);
                    sharing[i] += 1;
                    crossed.push((i, *u));
                }
                ends.push(crossed.len());
            }
            next.clone_from(free);
            for (m, &(x, y)) in pairs.iter().enumerate() {
                let link = self.net.link(x, y);
                let start = if m == 0 { 0 } else { ends[m - 1] };
                let beta = crossed[start..ends[m]]
                    .iter()
                    .fold(link.beta, |b, (i, u)| b.max(u.shared_beta(sharing[*i])));
                let arrive = free[x].max(free[y]) + link.alpha + bytes * beta;
                let gamma = if reduce { bytes * link.gamma } else { 0.0 };
                next[x] = next[x].max(arrive);
                next[y] = next[y].max(arrive + gamma);
            }
            std::mem::swap(free, &mut next);
        };
        let mut free = std::mem::take(&mut self.free);
        // Ranks that sit out hand their input to their odd neighbour, which reduces it.
        pairs.extend((0..fold.rem).map(|i| (2 * i, 2 * i + 1)));
        step(&mut free, &pairs, true);
        let mut mask = 1;
        while mask < fold.pof2 {
            pairs.clear();
            for u in 0..fold.pof2 {
                pairs.push((fold.real(u), fold.real(u ^ mask)));
            }
            step(&mut free, &pairs, true);
            mask <<= 1;
        }
        pairs.clear();
        pairs.extend((0..fold.rem).map(|i| (2 * i + 1, 2 * i)));
        step(&mut free, &pairs, false);
        self.free = free;
    }
}
