//! A live view of a running job (`collbench status`, [`Communicator::status`]): every rank's
//! call, how long it has been in it and whom it waits on, gathered down the rank tree of
//! fan-out [`TREE_FANOUT`](crate::bootstrap::TREE_FANOUT) without stopping the job.
//!
//! A question for the whole job goes to rank 0's listener; each rank answers for its subtree,
//! asking its children in parallel, so the question costs each rank one connection from its
//! parent and at most K to its children, and takes 2 ⌈log_K p⌉ hops. A rank that does not
//! answer in time (stopped, hung, gone) is named with the reason, and its children are asked
//! directly in its place. A client outside the job learns where rank 0 (and, for a silent
//! rank, its children) listens from the job's bootstrap root, which stays open for that while
//! the job runs ([`crate::bootstrap::JobRoot`]). Every connection is authenticated by the
//! job's secret.
//!
//! [`Communicator::status`]: crate::Communicator::status

use crate::bootstrap::tree_children;
use crate::diagnosis::{fraction_of, subtree_size};
use crate::error::{Error, Result};
use crate::watchdog::Health;
use crate::wire::{
    self, CallStatus, ConnectKind, Handler, Incoming, Located, Msg, PeerInfo, RankStatus, Retry,
    Secret, SilentRank, StatusPart, connect_authenticated,
};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The longest a status question may take, however long its asker allows.
const MOST_TIME: Duration = Duration::from_secs(30);

/// The shortest wait that names the rank waited on as holding the job up: shorter waits are
/// a healthy job's (a rank a few microseconds behind its peer in every call).
pub const NAMED_AFTER: Duration = Duration::from_millis(250);

/// The view of one communicator, as a status question gathered it.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct JobStatus {
    /// The communicator's id.
    pub comm: String,
    /// Its ranks.
    pub nranks: usize,
    /// The job's bootstrap root (rendezvous address), where known.
    pub root: Option<String>,
    /// The launcher's job id, as rank 0 (or the first rank that answered) knows it.
    pub job: Option<String>,
    /// How long the question took, seconds.
    pub asked_in_s: f64,
    /// The ranks that answered, by rank.
    pub ranks: Vec<RankStatus>,
    /// The ranks that did not answer, by rank.
    pub silent: Vec<SilentRank>,
    /// Ranks that could not be asked in time (below silent ones).
    pub unasked: usize,
    /// Who holds the job up, from the answers: silent ranks, and ranks that others wait on
    /// while they are not waiting themselves.
    pub holding_up: Vec<Culprit>,
}

/// A rank that holds the job up.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Culprit {
    /// The rank.
    pub rank: usize,
    /// Its host, where known.
    pub host: String,
    /// Its process id, where known.
    pub pid: u32,
    /// What it is doing, or why it did not answer.
    pub what: String,
    /// The ranks that wait on it, directly or through others.
    pub waited_on_by: Vec<usize>,
    /// The call they wait in, as the longest waiter describes it.
    pub call: Option<String>,
}

/// The launcher's job id, where this process knows one: `slurm 1234.0`, `torchelastic <id>`,
/// `openmpi <id>`, `pmix <namespace>`.
pub(crate) fn job_id_from_env() -> Option<String> {
    let get = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    if let Some(job) = get("SLURM_JOB_ID") {
        return Some(match get("SLURM_STEP_ID") {
            Some(step) => format!("slurm {job}.{step}"),
            None => format!("slurm {job}"),
        });
    }
    [
        ("TORCHELASTIC_RUN_ID", "torchelastic"),
        ("OMPI_MCA_ess_base_jobid", "openmpi"),
        ("PMIX_NAMESPACE", "pmix"),
    ]
    .into_iter()
    .find_map(|(var, label)| get(var).map(|v| format!("{label} {v}")))
}

/// One rank's side of the live view: its own answer, and the subtree questions it asks.
pub(crate) struct StatusSource {
    comm: String,
    rank: usize,
    peers: Vec<PeerInfo>,
    secret: Secret,
    health: Arc<Health>,
    handshake_timeout: Duration,
    job: Option<String>,
}

/// Where a status question goes before the communicator (and its source) exists.
pub(crate) type StatusCell = Arc<OnceLock<Arc<StatusSource>>>;

/// The listener's handler for `ConnectKind::JobStatus`: this rank's subtree, once the
/// communicator exists.
pub(crate) fn status_handler(source: StatusCell) -> Handler {
    Arc::new(move |incoming: Incoming| {
        let Incoming {
            kind, mut stream, ..
        } = incoming;
        let ConnectKind::JobStatus { within_ms } = kind else {
            return Err(Error::Transport("internal: not a status question".into()));
        };
        let Some(source) = source.get() else {
            return Err(wire::refuse(
                &mut stream,
                "the communicator is still being built".into(),
            ));
        };
        let until = Instant::now() + Duration::from_millis(within_ms).min(MOST_TIME);
        let part = sweep(&**source, source.rank, until);
        wire::send_msg(&mut stream, &Msg::StatusPart(part))
    })
}

impl StatusSource {
    pub(crate) fn new(
        comm: String,
        rank: usize,
        peers: Vec<PeerInfo>,
        secret: Secret,
        health: Arc<Health>,
        handshake_timeout: Duration,
    ) -> Self {
        Self {
            comm,
            rank,
            peers,
            secret,
            health,
            handshake_timeout,
            job: job_id_from_env(),
        }
    }

    /// What this rank says about itself now.
    fn own(&self) -> RankStatus {
        let me = &self.peers[self.rank];
        let progress = self.health.progress();
        let call = self.health.current_call().map(|(h, ran)| CallStatus {
            collective: h.collective.to_string(),
            seq: h.call_seq(),
            count: h.count,
            dtype: h.dtype.to_string(),
            describe: h.describe(),
            for_s: ran.as_secs_f64(),
        });
        let (waiting_on, waiting_for) = if call.is_some() {
            self.health.waits.read()
        } else {
            (Vec::new(), Duration::ZERO)
        };
        RankStatus {
            rank: self.rank,
            host: me.host.hostname.clone(),
            pid: me.pid,
            started: progress.started,
            finished: progress.finished,
            call,
            waiting_on,
            waiting_for_s: waiting_for.as_secs_f64(),
            stragglers: self.health.stragglers().iter().map(|s| s.rank).collect(),
            stall_share: self.health.own_stall_share(),
            fault: self.health.fault().map(|e| e.to_string()),
            job: self.job.clone(),
        }
    }

    /// The whole communicator's view, asked from this rank: of rank 0, which gathers it down
    /// the tree; if rank 0 does not answer, gathered from here in its place.
    pub(crate) fn job_status(&self, within: Duration, root: Option<String>) -> JobStatus {
        let started = Instant::now();
        let until = started + within.min(MOST_TIME);
        let part = sweep(self, 0, until);
        JobStatus::from_part(
            self.comm.clone(),
            self.peers.len(),
            root,
            part,
            started.elapsed(),
        )
    }
}

/// How a sweep reaches the ranks of one communicator.
trait Asker: Sync {
    /// The communicator's size.
    fn nranks(&self) -> usize;
    /// The asker's own rank, whose answer it gives itself (none for a client outside).
    fn me(&self) -> Option<usize>;
    /// The asker's own answer.
    fn own(&self) -> RankStatus;
    /// Asks `node` for its subtree's part by `until`; the reason as a phrase if it cannot.
    fn ask(&self, node: usize, until: Instant) -> std::result::Result<StatusPart, String>;
    /// `node`'s host and process id, where the asker knows them.
    fn who(&self, node: usize) -> (String, u32);
}

impl Asker for StatusSource {
    fn nranks(&self) -> usize {
        self.peers.len()
    }

    fn me(&self) -> Option<usize> {
        Some(self.rank)
    }

    fn own(&self) -> RankStatus {
        StatusSource::own(self)
    }

    fn ask(&self, node: usize, until: Instant) -> std::result::Result<StatusPart, String> {
        ask_at(
            &self.comm,
            &self.peers[node].listen,
            node,
            &self.secret,
            self.handshake_timeout,
            until,
        )
    }

    fn who(&self, node: usize) -> (String, u32) {
        let p = &self.peers[node];
        (p.host.hostname.clone(), p.pid)
    }
}

/// Asks the rank `node` listening at `addr` for its subtree's part by `until`.
fn ask_at(
    comm: &str,
    addr: &SocketAddr,
    node: usize,
    secret: &Secret,
    handshake_timeout: Duration,
    until: Instant,
) -> std::result::Result<StatusPart, String> {
    let left = until.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err("was not asked in time".into());
    }
    // The answer's own deadline is a little shorter than ours, so that a subtree with a
    // silent rank in it still answers in time.
    let within = left.mul_f64(0.9);
    let kind = ConnectKind::JobStatus {
        within_ms: within.as_millis().min(u128::from(u64::MAX)) as u64,
    };
    let mut s = connect_authenticated(*addr, secret, until, handshake_timeout.min(left), Retry::No)
        .and_then(|mut s| {
            // Not a rank of the job: the question names the asked rank on both ends.
            let open = Msg::Connect {
                comm: comm.to_string(),
                from: node,
                to: node,
                kind,
            };
            wire::send_msg(&mut s, &open).map(|()| s)
        })
        .map_err(|e| silence(&e, left))?;
    s.set_read_timeout(Some(
        until
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(10)),
    ))
    .ok();
    match wire::recv_msg(&mut s) {
        Ok(Msg::StatusPart(p)) => Ok(p),
        Ok(Msg::Nack { reason }) => Err(format!("refused the question: {reason}")),
        Ok(other) => Err(format!("answered with {other:?}")),
        Err(e) => Err(silence(&e, left)),
    }
}

/// Why a rank gave no answer, from the error of asking it within `left`.
fn silence(e: &Error, left: Duration) -> String {
    if wire::is_refused(e) {
        return wire::unreachable_cause(e).to_string();
    }
    let text = e.to_string();
    if text.contains("os error 11") || text.contains("timed out") || text.contains("deadline") {
        format!(
            "took the connection but gave no answer in {:.2} s: stopped, hung or starved of CPU",
            left.as_secs_f64()
        )
    } else {
        text
    }
}

/// Rank `node`'s subtree: answered by the asker itself when it is `node`, else asked of
/// `node`; if `node` does not answer, it is named and its children are asked in its place.
fn sweep(a: &dyn Asker, node: usize, until: Instant) -> StatusPart {
    if a.me() == Some(node) {
        let mut part = StatusPart {
            ranks: vec![a.own()],
            ..StatusPart::default()
        };
        sweep_children(a, node, until, &mut part);
        return part;
    }
    // Half the time for `node`; if it does not answer, the rest for asking its children.
    match a.ask(node, fraction_of(until, 0.5)) {
        Ok(p) => p,
        Err(_) if Instant::now() >= until => StatusPart {
            unasked: subtree_size(node, a.nranks()),
            ..StatusPart::default()
        },
        Err(reason) => {
            let (host, pid) = a.who(node);
            let mut part = StatusPart {
                silent: vec![SilentRank {
                    rank: node,
                    host,
                    pid,
                    reason,
                }],
                ..StatusPart::default()
            };
            sweep_children(a, node, until, &mut part);
            part
        }
    }
}

/// Adds the subtrees of `node`'s children, asked in parallel, to `part`.
fn sweep_children(a: &dyn Asker, node: usize, until: Instant, part: &mut StatusPart) {
    let parts: Vec<StatusPart> = std::thread::scope(|s| {
        let hs: Vec<_> = tree_children(node, a.nranks())
            .map(|c| s.spawn(move || sweep(a, c, until)))
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_default())
            .collect()
    });
    for p in parts {
        part.merge(p);
    }
}

/// A client outside the job: learns where ranks listen from the job's bootstrap root.
struct Client {
    root: SocketAddr,
    comm: String,
    secret: Secret,
    handshake_timeout: Duration,
    nranks: usize,
    located: Mutex<HashMap<usize, Located>>,
}

impl Client {
    /// Asks the root where `ranks` listen (at most K + 1 at a time) and remembers it.
    fn locate(&self, ranks: Vec<usize>, until: Instant) -> Result<usize> {
        let mut s = connect_authenticated(
            self.root,
            &self.secret,
            until,
            self.handshake_timeout,
            Retry::No,
        )?;
        s.set_read_timeout(Some(
            until
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(10)),
        ))
        .ok();
        wire::send_msg(&mut s, &Msg::Locate { ranks })?;
        match wire::recv_msg(&mut s)? {
            Msg::Located { nranks, ranks } => {
                if let Ok(mut l) = self.located.lock() {
                    l.extend(ranks.into_iter().map(|r| (r.rank, r)));
                }
                Ok(nranks)
            }
            Msg::Fail { reason, .. } => Err(Error::Transport(format!(
                "the root at {} refused: {reason}",
                self.root
            ))),
            other => Err(Error::Transport(format!(
                "the root at {} answered {other:?}; is it a strata job of this version?",
                self.root
            ))),
        }
    }

    fn located(&self, node: usize) -> Option<Located> {
        self.located.lock().ok()?.get(&node).cloned()
    }
}

impl Asker for Client {
    fn nranks(&self) -> usize {
        self.nranks
    }

    fn me(&self) -> Option<usize> {
        None
    }

    fn own(&self) -> RankStatus {
        RankStatus::default()
    }

    fn ask(&self, node: usize, until: Instant) -> std::result::Result<StatusPart, String> {
        let at = match self.located(node) {
            Some(at) => at,
            None => {
                // A silent rank's children: ask for all of them at once.
                let ranks = match node
                    .checked_sub(1)
                    .map(|r| r / crate::bootstrap::TREE_FANOUT)
                {
                    Some(parent) => tree_children(parent, self.nranks).collect(),
                    None => vec![node],
                };
                self.locate(ranks, until)
                    .map_err(|e| format!("could not be located: {e}"))?;
                self.located(node)
                    .ok_or_else(|| "is not registered at the job's root".to_string())?
            }
        };
        ask_at(
            &self.comm,
            &at.listen,
            node,
            &self.secret,
            self.handshake_timeout,
            until,
        )
    }

    fn who(&self, node: usize) -> (String, u32) {
        self.located(node)
            .map_or((String::new(), 0), |l| (l.host, l.pid))
    }
}

/// Asks the job whose bootstrap root is `root` (holding `secret`) for the view of its
/// communicator `comm`, within `within`.
pub(crate) fn ask_job(
    root: SocketAddr,
    secret: Secret,
    comm: String,
    handshake_timeout: Duration,
    within: Duration,
) -> Result<JobStatus> {
    let started = Instant::now();
    let until = started + within.min(MOST_TIME);
    let mut client = Client {
        root,
        comm,
        secret,
        handshake_timeout,
        nranks: 0,
        located: Mutex::new(HashMap::new()),
    };
    let ask_root = fraction_of(until, 0.3);
    client.nranks = client.locate(vec![0], ask_root).map_err(|e| {
        Error::Transport(format!(
            "no answer from the job's bootstrap root at {root}: {e} (it is open while rank 0 \
             of a job started from the launcher's variables runs; check STRATA_ROOT, \
             MASTER_ADDR/STRATA_PORT and the job's secret)"
        ))
    })?;
    if client.nranks == 0 {
        return Err(Error::Transport(format!(
            "the root at {root} has no ranks registered yet"
        )));
    }
    let part = sweep(&client, 0, until);
    Ok(JobStatus::from_part(
        client.comm.clone(),
        client.nranks,
        Some(root.to_string()),
        part,
        started.elapsed(),
    ))
}

impl JobStatus {
    fn from_part(
        comm: String,
        nranks: usize,
        root: Option<String>,
        mut part: StatusPart,
        took: Duration,
    ) -> Self {
        part.ranks.sort_by_key(|r| r.rank);
        part.silent.sort_by_key(|r| r.rank);
        let holding_up = holding_up(&part.ranks, &part.silent);
        Self {
            comm,
            nranks,
            root,
            job: part.ranks.iter().find_map(|r| r.job.clone()),
            asked_in_s: took.as_secs_f64(),
            ranks: part.ranks,
            silent: part.silent,
            unasked: part.unasked,
            holding_up,
        }
    }

    /// The view as text: one line per group of ranks doing the same thing, the silent ones,
    /// and who holds the job up.
    pub fn render_text(&self) -> String {
        let hosts: std::collections::BTreeSet<&str> =
            self.ranks.iter().map(|r| r.host.as_str()).collect();
        let mut out = format!(
            "communicator {}: {} ranks, {} answered ({} hosts), {} silent{} in {:.2} s\n",
            self.comm,
            self.nranks,
            self.ranks.len(),
            hosts.len(),
            self.silent.len(),
            if self.unasked > 0 {
                format!(", {} not asked in time", self.unasked)
            } else {
                String::new()
            },
            self.asked_in_s,
        );
        if let Some(root) = &self.root {
            out += &format!("  root {root}");
            out += &match &self.job {
                Some(job) => format!(", job {job}\n"),
                None => "\n".into(),
            };
        }
        // Ranks by what they do: the call (without its time), whom they wait on.
        let mut groups: BTreeMap<String, Vec<&RankStatus>> = BTreeMap::new();
        for r in &self.ranks {
            let what = match &r.call {
                Some(c) if r.waiting_on.is_empty() => format!("in {}", c.describe),
                Some(c) => format!("in {}, waiting on {}", c.describe, rank_list(&r.waiting_on)),
                None => format!("idle after collective #{}", r.finished),
            };
            groups.entry(what).or_default().push(r);
        }
        for (what, ranks) in &groups {
            let longest = ranks
                .iter()
                .filter_map(|r| r.call.as_ref().map(|c| c.for_s))
                .fold(0.0f64, f64::max);
            let ids: Vec<usize> = ranks.iter().map(|r| r.rank).collect();
            let on: std::collections::BTreeSet<&str> =
                ranks.iter().map(|r| r.host.as_str()).collect();
            let on: Vec<&str> = on.into_iter().collect();
            out += &format!("  {} on {}: {what}", rank_list(&ids), on.join(", "));
            if longest > 0.0 {
                out += &format!(" (up to {longest:.2} s)");
            }
            out += "\n";
        }
        for s in &self.silent {
            out += &format!(
                "  rank {}{}: does not answer: {}\n",
                s.rank,
                host_pid(&s.host, s.pid),
                s.reason
            );
        }
        let mut stragglers: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for r in &self.ranks {
            for &s in &r.stragglers {
                stragglers.entry(s).or_default().push(r.rank);
            }
        }
        for (slow, by) in &stragglers {
            out += &format!("  straggler: rank {slow}, named by {}\n", rank_list(by));
        }
        for r in self.ranks.iter().filter(|r| r.fault.is_some()) {
            out += &format!(
                "  fault at rank {}: {}\n",
                r.rank,
                r.fault.as_deref().unwrap_or_default()
            );
        }
        if self.holding_up.is_empty() {
            out += "  nobody holds the job up\n";
        }
        for c in &self.holding_up {
            out += &format!(
                "  holding up the job: rank {}{} {}",
                c.rank,
                host_pid(&c.host, c.pid),
                c.what
            );
            if !c.waited_on_by.is_empty() {
                let verb = if c.waited_on_by.len() == 1 {
                    "waits"
                } else {
                    "wait"
                };
                out += &format!("; {} {verb} on it", rank_list(&c.waited_on_by));
                if let Some(call) = &c.call {
                    out += &format!(" in {call}");
                }
            }
            out += "\n";
        }
        out
    }
}

/// ` (host h, pid 12)`, or nothing where unknown.
fn host_pid(host: &str, pid: u32) -> String {
    if host.is_empty() {
        String::new()
    } else {
        format!(" (host {host}, pid {pid})")
    }
}

/// `rank 3` or `ranks 0-2,5`.
fn rank_list(ranks: &[usize]) -> String {
    format!("{}", crate::error::RankList(ranks))
}

/// Who holds the job up: the ranks that waiting ranks wait on, followed through the waits
/// to a rank that is not waiting (silent, idle, in another call, or still computing), and
/// every silent rank. Each is named with the ranks that wait on it.
fn holding_up(ranks: &[RankStatus], silent: &[SilentRank]) -> Vec<Culprit> {
    let by_rank: HashMap<usize, &RankStatus> = ranks.iter().map(|r| (r.rank, r)).collect();
    let silent_by: HashMap<usize, &SilentRank> = silent.iter().map(|s| (s.rank, s)).collect();
    // The ends each waiting rank's waits lead to.
    let mut waited: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    let long = NAMED_AFTER.as_secs_f64();
    for r in ranks
        .iter()
        .filter(|r| !r.waiting_on.is_empty() && r.waiting_for_s >= long)
    {
        let mut seen = vec![r.rank];
        let mut frontier = r.waiting_on.clone();
        let mut ends = Vec::new();
        while let Some(q) = frontier.pop() {
            if seen.contains(&q) {
                continue;
            }
            seen.push(q);
            match by_rank.get(&q) {
                Some(s) if !s.waiting_on.is_empty() => frontier.extend(&s.waiting_on),
                _ => ends.push(q),
            }
        }
        for e in ends {
            waited.entry(e).or_default().push(r.rank);
        }
    }
    for s in silent {
        waited.entry(s.rank).or_default();
    }
    let call_of = |waiters: &[usize]| {
        waiters
            .iter()
            .filter_map(|w| by_rank.get(w)?.call.as_ref())
            .max_by(|a, b| a.for_s.total_cmp(&b.for_s))
            .map(|c| c.describe.clone())
    };
    waited
        .into_iter()
        .map(|(rank, mut by)| {
            by.sort_unstable();
            by.dedup();
            let (host, pid, what) = match (silent_by.get(&rank), by_rank.get(&rank)) {
                (Some(s), _) => (
                    s.host.clone(),
                    s.pid,
                    format!("does not answer: {}", s.reason),
                ),
                (None, Some(r)) => (
                    r.host.clone(),
                    r.pid,
                    match &r.call {
                        Some(c) => format!(
                            "is in {} for {:.2} s, not waiting on anyone",
                            c.describe, c.for_s
                        ),
                        None => format!("is not in a call (idle after collective #{})", r.finished),
                    },
                ),
                (None, None) => (String::new(), 0, "was not asked".into()),
            };
            Culprit {
                rank,
                host,
                pid,
                what,
                call: call_of(&by),
                waited_on_by: by,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rank(r: usize, waiting_on: &[usize], call: Option<(&str, f64)>) -> RankStatus {
        RankStatus {
            rank: r,
            host: format!("h{}", r / 2),
            pid: 100 + r as u32,
            call: call.map(|(d, s)| CallStatus {
                collective: "all_reduce".into(),
                seq: 7,
                count: 16,
                dtype: "float".into(),
                describe: d.into(),
                for_s: s,
            }),
            waiting_on: waiting_on.to_vec(),
            waiting_for_s: if waiting_on.is_empty() { 0.0 } else { 1.0 },
            ..RankStatus::default()
        }
    }

    #[test]
    fn waits_are_followed_to_the_rank_that_holds_the_ring_up() {
        // A ring stopped at rank 2: 3 waits on 2, 0 on 3, 1 on 0; rank 2 is silent.
        let ar = Some(("all_reduce #7", 1.5));
        let ranks = vec![rank(0, &[3], ar), rank(1, &[0], ar), rank(3, &[2], ar)];
        let silent = vec![SilentRank {
            rank: 2,
            host: "h1".into(),
            pid: 102,
            reason: "does not answer (timed out)".into(),
        }];
        let c = holding_up(&ranks, &silent);
        assert_eq!(c.len(), 1, "{c:?}");
        assert_eq!(c[0].rank, 2);
        assert_eq!(c[0].waited_on_by, vec![0, 1, 3]);
        assert_eq!(c[0].call.as_deref(), Some("all_reduce #7"));
        assert!(c[0].what.contains("does not answer"));
    }

    #[test]
    fn a_rank_still_computing_is_named_and_a_healthy_job_names_no_one() {
        let ranks = vec![
            rank(0, &[1], Some(("all_reduce #7", 0.4))),
            rank(1, &[], None),
            rank(2, &[0, 1], Some(("all_reduce #7", 0.4))),
        ];
        let c = holding_up(&ranks, &[]);
        assert_eq!(c.len(), 1, "{c:?}");
        assert_eq!((c[0].rank, c[0].waited_on_by.clone()), (1, vec![0, 2]));
        assert!(c[0].what.contains("not in a call"), "{}", c[0].what);
        let busy = vec![rank(0, &[], Some(("x", 0.0))), rank(1, &[], None)];
        assert!(holding_up(&busy, &[]).is_empty());
        // A wait shorter than NAMED_AFTER is a healthy job's.
        let mut brief = rank(0, &[1], Some(("x", 0.001)));
        brief.waiting_for_s = 0.001;
        assert!(holding_up(&[brief, rank(1, &[], None)], &[]).is_empty());
    }

    #[test]
    fn the_text_groups_ranks_and_names_the_culprit() {
        let ar = Some(("all_reduce #7 (float, sum, 16 elements; ring)", 1.5));
        let part = StatusPart {
            ranks: vec![rank(3, &[2], ar), rank(0, &[2], ar), rank(1, &[2], ar)],
            silent: vec![SilentRank {
                rank: 2,
                host: "h1".into(),
                pid: 102,
                reason: "does not answer (timed out)".into(),
            }],
            unasked: 0,
        };
        let s = JobStatus::from_part(
            "c".into(),
            4,
            Some("1.2.3.4:5".into()),
            part,
            Duration::ZERO,
        );
        let text = s.render_text();
        assert!(
            text.contains("ranks 0-1,3 on h0, h1: in all_reduce #7"),
            "{text}"
        );
        assert!(
            text.contains("holding up the job: rank 2 (host h1, pid 102)"),
            "{text}"
        );
        assert!(
            text.contains("ranks 0-1,3 wait on it in all_reduce #7"),
            "{text}"
        );
        let json = serde_json::to_string(&s).unwrap();
        let back: JobStatus = serde_json::from_str(&json).unwrap();
        assert_eq!(back.holding_up, s.holding_up);
    }
}
