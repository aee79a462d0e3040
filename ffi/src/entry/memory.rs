//! Entry points for memory and operators: registration, windows, `ncclMemAlloc` and
//! `ncclRedOpCreatePreMulSum`.

use crate::*;

/// Device memory handed out by `ncclMemAlloc`: address → (bytes, device).
fn device_allocations() -> &'static Mutex<HashMap<usize, (usize, i32)>> {
    static ALLOCS: OnceLock<Mutex<HashMap<usize, (usize, i32)>>> = OnceLock::new();
    ALLOCS.get_or_init(Default::default)
}

/// Host memory handed out by `ncclMemAlloc`: address → layout.
fn allocations() -> &'static Mutex<HashMap<usize, std::alloc::Layout>> {
    static ALLOCS: OnceLock<Mutex<HashMap<usize, std::alloc::Layout>>> = OnceLock::new();
    ALLOCS.get_or_init(Default::default)
}

nccl_api! {
    /// `ncclCommRegister`: records the buffer in the communicator's registration table (strata's
    /// shared-memory and TCP transports copy through their own buffers, so the record is all a
    /// registration needs).
    fn ncclCommRegister / pncclCommRegister(
        comm: NcclComm,
        buff: *mut c_void,
        size: usize,
        handle: *mut *mut c_void,
    ) -> NcclResult {
        guarded(|| {
            let h = comm_of(comm)?;
            if buff.is_null() || size == 0 {
                return Err(invalid(format!("cannot register {size} bytes at {buff:p}")));
            }
            let token = next_token();
            // SAFETY: per the contract.
            unsafe { put(handle, token as *mut c_void, "handle")? };
            lock(&h.registrations).insert(token, (buff as usize, size));
            Ok(NcclResult::Success)
        })
    }

    /// `ncclCommDeregister`: removes a registration; an unknown handle is an error.
    fn ncclCommDeregister / pncclCommDeregister(
        comm: NcclComm,
        handle: *mut c_void,
    ) -> NcclResult {
        guarded(|| {
            let h = comm_of(comm)?;
            match lock(&h.registrations).remove(&(handle as usize)) {
                Some(_) => Ok(NcclResult::Success),
                None => Err(invalid(format!(
                    "{handle:p} is not a registration of this communicator"
                ))),
            }
        })
    }

    /// `ncclCommWindowRegister`: records a window (flags `NCCL_WIN_DEFAULT`,
    /// `NCCL_WIN_COLL_SYMMETRIC`) in the communicator's table, as a registration.
    fn ncclCommWindowRegister / pncclCommWindowRegister(
        comm: NcclComm,
        buff: *mut c_void,
        size: usize,
        win: *mut *mut c_void,
        win_flags: c_int,
    ) -> NcclResult {
        guarded(|| {
            let h = comm_of(comm)?;
            if buff.is_null() || size == 0 {
                return Err(invalid(format!(
                    "cannot register a window of {size} bytes at {buff:p}"
                )));
            }
            if win_flags & !0x3 != 0 {
                return Err(invalid(format!(
                    "window flags {win_flags:#x} are not NCCL_WIN_* flags"
                )));
            }
            let token = next_token();
            // SAFETY: per the contract.
            unsafe { put(win, token as *mut c_void, "win")? };
            lock(&h.windows).insert(token, (buff as usize, size, win_flags));
            Ok(NcclResult::Success)
        })
    }

    /// `ncclCommWindowDeregister`.
    fn ncclCommWindowDeregister / pncclCommWindowDeregister(
        comm: NcclComm,
        win: *mut c_void,
    ) -> NcclResult {
        guarded(|| {
            let h = comm_of(comm)?;
            match lock(&h.windows).remove(&(win as usize)) {
                Some(_) => Ok(NcclResult::Success),
                None => Err(invalid(format!(
                    "{win:p} is not a window of this communicator"
                ))),
            }
        })
    }

    /// `ncclMemAlloc`: page-aligned, zeroed host memory (this build's buffers are host memory).
    fn ncclMemAlloc / pncclMemAlloc(ptr: *mut *mut c_void, size: usize) -> NcclResult {
        guarded(|| {
            if size == 0 {
                return Err(invalid("ncclMemAlloc of 0 bytes"));
            }
            let layout = std::alloc::Layout::from_size_align(size, 4096)
                .map_err(|_| invalid(format!("cannot allocate {size} bytes")))?;
            if ptr.is_null() {
                return Err(invalid("ptr is NULL"));
            }
            // With the CUDA driver loaded and a device current, device memory (as NCCL's).
            if device::driver_loaded()
                && let Ok(Some(dev)) = strata::gpu::current_device() {
                    let b = strata::gpu::DeviceBuffer::alloc(dev, size).map_err(|e| report(&e))?;
                    lock(device_allocations()).insert(b.ptr() as usize, (size, dev));
                    // SAFETY: checked non-NULL above.
                    unsafe { put(ptr, b.into_raw() as *mut c_void, "ptr")? };
                    return Ok(NcclResult::Success);
                }
            // SAFETY: the layout has a non-zero size.
            let p = unsafe { std::alloc::alloc_zeroed(layout) };
            if p.is_null() {
                return Err(fail(
                    NcclResult::SystemError,
                    format!("out of memory allocating {size} bytes"),
                ));
            }
            lock(allocations()).insert(p as usize, layout);
            // SAFETY: checked non-NULL above.
            unsafe { put(ptr, p.cast(), "ptr")? };
            Ok(NcclResult::Success)
        })
    }

    /// `ncclMemFree`: frees what `ncclMemAlloc` returned; NULL is a no-op, anything else an
    /// error.
    fn ncclMemFree / pncclMemFree(ptr: *mut c_void) -> NcclResult {
        guarded(|| {
            if ptr.is_null() {
                return Ok(NcclResult::Success);
            }
            if let Some((len, dev)) = lock(device_allocations()).remove(&(ptr as usize)) {
                // SAFETY: made by DeviceBuffer::alloc in ncclMemAlloc and given up there.
                drop(unsafe { strata::gpu::DeviceBuffer::from_raw(ptr as u64, len, dev) });
                return Ok(NcclResult::Success);
            }
            let layout = lock(allocations()).remove(&(ptr as usize)).ok_or_else(|| {
                invalid(format!(
                    "{ptr:p} was not allocated by ncclMemAlloc (or was freed already)"
                ))
            })?;
            // A registration of this memory with a NIC must not outlive it.
            strata::rdma::regcache::invalidate(ptr as *const u8, layout.size());
            // SAFETY: allocated by alloc_zeroed with this layout and not yet freed.
            unsafe { std::alloc::dealloc(ptr.cast(), layout) };
            Ok(NcclResult::Success)
        })
    }

    /// `ncclRedOpCreatePreMulSum`: an operator that multiplies each rank's input by its scalar
    /// and sums. `ncclScalarHostImmediate` (1) reads the scalar now; `ncclScalarDevice` (0)
    /// reads it when each call runs.
    fn ncclRedOpCreatePreMulSum / pncclRedOpCreatePreMulSum(
        op: *mut c_int,
        scalar: *mut c_void,
        datatype: c_int,
        residence: c_int,
        comm: NcclComm,
    ) -> NcclResult {
        guarded(|| {
            let h = comm_of(comm)?;
            let dtype = dtype_of(datatype)?;
            if op.is_null() || scalar.is_null() {
                return Err(invalid("op or scalar is NULL"));
            }
            if residence == 1 && device::any_device(&[scalar as *const u8]) {
                return Err(invalid(
                    "ncclScalarHostImmediate takes a host scalar; this one is GPU memory \
                     (use ncclScalarDevice)",
                ));
            }
            let made = match residence {
                1 => {
                    let mut bytes = [0u8; 8];
                    // SAFETY: the scalar points to one element of `dtype`.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            scalar as *const u8,
                            bytes.as_mut_ptr(),
                            dtype.size(),
                        )
                    };
                    UserOp::Immediate(Scalar { dtype, bytes })
                }
                0 => UserOp::Deferred(scalar as usize, dtype),
                r => {
                    return Err(invalid(format!(
                        "residence {r} is neither ncclScalarDevice (0) nor \
                         ncclScalarHostImmediate (1)"
                    )));
                }
            };
            let mut ops = lock(&h.ops);
            let index = match ops.iter().position(Option::is_none) {
                Some(i) => i,
                None => {
                    ops.push(None);
                    ops.len() - 1
                }
            };
            let value = c_int::try_from(index + FIRST_USER_OP)
                .map_err(|_| fail(NcclResult::InternalError, "too many reduction operators"))?;
            ops[index] = Some(made);
            // SAFETY: checked non-NULL above.
            unsafe { put(op, value, "op")? };
            Ok(NcclResult::Success)
        })
    }

    /// `ncclRedOpDestroy`: frees an operator made by `ncclRedOpCreatePreMulSum`.
    fn ncclRedOpDestroy / pncclRedOpDestroy(op: c_int, comm: NcclComm) -> NcclResult {
        guarded(|| {
            let h = comm_of(comm)?;
            let index = usize::try_from(op)
                .ok()
                .and_then(|o| o.checked_sub(FIRST_USER_OP));
            let mut ops = lock(&h.ops);
            match index.and_then(|i| ops.get_mut(i)) {
                Some(slot @ Some(_)) => {
                    *slot = None;
                    Ok(NcclResult::Success)
                }
                _ => Err(invalid(format!(
                    "reduction operator {op} was not made by ncclRedOpCreatePreMulSum on this \
                     communicator (built-ins cannot be destroyed)"
                ))),
            }
        })
    }
}
