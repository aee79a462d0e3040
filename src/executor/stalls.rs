//! What a call tells the straggler view ([`crate::watchdog::stragglers`]): its stalls and
//! the stall shares its peers' headers carried.

use crate::transport::Direction;
use std::time::{Duration, Instant};

/// A call's stalls: idle stretches of at least `threshold`, each charged to the peers the
/// rank was blocked on when the stretch began (receives first: a send that cannot go out
/// waits on a receiver that is itself waiting), and the stall shares the peers' headers
/// carried. Time this rank itself did not run is not charged: a gap between two of its polls
/// longer than it meant to sleep (stopped, throttled, descheduled) is taken out, or a rank
/// stopped while it waits would blame whomever it waited on. Costs two clock reads per idle
/// stretch, the one each sleeping poll makes anyway, and nothing per byte.
#[derive(Default)]
pub(crate) struct StallLog {
    /// This rank's own stall share (per mille), written into the headers it sends.
    pub own_share: u16,
    /// Shortest idle stretch counted as a stall.
    pub threshold: Duration,
    idle_since: Option<Instant>,
    /// The last sleeping poll of the open stretch and how long it meant to sleep.
    last_poll: Option<(Instant, Duration)>,
    /// Time of the open stretch this rank was not running.
    lost: Duration,
    blocked_on: Vec<usize>,
    /// (peer, stalled on it) of this call.
    pub stalls: Vec<(usize, Duration)>,
    /// (peer, its stall share per mille) from the headers of this call.
    pub peer_shares: Vec<(usize, u16)>,
}

impl StallLog {
    /// Forgets the last call.
    pub fn begin_call(&mut self) {
        self.idle_since = None;
        self.stalls.clear();
        self.peer_shares.clear();
    }

    /// An idle round: starts a stretch, blocked on the peers of `waits`, unless one is open.
    pub(super) fn idle(&mut self, waits: &[(usize, Direction)]) {
        if self.idle_since.is_some() {
            return;
        }
        self.idle_since = Some(Instant::now());
        self.last_poll = None;
        self.lost = Duration::ZERO;
        self.blocked_on.clear();
        let receiving = waits.iter().any(|w| w.1 == Direction::Recv);
        for &(peer, dir) in waits {
            if (dir == Direction::Recv || !receiving) && !self.blocked_on.contains(&peer) {
                self.blocked_on.push(peer);
            }
        }
    }

    /// A sleeping poll of the open stretch at `now`, about to sleep up to `sleep`.
    pub(super) fn polled(&mut self, now: Instant, sleep: Duration) {
        if self.idle_since.is_some() {
            self.count_gap(now);
            self.last_poll = Some((now, sleep));
        }
    }

    /// Takes the part of the gap since the last poll (or the stretch's start, which only
    /// spins and yields) that this rank meant to spend running out of the stretch.
    fn count_gap(&mut self, now: Instant) {
        /// Lateness of a wake-up that is only the scheduler's.
        const SLACK: Duration = Duration::from_millis(2);
        let (from, meant) = match (self.last_poll, self.idle_since) {
            (Some(p), _) => p,
            (None, Some(t0)) => (t0, Duration::ZERO),
            (None, None) => return,
        };
        let gap = now.saturating_duration_since(from);
        if gap > meant + SLACK {
            self.lost += gap - meant;
        }
    }

    /// Something moved (or the step ended): closes the open stretch, charging it when long.
    pub(super) fn moved(&mut self) {
        if self.idle_since.is_none() {
            return;
        }
        let now = Instant::now();
        self.count_gap(now);
        let Some(t0) = self.idle_since.take() else {
            return;
        };
        let waited = now.saturating_duration_since(t0).saturating_sub(self.lost);
        if waited < self.threshold || self.blocked_on.is_empty() {
            return;
        }
        let each = waited / self.blocked_on.len() as u32;
        for &peer in &self.blocked_on {
            match self.stalls.iter_mut().find(|s| s.0 == peer) {
                Some(s) => s.1 += each,
                None => self.stalls.push((peer, each)),
            }
        }
    }

    /// Records the stall share `peer`'s header carried.
    pub(crate) fn note_share(&mut self, peer: usize, per_mille: u16) {
        match self.peer_shares.iter_mut().find(|s| s.0 == peer) {
            Some(s) => s.1 = per_mille,
            None => self.peer_shares.push((peer, per_mille)),
        }
    }
}
