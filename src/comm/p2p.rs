//! Point-to-point transfers: send, recv and batches of them in rounds.

use super::*;

impl Communicator {
    /// Sends `buf` to `peer`, which must call [`Communicator::recv`] with the same length.
    pub fn send<T: Element>(&self, buf: &[T], peer: usize) -> Result<()> {
        self.send_recv(&mut [Transfer::Send {
            peer,
            dtype: T::DTYPE,
            data: bytemuck::cast_slice(buf),
        }])
    }

    /// Receives `buf.len()` elements from `peer`.
    pub fn recv<T: Element>(&self, buf: &mut [T], peer: usize) -> Result<()> {
        self.send_recv(&mut [Transfer::Recv {
            peer,
            dtype: T::DTYPE,
            data: bytemuck::cast_slice_mut(buf),
        }])
    }

    /// Runs a batch of point-to-point transfers as one (NCCL's sends and receives between
    /// `ncclGroupStart` and `ncclGroupEnd`): they progress together, so a rank may send to its
    /// successor and receive from its predecessor in one batch without deadlock.
    ///
    /// Transfers between a pair of ranks match in order in each direction, and each must have
    /// the same element type and count at both ends (a mismatch fails with an error naming
    /// both). The batch runs in rounds: round k holds every peer's k-th transfer in each
    /// direction, so round k of one rank meets round k of its peers. A transfer to this rank
    /// itself pairs with the receive from itself of the same position in the batch.
    pub fn send_recv(&self, transfers: &mut [Transfer<'_>]) -> Result<()> {
        let (p, me) = (self.size(), self.rank());
        for t in transfers.iter() {
            let (peer, dtype, len) = t.parts();
            if peer >= p {
                return Err(Error::InvalidArgument(format!(
                    "{} peer {peer} is out of range for {p} ranks",
                    t.verb()
                )));
            }
            if len % dtype.size() != 0 {
                return Err(Error::InvalidArgument(format!(
                    "{} buffer of {len} bytes is not a whole number of {dtype} elements",
                    t.verb()
                )));
            }
        }
        if let Some(e) = self.async_error() {
            return Err(e);
        }
        let to_self = |want_send: bool| -> Vec<usize> {
            (0..transfers.len())
                .filter(|&i| transfers[i].parts().0 == me && transfers[i].is_send() == want_send)
                .collect()
        };
        let (sends, recvs) = (to_self(true), to_self(false));
        if sends.len() != recvs.len() {
            return Err(Error::InvalidArgument(format!(
                "rank {me} sends itself {} message(s) but receives {} from itself; a transfer \
                 to self needs its partner in the same group",
                sends.len(),
                recvs.len()
            )));
        }
        for (&si, &ri) in sends.iter().zip(&recvs) {
            let ((_, sd, sl), (_, rd, rl)) = (transfers[si].parts(), transfers[ri].parts());
            if (sd, sl) != (rd, rl) {
                return Err(Error::Mismatch(format!(
                    "rank {me} sends itself {} {sd} elements but receives {} {rd} elements",
                    sl / sd.size(),
                    rl / rd.size()
                )));
            }
        }
        for (&si, &ri) in sends.iter().zip(&recvs) {
            let src = transfers[si].ptr() as *const u8;
            let dst = transfers[ri].ptr();
            // SAFETY: both buffers hold `len` bytes (checked above) and live for the call;
            // `copy_overlapping` allows them to overlap.
            unsafe { crate::copy::copy_overlapping(src, dst, transfers[si].parts().2) };
        }
        // Round k: the k-th transfer with each peer in each direction.
        let mut seen: HashMap<(bool, usize), usize> = HashMap::new();
        let round: Vec<Option<usize>> = transfers
            .iter()
            .map(|t| {
                let peer = t.parts().0;
                (peer != me).then(|| {
                    let k = seen.entry((t.is_send(), peer)).or_insert(0);
                    *k += 1;
                    *k - 1
                })
            })
            .collect();
        let rounds = round.iter().flatten().max().map_or(0, |m| m + 1);
        for k in 0..rounds {
            let members: Vec<usize> = (0..transfers.len())
                .filter(|&i| round[i] == Some(k))
                .collect();
            self.run_round(transfers, &members)?;
        }
        Ok(())
    }

    /// Runs one round of a [`Communicator::send_recv`] batch: at most one send to and one
    /// receive from each peer, all progressing together, each with its own header.
    fn run_round(&self, transfers: &mut [Transfer<'_>], members: &[usize]) -> Result<()> {
        let inner = &*self.inner;
        let rank = inner.rank;
        let mut guard = self.lock_state()?;
        let st = &mut *guard;
        let mut ops = Vec::with_capacity(members.len());
        let (mut input_parts, mut output_parts) = (Vec::new(), Vec::new());
        let (mut in_end, mut out_end) = (0usize, 0usize);
        let mut headers: Vec<(usize, Option<Header>, Option<Header>)> = Vec::new();
        let mut needed = Vec::with_capacity(members.len());
        let mut first = None;
        for &i in members {
            let (peer, dtype, len) = transfers[i].parts();
            let sending = transfers[i].is_send();
            let counters = if sending {
                &mut st.p2p_sent
            } else {
                &mut st.p2p_received
            };
            let seq = counters.entry(peer).or_insert(0);
            *seq += 1;
            // Both ends describe a transfer as the sender's `send` to the receiver.
            let local = Header {
                collective: if sending {
                    Collective::Send
                } else {
                    Collective::Recv
                },
                seq: *seq,
                dtype,
                count: (len / dtype.size()) as u64,
                op: 0,
                param: peer as u64,
                algorithm: Algorithm::Direct,
            };
            let wire = Header {
                collective: Collective::Send,
                param: if sending { peer } else { rank } as u64,
                ..local
            };
            let entry = match headers.iter().position(|h| h.0 == peer) {
                Some(j) => &mut headers[j],
                None => {
                    headers.push((peer, None, None));
                    headers
                        .last_mut()
                        .ok_or_else(|| Error::Transport("internal: lost a batch header".into()))?
                }
            };
            let ptr = transfers[i].ptr();
            let (header, parts, end, buf) = if sending {
                (&mut entry.1, &mut input_parts, &mut in_end, Buf::Input)
            } else {
                (&mut entry.2, &mut output_parts, &mut out_end, Buf::Output)
            };
            *header = Some(wire);
            if len > 0 {
                parts.push((*end, ptr, len));
                let region = Region::new(buf, *end, len);
                ops.push(if sending {
                    Op::Send { peer, src: region }
                } else {
                    Op::Recv { peer, dst: region }
                });
                *end += len;
            }
            needed.push(peer);
            first.get_or_insert(local);
        }
        let Some(local) = first else { return Ok(()) };
        let sched = RankSchedule {
            steps: if ops.is_empty() {
                Vec::new()
            } else {
                vec![Step { ops }]
            },
            scratch_elems: 0,
        };
        inner.health.op_started(local.call_seq(), &local.encode());
        let result = (|| {
            self.ensure_connections(st, &needed, &local)?;
            let bufs = Buffers {
                input: std::ptr::null(),
                input_bytes: 0,
                output: std::ptr::null_mut(),
                output_bytes: 0,
                scratch: std::ptr::null_mut(),
                scratch_bytes: 0,
                input_parts,
                output_parts,
            };
            self.op_run(st, local, DataType::Uint8, (Combine::Sum, None))
                .with_headers(&[], &[], &headers)
                .run(&sched, &bufs)
        })();
        self.conclude(st, &local, result)
    }
}

impl Communicator {
    /// Receives `buf.len()` elements from whichever rank's send to this rank arrives first
    /// (MPI's `MPI_ANY_SOURCE`, gloo's `recvAnysource`) and returns that rank. The message must
    /// have the element type and count of `buf`, as with [`Communicator::recv`]. Connects to
    /// every peer on first use (any of them may send); fails after the communicator's timeout
    /// if none does, and at once if the communicator has a fault.
    pub fn recv_any<T: Element>(&self, buf: &mut [T]) -> Result<usize> {
        self.recv_any_as(T::DTYPE, bytemuck::cast_slice_mut(buf))
    }

    /// [`Communicator::recv_any`] into the bytes of `data`, read as elements of `dtype`.
    pub fn recv_any_as(&self, dtype: DataType, data: &mut [u8]) -> Result<usize> {
        let source = self.pending_sender(dtype, data.len())?;
        self.send_recv(&mut [Transfer::Recv {
            peer: source,
            dtype,
            data,
        }])?;
        Ok(source)
    }

    /// Waits for a peer whose next message to this rank is a send, and returns it. Peers are
    /// looked at in turn, starting after the one chosen last, so a steady sender cannot starve
    /// the others; their messages stay in the connection for the receive that follows.
    fn pending_sender(&self, dtype: DataType, bytes: usize) -> Result<usize> {
        let inner = &*self.inner;
        let (p, me) = (inner.size, inner.rank);
        if p < 2 {
            return Err(Error::InvalidArgument(
                "recv from any source in a communicator of 1 rank: no other rank can send".into(),
            ));
        }
        if !bytes.is_multiple_of(dtype.size()) {
            return Err(Error::InvalidArgument(format!(
                "recv buffer of {bytes} bytes is not a whole number of {dtype} elements"
            )));
        }
        if let Some(e) = self.async_error() {
            return Err(e);
        }
        let mut guard = self.lock_state()?;
        let st = &mut *guard;
        let call = Header {
            collective: Collective::Recv,
            seq: 0,
            dtype,
            count: (bytes / dtype.size()) as u64,
            op: 0,
            param: me as u64,
            algorithm: Algorithm::Direct,
        };
        // Ranks above this one wait for it to dial them; those below dial it when they send.
        let higher: Vec<usize> = (me + 1..p).collect();
        self.ensure_connections(st, &higher, &call)?;
        let started = Instant::now();
        let deadline = started + self.timeout();
        let mut nap = Duration::from_micros(20);
        loop {
            for q in 0..me {
                if st.conns[q].is_none() {
                    st.conns[q] = inner.listener.take(q);
                }
            }
            let mut closed = 0;
            // The peer chosen last comes last, not never.
            for k in 1..=p {
                let q = (st.any_source_last + k) % p;
                let Some(conn) = st.conns[q].as_mut() else {
                    continue;
                };
                let mut head = [0u8; HEADER_BYTES];
                let n = match conn.data.peek(&mut head) {
                    Ok(n) => n,
                    // A peer that closed its end sends nothing more; a dead one is reported
                    // by the watchdog. Either way the others may still send.
                    Err(e) if is_closed(&e) || conn.gone => {
                        closed += 1;
                        continue;
                    }
                    Err(e) => return Err(self.peer_io_error(q, "recv from any source", e)),
                };
                let expected = st.p2p_received.get(&q).copied().unwrap_or(0) + 1;
                if n == HEADER_BYTES
                    && Header::decode(&head).is_some_and(|h| {
                        h.collective == Collective::Send
                            && h.param == me as u64
                            && h.seq == expected
                    })
                {
                    st.any_source_last = q;
                    return Ok(q);
                }
            }
            if inner.health.interrupt.load(Ordering::Acquire) {
                return Err(self.async_error().unwrap_or(Error::Aborted(None)));
            }
            executor::check_control(&mut st.conns, &inner.peers)?;
            if closed == p - 1 {
                return Err(Error::Transport(
                    "recv from any source: every other rank has closed its connection".into(),
                ));
            }
            if Instant::now() >= deadline {
                return Err(Error::Timeout {
                    op: "recv from any source".into(),
                    seq: 0,
                    waiting_on: (0..p).filter(|&q| q != me).collect(),
                    after_s: started.elapsed().as_secs_f64(),
                    diagnosis: None,
                });
            }
            std::thread::sleep(nap);
            nap = (nap * 2).min(Duration::from_millis(1));
        }
    }

    /// The error for a failed connection to `peer` while doing `what`.
    fn peer_io_error(&self, peer: usize, what: &str, e: std::io::Error) -> Error {
        let info = &self.inner.peers[peer];
        if e.kind() == std::io::ErrorKind::Unsupported {
            return Error::InvalidArgument(format!("{what}: rank {peer}: {e}"));
        }
        Error::PeerFailed {
            rank: peer,
            host: info.host.hostname.clone(),
            pid: info.pid,
            reason: format!("{what}: {e}"),
        }
    }
}

/// Whether `e` says the other end of a connection is gone.
fn is_closed(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        e.kind(),
        UnexpectedEof | ConnectionReset | BrokenPipe | ConnectionAborted | NotConnected
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A receive from any source passes over a peer whose connection is closed, by whatever
    /// errno the transport saw it as: a socket's EOF or reset, and libfabric's ENOTCONN or
    /// EPIPE for a peer that closed its endpoint (a rank done with its sends).
    #[test]
    fn a_closed_connection_is_told_by_its_errno() {
        for errno in [
            libc::ENOTCONN,
            libc::EPIPE,
            libc::ECONNRESET,
            libc::ECONNABORTED,
        ] {
            assert!(
                is_closed(&std::io::Error::from_raw_os_error(errno)),
                "{errno}"
            );
        }
        assert!(is_closed(&std::io::ErrorKind::UnexpectedEof.into()));
        for errno in [libc::EIO, libc::ETIMEDOUT, libc::EINVAL] {
            assert!(
                !is_closed(&std::io::Error::from_raw_os_error(errno)),
                "{errno}"
            );
        }
    }
}
