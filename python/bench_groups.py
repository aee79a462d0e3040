"""How long a job takes to make its process groups, on one backend (run by torchrun).

`benches/subgroups.sh` runs it for strata and gloo in interleaved rounds and prints medians.
Each run, on N processes (N even):

* ``init_ms``: ``init_process_group`` and a first all_reduce on the default group;
* ``new_group_ms``: two ``new_group``s (the lower and the upper half of the ranks) and a first
  all_reduce on the one this rank is in;
* ``device_mesh_ms``: ``init_device_mesh("cpu", (2, N // 2))``, which makes a group for each
  row and each column.

Each figure is the slowest rank's (a group is made when its last member has it). Rank 0 prints
one line: ``GROUPS {"backend": ..., "np": N, "init_ms": ..., ...}``.
"""

import argparse
import json
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

import strata_torch  # noqa: F401  (registers the backend)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="strata")
    args = ap.parse_args()
    t = time.perf_counter()
    dist.init_process_group(args.backend)
    dist.all_reduce(torch.ones(1))
    times = {"init_ms": time.perf_counter() - t}
    rank, n = dist.get_rank(), dist.get_world_size()
    assert n % 2 == 0, "run on an even number of processes"
    half = n // 2

    dist.barrier()
    t = time.perf_counter()
    lower = dist.new_group(list(range(half)))
    upper = dist.new_group(list(range(half, n)))
    dist.all_reduce(torch.ones(4), group=lower if rank < half else upper)
    times["new_group_ms"] = time.perf_counter() - t

    dist.barrier()
    t = time.perf_counter()
    mesh = init_device_mesh("cpu", (2, half), mesh_dim_names=("dp", "tp"))
    times["device_mesh_ms"] = time.perf_counter() - t

    slowest = torch.tensor([times[k] * 1e3 for k in sorted(times)], dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    if rank == 0:
        out = {"backend": args.backend, "np": n}
        out.update({k: round(float(v), 3) for k, v in zip(sorted(times), slowest)})
        print("GROUPS " + json.dumps(out), flush=True)
    del mesh
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
