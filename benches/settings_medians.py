#!/usr/bin/env python3
"""Median time per size of collbench runs of several settings over interleaved rounds.

Reads OUT/SETTING-ROUND.json (collbench -J) for every setting and round, and prints one row
per setting: the median out-of-place time (us) at each size. Used by slot_sizes.sh and
ring_slices.sh.
    settings_medians.py OUT ROUNDS "WHAT THE SETTING IS" SETTING...
"""
import json
import statistics
import sys

out, rounds, meaning, settings = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
table = {}
for s in settings:
    for r in range(1, rounds + 1):
        with open(f"{out}/{s}-{r}.json") as f:
            for row in json.load(f)["rows"]:
                table.setdefault(s, {}).setdefault(row["size_bytes"], []).append(
                    row["out_of_place"]["time_us"]
                )
sizes = sorted(next(iter(table.values())))
width = max(10, max(len(s) for s in settings) + 2)
print(f"# all_reduce float sum, time (us), median of {rounds} interleaved rounds; setting = {meaning}")
print(f"{'setting':>{width}}" + "".join(f"{s:>12}" for s in sizes))
for s in settings:
    print(f"{s:>{width}}" + "".join(f"{statistics.median(table[s][z]):>12.1f}" for z in sizes))
