//! The rendezvous in O(log p) rounds: a directory at the root and a tree of ranks.
//!
//! The root named by the unique id is only a directory. Each rank registers its listener's
//! address there on one short connection and learns the listeners of those of its tree
//! neighbours that registered before it: its parent and children in the rank tree of fan-out
//! [`TREE_FANOUT`] (rank r's parent is (r − 1) / K). Of every edge, the rank that registers
//! second connects to the first, so each edge is made once and nobody waits at the root. The
//! ranks' descriptions then go up the tree (each rank sends its subtree's to its parent) and the
//! complete table comes back down: 2 ⌈log_K p⌉ rounds. No connection stays open at the root,
//! which handles one short exchange per rank, and no rank holds more than K + 1 bootstrap
//! sockets.
//!
//! Failure: a rank that waits past its init deadline asks the directory which ranks never
//! registered and floods that verdict over the tree edges it has, so every rank that arrived
//! fails naming the missing ones. Ranks cut off below a missing rank ask the directory
//! themselves at their own deadline.

use super::UniqueId;
use crate::error::{Error, RankList, Result};
use crate::wire::{
    ConnectKind, Handler, Incoming, Located, Msg, PeerInfo, ROOT_GONE, Retry, Secret, accept_loop,
    connect_authenticated, encode_msg, random_bytes, recv_msg, refuse, send_msg,
};
use std::collections::BTreeMap;
use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Children per rank in the bootstrap tree.
pub const TREE_FANOUT: usize = 8;

/// How long a rank waiting for its parent's table waits beyond its own deadline: the verdict
/// of a rank whose deadline came first should reach it before it gives up on its own.
const PARENT_GRACE: Duration = Duration::from_secs(5);

/// Rank `rank`'s parent in the bootstrap tree (none for rank 0).
pub(crate) fn tree_parent(rank: usize) -> Option<usize> {
    rank.checked_sub(1).map(|r| r / TREE_FANOUT)
}

/// Rank `rank`'s children in the bootstrap tree of `nranks`.
pub(crate) fn tree_children(rank: usize, nranks: usize) -> Range<usize> {
    let first = rank.saturating_mul(TREE_FANOUT).saturating_add(1);
    first.min(nranks)..first.saturating_add(TREE_FANOUT).min(nranks)
}

/// Levels below rank 0 in the bootstrap tree of `nranks`: the table goes up and down this
/// many edges.
pub fn tree_depth(nranks: usize) -> usize {
    let mut depth = 0;
    let mut rank = nranks.saturating_sub(1);
    while let Some(parent) = tree_parent(rank) {
        depth += 1;
        rank = parent;
    }
    depth
}

/// Tree edges a neighbour opened to this rank's listener, until the rendezvous takes them.
#[derive(Default)]
pub(crate) struct TreeInbox {
    edges: Mutex<Vec<(usize, TcpStream)>>,
    arrived: Condvar,
}

impl TreeInbox {
    /// Hands over an edge from `from`; false if one from `from` is already here.
    pub(crate) fn put(&self, from: usize, s: TcpStream) -> bool {
        let Ok(mut edges) = self.edges.lock() else {
            return false;
        };
        if edges.iter().any(|(r, _)| *r == from) {
            return false;
        }
        edges.push((from, s));
        self.arrived.notify_all();
        true
    }

    /// The edge from `from`, waiting for it until `deadline`.
    fn take(&self, from: usize, deadline: Instant) -> Option<TcpStream> {
        let mut edges = self.edges.lock().ok()?;
        loop {
            if let Some(i) = edges.iter().position(|(r, _)| *r == from) {
                return Some(edges.swap_remove(i).1);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            edges = self.arrived.wait_timeout(edges, left).ok()?.0;
        }
    }
}

impl TreeInbox {
    /// The listener's handler for `ConnectKind::Tree`: only rank `rank`'s parent and children
    /// (of `nranks`) open an edge to it, once each; the edge waits here for the rendezvous.
    pub(crate) fn handler(self: &Arc<Self>, rank: usize, nranks: usize) -> Handler {
        let inbox = self.clone();
        Arc::new(move |incoming: Incoming| {
            let Incoming {
                from, mut stream, ..
            } = incoming;
            let neighbour =
                tree_parent(rank) == Some(from) || tree_children(rank, nranks).contains(&from);
            if !neighbour {
                return Err(refuse(
                    &mut stream,
                    format!("rank {from} is not a bootstrap tree neighbour of rank {rank}"),
                ));
            }
            let ack = encode_msg(&Msg::Ack)?;
            stream
                .write_all(&ack)
                .map_err(|e| Error::io("bootstrap tree edge", e))?;
            if !inbox.put(from, stream) {
                return Err(Error::Transport(format!(
                    "rank {from} opened a second bootstrap tree edge"
                )));
            }
            Ok(())
        })
    }
}

/// The directory's record of one communicator's registrations.
struct Registry {
    nranks: Option<usize>,
    listen: Vec<Option<SocketAddr>>,
    /// Each registered rank's host name and process id, for status clients.
    who: Vec<(String, u32)>,
    registered: usize,
    /// When the first rank registered: the job's init deadline counts from here.
    first_arrival: Option<Instant>,
    /// Complete, or past its deadline: no more registrations.
    closed: bool,
    /// Why init failed, as the first rank (or the deadline) to say so put it.
    verdict: Option<(String, Vec<usize>)>,
    /// Rank 0 has sent the table down the tree: the directory's work is done.
    finished: bool,
}

impl Registry {
    fn missing(&self) -> Vec<usize> {
        (0..self.listen.len())
            .filter(|&r| self.listen[r].is_none())
            .collect()
    }

    fn complete(&self) -> bool {
        self.nranks.is_some_and(|n| self.registered == n)
    }

    /// A status client's question: where the registered ones of `ranks` listen.
    fn locate(&self, ranks: &[usize]) -> Msg {
        let ranks = ranks
            .iter()
            .take(TREE_FANOUT + 1)
            .filter_map(|&r| {
                let listen = (*self.listen.get(r)?)?;
                let (host, pid) = self.who[r].clone();
                Some(Located {
                    rank: r,
                    host,
                    pid,
                    listen,
                })
            })
            .collect();
        Msg::Located {
            nranks: self.nranks.unwrap_or(0),
            ranks,
        }
    }

    /// Records `rank`'s listener and answers with its neighbours registered so far.
    fn register(&mut self, rank: usize, nranks: usize, info: &PeerInfo) -> Msg {
        let refuse = |reason: String| {
            tracing::warn!(%reason, "bootstrap root refused a rank");
            Msg::Fail {
                reason,
                missing: vec![],
            }
        };
        if let Some((reason, missing)) = &self.verdict {
            return Msg::Fail {
                reason: reason.clone(),
                missing: missing.clone(),
            };
        }
        if self.closed {
            return refuse("this unique id's communicator is already complete or failed".into());
        }
        let n = *self.nranks.get_or_insert(nranks);
        if nranks != n || nranks == 0 {
            return refuse(format!(
                "rank {rank} says there are {nranks} ranks, others say {n}"
            ));
        }
        if self.listen.is_empty() {
            self.listen = vec![None; n];
            self.who = vec![(String::new(), 0); n];
            self.first_arrival.get_or_insert_with(Instant::now);
        }
        if rank >= n || info.rank != rank {
            return refuse(format!("rank {rank} is out of range for {n} ranks"));
        }
        if self.listen[rank].is_some() {
            return refuse(format!("rank {rank} joined twice"));
        }
        self.listen[rank] = Some(info.listen);
        self.who[rank] = (info.host.hostname.clone(), info.pid);
        self.registered += 1;
        let known = |r: usize| self.listen[r].map(|a| (r, a));
        Msg::Joined {
            parent: tree_parent(rank).and_then(known),
            children: tree_children(rank, n).filter_map(known).collect(),
        }
    }
}

/// Keeps a job's bootstrap root open after init, so that a status client (`collbench
/// status`) holding the job's secret can learn there where the ranks listen; dropping it
/// closes the port.
pub struct JobRoot {
    closed: Arc<(Mutex<bool>, Condvar)>,
    /// Says when the directory's threads are gone and the port is free.
    gone: Mutex<std::sync::mpsc::Receiver<()>>,
}

impl JobRoot {
    fn new() -> (Self, RootDoor) {
        let closed = Arc::new((Mutex::new(false), Condvar::new()));
        let (tx, gone) = std::sync::mpsc::channel();
        (
            Self {
                closed: closed.clone(),
                gone: Mutex::new(gone),
            },
            RootDoor { closed, _gone: tx },
        )
    }
}

impl Drop for JobRoot {
    fn drop(&mut self) {
        let (lock, cv) = &*self.closed;
        if let Ok(mut c) = lock.lock() {
            *c = true;
        }
        cv.notify_all();
        // The port is free when this returns (or after a second, if the root is wedged), so
        // the next job of this process can bind it.
        if let Ok(gone) = self.gone.lock() {
            let _ = gone.recv_timeout(Duration::from_secs(1));
        }
    }
}

/// The directory's side of a [`JobRoot`]: it serves until the root is dropped.
pub(super) struct RootDoor {
    closed: Arc<(Mutex<bool>, Condvar)>,
    /// Dropped when the directory exits, which tells the [`JobRoot`].
    _gone: std::sync::mpsc::Sender<()>,
}

impl RootDoor {
    /// Waits until the job's [`JobRoot`] is dropped.
    fn wait_closed(&self) {
        let (lock, cv) = &*self.closed;
        let Ok(mut c) = lock.lock() else { return };
        while !*c {
            c = match cv.wait(c) {
                Ok(g) => g,
                Err(_) => return,
            };
        }
    }
}

/// A fresh [`JobRoot`] and the door its directory keeps.
pub(super) fn job_root() -> (JobRoot, RootDoor) {
    JobRoot::new()
}

/// The directory behind a unique id: serves one communicator's registrations and the
/// verdicts of ranks that fail, then exits when rank 0 says the table has gone down the tree,
/// or when its deadline and then a grace period (for the ranks' questions about who is
/// missing) have passed. With a `door`, a directory whose table went down stays until the
/// door's [`JobRoot`] is dropped, answering status clients' `Locate`.
pub(super) fn directory_main(
    listener: TcpListener,
    secret: Secret,
    timeout: Duration,
    door: Option<RootDoor>,
) {
    let wake = listener.local_addr().ok();
    let state = Arc::new((
        Mutex::new(Registry {
            nranks: None,
            listen: Vec::new(),
            who: Vec::new(),
            registered: 0,
            first_arrival: None,
            closed: false,
            verdict: None,
            finished: false,
        }),
        Condvar::new(),
    ));
    let stop = Arc::new(AtomicBool::new(false));
    let st = state.clone();
    let handle: Arc<dyn Fn(TcpStream) + Send + Sync> = Arc::new(move |mut s: TcpStream| {
        let msg = match recv_msg(&mut s) {
            Ok(m) => m,
            Err(e) => return tracing::warn!(error = %e, "bootstrap root: bad first frame"),
        };
        let (lock, cv) = &*st;
        let Ok(mut reg) = lock.lock() else { return };
        let reply = match msg {
            Msg::Hello { rank, nranks, info } => {
                let reply = reg.register(rank, nranks, &info);
                if reg.complete() {
                    reg.closed = true;
                    cv.notify_all();
                }
                reply
            }
            Msg::Missing => match &reg.verdict {
                Some((reason, missing)) => Msg::Verdict {
                    reason: reason.clone(),
                    missing: missing.clone(),
                },
                None => {
                    let missing = reg.missing();
                    Msg::Fail {
                        reason: format!("{} never arrived", RankList(&missing)),
                        missing,
                    }
                }
            },
            Msg::Locate { ranks } => reg.locate(&ranks),
            Msg::Done => {
                reg.finished = true;
                cv.notify_all();
                Msg::Ack
            }
            Msg::Verdict { reason, missing } => {
                let (reason, missing) = reg.verdict.get_or_insert((reason, missing)).clone();
                reg.closed = true;
                Msg::Verdict { reason, missing }
            }
            _ => Msg::Fail {
                reason: "expected Hello or Missing".into(),
                missing: vec![],
            },
        };
        drop(reg);
        if let Err(e) = send_msg(&mut s, &reply) {
            tracing::warn!(error = %e, "bootstrap root could not answer a rank");
        }
    });
    let (s2, l2) = (stop.clone(), listener);
    let acceptor = std::thread::Builder::new()
        .name("strata-root-accept".into())
        .spawn(move || accept_loop(l2, secret, Duration::from_secs(5), s2, handle));
    let (lock, cv) = &*state;
    let give_up = Instant::now() + timeout * 2;
    let Ok(mut reg) = lock.lock() else { return };
    let mut built = false;
    loop {
        let now = Instant::now();
        // Rank 0 says when the table has gone down the tree; until then a rank that fails in
        // the tree may still post its verdict here.
        if reg.complete() && reg.finished {
            built = true;
            break;
        }
        let expires = reg.first_arrival.map(|d| d + timeout);
        if let Some(deadline) = expires {
            if now >= deadline && reg.verdict.is_none() && !reg.complete() {
                reg.closed = true;
                let missing = reg.missing();
                let reason = format!("{} never arrived", RankList(&missing));
                tracing::error!("bootstrap: {reason}");
                reg.verdict = Some((reason, missing));
            }
            // Past the deadline the directory stays a while to answer `Missing`.
            if now >= deadline + timeout.max(PARENT_GRACE) {
                break;
            }
        } else if now >= give_up {
            break;
        }
        reg = match cv.wait_timeout(reg, Duration::from_millis(200)) {
            Ok((g, _)) => g,
            Err(_) => return,
        };
    }
    drop(reg);
    if let Some(door) = &door
        && built
    {
        door.wait_closed();
    }
    stop.store(true, Ordering::Release);
    // Wakes the acceptor from its poll at once.
    if let Some(mut a) = wake {
        if a.ip().is_unspecified() {
            a.set_ip(if a.is_ipv4() {
                std::net::Ipv4Addr::LOCALHOST.into()
            } else {
                std::net::Ipv6Addr::LOCALHOST.into()
            });
        }
        let _ = TcpStream::connect_timeout(&a, Duration::from_millis(100));
    }
    if let Ok(t) = acceptor {
        let _ = t.join();
    }
}

/// Registers `nranks` placeholder ranks at a fresh directory on loopback from `threads`
/// threads at once, and returns how long the directory took to answer them all: its cost per
/// rank, the one part of the bootstrap that grows with p. For `benches/init_scale.rs`.
#[doc(hidden)]
pub fn directory_registration_time(nranks: usize, threads: usize) -> Result<Duration> {
    let secret = random_bytes()?;
    let id = UniqueId::serve(
        "127.0.0.1:0".parse().expect("loopback"),
        secret,
        Duration::from_secs(60),
    )?;
    let host = strata_topology::HostIdentity::detect();
    let listen: SocketAddr = "127.0.0.1:9".parse().expect("loopback");
    let start = Instant::now();
    let threads = threads.clamp(1, nranks.max(1));
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let host = host.clone();
                s.spawn(move || -> Result<()> {
                    for rank in (t..nranks).step_by(threads) {
                        let info = PeerInfo {
                            rank,
                            host: host.clone(),
                            pid: 0,
                            process: 0,
                            listen,
                            place: Default::default(),
                            transports: Default::default(),
                            probe: Default::default(),
                        };
                        let deadline = Instant::now() + Duration::from_secs(30);
                        let mut c = connect_authenticated(
                            id.root_addr(),
                            &secret,
                            deadline,
                            Duration::from_secs(10),
                            Retry::UntilDeadline,
                        )?;
                        send_msg(&mut c, &Msg::Hello { rank, nranks, info })?;
                        match recv_msg(&mut c)? {
                            Msg::Joined { .. } => {}
                            other => {
                                return Err(Error::Transport(format!(
                                    "directory answered {other:?}"
                                )));
                            }
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        workers.into_iter().try_for_each(|w| {
            w.join()
                .unwrap_or_else(|_| Err(Error::Transport("a registering thread panicked".into())))
        })
    })?;
    let took = start.elapsed();
    // Let the directory go, as rank 0 would.
    if let Ok(mut c) = connect_authenticated(
        id.root_addr(),
        &secret,
        Instant::now() + Duration::from_secs(5),
        Duration::from_secs(5),
        Retry::No,
    ) {
        let _ = send_msg(&mut c, &Msg::Done);
    }
    Ok(took)
}

/// Ends this side of an edge so that what was sent on it arrives: closing a socket with
/// unread bytes (a child's subtree, say) resets the connection, and a reset can destroy the
/// last frame before the peer reads it. So: no more writes, and whatever came is read and
/// dropped (without waiting).
fn close_gently(s: &mut TcpStream) {
    let _ = s.shutdown(std::net::Shutdown::Write);
    if s.set_nonblocking(true).is_ok() {
        let mut sink = [0u8; 64 << 10];
        while matches!(std::io::Read::read(s, &mut sink), Ok(n) if n > 0) {}
    }
}

/// One rank's view of the rendezvous while it runs.
struct Rendezvous<'a> {
    id: &'a UniqueId,
    comm: &'a str,
    cfg: &'a crate::Config,
    rank: usize,
    nranks: usize,
    start: Instant,
    deadline: Instant,
    /// Open tree edges, by neighbour.
    edges: BTreeMap<usize, TcpStream>,
}

impl Rendezvous<'_> {
    fn timeout_error(&self, reason: String, missing: Vec<usize>) -> Error {
        Error::Timeout {
            op: format!("init: {reason}"),
            seq: 0,
            waiting_on: missing,
            after_s: self.start.elapsed().as_secs_f64(),
            diagnosis: None,
        }
    }

    /// Sends `msg` to every open edge but `except`'s, bounded in time.
    fn flood(&mut self, msg: &Msg, except: Option<usize>) {
        for (&r, s) in self.edges.iter_mut() {
            if Some(r) != except {
                s.set_write_timeout(Some(Duration::from_secs(2))).ok();
                let _ = send_msg(s, msg);
            }
            close_gently(s);
        }
    }

    /// Fails init: tells every neighbour (but `from`, whose verdict this is) and returns the
    /// error.
    fn fail(&mut self, reason: String, missing: Vec<usize>, from: Option<usize>) -> Error {
        self.flood(
            &Msg::Fail {
                reason: reason.clone(),
                missing: missing.clone(),
            },
            from,
        );
        self.timeout_error(reason, missing)
    }

    /// Fails init because `neighbour` did not deliver, by the verdict every rank will give:
    /// one already posted at the directory; else, when this rank waited out its deadline, the
    /// ranks that never registered; else `neighbour` (it died or hung after registering),
    /// posted so that the others name it too.
    fn fail_waiting_on(&mut self, neighbour: usize, what: &str, timed_out: bool) -> Error {
        let (reason, missing) = match self.ask_directory(&Msg::Missing) {
            Some(Msg::Verdict { reason, missing }) => (reason, missing),
            Some(Msg::Fail { reason, missing }) if timed_out && !missing.is_empty() => {
                self.post_verdict(reason, missing)
            }
            _ => self.post_verdict(format!("rank {neighbour} {what}"), vec![neighbour]),
        };
        tracing::error!(rank = self.rank, "bootstrap: {reason}");
        self.fail(reason, missing, None)
    }

    /// Posts a verdict at the directory and returns the one that stands.
    fn post_verdict(&self, reason: String, missing: Vec<usize>) -> (String, Vec<usize>) {
        let post = Msg::Verdict {
            reason: reason.clone(),
            missing: missing.clone(),
        };
        match self.ask_directory(&post) {
            Some(Msg::Verdict { reason, missing }) => (reason, missing),
            _ => (reason, missing),
        }
    }

    /// One question to the directory, if it still answers.
    fn ask_directory(&self, question: &Msg) -> Option<Msg> {
        let deadline = Instant::now() + Duration::from_secs(2);
        let mut s = connect_authenticated(
            self.id.root_addr(),
            &self.id.secret(),
            deadline,
            self.cfg.handshake_timeout,
            Retry::No,
        )
        .ok()?;
        send_msg(&mut s, question).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(2))).ok();
        recv_msg(&mut s).ok()
    }

    /// Registers at the directory: the neighbours registered before this rank.
    fn register(&self, me: PeerInfo) -> Result<Vec<(usize, SocketAddr)>> {
        let root = self.id.root_addr();
        let retry = if self.id.root_listened_first() {
            Retry::RefusedFor(super::ROOT_GONE_GRACE)
        } else {
            Retry::UntilDeadline
        };
        let mut s = connect_authenticated(
            root,
            &self.id.secret(),
            self.deadline,
            self.cfg.handshake_timeout,
            retry,
        )
        .map_err(|e| match e {
            Error::Transport(why) if why.contains(ROOT_GONE) => Error::Transport(format!(
                "init: bootstrap root {root}: {why}: the process that made this unique id has \
                 exited, or the id is stale (from an earlier run or restart attempt)"
            )),
            e => self.timeout_error(format!("bootstrap root {root}: {e}"), vec![]),
        })?;
        send_msg(
            &mut s,
            &Msg::Hello {
                rank: self.rank,
                nranks: self.nranks,
                info: me,
            },
        )?;
        let left = self.deadline.saturating_duration_since(Instant::now());
        s.set_read_timeout(Some(left.max(self.cfg.handshake_timeout)))
            .ok();
        match recv_msg(&mut s) {
            Ok(Msg::Joined { parent, children }) => {
                Ok(parent.into_iter().chain(children).collect())
            }
            Ok(Msg::Fail { reason, missing }) if missing.contains(&self.rank) => Err(self
                .timeout_error(
                    format!("this rank came after the others gave up ({reason})"),
                    missing,
                )),
            Ok(Msg::Fail { reason, missing }) if !missing.is_empty() => {
                Err(self.timeout_error(reason, missing))
            }
            Ok(Msg::Fail { reason, .. }) => Err(Error::InvalidArgument(format!(
                "bootstrap root refused this rank: {reason}"
            ))),
            Ok(other) => Err(Error::Transport(format!(
                "unexpected bootstrap message {other:?}"
            ))),
            Err(e) => Err(self.timeout_error(
                format!("no answer from the bootstrap root {root}: {e}"),
                vec![],
            )),
        }
    }

    /// Opens the tree edge to `peer`, which registered first.
    fn connect(&mut self, peer: usize, addr: SocketAddr) -> Result<()> {
        let mut s = connect_authenticated(
            addr,
            &self.id.secret(),
            self.deadline,
            self.cfg.handshake_timeout,
            Retry::No,
        )?;
        send_msg(
            &mut s,
            &Msg::Connect {
                comm: self.comm.to_string(),
                from: self.rank,
                to: peer,
                kind: ConnectKind::Tree,
            },
        )?;
        s.set_read_timeout(Some(self.cfg.handshake_timeout)).ok();
        match recv_msg(&mut s)? {
            Msg::Ack => {
                s.set_read_timeout(None).ok();
                self.edges.insert(peer, s);
                Ok(())
            }
            other => Err(Error::Transport(format!(
                "rank {peer} refused the bootstrap tree edge: {other:?}"
            ))),
        }
    }

    /// The edge to `peer`: opened by this rank, or taken from the listener's inbox when it
    /// arrives (until the deadline).
    fn edge(&mut self, peer: usize, inbox: &TreeInbox) -> Option<&mut TcpStream> {
        if !self.edges.contains_key(&peer) {
            let s = inbox.take(peer, self.deadline)?;
            s.set_read_timeout(None).ok();
            self.edges.insert(peer, s);
        }
        self.edges.get_mut(&peer)
    }

    /// `peer`'s next frame, a subtree or a table, read until `until`. A failure verdict, a
    /// broken or silent edge, or any other frame fails init here and is passed on.
    fn receive(&mut self, peer: usize, until: Instant, expected: &str) -> Result<Msg> {
        match self.read(peer, until) {
            Ok(msg @ (Msg::Subtree { .. } | Msg::Table { .. })) => Ok(msg),
            Ok(Msg::Fail { reason, missing }) => Err(self.fail(reason, missing, Some(peer))),
            Ok(other) => Err(self.wrong_frame(peer, &format!("{other:?}"), expected)),
            Err(e) => {
                let timed_out = Instant::now() >= self.deadline;
                Err(self.fail_waiting_on(peer, &format!("sent no {expected} ({e})"), timed_out))
            }
        }
    }

    /// Fails init because `peer` sent `got` where `expected` belonged.
    fn wrong_frame(&mut self, peer: usize, got: &str, expected: &str) -> Error {
        self.fail(
            format!("rank {peer} sent {got} instead of a {expected}"),
            vec![peer],
            Some(peer),
        )
    }

    /// Reads one frame from `peer`'s edge until `until`.
    fn read(&mut self, peer: usize, until: Instant) -> Result<Msg> {
        let s = self
            .edges
            .get_mut(&peer)
            .ok_or_else(|| Error::Transport(format!("no edge to rank {peer}")))?;
        let left = until.saturating_duration_since(Instant::now());
        s.set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .ok();
        recv_msg(s)
    }
}

/// Joins the rendezvous at the directory named by `id` and returns every rank's description,
/// in rank order. `inbox` is where this rank's listener puts the tree edges others open to it;
/// `comm` is the communicator id those edges name.
pub(crate) fn rendezvous(
    id: &UniqueId,
    nranks: usize,
    me: PeerInfo,
    cfg: &crate::Config,
    comm: &str,
    inbox: &TreeInbox,
) -> Result<Vec<PeerInfo>> {
    let start = Instant::now();
    let rank = me.rank;
    let mut rv = Rendezvous {
        id,
        comm,
        cfg,
        rank,
        nranks,
        start,
        deadline: start + cfg.init_timeout,
        edges: BTreeMap::new(),
    };
    let neighbours = rv.register(me.clone())?;
    let registered_s = start.elapsed().as_secs_f64();
    for (peer, addr) in neighbours {
        if let Err(e) = rv.connect(peer, addr) {
            tracing::warn!(rank, peer, error = %e, "bootstrap: no tree edge");
            return Err(rv.fail_waiting_on(peer, &format!("cannot be reached ({e})"), false));
        }
    }
    // Up: this rank's subtree, from its children's.
    let mut subtree = vec![me];
    for child in tree_children(rank, nranks) {
        if rv.edge(child, inbox).is_none() {
            return Err(rv.fail_waiting_on(child, "never connected to its bootstrap parent", true));
        }
        match rv.receive(child, rv.deadline, "subtree")? {
            Msg::Subtree { peers } => subtree.extend(peers),
            _ => return Err(rv.wrong_frame(child, "a rank table", "subtree")),
        }
    }
    let gathered_s = start.elapsed().as_secs_f64();
    let table = match tree_parent(rank) {
        None => {
            subtree.sort_by_key(|p| p.rank);
            let whole =
                subtree.len() == nranks && subtree.iter().enumerate().all(|(i, p)| p.rank == i);
            if !whole {
                return Err(rv.fail(
                    "the bootstrap tree delivered a malformed rank table".into(),
                    vec![],
                    None,
                ));
            }
            subtree
        }
        Some(parent) => {
            let Some(up) = rv.edge(parent, inbox) else {
                return Err(rv.fail_waiting_on(
                    parent,
                    "never connected to its bootstrap child",
                    true,
                ));
            };
            if let Err(e) = send_msg(up, &Msg::Subtree { peers: subtree }) {
                return Err(rv.fail_waiting_on(parent, &format!("left ({e})"), false));
            }
            match rv.receive(parent, rv.deadline + PARENT_GRACE, "rank table")? {
                Msg::Table { peers } => {
                    let whole =
                        peers.len() == nranks && peers.iter().enumerate().all(|(i, p)| p.rank == i);
                    if !whole {
                        return Err(Error::Transport(
                            "bootstrap parent sent a malformed rank table".into(),
                        ));
                    }
                    peers
                }
                _ => return Err(rv.wrong_frame(parent, "a subtree", "rank table")),
            }
        }
    };
    // Down: the table to every child, encoded once.
    let msg = Msg::Table { peers: table };
    let frame = encode_msg(&msg)?;
    for child in tree_children(rank, nranks) {
        if let Some(s) = rv.edges.get_mut(&child) {
            s.set_write_timeout(Some(
                rv.deadline
                    .saturating_duration_since(Instant::now())
                    .max(PARENT_GRACE),
            ))
            .ok();
            if let Err(e) = std::io::Write::write_all(s, &frame) {
                tracing::warn!(rank, child, error = %e, "bootstrap: could not pass the table on");
            }
        }
    }
    if rank == 0 {
        let _ = rv.ask_directory(&Msg::Done);
    }
    let Msg::Table { peers } = msg else {
        unreachable!("built as a table above")
    };
    tracing::debug!(
        rank,
        registered_s,
        gathered_s,
        done_s = start.elapsed().as_secs_f64(),
        table_bytes = frame.len(),
        "bootstrap tree rendezvous"
    );
    Ok(peers)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One exchange with the root at `addr` holding `secret`.
    fn ask_root(addr: SocketAddr, secret: &Secret, question: &Msg) -> Result<Msg> {
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut c =
            connect_authenticated(addr, secret, deadline, Duration::from_secs(5), Retry::No)?;
        send_msg(&mut c, question)?;
        recv_msg(&mut c)
    }

    #[test]
    fn a_job_root_answers_where_ranks_listen_until_it_is_dropped() {
        let secret = [7; 16];
        let (id, root) = UniqueId::serve_job(
            "127.0.0.1:0".parse().unwrap(),
            secret,
            Duration::from_secs(10),
        )
        .unwrap();
        let addr = id.root_addr();
        let host = strata_topology::HostIdentity::detect();
        for rank in 0..2 {
            let info = PeerInfo {
                rank,
                host: host.clone(),
                pid: 40 + rank as u32,
                process: 0,
                listen: SocketAddr::from(([127, 0, 0, 1], 9000 + rank as u16)),
                place: Default::default(),
                transports: Default::default(),
                probe: Default::default(),
            };
            let hello = Msg::Hello {
                rank,
                nranks: 2,
                info,
            };
            assert!(matches!(
                ask_root(addr, &secret, &hello),
                Ok(Msg::Joined { .. })
            ));
        }
        assert!(matches!(ask_root(addr, &secret, &Msg::Done), Ok(Msg::Ack)));
        // The table went down the tree; the root stays for status clients.
        std::thread::sleep(Duration::from_millis(300));
        let Ok(Msg::Located { nranks, ranks }) =
            ask_root(addr, &secret, &Msg::Locate { ranks: vec![1, 5] })
        else {
            panic!("no answer to Locate");
        };
        assert_eq!(nranks, 2);
        assert_eq!(ranks.len(), 1, "rank 5 does not exist");
        assert_eq!((ranks[0].rank, ranks[0].pid), (1, 41));
        assert_eq!(ranks[0].listen.port(), 9001);
        assert!(ask_root(addr, &[8; 16], &Msg::Locate { ranks: vec![0] }).is_err());
        // Dropped: the port is closed when drop returns.
        let t = Instant::now();
        drop(root);
        assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
        let e = ask_root(addr, &secret, &Msg::Locate { ranks: vec![0] }).unwrap_err();
        assert!(crate::wire::is_refused(&e), "{e}");
    }

    #[test]
    fn a_rank_that_registers_and_vanishes_is_named_by_the_others() {
        let id = UniqueId::serve(
            "127.0.0.1:0".parse().unwrap(),
            [5; 16],
            Duration::from_secs(5),
        )
        .unwrap();
        // Rank 2 registers with a listener that is closed at once, then is gone.
        let gone = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let info = PeerInfo {
            rank: 2,
            host: strata_topology::HostIdentity::detect(),
            pid: 1,
            process: 1,
            listen: gone,
            place: Default::default(),
            transports: Default::default(),
            probe: Default::default(),
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut s = connect_authenticated(
            id.root_addr(),
            &id.secret(),
            deadline,
            deadline - Instant::now(),
            Retry::UntilDeadline,
        )
        .unwrap();
        send_msg(
            &mut s,
            &Msg::Hello {
                rank: 2,
                nranks: 3,
                info,
            },
        )
        .unwrap();
        assert!(matches!(recv_msg(&mut s).unwrap(), Msg::Joined { .. }));
        let mut cfg = crate::Config::from_env().unwrap();
        cfg.listen_ip = "127.0.0.1".parse().unwrap();
        cfg.init_timeout = Duration::from_secs(3);
        let results: Vec<_> = std::thread::scope(|sc| {
            let hs: Vec<_> = (0..2)
                .map(|r| {
                    let cfg = cfg.clone();
                    sc.spawn(move || crate::Communicator::init_with_config(&id, 3, r, cfg))
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (rank, res) in results.into_iter().enumerate() {
            match res {
                Err(Error::Timeout { waiting_on, op, .. }) => {
                    assert_eq!(waiting_on, vec![2], "rank {rank}: {op}");
                    assert!(op.contains("rank 2 cannot be reached"), "rank {rank}: {op}");
                }
                Err(e) => panic!("rank {rank}: expected a timeout naming rank 2, got {e}"),
                Ok(_) => panic!("rank {rank}: init succeeded without rank 2"),
            }
        }
    }

    #[test]
    fn the_tree_covers_every_rank_once_and_is_logarithmically_deep() {
        for n in [1, 2, 7, 8, 9, 64, 65, 73, 1000, 1024, 24_576] {
            let mut seen = vec![0usize; n];
            seen[0] += 1;
            for r in 0..n {
                for c in tree_children(r, n) {
                    assert_eq!(tree_parent(c), Some(r), "n {n}: child {c} of {r}");
                    seen[c] += 1;
                }
            }
            assert!(seen.iter().all(|&k| k == 1), "n {n}: every rank once");
            // ⌈log_8 n⌉ levels at most.
            let mut levels = 0;
            while TREE_FANOUT.pow(levels) < n {
                levels += 1;
            }
            assert!(
                tree_depth(n) <= levels as usize,
                "n {n}: depth {}",
                tree_depth(n)
            );
        }
        assert_eq!(tree_depth(1), 0);
        assert_eq!(tree_depth(9), 1);
        assert_eq!(tree_depth(10), 2);
        assert_eq!(tree_depth(24_576), 5);
        assert_eq!(tree_depth(98_304), 6);
    }
}
