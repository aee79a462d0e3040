"""strata against gloo in one run: torch.distributed collectives and a DDP step, side by side.

    torchrun --standalone --nproc-per-node 4 python/bench.py [--rounds 5] [--max-bytes 64M]

Every process holds a strata group and a gloo group over the same ranks. For each size (8 B
to --max-bytes, x8) and each call (all_reduce, all_gather_into_tensor, reduce_scatter_tensor on
float32) the two backends are timed in alternation, --rounds times, each time for enough
iterations to fill ~0.1 s; the table gives the median per-call time of each, nccl-tests' bus
bandwidth and the ratio gloo/strata (above 1: strata is faster). Then one DDP model trains
alternately on each group (same model, same data) and the median step times are compared.
Rank 0 prints; with --json FILE it also writes the rows.
"""

import argparse
import json
import statistics
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn

import strata_torch  # noqa: F401

CALLS = ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor")


def parse_size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1].upper()] if text[-1].upper() in units else int(text)


def busbw_factor(call, n):
    return 2 * (n - 1) / n if call == "all_reduce" else (n - 1) / n


def make(call, nbytes, world):
    count = max(nbytes // 4, 1)
    if call == "all_reduce":
        t = torch.ones(count)
        return lambda g: dist.all_reduce(t, group=g)
    if call == "all_gather_into_tensor":
        part = max(count // world, 1)
        src, dst = torch.ones(part), torch.empty(part * world)
        return lambda g: dist.all_gather_into_tensor(dst, src, group=g)
    part = max(count // world, 1)
    src, dst = torch.ones(part * world), torch.empty(part)
    return lambda g: dist.reduce_scatter_tensor(dst, src, group=g)


def timed(fn, group, budget=0.1):
    """Per-call seconds: iterations enough to fill ``budget``, measured after one warm-up."""
    fn(group)
    iters, t0 = 1, time.perf_counter()
    fn(group)
    one = time.perf_counter() - t0
    iters = max(2, min(2000, int(budget / max(one, 1e-7))))
    # every rank runs the same count: take rank 0's
    n = torch.tensor([iters])
    dist.broadcast(n, src=0, group=group)
    iters = int(n.item())
    dist.barrier(group=group)
    t0 = time.perf_counter()
    for _ in range(iters):
        fn(group)
    return (time.perf_counter() - t0) / iters


def ddp_steps(group, steps):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    model = nn.parallel.DistributedDataParallel(net, process_group=group)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[3:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--max-bytes", default="64M")
    ap.add_argument("--calls", default=",".join(CALLS))
    ap.add_argument("--ddp-steps", type=int, default=40)
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("strata", timeout=timedelta(minutes=5))
    world, rank = dist.get_world_size(), dist.get_rank()
    groups = {"strata": dist.group.WORLD, "gloo": dist.new_group(backend="gloo")}
    sizes, s, top = [], 8, parse_size(args.max_bytes)
    while s < top:
        sizes.append(s)
        s *= 8
    sizes.append(top)
    samples = {}
    for _ in range(args.rounds):
        for call in args.calls.split(","):
            for nbytes in sizes:
                fn = make(call, nbytes, world)
                for name, group in groups.items():
                    samples.setdefault((call, nbytes, name), []).append(timed(fn, group))
    ddp = {name: [] for name in groups}
    for _ in range(args.rounds):
        for name, group in groups.items():
            ddp[name].append(ddp_steps(group, args.ddp_steps))
    if rank == 0:
        rows = []
        print(f"# strata vs gloo, {world} processes, float32, median of {args.rounds} interleaved rounds")
        print(f"{'call':<24}{'bytes':>10}{'strata us':>12}{'gloo us':>12}{'strata busbw':>14}{'gloo busbw':>12}{'gloo/strata':>13}")
        for call in args.calls.split(","):
            for nbytes in sizes:
                st = statistics.median(samples[(call, nbytes, "strata")])
                gl = statistics.median(samples[(call, nbytes, "gloo")])
                f = busbw_factor(call, world)
                bw = lambda t: nbytes / t / 1e9 * f  # noqa: E731  (GB/s, nccl-tests' bus bandwidth)
                rows.append(dict(call=call, bytes=nbytes, strata_us=st * 1e6, gloo_us=gl * 1e6, ratio=gl / st))
                print(f"{call:<24}{nbytes:>10}{st * 1e6:>12.1f}{gl * 1e6:>12.1f}{bw(st):>14.3f}{bw(gl):>12.3f}{gl / st:>13.2f}")
        d_st, d_gl = statistics.median(ddp["strata"]), statistics.median(ddp["gloo"])
        print(f"DDP step (MLP 64-256-256-10, batch 32): strata {d_st * 1e3:.2f} ms, gloo {d_gl * 1e3:.2f} ms, gloo/strata {d_gl / d_st:.2f}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(dict(world=world, rows=rows, ddp_strata_s=d_st, ddp_gloo_s=d_gl), f, indent=1)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
