//! The records that cross the wire between ranks, at the bottom of the runtime: bootstrap and
//! connection-setup messages ([`Msg`], [`ConnectKind`], [`TransportSetup`]), the control
//! frames of a connection, the operation header, and the progress and census records the
//! watchdog and the diagnosis exchange. Everything above (the bootstrap, the transports, the
//! listener, the watchdog, the diagnosis, the executor) imports them from here, so none of
//! those imports another for a record. Frames are length-prefixed JSON and bounded, so nothing
//! a stranger sends can make strata allocate without limit; [`auth`] makes sure a stranger
//! never gets that far.

mod auth;
mod census;
mod header;
mod peer;
mod progress;
mod status;

pub(crate) use auth::{
    ROOT_GONE, Retry, Secret, accept_loop, connect_authenticated, deepen_backlog,
    is_out_of_descriptors, is_refused, open_request, random_bytes, unreachable_cause,
};
pub(crate) use census::Census;
#[cfg(test)]
pub(crate) use census::MAX_NAMED;
pub(crate) use header::{
    HEADER_BYTES, Header, STALL_BYTES, same_call_bytes, set_stall_share, stall_share_of,
};
pub(crate) use peer::process_nonce;
pub use peer::{HostProbe, PeerInfo};
pub use progress::Progress;
pub use status::{CallStatus, Located, RankStatus, SilentRank, StatusPart};

use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;

/// Largest frame accepted from an authenticated peer.
pub(crate) const MAX_FRAME: usize = 64 << 20;

/// Messages of the bootstrap and connection-setup protocols.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) enum Msg {
    /// rank → root (the directory): I am here, and my listener is at `info.listen`.
    Hello {
        rank: usize,
        nranks: usize,
        info: PeerInfo,
    },
    /// root → rank: the listeners of its tree neighbours that registered before it; the rank
    /// connects to these, the others connect to it.
    Joined {
        parent: Option<(usize, SocketAddr)>,
        children: Vec<(usize, SocketAddr)>,
    },
    /// rank → root: which ranks have not registered? Answered with the standing `Verdict`
    /// if a rank posted one, else `Fail` listing the ranks not registered yet.
    Missing,
    /// rank → root: init failed for this reason (the first posted stands); answered with the
    /// standing verdict, so every rank that asks names the same ranks.
    Verdict { reason: String, missing: Vec<usize> },
    /// rank 0 → root: the table has gone down the tree; the directory may close.
    Done,
    /// child → parent in the bootstrap tree: the descriptions of the child's whole subtree.
    Subtree { peers: Vec<PeerInfo> },
    /// Down the bootstrap tree (and from a shrink's gatherer): everybody is here.
    Table { peers: Vec<PeerInfo> },
    /// Init failed: from the directory, or flooded over the bootstrap tree.
    Fail { reason: String, missing: Vec<usize> },
    /// Opens a connection to a rank's listener.
    Connect {
        comm: String,
        from: usize,
        to: usize,
        kind: ConnectKind,
    },
    /// Connection set up.
    Ack,
    /// Connection refused, with the reason.
    Nack { reason: String },
    /// A data connection set up on the listener's side: what its transport's accepting half
    /// tells the connecting half (`null` when nothing: shared memory, TCP).
    Accepted(serde_json::Value),
    /// A rank's answer to `ConnectKind::Status`: what it is doing.
    Status(Progress),
    /// A rank's answer to `ConnectKind::Census`.
    Census(Census),
    /// client → a job's bootstrap root, after init: who are these ranks and where do they
    /// listen (`collbench status`)? Answered with `Located`.
    Locate { ranks: Vec<usize> },
    /// The root's answer to `Locate`: the job's size and the ranks asked for.
    Located { nranks: usize, ranks: Vec<Located> },
    /// A rank's answer to `ConnectKind::JobStatus`: its subtree's view.
    StatusPart(StatusPart),
}

/// What a new connection to a listener is for.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) enum ConnectKind {
    /// Side stream `index` of a data connection whose transport opens streams of its own
    /// before the control stream (TCP's data streams); the listener keeps it for that
    /// transport's accepting half.
    Stream { transport: String, index: usize },
    /// The control stream of a data connection, sent last, saying which transport it uses and
    /// how the connecting side set it up.
    Control { transport: TransportSetup },
    /// Are you still there? Answered with `Ack`; nothing is set up.
    Probe,
    /// A watchdog link from a rank 2^k behind (see `watchdog`).
    Watchdog,
    /// A bootstrap tree edge from the rank's parent or child that registered after it.
    Tree,
    /// What are you doing? Answered with `Msg::Status`.
    Status,
    /// Where do the ranks stand with call `seq`: the whole job, or the asked rank's subtree
    /// (diagnosing a timeout, see `diagnosis`)? Answered with `Msg::Census` within
    /// `within_ms`.
    Census {
        seq: u64,
        whole_job: bool,
        within_ms: u64,
    },
    /// What is every rank of your subtree doing (`collbench status`)? Answered with
    /// `Msg::StatusPart` within `within_ms`.
    JobStatus { within_ms: u64 },
    /// A survivor joins shrink `key` of `expected` ranks, sent to the lowest survivor's
    /// listener; answered with `Msg::Table` (every survivor's `info`) or `Msg::Fail`.
    Shrink {
        key: String,
        expected: usize,
        info: Box<PeerInfo>,
    },
}

/// The kinds of [`ConnectKind`] without their contents: what a listener routes on. Each is
/// served by the module that owns it, which registers a handler for it with the listener.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Route {
    /// [`ConnectKind::Stream`]: the connection layer.
    Stream,
    /// [`ConnectKind::Control`]: the connection layer.
    Control,
    /// [`ConnectKind::Probe`]: the connection layer.
    Probe,
    /// [`ConnectKind::Watchdog`]: the watchdog.
    Watchdog,
    /// [`ConnectKind::Tree`]: the bootstrap.
    Tree,
    /// [`ConnectKind::Status`]: the watchdog.
    Status,
    /// [`ConnectKind::Census`]: the diagnosis.
    Census,
    /// [`ConnectKind::JobStatus`]: the live view.
    JobStatus,
    /// [`ConnectKind::Shrink`]: the communicator's membership.
    Shrink,
}

impl ConnectKind {
    /// Where a listener sends it.
    pub fn route(&self) -> Route {
        match self {
            ConnectKind::Stream { .. } => Route::Stream,
            ConnectKind::Control { .. } => Route::Control,
            ConnectKind::Probe => Route::Probe,
            ConnectKind::Watchdog => Route::Watchdog,
            ConnectKind::Tree => Route::Tree,
            ConnectKind::Status => Route::Status,
            ConnectKind::Census { .. } => Route::Census,
            ConnectKind::JobStatus { .. } => Route::JobStatus,
            ConnectKind::Shrink { .. } => Route::Shrink,
        }
    }
}

impl Route {
    /// What the connection is, for messages: `watchdog link`, `census`.
    pub fn describe(self) -> &'static str {
        match self {
            Route::Stream => "data stream",
            Route::Control => "connection",
            Route::Probe => "probe",
            Route::Watchdog => "watchdog link",
            Route::Tree => "bootstrap tree edge",
            Route::Status => "status query",
            Route::Census => "census",
            Route::JobStatus => "status view",
            Route::Shrink => "shrink",
        }
    }
}

/// How the connecting side built the data path of a new connection: the transport's name in
/// the transport table and what its connecting half says to the accepting half (opaque here;
/// each transport reads its own).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct TransportSetup {
    /// The transport's name (`shm`, `inproc`, `tcp`, `rdma`).
    pub transport: String,
    /// The transport's own setup record.
    pub setup: serde_json::Value,
}

/// Out-of-band frames on a connection's control stream.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) enum ControlFrame {
    /// The sender failed an operation with `error`; the receiver must fail too, with it.
    Poison { error: Error },
    /// The sender is destroying its communicator; a later EOF is not a failure.
    Goodbye,
}

/// One length-prefixed JSON frame, for sending to several peers.
pub(crate) fn encode_msg(msg: &Msg) -> Result<Vec<u8>> {
    let body = serde_json::to_vec(msg).map_err(|e| Error::Transport(format!("encoding: {e}")))?;
    if body.len() > MAX_FRAME {
        return Err(Error::Transport(format!(
            "a bootstrap frame of {} bytes exceeds the {MAX_FRAME}-byte limit",
            body.len()
        )));
    }
    let mut frame = Vec::with_capacity(4 + body.len());
    frame.extend_from_slice(&(body.len() as u32).to_le_bytes());
    frame.extend_from_slice(&body);
    Ok(frame)
}

/// Writes one length-prefixed JSON frame.
pub(crate) fn send_msg(s: &mut TcpStream, msg: &Msg) -> Result<()> {
    s.write_all(&encode_msg(msg)?)
        .map_err(|e| Error::io("bootstrap send", e))
}

/// Reads one frame; lengths above [`MAX_FRAME`] are rejected before allocating.
pub(crate) fn recv_msg(s: &mut TcpStream) -> Result<Msg> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len)
        .map_err(|e| Error::io("bootstrap receive", e))?;
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(Error::Transport(format!(
            "frame of {len} bytes exceeds the {MAX_FRAME}-byte limit"
        )));
    }
    let mut body = vec![0u8; len];
    s.read_exact(&mut body)
        .map_err(|e| Error::io("bootstrap receive", e))?;
    serde_json::from_slice(&body)
        .map_err(|e| Error::Transport(format!("malformed bootstrap frame: {e}")))
}

/// One incoming connection as a listener hands it to the module that serves its kind:
/// authenticated, and checked to be for the listener's communicator and rank, from one of its
/// ranks.
pub(crate) struct Incoming {
    /// The rank that opened it.
    pub from: usize,
    /// What it is for.
    pub kind: ConnectKind,
    /// The stream, for the handler to answer on (or keep).
    pub stream: TcpStream,
}

/// Serves one kind of incoming connection; an error is logged (the handler tells the other
/// side what it needs to know).
pub(crate) type Handler = Arc<dyn Fn(Incoming) -> Result<()> + Send + Sync>;

/// Refuses a connection: tells the other side why (best effort) and returns the reason as the
/// error to log.
pub(crate) fn refuse(s: &mut TcpStream, reason: String) -> Error {
    let _ = send_msg(
        s,
        &Msg::Nack {
            reason: reason.clone(),
        },
    );
    Error::Transport(reason)
}

/// `PeerFailed` naming `peer`.
pub(crate) fn peer_failed(peer: &PeerInfo, reason: String) -> Error {
    Error::PeerFailed {
        rank: peer.rank,
        host: peer.host.hostname.clone(),
        pid: peer.pid,
        reason,
    }
}
