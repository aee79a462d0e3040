//! A program written the way users of cudarc's safe CUDA and NCCL API write it (candle's
//! multi-GPU code does the same): a context per rank, `clone_htod` (once `memcpy_stod`) into device memory,
//! `Comm::all_reduce` (and all-gather, broadcast, reduce-scatter), then `clone_dtoh` (once `memcpy_dtov`) straight
//! back into a `Vec`, with no explicit synchronize: it relies on the driver's rule that a copy
//! into pageable host memory returns only when it is done. It knows nothing of strata; run
//! against strata's `libnccl.so` (or NVIDIA's), it must get the right numbers.
//!
//! `cudarc_client processes` runs one rank (RANK, WORLD_SIZE, and NCCL_TEST_ID_FILE for rank
//! 0's unique id) with `Comm::from_rank` on the default stream, then on a stream of its own;
//! `cudarc_client threads N` runs N ranks as streams of one context on GPU 0
//! (`Comm::from_devices`: ncclCommInitAll with a repeated device) under `group_start`. Prints
//! "all checks passed" and exits 0 when every result is right.

use cudarc::driver::{CudaContext, CudaStream};
use cudarc::nccl::safe::{Comm, Id, ReduceOp, group_end, group_start};
use std::sync::Arc;

/// Rank r's input: small integers, so sums are exact.
fn input(rank: usize, n: usize) -> Vec<f32> {
    (0..n).map(|i| ((rank + 1) * 10 + i % 7) as f32).collect()
}

fn sum(world: usize, n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| (0..world).map(|r| ((r + 1) * 10 + i % 7) as f32).sum())
        .collect()
}

type Failures = Vec<String>;

/// One rank's all-reduce, all-gather, broadcast (from rank 0) and reduce-scatter at `n`
/// elements on `comm`'s stream, each read back with clone_dtoh and checked at once.
fn collectives(comm: &Comm, n: usize, fail: &mut Failures) -> Result<(), String> {
    let (rank, world) = (comm.rank(), comm.world_size());
    let stream = comm.stream();
    let e = |x: cudarc::driver::DriverError| format!("{x:?}");
    let ne = |x: cudarc::nccl::result::NcclError| format!("{x:?}");
    let send = stream.clone_htod(&input(rank, n)).map_err(e)?;
    let mut recv = stream.alloc_zeros::<f32>(n).map_err(e)?;
    comm.all_reduce(&send, &mut recv, &ReduceOp::Sum)
        .map_err(ne)?;
    let got: Vec<f32> = stream.clone_dtoh(&recv).map_err(e)?;
    if got != sum(world, n) {
        fail.push(format!(
            "rank {rank}: all_reduce of {n} read {:?}...",
            &got[..n.min(4)]
        ));
    }
    let mut gathered = stream.alloc_zeros::<f32>(n * world).map_err(e)?;
    comm.all_gather(&send, &mut gathered).map_err(ne)?;
    let got: Vec<f32> = stream.clone_dtoh(&gathered).map_err(e)?;
    let want: Vec<f32> = (0..world).flat_map(|r| input(r, n)).collect();
    if got != want {
        fail.push(format!(
            "rank {rank}: all_gather of {n} read {:?}...",
            &got[..n.min(4)]
        ));
    }
    let mut bcast = stream.alloc_zeros::<f32>(n).map_err(e)?;
    comm.broadcast(Some(&send), &mut bcast, 0).map_err(ne)?;
    let got: Vec<f32> = stream.clone_dtoh(&bcast).map_err(e)?;
    if got != input(0, n) {
        fail.push(format!(
            "rank {rank}: broadcast of {n} read {:?}...",
            &got[..n.min(4)]
        ));
    }
    let mut shard = stream.alloc_zeros::<f32>(n).map_err(e)?;
    let whole = stream.clone_htod(&input(rank, n * world)).map_err(e)?;
    comm.reduce_scatter(&whole, &mut shard, &ReduceOp::Sum)
        .map_err(ne)?;
    let got: Vec<f32> = stream.clone_dtoh(&shard).map_err(e)?;
    let want: Vec<f32> = sum(world, n * world)[rank * n..(rank + 1) * n].to_vec();
    if got != want {
        fail.push(format!(
            "rank {rank}: reduce_scatter of {n} read {:?}...",
            &got[..n.min(4)]
        ));
    }
    Ok(())
}

const SIZES: [usize; 3] = [1, 1000, 100_000];

/// Rank 0's fresh unique id, shared with the other ranks through the file `path` (a unique id
/// serves one communicator, in NCCL as here).
fn share_id(rank: usize, path: &str) -> Result<Id, String> {
    if rank == 0 {
        let id = Id::new().map_err(|x| format!("{x:?}"))?;
        let bytes: Vec<u8> = id.internal().iter().map(|&c| c as u8).collect();
        std::fs::write(format!("{path}.tmp"), bytes).map_err(|x| x.to_string())?;
        std::fs::rename(format!("{path}.tmp"), path).map_err(|x| x.to_string())?;
        return Ok(id);
    }
    let bytes = loop {
        match std::fs::read(path) {
            Ok(b) if b.len() == 128 => break b,
            _ => std::thread::sleep(std::time::Duration::from_millis(10)),
        }
    };
    let mut internal = [0 as std::ffi::c_char; 128];
    for (d, s) in internal.iter_mut().zip(bytes) {
        *d = s as std::ffi::c_char;
    }
    Ok(Id::uninit(internal))
}

fn processes() -> Result<Failures, String> {
    let env = |k: &str| std::env::var(k).map_err(|_| format!("{k} is not set"));
    let rank: usize = env("RANK")?.parse().map_err(|_| "RANK")?;
    let world: usize = env("WORLD_SIZE")?.parse().map_err(|_| "WORLD_SIZE")?;
    let path = env("NCCL_TEST_ID_FILE")?;
    let ctx = CudaContext::new(0).map_err(|x| format!("{x:?}"))?;
    let mut fail = Vec::new();
    // The default stream first (what most users have), then one of the program's own.
    let streams: [Arc<CudaStream>; 2] = [
        ctx.default_stream(),
        ctx.new_stream().map_err(|x| format!("{x:?}"))?,
    ];
    for (k, stream) in streams.into_iter().enumerate() {
        let id = share_id(rank, &format!("{path}.{k}"))?;
        let comm = Comm::from_rank(stream, rank, world, id).map_err(|x| format!("{x:?}"))?;
        for n in SIZES {
            collectives(&comm, n, &mut fail)?;
        }
    }
    Ok(fail)
}

fn threads(world: usize) -> Result<Failures, String> {
    let ctx = CudaContext::new(0).map_err(|x| format!("{x:?}"))?;
    let streams: Vec<Arc<CudaStream>> = (0..world)
        .map(|_| ctx.new_stream())
        .collect::<Result<_, _>>()
        .map_err(|x| format!("{x:?}"))?;
    let comms = Comm::from_devices(streams).map_err(|x| format!("{x:?}"))?;
    let mut fail = Vec::new();
    for n in SIZES {
        let e = |x: cudarc::driver::DriverError| format!("{x:?}");
        // Buffers first: an allocation waits for the device, which these ranks share.
        let sends: Vec<_> = comms
            .iter()
            .map(|c| c.stream().clone_htod(&input(c.rank(), n)))
            .collect::<Result<_, _>>()
            .map_err(e)?;
        let mut recvs: Vec<_> = comms
            .iter()
            .map(|c| c.stream().alloc_zeros::<f32>(n))
            .collect::<Result<_, _>>()
            .map_err(e)?;
        group_start().map_err(|x| format!("{x:?}"))?;
        for ((c, s), r) in comms.iter().zip(&sends).zip(&mut recvs) {
            c.all_reduce(s, r, &ReduceOp::Sum)
                .map_err(|x| format!("{x:?}"))?;
        }
        group_end().map_err(|x| format!("{x:?}"))?;
        for (c, r) in comms.iter().zip(&recvs) {
            let got: Vec<f32> = c.stream().clone_dtoh(r).map_err(e)?;
            if got != sum(world, n) {
                fail.push(format!(
                    "rank {}: all_reduce of {n} read {:?}...",
                    c.rank(),
                    &got[..n.min(4)]
                ));
            }
        }
    }
    Ok(fail)
}

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let run = match args.get(1).map(String::as_str) {
        Some("processes") => processes(),
        Some("threads") => threads(args.get(2).and_then(|n| n.parse().ok()).unwrap_or(2)),
        _ => Err("usage: cudarc_client processes | threads N".into()),
    };
    match run {
        Ok(fail) if fail.is_empty() => {
            println!("all checks passed");
            std::process::ExitCode::SUCCESS
        }
        Ok(fail) => {
            eprintln!("{}", fail.join("\n"));
            std::process::ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("cudarc_client: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
