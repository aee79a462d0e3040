#!/usr/bin/env python3
"""Does a near-tie trial keep the algorithm that is fastest in the steady state?

For each rank count, collective and size: one collbench run under STRATA_LOG=info shows whether
the tuner ran a near-tie trial there, which algorithms it timed and which it kept. Each
trial is run TRIALS times by each collbench build named in BUILDS ("name:path", space
separated; default this tree's release build, so that two ways of running trials can be set
side by side, e.g. "turns:target/release/collbench alternate:/tmp/collbench-old"), and ROUNDS
interleaved rounds of the first build with each of the trial's algorithms fixed (`--algo`, 20
timed calls after collbench's warm-up) give their steady-state medians (out-of-place time).
Per case it prints each build's picks and, for each pick, its steady median over the fastest
one's; at the end, per build, how many picks were within 1.10x of the steady best.

    NPS="2 3 4" SIZES="512 4K 32K 256K 2M 16M" ROUNDS=5 TRIALS=4 python3 benches/trial_order.py

Figures from a 2-core VM are noisy: read the ratios over many cases, never one.
"""

import os
import re
import statistics
import subprocess
import sys

NPS = [int(x) for x in os.environ.get("NPS", "2 3 4").split()]
OPS = os.environ.get("OPS", "all_reduce all_gather reduce_scatter").split()
SIZES = os.environ.get("SIZES", "8 512 4K 32K 256K 2M").split()
ROUNDS = int(os.environ.get("ROUNDS", "3"))
TRIALS = int(os.environ.get("TRIALS", "3"))
BUILDS = [
    tuple(b.split(":", 1))
    for b in os.environ.get("BUILDS", "trial:target/release/collbench").split()
]
COLLBENCH = BUILDS[0][1]
KEEP = re.compile(r"their medians summed over the ranks are (.*); keeping (\S+)")


def collbench(np, op, size, extra, env, binary=None):
    e = dict(os.environ)
    e.setdefault("STRATA_SOCKET_IFNAME", "=lo")
    e.update(env)
    args = [binary or COLLBENCH, "--np", str(np), "--op", op, "-b", size, "-e", size,
            "--timeout", "120"]
    r = subprocess.run(args + extra, env=e, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{' '.join(args + extra)} failed:\n{r.stdout}\n{r.stderr}")
    return r.stdout + r.stderr


def out_of_place_us(text):
    for line in text.splitlines():
        f = line.split()
        if len(f) > 6 and f[0].isdigit() and f[3] in ("none", "sum"):
            return float(f[5])
    sys.exit(f"no result row in:\n{text}")


def trial(np, op, size, binary):
    """The trial's algorithms and its pick, or None where no trial ran."""
    text = collbench(np, op, size, ["-n", "1"], {"STRATA_LOG": "info"}, binary)
    m = KEEP.search(text)
    if not m:
        return None
    algos = [a.split()[0] for a in m.group(1).split(", ")]
    return algos, m.group(2)


def main():
    ratios = {name: [] for name, _ in BUILDS}
    for np in NPS:
        for op in OPS:
            for size in SIZES:
                first = trial(np, op, size, COLLBENCH)
                if first is None:
                    print(f"{np} ranks {op} {size}: no trial")
                    continue
                algos = first[0]
                picks = {name: [] for name, _ in BUILDS}
                steady = {a: [] for a in algos}
                for _ in range(max(ROUNDS, TRIALS)):
                    for name, binary in BUILDS:
                        if len(picks[name]) < TRIALS:
                            t = trial(np, op, size, binary)
                            if t is not None:
                                picks[name].append(t[1])
                    if len(steady[algos[0]]) < ROUNDS:
                        for a in algos:
                            steady[a].append(
                                out_of_place_us(collbench(np, op, size, ["--algo", a], {}))
                            )
                med = {a: statistics.median(t) for a, t in steady.items()}
                best = min(med.values())
                shown = ", ".join(f"{a} {med[a]:.2f}" for a in algos)
                print(f"{np} ranks {op} {size}: steady medians (us) {shown}")
                for name, _ in BUILDS:
                    r = [med[p] / best for p in picks[name] if p in med]
                    ratios[name] += r
                    print(
                        f"    {name}: kept {' '.join(picks[name])}; "
                        f"steady/best {' '.join(f'{x:.2f}' for x in r)}"
                    )
                sys.stdout.flush()
    for name, r in ratios.items():
        if r:
            within = sum(x <= 1.10 for x in r)
            print(
                f"{name}: {within}/{len(r)} picks within 1.10x of the steady best; "
                f"median {statistics.median(r):.3f}x, worst {max(r):.2f}x"
            )


if __name__ == "__main__":
    main()
