//! Bootstrap: the unique id, authenticated connections, the root rendezvous and the
//! per-communicator listener.
//!
//! Every TCP connection strata accepts — to the root or to a rank's listener — must first prove
//! it holds the job's 128-bit secret (a mutual challenge-response keyed by the secret), before
//! a single byte of a frame is read. A connection that fails is logged and closed; the listener
//! carries on. Frames are length-prefixed and bounded, so nothing a stranger sends can make
//! strata allocate without limit.

use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use strata_topology::HostIdentity;

mod tree;
pub use tree::{TREE_FANOUT, directory_registration_time, tree_depth};
pub(crate) use tree::{TreeInbox, rendezvous, tree_children, tree_parent};

/// Bytes in a [`UniqueId`], as in `ncclUniqueId`.
pub const UNIQUE_ID_BYTES: usize = 128;
const ID_MAGIC: &[u8; 8] = b"STRATAID";
const HS_MAGIC: &[u8; 8] = b"STRATAHS";
/// Largest frame accepted from an authenticated peer.
pub(crate) const MAX_FRAME: usize = 64 << 20;
/// Most handshakes the listener runs at once; extra connections are closed.
const MAX_PENDING_HANDSHAKES: usize = 64;

/// The token every rank of a job needs to join it: a magic, the root's address and a fresh
/// random secret. Opaque 128 bytes, like `ncclUniqueId`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct UniqueId {
    bytes: [u8; UNIQUE_ID_BYTES],
}

impl std::fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the secret.
        write!(f, "UniqueId(root {})", self.root_addr())
    }
}

/// The job secret.
pub(crate) type Secret = [u8; 16];

fn random_bytes<const N: usize>() -> Result<[u8; N]> {
    let mut b = [0u8; N];
    getrandom::fill(&mut b).map_err(|e| Error::Transport(format!("no randomness: {e}")))?;
    Ok(b)
}

impl UniqueId {
    /// Creates an id and starts the rendezvous root in this process, listening on the
    /// configured interface (like `ncclGetUniqueId`). The root serves one communicator and
    /// exits when it is built or when the init deadline runs out.
    pub fn new() -> Result<Self> {
        let cfg = crate::Config::from_env()?;
        Self::serve(
            SocketAddr::new(cfg.listen_ip, 0),
            random_bytes()?,
            cfg.init_timeout,
        )
    }

    /// Starts a root bound to `addr` with the given secret (used by `from_env` on rank 0).
    pub(crate) fn serve(addr: SocketAddr, secret: Secret, timeout: Duration) -> Result<Self> {
        let listener = TcpListener::bind(addr)
            .map_err(|e| Error::io(format!("binding the bootstrap root to {addr}"), e))?;
        let local = listener
            .local_addr()
            .map_err(|e| Error::io("bootstrap root address", e))?;
        deepen_backlog(&listener, 4096);
        let id = Self::from_parts(local, &secret);
        std::thread::Builder::new()
            .name("strata-root".into())
            .spawn(move || tree::directory_main(listener, secret, timeout))
            .map_err(|e| Error::io("spawning the bootstrap root", e))?;
        Ok(id)
    }

    /// An id naming an existing root.
    pub(crate) fn from_parts(root: SocketAddr, secret: &Secret) -> Self {
        let mut bytes = [0u8; UNIQUE_ID_BYTES];
        bytes[..8].copy_from_slice(ID_MAGIC);
        bytes[8] = 1; // layout version
        match root.ip() {
            IpAddr::V4(ip) => {
                bytes[9] = 4;
                bytes[12..16].copy_from_slice(&ip.octets());
            }
            IpAddr::V6(ip) => {
                bytes[9] = 6;
                bytes[12..28].copy_from_slice(&ip.octets());
            }
        }
        bytes[10..12].copy_from_slice(&root.port().to_be_bytes());
        bytes[28..44].copy_from_slice(secret);
        Self { bytes }
    }

    /// Parses 128 bytes produced by [`UniqueId::as_bytes`].
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        let bytes: [u8; UNIQUE_ID_BYTES] = bytes.try_into().map_err(|_| {
            Error::InvalidArgument(format!(
                "a unique id is {UNIQUE_ID_BYTES} bytes, got {}",
                bytes.len()
            ))
        })?;
        if &bytes[..8] != ID_MAGIC || bytes[8] != 1 || !matches!(bytes[9], 4 | 6) {
            return Err(Error::InvalidArgument(
                "not a strata unique id (bad magic or version)".into(),
            ));
        }
        Ok(Self { bytes })
    }

    /// The opaque bytes.
    pub fn as_bytes(&self) -> &[u8; UNIQUE_ID_BYTES] {
        &self.bytes
    }

    /// The id as 256 hex digits, for passing it through an environment variable or a file.
    pub fn to_hex(&self) -> String {
        self.bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Parses [`UniqueId::to_hex`]'s output.
    pub fn from_hex(s: &str) -> Result<Self> {
        let bytes = decode_hex(s).ok_or_else(|| {
            Error::InvalidArgument("a unique id in hex must be 256 hex digits".into())
        })?;
        Self::from_bytes(&bytes)
    }

    /// The root's address.
    pub fn root_addr(&self) -> SocketAddr {
        let port = u16::from_be_bytes([self.bytes[10], self.bytes[11]]);
        let ip = if self.bytes[9] == 6 {
            let o: [u8; 16] = self.bytes[12..28].try_into().unwrap_or([0; 16]);
            IpAddr::V6(Ipv6Addr::from(o))
        } else {
            IpAddr::V4(Ipv4Addr::new(
                self.bytes[12],
                self.bytes[13],
                self.bytes[14],
                self.bytes[15],
            ))
        };
        SocketAddr::new(ip, port)
    }

    pub(crate) fn secret(&self) -> Secret {
        self.bytes[28..44].try_into().unwrap_or([0; 16])
    }
}

/// Decodes an even number of hex digits (surrounding white space ignored).
pub(crate) fn decode_hex(s: &str) -> Option<Vec<u8>> {
    let s = s.trim();
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| s.get(i..i + 2).and_then(|b| u8::from_str_radix(b, 16).ok()))
        .collect()
}

/// What every rank tells the others about itself.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerInfo {
    /// Rank in the communicator.
    pub rank: usize,
    /// Host identity (decides shared memory).
    pub host: HostIdentity,
    /// Process id, for messages.
    pub pid: u32,
    /// A random number unique to the process (decides the in-process transport).
    pub process: u64,
    /// Where the rank's listener accepts data connections.
    pub listen: SocketAddr,
    /// Its GPU, NIC and switch path, from which every rank computes the same tiers.
    #[serde(default)]
    pub place: strata_topology::RankPlace,
    /// The RDMA providers it can use (probed only when `STRATA_TRANSPORT` allows RDMA).
    #[serde(default)]
    pub rdma: crate::transport::rdma::RdmaCaps,
}

impl PeerInfo {
    /// `host h (pid 4242)` for messages.
    pub fn describe(&self) -> String {
        format!("host {} (pid {})", self.host.hostname, self.pid)
    }
}

/// The random number identifying this process.
pub(crate) fn process_nonce() -> u64 {
    static NONCE: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *NONCE.get_or_init(|| {
        random_bytes::<8>()
            .map(u64::from_le_bytes)
            .unwrap_or(std::process::id() as u64)
    })
}

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
    /// An RDMA connection set up on the listener's side: its half of the setup.
    RdmaAccept(crate::transport::rdma::protocol::RdmaSetup),
    /// A rank's answer to `ConnectKind::Status`: what it is doing.
    Status(crate::watchdog::Progress),
    /// A rank's answer to `ConnectKind::Census`.
    Census(crate::diagnosis::Census),
}

/// What a new connection to a listener is for.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) enum ConnectKind {
    /// Data stream `index` of a TCP connection.
    TcpStream { index: usize },
    /// The control stream, sent last, saying which transport the connection uses.
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
    /// A survivor joins shrink `key` of `expected` ranks, sent to the lowest survivor's
    /// listener; answered with `Msg::Table` (every survivor's `info`) or `Msg::Fail`.
    Shrink {
        key: String,
        expected: usize,
        info: PeerInfo,
    },
}

/// How the data path of a new connection is built.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) enum TransportSetup {
    /// `streams` TCP streams were opened before the control stream.
    Tcp { streams: usize, stripe: usize },
    /// A ring segment in `/dev/shm` with this name.
    Shm { name: String },
    /// A ring segment registered in this process under this key.
    InProcess { key: String },
    /// RDMA: the connecting side's queue pairs or endpoints and clear-to-send ring; answered
    /// with `Msg::RdmaAccept` (the listener's) instead of `Ack`.
    Rdma(crate::transport::rdma::protocol::RdmaSetup),
}

fn mac(key: &[u8; 32], label: &[u8], a: &[u8], b: &[u8]) -> [u8; 32] {
    let mut h = blake3::Hasher::new_keyed(key);
    h.update(label);
    h.update(a);
    h.update(b);
    *h.finalize().as_bytes()
}

fn key_of(secret: &Secret) -> [u8; 32] {
    blake3::derive_key("strata 2026 connection authentication v1", secret)
}

fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Why a handshake failed: the connection broke (worth retrying against a busy root, which
/// closes handshakes beyond its limit), or the peer is not of this job (final).
enum HandshakeError {
    Dropped(Error),
    Impostor(Error),
}

impl HandshakeError {
    fn into_error(self) -> Error {
        match self {
            Self::Dropped(e) | Self::Impostor(e) => e,
        }
    }
}

impl From<Error> for HandshakeError {
    fn from(e: Error) -> Self {
        Self::Dropped(e)
    }
}

/// Connector side of the mutual handshake.
fn handshake_connect(
    s: &mut TcpStream,
    secret: &Secret,
    timeout: Duration,
) -> std::result::Result<(), HandshakeError> {
    let key = key_of(secret);
    s.set_read_timeout(Some(timeout)).ok();
    let nonce_c: [u8; 16] = random_bytes()?;
    let mut hello = [0u8; 24];
    hello[..8].copy_from_slice(HS_MAGIC);
    hello[8..].copy_from_slice(&nonce_c);
    s.write_all(&hello).map_err(|e| Error::io("handshake", e))?;
    let mut reply = [0u8; 48];
    s.read_exact(&mut reply)
        .map_err(|e| Error::io("handshake (peer did not answer)", e))?;
    let nonce_s = &reply[..16];
    if !ct_eq(&reply[16..], &mac(&key, b"acceptor", &nonce_c, nonce_s)) {
        return Err(HandshakeError::Impostor(Error::Transport(
            "handshake: the peer does not hold this job's secret".into(),
        )));
    }
    s.write_all(&mac(&key, b"connector", &nonce_c, nonce_s))
        .map_err(|e| Error::io("handshake", e))?;
    Ok(())
}

/// Acceptor side: reads exactly 24 + 32 bytes, within `timeout`, before trusting anything.
pub(crate) fn handshake_accept(
    s: &mut TcpStream,
    secret: &Secret,
    timeout: Duration,
) -> Result<()> {
    let key = key_of(secret);
    s.set_read_timeout(Some(timeout))
        .map_err(|e| Error::io("handshake", e))?;
    let mut hello = [0u8; 24];
    s.read_exact(&mut hello)
        .map_err(|e| Error::io("handshake", e))?;
    if &hello[..8] != HS_MAGIC {
        return Err(Error::Transport("handshake: bad magic".into()));
    }
    let nonce_s: [u8; 16] = random_bytes()?;
    let mut reply = [0u8; 48];
    reply[..16].copy_from_slice(&nonce_s);
    reply[16..].copy_from_slice(&mac(&key, b"acceptor", &hello[8..], &nonce_s));
    s.write_all(&reply).map_err(|e| Error::io("handshake", e))?;
    let mut proof = [0u8; 32];
    s.read_exact(&mut proof)
        .map_err(|e| Error::io("handshake", e))?;
    if !ct_eq(&proof, &mac(&key, b"connector", &hello[8..], &nonce_s)) {
        return Err(Error::Transport("handshake: wrong secret".into()));
    }
    Ok(())
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

/// Connects and authenticates. With `retry_refused`, a refused connection, or one dropped during
/// the handshake, is tried again until `deadline` (the bootstrap root may not be up yet, or may
/// be shedding a burst of thousands of ranks), after a randomised back-off; without it, the
/// first failure is final (a rank's listener is up before the rank table exists, so a refusal
/// means the rank is gone).
pub(crate) fn connect_authenticated(
    addr: SocketAddr,
    secret: &Secret,
    deadline: Instant,
    hs_timeout: Duration,
    retry_refused: bool,
) -> Result<TcpStream> {
    let mut last_err = None;
    let mut backoff = Duration::from_millis(10);
    while Instant::now() < deadline {
        let left = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1));
        match TcpStream::connect_timeout(&addr, left.min(Duration::from_secs(5))) {
            Ok(mut s) => {
                s.set_nodelay(true).ok();
                match handshake_connect(&mut s, secret, hs_timeout.min(left)) {
                    Ok(()) => {
                        s.set_read_timeout(None).ok();
                        return Ok(s);
                    }
                    Err(HandshakeError::Dropped(e)) if retry_refused => {
                        last_err = Some(e.to_string())
                    }
                    Err(e) => return Err(e.into_error()),
                }
            }
            Err(e) => {
                last_err = Some(e.to_string());
                if !retry_refused {
                    break;
                }
            }
        }
        // Spread the retries of a burst of ranks over the back-off window.
        let jitter = random_bytes::<2>().map_or(0, u16::from_le_bytes) as u32;
        let pause = backoff.mul_f64(0.5 + f64::from(jitter) / f64::from(u16::MAX));
        std::thread::sleep(pause.min(deadline.saturating_duration_since(Instant::now())));
        backoff = (backoff * 2).min(Duration::from_millis(500));
    }
    Err(Error::Transport(format!(
        "could not reach {addr}: {}",
        last_err.unwrap_or_else(|| "deadline passed".into())
    )))
}

/// Lets `listener` queue up to `backlog` connections not yet accepted (the kernel caps it at
/// `net.core.somaxconn`); the standard library's 128 makes a burst of ranks wait for SYN
/// retransmissions, a second or more each.
pub(crate) fn deepen_backlog(listener: &TcpListener, backlog: i32) {
    // SAFETY: listen() on a socket that is already listening only changes its backlog.
    unsafe { libc::listen(std::os::fd::AsRawFd::as_raw_fd(listener), backlog) };
}

/// Accepts connections until `stop` is set, authenticating each on its own thread and handing
/// good ones to `handle`. Strangers are logged and dropped.
pub(crate) fn accept_loop(
    listener: TcpListener,
    secret: Secret,
    hs_timeout: Duration,
    stop: Arc<AtomicBool>,
    handle: Arc<dyn Fn(TcpStream) + Send + Sync>,
) {
    if listener.set_nonblocking(true).is_err() {
        return;
    }
    let pending = Arc::new(AtomicUsize::new(0));
    while !stop.load(Ordering::Acquire) {
        match listener.accept() {
            Ok((mut s, peer)) => {
                if pending.load(Ordering::Acquire) >= MAX_PENDING_HANDSHAKES {
                    tracing::warn!(%peer, "too many unauthenticated connections; closing one");
                    continue;
                }
                pending.fetch_add(1, Ordering::AcqRel);
                let (pending, handle) = (pending.clone(), handle.clone());
                let spawned = std::thread::Builder::new().name("strata-accept".into()).spawn(move || {
                    let ok = s.set_nonblocking(false).is_ok() && s.set_nodelay(true).is_ok();
                    match handshake_accept(&mut s, &secret, hs_timeout) {
                        Ok(()) if ok => {
                            s.set_read_timeout(Some(hs_timeout)).ok();
                            pending.fetch_sub(1, Ordering::AcqRel);
                            handle(s);
                        }
                        Ok(()) => {
                            pending.fetch_sub(1, Ordering::AcqRel);
                        }
                        Err(e) => {
                            pending.fetch_sub(1, Ordering::AcqRel);
                            tracing::warn!(%peer, error = %e, "rejected a connection that did not authenticate");
                        }
                    }
                });
                if spawned.is_err() {
                    tracing::warn!("could not spawn a handshake thread");
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                let mut pfd = libc::pollfd {
                    fd: std::os::fd::AsRawFd::as_raw_fd(&listener),
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one valid pollfd.
                unsafe { libc::poll(&mut pfd, 1, 100) };
            }
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unique_id_round_trips_and_rejects_garbage() {
        let id = UniqueId::from_parts("127.0.0.1:4242".parse().unwrap(), &[7; 16]);
        let back = UniqueId::from_bytes(id.as_bytes()).unwrap();
        assert_eq!(back.root_addr(), "127.0.0.1:4242".parse().unwrap());
        assert_eq!(back.secret(), [7; 16]);
        assert!(UniqueId::from_bytes(&[0u8; 128]).is_err());
        assert!(UniqueId::from_bytes(&[0u8; 12]).is_err());
        assert_eq!(UniqueId::from_hex(&id.to_hex()).unwrap(), id);
        assert!(UniqueId::from_hex("abc").is_err());
        assert!(UniqueId::from_hex(&"zz".repeat(128)).is_err());
        assert_eq!(decode_hex(" 0aff "), Some(vec![0x0a, 0xff]));
        assert!(!format!("{id:?}").contains("7, 7"));
    }

    #[test]
    fn handshake_needs_the_same_secret() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let t = std::thread::spawn(move || {
            let mut results = Vec::new();
            for _ in 0..2 {
                let (mut s, _) = l.accept().unwrap();
                results.push(handshake_accept(&mut s, &[1; 16], Duration::from_secs(5)).is_ok());
            }
            results
        });
        let mut good = TcpStream::connect(addr).unwrap();
        assert!(handshake_connect(&mut good, &[1; 16], Duration::from_secs(5)).is_ok());
        let mut bad = TcpStream::connect(addr).unwrap();
        assert!(handshake_connect(&mut bad, &[2; 16], Duration::from_secs(5)).is_err());
        assert_eq!(t.join().unwrap(), vec![true, false]);
    }
}
