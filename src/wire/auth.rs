//! Authenticated connections: every TCP connection strata accepts, to the rendezvous root or
//! to a rank's listener, must first prove it holds the job's 128-bit secret (a mutual
//! challenge-response keyed by the secret) before a single byte of a frame is read. A
//! connection that fails is logged and closed; the listener carries on.

use super::{ConnectKind, Msg, PeerInfo, send_msg};
use crate::error::{Error, Result};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

const HS_MAGIC: &[u8; 8] = b"STRATAHS";
/// Most handshakes the listener runs at once; extra connections are closed.
const MAX_PENDING_HANDSHAKES: usize = 64;

/// The job secret.
pub(crate) type Secret = [u8; 16];

pub(crate) fn random_bytes<const N: usize>() -> Result<[u8; N]> {
    let mut b = [0u8; N];
    getrandom::fill(&mut b).map_err(|e| Error::Transport(format!("no randomness: {e}")))?;
    Ok(b)
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

/// What [`connect_authenticated`] does when a connection is refused or dropped during the
/// handshake.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Retry {
    /// The first failure is final: a rank's listener is up before the rank table exists, so
    /// a refusal means the rank is gone.
    No,
    /// Try again until the deadline, after a randomised back-off: the bootstrap root may not
    /// be up yet, or may be shedding a burst of thousands of ranks.
    UntilDeadline,
    /// As `UntilDeadline` for dropped handshakes, but refusals only for this long: the
    /// listener was up before the address was handed out (a unique id's root), so refusals
    /// that go on mean nothing listens there any more.
    RefusedFor(Duration),
}

/// Connects and authenticates, retrying failures as `retry` says.
pub(crate) fn connect_authenticated(
    addr: SocketAddr,
    secret: &Secret,
    deadline: Instant,
    hs_timeout: Duration,
    retry: Retry,
) -> Result<TcpStream> {
    let retry_refused = retry != Retry::No;
    let mut first_refused: Option<Instant> = None;
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
                // The socket could not even be made here: this process's fault, not the
                // peer's, and no retry will help while the descriptors are held.
                if let Some(why) = out_of_descriptors(&e) {
                    return Err(Error::Transport(why));
                }
                last_err = Some(e.to_string());
                if !retry_refused {
                    break;
                }
                if let Retry::RefusedFor(grace) = retry
                    && e.kind() == std::io::ErrorKind::ConnectionRefused
                    && first_refused.get_or_insert_with(Instant::now).elapsed() >= grace
                {
                    return Err(Error::Transport(format!(
                        "{addr} refused every connection for {:.1} s: {ROOT_GONE}",
                        grace.as_secs_f64()
                    )));
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

/// The words that end the error of an address that refused connections for
/// [`Retry::RefusedFor`]'s whole grace.
pub(crate) const ROOT_GONE: &str = "nothing listens there any more";

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
    let mut last_warned: Option<Instant> = None;
    while !stop.load(Ordering::Acquire) {
        match listener.accept() {
            // The owner's wake-up (or anyone) after the stop: no handshake, no warning.
            Ok(_) if stop.load(Ordering::Acquire) => break,
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
                // Out of descriptors, accept fails at once for as long as they are held: say
                // so now and then, not 20 times a second.
                if last_warned.is_none_or(|t: Instant| t.elapsed() > Duration::from_secs(10)) {
                    let why = out_of_descriptors(&e).unwrap_or_else(|| e.to_string());
                    tracing::warn!("accepting a connection failed: {why}");
                    last_warned = Some(Instant::now());
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

/// How an error that this process ran out of file descriptors begins.
const OUT_OF_DESCRIPTORS: &str = "this process is out of file descriptors";

/// `this process is out of file descriptors (… open, RLIMIT_NOFILE …)` when `e` is EMFILE or
/// ENFILE (the system's table), else `None`.
pub(crate) fn out_of_descriptors(e: &std::io::Error) -> Option<String> {
    let code = e.raw_os_error()?;
    if code != libc::EMFILE && code != libc::ENFILE {
        return None;
    }
    // Listing them takes a descriptor too, which may be the one missing.
    let open = std::fs::read_dir("/proc/self/fd")
        .map_or_else(|_| "all".to_string(), |d| d.count().to_string());
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: a valid out-pointer.
    let limit = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 {
        format!("soft limit {}", lim.rlim_cur)
    } else {
        "limit unknown".into()
    };
    let whose = if code == libc::ENFILE {
        "the system's file table is full"
    } else {
        "the process limit is reached"
    };
    Some(format!(
        "{OUT_OF_DESCRIPTORS} ({open} open, RLIMIT_NOFILE {limit}; {whose}): raise it with \
         `ulimit -n`, or look for descriptors leaking"
    ))
}

/// Whether `e` says this process ran out of file descriptors (made by
/// [`out_of_descriptors`]): the failure is this rank's, whichever peer it was reaching.
pub(crate) fn is_out_of_descriptors(e: &Error) -> bool {
    matches!(e, Error::Transport(m) if m.starts_with(OUT_OF_DESCRIPTORS))
}

/// What an unanswered connection to a peer's listener says about the peer. Refused: nothing
/// listens there any more. Anything else (a handshake cut or never answered) may be a process
/// alive but out of descriptors or stuck, whose queued connections are reset only when it exits.
pub(crate) fn unreachable_cause(e: &Error) -> &'static str {
    if is_refused(e) {
        "nothing listens there: it has exited or destroyed its communicator"
    } else {
        "it may be out of file descriptors or stuck, or it exited meanwhile"
    }
}

/// Whether a connection failed because nothing listened at the address (ECONNREFUSED).
pub(crate) fn is_refused(e: &Error) -> bool {
    e.to_string()
        .contains(&format!("(os error {})", libc::ECONNREFUSED))
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
    let mut s = connect_authenticated(peer.listen, secret, deadline, handshake_timeout, Retry::No)?;
    send_msg(
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

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn a_listener_that_never_accepts_is_not_called_exited_but_a_closed_port_is() {
        let deadline = || Instant::now() + Duration::from_secs(5);
        // Alive but not accepting (as when out of descriptors): the connection waits in the
        // backlog and is reset only when the listener goes.
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let closer = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            drop(l);
        });
        let connect = || {
            connect_authenticated(
                addr,
                &[1; 16],
                deadline(),
                Duration::from_secs(5),
                Retry::No,
            )
            .unwrap_err()
        };
        let e = connect();
        closer.join().unwrap();
        assert!(
            unreachable_cause(&e).contains("out of file descriptors or stuck"),
            "{e}"
        );
        // Nothing listens at all: refused.
        let e = connect();
        assert!(unreachable_cause(&e).contains("it has exited"), "{e}");
    }
}
