//! What a call tells the straggler view ([`crate::watchdog::stragglers`]): its stalls and
//! the stall shares its peers' headers carried.

use crate::transport::Direction;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// Which peers a rank's call is blocked on now, for the live view (`collbench status`):
/// written when a wait reaches its sleeping phase and cleared when it ends, two relaxed
/// stores each; read by the status handler.
#[derive(Default)]
pub(crate) struct WaitBoard {
    /// Up to three peers, each as rank + 1 in 21 bits; 0: not blocked.
    peers: AtomicU64,
    /// When the wait began, microseconds since [`board_epoch`].
    since_us: AtomicU64,
}

/// Bits per peer in [`WaitBoard::peers`].
const PEER_BITS: u32 = 21;
const PEER_MASK: u64 = (1 << PEER_BITS) - 1;

fn board_epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

impl WaitBoard {
    /// The call is blocked on `peers` (the first three that fit are kept) since `now`.
    fn set(&self, peers: &[usize], now: Instant) {
        let mut word = 0u64;
        let mut slot = 0;
        for &p in peers {
            let code = p as u64 + 1;
            if code > PEER_MASK || slot == 3 {
                continue;
            }
            word |= code << (slot * PEER_BITS);
            slot += 1;
        }
        let since = now.saturating_duration_since(board_epoch()).as_micros() as u64;
        self.since_us.store(since, Ordering::Relaxed);
        self.peers.store(word, Ordering::Release);
    }

    /// The call is no longer blocked.
    fn clear(&self) {
        self.peers.store(0, Ordering::Release);
    }

    /// The peers the call is blocked on and for how long (none: not blocked now).
    pub(crate) fn read(&self) -> (Vec<usize>, Duration) {
        let word = self.peers.load(Ordering::Acquire);
        let peers: Vec<usize> = (0..3)
            .map(|i| (word >> (i * PEER_BITS)) & PEER_MASK)
            .filter(|&c| c != 0)
            .map(|c| (c - 1) as usize)
            .collect();
        if peers.is_empty() {
            return (peers, Duration::ZERO);
        }
        let since = board_epoch() + Duration::from_micros(self.since_us.load(Ordering::Relaxed));
        (peers, Instant::now().saturating_duration_since(since))
    }
}

/// A call's stalls: idle stretches of at least `threshold`, each charged in full to every
/// peer the rank was blocked on when the stretch began (any of them may be the one holding it
/// up; receives first: a send that cannot go out waits on a receiver that is itself waiting),
/// and the stall shares the peers' headers carried. Time this rank itself did not run is not charged: a gap between two of its polls
/// longer than it meant to sleep (stopped, throttled, descheduled) is taken out, or a rank
/// stopped while it waits would blame whomever it waited on. A wait that ends while it spins
/// costs nothing; one that sleeps, the clock read each sleeping poll makes anyway and one at
/// its end; nothing per byte.
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
    /// This call's stalls in all (each counted once, whatever the peers it was charged to).
    pub stalled: Duration,
    /// (peer, its stall share per mille) from the headers of this call.
    pub peer_shares: Vec<(usize, u16)>,
    /// Where the live view reads whom this rank waits on.
    pub board: Option<Arc<WaitBoard>>,
}

impl StallLog {
    /// Forgets the last call.
    pub fn begin_call(&mut self) {
        // A stretch left open by a call that failed while it waited.
        if self.idle_since.take().is_some()
            && let Some(board) = &self.board
        {
            board.clear();
        }
        self.stalls.clear();
        self.stalled = Duration::ZERO;
        self.peer_shares.clear();
    }

    /// A wait reached its sleeping phase at `now` (spins and yields done: anything shorter
    /// is no stall, and costs no clock read): opens a stretch blocked on the peers of `waits`,
    /// unless one is open.
    pub(super) fn sleeping(&mut self, now: Instant, waits: &[(usize, Direction)]) {
        if self.idle_since.is_some() {
            return;
        }
        self.idle_since = Some(now);
        self.last_poll = None;
        self.lost = Duration::ZERO;
        self.blocked_on.clear();
        let receiving = waits.iter().any(|w| w.1 == Direction::Recv);
        for &(peer, dir) in waits {
            if (dir == Direction::Recv || !receiving) && !self.blocked_on.contains(&peer) {
                self.blocked_on.push(peer);
            }
        }
        if let Some(board) = &self.board {
            board.set(&self.blocked_on, now);
        }
    }

    /// A sleeping poll of the open stretch at `now`, about to sleep up to `sleep`.
    pub(super) fn polled(&mut self, now: Instant, sleep: Duration) {
        if self.idle_since.is_some() {
            self.count_gap(now);
            self.last_poll = Some((now, sleep));
        }
    }

    /// Takes the part of the gap since the last poll (or the stretch's start) that this rank
    /// meant to spend running out of the stretch.
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
        if let Some(board) = &self.board {
            board.clear();
        }
        let waited = now.saturating_duration_since(t0).saturating_sub(self.lost);
        if waited < self.threshold || self.blocked_on.is_empty() {
            return;
        }
        self.stalled += waited;
        for &peer in &self.blocked_on {
            match self.stalls.iter_mut().find(|s| s.0 == peer) {
                Some(s) => s.1 += waited,
                None => self.stalls.push((peer, waited)),
            }
        }
    }

    /// The longest a waiting rank may sleep between polls: half the stall threshold (at
    /// least 1 ms). A rank stopped while it sleeps (SIGSTOP, a CPU quota) wakes late, and a
    /// wake-up later than the sleep meant is time it did not run, not a stall on its peers;
    /// a sleep longer than the stop would hide it. With 50 ms sleeps, a rank stopped for
    /// 30-50 ms of every 60-100 ms seemed to stall on its peers as long as they did on it,
    /// and was not named.
    pub fn longest_sleep(&self) -> Duration {
        (self.threshold / 2).max(Duration::from_millis(1))
    }

    /// Records the stall share `peer`'s header carried.
    pub(crate) fn note_share(&mut self, peer: usize, per_mille: u16) {
        match self.peer_shares.iter_mut().find(|s| s.0 == peer) {
            Some(s) => s.1 = per_mille,
            None => self.peer_shares.push((peer, per_mille)),
        }
    }
}
