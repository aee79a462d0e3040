//! Streams and events.

use super::driver::{call, set_device};
use crate::error::Result;
use cudarc::driver::sys;

/// A CUDA stream: made here (and destroyed on drop) or borrowed from the caller (PyTorch's
/// current stream, a `cudaStream_t` passed to the C ABI).
#[derive(Debug)]
pub struct Stream {
    raw: sys::CUstream,
    owned: bool,
}

// SAFETY: stream handles may be used from any thread (the driver is thread-safe).
unsafe impl Send for Stream {}
// SAFETY: as above.
unsafe impl Sync for Stream {}

impl Stream {
    /// A new non-blocking stream on `device` (its primary context becomes current).
    pub fn new(device: i32) -> Result<Self> {
        set_device(device)?;
        let mut raw: sys::CUstream = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        call("cuStreamCreate", || unsafe {
            sys::cuStreamCreate(&mut raw, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32)
        })?;
        Ok(Self { raw, owned: true })
    }

    /// Borrows a stream handle made elsewhere (NULL is the legacy default stream).
    ///
    /// # Safety
    /// `raw` must be a valid stream (or NULL) for as long as this value and the work enqueued
    /// through it live.
    pub unsafe fn borrowed(raw: *mut std::ffi::c_void) -> Self {
        Self {
            raw: raw as sys::CUstream,
            owned: false,
        }
    }

    /// The raw handle.
    pub fn raw(&self) -> sys::CUstream {
        self.raw
    }

    /// Waits until everything enqueued so far has run.
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: a valid stream.
        call("cuStreamSynchronize", || unsafe {
            sys::cuStreamSynchronize(self.raw)
        })
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if self.owned {
            // SAFETY: made by cuStreamCreate; the driver finishes its work before freeing it.
            let _ = call("cuStreamDestroy", || unsafe {
                sys::cuStreamDestroy_v2(self.raw)
            });
        }
    }
}

/// A CUDA event, for ordering and for timing (as nccl-tests times with events).
#[derive(Debug)]
pub struct Event {
    raw: sys::CUevent,
}

// SAFETY: event handles may be used from any thread.
unsafe impl Send for Event {}
// SAFETY: as above.
unsafe impl Sync for Event {}

impl Event {
    /// A new event that records time (`timing`) or only ordering; a context must be current.
    pub fn new(timing: bool) -> Result<Self> {
        let flags = if timing {
            sys::CUevent_flags::CU_EVENT_DEFAULT as u32
        } else {
            sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32
        };
        let mut raw: sys::CUevent = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        call("cuEventCreate", || unsafe {
            sys::cuEventCreate(&mut raw, flags)
        })?;
        Ok(Self { raw })
    }

    /// Records the event on `stream`: it completes when the stream's earlier work has.
    pub fn record(&self, stream: &Stream) -> Result<()> {
        // SAFETY: valid event and stream.
        call("cuEventRecord", || unsafe {
            sys::cuEventRecord(self.raw, stream.raw())
        })
    }

    /// Whether the work before its last record has completed.
    pub fn is_complete(&self) -> Result<bool> {
        // SAFETY: a valid event.
        let r = std::panic::catch_unwind(|| unsafe { sys::cuEventQuery(self.raw) })
            .unwrap_or(sys::CUresult::CUDA_ERROR_NOT_SUPPORTED);
        if r == sys::CUresult::CUDA_ERROR_NOT_READY {
            return Ok(false);
        }
        super::driver::check(r, "cuEventQuery")?;
        Ok(true)
    }

    /// Makes `stream` wait, on the GPU, for the work before this event's last record.
    pub fn make_wait(&self, stream: &Stream) -> Result<()> {
        // SAFETY: a valid event and stream.
        call("cuStreamWaitEvent", || unsafe {
            sys::cuStreamWaitEvent(stream.raw(), self.raw, 0)
        })
    }

    /// Waits for the event.
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: a valid event.
        call("cuEventSynchronize", || unsafe {
            sys::cuEventSynchronize(self.raw)
        })
    }

    /// Milliseconds from `start` to this event, both recorded and complete.
    pub fn elapsed_ms_since(&self, start: &Event) -> Result<f32> {
        let mut ms = 0f32;
        // SAFETY: valid events and out-pointer.
        call("cuEventElapsedTime", || unsafe {
            sys::cuEventElapsedTime(&mut ms, start.raw, self.raw)
        })?;
        Ok(ms)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: made by cuEventCreate.
        let _ = call("cuEventDestroy", || unsafe {
            sys::cuEventDestroy_v2(self.raw)
        });
    }
}

/// The most operations strata puts in one `cuStreamBatchMemOp`.
const BATCH_MAX: usize = 64;

/// Stream memory operations gathered for one stream and enqueued together: the waits and
/// writes of one synchronisation become one `cuStreamBatchMemOp` (the GPU's front end takes
/// a batch as one command, where each single operation costs it 1-2 us), as NCCL's copy-engine
/// collectives do. Operations run in the order added.
pub(crate) struct MemOps {
    ops: Vec<sys::CUstreamBatchMemOpParams>,
    /// Whether the driver takes batches (else each goes on its own).
    batch: bool,
}

impl MemOps {
    /// An empty list; `batch` says whether to enqueue with `cuStreamBatchMemOp`.
    pub(crate) fn new(batch: bool) -> Self {
        Self {
            ops: Vec::new(),
            batch,
        }
    }

    /// A wait until the 32-bit word at `addr` is at least `value` (modulo 2^32).
    pub(crate) fn wait(&mut self, addr: u64, value: u64) {
        // SAFETY: a plain-data union, all zeros valid.
        let mut op: sys::CUstreamBatchMemOpParams = unsafe { std::mem::zeroed() };
        op.waitValue.operation = sys::CUstreamBatchMemOpType::CU_STREAM_MEM_OP_WAIT_VALUE_32;
        op.waitValue.address = addr;
        op.waitValue.__bindgen_anon_1.value = value as u32;
        op.waitValue.flags = sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32;
        self.ops.push(op);
    }

    /// A write of `value` into the 32-bit word at `addr`.
    pub(crate) fn write(&mut self, addr: u64, value: u64) {
        // SAFETY: as above.
        let mut op: sys::CUstreamBatchMemOpParams = unsafe { std::mem::zeroed() };
        op.writeValue.operation = sys::CUstreamBatchMemOpType::CU_STREAM_MEM_OP_WRITE_VALUE_32;
        op.writeValue.address = addr;
        op.writeValue.__bindgen_anon_1.value = value as u32;
        self.ops.push(op);
    }

    /// Enqueues what was gathered on `stream` (one batch per [`BATCH_MAX`] operations, or one
    /// call each without batches) and empties the list.
    pub(crate) fn flush(&mut self, stream: sys::CUstream) -> Result<()> {
        if self.batch {
            for chunk in self.ops.chunks_mut(BATCH_MAX) {
                // SAFETY: `chunk` holds valid operations on words of this communicator's
                // buffers, which outlive the stream's work; the driver copies the array.
                call("cuStreamBatchMemOp", || unsafe {
                    sys::cuStreamBatchMemOp_v2(stream, chunk.len() as u32, chunk.as_mut_ptr(), 0)
                })?;
            }
        } else {
            for op in &self.ops {
                // SAFETY: reading the variant this list wrote; the words are as above.
                unsafe {
                    match op.operation {
                        sys::CUstreamBatchMemOpType::CU_STREAM_MEM_OP_WAIT_VALUE_32 => {
                            let w = op.waitValue;
                            call("cuStreamWaitValue32", || {
                                sys::cuStreamWaitValue32_v2(
                                    stream,
                                    w.address,
                                    w.__bindgen_anon_1.value,
                                    w.flags,
                                )
                            })?
                        }
                        _ => {
                            let w = op.writeValue;
                            call("cuStreamWriteValue32", || {
                                sys::cuStreamWriteValue32_v2(
                                    stream,
                                    w.address,
                                    w.__bindgen_anon_1.value,
                                    0,
                                )
                            })?
                        }
                    }
                }
            }
        }
        self.ops.clear();
        Ok(())
    }
}
