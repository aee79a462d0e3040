//! strata-ffi: the C ABI of strata, built as a drop-in `libnccl.so.2`.
//!
//! Every entry point of NCCL's `nccl.h` (API level 2.30.7, [`NCCL_VERSION_CODE`]) that PyTorch
//! imports (the 51 of torch 2.15; those NCCL added in 2.29 and 2.30 live in [`elastic`]), plus
//! AlltoAll, Gather, Scatter, CommShrink and CommRevoke, with its `pnccl` profiling alias. Each one converts its C arguments, calls `strata`, maps errors to
//! `ncclResult_t` (the full message goes to `ncclGetLastError`) and never lets a panic cross
//! the boundary.
//!
//! Differences from NCCL, all documented in the README: buffers are host memory (a GPU pointer
//! is `ncclInvalidArgument`); outside a group a call on a blocking communicator completes
//! before it returns, so the stream argument is ignored and may be NULL; a non-blocking
//! communicator runs its calls on a worker thread and returns `ncclInProgress`.

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

// ----- the calls --------------------------------------------------------------------------------

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
        let c = Coll {
            spec: CallSpec {
                op,
                root,
                ..CallSpec::new(collective, dtype, count)
            },
            user_op,
            send: send as *const u8,
            recv: recv as *mut u8,
        };
        if count > 0 {
            device::check_host(&[(c.send, "sendbuff"), (c.recv, "recvbuff")]).map_err(invalid)?;
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
) -> NcclResult {
    guarded(|| {
        let h = comm_of(comm)?;
        live(&h)?;
        let dtype = dtype_of(datatype)?;
        let peer = usize_of(peer, "peer")?;
        if let Some((_, p)) = h.shape.get().copied() {
            if peer >= p {
                return Err(invalid(format!(
                    "peer {peer} is out of range for {p} ranks"
                )));
            }
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
        if bytes > 0 {
            device::check_host(&[(buf as *const u8, "the buffer")]).map_err(invalid)?;
        }
        Ok(group::submit(
            h,
            Call::P2p {
                send,
                peer,
                dtype,
                count,
                ptr: buf as *mut u8,
            },
        ))
    })
}

/// Creates a communicator for `rank` of `nranks` from `id`: now, at the end of the group, or
/// on its worker thread (non-blocking).
///
/// # Safety
/// `out` must be NULL or writable; `config` as in [`settings_of`].
unsafe fn init_rank(
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

/// Makes a child communicator from `h` with `make` (a split or a shrink): now for a blocking
/// parent, on the parent's worker for a non-blocking one. `child` is the child's handle, or
/// `None` for a rank that takes part but gets no communicator.
fn derive(
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

/// Host memory handed out by `ncclMemAlloc`: address → layout.
fn allocations() -> &'static Mutex<HashMap<usize, std::alloc::Layout>> {
    static ALLOCS: OnceLock<Mutex<HashMap<usize, std::alloc::Layout>>> = OnceLock::new();
    ALLOCS.get_or_init(Default::default)
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

    /// `ncclCommInitAll`: `ndev` ranks as threads of this process (the device list is not
    /// used: this build moves host memory).
    fn ncclCommInitAll / pncclCommInitAll(
        comms: *mut NcclComm,
        ndev: c_int,
        devlist: *const c_int,
    ) -> NcclResult {
        let _ = devlist;
        guarded(|| {
            if comms.is_null() {
                return Err(invalid("comms is NULL"));
            }
            let n = usize_of(ndev, "ndev")?;
            if n == 0 {
                return Err(invalid("ndev is 0"));
            }
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
            let h = comm_of(comm)?;
            live(&h)?;
            // SAFETY: per the contract.
            unsafe { put(newcomm, std::ptr::null_mut(), "newcomm")? };
            if color < -1 {
                return Err(invalid(format!(
                    "color {color} is negative (NCCL_SPLIT_NOCOLOR is -1)"
                )));
            }
            // SAFETY: per the contract.
            let settings = unsafe { settings_of(config, h.blocking)? };
            let color = u32::try_from(color).ok();
            let child = color.map(|_| CommHandle::create(settings.blocking, None));
            if let Some(ch) = &child {
                // SAFETY: checked writable above.
                unsafe { *newcomm = ch.id as NcclComm };
            }
            let r = derive(h, child, move |c| c.split(color, key));
            if r.is_err() {
                // SAFETY: checked writable above.
                unsafe { *newcomm = std::ptr::null_mut() };
            }
            r
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
            if shrink_flags == 1 {
                if let Some(c) = h.ready() {
                    c.revoke();
                }
            }
            let child = CommHandle::create(settings.blocking, None);
            // SAFETY: checked writable above.
            unsafe { *newcomm = child.id as NcclComm };
            let r = derive(h, Some(child), move |c| c.shrink(&exclude).map(Some));
            if r.is_err() {
                // SAFETY: checked writable above.
                unsafe { *newcomm = std::ptr::null_mut() };
            }
            r
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

    /// `ncclCommCuDevice`: this build drives no CUDA device, so `ncclInvalidUsage`.
    fn ncclCommCuDevice / pncclCommCuDevice(comm: NcclComm, device: *mut c_int) -> NcclResult {
        guarded(|| {
            comm_of(comm)?;
            // SAFETY: per the contract.
            unsafe { put(device, -1, "device")? };
            Err(fail(
                NcclResult::InvalidUsage,
                "this strata build drives no CUDA device (host memory only)",
            ))
        })
    }

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
            device::check_host(&[(buff as *const u8, "the buffer")]).map_err(invalid)?;
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
            device::check_host(&[(buff as *const u8, "the window")]).map_err(invalid)?;
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
            let layout = lock(allocations()).remove(&(ptr as usize)).ok_or_else(|| {
                invalid(format!(
                    "{ptr:p} was not allocated by ncclMemAlloc (or was freed already)"
                ))
            })?;
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
            device::check_host(&[(scalar as *const u8, "the scalar")]).map_err(invalid)?;
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
        let _ = stream;
        collective(
            Collective::AllReduce,
            sendbuff,
            recvbuff,
            count,
            datatype,
            Some(op),
            None,
            comm,
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
        let _ = stream;
        collective(
            Collective::Broadcast,
            sendbuff,
            recvbuff,
            count,
            datatype,
            None,
            Some(root),
            comm,
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
        let _ = stream;
        collective(
            Collective::Broadcast,
            buff,
            buff,
            count,
            datatype,
            None,
            Some(root),
            comm,
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
        let _ = stream;
        collective(
            Collective::Reduce,
            sendbuff,
            recvbuff,
            count,
            datatype,
            Some(op),
            Some(root),
            comm,
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
        let _ = stream;
        collective(
            Collective::AllGather,
            sendbuff,
            recvbuff,
            sendcount,
            datatype,
            None,
            None,
            comm,
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
        let _ = stream;
        collective(
            Collective::ReduceScatter,
            sendbuff,
            recvbuff,
            recvcount,
            datatype,
            Some(op),
            None,
            comm,
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
        let _ = stream;
        collective(
            Collective::AllToAll,
            sendbuff,
            recvbuff,
            count,
            datatype,
            None,
            None,
            comm,
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
        let _ = stream;
        collective(
            Collective::Gather,
            sendbuff,
            recvbuff,
            count,
            datatype,
            None,
            Some(root),
            comm,
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
        let _ = stream;
        collective(
            Collective::Scatter,
            sendbuff,
            recvbuff,
            count,
            datatype,
            None,
            Some(root),
            comm,
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
        let _ = stream;
        p2p(true, sendbuff as *mut c_void, count, datatype, peer, comm)
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
        let _ = stream;
        p2p(false, recvbuff, count, datatype, peer, comm)
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

/// `ncclResetDebugInit` (deprecated in NCCL): nothing to reset; logging reads its variables once.
#[unsafe(no_mangle)]
pub extern "C" fn ncclResetDebugInit() {}

/// The profiling alias of [`ncclResetDebugInit`].
#[unsafe(no_mangle)]
pub extern "C" fn pncclResetDebugInit() {}

// After `nccl_api!`, which it uses.
pub mod elastic;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_elastic;
