//! Stragglers: ranks that are alive but persistently late. Each call tells this rank how long
//! after its own start the first message of each peer it hears from in the call's first
//! communicating step arrived (those peers send that message as soon as they start, so the
//! delay is how much later they started, plus the wire). Over a sliding window of calls per
//! peer, a peer late by more than a threshold in at least half of the window is reported once,
//! and again when it recovers (late in under a fifth). Each call costs O(1) per peer heard
//! (a ring write and two counters) and adds no message.
//!
//! The rule's defaults: a window of 64 calls, reported once 32 have been seen, late meaning
//! more than `STRATA_STRAGGLER_MS` (5 ms). Five milliseconds is well above this machine's
//! scheduling noise between ranks of a call, and well below a training step; half the window
//! keeps a checkpoint or a garbage collection (a few calls) from naming a rank, and a throttled
//! rank (late at nearly every call) is named after 32 calls.

use std::collections::HashMap;
use std::time::Duration;

/// Calls kept per peer.
const WINDOW: usize = 64;
/// Calls seen before a peer may be reported.
const MIN_SEEN: usize = WINDOW / 2;

/// A peer found persistently late.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Straggler {
    /// The late rank.
    pub rank: usize,
    /// Calls of the window in which this rank heard from it.
    pub calls: usize,
    /// Share of those calls in which it was late, 0 to 1.
    pub late_share: f64,
    /// Median lateness over the window's calls, milliseconds.
    pub median_late_ms: f64,
}

/// What one peer's last calls said.
struct Window {
    /// Lateness per call, milliseconds, as a ring.
    late_ms: [f32; WINDOW],
    /// Samples written (the ring holds the last `min(written, WINDOW)`).
    written: usize,
    /// Samples in the ring over the threshold.
    late: usize,
    /// Reported as a straggler and not yet recovered.
    reported: bool,
}

impl Window {
    fn new() -> Self {
        Self {
            late_ms: [0.0; WINDOW],
            written: 0,
            late: 0,
            reported: false,
        }
    }

    fn len(&self) -> usize {
        self.written.min(WINDOW)
    }

    fn push(&mut self, ms: f32, threshold: f32) {
        let slot = self.written % WINDOW;
        if self.written >= WINDOW && self.late_ms[slot] > threshold {
            self.late -= 1;
        }
        self.late_ms[slot] = ms;
        if ms > threshold {
            self.late += 1;
        }
        self.written += 1;
    }

    fn summary(&self, rank: usize) -> Straggler {
        let n = self.len();
        let mut v: Vec<f32> = self.late_ms[..n].to_vec();
        v.sort_by(f32::total_cmp);
        Straggler {
            rank,
            calls: n,
            late_share: self.late as f64 / n.max(1) as f64,
            median_late_ms: v.get(n / 2).copied().unwrap_or(0.0) as f64,
        }
    }
}

/// A change worth a log line.
#[derive(Debug, PartialEq)]
pub enum Change {
    /// The peer became a straggler.
    Late(Straggler),
    /// The peer is on time again.
    Recovered(Straggler),
}

/// One communicator's view of the peers it hears from.
pub struct Stragglers {
    threshold_ms: f32,
    peers: HashMap<usize, Window>,
}

impl Stragglers {
    /// A view with lateness above `threshold` counting as late.
    pub fn new(threshold: Duration) -> Self {
        Self {
            threshold_ms: threshold.as_secs_f32() * 1e3,
            peers: HashMap::new(),
        }
    }

    /// One call's observations: how long after this rank's start each peer's first message
    /// arrived. Returns the peers whose state changed.
    pub fn observe(&mut self, samples: &[(usize, Duration)]) -> Vec<Change> {
        let mut changes = Vec::new();
        for &(peer, after) in samples {
            let t = self.threshold_ms;
            let w = self.peers.entry(peer).or_insert_with(Window::new);
            w.push(after.as_secs_f32() * 1e3, t);
            let n = w.len();
            if !w.reported && n >= MIN_SEEN && 2 * w.late >= n {
                w.reported = true;
                changes.push(Change::Late(w.summary(peer)));
            } else if w.reported && 5 * w.late < n {
                w.reported = false;
                changes.push(Change::Recovered(w.summary(peer)));
            }
        }
        changes
    }

    /// The peers reported now, by rank.
    pub fn current(&self) -> Vec<Straggler> {
        let mut v: Vec<Straggler> = self
            .peers
            .iter()
            .filter(|(_, w)| w.reported)
            .map(|(&r, w)| w.summary(r))
            .collect();
        v.sort_by_key(|s| s.rank);
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(x: u64) -> Duration {
        Duration::from_millis(x)
    }

    #[test]
    fn a_peer_late_at_most_calls_is_reported_once_and_again_when_it_recovers() {
        let mut s = Stragglers::new(ms(5));
        let mut changes = Vec::new();
        // Peer 3 is 20 ms late at 3 calls in 4; peer 1 always on time.
        for call in 0..200 {
            let late = if call % 4 == 0 { 1 } else { 20 };
            changes.extend(s.observe(&[(3, ms(late)), (1, ms(1))]));
        }
        assert_eq!(changes.len(), 1, "{changes:?}");
        let Change::Late(first) = &changes[0] else {
            panic!("{changes:?}")
        };
        assert_eq!(first.rank, 3);
        assert_eq!(first.calls, MIN_SEEN, "named as soon as the rule can");
        assert_eq!(s.current().len(), 1);
        assert!((s.current()[0].late_share - 0.75).abs() < 0.05);
        assert_eq!(s.current()[0].median_late_ms, 20.0);
        // On time again: recovered once, no longer current.
        changes.clear();
        for _ in 0..200 {
            changes.extend(s.observe(&[(3, ms(1))]));
        }
        assert!(
            matches!(changes.as_slice(), [Change::Recovered(r)] if r.rank == 3),
            "{changes:?}"
        );
        assert!(s.current().is_empty());
    }

    #[test]
    fn occasional_lateness_and_a_clean_run_name_no_one() {
        let mut s = Stragglers::new(ms(5));
        for call in 0..1000 {
            // A hiccup every 10 calls, and a burst of 20 late calls once.
            let late = if call % 10 == 0 || (500..520).contains(&call) {
                50
            } else {
                2
            };
            assert!(
                s.observe(&[(2, ms(late)), (5, ms(0))]).is_empty(),
                "call {call}"
            );
        }
        assert!(s.current().is_empty());
    }
}
