//! `collbench health` on emulated hosts: four network namespaces on one bridge, two ranks
//! each, every host's sending link shaped to 400 Mbit/s by `tc tbf`. With host 2's shaped to
//! half that, the check names host 2's egress and nothing else, and exits 3; with every link
//! equal it names no one and exits 0. Needs root, ip and tc; prints SKIPPED otherwise.

mod common;

use common::netns::Hosts;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const HOSTS: usize = 4;
const PER_HOST: usize = 2;
const SLOW: usize = 2;

/// Host `h`'s sending link shaped to `rate`.
fn tc(hosts: &Hosts, h: usize, rate: &str) -> bool {
    hosts.shape(h, rate, "512kb", "200ms")
}

/// Where rank `r` of the run on `port` writes its JSON report (rank 0 alone does).
fn json_path(port: u16, r: usize) -> std::path::PathBuf {
    std::env::temp_dir().join(format!(
        "strata-health-{}-{port}-{r}.json",
        std::process::id()
    ))
}

/// Runs `collbench health` on every rank; (exit code, output) per rank.
fn health(port: u16) -> Vec<(Option<i32>, String)> {
    let n = HOSTS * PER_HOST;
    let children: Vec<Child> = (0..n)
        .map(|r| {
            let ns = format!("st-k{}", r / PER_HOST);
            Command::new("ip")
                .args(["netns", "exec", &ns, "unshare", "--uts", "sh", "-c"])
                .arg(r#"hostname "$0"; exec "$@""#)
                .arg(&ns)
                .arg(env!("CARGO_BIN_EXE_collbench"))
                .args(["health", "--bytes", "2M", "--json"])
                .arg(json_path(port, r))
                .env("RANK", r.to_string())
                .env("LOCAL_RANK", (r % PER_HOST).to_string())
                .env("WORLD_SIZE", n.to_string())
                .env("MASTER_ADDR", "198.18.9.1")
                .env("MASTER_PORT", port.to_string())
                .env("STRATA_SOCKET_IFNAME", "eth0")
                .env("STRATA_TIMEOUT", "30")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let start = Instant::now();
    let mut children = children;
    while children
        .iter_mut()
        .any(|c| c.try_wait().ok().flatten().is_none())
    {
        if start.elapsed() > Duration::from_secs(90) {
            for c in &mut children {
                let _ = c.kill();
            }
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    children
        .into_iter()
        .map(|c| {
            let out = c.wait_with_output().unwrap();
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            (out.status.code(), text)
        })
        .collect()
}

#[test]
fn health_names_the_host_whose_link_is_shaped_to_half_and_no_other() {
    let hosts = match Hosts::build("st-k", "198.18.9.", HOSTS, |_| Vec::new()) {
        Ok(h) => h,
        Err(why) => {
            common::skip(
                "health_names_the_host_whose_link_is_shaped_to_half_and_no_other",
                &why,
            );
            return;
        }
    };
    if !(0..HOSTS).all(|h| tc(&hosts, h, "400mbit")) {
        common::skip(
            "health_names_the_host_whose_link_is_shaped_to_half_and_no_other",
            "tc tbf failed",
        );
        return;
    }
    let port = 29_600 + (std::process::id() % 100) as u16 * 2;
    // Every link equal: no one named.
    let t = Instant::now();
    let clean = health(port);
    let clean_s = t.elapsed().as_secs_f64();
    let table = &clean[0].1;
    println!("every link at 400 Mbit/s ({clean_s:.1} s):\n{table}");
    assert!(table.contains("every host in line"), "{table}");
    for (r, (code, out)) in clean.iter().enumerate() {
        assert_eq!(*code, Some(0), "rank {r}: {out}");
    }
    // Host 2 at half.
    assert!(tc(&hosts, SLOW, "200mbit"));
    let t = Instant::now();
    let shaped = health(port + 1);
    let shaped_s = t.elapsed().as_secs_f64();
    let table = &shaped[0].1;
    println!("host {SLOW} at 200 Mbit/s ({shaped_s:.1} s):\n{table}");
    for (r, (code, out)) in shaped.iter().enumerate() {
        assert_eq!(
            *code,
            Some(3),
            "rank {r} should say something is out of line: {out}"
        );
    }
    let verdicts: Vec<&str> = table.lines().filter(|l| l.starts_with("  st-k")).collect();
    assert_eq!(verdicts.len(), HOSTS, "{table}");
    for line in verdicts {
        let host = line.split_whitespace().next().unwrap();
        if host == format!("st-k{SLOW}") {
            assert!(line.contains("OUT OF LINE: egress"), "{line}");
        } else {
            assert!(line.trim_end().ends_with("ok"), "{line}");
        }
    }
    assert!(
        table.contains(&format!("# Health: 1 out of line: st-k{SLOW}")),
        "{table}"
    );
    // The JSON report says the same.
    let path = json_path(port + 1, 0);
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let outliers = report["outliers"].as_array().unwrap();
    assert_eq!(outliers.len(), 1, "{report}");
    assert_eq!(outliers[0]["host"], SLOW);
    assert_eq!(outliers[0]["what"], "egress");
    assert_eq!(report["rounds"], 2);
    for p in [json_path(port, 0), path] {
        let _ = std::fs::remove_file(p);
    }
    drop(hosts);
}
