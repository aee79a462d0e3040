//! Metrics a real Prometheus scrapes: four ranks (processes) serve them on
//! `STRATA_METRICS_PORT` + their place on this host; Debian's `prometheus`, started by the
//! test, scrapes all four every second; once it scrapes them all, they make their calls, and
//! once they have (and idle, still serving), the server's HTTP API returns the calls and
//! bytes they made, within a scrape interval. And the text itself: families, labels, and a file for jobs that cannot
//! open ports. Prometheus needs its package (`scripts/test-deps.sh` installs it); the test
//! prints SKIPPED without it.

mod common;

use common::{is_worker, spawn_watched, worker};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use strata::ReduceOp;

const CALLS: usize = 300;
const ELEMS: usize = 16 << 10; // 64 KiB of f32
const RANKS: usize = 4;

/// A GET of `path` from `port` on loopback: the body, or None.
fn http_get(port: u16, path: &str) -> Option<String> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200").then(|| body.to_string())
}

/// Four consecutive ports nobody listens on, from a random start.
fn free_ports(n: u16) -> u16 {
    loop {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let base = probe.local_addr().unwrap().port().clamp(20000, 60000 - n);
        drop(probe);
        let held: Vec<_> = (base..base + n)
            .map_while(|p| std::net::TcpListener::bind(("127.0.0.1", p)).ok())
            .collect();
        if held.len() == n as usize {
            return base;
        }
    }
}

/// Waits (up to 90 s) for the test to create `file` in `dir`.
fn wait_for(dir: &Path, file: &str) {
    let t = Instant::now();
    while !dir.join(file).exists() && t.elapsed() < Duration::from_secs(90) {
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// In a rank: once Prometheus scrapes every rank, CALLS all-reduces of 64 KiB, then "done",
/// then idle (serving its metrics) until the test releases it.
fn rank_body(dir: &Path) {
    let w = worker().unwrap();
    wait_for(dir, "go");
    let mut buf = vec![1f32; ELEMS];
    for _ in 0..CALLS {
        w.comm.all_reduce_in_place(&mut buf, ReduceOp::Sum).unwrap();
        buf.fill(1.0);
    }
    std::fs::write(dir.join(format!("done-{}", w.rank)), "").unwrap();
    wait_for(dir, "release");
}

/// Debian's prometheus scraping `targets` every second, its API on `port`; killed on drop.
struct Prometheus(Child, PathBuf);

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
        let _ = std::fs::remove_dir_all(&self.1);
    }
}

fn start_prometheus(dir: &Path, targets: &[u16], port: u16) -> std::io::Result<Prometheus> {
    let list: Vec<String> = targets.iter().map(|p| format!("'127.0.0.1:{p}'")).collect();
    let conf = dir.join("prometheus.yml");
    std::fs::write(
        &conf,
        format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: strata\n    \
             static_configs:\n      - targets: [{}]\n",
            list.join(", ")
        ),
    )?;
    let data = dir.join("prometheus-data");
    let child = Command::new("prometheus")
        .arg(format!("--config.file={}", conf.display()))
        .arg(format!("--storage.tsdb.path={}", data.display()))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    Ok(Prometheus(child, data))
}

/// The value of a PromQL query that returns one number, if it does.
fn query(port: u16, promql: &str) -> Option<f64> {
    let enc: String = promql
        .bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect();
    let body = http_get(port, &format!("/api/v1/query?query={enc}"))?;
    let v: serde_json::Value = serde_json::from_str(&body).ok()?;
    v["data"]["result"][0]["value"][1].as_str()?.parse().ok()
}

#[test]
fn prometheus_scrapes_every_rank_and_returns_the_calls_and_bytes_the_job_made() {
    let name = "prometheus_scrapes_every_rank_and_returns_the_calls_and_bytes_the_job_made";
    if is_worker() {
        return rank_body(Path::new(&std::env::var("STRATA_TEST_DIR").unwrap()));
    }
    if Command::new("prometheus")
        .arg("--version")
        .output()
        .is_err()
    {
        return common::skip(
            name,
            "prometheus is not installed (Debian's prometheus; scripts/test-deps.sh installs it)",
        );
    }
    let dir = std::env::temp_dir().join(format!("strata-metrics-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let base = free_ports(RANKS as u16 + 1);
    let targets: Vec<u16> = (base..base + RANKS as u16).collect();
    let api = base + RANKS as u16;
    let prometheus = start_prometheus(&dir, &targets, api).unwrap();
    let (base_s, dir_s) = (base.to_string(), dir.display().to_string());
    let env = [
        ("STRATA_METRICS_PORT", base_s.as_str()),
        ("STRATA_TEST_DIR", dir_s.as_str()),
    ];
    let want_calls = (RANKS * CALLS) as f64;
    let want_bytes = (RANKS * CALLS * ELEMS * 4) as f64;
    let (mut done_at, mut seen) = (None::<Instant>, None::<(Duration, f64, f64, f64)>);
    let mut last_poll = Instant::now();
    let ranks = spawn_watched(
        name,
        RANKS,
        RANKS,
        &env,
        Duration::from_secs(120),
        |_, _| {
            if seen.is_some() || last_poll.elapsed() < Duration::from_millis(100) {
                return;
            }
            last_poll = Instant::now();
            if !dir.join("go").exists() {
                if query(api, "count(up{job=\"strata\"} == 1)") == Some(RANKS as f64) {
                    std::fs::write(dir.join("go"), "").unwrap();
                }
                return;
            }
            let all_done = (0..RANKS).all(|r| dir.join(format!("done-{r}")).exists());
            if all_done && done_at.is_none() {
                done_at = Some(Instant::now());
            }
            let Some(t0) = done_at else {
                return;
            };
            let calls = query(api, "sum(strata_calls_total{collective=\"all_reduce\"})");
            let bytes = query(api, "sum(strata_bytes_total{collective=\"all_reduce\"})");
            let scraped = query(api, "count(strata_calls_total{collective=\"all_reduce\"})");
            if calls == Some(want_calls) && bytes == Some(want_bytes) || t0.elapsed().as_secs() > 30
            {
                seen = Some((
                    t0.elapsed(),
                    calls.unwrap_or(-1.0),
                    bytes.unwrap_or(-1.0),
                    scraped.unwrap_or(-1.0),
                ));
                std::fs::write(dir.join("release"), "").unwrap();
            }
        },
    );
    drop(prometheus);
    let _ = std::fs::remove_dir_all(&dir);
    common::assert_all_ok(&ranks);
    let (after, calls, bytes, scraped) = seen.expect("the ranks never finished their calls");
    println!(
        "prometheus returned {calls} calls and {bytes} bytes from {scraped} ranks {:.2} s after \
         the last rank's last call (scrape interval 1 s)",
        after.as_secs_f64()
    );
    assert_eq!(
        (calls, bytes, scraped),
        (want_calls, want_bytes, RANKS as f64)
    );
    // One interval, plus the time a scrape and this poll take on a loaded 2-core machine.
    assert!(after < Duration::from_secs(2), "{after:?}");
}

/// What one rank serves and writes: every family with its help and type, the calls and bytes
/// of each collective under the communicator's labels, the bus bytes at nccl-tests' factor,
/// 404 elsewhere; the file carries the same text; a rank whose port is taken warns and runs.
#[test]
fn the_text_names_every_family_and_the_file_carries_it() {
    let name = "the_text_names_every_family_and_the_file_carries_it";
    if let Some(w) = worker() {
        let dir = PathBuf::from(std::env::var("STRATA_TEST_DIR").unwrap());
        let mut buf = vec![1f32; 1024];
        for _ in 0..10 {
            w.comm.all_reduce_in_place(&mut buf, ReduceOp::Sum).unwrap();
        }
        let mut out = vec![0f32; 1024 * w.n];
        w.comm.all_gather(&buf, &mut out).unwrap();
        w.comm.barrier().unwrap();
        if w.rank == 0 {
            let port: u16 = std::env::var("STRATA_METRICS_PORT")
                .unwrap()
                .parse()
                .unwrap();
            let text = http_get(port, "/metrics").expect("GET /metrics");
            assert!(http_get(port, "/other").is_none(), "only /metrics answers");
            std::fs::write(dir.join("served.txt"), text).unwrap();
            // The file is rewritten every 50 ms: wait for one after these calls.
            std::thread::sleep(Duration::from_millis(300));
            let file = std::fs::read_to_string(dir.join("metrics-0.prom")).unwrap();
            std::fs::write(dir.join("file.txt"), file).unwrap();
        }
        w.comm.barrier().unwrap();
        return;
    }
    if is_worker() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("strata-metrics-text-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let base = free_ports(3);
    let port = base.to_string();
    // Rank 1's port is taken: it serves no metrics, says so, and the job goes on.
    let _taken = std::net::TcpListener::bind(("127.0.0.1", base + 1)).unwrap();
    let file = dir.join("metrics-{rank}.prom").display().to_string();
    let dir_s = dir.display().to_string();
    let env = [
        ("STRATA_METRICS_PORT", port.as_str()),
        ("STRATA_METRICS_FILE", file.as_str()),
        ("STRATA_METRICS_INTERVAL_MS", "50"),
        ("STRATA_LOG", "warn"),
        ("STRATA_TEST_DIR", dir_s.as_str()),
    ];
    let ranks = common::spawn(name, 3, 3, &env, Duration::from_secs(60));
    common::assert_all_ok(&ranks);
    assert!(ranks[1].1.contains("metrics: not served"), "{}", ranks[1].1);
    let served = std::fs::read_to_string(dir.join("served.txt")).unwrap();
    let file = std::fs::read_to_string(dir.join("file.txt")).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    for family in [
        "strata_calls_total counter",
        "strata_bytes_total counter",
        "strata_seconds_total counter",
        "strata_bus_bytes_total counter",
        "strata_stall_seconds_total counter",
        "strata_stall_share gauge",
        "strata_straggler gauge",
        "strata_faults_total counter",
    ] {
        assert!(
            served.contains(&format!("# TYPE {family}\n")),
            "{family}:\n{served}"
        );
        assert!(
            file.contains(&format!("# TYPE {family}\n")),
            "{family}:\n{file}"
        );
    }
    let value = |text: &str, family: &str, collective: &str| -> f64 {
        text.lines()
            .find(|l| l.starts_with(family) && l.contains(&format!("collective=\"{collective}\"")))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or_else(|| panic!("no {family} for {collective}:\n{text}"))
    };
    assert_eq!(value(&served, "strata_calls_total{", "all_reduce"), 10.0);
    assert_eq!(value(&served, "strata_bytes_total{", "all_reduce"), 40960.0);
    // All-reduce at 3 ranks: 2(n-1)/n; all-gather of 4 KiB each: 12 KiB, (n-1)/n.
    assert_eq!(
        value(&served, "strata_bus_bytes_total{", "all_reduce"),
        54613.0
    );
    assert_eq!(value(&served, "strata_bytes_total{", "all_gather"), 12288.0);
    assert_eq!(
        value(&served, "strata_bus_bytes_total{", "all_gather"),
        8192.0
    );
    assert!(served.contains("rank=\"0\",nranks=\"3\""), "{served}");
    assert!(
        served.contains("strata_faults_total{") && served.contains("} 0\n"),
        "{served}"
    );
    assert_eq!(value(&file, "strata_calls_total{", "all_reduce"), 10.0);
}
