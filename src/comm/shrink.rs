//! Shrinking: the lowest survivor gathers every survivor's place in the new communicator
//! through its listener of the old one, which outlives faults.

use crate::config::Config;
use crate::error::{Error, Result};
use crate::wire::{
    self, ConnectKind, Handler, Incoming, Msg, PeerInfo, Secret, open_request, peer_failed, refuse,
};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// The survivors of one shrink that have arrived so far.
#[derive(Default)]
struct ShrinkTable {
    expected: usize,
    infos: BTreeMap<usize, PeerInfo>,
    /// Survivors that have taken the complete table.
    taken: usize,
}

/// The shrinks this rank gathers as the lowest survivor, by key.
pub(super) struct Shrinks {
    tables: Mutex<HashMap<String, ShrinkTable>>,
    cv: Condvar,
    init_timeout: Duration,
}

impl Shrinks {
    /// No shrink yet; each waits at most `init_timeout` for its survivors.
    pub fn new(init_timeout: Duration) -> Arc<Self> {
        Arc::new(Self {
            tables: Mutex::default(),
            cv: Condvar::new(),
            init_timeout,
        })
    }

    /// The listener's handler for `ConnectKind::Shrink`: a survivor joins, and is answered
    /// with every survivor's place once all have.
    pub fn handler(self: &Arc<Self>) -> Handler {
        let shrinks = self.clone();
        Arc::new(move |incoming: Incoming| {
            let Incoming {
                kind, mut stream, ..
            } = incoming;
            let ConnectKind::Shrink {
                key,
                expected,
                info,
            } = kind
            else {
                return Err(Error::Transport("internal: not a shrink".into()));
            };
            if info.rank >= expected {
                return Err(refuse(
                    &mut stream,
                    format!("shrink {key}: rank {} of {expected}", info.rank),
                ));
            }
            let deadline = Instant::now() + shrinks.init_timeout;
            let reply = match shrinks.join(&key, expected, *info, deadline) {
                Ok(peers) => Msg::Table { peers },
                Err(e) => Msg::Fail {
                    reason: e.to_string(),
                    missing: Vec::new(),
                },
            };
            wire::send_msg(&mut stream, &reply)
        })
    }

    /// Joins shrink `key` as its lowest survivor: adds `info` and waits until `expected`
    /// survivors have (each through its own connection to this rank's listener), or
    /// `deadline`.
    pub fn join(
        &self,
        key: &str,
        expected: usize,
        info: PeerInfo,
        deadline: Instant,
    ) -> Result<Vec<PeerInfo>> {
        let poisoned = || Error::Transport("listener lock poisoned".into());
        let mut tables = self.tables.lock().map_err(|_| poisoned())?;
        let table = tables.entry(key.to_string()).or_default();
        if table.expected == 0 {
            table.expected = expected;
        }
        if table.expected != expected {
            return Err(Error::Mismatch(format!(
                "shrink {key}: one survivor expects {expected} ranks, another {}",
                table.expected
            )));
        }
        table.infos.insert(info.rank, info);
        self.cv.notify_all();
        loop {
            let table = tables.get_mut(key).ok_or_else(poisoned)?;
            if table.infos.len() == table.expected {
                let peers: Vec<PeerInfo> = table.infos.values().cloned().collect();
                table.taken += 1;
                if table.taken == table.expected {
                    tables.remove(key);
                }
                return Ok(peers);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                let missing: Vec<usize> = (0..table.expected)
                    .filter(|r| !table.infos.contains_key(r))
                    .collect();
                return Err(Error::Timeout {
                    op: format!("shrink {key}"),
                    seq: 0,
                    waiting_on: missing,
                    after_s: self.init_timeout.as_secs_f64(),
                    diagnosis: None,
                });
            }
            tables = self
                .cv
                .wait_timeout(tables, left)
                .map_err(|_| poisoned())?
                .0;
        }
    }
}

/// Joins shrink `key` through the lowest survivor `root`'s listener (this rank's `info` is
/// its place in the shrunk communicator) and returns every survivor's.
#[allow(clippy::too_many_arguments)]
pub(super) fn request(
    comm: &str,
    me: usize,
    root: &PeerInfo,
    secret: &Secret,
    cfg: &Config,
    key: &str,
    expected: usize,
    info: PeerInfo,
) -> Result<Vec<PeerInfo>> {
    let gone = |reason: String| peer_failed(root, reason);
    let deadline = Instant::now() + cfg.init_timeout;
    let kind = ConnectKind::Shrink {
        key: key.to_string(),
        expected,
        info: Box::new(info),
    };
    let mut s = open_request(
        comm,
        me,
        root,
        secret,
        deadline,
        cfg.handshake_timeout,
        kind,
    )
    .map_err(|e| {
        gone(format!(
            "the lowest survivor, which gathers the shrink, cannot be reached ({e})"
        ))
    })?;
    s.set_read_timeout(Some(cfg.init_timeout + Duration::from_secs(5)))
        .ok();
    match wire::recv_msg(&mut s) {
        Ok(Msg::Table { peers }) if peers.len() == expected => Ok(peers),
        Ok(Msg::Fail { reason, .. }) => Err(Error::Transport(format!("shrink {key}: {reason}"))),
        Ok(Msg::Nack { reason }) => Err(Error::Transport(format!("shrink {key}: {reason}"))),
        Ok(other) => Err(Error::Transport(format!(
            "shrink {key}: unexpected answer {other:?}"
        ))),
        Err(e) => Err(gone(format!("it did not answer the shrink: {e}"))),
    }
}
