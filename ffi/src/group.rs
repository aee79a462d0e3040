//! `ncclGroupStart`/`ncclGroupEnd`: calls made between them are queued per thread and run
//! together at the outermost `ncclGroupEnd`.
//!
//! At the end of a group, communicators initialised inside it are built first (concurrently,
//! so one thread can initialise several ranks), then each communicator's calls run as one
//! group ([`crate::call::run_group`]): collectives in order, then every send and receive as
//! one batch. Calls on different blocking communicators run on their own threads at the same
//! time; a non-blocking communicator gets its share queued on its worker, and the group
//! returns `ncclInProgress`. A group in which a call failed runs nothing and returns that
//! call's error.

use crate::call::{self, Call};
use crate::handle::CommHandle;
use crate::{NcclResult, init_limit, report};
use std::cell::RefCell;
use std::sync::Arc;
use strata::{Communicator, Config, Error, UniqueId};

/// An init deferred to the end of the group.
pub(crate) struct DeferredInit {
    /// The handle the caller already holds.
    pub handle: Arc<CommHandle>,
    /// The unique id.
    pub id: UniqueId,
    /// Ranks.
    pub nranks: usize,
    /// This rank.
    pub rank: usize,
    /// Configuration.
    pub cfg: Config,
    /// The GPU the communicator drives: the caller's current device when it asked (or the
    /// device list's entry of `ncclCommInitAll`), as NCCL binds a communicator at init.
    pub device: Option<i32>,
}

impl DeferredInit {
    /// The calling thread's current GPU, if this process has loaded the driver.
    pub fn current_device() -> Option<i32> {
        crate::device::driver_loaded()
            .then(|| strata::gpu::current_device().ok().flatten())
            .flatten()
    }

    /// Builds the communicator (on whatever thread runs it) and records the outcome in its
    /// handle. With a device, that device is current meanwhile and the communicator binds to
    /// it: each rank's init runs on a thread of its own (the caller's, a group's, a worker),
    /// so ranks of one process bind together, as binding is collective.
    pub fn run(self) -> strata::Result<()> {
        let _on = self
            .device
            .and_then(|d| strata::gpu::DeviceGuard::enter(d).ok());
        let r = Communicator::init_with_config(&self.id, self.nranks, self.rank, self.cfg);
        if let (Ok(c), Some(dev)) = (&r, self.device)
            && let Err(e) = c.bind_device(dev)
        {
            tracing::warn!("GPU {dev}: {e}; device buffers will fail");
        }
        let out = r.as_ref().map(|_| ()).map_err(Clone::clone);
        // Binding was decided here: a device known, bound above; none, nothing to bind to.
        self.handle.set_ready_bound(r, true);
        out
    }
}

#[derive(Default)]
struct Group {
    depth: usize,
    calls: Vec<(Arc<CommHandle>, Call)>,
    inits: Vec<DeferredInit>,
    /// The first error reported by a call made inside the group.
    error: Option<(NcclResult, String)>,
}

thread_local! {
    static GROUP: RefCell<Group> = RefCell::default();
}

/// Whether this thread is inside a group.
pub(crate) fn active() -> bool {
    GROUP.with(|g| g.borrow().depth > 0)
}

/// `ncclGroupStart`.
pub(crate) fn start() -> NcclResult {
    GROUP.with(|g| g.borrow_mut().depth += 1);
    NcclResult::Success
}

/// Remembers an error of a call inside the group, which `ncclGroupEnd` reports again.
pub(crate) fn note_error(code: NcclResult, message: &str) {
    GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth > 0 && g.error.is_none() {
            g.error = Some((code, message.to_string()));
        }
    });
}

/// Queues an init for the end of the group.
pub(crate) fn defer_init(init: DeferredInit) {
    GROUP.with(|g| g.borrow_mut().inits.push(init));
}

/// Runs `call` now (outside a group) or queues it (inside one).
pub(crate) fn submit(handle: Arc<CommHandle>, call: Call) -> NcclResult {
    let queued = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth > 0 {
            g.calls.push((handle.clone(), call));
            None
        } else {
            Some(call)
        }
    });
    match queued {
        None => NcclResult::Success,
        Some(call) => run_for(&handle, vec![call]),
    }
}

/// Runs one communicator's share: on this thread for a blocking communicator, on its worker
/// (returning `ncclInProgress`) for a non-blocking one.
fn run_for(handle: &Arc<CommHandle>, calls: Vec<Call>) -> NcclResult {
    // Calls on GPU memory are enqueued on their streams now, on this thread, so that they are
    // ordered before the caller's later work on those streams; enqueueing does not block.
    if handle.blocking || calls.iter().any(|c| c.stream().is_some()) {
        return match handle.execute(calls, init_limit()) {
            Ok(()) => NcclResult::Success,
            Err(e) => report(&e),
        };
    }
    let h = handle.clone();
    match handle.submit(Box::new(move || h.execute(calls, init_limit()))) {
        Ok(()) => NcclResult::InProgress,
        Err(e) => report(&e),
    }
}

/// Leaves one level; at the outermost level hands back the queued work.
fn leave() -> Result<Option<Group>, NcclResult> {
    let left = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth == 0 {
            return None;
        }
        g.depth -= 1;
        Some((g.depth == 0).then(|| std::mem::take(&mut *g)))
    });
    left.ok_or_else(|| {
        crate::fail(
            NcclResult::InvalidUsage,
            "ncclGroupEnd without a matching ncclGroupStart",
        )
    })
}

/// Builds the communicators initialised inside the group, concurrently (non-blocking ones on
/// their workers): the first error, and whether any init was left to a worker.
pub(crate) fn run_inits(inits: Vec<DeferredInit>) -> (Option<Error>, bool) {
    let (blocking, queued): (Vec<_>, Vec<_>) = inits.into_iter().partition(|i| i.handle.blocking);
    let any_queued = !queued.is_empty();
    let mut first = None;
    for init in queued {
        let h = init.handle.clone();
        if let Err(e) = h.submit(Box::new(move || init.run())) {
            first.get_or_insert(e);
        }
    }
    let results: Vec<strata::Result<()>> = std::thread::scope(|s| {
        let hs: Vec<_> = blocking
            .into_iter()
            .map(|init| s.spawn(move || init.run()))
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(Error::Transport("internal: init panicked".into())))
            })
            .collect()
    });
    for r in results {
        if let Err(e) = r {
            first.get_or_insert(e);
        }
    }
    (first, any_queued)
}

/// The queued calls, in order, per communicator.
fn by_comm(calls: Vec<(Arc<CommHandle>, Call)>) -> Vec<(Arc<CommHandle>, Vec<Call>)> {
    let mut out: Vec<(Arc<CommHandle>, Vec<Call>)> = Vec::new();
    for (h, c) in calls {
        match out.iter_mut().find(|(o, _)| o.id == h.id) {
            Some((_, v)) => v.push(c),
            None => out.push((h, vec![c])),
        }
    }
    out
}

/// `ncclGroupEnd`.
pub(crate) fn end() -> NcclResult {
    let g = match leave() {
        Err(code) => return code,
        Ok(None) => return NcclResult::Success,
        Ok(Some(g)) => g,
    };
    // As in NCCL, a group with a failed call runs nothing: its other calls would wait on
    // peers for the one that never started.
    if let Some((code, text)) = g.error {
        for init in g.inits {
            init.handle.set_ready(Err(Error::InvalidArgument(format!(
                "not initialised: its group failed ({text})"
            ))));
        }
        crate::set_last_error(&text);
        return code;
    }
    let (init_error, mut any_queued) = run_inits(g.inits);
    let shares = by_comm(g.calls);
    let results: Vec<NcclResult> = std::thread::scope(|s| {
        let mut results = Vec::new();
        let mut running = Vec::new();
        let concurrent = shares.iter().filter(|(h, _)| h.blocking).count() > 1;
        for (h, calls) in shares {
            if !h.blocking {
                any_queued = true;
                results.push(run_for(&h, calls));
            } else if concurrent {
                running.push(s.spawn(move || {
                    let r = run_for(&h, calls);
                    (r, crate::last_error_text())
                }));
            } else {
                results.push(run_for(&h, calls));
            }
        }
        for t in running {
            match t.join() {
                Ok((r, text)) => {
                    if r != NcclResult::Success {
                        crate::set_last_error(&text);
                    }
                    results.push(r)
                }
                Err(_) => results.push(NcclResult::InternalError),
            }
        }
        results
    });
    if let Some(e) = init_error {
        return report(&e);
    }
    if let Some(&bad) = results
        .iter()
        .find(|r| !matches!(r, NcclResult::Success | NcclResult::InProgress))
    {
        return bad;
    }
    if any_queued {
        NcclResult::InProgress
    } else {
        NcclResult::Success
    }
}

/// `ncclGroupSimulateEnd`: leaves the group like `ncclGroupEnd`, but instead of running the
/// queued calls it prices them with the cost model (microseconds, summed over the calls).
/// Inits queued in the group do run.
pub(crate) fn simulate_end() -> Result<f64, NcclResult> {
    let g = match leave()? {
        None => return Ok(0.0),
        Some(g) => g,
    };
    if let (Some(e), _) = run_inits(g.inits) {
        return Err(report(&e));
    }
    let mut us = 0.0;
    for (h, calls) in by_comm(g.calls) {
        match h.wait_ready(init_limit()) {
            Ok(comm) => us += call::estimate_us(&comm, &calls),
            Err(e) => return Err(report(&e)),
        }
    }
    Ok(us)
}
