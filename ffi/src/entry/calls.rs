//! Entry points for the calls: collectives, send and receive, and groups.

use crate::*;

/// Checks and submits a collective.
#[allow(clippy::too_many_arguments)]
fn collective(
    collective: Collective,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    datatype: c_int,
    op: Option<c_int>,
    root: Option<c_int>,
    comm: NcclComm,
    stream: *mut c_void,
) -> NcclResult {
    guarded(|| {
        let h = comm_of(comm)?;
        live(&h)?;
        let dtype = dtype_of(datatype)?;
        let (op, user_op) = match op {
            Some(code) => op_of(&h, code, dtype)?,
            None => (ReduceOp::Sum, None),
        };
        let root = root.map_or(Ok(0), |r| usize_of(r, "root"))?;
        let mut c = Coll {
            spec: CallSpec {
                op,
                root,
                ..CallSpec::new(collective, dtype, count)
            },
            user_op,
            send: send as *const u8,
            recv: recv as *mut u8,
            stream: None,
        };
        if count > 0 && device::any_device(&[c.send, c.recv]) {
            c.stream = Some(stream as usize);
        }
        if let Some((rank, p)) = h.shape.get().copied() {
            call::check_coll(&c, rank, p).map_err(invalid)?;
        }
        Ok(group::submit(h, Call::Coll(c)))
    })
}

/// Checks and submits a send or receive.
fn p2p(
    send: bool,
    buf: *mut c_void,
    count: usize,
    datatype: c_int,
    peer: c_int,
    comm: NcclComm,
    stream: *mut c_void,
) -> NcclResult {
    guarded(|| {
        let h = comm_of(comm)?;
        live(&h)?;
        let dtype = dtype_of(datatype)?;
        let peer = usize_of(peer, "peer")?;
        if let Some((_, p)) = h.shape.get().copied()
            && peer >= p
        {
            return Err(invalid(format!(
                "peer {peer} is out of range for {p} ranks"
            )));
        }
        let bytes = count
            .checked_mul(dtype.size())
            .filter(|&b| b <= isize::MAX as usize)
            .ok_or_else(|| invalid(format!("count {count} of {dtype} overflows")))?;
        if bytes > 0 && buf.is_null() {
            return Err(invalid(format!(
                "{} buffer is NULL with count {count}",
                if send { "send" } else { "recv" }
            )));
        }
        let stream =
            (bytes > 0 && device::any_device(&[buf as *const u8])).then_some(stream as usize);
        Ok(group::submit(
            h,
            Call::P2p {
                send,
                peer,
                dtype,
                count,
                ptr: buf as *mut u8,
                stream,
            },
        ))
    })
}

nccl_api! {
    /// `ncclAllReduce`.
    fn ncclAllReduce / pncclAllReduce(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        count: usize,
        datatype: c_int,
        op: c_int,
        comm: NcclComm,
        stream: *mut c_void,
    ) -> NcclResult {
        collective(
            Collective::AllReduce,
            sendbuff,
            recvbuff,
            count,
            datatype,
            Some(op),
            None,
            comm,
            stream,
        )
    }

    /// `ncclBroadcast`.
    fn ncclBroadcast / pncclBroadcast(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        count: usize,
        datatype: c_int,
        root: c_int,
        comm: NcclComm,
        stream: *mut c_void,
    ) -> NcclResult {
        collective(
            Collective::Broadcast,
            sendbuff,
            recvbuff,
            count,
            datatype,
            None,
            Some(root),
            comm,
            stream,
        )
    }

    /// `ncclBcast`: the in-place broadcast.
    fn ncclBcast / pncclBcast(
        buff: *mut c_void,
        count: usize,
        datatype: c_int,
        root: c_int,
        comm: NcclComm,
        stream: *mut c_void,
    ) -> NcclResult {
        collective(
            Collective::Broadcast,
            buff,
            buff,
            count,
            datatype,
            None,
            Some(root),
            comm,
            stream,
        )
    }

    /// `ncclReduce`.
    fn ncclReduce / pncclReduce(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        count: usize,
        datatype: c_int,
        op: c_int,
        root: c_int,
        comm: NcclComm,
        stream: *mut c_void,
    ) -> NcclResult {
        collective(
            Collective::Reduce,
            sendbuff,
            recvbuff,
            count,
            datatype,
            Some(op),
            Some(root),
            comm,
            stream,
        )
    }

    /// `ncclAllGather`: `sendcount` elements per rank.
    fn ncclAllGather / pncclAllGather(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        sendcount: usize,
        datatype: c_int,
        comm: NcclComm,
        stream: *mut c_void,
    ) -> NcclResult {
        collective(
            Collective::AllGather,
            sendbuff,
            recvbuff,
            sendcount,
            datatype,
            None,
            None,
            comm,
            stream,
        )
    }

    /// `ncclReduceScatter`: `recvcount` elements per rank.
    fn ncclReduceScatter / pncclReduceScatter(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        recvcount: usize,
        datatype: c_int,
        op: c_int,
        comm: NcclComm,
        stream: *mut c_void,
    ) -> NcclResult {
        collective(
            Collective::ReduceScatter,
            sendbuff,
            recvbuff,
            recvcount,
            datatype,
            Some(op),
            None,
            comm,
            stream,
        )
    }

    /// `ncclAlltoAll`: `count` elements to and from each rank.
    fn ncclAlltoAll / pncclAlltoAll(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        count: usize,
        datatype: c_int,
        comm: NcclComm,
        stream: *mut c_void,
    ) -> NcclResult {
        collective(
            Collective::AllToAll,
            sendbuff,
            recvbuff,
            count,
            datatype,
            None,
            None,
            comm,
            stream,
        )
    }

    /// `ncclGather`: `count` elements from each rank to the root.
    fn ncclGather / pncclGather(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        count: usize,
        datatype: c_int,
        root: c_int,
        comm: NcclComm,
        stream: *mut c_void,
    ) -> NcclResult {
        collective(
            Collective::Gather,
            sendbuff,
            recvbuff,
            count,
            datatype,
            None,
            Some(root),
            comm,
            stream,
        )
    }

    /// `ncclScatter`: `count` elements from the root to each rank.
    fn ncclScatter / pncclScatter(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        count: usize,
        datatype: c_int,
        root: c_int,
        comm: NcclComm,
        stream: *mut c_void,
    ) -> NcclResult {
        collective(
            Collective::Scatter,
            sendbuff,
            recvbuff,
            count,
            datatype,
            None,
            Some(root),
            comm,
            stream,
        )
    }

    /// `ncclSend`: inside a group it progresses with the group's other transfers.
    fn ncclSend / pncclSend(
        sendbuff: *const c_void,
        count: usize,
        datatype: c_int,
        peer: c_int,
        comm: NcclComm,
        stream: *mut c_void,
    ) -> NcclResult {
        p2p(true, sendbuff as *mut c_void, count, datatype, peer, comm, stream)
    }

    /// `ncclRecv`.
    fn ncclRecv / pncclRecv(
        recvbuff: *mut c_void,
        count: usize,
        datatype: c_int,
        peer: c_int,
        comm: NcclComm,
        stream: *mut c_void,
    ) -> NcclResult {
        p2p(false, recvbuff, count, datatype, peer, comm, stream)
    }

    /// `ncclGroupStart`: calls until the matching `ncclGroupEnd` are queued; groups nest.
    fn ncclGroupStart / pncclGroupStart() -> NcclResult {
        guarded(|| Ok(group::start()))
    }

    /// `ncclGroupEnd`: at the outermost level, runs the group and reports its first error.
    fn ncclGroupEnd / pncclGroupEnd() -> NcclResult {
        guarded(|| Ok(group::end()))
    }

    /// `ncclGroupSimulateEnd`: ends the group without running its calls and fills
    /// `estimatedTime` with the cost model's estimate, in microseconds.
    fn ncclGroupSimulateEnd / pncclGroupSimulateEnd(sim_info: *mut NcclSimInfo) -> NcclResult {
        guarded(|| {
            if sim_info.is_null() {
                return Err(invalid("simInfo is NULL"));
            }
            // SAFETY: non-NULL; every version's ncclSimInfo_t starts with size and magic.
            let magic = unsafe {
                (sim_info as *const u8)
                    .add(8)
                    .cast::<u32>()
                    .read_unaligned()
            };
            if magic != SIM_INFO_MAGIC {
                return Err(invalid(format!(
                    "simInfo magic is {magic:#x}: initialise it with NCCL_SIM_INFO_INITIALIZER"
                )));
            }
            let us = group::simulate_end()?;
            // SAFETY: non-NULL, and estimatedTime is at offset 16 in every version.
            unsafe {
                (sim_info as *mut u8)
                    .add(16)
                    .cast::<f32>()
                    .write_unaligned(us as f32)
            };
            Ok(NcclResult::Success)
        })
    }
}
