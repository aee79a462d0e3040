//! A status client outside the job: it learns where ranks listen from the job's bootstrap
//! root, then sweeps the rank tree from the top as a rank would.

use super::{JobStatus, MOST_TIME, ask_at, silent_part, unasked_part};
use crate::bootstrap::tree_children;
use crate::diagnosis::fraction_of;
use crate::diagnosis::{TreeQuestion, sweep};
use crate::error::{Error, Result};
use crate::wire::{self, Located, Msg, Retry, Secret, StatusPart, connect_authenticated};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

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

impl TreeQuestion for Client {
    type Answer = StatusPart;

    fn nranks(&self) -> usize {
        self.nranks
    }

    fn me(&self) -> Option<usize> {
        None
    }

    fn own(&self) -> StatusPart {
        StatusPart::default()
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

    fn silent(&self, node: usize, reason: String) -> StatusPart {
        let who = self
            .located(node)
            .map_or((String::new(), 0), |l| (l.host, l.pid));
        silent_part(node, who, reason)
    }

    fn unasked(&self, ranks: usize) -> StatusPart {
        unasked_part(ranks)
    }

    fn merge(&self, into: &mut StatusPart, part: StatusPart) {
        into.merge(part);
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
        let text = e.to_string();
        let why = if wire::is_refused(&e) || text.contains("secret") {
            "it is open while rank 0 of a job started from the launcher's variables (or \
             `collbench --np` with STRATA_ROOT) runs; check STRATA_ROOT, MASTER_ADDR with \
             STRATA_PORT or MASTER_PORT, and the job's secret"
        } else {
            "something listens there but did not answer: where rank 0 keeps the root, rank 0 \
             may be stopped or hung"
        };
        Error::Transport(format!(
            "no answer from the job's bootstrap root at {root}: {text} ({why})"
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
