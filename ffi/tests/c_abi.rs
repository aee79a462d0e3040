//! The C ABI from the outside: C, C++ and Python programs built against `include/nccl.h` (and
//! against NVIDIA's own header and library) run as several processes on `libnccl.so.2`.
//!
//! NVIDIA's NCCL comes from the PyPI wheel `nvidia-nccl-cu13` (the one torch 2.15 pins) that `.ci/run` installs and names
//! in `STRATA_NVIDIA_NCCL_DIR` (the folder holding `include/nccl.h` and `lib/libnccl.so.2`);
//! the tests that need it skip with one line on stderr when it is not set.

mod common;

use common::{built_cdylib, profile_dir, rand_suffix, skip};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The 34 functions PyTorch 2.9 imports from libnccl.so.2 (REFERENCE.md).
const PYTORCH_IMPORTS: [&str; 34] = [
    "AllGather",
    "AllReduce",
    "Bcast",
    "Broadcast",
    "CommAbort",
    "CommCount",
    "CommDeregister",
    "CommDestroy",
    "CommFinalize",
    "CommGetAsyncError",
    "CommInitAll",
    "CommInitRank",
    "CommInitRankConfig",
    "CommInitRankScalable",
    "CommRegister",
    "CommSplit",
    "CommUserRank",
    "CommWindowRegister",
    "CommWindowDeregister",
    "GetErrorString",
    "GetLastError",
    "GetUniqueId",
    "GetVersion",
    "GroupStart",
    "GroupEnd",
    "GroupSimulateEnd",
    "MemAlloc",
    "MemFree",
    "Send",
    "Recv",
    "RedOpCreatePreMulSum",
    "RedOpDestroy",
    "Reduce",
    "ReduceScatter",
];

/// strata's own functions, declared in its nccl.h under their own prefix (no NCCL program
/// calls them, so they cannot clash).
const STRATA_EXTENSIONS: [&str; 5] = [
    "strataCommSetTimeout",
    "strataCommGetStragglers",
    "strataCommGetStatus",
    "strataRecvAny",
    "strataCommSubgroup",
];

/// Newer functions strata also exports: the rest of NCCL 2.30's header and device API, of which
/// torch 2.15 imports the 2.29 and 2.30 additions (ffi/tests/pytorch.rs checks that list
/// against the installed torch itself).
const OTHERS: [&str; 20] = [
    "CommGetUniqueId",
    "CommGrow",
    "CommMemStats",
    "CommSuspend",
    "CommResume",
    "DevCommCreate",
    "DevCommDestroy",
    "GetLsaMultimemDevicePointer",
    "GetPeerDevicePointer",
    "PutSignal",
    "Signal",
    "WaitSignal",
    "WinGetUserPtr",
    "AlltoAll",
    "Gather",
    "Scatter",
    "CommShrink",
    "CommRevoke",
    "CommCuDevice",
    "ResetDebugInit",
];

/// A folder holding the built library as `libnccl.so.2`, with `libstrata.so` and
/// `libnccl.so` naming it too.
fn library_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let built = built_cdylib();
        let dir = profile_dir().join("strata-nccl-test");
        std::fs::create_dir_all(&dir).unwrap();
        let lib = dir.join("libnccl.so.2");
        let tmp = dir.join(format!("libnccl.so.2.{}", std::process::id()));
        std::fs::copy(&built, &tmp).unwrap();
        std::fs::rename(&tmp, &lib).unwrap();
        for alias in ["libstrata.so", "libnccl.so"] {
            let link = dir.join(alias);
            let _ = std::fs::remove_file(&link);
            let _ = std::os::unix::fs::symlink("libnccl.so.2", &link);
        }
        dir
    })
}

fn source(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join(name)
}

fn scratch(name: &str) -> PathBuf {
    let dir = profile_dir().join("strata-nccl-test").join("work");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(format!("{name}-{}", std::process::id()))
}

/// Runs a compiler or tool, failing the test with its output if it fails.
fn tool(cmd: &mut Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Compiles `src` into `out` against `include` and links it to the library in `lib_dir`.
fn compile_c(src: &str, out: &Path, include: &[&Path], lib_dir: &Path, extra: &[&str]) {
    let mut cmd = Command::new("cc");
    cmd.args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-O1", "-o"])
        .arg(out)
        .arg(source(src));
    for dir in include {
        cmd.arg("-I").arg(dir);
    }
    cmd.args(extra)
        .arg("-L")
        .arg(lib_dir)
        .arg("-lnccl")
        .arg(format!("-Wl,-rpath,{}", lib_dir.display()));
    tool(&mut cmd);
}

/// Runs `program` as `n` ranks (RANK, WORLD_SIZE, a fresh NCCL_TEST_ID_FILE) and returns each
/// rank's output; a rank still running after two minutes is killed and fails the test.
fn run_ranks(n: usize, program: &[&Path], env: &[(&str, &Path)]) -> Vec<String> {
    let id_file = scratch(&format!("id-{n}-{}", rand_suffix()));
    let _ = std::fs::remove_file(&id_file);
    let children: Vec<_> = (0..n)
        .map(|r| {
            let mut cmd = Command::new(program[0]);
            cmd.args(&program[1..])
                .env("RANK", r.to_string())
                .env("WORLD_SIZE", n.to_string())
                .env("NCCL_TEST_ID_FILE", &id_file)
                .env("STRATA_SOCKET_IFNAME", "=lo")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            for (k, v) in env {
                cmd.env(k, v);
            }
            cmd.spawn().expect("spawn a rank")
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut outputs = Vec::new();
    for (r, mut child) in children.into_iter().enumerate() {
        while child.try_wait().unwrap().is_none() {
            if Instant::now() > deadline {
                let _ = child.kill();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let out = child.wait_with_output().unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.status.success(),
            "rank {r} of {n} failed ({:?}):\n{text}",
            out.status
        );
        assert!(text.contains("all checks passed"), "rank {r}:\n{text}");
        outputs.push(text);
    }
    let _ = std::fs::remove_file(&id_file);
    outputs
}

/// NVIDIA's NCCL from the `nvidia-nccl-cu13` wheel, if `.ci/run` installed it.
fn nvidia_nccl(test: &str) -> Option<PathBuf> {
    let dir = std::env::var_os("STRATA_NVIDIA_NCCL_DIR").map(PathBuf::from);
    match dir {
        Some(d) if d.join("include/nccl.h").exists() && d.join("lib/libnccl.so.2").exists() => {
            Some(d)
        }
        Some(d) => {
            skip(
                test,
                &format!(
                    "STRATA_NVIDIA_NCCL_DIR={} lacks include/nccl.h or lib/libnccl.so.2",
                    d.display()
                ),
            );
            None
        }
        None => {
            skip(
                test,
                "STRATA_NVIDIA_NCCL_DIR is not set (scripts/test-all.sh points it at the nvidia-nccl-cu13 wheel torch installs)",
            );
            None
        }
    }
}

/// `tests/c/collectives.c` built against strata's header and library (once).
fn collectives_program() -> &'static Path {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| {
        let exe = scratch("collectives");
        compile_c(
            "c/collectives.c",
            &exe,
            &[&Path::new(env!("CARGO_MANIFEST_DIR")).join("include")],
            library_dir(),
            &[],
        );
        exe
    })
}

#[test]
fn a_c_program_checks_every_collective_on_4_and_3_processes() {
    let lib = library_dir();
    let exe = collectives_program();
    let out = run_ranks(4, &[exe], &[]);
    assert!(
        out[0].contains(&format!(
            "ncclAllReduce comes from {}",
            lib.join("libnccl.so.2").display()
        )),
        "{}",
        out[0]
    );
    run_ranks(3, &[exe], &[]);
}

#[test]
fn nccl_comm_id_fixes_the_root_and_every_rank_asks_for_the_id_itself() {
    let exe = collectives_program();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port();
    let comm_id = PathBuf::from(format!("127.0.0.1:{port}"));
    run_ranks(3, &[exe], &[("NCCL_COMM_ID", &comm_id)]);
}

#[test]
fn the_header_compiles_as_cpp_and_as_strict_c99() {
    let lib = library_dir();
    let include = Path::new(env!("CARGO_MANIFEST_DIR")).join("include");
    let exe = scratch("header-cpp");
    tool(
        Command::new("c++")
            .args(["-std=c++17", "-Wall", "-Wextra", "-Werror", "-o"])
            .arg(&exe)
            .arg(source("c/header.cpp"))
            .arg("-I")
            .arg(&include)
            .arg("-L")
            .arg(lib)
            .arg("-lnccl")
            .arg(format!("-Wl,-rpath,{}", lib.display())),
    );
    let out = tool(&mut Command::new(&exe));
    assert!(String::from_utf8_lossy(&out.stdout).contains("C++ sees NCCL 23007"));
    let probe = scratch("strict.c");
    std::fs::write(
        &probe,
        "#include \"nccl.h\"\nint main(void) { return ncclSuccess; }\n",
    )
    .unwrap();
    tool(
        Command::new("cc")
            .args([
                "-std=c99",
                "-pedantic-errors",
                "-Wall",
                "-Werror",
                "-fsyntax-only",
            ])
            .arg("-I")
            .arg(&include)
            .arg(&probe),
    );
}

#[test]
fn exports_are_exactly_the_nccl_api_and_the_soname_is_libnccl_so_2() {
    let lib = library_dir().join("libnccl.so.2");
    let out = tool(Command::new("nm").args(["-D", "--defined-only"]).arg(&lib));
    let mut exported: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2).map(str::to_string))
        .collect();
    exported.sort();
    let mut want: Vec<String> = PYTORCH_IMPORTS
        .iter()
        .chain(&OTHERS)
        .flat_map(|f| [format!("nccl{f}"), format!("pnccl{f}")])
        .chain(STRATA_EXTENSIONS.iter().map(|f| f.to_string()))
        .collect();
    want.sort();
    assert_eq!(
        exported, want,
        "the exported symbols differ from NCCL's API"
    );
    let dynamic = tool(Command::new("readelf").arg("-d").arg(&lib));
    assert!(
        String::from_utf8_lossy(&dynamic.stdout).contains("Library soname: [libnccl.so.2]"),
        "{}",
        String::from_utf8_lossy(&dynamic.stdout)
    );
}

/// A folder with the CUDA driver stand-in (`tests/standins/cuda`) as `libcuda.so.1`.
fn cuda_standin_dir() -> PathBuf {
    let built = [profile_dir().join("deps"), profile_dir()]
        .into_iter()
        .map(|d| d.join("libstrata_cuda_standin.so"))
        .find(|p| p.exists())
        .expect("the CUDA stand-in (a dev-dependency) was built");
    let dir = profile_dir().join("strata-nccl-test").join("cuda-standin");
    std::fs::create_dir_all(&dir).unwrap();
    let tmp = dir.join(format!("libcuda.so.1.{}", std::process::id()));
    std::fs::copy(&built, &tmp).unwrap();
    std::fs::rename(&tmp, dir.join("libcuda.so.1")).unwrap();
    dir
}

/// Logic-level only: the stand-in driver runs streams on host threads.
#[test]
fn gpu_buffers_on_streams_every_collective_at_2_3_and_4_processes_on_the_cuda_standin() {
    let lib = library_dir();
    let standin = cuda_standin_dir();
    let exe = scratch("device-collectives");
    let driver = standin.join("libcuda.so.1");
    compile_c(
        "c/device_collectives.c",
        &exe,
        &[&Path::new(env!("CARGO_MANIFEST_DIR")).join("include")],
        lib,
        &[driver.to_str().unwrap(), "-lm"],
    );
    let staged = PathBuf::from(std::env::join_paths([standin.as_path(), lib]).unwrap());
    for n in [2, 3, 4] {
        run_ranks(
            n,
            &[&exe],
            &[
                ("LD_LIBRARY_PATH", staged.as_path()),
                ("STRATA_GPU_CHUNK", Path::new("4K")),
                ("STRATA_GPU_PATH", Path::new("staged")),
            ],
        );
    }
    // GPU to GPU: every collective and the send/receive group as stream programs over CUDA
    // IPC, with the kernels NVRTC compiles at bind.
    let Some(nvrtc) = std::env::var_os("STRATA_NVRTC_DIR") else {
        common::skip(
            "gpu_buffers_on_streams (stream-program part)",
            "STRATA_NVRTC_DIR (the folder of libnvrtc.so.12, which scripts/test-all.sh installs) is not set",
        );
        return;
    };
    let with_nvrtc = std::env::join_paths([standin.as_path(), lib, Path::new(&nvrtc)]).unwrap();
    for n in [2, 3, 4] {
        run_ranks(
            n,
            &[&exe],
            &[
                ("LD_LIBRARY_PATH", Path::new(&with_nvrtc)),
                ("STRATA_GPU_CHUNK", Path::new("4K")),
                ("STRATA_GPU_PATH", Path::new("stream")),
            ],
        );
    }
}

/// Ranks as threads of one process sharing one GPU (the stand-in shows one):
/// `ncclCommInitAll` with the device list {0, 0, ...} and grouped calls, and
/// `ncclCommInitRank` from a thread per rank; host-staged, then as kernels and stream
/// programs (peers in one process reach each other's memory directly, with no IPC).
/// Logic-level only.
#[test]
fn ranks_as_threads_sharing_one_gpu_through_init_all_and_init_rank_on_the_cuda_standin() {
    let lib = library_dir();
    let standin = cuda_standin_dir();
    let exe = scratch("device-threads");
    let driver = standin.join("libcuda.so.1");
    compile_c(
        "c/device_threads.c",
        &exe,
        &[&Path::new(env!("CARGO_MANIFEST_DIR")).join("include")],
        lib,
        &[driver.to_str().unwrap(), "-lpthread"],
    );
    let staged = PathBuf::from(std::env::join_paths([standin.as_path(), lib]).unwrap());
    let one_gpu = Path::new("1");
    let run = |n: &str, path: &Path, gpu_path: &str| {
        let out = run_ranks(
            1,
            &[&exe, Path::new(n)],
            &[
                ("LD_LIBRARY_PATH", path),
                ("STRATA_STANDIN_GPUS", one_gpu),
                ("STRATA_GPU_CHUNK", Path::new("64K")),
                ("STRATA_GPU_PATH", Path::new(gpu_path)),
            ],
        );
        assert!(out[0].contains("all checks passed"), "{}", out[0]);
    };
    run("2", &staged, "staged");
    let Some(nvrtc) = std::env::var_os("STRATA_NVRTC_DIR") else {
        common::skip(
            "ranks_as_threads_sharing_one_gpu (kernel and stream-program part)",
            "STRATA_NVRTC_DIR (the folder of libnvrtc.so.12, which scripts/test-all.sh installs) is not set",
        );
        return;
    };
    let with_nvrtc =
        PathBuf::from(std::env::join_paths([standin.as_path(), lib, Path::new(&nvrtc)]).unwrap());
    for n in ["2", "3"] {
        run(n, &with_nvrtc, "stream");
    }
}

/// A Rust program written as cudarc's users write it (`examples/cudarc_client.rs`: cudarc's
/// safe NCCL API, `clone_htod`, a collective, `clone_dtoh` into a `Vec` with no synchronize),
/// unchanged, through the drop-in: at 2, 3 and 4 processes (default stream, then a stream of
/// its own) and as 2 and 3 ranks of one process on one GPU (`Comm::from_devices`), staged and
/// as kernels and stream programs. It relies on the driver's rule that a copy into pageable
/// memory returns when it is done, which the stand-in follows. Logic-level only.
#[test]
fn a_client_written_with_cudarcs_safe_api_runs_unchanged_through_the_drop_in() {
    let client = profile_dir().join("examples").join("cudarc_client");
    assert!(
        client.exists(),
        "{} was not built (cargo test builds strata-ffi's examples)",
        client.display()
    );
    let lib = library_dir();
    let standin = cuda_standin_dir();
    let mut paths = vec![(
        "staged",
        PathBuf::from(std::env::join_paths([standin.as_path(), lib]).unwrap()),
    )];
    match std::env::var_os("STRATA_NVRTC_DIR") {
        Some(nvrtc) => paths.push((
            "stream",
            PathBuf::from(
                std::env::join_paths([standin.as_path(), lib, Path::new(&nvrtc)]).unwrap(),
            ),
        )),
        None => common::skip(
            "a_client_written_with_cudarcs_safe_api (kernel and stream-program part)",
            "STRATA_NVRTC_DIR (the folder of libnvrtc.so.12, which scripts/test-all.sh installs) is not set",
        ),
    }
    for (gpu_path, dirs) in &paths {
        let env = [
            ("LD_LIBRARY_PATH", dirs.as_path()),
            ("STRATA_STANDIN_GPUS", Path::new("1")),
            ("STRATA_GPU_PATH", Path::new(gpu_path)),
        ];
        for n in [2, 3, 4] {
            run_ranks(n, &[&client, Path::new("processes")], &env);
        }
        for n in ["2", "3"] {
            run_ranks(1, &[&client, Path::new("threads"), Path::new(n)], &env);
        }
    }
}

#[test]
fn python_through_ctypes_and_numpy_on_4_processes() {
    let test = "python_through_ctypes_and_numpy_on_4_processes";
    // The PyTorch venv has numpy; else the system's python3.
    let python = std::env::var_os("STRATA_TORCH_PYTHON").unwrap_or_else(|| "python3".into());
    let numpy = Command::new(&python).args(["-c", "import numpy"]).output();
    if !numpy.is_ok_and(|o| o.status.success()) {
        skip(
            test,
            "no python with numpy (set STRATA_TORCH_PYTHON; scripts/test-all.sh installs one)",
        );
        return;
    }
    let lib = library_dir().join("libnccl.so.2");
    let script = source("python/nccl_ctypes.py");
    run_ranks(
        4,
        &[Path::new(&python), &script],
        &[("STRATA_NCCL_LIB", &lib)],
    );
}

/// Runs abi.c compiled against `include` (plus `extra` include folders) and returns its output.
fn abi_facts(name: &str, include: &[&Path]) -> String {
    let exe = scratch(name);
    let mut cmd = Command::new("cc");
    cmd.args(["-std=c11", "-O1", "-o"])
        .arg(&exe)
        .arg(source("c/abi.c"));
    for dir in include {
        cmd.arg("-I").arg(dir);
    }
    tool(&mut cmd);
    String::from_utf8_lossy(&tool(&mut Command::new(&exe)).stdout).into_owned()
}

#[test]
fn config_layout_and_enum_values_match_nvidia_nccl() {
    let ours = abi_facts(
        "abi-strata",
        &[&Path::new(env!("CARGO_MANIFEST_DIR")).join("include")],
    );
    // The Rust side of the ABI agrees with strata's header.
    let offset = |field: &str| -> usize {
        ours.lines()
            .find_map(|l| l.strip_prefix(&format!("ncclConfig_t.{field} ")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no offset for {field} in:\n{ours}"))
    };
    use strata_ffi::{NcclConfig, NcclSimInfo};
    assert_eq!(
        offset("blocking"),
        std::mem::offset_of!(NcclConfig, blocking)
    );
    assert_eq!(
        offset("netName"),
        std::mem::offset_of!(NcclConfig, net_name)
    );
    assert_eq!(
        offset("commName"),
        std::mem::offset_of!(NcclConfig, comm_name)
    );
    assert_eq!(
        offset("nvlinkCentricSched"),
        std::mem::offset_of!(NcclConfig, nvlink_centric_sched)
    );
    assert_eq!(
        offset("graphStreamOrdering"),
        std::mem::offset_of!(NcclConfig, graph_stream_ordering)
    );
    assert!(ours.contains(&format!(
        "sizeof(ncclConfig_t) {}",
        std::mem::size_of::<NcclConfig>()
    )));
    assert!(ours.contains(&format!(
        "ncclSimInfo_t.estimatedTime {}",
        std::mem::offset_of!(NcclSimInfo, estimated_time)
    )));
    let Some(nv) = nvidia_nccl("config_layout_and_enum_values_match_nvidia_nccl") else {
        return;
    };
    let theirs = abi_facts(
        "abi-nvidia",
        &[&nv.join("include"), &source("c/cuda-standin")],
    );
    assert_eq!(ours, theirs, "strata's nccl.h differs from NVIDIA's");
}

#[test]
fn a_binary_built_against_nvidia_nccl_runs_on_strata_by_ld_preload() {
    let Some(nv) = nvidia_nccl("a_binary_built_against_nvidia_nccl_runs_on_strata_by_ld_preload")
    else {
        return;
    };
    // Link against NVIDIA's own library, through a folder that also names it libnccl.so.
    let nv_lib = profile_dir().join("strata-nccl-test").join("nvidia-lib");
    std::fs::create_dir_all(&nv_lib).unwrap();
    let link = nv_lib.join("libnccl.so");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(nv.join("lib/libnccl.so.2"), &link).unwrap();
    let exe = scratch("collectives-nvidia");
    compile_c(
        "c/collectives.c",
        &exe,
        &[&nv.join("include"), &source("c/cuda-standin")],
        &nv_lib,
        &[],
    );
    let needed = tool(Command::new("readelf").arg("-d").arg(&exe));
    assert!(String::from_utf8_lossy(&needed.stdout).contains("[libnccl.so.2]"));
    let ours = library_dir().join("libnccl.so.2");
    let out = run_ranks(4, &[&exe], &[("LD_PRELOAD", &ours)]);
    assert!(
        out[0].contains(&format!("ncclAllReduce comes from {}", ours.display())),
        "{}",
        out[0]
    );
}
