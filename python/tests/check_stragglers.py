"""A persistently slow rank is named through the PyTorch backend, and a clean run names no one.
Four ranks of one group, each in a thread of this process, all-reduce 1 MiB 120 times; in the
slow run rank 2 sleeps 15 ms before each call (a rank whose compute is slow starts each
collective late). ``ProcessGroupStrata.stragglers()`` gives each rank's view.

    python python/tests/check_stragglers.py     (PYTHONPATH=python, STRATA_LIB=the built library)

Prints ``stragglers: N passed, 0 failed`` and exits 0 when every check holds.
"""

import sys
import threading
import time
from datetime import timedelta

import torch

from check_threads import make_groups, run_checks

SLOW = 2
CALLS = 120


def run(slow):
    """Every rank's straggler view after CALLS all-reduces, rank SLOW late by 15 ms if `slow`."""
    groups, _ = make_groups(4, timedelta(seconds=60))
    views, errors = [None] * 4, []

    def one(rank):
        try:
            t = torch.ones(1 << 18)
            for _ in range(CALLS):
                if slow and rank == SLOW:
                    time.sleep(0.015)
                t.fill_(1.0)
                groups[rank].allreduce([t]).wait()
                assert torch.all(t == 4.0), f"rank {rank}: {t[:4]}"
            views[rank] = groups[rank].stragglers()
        except Exception as e:  # reported below
            errors.append(f"rank {rank}: {e}")

    threads = [threading.Thread(target=one, args=(r,)) for r in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for g in groups:
        g.shutdown()
    if errors or any(t.is_alive() for t in threads):
        raise AssertionError(f"the run did not finish: {errors}")
    return views


def check_a_late_rank_is_named():
    views = run(slow=True)
    named = {s["rank"] for view in views for s in view}
    for rank, view in enumerate(views):
        for s in view:
            print(
                f"  rank {rank} names rank {s['rank']}: stalled on in {100 * s['late_share']:.0f}%"
                f" of {s['calls']} calls, a median {s['median_late_ms']:.1f} ms; it stalls"
                f" {100 * s['own_stall_share']:.0f}% itself"
            )
    assert named == {SLOW}, f"named {named}, want only rank {SLOW}"


def check_a_clean_run_names_no_one():
    views = run(slow=False)
    assert all(not v for v in views), f"a clean run named {views}"


def main():
    return run_checks("stragglers", (check_a_late_rank_is_named, check_a_clean_run_names_no_one))


if __name__ == "__main__":
    sys.exit(main())
