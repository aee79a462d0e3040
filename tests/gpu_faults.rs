//! The GPU path's failures against the CUDA driver stand-in: an abort and a killed peer
//! while calls wait on streams, a stream program waiting on a rank that never calls, and
//! mismatched calls on device buffers. Each test re-runs this binary as its ranks (see
//! `tests/common/gpu.rs`); what they prove is ordering and errors, never GPU speed.

mod common;

use common::gpu::{Gate, assert_all_ok, device_of, f32s, spawn, worker};
use std::time::{Duration, Instant};
use strata::gpu::{DeviceBuffer, Stream};
use strata::{CallSpec, Collective, DataType};

#[test]
fn abort_while_calls_wait_on_a_stream_releases_the_stream_and_says_why() {
    if let Some((comm, rank, _)) = worker() {
        let device = device_of(rank);
        let stream = Stream::new(device).unwrap();
        let buf = DeviceBuffer::alloc(device, 4096).unwrap();
        buf.upload(&f32s(&[(rank + 1) as f32; 1024]), &stream)
            .unwrap();
        comm.bind_device(device).unwrap();
        let spec = CallSpec::new(Collective::AllReduce, DataType::Float32, 1024);
        if rank == 0 {
            let gate = Gate::new();
            gate.close_on(&stream);
            for _ in 0..3 {
                comm.call_device(spec, None, &buf, &stream).unwrap();
            }
            comm.abort();
            gate.open();
        } else if let Err(e) = comm.call_device(spec, None, &buf, &stream) {
            // Rank 0 may have aborted already: then the call is refused with the reason.
            assert_eq!(Some(e), comm.async_error());
        }
        let t = Instant::now();
        stream.synchronize().unwrap();
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "the stream was held {:?}",
            t.elapsed()
        );
        if rank == 1 && comm.uses_gpu_ipc() && comm.async_error().is_none() {
            // Rank 0's released programs still ran their transfers once the gate opened (the
            // abort is local, as NCCL's is): then rank 1's one call completed, and correctly.
            let mut out = vec![0u8; 4096];
            buf.download(&mut out, &stream).unwrap();
            assert_eq!(out, f32s(&[3.0; 1024]), "completed with a wrong result");
            return;
        }
        let e = comm.async_error().expect("an async error after the abort");
        eprintln!("rank {rank}: {e}");
        if rank == 0 {
            assert!(e.to_string().contains("abort"), "{e}");
        }
        return;
    }
    let name = "abort_while_calls_wait_on_a_stream_releases_the_stream_and_says_why";
    let env = [("STRATA_TIMEOUT", "5")];
    assert_all_ok(&spawn(name, 2, &env, Duration::from_secs(60)));
}

#[test]
fn a_peer_killed_while_calls_are_on_a_stream_is_named_by_the_async_error() {
    if let Some((comm, rank, _)) = worker() {
        let device = device_of(rank);
        let stream = Stream::new(device).unwrap();
        let buf = DeviceBuffer::alloc(device, 1 << 20).unwrap();
        let spec = CallSpec::new(Collective::AllReduce, DataType::Float32, 1 << 18);
        comm.call_device(spec, None, &buf, &stream).unwrap();
        stream.synchronize().unwrap();
        if rank == 2 {
            // SAFETY: ends the process at once, as a crash would.
            unsafe { libc::_exit(0) };
        }
        let t = Instant::now();
        for _ in 0..4 {
            let _ = comm.call_device(spec, None, &buf, &stream);
        }
        stream.synchronize().unwrap();
        let e = comm
            .async_error()
            .expect("an async error after the peer died");
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "took {:?}",
            t.elapsed()
        );
        assert!(e.to_string().contains("rank 2"), "rank {rank}: {e}");
        eprintln!("rank {rank} after {:?}: {e}", t.elapsed());
        return;
    }
    let name = "a_peer_killed_while_calls_are_on_a_stream_is_named_by_the_async_error";
    let env = [("STRATA_TIMEOUT", "5")];
    assert_all_ok(&spawn(name, 3, &env, Duration::from_secs(60)));
}

/// In a rank: rank 2 never makes the call; the others' call (on `kernel`: one low-latency
/// kernel, else a stream program) times out naming it, and their streams are let go.
fn never_calls(kernel: bool) {
    let Some((comm, rank, _n)) = worker() else {
        return;
    };
    let device = device_of(rank);
    comm.bind_device(device).unwrap();
    assert!(comm.uses_gpu_ipc());
    let stream = Stream::new(device).unwrap();
    let buf = DeviceBuffer::alloc(device, 1 << 16).unwrap();
    let spec = CallSpec::new(Collective::AllReduce, DataType::Float32, 1 << 14);
    assert_eq!(comm.device_kernel_for(&spec).is_some(), kernel);
    if rank != 2 {
        comm.call_device(spec, None, &buf, &stream).unwrap();
        let t = Instant::now();
        // The stream is released after the timeout (2 s here), not held forever.
        stream.synchronize().unwrap();
        assert!(
            t.elapsed() < Duration::from_secs(15),
            "held {:?}",
            t.elapsed()
        );
        let e = comm.async_error().expect("a timeout");
        let text = e.to_string();
        assert!(text.contains("timed out"), "rank {rank}: {text}");
        assert!(
            matches!(&e, strata::Error::Timeout { waiting_on, .. } if waiting_on == &[2]),
            "rank {rank}: {e:?}"
        );
        println!("TIMED_OUT {text}");
    } else {
        // Rank 2 never makes the call; it stays until the others are done.
        std::thread::sleep(Duration::from_secs(6));
    }
}

/// Spawns [`never_calls`] at 3 ranks; the lines in which ranks 0 and 1 report the timeout.
fn never_calls_reports(name: &str, kernel: &str) -> Option<Vec<String>> {
    common::nvrtc_dir(name)?;
    let env = [
        ("STRATA_GPU_PATH", "stream"),
        ("STRATA_TIMEOUT", "2"),
        ("STRATA_GPU_KERNEL", kernel),
    ];
    let ranks = spawn(name, 3, &env, Duration::from_secs(60));
    assert_all_ok(&ranks);
    Some(
        ranks
            .iter()
            .enumerate()
            .filter(|(r, _)| *r != 2)
            .map(|(r, (_, out))| {
                out.lines()
                    .find(|l| l.contains("TIMED_OUT"))
                    .unwrap_or_else(|| panic!("rank {r}: {out}"))
                    .to_string()
            })
            .collect(),
    )
}

#[test]
fn a_stream_program_waiting_on_a_rank_that_never_calls_times_out_naming_it() {
    if common::is_worker() {
        return never_calls(false);
    }
    let name = "a_stream_program_waiting_on_a_rank_that_never_calls_times_out_naming_it";
    let Some(lines) = never_calls_reports(name, "off") else {
        return;
    };
    // Both ranks that called name rank 2, the one holding them up, though rank 1 waits on
    // rank 0 (ring order), not on rank 2: the diagnosis follows the waits across the host's
    // flag areas. (A rank may hear of the other's timeout first; it names rank 2 too.)
    for (r, line) in lines.iter().enumerate() {
        assert!(line.contains("rank 0 waits on rank 2"), "rank {r}: {line}");
        assert!(line.contains("rank 2 waits on no one"), "rank {r}: {line}");
    }
}

#[test]
fn a_kernel_waiting_on_a_rank_that_never_calls_times_out_naming_it() {
    if common::is_worker() {
        return never_calls(true);
    }
    let name = "a_kernel_waiting_on_a_rank_that_never_calls_times_out_naming_it";
    let Some(lines) = never_calls_reports(name, "on") else {
        return;
    };
    // The kernels wrote what each waits for (rank 2's arrival) into their flag areas; the
    // monitor's abort word let them go.
    for (r, line) in lines.iter().enumerate() {
        assert!(line.contains("kernel"), "rank {r}: {line}");
        assert!(line.contains("waits on rank 2"), "rank {r}: {line}");
        assert!(line.contains("rank 2 waits on no one"), "rank {r}: {line}");
    }
}

/// In a rank: rank 2 asks for twice the elements the others do; every rank's error names
/// both calls. On `kernel`, the calls run as low-latency kernels, else as ring programs.
fn mismatched(kernel: bool) {
    let Some((comm, rank, _)) = worker() else {
        return;
    };
    let device = device_of(rank);
    comm.bind_device(device).unwrap();
    assert!(comm.uses_gpu_ipc());
    let stream = Stream::new(device).unwrap();
    let buf = DeviceBuffer::alloc(device, 4 << 16).unwrap();
    let count = if rank == 2 { 1 << 15 } else { 1 << 14 };
    if !kernel {
        comm.set_algorithm(Collective::AllReduce, Some(strata::Algorithm::Ring))
            .unwrap();
    }
    let spec = CallSpec::new(Collective::AllReduce, DataType::Float32, count);
    assert_eq!(comm.device_kernel_for(&spec).is_some(), kernel);
    let mine = vec![(rank + 1) as f32; count];
    buf.upload(&f32s(&mine), &stream).unwrap();
    comm.call_device(spec, None, &buf, &stream).unwrap();
    let t = Instant::now();
    stream.synchronize().unwrap();
    // Whoever finds it first tells the others; wait for the word to arrive.
    while comm.async_error().is_none() && t.elapsed() < Duration::from_secs(15) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let e = comm
        .async_error()
        .expect("an error for the mismatched calls");
    let text = e.to_string();
    assert!(text.contains("mismatched calls"), "rank {rank}: {text}");
    assert!(
        text.contains("16384 elements") && text.contains("32768 elements"),
        "rank {rank}: {text}"
    );
    if kernel {
        // No rank took a peer's lines: the buffer holds no sum of the others' data.
        let mut got = vec![0u8; count * 4];
        buf.download(&mut got, &stream).unwrap();
        let sum = f32s(&vec![6.0; count]);
        assert_ne!(
            got[..64],
            sum[..64],
            "rank {rank} finished with mismatched data"
        );
    }
    println!("MISMATCH {text}");
}

fn mismatched_reports(name: &str, kernel: &str) {
    if common::nvrtc_dir(name).is_none() {
        return;
    }
    let env = [
        ("STRATA_GPU_PATH", "stream"),
        ("STRATA_TIMEOUT", "2"),
        ("STRATA_GPU_CHUNK", "16K"),
        ("STRATA_GPU_KERNEL", kernel),
    ];
    let ranks = spawn(name, 3, &env, Duration::from_secs(60));
    assert_all_ok(&ranks);
    for line in ranks[0].1.lines().filter(|l| l.contains("MISMATCH")) {
        println!("rank 0: {line}");
    }
}

#[test]
fn mismatched_calls_on_device_buffers_are_named_not_just_timed_out() {
    if common::is_worker() {
        return mismatched(false);
    }
    mismatched_reports(
        "mismatched_calls_on_device_buffers_are_named_not_just_timed_out",
        "off",
    );
}

#[test]
fn mismatched_calls_as_kernels_are_named_and_take_none_of_each_others_data() {
    if common::is_worker() {
        return mismatched(true);
    }
    mismatched_reports(
        "mismatched_calls_as_kernels_are_named_and_take_none_of_each_others_data",
        "on",
    );
}
