"""One rank of multi-dimensional training through PyTorch's own stack (run by torchrun, 4
processes), on the backend named by ``--backend`` (strata or gloo), from a fixed seed:

* ``mesh``: ``init_device_mesh("cpu", (2, 2), ("dp", "tp"))``; a 3-layer MLP with tensor
  parallelism over tp (DTensor: colwise then rowwise linear layers) and FSDP2 (``fully_shard``)
  over dp; 6 SGD steps, each dp rank on its own data.
* ``pipeline``: the same MLP cut into 4 stages, one per rank
  (``torch.distributed.pipelining``, GPipe schedule, 4 microbatches); 6 SGD steps.

Rank 0 prints ``RESULT <mode> <json>``: the final parameters (full tensors, gathered) as
lists, the median step time and the times to make the groups (``new_group`` twice and a first
call, ``init_device_mesh``). ``check_parallel_compare.py`` compares two such lines.
"""

import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn

import strata_torch  # noqa: F401  (registers the backend)

RANK, WORLD = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
STEPS, DIM, BATCH = 6, 16, 8


def mlp():
    torch.manual_seed(1234)
    return nn.Sequential(nn.Linear(DIM, 4 * DIM), nn.ReLU(), nn.Linear(4 * DIM, DIM), nn.ReLU(), nn.Linear(DIM, DIM))


def batch(step, who):
    g = torch.Generator().manual_seed(100 * step + who)
    return torch.randn(BATCH, DIM, generator=g), torch.randn(BATCH, DIM, generator=g)


def timed_groups():
    """Two new_groups and a first call on one, then a 2 x 2 device mesh, in milliseconds."""
    dist.barrier()
    t0 = time.perf_counter()
    a = dist.new_group([0, 1])
    b = dist.new_group([2, 3])
    x = torch.ones(4)
    dist.all_reduce(x, group=a if RANK < 2 else b)
    t1 = time.perf_counter()
    from torch.distributed.device_mesh import init_device_mesh

    dist.barrier()
    t2 = time.perf_counter()
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    t3 = time.perf_counter()
    return mesh, {"new_group_ms": (t1 - t0) * 1e3, "device_mesh_ms": (t3 - t2) * 1e3}


def run_mesh(mesh):
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    model = mlp()
    parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    fully_shard(model, mesh=mesh["dp"])
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    dp_rank = mesh["dp"].get_local_rank()
    times = []
    for step in range(STEPS):
        x, y = batch(step, dp_rank)
        t = time.perf_counter()
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t)
    params = {name: p.full_tensor().tolist() for name, p in model.named_parameters()}
    return params, times


def run_pipeline():
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    full = mlp()
    layers = [full[0], nn.Sequential(full[1], full[2]), nn.Sequential(full[3], full[4]), nn.Identity()]
    stage_mod = layers[RANK]
    stage = PipelineStage(stage_mod, RANK, WORLD, torch.device("cpu"))
    schedule = ScheduleGPipe(stage, n_microbatches=4, loss_fn=nn.functional.mse_loss)
    params = [p for p in stage_mod.parameters()]
    opt = torch.optim.SGD(params, lr=0.05) if params else None
    times = []
    for step in range(STEPS):
        x, y = batch(step, 0)
        t = time.perf_counter()
        if opt:
            opt.zero_grad()
        if RANK == 0:
            schedule.step(x)
        elif RANK == WORLD - 1:
            schedule.step(target=y)
        else:
            schedule.step()
        if opt:
            opt.step()
        times.append(time.perf_counter() - t)
    mine = {f"stage{RANK}.{n}": p.detach().tolist() for n, p in stage_mod.named_parameters()}
    every = [None] * WORLD
    dist.all_gather_object(every, mine)
    params = {k: v for d in every for k, v in d.items()}
    return params, times


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="strata")
    ap.add_argument("--mode", choices=["mesh", "pipeline"], default="mesh")
    args = ap.parse_args()
    t = time.perf_counter()
    dist.init_process_group(args.backend)
    x = torch.ones(1)
    dist.all_reduce(x)
    init_ms = (time.perf_counter() - t) * 1e3
    assert WORLD == 4, "run with 4 processes"
    mesh, group_times = timed_groups()
    if args.mode == "mesh":
        params, times = run_mesh(mesh)
    else:
        params, times = run_pipeline()
    dist.barrier()
    if RANK == 0:
        out = {"params": params, "step_ms": statistics.median(times) * 1e3, "init_ms": init_ms, **group_times}
        print(f"RESULT {args.mode} {json.dumps(out)}", flush=True)
    if args.backend != "gloo":  # Gloo sometimes aborts in its teardown (see tests/pytorch.rs)
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
