//! Setting the stream programs up at bind: every rank's program buffer mapped by the ranks of
//! its host (CUDA IPC), and registered and connected for the ranks of other hosts (GPUDirect
//! RDMA, `net.rs`); the ranks agree on the outcome, so they never disagree on a call's path.

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
        let layout = Layout { p, slots };
        const HANDLE: usize = 64;
        type Local = (
            Kernels,
            DeviceBuffer,
            [u8; HANDLE],
            ProgramState,
            Option<net::Pending>,
        );
        let local = (|| -> Result<Local> {
            let kernels = Kernels::load(device)?;
            let own = DeviceBuffer::alloc(device, layout.bytes())?;
            // SAFETY: the flag area of a fresh allocation of at least that many bytes.
            call("cuMemsetD8", || unsafe {
                sys::cuMemsetD8_v2(own.ptr(), 0, layout.rings() as usize)
            })?;
            // Stream memory operations carry the whole protocol: a driver without them (or
            // with them switched off) cannot run it.
            let probe = Stream::new(device)?;
            wait_value(probe.raw(), own.ptr(), 0)
                .and_then(|_| write_value(probe.raw(), own.ptr(), 0))
                .and_then(|_| probe.synchronize())
                .map_err(|e| Error::Unsupported(format!("no stream memory operations ({e})")))?;
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
            };
            Ok((kernels, own, bytes, state, pending))
        })();
        let mut mine = vec![0u8; HANDLE + 1];
        if let Ok((_, _, h, _, _)) = &local {
            mine[..HANDLE].copy_from_slice(h);
            mine[HANDLE] = 1;
        }
        let mut all = vec![0u8; (HANDLE + 1) * p];
        let spec = CallSpec::new(Collective::AllGather, DataType::Uint8, HANDLE + 1);
        comm.call_bytes(spec, Some(&mine), &mut all)?;
        let (kernels, own, _, state, pending) = match local {
            Ok(l) if all.chunks(HANDLE + 1).all(|c| c[HANDLE] == 1) => l,
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
        for (q, c) in all.chunks(HANDLE + 1).enumerate() {
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
        let watch = Watch::new(
            comm.inner.health.clone(),
            bases.clone(),
            rank,
            layout,
            device,
            net.as_ref().map(|n| (n.words.clone(), n.busy.clone())),
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
            (1, _) => Ok(Ok(built)),
            (_, why) => Ok(Err(
                why.unwrap_or_else(|| "another rank could not map it".into())
            )),
        }
    }
}
