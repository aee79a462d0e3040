#!/usr/bin/env python3
"""Summarises the JSON that `scripts/fattree.sh --out DIR` leaves behind.

For each placement it prints, per size: the topology-blind ring's busbw, the best fixed
algorithm's, strata's automatic choice and the ratios the issue's targets are about
(`pick/best` times auto's algorithm in the same run as the fixed ones, which separates the
choice from the noise between two runs of one schedule); then,
for every fixed algorithm at sizes >= 1 MiB, the cost model's prediction against the
measured time.

    python3 scripts/fattree_summary.py DIR
"""

import json
import pathlib
import sys


def load(directory, prefix):
    """Rows of every JSON file whose name starts with prefix, keyed (algorithm, size)."""
    rows = {}
    for path in sorted(pathlib.Path(directory).glob(prefix + "*.json")):
        for row in json.loads(path.read_text())["rows"]:
            rows[(row["algorithm"], row["size_bytes"])] = row
    return rows


def busbw(row):
    return row["out_of_place"]["busbw_gbs"]


def time_us(row):
    return row["out_of_place"]["time_us"]


def human(size):
    for unit in ["B", "KiB", "MiB", "GiB"]:
        if size < 1024:
            return f"{size} {unit}"
        size //= 1024
    return f"{size} TiB"


def summarise(directory, placement):
    blind = load(directory, f"{placement}__topology_blind_ring")
    fixed = load(directory, f"{placement}__fixed_algorithms")
    auto = load(directory, f"{placement}__auto")
    if not (blind and fixed and auto):
        print(f"# {placement}: no results in {directory}")
        return
    sizes = sorted({s for (_, s) in auto})
    print(f"\n## {placement} placement: busbw in MB/s (time-limited sizes first)")
    print(
        f"{'size':>9} {'blind ring':>11} {'best fixed':>22} {'auto':>22} {'auto/best':>10} "
        f"{'pick/best':>10} {'auto/blind':>11}"
    )
    worst = None
    worst_pick = None
    for size in sizes:
        b = next((busbw(r) for (a, s), r in blind.items() if s == size), 0.0)
        candidates = [(busbw(r), a, time_us(r)) for (a, s), r in fixed.items() if s == size]
        best_bw, best_algo, best_t = max(candidates)
        (auto_algo, _), auto_row = next(((k, r) for k, r in auto.items() if k[1] == size))
        # Compare times: busbw is 0 at the smallest sizes once rounded.
        ratio = best_t / time_us(auto_row)
        # The choice alone, free of run-to-run noise: the picked algorithm's time in the same
        # fixed-algorithm run as the best one.
        picked = fixed.get((auto_algo, size))
        pick = best_t / time_us(picked) if picked else float("nan")
        vs_blind = busbw(auto_row) / b if b > 0 else float("nan")
        print(
            f"{human(size):>9} {b * 1e3:>11.2f} {best_algo:>12} {best_bw * 1e3:>9.2f} "
            f"{auto_algo:>12} {busbw(auto_row) * 1e3:>9.2f} {ratio:>10.2f} {pick:>10.2f} "
            f"{vs_blind:>11.2f}"
        )
        if worst is None or ratio < worst[0]:
            worst = (ratio, size)
        if picked and (worst_pick is None or pick < worst_pick[0]):
            worst_pick = (pick, size)
    print(f"# lowest auto/best (time of best fixed / time of auto): {worst[0]:.2f} at {human(worst[1])}")
    if worst_pick:
        print(
            f"# lowest pick/best (the same, with auto's algorithm timed in the fixed run): "
            f"{worst_pick[0]:.2f} at {human(worst_pick[1])}"
        )
    print(f"\n## {placement} placement: cost model vs measured, sizes >= 1 MiB")
    print(f"{'algorithm':>16} {'worst error':>12} {'at':>9} {'mean |error|':>13}")
    by_algo = {}
    for (algo, size), row in fixed.items():
        if size >= 1 << 20 and row.get("predicted_us"):
            err = time_us(row) / row["predicted_us"] - 1.0
            by_algo.setdefault(algo, []).append((abs(err), err, size))
    outside = 0
    for algo, errs in sorted(by_algo.items()):
        errs.sort()
        _, err, size = errs[-1]
        mean = sum(e[0] for e in errs) / len(errs)
        flag = "" if abs(err) <= 0.25 else "  (outside ±25%)"
        outside += sum(1 for e in errs if e[0] > 0.25)
        print(f"{algo:>16} {err * 100:>+11.0f}% {human(size):>9} {mean * 100:>12.0f}%{flag}")
    total = sum(len(e) for e in by_algo.values())
    print(f"# {total - outside} of {total} (algorithm, size) pairs within ±25%")


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    for placement in ["launcher", "scattered"]:
        summarise(sys.argv[1], placement)
    return 0


if __name__ == "__main__":
    sys.exit(main())
