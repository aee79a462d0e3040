//! Device buffers between hosts: two emulated hosts (network namespaces) of two ranks each,
//! the CUDA driver stand-in as every rank's GPU and the libibverbs stand-in (RoCE, one
//! address per rank's NIC) as its NIC. Ranks of one host meet through CUDA IPC, ranks of
//! different hosts through GPUDirect RDMA: the NIC reads the sender's GPU memory and writes
//! the receiver's, registered through dma-bufs. What these tests prove is the protocol, the
//! data and what crosses host memory, never GPU or NIC speed.

mod common;

use common::gpu::{algorithm_pairs, for_each_algorithm_call};
use common::netns::Hosts;
use common::{assert_all_ok, is_worker, spawn, worker};
use std::time::{Duration, Instant};
use strata::gpu::{DeviceBuffer, Stream};
use strata::{CallSpec, Collective, Communicator, DataType, DeviceTransfer, check};

const HOSTS: usize = 2;
const PER_HOST: usize = 2;
const SUBNET: &str = "198.18.6.";

/// The ranks' library path: both stand-ins, then NVRTC; `None` (having said so) without NVRTC.
fn library_path(name: &str) -> Option<String> {
    let nvrtc = common::nvrtc_dir(name)?.into_string().ok()?;
    let cuda = common::standin_dir("libstrata_cuda_standin.so", "libcuda.so.1", "cuda-standin");
    let verbs = common::ibverbs_standin_dir();
    Some(format!("{}:{}:{nvrtc}", cuda.display(), verbs.display()))
}

/// Runs test `name` on 2 × 2 ranks with `extra` settings; `None` (having said why) when
/// this machine cannot.
fn run_on_hosts(name: &str, extra: &[(&str, &str)]) -> Option<Vec<(bool, String)>> {
    // One test at a time: they build the same namespaces.
    static HOSTS_IN_USE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = HOSTS_IN_USE.lock().unwrap_or_else(|e| e.into_inner());
    if std::env::var_os("STRATA_GPU_TESTS_REAL").is_some() {
        println!("SKIPPED {name}: it needs the stand-ins' NIC between namespaces, not one GPU");
        return None;
    }
    let path = library_path(name)?;
    let nics = |h: usize| -> Vec<String> {
        (0..PER_HOST)
            .map(|l| format!("{SUBNET}{}/24", 101 + h * PER_HOST + l))
            .collect()
    };
    let _hosts = match Hosts::build("st-g", SUBNET, HOSTS, nics) {
        Ok(h) => h,
        Err(why) => {
            common::skip(name, &why);
            return None;
        }
    };
    let mut env: Vec<(&str, &str)> = vec![
        ("STRATA_TEST_NETNS", "st-g"),
        ("STRATA_TEST_SUBNET", SUBNET),
        ("STRATA_TEST_RANKS_PER_HOST", "2"),
        ("STRATA_TEST_NIC_SUBNET", SUBNET),
        ("STRATA_TRANSPORT", "verbs"),
        ("STRATA_IBV_STANDIN_LINK", "roce"),
        ("STRATA_STANDIN_GPUS", "2"),
        ("STRATA_GPU_CHUNK", "64K"),
        ("LD_LIBRARY_PATH", &path),
    ];
    env.extend_from_slice(extra);
    Some(spawn(
        name,
        HOSTS * PER_HOST,
        HOSTS * PER_HOST,
        &env,
        Duration::from_secs(400),
    ))
}

/// This rank's GPU: its local rank (one process per GPU).
fn local_device() -> i32 {
    std::env::var("LOCAL_RANK")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Checks every peer's path: `ipc` on this host, `want_remote` on the other.
fn assert_paths(comm: &Communicator, rank: usize, n: usize, want_remote: &str) {
    for q in (0..n).filter(|&q| q != rank) {
        let want = if q / PER_HOST == rank / PER_HOST && want_remote != "staged" {
            "ipc"
        } else {
            want_remote
        };
        assert_eq!(comm.device_path_to(q), Some(want), "rank {rank} to {q}");
    }
}

/// Every algorithm of every collective with [`algorithm_pairs`], in and out of place, at one
/// piece and several; then (unless the full matrix ran already) every collective × type ×
/// operator under the tuner's choice. Returns how many calls ran.
fn device_matrix(comm: &Communicator, rank: usize, n: usize) -> usize {
    let full = common::gpu::full_matrix();
    let device = local_device();
    let stream = Stream::new(device).unwrap();
    let mut failures = Vec::new();
    let mut ran = 0;
    let mut one = |spec: CallSpec, in_place: bool, what: String| {
        match check::run_and_check_device(comm, spec, in_place, &stream, device) {
            Ok(c) if c.first.is_none() => {}
            Ok(c) => failures.push(format!("{what}: {:?}", c.first)),
            Err(e) => failures.push(format!("{what}: {e}")),
        }
        ran += 1;
    };
    for collective in Collective::WITH_BUFFERS {
        for_each_algorithm_call(comm, n, collective, full, 20_001, &mut one);
        if full {
            continue;
        }
        for (dtype, op) in algorithm_pairs(collective, true) {
            for in_place in [false, true] {
                let spec = CallSpec {
                    op,
                    root: n - 1,
                    ..CallSpec::new(collective, dtype, 1031)
                };
                let what = format!("{collective} {dtype} {op} in_place {in_place}");
                one(spec, in_place, what);
            }
        }
    }
    assert!(failures.is_empty(), "rank {rank}: {}", failures.join("\n"));
    ran
}

/// A ring of sends and receives on device memory in one batch: each rank sends to the next
/// and receives from the previous, crossing hosts at two of the four links.
fn device_ring(comm: &Communicator, rank: usize, n: usize) {
    let device = local_device();
    let stream = Stream::new(device).unwrap();
    let len = 300_001usize;
    let send = DeviceBuffer::alloc(device, len).unwrap();
    let recv = DeviceBuffer::alloc(device, len).unwrap();
    let mine: Vec<u8> = (0..len).map(|i| (i * 7 + rank * 13) as u8).collect();
    send.upload(&mine, &stream).unwrap();
    let (next, prev) = ((rank + 1) % n, (rank + n - 1) % n);
    comm.enqueue_transfers(
        &[
            DeviceTransfer {
                peer: next,
                ptr: send.ptr(),
                bytes: len,
                send: true,
            },
            DeviceTransfer {
                peer: prev,
                ptr: recv.ptr(),
                bytes: len,
                send: false,
            },
        ],
        &stream,
    )
    .unwrap();
    let mut got = vec![0u8; len];
    recv.download(&mut got, &stream).unwrap();
    let want: Vec<u8> = (0..len).map(|i| (i * 7 + prev * 13) as u8).collect();
    assert!(got == want, "rank {rank}: wrong bytes from rank {prev}");
}

/// The flight recorder names the algorithm each device call ran, and stamps its end once the
/// stream has passed it.
fn device_calls_are_in_the_flight_recorder(comm: &Communicator, rank: usize, n: usize) {
    let device = local_device();
    let stream = Stream::new(device).unwrap();
    let buf = DeviceBuffer::alloc(device, 4 * 4096).unwrap();
    let spec = CallSpec::new(Collective::AllReduce, DataType::Float32, 4096);
    let algorithms: Vec<_> = strata::algorithms::algorithms_for(Collective::AllReduce)
        .iter()
        .copied()
        .filter(|a| a.check_ranks(n).is_ok())
        .collect();
    for &a in &algorithms {
        comm.set_algorithm(Collective::AllReduce, Some(a)).unwrap();
        comm.call_device(spec, None, &buf, &stream).unwrap();
    }
    comm.set_algorithm(Collective::AllReduce, None).unwrap();
    stream.synchronize().unwrap();
    let t = Instant::now();
    let records = loop {
        let r = comm.flight_records();
        let device: Vec<_> = r
            .into_iter()
            .filter(|r| r.op.ends_with(" on device buffers"))
            .collect();
        let tail = device.len().saturating_sub(algorithms.len());
        if device[tail..].iter().all(|r| r.end_us.is_some()) || t.elapsed().as_secs() > 5 {
            break device[tail..].to_vec();
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(records.len(), algorithms.len(), "rank {rank}: {records:?}");
    for (r, a) in records.iter().zip(&algorithms) {
        assert!(
            r.op.starts_with("all_reduce #") && r.op.contains(&format!("; {a}) on device")),
            "rank {rank}: {a} recorded as {}",
            r.op
        );
        assert!(
            r.end_us.is_some() && r.error.is_none(),
            "rank {rank}: {r:?}"
        );
    }
}

#[test]
fn every_collective_algorithm_type_and_operator_on_2_hosts_of_2_gpus_over_ipc_and_gpudirect() {
    if let Some(w) = worker() {
        w.comm.bind_device(local_device()).unwrap();
        assert_paths(&w.comm, w.rank, w.n, "gdr");
        let ran = device_matrix(&w.comm, w.rank, w.n);
        device_ring(&w.comm, w.rank, w.n);
        device_calls_are_in_the_flight_recorder(&w.comm, w.rank, w.n);
        w.comm.wait_device_idle(Duration::from_secs(30)).unwrap();
        println!("MATRIX {ran}");
        return;
    }
    if is_worker() {
        return;
    }
    let name =
        "every_collective_algorithm_type_and_operator_on_2_hosts_of_2_gpus_over_ipc_and_gpudirect";
    let full = std::env::var("STRATA_GPU_FULL_MATRIX").unwrap_or_default();
    let env = [
        ("STRATA_GPU_PATH", "stream"),
        ("STRATA_GPU_FULL_MATRIX", &full),
    ];
    let Some(ranks) = run_on_hosts(name, &env) else {
        return;
    };
    assert_all_ok(&ranks);
    assert!(
        ranks.iter().all(|(_, out)| out.contains("MATRIX")),
        "{ranks:?}"
    );
    for line in ranks[0].1.lines().filter(|l| l.contains("MATRIX")) {
        println!("rank 0: {line}");
    }
    // Ranks that finish and drop the communicator one after another raise no error.
    for (r, (_, out)) in ranks.iter().enumerate() {
        assert!(
            !out.contains("ERROR") && !out.contains("WARN"),
            "rank {r} logged a fault in a healthy run:\n{out}"
        );
    }
}

#[test]
fn a_64_mib_all_reduce_across_hosts_moves_nothing_through_host_memory() {
    if let Some(w) = worker() {
        w.comm.bind_device(local_device()).unwrap();
        assert_paths(&w.comm, w.rank, w.n, "gdr");
        let gdr_read = std::env::var("NCCL_NET_GDR_READ").map_or(true, |v| v != "0");
        let during = common::polled_64_mib_all_reduce(&w.comm, w.rank, w.n, local_device());
        if gdr_read {
            assert_eq!(during.host_bytes(), 0, "{during:?}");
            assert_eq!(during.host_waits, 0, "{during:?}");
            assert_eq!(during.host_functions, 0, "{during:?}");
        } else {
            // The NIC may not read GPU memory: pieces for the other host go through a host
            // outbox, and only those.
            assert!(during.host_bytes() > 0, "{during:?}");
            assert!(during.host_bytes() <= 64 << 20, "{during:?}");
        }
        println!("MOVED {during:?}");
        return;
    }
    if is_worker() {
        return;
    }
    let name = "a_64_mib_all_reduce_across_hosts_moves_nothing_through_host_memory";
    let configs: [&[(&str, &str)]; 3] = [
        &[("NCCL_NET_GDR_READ", "1")],
        &[("NCCL_NET_GDR_READ", "0")],
        // GPU memory registered by its device address, as with nvidia-peermem loaded.
        &[
            ("STRATA_GDR_REGISTRATION", "peermem"),
            ("STRATA_IBV_STANDIN_PEERMEM", "1"),
        ],
    ];
    for extra in configs {
        // The hierarchical all-reduce, as the tuner chose with its default figures. Priced
        // with a host's measured figures it may choose the flat ring or the tree, which on
        // these stand-ins move some bytes device to host with GPUDirect read as well (32-96
        // MiB per rank): not what this test is about.
        let extra = [extra, &[("STRATA_ALGO", "allreduce:hier_ring")]].concat();
        let Some(ranks) = run_on_hosts(name, &extra) else {
            return;
        };
        assert_all_ok(&ranks);
        assert!(
            ranks.iter().all(|(_, out)| out.contains("MOVED")),
            "{extra:?}: {ranks:?}"
        );
        for line in ranks[0].1.lines().filter(|l| l.contains("MOVED")) {
            println!("{extra:?} rank 0: {line}");
        }
    }
}

#[test]
fn gdr_level_loc_stages_through_host_memory_and_stays_right() {
    if let Some(w) = worker() {
        w.comm.bind_device(local_device()).unwrap();
        assert_paths(&w.comm, w.rank, w.n, "staged");
        let device = local_device();
        let stream = Stream::new(device).unwrap();
        for collective in [Collective::AllReduce, Collective::AllGather] {
            let spec = CallSpec::new(collective, DataType::Float32, 5000);
            let c = check::run_and_check_device(&w.comm, spec, false, &stream, device).unwrap();
            assert!(c.first.is_none(), "{collective}: {:?}", c.first);
        }
        println!("STAGED");
        return;
    }
    if is_worker() {
        return;
    }
    let name = "gdr_level_loc_stages_through_host_memory_and_stays_right";
    let Some(ranks) = run_on_hosts(name, &[("NCCL_NET_GDR_LEVEL", "LOC")]) else {
        return;
    };
    assert_all_ok(&ranks);
    assert!(
        ranks.iter().all(|(_, out)| out.contains("STAGED")),
        "{ranks:?}"
    );
}

#[test]
fn a_rank_killed_on_the_other_host_is_named_and_every_stream_is_released() {
    const VICTIM: usize = 3;
    if let Some(w) = worker() {
        let device = local_device();
        w.comm.bind_device(device).unwrap();
        let stream = Stream::new(device).unwrap();
        let buf = DeviceBuffer::alloc(device, 1 << 20).unwrap();
        let spec = CallSpec::new(Collective::AllReduce, DataType::Float32, 1 << 18);
        w.comm.call_device(spec, None, &buf, &stream).unwrap();
        stream.synchronize().unwrap();
        if w.rank == VICTIM {
            // SAFETY: ends the process at once, as a crash would.
            unsafe { libc::_exit(0) };
        }
        let t = Instant::now();
        for _ in 0..4 {
            let _ = w.comm.call_device(spec, None, &buf, &stream);
        }
        stream.synchronize().unwrap();
        let e = w
            .comm
            .async_error()
            .expect("an async error after the peer died");
        assert!(
            t.elapsed() < Duration::from_secs(15),
            "took {:?}",
            t.elapsed()
        );
        assert!(e.to_string().contains("rank 3"), "rank {}: {e}", w.rank);
        println!("NAMED after {:?}: {e}", t.elapsed());
        return;
    }
    if is_worker() {
        return;
    }
    let name = "a_rank_killed_on_the_other_host_is_named_and_every_stream_is_released";
    let Some(ranks) = run_on_hosts(name, &[("STRATA_TIMEOUT", "5")]) else {
        return;
    };
    for (r, (ok, out)) in ranks.iter().enumerate().filter(|(r, _)| *r != VICTIM) {
        assert!(ok, "rank {r}: {out}");
        assert!(out.contains("NAMED"), "rank {r}: {out}");
    }
}

/// The ranks a timeout report names as on another host (`rank 2 is on another host` or
/// `ranks 2-3 are on another host`), empty where it names none.
fn ranks_on_another_host(line: &str) -> Vec<usize> {
    let Some(before) = line
        .split(" on another host")
        .next()
        .filter(|b| b.len() < line.len())
    else {
        return Vec::new();
    };
    let list = before.rsplit("; ").next().unwrap_or("");
    let list = list
        .trim_start_matches("ranks ")
        .trim_start_matches("rank ")
        .trim_end_matches(" are")
        .trim_end_matches(" is");
    let mut ranks = Vec::new();
    for part in list.split(',') {
        let mut ends = part.splitn(2, '-').map(|x| x.trim().parse::<usize>());
        match (ends.next(), ends.next()) {
            (Some(Ok(a)), None) => ranks.push(a),
            (Some(Ok(a)), Some(Ok(b))) if a <= b => ranks.extend(a..=b),
            _ => return Vec::new(),
        }
    }
    ranks
}

#[test]
fn a_timeout_across_hosts_names_the_rank_that_never_called_or_the_host_to_ask() {
    const ABSENT: usize = 3;
    if let Some(w) = worker() {
        let device = local_device();
        w.comm.bind_device(device).unwrap();
        let stream = Stream::new(device).unwrap();
        let buf = DeviceBuffer::alloc(device, 1 << 16).unwrap();
        let spec = CallSpec::new(Collective::AllReduce, DataType::Float32, 1 << 14);
        if w.rank != ABSENT {
            w.comm.call_device(spec, None, &buf, &stream).unwrap();
            stream.synchronize().unwrap();
            let e = w.comm.async_error().expect("a timeout");
            println!("TIMED_OUT {e}");
        } else {
            std::thread::sleep(Duration::from_secs(8));
        }
        return;
    }
    if is_worker() {
        return;
    }
    let name = "a_timeout_across_hosts_names_the_rank_that_never_called_or_the_host_to_ask";
    let env = [("STRATA_TIMEOUT", "2"), ("STRATA_GPU_PATH", "stream")];
    let Some(ranks) = run_on_hosts(name, &env) else {
        return;
    };
    assert_all_ok(&ranks);
    for (r, (_, out)) in ranks.iter().enumerate().filter(|(r, _)| *r != ABSENT) {
        let line = out
            .lines()
            .find(|l| l.contains("TIMED_OUT"))
            .unwrap_or_else(|| panic!("rank {r}: {out}"));
        println!("rank {r}: {line}");
        // The first report reaches every rank. Made on host 1, it names rank 3 as waiting
        // on no one (its flag area is readable there); made on host 0, it names the ranks of
        // host 1 that the reporting rank waits on as on another host: which ones depends on
        // the algorithm (rd: rank 0 waits on rank 2, rank 1 on rank 3), but only host 1's.
        let elsewhere = ranks_on_another_host(line);
        assert!(
            line.contains("rank 3 waits on no one")
                || (!elsewhere.is_empty() && elsewhere.iter().all(|&q| q == 2 || q == 3)),
            "rank {r}: {line}"
        );
        assert!(
            !line.contains("rank 0 waits on ranks 1-2; rank 1 waits on ranks 0,3; rank 0"),
            "a rank repeated in the chain: {line}"
        );
    }
}

#[test]
fn gpu_memory_the_nic_cannot_register_is_refused_at_bind_with_the_reason() {
    if let Some(w) = worker() {
        let e = w
            .comm
            .bind_device(local_device())
            .expect_err("bound without a way to register GPU memory");
        let text = e.to_string();
        assert!(
            text.contains("ibv_reg_mr, nvidia-peermem") && text.contains("Bad address"),
            "rank {}: {text}",
            w.rank
        );
        println!("REFUSED {text}");
        return;
    }
    if is_worker() {
        return;
    }
    let name = "gpu_memory_the_nic_cannot_register_is_refused_at_bind_with_the_reason";
    // ibv_reg_mr on a device address without nvidia-peermem: the stand-in refuses it (EFAULT)
    // as the kernel does.
    let env = [
        ("STRATA_GPU_PATH", "stream"),
        ("STRATA_GDR_REGISTRATION", "peermem"),
    ];
    let Some(ranks) = run_on_hosts(name, &env) else {
        return;
    };
    assert_all_ok(&ranks);
    assert!(
        ranks.iter().all(|(_, out)| out.contains("REFUSED")),
        "{ranks:?}"
    );
}

#[test]
fn split_communicators_each_get_their_own_gpudirect_path() {
    if let Some(w) = worker() {
        let device = local_device();
        // Ranks 0,2 and 1,3: each pair spans the two hosts; the world binds too.
        let sub = w
            .comm
            .split(Some((w.rank % 2) as u32), w.rank as i32)
            .unwrap()
            .expect("a member of a color");
        w.comm.bind_device(device).unwrap();
        sub.bind_device(device).unwrap();
        assert_eq!(sub.device_path_to(1 - sub.rank()), Some("gdr"));
        let stream = Stream::new(device).unwrap();
        for (comm, what) in [(&sub, "pair"), (&w.comm, "world"), (&sub, "pair again")] {
            let spec = CallSpec::new(Collective::AllReduce, DataType::Float32, 30_001);
            let c = check::run_and_check_device(comm, spec, false, &stream, device).unwrap();
            assert!(c.first.is_none(), "rank {} {what}: {:?}", w.rank, c.first);
        }
        drop(sub);
        println!("SPLIT");
        return;
    }
    if is_worker() {
        return;
    }
    let name = "split_communicators_each_get_their_own_gpudirect_path";
    let Some(ranks) = run_on_hosts(name, &[("STRATA_GPU_PATH", "stream")]) else {
        return;
    };
    assert_all_ok(&ranks);
    assert!(
        ranks.iter().all(|(_, out)| out.contains("SPLIT")),
        "{ranks:?}"
    );
    for (r, (_, out)) in ranks.iter().enumerate() {
        assert!(
            !out.contains("ERROR") && !out.contains("WARN"),
            "rank {r} logged a fault in a healthy run:\n{out}"
        );
    }
}
