//! `collbench status`, the live view of a running job, asked from outside it:
//! * a 4-rank `collbench --np 4` job with its root at `STRATA_ROOT`: every rank answers with
//!   its call; with rank 2 stopped (SIGSTOP) inside its all-reduces, rank 2 is named silent and
//!   holding the job up, with the call the others wait in; with rank 0 stopped, its children
//!   are asked in its place; a client without the job's secret is refused; once the job ends
//!   the root's port is closed;
//! * a job whose ranks join from the launcher's variables (`RANK`/`WORLD_SIZE`), where rank 0
//!   keeps the root: the view answers, and the port closes when rank 0 exits.

use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A TCP port nobody listens on now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The pids whose parent is `parent` (from /proc), in the order they were started.
fn children_of(parent: u32) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut pids: Vec<i32> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
                stat.rsplit_once(')')
                    .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok())
                    == Some(parent)
            })
        })
        .collect();
    pids.sort_unstable();
    pids
}

/// `collbench status --json` against `root` with `secret`: its exit code, the view (when it
/// printed one) and how long it took.
fn status(root: &str, secret: &str) -> (Option<i32>, Option<serde_json::Value>, Duration, Output) {
    let t = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_collbench"))
        // A loaded machine may take a while to answer: 3 s, of which a stopped rank costs
        // about a quarter.
        .args(["status", "--json", "--within", "3", "--root", root])
        .env("STRATA_SECRET", secret)
        .output()
        .unwrap();
    let took = t.elapsed();
    let view = serde_json::from_slice(&out.stdout).ok();
    (out.status.code(), view, took, out)
}

/// The ranks a view lists under `key` (`ranks` or `silent`).
fn ranks_in(view: &serde_json::Value, key: &str) -> Vec<u64> {
    view[key]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["rank"].as_u64().unwrap())
        .collect()
}

/// Asks until all `n` ranks answer (the job is up), for up to 30 s.
fn wait_for_ranks(root: &str, secret: &str, n: u64) -> serde_json::Value {
    let t = Instant::now();
    loop {
        if let (_, Some(view), _, _) = status(root, secret)
            && ranks_in(&view, "ranks").len() as u64 == n
        {
            return view;
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "the job never answered"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn signal(pid: i32, sig: i32) {
    // SAFETY: a child of a process this test started.
    assert_eq!(unsafe { libc::kill(pid, sig) }, 0);
}

/// Ends `child` and every process it started.
fn end(mut child: Child) {
    for pid in children_of(child.id()) {
        // SAFETY: children of the launcher this test started.
        unsafe {
            libc::kill(pid, libc::SIGCONT);
            libc::kill(pid, libc::SIGKILL);
        }
    }
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn status_names_a_stopped_rank_and_its_call_and_refuses_strangers() {
    let root = format!("127.0.0.1:{}", free_port());
    let secret = "0123456789abcdef0123456789abcdef";
    let launcher = Command::new(env!("CARGO_BIN_EXE_collbench"))
        .args([
            "--np", "4", "-b", "64K", "-e", "64K", "-n", "10000000", "-w", "1",
        ])
        .args(["--timeout", "120"])
        .env("STRATA_SOCKET_IFNAME", "=lo")
        .env("STRATA_ROOT", &root)
        .env("STRATA_SECRET", secret)
        // The watchdog would end the job 3 s after a stop; the view is what is tested here.
        .env("STRATA_HEARTBEAT_MISSES", "60")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let view = wait_for_ranks(&root, secret, 4);
    assert_eq!(view["nranks"], 4);
    assert_eq!(view["root"], root.as_str());
    assert_eq!(ranks_in(&view, "silent"), Vec::<u64>::new(), "{view:#}");
    let ranks = children_of(launcher.id());
    assert_eq!(ranks.len(), 4);
    // Rank 2, stopped in the middle of its all-reduces.
    signal(ranks[2], libc::SIGSTOP);
    std::thread::sleep(Duration::from_millis(500));
    let (code, view, took, out) = status(&root, secret);
    let view = view.unwrap_or_else(|| panic!("{out:?}"));
    println!("rank 2 stopped: view in {took:?}");
    assert_eq!(code, Some(3), "someone holds the job up");
    assert_eq!(ranks_in(&view, "silent"), vec![2], "{view:#}");
    assert_eq!(ranks_in(&view, "ranks"), vec![0, 1, 3], "{view:#}");
    assert_eq!(view["silent"][0]["pid"], ranks[2]);
    let culprit = &view["holding_up"][0];
    assert_eq!(culprit["rank"], 2, "{view:#}");
    assert!(
        culprit["call"]
            .as_str()
            .unwrap()
            .starts_with("all_reduce #"),
        "{culprit}"
    );
    assert!(!culprit["waited_on_by"].as_array().unwrap().is_empty());
    for r in view["ranks"].as_array().unwrap() {
        assert_eq!(r["call"]["collective"], "all_reduce", "{r}");
    }
    // The text names it too.
    let text = Command::new(env!("CARGO_BIN_EXE_collbench"))
        .args(["status", "--within", "3", "--root", &root])
        .env("STRATA_SECRET", secret)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout).to_string();
    println!("{text}");
    assert!(text.contains("holding up the job: rank 2 (host"), "{text}");
    assert!(text.contains("does not answer"), "{text}");
    signal(ranks[2], libc::SIGCONT);
    // Rank 0 stopped: its children are asked in its place.
    signal(ranks[0], libc::SIGSTOP);
    std::thread::sleep(Duration::from_millis(300));
    let (_, view, _, out) = status(&root, secret);
    let view = view.unwrap_or_else(|| panic!("{out:?}"));
    assert_eq!(ranks_in(&view, "silent"), vec![0], "{view:#}");
    assert_eq!(ranks_in(&view, "ranks"), vec![1, 2, 3], "{view:#}");
    signal(ranks[0], libc::SIGCONT);
    // A client without the job's secret learns nothing.
    let (code, view, _, out) = status(&root, "ffffffffffffffffffffffffffffffff");
    assert_eq!(code, Some(1));
    assert!(view.is_none());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("does not hold this job's secret"), "{err}");
    end(launcher);
    let (code, _, _, out) = status(&root, secret);
    assert_eq!(code, Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("Connection refused"), "{err}");
}

#[test]
fn rank_0_of_a_launched_job_keeps_the_root_open_for_the_view_while_it_runs() {
    let root = format!("127.0.0.1:{}", free_port());
    let secret = "00112233445566778899aabbccddeeff";
    let ranks: Vec<Child> = (0..3)
        .map(|rank| {
            Command::new(env!("CARGO_BIN_EXE_collbench"))
                .args(["-b", "8", "-e", "8", "-n", "100000000", "-w", "1"])
                .env("STRATA_SOCKET_IFNAME", "=lo")
                .env("STRATA_ROOT", &root)
                .env("STRATA_SECRET", secret)
                .env("RANK", rank.to_string())
                .env("WORLD_SIZE", "3")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    let pids: Vec<u32> = ranks.iter().map(Child::id).collect();
    let view = wait_for_ranks(&root, secret, 3);
    let answered: Vec<u64> = view["ranks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["pid"].as_u64().unwrap())
        .collect();
    assert_eq!(
        answered,
        pids.iter().map(|&p| u64::from(p)).collect::<Vec<_>>()
    );
    for r in ranks {
        end(r);
    }
    let (code, _, _, _) = status(&root, secret);
    assert_eq!(code, Some(1), "the root closed with rank 0");
}
