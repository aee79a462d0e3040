//! The GPU path against the CUDA driver stand-in (`tests/standins/cuda`, built as
//! `libcuda.so.1` and loaded through the same cudarc path as the real driver). What these tests
//! prove is ordering and data, never GPU speed; `scripts/gpu-check.sh` runs the GPU tests on a
//! real GPU.
//!
//! Every collective × type × operator, in and out of place, on device buffers at 2, 3 and 4
//! processes, host-staged and as stream programs; that a call returns before its stream has
//! run it and that later work on the stream sees its result; what crosses host memory; a
//! one-rank communicator. Failures are in `tests/gpu_faults.rs`. Each test re-runs this binary
//! as its ranks, with the stand-in first on `LD_LIBRARY_PATH` (`tests/common/gpu.rs`).

mod common;

use std::time::{Duration, Instant};
use strata::gpu::{self, DeviceBuffer, Stream, sys};
use strata::{CallSpec, Collective, Communicator, DataType, ReduceOp, check};

use common::gpu::{
    Gate, assert_all_ok, device_of, f32s, for_each_algorithm_call, for_each_matrix_call,
    full_matrix, note, spawn, worker,
};

#[test]
fn every_collective_type_and_operator_host_staged_on_device_buffers_at_2_3_and_4_processes() {
    if let Some((comm, rank, n)) = worker() {
        device_matrix(&comm, rank, n);
        assert!(
            !comm.uses_gpu_ipc(),
            "STRATA_GPU_PATH=staged went through IPC"
        );
        return;
    }
    for n in [2, 3, 4] {
        let name = "every_collective_type_and_operator_host_staged_on_device_buffers_at_2_3_and_4_processes";
        let env = [("STRATA_GPU_CHUNK", "64K"), ("STRATA_GPU_PATH", "staged")];
        assert_all_ok(&spawn(name, n, &env, Duration::from_secs(300)));
    }
}

/// Every collective × type × operator, in and out of place, on device buffers: the body of
/// the two matrix tests (host-staged, and stream programs over CUDA IPC).
fn device_matrix(comm: &Communicator, rank: usize, n: usize) {
    let device = device_of(rank);
    let stream = Stream::new(device).unwrap();
    let mut failures = Vec::new();
    // Small, and big enough for several chunks (64 KiB here).
    for_each_matrix_call(n, &[1, 4099, 70_000], |spec, in_place, what| {
        let checked = check::run_and_check_device(comm, spec, in_place, &stream, device);
        note(&mut failures, what, checked);
    });
    assert!(failures.is_empty(), "rank {rank}: {}", failures.join("\n"));
    comm.wait_device_idle(Duration::from_secs(10)).unwrap();
}

#[test]
fn a_call_returns_before_its_stream_runs_it_and_later_work_sees_the_result() {
    if let Some((comm, rank, n)) = worker() {
        let device = device_of(rank);
        let stream = Stream::new(device).unwrap();
        let side = Stream::new(device).unwrap();
        comm.bind_device(device).unwrap();
        let count = 1 << 16;
        let buf = DeviceBuffer::alloc(device, count * 4).unwrap();
        buf.upload(&f32s(&vec![(rank + 1) as f32; count]), &stream)
            .unwrap();
        let gate = Gate::new();
        gate.close_on(&stream);
        let spec = CallSpec::new(Collective::AllReduce, DataType::Float32, count);
        let t = Instant::now();
        comm.call_device(spec, None, &buf, &stream).unwrap();
        let enqueue = t.elapsed();
        // The stream is held at the gate: the collective has not run, so the buffer (read
        // on another stream) still holds this rank's input.
        std::thread::sleep(Duration::from_millis(300));
        let mut before = vec![0u8; count * 4];
        buf.download(&mut before, &side).unwrap();
        assert_eq!(
            before,
            f32s(&vec![(rank + 1) as f32; count]),
            "ran before its stream"
        );
        gate.open();
        // Work enqueued after the call on its stream sees the sum.
        let mut after = vec![0u8; count * 4];
        buf.download(&mut after, &stream).unwrap();
        let want = (n * (n + 1) / 2) as f32;
        assert_eq!(
            after,
            f32s(&vec![want; count]),
            "later work saw a stale buffer"
        );
        assert!(
            enqueue < Duration::from_millis(250),
            "the call blocked for {enqueue:?}"
        );
        assert!(comm.async_error().is_none());
        return;
    }
    let name = "a_call_returns_before_its_stream_runs_it_and_later_work_sees_the_result";
    assert_all_ok(&spawn(name, 2, &[], Duration::from_secs(60)));
}

#[test]
fn a_host_call_after_stream_calls_waits_for_them_so_every_rank_keeps_its_order() {
    if let Some((comm, rank, n)) = worker() {
        let device = device_of(rank);
        let stream = Stream::new(device).unwrap();
        comm.bind_device(device).unwrap();
        let count = 1024;
        let buf = DeviceBuffer::alloc(device, count * 4).unwrap();
        buf.upload(&f32s(&vec![1.0; count]), &stream).unwrap();
        let spec = CallSpec::new(Collective::AllReduce, DataType::Float32, count);
        // Rank 0's device call cannot start for 300 ms; its host call, made right after,
        // must still come second, as on rank 1 (a different count would be a mismatch).
        let gate = (rank == 0).then(|| {
            let g = Gate::new();
            g.close_on(&stream);
            g
        });
        comm.call_device(spec, None, &buf, &stream).unwrap();
        let opener = gate.map(|g| {
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(300));
                g.open();
            })
        });
        if rank != 0 {
            // Here the device call surely runs first: rank 0's host call must wait for its own.
            stream.synchronize().unwrap();
        }
        let mut host = vec![rank as f32 + 1.0; 8];
        comm.all_reduce_in_place(&mut host, ReduceOp::Sum).unwrap();
        assert_eq!(host, vec![(n * (n + 1) / 2) as f32; 8]);
        let mut out = vec![0u8; count * 4];
        buf.download(&mut out, &stream).unwrap();
        assert_eq!(out, f32s(&vec![n as f32; count]));
        if let Some(t) = opener {
            t.join().unwrap();
        }
        assert!(comm.async_error().is_none());
        return;
    }
    let name = "a_host_call_after_stream_calls_waits_for_them_so_every_rank_keeps_its_order";
    assert_all_ok(&spawn(
        name,
        2,
        &[("STRATA_TIMEOUT", "10")],
        Duration::from_secs(60),
    ));
}

#[test]
fn without_a_driver_the_gpu_path_says_so_in_one_line() {
    if std::env::var_os(common::WORKER).is_some() {
        return;
    }
    // This process never has the stand-in on its library path, and the machines this runs on
    // have no GPU driver: the GPU path reports unavailable and host buffers are unaffected.
    if gpu::available() {
        eprintln!(
            "SKIPPED without_a_driver_the_gpu_path_says_so_in_one_line: a CUDA driver is installed"
        );
        return;
    }
    let e = gpu::driver().unwrap_err().to_string();
    assert!(
        e.contains("GPU buffers are unavailable") && !e.contains('\n'),
        "{e}"
    );
    assert!(DeviceBuffer::alloc(0, 16).is_err());
}

/// The stand-in's counters between `before` and now, after `stream` has finished.
fn counted_since(before: &gpu::StandinStats, stream: &Stream) -> gpu::StandinStats {
    stream.synchronize().unwrap();
    gpu::standin_stats()
        .expect("the stand-in is the driver")
        .since(before)
}

#[test]
fn the_standin_counts_what_crosses_host_memory_and_who_waits() {
    if let Some((comm, rank, _n)) = worker() {
        let device = device_of(rank);
        let stream = Stream::new(device).unwrap();
        comm.bind_device(device).unwrap();
        let len = 1 << 20;
        let (a, b) = (
            DeviceBuffer::alloc(device, len).unwrap(),
            DeviceBuffer::alloc(device, len).unwrap(),
        );
        // An upload: its bytes from host memory, and the host waits once for it.
        let s0 = gpu::standin_stats().expect("the stand-in is the driver");
        a.upload(&f32s(&vec![(rank + 1) as f32; len / 4]), &stream)
            .unwrap();
        let up = gpu::standin_stats().unwrap().since(&s0);
        assert_eq!((up.host_to_device, up.device_to_host), (len as u64, 0));
        assert_eq!(up.host_waits, 1, "{up:?}");
        // A device-to-device copy touches no host memory.
        let s1 = gpu::standin_stats().unwrap();
        // SAFETY: two device buffers of `len` bytes each, alive until the stream is done.
        let r = unsafe { sys::cuMemcpyDtoDAsync_v2(b.ptr(), a.ptr(), len, stream.raw()) };
        assert_eq!(r, sys::CUresult::CUDA_SUCCESS);
        let dd = counted_since(&s1, &stream);
        assert_eq!((dd.device_to_device, dd.host_bytes()), (len as u64, 0));
        // One all-reduce on device buffers: through host memory when staged, GPU to GPU
        // through IPC.
        let spec = CallSpec::new(Collective::AllReduce, DataType::Float32, len / 4);
        let s2 = gpu::standin_stats().unwrap();
        comm.call_device(spec, None, &a, &stream).unwrap();
        let call = counted_since(&s2, &stream);
        if comm.uses_gpu_ipc() {
            assert_eq!(call.host_bytes(), 0, "{call:?}");
            assert!(call.device_to_device >= len as u64, "{call:?}");
            assert_eq!(comm.device_path_to(1 - rank), Some("ipc"));
        } else {
            assert_eq!(call.host_to_device, len as u64, "{call:?}");
            assert_eq!(call.device_to_host, len as u64, "{call:?}");
            assert_eq!(call.device_to_device, 0, "{call:?}");
            assert_eq!(comm.device_path_to(1 - rank), Some("staged"));
        }
        assert_eq!(comm.device_path_to(rank), None);
        let mut out = vec![0u8; len];
        a.download(&mut out, &stream).unwrap();
        assert_eq!(out, f32s(&vec![3.0; len / 4]));
        println!("COUNTED {call:?}");
        return;
    }
    let name = "the_standin_counts_what_crosses_host_memory_and_who_waits";
    if std::env::var_os("STRATA_GPU_TESTS_REAL").is_some() {
        eprintln!(
            "SKIPPED {name}: it reads the CUDA stand-in's counters, which a real driver does not keep"
        );
        return;
    }
    let staged = spawn(
        name,
        2,
        &[("STRATA_GPU_PATH", "staged")],
        Duration::from_secs(60),
    );
    assert_all_ok(&staged);
    assert!(
        staged.iter().all(|(_, out)| out.contains("COUNTED")),
        "{staged:?}"
    );
    if common::nvrtc_dir(&format!("{name} through CUDA IPC (the staged half ran)")).is_none() {
        return;
    }
    let ipc = spawn(
        name,
        2,
        &[("STRATA_GPU_PATH", "ipc")],
        Duration::from_secs(60),
    );
    assert_all_ok(&ipc);
    assert!(
        ipc.iter().all(|(_, out)| out.contains("COUNTED")),
        "{ipc:?}"
    );
}

/// Every algorithm of every collective on device buffers, with `algorithm_pairs`, in and
/// out of place, at a size of one piece and one of several (the body of the stream-program
/// test, beside the type × operator matrix under the tuner's choice).
fn device_algorithms(comm: &Communicator, rank: usize, n: usize) {
    let device = device_of(rank);
    let stream = Stream::new(device).unwrap();
    let mut failures = Vec::new();
    let mut ran = 0;
    for collective in Collective::WITH_BUFFERS {
        let big = 70_001;
        for_each_algorithm_call(
            comm,
            n,
            collective,
            full_matrix(),
            big,
            |spec, in_place, what| {
                match check::run_and_check_device(comm, spec, in_place, &stream, device) {
                    Ok(c) if c.first.is_none() => {}
                    Ok(c) => failures.push(format!("{what}: {:?}", c.first)),
                    Err(e) => failures.push(format!("{what}: {e}")),
                }
                ran += 1;
            },
        );
    }
    assert!(failures.is_empty(), "rank {rank}: {}", failures.join("\n"));
    assert!(ran > 100, "only {ran} calls");
    println!("ALGORITHMS {ran}");
}

#[test]
fn every_collective_algorithm_type_and_operator_as_stream_programs_at_2_3_and_4_processes() {
    if let Some((comm, rank, n)) = worker() {
        comm.bind_device(device_of(rank)).unwrap();
        assert!(
            comm.uses_gpu_ipc(),
            "STRATA_GPU_PATH=stream bound without them"
        );
        device_matrix(&comm, rank, n);
        device_algorithms(&comm, rank, n);
        return;
    }
    let test =
        "every_collective_algorithm_type_and_operator_as_stream_programs_at_2_3_and_4_processes";
    if common::nvrtc_dir(test).is_none() {
        return;
    }
    for n in [2, 3, 4] {
        let env = [("STRATA_GPU_CHUNK", "64K"), ("STRATA_GPU_PATH", "stream")];
        let ranks = spawn(test, n, &env, Duration::from_secs(300));
        assert_all_ok(&ranks);
        assert!(
            ranks.iter().all(|(_, out)| out.contains("ALGORITHMS")),
            "{ranks:?}"
        );
    }
}

#[test]
fn a_64_mib_all_reduce_as_a_stream_program_touches_no_host_memory_and_no_host_waits() {
    if let Some((comm, rank, n)) = worker() {
        let device = device_of(rank);
        comm.bind_device(device).unwrap();
        let during = common::polled_64_mib_all_reduce(&comm, rank, n, device);
        assert_eq!(during.host_bytes(), 0, "{during:?}");
        assert_eq!(during.host_waits, 0, "{during:?}");
        assert_eq!(during.host_functions, 0, "{during:?}");
        assert!(during.device_to_device > 0, "{during:?}");
        println!("MOVED {during:?}");
        return;
    }
    let test = "a_64_mib_all_reduce_as_a_stream_program_touches_no_host_memory_and_no_host_waits";
    if std::env::var_os("STRATA_GPU_TESTS_REAL").is_some() {
        eprintln!(
            "SKIPPED {test}: it reads the CUDA stand-in's counters, which a real driver does not keep"
        );
        return;
    }
    if common::nvrtc_dir(test).is_none() {
        return;
    }
    let ranks = spawn(
        test,
        4,
        &[("STRATA_GPU_PATH", "stream")],
        Duration::from_secs(300),
    );
    assert_all_ok(&ranks);
    assert!(
        ranks.iter().all(|(_, out)| out.contains("MOVED")),
        "{ranks:?}"
    );
}

#[test]
fn sends_and_receives_on_device_buffers_progress_together_in_one_stream_program() {
    if let Some((comm, rank, n)) = worker() {
        let device = device_of(rank);
        comm.bind_device(device).unwrap();
        assert!(comm.uses_gpu_ipc());
        let stream = Stream::new(device).unwrap();
        let count = 70_001; // several slots of 64 KiB, and a partial one
        let bytes = count * 4;
        let value = |from: usize, to: usize| (from * 10 + to) as f32;
        let sends: Vec<DeviceBuffer> = (0..n)
            .map(|to| {
                let b = DeviceBuffer::alloc(device, bytes).unwrap();
                b.upload(&f32s(&vec![value(rank, to); count]), &stream)
                    .unwrap();
                b
            })
            .collect();
        let recvs: Vec<DeviceBuffer> = (0..n)
            .map(|_| DeviceBuffer::alloc(device, bytes).unwrap())
            .collect();
        // Every rank sends to every rank (itself included) and receives from every rank in
        // one batch: only concurrent progress gets through this with four slots a pair.
        let mut batch = Vec::new();
        for q in 0..n {
            batch.push(strata::DeviceTransfer {
                peer: q,
                ptr: sends[q].ptr(),
                bytes,
                send: true,
            });
            batch.push(strata::DeviceTransfer {
                peer: q,
                ptr: recvs[q].ptr(),
                bytes,
                send: false,
            });
        }
        // The stand-in counts what crosses host memory; a real driver has no such counters.
        let real = std::env::var_os("STRATA_GPU_TESTS_REAL").is_some();
        let before = (!real).then(|| gpu::standin_stats().expect("the stand-in's counters"));
        comm.enqueue_transfers(&batch, &stream).unwrap();
        if let Some(before) = before {
            let moved = counted_since(&before, &stream);
            assert_eq!(moved.host_bytes(), 0, "{moved:?}");
        }
        for (q, r) in recvs.iter().enumerate() {
            let mut out = vec![0u8; bytes];
            r.download(&mut out, &stream).unwrap();
            assert!(out == f32s(&vec![value(q, rank); count]), "from rank {q}");
        }
        // Bad input is refused before anything is enqueued.
        let bad = [strata::DeviceTransfer {
            peer: n,
            ptr: sends[0].ptr(),
            bytes: 4,
            send: true,
        }];
        assert!(comm.enqueue_transfers(&bad, &stream).is_err());
        assert!(comm.async_error().is_none());
        println!("EXCHANGED");
        return;
    }
    let name = "sends_and_receives_on_device_buffers_progress_together_in_one_stream_program";
    if common::nvrtc_dir(name).is_none() {
        return;
    }
    for n in [2, 3, 4] {
        let env = [("STRATA_GPU_CHUNK", "64K"), ("STRATA_GPU_PATH", "stream")];
        let ranks = spawn(name, n, &env, Duration::from_secs(120));
        assert_all_ok(&ranks);
        assert!(
            ranks.iter().all(|(_, out)| out.contains("EXCHANGED")),
            "{ranks:?}"
        );
    }
}

#[test]
fn a_one_rank_communicator_runs_device_calls_on_the_gpu_not_through_host_memory() {
    if let Some((comm, rank, n)) = worker() {
        let device = device_of(rank);
        comm.bind_device(device).unwrap();
        assert!(comm.uses_gpu_ipc(), "one rank fell back to staging");
        device_matrix(&comm, rank, n);
        let stream = Stream::new(device).unwrap();
        let count = 1 << 20;
        let send = DeviceBuffer::alloc(device, count * 4).unwrap();
        let recv = DeviceBuffer::alloc(device, count * 4).unwrap();
        send.upload(&f32s(&vec![2.5; count]), &stream).unwrap();
        let before = gpu::standin_stats().unwrap();
        let spec = CallSpec::new(Collective::AllReduce, DataType::Float32, count);
        comm.call_device(spec, Some(&send), &recv, &stream).unwrap();
        let during = counted_since(&before, &stream);
        assert_eq!(during.host_bytes(), 0, "{during:?}");
        let mut out = vec![0u8; count * 4];
        recv.download(&mut out, &stream).unwrap();
        assert!(out == f32s(&vec![2.5; count]), "wrong copy");
        println!("ONE_RANK {during:?}");
        return;
    }
    let name = "a_one_rank_communicator_runs_device_calls_on_the_gpu_not_through_host_memory";
    if std::env::var_os("STRATA_GPU_TESTS_REAL").is_some() {
        eprintln!(
            "SKIPPED {name}: it reads the CUDA stand-in's counters, which a real driver does not keep"
        );
        return;
    }
    if common::nvrtc_dir(name).is_none() {
        return;
    }
    let ranks = spawn(
        name,
        1,
        &[("STRATA_GPU_CHUNK", "64K")],
        Duration::from_secs(120),
    );
    assert_all_ok(&ranks);
    assert!(ranks[0].1.contains("ONE_RANK"), "{ranks:?}");
}

/// The stand-in follows the driver's rules for pageable host memory ("API synchronization
/// behavior"), which client code relies on: a copy from pageable memory may reuse the source
/// as soon as the call returns (it was staged), a copy into pageable memory returns only when
/// it is done, and a copy into page-locked memory returns at once, even on a held stream.
#[test]
fn copies_to_and_from_pageable_memory_follow_the_drivers_synchronisation_rules() {
    if let Some((_comm, rank, _)) = worker() {
        let device = device_of(rank);
        let stream = Stream::new(device).unwrap();
        let buf = DeviceBuffer::alloc(device, 4096).unwrap();
        // From pageable memory: staged at the call, so overwriting the source is safe.
        let gate = Gate::new();
        gate.close_on(&stream);
        let mut src = vec![7u8; 4096];
        // SAFETY: host memory of 4096 bytes into a device buffer of as many.
        let r = unsafe {
            sys::cuMemcpyHtoDAsync_v2(buf.ptr(), src.as_ptr().cast(), 4096, stream.raw())
        };
        assert_eq!(r, sys::CUresult::CUDA_SUCCESS);
        src.fill(9);
        gate.open();
        let mut back = vec![0u8; 4096];
        buf.download(&mut back, &stream).unwrap();
        assert_eq!(
            back,
            vec![7u8; 4096],
            "the copy read the source after the call returned"
        );
        // Into pageable memory: the call returns when the data is there.
        let gate = Gate::new();
        gate.close_on(&stream);
        let opener = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            gate.open();
        });
        let mut dst = vec![0u8; 4096];
        let t = Instant::now();
        // SAFETY: as above, the other way.
        let r = unsafe {
            sys::cuMemcpyDtoHAsync_v2(dst.as_mut_ptr().cast(), buf.ptr(), 4096, stream.raw())
        };
        assert_eq!(r, sys::CUresult::CUDA_SUCCESS);
        assert!(
            t.elapsed() >= Duration::from_millis(150),
            "returned before the copy ran"
        );
        assert_eq!(dst, vec![7u8; 4096]);
        opener.join().unwrap();
        // Into page-locked memory: asynchronous, as the driver's. (Allocated before the stream
        // is held: allocating waits for the device.)
        let mut pinned: *mut std::ffi::c_void = std::ptr::null_mut();
        // SAFETY: a driver allocation of 4096 bytes, freed below.
        unsafe {
            assert_eq!(
                sys::cuMemHostAlloc(&mut pinned, 4096, 0),
                sys::CUresult::CUDA_SUCCESS
            );
        }
        let gate = Gate::new();
        gate.close_on(&stream);
        let t = Instant::now();
        // SAFETY: as above.
        let r = unsafe { sys::cuMemcpyDtoHAsync_v2(pinned, buf.ptr(), 4096, stream.raw()) };
        assert_eq!(r, sys::CUresult::CUDA_SUCCESS);
        assert!(
            t.elapsed() < Duration::from_millis(100),
            "a pinned copy blocked"
        );
        gate.open();
        stream.synchronize().unwrap();
        // SAFETY: the allocation made above, its copy complete.
        unsafe {
            assert_eq!(*(pinned as *const u8), 7);
            sys::cuMemFreeHost(pinned);
        }
        return;
    }
    let name = "copies_to_and_from_pageable_memory_follow_the_drivers_synchronisation_rules";
    assert_all_ok(&spawn(name, 1, &[], Duration::from_secs(60)));
}

/// Ranks whose kernel areas differ (`STRATA_GPU_LL_BYTES` set on one rank only) agree at bind
/// to run no call as a kernel, rather than write lines at offsets their peers do not read or
/// leave a collective out; their calls run as stream programs and stay right.
#[test]
fn ranks_whose_kernel_areas_differ_agree_on_no_kernels() {
    if let Some((comm, rank, n)) = worker() {
        if rank == 1 {
            // SAFETY: nothing else of this process reads the environment meanwhile (the
            // communicator's threads never read this variable).
            unsafe { std::env::set_var("STRATA_GPU_LL_BYTES", "64K") };
        }
        let device = device_of(rank);
        comm.bind_device(device).unwrap();
        let choice = comm.kernel_choice().expect("the kernel path was set up");
        assert_eq!(choice.up_to, 0, "rank {rank}: {choice:?}");
        assert!(choice.how.contains("differ"), "rank {rank}: {}", choice.how);
        let stream = Stream::new(device).unwrap();
        let spec = CallSpec::new(Collective::AllReduce, DataType::Float32, 2);
        assert_eq!(comm.device_kernel_for(&spec), None);
        let c = check::run_and_check_device(&comm, spec, false, &stream, device).unwrap();
        assert!(c.first.is_none(), "rank {rank} of {n}: {:?}", c.first);
        return;
    }
    let name = "ranks_whose_kernel_areas_differ_agree_on_no_kernels";
    if common::nvrtc_dir(name).is_none() {
        return;
    }
    let env = [("STRATA_GPU_KERNEL", "on"), ("STRATA_GPU_PATH", "stream")];
    assert_all_ok(&spawn(name, 2, &env, Duration::from_secs(60)));
}
