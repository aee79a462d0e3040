"""Work handles and the per-group worker that runs collectives in issue order."""

import queue
import threading
from datetime import timedelta

import torch
import torch.distributed as dist


def backend_error(message):
    """The exception PyTorch raises for backend failures (a RuntimeError subclass). A call
    that overran its deadline says "Timed out" first, the words PyTorch (and its tests) look
    for, then strata's account of whom it waited on."""
    if " timed out after " in message and "Timed out" not in message:
        message = f"strata: Timed out waiting for the group: {message}"
    return dist.DistBackendError(message)


class StrataWork(dist.Work):
    """A collective in flight (or done): ``wait()`` and ``get_future()`` as PyTorch documents.

    The future's value is the list of output tensors (what DDP's comm hooks expect); a failed
    collective sets the future's exception, and ``wait()`` raises it.
    """

    def __init__(self, outputs, op_name, timeout):
        super().__init__()
        self._outputs = outputs
        self._op_name = op_name
        self._timeout = timeout
        self._error = None
        # A call that completes on the caller's thread needs neither an event nor a future
        # until someone asks (the cheapest path for small messages); a queued call gets both.
        self._future = None
        self._done = None
        self._completed = False

    def _queued(self):
        if self._done is None:
            self._future = torch.futures.Future()
            self._done = threading.Event()

    def _finish(self, error=None):
        self._error = error
        self._completed = True
        if self._future is not None:
            if error is None:
                self._future.set_result(self._outputs)
            else:
                self._future.set_exception(error)
        if self._done is not None:
            self._done.set()

    def is_completed(self):
        return self._completed

    def is_success(self):
        return self._completed and self._error is None

    def exception(self):
        return self._error

    def result(self):
        self.wait()
        return self._outputs

    # Set by recv from any source: a list that gets the sender's rank when the call runs.
    _source_box = None

    def source_rank(self):
        """The rank a receive from any source took its message from (waits for it)."""
        if self._source_box is None:
            raise ValueError("strata: source_rank is only defined for recv from any source")
        self.wait()
        return self._source_box[0]

    _source_rank = source_rank

    def synchronize(self):
        self.wait()

    def wait(self, timeout=timedelta(0)):
        """Blocks until done; raises the collective's error, or a timeout after ``timeout``.

        A zero timeout (PyTorch's default) means the group's timeout.
        """
        limit = timeout if timeout and timeout > timedelta(0) else self._timeout
        if self._done is not None and not self._done.wait(limit.total_seconds()):
            raise backend_error(
                f"strata: {self._op_name} did not complete within {limit.total_seconds():g} s "
                "(Work.wait timeout); the communicator's own deadline reports which rank it "
                "waits on"
            )
        if self._error is not None:
            raise self._error
        return True

    def get_future(self):
        if self._future is None:  # completed inline: a future that is already done
            self._future = torch.futures.Future()
            if self._error is None:
                self._future.set_result(self._outputs)
            else:
                self._future.set_exception(self._error)
        return self._future


class Worker:
    """One thread per process group that runs queued collectives in issue order.

    A call that need not be asynchronous runs on the caller's thread when nothing is queued
    (the cheapest path for small messages); otherwise it is queued behind the earlier calls,
    so every rank issues its collectives in the same order either way.
    """

    def __init__(self, name):
        self._queue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._pending = 0
        self._name = name
        # Started at the first call that is queued: a group that only ever runs calls inline
        # (most sub-groups) never pays for a thread, and making one does not wait for it.
        self._thread = None

    def _loop(self):
        while True:
            item = self._queue.get()
            if item is None:
                return
            run, work = item
            work._finish(_run_caught(run))
            with self._lock:
                self._pending -= 1

    def submit(self, run, work, async_op):
        """Runs ``run()`` for ``work``: inline when allowed and idle, else on the worker."""
        with self._lock:
            if not async_op and self._pending == 0:
                work._finish(_run_caught(run))
                return work
            self._pending += 1
            work._queued()
            self._queue.put((run, work))
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
                self._thread.start()
        return work

    def stop(self):
        """Ends the thread once the queued calls have run."""
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is None:
            return
        self._queue.put(None)
        if thread is not threading.current_thread():
            thread.join()


def _run_caught(run):
    try:
        run()
        return None
    except Exception as e:  # every failure reaches the Work; none is lost on a thread
        return e if isinstance(e, dist.DistBackendError) else backend_error(str(e))
