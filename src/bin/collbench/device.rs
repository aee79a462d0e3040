//! `--device cuda`: buffers on the GPU, calls enqueued on a stream and timed with CUDA events
//! around the timed iterations, as nccl-tests times them.

use super::*;
use strata::gpu::{DeviceBuffer, DeviceRange, Event, Stream};

/// The GPU of this rank: its position among the ranks of its host, modulo the GPUs visible.
pub(super) fn local_device(comm: &Communicator) -> Result<i32, String> {
    let info = strata::gpu::driver().map_err(|e| e.to_string())?;
    let me = &comm.peers()[comm.rank()].host;
    let local = comm.peers()[..comm.rank()]
        .iter()
        .filter(|p| &p.host == me)
        .count();
    Ok((local % info.devices) as i32)
}

/// One enqueue of the benchmark's call on device buffers.
#[allow(clippy::too_many_arguments)]
fn enqueue_once(
    comm: &Communicator,
    spec: CallSpec,
    in_place: bool,
    send: &DeviceBuffer,
    recv: &DeviceBuffer,
    in_bytes: usize,
    stream: &Stream,
) -> strata::Result<()> {
    if spec.collective == Collective::Send {
        let (n, rank) = (comm.size(), comm.rank());
        let peer = rank ^ 1;
        let bytes = spec.count * spec.dtype.size();
        if peer >= n || bytes == 0 {
            return Ok(());
        }
        let (s, r, dtype) = (send.ptr(), recv.ptr(), spec.dtype);
        let ranges = vec![
            DeviceRange {
                ptr: s,
                len: bytes,
                read: true,
                write: false,
            },
            DeviceRange {
                ptr: r,
                len: bytes,
                read: false,
                write: true,
            },
        ];
        return comm.enqueue_device(
            &[stream],
            ranges,
            Box::new(move |comm, staged| {
                let missing = || strata::Error::Transport("internal: buffer not staged".into());
                let hs = staged.host(s).ok_or_else(missing)?;
                let hr = staged.host(r).ok_or_else(missing)?;
                // SAFETY: staged copies of `bytes` bytes each, used by this call alone.
                let (sb, rb) = unsafe {
                    (
                        std::slice::from_raw_parts(hs, bytes),
                        std::slice::from_raw_parts_mut(hr, bytes),
                    )
                };
                send_recv(comm, dtype, bytes / dtype.size(), sb, rb)
            }),
        );
    }
    if in_place {
        comm.call_device(spec, None, recv, stream)
    } else {
        let _ = in_bytes;
        comm.call_device(spec, Some(send), recv, stream)
    }
}

/// What one call did on the CUDA driver stand-in, averaged over the timed calls of a row.
#[derive(Serialize, Clone, Copy, Debug, Default)]
pub(super) struct PerCall {
    /// Payload bytes copied between host and device memory, either way.
    pub host_bytes: f64,
    /// Payload bytes copied between device allocations.
    pub device_bytes: f64,
    /// Host threads waiting on the GPU (stream, event or context synchronisation).
    pub host_waits: f64,
    /// Host functions streams ran.
    pub host_functions: f64,
    /// Kernels launched.
    pub launches: f64,
    /// Stream memory operations enqueued (a batch counts one).
    pub memory_ops: f64,
}

impl PerCall {
    fn of(stats: &strata::gpu::StandinStats, calls: usize) -> Self {
        let per = |x: u64| x as f64 / calls.max(1) as f64;
        Self {
            host_bytes: per(stats.host_bytes()),
            device_bytes: per(stats.device_to_device),
            host_waits: per(stats.host_waits),
            host_functions: per(stats.host_functions),
            launches: per(stats.launches),
            memory_ops: per(stats.memory_ops),
        }
    }
}

/// Ranks of this communicator in this process (several with `--threads`): the stand-in's
/// counters are the process's, so they count every such rank's calls.
fn ranks_in_process(comm: &Communicator) -> usize {
    let me = comm.peers()[comm.rank()].process;
    comm.peers().iter().filter(|p| p.process == me).count()
}

/// Prints the stand-in's per-call counts of rank 0 (logic-level), one line a row.
pub(super) fn print_standin(rows: &[Row]) {
    let measured: Vec<(&Row, &PerCall)> = rows
        .iter()
        .filter_map(|r| Some((r, r.standin_per_call.as_ref()?)))
        .collect();
    if measured.is_empty() {
        return;
    }
    println!(
        "# CUDA driver stand-in, rank 0, per out-of-place call (logic-level: what moved and who \
         waited, never GPU speed; the timed calls' counts, so the one synchronise after them is \
         shared among them)"
    );
    println!(
        "#  {:>10} {:>8} {:>14} {:>14} {:>11} {:>9} {:>9} {:>9}",
        "size",
        "type",
        "host bytes",
        "device bytes",
        "host waits",
        "host fns",
        "launches",
        "mem ops"
    );
    for (r, c) in measured {
        println!(
            "#  {:>10} {:>8} {:>14.0} {:>14.0} {:>11.2} {:>9.2} {:>9.2} {:>9.2}",
            r.size_bytes,
            r.dtype,
            c.host_bytes,
            c.device_bytes,
            c.host_waits,
            c.host_functions,
            c.launches,
            c.memory_ops
        );
    }
}

/// Times `spec` on device buffers: (microseconds per call, wrong elements on this rank, and on
/// the driver stand-in what one timed call did).
pub(super) fn time_on_device(
    args: &Args,
    comm: &Communicator,
    spec: CallSpec,
    in_place: bool,
    in_bytes: usize,
    out_bytes: usize,
) -> Result<(f64, u64, Option<PerCall>), String> {
    let err = |e: strata::Error| e.to_string();
    let device = local_device(comm)?;
    let stream = Stream::new(device).map_err(err)?;
    let es = spec.dtype.size();
    let send = DeviceBuffer::alloc(device, in_bytes.max(spec.count * es).max(1)).map_err(err)?;
    let recv = DeviceBuffer::alloc(device, out_bytes.max(in_bytes).max(spec.count * es).max(1))
        .map_err(err)?;
    // Every rank allocated before any rank's call waits on it: an allocation waits for the
    // device, which ranks as threads (--threads) share.
    comm.barrier().map_err(err)?;
    let once = || enqueue_once(comm, spec, in_place, &send, &recv, in_bytes, &stream);
    for _ in 0..args.warmup {
        once().map_err(err)?;
    }
    stream.synchronize().map_err(err)?;
    comm.barrier().map_err(err)?;
    let (start, end) = (
        Event::new(true).map_err(err)?,
        Event::new(true).map_err(err)?,
    );
    // Ranks as threads (--threads) share the stand-in's counters: every rank reads them with
    // no rank's calls under way, so each reading holds all the timed calls and nothing else.
    let shared = ranks_in_process(comm) > 1 && strata::gpu::standin_stats().is_some();
    let before = strata::gpu::standin_stats();
    if shared {
        comm.barrier().map_err(err)?;
    }
    start.record(&stream).map_err(err)?;
    for _ in 0..args.iters {
        once().map_err(err)?;
    }
    end.record(&stream).map_err(err)?;
    end.synchronize().map_err(err)?;
    if shared {
        comm.barrier().map_err(err)?;
    }
    let per_call = before
        .zip(strata::gpu::standin_stats())
        .map(|(b, a)| PerCall::of(&a.since(&b), args.iters * ranks_in_process(comm)));
    if shared {
        comm.barrier().map_err(err)?;
    }
    if let Some(e) = comm.async_error() {
        return Err(e.to_string());
    }
    let us = end.elapsed_ms_since(&start).map_err(err)? as f64 * 1e3 / args.iters.max(1) as f64;
    let mut wrong = 0u64;
    if args.check != 0 && spec.collective != Collective::Send {
        wrong = check::run_and_check_device_in(comm, spec, in_place, &stream, &send, &recv)
            .map_err(err)?
            .wrong as u64;
    }
    // Nobody frees (which waits for the device) while a peer's call may still need it.
    stream.synchronize().map_err(err)?;
    comm.barrier().map_err(err)?;
    Ok((us, wrong, per_call))
}
