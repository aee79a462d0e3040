//! What the multi-process test binaries share: the worker side (a rank joins the communicator
//! its parent set up), spawning ranks as processes under an outer deadline, and the full
//! collective × type × reduction matrix one rank runs.
//!
//! `spawn` understands two markers in `env`: `STRATA_TEST_IBVERBS_STANDIN=1` puts the
//! libibverbs stand-in first on the ranks' library path, and `STRATA_TEST_NETNS=<prefix>` runs
//! rank r in network namespace `<prefix><r>` (an emulated host whose address ends in r + 1,
//! in subnet `STRATA_TEST_SUBNET`) and has the ranks join through the launcher variables, rank
//! 0 serving the rendezvous. With `STRATA_TEST_RANKS_PER_HOST=k`, rank r runs in namespace
//! `<prefix><r / k>` as local rank `r mod k`; with `STRATA_TEST_NIC_SUBNET=<a.b.c.>`, rank r's
//! stand-in NIC has address `<a.b.c.><101 + r>` (`STRATA_IBV_STANDIN_ADDR`).

#![allow(dead_code, unused_macros)] // each test binary uses part of this

/// A test that runs [`matrix`] on `$n` ranks (each its own process) with `$env`; with a
/// transport name, every rank also checks that its connection to the next rank used it.
macro_rules! matrix_test {
    ($name:ident, $n:expr, $big:expr, $env:expr) => {
        matrix_test!($name, $n, $big, $env, None);
    };
    ($name:ident, $n:expr, $big:expr, $env:expr, $transport:expr) => {
        #[test]
        fn $name() {
            if let Some(w) = worker() {
                matrix(&w, $big);
                let want: Option<&str> = $transport;
                if want.is_some() && w.n > 1 {
                    assert_eq!(w.comm.transport_to((w.rank + 1) % w.n), want);
                }
                return;
            }
            if is_worker() {
                return;
            }
            assert_all_ok(&spawn(
                stringify!($name),
                $n,
                $n,
                $env,
                Duration::from_secs(400),
            ));
        }
    };
}

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use strata::check;
use strata::{CallSpec, Collective, Communicator, DataType, ReduceOp, UniqueId};

pub mod any_source;
pub mod gpu;
pub mod netns;

pub const WORKER: &str = "STRATA_TEST_WORKER";

/// Says on one line that `test` did not run and why. Under `STRATA_TESTS_ALL=1` (set by
/// `scripts/test-all.sh`, which installs everything the suite needs) a skip is a failure.
pub fn skip(test: &str, why: &str) {
    if std::env::var_os("STRATA_TESTS_ALL").is_some() {
        panic!("{test} would be skipped ({why}), but STRATA_TESTS_ALL=1 runs every test");
    }
    // Straight to stderr, which `cargo test` does not capture: the line shows in a passing run.
    let _ = std::io::Write::write_fmt(
        &mut std::io::stderr(),
        format_args!("SKIPPED {test}: {why}\n"),
    );
}

/// `STRATA_NVRTC_DIR`, the folder of `libnvrtc.so.12`; `None` (having said so through
/// [`skip`]) when it is not set.
pub fn nvrtc_dir(test: &str) -> Option<std::ffi::OsString> {
    let dir = std::env::var_os("STRATA_NVRTC_DIR");
    if dir.is_none() {
        skip(
            test,
            "STRATA_NVRTC_DIR (the folder of libnvrtc.so.12, which scripts/test-all.sh installs) is not set",
        );
    }
    dir
}

pub struct Worker {
    pub comm: Communicator,
    pub rank: usize,
    pub n: usize,
}

/// In a worker process: joins the communicator the parent set up.
pub fn worker() -> Option<Worker> {
    std::env::var(WORKER).ok()?;
    let rank: usize = std::env::var("STRATA_TEST_RANK").ok()?.parse().ok()?;
    let n: usize = std::env::var("STRATA_TEST_NRANKS").ok()?.parse().ok()?;
    let id = std::env::var("STRATA_TEST_ID").ok();
    // STRATA_TEST_LEAVES=k deals the ranks round-robin over k leaf switches (through Slurm's
    // variables), so the topology order differs from the launcher's.
    if let Some(k) = std::env::var("STRATA_TEST_LEAVES")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
    {
        // SAFETY: the worker is single-threaded until init.
        unsafe {
            std::env::set_var(
                "SLURM_TOPOLOGY_ADDR",
                format!("spine.leaf{}.node{rank}", rank % k),
            );
            std::env::set_var("SLURM_TOPOLOGY_ADDR_PATTERN", "switch.switch.node");
        }
    }
    let comm = match id {
        Some(hex) => Communicator::init(&UniqueId::from_hex(&hex).unwrap(), n, rank),
        None => Communicator::from_env(),
    }
    .unwrap_or_else(|e| panic!("rank {rank}: init: {e}"));
    Some(Worker { comm, rank, n })
}

/// `target/<profile>/ibverbs-standin/libibverbs.so.1`: the libibverbs stand-in, first on the
/// library path of ranks that use it.
pub fn ibverbs_standin_dir() -> PathBuf {
    standin_dir(
        "libstrata_ibverbs_standin.so",
        "libibverbs.so.1",
        "ibverbs-standin",
    )
}

/// `target/<profile>/<dir>/<soname>`, copied (once per test process) from the stand-in cdylib
/// `built` that this test built as a dev-dependency, so `dlopen(soname)` finds it first.
pub fn standin_dir(built: &str, soname: &str, dir: &str) -> PathBuf {
    static DIRS: std::sync::Mutex<Vec<(String, PathBuf)>> = std::sync::Mutex::new(Vec::new());
    let mut dirs = DIRS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, d)) = dirs.iter().find(|(s, _)| s == soname) {
        return d.clone();
    }
    let exe = std::env::current_exe().unwrap();
    let profile = exe.parent().and_then(Path::parent).unwrap().to_path_buf();
    let from = [profile.join("deps"), profile.clone()]
        .into_iter()
        .map(|d| d.join(built))
        .find(|p| p.exists())
        .unwrap_or_else(|| panic!("the stand-in {built} (a dev-dependency) was built"));
    let to = profile.join(dir);
    std::fs::create_dir_all(&to).unwrap();
    let tmp = to.join(format!("{soname}.{}", std::process::id()));
    std::fs::copy(&from, &tmp).unwrap();
    std::fs::rename(&tmp, to.join(soname)).unwrap();
    dirs.push((soname.to_string(), to.clone()));
    to
}

pub fn is_worker() -> bool {
    std::env::var_os(WORKER).is_some()
}

/// Spawns `n` ranks running test `name` (only `ranks_started` of them, to test init failures),
/// and returns each rank's (success, combined output).
pub fn spawn(
    name: &str,
    n: usize,
    ranks_started: usize,
    env: &[(&str, &str)],
    limit: Duration,
) -> Vec<(bool, String)> {
    spawn_watched(name, n, ranks_started, env, limit, |_, _| {})
}

/// [`spawn`], calling `watch` with the ranks' pids and the time since they started about
/// every 10 ms while they run (to throttle or signal one of them).
pub fn spawn_watched(
    name: &str,
    n: usize,
    ranks_started: usize,
    env: &[(&str, &str)],
    limit: Duration,
    mut watch: impl FnMut(&[u32], Duration),
) -> Vec<(bool, String)> {
    // One job at a time: the machine has two cores and each job brings up to 8 processes.
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one_at_a_time = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // SAFETY: set before the root thread starts; every test in this binary sets the same value.
    unsafe { std::env::set_var("STRATA_SOCKET_IFNAME", "=lo") };
    let marker = |name: &str| env.iter().find(|(k, _)| *k == name).map(|(_, v)| *v);
    let netns = marker("STRATA_TEST_NETNS");
    // STRATA_RDMA_TESTS_REAL=1 (scripts/rdma-check.sh): rdma-core's own library and devices.
    let standin = marker("STRATA_TEST_IBVERBS_STANDIN")
        .filter(|_| std::env::var_os("STRATA_RDMA_TESTS_REAL").is_none())
        .map(|_| ibverbs_standin_dir());
    let hex = match netns {
        Some(_) => None,
        None => Some(UniqueId::new().unwrap().to_hex()),
    };
    let subnet = marker("STRATA_TEST_SUBNET").unwrap_or("198.18.2.");
    let per_host: usize = marker("STRATA_TEST_RANKS_PER_HOST")
        .and_then(|k| k.parse().ok())
        .unwrap_or(1);
    let nic_subnet = marker("STRATA_TEST_NIC_SUBNET");
    let port = 29_000 + (std::process::id() % 900) as u16 * 2;
    let exe = std::env::current_exe().unwrap();
    let mut children: Vec<Child> = (0..ranks_started)
        .map(|r| {
            let mut c = match netns {
                Some(prefix) => {
                    let mut c = Command::new("ip");
                    c.args(["netns", "exec", &format!("{prefix}{}", r / per_host)])
                        .arg(&exe);
                    c.env("STRATA_SOCKET_IFNAME", "eth0")
                        .env("LOCAL_RANK", (r % per_host).to_string())
                        .env("RANK", r.to_string())
                        .env("WORLD_SIZE", n.to_string())
                        .env("MASTER_ADDR", format!("{subnet}1"))
                        .env("MASTER_PORT", port.to_string())
                        .env(
                            "STRATA_SECRET",
                            format!("{:032x}", port as u128 * 7919 + n as u128),
                        );
                    c
                }
                None => {
                    let mut c = Command::new(&exe);
                    c.env("STRATA_SOCKET_IFNAME", "=lo");
                    c
                }
            };
            c.args([name, "--exact", "--nocapture", "--test-threads=1"])
                .env(WORKER, "1")
                .env("STRATA_TEST_RANK", r.to_string())
                .env("STRATA_TEST_NRANKS", n.to_string())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            if let Some(hex) = &hex {
                c.env("STRATA_TEST_ID", hex);
            }
            if let Some(dir) = &standin {
                c.env("LD_LIBRARY_PATH", dir);
            }
            for (k, v) in env {
                c.env(k, v);
            }
            if let Some(nic) = nic_subnet {
                c.env("STRATA_IBV_STANDIN_ADDR", format!("{nic}{}", 101 + r));
            }
            c.spawn().unwrap()
        })
        .collect();
    let start = Instant::now();
    let pids: Vec<u32> = children.iter().map(Child::id).collect();
    let mut done: Vec<Option<bool>> = vec![None; children.len()];
    while done.iter().any(Option::is_none) {
        watch(&pids, start.elapsed());
        for (r, c) in children.iter_mut().enumerate() {
            if done[r].is_none()
                && let Some(s) = c.try_wait().unwrap()
            {
                done[r] = Some(s.success());
            }
        }
        if start.elapsed() > limit {
            for c in &mut children {
                let _ = c.kill();
            }
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    children
        .into_iter()
        .zip(done)
        .map(|(c, ok)| {
            let out = c.wait_with_output().unwrap();
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            (
                ok == Some(true),
                if ok.is_none() {
                    format!("KILLED after {limit:?}\n{text}")
                } else {
                    text
                },
            )
        })
        .collect()
}

/// Asserts every rank succeeded; on a failure it shows every rank's output, the healthy ones
/// too, since the rank that failed is often not the rank that caused it.
pub fn assert_all_ok(results: &[(bool, String)]) {
    let failed: Vec<usize> = (0..results.len()).filter(|&r| !results[r].0).collect();
    if failed.is_empty() {
        return;
    }
    let mut all = String::new();
    for (r, (ok, out)) in results.iter().enumerate() {
        let verdict = if *ok { "ok" } else { "FAILED" };
        all.push_str(&format!("===== rank {r}: {verdict}\n{out}\n"));
    }
    panic!("ranks {failed:?} failed\n{all}");
}

pub const COLLECTIVES: [Collective; 8] = Collective::WITH_BUFFERS;

pub fn all_ops(dtype: DataType) -> Vec<ReduceOp> {
    let mut v = ReduceOp::BASIC.to_vec();
    v.push(ReduceOp::PreMulSum(check::premul_scalar(dtype, 0)));
    v
}

/// Runs one call with checked inputs on this rank and describes the first wrong element.
pub fn run_checked(w: &Worker, spec: CallSpec, in_place: bool) -> Result<(), String> {
    let what = format!(
        "{:?} {} {} count {} root {} in_place {in_place}",
        spec.collective, spec.dtype, spec.op, spec.count, spec.root
    );
    match check::run_and_check(&w.comm, spec, in_place) {
        Err(e) => Err(format!("{what}: {e}")),
        Ok(c) => match c.first {
            None => Ok(()),
            Some((i, got, want)) => Err(format!(
                "{what}: rank {} element {i} is {got}, expected {want}",
                w.rank
            )),
        },
    }
}

/// The full matrix for one communicator.
pub fn matrix(w: &Worker, big: bool) {
    let small_counts = [0usize, 1, 7, 4099];
    for c in COLLECTIVES {
        for dtype in DataType::ALL {
            let ops = if c.reduces() {
                all_ops(dtype)
            } else {
                vec![ReduceOp::Sum]
            };
            for op in ops {
                for (k, &count) in small_counts.iter().enumerate() {
                    let root = (k + dtype as usize) % w.n;
                    for in_place in [false, true] {
                        let spec = CallSpec {
                            collective: c,
                            dtype,
                            count,
                            op,
                            root,
                        };
                        if let Err(e) = run_checked(w, spec, in_place) {
                            panic!("{e}");
                        }
                    }
                }
            }
        }
    }
    if big {
        // 1 MiB + 5 elements: every collective in every type (sum), every reduction of
        // all-reduce in every type, in place and out of place for f32.
        let count = (1 << 20) + 5;
        for c in COLLECTIVES {
            for dtype in DataType::ALL {
                let ops = if c == Collective::AllReduce {
                    all_ops(dtype)
                } else {
                    vec![ReduceOp::Sum]
                };
                for op in ops {
                    let spec = CallSpec {
                        collective: c,
                        dtype,
                        count,
                        op,
                        root: w.n - 1,
                    };
                    run_checked(w, spec, false).unwrap_or_else(|e| panic!("{e}"));
                    if dtype == DataType::Float32 {
                        run_checked(w, spec, true).unwrap_or_else(|e| panic!("{e}"));
                    }
                }
            }
        }
    }
    // Barrier, and send/recv around the ring (even ranks send first so the pair never both
    // block on a send).
    w.comm.barrier().unwrap();
    if w.n > 1 {
        let next = (w.rank + 1) % w.n;
        let prev = (w.rank + w.n - 1) % w.n;
        let payload: Vec<u64> = (0..4099).map(|i| (w.rank * 1_000_000 + i) as u64).collect();
        let mut got = vec![0u64; 4099];
        if w.rank.is_multiple_of(2) {
            w.comm.send(&payload, next).unwrap();
            w.comm.recv(&mut got, prev).unwrap();
        } else {
            w.comm.recv(&mut got, prev).unwrap();
            w.comm.send(&payload, next).unwrap();
        }
        assert!(
            got.iter()
                .enumerate()
                .all(|(i, v)| *v == (prev * 1_000_000 + i) as u64)
        );
    }
    w.comm.barrier().unwrap();
}

/// A 64 MiB in-place f32 all-reduce on device buffers of GPU `device`, each rank adding
/// `rank + 1`, polled to completion (nothing waits on the GPU meanwhile); checks that no host
/// collective ran inside it and that every element is the sum, and returns what the CUDA
/// stand-in counted between enqueue and completion.
pub fn polled_64_mib_all_reduce(
    comm: &Communicator,
    rank: usize,
    n: usize,
    device: i32,
) -> strata::gpu::StandinStats {
    use strata::gpu::{self, DeviceBuffer, Stream};
    let f32s = |v: f32, count: usize| -> Vec<u8> { v.to_ne_bytes().repeat(count) };
    let stream = Stream::new(device).unwrap();
    let count = 16 << 20;
    let buf = DeviceBuffer::alloc(device, count * 4).unwrap();
    buf.upload(&f32s((rank + 1) as f32, count), &stream)
        .unwrap();
    let done = gpu::Event::new(false).unwrap();
    let spec = CallSpec::new(Collective::AllReduce, DataType::Float32, count);
    let calls_before = comm.progress();
    let before = gpu::standin_stats().unwrap();
    comm.call_device(spec, None, &buf, &stream).unwrap();
    done.record(&stream).unwrap();
    let t = Instant::now();
    while !done.is_complete().unwrap() {
        assert!(
            t.elapsed() < Duration::from_secs(300),
            "the call did not finish"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let during = gpu::standin_stats().unwrap().since(&before);
    assert_eq!(
        comm.progress(),
        calls_before,
        "a host collective ran inside the call"
    );
    let mut out = vec![0u8; count * 4];
    buf.download(&mut out, &stream).unwrap();
    let want = (n * (n + 1) / 2) as f32;
    assert!(out == f32s(want, count), "wrong sum");
    during
}
