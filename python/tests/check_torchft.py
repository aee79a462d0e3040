"""torchft's fault-tolerant DDP on strata: two replica groups (one rank each, threads of this
process, as torchft's own integration tests run them) train a small model under a torchft
Lighthouse; replica 1 fails after step 2, restarts and rejoins, healing from replica 0; both
must end with equal state. Prints the time from the failure to the next step both replicas
commit.

    python python/tests/check_torchft.py [--backend strata|gloo] [--steps N]
        (PYTHONPATH=python, STRATA_LIB=the built library; torchft from PyPI)

Prints ``torchft <backend>: ... failure to next commit X s`` and ``torchft: N passed, 0 failed``;
with strata it also checks that ``abort`` ends a call in flight and that the group re-forms.
"""

import argparse
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn, optim
from torchft._torchft import LighthouseServer
from torchft.ddp import DistributedDataParallel
from torchft.manager import Manager
from torchft.optim import OptimizerWrapper
from torchft.process_group import ProcessGroupGloo

from check_threads import fails_within, run_checks
from strata_torch.torchft import ProcessGroupStrataFT

FAIL_AT = 2
SEED_LOCK = threading.Lock()


class Failure(Exception):
    """A replica's simulated crash."""


class Replica:
    """One replica group of one rank: restarts after a failure, up to `attempts` times."""

    def __init__(self, replica_id, lighthouse, make_pg, steps, fail_at, commits):
        self.replica_id = replica_id
        self.lighthouse = lighthouse
        self.make_pg = make_pg
        self.steps = steps
        self.fail_at = fail_at
        self.commits = commits  # (replica, step, time) of every committed step
        self.failed_at_time = None

    def run(self, attempts=3):
        for attempt in range(attempts):
            try:
                return self.train()
            except Failure:
                print(f"  replica {self.replica_id}: failed after step {self.fail_at}, restarting")
                self.fail_at = None
        raise RuntimeError(f"replica {self.replica_id} ran out of attempts")

    def train(self):
        store = dist.TCPStore(host_name="localhost", port=0, is_master=True, wait_for_workers=False)

        def load_state_dict(state):
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optim"])

        def state_dict():
            return {"model": model.state_dict(), "optim": optimizer.state_dict()}

        manager = Manager(
            pg=self.make_pg(),
            min_replica_size=2,
            load_state_dict=load_state_dict,
            state_dict=state_dict,
            replica_id=str(self.replica_id),
            store_addr="localhost",
            store_port=store.port,
            rank=0,
            world_size=1,
            lighthouse_addr=self.lighthouse.address(),
            port=0,
            use_async_quorum=False,
            timeout=timedelta(seconds=30),
        )
        try:
            with SEED_LOCK:
                torch.manual_seed(42)
                model = nn.Sequential(nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 4))
            model = DistributedDataParallel(manager, model)
            optimizer = OptimizerWrapper(manager, optim.Adam(model.parameters()))
            criterion = nn.CrossEntropyLoss()
            while manager.current_step() < self.steps:
                before = manager.current_step()
                optimizer.zero_grad()
                loss = criterion(model(torch.rand(2, 3)), torch.randint(4, (2,)))
                loss.backward()
                optimizer.step()
                if manager.current_step() > before:
                    self.commits.append((self.replica_id, manager.current_step(), time.monotonic()))
                if self.fail_at is not None and manager.current_step() == self.fail_at:
                    self.failed_at_time = time.monotonic()
                    raise Failure()
            return state_dict()
        finally:
            manager.shutdown(wait=False)


def run(backend, steps):
    """Trains two replicas with replica 1 failing at FAIL_AT; (states, failure-to-commit s)."""
    make_pg = {
        "strata": lambda: ProcessGroupStrataFT(timeout=timedelta(seconds=30)),
        "gloo": lambda: ProcessGroupGloo(timeout=timedelta(seconds=30)),
    }[backend]
    lighthouse = LighthouseServer(bind="[::]:0", min_replicas=2)
    commits = []
    replicas = [
        Replica(0, lighthouse, make_pg, steps, None, commits),
        Replica(1, lighthouse, make_pg, steps, FAIL_AT, commits),
    ]
    try:
        with ThreadPoolExecutor(max_workers=2) as pool:
            futures = [pool.submit(r.run) for r in replicas]
            states = [f.result(timeout=300) for f in futures]
    finally:
        lighthouse.shutdown()
    failed = replicas[1].failed_at_time
    after = [t for (r, s, t) in commits if r == 0 and s > FAIL_AT and t > failed]
    return states, (min(after) - failed) if after else float("nan")


def check_ddp_heals_on(backend, steps):
    start = time.monotonic()
    states, heal = run(backend, steps)
    torch.testing.assert_close(states[0], states[1])
    print(
        f"torchft {backend}: 2 replicas, replica 1 failed after step {FAIL_AT} and rejoined; "
        f"{steps} steps in {time.monotonic() - start:.1f} s; failure to next commit {heal:.2f} s; "
        "equal state"
    )


def check_abort_interrupts_a_call_in_flight():
    """Rank 0 of two all-reduces alone; abort from another thread must end its wait at once,
    with errored() saying so, and a re-configure must give a working group again."""
    store = dist.TCPStore(host_name="localhost", port=0, is_master=True, wait_for_workers=False)
    groups = [ProcessGroupStrataFT(timeout=timedelta(seconds=60)) for _ in range(2)]

    def configure(q):
        with ThreadPoolExecutor(max_workers=2) as pool:
            for f in [
                pool.submit(g.configure, f"localhost:{store.port}/abort/{q}", str(r), r, 2)
                for r, g in enumerate(groups)
            ]:
                f.result(timeout=60)

    configure(0)
    work = groups[0].allreduce([torch.ones(8)], dist.AllreduceOptions())
    time.sleep(0.3)
    assert groups[0].errored() is None, groups[0].errored()
    start = time.monotonic()
    threading.Thread(target=groups[0].abort).start()
    took, e = fails_within(work.wait, 5, start)
    print(f"  abort ended the call in flight after {1e3 * took:.0f} ms: {str(e)[:90]}")
    assert groups[0].errored() is not None
    groups[1].abort(errored=False)
    configure(1)
    assert groups[0].errored() is None
    x = [torch.full((8,), float(r + 1)) for r in range(2)]
    with ThreadPoolExecutor(max_workers=2) as pool:
        for f in [
            pool.submit(lambda r=r: groups[r].allreduce([x[r]], dist.AllreduceOptions()).wait())
            for r in range(2)
        ]:
            f.result(timeout=60)
    assert all(torch.all(t == 3.0) for t in x), x
    for g in groups:
        g.abort(errored=False)


def configure_times(backend, ranks, rounds):
    """Seconds each of `rounds` reconfigurations of a `ranks`-rank group took (the slowest
    rank's, each followed by an all-reduce that checks the new group)."""
    make_pg = {
        "strata": lambda: ProcessGroupStrataFT(timeout=timedelta(seconds=30)),
        "gloo": lambda: ProcessGroupGloo(timeout=timedelta(seconds=30)),
    }[backend]
    store = dist.TCPStore(host_name="localhost", port=0, is_master=True, wait_for_workers=False)
    groups = [make_pg() for _ in range(ranks)]
    took = [[0.0] * rounds for _ in range(ranks)]
    barrier = threading.Barrier(ranks)

    def one(rank):
        for q in range(rounds):
            barrier.wait()
            t = time.monotonic()
            groups[rank].configure(f"localhost:{store.port}/bench/{q}", str(rank), rank, ranks)
            took[rank][q] = time.monotonic() - t
            x = torch.ones(16)
            groups[rank].allreduce([x], dist.AllreduceOptions()).wait()
            assert torch.all(x == ranks), x

    with ThreadPoolExecutor(max_workers=ranks) as pool:
        for f in [pool.submit(one, r) for r in range(ranks)]:
            f.result(timeout=120)
    for g in groups:
        g.abort(errored=False)
    return [max(took[r][q] for r in range(ranks)) for q in range(rounds)]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", choices=["strata", "gloo"], default="strata")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument(
        "--configure",
        metavar="RANKS",
        help="instead: time a re-configure (abort the group, form the next) at these rank "
        "counts, e.g. 2,4,8, strata and gloo interleaved, medians of 5",
    )
    args = parser.parse_args()
    if args.configure:
        for ranks in [int(x) for x in args.configure.split(",")]:
            runs = {"strata": [], "gloo": []}
            for _ in range(5):
                for backend in ("strata", "gloo"):
                    # The second: a re-configure, which aborts the group it replaces.
                    runs[backend].extend(configure_times(backend, ranks, 2)[1:])
            med = {b: sorted(v)[len(v) // 2] for b, v in runs.items()}
            print(
                f"configure at {ranks} ranks: strata {1e3 * med['strata']:.1f} ms, "
                f"gloo {1e3 * med['gloo']:.1f} ms (median of 5, interleaved)"
            )
        return 0

    def check_fault_tolerant_ddp_heals():
        check_ddp_heals_on(args.backend, args.steps)

    checks = [check_fault_tolerant_ddp_heals]
    if args.backend == "strata":
        checks.append(check_abort_interrupts_a_call_in_flight)
    return run_checks("torchft", checks)


if __name__ == "__main__":
    sys.exit(main())
