//! Stragglers: ranks that are alive but persistently slow, found from what the data path
//! already sees and no extra message.
//!
//! **What a rank measures.** Each idle stretch of a collective longer than a threshold
//! (`STRATA_STRAGGLER_MS`, 5 ms) is a *stall*, charged to the peers the rank was blocked on
//! ([`crate::executor::StallLog`]). A rank that starts a call late stalls its peers at their
//! first step; a rank throttled to half speed (a CPU quota, a SIGSTOP duty cycle, a slow
//! link) stalls them in bursts anywhere in the call.
//!
//! **Telling the cause from a link in the chain.** In a ring, the rank after a slow one
//! stalls on it, and the rank after that stalls on its neighbour, which is only passing the
//! delay along. So every header a rank sends carries its own *stall share* (the part of its
//! recent collective time it spent stalled, [`crate::wire::Header`]'s spare bytes): a rank
//! that others stall on while it hardly stalls itself is the slow one; a neighbour that
//! stalls as much as this rank does is not.
//!
//! **The rule.** Over a window of the last `WINDOW_S` seconds and at least the last
//! `WINDOW_CALLS` calls (exponentially weighted, so O(1) per call and per peer stalled on), a
//! peer is named when this rank stalled on it in at least half of the calls, or for at least a
//! quarter of its collective time in at least three calls, and the peer's own stall share is
//! at most a third of this rank's. It is named again as recovered when both fall under a fifth of those marks, or its
//! own share rises to half of this rank's. Half the calls keeps a checkpoint or a garbage
//! collection (a few calls) from naming anyone; a quarter of the time catches a bursty
//! slowdown that hits few calls but costs many milliseconds; 5 ms is well above this
//! machine's scheduling noise and well below a training step.

use std::collections::HashMap;
use std::time::Duration;

/// The monotonic clock at its coarse resolution (a scheduler tick, a few milliseconds): read
/// twice per call, it costs a few nanoseconds where a precise read costs tens. A call's
/// duration so measured is a whole number of ticks, right on average over many calls, which
/// is all a window of them needs.
pub fn coarse_now() -> Duration {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer; the clock exists on every Linux since 2.6.32.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut t) };
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// `ticks` of a clock at `seconds_per_tick` as time (zero where the rate is unknown).
pub fn ticks_to_time(ticks: u64, seconds_per_tick: f64) -> Duration {
    Duration::try_from_secs_f64(ticks as f64 * seconds_per_tick).unwrap_or_default()
}

/// The window's length in time, seconds.
const WINDOW_S: f64 = 4.0;
/// The window's least length in calls.
const WINDOW_CALLS: f64 = 64.0;
/// Calls seen before anyone may be named.
const MIN_CALLS: u64 = 32;
/// Stalled calls (weighted) a share of the time needs behind it.
const MIN_BURSTS: f64 = 3.0;
/// Stalls kept per peer for the median.
const RECENT: usize = 15;

/// A peer found persistently slow.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Straggler {
    /// The slow rank.
    pub rank: usize,
    /// Calls in this rank's window (weighted, rounded).
    pub calls: usize,
    /// Share of the window's calls in which this rank stalled on it, 0 to 1.
    pub late_share: f64,
    /// Share of this rank's collective time spent stalled on it, 0 to 1, counting no stall
    /// for more than the median one.
    pub stall_share: f64,
    /// Median of its last stalls, milliseconds.
    pub median_late_ms: f64,
    /// Its own stall share as its headers said, 0 to 1 (a slow rank hardly stalls).
    pub own_stall_share: f64,
}

/// A change worth a log line.
#[derive(Debug, PartialEq)]
pub enum Change {
    /// The peer became a straggler.
    Late(Straggler),
    /// The peer is on time again.
    Recovered(Straggler),
}

/// What this rank saw of one peer, weighted as of `stamp` (see [`Stragglers::age`]).
#[derive(Default)]
struct Peer {
    stamp: f64,
    stalled_s: f64,
    stalled_calls: f64,
    recent_ms: [f32; RECENT],
    recent_n: usize,
    share: Option<f64>,
    reported: bool,
}

/// One communicator's view of the peers it stalls on.
#[derive(Default)]
pub struct Stragglers {
    /// Sum of -ln(decay) over all calls: a weight recorded at age `a` is worth
    /// `exp(a - age)` now, so nothing is decayed until it is read.
    age: f64,
    last: Option<Duration>,
    seen: u64,
    calls: f64,
    time_s: f64,
    stalled_s: f64,
    peers: HashMap<usize, Peer>,
    /// The peers named now.
    named: Vec<usize>,
    /// Quiet calls (no stall, no one named) not yet folded into the window: how many, and
    /// their time. Folding them in one at a time cost more than a small call's messages.
    pending_calls: u32,
    pending_time: Duration,
    /// The time of quiet calls set aside by [`Stragglers::set_aside`], in ticks of the
    /// caller's clock, not yet turned into `pending_time` ([`Stragglers::settle`]).
    pending_ticks: u64,
}

/// Quiet calls kept aside before they are folded into the window together: the window's
/// figures (and the stall share headers carry) lag by at most this many calls, against its
/// least length of [`WINDOW_CALLS`].
const PENDING_CALLS: u32 = 16;

impl Stragglers {
    /// This rank's stall share over the window, per mille: what its headers carry.
    pub fn own_share_per_mille(&self) -> u16 {
        (1000.0 * self.own_share()).round().clamp(0.0, 1000.0) as u16
    }

    fn own_share(&self) -> f64 {
        if self.time_s > 0.0 {
            (self.stalled_s / self.time_s).min(1.0)
        } else {
            0.0
        }
    }

    /// Whether a call that stalled `stalled` in `stalls` is set aside rather than folded in:
    /// it did not stall, nobody is named (so nothing for anyone can change), and fewer than
    /// [`PENDING_CALLS`] are waiting.
    fn may_set_aside(&self, stalled: Duration, stalls: &[(usize, Duration)]) -> bool {
        stalls.is_empty()
            && stalled.is_zero()
            && self.named.is_empty()
            && self.pending_calls < PENDING_CALLS
    }

    /// A call that ran `ticks` of the caller's clock and stalled `stalled` in `stalls`, set
    /// aside without a clock read where [`Stragglers::observe`] would set it aside. Returns
    /// false when the call must go through `observe` instead (after
    /// [`Stragglers::settle`]).
    pub fn set_aside(
        &mut self,
        ticks: u64,
        stalled: Duration,
        stalls: &[(usize, Duration)],
    ) -> bool {
        if !self.may_set_aside(stalled, stalls) {
            return false;
        }
        self.seen += 1;
        self.pending_calls += 1;
        self.pending_ticks = self.pending_ticks.saturating_add(ticks);
        true
    }

    /// Turns the ticks of the calls set aside into time, at `seconds_per_tick`.
    pub fn settle(&mut self, seconds_per_tick: f64) {
        let ticks = std::mem::take(&mut self.pending_ticks);
        self.pending_time += ticks_to_time(ticks, seconds_per_tick);
    }

    /// One collective call that ended at `now` ([`coarse_now`]) and took `took`, of which
    /// `stalled` in stalls: the stalls per peer (one stall may be charged to several), and
    /// the stall shares (per mille) the peers' headers carried. Returns the peers whose state
    /// changed.
    pub fn observe(
        &mut self,
        (now, took, stalled): (Duration, Duration, Duration),
        stalls: &[(usize, Duration)],
        shares: &[(usize, u16)],
    ) -> Vec<Change> {
        self.seen += 1;
        // A quiet call is set aside: nothing can change for anyone until a stall or a name.
        if self.may_set_aside(stalled, stalls) {
            self.pending_calls += 1;
            self.pending_time += took;
            return Vec::new();
        }
        // This call and those set aside since the last fold, as one batch arriving now.
        let batch = f64::from(self.pending_calls + 1);
        let took = took + std::mem::take(&mut self.pending_time);
        self.pending_calls = 0;
        // The window is the longer of WINDOW_S and WINDOW_CALLS calls.
        let since = self
            .last
            .map_or(0.0, |t| now.saturating_sub(t).as_secs_f64());
        self.last = Some(now);
        let step = (since / WINDOW_S).min(batch / WINDOW_CALLS);
        let keep = if batch > 1.0 {
            (-step).exp()
        } else {
            // exp(-step) to within step³/6 (step ≤ 1/64), without the call to exp.
            1.0 - step + step * step / 2.0
        };
        self.age += step;
        self.calls = self.calls * keep + batch;
        self.time_s = self.time_s * keep + took.as_secs_f64();
        self.stalled_s = self.stalled_s * keep + stalled.as_secs_f64().min(took.as_secs_f64());
        let age = self.age;
        // Shares are kept only for the peers that matter (stalled on, or named): no map
        // lookup per header in a call without stalls.
        let share_of = |peer: usize| {
            shares
                .iter()
                .find(|s| s.0 == peer)
                .map(|s| f64::from(s.1) / 1000.0)
        };
        for &peer in &self.named {
            if let (Some(p), Some(x)) = (self.peers.get_mut(&peer), share_of(peer)) {
                p.share = Some(x);
            }
        }
        for &(peer, d) in stalls {
            let p = self.peers.entry(peer).or_default();
            if let Some(x) = share_of(peer) {
                p.share = Some(x);
            }
            p.bring_to(age);
            p.stalled_s += d.as_secs_f64();
            p.stalled_calls += 1.0;
            p.recent_ms[p.recent_n % RECENT] = d.as_secs_f32() * 1e3;
            p.recent_n += 1;
        }
        let mut changes = Vec::new();
        // Only the peers stalled on now, and those named: O(1) per call, not per peer known.
        let mut candidates: Vec<usize> = stalls.iter().map(|s| s.0).collect();
        for &r in &self.named {
            if !candidates.contains(&r) {
                candidates.push(r);
            }
        }
        for peer in candidates {
            let s = self.summary(peer);
            let mine = self.own_share();
            let Some(p) = self.peers.get_mut(&peer) else {
                continue;
            };
            let its = p.share.unwrap_or(1.0);
            // A share of the time needs a few stalls behind it: one long pause (a collection,
            // a checkpoint) is not a slow rank.
            let repeated = s.late_share * self.calls >= MIN_BURSTS;
            let slow = s.late_share >= 0.5 || (s.stall_share >= 0.25 && repeated);
            if !p.reported && self.seen >= MIN_CALLS && slow && its <= mine / 3.0 {
                p.reported = true;
                self.named.push(peer);
                changes.push(Change::Late(s));
            } else if p.reported
                && ((s.late_share < 0.1 && s.stall_share < 0.05) || its > mine / 2.0)
            {
                p.reported = false;
                self.named.retain(|&r| r != peer);
                changes.push(Change::Recovered(s));
            }
        }
        changes
    }

    fn summary(&self, rank: usize) -> Straggler {
        let p = &self.peers[&rank];
        let decay = (p.stamp - self.age).exp();
        let n = p.recent_n.min(RECENT);
        let mut recent = p.recent_ms[..n].to_vec();
        recent.sort_by(f32::total_cmp);
        let ratio = |a: f64, b: f64| if b > 0.0 { (a / b).min(1.0) } else { 0.0 };
        let median_ms = recent.get(n / 2).copied().unwrap_or(0.0) as f64;
        // The time share, but no more than its stalls at their median length would take: one
        // long pause among short stalls does not count as many long ones.
        let typical_s = p.stalled_calls * decay * median_ms / 1e3;
        Straggler {
            rank,
            calls: self.calls.round() as usize,
            late_share: ratio(p.stalled_calls * decay, self.calls),
            stall_share: ratio((p.stalled_s * decay).min(typical_s), self.time_s),
            median_late_ms: median_ms,
            own_stall_share: p.share.unwrap_or(0.0),
        }
    }

    /// Whether anyone is named now.
    pub fn any_named(&self) -> bool {
        !self.named.is_empty()
    }

    /// The peers named now, by rank.
    pub fn current(&self) -> Vec<Straggler> {
        let mut v: Vec<Straggler> = self.named.iter().map(|&r| self.summary(r)).collect();
        v.sort_by_key(|s| s.rank);
        v
    }
}

impl Peer {
    /// Decays this peer's sums to `age`.
    fn bring_to(&mut self, age: f64) {
        let decay = (self.stamp - age).exp();
        self.stalled_s *= decay;
        self.stalled_calls *= decay;
        self.stamp = age;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(x: u64) -> Duration {
        Duration::from_millis(x)
    }

    /// Calls of `took` ms back to back from `t`, each with `stalls` and `shares`.
    struct Run {
        s: Stragglers,
        t: Duration,
    }

    impl Run {
        fn new() -> Self {
            Self {
                s: Stragglers::default(),
                t: Duration::ZERO,
            }
        }

        fn call(
            &mut self,
            took: u64,
            stalls: &[(usize, u64)],
            shares: &[(usize, u16)],
        ) -> Vec<Change> {
            self.t += ms(took);
            let stalls: Vec<(usize, Duration)> = stalls.iter().map(|&(p, d)| (p, ms(d))).collect();
            let stalled = stalls.iter().map(|s| s.1).max().unwrap_or_default();
            self.s.observe((self.t, ms(took), stalled), &stalls, shares)
        }
    }

    /// Quiet calls set aside by their clock ticks ([`Stragglers::set_aside`], as the runtime
    /// does) count as the same calls observed with their time: the same calls seen, the same
    /// time and stall shares, the same peer named and cleared.
    #[test]
    fn calls_set_aside_by_ticks_count_as_the_same_calls_observed() {
        let mut by_time = Run::new();
        let mut by_ticks = Stragglers::default();
        let mut t = Duration::ZERO;
        let mut named = (Vec::new(), Vec::new());
        for i in 0..3000 {
            // Quiet, then a stall of 3 ms on rank 2 in three calls of 4 ms out of four, then
            // quiet again for ten seconds: rank 2 is named, then recovers.
            let stalls: &[(usize, u64)] = if (150..450).contains(&i) && i % 4 != 0 {
                &[(2, 3)]
            } else {
                &[]
            };
            let shares: &[(usize, u16)] = &[(2, 10)];
            named.0.extend(by_time.call(4, stalls, shares));
            t += ms(4);
            let d: Vec<(usize, Duration)> = stalls.iter().map(|&(p, d)| (p, ms(d))).collect();
            let stalled = d.iter().map(|s| s.1).max().unwrap_or_default();
            // 4 ms as 4,000 ticks of a microsecond.
            if !by_ticks.set_aside(4000, stalled, &d) {
                by_ticks.settle(1e-6);
                named
                    .1
                    .extend(by_ticks.observe((t, ms(4), stalled), &d, shares));
            }
        }
        assert!(
            matches!(
                named.0.as_slice(),
                [Change::Late(a), Change::Recovered(b)] if a.rank == 2 && b.rank == 2
            ),
            "the pattern names rank 2, then clears it: {:?}",
            named.0
        );
        assert_eq!(named.0, named.1);
        assert_eq!(by_ticks.seen, by_time.s.seen);
        assert!(by_ticks.pending_calls <= PENDING_CALLS);
        by_ticks.settle(1e-6);
        assert!(
            (by_ticks.time_s - by_time.s.time_s).abs() < 1e-9,
            "{} against {}",
            by_ticks.time_s,
            by_time.s.time_s
        );
        assert_eq!(
            by_ticks.own_share_per_mille(),
            by_time.s.own_share_per_mille()
        );
    }

    /// Quiet calls are set aside and folded in later: every call counts, the window's
    /// figures lag by at most [`PENDING_CALLS`] calls, and the share comes out as it would
    /// one call at a time.
    #[test]
    fn quiet_calls_are_folded_in_batches_and_still_count() {
        let mut r = Run::new();
        for _ in 0..100 {
            assert!(r.call(1, &[], &[]).is_empty());
        }
        assert_eq!(r.s.seen, 100);
        assert!(r.s.pending_calls <= PENDING_CALLS);
        assert!(r.s.time_s > 0.0 && r.s.own_share() == 0.0);
        // Then a stall of 5 ms in every other call of 10 ms: a quarter of the time.
        for _ in 0..500 {
            r.call(10, &[], &[]);
            r.call(10, &[(2, 5)], &[(2, 900)]);
        }
        assert_eq!(r.s.seen, 1100);
        assert!((r.s.own_share() - 0.25).abs() < 0.02, "{}", r.s.own_share());
        // Peer 2 says it stalls 90%: a link in the chain, not named.
        assert!(r.s.current().is_empty());
    }

    #[test]
    fn a_peer_that_stalls_most_calls_and_hardly_stalls_itself_is_named_once_then_recovers() {
        let mut r = Run::new();
        let mut changes = Vec::new();
        // Peer 3 holds this rank up 20 ms at 3 calls in 4 and says it stalls 1%; peer 1
        // (the rank after this one) never.
        for call in 0..200 {
            let stalls: &[(usize, u64)] = if call % 4 == 0 { &[] } else { &[(3, 20)] };
            changes.extend(r.call(25, stalls, &[(3, 10), (1, 600)]));
        }
        assert_eq!(changes.len(), 1, "{changes:?}");
        let Change::Late(first) = &changes[0] else {
            panic!("{changes:?}")
        };
        assert_eq!(first.rank, 3);
        assert_eq!(r.s.seen, 200);
        let now = &r.s.current()[0];
        assert!((now.late_share - 0.75).abs() < 0.1, "{now:?}");
        assert_eq!(now.median_late_ms, 20.0);
        assert!((now.own_stall_share - 0.01).abs() < 1e-9);
        assert!(
            r.s.own_share_per_mille() > 400,
            "{}",
            r.s.own_share_per_mille()
        );
        // On time again: recovered once, no longer current.
        changes.clear();
        for _ in 0..400 {
            changes.extend(r.call(25, &[], &[(3, 10)]));
        }
        assert!(
            matches!(changes.as_slice(), [Change::Recovered(x)] if x.rank == 3),
            "{changes:?}"
        );
        assert!(r.s.current().is_empty());
    }

    #[test]
    fn a_neighbour_that_stalls_as_much_as_this_rank_is_a_link_in_the_chain_not_the_cause() {
        let mut r = Run::new();
        for _ in 0..500 {
            // Every call stalls 15 ms on rank 3, which says it stalls half its time too.
            assert!(r.call(20, &[(3, 15)], &[(3, 500)]).is_empty());
        }
        assert!(r.s.current().is_empty());
    }

    #[test]
    fn bursts_on_few_calls_that_cost_much_time_name_the_peer() {
        let mut r = Run::new();
        let mut named = None;
        // 2 ms calls; every 50th call stalls 100 ms on peer 5 (a 50% SIGSTOP duty cycle):
        // 2% of the calls, two thirds of the time.
        for call in 0..3000u64 {
            let stalls: &[(usize, u64)] = if call % 50 == 49 { &[(5, 100)] } else { &[] };
            let took = if stalls.is_empty() { 2 } else { 102 };
            if let Some(Change::Late(s)) = r.call(took, stalls, &[(5, 0)]).pop() {
                named.get_or_insert((call, s));
            }
        }
        let (call, s) = named.expect("never named");
        assert_eq!(s.rank, 5);
        assert!(s.late_share < 0.1 && s.stall_share > 0.25, "{s:?}");
        // Within a few seconds of its first burst (3.6 s of calls at most).
        assert!(call < 1800, "named at call {call}");
    }

    #[test]
    fn occasional_stalls_one_long_pause_and_a_clean_run_name_no_one() {
        let mut r = Run::new();
        for call in 0..2000u64 {
            // A 50 ms hiccup every 10 calls, a checkpoint's five stalled calls in a row, and
            // one pause of a second.
            let stalls: &[(usize, u64)] = match call {
                700 => &[(2, 1000)],
                500..505 => &[(2, 50)],
                _ if call % 10 == 0 => &[(2, 50)],
                _ => &[],
            };
            let took = 40 + stalls.first().map_or(0, |s| s.1);
            assert!(
                r.call(took, stalls, &[(2, 0), (5, 0)]).is_empty(),
                "call {call}"
            );
        }
        assert!(r.s.current().is_empty());
    }
}
