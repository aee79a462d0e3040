//! strata-ffi: the C ABI of strata.
//!
//! This release exports the version and error-string entry points with NCCL's signatures; the
//! full `libnccl.so.2` surface is built on the same pattern: convert arguments, call `strata`,
//! map errors to `ncclResult_t`, and never let a panic cross the boundary.

use std::ffi::{c_char, c_int};

/// The NCCL API level strata implements, encoded as NCCL does for versions ≥ 2.9.
pub const NCCL_VERSION_CODE: c_int = 2 * 10000 + 27 * 100 + 5;

/// `ncclResult_t` values.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NcclResult {
    /// Success.
    Success = 0,
    /// A CUDA call failed.
    UnhandledCudaError = 1,
    /// A system call failed.
    SystemError = 2,
    /// An internal check failed.
    InternalError = 3,
    /// A bad argument.
    InvalidArgument = 4,
    /// A call made in the wrong state.
    InvalidUsage = 5,
    /// A remote process exited or the network failed.
    RemoteError = 6,
    /// A non-blocking operation is still in progress.
    InProgress = 7,
    /// An operation timed out.
    Timeout = 8,
}

/// Maps a strata error to the `ncclResult_t` a NCCL caller expects.
pub fn result_of(e: &strata::Error) -> NcclResult {
    match e {
        strata::Error::InvalidArgument(_) => NcclResult::InvalidArgument,
        strata::Error::Mismatch(_) => NcclResult::InvalidUsage,
        strata::Error::PeerFailed { .. } => NcclResult::RemoteError,
        strata::Error::Timeout { .. } => NcclResult::Timeout,
        strata::Error::Aborted(_) => NcclResult::RemoteError,
        strata::Error::Transport(_) => NcclResult::SystemError,
        strata::Error::Unsupported(_) => NcclResult::InvalidUsage,
    }
}

/// Runs `f`, turning a panic into `ncclInternalError`.
fn guarded(f: impl FnOnce() -> NcclResult) -> NcclResult {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or(NcclResult::InternalError)
}

/// `ncclResult_t ncclGetVersion(int* version)`.
///
/// # Safety
/// `version` must be null or point to writable memory for one `int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclGetVersion(version: *mut c_int) -> NcclResult {
    guarded(|| {
        if version.is_null() {
            return NcclResult::InvalidArgument;
        }
        // SAFETY: non-null and writable per the contract above.
        unsafe { *version = NCCL_VERSION_CODE };
        NcclResult::Success
    })
}

/// `const char* ncclGetErrorString(ncclResult_t result)`; unknown codes get a generic string.
#[unsafe(no_mangle)]
pub extern "C" fn ncclGetErrorString(result: c_int) -> *const c_char {
    let s: &'static [u8] = match result {
        0 => b"no error\0",
        1 => b"unhandled cuda error\0",
        2 => b"unhandled system error\0",
        3 => b"internal error\0",
        4 => b"invalid argument\0",
        5 => b"invalid usage\0",
        6 => b"remote process exited or there was a network error\0",
        7 => b"NCCL operation in progress\0",
        8 => b"operation timed out\0",
        _ => b"unknown result code\0",
    };
    s.as_ptr() as *const c_char
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_and_strings() {
        let mut v = 0;
        // SAFETY: valid pointer / null.
        assert_eq!(unsafe { ncclGetVersion(&mut v) }, NcclResult::Success);
        assert_eq!(v, 22705);
        // SAFETY: null is handled.
        assert_eq!(
            unsafe { ncclGetVersion(std::ptr::null_mut()) },
            NcclResult::InvalidArgument
        );
        // SAFETY: the returned pointers are static C strings.
        let s = unsafe { std::ffi::CStr::from_ptr(ncclGetErrorString(6)) };
        assert!(s.to_str().unwrap().contains("remote process"));
        assert_eq!(
            result_of(&strata::Error::Timeout {
                op: "x".into(),
                seq: 1,
                waiting_on: vec![],
                after_s: 1.0,
                diagnosis: None,
            }),
            NcclResult::Timeout
        );
    }
}
