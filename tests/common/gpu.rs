//! The multi-process harness of the GPU tests (`tests/gpu_standin.rs`, `tests/gpu_faults.rs`):
//! ranks as processes of the test binary with the CUDA driver stand-in first on their library
//! path (the real driver under `STRATA_GPU_TESTS_REAL=1`), a gate that holds a stream, and
//! each rank's GPU.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use strata::gpu::{self, Stream, sys};
use strata::{CallSpec, Collective, Communicator, DataType, ReduceOp, UniqueId, check};

const WORKER: &str = super::WORKER;

/// `target/<profile>/cuda-standin/libcuda.so.1`, copied from the stand-in this test built.
pub fn standin_dir() -> PathBuf {
    super::standin_dir("libstrata_cuda_standin.so", "libcuda.so.1", "cuda-standin")
}

/// Spawns `n` ranks of test `name` with the stand-in as the driver; (success, output) each.
pub fn spawn(name: &str, n: usize, env: &[(&str, &str)], limit: Duration) -> Vec<(bool, String)> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // STRATA_GPU_TESTS_REAL=1 (scripts/gpu-check.sh): the real driver, no stand-in.
    let real = std::env::var_os("STRATA_GPU_TESTS_REAL").is_some();
    let mut dir = if real {
        std::env::var_os("LD_LIBRARY_PATH").unwrap_or_default()
    } else {
        standin_dir().into_os_string()
    };
    if let Some(nvrtc) = std::env::var_os("STRATA_NVRTC_DIR") {
        dir.push(":");
        dir.push(nvrtc);
    }
    let hex = UniqueId::new().unwrap().to_hex();
    let mut children: Vec<Child> = (0..n)
        .map(|r| {
            let mut c = Command::new(std::env::current_exe().unwrap());
            c.args([name, "--exact", "--nocapture", "--test-threads=1"])
                .env(WORKER, "1")
                .env("STRATA_TEST_ID", &hex)
                .env("STRATA_TEST_RANK", r.to_string())
                .env("STRATA_TEST_NRANKS", n.to_string())
                .env("STRATA_SOCKET_IFNAME", "=lo")
                .env("STRATA_STANDIN_GPUS", "4")
                .env("LD_LIBRARY_PATH", &dir)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            for (k, v) in env {
                c.env(k, v);
            }
            c.spawn().unwrap()
        })
        .collect();
    let start = Instant::now();
    let mut done = vec![None; n];
    while done.iter().any(Option::is_none) && start.elapsed() < limit {
        for (r, c) in children.iter_mut().enumerate() {
            if done[r].is_none() {
                done[r] = c.try_wait().unwrap().map(|s| s.success());
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    children
        .into_iter()
        .zip(done)
        .map(|(mut c, ok)| {
            if ok.is_none() {
                let _ = c.kill();
            }
            let out = c.wait_with_output().unwrap();
            let text = format!(
                "{}{}(exit: {:?})",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr),
                out.status
            );
            (
                ok == Some(true),
                if ok.is_none() {
                    format!("KILLED\n{text}")
                } else {
                    text
                },
            )
        })
        .collect()
}

/// In a rank: (communicator, rank, ranks); `None` in the parent.
pub fn worker() -> Option<(Communicator, usize, usize)> {
    std::env::var(WORKER).ok()?;
    let rank: usize = std::env::var("STRATA_TEST_RANK").ok()?.parse().ok()?;
    let n: usize = std::env::var("STRATA_TEST_NRANKS").ok()?.parse().ok()?;
    let id = UniqueId::from_hex(&std::env::var("STRATA_TEST_ID").ok()?).unwrap();
    let comm = Communicator::init(&id, n, rank).unwrap_or_else(|e| panic!("rank {rank}: {e}"));
    Some((comm, rank, n))
}

pub fn assert_all_ok(results: &[(bool, String)]) {
    if results.iter().any(|(ok, _)| !ok) {
        let all: Vec<String> = results
            .iter()
            .enumerate()
            .map(|(r, (ok, out))| {
                format!(
                    "--- rank {r} ({}):\n{out}",
                    if *ok { "ok" } else { "FAILED" }
                )
            })
            .collect();
        panic!("{}", all.join("\n"));
    }
}

/// Each rank drives its own GPU (rank % the GPUs visible; the stand-in shows 4), as one
/// process per GPU does.
pub fn device_of(rank: usize) -> i32 {
    (rank % gpu::driver().unwrap().devices) as i32
}

/// A word of pinned, device-mapped host memory that gates a stream: the stream waits at
/// `cuStreamWaitValue32` until the host writes 1.
pub struct Gate {
    host: *mut u32,
    dev: u64,
}

// SAFETY: a pinned word the driver maps; only the owner writes it.
unsafe impl Send for Gate {}

impl Gate {
    pub fn new() -> Self {
        let mut host: *mut std::ffi::c_void = std::ptr::null_mut();
        let mut dev = 0u64;
        // SAFETY: plain driver calls with valid out-pointers; a context is current.
        unsafe {
            assert_eq!(
                sys::cuMemHostAlloc(&mut host, 64, sys::CU_MEMHOSTALLOC_DEVICEMAP),
                sys::CUresult::CUDA_SUCCESS
            );
            (host as *mut u32).write_volatile(0);
            assert_eq!(
                sys::cuMemHostGetDevicePointer_v2(&mut dev, host, 0),
                sys::CUresult::CUDA_SUCCESS
            );
        }
        Gate {
            host: host.cast(),
            dev,
        }
    }

    pub fn close_on(&self, stream: &Stream) {
        let eq = sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_EQ as u32;
        // SAFETY: a live device-mapped word.
        let r = unsafe { sys::cuStreamWaitValue32_v2(stream.raw(), self.dev, 1, eq) };
        assert_eq!(r, sys::CUresult::CUDA_SUCCESS);
    }

    pub fn open(&self) {
        // SAFETY: a live pinned word; the stream reads it atomically.
        unsafe { std::ptr::write_volatile(self.host, 1) };
    }
}

/// Native-endian bytes of `v`.
pub fn f32s(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_ne_bytes()).collect()
}

/// Whether `STRATA_GPU_FULL_MATRIX=1` (`scripts/gpu-matrix.sh`) asks for every type and
/// operator with every algorithm.
pub fn full_matrix() -> bool {
    std::env::var("STRATA_GPU_FULL_MATRIX").is_ok_and(|v| v == "1")
}

/// The type × operator pairs a collective's algorithms are checked with: every one when
/// `full`, else three that cover float, integer and 16-bit arithmetic and the sum, max and avg
/// paths.
pub fn algorithm_pairs(collective: Collective, full: bool) -> Vec<(DataType, ReduceOp)> {
    if !full {
        return vec![
            (DataType::Float32, ReduceOp::Sum),
            (DataType::Int64, ReduceOp::Max),
            (DataType::Bfloat16, ReduceOp::Avg),
        ];
    }
    let mut out = Vec::new();
    for dtype in DataType::ALL {
        if collective.reduces() {
            out.extend(ReduceOp::BASIC.iter().map(|&op| (dtype, op)));
            out.push((dtype, ReduceOp::PreMulSum(check::premul_scalar(dtype, 0))));
        } else {
            out.push((dtype, ReduceOp::Sum));
        }
    }
    out
}

/// Calls `call(spec, in_place, what)` for every algorithm of `collective` that runs at `n`
/// ranks (forced with `set_algorithm` meanwhile), with [`algorithm_pairs`], in and out of
/// place, at 3 elements and at `big`; then gives `collective` back to the tuner.
pub fn for_each_algorithm_call(
    comm: &Communicator,
    n: usize,
    collective: Collective,
    full: bool,
    big: usize,
    mut call: impl FnMut(CallSpec, bool, String),
) {
    for &algorithm in strata::algorithms::algorithms_for(collective) {
        if algorithm.check_ranks(n).is_err() {
            continue;
        }
        comm.set_algorithm(collective, Some(algorithm)).unwrap();
        for (dtype, op) in algorithm_pairs(collective, full) {
            for in_place in [false, true] {
                for count in [3usize, big] {
                    let spec = CallSpec {
                        op,
                        root: 1 % n,
                        ..CallSpec::new(collective, dtype, count)
                    };
                    let what = format!(
                        "{collective}/{algorithm} {dtype} {op} {count} in_place {in_place}"
                    );
                    call(spec, in_place, what);
                }
            }
        }
    }
    comm.set_algorithm(collective, None).unwrap();
}

/// Calls `call(spec, in_place, what)` for every call of the full matrix: each collective with
/// buffers × every type × every operator (PreMulSum with rank 0's scalar; `check` gives each
/// rank its own) × in and out of place × `counts`, rooted at rank `n − 1`.
pub fn for_each_matrix_call(
    n: usize,
    counts: &[usize],
    mut call: impl FnMut(CallSpec, bool, String),
) {
    for collective in Collective::WITH_BUFFERS {
        for dtype in DataType::ALL {
            let ops: Vec<ReduceOp> = if collective.reduces() {
                let mut v = ReduceOp::BASIC.to_vec();
                v.push(ReduceOp::PreMulSum(check::premul_scalar(dtype, 0)));
                v
            } else {
                vec![ReduceOp::Sum]
            };
            for op in ops {
                for in_place in [false, true] {
                    for &count in counts {
                        let spec = CallSpec {
                            op,
                            root: n - 1,
                            ..CallSpec::new(collective, dtype, count)
                        };
                        let what = format!("{collective} {dtype} {op} {count} in_place {in_place}");
                        call(spec, in_place, what);
                    }
                }
            }
        }
    }
}

/// Adds `what` to `failures` unless `checked` is a check with nothing wrong.
pub fn note(failures: &mut Vec<String>, what: String, checked: strata::Result<check::Checked>) {
    match checked {
        Ok(c) if c.first.is_none() => {}
        Ok(c) => failures.push(format!("{what}: {:?}", c.first)),
        Err(e) => failures.push(format!("{what}: {e}")),
    }
}
