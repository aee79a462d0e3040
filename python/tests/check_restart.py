"""A training loop that torchrun restarts: in the first attempt (TORCHELASTIC_RESTART_COUNT
0) one worker exits with status 1 at step 5; torchrun restarts the whole group, which must
join again and finish with exact results. Every worker prints its pid (``RESTART pid P``) and,
at the end, ``RESTART ok attempt A rank R``.

Usage: torchrun --nproc-per-node 4 --max-restarts 2 --rdzv-backend c10d --rdzv-endpoint
HOST:PORT check_restart.py [--backend strata|gloo] [--steps N]
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--backend", default="strata")
parser.add_argument("--steps", type=int, default=10)
parser.add_argument("--die-rank", type=int, default=1)
parser.add_argument("--die-step", type=int, default=5)
args = parser.parse_args()
if args.backend == "strata":
    import strata_torch  # noqa: F401  (registers the backend)



def say(line):
    """One write per line: four workers share torchrun's stdout, and print() may write the
    text and its newline separately (unbuffered), which lets another worker's line in between."""
    os.write(1, (line + "\n").encode())


attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
say(f"RESTART pid {os.getpid()} attempt {attempt}")
dist.init_process_group(args.backend)
rank, size = dist.get_rank(), dist.get_world_size()
for step in range(args.steps):
    if attempt == 0 and rank == args.die_rank and step == args.die_step:
        say(f"RESTART rank {rank} exits at step {step} of attempt {attempt}")
        os._exit(1)
    t = torch.full((1000,), float(rank + step + 1))
    dist.all_reduce(t)
    want = size * (step + 1) + size * (size - 1) / 2
    if not torch.all(t == want):
        say(f"RESTART wrong at step {step}: {t[0].item()} != {want}")
        sys.exit(2)
dist.barrier()
dist.destroy_process_group()
say(f"RESTART ok attempt {attempt} rank {rank}")
