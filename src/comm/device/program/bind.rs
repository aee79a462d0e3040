//! Setting the stream programs up at bind: every rank's program buffer mapped by the ranks of
//! its host (CUDA IPC; ranks of one process use each other's buffers directly, as NCCL's
//! threads of one process do), and registered and connected for the ranks of other hosts
//! (GPUDirect RDMA, `net.rs`); the ranks agree on the outcome, so they never disagree on a
//! call's path. Last, the kernels' crossover is measured and agreed (`kernel.rs`).

use super::*;

impl Programs {
    /// Sets the path up on every rank (a collective over the host transports, at bind), or
    /// says why it cannot be: `Ok(None)` with the reason when another rank could not.
    pub(crate) fn build(
        comm: &Communicator,
        device: i32,
        chunk: usize,
    ) -> Result<std::result::Result<Self, String>> {
        let (p, rank) = (comm.size(), comm.rank());
        let me = &comm.peers()[rank];
        let remote: Vec<bool> = comm
            .peers()
            .iter()
            .map(|h| !me.host.same_host(&h.host))
            .collect();
        let remote_ranks: Vec<usize> = (0..p).filter(|&q| remote[q]).collect();
        let slots = Slots::from_env(chunk)?;
        // The kernels serve the ranks of one host only.
        let ll_stride = if remote_ranks.is_empty() {
            kernel::area_bytes(p)?
        } else {
            0
        };
        let layout = Layout {
            p,
            slots,
            ll_stride,
        };
        const HANDLE: usize = 64;
        // Each rank's record: its IPC handle, the buffer's address in its process, its GPU,
        // and whether it is set up (the last byte).
        const RECORD: usize = HANDLE + 8 + 4 + 1;
        type Local = (
            Kernels,
            DeviceBuffer,
            [u8; HANDLE],
            ProgramState,
            Option<net::Pending>,
            bool,
        );
        let local = (|| -> Result<Local> {
            let kernels = Kernels::load(device)?;
            let own = DeviceBuffer::alloc(device, layout.bytes())?;
            // SAFETY: the flag area of a fresh allocation of at least that many bytes.
            call("cuMemsetD8", || unsafe {
                sys::cuMemsetD8_v2(own.ptr(), 0, layout.rings() as usize)
            })?;
            if layout.ll_stride > 0 {
                // Fresh device memory holds anything, a line with a valid call number included.
                let ll = layout.ll();
                // SAFETY: the low-latency areas, inside the allocation.
                call("cuMemsetD8", || unsafe {
                    sys::cuMemsetD8_v2(own.ptr() + ll, 0, layout.bytes() - ll as usize)
                })?;
            }
            // Stream memory operations carry the whole protocol: a driver without them (or
            // with them switched off) cannot run it.
            let probe = Stream::new(device)?;
            wait_value(probe.raw(), own.ptr(), 0)
                .and_then(|_| write_value(probe.raw(), own.ptr(), 0))
                .and_then(|_| probe.synchronize())
                .map_err(|e| Error::Unsupported(format!("no stream memory operations ({e})")))?;
            // Batches of them, where the driver has those (each sync is then one command);
            // STRATA_GPU_MEMOP_BATCH=0 enqueues them one by one.
            let wanted = std::env::var("STRATA_GPU_MEMOP_BATCH").map_or(true, |v| v.trim() != "0");
            let mut both = MemOps::new(true);
            both.wait(own.ptr(), 0);
            both.write(own.ptr(), 0);
            let batch = wanted
                && both
                    .flush(probe.raw())
                    .and_then(|_| probe.synchronize())
                    .is_ok();
            let mut h = sys::CUipcMemHandle { reserved: [0; 64] };
            // SAFETY: the start of an allocation; a valid out-pointer.
            call("cuIpcGetMemHandle", || unsafe {
                sys::cuIpcGetMemHandle(&mut h, own.ptr())
            })?;
            let mut bytes = [0u8; HANDLE];
            for (b, c) in bytes.iter_mut().zip(h.reserved) {
                *b = c as u8;
            }
            let pending = if remote_ranks.is_empty() {
                None
            } else {
                Some(
                    net::Net::prepare(comm, &own, layout, &remote_ranks).map_err(|e| {
                        Error::Unsupported(format!("no GPUDirect RDMA to the other hosts: {e}"))
                    })?,
                )
            };
            let state = ProgramState {
                sent: vec![0; p],
                received: vec![0; p],
                cache: HashMap::new(),
                lanes: Vec::new(),
                fork: Event::new(false)?,
                joins: Vec::new(),
                last: Event::new(false)?,
                kernel_calls: 0,
            };
            Ok((kernels, own, bytes, state, pending, batch))
        })();
        let mut mine = vec![0u8; RECORD];
        if let Ok((_, own, h, _, _, _)) = &local {
            mine[..HANDLE].copy_from_slice(h);
            mine[HANDLE..HANDLE + 8].copy_from_slice(&own.ptr().to_le_bytes());
            mine[HANDLE + 8..HANDLE + 12].copy_from_slice(&device.to_le_bytes());
            mine[RECORD - 1] = 1;
        }
        let mut all = vec![0u8; RECORD * p];
        let spec = CallSpec::new(Collective::AllGather, DataType::Uint8, RECORD);
        comm.call_bytes(spec, Some(&mine), &mut all)?;
        let (kernels, own, _, state, pending, batch) = match local {
            Ok(l) if all.chunks(RECORD).all(|c| c[RECORD - 1] == 1) => l,
            Ok(_) => return Ok(Err("another rank could not set it up".into())),
            Err(e) => {
                // Every rank that cannot says why (rank 0 speaks for the others).
                if rank != 0 {
                    tracing::info!("rank {rank}: no stream programs on device buffers: {e}");
                }
                return Ok(Err(e.to_string()));
            }
        };
        // Every rank prepared: connect the queue pairs to the other hosts.
        let mut failure = None;
        let net = match pending.map(|p| p.finish(comm, layout, comm.inner.health.clone())) {
            Some(Ok(n)) => Some(n),
            Some(Err(e)) => {
                failure = Some(format!("GPUDirect RDMA to the other hosts: {e}"));
                None
            }
            None => None,
        };
        let mut bases = vec![0u64; p];
        let mut opened = Vec::new();
        for (q, c) in all.chunks(RECORD).enumerate() {
            if failure.is_some() {
                break;
            }
            if q == rank {
                bases[q] = own.ptr();
                continue;
            }
            if remote[q] {
                continue;
            }
            if comm.peers()[q].process == me.process {
                // A rank of this process: its buffer is addressable as it is (its GPU's
                // memory once peer access is on); CUDA IPC refuses a process its own handle.
                let ptr = u64::from_le_bytes(c[HANDLE..HANDLE + 8].try_into().unwrap_or_default());
                let theirs =
                    i32::from_le_bytes(c[HANDLE + 8..HANDLE + 12].try_into().unwrap_or_default());
                match crate::gpu::driver::enable_peer_access(device, theirs) {
                    Ok(()) => bases[q] = ptr,
                    Err(e) => {
                        failure = Some(format!("reaching rank {q}'s GPU {theirs}: {e}"));
                        break;
                    }
                }
                continue;
            }
            let mut h = sys::CUipcMemHandle { reserved: [0; 64] };
            for (d, s) in h.reserved.iter_mut().zip(&c[..HANDLE]) {
                *d = *s as _;
            }
            let mut ptr = 0u64;
            let lazy = sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32;
            // SAFETY: a handle another rank exported; a valid out-pointer.
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
        let ll = match failure {
            None => match kernel::Ll::new(&layout, &bases, device, &kernels) {
                Ok(ll) => ll,
                Err(e) => {
                    failure = Some(format!("the kernels' tables: {e}"));
                    None
                }
            },
            Some(_) => None,
        };
        let watch = Watch::new(
            comm.inner.health.clone(),
            bases.clone(),
            rank,
            layout,
            device,
            net.as_ref().map(|n| (n.words.clone(), n.busy.clone())),
            ll.as_ref().map(|l| l.abort_word()),
        );
        let mut built = Self {
            device,
            kernels,
            layout,
            own,
            bases,
            opened,
            remote,
            net,
            rank,
            state: Mutex::new(state),
            ll,
            batch,
            watch,
            monitor: Mutex::new(None),
        };
        if failure.is_none() {
            match built.watch.start() {
                Ok(m) => built.monitor = Mutex::new(Some(m)),
                Err(e) => failure = Some(e.to_string()),
            }
        }
        let mut ok = [u8::from(failure.is_none())];
        let min = CallSpec {
            op: ReduceOp::Min,
            ..CallSpec::new(Collective::AllReduce, DataType::Uint8, 1)
        };
        comm.call_bytes(min, None, &mut ok)?;
        match (ok[0], failure) {
            (1, _) => {
                built.choose_kernels(comm)?;
                Ok(Ok(built))
            }
            (_, why) => Ok(Err(
                why.unwrap_or_else(|| "another rank could not map it".into())
            )),
        }
    }
}
