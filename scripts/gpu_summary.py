#!/usr/bin/env python3
"""The table and the JSON of a lent-GPU run (scripts/gpu-lent-check.sh), from its logs.

    python3 scripts/gpu_summary.py OUT_DIR        prints the table, writes OUT_DIR/summary.json

Logs read: <mode>_<lib>_r<round>.log with RESULT lines from benches/gpu_bench.c (mode threads
or mps, lib nccl or strata), copy.log (COPY), ddp_<lib>.json (scripts/gpu_ddp.py), env.log.
For each mode, collective and size: the median time over rounds per library (a rank's slowest
for processes), strata's time over NCCL's, both bus bandwidths, wrong elements, and the
target the issue sets: time at or below NCCL's up to 64 KiB, bus bandwidth at or above from
64 MiB. Also the HBM traffic each all-reduce implies (2 N S bytes at least for N ranks and S
bytes) against the copy rate measured in the same run.
"""
import glob
import json
import os
import re
import statistics
import sys

RESULT = re.compile(r"RESULT (\w+) bytes=(\d+) us=([\d.]+) algbw=([\d.]+) busbw=([\d.]+) wrong=(\d+)")


def human(b):
    for unit, size in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if b >= size and b % size == 0:
            return f"{b // size}{unit}"
    return str(b)


def runs(out, mode, lib):
    """{(coll, bytes): [(us, busbw, wrong), ...]} over rounds (and ranks: the slowest)."""
    got = {}
    for path in sorted(glob.glob(os.path.join(out, f"{mode}_{lib}_r*.log"))):
        per_file = {}
        for line in open(path, errors="replace"):
            m = RESULT.search(line)
            if not m:
                continue
            coll, b = m.group(1), int(m.group(2))
            us, bw, wrong = float(m.group(3)), float(m.group(5)), int(m.group(6))
            prev = per_file.get((coll, b))
            # Processes print one line each: the slowest rank's time counts, wrongs add.
            if prev is None or us > prev[0]:
                per_file[(coll, b)] = (us, bw, wrong + (prev[2] if prev else 0))
            else:
                per_file[(coll, b)] = (prev[0], prev[1], prev[2] + wrong)
        for k, v in per_file.items():
            got.setdefault(k, []).append(v)
    return got


def main():
    out = sys.argv[1]
    summary = {"env": open(os.path.join(out, "env.log"), errors="replace").read()
               if os.path.exists(os.path.join(out, "env.log")) else ""}
    copy_rate = None
    cp = os.path.join(out, "copy.log")
    if os.path.exists(cp):
        m = re.search(r"COPY bytes=(\d+) us=([\d.]+) rate=([\d.]+)", open(cp).read())
        if m:
            copy_rate = float(m.group(3))
    summary["copy_rate_gbs"] = copy_rate
    print(f"# device-to-device copy: {copy_rate} GB/s (bytes read + written)" if copy_rate
          else "# device-to-device copy: not measured")
    summary["modes"] = {}
    for mode in ("threads", "mps", "procs"):
        nv, st = runs(out, mode, "nccl"), runs(out, mode, "strata")
        if not nv and not st:
            continue
        n = 2
        rows = []
        what = {"threads": "2 ranks as threads on one GPU", "mps": "2 processes on one GPU under MPS",
                "procs": "ranks as processes"}[mode]
        print(f"\n# {mode}: {what}, medians of {max(len(v) for v in (nv or st).values())} "
              f"rounds; ratio = strata time / NCCL time")
        print(f"# {'collective':15} {'size':>6} {'nccl us':>10} {'strata us':>10} {'ratio':>6} "
              f"{'nccl busbw':>10} {'strata busbw':>12} {'wrong':>5}  target")
        for key in sorted(set(nv) | set(st), key=lambda k: (k[0], k[1])):
            coll, b = key
            med = lambda xs, i: statistics.median(x[i] for x in xs) if xs else None
            a, s = nv.get(key, []), st.get(key, [])
            nu, su, nb, sb = med(a, 0), med(s, 0), med(a, 1), med(s, 1)
            wrong = sum(x[2] for x in s) + sum(x[2] for x in a)
            ratio = su / nu if nu and su else None
            target = ""
            if nu and su and b <= 64 << 10:
                target = "ok" if su <= nu else "slower"
            elif nb and sb and b >= 64 << 20:
                target = "ok" if sb >= nb else "below"
            hbm = None
            if coll == "all_reduce" and su and mode != "procs":
                hbm = 2 * n * b / su / 1e3  # GB/s of HBM traffic at least, ranks sharing a GPU
            row = {"collective": coll, "bytes": b, "nccl_us": nu, "strata_us": su, "ratio": ratio,
                   "nccl_busbw": nb, "strata_busbw": sb, "wrong": wrong, "target": target,
                   "strata_hbm_gbs_at_least": hbm}
            rows.append(row)
            f = lambda v, w, p=2: f"{v:{w}.{p}f}" if v is not None else " " * (w - 1) + "-"
            print(f"  {coll:15} {human(b):>6} {f(nu, 10)} {f(su, 10)} {f(ratio, 6)} "
                  f"{f(nb, 10)} {f(sb, 12)} {wrong:5}  {target}")
        summary["modes"][mode] = rows
    ddp = {}
    for lib in ("nccl", "strata"):
        p = os.path.join(out, f"ddp_{lib}.json")
        if os.path.exists(p):
            ddp[lib] = json.load(open(p))
    if ddp:
        print("\n# PyTorch DDP, 2 processes on one GPU (ProcessGroupNCCL)")
        for lib, r in ddp.items():
            print(f"  {lib:7} {r['step_ms_median']:.2f} ms/step  params {r['params_sha256'][:16]}  "
                  f"({r['library']})")
        if len(ddp) == 2:
            same = ddp["nccl"]["params_sha256"] == ddp["strata"]["params_sha256"]
            ratio = ddp["strata"]["step_ms_median"] / ddp["nccl"]["step_ms_median"]
            print(f"  parameters {'equal' if same else 'DIFFER'}; step time strata / nccl = {ratio:.2f}")
            ddp["params_equal"] = same
            ddp["step_ratio"] = ratio
    summary["ddp"] = ddp
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    print(f"\n# JSON: {os.path.join(out, 'summary.json')}")


if __name__ == "__main__":
    main()
