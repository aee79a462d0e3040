"""One rank of a check (run by torchrun, 4 processes) of ``dist.monitored_barrier`` on strata.

1. Every rank arrives: both forms pass, and 6 more calls leave none of their keys in the store
   but the last release.
2. Ranks 2 and 3 stay away (busy for 1.5 s) while ranks 0 and 1 call it with a 0.5 s
   timeout: with ``wait_all_ranks`` rank 0 names ranks 2 and 3, and rank 1 says it arrived
   but was not released by rank 0 (gloo's words, which PyTorch's tests match).
3. The same without ``wait_all_ranks``: rank 0 names the first rank that did not arrive.
4. The communicator was never touched: an all_reduce of all 4 ranks gives the right sum.

Each rank prints ``monitored_barrier: rank R ok`` when everything it saw was right.
"""

import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import strata_torch  # noqa: F401  (registers the backend)

RANK, WORLD = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
AWAY = (2, 3)


def expect_error(words, **kwargs):
    try:
        dist.monitored_barrier(timeout=timedelta(seconds=0.5), **kwargs)
    except RuntimeError as e:
        assert words in str(e), f"rank {RANK}: {e!r} lacks {words!r}"
        return str(e)
    raise AssertionError(f"rank {RANK}: monitored_barrier passed with ranks {AWAY} away")


def main():
    dist.init_process_group("strata")
    assert WORLD == 4, "run with 4 processes"
    dist.monitored_barrier(timeout=timedelta(seconds=30))
    dist.monitored_barrier(timeout=timedelta(seconds=30), wait_all_ranks=True)
    # A job may call it every step: the store it runs over must not keep a call's keys. (The
    # store's key count is no measure: torchrun's agent writes its own keys meanwhile.)
    for i in range(6):
        dist.monitored_barrier(timeout=timedelta(seconds=30), wait_all_ranks=i % 2 == 0)
    dist.barrier()
    store = dist.group.WORLD._store  # the group's own (prefixed) store
    prefix = "strata/monitored_barrier"
    left = [
        key
        for n in range(1, 8)
        for key in [f"{prefix}/{n}/release"] + [f"{prefix}/{n}/arrived/{r}" for r in range(1, WORLD)]
        if store.check([key])
    ]
    assert not left, f"rank {RANK}: keys of finished barriers remain: {left}"
    assert store.check([f"{prefix}/8/release"]), "the last barrier's release key is missing"
    for wait_all in (True, False):
        if RANK in AWAY:
            time.sleep(1.5)
        elif RANK == 0:
            want = "Ranks 2, 3 failed to pass monitoredBarrier" if wait_all else "Rank 2 failed to pass monitoredBarrier"
            print(f"rank 0 (wait_all_ranks={wait_all}): {expect_error(want, wait_all_ranks=wait_all)}", flush=True)
        else:
            expect_error("Rank 1 successfully reached monitoredBarrier, but received errors", wait_all_ranks=wait_all)
        t = torch.full((8,), float(RANK + 1))
        dist.all_reduce(t)
        assert torch.all(t == WORLD * (WORLD + 1) / 2), t
    print(f"monitored_barrier: rank {RANK} ok", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
