//! The RDMA transport, each rank its own process.
//!
//! * Over the libibverbs stand-in (`tests/standins/ibverbs`, loaded as `libibverbs.so.1`
//!   through the same `dlopen` path as rdma-core): every collective × type × reduction at 2, 3
//!   and 4 processes (the 1 MiB cases at 2), on InfiniBand and RoCE ports, with small slots and
//!   several queue pairs so the credits wrap; receive from any source; a bad remote key, a
//!   pulled cable and a QP error injected into the stand-in's NIC, each named with the device
//!   or lane and the verbs status; a rank that destroys its communicator while its last write
//!   is still held by a slow link, whose peer still gets it; a device that is missing; a
//!   dma-buf registration. Everything here is protocol-level: the stand-in's wire is a TCP
//!   connection per queue pair, so no figure from it is NIC speed.
//! * Over libfabric's real `tcp` provider across 4 emulated hosts (network namespaces on a
//!   bridge; needs root, `ip` and libfabric, and says so when it skips): the matrix and
//!   receive from any source, a peer killed in the middle of 4 MiB all-reduces named on
//!   every survivor, and (2 hosts, the sender's link shaped by `tc tbf`) a rank that destroys
//!   its communicator right after its last send, whose peer still gets all of it.
//!
//! With `STRATA_RDMA_TESTS_REAL=1` (`scripts/rdma-check.sh`) the verbs matrices run on the
//! machine's own rdma-core and devices, and the tests that need the stand-in say they skip.

#[macro_use]
mod common;

use common::netns::Hosts;
use common::*;
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use strata::ReduceOp;

const VERBS: (&str, &str) = ("STRATA_TRANSPORT", "verbs");
const STANDIN: (&str, &str) = ("STRATA_TEST_IBVERBS_STANDIN", "1");

/// True (after printing why) when a test needs the stand-in but real devices are in use.
fn skip_on_real_devices(test: &str, why: &str) -> bool {
    let real = std::env::var_os("STRATA_RDMA_TESTS_REAL").is_some();
    if real {
        println!("skipped: {test} {why} (STRATA_RDMA_TESTS_REAL=1)");
    }
    real
}

matrix_test!(
    matrix_2_processes_over_verbs_standin,
    2,
    true,
    &[VERBS, STANDIN],
    Some("verbs")
);
matrix_test!(
    matrix_3_processes_over_verbs_standin_roce_small_slots_three_qps,
    3,
    false,
    &[
        VERBS,
        STANDIN,
        ("STRATA_IBV_STANDIN_LINK", "roce"),
        ("NCCL_IB_QPS_PER_CONNECTION", "3"),
        ("STRATA_RDMA_SLOTS", "4"),
        ("STRATA_RDMA_SLOT_SIZE", "4096"),
        ("NCCL_IB_TC", "106"),
    ],
    Some("verbs")
);
matrix_test!(
    matrix_4_processes_over_verbs_standin,
    4,
    false,
    &[VERBS, STANDIN],
    Some("verbs")
);

/// All-reduces until one fails; prints the error and the time it came, and exits 1.
fn fail_eventually(w: &Worker, elems: usize) -> ! {
    let mut v = vec![1f32; elems];
    for _ in 0..100_000 {
        if let Err(e) = w.comm.all_reduce_in_place(&mut v, ReduceOp::Sum) {
            println!("FAILED_AT_US={} ERROR={e}", now_us());
            std::process::exit(1);
        }
    }
    println!("never failed");
    std::process::exit(0);
}

fn now_us() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros())
        .unwrap_or(0)
}

/// A fault injected into the stand-in's NIC (`STRATA_IBV_STANDIN_FAULT`) on `n` ranks that
/// all-reduce until one fails: every rank must fail, and together they must say each of
/// `expect`.
macro_rules! injected_fault_test {
    ($name:ident, $n:expr, $env:expr, $expect:expr) => {
        #[test]
        fn $name() {
            if let Some(w) = worker() {
                fail_eventually(&w, 1 << 14);
            }
            if is_worker()
                || skip_on_real_devices(
                    stringify!($name),
                    "injects its fault into the stand-in's NIC",
                )
            {
                return;
            }
            let mut env = vec![VERBS, STANDIN];
            env.extend_from_slice($env);
            let res = spawn(stringify!($name), $n, $n, &env, Duration::from_secs(60));
            let all: String = res.iter().map(|r| r.1.as_str()).collect();
            assert!(res.iter().all(|r| !r.0), "every rank fails:\n{all}");
            for want in $expect {
                assert!(all.contains(want), "{want} is said:\n{all}");
            }
        }
    };
}

injected_fault_test!(
    a_bad_remote_key_is_named_with_the_device_and_the_verbs_status,
    3,
    &[("STRATA_IBV_STANDIN_FAULT", "rkey:50")],
    [
        "remote access error (IBV_WC_REM_ACCESS_ERR",
        "verbs standin_ib0 port 1 (InfiniBand",
    ]
);
// 4.096 µs × 2^12 × (7 + 1) ≈ 134 ms before the NIC gives up.
injected_fault_test!(
    a_pulled_cable_is_named_as_retry_exceeded_with_the_device,
    2,
    &[
        ("STRATA_IBV_STANDIN_FAULT", "drop:40"),
        ("NCCL_IB_TIMEOUT", "12"),
        ("STRATA_TIMEOUT", "60"),
    ],
    [
        "transport retry counter exceeded (IBV_WC_RETRY_EXC_ERR",
        "standin_ib0",
    ]
);
injected_fault_test!(
    a_queue_pair_in_the_error_state_is_named_as_flushed,
    2,
    &[("STRATA_IBV_STANDIN_FAULT", "qperr:30")],
    ["Work Request Flushed Error (IBV_WC_WR_FLUSH_ERR", "lane "]
);

/// Receive from any source over RDMA: the receiver looks at each peer's next message in its
/// granted slots without consuming it (`common::any_source`'s exchange, with a 1 MiB message that
/// crosses many slots). Every peer must be joined to rank 0 by `transport`.
fn receive_from_any_source(w: &Worker, transport: &str) {
    any_source::every_message_once_with_its_sender(&w.comm, 1 << 20);
    if w.rank == 0 {
        for q in 1..w.n {
            assert_eq!(w.comm.transport_to(q), Some(transport), "rank {q}");
        }
        println!("ANY_SOURCE_OK");
    }
}

#[test]
fn receive_from_any_source_over_verbs_names_every_sender_in_order() {
    if let Some(w) = worker() {
        receive_from_any_source(&w, "verbs");
        return;
    }
    if is_worker() {
        return;
    }
    let env = [
        VERBS,
        STANDIN,
        ("STRATA_RDMA_SLOTS", "4"),
        ("STRATA_RDMA_SLOT_SIZE", "4096"),
    ];
    let name = "receive_from_any_source_over_verbs_names_every_sender_in_order";
    let res = spawn(name, 4, 4, &env, Duration::from_secs(60));
    assert_all_ok(&res);
    assert!(res[0].1.contains("ANY_SOURCE_OK"), "{res:?}");
}

/// A rank that sends its last message and destroys its communicator at once loses nothing:
/// the destroy waits until the NIC has delivered what it still holds. The stand-in holds each
/// write 300 ms here (a congested link), so the write is always outstanding at the destroy;
/// a destroy that did not wait would flush it unsent, and the receiver would be told that
/// the sender left while it waited.
#[test]
fn a_rank_that_destroys_its_communicator_right_after_sending_loses_nothing() {
    const ELEMS: usize = 4096;
    if let Some(w) = worker() {
        if w.rank == 0 {
            let v: Vec<f32> = (0..ELEMS).map(|i| i as f32).collect();
            w.comm.send(&v, 1).unwrap();
            let t = std::time::Instant::now();
            drop(w);
            println!("DESTROYED_IN_MS={}", t.elapsed().as_millis());
        } else {
            let mut v = vec![0f32; ELEMS];
            w.comm.recv(&mut v, 0).unwrap();
            let wrong = (0..ELEMS).filter(|&i| v[i] != i as f32).count();
            assert_eq!(wrong, 0, "{wrong} of {ELEMS} elements wrong");
            println!("RECEIVED");
        }
        return;
    }
    let name = "a_rank_that_destroys_its_communicator_right_after_sending_loses_nothing";
    if is_worker() || skip_on_real_devices(name, "slows the stand-in's NIC") {
        return;
    }
    let env = [VERBS, STANDIN, ("STRATA_IBV_STANDIN_FAULT", "slow:300")];
    let res = spawn(name, 2, 2, &env, Duration::from_secs(60));
    assert_all_ok(&res);
    assert!(res[1].1.contains("RECEIVED"), "{res:?}");
    // The destroy waited for the write the stand-in held back.
    let waited: u64 = res[0]
        .1
        .lines()
        .find_map(|l| l.split("DESTROYED_IN_MS=").nth(1))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("rank 0 says how long its destroy took: {res:?}"));
    assert!(waited >= 100, "the destroy took {waited} ms: {res:?}");
}

#[test]
fn forcing_verbs_without_a_device_fails_init_in_one_line() {
    if is_worker() {
        if let Err(e) = strata::Communicator::from_env() {
            println!("INIT_ERROR={e}");
        }
        return;
    }
    if skip_on_real_devices(
        "forcing_verbs_without_a_device_fails_init_in_one_line",
        "needs a machine without RDMA devices",
    ) {
        return;
    }
    // No stand-in on the library path: rdma-core (if installed) finds no device, or there is
    // no libibverbs at all; either way init says so.
    let (_, text) = run_alone(
        "forcing_verbs_without_a_device_fails_init_in_one_line",
        &[
            ("STRATA_TRANSPORT", "verbs"),
            ("RANK", "0"),
            ("WORLD_SIZE", "1"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", "29377"),
            ("STRATA_SOCKET_IFNAME", "=lo"),
        ],
    );
    let line = text
        .lines()
        .find(|l| l.starts_with("INIT_ERROR="))
        .unwrap_or_else(|| panic!("init should fail:\n{text}"));
    assert!(
        line.contains("STRATA_TRANSPORT=verbs but verbs:")
            && (line.contains("no RDMA devices") || line.contains("cannot load libibverbs.so.1")),
        "{line}"
    );
}

#[test]
fn a_dma_buf_registers_once_and_is_found_in_the_cache() {
    if is_worker() {
        use std::os::fd::AsRawFd;
        let cfg = strata::rdma::RdmaConfig::from_env().unwrap();
        // A memfd stands in for exported GPU memory.
        let f = std::fs::File::from(memfd().expect("memfd_create (the dma-buf stand-in) works"));
        f.set_len(1 << 20).unwrap();
        let iova = 0x7f00_0000_0000u64;
        let a = strata::rdma::DmabufRegion::register(&cfg, f.as_raw_fd(), 0, 1 << 20, iova)
            .unwrap_or_else(|e| panic!("{e}"));
        // A range inside the first is a cache hit: the same keys.
        let b = strata::rdma::DmabufRegion::register(&cfg, f.as_raw_fd(), 4096, 4096, iova + 4096)
            .unwrap();
        assert_eq!((a.rkey(), a.lkey()), (b.rkey(), b.lkey()));
        assert_ne!(a.rkey(), 0);
        println!("DMABUF_OK");
        return;
    }
    if skip_on_real_devices(
        "a_dma_buf_registers_once_and_is_found_in_the_cache",
        "registers a memfd, which only the stand-in takes as a dma-buf",
    ) {
        return;
    }
    let dir = ibverbs_standin_dir();
    let (ok, text) = run_alone(
        "a_dma_buf_registers_once_and_is_found_in_the_cache",
        &[("LD_LIBRARY_PATH", dir.to_str().unwrap())],
    );
    assert!(ok && text.contains("DMABUF_OK"), "{text}");
}

#[test]
fn gpu_memory_exported_as_a_dma_buf_registers_with_the_nic_and_is_dropped_when_freed() {
    if is_worker() {
        use std::os::fd::AsRawFd;
        use strata::gpu::{DeviceBuffer, Stream};
        let cfg = strata::rdma::RdmaConfig::from_env().unwrap();
        let len = 1 << 20;
        let buf = DeviceBuffer::alloc(0, len).unwrap();
        let stream = Stream::new(0).unwrap();
        let pattern: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
        buf.upload(&pattern, &stream).unwrap();
        let fd = buf.export_dmabuf().unwrap_or_else(|e| panic!("{e}"));
        // Offset 0 of the dma-buf is the buffer's first byte.
        // SAFETY: a read-only shared mapping of `len` bytes of the exported descriptor,
        // unmapped below.
        let seen = unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            );
            assert_ne!(p, libc::MAP_FAILED);
            let v = std::slice::from_raw_parts(p as *const u8, len).to_vec();
            libc::munmap(p, len);
            v
        };
        assert!(seen == pattern, "the dma-buf is not the buffer's memory");
        let iova = buf.ptr();
        let a = strata::rdma::DmabufRegion::register(&cfg, fd.as_raw_fd(), 0, len, iova)
            .unwrap_or_else(|e| panic!("{e}"));
        let again =
            strata::rdma::DmabufRegion::register(&cfg, fd.as_raw_fd(), 0, len, iova).unwrap();
        assert_eq!(
            again.rkey(),
            a.rkey(),
            "a second registration is a cache hit"
        );
        drop(again);
        // Freeing the device memory drops the cached registration (gpu::on_device_free), so
        // the same range registers anew, with a new key.
        drop(buf);
        let after =
            strata::rdma::DmabufRegion::register(&cfg, fd.as_raw_fd(), 0, len, iova).unwrap();
        assert_ne!(
            after.rkey(),
            a.rkey(),
            "a freed buffer's registration was reused"
        );
        println!("GPU_DMABUF_OK");
        return;
    }
    if skip_on_real_devices(
        "gpu_memory_exported_as_a_dma_buf_registers_with_the_nic_and_is_dropped_when_freed",
        "registers the CUDA stand-in's memory file, which only the verbs stand-in takes",
    ) {
        return;
    }
    let cuda = standin_dir("libstrata_cuda_standin.so", "libcuda.so.1", "cuda-standin");
    let path = std::env::join_paths([cuda, ibverbs_standin_dir()]).unwrap();
    let (ok, text) = run_alone(
        "gpu_memory_exported_as_a_dma_buf_registers_with_the_nic_and_is_dropped_when_freed",
        &[("LD_LIBRARY_PATH", path.to_str().unwrap())],
    );
    assert!(ok && text.contains("GPU_DMABUF_OK"), "{text}");
}

/// Runs test `name` of this binary as one worker process with `env` (and no inherited
/// `LD_LIBRARY_PATH` unless `env` sets one): its success and its stdout then stderr.
fn run_alone(name: &str, env: &[(&str, &str)]) -> (bool, String) {
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args([name, "--exact", "--nocapture"])
        .env(WORKER, "1")
        .env_remove("LD_LIBRARY_PATH");
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// An anonymous memory file.
fn memfd() -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: a plain syscall with a static name; the descriptor is owned below.
    let fd = unsafe { libc::memfd_create(c"strata-dmabuf".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nobody else owns.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}

// ---- libfabric's tcp provider across emulated hosts -------------------------------------

/// Four emulated hosts `st-o0` … `st-o3` (198.18.2.1-4/24) on one bridge in `st-osw`, for
/// libfabric's tcp provider; removed on drop.
/// The 4 hosts of the libfabric tests that share them (`st-o`), held by one test at a time:
/// two building the same namespaces at once fail, and one tearing them down would pull them
/// from under the other. The hosts go before the lock.
struct OfiHosts {
    _hosts: Hosts,
    _one_at_a_time: std::sync::MutexGuard<'static, ()>,
}

fn ofi_hosts() -> Result<OfiHosts, String> {
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let lock = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    Ok(OfiHosts {
        _hosts: ofi_hosts_at("st-o", "198.18.2.", HOSTS)?,
        _one_at_a_time: lock,
    })
}

/// `count` emulated hosts named from `prefix` in `subnet`, once libfabric's tcp provider is
/// known to be there; or why not.
fn ofi_hosts_at(prefix: &str, subnet: &str, count: usize) -> Result<Hosts, String> {
    if let Err(e) = strata::rdma::ofi::providers(Some("tcp")) {
        return Err(format!(
            "needs libfabric's tcp provider (Debian: libfabric1): {e}"
        ));
    }
    Hosts::build(prefix, subnet, count, |_| Vec::new())
}

const HOSTS: usize = 4;

const OFI_HOSTS: [(&str, &str); 3] = [
    ("STRATA_TRANSPORT", "ofi"),
    ("STRATA_OFI_PROVIDER", "tcp"),
    ("STRATA_TEST_NETNS", "st-o"),
];

#[test]
fn matrix_4_hosts_over_libfabric_tcp() {
    if let Some(w) = worker() {
        matrix(&w, true);
        let t = w.comm.transport_to((w.rank + 1) % w.n);
        assert_eq!(t, Some("ofi"), "rank {}", w.rank);
        receive_from_any_source(&w, "ofi");
        return;
    }
    if is_worker() {
        return;
    }
    let _hosts = match ofi_hosts() {
        Ok(h) => h,
        Err(why) => {
            skip("matrix_4_hosts_over_libfabric_tcp", &why);
            return;
        }
    };
    let res = spawn(
        "matrix_4_hosts_over_libfabric_tcp",
        HOSTS,
        HOSTS,
        &OFI_HOSTS,
        Duration::from_secs(500),
    );
    assert_all_ok(&res);
    assert!(res[0].1.contains("ANY_SOURCE_OK"), "{res:?}");
}

#[test]
fn a_peer_killed_mid_transfer_over_libfabric_is_named_on_every_survivor() {
    const VICTIM: usize = 2;
    if let Some(w) = worker() {
        if w.rank == VICTIM {
            std::thread::spawn(|| {
                std::thread::sleep(Duration::from_millis(700));
                println!("KILLED_AT_US={}", now_us());
                // SAFETY: killing this process, as a crash or the OOM killer would.
                unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
            });
        }
        fail_eventually(&w, 1 << 20);
    }
    if is_worker() {
        return;
    }
    let _hosts = match ofi_hosts() {
        Ok(h) => h,
        Err(why) => {
            skip(
                "a_peer_killed_mid_transfer_over_libfabric_is_named_on_every_survivor",
                &why,
            );
            return;
        }
    };
    let res = spawn(
        "a_peer_killed_mid_transfer_over_libfabric_is_named_on_every_survivor",
        HOSTS,
        HOSTS,
        &OFI_HOSTS,
        Duration::from_secs(60),
    );
    let field = |text: &str, key: &str| -> Option<u128> {
        let at = text.find(key)? + key.len();
        text[at..]
            .split(|c: char| !c.is_ascii_digit())
            .next()?
            .parse()
            .ok()
    };
    let killed = field(&res[VICTIM].1, "KILLED_AT_US=").expect("the victim says when it died");
    for (r, (_, out)) in res.iter().enumerate().filter(|(r, _)| *r != VICTIM) {
        let failed = field(out, "FAILED_AT_US=").unwrap_or_else(|| panic!("rank {r}:\n{out}"));
        let ms = (failed.saturating_sub(killed)) as f64 / 1000.0;
        println!("rank {r} named the dead rank {ms:.0} ms after the kill");
        assert!(
            out.contains(&format!("rank {VICTIM}")),
            "rank {r} names rank {VICTIM}:\n{out}"
        );
        assert!(ms < 10_000.0, "rank {r} took {ms} ms:\n{out}");
    }
}

/// Over libfabric's `tcp` provider, a rank that sends 4 MiB on a link shaped to 40 Mbit/s and
/// destroys its communicator at once loses nothing: its writes complete only once delivered
/// (`FI_DELIVERY_COMPLETE`), so the destroy waits for them. At libfabric's default (transmit
/// complete) the writes completed with most of the data still in the sender's socket, and
/// the receiver was told the sender left while it waited (3 of 3 runs).
#[test]
fn over_libfabric_a_rank_that_destroys_right_after_sending_on_a_slow_link_loses_nothing() {
    const BYTES: usize = 4 << 20;
    let name =
        "over_libfabric_a_rank_that_destroys_right_after_sending_on_a_slow_link_loses_nothing";
    if let Some(w) = worker() {
        let pattern = |i: usize| (i % 251) as u8;
        if w.rank == 0 {
            let v: Vec<u8> = (0..BYTES).map(pattern).collect();
            w.comm.send(&v, 1).unwrap();
            let t = std::time::Instant::now();
            drop(w);
            println!("DESTROYED_IN_MS={}", t.elapsed().as_millis());
        } else {
            let mut v = vec![0u8; BYTES];
            w.comm.recv(&mut v, 0).unwrap();
            let wrong = (0..BYTES).filter(|&i| v[i] != pattern(i)).count();
            assert_eq!(wrong, 0, "{wrong} of {BYTES} bytes wrong");
            println!("RECEIVED");
        }
        return;
    }
    if is_worker() {
        return;
    }
    let hosts = match ofi_hosts_at("st-d", "198.18.4.", 2) {
        Ok(h) => h,
        Err(why) => {
            skip(name, &why);
            return;
        }
    };
    assert!(hosts.shape(0, "40mbit", "64kb", "2s"), "tc tbf on host 0");
    let env = [
        ("STRATA_TRANSPORT", "ofi"),
        ("STRATA_OFI_PROVIDER", "tcp"),
        ("STRATA_TEST_NETNS", "st-d"),
        ("STRATA_TEST_SUBNET", "198.18.4."),
    ];
    let res = spawn(name, 2, 2, &env, Duration::from_secs(60));
    assert_all_ok(&res);
    assert!(res[1].1.contains("RECEIVED"), "{res:?}");
}
