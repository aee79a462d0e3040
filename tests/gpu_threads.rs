//! Ranks that share one GPU as threads of one process, through the Rust API, on the CUDA
//! driver stand-in (one device): every collective × type × operator, in and out of place, as
//! low-latency kernels and as stream programs, peers reaching each other's buffers directly
//! (a process cannot open its own CUDA IPC handles); and what a call costs the GPU's front
//! end, counted by the stand-in: launches and stream memory operations. Ordering and data,
//! never GPU speed (`scripts/gpu-lent-check.sh` runs the same on a lent GPU).

mod common;

use std::time::Duration;
use strata::gpu::{self, DeviceBuffer, Stream};
use strata::{CallSpec, Collective, Communicator, DataType, UniqueId, check};

use common::gpu::{assert_all_ok, for_each_matrix_call, note, spawn};

/// In the parent: true (having said so) when `STRATA_NVRTC_DIR` is not set; the stream
/// programs and kernels these tests run are compiled at bind with NVRTC.
fn without_nvrtc(test: &str) -> bool {
    std::env::var_os(common::WORKER).is_none() && common::nvrtc_dir(test).is_none()
}

/// In the child process: `n` communicators as threads, each bound to GPU 0, each running
/// `body(comm)`; the failures of every rank.
fn threads(n: usize, body: impl Fn(&Communicator) -> Vec<String> + Sync) -> Vec<String> {
    let id = UniqueId::new().unwrap();
    std::thread::scope(|s| {
        let ranks: Vec<_> = (0..n)
            .map(|r| {
                let body = &body;
                s.spawn(move || {
                    let comm = Communicator::init(&id, n, r).unwrap();
                    comm.bind_device(0).unwrap();
                    let mut out = body(&comm);
                    comm.wait_device_idle(Duration::from_secs(30)).unwrap();
                    if let Some(e) = comm.async_error() {
                        out.push(format!("rank {r}: {e}"));
                    }
                    out
                })
            })
            .collect();
        ranks.into_iter().flat_map(|h| h.join().unwrap()).collect()
    })
}

/// Every collective × type × operator in and out of place at `counts`, in buffers allocated
/// once (a rank of a shared process must not allocate while peers' calls are in flight).
fn matrix(comm: &Communicator, counts: &[usize]) -> Vec<String> {
    let (rank, n) = (comm.rank(), comm.size());
    let stream = Stream::new(0).unwrap();
    let biggest = counts.iter().max().unwrap() * 8 * n;
    let send = DeviceBuffer::alloc(0, biggest).unwrap();
    let recv = DeviceBuffer::alloc(0, biggest).unwrap();
    comm.barrier().unwrap(); // nobody's calls start before everyone has allocated
    let mut failures = Vec::new();
    for_each_matrix_call(n, counts, |spec, in_place, what| {
        let what = format!(
            "rank {rank}: {what} ({})",
            comm.device_kernel_for(&spec).unwrap_or("stream program")
        );
        let checked = check::run_and_check_device_in(comm, spec, in_place, &stream, &send, &recv);
        note(&mut failures, what, checked);
    });
    stream.synchronize().unwrap();
    comm.barrier().unwrap(); // nobody frees before everyone is done
    failures
}

#[test]
fn ranks_as_threads_sharing_one_gpu_run_every_collective_type_and_operator() {
    if without_nvrtc("ranks_as_threads_sharing_one_gpu_run_every_collective_type_and_operator") {
        return;
    }
    if std::env::var_os(common::WORKER).is_some() {
        let n: usize = std::env::var("STRATA_TEST_THREADS")
            .unwrap()
            .parse()
            .unwrap();
        let kernels = std::env::var("STRATA_GPU_KERNEL").unwrap() == "on";
        // Kernels: small and medium (4,099 f32 run two-shot); then 70,000 elements, beyond
        // the 256 KiB areas for the wider types, which fall back to stream programs in the
        // same run, calls of both kinds following each other.
        let counts: &[usize] = if kernels {
            &[1, 4099, 70_000]
        } else {
            &[1, 4099]
        };
        let failures = threads(n, |comm| {
            let mut f = Vec::new();
            if !comm.uses_gpu_ipc() {
                f.push(format!("rank {}: not on stream programs", comm.rank()));
            }
            let small = CallSpec::new(Collective::AllReduce, DataType::Float32, 2);
            if comm.device_kernel_for(&small).is_some() != kernels {
                f.push(format!(
                    "rank {}: 8 B all-reduce on {:?} with STRATA_GPU_KERNEL={}",
                    comm.rank(),
                    comm.device_kernel_for(&small),
                    if kernels { "on" } else { "off" }
                ));
            }
            f.extend(matrix(comm, counts));
            f
        });
        assert!(
            failures.is_empty(),
            "{} failures:\n{}",
            failures.len(),
            failures[..failures.len().min(30)].join("\n")
        );
        return;
    }
    let name = "ranks_as_threads_sharing_one_gpu_run_every_collective_type_and_operator";
    for n in ["2", "3", "4"] {
        for kernel in ["on", "off"] {
            let env = [
                ("STRATA_STANDIN_GPUS", "1"),
                ("STRATA_TEST_THREADS", n),
                ("STRATA_GPU_KERNEL", kernel),
                ("STRATA_GPU_PATH", "stream"),
                ("STRATA_GPU_CHUNK", "64K"),
            ];
            assert_all_ok(&spawn(name, 1, &env, Duration::from_secs(300)));
        }
    }
}

/// Per call and rank, what a run of `calls` calls of `spec` cost the GPU's front end.
fn footprint(comm: &Communicator, spec: CallSpec, calls: usize) -> (f64, f64) {
    let stream = Stream::new(0).unwrap();
    let bytes = spec.count * spec.dtype.size();
    let buf = DeviceBuffer::alloc(0, bytes).unwrap();
    buf.upload(&vec![0u8; bytes], &stream).unwrap();
    comm.barrier().unwrap(); // every rank allocated before any call waits on it
    comm.call_device(spec, None, &buf, &stream).unwrap(); // programs compiled, caches warm
    stream.synchronize().unwrap();
    comm.barrier().unwrap();
    let before = gpu::standin_stats().unwrap();
    comm.barrier().unwrap();
    for _ in 0..calls {
        comm.call_device(spec, None, &buf, &stream).unwrap();
    }
    stream.synchronize().unwrap();
    comm.barrier().unwrap();
    let d = gpu::standin_stats().unwrap().since(&before);
    comm.barrier().unwrap();
    // The counters are the process's: every rank's calls are in them.
    let per = (calls * comm.size()) as f64;
    (d.launches as f64 / per, d.memory_ops as f64 / per)
}

#[test]
fn an_8_byte_all_reduce_at_4_ranks_costs_one_launch_and_at_most_two_memory_operations() {
    if without_nvrtc(
        "an_8_byte_all_reduce_at_4_ranks_costs_one_launch_and_at_most_two_memory_operations",
    ) {
        return;
    }
    if std::env::var_os(common::WORKER).is_some() {
        let spec = CallSpec::new(Collective::AllReduce, DataType::Float32, 2);
        let out = threads(4, |comm| {
            let (launches, memops) = footprint(comm, spec, 20);
            let mut f = Vec::new();
            if comm.device_kernel_for(&spec) != Some("ll_one_shot") {
                f.push(format!("ran as {:?}", comm.device_kernel_for(&spec)));
            }
            // explain says where the kernels stop and what this call runs as.
            let text = comm.explain(Collective::AllReduce, 8).render();
            for want in [
                "device buffers: one low-latency kernel per call whenever the call fits",
                "STRATA_GPU_KERNEL=on",
                "on device buffers this call runs as one kernel: ll_one_shot",
            ] {
                if !text.contains(want) {
                    f.push(format!("explain lacks '{want}':\n{text}"));
                }
            }
            if launches > 1.0 || memops > 2.0 {
                f.push(format!(
                    "rank {}: {launches:.2} launches and {memops:.2} memory operations per call",
                    comm.rank()
                ));
            }
            if comm.rank() == 0 {
                println!(
                    "8 B all-reduce, 4 ranks: {launches:.2} launches, {memops:.2} memory operations per call (stand-in)"
                );
            }
            f
        });
        assert!(out.is_empty(), "{}", out.join("\n"));
        return;
    }
    let name = "an_8_byte_all_reduce_at_4_ranks_costs_one_launch_and_at_most_two_memory_operations";
    let env = [("STRATA_STANDIN_GPUS", "1"), ("STRATA_GPU_KERNEL", "on")];
    assert_all_ok(&spawn(name, 1, &env, Duration::from_secs(120)));
}

/// A stream program's waits and writes between two data operations of a lane go to the GPU as
/// one batch (a piece's credit or *filled* write with the next piece's wait, the call's header
/// with the first waits): a 64 KiB ring all-reduce at 4 ranks in 4 KiB pieces enqueues under
/// 65% of the memory operations it enqueues one by one (`STRATA_GPU_MEMOP_BATCH=0`; 2 per
/// piece then, about 1 in batches), and its results stay right.
#[test]
fn a_stream_program_enqueues_each_synchronisation_as_one_batch() {
    if without_nvrtc("a_stream_program_enqueues_each_synchronisation_as_one_batch") {
        return;
    }
    if std::env::var_os(common::WORKER).is_some() {
        let spec = CallSpec::new(Collective::AllReduce, DataType::Float32, 16 << 10);
        let out = threads(4, |comm| {
            comm.set_algorithm(Collective::AllReduce, Some(strata::Algorithm::Ring))
                .unwrap();
            let (_, memops) = footprint(comm, spec, 5);
            if comm.rank() == 0 {
                println!("MEMOPS {memops:.2}");
            }
            let stream = Stream::new(0).unwrap();
            let (send, recv) = (
                DeviceBuffer::alloc(0, 1 << 20).unwrap(),
                DeviceBuffer::alloc(0, 1 << 20).unwrap(),
            );
            comm.barrier().unwrap();
            let c = check::run_and_check_device_in(comm, spec, false, &stream, &send, &recv);
            stream.synchronize().unwrap();
            comm.barrier().unwrap();
            match c {
                Ok(c) if c.first.is_none() => vec![],
                other => vec![format!("rank {}: {other:?}", comm.rank())],
            }
        });
        assert!(out.is_empty(), "{}", out.join("\n"));
        return;
    }
    let name = "a_stream_program_enqueues_each_synchronisation_as_one_batch";
    let mut per_call = Vec::new();
    for batch in ["1", "0"] {
        let env = [
            ("STRATA_STANDIN_GPUS", "1"),
            ("STRATA_GPU_KERNEL", "off"),
            ("STRATA_GPU_CHUNK", "4K"),
            ("STRATA_GPU_MEMOP_BATCH", batch),
        ];
        let out = spawn(name, 1, &env, Duration::from_secs(120));
        assert_all_ok(&out);
        let memops: f64 = out[0]
            .1
            .lines()
            .find_map(|l| l.split("MEMOPS ").nth(1))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("the child printed no count:\n{}", out[0].1));
        per_call.push(memops);
    }
    let (batched, single) = (per_call[0], per_call[1]);
    println!(
        "64 KiB ring all-reduce, 4 ranks: {batched:.1} memory operations per call in batches, {single:.1} one by one (stand-in)"
    );
    assert!(
        batched < 0.65 * single,
        "batched {batched:.1}, one by one {single:.1}"
    );
}

/// Every algorithm of every collective as a stream program with ranks as threads on one GPU
/// (three type and operator pairs, in and out of place, one piece and several; set
/// algorithms never run as kernels).
#[test]
fn every_algorithm_as_a_stream_program_with_ranks_as_threads_on_one_gpu() {
    if without_nvrtc("every_algorithm_as_a_stream_program_with_ranks_as_threads_on_one_gpu") {
        return;
    }
    if std::env::var_os(common::WORKER).is_some() {
        let failures = threads(3, |comm| {
            let stream = Stream::new(0).unwrap();
            let send = DeviceBuffer::alloc(0, 8 << 20).unwrap();
            let recv = DeviceBuffer::alloc(0, 8 << 20).unwrap();
            comm.barrier().unwrap();
            let mut failures = Vec::new();
            for collective in Collective::WITH_BUFFERS {
                common::gpu::for_each_algorithm_call(
                    comm,
                    comm.size(),
                    collective,
                    false,
                    70_001,
                    |spec, in_place, what| {
                        if comm.device_kernel_for(&spec).is_some() {
                            failures.push(format!("{what}: ran as a kernel"));
                        }
                        let checked = check::run_and_check_device_in(
                            comm, spec, in_place, &stream, &send, &recv,
                        );
                        note(&mut failures, what, checked);
                    },
                );
            }
            stream.synchronize().unwrap();
            comm.barrier().unwrap();
            failures
        });
        assert!(failures.is_empty(), "{}", failures.join("\n"));
        return;
    }
    let name = "every_algorithm_as_a_stream_program_with_ranks_as_threads_on_one_gpu";
    let env = [
        ("STRATA_STANDIN_GPUS", "1"),
        ("STRATA_GPU_KERNEL", "on"),
        ("STRATA_GPU_PATH", "stream"),
        ("STRATA_GPU_CHUNK", "64K"),
    ];
    assert_all_ok(&spawn(name, 1, &env, Duration::from_secs(300)));
}
