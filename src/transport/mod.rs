//! Transports: how bytes move between two ranks.
//!
//! Every transport is a pair of ordered byte streams (one per direction) with non-blocking
//! `send_some` / `recv_some` calls, so the executor can progress many transfers at once and
//! bound every wait by a deadline and the abort flag. [`Transport::wait_for`] says what to
//! sleep on when nothing can move.
//!
//! Each transport is a folder here implementing [`Connector`] (can it join two ranks, what its
//! connecting half offers, how its accepting half answers), with one line in [`TABLE`].

mod connector;
pub(crate) mod futex;
pub(crate) mod inproc;
pub mod rdma;
pub(crate) mod ring;
pub(crate) mod shm;
pub(crate) mod tcp;

pub(crate) use connector::{Accepted, Answer, Connector, Dial, Offer, decode, encode};

/// The transports in order of preference, as NCCL's transport table: a new connection takes
/// the first that can join its two ranks, and the listener hands an offer to the one it names.
pub(crate) static TABLE: &[&dyn Connector] = &[
    &rdma::CONNECTOR,
    &inproc::CONNECTOR,
    &shm::CONNECTOR,
    &tcp::CONNECTOR,
];

/// The row of [`TABLE`] called `name`.
pub(crate) fn by_name(name: &str) -> Option<&'static dyn Connector> {
    TABLE.iter().copied().find(|c| c.name() == name)
}

/// The first row of [`TABLE`] that joins `me` and `peer` under `cfg`.
pub(crate) fn choose(
    cfg: &crate::config::Config,
    me: &crate::wire::PeerInfo,
    peer: &crate::wire::PeerInfo,
) -> Option<&'static dyn Connector> {
    TABLE.iter().copied().find(|c| c.can_connect(cfg, me, peer))
}

/// What this rank publishes at bootstrap, by transport ([`crate::PeerInfo::transports`]).
pub(crate) fn publish_all(
    cfg: &crate::config::Config,
) -> crate::error::Result<std::collections::BTreeMap<String, serde_json::Value>> {
    let mut out = std::collections::BTreeMap::new();
    for c in TABLE {
        if let Some(v) = c.publish(cfg)? {
            out.insert(c.name().to_string(), v);
        }
    }
    Ok(out)
}

/// 16 random hex digits, for names that must not collide (segments, registry keys).
pub(crate) fn random_hex() -> String {
    let mut b = [0u8; 8];
    let _ = getrandom::fill(&mut b);
    b.iter().map(|x| format!("{x:02x}")).collect()
}

use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::AtomicU32;

/// Which way a wait is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Direction {
    /// Room to send.
    Send,
    /// Data to receive.
    Recv,
}

/// Something a blocked transfer can sleep on.
pub(crate) enum Wait {
    /// Sleep while the word holds `expected`. `flag` is raised while sleeping so the other side
    /// knows to issue a wake.
    Futex {
        /// The word that changes on progress.
        word: *const AtomicU32,
        /// Its value when progress stopped.
        expected: u32,
        /// The "someone sleeps" flag of this direction.
        flag: *const AtomicU32,
    },
    /// Poll a descriptor (a socket, a completion channel) for these events.
    Fd {
        /// The descriptor.
        fd: RawFd,
        /// `POLLIN` or `POLLOUT`.
        events: i16,
    },
    /// Nothing to sleep on: poll again within this long (zero: at once).
    Within(std::time::Duration),
}

/// One connection's data path.
pub(crate) trait Transport: Send {
    /// A short name for logs: `shm`, `inproc`, `tcp`.
    fn name(&self) -> &'static str;
    /// Accepts as much of `data` as fits now and returns how much; never blocks.
    fn send_some(&mut self, data: &[u8]) -> io::Result<usize>;
    /// Sends `head` then `tail`, in one message where the transport can (one ring slot), and
    /// returns how many of their bytes it took, as `send_some`.
    fn send_some_pair(&mut self, head: &[u8], tail: &[u8]) -> io::Result<usize> {
        send_in_turn(self, head, tail)
    }
    /// Hands received bytes to `f` — at most `max`, in whole multiples of `granule` — and
    /// returns how many were consumed; never blocks.
    fn recv_some(
        &mut self,
        max: usize,
        granule: usize,
        f: &mut dyn FnMut(&[u8]),
    ) -> io::Result<usize>;
    /// Copies received bytes into `dst` and returns how many; never blocks.
    fn recv_into(&mut self, dst: &mut [u8]) -> io::Result<usize> {
        let mut done = 0;
        let max = dst.len();
        self.recv_some(max, 1, &mut |b| {
            crate::copy::copy(&mut dst[done..done + b.len()], b);
            done += b.len();
        })
    }
    /// Copies up to `dst.len()` received bytes into `dst` without consuming them (the next
    /// receive gets them again) and returns how many; never blocks. Receive from any source
    /// looks at each peer's next header this way; a transport that cannot look ahead says so.
    fn peek(&mut self, dst: &mut [u8]) -> io::Result<usize> {
        let _ = dst;
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!(
                "the {} transport cannot look at a message before receiving it",
                self.name()
            ),
        ))
    }
    /// What to sleep on until the given direction can make progress (a transport may arm a
    /// notification here).
    fn wait_for(&mut self, dir: Direction) -> Wait;
    /// Progress the connection makes without a caller, for a connection the current call does
    /// not wait on (reaping completions, sending credits it owes): an error if the connection
    /// has failed, and what to also sleep on, if anything. Shared memory and TCP need none.
    fn background(&mut self) -> io::Result<Option<Wait>> {
        Ok(None)
    }
    /// Whether bytes `send_some` accepted are still on their way: handed to a NIC that has
    /// not yet reported them delivered (it progresses the connection to find out). A rank
    /// must not tear such a connection down, or the bytes are lost: a queue pair destroyed
    /// with writes outstanding flushes them unsent. Shared memory and TCP, whose accepted
    /// bytes the peer or the kernel already holds, have none.
    fn sending(&mut self) -> io::Result<bool> {
        Ok(false)
    }
}

/// `head` then `tail` through `send_some`: what a transport without a way to send both as
/// one message does.
pub(crate) fn send_in_turn<T: Transport + ?Sized>(
    t: &mut T,
    head: &[u8],
    tail: &[u8],
) -> io::Result<usize> {
    let n = t.send_some(head)?;
    if n < head.len() || tail.is_empty() {
        return Ok(n);
    }
    Ok(n + t.send_some(tail)?)
}

/// How many of a slot's `avail` bytes to hand over now: at most `room`, in whole `granule`s;
/// 0 means stop here. A slot that ends inside an element before anything was handed over is
/// an error: the peer sent another type.
pub(crate) fn whole_elements(
    avail: usize,
    room: usize,
    granule: usize,
    consumed: usize,
) -> io::Result<usize> {
    let granule = granule.max(1);
    let take = avail.min(room);
    // Element sizes are powers of two: a mask, not a division, on every receive.
    let take = if granule.is_power_of_two() {
        take & !(granule - 1)
    } else {
        take - take % granule
    };
    if take == 0 && avail > 0 && avail < granule && consumed == 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "stream split inside an element (peer sent a different type?)",
        ));
    }
    Ok(take)
}

/// Sleeps until one of `fds` is readable (or closed) or `timeout` passes.
pub(crate) fn wait_readable(fds: &[std::os::fd::RawFd], timeout: std::time::Duration) {
    let mut polls: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    // SAFETY: a valid array of pollfds that outlives the call; poll only writes `revents`.
    unsafe {
        libc::poll(
            polls.as_mut_ptr(),
            polls.len() as libc::nfds_t,
            timeout.as_millis().clamp(1, i32::MAX as u128) as i32,
        )
    };
}
