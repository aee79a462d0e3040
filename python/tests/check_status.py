"""The live view through the PyTorch backend: ``ProcessGroupStrata.status()`` names the rank the
others wait on, and the call they wait in, without stopping anyone. Four ranks of one group, each
in a thread of this process; ranks 0, 1 and 3 enter an all-reduce of 1 MiB while rank 2 holds
back; the main thread asks rank 0's group for the view, then lets rank 2 in.

    python python/tests/check_status.py     (PYTHONPATH=python, STRATA_LIB=the built library)

Prints ``status: N passed, 0 failed`` and exits 0 when every check holds.
"""

import sys
import threading
import time
from datetime import timedelta

import torch

from check_threads import make_groups, run_checks

LATE = 2


def check_the_rank_others_wait_on_is_named_with_their_call():
    groups, _ = make_groups(4, timedelta(seconds=60))
    go, errors = threading.Event(), []

    def one(rank):
        try:
            t = torch.ones(1 << 18)
            groups[rank].allreduce([t]).wait()  # call #1: everyone
            if rank == LATE:
                go.wait(30)
            groups[rank].allreduce([t]).wait()  # call #2: rank 2 late
            assert torch.all(t == 16.0), f"rank {rank}: {t[:4]}"
        except Exception as e:  # reported below
            errors.append(f"rank {rank}: {e}")

    threads = [threading.Thread(target=one, args=(r,)) for r in range(4)]
    for t in threads:
        t.start()
    try:
        time.sleep(1.0)
        view = groups[0].status(1.0)
    finally:
        go.set()
        for t in threads:
            t.join(60)
    after = groups[3].status(1.0)
    for g in groups:
        g.shutdown()
    assert not errors, errors
    by_rank = {r["rank"]: r for r in view["ranks"]}
    assert sorted(by_rank) == [0, 1, 2, 3] and not view["silent"], view
    for r in (0, 1, 3):
        call = by_rank[r]["call"]
        assert call and call["collective"] == "all_reduce" and call["seq"] == 2, by_rank[r]
        assert call["for_s"] >= 0.5, call
    assert by_rank[LATE]["call"] is None and by_rank[LATE]["finished"] == 1, by_rank[LATE]
    culprits = {c["rank"]: c for c in view["holding_up"]}
    assert list(culprits) == [LATE], view["holding_up"]
    assert culprits[LATE]["waited_on_by"] == [0, 1, 3], culprits[LATE]
    assert "all_reduce #2" in culprits[LATE]["call"], culprits[LATE]
    print(f"  rank {LATE}: {culprits[LATE]['what']}; ranks {culprits[LATE]['waited_on_by']} wait in {culprits[LATE]['call']}")
    # Once everyone is done, nobody holds anyone up.
    assert not after["holding_up"] and all(r["call"] is None for r in after["ranks"]), after


def main():
    return run_checks("status", (check_the_rank_others_wait_on_is_named_with_their_call,))


if __name__ == "__main__":
    sys.exit(main())
