//! GPU to GPU inside a host: collectives through CUDA IPC, with the reductions in GPU
//! kernels, so the data never crosses host memory.
//!
//! Each rank owns an exchange buffer of two halves, IN and OUT, of one chunk each, and maps
//! every peer's through `cuIpcOpenMemHandle` (handles travel by a host all-gather at bind).
//! Per chunk: each rank copies (or, for PreMulSum, scales) its input into its IN; barrier;
//! rank r reduces segment r of every peer's IN into its OUT with the combine kernels (and
//! divides for avg); barrier; every rank copies every segment from its owner's OUT into its
//! output. The barriers run over strata's host transports; the copies and kernels run on the
//! progress thread's copy stream. The other collectives stage the blocks each rank
//! contributes into its IN and read them from the peers' INs after a barrier (reducing with
//! the kernels for reduce and reduce-scatter). Peers read a rank's buffers only between two
//! barriers that the rank also crosses, so no buffer is overwritten while a peer reads it.

use crate::comm::{CallSpec, Communicator};
use crate::dtype::{DataType, ReduceOp};
use crate::error::{Error, Result};
use crate::gpu::DeviceBuffer;
use crate::gpu::driver::call;
use crate::gpu::kernels::Kernels;
use crate::gpu::stream::Stream;
use cudarc::driver::sys;
use strata_algorithms::Collective;

/// Which data path a communicator's GPU calls take (`STRATA_GPU_PATH`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuPath {
    /// IPC when every rank is on one host and the kernels load, else staged.
    Auto,
    /// Always through pinned host memory.
    Staged,
    /// IPC, or fail at bind.
    Ipc,
    /// Stream programs compiled from the schedules (every rank on one host), or fail at
    /// bind.
    Stream,
}

impl GpuPath {
    /// From `STRATA_GPU_PATH` (`auto`, `staged`, `ipc`, `stream`).
    pub fn from_env() -> Result<Self> {
        match std::env::var("STRATA_GPU_PATH").as_deref().map(str::trim) {
            Err(_) | Ok("") | Ok("auto") => Ok(Self::Auto),
            Ok("staged") => Ok(Self::Staged),
            Ok("ipc") => Ok(Self::Ipc),
            Ok("stream") => Ok(Self::Stream),
            Ok(other) => Err(Error::InvalidArgument(format!(
                "STRATA_GPU_PATH={other}: expected auto, staged, ipc or stream"
            ))),
        }
    }
}

/// The exchange buffers of every rank of a one-host communicator, and the kernels.
pub(crate) struct IpcPath {
    kernels: Kernels,
    _own: DeviceBuffer,
    /// Each rank's exchange buffer as this process addresses it (its own at `rank`).
    bases: Vec<u64>,
    /// Bytes of each half.
    half: usize,
    /// Peers' mappings, closed on drop.
    opened: Vec<u64>,
    device: i32,
}

// SAFETY: device addresses and handles; used by the progress thread alone after bind.
unsafe impl Send for IpcPath {}
// SAFETY: as above.
unsafe impl Sync for IpcPath {}

const HANDLE: usize = 64;

impl IpcPath {
    /// Builds the path on every rank, or on none (collective: every rank calls it at bind).
    /// `Ok(None)` when the ranks agree it is unavailable and the path is `Auto`.
    pub(crate) fn build(
        comm: &Communicator,
        device: i32,
        half: usize,
        path: GpuPath,
    ) -> Result<Option<Self>> {
        if matches!(path, GpuPath::Staged | GpuPath::Stream) || comm.size() < 2 {
            return Ok(None);
        }
        let host = &comm.peers()[comm.rank()].host;
        let one_host = comm.peers().iter().all(|p| &p.host == host);
        if !one_host {
            return match path {
                GpuPath::Ipc => Err(Error::Unsupported(
                    "STRATA_GPU_PATH=ipc needs every rank on one host".into(),
                )),
                _ => Ok(None),
            };
        }
        // Local half: kernels, buffer and handle; the verdict travels with the handle.
        let local = (|| -> Result<(Kernels, DeviceBuffer, [u8; HANDLE])> {
            let kernels = Kernels::load(device)?;
            let own = DeviceBuffer::alloc(device, 2 * half)?;
            let mut h = sys::CUipcMemHandle { reserved: [0; 64] };
            // SAFETY: the start of an allocation; valid out-pointer.
            call("cuIpcGetMemHandle", || unsafe {
                sys::cuIpcGetMemHandle(&mut h, own.ptr())
            })?;
            let mut bytes = [0u8; HANDLE];
            for (b, c) in bytes.iter_mut().zip(h.reserved) {
                *b = c as u8;
            }
            Ok((kernels, own, bytes))
        })();
        let mut mine = vec![0u8; HANDLE + 1];
        if let Ok((_, _, h)) = &local {
            mine[..HANDLE].copy_from_slice(h);
            mine[HANDLE] = 1;
        }
        let p = comm.size();
        let mut all = vec![0u8; (HANDLE + 1) * p];
        let spec = CallSpec::new(Collective::AllGather, DataType::Uint8, HANDLE + 1);
        comm.call_bytes(spec, Some(&mine), &mut all)?;
        let everyone = all.chunks(HANDLE + 1).all(|c| c[HANDLE] == 1);
        let (kernels, own, _) = match local {
            Ok(l) if everyone => l,
            Ok(_) => return Self::unavailable(path, "another rank could not set it up".into()),
            Err(e) => return Self::unavailable(path, e.to_string()),
        };
        // Map the peers' buffers; then agree again, since opening can fail too.
        let mut bases = vec![0u64; p];
        let mut opened = Vec::new();
        let mut failure = None;
        for (q, c) in all.chunks(HANDLE + 1).enumerate() {
            if q == comm.rank() {
                bases[q] = own.ptr();
                continue;
            }
            let mut h = sys::CUipcMemHandle { reserved: [0; 64] };
            for (d, s) in h.reserved.iter_mut().zip(&c[..HANDLE]) {
                *d = *s as _;
            }
            let mut ptr = 0u64;
            let lazy = sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32;
            // SAFETY: a handle another rank exported; valid out-pointer.
            match call("cuIpcOpenMemHandle", || unsafe {
                sys::cuIpcOpenMemHandle_v2(&mut ptr, h, lazy)
            }) {
                Ok(()) => {
                    bases[q] = ptr;
                    opened.push(ptr);
                }
                Err(e) => {
                    failure = Some(format!("opening rank {q}'s buffer: {e}"));
                    break;
                }
            }
        }
        let built = Self {
            kernels,
            _own: own,
            bases,
            half,
            opened,
            device,
        };
        let mut ok = [u8::from(failure.is_none())];
        let min = CallSpec {
            op: ReduceOp::Min,
            ..CallSpec::new(Collective::AllReduce, DataType::Uint8, 1)
        };
        comm.call_bytes(min, None, &mut ok)?;
        match (ok[0], failure) {
            (1, _) => Ok(Some(built)),
            (_, why) => {
                drop(built);
                Self::unavailable(path, why.unwrap_or("another rank could not map it".into()))
            }
        }
    }

    fn unavailable(path: GpuPath, why: String) -> Result<Option<Self>> {
        match path {
            GpuPath::Ipc => Err(Error::Unsupported(format!(
                "the IPC path is unavailable: {why}"
            ))),
            _ => {
                tracing::info!("GPU all-reduce stays host-staged: {why}");
                Ok(None)
            }
        }
    }

    /// Runs `spec` from device address `send` to `recv` (NCCL's in-place layout allowed).
    pub(crate) fn run(
        &self,
        comm: &Communicator,
        spec: CallSpec,
        send: u64,
        recv: u64,
        copy: &Stream,
    ) -> Result<()> {
        match spec.collective {
            Collective::AllReduce => self.all_reduce(comm, spec, send, recv, copy),
            _ => self.exchange(comm, spec, send, recv, copy),
        }
    }

    /// Rank `q`'s IN half, as this process addresses it.
    fn inn(&self, q: usize) -> u64 {
        self.bases[q]
    }

    /// Rank `q`'s OUT half.
    fn out(&self, q: usize) -> u64 {
        self.bases[q] + self.half as u64
    }

    /// Enqueues a device-to-device copy of `bytes` (none for 0) on `s`.
    fn copy(&self, dst: u64, src: u64, bytes: usize, s: sys::CUstream) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        // SAFETY: device ranges of the call and of the exchange buffers.
        call("cuMemcpyDtoDAsync", || unsafe {
            sys::cuMemcpyDtoDAsync_v2(dst, src, bytes, s)
        })
    }

    /// Enqueues the staging of `n` input elements into `dst`: a copy, or for PreMulSum of a
    /// reducing collective the scale by this rank's scalar.
    fn stage(&self, spec: &CallSpec, dst: u64, src: u64, n: usize, s: sys::CUstream) -> Result<()> {
        match &spec.op {
            ReduceOp::PreMulSum(scalar) if spec.collective.reduces() => {
                self.kernels.scale(scalar, dst, src, n, s)
            }
            _ => self.copy(dst, src, n * spec.dtype.size(), s),
        }
    }

    /// Enqueues `dst` = the reduction of `src(q)` over the `p` ranks, `n` elements (then the
    /// divide, for avg).
    fn reduce_over(
        &self,
        spec: &CallSpec,
        p: usize,
        dst: u64,
        src: &dyn Fn(usize) -> u64,
        n: usize,
        s: sys::CUstream,
    ) -> Result<()> {
        if p == 1 {
            return self.copy(dst, src(0), n * spec.dtype.size(), s);
        }
        let combine = crate::reduce::combine_of(spec.op);
        self.kernels
            .combine(spec.dtype, combine, dst, src(0), src(1), n, s)?;
        for q in 2..p {
            self.kernels
                .combine(spec.dtype, combine, dst, dst, src(q), n, s)?;
        }
        if spec.op == ReduceOp::Avg {
            self.kernels.divide(spec.dtype, dst, p, n, s)?;
        }
        Ok(())
    }

    /// Every collective but all-reduce, chunk by chunk: each rank stages the blocks it
    /// contributes into its IN (scaled for PreMulSum); barrier; each rank reads what it needs
    /// from its peers' INs into its output (reducing with the kernels where the collective
    /// reduces); barrier.
    fn exchange(
        &self,
        comm: &Communicator,
        spec: CallSpec,
        send: u64,
        recv: u64,
        copy: &Stream,
    ) -> Result<()> {
        use Collective::*;
        let (rank, p) = (comm.rank(), comm.size());
        let (es, count, root) = (spec.dtype.size(), spec.count, spec.root);
        let s = copy.raw();
        let is_root = rank == root;
        // Blocks of `count` this rank stages, and the most any rank stages.
        let (blocks, most) = match spec.collective {
            ReduceScatter | AllToAll => (p, p),
            Scatter => (if is_root { p } else { 0 }, p),
            Broadcast => (usize::from(is_root), 1),
            _ => (1, 1),
        };
        let chunk = (self.half / (es * most)).max(1);
        let at = |base: u64, i: usize| base + (i * es) as u64;
        let mut first = 0;
        while first < count {
            let n = chunk.min(count - first);
            for b in 0..blocks {
                self.stage(
                    &spec,
                    at(self.inn(rank), b * n),
                    at(send, b * count + first),
                    n,
                    s,
                )?;
            }
            copy.synchronize()?;
            comm.barrier()?;
            let block = |q: usize, b: usize| at(self.inn(q), b * n);
            match spec.collective {
                AllGather => {
                    for q in 0..p {
                        self.copy(at(recv, q * count + first), block(q, 0), n * es, s)?;
                    }
                }
                AllToAll => {
                    for q in 0..p {
                        self.copy(at(recv, q * count + first), block(q, rank), n * es, s)?;
                    }
                }
                Gather if is_root => {
                    for q in 0..p {
                        self.copy(at(recv, q * count + first), block(q, 0), n * es, s)?;
                    }
                }
                Scatter => self.copy(at(recv, first), block(root, rank), n * es, s)?,
                Broadcast => self.copy(at(recv, first), block(root, 0), n * es, s)?,
                ReduceScatter => {
                    self.reduce_over(&spec, p, at(recv, first), &|q| block(q, rank), n, s)?
                }
                Reduce if is_root => {
                    self.reduce_over(&spec, p, at(recv, first), &|q| block(q, 0), n, s)?
                }
                _ => {}
            }
            copy.synchronize()?;
            comm.barrier()?;
            first += n;
        }
        Ok(())
    }

    /// All-reduce of `spec` from device address `send` to `recv` (equal in place).
    fn all_reduce(
        &self,
        comm: &Communicator,
        spec: CallSpec,
        send: u64,
        recv: u64,
        copy: &Stream,
    ) -> Result<()> {
        let (rank, p) = (comm.rank(), comm.size());
        let es = spec.dtype.size();
        let chunk = (self.half / es).max(1);
        let s = copy.raw();
        let segment = |q: usize, n: usize| (q * n / p, (q + 1) * n / p);
        let at = |base: u64, i: usize| base + (i * es) as u64;
        let mut first = 0;
        while first < spec.count {
            let n = chunk.min(spec.count - first);
            self.stage(&spec, self.inn(rank), at(send, first), n, s)?;
            copy.synchronize()?;
            comm.barrier()?;
            let (lo, hi) = segment(rank, n);
            if hi > lo {
                let dst = at(self.out(rank), lo);
                self.reduce_over(&spec, p, dst, &|q| at(self.inn(q), lo), hi - lo, s)?;
            }
            copy.synchronize()?;
            comm.barrier()?;
            for q in 0..p {
                let (lo, hi) = segment(q, n);
                self.copy(at(recv, first + lo), at(self.out(q), lo), (hi - lo) * es, s)?;
            }
            copy.synchronize()?;
            first += n;
        }
        // No rank leaves (and may free or reuse its buffers) while a peer still reads them.
        comm.barrier()
    }
}

impl Drop for IpcPath {
    fn drop(&mut self) {
        let _ = crate::gpu::driver::set_device(self.device);
        for &ptr in &self.opened {
            // SAFETY: mappings made by cuIpcOpenMemHandle.
            let _ = call("cuIpcCloseMemHandle", || unsafe {
                sys::cuIpcCloseMemHandle(ptr)
            });
        }
    }
}
