//! Communicator handles: what an `ncclComm_t` names.
//!
//! An `ncclComm_t` is never an address. It is a number from a counter that never repeats,
//! looked up in a registry on every call, so a destroyed communicator, a garbage value or
//! NULL gets `ncclInvalidArgument` instead of a use-after-free.

use crate::call::Call;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};
use strata::{Communicator, DataType, Error, Scalar};

/// Work for a non-blocking communicator's worker thread.
pub(crate) type Job = Box<dyn FnOnce() -> strata::Result<()> + Send>;

/// A reduction operator made by `ncclRedOpCreatePreMulSum`.
#[derive(Clone, Copy, Debug)]
pub(crate) enum UserOp {
    /// The scalar was read when the operator was made (`ncclScalarHostImmediate`).
    Immediate(Scalar),
    /// The scalar is read when each call runs (`ncclScalarDevice`), from this address.
    Deferred(usize, DataType),
}

/// Where a communicator is in its life.
enum Slot {
    /// Being built (non-blocking init or split, or init deferred to `ncclGroupEnd`).
    Pending,
    /// Built.
    Ready(Arc<Communicator>),
    /// Init failed with this error.
    Failed(Error),
}

/// A non-blocking communicator's queue of work.
#[derive(Default)]
struct WorkQueue {
    jobs: VecDeque<Job>,
    busy: bool,
    closing: bool,
    /// The first error of queued work.
    error: Option<Error>,
}

/// Everything an `ncclComm_t` stands for.
pub(crate) struct CommHandle {
    /// The `ncclComm_t` value.
    pub id: usize,
    /// Whether calls complete before they return (else they return `ncclInProgress`).
    pub blocking: bool,
    /// Rank and size, once known (at once for init; after a split or shrink completes).
    pub shape: OnceLock<(usize, usize)>,
    slot: Mutex<Slot>,
    slot_cv: Condvar,
    queue: Mutex<WorkQueue>,
    queue_cv: Condvar,
    worker: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// After `ncclCommFinalize`: no new operations.
    pub finalized: AtomicBool,
    /// Between `ncclCommSuspend` and `ncclCommResume`: no new operations.
    pub suspended: AtomicBool,
    /// Reduction operators made on this communicator, index = value − 5.
    pub ops: Mutex<Vec<Option<UserOp>>>,
    /// `ncclCommRegister` and `ncclCommWindowRegister` records: handle → (address, bytes).
    pub registrations: Mutex<HashMap<usize, (usize, usize)>>,
    /// Windows: handle → (address, bytes, flags).
    pub windows: Mutex<HashMap<usize, (usize, usize, i32)>>,
}

/// The registry of live handles.
fn registry() -> &'static Mutex<HashMap<usize, Arc<CommHandle>>> {
    static REGISTRY: OnceLock<Mutex<HashMap<usize, Arc<CommHandle>>>> = OnceLock::new();
    REGISTRY.get_or_init(Default::default)
}

/// Handle values: far from small integers and never reused.
static NEXT_ID: AtomicUsize = AtomicUsize::new(0x5354_0000_0000);

/// Handle values for registrations, windows and memory: never reused either.
pub(crate) fn next_token() -> usize {
    NEXT_ID.fetch_add(16, Ordering::Relaxed)
}

/// Locks a mutex whose data stays consistent even if a holder panicked.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl CommHandle {
    /// Registers a new, pending handle.
    pub fn create(blocking: bool, shape: Option<(usize, usize)>) -> Arc<Self> {
        let h = Arc::new(Self {
            id: next_token(),
            blocking,
            shape: OnceLock::new(),
            slot: Mutex::new(Slot::Pending),
            slot_cv: Condvar::new(),
            queue: Mutex::default(),
            queue_cv: Condvar::new(),
            worker: Mutex::new(None),
            finalized: AtomicBool::new(false),
            suspended: AtomicBool::new(false),
            ops: Mutex::default(),
            registrations: Mutex::default(),
            windows: Mutex::default(),
        });
        if let Some(s) = shape {
            let _ = h.shape.set(s);
        }
        lock(registry()).insert(h.id, h.clone());
        h
    }

    /// The live handle named by `comm`, or why there is none.
    pub fn lookup(comm: *const std::ffi::c_void) -> Result<Arc<Self>, String> {
        if comm.is_null() {
            return Err("the communicator is NULL".into());
        }
        lock(registry())
            .get(&(comm as usize))
            .cloned()
            .ok_or_else(|| {
                format!(
                    "{comm:p} is not a live communicator (it was destroyed or aborted, or never \
                 created)"
                )
            })
    }

    /// Removes the handle from the registry; later lookups fail.
    pub fn unregister(&self) {
        lock(registry()).remove(&self.id);
    }

    /// Records the outcome of init (or of the split or shrink that makes this communicator).
    pub fn set_ready(&self, result: strata::Result<Communicator>) {
        self.set_ready_bound(result, false)
    }

    /// [`CommHandle::set_ready`]; `bound` when whoever made the communicator already bound it
    /// to its GPU or found none to bind to ([`crate::group::DeferredInit::run`]).
    pub fn set_ready_bound(&self, result: strata::Result<Communicator>, bound: bool) {
        let mut slot = lock(&self.slot);
        *slot = match result {
            Ok(c) => {
                let _ = self.shape.set((c.rank(), c.size()));
                // As NCCL binds a communicator to the current device at init: the GPU path's
                // resources are made now, before any stream waits on them. Binding is
                // collective, so not where one thread makes several ranks of this process one
                // after the other (grouped splits): those bind at their first GPU call.
                let me = c.peers()[c.rank()].process;
                let one_here = c.peers().iter().filter(|p| p.process == me).count() == 1;
                if !bound
                    && one_here
                    && let Some(dev) = crate::group::DeferredInit::current_device()
                    && let Err(e) = c.bind_device(dev)
                {
                    tracing::warn!("GPU {dev}: {e}; device buffers will fail");
                }
                Slot::Ready(Arc::new(c))
            }
            Err(e) => Slot::Failed(e),
        };
        self.slot_cv.notify_all();
    }

    /// The communicator once built, waiting for a pending init for at most `limit`.
    pub fn wait_ready(&self, limit: Duration) -> strata::Result<Arc<Communicator>> {
        let deadline = Instant::now() + limit;
        let mut slot = lock(&self.slot);
        loop {
            match &*slot {
                Slot::Ready(c) => return Ok(c.clone()),
                Slot::Failed(e) => return Err(e.clone()),
                Slot::Pending => {
                    let now = Instant::now();
                    if now >= deadline {
                        return Err(Error::Timeout {
                            op: "waiting for the communicator's init".into(),
                            seq: 0,
                            waiting_on: Vec::new(),
                            after_s: limit.as_secs_f64(),
                            diagnosis: None,
                        });
                    }
                    slot = self
                        .slot_cv
                        .wait_timeout(slot, deadline - now)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                }
            }
        }
    }

    /// The communicator if built, without waiting.
    pub fn ready(&self) -> Option<Arc<Communicator>> {
        match &*lock(&self.slot) {
            Slot::Ready(c) => Some(c.clone()),
            _ => None,
        }
    }

    /// `None` while init or queued work is in progress, else the first error (of init, of
    /// queued work, or the fault that broke the communicator), if any.
    pub fn status(&self) -> Option<Option<Error>> {
        let comm = match &*lock(&self.slot) {
            Slot::Pending => return None,
            Slot::Failed(e) => return Some(Some(e.clone())),
            Slot::Ready(c) => c.clone(),
        };
        {
            let q = lock(&self.queue);
            if !q.jobs.is_empty() || q.busy {
                return None;
            }
            if let Some(e) = &q.error {
                return Some(Some(e.clone()));
            }
        }
        Some(comm.async_error())
    }

    /// Queues `job` on this communicator's worker thread (started on first use).
    pub fn submit(self: &Arc<Self>, job: Job) -> strata::Result<()> {
        let mut worker = lock(&self.worker);
        if worker.is_none() {
            let me = self.clone();
            *worker = Some(
                std::thread::Builder::new()
                    .name("strata-nccl-worker".into())
                    .spawn(move || me.work())
                    .map_err(|e| Error::Transport(format!("spawning a worker thread: {e}")))?,
            );
        }
        let mut q = lock(&self.queue);
        q.jobs.push_back(job);
        self.queue_cv.notify_all();
        Ok(())
    }

    fn work(&self) {
        let mut q = lock(&self.queue);
        loop {
            let Some(job) = q.jobs.pop_front() else {
                if q.closing {
                    return;
                }
                q = self.queue_cv.wait(q).unwrap_or_else(|p| p.into_inner());
                continue;
            };
            q.busy = true;
            drop(q);
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job))
                .unwrap_or_else(|_| {
                    Err(Error::Transport("internal: a queued call panicked".into()))
                });
            q = lock(&self.queue);
            q.busy = false;
            if let Err(e) = result {
                q.error.get_or_insert(e);
            }
            self.queue_cv.notify_all();
        }
    }

    /// Whether queued work remains.
    pub fn has_pending_work(&self) -> bool {
        let q = lock(&self.queue);
        !q.jobs.is_empty() || q.busy
    }

    /// Stops the worker: with `wait`, after it finishes its queue (waiting for it); without,
    /// queued work is dropped unrun and only the call in progress is waited for (it ends
    /// quickly after an abort), unless init is still running, which touches no user buffer.
    pub fn close(&self, wait: bool) {
        let init_running = matches!(*lock(&self.slot), Slot::Pending);
        {
            let mut q = lock(&self.queue);
            q.closing = true;
            if !wait {
                q.jobs.clear();
            }
        }
        self.queue_cv.notify_all();
        if let Some(w) = lock(&self.worker).take()
            && (wait || !init_running)
            && w.thread().id() != std::thread::current().id()
        {
            let _ = w.join();
        }
        // Calls still queued on streams run before the communicator goes (within its
        // deadline); after an abort they fail at once and release their streams.
        if let Slot::Ready(c) = &*lock(&self.slot)
            && wait
            && let Err(e) = c.wait_device_idle(c.timeout())
        {
            tracing::warn!("destroying with stream-ordered calls unfinished: {e}");
        }
    }

    /// Runs `calls` (all on this communicator) as one group: collectives in order, then every
    /// point-to-point transfer as one batch.
    pub fn execute(&self, calls: Vec<Call>, init_limit: Duration) -> strata::Result<()> {
        let comm = self.wait_ready(init_limit)?;
        let ops = lock(&self.ops).clone();
        if calls.iter().any(|c| c.stream().is_some()) {
            return crate::call::enqueue_device(&comm, ops, calls);
        }
        crate::call::run_group(&comm, &ops, calls)
    }
}
