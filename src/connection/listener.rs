//! A communicator's listener: accepts and authenticates incoming connections, builds the data
//! connections itself through the transport table, and hands every other kind to the handler
//! its owning module registered in [`Routes`].

use super::Connection;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::transport::{self, Answer};
use crate::wire::{
    self, ConnectKind, Handler, Incoming, Msg, Route, Secret, TransportSetup, refuse,
};
use std::collections::{BTreeMap, HashMap};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Which module serves which kind of connection, fixed before the listener starts (so that
/// nothing arrives before its handler).
#[derive(Clone, Default)]
pub(crate) struct Routes {
    handlers: BTreeMap<Route, Handler>,
}

impl Routes {
    /// Serves `route` with `handler`. Data connections and probes belong to the listener
    /// itself and cannot be routed elsewhere.
    pub fn add(&mut self, route: Route, handler: Handler) -> &mut Self {
        debug_assert!(!matches!(
            route,
            Route::Stream | Route::Control | Route::Probe
        ));
        self.handlers.insert(route, handler);
        self
    }
}

struct ListenerShared {
    comm: String,
    rank: usize,
    nranks: usize,
    cfg: Config,
    routes: Routes,
    ready: Mutex<HashMap<usize, Connection>>,
    /// Side streams by (from, index), until their transport's accepting half takes them.
    streams: Mutex<HashMap<(usize, usize), (String, TcpStream)>>,
    cv: Condvar,
}

/// How a listener refuses a connection for a communicator it does not serve (after waiting
/// for it to be made): the dialer names the cause from it.
pub(crate) const NOT_SERVED: &str = "no such communicator here";

/// How a listener refuses a connection for a communicator destroyed here: like a peer's
/// goodbye, not a fault of its own.
pub(crate) const DESTROYED: &str = "communicator destroyed here";

/// The communicators one listening socket serves, by id: its own, and those made from its
/// table without a rendezvous ([`CommListener::attach`]).
#[derive(Default)]
struct Served {
    by_comm: Mutex<ServedTable>,
    cv: Condvar,
}

/// The communicators served now, and the last ones that were (a late connection for one of
/// those is refused at once instead of waiting for it to be made).
#[derive(Default)]
struct ServedTable {
    now: HashMap<String, Arc<ListenerShared>>,
    gone: std::collections::VecDeque<String>,
}

/// How many destroyed communicators a listener remembers.
const GONE_KEPT: usize = 256;

impl Served {
    /// The communicator `comm`, waiting up to `wait` for it to be attached (a member of a
    /// new sub-communicator may dial a peer that has not made its own yet); else why not.
    fn find(
        &self,
        comm: &str,
        wait: Duration,
    ) -> std::result::Result<Arc<ListenerShared>, &'static str> {
        let deadline = Instant::now() + wait;
        let mut m = self.by_comm.lock().map_err(|_| NOT_SERVED)?;
        loop {
            if let Some(sh) = m.now.get(comm) {
                return Ok(sh.clone());
            }
            if m.gone.iter().any(|g| g == comm) {
                return Err(DESTROYED);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(NOT_SERVED);
            }
            m = self.cv.wait_timeout(m, left).map_err(|_| NOT_SERVED)?.0;
        }
    }
}

/// The accept thread of one listening socket, shared by every communicator it serves and
/// stopped when the last of them is gone.
struct AcceptThread {
    stop: Arc<AtomicBool>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Where a connection wakes the accept loop at once when it must stop (else it notices
    /// at its next poll, up to 100 ms later: the whole of an abort's cost).
    wake_at: Option<std::net::SocketAddr>,
}

impl Drop for AcceptThread {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(addr) = self.wake_at {
            let _ = TcpStream::connect_timeout(&addr, std::time::Duration::from_millis(100));
        }
        if let Some(t) = self.thread.get_mut().ok().and_then(Option::take) {
            let _ = t.join();
        }
    }
}

/// A communicator's listener: accepts, authenticates and builds incoming connections.
pub(crate) struct CommListener {
    shared: Arc<ListenerShared>,
    served: Arc<Served>,
    accept: Arc<AcceptThread>,
}

impl CommListener {
    /// Binds a listener on the configured interface.
    pub fn bind(cfg: &Config) -> Result<TcpListener> {
        let listener = TcpListener::bind(SocketAddr::new(cfg.listen_ip, 0))
            .map_err(|e| Error::io(format!("binding a listener on {}", cfg.listen_ip), e))?;
        wire::deepen_backlog(&listener, 1024);
        Ok(listener)
    }

    /// Starts serving `listener` for rank `rank` of communicator `comm`, with `routes` for
    /// the kinds of connection other modules serve.
    pub fn start(
        listener: TcpListener,
        comm: String,
        rank: usize,
        nranks: usize,
        secret: Secret,
        cfg: &Config,
        routes: Routes,
    ) -> Result<Self> {
        let served = Arc::new(Served::default());
        let shared = serve(&served, comm, rank, nranks, cfg, routes)?;
        let stop = Arc::new(AtomicBool::new(false));
        let (by_id, hs) = (served.clone(), cfg.handshake_timeout);
        let handle: Arc<dyn Fn(TcpStream) + Send + Sync> = Arc::new(move |s| {
            if let Err(e) = route(&by_id, hs, s) {
                tracing::warn!(rank, error = %e, "refused an incoming connection");
            }
        });
        let st = stop.clone();
        let wake_at = listener.local_addr().ok().map(|mut a| {
            if a.ip().is_unspecified() {
                a.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
            }
            a
        });
        let thread = std::thread::Builder::new()
            .name(format!("strata-listen-{rank}"))
            .spawn(move || wire::accept_loop(listener, secret, hs, st, handle))
            .map_err(|e| Error::io("spawning the listener", e))?;
        Ok(Self {
            shared,
            served,
            accept: Arc::new(AcceptThread {
                stop,
                thread: Mutex::new(Some(thread)),
                wake_at,
            }),
        })
    }

    /// Serves communicator `comm` (rank `rank` of `nranks`) through this listener's socket
    /// too: a communicator made from this one's table, whose peers dial the addresses they
    /// already know. Connections for it that arrive before it is attached wait for it up to
    /// the handshake timeout. Refused if `comm` is served already.
    pub fn attach(
        &self,
        comm: String,
        rank: usize,
        nranks: usize,
        cfg: &Config,
        routes: Routes,
    ) -> Result<Self> {
        Ok(Self {
            shared: serve(&self.served, comm, rank, nranks, cfg, routes)?,
            served: self.served.clone(),
            accept: self.accept.clone(),
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

    /// The communicator id this listener serves.
    pub fn comm(&self) -> &str {
        &self.shared.comm
    }

    /// Waits up to `d` for a new connection, unless one from `peers` is already waiting to
    /// be taken: checked under the lock the acceptor notifies under, so a connection that
    /// arrives between a caller's `take` and this wait is not slept through.
    pub fn wait_for_any(&self, peers: &[usize], d: Duration) {
        if let Ok(g) = self.shared.ready.lock() {
            if peers.iter().any(|p| g.contains_key(p)) {
                return;
            }
            let _ = self.shared.cv.wait_timeout(g, d);
        }
    }
}

impl Drop for CommListener {
    /// No longer serves this communicator; the socket's accept thread stops with the last
    /// communicator it serves.
    fn drop(&mut self) {
        if let Ok(mut m) = self.served.by_comm.lock() {
            m.now.remove(&self.shared.comm);
            if m.gone.len() >= GONE_KEPT {
                m.gone.pop_front();
            }
            m.gone.push_back(self.shared.comm.clone());
        }
    }
}

/// Registers communicator `comm` with `served`.
fn serve(
    served: &Served,
    comm: String,
    rank: usize,
    nranks: usize,
    cfg: &Config,
    routes: Routes,
) -> Result<Arc<ListenerShared>> {
    let shared = Arc::new(ListenerShared {
        comm: comm.clone(),
        rank,
        nranks,
        cfg: cfg.clone(),
        routes,
        ready: Mutex::new(HashMap::new()),
        streams: Mutex::new(HashMap::new()),
        cv: Condvar::new(),
    });
    let mut m = served.by_comm.lock().map_err(|_| poisoned())?;
    if m.now.contains_key(&comm) {
        return Err(Error::InvalidArgument(format!(
            "communicator {comm} is served already: a sub-communicator's tag must be new"
        )));
    }
    m.gone.retain(|g| *g != comm);
    m.now.insert(comm, shared.clone());
    served.cv.notify_all();
    Ok(shared)
}

fn poisoned() -> Error {
    Error::Transport("listener lock poisoned".into())
}

/// Reads what an authenticated connection is for, finds the communicator it names (waiting
/// up to `wait` for it), checks that it belongs there, and serves it.
fn route(served: &Served, wait: Duration, mut s: TcpStream) -> Result<()> {
    let Msg::Connect {
        comm,
        from,
        to,
        kind,
    } = wire::recv_msg(&mut s)?
    else {
        return Err(Error::Transport("expected a Connect frame".into()));
    };
    let route = kind.route();
    let sh = match served.find(&comm, wait) {
        Ok(sh) => sh,
        Err(why) => {
            let text = format!(
                "{} for comm {comm} rank {from}->{to}: {why}",
                route.describe()
            );
            return Err(refuse(&mut s, text));
        }
    };
    let sh = &*sh;
    if to != sh.rank || from >= sh.nranks {
        return Err(refuse(
            &mut s,
            format!(
                "{} for comm {comm} rank {from}->{to} does not belong here",
                route.describe()
            ),
        ));
    }
    let incoming = Incoming {
        from,
        kind,
        stream: s,
    };
    match route {
        Route::Probe => {
            let mut s = incoming.stream;
            wire::send_msg(&mut s, &Msg::Ack)
        }
        Route::Stream | Route::Control => data_connection(sh, incoming),
        other => match sh.routes.handlers.get(&other) {
            Some(handler) => handler(incoming),
            None => {
                let mut s = incoming.stream;
                Err(refuse(
                    &mut s,
                    format!("rank {} serves no {}", sh.rank, other.describe()),
                ))
            }
        },
    }
}

/// A data connection's side stream (kept for its transport) or its control stream (the offer,
/// answered by the transport it names).
fn data_connection(sh: &ListenerShared, incoming: Incoming) -> Result<()> {
    let Incoming {
        from,
        kind,
        stream: mut s,
    } = incoming;
    if from >= sh.rank {
        return Err(refuse(
            &mut s,
            format!(
                "rank {from} opened a connection to the lower rank {}; the lower rank opens it",
                sh.rank
            ),
        ));
    }
    let setup = match kind {
        ConnectKind::Stream { transport, index } => {
            s.set_read_timeout(None).ok();
            let mut m = sh.streams.lock().map_err(|_| poisoned())?;
            m.insert((from, index), (transport, s));
            sh.cv.notify_all();
            return Ok(());
        }
        ConnectKind::Control { transport } => transport,
        _ => return Err(Error::Transport("internal: not a data connection".into())),
    };
    let TransportSetup { transport, setup } = setup;
    let Some(connector) = transport::by_name(&transport) else {
        return Err(refuse(&mut s, format!("unknown transport {transport:?}")));
    };
    let take_streams = |n: usize| take_streams(sh, from, &transport, n);
    let answer = Answer {
        cfg: &sh.cfg,
        take_streams: &take_streams,
    };
    let accepted = match connector.accept(&answer, setup) {
        Ok(a) => a,
        Err(e) => return Err(refuse(&mut s, format!("{transport}: {e}"))),
    };
    wire::send_msg(&mut s, &Msg::Accepted(accepted.reply))?;
    let conn = Connection::new(from, accepted.data, s)?;
    let mut ready = sh.ready.lock().map_err(|_| poisoned())?;
    ready.insert(from, conn);
    sh.cv.notify_all();
    Ok(())
}

/// Side streams `0..n` from rank `from` for `transport`, waiting for them until the handshake
/// timeout.
fn take_streams(
    sh: &ListenerShared,
    from: usize,
    transport: &str,
    n: usize,
) -> Result<Vec<TcpStream>> {
    let deadline = Instant::now() + sh.cfg.handshake_timeout;
    let mut m = sh.streams.lock().map_err(|_| poisoned())?;
    while (0..n).any(|i| !m.contains_key(&(from, i))) {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Error::Transport(format!(
                "{n} data streams did not arrive within the handshake timeout"
            )));
        }
        m = sh.cv.wait_timeout(m, left).map_err(|_| poisoned())?.0;
    }
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        if let Some((t, s)) = m.remove(&(from, i)) {
            if t != transport {
                return Err(Error::Transport(format!(
                    "data stream {i} was opened for {t}, the connection is {transport}"
                )));
            }
            out.push(s);
        }
    }
    Ok(out)
}
