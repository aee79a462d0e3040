//! What the test binaries that run ranks as threads of one process share: configuration,
//! start-up, running a closure on every rank at once, and checked all-reduces.

#![allow(dead_code)] // each test binary uses part of this

use std::time::Duration;
use strata::check;
use strata::{
    CallSpec, Collective, Communicator, Config, DataType, ReduceOp, TransportPolicy, UniqueId,
};

pub fn cfg(transport: TransportPolicy) -> Config {
    let mut c = Config::from_env().unwrap();
    c.listen_ip = "127.0.0.1".parse().unwrap();
    c.init_timeout = Duration::from_secs(20);
    c.timeout = Duration::from_secs(60);
    c.transport = transport;
    c
}

/// A unique id whose root listens on loopback.
pub fn loopback_id() -> UniqueId {
    // SAFETY: every test in this binary sets the same value before reading it.
    unsafe { std::env::set_var("STRATA_SOCKET_IFNAME", "=lo") };
    UniqueId::new().unwrap()
}

/// Initialises `n` ranks as threads and returns their communicators in rank order.
pub fn init_threads(n: usize, transport: TransportPolicy) -> Vec<Communicator> {
    init_threads_with(loopback_id(), n, transport)
}

pub fn init_threads_with(id: UniqueId, n: usize, transport: TransportPolicy) -> Vec<Communicator> {
    init_threads_configured(id, n, |_| cfg(transport))
}

/// Initialises `n` ranks as threads, rank r with `config(r)`, in rank order.
pub fn init_threads_configured(
    id: UniqueId,
    n: usize,
    config: impl Fn(usize) -> Config,
) -> Vec<Communicator> {
    let handles: Vec<_> = (0..n)
        .map(|r| {
            let c = config(r);
            std::thread::spawn(move || Communicator::init_with_config(&id, n, r, c).unwrap())
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

/// Runs `f` on every communicator at once, one thread each.
pub fn on_all<R: Send>(comms: &[Communicator], f: impl Fn(&Communicator) -> R + Sync) -> Vec<R> {
    std::thread::scope(|s| {
        let hs: Vec<_> = comms.iter().map(|c| s.spawn(|| f(c))).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

pub fn checked_call(c: &Communicator, spec: CallSpec, in_place: bool) -> Result<(), String> {
    match check::run_and_check(c, spec, in_place)
        .map_err(|e| e.to_string())?
        .first
    {
        None => Ok(()),
        Some((i, got, want)) => Err(format!(
            "rank {}: element {i} is {got}, expected {want}",
            c.rank()
        )),
    }
}

/// Checks an all-reduce of `count` elements on `c` out of place, then in place; `what` leads
/// the error.
pub fn all_reduce_both_ways(
    c: &Communicator,
    dtype: DataType,
    count: usize,
    op: ReduceOp,
    what: &str,
) -> Result<(), String> {
    for in_place in [false, true] {
        let spec = CallSpec {
            collective: Collective::AllReduce,
            dtype,
            count,
            op,
            root: 0,
        };
        checked_call(c, spec, in_place)
            .map_err(|e| format!("{what}: {spec:?}, in place {in_place}: {e}"))?;
    }
    Ok(())
}
