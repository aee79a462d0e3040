#!/usr/bin/env python3
"""PyTorch DDP on CUDA tensors through ProcessGroupNCCL, for comparing NVIDIA's NCCL with
strata's drop-in (LD_PRELOAD) on the same machine: the same model, seed and data, so the
final parameters must match bit for bit (two ranks: each sum has two terms, whatever the
order). Every rank may share one GPU (NCCL 2.30+: NCCL_MULTI_RANK_GPU_ENABLE=1).

    torchrun --standalone --nproc-per-node 2 scripts/gpu_ddp.py --steps 30 --out r.json

Rank 0 writes JSON: the NCCL version torch reports, the library that answered, the median
and every step's time (ms, after a synchronize), and the parameters' SHA-256 and sum.
"""
import argparse
import hashlib
import json
import os
import statistics
import time

import torch
import torch.distributed as dist


def loaded_nccl():
    """The libnccl file this process mapped (strata's when preloaded)."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                if "libnccl" in line:
                    return line.split()[-1]
    except OSError:
        pass
    return "?"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    rank = int(os.environ["RANK"])
    device = torch.device("cuda", int(os.environ.get("DDP_DEVICE", "0")))
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    torch.manual_seed(1234)
    model = torch.nn.Sequential(
        torch.nn.Linear(a.width, a.width),
        torch.nn.ReLU(),
        torch.nn.Linear(a.width, a.width),
        torch.nn.ReLU(),
        torch.nn.Linear(a.width, 16),
    ).to(device)
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index])
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    gen = torch.Generator(device="cpu").manual_seed(99 + rank)
    times = []
    for _ in range(a.steps):
        x = torch.randn(64, a.width, generator=gen).to(device)
        y = torch.randn(64, 16, generator=gen).to(device)
        torch.cuda.synchronize()
        t = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t) * 1e3)
    flat = torch.cat([p.detach().float().reshape(-1).cpu() for p in model.parameters()])
    digest = hashlib.sha256(flat.numpy().tobytes()).hexdigest()
    dist.barrier()
    if rank == 0:
        result = {
            "nccl_version": ".".join(map(str, torch.cuda.nccl.version())),
            "library": loaded_nccl(),
            "world_size": dist.get_world_size(),
            "steps": a.steps,
            "step_ms_median": statistics.median(times[3:] or times),
            "step_ms": times,
            "params_sha256": digest,
            "params_sum": float(flat.double().sum()),
        }
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)
        print(json.dumps({k: v for k, v in result.items() if k != "step_ms"}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
