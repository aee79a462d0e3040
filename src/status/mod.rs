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

mod client;
mod view;

pub(crate) use client::ask_job;
pub use view::{Culprit, JobStatus};

use crate::bootstrap::tree_children;
use crate::diagnosis::{fraction_of, subtree_size};
use crate::error::Error;
use crate::watchdog::Health;
use crate::wire::{
    self, CallStatus, ConnectKind, Handler, Incoming, Msg, PeerInfo, RankStatus, Retry, Secret,
    SilentRank, StatusPart, connect_authenticated,
};
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// The longest a status question may take, however long its asker allows.
const MOST_TIME: Duration = Duration::from_secs(30);

/// The shortest wait that names the rank waited on as holding the job up: shorter waits are
/// a healthy job's (a rank a few microseconds behind its peer in every call).
pub const NAMED_AFTER: Duration = Duration::from_millis(250);

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
