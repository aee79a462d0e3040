//! collbench as a launcher: when one of its ranks is stopped (SIGSTOP), the survivors name it
//! and the launcher ends the stopped rank and exits, instead of waiting on it; when the
//! launcher itself is killed, its ranks die with it. And collbench
//! on device buffers (the CUDA driver stand-in): it says which path each peer takes and what
//! one call moved through host memory; with ranks as threads of one process (`--threads`)
//! sharing one GPU, small calls run as one kernel each.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The pids whose parent is `parent` (from /proc).
fn children_of(parent: u32) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
                // pid (comm) state ppid ...: the comm may hold spaces, so split after ')'.
                stat.rsplit_once(')')
                    .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok())
                    == Some(parent)
            })
        })
        .collect()
}

#[test]
fn a_stopped_rank_ends_the_launcher_soon_after_the_survivors_name_it() {
    let mut launcher = Command::new(env!("CARGO_BIN_EXE_collbench"))
        .args([
            "--np", "4", "-b", "1M", "-e", "1M", "-n", "1000000", "-w", "1",
        ])
        .env("STRATA_SOCKET_IFNAME", "=lo")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait for the four ranks, and let them get into the benchmark.
    let t = Instant::now();
    let ranks = loop {
        let ranks = children_of(launcher.id());
        if ranks.len() == 4 || t.elapsed() > Duration::from_secs(30) {
            break ranks;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(ranks.len(), 4, "collbench did not start 4 ranks");
    std::thread::sleep(Duration::from_secs(2));
    let victim = ranks[1];
    // SAFETY: a child of the launcher this test started.
    assert_eq!(unsafe { libc::kill(victim, libc::SIGSTOP) }, 0);
    let stopped_at = Instant::now();
    let status = loop {
        if let Some(s) = launcher.try_wait().unwrap() {
            break Some(s);
        }
        if stopped_at.elapsed() > Duration::from_secs(30) {
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let took = stopped_at.elapsed();
    let Some(status) = status else {
        for pid in children_of(launcher.id()) {
            // SAFETY: children of the launcher this test started.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        let _ = launcher.kill();
        panic!("the launcher still ran 30 s after a rank was stopped");
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut launcher.stderr.take().unwrap(), &mut stderr).unwrap();
    println!("launcher exited {took:?} after SIGSTOP ({status})");
    assert!(!status.success(), "{stderr}");
    assert!(
        stderr.contains("stopped or hung"),
        "no survivor named the stopped rank:\n{stderr}"
    );
    // The watchdog takes 3 missed heartbeats (3 s) to call a rank hung; the launcher then
    // allows the others 1 s. It used to wait 10 s more for the stopped rank.
    assert!(took < Duration::from_secs(7), "took {took:?}:\n{stderr}");
    // And the stopped rank is gone, not left behind.
    assert!(!alive(victim), "the stopped rank {victim} is still there");
}

/// Whether `pid` is still a process (not gone, not a zombie).
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "))
}

#[test]
fn ranks_die_with_a_killed_launcher_instead_of_running_on() {
    let mut launcher = Command::new(env!("CARGO_BIN_EXE_collbench"))
        .args([
            "--np", "3", "-b", "1M", "-e", "1M", "-n", "1000000", "-w", "1",
        ])
        .env("STRATA_SOCKET_IFNAME", "=lo")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let t = Instant::now();
    let ranks = loop {
        let ranks = children_of(launcher.id());
        if ranks.len() == 3 || t.elapsed() > Duration::from_secs(30) {
            break ranks;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(ranks.len(), 3, "collbench did not start 3 ranks");
    std::thread::sleep(Duration::from_millis(500));
    // As a job scheduler's SIGKILL or an OOM kill would: the launcher has no chance to clean up.
    launcher.kill().unwrap();
    launcher.wait().unwrap();
    let killed_at = Instant::now();
    while ranks.iter().any(|&r| alive(r)) && killed_at.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let left: Vec<i32> = ranks.iter().copied().filter(|&r| alive(r)).collect();
    for &pid in &left {
        // SAFETY: ranks this test's launcher started; cleaning up before failing.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    assert!(
        left.is_empty(),
        "ranks {left:?} ran on after the launcher was killed"
    );
    println!("ranks gone {:?} after the launcher", killed_at.elapsed());
}

/// The rows of collbench's per-call table of the CUDA stand-in, each split into its fields
/// (size, type, host bytes, device bytes, host waits, host functions, launches, memory ops).
fn standin_table(text: &str) -> Vec<Vec<String>> {
    text.lines()
        .skip_while(|l| !l.starts_with("# CUDA driver stand-in"))
        .skip(2)
        .map(|l| {
            l.trim_start_matches('#')
                .split_whitespace()
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .take_while(|f| f.first().is_some_and(|s| s.parse::<u64>().is_ok()))
        .collect()
}

/// collbench's output with `args` and `env`, on loopback with `libs` as its library path,
/// after asserting that it succeeded.
fn collbench_ok(args: &[&str], env: &[(&str, &str)], libs: &std::ffi::OsStr) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_collbench"))
        .args(args)
        .env("STRATA_SOCKET_IFNAME", "=lo")
        .envs(env.iter().copied())
        .env("LD_LIBRARY_PATH", libs)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

#[test]
fn on_device_buffers_it_names_each_peers_path_and_the_host_bytes_per_call() {
    let dir = common::standin_dir("libstrata_cuda_standin.so", "libcuda.so.1", "cuda-standin");
    let text = collbench_ok(
        &[
            "--np", "3", "--device", "cuda", "-b", "64K", "-e", "256K", "-f", "4", "-n", "2", "-w",
            "1",
        ],
        &[("STRATA_GPU_PATH", "staged"), ("STRATA_STANDIN_GPUS", "4")],
        dir.as_os_str(),
    );
    assert!(
        text.contains("# Device paths of rank 0: rank 1 staged, rank 2 staged"),
        "{text}"
    );
    // Staged: each byte of the message goes to the host and back once per call.
    let counted: Vec<(u64, u64)> = standin_table(&text)
        .iter()
        .filter_map(|f| Some((f.first()?.parse().ok()?, f.get(2)?.parse().ok()?)))
        .collect();
    assert_eq!(counted, vec![(65536, 131072), (262144, 524288)], "{text}");
}

#[test]
fn ranks_as_threads_share_one_gpu_and_small_calls_run_as_one_kernel_each() {
    let test = "ranks_as_threads_share_one_gpu_and_small_calls_run_as_one_kernel_each";
    let Some(nvrtc) = common::nvrtc_dir(test) else {
        return;
    };
    let dir = common::standin_dir("libstrata_cuda_standin.so", "libcuda.so.1", "cuda-standin");
    let path = std::env::join_paths([dir.as_os_str(), nvrtc.as_os_str()]).unwrap();
    let text = collbench_ok(
        &[
            "--threads",
            "3",
            "--device",
            "cuda",
            "-b",
            "8",
            "-e",
            "256K",
            "-f",
            "8",
            "-n",
            "3",
            "-w",
            "1",
        ],
        &[("STRATA_STANDIN_GPUS", "1"), ("STRATA_GPU_KERNEL", "64K")],
        &path,
    );
    assert!(
        text.contains("# Device paths of rank 0: rank 1 direct, rank 2 direct"),
        "{text}"
    );
    assert!(text.contains("up to 64 KiB"), "{text}");
    assert!(text.contains("set by STRATA_GPU_KERNEL"), "{text}");
    // Up to 64 KiB one kernel per call (two-shot from 16 KiB) and no memory operation;
    // 256 KiB a stream program.
    let rows: Vec<(u64, String)> = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Some((f.first()?.parse().ok()?, f.last()?.to_string()))
        })
        .collect();
    let algos: Vec<&str> = rows.iter().map(|(_, a)| a.as_str()).collect();
    assert_eq!(algos[..4], ["ll_one_shot"; 4], "{text}");
    assert_eq!(algos[4], "ll_two_shot", "{text}");
    assert!(!algos[5].starts_with("ll"), "{text}");
    let counted: Vec<(u64, f64, f64)> = standin_table(&text)
        .iter()
        .filter_map(|f| {
            Some((
                f.first()?.parse().ok()?,
                f.get(6)?.parse().ok()?,
                f.get(7)?.parse().ok()?,
            ))
        })
        .collect();
    assert_eq!(counted.len(), 6, "{text}");
    for &(size, launches, memops) in &counted[..5] {
        assert_eq!((launches, memops), (1.0, 0.0), "{size} B: {text}");
    }
    assert!(counted[5].2 > 0.0, "the stream program's row: {text}");
    // Ranks as threads and as processes exclude each other.
    let both = Command::new(env!("CARGO_BIN_EXE_collbench"))
        .args(["--threads", "2", "--np", "2"])
        .output()
        .unwrap();
    assert!(!both.status.success());
    assert!(String::from_utf8_lossy(&both.stderr).contains("exclude each other"));
}

#[test]
fn a_full_dev_shm_fails_with_a_clear_error_not_sigbus() {
    let name = "a_full_dev_shm_fails_with_a_clear_error_not_sigbus";
    // SAFETY: a plain query.
    if unsafe { libc::geteuid() } != 0 || Command::new("unshare").arg("--version").output().is_err()
    {
        common::skip(
            name,
            "needs root and unshare (a private mount of a tiny /dev/shm)",
        );
        return;
    }
    // A 256 KiB /dev/shm, private to this run: a 1 MiB ring segment cannot fit.
    let script = format!(
        "mount -t tmpfs -o size=256k tmpfs /dev/shm && exec timeout 60 {} --np 2 -b 1M -e 1M -n 2 -w 1",
        env!("CARGO_BIN_EXE_collbench")
    );
    let out = Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c", &script])
        .env("STRATA_SOCKET_IFNAME", "=lo")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "ran with no room for its segments");
    assert!(
        !stderr.contains("signal: 7") && !stderr.contains("SIGBUS"),
        "a rank died of SIGBUS:\n{stderr}"
    );
    assert!(
        stderr.contains("no space in /dev/shm for a ") && stderr.contains("-byte shared-memory"),
        "{stderr}"
    );
    println!(
        "{}",
        stderr
            .lines()
            .find(|l| l.contains("no space"))
            .unwrap_or("")
    );
}

#[test]
fn segments_left_by_dead_ranks_are_removed_by_the_next_run() {
    // A process that has exited: its pid names a segment nobody will unlink.
    let mut dead = Command::new("true").spawn().unwrap();
    let dead_pid = dead.id();
    dead.wait().unwrap();
    let stale = std::path::PathBuf::from(format!("/dev/shm/strata-{dead_pid}-deadbeef00"));
    let live =
        std::path::PathBuf::from(format!("/dev/shm/strata-{}-feedface00", std::process::id()));
    let recent = std::path::PathBuf::from(format!("/dev/shm/strata-{dead_pid}-0123456789"));
    for f in [&stale, &live, &recent] {
        std::fs::write(f, [0u8; 4096]).unwrap();
    }
    // Leaks are old: only names older than 30 s are candidates (a connection's name lives for
    // milliseconds).
    let two_minutes_ago = libc::timespec {
        tv_sec: (std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
            - 120) as libc::time_t,
        tv_nsec: 0,
    };
    for f in [&stale, &live] {
        let c = std::ffi::CString::new(f.to_str().unwrap()).unwrap();
        let times = [two_minutes_ago, two_minutes_ago];
        // SAFETY: a valid path and two timespecs.
        assert_eq!(
            unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), times.as_ptr(), 0) },
            0
        );
    }
    let out = Command::new(env!("CARGO_BIN_EXE_collbench"))
        .args(["--np", "2", "-b", "8", "-e", "8", "-n", "1", "-w", "0"])
        .env("STRATA_SOCKET_IFNAME", "=lo")
        .output()
        .unwrap();
    let (stale_left, live_left) = (stale.exists(), live.exists());
    let _ = std::fs::remove_file(&stale);
    let _ = std::fs::remove_file(&live);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !stale_left,
        "the dead process's segment is still in /dev/shm"
    );
    assert!(live_left, "a live process's segment was removed");
}

/// The launcher's flags work on either side of `health`: both placements spawn 3 ranks
/// (the report's first line counts them), and the bound holds after the subcommand too.
#[test]
fn launcher_flags_work_before_and_after_the_health_subcommand() {
    let none = std::ffi::OsStr::new("");
    for args in [
        &["--np", "3", "health", "--bytes", "64K"][..],
        &[
            "health",
            "--np",
            "3",
            "--bytes",
            "64K",
            "--timeout",
            "60",
            "--bind-to",
            "none",
        ][..],
    ] {
        let text = collbench_ok(args, &[], none);
        assert!(text.contains("1 hosts, 3 ranks"), "{args:?}:\n{text}");
        assert!(text.contains("every host in line"), "{args:?}:\n{text}");
    }
}

/// `--algo rd,ring,auto` times the named algorithms and then strata's choice in one run; the
/// JSON marks the tuner's rows, and benches/auto_vs_best.py sets auto's median beside the best
/// fixed algorithm's over the rounds it is given.
#[test]
fn fixed_algorithms_and_auto_side_by_side_and_the_comparison_script() {
    let dir = std::env::temp_dir().join(format!("strata-all-auto-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let none = std::ffi::OsStr::new("");
    let mut files = Vec::new();
    for round in 0..2 {
        let path = dir.join(format!("round{round}.json"));
        let p = path.to_str().unwrap();
        let args = [
            "--np",
            "3",
            "--algo",
            "rd,ring,auto",
            "-b",
            "64",
            "-e",
            "4K",
            "-f",
            "64",
        ];
        collbench_ok(
            &[&args[..], &["-n", "3", "-w", "1", "-J", p]].concat(),
            &[],
            none,
        );
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let rows: Vec<(String, bool, u64)> = v["rows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                let algorithm = r["algorithm"].as_str().unwrap().to_string();
                (
                    algorithm,
                    r["tuned"].as_bool().unwrap(),
                    r["size_bytes"].as_u64().unwrap(),
                )
            })
            .collect();
        // Two sizes per table, in the order named: rd, ring, then the tuner's.
        assert_eq!(rows.len(), 6, "{rows:?}");
        assert_eq!(
            rows[..4],
            [
                ("rd".into(), false, 64),
                ("rd".into(), false, 4096),
                ("ring".into(), false, 64),
                ("ring".into(), false, 4096)
            ],
            "{rows:?}"
        );
        assert!(rows[4..].iter().all(|r| r.1), "{rows:?}");
        files.push(path);
    }
    let out = Command::new("python3")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/benches/auto_vs_best.py"
        ))
        .args(&files)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // One line per (collective, size) with its two rounds, and the count over both sizes.
    assert!(text.contains("all_reduce 64 B: auto "), "{text}");
    assert!(text.contains("all_reduce 4096 B: auto "), "{text}");
    assert_eq!(text.matches(", 2 rounds").count(), 2, "{text}");
    assert!(text.contains("/2\n"), "{text}");
}
