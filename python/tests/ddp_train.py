"""One rank of a DistributedDataParallel training run on CPU (run by torchrun).

    torchrun --nproc-per-node 4 ddp_train.py --backend strata --steps 300 --out DIR

trains a small MLP classifier on synthetic data from a fixed seed: every rank draws its own
shard of each batch, DDP all-reduces the gradients (bucketed, through the backend's
``allreduce`` futures), SGD with momentum updates the weights. Rank 0 writes the final
parameters to ``DIR/<backend>.pt`` and the step times to ``DIR/<backend>.json``; a run with
another backend from the same seed must end at the same parameters.

``--fsdp`` trains the same model with FSDP2 (``fully_shard``): parameters are sharded over the
ranks, gathered with all_gather_into_tensor and gradients reduce-scattered.
"""

import argparse
import json
import os
import pathlib
import statistics
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn

import strata_torch  # noqa: F401  (registers the "strata" backend)

FEATURES, HIDDEN, CLASSES, BATCH = 64, 256, 10, 32


def model():
    torch.manual_seed(1234)
    return nn.Sequential(
        nn.Linear(FEATURES, HIDDEN),
        nn.ReLU(),
        nn.Linear(HIDDEN, HIDDEN),
        nn.ReLU(),
        nn.Linear(HIDDEN, CLASSES),
    )


def batch(step, rank):
    g = torch.Generator().manual_seed(step * 1000 + rank)
    x = torch.randn(BATCH, FEATURES, generator=g)
    # a learnable rule: the class is the index of the largest of the first CLASSES features
    y = x[:, :CLASSES].argmax(dim=1)
    return x, y


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", required=True)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--out", required=True)
    ap.add_argument("--fsdp", action="store_true")
    ap.add_argument("--strata-algo", help="STRATA_ALGO for this run (a fixed summation order)")
    ap.add_argument("--tag", help="the name of the files written (default: backend[-fsdp])")
    args = ap.parse_args()
    if args.strata_algo:
        os.environ["STRATA_ALGO"] = args.strata_algo
    torch.set_num_threads(1)
    dist.init_process_group(args.backend, timeout=timedelta(seconds=120))
    rank = dist.get_rank()
    net = model()
    if args.fsdp:
        from torch.distributed.fsdp import fully_shard

        for layer in net:
            if isinstance(layer, nn.Linear):
                fully_shard(layer)
        wrapped = fully_shard(net)
    else:
        wrapped = nn.parallel.DistributedDataParallel(net)
    opt = torch.optim.SGD(wrapped.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    times, losses = [], []
    for step in range(args.steps):
        x, y = batch(step, rank)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(wrapped(x), y)
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
    if args.fsdp:
        state = {k: v.full_tensor() for k, v in wrapped.state_dict().items()}
    else:
        state = {k: v.detach().clone() for k, v in wrapped.module.state_dict().items()}
    # the ranks must agree with each other, whatever the backend
    for k, v in state.items():
        ref = v.clone()
        dist.broadcast(ref, src=0)
        assert torch.equal(ref, v), f"rank {rank}: {k} differs from rank 0's"
    dist.barrier()
    if rank == 0:
        out = pathlib.Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        tag = args.tag or args.backend + ("-fsdp" if args.fsdp else "")
        torch.save(state, out / f"{tag}.pt")
        warm = times[min(10, len(times) - 1) :]
        (out / f"{tag}.json").write_text(
            json.dumps(
                {
                    "backend": args.backend,
                    "fsdp": args.fsdp,
                    "world": dist.get_world_size(),
                    "steps": args.steps,
                    "median_step_s": statistics.median(warm),
                    "first_loss": losses[0],
                    "last_loss": statistics.fmean(losses[-10:]),
                }
            )
        )
    if args.backend == "gloo":
        # Gloo's teardown sometimes leaves a worker thread joinable, and the C++ runtime then
        # aborts the process ("terminate called without an active exception"; twice in a row
        # in one CI run with torch 2.15.0). Gloo is only the reference here and its results
        # are written, so its processes leave without tearing it down. strata's backend is
        # torn down in full: that is under test.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
