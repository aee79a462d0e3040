//! Entry points for versions, errors and a communicator's life: unique ids, init, split,
//! shrink, revoke, finalize, destroy, abort and the queries.

use crate::*;

/// Creates a communicator for `rank` of `nranks` from `id`: now, at the end of the group, or
/// on its worker thread (non-blocking).
///
/// # Safety
/// `out` must be NULL or writable; `config` as in [`settings_of`].
pub(crate) unsafe fn init_rank(
    out: *mut NcclComm,
    nranks: c_int,
    id: &NcclUniqueId,
    rank: c_int,
    config: *const NcclConfig,
) -> Ffi {
    // SAFETY: per the contract.
    unsafe { put(out, std::ptr::null_mut(), "comm")? };
    let n = usize_of(nranks, "nranks")?;
    let r = usize_of(rank, "rank")?;
    if n == 0 || r >= n {
        return Err(invalid(format!(
            "rank {rank} is out of range for {nranks} ranks"
        )));
    }
    // SAFETY: per the contract.
    let settings = unsafe { settings_of(config, env_blocking())? };
    let id = strata::UniqueId::from_bytes(&id.internal).map_err(|e| report(&e))?;
    let cfg = Config::from_env().map_err(|e| report(&e))?;
    // With NCCL_COMM_ID, nobody's ncclGetUniqueId started the root: rank 0 serves it.
    if r == 0 {
        let fixed = strata::UniqueId::from_nccl_comm_id().map_err(|e| report(&e))?;
        if fixed.is_some_and(|f| f.as_bytes() == id.as_bytes()) {
            id.serve_root().map_err(|e| report(&e))?;
        }
    }
    let h = CommHandle::create(settings.blocking, Some((r, n)));
    // SAFETY: checked writable above.
    unsafe { *out = h.id as NcclComm };
    let init = group::DeferredInit {
        handle: h.clone(),
        id,
        nranks: n,
        rank: r,
        cfg,
        device: group::DeferredInit::current_device(),
    };
    if group::active() {
        group::defer_init(init);
        return Ok(NcclResult::Success);
    }
    if !h.blocking {
        h.submit(Box::new(move || init.run()))
            .map_err(|e| report(&e))?;
        return Ok(NcclResult::InProgress);
    }
    match init.run() {
        Ok(()) => Ok(NcclResult::Success),
        Err(e) => {
            h.unregister();
            // SAFETY: checked writable above.
            unsafe { *out = std::ptr::null_mut() };
            Err(report(&e))
        }
    }
}

/// The live communicator `comm` that a child (split, grow, sub-group) is about to be made
/// from, with `*newcomm` set to NULL first, so that any failure from here on leaves NULL
/// there.
///
/// # Safety
/// `newcomm` must be NULL (refused) or writable.
pub(crate) unsafe fn live_parent(
    comm: NcclComm,
    newcomm: *mut NcclComm,
) -> Result<Arc<CommHandle>, NcclResult> {
    let h = comm_of(comm)?;
    live(&h)?;
    // SAFETY: per this function's contract.
    unsafe { put(newcomm, std::ptr::null_mut(), "newcomm")? };
    Ok(h)
}

/// Makes a child communicator from `h` with `make` (a split, shrink, grow or sub-group): now
/// for a blocking parent, on the parent's worker for a non-blocking one. `child` is the child's
/// handle, or `None` for a rank that takes part but gets no communicator. `*newcomm` names
/// the child at once (a non-blocking caller polls it) and is NULL again if the call fails.
///
/// # Safety
/// `newcomm` must be writable (the callers check it with `put` first).
pub(crate) unsafe fn derive(
    h: Arc<CommHandle>,
    child: Option<Arc<CommHandle>>,
    newcomm: *mut NcclComm,
    make: impl FnOnce(&Communicator) -> strata::Result<Option<Communicator>> + Send + 'static,
) -> Ffi {
    if let Some(ch) = &child {
        // SAFETY: writable, per the contract.
        unsafe { *newcomm = ch.id as NcclComm };
    }
    let r = derive_now_or_later(h, child, make);
    if r.is_err() {
        // SAFETY: as above.
        unsafe { *newcomm = std::ptr::null_mut() };
    }
    r
}

/// [`derive`] once the handle is written: runs `make` and settles the child with its result.
fn derive_now_or_later(
    h: Arc<CommHandle>,
    child: Option<Arc<CommHandle>>,
    make: impl FnOnce(&Communicator) -> strata::Result<Option<Communicator>> + Send + 'static,
) -> Ffi {
    let blocking = h.blocking;
    let parent = h.clone();
    let job_child = child.clone();
    let job = move || -> strata::Result<()> {
        let result = parent.wait_ready(init_limit()).and_then(|c| make(&c));
        match (job_child, result) {
            (Some(ch), Ok(Some(c))) => ch.set_ready(Ok(c)),
            (Some(ch), Ok(None)) => {
                let e = Error::Transport("internal: the split left this rank out".into());
                ch.set_ready(Err(e.clone()));
                return Err(e);
            }
            (Some(ch), Err(e)) => {
                ch.set_ready(Err(e.clone()));
                return Err(e);
            }
            (None, r) => return r.map(|_| ()),
        }
        Ok(())
    };
    if !blocking {
        h.submit(Box::new(job)).map_err(|e| report(&e))?;
        return Ok(NcclResult::InProgress);
    }
    match job() {
        Ok(()) => Ok(NcclResult::Success),
        Err(e) => {
            if let Some(ch) = child {
                ch.unregister();
            }
            Err(report(&e))
        }
    }
}

/// Writes `value(communicator)` to `out`, waiting for a pending init.
///
/// # Safety
/// `out` must be NULL or writable.
unsafe fn query(
    comm: NcclComm,
    out: *mut c_int,
    what: &str,
    value: impl FnOnce(&Communicator) -> usize,
) -> Ffi {
    let h = comm_of(comm)?;
    let c = h.wait_ready(init_limit()).map_err(|e| report(&e))?;
    // SAFETY: per the contract.
    unsafe { put(out, value(&c) as c_int, what)? };
    Ok(NcclResult::Success)
}

nccl_api! {
    /// `ncclGetVersion`: the NCCL API level strata implements (23007).
    fn ncclGetVersion / pncclGetVersion(version: *mut c_int) -> NcclResult {
        // SAFETY: per the contract.
        guarded(|| {
            // SAFETY: per the contract.
            unsafe { put(version, NCCL_VERSION_CODE, "version")? };
            Ok(NcclResult::Success)
        })
    }

    /// `ncclGetErrorString`: a fixed description of a result code.
    fn ncclGetErrorString / pncclGetErrorString(result: c_int) -> *const c_char {
        let s: &'static std::ffi::CStr = match result {
            0 => c"no error",
            1 => c"unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
            2 => c"unhandled system error (run with NCCL_DEBUG=INFO for details)",
            3 => c"internal error - please report this issue to the strata developers",
            4 => c"invalid argument (run with NCCL_DEBUG=WARN for details)",
            5 => c"invalid usage (run with NCCL_DEBUG=WARN for details)",
            6 => c"remote process exited or there was a network error",
            7 => c"NCCL operation in progress",
            8 => c"operation timed out",
            _ => c"unknown result code",
        };
        s.as_ptr()
    }

    /// `ncclGetLastError`: the full message of this thread's last error, or of `comm`'s fault
    /// when it has one. Valid until this thread's next error.
    fn ncclGetLastError / pncclGetLastError(comm: NcclComm) -> *const c_char {
        let fault = std::panic::catch_unwind(|| {
            CommHandle::lookup(comm)
                .ok()
                .and_then(|h| h.status().flatten())
        })
        .ok()
        .flatten();
        if let Some(e) = fault {
            set_last_error(&e.to_string());
        }
        LAST_ERROR.with(|l| l.borrow().as_ptr())
    }

    /// `ncclGetUniqueId`: starts the rendezvous root in this process and describes it; with
    /// `NCCL_COMM_ID=<host>:<port>` set, the id naming that address instead (every rank gets
    /// the same one, and rank 0's init serves it).
    fn ncclGetUniqueId / pncclGetUniqueId(unique_id: *mut NcclUniqueId) -> NcclResult {
        guarded(|| {
            let id = match strata::UniqueId::from_nccl_comm_id().map_err(|e| report(&e))? {
                Some(fixed) => fixed,
                None => strata::UniqueId::new().map_err(|e| report(&e))?,
            };
            // SAFETY: per the contract.
            unsafe {
                put(
                    unique_id,
                    NcclUniqueId {
                        internal: *id.as_bytes(),
                    },
                    "uniqueId",
                )?
            };
            Ok(NcclResult::Success)
        })
    }

    /// `ncclCommInitRank`.
    fn ncclCommInitRank / pncclCommInitRank(
        comm: *mut NcclComm,
        nranks: c_int,
        comm_id: NcclUniqueId,
        rank: c_int,
    ) -> NcclResult {
        // SAFETY: per the contract.
        guarded(|| unsafe { init_rank(comm, nranks, &comm_id, rank, std::ptr::null()) })
    }

    /// `ncclCommInitRankConfig`: as `ncclCommInitRank`, with a config read by its size.
    fn ncclCommInitRankConfig / pncclCommInitRankConfig(
        comm: *mut NcclComm,
        nranks: c_int,
        comm_id: NcclUniqueId,
        rank: c_int,
        config: *mut NcclConfig,
    ) -> NcclResult {
        // SAFETY: per the contract.
        guarded(|| unsafe { init_rank(comm, nranks, &comm_id, rank, config) })
    }

    /// `ncclCommInitRankScalable`: the first id's root serves the whole communicator.
    fn ncclCommInitRankScalable / pncclCommInitRankScalable(
        newcomm: *mut NcclComm,
        nranks: c_int,
        myrank: c_int,
        n_id: c_int,
        comm_ids: *mut NcclUniqueId,
        config: *mut NcclConfig,
    ) -> NcclResult {
        guarded(|| {
            if n_id < 1 || comm_ids.is_null() {
                return Err(invalid(format!(
                    "nId is {n_id} and commIds is {comm_ids:p}; need at least one id"
                )));
            }
            // SAFETY: non-NULL, and the caller passes nId ≥ 1 ids.
            let id = unsafe { comm_ids.read_unaligned() };
            // SAFETY: per the contract.
            unsafe { init_rank(newcomm, nranks, &id, myrank, config) }
        })
    }

    /// `ncclCommInitAll`: `ndev` ranks of this process, rank r driving GPU `devlist[r]` (GPU
    /// r when the list is NULL; a GPU may repeat, ranks then share it), each initialised and
    /// bound on a thread of its own. Without a CUDA driver the ranks move host memory.
    fn ncclCommInitAll / pncclCommInitAll(
        comms: *mut NcclComm,
        ndev: c_int,
        devlist: *const c_int,
    ) -> NcclResult {
        guarded(|| {
            if comms.is_null() {
                return Err(invalid("comms is NULL"));
            }
            let n = usize_of(ndev, "ndev")?;
            if n == 0 {
                return Err(invalid("ndev is 0"));
            }
            let gpus = crate::device::driver_loaded()
                .then(|| strata::gpu::driver().map(|d| d.devices).ok())
                .flatten();
            let devices: Vec<Option<i32>> = (0..n)
                .map(|r| {
                    let Some(count) = gpus else {
                        return Ok(None);
                    };
                    // SAFETY: the caller passes ndev entries when devlist is not NULL.
                    let d = if devlist.is_null() { r as c_int } else { unsafe { *devlist.add(r) } };
                    if d < 0 || d as usize >= count {
                        return Err(invalid(format!(
                            "devlist[{r}] is {d}; {count} GPUs are visible"
                        )));
                    }
                    Ok(Some(d))
                })
                .collect::<Result<_, _>>()?;
            let id = strata::UniqueId::new().map_err(|e| report(&e))?;
            let cfg = Config::from_env().map_err(|e| report(&e))?;
            // As NCCL documents it: ncclCommInitRank for every rank inside one group.
            let handles: Vec<_> = (0..n)
                .map(|r| CommHandle::create(true, Some((r, n))))
                .collect();
            let inits = handles.iter().enumerate().map(|(rank, h)| group::DeferredInit {
                handle: h.clone(),
                id,
                nranks: n,
                rank,
                cfg: cfg.clone(),
                device: devices[rank],
            });
            if let (Some(e), _) = group::run_inits(inits.collect()) {
                handles.iter().for_each(|h| h.unregister());
                return Err(report(&e));
            }
            for (r, h) in handles.iter().enumerate() {
                // SAFETY: the caller passes an array of ndev handles.
                unsafe { comms.add(r).write_unaligned(h.id as NcclComm) };
            }
            Ok(NcclResult::Success)
        })
    }

    /// `ncclCommSplit`: ranks with the same color form a communicator, ordered by key;
    /// `NCCL_SPLIT_NOCOLOR` (-1) takes part and gets NULL.
    fn ncclCommSplit / pncclCommSplit(
        comm: NcclComm,
        color: c_int,
        key: c_int,
        newcomm: *mut NcclComm,
        config: *mut NcclConfig,
    ) -> NcclResult {
        guarded(|| {
            // SAFETY: per the contract.
            let h = unsafe { live_parent(comm, newcomm)? };
            if color < -1 {
                return Err(invalid(format!(
                    "color {color} is negative (NCCL_SPLIT_NOCOLOR is -1)"
                )));
            }
            // SAFETY: per the contract.
            let settings = unsafe { settings_of(config, h.blocking)? };
            let color = u32::try_from(color).ok();
            let child = color.map(|_| CommHandle::create(settings.blocking, None));
            // SAFETY: checked writable above.
            unsafe { derive(h, child, newcomm, move |c| c.split(color, key)) }
        })
    }

    /// `ncclCommShrink`: a communicator of the ranks not excluded, called by the survivors
    /// only. `NCCL_SHRINK_ABORT` (1) first revokes the parent, ending its calls in progress.
    fn ncclCommShrink / pncclCommShrink(
        comm: NcclComm,
        exclude_ranks_list: *mut c_int,
        exclude_ranks_count: c_int,
        newcomm: *mut NcclComm,
        config: *mut NcclConfig,
        shrink_flags: c_int,
    ) -> NcclResult {
        guarded(|| {
            let h = comm_of(comm)?;
            // SAFETY: per the contract.
            unsafe { put(newcomm, std::ptr::null_mut(), "newcomm")? };
            if !matches!(shrink_flags, 0 | 1) {
                return Err(invalid(format!(
                    "shrinkFlags {shrink_flags}: use NCCL_SHRINK_DEFAULT (0) or \
                     NCCL_SHRINK_ABORT (1)"
                )));
            }
            let n = usize_of(exclude_ranks_count, "excludeRanksCount")?;
            if n > 0 && exclude_ranks_list.is_null() {
                return Err(invalid("excludeRanksList is NULL"));
            }
            let mut exclude = Vec::with_capacity(n);
            for i in 0..n {
                // SAFETY: the caller passes excludeRanksCount ranks.
                let r = unsafe { exclude_ranks_list.add(i).read_unaligned() };
                exclude.push(usize_of(r, "excluded rank")?);
            }
            // SAFETY: per the contract.
            let settings = unsafe { settings_of(config, h.blocking)? };
            if shrink_flags == 1
                && let Some(c) = h.ready() {
                    c.revoke();
                }
            let child = CommHandle::create(settings.blocking, None);
            // SAFETY: checked writable above.
            unsafe { derive(h, Some(child), newcomm, move |c| c.shrink(&exclude).map(Some)) }
        })
    }

    /// `ncclCommRevoke`: every rank's call in progress on `comm`, and every later one, fails;
    /// the revocation reaches all ranks through the watchdog.
    fn ncclCommRevoke / pncclCommRevoke(comm: NcclComm, revoke_flags: c_int) -> NcclResult {
        guarded(|| {
            let h = comm_of(comm)?;
            if revoke_flags != 0 {
                return Err(invalid(format!(
                    "revokeFlags {revoke_flags}: must be NCCL_REVOKE_DEFAULT (0)"
                )));
            }
            h.wait_ready(init_limit()).map_err(|e| report(&e))?.revoke();
            Ok(NcclResult::Success)
        })
    }

    /// `ncclCommFinalize`: no new operations; `ncclInProgress` while queued work remains.
    fn ncclCommFinalize / pncclCommFinalize(comm: NcclComm) -> NcclResult {
        guarded(|| {
            let h = comm_of(comm)?;
            h.finalized.store(true, Ordering::Release);
            Ok(if h.has_pending_work() {
                NcclResult::InProgress
            } else {
                NcclResult::Success
            })
        })
    }

    /// `ncclCommDestroy`: waits for queued work, then frees the communicator (its peers hear
    /// a goodbye). The handle is dead afterwards: using it again is `ncclInvalidArgument`.
    fn ncclCommDestroy / pncclCommDestroy(comm: NcclComm) -> NcclResult {
        guarded(|| {
            let h = comm_of(comm)?;
            h.unregister();
            h.close(true);
            Ok(NcclResult::Success)
        })
    }

    /// `ncclCommAbort`: stops the call in progress (from any thread) and frees the
    /// communicator without waiting for queued work.
    fn ncclCommAbort / pncclCommAbort(comm: NcclComm) -> NcclResult {
        guarded(|| {
            let h = comm_of(comm)?;
            h.unregister();
            if let Some(c) = h.ready() {
                c.abort();
            }
            h.close(false);
            Ok(NcclResult::Success)
        })
    }

    /// `ncclCommGetAsyncError`: `ncclInProgress` while init or queued work runs, else the
    /// communicator's first error (the fault that broke it) or `ncclSuccess`.
    fn ncclCommGetAsyncError / pncclCommGetAsyncError(
        comm: NcclComm,
        async_error: *mut NcclResult,
    ) -> NcclResult {
        guarded(|| {
            let h = comm_of(comm)?;
            let state = match h.status() {
                None => NcclResult::InProgress,
                Some(None) => NcclResult::Success,
                Some(Some(e)) => {
                    set_last_error(&e.to_string());
                    result_of(&e)
                }
            };
            // SAFETY: per the contract.
            unsafe { put(async_error, state, "asyncError")? };
            Ok(NcclResult::Success)
        })
    }

    /// `ncclCommCount`: the number of ranks.
    fn ncclCommCount / pncclCommCount(comm: NcclComm, count: *mut c_int) -> NcclResult {
        // SAFETY: per the contract.
        guarded(|| unsafe { query(comm, count, "count", |c| c.size()) })
    }

    /// `ncclCommUserRank`: this rank.
    fn ncclCommUserRank / pncclCommUserRank(comm: NcclComm, rank: *mut c_int) -> NcclResult {
        // SAFETY: per the contract.
        guarded(|| unsafe { query(comm, rank, "rank", |c| c.rank()) })
    }

    /// `ncclCommCuDevice`: the GPU the communicator is bound to (at init, to the caller's
    /// current device or `ncclCommInitAll`'s list; else at its first call on device memory);
    /// `ncclInvalidUsage` for a communicator that drives none.
    fn ncclCommCuDevice / pncclCommCuDevice(comm: NcclComm, device: *mut c_int) -> NcclResult {
        guarded(|| {
            let bound = comm_of(comm)?.ready().and_then(|c| c.bound_device());
            // SAFETY: per the contract.
            unsafe { put(device, bound.unwrap_or(-1), "device")? };
            match bound {
                Some(_) => Ok(NcclResult::Success),
                None => Err(fail(
                    NcclResult::InvalidUsage,
                    "this communicator drives no GPU (not bound: no current device at init \
                     and no call on device memory yet)",
                )),
            }
        })
    }
}

/// `strataCommSetTimeout` (strata's own, not NCCL's): sets the deadline of each later call on
/// `comm` to `seconds` (more than 0, at most a year), for this communicator alone, where
/// `STRATA_TIMEOUT` sets every communicator's at init. PyTorch's backend passes a group's
/// timeout this way, so that threads making groups at once need not share the environment.
/// Waits for a non-blocking communicator's init to finish first.
///
/// # Safety
/// None beyond the C ABI's: `comm` is checked.
#[unsafe(no_mangle)]
pub extern "C" fn strataCommSetTimeout(comm: NcclComm, seconds: f64) -> NcclResult {
    guarded(|| {
        if !(seconds > 0.0 && seconds <= 365.0 * 86_400.0) {
            return Err(invalid(format!(
                "timeout of {seconds} s: want more than 0 and at most a year"
            )));
        }
        let h = comm_of(comm)?;
        let c = h.wait_ready(init_limit()).map_err(|e| report(&e))?;
        c.set_timeout(Duration::from_secs_f64(seconds))
            .map_err(|e| report(&e))?;
        Ok(NcclResult::Success)
    })
}

/// `strataCommGetStragglers` (strata's own, not NCCL's): the peers this rank names as
/// persistently slow (`Communicator::stragglers`), as a JSON array of objects (`rank`,
/// `calls`, `late_share`, `stall_share`, `median_late_ms`, `own_stall_share`), written with a
/// terminating NUL into `json` of `capacity` bytes. `*length` is always set to the text's
/// length without the NUL; a buffer too small is `ncclInvalidArgument` and is left untouched.
///
/// # Safety
/// `json` must be NULL or writable for `capacity` bytes; `length` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strataCommGetStragglers(
    comm: NcclComm,
    json: *mut c_char,
    capacity: usize,
    length: *mut usize,
) -> NcclResult {
    guarded(|| {
        let h = comm_of(comm)?;
        let c = h.wait_ready(init_limit()).map_err(|e| report(&e))?;
        let text = serde_json::to_string(&c.stragglers())
            .map_err(|e| fail(NcclResult::InternalError, e))?;
        // SAFETY: per the contract.
        unsafe { put_json(&text, json, capacity, length, "the straggler list") }
    })
}

/// Writes `text` with a NUL into `json` of `capacity` bytes and its length into `*length`
/// (always); a buffer too small is `ncclInvalidArgument`, naming `what` and the bytes needed.
///
/// # Safety
/// `json` must be NULL or writable for `capacity` bytes; `length` NULL or writable.
unsafe fn put_json(
    text: &str,
    json: *mut c_char,
    capacity: usize,
    length: *mut usize,
    what: &str,
) -> std::result::Result<NcclResult, NcclResult> {
    // SAFETY: per the contract.
    unsafe { put(length, text.len(), "length")? };
    if json.is_null() {
        return Err(invalid("json is NULL"));
    }
    if capacity <= text.len() {
        return Err(invalid(format!(
            "{what} needs {} bytes with its NUL; the buffer has {capacity}",
            text.len() + 1
        )));
    }
    // SAFETY: `json` is writable for `capacity` > text.len() bytes, per the contract.
    unsafe {
        std::ptr::copy_nonoverlapping(text.as_ptr(), json.cast::<u8>(), text.len());
        *json.add(text.len()) = 0;
    }
    Ok(NcclResult::Success)
}

/// `strataCommGetStatus` (strata's own, not NCCL's): the live view of the communicator
/// (`Communicator::status`): every rank's call, how long it has been in it, whom it waits
/// on, stragglers, faults, silent ranks and who holds the job up, gathered from the ranks
/// within `within_s` seconds, as a JSON object written as `strataCommGetStragglers` writes
/// its list. A buffer too small gets `*length` and `ncclInvalidArgument`; ask again with
/// more (the view is gathered anew).
///
/// # Safety
/// `json` must be NULL or writable for `capacity` bytes; `length` NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strataCommGetStatus(
    comm: NcclComm,
    within_s: f64,
    json: *mut c_char,
    capacity: usize,
    length: *mut usize,
) -> NcclResult {
    guarded(|| {
        if !(within_s > 0.0 && within_s <= 30.0) {
            return Err(invalid(format!(
                "within_s must be above 0 and at most 30 seconds, got {within_s}"
            )));
        }
        let h = comm_of(comm)?;
        let c = h.wait_ready(init_limit()).map_err(|e| report(&e))?;
        let text = serde_json::to_string(&c.status(Duration::from_secs_f64(within_s)))
            .map_err(|e| fail(NcclResult::InternalError, e))?;
        // SAFETY: per the contract.
        unsafe { put_json(&text, json, capacity, length, "the status view") }
    })
}

/// `strataRecvAny` (strata's own, not NCCL's): receives `count` elements of `datatype` into
/// host memory `recvbuff` from whichever rank's `ncclSend` to this rank arrives first (MPI's
/// `MPI_ANY_SOURCE`) and writes that rank to `*source`. Not inside a group, and not on GPU
/// memory; on a non-blocking communicator it runs after the calls queued before it and
/// `*source` is written when `ncclCommGetAsyncError` says success.
///
/// # Safety
/// `recvbuff` must be writable for `count` elements of `datatype` (or NULL with `count` 0)
/// and `source` writable, until the call completes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strataRecvAny(
    recvbuff: *mut c_void,
    count: usize,
    datatype: c_int,
    source: *mut c_int,
    comm: NcclComm,
) -> NcclResult {
    guarded(|| {
        let h = comm_of(comm)?;
        live(&h)?;
        let dtype = dtype_of(datatype)?;
        let bytes = count
            .checked_mul(dtype.size())
            .filter(|&b| b <= isize::MAX as usize)
            .ok_or_else(|| invalid(format!("count {count} of {dtype} overflows")))?;
        if bytes > 0 && recvbuff.is_null() {
            return Err(invalid(format!("recv buffer is NULL with count {count}")));
        }
        if source.is_null() {
            return Err(invalid("source is NULL"));
        }
        if group::active() {
            return Err(fail(
                NcclResult::InvalidUsage,
                "strataRecvAny cannot be part of a group: which peer it pairs with is known only when a message arrives",
            ));
        }
        if bytes > 0 && device::any_device(&[recvbuff as *const u8]) {
            return Err(invalid("strataRecvAny receives into host memory only"));
        }
        let (buf, out) = (recvbuff as usize, source as usize);
        let run = move |c: &Communicator| -> strata::Result<()> {
            let data: &mut [u8] = if bytes == 0 {
                &mut []
            } else {
                // SAFETY: writable for `bytes` bytes until the call completes, per the contract.
                unsafe { std::slice::from_raw_parts_mut(buf as *mut u8, bytes) }
            };
            let from = c.recv_any_as(dtype, data)?;
            // SAFETY: writable, per the contract.
            unsafe { *(out as *mut c_int) = from as c_int };
            Ok(())
        };
        if h.blocking {
            let c = h.wait_ready(init_limit()).map_err(|e| report(&e))?;
            return run(&c)
                .map(|()| NcclResult::Success)
                .map_err(|e| report(&e));
        }
        let handle = h.clone();
        h.submit(Box::new(move || {
            let c = handle.wait_ready(init_limit())?;
            run(&c)
        }))
        .map(|()| NcclResult::InProgress)
        .map_err(|e| report(&e))
    })
}

/// `strataCommSubgroup` (strata's own, not NCCL's): a communicator of the ranks
/// `parentRanks[0..nranks)` of `comm` (rank `i` of it is `parentRanks[i]`), made by those
/// ranks alone and with no message: each builds the same table from `comm`'s, and `comm`'s
/// listener serves it. It is what a framework's sub-group needs when only its members take
/// part (PyTorch's `new_group`); `ncclCommSplit` needs every rank of `comm`. Every member
/// passes the same list and `tag`, and `tag` is new among `comm`'s live sub-communicators;
/// members that disagree get communicators whose first call fails naming the mismatch.
///
/// # Safety
/// `parentRanks` must be readable for `nranks` ints, `tag` a NUL-terminated string, and
/// `newcomm` writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn strataCommSubgroup(
    comm: NcclComm,
    nranks: c_int,
    parent_ranks: *const c_int,
    tag: *const std::ffi::c_char,
    newcomm: *mut NcclComm,
) -> NcclResult {
    guarded(|| {
        // SAFETY: per the contract.
        let h = unsafe { live_parent(comm, newcomm)? };
        let n = usize_of(nranks, "nranks")?;
        if n == 0 || parent_ranks.is_null() {
            return Err(invalid(
                "a sub-communicator needs nranks > 0 and a parentRanks list",
            ));
        }
        // The list is read only as far as the parent could have members.
        let size = match h.shape.get() {
            Some(&(_, size)) => size,
            None => h.wait_ready(init_limit()).map_err(|e| report(&e))?.size(),
        };
        if n > size {
            return Err(invalid(format!(
                "nranks {n} is more than the parent's {size} ranks"
            )));
        }
        if tag.is_null() {
            return Err(invalid("tag is NULL"));
        }
        // SAFETY: a NUL-terminated string, per the contract.
        let tag = unsafe { std::ffi::CStr::from_ptr(tag) }
            .to_string_lossy()
            .into_owned();
        let mut members = Vec::with_capacity(n);
        for i in 0..n {
            // SAFETY: the caller passes nranks ranks.
            let r = unsafe { parent_ranks.add(i).read_unaligned() };
            members.push(usize_of(r, "parent rank")?);
        }
        let child = CommHandle::create(h.blocking, None);
        let make = move |c: &Communicator| c.subgroup(&members, &tag).map(Some);
        // SAFETY: checked writable above.
        unsafe { derive(h, Some(child), newcomm, make) }
    })
}
