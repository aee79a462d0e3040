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
    capped: Capped,
}

/// When each message sharing a link of `capacity` bytes per second ends, written into `ends`
/// as (operation, end) pairs (cleared first): the link is divided max-min fairly among the
/// messages moving through it (water-filling under their caps), and gives `efficiency` of its
/// capacity while two or more share it. O(n log n) for n messages when no cap binds unequally,
/// O((n + m) log n) otherwise, m being how often the fair share crosses a message's cap.
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
    if let [a, b] = flows {
        two_sharing(a, b, capacity, efficiency, ends);
        return;
    }
    if equal_sharing(flows, capacity, efficiency, &mut scratch.heap, ends) {
        return;
    }
    ends.clear();
    capped_sharing(flows, capacity, efficiency, &mut scratch.capped, ends);
}

/// [`processor_sharing`] of two messages, `a` starting no later than `b`, in closed form (the
/// case the lock-step engine meets most: a rank's two children on one port). `a` moves
/// alone until `b` starts; then each gets its max-min share of the link until one ends, and
/// the other moves alone again.
fn two_sharing(
    a: &Shared,
    b: &Shared,
    capacity: f64,
    efficiency: f64,
    ends: &mut Vec<(usize, f64)>,
) {
    let alone = |f: &Shared| f.cap.min(capacity);
    let a_alone = a.start + a.bytes / alone(a);
    if a_alone <= b.start {
        ends.push((a.op, a_alone));
        ends.push((b.op, b.start + b.bytes / alone(b)));
        return;
    }
    let a_left = a.bytes - alone(a) * (b.start - a.start);
    // Water-filling of two: an equal split unless a cap binds below it.
    let share = capacity * efficiency;
    let (rate_a, rate_b) = if a.cap.min(b.cap) >= share / 2.0 {
        (share / 2.0, share / 2.0)
    } else if a.cap <= b.cap {
        (a.cap, b.cap.min(share - a.cap))
    } else {
        (a.cap.min(share - b.cap), b.cap)
    };
    let (a_in, b_in) = (a_left / rate_a, b.bytes / rate_b);
    if a_in <= b_in {
        ends.push((a.op, b.start + a_in));
        let b_left = b.bytes - rate_b * a_in;
        ends.push((b.op, b.start + a_in + b_left / alone(b)));
    } else {
        let a_left = a_left - rate_a * b_in;
        ends.push((a.op, b.start + b_in + a_left / alone(a)));
        ends.push((b.op, b.start + b_in));
    }
}

/// Buffers of [`capped_sharing`].
#[derive(Default)]
struct Capped {
    /// Message indices by cap, smallest first, and each message's place in that order.
    by_cap: Vec<usize>,
    place: Vec<usize>,
    /// Fenwick trees over places (1-based): how many messages move, and their caps' sum.
    count: Vec<u32>,
    caps: Vec<f64>,
    state: Vec<Progress>,
    /// Messages held to their caps, by real end time, and the others, by virtual end time.
    /// An entry names the message's generation; one outdated by a move is skipped.
    held: BinaryHeap<Earliest<(usize, u32)>>,
    free: BinaryHeap<Earliest<(usize, u32)>>,
}

/// Where one message stands in [`capped_sharing`].
#[derive(Clone, Copy, Default)]
struct Progress {
    moving: bool,
    /// Moving at its own cap since real time `since`, or at the common level since virtual
    /// time `since`, with `left` bytes then.
    held: bool,
    since: f64,
    left: f64,
    generation: u32,
}

/// [`processor_sharing`] when unequal caps bind. At every moment the link's share is a level
/// L: each message gets min(cap, L), and L divides what the capped ones leave (max-min
/// fairness, as water-filling computes it). L is found by descending Fenwick trees of the
/// moving messages' caps in cap order (O(log n)). Messages below L move at their own caps and
/// end at fixed real times; the others move alike at L and end by virtual time, the bytes
/// each has been given since the first start. A message changes sides only when L crosses
/// its cap.
fn capped_sharing(
    flows: &[Shared],
    capacity: f64,
    efficiency: f64,
    s: &mut Capped,
    ends: &mut Vec<(usize, f64)>,
) {
    s.reset(flows);
    let n = flows.len();
    // Places below `boundary` (cap order) are held to their caps.
    let (mut now, mut virt, mut moving, mut next, mut boundary) = (flows[0].start, 0.0, 0, 0, 0);
    while next < n || moving > 0 {
        let arrived = next;
        while next < n && flows[next].start <= now {
            s.update(next, true, flows[next].cap);
            next += 1;
        }
        moving += next - arrived;
        if moving == 0 {
            now = flows[next].start;
            continue;
        }
        let share = if moving > 1 {
            capacity * efficiency
        } else {
            capacity
        };
        let (place, held, held_caps) = s.held_prefix(flows, share, moving);
        let level = if held < moving {
            (share - held_caps) / (moving - held) as f64
        } else {
            f64::INFINITY
        };
        // Messages whose cap the level crossed change sides; the arrivals take theirs.
        let (lo, hi) = (place.min(boundary), place.max(boundary));
        boundary = place;
        for at in lo..hi {
            let f = s.by_cap[at];
            if f < arrived && s.state[f].moving {
                s.settle(flows, f, at < boundary, now, virt);
            }
        }
        for f in arrived..next {
            s.settle(flows, f, s.place[f] < boundary, now, virt);
        }
        let free_end = s.peek(false);
        let free_due = free_end.map_or(f64::INFINITY, |v| now + (v - virt).max(0.0) / level);
        let held_due = s.peek(true).unwrap_or(f64::INFINITY);
        let arrival = flows.get(next).map_or(f64::INFINITY, |f| f.start);
        let at = free_due.min(held_due).min(arrival).max(now);
        if !at.is_finite() {
            // Nothing moves (a link of no capacity): what is left never ends.
            let stuck = flows.iter().zip(&s.state).filter(|(_, p)| p.moving);
            ends.extend(stuck.map(|(f, _)| (f.op, f64::INFINITY)));
            return;
        }
        if level.is_finite() {
            virt += (at - now) * level;
        }
        if let Some(v) = free_end.filter(|_| at == free_due) {
            // Exactly, even where the step is below the resolution of `now`.
            virt = virt.max(v);
        }
        now = at;
        while let Some(due) = s.peek(true) {
            if due > now {
                break;
            }
            let f = s.pop(true);
            s.update(f, false, flows[f].cap);
            ends.push((flows[f].op, now));
            moving -= 1;
        }
        while let Some(due) = s.peek(false) {
            let f = s.free.peek().map_or(0, |e| e.key.0);
            if due > virt + flows[f].bytes * 1e-12 {
                break;
            }
            s.pop(false);
            s.update(f, false, flows[f].cap);
            ends.push((flows[f].op, now));
            moving -= 1;
        }
    }
}

impl Capped {
    /// Orders `flows` by cap; nothing moves yet.
    fn reset(&mut self, flows: &[Shared]) {
        let n = flows.len();
        self.by_cap.clear();
        self.by_cap.extend(0..n);
        self.by_cap
            .sort_by(|&a, &b| flows[a].cap.total_cmp(&flows[b].cap).then(a.cmp(&b)));
        self.place.clear();
        self.place.resize(n, 0);
        for (at, &f) in self.by_cap.iter().enumerate() {
            self.place[f] = at;
        }
        self.count.clear();
        self.count.resize(n + 1, 0);
        self.caps.clear();
        self.caps.resize(n + 1, 0.0);
        self.state.clear();
        self.state.resize(n, Progress::default());
        self.held.clear();
        self.free.clear();
    }

    /// Message `f` (of cap `cap`) starts or stops moving.
    fn update(&mut self, f: usize, moving: bool, cap: f64) {
        self.state[f].moving = moving;
        let (count, cap) = if moving { (1, cap) } else { (u32::MAX, -cap) };
        let mut i = self.place[f] + 1;
        while i < self.count.len() {
            self.count[i] = self.count[i].wrapping_add(count);
            self.caps[i] += cap;
            i += i & i.wrapping_neg();
        }
    }

    /// How many places (cap order) are held to their caps when `moving` messages share
    /// `share`, with how many moving messages and the sum of their caps. A moving message at
    /// place j is held iff (caps below it) + cap_j × (messages from it up) ≤ share; that sum
    /// never falls as j grows (caps are in order), so the held places are a prefix.
    fn held_prefix(&self, flows: &[Shared], share: f64, moving: usize) -> (usize, usize, f64) {
        let n = self.by_cap.len();
        let (mut at, mut count, mut sum) = (0, 0, 0.0);
        let mut step = if n == 0 { 0 } else { 1 << n.ilog2() };
        while step > 0 {
            let to = at + step;
            if to <= n {
                let (c, s) = (count + self.count[to] as usize, sum + self.caps[to]);
                let cap = flows[self.by_cap[to - 1]].cap;
                if s + cap * moving.saturating_sub(c) as f64 <= share {
                    (at, count, sum) = (to, c, s);
                }
            }
            step >>= 1;
        }
        (at, count, sum)
    }

    /// Puts moving message `f` on its side (`held` to its cap, or at the level) at real time
    /// `now` and virtual time `virt`, with the bytes it has left.
    fn settle(&mut self, flows: &[Shared], f: usize, held: bool, now: f64, virt: f64) {
        let p = self.state[f];
        let left = if p.generation == 0 {
            flows[f].bytes
        } else if p.held {
            p.left - flows[f].cap * (now - p.since)
        } else {
            p.left - (virt - p.since)
        };
        let generation = p.generation + 1;
        self.state[f] = Progress {
            moving: true,
            held,
            since: if held { now } else { virt },
            left,
            generation,
        };
        let key = (f, generation);
        if held {
            self.held.push(Earliest {
                at: now + left.max(0.0) / flows[f].cap,
                key,
            });
        } else {
            self.free.push(Earliest {
                at: virt + left.max(0.0),
                key,
            });
        }
    }

    /// The earliest end (real time if `held`, else virtual) still current.
    fn peek(&mut self, held: bool) -> Option<f64> {
        let heap = if held { &mut self.held } else { &mut self.free };
        while let Some(e) = heap.peek() {
            let p = self.state[e.key.0];
            if p.moving && p.held == held && p.generation == e.key.1 {
                return Some(e.at);
            }
            heap.pop();
        }
        None
    }

    /// Takes the message [`Capped::peek`] saw.
    fn pop(&mut self, held: bool) -> usize {
        let heap = if held { &mut self.held } else { &mut self.free };
        heap.pop().map_or(0, |e| e.key.0)
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Max-min sharing by water-filling from event to event, O(n²): the rule
    /// [`capped_sharing`] must reproduce. Messages alike (same start, bytes and cap) are one
    /// class weighted by their number. `flows` sorted by start.
    fn water_filling(flows: &[Shared], capacity: f64, efficiency: f64) -> Vec<(usize, f64)> {
        let mut ends = Vec::new();
        let mut classes: Vec<(usize, usize, f64, f64, f64)> = Vec::new();
        let (mut moving, mut rates, mut order): (Vec<(usize, f64)>, Vec<f64>, Vec<usize>) =
            (Vec::new(), Vec::new(), Vec::new());
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
        ends
    }

    fn ends_of(flows: &mut [Shared], capacity: f64, efficiency: f64) -> Vec<f64> {
        let mut ends = Vec::new();
        processor_sharing(
            flows,
            capacity,
            efficiency,
            &mut Scratch::default(),
            &mut ends,
        );
        let mut by_op = vec![f64::NAN; flows.len()];
        for (op, end) in ends {
            by_op[op] = end;
        }
        by_op
    }

    proptest! {
        /// Unequal caps, starts and sizes, repeated values included: every message ends when
        /// water-filling says, within 1e-9 of its time on the link.
        #[test]
        fn capped_sharing_ends_as_water_filling_does(
            msgs in prop::collection::vec((0u8..6, 1u8..5, 1u8..8), 1..60),
            capacity in 1.0f64..40.0,
            efficiency in 0.5f64..=1.0,
        ) {
            let mut flows: Vec<Shared> = msgs
                .iter()
                .enumerate()
                .map(|(op, &(start, bytes, cap))| Shared {
                    op,
                    start: start as f64 * 0.7,
                    bytes: bytes as f64 * 3.0,
                    cap: cap as f64 * 1.5,
                })
                .collect();
            let got = ends_of(&mut flows, capacity, efficiency);
            let mut want = vec![f64::NAN; flows.len()];
            for (op, end) in water_filling(&flows, capacity, efficiency) {
                want[op] = end;
            }
            for (i, f) in flows.iter().enumerate() {
                let (g, w) = (got[f.op], want[f.op]);
                let span = w - f.start;
                prop_assert!((g - w).abs() <= 1e-9 * span.max(1e-9), "message {i}: {g} against {w}");
            }
        }
    }

    proptest! {
        /// Two messages, the closed form: the ends water-filling gives, whichever starts
        /// first, ends first or is held to its cap.
        #[test]
        fn two_messages_end_as_water_filling_says(
            starts in (0u8..8, 0u8..8),
            bytes in (0u8..9, 1u8..9),
            caps in (1u8..12, 1u8..12),
            capacity in 1.0f64..20.0,
            efficiency in 0.5f64..=1.0,
        ) {
            let mut flows = vec![
                Shared {
                    op: 0,
                    start: starts.0 as f64 * 0.5,
                    bytes: bytes.0 as f64,
                    cap: caps.0 as f64,
                },
                Shared {
                    op: 1,
                    start: starts.1 as f64 * 0.5,
                    bytes: bytes.1 as f64 * 2.0,
                    cap: caps.1 as f64,
                },
            ];
            let got = ends_of(&mut flows, capacity, efficiency);
            for (op, w) in water_filling(&flows, capacity, efficiency) {
                let start = flows.iter().find(|f| f.op == op).map_or(0.0, |f| f.start);
                prop_assert!(
                    (got[op] - w).abs() <= 1e-9 * (w - start).max(1e-9),
                    "message {op}: {} against {w}", got[op]
                );
            }
        }
    }

    /// The case the lock-step engine met at 4,096 ranks (thousands of distinct caps on one
    /// uplink): the same ends, and a message alone on the link runs at its own cap.
    #[test]
    fn many_distinct_caps_match_water_filling() {
        let mut flows: Vec<Shared> = (0..600)
            .map(|i| Shared {
                op: i,
                start: (i % 37) as f64 * 1e-6,
                bytes: 1e6 + (i % 5) as f64 * 1e5,
                cap: 1e9 + i as f64 * 7e6,
            })
            .collect();
        flows.sort_by(|a, b| a.start.total_cmp(&b.start));
        let got = ends_of(&mut flows, 5e10, 0.9);
        for (op, w) in water_filling(&flows, 5e10, 0.9) {
            let start = flows.iter().find(|f| f.op == op).unwrap().start;
            assert!(
                (got[op] - w).abs() <= 1e-9 * (w - start),
                "{op}: {} against {w}",
                got[op]
            );
        }
        let mut one = [Shared {
            op: 0,
            start: 1.0,
            bytes: 10.0,
            cap: 2.0,
        }];
        assert_eq!(ends_of(&mut one, 100.0, 0.5), vec![6.0]);
    }
}
