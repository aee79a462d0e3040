"""Ranks of one strata group made from threads of one process (as torchft's integration
tests run every replica in a thread): init must not serialise them, and each group keeps the
timeout it was given.

    python python/tests/check_threads.py     (PYTHONPATH=python, STRATA_LIB=the built library)

Prints ``threads: N passed, 0 failed`` and exits 0 when every check holds.
"""

import sys
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import strata_torch  # noqa: F401  (registers the backend)
from strata_torch.process_group import ProcessGroupStrata


def make_groups(size, timeout):
    """`size` ranks of one group, each made in its own thread; (groups, seconds taken)."""
    store = dist.HashStore()
    groups, errors = [None] * size, []

    def one(rank):
        try:
            groups[rank] = ProcessGroupStrata(store, rank, size, timeout=timeout)
        except Exception as e:  # reported below
            errors.append(f"rank {rank}: {e}")

    start = time.monotonic()
    threads = [threading.Thread(target=one, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    took = time.monotonic() - start
    if errors or any(t.is_alive() for t in threads):
        raise AssertionError(f"init did not finish in 60 s: {errors}")
    return groups, took


def all_reduce_in_threads(groups):
    """An all-reduce on every rank, each from its own thread; the results."""
    out = [None] * len(groups)

    def one(rank):
        t = torch.full((1000,), float(rank + 1))
        groups[rank].allreduce([t]).wait()
        out[rank] = t

    threads = [threading.Thread(target=one, args=(r,)) for r in range(len(groups))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return out


def fails_within(call, seconds, start=None):
    """Runs `call`, which must raise within `seconds` (counted from `start`, else now):
    (seconds taken, the exception)."""
    start = time.monotonic() if start is None else start
    try:
        call()
    except Exception as e:
        took = time.monotonic() - start
        assert took < seconds, f"failed only after {took:.1f} s: {e}"
        return took, e
    raise AssertionError("a call that cannot complete completed")


def check_init_in_threads():
    for size in (2, 4):
        groups, took = make_groups(size, timedelta(seconds=30))
        want = float(size * (size + 1) // 2)
        for r, t in enumerate(all_reduce_in_threads(groups)):
            assert t is not None and torch.all(t == want), f"size {size} rank {r}: {t}"
        for g in groups:
            g.shutdown() if hasattr(g, "shutdown") else g.abort()
        print(f"  {size} ranks made in threads of one process in {took:.2f} s")


def check_each_group_keeps_its_timeout():
    # Two ranks with a 1 s timeout; only rank 0 calls. The wait allows 20 s, so the error
    # must come from the communicator's own 1 s deadline, naming the rank that never came.
    groups, _ = make_groups(2, timedelta(seconds=1))
    t = torch.ones(10)
    took, e = fails_within(lambda: groups[0].allreduce([t]).wait(timedelta(seconds=20)), 10)
    assert "Work.wait" not in str(e) and "rank 1" in str(e), f"not the 1 s deadline: {e}"
    print(f"  the 1 s group's lone call failed after {took:.1f} s: {str(e)[:100]}")
    for g in groups:
        g.abort()


def run_checks(label, checks):
    """Runs each check, prints ok or FAIL per check and ``<label>: N passed, M failed``;
    the exit status."""
    passed = failed = 0
    for check in checks:
        try:
            check()
            passed += 1
            print(f"ok   {check.__name__}")
        except Exception as e:
            failed += 1
            print(f"FAIL {check.__name__}: {e}")
    print(f"{label}: {passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


def main():
    return run_checks("threads", (check_init_in_threads, check_each_group_keeps_its_timeout))


if __name__ == "__main__":
    sys.exit(main())
