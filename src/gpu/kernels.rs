//! strata's kernels on the GPU: the reductions (`kernels/reduce.cu`) and the low-latency
//! collectives (`kernels/ll.cu`), one program compiled at run time with NVRTC (loaded through
//! cudarc, like the driver) for the device's architecture, once per process (and kept in a
//! cache on disk, so that a process seldom compiles at all), and launched on a stream.

use super::driver::{call, check};
use crate::dtype::DataType;
use crate::error::{Error, Result};
use crate::reduce::Combine;
use cudarc::driver::sys;
use std::collections::HashMap;
use std::ffi::{CString, c_void};
use std::sync::{Mutex, OnceLock};

/// The reduction kernels' source (also compiled in CI for sm_80 and sm_90, and as C by the
/// stand-in).
pub const REDUCE_SOURCE: &str = include_str!("kernels/reduce.cu");

/// The whole program NVRTC compiles: the reductions, then the low-latency kernels
/// (`kernels/ll.cu`, which uses what `reduce.cu` defines).
const PROGRAM: &str = concat!(
    include_str!("kernels/reduce.cu"),
    "\n",
    include_str!("kernels/ll.cu")
);

/// The kernels' name suffix for a type (`strata_combine_sum_<suffix>`).
pub fn kernel_suffix(d: DataType) -> &'static str {
    match d {
        DataType::Int8 => "i8",
        DataType::Uint8 => "u8",
        DataType::Int32 => "i32",
        DataType::Uint32 => "u32",
        DataType::Int64 => "i64",
        DataType::Uint64 => "u64",
        DataType::Float16 => "f16",
        DataType::Float32 => "f32",
        DataType::Float64 => "f64",
        DataType::Bfloat16 => "bf16",
        DataType::Float8E4M3 => "e4m3",
        DataType::Float8E5M2 => "e5m2",
    }
}

/// Where compiled PTX is kept between processes: `STRATA_KERNEL_CACHE` (a directory; `0` or
/// empty turns the cache off), else `$XDG_CACHE_HOME/strata/kernels`, else
/// `~/.cache/strata/kernels`.
fn cache_dir() -> Option<std::path::PathBuf> {
    match std::env::var_os("STRATA_KERNEL_CACHE") {
        Some(v) if v.is_empty() || v == "0" => None,
        Some(v) => Some(v.into()),
        None => std::env::var_os("XDG_CACHE_HOME")
            .map(std::path::PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| std::path::Path::new(&h).join(".cache")))
            .map(|c| c.join("strata").join("kernels")),
    }
}

/// The cache file of the PTX for `arch` and these options: named by a hash of the program, the
/// options and NVRTC's version, so a change to any of them misses.
fn cache_file(arch: &str, options: &[String]) -> Option<std::path::PathBuf> {
    let dir = cache_dir()?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: two out-parameters; a missing symbol is caught.
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| unsafe {
        cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor)
    }))
    .ok()?;
    if r != cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS {
        return None;
    }
    let mut h = blake3::Hasher::new();
    h.update(PROGRAM.as_bytes());
    for o in options {
        h.update(o.as_bytes());
        h.update(b"\0");
    }
    h.update(format!("nvrtc {major}.{minor}").as_bytes());
    let key = h.finalize().to_hex();
    Some(dir.join(format!("{arch}-{}.ptx", &key[..32])))
}

/// PTX per architecture (`compute_XY`), compiled once per process, or read from the cache.
fn ptx_for(arch: &str) -> Result<String> {
    static CACHE: OnceLock<Mutex<HashMap<String, std::result::Result<String, String>>>> =
        OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let mut c = cache.lock().unwrap_or_else(|p| p.into_inner());
    let r = c.entry(arch.to_string()).or_insert_with(|| {
        if !super::driver::keep_loaded(&["libnvrtc.so.12", "libnvrtc.so"]) {
            return Err("NVRTC (libnvrtc.so.12) is not on the library path".into());
        }
        let options = vec![
            format!("--gpu-architecture={arch}"),
            "--std=c++17".to_string(),
        ];
        let file = cache_file(arch, &options);
        if let Some(ptx) = file.as_ref().and_then(|f| std::fs::read_to_string(f).ok())
            && ptx.contains(".entry")
        {
            return Ok(ptx);
        }
        let opts = cudarc::nvrtc::CompileOptions {
            options,
            name: Some("strata-kernels.cu".into()),
            ..Default::default()
        };
        // NVRTC is a compiler and recurses deeply: it gets a thread with a large stack rather
        // than whatever thread binds the communicator (2 MiB for Rust's, less for some).
        let compiled = std::thread::Builder::new()
            .name("strata-nvrtc".into())
            .stack_size(256 << 20)
            .spawn(move || {
                std::panic::catch_unwind(|| {
                    cudarc::nvrtc::compile_ptx_with_opts(PROGRAM, opts)
                        .map(|ptx| ptx.to_src())
                        .map_err(|e| format!("{e:?}"))
                })
            })
            .map_err(|e| format!("cannot start the NVRTC thread: {e}"))?
            .join();
        let ptx = match compiled {
            Ok(Ok(r)) => {
                r.map_err(|e| format!("NVRTC failed on strata's kernels for {arch}: {e}"))?
            }
            _ => return Err("NVRTC lacks a function strata needs".to_string()),
        };
        if let Some(f) = file {
            store(&f, &ptx);
        }
        Ok(ptx)
    });
    r.clone()
        .map_err(|why| Error::Unsupported(format!("GPU kernels are unavailable: {why}")))
}

/// Writes `ptx` to the cache file `f` (through a file of its own, renamed into place, so that
/// a process reading it never sees half of it); a cache that cannot be written is skipped.
fn store(f: &std::path::Path, ptx: &str) {
    let tmp = f.with_extension(format!("tmp{}", std::process::id()));
    let done = f
        .parent()
        .map_or(Ok(()), std::fs::create_dir_all)
        .and_then(|_| std::fs::write(&tmp, ptx))
        .and_then(|_| std::fs::rename(&tmp, f));
    if let Err(e) = done {
        let _ = std::fs::remove_file(&tmp);
        tracing::debug!("the kernel cache {} was not written: {e}", f.display());
    }
}

/// The kernels loaded into one device's context.
pub(crate) struct Kernels {
    module: sys::CUmodule,
    functions: Mutex<HashMap<String, usize>>,
}

// SAFETY: module and function handles may be used from any thread of the context.
unsafe impl Send for Kernels {}
// SAFETY: as above; the table is locked.
unsafe impl Sync for Kernels {}

/// Threads per block of every launch, and the most blocks.
const BLOCK: u32 = 512;
const MAX_BLOCKS: u64 = 1024;
/// Threads per block of a low-latency kernel (its `__launch_bounds__`).
pub(crate) const LL_BLOCK: u32 = 256;

/// The arguments of a low-latency kernel (`strata_ll_args` in `kernels/ll.cu`, field for
/// field): passed by value, so a launch carries everything a call needs and no copy precedes
/// it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct LlArgs {
    pub input: u64,
    pub output: u64,
    pub in_bytes: u64,
    pub out_bytes: u64,
    pub count: u64,
    pub bases: u64,
    pub abort_word: u64,
    pub scalar: u64,
    pub ll_off: u64,
    pub ll_stride: u64,
    pub rank: u32,
    pub nranks: u32,
    pub root: u32,
    pub seq: u32,
    pub wait_for: u32,
    pub coll: u32,
    pub op: u32,
    pub flags: u32,
    pub call_off: u32,
    pub arrive_off: u32,
    pub expect_off: u32,
    pub es: u32,
    pub dtype: u32,
    pub digest: u32,
    pub sig_off: u32,
    pub pad: u32,
    pub header: [u32; 8],
}

/// `sizeof(strata_ll_args)` in `kernels/ll.cu`.
pub(crate) const LL_ARGS_BYTES: usize = 176;
const _: () = assert!(std::mem::size_of::<LlArgs>() == LL_ARGS_BYTES);

impl Kernels {
    /// Compiles (once per architecture) and loads the kernels for `device`, whose context
    /// must be current.
    pub(crate) fn load(device: i32) -> Result<Self> {
        let mut dev: sys::CUdevice = 0;
        // SAFETY: valid out-pointers.
        call("cuDeviceGet", || unsafe {
            sys::cuDeviceGet(&mut dev, device)
        })?;
        let attr = |a: sys::CUdevice_attribute| -> Result<i32> {
            let mut v = 0;
            // SAFETY: as above.
            call("cuDeviceGetAttribute", || unsafe {
                sys::cuDeviceGetAttribute(&mut v, a, dev)
            })?;
            Ok(v)
        };
        use sys::CUdevice_attribute::*;
        let (major, minor) = (
            attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        );
        let ptx = ptx_for(&format!("compute_{major}{minor}"))?;
        let image = CString::new(ptx).map_err(|_| Error::Transport("PTX with a NUL".into()))?;
        let mut module: sys::CUmodule = std::ptr::null_mut();
        // SAFETY: a NUL-terminated PTX image; valid out-pointer.
        call("cuModuleLoadData", || unsafe {
            sys::cuModuleLoadData(&mut module, image.as_ptr().cast())
        })?;
        Ok(Self {
            module,
            functions: Mutex::new(HashMap::new()),
        })
    }

    /// The kernel `name` of the loaded module (looked up once).
    pub(crate) fn function(&self, name: &str) -> Result<sys::CUfunction> {
        let mut f = self.functions.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(&h) = f.get(name) {
            return Ok(h as sys::CUfunction);
        }
        let cname = CString::new(name).map_err(|_| Error::InvalidArgument(name.into()))?;
        let mut h: sys::CUfunction = std::ptr::null_mut();
        // SAFETY: a loaded module and a NUL-terminated name.
        call("cuModuleGetFunction", || unsafe {
            sys::cuModuleGetFunction(&mut h, self.module, cname.as_ptr())
        })?;
        f.insert(name.into(), h as usize);
        Ok(h)
    }

    fn launch(&self, name: &str, stream: sys::CUstream, args: &mut [u64], n: u64) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        let f = self.function(name)?;
        let blocks = n.div_ceil(BLOCK as u64).clamp(1, MAX_BLOCKS) as u32;
        let mut params: Vec<*mut c_void> =
            args.iter_mut().map(|a| (a as *mut u64).cast()).collect();
        // SAFETY: the kernel takes exactly these 8-byte arguments; `params` outlives the call
        // (the driver copies arguments at launch).
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| unsafe {
            sys::cuLaunchKernel(
                f,
                blocks,
                1,
                1,
                BLOCK,
                1,
                1,
                0,
                stream,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        }))
        .map_err(|_| Error::Unsupported("the CUDA driver has no cuLaunchKernel".into()))?;
        check(r, name)
    }

    /// Enqueues low-latency kernel `name` (`strata_ll_reduce` or `strata_ll_copy`) with `args`
    /// on `stream`, on `blocks` blocks of [`LL_BLOCK`] threads.
    pub(crate) fn launch_ll(
        &self,
        name: &str,
        args: &LlArgs,
        blocks: u32,
        stream: sys::CUstream,
    ) -> Result<()> {
        let f = self.function(name)?;
        let mut copy = *args;
        let mut params: [*mut c_void; 1] = [(&mut copy as *mut LlArgs).cast()];
        // SAFETY: the kernel takes one parameter, a `strata_ll_args` by value, which `copy`
        // is; the driver copies it at launch.
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| unsafe {
            sys::cuLaunchKernel(
                f,
                blocks.max(1),
                1,
                1,
                LL_BLOCK,
                1,
                1,
                0,
                stream,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        }))
        .map_err(|_| Error::Unsupported("the CUDA driver has no cuLaunchKernel".into()))?;
        check(r, name)
    }

    /// Enqueues `dst = a op b` over `n` elements of `dtype` on `stream`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn combine(
        &self,
        dtype: DataType,
        op: Combine,
        dst: u64,
        a: u64,
        b: u64,
        n: usize,
        stream: sys::CUstream,
    ) -> Result<()> {
        let op = match op {
            Combine::Sum => "sum",
            Combine::Prod => "prod",
            Combine::Min => "min",
            Combine::Max => "max",
        };
        let name = format!("strata_combine_{op}_{}", kernel_suffix(dtype));
        self.launch(&name, stream, &mut [dst, a, b, n as u64], n as u64)
    }

    /// Enqueues `buf /= divisor` (avg) over `n` elements.
    pub(crate) fn divide(
        &self,
        dtype: DataType,
        buf: u64,
        divisor: usize,
        n: usize,
        stream: sys::CUstream,
    ) -> Result<()> {
        let name = format!("strata_divide_{}", kernel_suffix(dtype));
        self.launch(
            &name,
            stream,
            &mut [buf, divisor as u64, n as u64],
            n as u64,
        )
    }

    /// Enqueues `dst = src * scalar` (PreMulSum's first step) over `n` elements.
    pub(crate) fn scale(
        &self,
        scalar: &crate::dtype::Scalar,
        dst: u64,
        src: u64,
        n: usize,
        stream: sys::CUstream,
    ) -> Result<()> {
        let name = format!("strata_scale_{}", kernel_suffix(scalar.dtype));
        let bits = u64::from_le_bytes(scalar.bytes);
        self.launch(&name, stream, &mut [dst, src, bits, n as u64], n as u64)
    }
}

impl Drop for Kernels {
    fn drop(&mut self) {
        // SAFETY: loaded by cuModuleLoadData; nothing launches from it any more.
        let _ = call("cuModuleUnload", || unsafe {
            sys::cuModuleUnload(self.module)
        });
    }
}
