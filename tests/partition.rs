//! A network partition is told apart from a hung process: two emulated hosts (network
//! namespaces on one bridge), the bridge port of one taken down while both ranks run
//! all-reduces. Both processes stay alive; each side must say the network between them went
//! silent, not that the other process stopped or hung (which a SIGSTOPped peer is, and
//! `tests/collbench.rs` checks that wording). Needs root; prints SKIPPED otherwise.

mod common;

use common::{assert_all_ok, is_worker, spawn, worker};
use std::process::Command;
use std::time::{Duration, Instant};
use strata::{CallSpec, Collective, DataType};

const HOSTS: usize = 2;

fn ip(args: &[&str]) -> bool {
    Command::new("ip")
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Hosts `st-q0`, `st-q1` (198.18.8.1-2/24) on a bridge in `st-qsw`; removed on drop.
struct Hosts;

impl Hosts {
    fn build() -> Result<Self, String> {
        // SAFETY: a plain query.
        if unsafe { libc::geteuid() } != 0 {
            return Err("needs root for network namespaces".into());
        }
        if !ip(&["-V"]) {
            return Err("needs ip (iproute2)".into());
        }
        Self::teardown();
        let ok = ip(&["netns", "add", "st-qsw"])
            && ip(&["-n", "st-qsw", "link", "add", "br0", "type", "bridge"])
            && ip(&["-n", "st-qsw", "link", "set", "br0", "up"])
            && (0..HOSTS).all(|h| {
                let (ns, a, b) = (format!("st-q{h}"), format!("st-qe{h}"), format!("st-qp{h}"));
                let addr = format!("198.18.8.{}/24", h + 1);
                ip(&["netns", "add", &ns])
                    && ip(&["link", "add", &a, "type", "veth", "peer", "name", &b])
                    && ip(&["link", "set", &a, "netns", &ns])
                    && ip(&["link", "set", &b, "netns", "st-qsw"])
                    && ip(&["-n", &ns, "link", "set", &a, "name", "eth0"])
                    && ip(&["-n", &ns, "addr", "add", &addr, "dev", "eth0"])
                    && ip(&["-n", &ns, "link", "set", "eth0", "up"])
                    && ip(&["-n", &ns, "link", "set", "lo", "up"])
                    && ip(&["-n", "st-qsw", "link", "set", &b, "master", "br0", "up"])
            });
        if !ok {
            Self::teardown();
            return Err("building the namespaces failed".into());
        }
        Ok(Hosts)
    }

    fn teardown() {
        for h in 0..HOSTS {
            ip(&["netns", "del", &format!("st-q{h}")]);
        }
        ip(&["netns", "del", "st-qsw"]);
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        Self::teardown();
    }
}

#[test]
fn a_partition_is_reported_as_a_silent_network_not_a_hung_process() {
    if let Some(w) = worker() {
        let spec = CallSpec::new(Collective::AllReduce, DataType::Float32, 256);
        let mut buf = vec![0u8; 1024];
        let t = Instant::now();
        let e = loop {
            if let Err(e) = w.comm.call_bytes(spec, None, &mut buf) {
                break e;
            }
            assert!(t.elapsed() < Duration::from_secs(60), "no error in 60 s");
            std::thread::sleep(Duration::from_millis(10));
        };
        println!("FAILED_WITH {e}");
        return;
    }
    if is_worker() {
        return;
    }
    let name = "a_partition_is_reported_as_a_silent_network_not_a_hung_process";
    let _hosts = match Hosts::build() {
        Ok(h) => h,
        Err(why) => {
            println!("SKIPPED {name}: {why}");
            return;
        }
    };
    // Cut host 1 off the bridge once the ranks are running: frames to and from it are
    // dropped without a word, as a failed switch port or cable drops them.
    let cut = std::thread::spawn(|| {
        std::thread::sleep(Duration::from_secs(3));
        assert!(ip(&["-n", "st-qsw", "link", "set", "st-qp1", "down"]));
        Instant::now()
    });
    let env = [
        ("STRATA_TEST_NETNS", "st-q"),
        ("STRATA_TEST_SUBNET", "198.18.8."),
        ("STRATA_TRANSPORT", "tcp"),
    ];
    let ranks = spawn(name, HOSTS, HOSTS, &env, Duration::from_secs(90));
    let cut_at = cut.join().unwrap();
    assert_all_ok(&ranks);
    for (r, (_, out)) in ranks.iter().enumerate() {
        let line = out
            .lines()
            .find(|l| l.contains("FAILED_WITH"))
            .unwrap_or_else(|| panic!("rank {r}: {out}"));
        println!("rank {r} ({:?} after the cut): {line}", cut_at.elapsed());
        assert!(
            line.contains("the network between them went silent"),
            "rank {r}: {line}"
        );
        assert!(!line.contains("stopped or hung"), "rank {r}: {line}");
        assert!(
            line.contains(&format!("rank {}", 1 - r)),
            "rank {r}: {line}"
        );
    }
}
