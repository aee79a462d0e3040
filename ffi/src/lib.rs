//! strata-ffi: the C ABI of strata, built as a drop-in `libnccl.so.2`.
//!
//! Every entry point of NCCL's `nccl.h` (API level 2.30.7, [`NCCL_VERSION_CODE`]) that PyTorch
//! imports (the 51 of torch 2.15; those NCCL added in 2.29 and 2.30 live in [`elastic`]), plus
//! AlltoAll, Gather, Scatter, CommShrink and CommRevoke, with its `pnccl` profiling alias. Each one converts its C arguments, calls `strata`, maps errors to
//! `ncclResult_t` (the full message goes to `ncclGetLastError`) and never lets a panic cross
//! the boundary.
//!
//! Differences from NCCL, all documented in the README: a call on GPU buffers is enqueued on
//! its stream (strata's progress thread runs it; see `strata::gpu`), while a call on host
//! buffers completes before it returns outside a group, so its stream is ignored and may be
//! NULL; a non-blocking communicator runs host calls on a worker thread and returns
//! `ncclInProgress`.

mod call;
mod device;
mod group;
mod handle;

use call::{Call, Coll};
use handle::{CommHandle, UserOp, lock, next_token};
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{CString, c_char, c_int, c_void};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use strata::{CallSpec, Collective, Communicator, Config, DataType, Error, ReduceOp, Scalar};

/// The NCCL API level strata implements, encoded as NCCL does for versions ≥ 2.9 (2.30.7, the
/// NCCL that PyPI's torch 2.15 pins).
pub const NCCL_VERSION_CODE: c_int = 2 * 10000 + 30 * 100 + 7;

/// `ncclConfig_t`'s magic (`NCCL_CONFIG_INITIALIZER`).
pub const CONFIG_MAGIC: u32 = 0xcafe_beef;

/// `ncclSimInfo_t`'s magic (`NCCL_SIM_INFO_INITIALIZER`).
pub const SIM_INFO_MAGIC: u32 = 0x7468_5283;

/// The first value `ncclRedOpCreatePreMulSum` hands out (`ncclNumOps`).
pub const FIRST_USER_OP: usize = 5;

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
    /// An operation timed out (NCCL 2.30's value).
    Timeout = 8,
}

/// `ncclUniqueId`: 128 opaque bytes, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct NcclUniqueId {
    /// The bytes.
    pub internal: [u8; strata::UNIQUE_ID_BYTES],
}

/// `ncclConfig_t` as NCCL 2.30 lays it out (`ncclConfig_v23000`). strata reads `size` bytes
/// of the caller's struct and defaults everything after them.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct NcclConfig {
    /// `sizeof(ncclConfig_t)` of the caller.
    pub size: usize,
    /// Must be 0xcafebeef.
    pub magic: u32,
    /// The caller's `NCCL_VERSION_CODE`.
    pub version: u32,
    /// 0: non-blocking; 1: blocking; `INT_MIN`: `NCCL_COMM_BLOCKING` or blocking.
    pub blocking: c_int,
    /// GPU launch setting (ignored).
    pub cga_cluster_size: c_int,
    /// GPU launch setting (ignored).
    pub min_ctas: c_int,
    /// GPU launch setting (ignored).
    pub max_ctas: c_int,
    /// Network plugin name (ignored).
    pub net_name: *const c_char,
    /// Share resources with the parent on split (ignored).
    pub split_share: c_int,
    /// Traffic class (ignored).
    pub traffic_class: c_int,
    /// A name for logs.
    pub comm_name: *const c_char,
    /// CollNet (ignored).
    pub collnet_enable: c_int,
    /// CTA policy (ignored).
    pub cta_policy: c_int,
    /// Share resources with the parent on shrink (ignored).
    pub shrink_share: c_int,
    /// NVLS CTAs (ignored).
    pub nvls_ctas: c_int,
    /// Channels per network peer (ignored).
    pub n_channels_per_net_peer: c_int,
    /// NVLink-centric scheduling (ignored).
    pub nvlink_centric_sched: c_int,
    /// CUDA graph usage mode (2.29; ignored).
    pub graph_usage_mode: c_int,
    /// One-sided (RMA) contexts (2.29; ignored).
    pub num_rma_ctx: c_int,
    /// Most point-to-point peers at once (2.30; ignored).
    pub max_p2p_peers: c_int,
    /// Stream ordering under CUDA graphs (2.30; ignored).
    pub graph_stream_ordering: c_int,
}

impl NcclConfig {
    /// `NCCL_CONFIG_INITIALIZER`: this API level's size, magic and version, every setting unset.
    pub fn initializer() -> Self {
        Self {
            size: std::mem::size_of::<NcclConfig>(),
            magic: CONFIG_MAGIC,
            version: NCCL_VERSION_CODE as u32,
            blocking: c_int::MIN,
            cga_cluster_size: c_int::MIN,
            min_ctas: c_int::MIN,
            max_ctas: c_int::MIN,
            net_name: std::ptr::null(),
            split_share: c_int::MIN,
            traffic_class: c_int::MIN,
            comm_name: std::ptr::null(),
            collnet_enable: c_int::MIN,
            cta_policy: c_int::MIN,
            shrink_share: c_int::MIN,
            nvls_ctas: c_int::MIN,
            n_channels_per_net_peer: c_int::MIN,
            nvlink_centric_sched: c_int::MIN,
            graph_usage_mode: c_int::MIN,
            num_rma_ctx: c_int::MIN,
            max_p2p_peers: c_int::MIN,
            graph_stream_ordering: c_int::MIN,
        }
    }
}

/// `ncclSimInfo_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct NcclSimInfo {
    /// `sizeof(ncclSimInfo_t)`.
    pub size: usize,
    /// Must be 0x74685283.
    pub magic: u32,
    /// The caller's `NCCL_VERSION_CODE`.
    pub version: u32,
    /// Output: the cost model's estimate of the group, in microseconds.
    pub estimated_time: f32,
}

/// `ncclComm_t`: an opaque handle value (never an address; see [`handle`]).
pub type NcclComm = *mut c_void;

/// Maps a strata error to the `ncclResult_t` a NCCL caller expects.
pub fn result_of(e: &Error) -> NcclResult {
    match e {
        Error::InvalidArgument(_) => NcclResult::InvalidArgument,
        Error::Mismatch(_) => NcclResult::InvalidUsage,
        Error::PeerFailed { .. } => NcclResult::RemoteError,
        Error::Timeout { .. } => NcclResult::Timeout,
        Error::Aborted(_) => NcclResult::RemoteError,
        Error::Transport(_) => NcclResult::SystemError,
        Error::Unsupported(_) => NcclResult::InvalidUsage,
    }
}

// ----- errors --------------------------------------------------------------------------------

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Sets this thread's `ncclGetLastError` text.
pub(crate) fn set_last_error(text: &str) {
    let c = CString::new(text.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|l| *l.borrow_mut() = c);
}

/// This thread's `ncclGetLastError` text.
pub(crate) fn last_error_text() -> String {
    LAST_ERROR.with(|l| l.borrow().to_string_lossy().into_owned())
}

/// Records `message` as the last error (and as the group's error inside a group); `code`.
pub(crate) fn fail(code: NcclResult, message: impl std::fmt::Display) -> NcclResult {
    let text = message.to_string();
    tracing::debug!("{code:?}: {text}");
    set_last_error(&text);
    group::note_error(code, &text);
    code
}

/// `fail` for a strata error.
pub(crate) fn report(e: &Error) -> NcclResult {
    fail(result_of(e), e)
}

fn invalid(message: impl std::fmt::Display) -> NcclResult {
    fail(NcclResult::InvalidArgument, message)
}

/// What an entry point's body returns: a code, or a code already recorded as an error.
type Ffi = Result<NcclResult, NcclResult>;

/// Runs an entry point's body, turning a panic into `ncclInternalError`.
fn guarded(f: impl FnOnce() -> Ffi) -> NcclResult {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(code) | Err(code)) => code,
        Err(_) => fail(
            NcclResult::InternalError,
            "internal error: strata panicked; the panic was stopped at the C boundary",
        ),
    }
}

/// Writes `value` through an out-parameter, which must not be NULL.
///
/// # Safety
/// `out` must be NULL or valid for a write of `T`.
unsafe fn put<T>(out: *mut T, value: T, what: &str) -> Result<(), NcclResult> {
    if out.is_null() {
        return Err(invalid(format!("{what} is NULL")));
    }
    // SAFETY: non-NULL and writable per the contract.
    unsafe { out.write_unaligned(value) };
    Ok(())
}

/// How long a call waits for a communicator whose init is still running.
pub(crate) fn init_limit() -> Duration {
    static LIMIT: OnceLock<Duration> = OnceLock::new();
    *LIMIT.get_or_init(|| {
        Config::from_env().map_or(Duration::from_secs(120), |c| c.init_timeout)
            + Duration::from_secs(10)
    })
}

// ----- argument conversion ---------------------------------------------------------------------

fn comm_of(comm: NcclComm) -> Result<Arc<CommHandle>, NcclResult> {
    CommHandle::lookup(comm).map_err(invalid)
}

fn dtype_of(code: c_int) -> Result<DataType, NcclResult> {
    u8::try_from(code)
        .ok()
        .and_then(DataType::from_code)
        .ok_or_else(|| {
            invalid(format!(
                "datatype {code} is not an ncclDataType_t (0-11: int8 to float8e5m2)"
            ))
        })
}

/// The operator `code` on `h` for buffers of `dtype`: a built-in, or a PreMulSum (its index).
fn op_of(
    h: &CommHandle,
    code: c_int,
    dtype: DataType,
) -> Result<(ReduceOp, Option<usize>), NcclResult> {
    let builtin = match code {
        0 => Some(ReduceOp::Sum),
        1 => Some(ReduceOp::Prod),
        2 => Some(ReduceOp::Max),
        3 => Some(ReduceOp::Min),
        4 => Some(ReduceOp::Avg),
        _ => None,
    };
    if let Some(op) = builtin {
        return Ok((op, None));
    }
    let index = usize::try_from(code)
        .ok()
        .and_then(|c| c.checked_sub(FIRST_USER_OP));
    let made = index.and_then(|i| lock(&h.ops).get(i).copied().flatten());
    let (Some(i), Some(op)) = (index, made) else {
        return Err(invalid(format!(
            "reduction operator {code} is neither built in (0-4) nor one made by \
             ncclRedOpCreatePreMulSum on this communicator"
        )));
    };
    let made_for = match op {
        UserOp::Immediate(s) => s.dtype,
        UserOp::Deferred(_, d) => d,
    };
    if made_for != dtype {
        return Err(invalid(format!(
            "reduction operator {code} was made for {made_for}, but the buffers are {dtype}"
        )));
    }
    Ok((ReduceOp::Sum, Some(i)))
}

fn usize_of(v: c_int, what: &str) -> Result<usize, NcclResult> {
    usize::try_from(v).map_err(|_| invalid(format!("{what} {v} is negative")))
}

fn live(h: &CommHandle) -> Result<(), NcclResult> {
    if h.finalized.load(Ordering::Acquire) {
        return Err(fail(
            NcclResult::InvalidUsage,
            "the communicator was finalized (ncclCommFinalize); it takes no new operations",
        ));
    }
    if h.suspended.load(Ordering::Acquire) {
        return Err(fail(
            NcclResult::InvalidUsage,
            "the communicator is suspended (ncclCommSuspend); call ncclCommResume first",
        ));
    }
    Ok(())
}

/// What strata takes from an `ncclConfig_t`.
struct Settings {
    blocking: bool,
}

/// Reads a caller's config by its `size`, rejecting one that was never initialised.
///
/// # Safety
/// `config` must be NULL or point to at least `config->size` readable bytes.
unsafe fn settings_of(
    config: *const NcclConfig,
    default_blocking: bool,
) -> Result<Settings, NcclResult> {
    let mut s = Settings {
        blocking: default_blocking,
    };
    if config.is_null() {
        return Ok(s);
    }
    // SAFETY: a config starts with its size and magic (16 bytes) in every NCCL version.
    let (size, magic) = unsafe {
        (
            (config as *const usize).read_unaligned(),
            (config as *const u8).add(8).cast::<u32>().read_unaligned(),
        )
    };
    if magic != CONFIG_MAGIC {
        return Err(invalid(format!(
            "config magic is {magic:#x}, not 0xcafebeef: initialise ncclConfig_t with \
             NCCL_CONFIG_INITIALIZER"
        )));
    }
    if size < 16 {
        return Err(invalid(format!("config size {size} is too small")));
    }
    let mut c = NcclConfig::initializer();
    let n = size.min(std::mem::size_of::<NcclConfig>());
    // SAFETY: the caller's struct holds `size` bytes; fields past `n` keep their defaults.
    unsafe {
        std::ptr::copy_nonoverlapping(config as *const u8, (&mut c as *mut NcclConfig).cast(), n)
    };
    s.blocking = match c.blocking {
        c_int::MIN => default_blocking,
        0 => false,
        1 => true,
        v => return Err(invalid(format!("config blocking = {v}; use 0 or 1"))),
    };
    Ok(s)
}

/// `NCCL_COMM_BLOCKING=0` makes communicators non-blocking unless their config says otherwise.
fn env_blocking() -> bool {
    std::env::var("NCCL_COMM_BLOCKING").map_or(true, |v| v.trim() != "0")
}

/// Exports each function under its name and its `pnccl` profiling alias.
macro_rules! nccl_api {
    ($(
        $(#[doc = $doc:literal])*
        fn $name:ident / $alias:ident ($($arg:ident : $ty:ty),* $(,)?) -> $ret:ty $body:block
    )*) => {$(
        $(#[doc = $doc])*
        ///
        /// # Safety
        /// Pointer arguments must be NULL or valid for what NCCL documents for this function;
        /// buffers must stay valid until the operation completes.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret $body

        #[doc = concat!("The profiling alias of [`", stringify!($name), "`].")]
        ///
        /// # Safety
        #[doc = concat!("As for [`", stringify!($name), "`].")]
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $alias($($arg: $ty),*) -> $ret {
            // SAFETY: the same contract as the function it aliases.
            unsafe { $name($($arg),*) }
        }
    )*};
}

// After `nccl_api!`, which they use.
mod entry;
pub use entry::*;

/// `ncclResetDebugInit` (deprecated in NCCL): nothing to reset; logging reads its variables once.
#[unsafe(no_mangle)]
pub extern "C" fn ncclResetDebugInit() {}

/// The profiling alias of [`ncclResetDebugInit`].
#[unsafe(no_mangle)]
pub extern "C" fn pncclResetDebugInit() {}

pub mod elastic;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_elastic;
