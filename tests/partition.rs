//! A network partition is told apart from a hung process: two emulated hosts (network
//! namespaces on one bridge), the bridge port of one taken down while both ranks run
//! all-reduces. Both processes stay alive; each side must say the network between them went
//! silent, not that the other process stopped or hung (which a SIGSTOPped peer is, and
//! `tests/collbench.rs` checks that wording). Needs root; prints SKIPPED otherwise.

mod common;

use common::netns::{Hosts, ip};
use common::{assert_all_ok, is_worker, spawn, worker};
use std::time::{Duration, Instant};
use strata::{CallSpec, Collective, DataType};

const HOSTS: usize = 2;

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
    let hosts = match Hosts::build("st-q", "198.18.8.", HOSTS, |_| Vec::new()) {
        Ok(h) => h,
        Err(why) => {
            common::skip(name, &why);
            return;
        }
    };
    // Cut host 1 off the bridge once the ranks are running: frames to and from it are
    // dropped without a word, as a failed switch port or cable drops them.
    let switch = hosts.switch();
    let cut = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(3));
        assert!(ip(&["-n", &switch, "link", "set", "st-qp1", "down"]));
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
