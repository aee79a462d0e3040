//! Timeout diagnosis over a tree: which ranks are not in the call the others wait in.
//!
//! When a call times out, the rank asks its parent in the rank tree of fan-out
//! [`TREE_FANOUT`](crate::bootstrap::TREE_FANOUT) (the bootstrap's) for the job's census of that call; the parent asks its own
//! parent, and rank 0 takes the census by asking its children for their subtrees' in parallel,
//! each of which asks its own children. Every listener computes a census once per call and
//! serves later questions from that, so a timeout that hits every rank costs each rank one
//! question up and at most K down, and takes 2 ⌈log_K p⌉ hops, instead of every rank asking
//! every rank. A rank that does not answer is named as such, and its children are asked
//! directly in its place; a rank whose parent does not answer takes the census itself.

use crate::bootstrap;
use crate::error::Error;
use crate::watchdog::Health;
use crate::wire::{
    self, Census, ConnectKind, Handler, Incoming, Msg, PeerInfo, Progress, Secret, open_request,
};
use std::collections::HashMap;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Where a census question goes before the communicator (and its diagnoser) exists.
pub(crate) type DiagnoserCell = Arc<OnceLock<Arc<Diagnoser>>>;

/// The listener's handler for `ConnectKind::Census`: the census of the asked call from the
/// communicator's diagnoser once it has one; during init, this rank's own state from `health`,
/// which is all it can say then.
pub(crate) fn census_handler(diagnoser: DiagnoserCell, health: Arc<Health>) -> Handler {
    Arc::new(move |incoming: Incoming| {
        let Incoming {
            kind, mut stream, ..
        } = incoming;
        let ConnectKind::Census {
            seq,
            whole_job,
            within_ms,
        } = kind
        else {
            return Err(Error::Transport("internal: not a census".into()));
        };
        let reply = match diagnoser.get() {
            Some(d) => {
                let within = Duration::from_millis(within_ms).min(Duration::from_secs(30));
                Msg::Census(d.census(seq, whole_job, Instant::now() + within))
            }
            None => Msg::Status(health.progress()),
        };
        wire::send_msg(&mut stream, &reply)
    })
}

/// Where rank `q`, in state `p`, stands with call `seq`.
fn classify(q: usize, p: &Progress, seq: u64) -> Census {
    if p.started == seq && p.finished < seq {
        // In this call, or it gave up on it already.
        return Census {
            in_call: vec![q],
            ..Census::default()
        };
    }
    if p.finished >= seq {
        // It finished this call: not what anyone waits for.
        return Census::default();
    }
    let what = if p.started > seq {
        format!("is already past it, {}", p.describe())
    } else {
        match &p.current {
            Some(c) => format!("is still in {c}"),
            None => format!(
                "is idle after collective #{} (it has not called #{seq})",
                p.finished
            ),
        }
    };
    Census::lagging(q, what)
}

fn tree_children(rank: usize, n: usize) -> std::ops::Range<usize> {
    bootstrap::tree_children(rank, n)
}

/// Ranks in `node`'s subtree of the rank tree of `n`.
pub(crate) fn subtree_size(node: usize, n: usize) -> usize {
    let mut size = 0;
    let mut level = node..node + 1;
    while level.start < n {
        size += level.end.min(n) - level.start;
        let first = tree_children(level.start, usize::MAX).start;
        let last = tree_children(level.end - 1, usize::MAX).end;
        level = first..last;
    }
    size
}

/// The instant `share` of the way from now to `until`.
pub(crate) fn fraction_of(until: Instant, share: f64) -> Instant {
    let now = Instant::now();
    now + until.saturating_duration_since(now).mul_f64(share)
}

/// A census being taken or taken: the first asker fills it while the others wait on its lock.
type CensusSlot = Arc<Mutex<Option<Census>>>;

/// The ranks of one communicator as one of them reaches them: what the timeout census and the
/// live view ([`crate::status`]) both ask down the rank tree with.
pub(crate) struct Directory {
    /// The communicator's id.
    pub comm: String,
    /// This rank.
    pub rank: usize,
    /// Every rank's listener, host and process.
    pub peers: Vec<PeerInfo>,
    /// The job's secret, proven on every connection.
    pub secret: Secret,
    /// This rank's progress, waits and faults.
    pub health: Arc<Health>,
    /// How long a connection's handshake may take.
    pub handshake_timeout: Duration,
}

/// A question asked down the rank tree of fan-out
/// [`TREE_FANOUT`](crate::bootstrap::TREE_FANOUT): every node answers for its subtree, asking
/// its children in parallel; a node that does not answer is named, and its children are asked
/// in its place. The timeout census and the live view are two such questions.
pub(crate) trait TreeQuestion: Sync {
    /// A subtree's answer; answers of disjoint subtrees merge.
    type Answer: Default + Send;
    /// Ranks in the communicator.
    fn nranks(&self) -> usize;
    /// The asker's own rank, which it answers for itself (none for a client outside the job).
    fn me(&self) -> Option<usize>;
    /// The asker's own answer, without its children's.
    fn own(&self) -> Self::Answer;
    /// Asks `node` for its subtree's answer by `until`; the reason as a phrase if it cannot.
    fn ask(&self, node: usize, until: Instant) -> std::result::Result<Self::Answer, String>;
    /// The answer that names `node`, which did not answer, with `reason`.
    fn silent(&self, node: usize, reason: String) -> Self::Answer;
    /// The answer for `ranks` ranks left unasked when time ran out.
    fn unasked(&self, ranks: usize) -> Self::Answer;
    /// Adds a disjoint subtree's answer to `into`.
    fn merge(&self, into: &mut Self::Answer, part: Self::Answer);
    /// Tidies the asker's own subtree answer once its children's are in.
    fn finish(&self, _answer: &mut Self::Answer) {}
}

/// Rank `node`'s subtree: answered by the asker itself when it is `node`, else asked of
/// `node` with half the time left; if `node` does not answer, it is named and its children are
/// asked in its place with the rest.
pub(crate) fn sweep<Q: TreeQuestion>(q: &Q, node: usize, until: Instant) -> Q::Answer {
    if q.me() == Some(node) {
        let mut answer = q.own();
        sweep_children(q, node, until, &mut answer);
        q.finish(&mut answer);
        return answer;
    }
    match q.ask(node, fraction_of(until, 0.5)) {
        Ok(a) => a,
        Err(_) if Instant::now() >= until => q.unasked(subtree_size(node, q.nranks())),
        Err(reason) => {
            let mut answer = q.silent(node, reason);
            sweep_children(q, node, until, &mut answer);
            answer
        }
    }
}

/// Adds the subtrees of `node`'s children, asked in parallel, to `answer`.
fn sweep_children<Q: TreeQuestion>(q: &Q, node: usize, until: Instant, answer: &mut Q::Answer) {
    let parts: Vec<Q::Answer> = std::thread::scope(|s| {
        let hs: Vec<_> = tree_children(node, q.nranks())
            .map(|c| s.spawn(move || sweep(q, c, until)))
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_default())
            .collect()
    });
    for part in parts {
        q.merge(answer, part);
    }
}

/// One rank's side of the diagnosis: answers its listener's census questions and takes the
/// census when its own call times out.
pub(crate) struct Diagnoser {
    dir: Arc<Directory>,
    /// Censuses taken, by (call, whole job or this rank's subtree); the first asker takes
    /// it, the others wait for it.
    taken: Mutex<HashMap<(u64, bool), CensusSlot>>,
    /// Questions this rank has asked other ranks' listeners.
    asked: AtomicUsize,
}

impl Diagnoser {
    pub(crate) fn new(dir: Arc<Directory>) -> Self {
        Self {
            dir,
            taken: Mutex::new(HashMap::new()),
            asked: AtomicUsize::new(0),
        }
    }

    /// Questions this rank has asked other ranks' listeners so far.
    pub(crate) fn questions_asked(&self) -> usize {
        self.asked.load(Ordering::Relaxed)
    }

    /// The census of call `seq`: the whole job's, or this rank's subtree's; taken once.
    pub(crate) fn census(&self, seq: u64, whole_job: bool, until: Instant) -> Census {
        let slot = {
            let Ok(mut taken) = self.taken.lock() else {
                return self.take(seq, whole_job, until);
            };
            // Keep the last few calls' only.
            if taken.len() > 16 {
                taken.retain(|&(s, _), _| s + 8 > seq);
            }
            taken.entry((seq, whole_job)).or_default().clone()
        };
        let Ok(mut slot) = slot.lock() else {
            return self.take(seq, whole_job, until);
        };
        if let Some(c) = slot.as_ref() {
            return c.clone();
        }
        let c = self.take(seq, whole_job, until);
        *slot = Some(c.clone());
        c
    }

    fn take(&self, seq: u64, whole_job: bool, until: Instant) -> Census {
        let question = CensusQuestion { d: self, seq };
        if !whole_job {
            return sweep(&question, self.dir.rank, until);
        }
        match bootstrap::tree_parent(self.dir.rank) {
            None => sweep(&question, self.dir.rank, until),
            // Three quarters of the time for the parent (its own parent gets three quarters
            // of that, and so on up: the root keeps a quarter of the whole at depth 5); if it
            // does not answer, the rest for taking the census from here.
            Some(parent) => self
                .ask(parent, seq, true, fraction_of(until, 0.75))
                .unwrap_or_else(|_| sweep(&question, 0, until)),
        }
    }

    /// Asks `peer`'s listener for a census; the reason as a phrase if it cannot give one.
    fn ask(
        &self,
        peer: usize,
        seq: u64,
        whole_job: bool,
        until: Instant,
    ) -> std::result::Result<Census, String> {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err("was not asked in time".into());
        }
        let kind = ConnectKind::Census {
            seq,
            whole_job,
            within_ms: left.as_millis().min(u128::from(u64::MAX)) as u64,
        };
        let dir = &*self.dir;
        self.asked.fetch_add(1, Ordering::Relaxed);
        let mut s = open_request(
            &dir.comm,
            dir.rank,
            &dir.peers[peer],
            &dir.secret,
            until,
            dir.handshake_timeout.min(left),
            kind,
        )
        .map_err(|e| format!("does not answer ({e})"))?;
        s.set_read_timeout(Some(
            until
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(10)),
        ))
        .ok();
        match wire::recv_msg(&mut s) {
            Ok(Msg::Census(c)) => Ok(c),
            Ok(Msg::Status(p)) => Ok(classify(peer, &p, seq)),
            Ok(other) => Err(format!("answered a census with {other:?}")),
            Err(e) => Err(format!("does not answer ({e})")),
        }
    }
}

/// The census of call `seq`, asked down the tree from a diagnoser.
struct CensusQuestion<'a> {
    d: &'a Diagnoser,
    seq: u64,
}

impl TreeQuestion for CensusQuestion<'_> {
    type Answer = Census;

    fn nranks(&self) -> usize {
        self.d.dir.peers.len()
    }

    fn me(&self) -> Option<usize> {
        Some(self.d.dir.rank)
    }

    fn own(&self) -> Census {
        classify(self.d.dir.rank, &self.d.dir.health.progress(), self.seq)
    }

    fn ask(&self, node: usize, until: Instant) -> std::result::Result<Census, String> {
        self.d.ask(node, self.seq, false, until)
    }

    fn silent(&self, node: usize, reason: String) -> Census {
        Census::lagging(node, reason)
    }

    fn unasked(&self, ranks: usize) -> Census {
        Census {
            unasked: ranks,
            ..Census::default()
        }
    }

    fn merge(&self, into: &mut Census, part: Census) {
        into.merge(part);
    }

    fn finish(&self, answer: &mut Census) {
        answer.sort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::MAX_NAMED;

    fn progress(started: u64, finished: u64, current: Option<&str>) -> Progress {
        Progress {
            started,
            finished,
            current: current.map(str::to_string),
        }
    }

    #[test]
    fn ranks_are_classified_against_the_call() {
        assert_eq!(classify(3, &progress(5, 4, Some("x")), 5).in_call, vec![3]);
        assert!(classify(3, &progress(5, 5, None), 5).laggards.is_empty());
        let idle = classify(2, &progress(4, 4, None), 5);
        assert_eq!(idle.laggards[0].0, 2);
        assert!(idle.laggards[0].1.contains("is idle after collective #4"));
        let stuck = classify(2, &progress(4, 3, Some("broadcast #4")), 5);
        assert!(stuck.laggards[0].1.contains("is still in broadcast #4"));
        let ahead = classify(2, &progress(6, 4, Some("all_gather #6")), 5);
        assert!(ahead.laggards[0].1.contains("already past it"));
    }

    #[test]
    fn subtree_sizes_add_up() {
        for n in [1, 2, 9, 10, 73, 74, 1000] {
            assert_eq!(subtree_size(0, n), n);
            let children: usize = tree_children(0, n).map(|c| subtree_size(c, n)).sum();
            assert_eq!(children, n - 1);
        }
        assert_eq!(subtree_size(1, 74), 1 + 8 + 1);
    }

    #[test]
    fn a_census_names_at_most_64_laggards_and_counts_the_rest() {
        let mut c = Census::default();
        for r in 0..100 {
            c.merge(Census::lagging(r, "idle".into()));
        }
        assert_eq!(c.laggards.len(), MAX_NAMED);
        assert_eq!(c.unnamed, 100 - MAX_NAMED);
    }
}
