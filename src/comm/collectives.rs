//! The collectives: the typed API over slices and the byte-level API under it.

use super::*;

impl Communicator {
    // ----- typed API -----------------------------------------------------------------------

    /// `recv = reduce(send over all ranks)`; `send` and `recv` have the same length.
    pub fn all_reduce<T: Element>(&self, send: &[T], recv: &mut [T], op: ReduceOp) -> Result<()> {
        same_len(send.len(), recv.len(), "all_reduce send and recv")?;
        self.call_typed(
            CallSpec {
                op,
                ..CallSpec::new(Collective::AllReduce, T::DTYPE, recv.len())
            },
            Some(send),
            recv,
        )
    }

    /// In-place all-reduce.
    pub fn all_reduce_in_place<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        self.call_typed::<T>(
            CallSpec {
                op,
                ..CallSpec::new(Collective::AllReduce, T::DTYPE, buf.len())
            },
            None,
            buf,
        )
    }

    /// Every rank receives `root`'s `send` into `recv` (`send` is read on the root only).
    pub fn broadcast<T: Element>(&self, send: &[T], recv: &mut [T], root: usize) -> Result<()> {
        if self.rank() == root {
            same_len(
                send.len(),
                recv.len(),
                "broadcast send and recv at the root",
            )?;
        }
        self.call_typed(
            CallSpec {
                root,
                ..CallSpec::new(Collective::Broadcast, T::DTYPE, recv.len())
            },
            Some(send),
            recv,
        )
    }

    /// In-place broadcast: `buf` on the root is sent into `buf` everywhere.
    pub fn broadcast_in_place<T: Element>(&self, buf: &mut [T], root: usize) -> Result<()> {
        self.call_typed::<T>(
            CallSpec {
                root,
                ..CallSpec::new(Collective::Broadcast, T::DTYPE, buf.len())
            },
            None,
            buf,
        )
    }

    /// The root receives the reduction into `recv`; other ranks may pass an empty `recv`.
    pub fn reduce<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        if self.rank() == root {
            same_len(send.len(), recv.len(), "reduce send and recv at the root")?;
        }
        self.call_typed(
            CallSpec {
                op,
                root,
                ..CallSpec::new(Collective::Reduce, T::DTYPE, send.len())
            },
            Some(send),
            recv,
        )
    }

    /// In-place reduce: the root's `buf` ends with the result.
    pub fn reduce_in_place<T: Element>(
        &self,
        buf: &mut [T],
        op: ReduceOp,
        root: usize,
    ) -> Result<()> {
        self.call_typed::<T>(
            CallSpec {
                op,
                root,
                ..CallSpec::new(Collective::Reduce, T::DTYPE, buf.len())
            },
            None,
            buf,
        )
    }

    /// `recv` (size × `send.len()`) receives every rank's `send`, in rank order.
    pub fn all_gather<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        same_len(
            send.len() * self.size(),
            recv.len(),
            "all_gather recv (size × send)",
        )?;
        self.call_typed(
            CallSpec::new(Collective::AllGather, T::DTYPE, send.len()),
            Some(send),
            recv,
        )
    }

    /// In-place all-gather: this rank's block already sits at `buf[rank × count..]`.
    pub fn all_gather_in_place<T: Element>(&self, buf: &mut [T]) -> Result<()> {
        let count = self.per_rank(buf.len(), "all_gather_in_place buffer")?;
        self.call_typed::<T>(
            CallSpec::new(Collective::AllGather, T::DTYPE, count),
            None,
            buf,
        )
    }

    /// `recv` receives block `rank` of the reduction of every rank's `send` (size × `recv.len()`).
    pub fn reduce_scatter<T: Element>(
        &self,
        send: &[T],
        recv: &mut [T],
        op: ReduceOp,
    ) -> Result<()> {
        same_len(
            recv.len() * self.size(),
            send.len(),
            "reduce_scatter send (size × recv)",
        )?;
        self.call_typed(
            CallSpec {
                op,
                ..CallSpec::new(Collective::ReduceScatter, T::DTYPE, recv.len())
            },
            Some(send),
            recv,
        )
    }

    /// In-place reduce-scatter: the result lands in `buf[rank × count..(rank + 1) × count]`.
    pub fn reduce_scatter_in_place<T: Element>(&self, buf: &mut [T], op: ReduceOp) -> Result<()> {
        let count = self.per_rank(buf.len(), "reduce_scatter_in_place buffer")?;
        self.call_typed::<T>(
            CallSpec {
                op,
                ..CallSpec::new(Collective::ReduceScatter, T::DTYPE, count)
            },
            None,
            buf,
        )
    }

    /// Block j of `send` goes to rank j, which stores it as block `rank` of its `recv`.
    pub fn all_to_all<T: Element>(&self, send: &[T], recv: &mut [T]) -> Result<()> {
        same_len(send.len(), recv.len(), "all_to_all send and recv")?;
        let count = self.per_rank(recv.len(), "all_to_all buffers")?;
        self.call_typed(
            CallSpec::new(Collective::AllToAll, T::DTYPE, count),
            Some(send),
            recv,
        )
    }

    /// In-place all-to-all.
    pub fn all_to_all_in_place<T: Element>(&self, buf: &mut [T]) -> Result<()> {
        let count = self.per_rank(buf.len(), "all_to_all_in_place buffer")?;
        self.call_typed::<T>(
            CallSpec::new(Collective::AllToAll, T::DTYPE, count),
            None,
            buf,
        )
    }

    /// The root's `recv` (size × `send.len()`) receives every rank's `send`.
    pub fn gather<T: Element>(&self, send: &[T], recv: &mut [T], root: usize) -> Result<()> {
        if self.rank() == root {
            same_len(
                send.len() * self.size(),
                recv.len(),
                "gather recv at the root (size × send)",
            )?;
        }
        self.call_typed(
            CallSpec {
                root,
                ..CallSpec::new(Collective::Gather, T::DTYPE, send.len())
            },
            Some(send),
            recv,
        )
    }

    /// Block j of the root's `send` (size × `recv.len()`) lands in rank j's `recv`.
    pub fn scatter<T: Element>(&self, send: &[T], recv: &mut [T], root: usize) -> Result<()> {
        if self.rank() == root {
            same_len(
                recv.len() * self.size(),
                send.len(),
                "scatter send at the root (size × recv)",
            )?;
        }
        self.call_typed(
            CallSpec {
                root,
                ..CallSpec::new(Collective::Scatter, T::DTYPE, recv.len())
            },
            Some(send),
            recv,
        )
    }

    /// Waits until every rank has called `barrier`.
    pub fn barrier(&self) -> Result<()> {
        self.call_bytes(
            CallSpec::new(Collective::Barrier, DataType::Uint8, 0),
            None,
            &mut [],
        )
    }

    // ----- byte-level API ------------------------------------------------------------------

    /// Runs `spec` on byte buffers. `send` is `None` for the in-place form, in which `recv`
    /// holds the input at NCCL's in-place position (all_gather and gather: block `rank`/`root`
    /// of `recv`; reduce_scatter and scatter: the whole of `recv`, result in block `rank`).
    pub fn call_bytes(&self, spec: CallSpec, send: Option<&[u8]>, recv: &mut [u8]) -> Result<()> {
        let es = spec.dtype.size();
        let p = self.size();
        if matches!(spec.collective, Collective::Send | Collective::Recv) {
            return Err(Error::InvalidArgument(
                "use send/recv for point-to-point transfers".into(),
            ));
        }
        if spec.collective.rooted() && spec.root >= p {
            return Err(Error::InvalidArgument(format!(
                "root {} is out of range for {p} ranks",
                spec.root
            )));
        }
        let total = spec
            .count
            .checked_mul(p)
            .and_then(|n| n.checked_mul(es))
            .filter(|&n| n <= isize::MAX as usize);
        if total.is_none() {
            return Err(Error::InvalidArgument(format!(
                "count {} overflows for {p} ranks of {}",
                spec.count, spec.dtype
            )));
        }
        let (ilen, olen) = spec
            .collective
            .buffer_elems(spec.count, p, self.rank(), spec.root);
        let (ib, ob) = (ilen * es, olen * es);
        let (input, input_bytes, output, output_bytes): (*const u8, usize, *mut u8, usize) =
            match send {
                Some(send) => {
                    need(send.len(), ib, "send buffer")?;
                    need(recv.len(), ob, "recv buffer")?;
                    (send.as_ptr(), ib, recv.as_mut_ptr(), ob)
                }
                None => {
                    let base = recv.as_mut_ptr();
                    let (in_off, out_off) = spec.in_place_offsets(self.rank());
                    need(
                        recv.len(),
                        (in_off + ib).max(out_off + ob),
                        "in-place buffer",
                    )?;
                    // SAFETY: both offsets plus lengths were checked against recv.len().
                    unsafe { (base.add(in_off) as *const u8, ib, base.add(out_off), ob) }
                }
            };
        // SAFETY: the spans are bounds-checked views of `send`/`recv`, which outlive the call.
        unsafe { self.run(spec, input, input_bytes, output, output_bytes) }
    }

    fn call_typed<T: Element>(
        &self,
        spec: CallSpec,
        send: Option<&[T]>,
        recv: &mut [T],
    ) -> Result<()> {
        self.call_bytes(
            spec,
            send.map(bytemuck::cast_slice),
            bytemuck::cast_slice_mut(recv),
        )
    }

    fn per_rank(&self, len: usize, what: &str) -> Result<usize> {
        if !len.is_multiple_of(self.size()) {
            return Err(Error::InvalidArgument(format!(
                "{what} has {len} elements, not a multiple of {} ranks",
                self.size()
            )));
        }
        Ok(len / self.size())
    }
}
