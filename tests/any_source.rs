//! Receive from any source (MPI's `MPI_ANY_SOURCE`, gloo's `recvAnysource`), ranks as threads:
//! every message arrives once with its sender named, order per sender is kept, the first
//! sender wins, a collective already under way is not taken for a send, a wrong count is a
//! mismatch, and a receive no one answers times out.

use std::time::{Duration, Instant};
use strata::{Error, TransportPolicy};

mod in_process;
use in_process::*;

#[path = "common/any_source.rs"]
mod exchange;

fn every_message_once_with_its_sender(transport: TransportPolicy) {
    let comms = init_threads(4, transport);
    // 3 MiB: several ring slots and several TCP reads.
    on_all(&comms, |c| {
        exchange::every_message_once_with_its_sender(c, 3 << 20)
    });
}

#[test]
fn every_message_arrives_once_with_its_sender_in_process() {
    every_message_once_with_its_sender(TransportPolicy::Auto);
}

#[test]
fn every_message_arrives_once_with_its_sender_over_tcp() {
    every_message_once_with_its_sender(TransportPolicy::Tcp);
}

#[test]
fn the_first_sender_wins_and_a_collective_under_way_is_not_a_send() {
    for transport in [TransportPolicy::Auto, TransportPolicy::Tcp] {
        let comms = init_threads(4, transport);
        let first = on_all(&comms, |c| {
            let r = c.rank();
            let mut x = [r as f32 + 1.0; 64];
            let mut source = None;
            match r {
                // Rank 1 starts an all-reduce at once; rank 2 sends only 150 ms later.
                0 => {
                    let mut buf = [0u64; 2];
                    source = Some(c.recv_any(&mut buf).unwrap());
                    assert_eq!(buf, [2, 2]);
                }
                2 => {
                    std::thread::sleep(Duration::from_millis(150));
                    c.send(&[2u64, 2], 0).unwrap();
                }
                _ => {}
            }
            c.all_reduce_in_place(&mut x, strata::ReduceOp::Sum)
                .unwrap();
            assert!(x.iter().all(|&v| v == 10.0), "rank {r}: {x:?}");
            source
        });
        assert_eq!(first[0], Some(2), "{transport:?}");
    }
}

#[test]
fn a_wrong_count_is_a_mismatch_and_no_sender_is_a_timeout() {
    let id = loopback_id();
    let comms = init_threads_configured(id, 3, |_| {
        let mut c = cfg(TransportPolicy::Auto);
        c.timeout = Duration::from_millis(600);
        c
    });
    let out = on_all(&comms, |c| match c.rank() {
        0 => {
            let mut three = [0u32; 3];
            c.recv_any(&mut three)
                .map(|_| ())
                .map_err(|e| e.to_string())
        }
        1 => c.send(&[7u32; 4], 0).map_err(|e| e.to_string()),
        _ => Ok(()),
    });
    assert!(
        out[0]
            .as_ref()
            .is_err_and(|e| e.contains("3") && e.contains("4")),
        "{out:?}"
    );
    let lone = init_threads_configured(loopback_id(), 2, |_| {
        let mut c = cfg(TransportPolicy::Auto);
        c.timeout = Duration::from_millis(500);
        c
    });
    let t = Instant::now();
    let e = lone[0].recv_any(&mut [0u8; 4]).unwrap_err();
    assert!(matches!(e, Error::Timeout { .. }), "{e}");
    assert!(e.to_string().contains("any source"), "{e}");
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    let single = init_threads(1, TransportPolicy::Auto);
    let e = single[0].recv_any(&mut [0u8; 4]).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
}
