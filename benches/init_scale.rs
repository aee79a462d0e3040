//! How communicator init grows with the number of ranks: ranks as threads spread over several
//! processes (one process could not hold 1,024 ranks' sockets under this machine's 20,000-file
//! limit), all on loopback, every rank calling `Communicator::init` at once.
//!
//!     cargo bench --bench init_scale -- [--ranks 1,64,256,1024] [--trials 3] [--procs 8]
//!     cargo bench --bench init_scale -- --model
//!
//! For each rank count it prints the time from spawning the processes to the last rank's
//! `init` returning (process start included), the median rank's time, and the bootstrap
//! tree's depth. Every rank's table must have every rank, in order, and be the same on all
//! ranks, so a figure is only printed for a bootstrap that worked. (The collectives on a tree
//! bootstrap are tested in tests/threads.rs and tests/multiprocess.rs.)
//!
//! `--model` measures what the bootstrap's critical path is made of on this machine (the
//! directory's cost per registration, the table's encode and decode cost per rank) and
//! extrapolates to 24,576 and 98,304 ranks, for the tree and for the root gather it replaced.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use strata::{Communicator, Config, TransportPolicy, UniqueId};

const WORKER: &str = "STRATA_INIT_BENCH_WORKER";

fn unix_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

fn config() -> Config {
    let mut c = Config::from_env().expect("configuration");
    c.listen_ip = "127.0.0.1".parse().expect("loopback");
    c.init_timeout = Duration::from_secs(120);
    c.timeout = Duration::from_secs(120);
    c.transport = TransportPolicy::Tcp;
    // Hundreds of ranks on two cores: a watchdog thread, or a listener's handshake, can wait
    // seconds for a core while the others set up the all-reduce's connections. This measures
    // init, not the watchdog.
    c.heartbeat_misses = 30;
    c.handshake_timeout = Duration::from_secs(30);
    c
}

/// A worker process: ranks `first..first + count` of `nranks` as threads. Prints
/// `ready <rank> <unix ns>` as each rank's init returns, then `table <rank> <hash>` (a hash of
/// the rank table it got), and exits when its standard input closes.
fn worker(spec: &str) {
    let mut it = spec.split(',');
    let mut next = || -> usize { it.next().and_then(|v| v.parse().ok()).expect("worker spec") };
    let (first, count, nranks) = (next(), next(), next());
    let id = UniqueId::from_hex(&std::env::var("STRATA_INIT_BENCH_ID").expect("id")).expect("id");
    let out = std::sync::Mutex::new(std::io::stdout());
    let comms: Vec<Communicator> = std::thread::scope(|s| {
        let handles: Vec<_> = (first..first + count)
            .map(|rank| {
                let out = &out;
                s.spawn(move || {
                    let comm = Communicator::init_with_config(&id, nranks, rank, config())
                        .unwrap_or_else(|e| panic!("rank {rank}: init failed: {e}"));
                    let line = format!("ready {rank} {}\n", unix_ns());
                    out.lock().expect("stdout").write_all(line.as_bytes()).ok();
                    comm
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank"))
            .collect()
    });
    for comm in &comms {
        let peers = comm.peers();
        assert_eq!(peers.len(), nranks, "rank {}: table size", comm.rank());
        // FNV-1a over every rank's listener: equal on every rank iff the tables agree.
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for (i, p) in peers.iter().enumerate() {
            assert_eq!(p.rank, i, "rank {}: table order", comm.rank());
            for b in p.listen.to_string().bytes() {
                hash = (hash ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
            }
        }
        let line = format!("table {} {hash:016x}\n", comm.rank());
        out.lock().expect("stdout").write_all(line.as_bytes()).ok();
    }
    out.lock().expect("stdout").flush().ok();
    let mut rest = String::new();
    let _ = std::io::stdin().read_line(&mut rest);
}

struct Trial {
    last_s: f64,
    median_s: f64,
}

fn trial(nranks: usize, procs: usize) -> Trial {
    // SAFETY: set before the root (which reads the configuration) starts; single-threaded here.
    unsafe { std::env::set_var("STRATA_SOCKET_IFNAME", "=lo") };
    let id = UniqueId::new().expect("unique id");
    let procs = procs.clamp(1, nranks);
    let start_ns = unix_ns();
    let exe = std::env::current_exe().expect("own path");
    let mut children = Vec::new();
    for p in 0..procs {
        let first = nranks * p / procs;
        let count = nranks * (p + 1) / procs - first;
        let child = Command::new(&exe)
            .env(WORKER, format!("{first},{count},{nranks}"))
            .env("STRATA_INIT_BENCH_ID", id.to_hex())
            .env("STRATA_SOCKET_IFNAME", "=lo")
            // Workers exit one by one after the measurement, and the ranks still running log
            // their peers' departure; a failed init still panics with its error.
            .env(
                "STRATA_LOG",
                std::env::var("STRATA_LOG").unwrap_or_else(|_| "off".into()),
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawning a worker");
        children.push((child, count));
    }
    let mut ready = Vec::with_capacity(nranks);
    let mut tables = std::collections::BTreeSet::new();
    let mut answered = 0;
    for (child, count) in &mut children {
        let stdout = child.stdout.take().expect("piped");
        let mut here = 0;
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let words: Vec<&str> = line.split_whitespace().collect();
            match words.as_slice() {
                ["ready", _, ns] => {
                    let ns: u128 = ns.parse().expect("time");
                    ready.push(ns.saturating_sub(start_ns) as f64 / 1e9);
                }
                ["table", _, hash] => {
                    tables.insert(hash.to_string());
                    here += 1;
                }
                _ => {}
            }
            if here == *count {
                break;
            }
        }
        answered += here;
    }
    for (mut child, _) in children {
        drop(child.stdin.take());
        let status = child.wait().expect("worker");
        assert!(status.success(), "a worker failed: {status}");
    }
    assert_eq!(ready.len(), nranks, "every rank's init returned");
    assert_eq!(answered, nranks, "every rank reported its table");
    assert_eq!(tables.len(), 1, "every rank got the same rank table");
    ready.sort_by(f64::total_cmp);
    Trial {
        last_s: ready[nranks - 1],
        median_s: ready[nranks / 2],
    }
}

/// Seconds to encode and to decode a table of `n` entries like this host's (medians of 5), and
/// its bytes.
fn table_codec(n: usize) -> (f64, f64, usize) {
    let entry = strata::PeerInfo {
        rank: 0,
        host: strata::topology::HostIdentity::detect(),
        pid: std::process::id(),
        process: 0x1234_5678_9abc_def0,
        listen: "198.18.100.200:45678".parse().expect("address"),
        place: Default::default(),
        transports: Default::default(),
        probe: strata::HostProbe {
            cores: 192,
            copy_mbps: 12_345,
            reduce_mbps: 6_789,
            bound_cpu: 7,
        },
    };
    let table: Vec<strata::PeerInfo> = (0..n)
        .map(|rank| strata::PeerInfo {
            rank,
            ..entry.clone()
        })
        .collect();
    let (mut enc, mut dec, mut bytes) = (Vec::new(), Vec::new(), 0);
    for _ in 0..5 {
        let t = std::time::Instant::now();
        let body = serde_json::to_vec(&table).expect("encode");
        enc.push(t.elapsed().as_secs_f64());
        let t = std::time::Instant::now();
        let back: Vec<strata::PeerInfo> = serde_json::from_slice(&body).expect("decode");
        dec.push(t.elapsed().as_secs_f64());
        assert_eq!(back.len(), n);
        bytes = body.len();
    }
    enc.sort_by(f64::total_cmp);
    dec.sort_by(f64::total_cmp);
    (enc[2], dec[2], bytes)
}

/// The bootstrap's critical path at `p` ranks from measured costs: the directory answers p
/// registrations one after another, then the table crosses the tree up and down (each level
/// decodes and re-encodes it and sends it to up to K children in turn), with `alpha` per hop
/// and `bandwidth` bytes/s per link.
struct InitModel {
    register_s: f64,
    encode_per_entry_s: f64,
    decode_per_entry_s: f64,
    bytes_per_entry: f64,
    alpha_s: f64,
    bandwidth: f64,
}

impl InitModel {
    fn tree(&self, p: usize) -> f64 {
        let (p_f, d) = (p as f64, strata::bootstrap::tree_depth(p) as f64);
        let codec = p_f * (self.encode_per_entry_s + self.decode_per_entry_s);
        let send =
            strata::bootstrap::TREE_FANOUT as f64 * p_f * self.bytes_per_entry / self.bandwidth;
        p_f * self.register_s + (d + 1.0) * codec + d * send + 2.0 * d * self.alpha_s
    }

    /// The root-gather bootstrap this replaced: p registrations, then the root encodes and sends
    /// the whole table to every rank.
    fn root_gather(&self, p: usize) -> f64 {
        let p_f = p as f64;
        let table = p_f * self.bytes_per_entry;
        p_f * self.register_s
            + p_f * (p_f * self.encode_per_entry_s + table / self.bandwidth)
            + p_f * self.decode_per_entry_s
    }
}

fn model() {
    let probe = 4096;
    let register = strata::bootstrap::directory_registration_time(probe, 16)
        .expect("registering at a directory")
        .as_secs_f64()
        / probe as f64;
    let (enc, dec, bytes) = table_codec(probe);
    let m = InitModel {
        register_s: register,
        encode_per_entry_s: enc / probe as f64,
        decode_per_entry_s: dec / probe as f64,
        bytes_per_entry: bytes as f64 / probe as f64,
        alpha_s: 100e-6,
        bandwidth: 12.5e9,
    };
    println!(
        "# measured here: {:.0} us per registration at the directory ({probe} from 16 threads), \
         table {:.0} B/rank, encode {:.2} us/rank, decode {:.2} us/rank",
        m.register_s * 1e6,
        m.bytes_per_entry,
        m.encode_per_entry_s * 1e6,
        m.decode_per_entry_s * 1e6
    );
    println!(
        "# assumed: 100 us per tree hop (TCP connect and handshake), 12.5 GB/s per link \
         (100 Gb/s front-end network); one core per rank"
    );
    println!(
        "{:>7} {:>11} {:>17} {:>20}",
        "ranks", "tree depth", "tree model (s)", "root gather model (s)"
    );
    for p in [1024, 24_576, 98_304] {
        println!(
            "{:>7} {:>11} {:>17.2} {:>20.1}",
            p,
            strata::bootstrap::tree_depth(p),
            m.tree(p),
            m.root_gather(p)
        );
    }
}

fn main() {
    if let Ok(spec) = std::env::var(WORKER) {
        worker(&spec);
        return;
    }
    let args: Vec<String> = std::env::args().collect();
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let ranks: Vec<usize> = value("--ranks")
        .unwrap_or_else(|| "1,64,256,1024".into())
        .split(',')
        .map(|v| v.parse().expect("--ranks takes counts like 1,64,256"))
        .collect();
    if args.iter().any(|a| a == "--model") {
        model();
        return;
    }
    let trials: usize = value("--trials").map_or(3, |v| v.parse().expect("--trials"));
    let procs: usize = value("--procs").map_or(8, |v| v.parse().expect("--procs"));
    println!("# init on loopback, ranks as threads in up to {procs} processes, {trials} trials");
    println!(
        "{:>7} {:>12} {:>12} {:>12}",
        "ranks", "last (s)", "median (s)", "tree depth"
    );
    for &n in &ranks {
        let mut last = Vec::new();
        let mut median = Vec::new();
        for _ in 0..trials {
            let t = trial(n, procs);
            last.push(t.last_s);
            median.push(t.median_s);
        }
        last.sort_by(f64::total_cmp);
        median.sort_by(f64::total_cmp);
        println!(
            "{:>7} {:>12.3} {:>12.3} {:>12}",
            n,
            last[trials / 2],
            median[trials / 2],
            strata::bootstrap::tree_depth(n)
        );
    }
}
