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

use crate::diagnosis::{Directory, TreeQuestion, sweep};
use crate::error::Error;
use crate::wire::{
    self, CallStatus, ConnectKind, Handler, Incoming, Msg, RankStatus, Retry, Secret, SilentRank,
    StatusPart, connect_authenticated,
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
    dir: Arc<Directory>,
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
        let part = sweep(&**source, source.dir.rank, until);
        wire::send_msg(&mut stream, &Msg::StatusPart(part))
    })
}

impl StatusSource {
    pub(crate) fn new(dir: Arc<Directory>) -> Self {
        Self {
            dir,
            job: job_id_from_env(),
        }
    }

    /// What this rank says about itself now.
    fn own_status(&self) -> RankStatus {
        let dir = &*self.dir;
        let me = &dir.peers[dir.rank];
        let progress = dir.health.progress();
        let call = dir.health.current_call().map(|(h, ran)| CallStatus {
            collective: h.collective.to_string(),
            seq: h.call_seq(),
            count: h.count,
            dtype: h.dtype.to_string(),
            describe: h.describe(),
            for_s: ran.as_secs_f64(),
        });
        let (waiting_on, waiting_for) = if call.is_some() {
            dir.health.waits.read()
        } else {
            (Vec::new(), Duration::ZERO)
        };
        RankStatus {
            rank: dir.rank,
            host: me.host.hostname.clone(),
            pid: me.pid,
            started: progress.started,
            finished: progress.finished,
            call,
            waiting_on,
            waiting_for_s: waiting_for.as_secs_f64(),
            stragglers: dir.health.stragglers().iter().map(|s| s.rank).collect(),
            stall_share: dir.health.own_stall_share(),
            fault: dir.health.fault().map(|e| e.to_string()),
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
            self.dir.comm.clone(),
            self.dir.peers.len(),
            root,
            part,
            started.elapsed(),
        )
    }
}

/// The part that names `node`, on `host` as process `pid`, silent for `reason`.
fn silent_part(node: usize, (host, pid): (String, u32), reason: String) -> StatusPart {
    StatusPart {
        silent: vec![SilentRank {
            rank: node,
            host,
            pid,
            reason,
        }],
        ..StatusPart::default()
    }
}

/// The part for `ranks` ranks left unasked.
fn unasked_part(ranks: usize) -> StatusPart {
    StatusPart {
        unasked: ranks,
        ..StatusPart::default()
    }
}

impl TreeQuestion for StatusSource {
    type Answer = StatusPart;

    fn nranks(&self) -> usize {
        self.dir.peers.len()
    }

    fn me(&self) -> Option<usize> {
        Some(self.dir.rank)
    }

    fn own(&self) -> StatusPart {
        StatusPart {
            ranks: vec![self.own_status()],
            ..StatusPart::default()
        }
    }

    fn ask(&self, node: usize, until: Instant) -> std::result::Result<StatusPart, String> {
        let dir = &*self.dir;
        ask_at(
            &dir.comm,
            &dir.peers[node].listen,
            node,
            &dir.secret,
            dir.handshake_timeout,
            until,
        )
    }

    fn silent(&self, node: usize, reason: String) -> StatusPart {
        let p = &self.dir.peers[node];
        silent_part(node, (p.host.hostname.clone(), p.pid), reason)
    }

    fn unasked(&self, ranks: usize) -> StatusPart {
        unasked_part(ranks)
    }

    fn merge(&self, into: &mut StatusPart, part: StatusPart) {
        into.merge(part);
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
