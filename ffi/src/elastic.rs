//! The entry points NCCL added in 2.29 and 2.30 that PyTorch 2.15 imports: growing a
//! communicator, suspend/resume and memory statistics, window pointers, and the device-side
//! and one-sided (signal) APIs.
//!
//! Symbols bind when `libtorch_cuda.so` loads, so every one must exist for `import torch` to
//! succeed with strata preloaded. Those strata can give NCCL's meaning have it; the device API
//! and the signals, which need GPU kernels or collective windows, fail with
//! `ncclInvalidUsage` and a `ncclGetLastError` text that says so.

use super::{
    Ffi, NcclComm, NcclConfig, NcclResult, NcclUniqueId, comm_of, entry::derive, entry::init_rank,
    entry::live_parent, fail, guarded, invalid, live, put, report, settings_of, usize_of,
};
use crate::handle::{CommHandle, lock};
use std::ffi::{c_int, c_void};
use std::sync::atomic::Ordering;
use strata::UniqueId;

/// `NCCL_SUSPEND_MEM`: release what can be released while suspended.
pub const SUSPEND_MEM: c_int = 0x01;

/// `ncclCommMemStat_t` values.
pub mod mem_stat {
    use std::ffi::c_int;
    /// GPU memory that suspending would release (bytes).
    pub const GPU_MEM_SUSPEND: c_int = 0;
    /// Whether the communicator is suspended (0 or 1).
    pub const GPU_MEM_SUSPENDED: c_int = 1;
    /// GPU memory that stays while suspended (bytes).
    pub const GPU_MEM_PERSIST: c_int = 2;
    /// All GPU memory the communicator holds (bytes).
    pub const GPU_MEM_TOTAL: c_int = 3;
}

fn no_device_api(name: &str) -> NcclResult {
    fail(
        NcclResult::InvalidUsage,
        format!(
            "{name}: NCCL's device-side API runs inside GPU kernels; this strata build moves \
             host memory and has no device communicators or device pointers"
        ),
    )
}

fn no_signals(name: &str) -> NcclResult {
    fail(
        NcclResult::InvalidUsage,
        format!(
            "{name}: one-sided signals (ncclPutSignal, ncclSignal, ncclWaitSignal) are not \
             implemented by strata: its windows are per-rank records, not remote memory"
        ),
    )
}

/// A call on `comm` that strata refuses: `ncclInvalidArgument` for a bad handle, as everywhere,
/// else the refusal `why` builds.
fn refused(comm: NcclComm, why: impl FnOnce() -> NcclResult) -> NcclResult {
    guarded(|| {
        comm_of(comm)?;
        Err(why())
    })
}

nccl_api! {
    /// `ncclCommGetUniqueId`: a new id for growing `comm`, served by this process (the one
    /// existing rank that calls it passes the id to `ncclCommGrow`, and to the new ranks).
    fn ncclCommGetUniqueId / pncclCommGetUniqueId(
        comm: NcclComm,
        unique_id: *mut NcclUniqueId,
    ) -> NcclResult {
        guarded(|| {
            let h = comm_of(comm)?;
            live(&h)?;
            let c = h.wait_ready(super::init_limit()).map_err(|e| report(&e))?;
            let id = c.grow_id().map_err(|e| report(&e))?;
            // SAFETY: per the contract.
            unsafe { put(unique_id, NcclUniqueId { internal: *id.as_bytes() }, "uniqueId")? };
            Ok(NcclResult::Success)
        })
    }

    /// `ncclCommGrow`: a communicator of `nRanks` ranks. Existing ranks pass their `comm` and
    /// rank -1 (they keep their ranks), the one that called `ncclCommGetUniqueId` its id and
    /// the others NULL; new ranks pass NULL, the id and their new rank.
    fn ncclCommGrow / pncclCommGrow(
        comm: NcclComm,
        n_ranks: c_int,
        unique_id: *const NcclUniqueId,
        rank: c_int,
        newcomm: *mut NcclComm,
        config: *mut NcclConfig,
    ) -> NcclResult {
        guarded(|| -> Ffi {
            if comm.is_null() {
                if unique_id.is_null() {
                    return Err(invalid(
                        "ncclCommGrow: a new rank (comm NULL) passes the uniqueId from ncclCommGetUniqueId",
                    ));
                }
                // SAFETY: non-NULL, per the contract.
                let id = unsafe { unique_id.read_unaligned() };
                // SAFETY: per the contract.
                return unsafe { init_rank(newcomm, n_ranks, &id, rank, config) };
            }
            // SAFETY: per the contract.
            let h = unsafe { live_parent(comm, newcomm)? };
            if rank != -1 {
                return Err(invalid(format!(
                    "ncclCommGrow: an existing rank passes rank -1 (it keeps its rank), not {rank}"
                )));
            }
            let total = usize_of(n_ranks, "nRanks")?;
            // SAFETY: NULL or a readable id, per the contract.
            let offered = (!unique_id.is_null()).then(|| unsafe { unique_id.read_unaligned() }.internal);
            let offered = offered
                .map(|bytes| UniqueId::from_bytes(&bytes))
                .transpose()
                .map_err(|e| report(&e))?;
            // SAFETY: per the contract.
            let settings = unsafe { settings_of(config, h.blocking)? };
            let child = CommHandle::create(settings.blocking, None);
            let make = move |c: &strata::Communicator| c.grow(offered.as_ref(), total).map(Some);
            // SAFETY: checked writable above.
            unsafe { derive(h, Some(child), newcomm, make) }
        })
    }

    /// `ncclCommSuspend`: the communicator takes no operations until `ncclCommResume`. With
    /// `NCCL_SUSPEND_MEM` NCCL releases GPU memory; strata holds none, so nothing is released.
    fn ncclCommSuspend / pncclCommSuspend(comm: NcclComm, flags: c_int) -> NcclResult {
        guarded(|| {
            let h = comm_of(comm)?;
            if flags & !SUSPEND_MEM != 0 {
                return Err(invalid(format!(
                    "suspend flags {flags:#x}: the only flag is NCCL_SUSPEND_MEM (1)"
                )));
            }
            if h.has_pending_work() {
                return Err(fail(
                    NcclResult::InvalidUsage,
                    "ncclCommSuspend: the communicator still has operations in progress",
                ));
            }
            h.suspended.store(true, Ordering::Release);
            Ok(NcclResult::Success)
        })
    }

    /// `ncclCommResume`: ends a suspension.
    fn ncclCommResume / pncclCommResume(comm: NcclComm) -> NcclResult {
        guarded(|| {
            let h = comm_of(comm)?;
            if !h.suspended.swap(false, Ordering::AcqRel) {
                return Err(fail(
                    NcclResult::InvalidUsage,
                    "ncclCommResume: the communicator is not suspended",
                ));
            }
            Ok(NcclResult::Success)
        })
    }

    /// `ncclCommMemStats`: GPU memory the communicator holds, which for strata is none (its
    /// buffers are host memory), and whether it is suspended.
    fn ncclCommMemStats / pncclCommMemStats(
        comm: NcclComm,
        stat: c_int,
        value: *mut u64,
    ) -> NcclResult {
        guarded(|| {
            let h = comm_of(comm)?;
            let v = match stat {
                mem_stat::GPU_MEM_SUSPENDED => u64::from(h.suspended.load(Ordering::Acquire)),
                mem_stat::GPU_MEM_SUSPEND | mem_stat::GPU_MEM_PERSIST | mem_stat::GPU_MEM_TOTAL => 0,
                _ => return Err(invalid(format!("{stat} is not an ncclCommMemStat_t"))),
            };
            // SAFETY: per the contract.
            unsafe { put(value, v, "value")? };
            Ok(NcclResult::Success)
        })
    }

    /// `ncclWinGetUserPtr`: the buffer a window of `comm` was registered on.
    fn ncclWinGetUserPtr / pncclWinGetUserPtr(
        comm: NcclComm,
        win: *mut c_void,
        out_user_ptr: *mut *mut c_void,
    ) -> NcclResult {
        guarded(|| {
            let h = comm_of(comm)?;
            let addr = lock(&h.windows)
                .get(&(win as usize))
                .map(|w| w.0)
                .ok_or_else(|| invalid(format!("{win:p} is not a window of this communicator")))?;
            // SAFETY: per the contract.
            unsafe { put(out_user_ptr, addr as *mut c_void, "outUserPtr")? };
            Ok(NcclResult::Success)
        })
    }

    /// `ncclDevCommCreate` (device API): `ncclInvalidUsage`, see the module doc.
    fn ncclDevCommCreate / pncclDevCommCreate(
        comm: NcclComm,
        reqs: *const c_void,
        out_dev_comm: *mut c_void,
    ) -> NcclResult {
        let _ = (reqs, out_dev_comm);
        refused(comm, || no_device_api("ncclDevCommCreate"))
    }

    /// `ncclDevCommDestroy` (device API): `ncclInvalidUsage`; none was ever created.
    fn ncclDevCommDestroy / pncclDevCommDestroy(comm: NcclComm, dev_comm: *const c_void) -> NcclResult {
        let _ = dev_comm;
        refused(comm, || no_device_api("ncclDevCommDestroy"))
    }

    /// `ncclGetLsaMultimemDevicePointer` (device API): NULL and `ncclInvalidUsage`.
    fn ncclGetLsaMultimemDevicePointer / pncclGetLsaMultimemDevicePointer(
        window: *mut c_void,
        offset: usize,
        out_ptr: *mut *mut c_void,
    ) -> NcclResult {
        let _ = (window, offset);
        guarded(|| {
            // SAFETY: per the contract.
            unsafe { put(out_ptr, std::ptr::null_mut(), "outPtr")? };
            Err(no_device_api("ncclGetLsaMultimemDevicePointer"))
        })
    }

    /// `ncclGetPeerDevicePointer` (device API): NULL and `ncclInvalidUsage`.
    fn ncclGetPeerDevicePointer / pncclGetPeerDevicePointer(
        window: *mut c_void,
        offset: usize,
        peer: c_int,
        out_ptr: *mut *mut c_void,
    ) -> NcclResult {
        let _ = (window, offset, peer);
        guarded(|| {
            // SAFETY: per the contract.
            unsafe { put(out_ptr, std::ptr::null_mut(), "outPtr")? };
            Err(no_device_api("ncclGetPeerDevicePointer"))
        })
    }

    /// `ncclPutSignal`: `ncclInvalidUsage`, see the module doc.
    fn ncclPutSignal / pncclPutSignal(
        localbuff: *const c_void,
        count: usize,
        datatype: c_int,
        peer: c_int,
        peer_win: *mut c_void,
        peer_win_offset: usize,
        sig_idx: c_int,
        ctx: c_int,
        flags: u32,
        comm: NcclComm,
        stream: *mut c_void,
    ) -> NcclResult {
        let _ = (localbuff, count, datatype, peer, peer_win, peer_win_offset, sig_idx, ctx, flags, stream);
        refused(comm, || no_signals("ncclPutSignal"))
    }

    /// `ncclSignal`: `ncclInvalidUsage`, see the module doc.
    fn ncclSignal / pncclSignal(
        peer: c_int,
        sig_idx: c_int,
        ctx: c_int,
        flags: u32,
        comm: NcclComm,
        stream: *mut c_void,
    ) -> NcclResult {
        let _ = (peer, sig_idx, ctx, flags, stream);
        refused(comm, || no_signals("ncclSignal"))
    }

    /// `ncclWaitSignal`: `ncclInvalidUsage`, see the module doc.
    fn ncclWaitSignal / pncclWaitSignal(
        n_desc: c_int,
        signal_descs: *mut c_void,
        comm: NcclComm,
        stream: *mut c_void,
    ) -> NcclResult {
        let _ = (n_desc, signal_descs, stream);
        refused(comm, || no_signals("ncclWaitSignal"))
    }
}
