#!/usr/bin/env python3
"""Auto's time beside the best fixed algorithm's, measured side by side in rounds.

    python3 benches/auto_vs_best.py RUN_JSON...

Each RUN_JSON is a collbench `-J` file of one collective run with `--algo all,auto` (every
fixed algorithm, then strata's choice, in one run); several files of the same collective are
rounds of it, run one after another. Per (collective, size): each algorithm's median
out-of-place time over the rounds, and auto's (its rows carry `"tuned": true`), set beside the
least of those medians, and counted within issue 41's bound: 1.10x, or 1 us below 4 KiB.
A second count judges the choice alone: the fixed median of what auto ran (the slowest of its
choices where rounds chose differently) against the best, which leaves out how far one run of
an algorithm lands from another run of the same algorithm.
scripts/fattree.sh --calibrate (and --auto-vs-best) writes such rounds on the emulated fat tree.
"""

import json
import statistics
import sys
from collections import defaultdict


def within_bound(t, best, size):
    """Issue 41's bound: 1.10x the best, or 1 us over it below 4 KiB."""
    return t / best <= 1.10 or (size < 4096 and t - best <= 1.0)


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    fixed = defaultdict(lambda: defaultdict(list))  # (op, size) -> algorithm -> times
    tuned = defaultdict(list)  # (op, size) -> [(time, algorithm)]
    for path in sys.argv[1:]:
        with open(path) as f:
            run = json.load(f)
        for r in run["rows"]:
            key = (r["collective"], r["size_bytes"])
            t = r["out_of_place"]["time_us"]
            if r.get("tuned"):
                tuned[key].append((t, r["algorithm"]))
            else:
                fixed[key][r["algorithm"]].append(t)
    within = chose_well = total = 0
    for key in sorted(tuned, key=lambda k: (k[0], k[1])):
        if not fixed[key]:
            continue
        medians = {a: statistics.median(ts) for a, ts in fixed[key].items()}
        best = min(medians, key=medians.get)
        b = medians[best]
        a = statistics.median(t for t, _ in tuned[key])
        picks = {name for _, name in tuned[key]}
        chosen = "/".join(sorted(picks))
        rounds = len(tuned[key])
        ok = within_bound(a, b, key[1])
        total += 1
        within += ok
        fixed_of_picks = [medians[p] for p in picks if p in medians]
        choice = max(fixed_of_picks) if len(fixed_of_picks) == len(picks) else None
        choice_ok = choice is not None and within_bound(choice, b, key[1])
        chose_well += choice_ok
        same_txt = f", {chosen} fixed {choice:.2f} us" if choice is not None else ""
        print(f"{key[0]} {key[1]} B: auto {a:.2f} us ({chosen}), best {b:.2f} us ({best})"
              f"{same_txt}, {a / b:.2f}x, {rounds} rounds{'' if ok else '  <- off'}"
              f"{'' if choice_ok else '  <- choice off'}")
    if total == 0:
        sys.exit("no (collective, size) has both tuned and fixed rows: run --algo all,auto")
    print(f"auto within 1.10x of the best fixed algorithm (or 1 us below 4 KiB), medians of "
          f"rounds run side by side: {within}/{total}")
    print(f"auto's choice, its fixed median within the same bound: {chose_well}/{total}")


if __name__ == "__main__":
    main()
