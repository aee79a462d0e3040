//! Ranks as threads of one process (the in-process transport), plus the abort and
//! stranger-on-the-port cases.

use std::sync::Arc;
use std::time::{Duration, Instant};
use strata::{Communicator, Config, Error, ReduceOp, UniqueId};

fn cfg() -> Config {
    let mut c = Config::from_env().unwrap();
    c.listen_ip = "127.0.0.1".parse().unwrap();
    c.init_timeout = Duration::from_secs(20);
    c.timeout = Duration::from_secs(30);
    c
}

fn id() -> UniqueId {
    // SAFETY of the test: loopback only.
    let c = cfg();
    let _ = c;
    temp_env_loopback();
    UniqueId::new().unwrap()
}

fn temp_env_loopback() {
    // Tests run on loopback only.
    // SAFETY: set before any thread of this test reads the environment; tests in this file
    // all set the same value.
    unsafe { std::env::set_var("STRATA_SOCKET_IFNAME", "=lo") };
}

/// Runs `f(comm)` on `n` ranks as threads and returns their results in rank order.
fn on_threads<R: Send + 'static>(
    n: usize,
    f: impl Fn(Communicator) -> R + Send + Sync + 'static,
) -> Vec<R> {
    let id = id();
    let f = Arc::new(f);
    let handles: Vec<_> = (0..n)
        .map(|r| {
            let f = f.clone();
            std::thread::spawn(move || f(Communicator::init_with_config(&id, n, r, cfg()).unwrap()))
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn all_reduce_on_threads() {
    for n in [1, 2, 3, 5] {
        let out = on_threads(n, move |comm| {
            let r = comm.rank() as f32;
            let send: Vec<f32> = (0..1000).map(|i| i as f32 + r).collect();
            let mut recv = vec![0f32; 1000];
            comm.all_reduce(&send, &mut recv, ReduceOp::Sum).unwrap();
            recv
        });
        let tri = (n * (n - 1) / 2) as f32;
        for recv in out {
            for (i, x) in recv.iter().enumerate() {
                assert_eq!(*x, i as f32 * n as f32 + tri);
            }
        }
    }
}

#[test]
fn split_makes_working_subcommunicators() {
    let out = on_threads(5, |comm| {
        let color = if comm.rank() == 4 {
            None
        } else {
            Some((comm.rank() % 2) as u32)
        };
        let sub = comm.split(color, -(comm.rank() as i32)).unwrap();
        sub.map(|s| {
            let mut v = [comm.rank() as u64];
            s.all_reduce_in_place(&mut v, ReduceOp::Sum).unwrap();
            (s.rank(), s.size(), v[0])
        })
    });
    // Evens 0,2 and odds 1,3; key = -rank orders them in reverse.
    assert_eq!(out[0], Some((1, 2, 2)));
    assert_eq!(out[2], Some((0, 2, 2)));
    assert_eq!(out[1], Some((1, 2, 4)));
    assert_eq!(out[3], Some((0, 2, 4)));
    assert_eq!(out[4], None);
}

#[test]
fn abort_unblocks_a_call_waiting_on_a_peer_within_one_second() {
    let id = id();
    let h1 = std::thread::spawn(move || Communicator::init_with_config(&id, 2, 1, cfg()).unwrap());
    let comm = Arc::new(Communicator::init_with_config(&id, 2, 0, cfg()).unwrap());
    let peer = h1.join().unwrap();
    // Rank 1 never calls all_reduce: rank 0 waits on it until aborted.
    let c2 = comm.clone();
    let waiter = std::thread::spawn(move || {
        let mut v = vec![1f32; 1 << 20];
        let r = c2.all_reduce_in_place(&mut v, ReduceOp::Sum);
        (r, Instant::now())
    });
    std::thread::sleep(Duration::from_millis(300));
    let aborted_at = Instant::now();
    comm.abort();
    let (r, returned_at) = waiter.join().unwrap();
    assert!(matches!(r, Err(Error::Aborted(_))), "{r:?}");
    assert!(
        returned_at - aborted_at < Duration::from_secs(1),
        "took {:?}",
        returned_at - aborted_at
    );
    assert!(comm.async_error().is_some());
    drop(peer);
}

#[test]
fn a_stranger_on_the_ports_is_ignored() {
    use std::io::Write;
    let id = id();
    let root = id.root_addr();
    // Garbage, an oversized length and a silent connection hit the root before the ranks arrive.
    let mut junk = Vec::new();
    for payload in [
        &b"GET / HTTP/1.0\r\n\r\n"[..],
        &[0xff; 64][..],
        &b"STRATAHS"[..],
    ] {
        let mut s = std::net::TcpStream::connect(root).unwrap();
        let _ = s.write_all(payload);
        junk.push(s);
    }
    let out = on_threads_with(id, 3, |comm| {
        let mut v = [comm.rank() as i32 + 1];
        comm.all_reduce_in_place(&mut v, ReduceOp::Max).unwrap();
        v[0]
    });
    assert_eq!(out, vec![3, 3, 3]);
}

fn on_threads_with<R: Send + 'static>(
    id: UniqueId,
    n: usize,
    f: impl Fn(Communicator) -> R + Send + Sync + 'static,
) -> Vec<R> {
    let f = Arc::new(f);
    let handles: Vec<_> = (0..n)
        .map(|r| {
            let f = f.clone();
            std::thread::spawn(move || f(Communicator::init_with_config(&id, n, r, cfg()).unwrap()))
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}
