//! GPUDirect RDMA between hosts: the stream-program pieces a rank sends to, and receives from,
//! a rank on another host, moved by the NIC straight out of and into device memory.
//!
//! Every rank's program buffer (its receive rings) is registered with its verbs device through
//! a dma-buf (`cuMemGetHandleForAddressRange`, then `ibv_reg_dmabuf_mr`), and so is an
//! *outbox*: one ring of slots per remote peer, in device memory (in pinned host memory under
//! `NCCL_NET_GDR_READ=0`, where the NIC does not read GPU memory). Stream and progress thread
//! meet in a small area of host memory the GPU can address ([`HostWords`]):
//!
//! * to send piece `n` to remote rank `q`, the stream waits until its *credit* word for `q`
//!   says piece `n − count` was consumed, copies the piece into outbox slot `n mod count`,
//!   writes the piece's length and then `n + 1` into its *ready* word for `q`;
//! * the progress thread sees *ready* move and posts an RDMA write with immediate data from
//!   the outbox slot into `q`'s receive slot for this rank (which `q` registered and named at
//!   bind);
//! * at `q`, the write's completion tells `q`'s progress thread that piece `n` landed: it moves
//!   its *filled* word for this rank, which `q`'s stream waits on; `q`'s stream copies or
//!   reduces the slot into place and writes its *consumed* word;
//! * `q`'s progress thread sees *consumed* move and sends the credit back: an RDMA write of no
//!   bytes whose immediate data counts the slots freed, which moves this rank's *credit* word.
//!
//! No payload byte crosses host memory (with GPUDirect read), no host thread waits on the GPU,
//! and no host collective runs inside a call: the progress thread only reads and writes host
//! words and posts and polls the NIC. One progress thread per communicator, as NCCLX's CTran
//! has one per communicator.

use super::layout::Layout;
use crate::comm::Communicator;
use crate::error::{Error, Result};
use crate::gpu::DeviceBuffer;
use crate::gpu::memory::PinnedBuffer;
use crate::transport::rdma::{self, Completion, Fabric, Link, Region, Write};
use crate::watchdog::Health;
use crate::wire::{PeerInfo, peer_failed};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Immediate data of a credit (else a data piece, numbered in its low 24 bits).
const IMM_CREDIT: u32 = 1 << 31;
/// Bytes of the record each pair exchanges at bind.
const RECORD: usize = 1024;
/// How long a communicator going away waits for its peers' last credits.
const DRAIN: Duration = Duration::from_secs(1);

/// Whether GPUDirect RDMA may be used, from `NCCL_NET_GDR_LEVEL` (as NCCL spells it: `LOC`,
/// `PIX`, `PXB`, `PHB`, `SYS`, or NCCL's old integers 0 to 4; `LOC` or 0 turns it off) and the distance between
/// the GPU and the NIC where sysfs shows both. Unset: used wherever registration works.
fn gdr_allowed(
    level: Option<&str>,
    gpu_bus: Option<&str>,
    nic_bus: Option<&str>,
) -> Result<(), String> {
    let Some(v) = level else {
        return Ok(());
    };
    let level = match v.trim().to_ascii_uppercase().as_str() {
        "LOC" | "0" => 0,
        "PIX" | "1" => 1,
        "PXB" | "2" => 2,
        "PHB" | "3" => 3,
        "SYS" | "4" => 4,
        other => {
            return Err(format!(
                "NCCL_NET_GDR_LEVEL={other}: want LOC, PIX, PXB, PHB or SYS"
            ));
        }
    };
    if level == 0 {
        return Err("NCCL_NET_GDR_LEVEL=LOC turns GPUDirect RDMA off".into());
    }
    let (Some(g), Some(n)) = (gpu_bus, nic_bus) else {
        // The stand-ins (and some virtual machines) show no PCI path: nothing to compare.
        return Ok(());
    };
    let distance = pci_distance(g, n);
    if distance > level {
        return Err(format!(
            "NCCL_NET_GDR_LEVEL={v}: the GPU ({g}) and the NIC ({n}) are {} apart",
            ["LOC", "PIX", "PXB", "PHB", "SYS"][distance]
        ));
    }
    Ok(())
}

/// How GPU memory is registered with the NIC (`STRATA_GDR_REGISTRATION`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Registration {
    /// A dma-buf (`cuMemGetHandleForAddressRange`, `ibv_reg_dmabuf_mr`), else `ibv_reg_mr` on
    /// the device address where `nvidia-peermem` is loaded.
    Auto,
    /// Only a dma-buf.
    Dmabuf,
    /// Only `ibv_reg_mr` on the device address (the operator vouches for `nvidia-peermem`).
    Peermem,
}

impl Registration {
    fn from_env() -> Result<Self> {
        match std::env::var("STRATA_GDR_REGISTRATION")
            .as_deref()
            .map(str::trim)
        {
            Err(_) | Ok("") | Ok("auto") => Ok(Self::Auto),
            Ok("dmabuf") => Ok(Self::Dmabuf),
            Ok("peermem") => Ok(Self::Peermem),
            Ok(other) => Err(Error::InvalidArgument(format!(
                "STRATA_GDR_REGISTRATION={other}: expected auto, dmabuf or peermem"
            ))),
        }
    }
}

/// Whether the kernel module that lets a NIC register GPU memory by its device address is
/// loaded (`nvidia_peermem`, or the older `nv_peer_mem`).
fn peermem_loaded() -> bool {
    ["/sys/module/nvidia_peermem", "/sys/module/nv_peer_mem"]
        .iter()
        .any(|m| std::path::Path::new(m).exists())
}

/// NCCL's path types between two PCI functions from their sysfs paths: 1 (PIX) behind one
/// switch, 2 (PXB) across switches under one root port, 3 (PHB) under one host bridge, 4 (SYS)
/// otherwise.
fn pci_distance(a: &str, b: &str) -> usize {
    let path = |bus: &str| -> Vec<String> {
        std::fs::canonicalize(format!("/sys/bus/pci/devices/{bus}"))
            .map(|p| {
                p.components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .filter(|c| c.contains(':'))
                    .collect()
            })
            .unwrap_or_default()
    };
    let (pa, pb) = (path(a), path(b));
    if pa.is_empty() || pb.is_empty() {
        return 4;
    }
    let common = pa.iter().zip(&pb).take_while(|(x, y)| x == y).count();
    match (pa.len() - common, pb.len() - common, common) {
        (_, _, 0) => 4,
        (1, 1, _) => 1,
        _ if common >= 2 => 2,
        _ => 3,
    }
}

/// The host words stream and progress thread share, in page-locked memory the GPU maps:
/// per rank `q`, *ready*, *consumed*, *filled* and *credit*, then the length of each outbox
/// slot.
pub(super) struct HostWords {
    buf: PinnedBuffer,
    /// The same memory as the GPU addresses it.
    device: u64,
    p: usize,
    slots: usize,
}

// SAFETY: page-locked memory owned by the value; the words are read and written atomically.
unsafe impl Send for HostWords {}
// SAFETY: as above.
unsafe impl Sync for HostWords {}

impl HostWords {
    fn new(p: usize, slots: usize) -> Result<Self> {
        let buf = PinnedBuffer::new(4 * (4 * p + p * slots))?;
        // SAFETY: fresh memory of that many bytes.
        unsafe { std::ptr::write_bytes(buf.as_ptr(), 0, buf.len()) };
        let device = buf.device_ptr()?;
        Ok(Self {
            buf,
            device,
            p,
            slots,
        })
    }

    fn word(&self, i: usize) -> &AtomicU32 {
        // SAFETY: `i` indexes the allocation's words (the callers' indices are in range); the
        // memory lives as long as `self` and is only accessed atomically by the host.
        unsafe { &*(self.buf.as_ptr() as *const AtomicU32).add(i) }
    }

    fn offset(i: usize) -> u64 {
        4 * i as u64
    }

    /// Device address of the *ready* word for `q` (the stream writes it).
    pub fn ready(&self, q: usize) -> u64 {
        self.device + Self::offset(q)
    }
    /// Device address of the *consumed* word for `q` (the stream writes it).
    pub fn consumed(&self, q: usize) -> u64 {
        self.device + Self::offset(self.p + q)
    }
    /// Device address of the *filled* word for `q` (the stream waits on it).
    pub fn filled(&self, q: usize) -> u64 {
        self.device + Self::offset(2 * self.p + q)
    }
    /// Device address of the *credit* word for `q` (the stream waits on it).
    pub fn credit(&self, q: usize) -> u64 {
        self.device + Self::offset(3 * self.p + q)
    }
    /// Device address of the length of outbox slot `i` for `q` (the stream writes it).
    pub fn length(&self, q: usize, i: usize) -> u64 {
        self.device + Self::offset(4 * self.p + q * self.slots + i)
    }

    /// Satisfies every wait on the *filled* and *credit* words (`values`: filled for ranks
    /// 0..p, then credit), after a fault or an abort.
    pub fn release(&self, values: &[u32]) {
        for q in 0..self.p.min(values.len() / 2) {
            self.word(2 * self.p + q)
                .fetch_max(values[q], Ordering::AcqRel);
            self.word(3 * self.p + q)
                .fetch_max(values[self.p + q], Ordering::AcqRel);
        }
    }
}

/// Where a piece for a remote peer waits for the NIC.
enum Outbox {
    /// Device memory (GPUDirect read).
    Device(DeviceBuffer),
    /// Page-locked host memory (`NCCL_NET_GDR_READ=0`).
    Host(PinnedBuffer),
}

/// What one rank tells a remote peer at bind.
#[derive(Serialize, Deserialize)]
struct Record {
    /// Its queue pair for this pair.
    link: Vec<u8>,
    /// Where its receive rings start, as its NIC names them, and their key.
    base: u64,
    rkey: u64,
}

/// A remote peer as the progress thread drives it.
struct Remote {
    rank: usize,
    link: Box<dyn Link>,
    /// Its receive rings and their key.
    base: u64,
    rkey: u64,
    /// Pieces posted, credits returned, pieces arrived and slots credited back, so far.
    posted: u32,
    credited: u32,
    arrived: u32,
    credits: u32,
    /// Writes posted and not yet complete.
    in_flight: usize,
    broken: bool,
}

/// The GPUDirect side of one communicator's stream programs.
pub(super) struct Net {
    pub words: Arc<HostWords>,
    outbox: Outbox,
    /// Device address of outbox slot 0 of each remote peer (by rank; 0 for local ranks).
    outbox_of: Vec<u64>,
    slot_bytes: usize,
    /// Registrations held for the life of the path.
    registrations: Vec<(Arc<dyn rdma::Fabric>, Region)>,
    stop: Arc<AtomicBool>,
    proxy: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Set while calls are queued, so the proxy polls without sleeping.
    pub busy: Arc<AtomicU32>,
}

// SAFETY: device addresses are plain numbers; the buffers are owned.
unsafe impl Send for Net {}
// SAFETY: as above; the proxy thread owns the links.
unsafe impl Sync for Net {}

/// A half-built path: local resources made, links not yet connected.
pub(super) struct Pending {
    net: Net,
    links: Vec<(usize, Box<dyn Link>)>,
    own: Region,
    depth: usize,
}

impl Net {
    /// The local half for `remote` peers (ranks on other hosts): the fabric, registrations,
    /// outbox, host words and one connection per peer. `own` is this rank's program buffer.
    pub(super) fn prepare(
        comm: &Communicator,
        own: &DeviceBuffer,
        layout: Layout,
        remote: &[usize],
    ) -> Result<Pending> {
        let cfg = comm.config();
        let me = &comm.peers()[comm.rank()];
        for &q in remote {
            if rdma::provider_between(cfg, me, &comm.peers()[q]) != Some(rdma::ProviderKind::Verbs)
            {
                return Err(Error::Unsupported(format!(
                    "no verbs device joins it to rank {q} ({}) under STRATA_TRANSPORT",
                    comm.peers()[q].describe()
                )));
            }
        }
        let verbs =
            rdma::verbs::open(&cfg.rdma).map_err(|e| Error::Unsupported(format!("verbs: {e}")))?;
        gdr_allowed(
            std::env::var("NCCL_NET_GDR_LEVEL").ok().as_deref(),
            crate::gpu::driver::current_gpu_bus_id().as_deref(),
            verbs.pci_bus(),
        )
        .map_err(Error::Unsupported)?;
        let fabric: Arc<dyn rdma::Fabric> = verbs.clone();
        let (p, k, sb) = (layout.p, layout.slots.count, layout.slots.bytes);
        let how = Registration::from_env()?;
        let register_device = |buf: &DeviceBuffer| -> Result<Region> {
            let len = buf.len().next_multiple_of(4096);
            let dmabuf = || -> Result<Region> {
                let fd = buf.export_dmabuf()?;
                use std::os::fd::AsRawFd;
                verbs
                    .register_dmabuf(fd.as_raw_fd(), 0, len, buf.ptr())
                    .map_err(|e| Error::io(format!("{} (dma-buf)", verbs.device()), e))
            };
            // ibv_reg_mr on the device address: nvidia-peermem pins the GPU pages.
            let peermem = || -> Result<Region> {
                verbs.register(buf.ptr() as *mut u8, len).map_err(|e| {
                    Error::io(
                        format!("{} (ibv_reg_mr, nvidia-peermem)", verbs.device()),
                        e,
                    )
                })
            };
            match how {
                Registration::Dmabuf => dmabuf(),
                Registration::Peermem => peermem(),
                Registration::Auto => dmabuf().or_else(|e| {
                    if peermem_loaded() {
                        peermem()
                    } else {
                        Err(Error::Unsupported(format!(
                            "registering GPU memory: {e}; and nvidia-peermem is not loaded"
                        )))
                    }
                }),
            }
        };
        let own_region = register_device(own)?;
        let mut registrations = vec![(fabric.clone(), own_region)];
        let ring = k * sb;
        let gdr_read = std::env::var("NCCL_NET_GDR_READ").map_or(true, |v| v.trim() != "0");
        let outbox = if gdr_read {
            Outbox::Device(DeviceBuffer::alloc(own.device(), remote.len() * ring)?)
        } else {
            Outbox::Host(PinnedBuffer::new(remote.len() * ring)?)
        };
        let (outbox_region, outbox_base) = match &outbox {
            Outbox::Device(b) => (register_device(b)?, b.ptr()),
            Outbox::Host(b) => (
                fabric
                    .register(b.as_ptr(), b.len())
                    .map_err(|e| Error::io("registering the outbox", e))?,
                b.device_ptr()?,
            ),
        };
        registrations.push((fabric.clone(), outbox_region));
        let mut outbox_of = vec![0u64; p];
        for (i, &q) in remote.iter().enumerate() {
            outbox_of[q] = outbox_base + (i * ring) as u64;
        }
        let depth = 2 * k + 4;
        let mut links = Vec::with_capacity(remote.len());
        for &q in remote {
            let link = fabric
                .link(1, depth)
                .map_err(|e| Error::io(format!("a queue pair for rank {q}"), e))?;
            links.push((q, link));
        }
        Ok(Pending {
            net: Net {
                words: Arc::new(HostWords::new(p, k)?),
                outbox,
                outbox_of,
                slot_bytes: sb,
                registrations,
                stop: Arc::new(AtomicBool::new(false)),
                proxy: Mutex::new(None),
                busy: Arc::new(AtomicU32::new(0)),
            },
            links,
            own: own_region,
            depth,
        })
    }

    /// Device address of outbox slot `i` for remote rank `q`.
    pub fn outbox_slot(&self, q: usize, i: usize) -> u64 {
        self.outbox_of[q] + (i * self.slot_bytes) as u64
    }

    /// Stops the progress thread (the communicator is going away).
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        if let Some(h) = self.proxy.lock().ok().and_then(|mut p| p.take()) {
            let _ = h.join();
        }
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        self.stop();
        for (fabric, region) in &self.registrations {
            fabric.deregister(region);
        }
        // The outbox frees itself (a device buffer drops its registrations first).
        let _ = &self.outbox;
    }
}

impl Pending {
    /// Exchanges addresses with every remote peer (point to point over the host transports,
    /// so a rank talks only to its own remote peers), connects the queue pairs, posts the
    /// receives and starts the progress thread. Collective among the ranks that prepared.
    pub(super) fn finish(
        self,
        comm: &Communicator,
        layout: Layout,
        health: Arc<Health>,
    ) -> Result<Net> {
        let Pending {
            net,
            mut links,
            own,
            depth,
        } = self;
        let mut outgoing = Vec::with_capacity(links.len());
        for (_, link) in &links {
            let rec = Record {
                link: link.address(),
                base: own.remote_base,
                rkey: own.rkey,
            };
            let mut bytes = serde_json::to_vec(&rec)
                .map_err(|e| Error::Transport(format!("GPUDirect record: {e}")))?;
            if bytes.len() > RECORD {
                return Err(Error::Transport(format!(
                    "GPUDirect record of {} bytes (at most {RECORD})",
                    bytes.len()
                )));
            }
            bytes.resize(RECORD, b' ');
            outgoing.push(bytes);
        }
        let mut incoming = vec![vec![0u8; RECORD]; links.len()];
        {
            let mut transfers: Vec<crate::comm::Transfer<'_>> = Vec::new();
            for (((q, _), out), inc) in links.iter().zip(&outgoing).zip(incoming.iter_mut()) {
                transfers.push(crate::comm::Transfer::Send {
                    peer: *q,
                    dtype: crate::dtype::DataType::Uint8,
                    data: out,
                });
                transfers.push(crate::comm::Transfer::Recv {
                    peer: *q,
                    dtype: crate::dtype::DataType::Uint8,
                    data: inc,
                });
            }
            comm.send_recv(&mut transfers)?;
        }
        let mut remotes = Vec::with_capacity(links.len());
        for ((q, mut link), inc) in links.drain(..).zip(&incoming) {
            let theirs: Record = serde_json::from_slice(inc.trim_ascii_end()).map_err(|e| {
                peer_failed(
                    &comm.peers()[q],
                    format!("sent an unreadable GPUDirect record: {e}"),
                )
            })?;
            link.connect(&theirs.link).map_err(|e| {
                peer_failed(
                    &comm.peers()[q],
                    format!("connecting its GPUDirect queue pair failed: {e}"),
                )
            })?;
            for _ in 0..depth {
                link.post_recv(0)
                    .map_err(|e| Error::io(format!("a receive for rank {q}"), e))?;
            }
            remotes.push(Remote {
                rank: q,
                link,
                base: theirs.base,
                rkey: theirs.rkey,
                posted: 0,
                credited: 0,
                arrived: 0,
                credits: 0,
                in_flight: 0,
                broken: false,
            });
        }
        let proxy = Proxy {
            remotes,
            words: net.words.clone(),
            outbox: net.registrations[1].1,
            outbox_of: net.outbox_of.clone(),
            outbox_host: match &net.outbox {
                Outbox::Device(_) => None,
                Outbox::Host(b) => Some((b.device_ptr()?, b.as_ptr() as u64)),
            },
            layout,
            me: comm.rank(),
            depth,
            stop: net.stop.clone(),
            busy: net.busy.clone(),
            health,
            peers: comm.peers().to_vec(),
        };
        let handle = std::thread::Builder::new()
            .name("strata-gdr-proxy".into())
            .spawn(move || proxy.run())
            .map_err(|e| Error::io("spawning the GPUDirect progress thread", e))?;
        if let Ok(mut p) = net.proxy.lock() {
            *p = Some(handle);
        }
        Ok(net)
    }
}

/// The progress thread's state.
struct Proxy {
    remotes: Vec<Remote>,
    words: Arc<HostWords>,
    outbox: Region,
    outbox_of: Vec<u64>,
    /// A host outbox: its device address and host address (the NIC's view is the host one).
    outbox_host: Option<(u64, u64)>,
    layout: Layout,
    me: usize,
    depth: usize,
    stop: Arc<AtomicBool>,
    busy: Arc<AtomicU32>,
    health: Arc<Health>,
    peers: Vec<PeerInfo>,
}

impl Proxy {
    fn run(mut self) {
        let mut idle_since = Instant::now();
        let mut completions = Vec::new();
        while !self.stop.load(Ordering::Acquire) {
            let moved = self.pass(&mut completions, true);
            if moved {
                idle_since = Instant::now();
                continue;
            }
            // Poll hard while calls are queued or just were; sleep a little otherwise.
            let recent = idle_since.elapsed() < Duration::from_millis(2);
            if self.busy.load(Ordering::Acquire) > 0 || recent {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        // The communicator is going away. Return the credits owed and wait (briefly) for the
        // peers' credits and completions, so that no write of either side meets a queue pair
        // already gone and a healthy job ends without a fault on its peers.
        let deadline = Instant::now() + DRAIN;
        while Instant::now() < deadline && !self.drained() {
            if !self.pass(&mut completions, false) {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
    }

    /// One pass over every remote peer; whether anything moved. A failure is recorded as the
    /// communicator's fault when `report` (not while draining: a peer may be gone already).
    fn pass(&mut self, completions: &mut Vec<Completion>, report: bool) -> bool {
        let mut moved = false;
        for i in 0..self.remotes.len() {
            match self.step(i, completions) {
                Ok(m) => moved |= m,
                Err(e) => {
                    let r = &mut self.remotes[i];
                    r.broken = true;
                    if !report {
                        continue;
                    }
                    let e = peer_failed(
                        &self.peers[r.rank],
                        format!("a GPUDirect RDMA transfer with it failed: {e}"),
                    );
                    if self.health.record_fault(&e) {
                        tracing::error!("{e}");
                    }
                }
            }
        }
        moved
    }

    /// Whether nothing is owed or outstanding with any peer still reachable.
    fn drained(&self) -> bool {
        let words = &self.words;
        self.remotes.iter().all(|r| {
            r.broken
                || (r.in_flight == 0
                    && r.credits == r.posted
                    && r.credited == words.word(words.p + r.rank).load(Ordering::Acquire))
        })
    }

    /// One pass over remote peer `i`: posts the pieces the stream made ready and the credits
    /// it freed, and handles the completions. Whether anything moved.
    fn step(&mut self, i: usize, completions: &mut Vec<Completion>) -> std::io::Result<bool> {
        let k = self.layout.slots.count as u32;
        let (me, depth) = (self.me, self.depth);
        let words = &self.words;
        let r = &mut self.remotes[i];
        if r.broken {
            return Ok(false);
        }
        let q = r.rank;
        let mut moved = false;
        let ready = words.word(q).load(Ordering::Acquire);
        while r.posted != ready && r.in_flight < depth {
            let n = r.posted;
            let slot = (n % k) as usize;
            let len = words
                .word(4 * words.p + q * words.slots + slot)
                .load(Ordering::Acquire);
            let mut src = self.outbox_of[q] + (slot * self.layout.slots.bytes) as u64;
            if let Some((dev, host)) = self.outbox_host {
                src = src - dev + host;
            }
            let w = Write {
                lane: 0,
                region: self.outbox,
                src,
                len: len as usize,
                dst: r.base + self.layout.slot(me, slot),
                rkey: r.rkey,
                imm: n & 0xff_ffff,
                wr_id: u64::from(n),
            };
            if !r.link.write(&w)? {
                break;
            }
            r.posted = r.posted.wrapping_add(1);
            r.in_flight += 1;
            moved = true;
        }
        let consumed = words.word(words.p + q).load(Ordering::Acquire);
        if consumed != r.credited && r.in_flight < depth {
            let freed = consumed.wrapping_sub(r.credited);
            let w = Write {
                lane: 0,
                region: self.outbox,
                src: self.outbox.addr,
                len: 0,
                dst: r.base,
                rkey: r.rkey,
                imm: IMM_CREDIT | (freed & 0xff_ffff),
                wr_id: u64::MAX,
            };
            if r.link.write(&w)? {
                r.credited = consumed;
                r.in_flight += 1;
                moved = true;
            }
        }
        completions.clear();
        r.link.poll(completions)?;
        for c in completions.iter() {
            moved = true;
            match *c {
                Completion::Sent { .. } => r.in_flight = r.in_flight.saturating_sub(1),
                Completion::Arrived { imm } if imm & IMM_CREDIT != 0 => {
                    r.credits = r.credits.wrapping_add(imm & 0xff_ffff);
                    words
                        .word(3 * words.p + q)
                        .fetch_max(r.credits, Ordering::AcqRel);
                    r.link.post_recv(0)?;
                }
                Completion::Arrived { imm } => {
                    if imm & 0xff_ffff != r.arrived & 0xff_ffff {
                        return Err(std::io::Error::other(format!(
                            "piece {} arrived where piece {} was due",
                            imm & 0xff_ffff,
                            r.arrived & 0xff_ffff
                        )));
                    }
                    r.arrived = r.arrived.wrapping_add(1);
                    words
                        .word(2 * words.p + q)
                        .fetch_max(r.arrived, Ordering::AcqRel);
                    r.link.post_recv(0)?;
                }
            }
        }
        Ok(moved)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gdr_level_loc_turns_it_off_and_a_bad_level_is_named() {
        assert!(gdr_allowed(None, None, None).is_ok());
        for on in ["PIX", "pxb", "PHB", "SYS", "1", "4"] {
            assert!(gdr_allowed(Some(on), None, None).is_ok(), "{on}");
        }
        for off in ["LOC", "0"] {
            let e = gdr_allowed(Some(off), None, None).unwrap_err();
            assert!(e.contains("turns GPUDirect RDMA off"), "{e}");
        }
        let e = gdr_allowed(Some("NEAR"), None, None).unwrap_err();
        assert!(e.contains("NCCL_NET_GDR_LEVEL=NEAR"), "{e}");
        // Buses sysfs does not show are as far apart as can be: PHB refuses, SYS allows.
        let e = gdr_allowed(Some("PHB"), Some("0000:ff:00.0"), Some("0000:fe:00.0")).unwrap_err();
        assert!(e.contains("SYS apart"), "{e}");
        assert!(gdr_allowed(Some("SYS"), Some("0000:ff:00.0"), Some("0000:fe:00.0")).is_ok());
    }
}
