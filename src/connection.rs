//! Connections between two ranks of a communicator: a data path (a [`Transport`]) plus a TCP
//! control stream that carries out-of-band frames (failure notices, goodbyes) and whose loss
//! means the peer is gone.
//!
//! The lower rank of a pair always opens the connection. The higher rank's listener thread
//! authenticates it, builds the data path and parks the finished connection until the owning
//! thread asks for it, so opening a connection never waits for the other rank's thread.

use crate::bootstrap::{self, ConnectKind, Msg, PeerInfo, Secret, TransportSetup};
use crate::config::{Config, TransportPolicy};
use crate::diagnosis::Diagnoser;
use crate::error::{Error, Result};
use crate::transport::Transport;
use crate::transport::rdma::protocol::RdmaTransport;
use crate::transport::ring::{Geometry, HeapMemory, Memory, RingEndpoint, ShmMemory};
use crate::transport::tcp::{TcpTransport, tune_socket};
use crate::watchdog::Health;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Largest control frame.
const MAX_CONTROL_FRAME: usize = 1 << 20;

/// Out-of-band frames on a connection's control stream.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) enum ControlFrame {
    /// The sender failed an operation with `error`; the receiver must fail too, with it.
    Poison { error: Error },
    /// The sender is destroying its communicator; a later EOF is not a failure.
    Goodbye,
}

/// A connection to one peer.
pub(crate) struct Connection {
    pub peer: usize,
    pub data: Box<dyn Transport>,
    pub control: TcpStream,
    control_in: Vec<u8>,
    /// The peer said goodbye.
    pub gone: bool,
    /// Bytes of the current operation's incoming header read so far.
    pub hdr_in: Vec<u8>,
}

impl Connection {
    fn new(peer: usize, data: Box<dyn Transport>, control: TcpStream) -> Result<Self> {
        control
            .set_nonblocking(true)
            .map_err(|e| Error::io("control stream", e))?;
        control.set_read_timeout(None).ok();
        Ok(Self {
            peer,
            data,
            control,
            control_in: Vec::new(),
            gone: false,
            hdr_in: Vec::new(),
        })
    }

    /// Sends a control frame (best effort: the peer may already be gone).
    pub fn send_control(&mut self, frame: &ControlFrame) {
        let Ok(body) = serde_json::to_vec(frame) else {
            return;
        };
        let mut buf = (body.len() as u32).to_le_bytes().to_vec();
        buf.extend_from_slice(&body);
        let _ = self.control.set_nonblocking(false);
        let _ = self.control.set_write_timeout(Some(Duration::from_secs(1)));
        let _ = self.control.write_all(&buf);
        let _ = self.control.set_nonblocking(true);
    }

    /// Reads whatever control frames have arrived. `Ok(None)` when nothing is pending; an
    /// `Err` when the peer failed or vanished without a goodbye.
    pub fn poll_control(&mut self, peer_info: &PeerInfo) -> Result<Option<ControlFrame>> {
        let mut chunk = [0u8; 4096];
        loop {
            if let Some(frame) = self.take_frame()? {
                if matches!(frame, ControlFrame::Goodbye) {
                    self.gone = true;
                }
                return Ok(Some(frame));
            }
            match self.control.read(&mut chunk) {
                Ok(0) => {
                    if self.gone {
                        return Ok(None);
                    }
                    return Err(Error::PeerFailed {
                        rank: self.peer,
                        host: peer_info.host.hostname.clone(),
                        pid: peer_info.pid,
                        reason: format!(
                            "connection closed without a goodbye (pid {} exited or was killed?)",
                            peer_info.pid
                        ),
                    });
                }
                Ok(n) => self.control_in.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(None),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    if self.gone {
                        return Ok(None);
                    }
                    return Err(Error::PeerFailed {
                        rank: self.peer,
                        host: peer_info.host.hostname.clone(),
                        pid: peer_info.pid,
                        reason: format!("control stream: {e}"),
                    });
                }
            }
        }
    }

    fn take_frame(&mut self) -> Result<Option<ControlFrame>> {
        if self.control_in.len() < 4 {
            return Ok(None);
        }
        let len = u32::from_le_bytes([
            self.control_in[0],
            self.control_in[1],
            self.control_in[2],
            self.control_in[3],
        ]) as usize;
        if len > MAX_CONTROL_FRAME {
            return Err(Error::Transport(format!(
                "rank {} sent a {len}-byte control frame",
                self.peer
            )));
        }
        if self.control_in.len() < 4 + len {
            return Ok(None);
        }
        let frame = serde_json::from_slice(&self.control_in[4..4 + len]).map_err(|e| {
            Error::Transport(format!(
                "rank {} sent a malformed control frame: {e}",
                self.peer
            ))
        });
        self.control_in.drain(..4 + len);
        frame.map(Some)
    }
}

/// Ring segments handed between threads of one process, by key.
fn inproc_registry() -> &'static Mutex<HashMap<String, Arc<HeapMemory>>> {
    static REG: OnceLock<Mutex<HashMap<String, Arc<HeapMemory>>>> = OnceLock::new();
    REG.get_or_init(Default::default)
}

fn random_hex() -> String {
    let mut b = [0u8; 8];
    let _ = getrandom::fill(&mut b);
    b.iter().map(|x| format!("{x:02x}")).collect()
}

struct ListenerShared {
    comm: String,
    rank: usize,
    nranks: usize,
    cfg: Config,
    ready: Mutex<HashMap<usize, Connection>>,
    streams: Mutex<HashMap<(usize, usize), TcpStream>>,
    cv: Condvar,
    /// Watchdog links from the ranks 2^k behind, until the watchdog takes them.
    watchdog_in: Arc<Mutex<Vec<(usize, TcpStream)>>>,
    /// The communicator's health, whose progress answers status queries.
    health: Arc<Health>,
    /// Shrinks this rank gathers as the lowest survivor, by key.
    shrinks: Mutex<HashMap<String, ShrinkTable>>,
    /// Bootstrap tree edges from this rank's parent or children, until init takes them.
    tree_in: Arc<bootstrap::TreeInbox>,
    /// Answers census questions once the communicator is built.
    diagnoser: OnceLock<Arc<Diagnoser>>,
}

/// The survivors of one shrink that have arrived so far.
#[derive(Default)]
struct ShrinkTable {
    expected: usize,
    infos: std::collections::BTreeMap<usize, PeerInfo>,
    /// Survivors that have taken the complete table.
    taken: usize,
}

/// A communicator's listener: accepts, authenticates and builds incoming connections.
pub(crate) struct CommListener {
    shared: Arc<ListenerShared>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl CommListener {
    /// Binds a listener on the configured interface.
    pub fn bind(cfg: &Config) -> Result<TcpListener> {
        let listener = TcpListener::bind(SocketAddr::new(cfg.listen_ip, 0))
            .map_err(|e| Error::io(format!("binding a listener on {}", cfg.listen_ip), e))?;
        bootstrap::deepen_backlog(&listener, 1024);
        Ok(listener)
    }

    /// Starts serving `listener` for communicator `comm`.
    pub fn start(
        listener: TcpListener,
        comm: String,
        rank: usize,
        nranks: usize,
        secret: Secret,
        cfg: &Config,
    ) -> Result<Self> {
        let shared = Arc::new(ListenerShared {
            comm,
            rank,
            nranks,
            cfg: cfg.clone(),
            ready: Mutex::new(HashMap::new()),
            streams: Mutex::new(HashMap::new()),
            cv: Condvar::new(),
            watchdog_in: Arc::new(Mutex::new(Vec::new())),
            health: Arc::new(Health::default()),
            shrinks: Mutex::new(HashMap::new()),
            tree_in: Arc::default(),
            diagnoser: OnceLock::new(),
        });
        let stop = Arc::new(AtomicBool::new(false));
        let sh = shared.clone();
        let handle: Arc<dyn Fn(TcpStream) + Send + Sync> = Arc::new(move |s| {
            if let Err(e) = accept_connection(&sh, s) {
                tracing::warn!(rank = sh.rank, error = %e, "refused an incoming connection");
            }
        });
        let (st, hs) = (stop.clone(), cfg.handshake_timeout);
        let thread = std::thread::Builder::new()
            .name(format!("strata-listen-{rank}"))
            .spawn(move || bootstrap::accept_loop(listener, secret, hs, st, handle))
            .map_err(|e| Error::io("spawning the listener", e))?;
        Ok(Self {
            shared,
            stop,
            thread: Some(thread),
        })
    }

    /// Takes the connection from `peer` if its listener side is complete.
    pub fn take(&self, peer: usize) -> Option<Connection> {
        self.shared.ready.lock().ok()?.remove(&peer)
    }

    /// Every accepted connection no call has taken yet.
    pub fn take_all(&self) -> Vec<Connection> {
        self.shared
            .ready
            .lock()
            .map(|mut ready| ready.drain().map(|(_, c)| c).collect())
            .unwrap_or_default()
    }

    /// Joins shrink `key` as its lowest survivor: adds `info` and waits until `expected`
    /// survivors have (each through its own connection to this listener), or `deadline`.
    pub fn shrink_join(
        &self,
        key: &str,
        expected: usize,
        info: PeerInfo,
        deadline: Instant,
    ) -> Result<Vec<PeerInfo>> {
        shrink_join(&self.shared, key, expected, info, deadline)
    }

    /// The communicator's health (abort flags, fault, progress), shared with its listener.
    pub fn health(&self) -> Arc<Health> {
        self.shared.health.clone()
    }

    /// Where the bootstrap tree edges opened to this rank are handed over.
    pub fn tree_inbox(&self) -> Arc<bootstrap::TreeInbox> {
        self.shared.tree_in.clone()
    }

    /// Lets the listener answer census questions (see `diagnosis`).
    pub fn set_diagnoser(&self, diagnoser: Arc<Diagnoser>) {
        let _ = self.shared.diagnoser.set(diagnoser);
    }

    /// The communicator id this listener serves.
    pub fn comm(&self) -> &str {
        &self.shared.comm
    }

    /// Where the watchdog links from the ranks 2^k behind are handed over.
    pub fn watchdog_inbox(&self) -> Arc<Mutex<Vec<(usize, TcpStream)>>> {
        self.shared.watchdog_in.clone()
    }

    /// Waits up to `d` for any new connection.
    pub fn wait(&self, d: Duration) {
        if let Ok(g) = self.shared.ready.lock() {
            let _ = self.shared.cv.wait_timeout(g, d);
        }
    }
}

impl Drop for CommListener {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn accept_connection(sh: &ListenerShared, mut s: TcpStream) -> Result<()> {
    let msg = bootstrap::recv_msg(&mut s)?;
    let Msg::Connect {
        comm,
        from,
        to,
        kind,
    } = msg
    else {
        return Err(Error::Transport("expected a Connect frame".into()));
    };
    let refuse = |s: &mut TcpStream, reason: String| -> Result<()> {
        let _ = bootstrap::send_msg(
            s,
            &Msg::Nack {
                reason: reason.clone(),
            },
        );
        Err(Error::Transport(reason))
    };
    if matches!(kind, ConnectKind::Probe) && comm == sh.comm && to == sh.rank && from < sh.nranks {
        return bootstrap::send_msg(&mut s, &Msg::Ack);
    }
    if let ConnectKind::Shrink {
        key,
        expected,
        info,
    } = &kind
    {
        if comm != sh.comm || to != sh.rank || from >= sh.nranks || info.rank >= *expected {
            return refuse(
                &mut s,
                format!("shrink for comm {comm} does not belong here"),
            );
        }
        let deadline = Instant::now() + sh.cfg.init_timeout;
        let reply = match shrink_join(sh, key, *expected, info.clone(), deadline) {
            Ok(peers) => Msg::Table { peers },
            Err(e) => Msg::Fail {
                reason: e.to_string(),
                missing: Vec::new(),
            },
        };
        return bootstrap::send_msg(&mut s, &reply);
    }
    if let ConnectKind::Census {
        seq,
        whole_job,
        within_ms,
    } = kind
    {
        if comm != sh.comm || to != sh.rank || from >= sh.nranks {
            return refuse(
                &mut s,
                format!("census for comm {comm} rank {to} does not belong here"),
            );
        }
        let reply = match sh.diagnoser.get() {
            Some(d) => {
                let within = Duration::from_millis(within_ms).min(Duration::from_secs(30));
                Msg::Census(d.census(seq, whole_job, Instant::now() + within))
            }
            // Still in init: this rank's own state is all it can say.
            None => Msg::Status(sh.health.progress()),
        };
        return bootstrap::send_msg(&mut s, &reply);
    }
    if matches!(kind, ConnectKind::Status) {
        if comm != sh.comm || to != sh.rank || from >= sh.nranks {
            return refuse(
                &mut s,
                format!("status query for comm {comm} rank {to} does not belong here"),
            );
        }
        return bootstrap::send_msg(&mut s, &Msg::Status(sh.health.progress()));
    }
    if matches!(kind, ConnectKind::Tree) {
        let neighbour = bootstrap::tree_parent(sh.rank) == Some(from)
            || bootstrap::tree_children(sh.rank, sh.nranks).contains(&from);
        if comm != sh.comm || to != sh.rank || !neighbour {
            return refuse(
                &mut s,
                format!(
                    "bootstrap tree edge for comm {comm} rank {from}->{to} does not belong here"
                ),
            );
        }
        let ack = bootstrap::encode_msg(&Msg::Ack)?;
        s.write_all(&ack)
            .map_err(|e| Error::io("bootstrap tree edge", e))?;
        if !sh.tree_in.put(from, s) {
            return Err(Error::Transport(format!(
                "rank {from} opened a second bootstrap tree edge"
            )));
        }
        return Ok(());
    }
    if matches!(kind, ConnectKind::Watchdog) {
        // Only the ranks 2^k behind this one open one (see `watchdog`), once each.
        let sources = crate::watchdog::link_sources(sh.rank, sh.nranks);
        if comm != sh.comm || to != sh.rank || !sources.contains(&from) {
            return refuse(
                &mut s,
                format!("watchdog link for comm {comm} rank {from}->{to} does not belong here"),
            );
        }
        let mut inbox = sh
            .watchdog_in
            .lock()
            .map_err(|_| Error::Transport("listener lock poisoned".into()))?;
        if inbox.iter().any(|(r, _)| *r == from) {
            return refuse(&mut s, format!("rank {from} already has a watchdog link"));
        }
        bootstrap::send_msg(&mut s, &Msg::Ack)?;
        s.set_read_timeout(None).ok();
        inbox.push((from, s));
        return Ok(());
    }
    if comm != sh.comm || to != sh.rank || from >= sh.nranks || from >= to {
        return refuse(
            &mut s,
            format!("connection for comm {comm} rank {from}->{to} does not belong here"),
        );
    }
    match kind {
        ConnectKind::TcpStream { index } => {
            tune_socket(&s, sh.cfg.socket_buffer).map_err(|e| Error::io("socket options", e))?;
            s.set_read_timeout(None).ok();
            let mut m = sh
                .streams
                .lock()
                .map_err(|_| Error::Transport("listener lock poisoned".into()))?;
            m.insert((from, index), s);
            sh.cv.notify_all();
            Ok(())
        }
        ConnectKind::Probe
        | ConnectKind::Census { .. }
        | ConnectKind::Tree
        | ConnectKind::Watchdog
        | ConnectKind::Status
        | ConnectKind::Shrink { .. } => Ok(()),
        ConnectKind::Control { transport } => {
            let mut accepted_rdma = false;
            let data: Box<dyn Transport> = match transport {
                TransportSetup::Tcp { streams, stripe } => {
                    if streams == 0 || streams > 64 {
                        return refuse(&mut s, format!("{streams} streams requested"));
                    }
                    let deadline = Instant::now() + sh.cfg.handshake_timeout;
                    let mut m = sh
                        .streams
                        .lock()
                        .map_err(|_| Error::Transport("listener lock poisoned".into()))?;
                    while (0..streams).any(|i| !m.contains_key(&(from, i))) {
                        let left = deadline.saturating_duration_since(Instant::now());
                        if left.is_zero() {
                            drop(m);
                            return refuse(&mut s, "data streams did not arrive".into());
                        }
                        m = sh
                            .cv
                            .wait_timeout(m, left)
                            .map_err(|_| Error::Transport("listener lock poisoned".into()))?
                            .0;
                    }
                    let list: Vec<TcpStream> =
                        (0..streams).filter_map(|i| m.remove(&(from, i))).collect();
                    drop(m);
                    Box::new(
                        TcpTransport::new(list, stripe)
                            .map_err(|e| Error::io("tcp transport", e))?,
                    )
                }
                TransportSetup::Shm { name } => {
                    if !name.starts_with("/strata-") || name.len() > 200 || name[1..].contains('/')
                    {
                        return refuse(&mut s, "bad segment name".into());
                    }
                    let mem = ShmMemory::open(&name)
                        .map_err(|e| Error::io(format!("opening {name}"), e))?;
                    Box::new(
                        RingEndpoint::attach(Arc::new(mem), "shm")
                            .map_err(|e| Error::io("shm ring", e))?,
                    )
                }
                TransportSetup::Rdma(theirs) => {
                    let opened = RdmaTransport::accept(&theirs, &sh.cfg.rdma);
                    let t = match opened {
                        Ok(t) => t,
                        Err(e) => {
                            return refuse(&mut s, format!("{}: {e}", theirs.provider.name()));
                        }
                    };
                    bootstrap::send_msg(&mut s, &Msg::RdmaAccept(t.setup()))?;
                    accepted_rdma = true;
                    Box::new(t)
                }
                TransportSetup::InProcess { key } => {
                    let mem = inproc_registry()
                        .lock()
                        .ok()
                        .and_then(|mut r| r.remove(&key));
                    let Some(mem) = mem else {
                        return refuse(&mut s, "unknown in-process segment".into());
                    };
                    let mem: Arc<dyn Memory> = mem;
                    Box::new(
                        RingEndpoint::attach(mem, "inproc")
                            .map_err(|e| Error::io("inproc ring", e))?,
                    )
                }
            };
            if !accepted_rdma {
                bootstrap::send_msg(&mut s, &Msg::Ack)?;
            }
            let conn = Connection::new(from, data, s)?;
            let mut ready = sh
                .ready
                .lock()
                .map_err(|_| Error::Transport("listener lock poisoned".into()))?;
            ready.insert(from, conn);
            sh.cv.notify_all();
            Ok(())
        }
    }
}

fn shrink_join(
    sh: &ListenerShared,
    key: &str,
    expected: usize,
    info: PeerInfo,
    deadline: Instant,
) -> Result<Vec<PeerInfo>> {
    let poisoned = || Error::Transport("listener lock poisoned".into());
    let mut tables = sh.shrinks.lock().map_err(|_| poisoned())?;
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
    sh.cv.notify_all();
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
                after_s: sh.cfg.init_timeout.as_secs_f64(),
                diagnosis: None,
            });
        }
        tables = sh.cv.wait_timeout(tables, left).map_err(|_| poisoned())?.0;
    }
}

/// Joins shrink `key` through the lowest survivor `root`'s listener (this rank's `info` is
/// its place in the shrunk communicator) and returns every survivor's.
#[allow(clippy::too_many_arguments)]
pub(crate) fn shrink_request(
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
        info,
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
    match bootstrap::recv_msg(&mut s) {
        Ok(Msg::Table { peers }) if peers.len() == expected => Ok(peers),
        Ok(Msg::Fail { reason, .. }) => Err(Error::Transport(format!("shrink {key}: {reason}"))),
        Ok(Msg::Nack { reason }) => Err(Error::Transport(format!("shrink {key}: {reason}"))),
        Ok(other) => Err(Error::Transport(format!(
            "shrink {key}: unexpected answer {other:?}"
        ))),
        Err(e) => Err(gone(format!("it did not answer the shrink: {e}"))),
    }
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

/// Opens an authenticated connection to `peer`'s listener for communicator `comm` and asks
/// it for `kind`; reading the answer is the caller's part.
pub(crate) fn open_request(
    comm: &str,
    from: usize,
    peer: &PeerInfo,
    secret: &Secret,
    deadline: Instant,
    handshake_timeout: Duration,
    kind: ConnectKind,
) -> Result<TcpStream> {
    let mut s =
        bootstrap::connect_authenticated(peer.listen, secret, deadline, handshake_timeout, false)?;
    bootstrap::send_msg(
        &mut s,
        &Msg::Connect {
            comm: comm.to_string(),
            from,
            to: peer.rank,
            kind,
        },
    )?;
    Ok(s)
}

/// Checks that `peer`'s listener still answers for this communicator; `PeerFailed` if not.
pub(crate) fn probe(
    comm: &str,
    me: &PeerInfo,
    peer: &PeerInfo,
    secret: &Secret,
    cfg: &Config,
) -> Result<()> {
    let gone = |reason: String| peer_failed(peer, reason);
    let deadline = Instant::now() + cfg.handshake_timeout;
    let hs = cfg.handshake_timeout;
    let mut s = open_request(
        comm,
        me.rank,
        peer,
        secret,
        deadline,
        hs,
        ConnectKind::Probe,
    )
    .map_err(|e| {
        gone(format!(
            "its listener at {} cannot be reached ({e}); it has exited or destroyed its \
                 communicator",
            peer.listen
        ))
    })?;
    s.set_read_timeout(Some(cfg.handshake_timeout)).ok();
    match bootstrap::recv_msg(&mut s) {
        Ok(Msg::Ack) => Ok(()),
        Ok(other) => Err(gone(format!(
            "its listener answered a probe with {other:?}"
        ))),
        Err(e) => Err(gone(format!("its listener did not answer a probe: {e}"))),
    }
}

/// Opens a connection from `me` to the higher rank `peer`, choosing the transport by where
/// the two ranks live.
pub(crate) fn connect(
    comm: &str,
    me: &PeerInfo,
    peer: &PeerInfo,
    secret: &Secret,
    cfg: &Config,
    deadline: Instant,
) -> Result<Connection> {
    let same_host = me.host.same_host(&peer.host);
    let hs = cfg.handshake_timeout;
    let open = || {
        bootstrap::connect_authenticated(peer.listen, secret, deadline, hs, false).map_err(|e| Error::PeerFailed {
            rank: peer.rank,
            host: peer.host.hostname.clone(),
            pid: peer.pid,
            reason: format!("its listener at {} cannot be reached ({e}); it has exited or destroyed its communicator", peer.listen),
        })
    };
    let connect_msg = |kind| Msg::Connect {
        comm: comm.to_string(),
        from: me.rank,
        to: peer.rank,
        kind,
    };
    let mut shm_mem: Option<Arc<ShmMemory>> = None;
    let geo = Geometry {
        slots: cfg.shm_slots,
        slot_size: cfg.shm_slot_size,
    };
    let rdma = crate::transport::rdma::choose(cfg.transport, &me.rdma, &peer.rdma, same_host);
    // An RDMA transport is finished with the peer's half of its setup, from the reply.
    let mut rdma_half: Option<RdmaTransport> = None;
    let (setup, data): (TransportSetup, Option<Box<dyn Transport>>) = if let Some(kind) = rdma {
        let fabric = crate::transport::rdma::open(kind, &cfg.rdma)
            .map_err(|e| Error::Unsupported(format!("{}: {e}", kind.name())))?;
        let t = RdmaTransport::from_config(fabric, &cfg.rdma)
            .map_err(|e| Error::io(format!("{} transport", kind.name()), e))?;
        let setup = TransportSetup::Rdma(t.setup());
        rdma_half = Some(t);
        (setup, None)
    } else if cfg.transport == TransportPolicy::Tcp || !same_host {
        let mut streams = Vec::with_capacity(cfg.tcp_streams);
        for index in 0..cfg.tcp_streams {
            let mut s = open()?;
            tune_socket(&s, cfg.socket_buffer).map_err(|e| Error::io("socket options", e))?;
            bootstrap::send_msg(&mut s, &connect_msg(ConnectKind::TcpStream { index }))?;
            streams.push(s);
        }
        let t = TcpTransport::new(streams, cfg.tcp_stripe)
            .map_err(|e| Error::io("tcp transport", e))?;
        (
            TransportSetup::Tcp {
                streams: cfg.tcp_streams,
                stripe: cfg.tcp_stripe,
            },
            Some(Box::new(t)),
        )
    } else if me.process == peer.process {
        let mem = Arc::new(
            HeapMemory::new(geo.segment_bytes()).map_err(|e| Error::io("ring allocation", e))?,
        );
        let ep = RingEndpoint::create(mem.clone(), geo, "inproc")
            .map_err(|e| Error::io("inproc ring", e))?;
        let key = format!("{comm}-{}-{}-{}", me.rank, peer.rank, random_hex());
        inproc_registry()
            .lock()
            .map_err(|_| Error::Transport("registry lock poisoned".into()))?
            .insert(key.clone(), mem);
        (TransportSetup::InProcess { key }, Some(Box::new(ep)))
    } else {
        let name = format!("/strata-{}-{}", std::process::id(), random_hex());
        let mem = Arc::new(
            ShmMemory::create(&name, geo.segment_bytes())
                .map_err(|e| Error::io(format!("creating {name}"), e))?,
        );
        let ep =
            RingEndpoint::create(mem.clone(), geo, "shm").map_err(|e| Error::io("shm ring", e))?;
        shm_mem = Some(mem);
        (TransportSetup::Shm { name }, Some(Box::new(ep)))
    };
    let mut control = open()?;
    bootstrap::send_msg(
        &mut control,
        &connect_msg(ConnectKind::Control {
            transport: setup.clone(),
        }),
    )?;
    // The listener's side of the setup is bounded by the handshake timeout, so a reply that
    // has not come by then never will (a stopped or wedged peer).
    let reply_wait = cfg
        .handshake_timeout
        .min(deadline.saturating_duration_since(Instant::now()));
    control
        .set_read_timeout(Some(reply_wait.max(Duration::from_millis(10))))
        .ok();
    let reply = bootstrap::recv_msg(&mut control);
    if let TransportSetup::InProcess { key } = &setup {
        // Whatever happened, the listener took the segment or never will.
        if let Ok(mut r) = inproc_registry().lock() {
            r.remove(key);
        }
    }
    // Both sides have the segment mapped (or the peer failed); the name is no longer needed.
    if let Some(m) = &shm_mem {
        m.unlink();
    }
    match (reply?, data, rdma_half) {
        (Msg::Ack, Some(data), None) => Connection::new(peer.rank, data, control),
        (Msg::RdmaAccept(theirs), None, Some(mut t)) => {
            t.connect(&theirs, true).map_err(|e| {
                peer_failed(
                    peer,
                    format!(
                        "connecting to its {} ({}) failed: {e}",
                        theirs.provider.name(),
                        theirs.device
                    ),
                )
            })?;
            Connection::new(peer.rank, Box::new(t), control)
        }
        (Msg::Nack { reason }, ..) => Err(Error::Transport(format!(
            "rank {} refused the connection: {reason}",
            peer.rank
        ))),
        (other, ..) => Err(Error::Transport(format!("unexpected reply {other:?}"))),
    }
}
