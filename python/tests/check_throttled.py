"""One rank of a check (run by torchrun, 4 processes) that a rank slowed to half speed is named
through the strata backend: all ranks all-reduce 1 MiB for about 8 s; from 1 s to 7 s a thread
of rank 0 stops rank 2's process for 100 ms of every 200 ms (SIGSTOP/SIGCONT). Each rank asks
its group for stragglers after every call; rank 0 gathers when each first named whom.

Rank 0 prints ``throttled: rank 2 named by ranks [...] X s after the throttle began`` and every
rank exits 0 when rank 2, and no other rank, was named at any time, within 10 s.
"""

import os
import signal
import sys
import threading
import time

import torch
import torch.distributed as dist

import strata_torch  # noqa: F401  (registers the backend)

RANK, WORLD = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
SLOW = 2
RUN_S, THROTTLE_FROM, THROTTLE_TO = 8.0, 1.0, 7.0


def throttle(pid, start, began):
    """Stops `pid` 100 ms of every 200 ms between THROTTLE_FROM and THROTTLE_TO."""
    while time.monotonic() - start < THROTTLE_FROM:
        time.sleep(0.01)
    began.append(time.time())
    try:
        while time.monotonic() - start < THROTTLE_TO:
            os.kill(pid, signal.SIGSTOP)
            time.sleep(0.1)
            os.kill(pid, signal.SIGCONT)
            time.sleep(0.1)
    finally:
        os.kill(pid, signal.SIGCONT)


def main():
    dist.init_process_group("strata")
    group = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
    pids = [None] * WORLD
    dist.all_gather_object(pids, os.getpid())
    start = time.monotonic()
    began = []
    if RANK == 0:
        threading.Thread(target=throttle, args=(pids[SLOW], start, began), daemon=True).start()
    t = torch.ones(1 << 18)
    named_at, calls, ever = None, 0, set()
    while True:
        t.fill_(1.0)
        if RANK == 0 and time.monotonic() - start > RUN_S:
            t[0] = 1e6
        dist.all_reduce(t)
        calls += 1
        assert torch.all(t[1:] == WORLD), t[:4]
        view = group.stragglers()
        if view:
            ever.update(s["rank"] for s in view)
            named_at = named_at or time.time()
        if t[0] > 1e5:
            break
    # Whom each rank named at any time: the view itself fades once the throttle stops (its
    # window is 4 s), and the run goes on 1 s past it.
    views = [None] * WORLD
    dist.all_gather_object(views, (sorted(ever), named_at))
    failed = False
    if RANK == 0:
        named = {r for v, _ in views for r in v}
        by = [r for r, (v, _) in enumerate(views) if v]
        first = min((at for _, at in views if at), default=None)
        after = first - began[0] if first and began else float("nan")
        print(f"throttled: {calls} calls; rank {SLOW} named by ranks {by} {after:.1f} s after the "
              f"throttle began; named: {sorted(named)}")
        failed = named != {SLOW} or not after < 10
    dist.destroy_process_group()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
