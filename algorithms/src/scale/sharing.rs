//! Processor sharing of one link (a port or an uplink) among the messages that move through
//! it, the rule the lock-step engine ([`super::lockstep`]) times shared ports and uplinks by.
//!
//! The engine asks this question for nearly every message it times, so the answer is written
//! into buffers the caller keeps ([`Scratch`]) rather than allocated per call.

use std::collections::BinaryHeap;

use crate::sim::Earliest;

/// A message on a shared link.
#[derive(Clone, Copy, Debug)]
pub(super) struct Shared {
    /// The caller's name for it (an operation's index), returned with its end.
    pub op: usize,
    pub start: f64,
    pub bytes: f64,
    /// The most bytes per second it can get elsewhere (its link, the far end's port).
    pub cap: f64,
}

/// Buffers [`processor_sharing`] reuses from call to call.
#[derive(Default)]
pub(super) struct Scratch {
    heap: BinaryHeap<Earliest<usize>>,
    /// (first index into flows, members, start, bytes, cap).
    classes: Vec<(usize, usize, f64, f64, f64)>,
    /// (class, bytes left per member) of the classes moving now.
    moving: Vec<(usize, f64)>,
    rates: Vec<f64>,
    order: Vec<usize>,
}

/// When each message sharing a link of `capacity` bytes per second ends, written into `ends`
/// as (operation, end) pairs (cleared first): the link is divided max-min fairly among the
/// messages moving through it (water-filling under their caps), and gives `efficiency` of its
/// capacity while two or more share it. Messages alike (same start, bytes and cap) move
/// alike, so they are one class weighted by their number: the cost grows with the number of
/// classes, not of messages.
pub(super) fn processor_sharing(
    flows: &mut [Shared],
    capacity: f64,
    efficiency: f64,
    scratch: &mut Scratch,
    ends: &mut Vec<(usize, f64)>,
) {
    ends.clear();
    if flows.is_empty() {
        return;
    }
    flows.sort_by(|a, b| {
        (a.start, a.bytes, a.cap)
            .partial_cmp(&(b.start, b.bytes, b.cap))
            .unwrap_or(std::cmp::Ordering::Equal)
    });
    if !capacity.is_finite() {
        ends.extend(flows.iter().map(|f| (f.op, f.start)));
        return;
    }
    if equal_sharing(flows, capacity, efficiency, &mut scratch.heap, ends) {
        return;
    }
    ends.clear();
    let Scratch {
        classes,
        moving,
        rates,
        order,
        ..
    } = scratch;
    classes.clear();
    for (i, f) in flows.iter().enumerate() {
        match classes.last_mut() {
            Some(c) if (c.2, c.3, c.4) == (f.start, f.bytes, f.cap) => c.1 += 1,
            _ => classes.push((i, 1, f.start, f.bytes, f.cap)),
        }
    }
    moving.clear();
    let (mut now, mut next) = (classes[0].2, 0);
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
            order.clear();
            order.extend(0..moving.len());
            order.sort_by(|&a, &b| classes[moving[a].0].4.total_cmp(&classes[moving[b].0].4));
            rates.resize(moving.len(), 0.0);
            let mut unfilled = members;
            for &m in order.iter() {
                let c = &classes[moving[m].0];
                let rate = c.4.min(left / unfilled as f64);
                rates[m] = rate;
                left -= rate * c.1 as f64;
                unfilled -= c.1;
            }
        }
        let finish_in = moving
            .iter()
            .zip(rates.iter())
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
}

/// [`processor_sharing`] when every moving message gets the same rate (no cap binds, or all
/// caps are equal), for `flows` sorted by start: in O(n log n) by virtual time, the bytes each
/// moving message has been given since the first start, so that a message ends when virtual
/// time passes its start's plus its bytes. False (with `ends` partly written) when unequal
/// caps would bind.
fn equal_sharing(
    flows: &[Shared],
    capacity: f64,
    efficiency: f64,
    heap: &mut BinaryHeap<Earliest<usize>>,
    ends: &mut Vec<(usize, f64)>,
) -> bool {
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
    heap.clear();
    let (mut now, mut virt, mut n, mut next) = (flows[0].start, 0.0, 0usize, 0);
    while next < flows.len() || n > 0 {
        while next < flows.len() && flows[next].start <= now {
            heap.push(Earliest {
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
                return false;
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
    true
}
