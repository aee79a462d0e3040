//! Collectives on device buffers, enqueued on CUDA streams (see [`crate::gpu`] for how the
//! stream and the progress thread are ordered).

use super::*;
use crate::gpu::{self, DeviceBuffer, DeviceRange, Memory, Stream};

mod program;
pub(crate) mod queue;

pub use program::{DeviceTransfer, KernelChoice, KernelTiming};
pub use queue::{DeviceWork, Staged};
pub(crate) use queue::{Elementwise, JobKind, StreamQueue};

/// Which data path a communicator's GPU calls take (`STRATA_GPU_PATH`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuPath {
    /// Stream programs when the kernels load and every peer is reachable GPU to GPU (CUDA
    /// IPC on this host, GPUDirect RDMA on others), else host-staged (said once, with the
    /// reason).
    Auto,
    /// Always through pinned host memory.
    Staged,
    /// Stream programs (CUDA IPC, GPUDirect RDMA), or fail at bind (`stream`, or its old
    /// name `ipc`).
    Stream,
}

impl GpuPath {
    /// From `STRATA_GPU_PATH` (`auto`, `staged`, `stream`; `ipc` is the old name of `stream`).
    pub fn from_env() -> Result<Self> {
        match std::env::var("STRATA_GPU_PATH").as_deref().map(str::trim) {
            Err(_) | Ok("") | Ok("auto") => Ok(Self::Auto),
            Ok("staged") => Ok(Self::Staged),
            Ok("stream" | "ipc") => Ok(Self::Stream),
            Ok(other) => Err(Error::InvalidArgument(format!(
                "STRATA_GPU_PATH={other}: expected auto, staged, ipc or stream"
            ))),
        }
    }
}

impl Communicator {
    /// The communicator behind a progress thread's weak reference, while it lives.
    pub(crate) fn upgrade(inner: &std::sync::Weak<Inner>) -> Option<Communicator> {
        inner.upgrade().map(|inner| Communicator { inner })
    }

    /// Makes a failed stream-ordered call the communicator's fault, so that `async_error`
    /// (`ncclCommGetAsyncError`) says why.
    pub(crate) fn record_stream_fault(&self, e: &Error) {
        if !matches!(e, Error::Aborted(_)) || self.async_error().is_none() {
            self.inner.health.record_fault(e);
        }
    }

    /// The progress thread for device buffers on `device`, started on first use. A
    /// communicator drives one GPU, as in NCCL.
    fn gpu_queue(&self, device: i32) -> Result<&StreamQueue> {
        let bound = |q: &StreamQueue| -> Result<()> {
            if q.device() != device {
                return Err(Error::InvalidArgument(format!(
                    "this communicator drives GPU {}, and the buffer is on GPU {device}",
                    q.device()
                )));
            }
            Ok(())
        };
        if let Some(q) = self.inner.gpu.get() {
            return bound(q).map(|_| q);
        }
        // Collective: every rank binds (at init, or at its first call on device buffers). No
        // lock is held meanwhile: the IPC path's set-up runs host collectives, which look at
        // the queue.
        let path = GpuPath::from_env()?;
        let started = StreamQueue::start(Arc::downgrade(&self.inner), device);
        // No rank goes on before every rank has made its pinned and device allocations: an
        // allocation waits for the device, so with ranks as threads of one process a rank
        // that allocated while a peer's call already waited on it would wait for ever. The
        // stream programs' set-up below ends the same way.
        let mut ok = [u8::from(started.is_ok())];
        let min = CallSpec {
            op: ReduceOp::Min,
            ..CallSpec::new(Collective::AllReduce, DataType::Uint8, 1)
        };
        self.call_bytes(min, None, &mut ok)?;
        let started = started?;
        if ok[0] == 0 {
            return Err(Error::Unsupported(
                "another rank could not set up its GPU progress thread".into(),
            ));
        }
        if path != GpuPath::Staged {
            match program::Programs::build(self, device, queue::chunk_bytes())? {
                Ok(programs) => started.set_programs(programs),
                Err(why) if path == GpuPath::Stream => {
                    return Err(Error::Unsupported(format!(
                        "STRATA_GPU_PATH=stream: stream programs are unavailable: {why}"
                    )));
                }
                Err(why) => {
                    if self.rank() == 0 {
                        tracing::info!(
                            "device buffers go through host memory (staged) to every peer: {why}"
                        );
                    }
                }
            }
        }
        // A thread that bound at the same time wins; ours is dropped.
        let q = self.inner.gpu.get_or_init(|| started);
        bound(q).map(|_| q)
    }

    /// Binds the communicator to `device` and makes its GPU resources (progress thread, copy
    /// stream, pinned staging, and on one host the IPC exchange buffers) now, as NCCL does at
    /// init. Collective: every rank calls it (or none). Optional: the first call on device
    /// buffers does it otherwise, but making pinned memory synchronises with every stream, so
    /// bind before a stream waits on work of this communicator.
    pub fn bind_device(&self, device: i32) -> Result<()> {
        let _on = gpu::DeviceGuard::enter(device)?;
        self.gpu_queue(device).map(|_| ())
    }

    /// The GPU of the device buffers among `ptrs` (all must be on one), or an error naming a
    /// host pointer among them.
    fn device_of(ptrs: &[(u64, &str)]) -> Result<i32> {
        gpu::driver()?;
        let mut device = None;
        for &(ptr, what) in ptrs {
            match gpu::memory_of(ptr as *const std::ffi::c_void) {
                Memory::Device(d) if device.is_none_or(|x| x == d) => device = Some(d),
                Memory::Device(d) => {
                    return Err(Error::InvalidArgument(format!(
                        "{what} is on GPU {d}, another buffer of the call on GPU {}",
                        device.unwrap_or(d)
                    )));
                }
                Memory::Host => {
                    return Err(Error::InvalidArgument(format!(
                        "{what} ({ptr:#x}) is host memory; a stream-ordered call takes \
                         device buffers only"
                    )));
                }
            }
        }
        device.ok_or_else(|| Error::InvalidArgument("the call names no device buffer".into()))
    }

    /// The GPU queue for a call on the device buffers `ptrs` (all on the communicator's GPU),
    /// with that GPU's context current on this thread until the guard drops: a call may come
    /// from any thread, with another context current or none (the caller's is restored).
    fn queue_for(&self, ptrs: &[(u64, &str)]) -> Result<(&StreamQueue, gpu::DeviceGuard)> {
        let device = Self::device_of(ptrs)?;
        let on = gpu::DeviceGuard::enter(device)?;
        Ok((self.gpu_queue(device)?, on))
    }

    /// Enqueues `work` on `streams`: it runs on this communicator's progress thread once every
    /// stream has reached this point, on host copies of `ranges` (device ranges read are
    /// copied in first; ranges written are copied back after), and the streams go on only
    /// when those copies are complete. Returns at once. A failure becomes the communicator's
    /// [`async_error`](Communicator::async_error).
    pub fn enqueue_device(
        &self,
        streams: &[&Stream],
        ranges: Vec<DeviceRange>,
        work: DeviceWork,
    ) -> Result<()> {
        if let Some(e) = self.async_error() {
            return Err(e);
        }
        let ptrs: Vec<(u64, &str)> = ranges.iter().map(|r| (r.ptr, "a buffer")).collect();
        let (q, _on) = self.queue_for(&ptrs)?;
        let raw: Vec<_> = streams.iter().map(|s| s.raw()).collect();
        q.enqueue(&raw, JobKind::Staged(ranges, work))
    }

    /// Enqueues all_reduce, broadcast or reduce of `spec` from device address `send` to `recv`
    /// (equal for in place) on `stream`, pipelined in chunks (`STRATA_GPU_CHUNK`).
    pub fn enqueue_elementwise(
        &self,
        spec: CallSpec,
        send: u64,
        recv: u64,
        stream: &Stream,
    ) -> Result<()> {
        if !matches!(
            spec.collective,
            Collective::AllReduce | Collective::Broadcast | Collective::Reduce
        ) {
            return Err(Error::InvalidArgument(format!(
                "{} is not elementwise; use enqueue_device",
                spec.collective
            )));
        }
        if let Some(e) = self.async_error() {
            return Err(e);
        }
        if spec.collective.rooted() && spec.root >= self.size() {
            return Err(Error::InvalidArgument(format!(
                "root {} is out of range for {} ranks",
                spec.root,
                self.size()
            )));
        }
        let is_root = self.rank() == spec.root;
        let reads = spec.collective != Collective::Broadcast || is_root;
        let writes = spec.collective != Collective::Reduce || is_root;
        let mut ptrs = Vec::new();
        if reads {
            ptrs.push((send, "sendbuff"));
        }
        if writes {
            ptrs.push((recv, "recvbuff"));
        }
        if spec.count == 0 || ptrs.is_empty() {
            return Ok(());
        }
        let (q, _on) = self.queue_for(&ptrs)?;
        let job = Elementwise {
            spec,
            send,
            recv,
            reads,
            writes,
        };
        q.enqueue(&[stream.raw()], JobKind::Elementwise(job))
    }

    /// Runs `spec` on device buffers, enqueued on `stream`: returns at once, starts when the
    /// stream's earlier work is done, and the stream's later work sees the result. `send` is
    /// `None` for the in-place form (as in [`call_bytes`](Communicator::call_bytes)). Buffer
    /// sizes are checked against the call now; a failure while it runs becomes the
    /// communicator's [`async_error`](Communicator::async_error). Dropping the communicator
    /// fails the calls still queued (their streams are released); call
    /// [`wait_device_idle`](Communicator::wait_device_idle) first to let them finish.
    pub fn call_device(
        &self,
        spec: CallSpec,
        send: Option<&DeviceBuffer>,
        recv: &DeviceBuffer,
        stream: &Stream,
    ) -> Result<()> {
        let (ib, ob) = self.call_sizes(&spec)?;
        let (in_off, out_off) = spec.in_place_offsets(self.rank());
        match send {
            Some(s) => {
                need(s.len(), ib, "sendbuff")?;
                need(recv.len(), ob, "recvbuff")?;
                self.enqueue_call(spec, s.ptr(), recv.ptr(), stream)
            }
            None => {
                let whole = (in_off + ib).max(out_off + ob);
                need(recv.len(), whole, "the in-place buffer")?;
                let base = recv.ptr();
                self.enqueue_call(spec, base + in_off as u64, base + out_off as u64, stream)
            }
        }
    }

    /// Bytes this rank reads and writes for `spec`, after checking the call's shape.
    fn call_sizes(&self, spec: &CallSpec) -> Result<(usize, usize)> {
        let (rank, p) = (self.rank(), self.size());
        if matches!(spec.collective, Collective::Send | Collective::Recv) {
            return Err(Error::InvalidArgument(
                "use enqueue_device for point-to-point transfers".into(),
            ));
        }
        if spec.collective.rooted() && spec.root >= p {
            return Err(Error::InvalidArgument(format!(
                "root {} is out of range for {p} ranks",
                spec.root
            )));
        }
        let es = spec.dtype.size();
        let (ie, oe) = spec.collective.buffer_elems(spec.count, p, rank, spec.root);
        Ok((ie * es, oe * es))
    }

    /// Enqueues `spec` from device address `send` to `recv` on `stream`, with NCCL's buffer
    /// rules (in place when `send` sits at the in-place position of `recv`). Through CUDA IPC
    /// and the GPU kernels when the communicator has that path, else through host memory.
    /// The caller vouches that the buffers hold what the call reads and writes.
    pub fn enqueue_call(
        &self,
        spec: CallSpec,
        send: u64,
        recv: u64,
        stream: &Stream,
    ) -> Result<()> {
        let (ib, ob) = self.call_sizes(&spec)?;
        if let Some(e) = self.async_error() {
            return Err(e);
        }
        if ib + ob > 0 {
            let ptrs: Vec<(u64, &str)> = [(send, "sendbuff", ib), (recv, "recvbuff", ob)]
                .into_iter()
                .filter(|b| b.2 > 0)
                .map(|(ptr, what, _)| (ptr, what))
                .collect();
            let (q, _on) = self.queue_for(&ptrs)?;
            if let Some(programs) = q.programs() {
                return programs
                    .enqueue(self, spec, send, recv, ib, stream)
                    .map(|_| ());
            }
        }
        if matches!(
            spec.collective,
            Collective::AllReduce | Collective::Broadcast | Collective::Reduce
        ) {
            return self.enqueue_elementwise(spec, send, recv, stream);
        }
        if let Some(e) = self.async_error() {
            return Err(e);
        }
        let (in_off, out_off) = spec.in_place_offsets(self.rank());
        let in_place = ib > 0
            && ob > 0
            && send.wrapping_sub(in_off as u64) == recv.wrapping_sub(out_off as u64);
        let base = recv.wrapping_sub(out_off as u64);
        let whole = (in_off + ib).max(out_off + ob);
        let mut ranges = if in_place {
            vec![DeviceRange {
                ptr: base,
                len: whole,
                read: true,
                write: true,
            }]
        } else {
            vec![
                DeviceRange {
                    ptr: send,
                    len: ib,
                    read: true,
                    write: false,
                },
                DeviceRange {
                    ptr: recv,
                    len: ob,
                    read: false,
                    write: true,
                },
            ]
        };
        ranges.retain(|r| r.len > 0);
        if ranges.is_empty() {
            return Ok(());
        }
        let work: DeviceWork = Box::new(move |comm, staged| {
            let host = |ptr: u64, len: usize| -> Result<&mut [u8]> {
                if len == 0 {
                    return Ok(&mut []);
                }
                let h = staged.host(ptr).ok_or_else(|| {
                    Error::Transport(format!("internal: {ptr:#x} was not staged"))
                })?;
                // SAFETY: the staged copy of a range of at least `len` bytes, alive for the
                // call and used by it alone.
                Ok(unsafe { std::slice::from_raw_parts_mut(h, len) })
            };
            if in_place {
                comm.call_bytes(spec, None, host(base, whole)?)
            } else {
                let input = host(send, ib)?;
                comm.call_bytes(spec, Some(input), host(recv, ob)?)
            }
        });
        let ptrs: Vec<(u64, &str)> = ranges.iter().map(|r| (r.ptr, "a buffer")).collect();
        let (q, _on) = self.queue_for(&ptrs)?;
        q.enqueue(&[stream.raw()], JobKind::Staged(ranges, work))
    }

    /// Enqueues point-to-point transfers on device memory on `stream` as one batch (a group's
    /// sends and receives, all of which may progress at once; a rank may send to itself), GPU
    /// to GPU in a stream program, and returns at once. Each transfer must meet one of the
    /// same size from its peer, in the same order. `Unsupported` when the communicator has no
    /// stream programs (not every rank on one host): [`Communicator::enqueue_device`] stages
    /// through host memory instead.
    pub fn enqueue_transfers(&self, transfers: &[DeviceTransfer], stream: &Stream) -> Result<()> {
        if let Some(e) = self.async_error() {
            return Err(e);
        }
        if let Some(t) = transfers.iter().find(|t| t.peer >= self.size()) {
            return Err(Error::InvalidArgument(format!(
                "peer {} is out of range for {} ranks",
                t.peer,
                self.size()
            )));
        }
        let ptrs: Vec<(u64, &str)> = transfers
            .iter()
            .filter(|t| t.bytes > 0)
            .map(|t| {
                (
                    t.ptr,
                    if t.send {
                        "a send buffer"
                    } else {
                        "a receive buffer"
                    },
                )
            })
            .collect();
        if ptrs.is_empty() {
            return Ok(());
        }
        let (q, _on) = self.queue_for(&ptrs)?;
        match q.programs() {
            Some(programs) => programs.enqueue_transfers(self, transfers, stream),
            None => Err(Error::Unsupported(
                "point-to-point transfers in a stream program need every peer reachable GPU \
                 to GPU (CUDA IPC or GPUDirect RDMA) and the kernels; stage them with \
                 enqueue_device"
                    .into(),
            )),
        }
    }

    /// The GPU this communicator is bound to, if it is (`bind_device`, or its first call on
    /// device buffers).
    pub fn bound_device(&self) -> Option<i32> {
        self.inner.gpu.get().map(|q| q.device())
    }

    /// The kernel that runs `spec` on device buffers here (`ll_one_shot`, `ll_two_shot`, or
    /// `ll` for the other collectives), or `None` where it runs as the stream program of the
    /// tuner's algorithm (or host-staged, or before binding).
    pub fn device_kernel_for(&self, spec: &CallSpec) -> Option<&'static str> {
        self.inner.gpu.get()?.programs()?.kernel_name(self, spec)
    }

    /// Where this communicator's calls on device buffers go to one low-latency kernel, as
    /// every rank agreed at bind (measured, or set by `STRATA_GPU_KERNEL`); `None` without
    /// the kernel path (not bound, host-staged, ranks on other hosts, or off).
    pub fn kernel_choice(&self) -> Option<KernelChoice> {
        self.inner.gpu.get()?.programs()?.kernel_choice().cloned()
    }

    /// Whether this communicator's collectives on device buffers go GPU to GPU (CUDA IPC on
    /// this host, GPUDirect RDMA to others) as stream programs compiled from their schedules,
    /// rather than through host memory.
    pub fn uses_gpu_ipc(&self) -> bool {
        self.inner.gpu.get().is_some_and(|q| q.programs().is_some())
    }

    /// How device data reaches `peer` once the communicator is bound to a GPU, in stream
    /// programs: `direct` (a rank of this process: its memory as it is), `ipc` (GPU to GPU
    /// through CUDA IPC, on this host) or `gdr` (GPUDirect RDMA,
    /// the NIC reading and writing GPU memory, to another host); else `staged` (through
    /// pinned host memory and the host transports). `None` for this rank itself, a rank out
    /// of range, or before binding.
    pub fn device_path_to(&self, peer: usize) -> Option<&'static str> {
        let q = self.inner.gpu.get()?;
        if peer >= self.size() || peer == self.rank() {
            return None;
        }
        Some(q.programs().map_or("staged", |p| p.path_to(peer)))
    }

    /// Before a call from any thread but the progress thread: waits for the stream-ordered
    /// calls enqueued so far, so that every rank runs its calls in the order it made them.
    /// Costs one load on a communicator that never used device buffers.
    pub(super) fn wait_for_stream_calls(&self) -> Result<()> {
        match self.inner.gpu.get() {
            Some(q) if !q.is_progress_thread() => q.wait_idle(self.timeout()),
            _ => Ok(()),
        }
    }

    /// Waits until every stream-ordered call enqueued so far has run, or `limit` passes.
    pub fn wait_device_idle(&self, limit: Duration) -> Result<()> {
        self.inner.gpu.get().map_or(Ok(()), |q| q.wait_idle(limit))
    }
}
