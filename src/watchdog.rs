//! The watchdog: heartbeats over skip links, failure detection, and an abort that floods the
//! links so that every survivor fails fast, within ⌈lg p⌉ + 1 hops, with the same precise
//! error.
//!
//! Rank r opens a watchdog link to each rank r + 2^k (mod p, 2^k < p) and accepts one from
//! each rank r − 2^k: about 2 lg p links (30 at 24,576 ranks), and any two ranks are at most
//! ⌈lg p⌉ links apart (a distance's binary digits, one link each). A thread per communicator
//! sends a heartbeat on every link every interval (`STRATA_HEARTBEAT_MS`, default 1000)
//! carrying what the rank is doing, and declares a neighbour failed when
//!
//! * its link closes or resets without a goodbye (the process died: detected at once), or
//! * no frame has arrived for `STRATA_HEARTBEAT_MISSES` intervals (default 3: the process is
//!   stopped or its threads hung).
//!
//! A fault found here, or one a collective call on this rank ran into, is recorded in the
//! communicator's health record (which interrupts the call in progress) and sent on every link
//! as an abort; a rank that learns of a fault first from a neighbour records it and passes it
//! on every other link, counting hops, and passes on again any later copy from the same origin
//! that came by a shorter route, so that each rank learns its distance from the origin. Every
//! rank ends up failing with the error of the rank that saw it first.

use crate::config::Config;
use crate::error::{Error, Result};
use crate::wire::{self, ConnectKind, Handler, Incoming, Msg, PeerInfo, Secret};
use serde::{Deserialize, Serialize};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixDatagram;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod flight;
mod health;
pub mod stragglers;
pub use crate::wire::Progress;
pub use health::FlightRecord;
pub(crate) use health::{Health, dump_trace};
pub use stragglers::Straggler;

/// Largest watchdog frame; a longer length field is a protocol error, not an allocation.
const MAX_FRAME: usize = 64 << 10;

/// Frames on a watchdog link.
#[derive(Clone, Debug, Serialize, Deserialize)]
enum Frame {
    /// "I am alive, and this is what I am doing."
    Heartbeat(Progress),
    /// The communicator is broken; `origin` saw it first, `hops` links ago.
    Abort {
        origin: usize,
        error: Error,
        #[serde(default)]
        hops: u32,
    },
    /// The sender is destroying its communicator; its link closing next is not a failure.
    Goodbye,
}

/// The ranks `rank` opens watchdog links to: rank + 2^k (mod p) for 2^k < p, once each.
pub(crate) fn link_targets(rank: usize, p: usize) -> Vec<usize> {
    let mut out: Vec<usize> = std::iter::successors(Some(1usize), |k| k.checked_mul(2))
        .take_while(|&k| k < p)
        .map(|k| (rank + k) % p)
        .filter(|&q| q != rank)
        .collect();
    out.dedup();
    out
}

/// The ranks that open watchdog links to `rank`: rank − 2^k (mod p) for 2^k < p.
pub(crate) fn link_sources(rank: usize, p: usize) -> Vec<usize> {
    let mut out: Vec<usize> = std::iter::successors(Some(1usize), |k| k.checked_mul(2))
        .take_while(|&k| k < p)
        .map(|k| (rank + p - k) % p)
        .filter(|&q| q != rank)
        .collect();
    out.dedup();
    out
}

/// One watchdog link to a neighbour.
struct Link {
    peer: usize,
    stream: TcpStream,
    inbox: Vec<u8>,
    /// Bytes of frames not yet written (the socket is non-blocking).
    outbox: Vec<u8>,
    last_heard: Instant,
    last_report: Progress,
    /// When `last_report` came (none yet: `None`).
    last_report_at: Option<Instant>,
    /// The neighbour said goodbye (or the link already failed): no longer watched.
    closed: bool,
}

impl Link {
    fn new(peer: usize, stream: TcpStream) -> Result<Self> {
        stream
            .set_nonblocking(true)
            .map_err(|e| Error::io("watchdog link", e))?;
        let _ = stream.set_nodelay(true);
        Ok(Self {
            peer,
            stream,
            inbox: Vec::new(),
            outbox: Vec::new(),
            last_heard: Instant::now(),
            last_report: Progress::default(),
            last_report_at: None,
            closed: false,
        })
    }

    /// What the neighbour last said it was doing, and how long ago: a heartbeat comes once
    /// an interval, so the report may be older than the failure by up to that much.
    fn last_seen(&self) -> String {
        match self.last_report_at {
            Some(t) => format!(
                "last seen {}, reported {:.1} s before",
                self.last_report.describe(),
                t.elapsed().as_secs_f64()
            ),
            None => "no progress heard from it yet".into(),
        }
    }

    /// Queues one frame and writes what the socket takes now. A heartbeat is skipped while
    /// earlier bytes still wait (the neighbour is not reading; the next one will do); an abort
    /// or goodbye is written out in full, waiting up to a second.
    fn send(&mut self, frame: &Frame) {
        if self.closed {
            return;
        }
        let urgent = !matches!(frame, Frame::Heartbeat(_));
        if !urgent && !self.outbox.is_empty() {
            self.flush();
            return;
        }
        let Ok(body) = serde_json::to_vec(frame) else {
            return;
        };
        self.outbox
            .extend_from_slice(&(body.len() as u32).to_le_bytes());
        self.outbox.extend_from_slice(&body);
        if urgent {
            let _ = self.stream.set_nonblocking(false);
            let _ = self.stream.set_write_timeout(Some(Duration::from_secs(1)));
            let _ = self.stream.write_all(&self.outbox);
            self.outbox.clear();
            let _ = self.stream.set_nonblocking(true);
        } else {
            self.flush();
        }
    }

    /// Writes as much of the outbox as the socket takes without blocking.
    fn flush(&mut self) {
        while !self.outbox.is_empty() {
            match self.stream.write(&self.outbox) {
                Ok(0) => break,
                Ok(n) => {
                    self.outbox.drain(..n);
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                // WouldBlock: later. Anything else: the read side will report the broken link.
                Err(_) => break,
            }
        }
    }

    /// Reads what has arrived: the frames, then `Err(reason)` if the link broke.
    fn receive(&mut self, out: &mut Vec<Frame>) -> std::result::Result<(), String> {
        let mut chunk = [0u8; 4096];
        loop {
            match self.stream.read(&mut chunk) {
                Ok(0) => return Err("its watchdog link closed".into()),
                Ok(n) => {
                    self.inbox.extend_from_slice(&chunk[..n]);
                    self.last_heard = Instant::now();
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(format!("its watchdog link failed: {e}")),
            }
            while self.inbox.len() >= 4 {
                let len = u32::from_le_bytes([
                    self.inbox[0],
                    self.inbox[1],
                    self.inbox[2],
                    self.inbox[3],
                ]) as usize;
                if len > MAX_FRAME {
                    return Err(format!("it sent a {len}-byte watchdog frame"));
                }
                if self.inbox.len() < 4 + len {
                    break;
                }
                let frame = serde_json::from_slice(&self.inbox[4..4 + len])
                    .map_err(|e| format!("it sent a malformed watchdog frame: {e}"))?;
                self.inbox.drain(..4 + len);
                out.push(frame);
            }
        }
        Ok(())
    }
}

/// Links the ranks 2^k behind opened to this rank's listener, until the watchdog takes them.
pub(crate) type LinkInbox = Arc<Mutex<Vec<(usize, TcpStream)>>>;

/// The listener's handler for `ConnectKind::Watchdog`: only the ranks 2^k behind `rank` (of
/// `nranks`) open a link to it, once each; the link waits in `inbox` for the watchdog thread.
pub(crate) fn link_handler(rank: usize, nranks: usize, inbox: LinkInbox) -> Handler {
    Arc::new(move |incoming: Incoming| {
        let Incoming {
            from, mut stream, ..
        } = incoming;
        if !link_sources(rank, nranks).contains(&from) {
            return Err(wire::refuse(
                &mut stream,
                format!("rank {from} does not watch rank {rank}"),
            ));
        }
        let mut links = inbox
            .lock()
            .map_err(|_| Error::Transport("watchdog inbox lock poisoned".into()))?;
        if links.iter().any(|(r, _)| *r == from) {
            return Err(wire::refuse(
                &mut stream,
                format!("rank {from} already has a watchdog link"),
            ));
        }
        wire::send_msg(&mut stream, &Msg::Ack)?;
        stream.set_read_timeout(None).ok();
        links.push((from, stream));
        Ok(())
    })
}

/// The listener's handler for `ConnectKind::Status`: what this rank is doing.
pub(crate) fn status_handler(health: Arc<Health>) -> Handler {
    Arc::new(move |incoming: Incoming| {
        let mut stream = incoming.stream;
        wire::send_msg(&mut stream, &Msg::Status(health.progress()))
    })
}

/// What the watchdog thread needs.
pub(crate) struct WatchdogSetup {
    pub comm_id: String,
    pub rank: usize,
    pub peers: Vec<PeerInfo>,
    pub secret: Secret,
    pub cfg: Config,
    pub health: Arc<Health>,
    /// Hands over the links the ranks 2^k behind opened (from the communicator's listener).
    pub incoming: LinkInbox,
}

/// A running watchdog; dropping it says goodbye to both neighbours and stops the thread.
pub(crate) struct Watchdog {
    wake: UnixDatagram,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watchdog {
    /// Starts the watchdog of a communicator of two or more ranks (`None` when heartbeats are
    /// off or the communicator has one rank).
    pub fn start(setup: WatchdogSetup) -> Result<Option<Self>> {
        if setup.peers.len() < 2 || setup.cfg.heartbeat_interval.is_zero() {
            return Ok(None);
        }
        // Datagrams: a send whose reader is gone fails with an error, never with SIGPIPE (this
        // code also runs inside C programs that keep SIGPIPE's default).
        let (wake, wake_rx) = UnixDatagram::pair().map_err(|e| Error::io("watchdog wake", e))?;
        wake_rx
            .set_nonblocking(true)
            .map_err(|e| Error::io("watchdog wake", e))?;
        let fault_waker = wake
            .try_clone()
            .map_err(|e| Error::io("watchdog wake", e))?;
        fault_waker
            .set_nonblocking(true)
            .map_err(|e| Error::io("watchdog wake", e))?;
        if let Ok(mut w) = setup.health.waker.lock() {
            *w = Some(fault_waker);
        }
        let stop = Arc::new(AtomicBool::new(false));
        let st = stop.clone();
        let thread = std::thread::Builder::new()
            .name(format!("strata-watch-{}", setup.rank))
            .spawn(move || Runner::new(setup, wake_rx, st).run())
            .map_err(|e| Error::io("spawning the watchdog", e))?;
        Ok(Some(Self {
            wake,
            stop,
            thread: Some(thread),
        }))
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        let _ = self.wake.send(&[1]);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

struct Runner {
    s: WatchdogSetup,
    wake: UnixDatagram,
    stop: Arc<AtomicBool>,
    /// Links to the ranks 2^k ahead (opened here) and from those 2^k behind (accepted).
    links: Vec<Link>,
    /// The ranks whose links have not arrived yet.
    awaited: Vec<usize>,
    /// The abort this rank has sent its neighbours (also sent to a link that joins later).
    announced: Option<Frame>,
    started: Instant,
    interval: Duration,
    misses: u32,
    /// Link targets whose listener refused the connection, with when it first did: tried
    /// again each heartbeat, and a fault only after as many intervals as a silent link gets.
    /// A sub-communicator is made without a rendezvous, so a member may exit (its program
    /// done) before another's watchdog first dials it.
    refused: Vec<(usize, Instant)>,
}

impl Runner {
    fn new(s: WatchdogSetup, wake: UnixDatagram, stop: Arc<AtomicBool>) -> Self {
        let p = s.peers.len();
        let interval = s.cfg.heartbeat_interval;
        let misses = s.cfg.heartbeat_misses.max(1);
        Self {
            awaited: link_sources(s.rank, p),
            s,
            wake,
            stop,
            links: Vec::new(),
            announced: None,
            started: Instant::now(),
            interval,
            misses,
            refused: Vec::new(),
        }
    }

    fn peer_failed(&self, rank: usize, reason: String) -> Error {
        wire::peer_failed(&self.s.peers[rank], reason)
    }

    /// Records a fault found here and announces it (once) to both neighbours.
    fn fault(&mut self, e: Error) {
        if self.s.health.record_fault(&e) {
            tracing::error!(rank = self.s.rank, "watchdog: {e}");
            self.dump_trace();
        }
        self.announce();
    }

    fn announce(&mut self) {
        if self.announced.is_some() {
            return;
        }
        let Some(error) = self.s.health.fault() else {
            return;
        };
        let frame = Frame::Abort {
            origin: self.s.rank,
            error,
            hops: 1,
        };
        for l in &mut self.links {
            l.send(&frame);
        }
        self.announced = Some(frame);
    }

    fn add_link(&mut self, peer: usize, stream: TcpStream) {
        match Link::new(peer, stream) {
            Ok(mut link) => {
                if let Some(frame) = &self.announced {
                    link.send(frame);
                }
                self.links.push(link);
            }
            Err(e) => self.fault(self.peer_failed(peer, e.to_string())),
        }
    }

    fn dump_trace(&self) {
        let me = &self.s.peers[self.s.rank];
        dump_trace(
            self.s.cfg.trace_dir.as_deref(),
            &self.s.comm_id,
            me,
            &self.s.peers[0],
            &self.s.health,
        );
    }

    /// Opens the links to the ranks 2^k ahead.
    fn connect_targets(&mut self) {
        for target in link_targets(self.s.rank, self.s.peers.len()) {
            self.connect(target);
        }
    }

    fn connect(&mut self, target: usize) {
        let peer = &self.s.peers[target];
        let hs = self.s.cfg.handshake_timeout;
        let opened = wire::open_request(
            &self.s.comm_id,
            self.s.rank,
            peer,
            &self.s.secret,
            Instant::now() + hs,
            hs,
            ConnectKind::Watchdog,
        )
        .and_then(|mut s| {
            s.set_read_timeout(Some(hs)).ok();
            match wire::recv_msg(&mut s)? {
                Msg::Ack => Ok(s),
                other => Err(Error::Transport(format!("answered {other:?}"))),
            }
        });
        // A refusal is tried again at the next heartbeat until it has lasted as long as a
        // silent link may; any other outcome settles the target.
        let try_later =
            matches!(&opened, Err(e) if wire::is_refused(e)) && !self.refused_too_long(target);
        if !try_later {
            self.refused.retain(|r| r.0 != target);
        }
        match opened {
            Ok(stream) => self.add_link(target, stream),
            // The socket could not be made here: this rank is at fault, not the target.
            Err(e) if wire::is_out_of_descriptors(&e) => {
                let e = self.peer_failed(
                    self.s.rank,
                    format!("opening its watchdog link to rank {target}: {e}"),
                );
                self.fault(e);
            }
            // The target destroyed this communicator already: as if it had said goodbye.
            Err(e) if e.to_string().contains(crate::connection::DESTROYED) => {
                tracing::debug!(rank = self.s.rank, target, "watchdog link: {e}");
            }
            // The target is alive but has not made this communicator: its members disagree.
            Err(e) if e.to_string().contains(crate::connection::NOT_SERVED) => {
                let peer = &self.s.peers[target];
                self.fault(Error::Mismatch(format!(
                    "rank {target} (host {}, pid {}) has not made this communicator within {:.1} s: \
                     the members of a sub-communicator disagree on its member list or tag, or \
                     rank {target} never made it",
                    peer.host.hostname,
                    peer.pid,
                    hs.as_secs_f64()
                )));
            }
            Err(e) if try_later => {
                tracing::debug!(
                    rank = self.s.rank,
                    target,
                    "watchdog link refused, again later: {e}"
                );
            }
            Err(e) => {
                let cause = wire::unreachable_cause(&e);
                let e = self.peer_failed(
                    target,
                    format!("its listener did not take the watchdog link ({e}); {cause}"),
                );
                self.fault(e);
            }
        }
    }

    /// Whether `target` has refused its link for longer than a silent link may be silent;
    /// remembers the first refusal.
    fn refused_too_long(&mut self, target: usize) -> bool {
        let now = Instant::now();
        let since = match self.refused.iter().find(|r| r.0 == target) {
            Some(&(_, first)) => first,
            None => {
                self.refused.push((target, now));
                now
            }
        };
        now.duration_since(since) > self.interval * self.misses
    }

    /// Dials again the link targets that refused.
    fn retry_refused(&mut self) {
        let targets: Vec<usize> = self.refused.iter().map(|r| r.0).collect();
        for target in targets {
            self.connect(target);
        }
    }

    /// Adds the links that arrived from the ranks behind.
    fn take_incoming(&mut self) {
        let arrived: Vec<(usize, TcpStream)> = self
            .s
            .incoming
            .lock()
            .map(|mut v| std::mem::take(&mut *v))
            .unwrap_or_default();
        for (peer, stream) in arrived {
            self.awaited.retain(|&r| r != peer);
            self.add_link(peer, stream);
        }
    }

    fn run(mut self) {
        self.connect_targets();
        let mut next_beat = Instant::now();
        let mut frames = Vec::new();
        while !self.stop.load(Ordering::Acquire) {
            if !self.awaited.is_empty() {
                self.take_incoming();
                if let Some(&late) = self.awaited.first()
                    && self.started.elapsed() > self.s.cfg.init_timeout
                {
                    self.awaited.clear();
                    let e = self.peer_failed(
                        late,
                        format!(
                            "it never opened its watchdog link in {:.0} s",
                            self.s.cfg.init_timeout.as_secs_f64()
                        ),
                    );
                    self.fault(e);
                }
            }
            // A fault a call on this rank ran into goes to the neighbours too.
            if self.announced.is_none() && self.s.health.has_failed.load(Ordering::Acquire) {
                self.announce();
            }
            for l in &mut self.links {
                l.flush();
            }
            let now = Instant::now();
            if now >= next_beat {
                let beat = Frame::Heartbeat(self.s.health.progress());
                for l in &mut self.links {
                    l.send(&beat);
                }
                next_beat = now + self.interval;
                self.retry_refused();
            }
            self.drain_wake();
            self.read_links(&mut frames);
            self.check_silence();
            let wait = next_beat
                .saturating_duration_since(Instant::now())
                .min(Duration::from_millis(250))
                .max(Duration::from_millis(1));
            self.poll(wait);
        }
        // Links that arrived after the last look still get their goodbye (a communicator
        // destroyed within a few hundred milliseconds of init would otherwise close them
        // unread, which their owners see as this process dying).
        self.take_incoming();
        // A fault recorded just before the communicator was dropped still goes out first.
        if self.announced.is_none() && self.s.health.has_failed.load(Ordering::Acquire) {
            self.announce();
        }
        for l in &mut self.links {
            l.send(&Frame::Goodbye);
        }
    }

    /// Passes an abort that came over link `came_on`, `hops` links from `origin`, on to every
    /// other neighbour, and remembers it as what this rank has said.
    fn pass_on(&mut self, came_on: usize, origin: usize, error: Error, hops: u32) {
        let frame = Frame::Abort {
            origin,
            error,
            hops: hops + 1,
        };
        for (j, l) in self.links.iter_mut().enumerate() {
            if j != came_on {
                l.send(&frame);
            }
        }
        self.announced = Some(frame);
    }

    fn drain_wake(&self) {
        let mut buf = [0u8; 64];
        while matches!(self.wake.recv(&mut buf), Ok(n) if n > 0) {}
    }

    fn read_links(&mut self, frames: &mut Vec<Frame>) {
        for i in 0..self.links.len() {
            if self.links[i].closed {
                continue;
            }
            frames.clear();
            let res = self.links[i].receive(frames);
            for f in frames.drain(..) {
                match f {
                    Frame::Heartbeat(p) => {
                        self.links[i].last_report = p;
                        self.links[i].last_report_at = Some(Instant::now());
                    }
                    Frame::Goodbye => self.links[i].closed = true,
                    Frame::Abort {
                        origin,
                        error,
                        hops,
                    } => {
                        let from = self.links[i].peer;
                        if self.s.health.record_fault(&error) {
                            tracing::error!(
                                rank = self.s.rank,
                                "aborting: rank {origin} reported {error} (heard from rank \
                                 {from}, {hops} hops from rank {origin})"
                            );
                            self.dump_trace();
                            // This rank need not announce it again.
                            self.pass_on(i, origin, error, hops);
                        } else if let Some(Frame::Abort {
                            origin: first,
                            hops: passed_on,
                            ..
                        }) = &self.announced
                            && *first == origin
                            && hops + 1 < *passed_on
                        {
                            // A shorter route from the same origin: pass it on too, so that
                            // every rank learns its distance (at most ⌈lg p⌉ links) even when
                            // a longer route won the race. Each rank improves a few times.
                            tracing::warn!(
                                rank = self.s.rank,
                                "abort: heard again from rank {from}, {hops} hops from rank \
                                 {origin}"
                            );
                            self.pass_on(i, origin, error, hops);
                        }
                    }
                }
            }
            if let Err(reason) = res {
                let link = &mut self.links[i];
                if link.closed {
                    continue;
                }
                link.closed = true;
                let peer = link.peer;
                let last = link.last_seen();
                let pid = self.s.peers[peer].pid;
                let e = self.peer_failed(
                    peer,
                    format!(
                        "{reason} without a goodbye: process {pid} exited or was killed ({last})"
                    ),
                );
                self.fault(e);
            }
        }
    }

    fn check_silence(&mut self) {
        let limit = self.interval * self.misses;
        for i in 0..self.links.len() {
            let l = &self.links[i];
            if l.closed || l.last_heard.elapsed() < limit {
                continue;
            }
            let (peer, last) = (l.peer, l.last_seen());
            let unacked = unacknowledged_for(&l.stream);
            self.links[i].closed = true;
            let silent = self.links[i].last_heard.elapsed().as_secs_f64();
            let cause = match unacked {
                // The peer's kernel would acknowledge our heartbeats even if the process were
                // stopped: none came back, so the packets did not reach it.
                Some(ack) if ack.as_secs_f64() >= silent * 0.5 => format!(
                    " and its host has acknowledged none of this rank's packets for {:.1} s: \
                     the network between them went silent (a partition, a dead link or a host \
                     that is down; the process itself may still be running)",
                    ack.as_secs_f64()
                ),
                _ => ": the process is stopped or hung".to_string(),
            };
            let e = self.peer_failed(
                peer,
                format!(
                    "no heartbeat for {silent:.1} s ({} missed at {} ms){cause} ({last})",
                    self.misses,
                    self.interval.as_millis()
                ),
            );
            self.fault(e);
        }
    }

    /// Sleeps until a link has data, the wake pipe is written, or `wait` passes.
    fn poll(&self, wait: Duration) {
        let mut fds: Vec<std::os::fd::RawFd> = self
            .links
            .iter()
            .filter(|l| !l.closed)
            .map(|l| l.stream.as_raw_fd())
            .collect();
        fds.push(self.wake.as_raw_fd());
        crate::transport::wait_readable(&fds, wait);
    }
}

/// How long the peer's host has left this side's sent data unacknowledged, if some is
/// outstanding (`TCP_INFO`): `None` when everything sent was acknowledged or the kernel says
/// nothing.
fn unacknowledged_for(stream: &TcpStream) -> Option<Duration> {
    // SAFETY: tcp_info is plain integers; all zeros is a valid value.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: a live socket and a buffer of the length given.
    let r = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        )
    };
    (r == 0 && info.tcpi_unacked > 0)
        .then(|| Duration::from_millis(u64::from(info.tcpi_last_ack_recv)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every rank opens links to and accepts links from ⌈lg p⌉ ranks or fewer, the two lists
    /// agree, and a flood over the links reaches every rank within ⌈lg p⌉ links of any origin.
    #[test]
    fn skip_links_reach_every_rank_within_lg_p_hops() {
        for p in (2usize..=130).chain([257, 1000, 1024, 24_576]) {
            let lg = usize::BITS - (p - 1).leading_zeros();
            let mut adj: Vec<Vec<usize>> = vec![Vec::new(); p];
            for r in 0..p {
                let out = link_targets(r, p);
                assert!(out.len() <= lg as usize, "p={p} r={r}: {out:?}");
                for &q in &out {
                    assert!(link_sources(q, p).contains(&r), "p={p}: {r}->{q}");
                    adj[r].push(q);
                    adj[q].push(r);
                }
            }
            // Links are alike up to rotation, so one origin is every origin.
            let origins: &[usize] = if p > 2000 { &[0] } else { &[0, p / 3, p - 1] };
            for &o in origins {
                let mut dist = vec![u32::MAX; p];
                dist[o] = 0;
                let mut queue = std::collections::VecDeque::from([o]);
                while let Some(r) = queue.pop_front() {
                    for &q in &adj[r] {
                        if dist[q] == u32::MAX {
                            dist[q] = dist[r] + 1;
                            queue.push_back(q);
                        }
                    }
                }
                let far = *dist.iter().max().unwrap();
                assert!(far <= lg, "p={p} from {o}: {far} hops > {lg}");
            }
        }
    }
}
