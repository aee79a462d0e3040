//! Metrics a running job exports for the dashboards a cluster already has: per communicator,
//! collective calls, bytes, time and bus bytes by collective, time stalled on peers, the
//! stragglers named now and the calls that failed, in the Prometheus text format (0.0.4).
//!
//! Opt-in. `STRATA_METRICS_PORT=P` serves them over HTTP (`GET /metrics`) from each process,
//! on port P + the process's place among this host's ranks of its first communicator (so the
//! ranks of a host do not collide, and a scrape configuration can list them);
//! `STRATA_METRICS_FILE=path` writes them to a file every `STRATA_METRICS_INTERVAL_MS` (1000)
//! for jobs that cannot open ports (`{rank}` and `{pid}` in the path are replaced), as
//! node_exporter's textfile collector reads them. A call adds to a few relaxed atomic
//! counters; nothing else happens on the data path.

use crate::error::{Error, Result};
use crate::watchdog::Health;
use crate::{Collective, Config};
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

/// busbw / algbw of `c` on `n` ranks (nccl-tests' factors): bus bytes are bytes times this.
pub fn bus_factor(c: Collective, n: usize) -> f64 {
    let n = n as f64;
    match c {
        Collective::AllReduce => 2.0 * (n - 1.0) / n,
        Collective::AllGather
        | Collective::ReduceScatter
        | Collective::AllToAll
        | Collective::Gather
        | Collective::Scatter => (n - 1.0) / n,
        _ => 1.0,
    }
}

/// One collective's counters.
#[derive(Default)]
struct Counters {
    calls: AtomicU64,
    bytes: AtomicU64,
    nanos: AtomicU64,
}

/// The counters of one communicator, shared with the exporters.
pub(crate) struct CommMetrics {
    /// `comm="…",rank="…",nranks="…",host="…"`.
    labels: String,
    nranks: usize,
    per: [Counters; Collective::ALL.len()],
    stalled_nanos: AtomicU64,
    faults: AtomicU64,
    health: Arc<Health>,
}

impl CommMetrics {
    /// Counters for rank `rank` of `nranks` of communicator `comm` on `host`.
    pub(crate) fn new(
        comm: &str,
        rank: usize,
        nranks: usize,
        host: &str,
        health: Arc<Health>,
    ) -> Self {
        let clean = |s: &str| s.replace(['\\', '"', '\n'], "_");
        Self {
            labels: format!(
                "comm=\"{}\",rank=\"{rank}\",nranks=\"{nranks}\",host=\"{}\"",
                clean(comm),
                clean(host)
            ),
            nranks,
            per: Default::default(),
            stalled_nanos: AtomicU64::new(0),
            faults: AtomicU64::new(0),
            health,
        }
    }

    /// A call of `collective` that moved `bytes` (the larger buffer of this rank, as
    /// nccl-tests counts) and took `took`, `stalled` of it on peers.
    pub(crate) fn record(
        &self,
        collective: Collective,
        bytes: usize,
        took: Duration,
        stalled: Duration,
    ) {
        let c = &self.per[collective.code() as usize];
        c.calls.fetch_add(1, Relaxed);
        c.bytes.fetch_add(bytes as u64, Relaxed);
        c.nanos.fetch_add(took.as_nanos() as u64, Relaxed);
        if !stalled.is_zero() {
            self.stalled_nanos
                .fetch_add(stalled.as_nanos() as u64, Relaxed);
        }
    }

    /// A call that failed.
    pub(crate) fn fault(&self) {
        self.faults.fetch_add(1, Relaxed);
    }
}

/// What every family is: name, type, help.
const FAMILIES: [(&str, &str, &str); 8] = [
    (
        "strata_calls_total",
        "counter",
        "Collective calls completed, by collective.",
    ),
    (
        "strata_bytes_total",
        "counter",
        "Bytes of the collective calls completed (the larger buffer of the rank, as nccl-tests counts), by collective.",
    ),
    (
        "strata_seconds_total",
        "counter",
        "Seconds spent in the collective calls completed, by collective.",
    ),
    (
        "strata_bus_bytes_total",
        "counter",
        "Bus bytes of the calls completed (bytes times nccl-tests' bus factor); divided by strata_seconds_total it is the bus bandwidth.",
    ),
    (
        "strata_stall_seconds_total",
        "counter",
        "Seconds this rank's calls stalled waiting on peers (idle stretches over STRATA_STRAGGLER_MS).",
    ),
    (
        "strata_stall_share",
        "gauge",
        "Share of this rank's recent collective time spent stalled, 0 to 1 (what its headers carry).",
    ),
    (
        "strata_straggler",
        "gauge",
        "1 for each peer this rank names a straggler now (label peer), with its stall share as seen here in strata_straggler_stall_share.",
    ),
    (
        "strata_faults_total",
        "counter",
        "Calls that failed (a peer died or hung, a timeout, an abort).",
    ),
];

/// The Prometheus text of every live communicator of this process.
pub fn render() -> String {
    let comms: Vec<Arc<CommMetrics>> = registry()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .filter_map(Weak::upgrade)
        .collect();
    let mut out = String::new();
    for (name, kind, help) in FAMILIES {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for m in &comms {
            let l = &m.labels;
            match name {
                "strata_stall_seconds_total" => {
                    let s = m.stalled_nanos.load(Relaxed) as f64 / 1e9;
                    let _ = writeln!(out, "{name}{{{l}}} {s}");
                }
                "strata_stall_share" => {
                    let share = m.health.own_stall_share();
                    let _ = writeln!(out, "{name}{{{l}}} {share}");
                }
                "strata_straggler" => {
                    for s in m.health.stragglers() {
                        let _ = writeln!(out, "{name}{{{l},peer=\"{}\"}} 1", s.rank);
                    }
                }
                "strata_faults_total" => {
                    let _ = writeln!(out, "{name}{{{l}}} {}", m.faults.load(Relaxed));
                }
                _ => {
                    for c in Collective::ALL {
                        let k = &m.per[c.code() as usize];
                        let calls = k.calls.load(Relaxed);
                        if calls == 0 {
                            continue;
                        }
                        let bytes = k.bytes.load(Relaxed);
                        let value = match name {
                            "strata_calls_total" => calls as f64,
                            "strata_bytes_total" => bytes as f64,
                            "strata_seconds_total" => k.nanos.load(Relaxed) as f64 / 1e9,
                            _ => (bytes as f64 * bus_factor(c, m.nranks)).round(),
                        };
                        let _ = writeln!(out, "{name}{{{l},collective=\"{}\"}} {value}", c.name());
                    }
                }
            }
        }
    }
    out
}

fn registry() -> &'static Mutex<Vec<Weak<CommMetrics>>> {
    static REGISTRY: OnceLock<Mutex<Vec<Weak<CommMetrics>>>> = OnceLock::new();
    REGISTRY.get_or_init(Default::default)
}

/// Adds a communicator's counters to what this process exports, and starts the exporters
/// `cfg` asks for with the first (`local_place`: this rank's place among its host's ranks;
/// `rank`: its rank, for the file's name). A port that cannot be had, or a file writer that
/// cannot start, is logged, and the job goes on.
pub(crate) fn register(
    m: &Arc<CommMetrics>,
    cfg: &Config,
    local_place: usize,
    rank: usize,
) -> Result<()> {
    {
        let mut live = registry().lock().unwrap_or_else(|e| e.into_inner());
        live.retain(|w| w.strong_count() > 0);
        live.push(Arc::downgrade(m));
    }
    static STARTED: Mutex<bool> = Mutex::new(false);
    let mut started = STARTED.lock().unwrap_or_else(|e| e.into_inner());
    if *started {
        return Ok(());
    }
    if let Some(base) = cfg.metrics_port {
        // A port another process holds costs the metrics, never the job: said once, and on.
        match serve_on(base, local_place, cfg.listen_ip) {
            Ok(addr) => tracing::info!(%addr, "metrics: Prometheus text at http://{addr}/metrics"),
            Err(e) => tracing::warn!("metrics: not served: {e}"),
        }
    }
    if let Some(pattern) = &cfg.metrics_file {
        let path = PathBuf::from(
            pattern
                .to_string_lossy()
                .replace("{rank}", &rank.to_string())
                .replace("{pid}", &std::process::id().to_string()),
        );
        let every = cfg.metrics_interval;
        std::thread::Builder::new()
            .name("strata-metrics-file".into())
            .spawn(move || {
                loop {
                    if let Err(e) = write_file(&path) {
                        tracing::warn!("metrics: cannot write {}: {e}", path.display());
                    }
                    std::thread::sleep(every);
                }
            })
            .map_err(|e| Error::io("spawning the metrics file writer", e))?;
    }
    *started = true;
    Ok(())
}

/// Starts the metrics server on port `base + place` of `ip`.
fn serve_on(base: u16, place: usize, ip: std::net::IpAddr) -> Result<SocketAddr> {
    let port = u16::try_from(place)
        .ok()
        .and_then(|p| base.checked_add(p))
        .ok_or_else(|| {
            Error::InvalidArgument(format!("STRATA_METRICS_PORT={base} + {place} is no port"))
        })?;
    let addr = SocketAddr::new(ip, port);
    let listener = TcpListener::bind(addr).map_err(|e| {
        Error::io(
            format!("binding the metrics port {addr} (STRATA_METRICS_PORT)"),
            e,
        )
    })?;
    std::thread::Builder::new()
        .name("strata-metrics".into())
        .spawn(move || serve(listener))
        .map_err(|e| Error::io("spawning the metrics server", e))?;
    Ok(addr)
}

/// Writes [`render`] to `path` through a temporary file, so a reader never sees half of it.
fn write_file(path: &std::path::Path) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, render())?;
    std::fs::rename(&tmp, path)
}

/// Answers every connection with the metrics, one request each.
fn serve(listener: TcpListener) {
    for conn in listener.incoming().flatten() {
        // A slow or silent client holds its own thread, never the next scrape.
        let _ = std::thread::Builder::new()
            .name("strata-metrics-conn".into())
            .spawn(move || answer(conn));
    }
}

/// Reads one HTTP request (its head, up to 8 KiB within 5 s) and answers it.
fn answer(mut conn: TcpStream) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = conn.set_write_timeout(Some(Duration::from_secs(5)));
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 8192 {
        match conn.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let line = String::from_utf8_lossy(&head);
    let mut words = line.split_whitespace();
    let (method, path) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let path = path.split('?').next().unwrap_or("");
    let (status, kind, body) = match (method, path) {
        ("GET", "/metrics" | "/") => (
            "200 OK",
            "text/plain; version=0.0.4; charset=utf-8",
            render(),
        ),
        ("GET", _) => (
            "404 Not Found",
            "text/plain",
            "strata serves /metrics\n".into(),
        ),
        _ => ("405 Method Not Allowed", "text/plain", "GET only\n".into()),
    };
    let _ = write!(
        conn,
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
}
