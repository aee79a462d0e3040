//! Runtime configuration from `STRATA_*` (and NCCL's) environment variables.

mod rdma;

pub use rdma::{HcaFilter, RdmaConfig};

use crate::error::{Error, Result};
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

/// Which transports connect ranks (`STRATA_TRANSPORT`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TransportPolicy {
    /// In-process rings between threads, shared memory within a host; between hosts verbs if
    /// both ranks have a usable device, else libfabric with a hardware provider, else TCP.
    Auto,
    /// Shared memory within a host and TCP between hosts: no RDMA (`shm`).
    Shm,
    /// TCP everywhere (`tcp`), so one host can test the network path.
    Tcp,
    /// RDMA everywhere, verbs if usable, else libfabric (`rdma`).
    Rdma,
    /// Verbs everywhere (`verbs`).
    Verbs,
    /// libfabric everywhere, whatever its provider (`ofi`).
    Ofi,
}

/// The order flat schedules visit the ranks in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RankOrder {
    /// Host by host, leaf by leaf, pod by pod (from the fabric), launcher order within a host.
    Topology,
    /// The launcher's rank order, whatever the fabric.
    Launcher,
}

/// Largest slot count of a shared-memory ring (`STRATA_SHM_SLOTS`).
pub const MAX_SHM_SLOTS: u32 = 1 << 16;

/// Tunables of a communicator. [`Config::from_env`] reads them; every field can be set directly.
#[derive(Clone, Debug)]
pub struct Config {
    /// Deadline of one operation (`STRATA_TIMEOUT`, seconds; default 600 as in PyTorch).
    pub timeout: Duration,
    /// Deadline of init (`STRATA_INIT_TIMEOUT`, seconds; default 120).
    pub init_timeout: Duration,
    /// Transport choice (`STRATA_TRANSPORT=auto|shm|tcp|rdma|verbs|ofi`).
    pub transport: TransportPolicy,
    /// RDMA settings (`NCCL_IB_*`, `STRATA_RDMA_*`, `STRATA_OFI_PROVIDER`).
    pub rdma: RdmaConfig,
    /// TCP streams per peer (`STRATA_TCP_STREAMS`, default 2).
    pub tcp_streams: usize,
    /// Bytes per stripe across TCP streams (`STRATA_TCP_STRIPE`, default 512 KiB).
    pub tcp_stripe: usize,
    /// Socket buffer size requested (`STRATA_SOCKET_BUFFER`, default 4 MiB).
    pub socket_buffer: usize,
    /// Slots per shared-memory ring (`STRATA_SHM_SLOTS`, default 128).
    pub shm_slots: u32,
    /// Bytes per slot (`STRATA_SHM_SLOT_SIZE`, default 8 KiB, multiple of 64). Small slots let
    /// the receiver start on a message while the sender is still writing it, and stay in the
    /// first-level cache; `benches/slot_sizes.sh` measured 8 KiB x 128 against 32 KiB x 32
    /// (the same 1 MiB) at 1.4-1.8x faster from 256 KiB to 1 MiB and no slower above.
    pub shm_slot_size: usize,
    /// Pipeline chunk of chunked schedules (`STRATA_CHUNK_SIZE`, default 512 KiB).
    pub chunk_bytes: usize,
    /// Bytes the ranks of one host keep in flight together in a ring all-reduce run slice by
    /// slice (`STRATA_RING_PIPELINE`, default 4 MiB; 0 runs the ring block by block). See
    /// [`Config::ring_slice_bytes`].
    pub ring_pipeline_bytes: usize,
    /// Whether a call sends the next step's data while the current step still runs, each
    /// chunk as soon as it is final: receive, reduce and send fused (`STRATA_SEND_AHEAD=1`;
    /// off by default: on this project's 2-core machine it measured no faster at 2 ranks and
    /// slower with more ranks than cores; see the README).
    pub send_ahead: bool,
    /// Whether the first calls of a size class time the two algorithms the model prices
    /// within [`NEAR_TIE`](strata_algorithms::tuner::NEAR_TIE) of each other and keep the
    /// faster, every rank agreeing (`STRATA_TUNER_TRIALS`, default 1; 0 keeps the model's
    /// choice).
    pub tuner_trials: bool,
    /// Whether flat schedules run in topology order (`STRATA_RANK_ORDER=topology`, the
    /// default) or in the launcher's order (`launcher`: a topology-blind baseline).
    pub rank_order: RankOrder,
    /// Rules that override the tuner for size ranges (`STRATA_TUNING_FILE`, JSON).
    pub tuning_rules: Vec<strata_algorithms::tuner::Rule>,
    /// Tier figures measured on this machine by `collbench calibrate` (`STRATA_COST_PROFILE`),
    /// priced with instead of the topology file's or init's.
    pub cost_profile: Option<std::sync::Arc<strata_topology::CostProfile>>,
    /// How long an accepted connection may take to authenticate (`STRATA_HANDSHAKE_TIMEOUT`, s).
    pub handshake_timeout: Duration,
    /// Address to listen on (from `STRATA_SOCKET_IFNAME` / `NCCL_SOCKET_IFNAME`, else the first
    /// non-loopback IPv4 interface that is up, else loopback).
    pub listen_ip: IpAddr,
    /// Watchdog heartbeat interval (`STRATA_HEARTBEAT_MS`, default 1000; 0 turns the watchdog
    /// off).
    pub heartbeat_interval: Duration,
    /// Heartbeats a watchdog neighbour may miss before it is declared stopped or hung
    /// (`STRATA_HEARTBEAT_MISSES`, default 3).
    pub heartbeat_misses: u32,
    /// Where each rank writes its flight record (the last operations, as JSON) after a fault
    /// (`STRATA_TRACE_DIR`; unset: nowhere).
    pub trace_dir: Option<std::path::PathBuf>,
    /// How late a peer's first message of a call may be before the call counts it late, for
    /// straggler reports (`STRATA_STRAGGLER_MS`, default 5; see `watchdog::stragglers`).
    pub straggler_threshold: Duration,
    /// Serve Prometheus metrics on this port plus the rank's place on its host
    /// (`STRATA_METRICS_PORT`; unset: no server). See [`crate::metrics`].
    pub metrics_port: Option<u16>,
    /// Write the same metrics to this file (`STRATA_METRICS_FILE`; `{rank}` and `{pid}` are
    /// replaced).
    pub metrics_file: Option<std::path::PathBuf>,
    /// How often the metrics file is rewritten (`STRATA_METRICS_INTERVAL_MS`, default 1000).
    pub metrics_interval: Duration,
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// The cost profile `STRATA_COST_PROFILE` names, loaded, and its path; `None` where the variable
/// is unset or blank, an error naming the variable where the file does not load.
pub fn cost_profile_from_env() -> Result<Option<(strata_topology::CostProfile, std::path::PathBuf)>>
{
    let Some(path) = env("STRATA_COST_PROFILE") else {
        return Ok(None);
    };
    let path = std::path::PathBuf::from(path);
    let profile = strata_topology::profile::load_profile(&path)
        .map_err(|e| Error::InvalidArgument(format!("STRATA_COST_PROFILE {e}")))?;
    Ok(Some((profile, path)))
}

fn parse_env<T: std::str::FromStr>(name: &str, default: T) -> Result<T> {
    match env(name) {
        None => Ok(default),
        Some(v) => v
            .trim()
            .parse()
            .map_err(|_| Error::InvalidArgument(format!("{name}={v} is not a valid value"))),
    }
}

fn secs(name: &str, default: f64) -> Result<Duration> {
    let s: f64 = parse_env(name, default)?;
    if !(s > 0.0 && s.is_finite()) {
        return Err(Error::InvalidArgument(format!(
            "{name} must be a positive number of seconds"
        )));
    }
    Ok(Duration::from_secs_f64(s))
}

/// Default of [`Config::ring_pipeline_bytes`].
pub const RING_PIPELINE_BYTES: usize = 4 << 20;

impl Config {
    /// Reads the environment; a malformed value is an error that names the variable.
    pub fn from_env() -> Result<Self> {
        let transport = match env("STRATA_TRANSPORT").map(|s| s.to_ascii_lowercase()) {
            None => TransportPolicy::Auto,
            Some(s) => match s.as_str() {
                "auto" => TransportPolicy::Auto,
                "shm" => TransportPolicy::Shm,
                "tcp" | "socket" => TransportPolicy::Tcp,
                "rdma" => TransportPolicy::Rdma,
                "verbs" | "ib" => TransportPolicy::Verbs,
                "ofi" | "libfabric" => TransportPolicy::Ofi,
                _ => {
                    return Err(Error::InvalidArgument(format!(
                        "STRATA_TRANSPORT={s}: valid values are auto, shm, tcp, rdma, verbs, ofi"
                    )));
                }
            },
        };
        let shm_slot_size: usize = parse_env("STRATA_SHM_SLOT_SIZE", 8 << 10)?;
        let shm_slots: u32 = parse_env("STRATA_SHM_SLOTS", 128)?;
        if shm_slot_size == 0
            || !shm_slot_size.is_multiple_of(64)
            || shm_slots == 0
            || shm_slots > MAX_SHM_SLOTS
        {
            return Err(Error::InvalidArgument(format!(
                "STRATA_SHM_SLOT_SIZE must be a positive multiple of 64 and STRATA_SHM_SLOTS in 1..={}",
                MAX_SHM_SLOTS
            )));
        }
        let tcp_streams: usize = parse_env("STRATA_TCP_STREAMS", 2)?;
        if !(1..=64).contains(&tcp_streams) {
            return Err(Error::InvalidArgument(
                "STRATA_TCP_STREAMS must be in 1..=64".into(),
            ));
        }
        let ifname = env("STRATA_SOCKET_IFNAME").or_else(|| env("NCCL_SOCKET_IFNAME"));
        let listen_ip = pick_interface(ifname.as_deref())?;
        let mut rdma = RdmaConfig::from_env()?;
        rdma.interface = interface_of(listen_ip);
        Ok(Self {
            timeout: secs("STRATA_TIMEOUT", 600.0)?,
            init_timeout: secs("STRATA_INIT_TIMEOUT", 120.0)?,
            transport,
            rdma,
            tcp_streams,
            tcp_stripe: parse_env("STRATA_TCP_STRIPE", 512 << 10)?,
            socket_buffer: parse_env("STRATA_SOCKET_BUFFER", 4 << 20)?,
            shm_slots,
            shm_slot_size,
            chunk_bytes: parse_env::<usize>("STRATA_CHUNK_SIZE", 512 << 10)?.max(64),
            ring_pipeline_bytes: parse_env("STRATA_RING_PIPELINE", RING_PIPELINE_BYTES)?,
            send_ahead: parse_env::<u8>("STRATA_SEND_AHEAD", 0)? == 1,
            tuner_trials: parse_env::<u8>("STRATA_TUNER_TRIALS", 1)? == 1,
            rank_order: match env("STRATA_RANK_ORDER").map(|s| s.to_ascii_lowercase()) {
                None => RankOrder::Topology,
                Some(s) if s == "topology" => RankOrder::Topology,
                Some(s) if s == "launcher" => RankOrder::Launcher,
                Some(s) => {
                    return Err(Error::InvalidArgument(format!(
                        "STRATA_RANK_ORDER={s}: valid values are topology, launcher"
                    )));
                }
            },
            tuning_rules: match env("STRATA_TUNING_FILE") {
                None => Vec::new(),
                Some(path) => crate::tuning::load_rules(std::path::Path::new(&path))?,
            },
            cost_profile: cost_profile_from_env()?.map(|(p, _)| std::sync::Arc::new(p)),
            handshake_timeout: secs("STRATA_HANDSHAKE_TIMEOUT", 5.0)?,
            listen_ip,
            heartbeat_interval: Duration::from_millis(parse_env("STRATA_HEARTBEAT_MS", 1000u64)?),
            heartbeat_misses: match parse_env("STRATA_HEARTBEAT_MISSES", 3u32)? {
                0 => {
                    return Err(Error::InvalidArgument(
                        "STRATA_HEARTBEAT_MISSES must be at least 1".into(),
                    ));
                }
                n => n,
            },
            trace_dir: env("STRATA_TRACE_DIR").map(std::path::PathBuf::from),
            straggler_threshold: Duration::from_secs_f64(
                parse_env("STRATA_STRAGGLER_MS", 5.0f64)?.max(0.0) / 1e3,
            ),
            metrics_port: match env("STRATA_METRICS_PORT") {
                None => None,
                Some(p) => Some(p.trim().parse::<u16>().map_err(|_| {
                    Error::InvalidArgument(format!("STRATA_METRICS_PORT={p} is not a port"))
                })?),
            },
            metrics_file: env("STRATA_METRICS_FILE").map(std::path::PathBuf::from),
            metrics_interval: Duration::from_millis(
                parse_env("STRATA_METRICS_INTERVAL_MS", 1000u64)?.max(10),
            ),
        })
    }

    /// The slice of a ring all-reduce of `message_bytes` over `nranks` ranks, `local_ranks`
    /// of them on the fullest host (every rank must cut the ring alike), in bytes (0: not
    /// sliced), by
    /// [`strata_algorithms::builders::ring_slice_bytes`] with `ring_pipeline_bytes`. What a
    /// rank reduced is then sent on from cache. On a 2-core EPYC (L2 512 KiB per core, L3
    /// 32 MiB) 4 MiB per host was the fastest budget at 2 and at 4 ranks
    /// (`benches/ring_slices.sh`).
    pub fn ring_slice_bytes(
        &self,
        nranks: usize,
        local_ranks: usize,
        message_bytes: usize,
    ) -> usize {
        strata_algorithms::builders::ring_slice_bytes(
            self.ring_pipeline_bytes,
            nranks,
            local_ranks,
            message_bytes,
        )
    }

    /// Calls of a collective moving `bytes` (its whole message) among `nranks` ranks after
    /// which every slot ring those calls pass through (shared memory, RDMA) has been written
    /// round at least once: calls timed after them see the rings' steady state, where each
    /// slot's lines were last touched one lap before, and not their first lap. Each call
    /// fills at least one slot, and at least `bytes / nranks` bytes, of every ring it uses.
    /// On a 2-core EPYC VM the first lap ran a 2-rank 32 KiB all-reduce in 3.0 µs and every
    /// later one in 3.8-3.9 µs.
    pub fn calls_to_lap_rings(&self, nranks: usize, bytes: usize) -> usize {
        let per_ring = (bytes / nranks.max(1)).max(1);
        let laps =
            |slots: usize, slot_size: usize| (slots * slot_size).div_ceil(per_ring).min(slots);
        laps(self.shm_slots as usize, self.shm_slot_size)
            .max(laps(self.rdma.slots, self.rdma.slot_size))
            + 1
    }
}

/// Picks the address to listen on. `spec` follows NCCL_SOCKET_IFNAME: a comma-separated list of
/// name prefixes, `=` for exact names, `^` to exclude.
pub fn pick_interface(spec: Option<&str>) -> Result<IpAddr> {
    let ifaces = interfaces();
    let pick = |f: &dyn Fn(&str) -> bool| ifaces.iter().find(|(n, _)| f(n)).map(|(_, a)| *a);
    match spec {
        Some(spec) => {
            let (exclude, list) = match spec.strip_prefix('^') {
                Some(rest) => (true, rest),
                None => (false, spec),
            };
            let (exact, list) = match list.strip_prefix('=') {
                Some(rest) => (true, rest),
                None => (false, list),
            };
            let names: Vec<&str> = list
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .collect();
            let matches = |n: &str| {
                names
                    .iter()
                    .any(|p| if exact { n == *p } else { n.starts_with(p) })
            };
            pick(&|n| matches(n) != exclude).ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "no interface with an IPv4 address matches socket interface '{spec}'"
                ))
            })
        }
        None => Ok(
            pick(&|n| n != "lo" && !n.starts_with("docker") && !n.starts_with("virbr"))
                .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST)),
        ),
    }
}

/// The name of the interface that holds `ip`, if any.
pub fn interface_of(ip: IpAddr) -> Option<String> {
    interfaces()
        .into_iter()
        .find(|(_, a)| *a == ip)
        .map(|(n, _)| n)
}

/// (name, IPv4 address) of every interface that is up.
fn interfaces() -> Vec<(String, IpAddr)> {
    let mut out = Vec::new();
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills a list we free below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return out;
    }
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: cur is a node of the list returned by getifaddrs.
        let ifa = unsafe { &*cur };
        if !ifa.ifa_addr.is_null() && ifa.ifa_flags & libc::IFF_UP as u32 != 0 {
            // SAFETY: ifa_addr is non-null and points to a sockaddr.
            let family = unsafe { (*ifa.ifa_addr).sa_family } as i32;
            if family == libc::AF_INET {
                // SAFETY: AF_INET addresses are sockaddr_in; ifa_name is a C string.
                let (sin, name) = unsafe {
                    (
                        &*(ifa.ifa_addr as *const libc::sockaddr_in),
                        std::ffi::CStr::from_ptr(ifa.ifa_name),
                    )
                };
                let ip = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
                out.push((name.to_string_lossy().into_owned(), IpAddr::V4(ip)));
            }
        }
        cur = ifa.ifa_next;
    }
    // SAFETY: head came from getifaddrs.
    unsafe { libc::freeifaddrs(head) };
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_can_be_chosen_by_name() {
        assert_eq!(
            pick_interface(Some("=lo")).unwrap(),
            IpAddr::V4(Ipv4Addr::LOCALHOST)
        );
        assert!(pick_interface(Some("=no-such-interface0")).is_err());
    }

    #[test]
    fn ring_slices_share_the_hosts_budget_and_only_when_blocks_do_not_fit() {
        let mut c = Config::from_env().unwrap();
        c.ring_pipeline_bytes = RING_PIPELINE_BYTES;
        let mib = 1 << 20;
        // 2 ranks on one host: 2 ranks × 2 steps share 4 MiB.
        assert_eq!(c.ring_slice_bytes(2, 2, 64 * mib), mib);
        // Blocks of 2 MiB, two on the host, fit the 4 MiB: the plain ring.
        assert_eq!(c.ring_slice_bytes(2, 2, 4 * mib), 0);
        assert_eq!(c.ring_slice_bytes(4, 4, 64 * mib), (4 * mib) / 24);
        // Many ranks: the floor.
        assert_eq!(c.ring_slice_bytes(64, 8, 1 << 30), 64 << 10);
        assert_eq!(c.ring_slice_bytes(1, 1, 64 * mib), 0);
        c.ring_pipeline_bytes = 0;
        assert_eq!(c.ring_slice_bytes(2, 2, 64 * mib), 0);
    }

    #[test]
    fn rings_lap_within_their_slot_count_and_at_once_for_large_messages() {
        let mut c = Config::from_env().unwrap();
        (c.shm_slots, c.shm_slot_size) = (128, 8 << 10);
        (c.rdma.slots, c.rdma.slot_size) = (8, 512 << 10);
        // Shared memory: 1 MiB of slots, 16 KiB of them per call of 32 KiB over 2 ranks. RDMA:
        // 4 MiB, but 8 slots, and a call fills at least one.
        assert_eq!(c.calls_to_lap_rings(2, 32 << 10), 65);
        assert_eq!(c.calls_to_lap_rings(2, 1 << 20), 9);
        assert_eq!(c.calls_to_lap_rings(2, 8), 129);
        assert_eq!(c.calls_to_lap_rings(4, 0), 129);
        assert_eq!(c.calls_to_lap_rings(2, 64 << 20), 2);
        c.shm_slot_size = 64;
        assert_eq!(c.calls_to_lap_rings(2, 64 << 20), 2);
        assert_eq!(
            c.calls_to_lap_rings(2, 1 << 20),
            9,
            "RDMA's 8 slots of 512 KiB"
        );
    }
}
