//! The stand-in's "wire": TCP. Each open device listens on port [`PORT`] (RoCE v2's UDP port)
//! of its own IPv4 address; each RTS queue pair connects to its peer's device and sends one
//! write at a time, waiting for the acknowledgement, which the responder sends after the data
//! is in the target region and, for a write with immediate data, the receive has completed.
//!
//! A device's address is `STRATA_IBV_STANDIN_ADDR` (one per device, comma-separated) on a RoCE
//! link, which its IPv4-mapped GID carries, so queue pairs reach it across network namespaces
//! as RoCE v2 packets reach a NIC across routers. An InfiniBand LID means something only
//! inside its subnet: an IB-link device (or a RoCE one with no address given) listens on
//! `127.77.x.y`, the LID's two bytes, reachable from its own network namespace only.

use crate::qp::{Job, QpInner, WriteJob, lookup, wc};
use crate::regions;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use strata_ibverbs_abi::*;

/// Bytes of a write's header on the wire.
const HEADER: usize = 24;

/// What a responder sends while a write with immediate data waits for a posted receive: an RNR
/// NAK. The initiator's ACK timer starts again on it, as a NIC's does (with `rnr_retry` 7 it
/// retries for ever), so a receiver slow to post is never taken for a dead peer.
const RNR_NAK: u32 = u32::MAX;

/// How often a responder waiting for a receive sends an RNR NAK.
const RNR_EVERY: Duration = Duration::from_millis(50);

/// The port every device listens on (RoCE v2's UDP port, here TCP).
pub(crate) const PORT: u16 = 4791;

/// Where the device with LID `lid` listens when it has no address of its own.
pub(crate) fn lid_address(lid: u16) -> Ipv4Addr {
    let [hi, lo] = lid.to_be_bytes();
    Ipv4Addr::new(127, 77, hi, lo)
}

/// An open device's listening side.
pub(crate) struct Nic {
    stop: Arc<AtomicBool>,
    accepting: std::sync::Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Nic {
    /// Binds a free LID (and, when `addr` is given, that address; else the LID's loopback
    /// address) and starts accepting connections from peers' queue pairs. Returns the LID and
    /// the address the device listens on.
    pub fn start(addr: Option<Ipv4Addr>) -> io::Result<(u16, Ipv4Addr, Nic)> {
        let mut seed = [0u8; 2];
        let mut last = io::Error::other("no free LID");
        for attempt in 0..1000u32 {
            // SAFETY: filling a local buffer.
            unsafe { libc::getrandom(seed.as_mut_ptr() as *mut libc::c_void, 2, 0) };
            let lid = (u16::from_le_bytes(seed).wrapping_add(attempt as u16) % 0xbffe) + 1;
            let ip = addr.unwrap_or_else(|| lid_address(lid));
            let listener = match TcpListener::bind(SocketAddrV4::new(ip, PORT)) {
                Ok(l) => l,
                // A given address is this device's alone: a second device on it is an error.
                Err(e) if addr.is_some() => {
                    return Err(io::Error::new(e.kind(), format!("{ip}:{PORT}: {e}")));
                }
                Err(e) => {
                    last = e;
                    continue;
                }
            };
            listener.set_nonblocking(true)?;
            let stop = Arc::new(AtomicBool::new(false));
            let s = stop.clone();
            let accepting = std::thread::Builder::new()
                .name(format!("ibv-standin-nic-{lid}"))
                .spawn(move || accept_loop(listener, s))?;
            let accepting = std::sync::Mutex::new(Some(accepting));
            return Ok((lid, ip, Nic { stop, accepting }));
        }
        Err(last)
    }

    /// Stops accepting and frees the address (connections already made keep working until
    /// their peers close), so the device can be opened again at once.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.accepting.lock().ok().and_then(|mut a| a.take()) {
            let _ = t.join();
        }
    }
}

fn accept_loop(listener: TcpListener, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::Acquire) {
        match listener.accept() {
            Ok((s, _)) => {
                let _ = s.set_nonblocking(false);
                let _ = s.set_nodelay(true);
                let _ = std::thread::Builder::new()
                    .name("ibv-standin-responder".into())
                    .spawn(move || {
                        let _ = respond(s);
                    });
            }
            Err(_) => std::thread::sleep(Duration::from_millis(2)),
        }
    }
}

/// The target side of one queue pair's connection.
fn respond(mut s: TcpStream) -> io::Result<()> {
    let mut hello = [0u8; 4];
    s.read_exact(&mut hello)?;
    let Some(qp) = lookup(u32::from_le_bytes(hello)) else {
        return Ok(());
    };
    let mut hdr = [0u8; HEADER];
    let mut payload = Vec::new();
    loop {
        s.read_exact(&mut hdr)?;
        let u64_at = |i: usize| u64::from_le_bytes(hdr[i..i + 8].try_into().unwrap_or([0; 8]));
        let u32_at = |i: usize| u32::from_le_bytes(hdr[i..i + 4].try_into().unwrap_or([0; 4]));
        let (addr, rkey, len, imm, flags) =
            (u64_at(0), u32_at(8), u32_at(12), u32_at(16), u32_at(20));
        payload.resize(len as usize, 0);
        s.read_exact(&mut payload)?;
        // A QP that is not ready to receive drops the packet; the initiator retries, then
        // gives up with the retry count exceeded.
        let (ready, access) = match qp.st.lock() {
            Ok(st) => (matches!(st.state, qp_state::RTR | qp_state::RTS), st.access),
            Err(_) => return Ok(()),
        };
        if !ready {
            continue;
        }
        let status = if access & access::REMOTE_WRITE as u32 == 0 {
            wc_status::REM_ACCESS_ERR
        } else {
            write_region(qp.pd, addr, rkey, &payload)
        };
        if status == wc_status::SUCCESS
            && flags & 1 != 0
            && !deliver_imm(&qp, len, imm, &mut || {
                s.write_all(&RNR_NAK.to_le_bytes()).is_ok()
            })
        {
            // The QP was destroyed or failed while waiting for a receive, or the initiator is
            // gone: no acknowledgement.
            continue;
        }
        s.write_all(&status.to_le_bytes())?;
    }
}

/// Copies an incoming write into the region `rkey` names, if it may.
fn write_region(pd: usize, addr: u64, rkey: u32, data: &[u8]) -> u32 {
    let Ok(map) = regions().lock() else {
        return wc_status::GENERAL_ERR;
    };
    let target = map
        .get(&rkey)
        .filter(|r| r.pd == pd && r.access & access::REMOTE_WRITE != 0)
        .and_then(|r| r.host_range(addr, data.len() as u64));
    match target {
        Some(host) => {
            // SAFETY: the region is registered (and stays so while the table is locked) and
            // holds the range.
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), host as *mut u8, data.len()) };
            wc_status::SUCCESS
        }
        None => wc_status::REM_ACCESS_ERR,
    }
}

/// Consumes a posted receive for a write with immediate data, waiting for one (infinite RNR
/// retries), and calls `nak` every [`RNR_EVERY`] it waits. False if the QP went away
/// meanwhile, or `nak` could not reach the initiator.
fn deliver_imm(qp: &QpInner, len: u32, imm: u32, nak: &mut dyn FnMut() -> bool) -> bool {
    let Ok(mut st) = qp.st.lock() else {
        return false;
    };
    let mut last_nak = Instant::now();
    loop {
        if st.destroyed || st.state == qp_state::ERR {
            return false;
        }
        if let Some(wr_id) = st.rq.pop_front() {
            let mut e = wc(
                qp.qpn,
                wr_id,
                wc_status::SUCCESS,
                wc_opcode::RECV_RDMA_WITH_IMM,
            );
            e.byte_len = len;
            e.imm_data = imm.to_be();
            e.wc_flags = WC_WITH_IMM;
            qp.recv_cq.push(e);
            return true;
        }
        st = match qp.cv.wait_timeout(st, RNR_EVERY) {
            Ok((g, _)) => g,
            Err(_) => return false,
        };
        if last_nak.elapsed() >= RNR_EVERY {
            drop(st);
            if !nak() {
                return false;
            }
            last_nak = Instant::now();
            st = match qp.st.lock() {
                Ok(g) => g,
                Err(_) => return false,
            };
        }
    }
}

/// This process's injected fault, from `STRATA_IBV_STANDIN_FAULT`.
enum Fault {
    None,
    /// Corrupt the remote key of the Nth write.
    Rkey(u64),
    /// Stop transmitting from the Nth write on.
    Drop(u64),
    /// A fatal error on the QP at the Nth write: the QP goes to the error state and flushes.
    QpError(u64),
    /// Every write waits this many milliseconds before it leaves (a congested link): a QP
    /// destroyed meanwhile flushes it unsent, as a real NIC does.
    Slow(u64),
}

fn fault() -> &'static Fault {
    static F: OnceLock<Fault> = OnceLock::new();
    F.get_or_init(|| {
        let v = std::env::var("STRATA_IBV_STANDIN_FAULT").unwrap_or_default();
        let n = |s: &str| s.parse::<u64>().ok().filter(|&n| n > 0);
        match v.split_once(':') {
            Some(("rkey", k)) => n(k).map_or(Fault::None, Fault::Rkey),
            Some(("drop", k)) => n(k).map_or(Fault::None, Fault::Drop),
            Some(("qperr", k)) => n(k).map_or(Fault::None, Fault::QpError),
            Some(("slow", ms)) => n(ms).map_or(Fault::None, Fault::Slow),
            _ => Fault::None,
        }
    })
}

static WRITES: AtomicU64 = AtomicU64::new(0);

/// Starts a queue pair's sender; the QP posts its writes to the returned channel.
pub(crate) fn start_sender(
    qp: Arc<QpInner>,
    dest: Ipv4Addr,
    dest_qpn: u32,
    timeout: u8,
    retry_cnt: u8,
) -> Sender<Job> {
    let (tx, rx) = mpsc::channel();
    // The local ACK timeout is 4.096 µs × 2^timeout (0: wait forever); a request is given up
    // after retry_cnt retries.
    let give_up = (timeout != 0)
        .then(|| Duration::from_nanos(4096u64 << timeout.min(31)) * (u32::from(retry_cnt) + 1));
    let _ = std::thread::Builder::new()
        .name(format!("ibv-standin-qp-{}", qp.qpn))
        .spawn(move || send_loop(qp, rx, dest, dest_qpn, give_up));
    tx
}

fn send_loop(
    qp: Arc<QpInner>,
    rx: Receiver<Job>,
    dest: Ipv4Addr,
    dest_qpn: u32,
    give_up: Option<Duration>,
) {
    let mut conn: Option<TcpStream> = None;
    let mut broken = false;
    while let Ok(Job::Write(job)) = rx.recv() {
        if let Fault::Slow(ms) = fault() {
            std::thread::sleep(Duration::from_millis(*ms));
        }
        let failed = qp
            .st
            .lock()
            .map(|st| st.state == qp_state::ERR)
            .unwrap_or(true);
        if failed {
            qp.complete_send(job.wr_id, job.signaled, wc_status::WR_FLUSH_ERR);
            continue;
        }
        let n = WRITES.fetch_add(1, Ordering::Relaxed) + 1;
        let start = Instant::now();
        if matches!(fault(), Fault::QpError(k) if n == *k) {
            if let Ok(mut st) = qp.st.lock() {
                qp.fail(&mut st);
            }
            qp.complete_send(job.wr_id, job.signaled, wc_status::WR_FLUSH_ERR);
            continue;
        }
        let status = match fault() {
            Fault::Drop(k) if n >= *k => None,
            _ if broken => None,
            f => {
                let rkey = match f {
                    Fault::Rkey(k) if n == *k => job.rkey ^ 0x00a5_a5a5,
                    _ => job.rkey,
                };
                if conn.is_none() {
                    conn = connect(dest, dest_qpn, give_up);
                }
                let r = conn
                    .as_mut()
                    .and_then(|c| transmit(c, &job, rkey, give_up).ok());
                if r.is_none() {
                    broken = true;
                }
                r
            }
        };
        match status {
            Some(s) => qp.complete_send(job.wr_id, job.signaled, s),
            None => {
                // No acknowledgement: the NIC retries until the retry count is spent.
                match give_up {
                    Some(g) => std::thread::sleep(g.saturating_sub(start.elapsed())),
                    None => loop {
                        std::thread::sleep(Duration::from_millis(100));
                        if qp.st.lock().map(|s| s.destroyed).unwrap_or(true) {
                            return;
                        }
                    },
                }
                qp.complete_send(job.wr_id, job.signaled, wc_status::RETRY_EXC_ERR);
            }
        }
    }
}

/// Connects to the peer's device, trying until the retry budget is spent.
fn connect(ip: Ipv4Addr, qpn: u32, give_up: Option<Duration>) -> Option<TcpStream> {
    let deadline = Instant::now() + give_up.unwrap_or(Duration::from_secs(3600));
    let addr = SocketAddrV4::new(ip, PORT).into();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if let Ok(mut s) = TcpStream::connect_timeout(&addr, left.max(Duration::from_millis(1))) {
            s.set_nodelay(true).ok()?;
            s.write_all(&qpn.to_le_bytes()).ok()?;
            return Some(s);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Sends one write and waits for its acknowledgement.
fn transmit(
    s: &mut TcpStream,
    job: &WriteJob,
    rkey: u32,
    give_up: Option<Duration>,
) -> io::Result<u32> {
    let mut hdr = [0u8; HEADER];
    hdr[0..8].copy_from_slice(&job.remote_addr.to_le_bytes());
    hdr[8..12].copy_from_slice(&rkey.to_le_bytes());
    hdr[12..16].copy_from_slice(&job.len.to_le_bytes());
    hdr[16..20].copy_from_slice(&job.imm.unwrap_or(0).to_le_bytes());
    hdr[20..24].copy_from_slice(&u32::from(job.imm.is_some()).to_le_bytes());
    s.write_all(&hdr)?;
    if job.len > 0 {
        // SAFETY: the range was checked against a registered region at post time, and the
        // caller must not free it before the completion.
        let data = unsafe { std::slice::from_raw_parts(job.local as *const u8, job.len as usize) };
        s.write_all(data)?;
    }
    s.set_read_timeout(give_up)?;
    let mut ack = [0u8; 4];
    loop {
        s.read_exact(&mut ack)?;
        let ack = u32::from_le_bytes(ack);
        if ack != RNR_NAK {
            return Ok(ack);
        }
    }
}
