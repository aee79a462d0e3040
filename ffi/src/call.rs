//! One queued NCCL call, and running a group of them on a communicator.

use crate::device;
use crate::handle::UserOp;
use std::sync::Arc;
use strata::gpu::{DeviceRange, Stream};
use strata::{CallSpec, Collective, Communicator, DataType, Error, ReduceOp, Scalar, Transfer};

/// A collective call as the C caller made it.
pub(crate) struct Coll {
    /// Collective, type, count (NCCL's meaning), operator (built-in) and root.
    pub spec: CallSpec,
    /// A `ncclRedOpCreatePreMulSum` operator: its index in the communicator's table.
    pub user_op: Option<usize>,
    /// `sendbuff` (may be NULL where this rank reads no input).
    pub send: *const u8,
    /// `recvbuff` (may be NULL where this rank writes no output).
    pub recv: *mut u8,
    /// The stream, when a buffer is GPU memory (the call is then stream-ordered).
    pub stream: Option<usize>,
}

/// One call queued in a group or for a non-blocking communicator.
pub(crate) enum Call {
    /// A collective.
    Coll(Coll),
    /// `ncclSend` (`send`) or `ncclRecv`.
    P2p {
        /// Whether this is a send.
        send: bool,
        /// The other rank.
        peer: usize,
        /// Element type.
        dtype: DataType,
        /// Elements.
        count: usize,
        /// The buffer.
        ptr: *mut u8,
        /// The stream, when the buffer is GPU memory.
        stream: Option<usize>,
    },
}

impl Call {
    /// The stream of a stream-ordered call (one on GPU memory).
    pub(crate) fn stream(&self) -> Option<usize> {
        match self {
            Call::Coll(c) => c.stream,
            Call::P2p { stream, .. } => *stream,
        }
    }
}

// SAFETY: the pointers are the caller's buffers, which NCCL's contract keeps valid until the
// operation completes; a queued call is run by exactly one thread.
unsafe impl Send for Call {}

/// Bytes of input and output `spec` needs on `rank` of `p`, or why the shape is impossible.
pub(crate) fn buffer_bytes(
    spec: &CallSpec,
    rank: usize,
    p: usize,
) -> Result<(usize, usize), String> {
    if spec.collective.rooted() && spec.root >= p {
        return Err(format!("root {} is out of range for {p} ranks", spec.root));
    }
    let es = spec.dtype.size();
    if spec
        .count
        .checked_mul(p)
        .and_then(|n| n.checked_mul(es))
        .is_none_or(|n| n > isize::MAX as usize)
    {
        return Err(format!(
            "count {} of {} overflows for {p} ranks",
            spec.count, spec.dtype
        ));
    }
    let (i, o) = spec.collective.buffer_elems(spec.count, p, rank, spec.root);
    Ok((i * es, o * es))
}

/// The checks of a collective that need this rank's place: root in range, no overflow, no
/// NULL buffer that the call must read or write. Returns the bytes it reads and writes.
pub(crate) fn check_coll(c: &Coll, rank: usize, p: usize) -> Result<(usize, usize), String> {
    let (ib, ob) = buffer_bytes(&c.spec, rank, p)?;
    if ib > 0 && c.send.is_null() {
        return Err(format!(
            "sendbuff is NULL but {} on rank {rank} reads {ib} bytes from it",
            c.spec.collective
        ));
    }
    if ob > 0 && c.recv.is_null() {
        return Err(format!(
            "recvbuff is NULL but {} on rank {rank} writes {ob} bytes to it",
            c.spec.collective
        ));
    }
    Ok((ib, ob))
}

/// The operator of `c`, reading a deferred scalar now.
fn resolve_op(c: &Coll, ops: &[Option<UserOp>]) -> strata::Result<ReduceOp> {
    let Some(i) = c.user_op else {
        return Ok(c.spec.op);
    };
    match ops.get(i).copied().flatten() {
        Some(UserOp::Immediate(s)) => Ok(ReduceOp::PreMulSum(s)),
        Some(UserOp::Deferred(addr, dtype)) => {
            let mut bytes = [0u8; 8];
            if device::any_device(&[addr as *const u8]) {
                // Read when the call runs, after the stream's earlier work (NCCL's
                // ncclScalarDevice); the progress thread has the device's context current.
                strata::gpu::read_device(addr as u64, &mut bytes[..dtype.size()])?;
                return Ok(ReduceOp::PreMulSum(Scalar { dtype, bytes }));
            }
            // SAFETY: the caller made the operator with a pointer to one element of `dtype`
            // and keeps it valid while the operator exists (NCCL's contract); it is host memory.
            unsafe {
                std::ptr::copy_nonoverlapping(addr as *const u8, bytes.as_mut_ptr(), dtype.size())
            };
            Ok(ReduceOp::PreMulSum(Scalar { dtype, bytes }))
        }
        None => Err(Error::InvalidArgument(format!(
            "reduction operator {} was destroyed",
            i + crate::FIRST_USER_OP
        ))),
    }
}

/// Runs one collective, in place when the buffers follow NCCL's in-place rules.
fn run_coll(comm: &Communicator, ops: &[Option<UserOp>], c: &Coll) -> strata::Result<()> {
    let (rank, p) = (comm.rank(), comm.size());
    let (ib, ob) = check_coll(c, rank, p).map_err(Error::InvalidArgument)?;
    let spec = CallSpec {
        op: resolve_op(c, ops)?,
        ..c.spec
    };
    let (in_off, out_off) = spec.in_place_offsets(rank);
    let (send, recv) = (c.send as usize, c.recv as usize);
    if ib > 0 && ob > 0 && send.wrapping_sub(in_off) == recv.wrapping_sub(out_off) {
        let len = (in_off + ib).max(out_off + ob);
        // SAFETY: in place, the caller's buffer starts `out_off` bytes before recvbuff and
        // holds `len` bytes (NCCL's in-place layout for this collective).
        let buf = unsafe { std::slice::from_raw_parts_mut(c.recv.sub(out_off), len) };
        return comm.call_bytes(spec, None, buf);
    }
    if ib > 0 && ob > 0 && send < recv + ob && recv < send + ib {
        return Err(Error::InvalidArgument(format!(
            "{}: sendbuff and recvbuff overlap without following NCCL's in-place layout",
            spec.collective
        )));
    }
    // SAFETY: non-NULL (checked) buffers of the sizes this collective reads and writes, which
    // the caller keeps valid until the call completes; empty slices for unused buffers.
    let (input, output) = unsafe {
        (
            if ib > 0 {
                std::slice::from_raw_parts(c.send, ib)
            } else {
                &[][..]
            },
            if ob > 0 {
                std::slice::from_raw_parts_mut(c.recv, ob)
            } else {
                &mut [][..]
            },
        )
    };
    comm.call_bytes(spec, Some(input), output)
}

/// Runs the calls of one group on `comm`: collectives in the order made, then every send and
/// receive as one batch, so that transfers in both directions progress together.
pub(crate) fn run_group(
    comm: &Communicator,
    ops: &[Option<UserOp>],
    calls: Vec<Call>,
) -> strata::Result<()> {
    let mut transfers = Vec::new();
    for call in &calls {
        match call {
            Call::Coll(c) => run_coll(comm, ops, c)?,
            &Call::P2p {
                send,
                peer,
                dtype,
                count,
                ptr,
                ..
            } => {
                let bytes = count
                    .checked_mul(dtype.size())
                    .ok_or_else(|| Error::InvalidArgument(format!("count {count} overflows")))?;
                if bytes > 0 && ptr.is_null() {
                    return Err(Error::InvalidArgument(format!(
                        "{} buffer is NULL with count {count}",
                        if send { "send" } else { "recv" }
                    )));
                }
                // SAFETY: a non-NULL buffer of `bytes` bytes that the caller keeps valid until
                // the group completes; empty slices need no buffer.
                transfers.push(unsafe {
                    if send {
                        Transfer::Send {
                            peer,
                            dtype,
                            data: if bytes > 0 {
                                std::slice::from_raw_parts(ptr, bytes)
                            } else {
                                &[]
                            },
                        }
                    } else {
                        Transfer::Recv {
                            peer,
                            dtype,
                            data: if bytes > 0 {
                                std::slice::from_raw_parts_mut(ptr, bytes)
                            } else {
                                &mut []
                            },
                        }
                    }
                });
            }
        }
    }
    if transfers.is_empty() {
        return Ok(());
    }
    comm.send_recv(&mut transfers)
}

/// Whether `send` sits at NCCL's in-place position of `recv` for `spec` on `rank`.
fn nccl_in_place(spec: &CallSpec, rank: usize, send: u64, recv: u64) -> bool {
    let (in_off, out_off) = spec.in_place_offsets(rank);
    send.wrapping_sub(in_off as u64) == recv.wrapping_sub(out_off as u64)
}

/// Device ranges of `c` on `rank` of `p`: the input read, the output written (in place they
/// overlap and are merged into one range read and written).
fn coll_ranges(c: &Coll, rank: usize, p: usize, out: &mut Vec<DeviceRange>) -> Result<(), Error> {
    let (ib, ob) = check_coll(c, rank, p).map_err(Error::InvalidArgument)?;
    if ib > 0 && device::any_device(&[c.send]) {
        out.push(DeviceRange {
            ptr: c.send as u64,
            len: ib,
            read: true,
            write: false,
        });
    }
    if ob > 0 && device::any_device(&[c.recv]) {
        out.push(DeviceRange {
            ptr: c.recv as u64,
            len: ob,
            read: false,
            write: true,
        });
    }
    Ok(())
}

/// Enqueues a group's calls on GPU memory on their streams (see strata's `comm/device/queue.rs`): one
/// elementwise collective is pipelined in chunks; anything else (several calls, sends and
/// receives, the other collectives) is staged whole through host memory and run as a group.
pub(crate) fn enqueue_device(
    comm: &Arc<Communicator>,
    ops: Vec<Option<UserOp>>,
    calls: Vec<Call>,
) -> strata::Result<()> {
    let (rank, p) = (comm.rank(), comm.size());
    let mut raw: Vec<usize> = calls.iter().filter_map(Call::stream).collect();
    raw.sort_unstable();
    raw.dedup();
    // SAFETY: the caller's streams, valid until the calls complete (NCCL's contract).
    let streams: Vec<Stream> = raw
        .iter()
        .map(|&s| unsafe { Stream::borrowed(s as *mut _) })
        .collect();
    let deferred = |c: &Coll| {
        c.user_op
            .and_then(|i| ops.get(i).copied().flatten())
            .is_some_and(|o| matches!(o, UserOp::Deferred(..)))
    };
    if let [Call::Coll(c)] = calls.as_slice()
        && !deferred(c)
        && streams.len() == 1
    {
        // One collective: strata's own path (stream programs on one host, else pipelined).
        let (spec, send, recv) = device_coll(c, &ops, rank, p)?;
        return comm.enqueue_call(spec, send, recv, &streams[0]);
    }
    if comm.uses_gpu_ipc()
        && streams.len() == 1
        && calls.iter().all(|call| match call {
            // Every buffer the call touches is device memory (a group may mix in host ones,
            // which only the staged path serves).
            Call::Coll(c) => {
                !deferred(c)
                    && buffer_bytes(&c.spec, rank, p).is_ok_and(|(ib, ob)| {
                        (ib == 0 || device::any_device(&[c.send]))
                            && (ob == 0 || device::any_device(&[c.recv]))
                    })
            }
            Call::P2p { ptr, count, .. } => *count == 0 || device::any_device(&[*ptr]),
        })
    {
        // A group on one stream, every rank on this host: its collectives in order as stream
        // programs, then its sends and receives as one batch that progresses all at once.
        let mut colls = Vec::new();
        let mut transfers = Vec::new();
        for call in &calls {
            match *call {
                Call::Coll(ref c) => colls.push(device_coll(c, &ops, rank, p)?),
                Call::P2p {
                    send,
                    peer,
                    dtype,
                    count,
                    ptr,
                    ..
                } => transfers.push(strata::DeviceTransfer {
                    peer,
                    ptr: ptr as u64,
                    bytes: count.saturating_mul(dtype.size()),
                    send,
                }),
            }
        }
        for (spec, send, recv) in colls {
            comm.enqueue_call(spec, send, recv, &streams[0])?;
        }
        return comm.enqueue_transfers(&transfers, &streams[0]);
    }
    let mut ranges = Vec::new();
    for call in &calls {
        match call {
            Call::Coll(c) => coll_ranges(c, rank, p, &mut ranges)?,
            &Call::P2p {
                send,
                dtype,
                count,
                ptr,
                ..
            } => {
                let len = count.saturating_mul(dtype.size());
                if len > 0 && device::any_device(&[ptr]) {
                    ranges.push(DeviceRange {
                        ptr: ptr as u64,
                        len,
                        read: send,
                        write: !send,
                    });
                }
            }
        }
    }
    let stream_refs: Vec<&Stream> = streams.iter().collect();
    comm.enqueue_device(
        &stream_refs,
        ranges,
        Box::new(move |comm, staged| {
            let host =
                |ptr: *const u8| -> *mut u8 { staged.host(ptr as u64).unwrap_or(ptr as *mut u8) };
            let calls = calls
                .into_iter()
                .map(|call| match call {
                    Call::Coll(c) => Call::Coll(Coll {
                        send: host(c.send),
                        recv: host(c.recv),
                        stream: None,
                        ..c
                    }),
                    Call::P2p {
                        send,
                        peer,
                        dtype,
                        count,
                        ptr,
                        ..
                    } => Call::P2p {
                        send,
                        peer,
                        dtype,
                        count,
                        ptr: host(ptr),
                        stream: None,
                    },
                })
                .collect();
            run_group(comm, &ops, calls)
        }),
    )
}

/// A collective on device memory checked as NCCL would: its spec with the operator resolved,
/// and its send and receive addresses (the receive buffer standing in for a send buffer this
/// rank does not read).
fn device_coll(
    c: &Coll,
    ops: &[Option<UserOp>],
    rank: usize,
    p: usize,
) -> strata::Result<(CallSpec, u64, u64)> {
    check_coll(c, rank, p).map_err(Error::InvalidArgument)?;
    let spec = CallSpec {
        op: resolve_op(c, ops)?,
        ..c.spec
    };
    let (ib, ob) = buffer_bytes(&spec, rank, p).map_err(Error::InvalidArgument)?;
    let (send, recv) = (c.send as u64, c.recv as u64);
    if ib > 0
        && ob > 0
        && !nccl_in_place(&spec, rank, send, recv)
        && send < recv + ob as u64
        && recv < send + ib as u64
    {
        return Err(Error::InvalidArgument(format!(
            "{}: sendbuff and recvbuff overlap without following NCCL's in-place layout",
            spec.collective
        )));
    }
    // Where this rank reads no input, its sendbuff may be anything: use recvbuff.
    Ok((spec, if ib == 0 { recv } else { send }, recv))
}

/// The cost model's estimate of `calls` on `comm`, in microseconds.
pub(crate) fn estimate_us(comm: &Communicator, calls: &[Call]) -> f64 {
    let mut seconds = 0.0;
    for call in calls {
        let (collective, bytes) = match call {
            Call::Coll(c) => (c.spec.collective, c.spec.count * c.spec.dtype.size()),
            Call::P2p { dtype, count, .. } => (Collective::Send, count * dtype.size()),
        };
        let algorithm = comm.algorithm_for(collective, bytes);
        if let Ok(s) = comm.predict(collective, algorithm, bytes) {
            seconds += s;
        }
    }
    seconds * 1e6
}
