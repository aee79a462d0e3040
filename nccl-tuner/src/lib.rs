//! `libnccl-tuner-strata.so`: a tuner plugin for NVIDIA's NCCL built from strata's cost model
//! and topology.
//!
//! NCCL (2.19 and later) loads a tuner plugin named by `NCCL_TUNER_PLUGIN` and asks it, per
//! collective call, to adjust its table of predicted times (algorithm × protocol) and the
//! channel count; it then runs the cheapest entry. This plugin prices NCCL's ring, tree and
//! PAT algorithms with strata's model on the fabric strata knows ([`source`]: the topology file
//! or Slurm's topology), once per communicator at `init`, and per call rewrites the table from
//! those prices ([`model`]): a lookup, never a simulation, on NCCL's hot path.
//!
//! It exports `ncclTunerPlugin_v7` (NCCL 2.32.6), `_v6` (2.30), `_v5`, `_v4` and `_v3`; NCCL
//! takes the newest it knows. Nothing here unwinds into NCCL: every entry point catches panics
//! and answers `ncclInternalError`, and checks its pointers.

pub mod cache;
pub mod model;
pub mod source;

use std::ffi::{CString, c_char, c_int, c_ulong, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};

use model::Model;

/// `ncclResult_t`.
type NcclResult = c_int;
const NCCL_SUCCESS: NcclResult = 0;
const NCCL_INTERNAL_ERROR: NcclResult = 3;
const NCCL_INVALID_ARGUMENT: NcclResult = 4;
const NCCL_INVALID_USAGE: NcclResult = 5;

/// `ncclDebugLogger_t`.
type Logger = Option<
    unsafe extern "C" fn(
        level: c_int,
        flags: c_ulong,
        file: *const c_char,
        line: c_int,
        fmt: *const c_char,
        ...
    ),
>;
const LOG_WARN: c_int = 2;
const LOG_INFO: c_int = 3;
const SUBSYS_INIT_TUNING: c_ulong = 0x1 | 0x40;

/// `ncclNvlDomainInfo_v5_t` (v5-v7).
#[repr(C)]
pub struct NvlDomainInfo {
    /// NVLink domains.
    pub n_nvl_domains: c_int,
    /// Fewest ranks in one domain.
    pub min_ranks_per_nvl_domain: c_int,
    /// Most ranks in one domain.
    pub max_ranks_per_nvl_domain: c_int,
}

/// `init` of v5-v7 (the constants struct, which differs between them, is not touched).
type InitV5 = unsafe extern "C" fn(
    ctx: *mut *mut c_void,
    comm_id: u64,
    n_ranks: usize,
    n_nodes: usize,
    log: Logger,
    nvl: *mut NvlDomainInfo,
    constants: *mut c_void,
) -> NcclResult;
/// `init` of v3-v4.
type InitV3 = unsafe extern "C" fn(
    n_ranks: usize,
    n_nodes: usize,
    log: Logger,
    ctx: *mut *mut c_void,
) -> NcclResult;
/// `getCollInfo` of v4-v7.
type GetCollInfo = unsafe extern "C" fn(
    ctx: *mut c_void,
    coll: c_int,
    n_bytes: usize,
    num_pipe_ops: c_int,
    table: *mut *mut f32,
    num_algo: c_int,
    num_proto: c_int,
    reg_buff: c_int,
    n_channels: *mut c_int,
) -> NcclResult;
/// `getCollInfo` of v3 (no `regBuff`).
type GetCollInfoV3 = unsafe extern "C" fn(
    ctx: *mut c_void,
    coll: c_int,
    n_bytes: usize,
    num_pipe_ops: c_int,
    table: *mut *mut f32,
    num_algo: c_int,
    num_proto: c_int,
    n_channels: *mut c_int,
) -> NcclResult;
/// `finalize` / `destroy`.
type Finalize = unsafe extern "C" fn(ctx: *mut c_void) -> NcclResult;
/// `getChunkSize` (v6-v7, optional).
type GetChunkSize = unsafe extern "C" fn(
    ctx: *mut c_void,
    coll: c_int,
    n_bytes: usize,
    algo: c_int,
    proto: c_int,
    n_channels: c_int,
    chunk_size: *mut usize,
) -> NcclResult;

/// `ncclTuner_v6_t` and `ncclTuner_v7_t` (the same layout).
#[repr(C)]
pub struct TunerV6 {
    name: *const c_char,
    init: InitV5,
    get_coll_info: GetCollInfo,
    finalize: Finalize,
    get_chunk_size: Option<GetChunkSize>,
}

/// `ncclTuner_v5_t`.
#[repr(C)]
pub struct TunerV5 {
    name: *const c_char,
    init: InitV5,
    get_coll_info: GetCollInfo,
    finalize: Finalize,
}

/// `ncclTuner_v4_t`.
#[repr(C)]
pub struct TunerV4 {
    name: *const c_char,
    init: InitV3,
    get_coll_info: GetCollInfo,
    destroy: Finalize,
}

/// `ncclTuner_v3_t`.
#[repr(C)]
pub struct TunerV3 {
    name: *const c_char,
    init: InitV3,
    get_coll_info: GetCollInfoV3,
    destroy: Finalize,
}

// SAFETY: the structs hold a pointer to a static string and function pointers; NCCL only
// reads them.
unsafe impl Sync for TunerV6 {}
unsafe impl Sync for TunerV5 {}
unsafe impl Sync for TunerV4 {}
unsafe impl Sync for TunerV3 {}

const NAME: *const c_char = c"strata".as_ptr();

/// The v6 and v7 tables (one layout: v7 only widened the constants, which are not touched).
const TUNER_V6: TunerV6 = TunerV6 {
    name: NAME,
    init: init_v5,
    get_coll_info,
    finalize,
    get_chunk_size: None,
};

/// The plugin as NCCL 2.32.6 and later load it.
#[unsafe(no_mangle)]
pub static ncclTunerPlugin_v7: TunerV6 = TUNER_V6;

/// The plugin as NCCL 2.30 loads it.
#[unsafe(no_mangle)]
pub static ncclTunerPlugin_v6: TunerV6 = TUNER_V6;

/// The plugin for NCCL versions whose newest tuner interface is v5.
#[unsafe(no_mangle)]
pub static ncclTunerPlugin_v5: TunerV5 = TunerV5 {
    name: NAME,
    init: init_v5,
    get_coll_info,
    finalize,
};

/// The plugin for NCCL versions whose newest tuner interface is v4.
#[unsafe(no_mangle)]
pub static ncclTunerPlugin_v4: TunerV4 = TunerV4 {
    name: NAME,
    init: init_v3,
    get_coll_info,
    destroy: finalize,
};

/// The plugin for NCCL versions whose newest tuner interface is v3.
#[unsafe(no_mangle)]
pub static ncclTunerPlugin_v3: TunerV3 = TunerV3 {
    name: NAME,
    init: init_v3,
    get_coll_info: get_coll_info_v3,
    destroy: finalize,
};

/// One communicator's state: its prices, or nothing (NCCL's tuning stands).
struct Context {
    model: Option<Model>,
}

/// Writes one line through NCCL's logger (and WARN lines to stderr too, where NCCL's own
/// output may be off).
fn log(logger: Logger, level: c_int, line: u32, text: &str) {
    let text = format!("strata tuner: {text}");
    if level == LOG_WARN {
        eprintln!("{text}");
    }
    let Some(f) = logger else { return };
    let Ok(msg) = CString::new(text) else { return };
    // SAFETY: NCCL's logger is printf-like; "%s" with one NUL-terminated string is its
    // documented use.
    unsafe {
        f(
            level,
            SUBSYS_INIT_TUNING,
            c"nccl-tuner/src/lib.rs".as_ptr(),
            line as c_int,
            c"%s".as_ptr(),
            msg.as_ptr(),
        )
    };
}

/// Builds a communicator's context from the environment.
fn make_context(n_ranks: usize, n_nodes: usize, logger: Logger) -> Result<Context, String> {
    if n_ranks == 0 || n_nodes == 0 || n_nodes > n_ranks {
        return Err(format!(
            "a communicator of {n_ranks} ranks on {n_nodes} nodes"
        ));
    }
    let fab = match source::fabric_from_env()? {
        Some(f) => f,
        None => {
            log(
                logger,
                LOG_INFO,
                line!(),
                "no fabric described (STRATA_TOPO_FILE, Slurm's topology.conf); NCCL's own tuning stands",
            );
            return Ok(Context { model: None });
        }
    };
    let nodelist = std::env::var("SLURM_JOB_NODELIST").ok();
    let hosts = source::node_hosts(&fab, n_nodes, nodelist.as_deref())?;
    let started = std::time::Instant::now();
    let dir = std::env::var_os("STRATA_NCCL_TUNER_CACHE").map(std::path::PathBuf::from);
    let (model, origin) = cache::model_for(&fab, n_ranks, &hosts, dir.as_deref());
    let ms = started.elapsed().as_secs_f64() * 1e3;
    let how = match &origin {
        cache::Origin::Loaded(p) => format!("read from {} in {ms:.1} ms", p.display()),
        cache::Origin::Priced(stored) => {
            let kept = match stored {
                None => String::new(),
                Some(Ok(p)) => format!("; kept in {}", p.display()),
                Some(Err(e)) => format!("; not kept: {e}"),
            };
            format!(
                "priced in {ms:.1} ms ({} prices extrapolated from smaller sizes){kept}",
                model.extrapolated
            )
        }
        cache::Origin::Replaced(p, why, stored) => format!(
            "priced in {ms:.1} ms, as the table in {} could not be used ({why}){}",
            p.display(),
            match stored {
                Ok(()) => "; replaced".to_string(),
                Err(e) => format!("; not replaced: {e}"),
            }
        ),
    };
    log(
        logger,
        LOG_INFO,
        line!(),
        &format!(
            "{n_ranks} ranks on {n_nodes} nodes on {}: {how}",
            model.described
        ),
    );
    Ok(Context { model: Some(model) })
}

/// `init` shared by every version: boxes the context into `*ctx`.
///
/// # Safety
/// `ctx` must be valid for a write (NCCL passes `&comm->tunerContext`).
unsafe fn init_common(
    ctx: *mut *mut c_void,
    n_ranks: usize,
    n_nodes: usize,
    logger: Logger,
) -> NcclResult {
    if ctx.is_null() {
        log(
            logger,
            LOG_WARN,
            line!(),
            "init: the context pointer is NULL",
        );
        return NCCL_INVALID_ARGUMENT;
    }
    let made = catch_unwind(AssertUnwindSafe(|| make_context(n_ranks, n_nodes, logger)));
    match made {
        Ok(Ok(c)) => {
            // SAFETY: checked non-null; NCCL owns the slot.
            unsafe { *ctx = Box::into_raw(Box::new(c)).cast() };
            NCCL_SUCCESS
        }
        Ok(Err(e)) => {
            log(logger, LOG_WARN, line!(), &e);
            NCCL_INVALID_USAGE
        }
        Err(_) => {
            log(
                logger,
                LOG_WARN,
                line!(),
                "init failed inside strata (a bug)",
            );
            NCCL_INTERNAL_ERROR
        }
    }
}

unsafe extern "C" fn init_v5(
    ctx: *mut *mut c_void,
    _comm_id: u64,
    n_ranks: usize,
    n_nodes: usize,
    log: Logger,
    _nvl: *mut NvlDomainInfo,
    _constants: *mut c_void,
) -> NcclResult {
    // SAFETY: forwarded from NCCL.
    unsafe { init_common(ctx, n_ranks, n_nodes, log) }
}

unsafe extern "C" fn init_v3(
    n_ranks: usize,
    n_nodes: usize,
    log: Logger,
    ctx: *mut *mut c_void,
) -> NcclResult {
    // SAFETY: forwarded from NCCL.
    unsafe { init_common(ctx, n_ranks, n_nodes, log) }
}

unsafe extern "C" fn get_coll_info(
    ctx: *mut c_void,
    coll: c_int,
    n_bytes: usize,
    _num_pipe_ops: c_int,
    table: *mut *mut f32,
    num_algo: c_int,
    num_proto: c_int,
    _reg_buff: c_int,
    n_channels: *mut c_int,
) -> NcclResult {
    if ctx.is_null() || table.is_null() || n_channels.is_null() || num_algo < 0 || num_proto <= 0 {
        return NCCL_INVALID_ARGUMENT;
    }
    let done = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: ctx came from init_common; NCCL passes its float[numAlgo][numProto] table
        // cast to float**, and a valid int for the channels.
        let c = unsafe { &*ctx.cast::<Context>() };
        let Some(m) = &c.model else { return };
        let cells = num_algo as usize * num_proto as usize;
        let t = unsafe { std::slice::from_raw_parts_mut(table.cast::<f32>(), cells) };
        let ch = m.fill(coll, n_bytes, t, num_proto as usize);
        if ch > 0 {
            unsafe { *n_channels = ch };
        }
    }));
    if done.is_ok() {
        NCCL_SUCCESS
    } else {
        NCCL_INTERNAL_ERROR
    }
}

unsafe extern "C" fn get_coll_info_v3(
    ctx: *mut c_void,
    coll: c_int,
    n_bytes: usize,
    num_pipe_ops: c_int,
    table: *mut *mut f32,
    num_algo: c_int,
    num_proto: c_int,
    n_channels: *mut c_int,
) -> NcclResult {
    // SAFETY: forwarded from NCCL.
    unsafe {
        get_coll_info(
            ctx,
            coll,
            n_bytes,
            num_pipe_ops,
            table,
            num_algo,
            num_proto,
            0,
            n_channels,
        )
    }
}

unsafe extern "C" fn finalize(ctx: *mut c_void) -> NcclResult {
    if !ctx.is_null() {
        // SAFETY: ctx came from init_common and NCCL finalizes it once.
        let _ = catch_unwind(AssertUnwindSafe(|| {
            drop(unsafe { Box::from_raw(ctx.cast::<Context>()) })
        }));
    }
    NCCL_SUCCESS
}
