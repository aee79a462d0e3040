#!/usr/bin/env python3
"""Auto's time beside the best fixed algorithm's, from files other runs wrote.

    python3 benches/auto_vs_best.py CALIBRATE_JSON AUTO_JSON...

CALIBRATE_JSON is a `collbench calibrate --json` file (every algorithm of all-reduce,
all-gather and reduce-scatter timed per size); each AUTO_JSON a collbench `-J` file of one
collective with `--algo auto`. Per (collective, size) in both, auto's out-of-place time is set
beside the least measured time of any algorithm, and counted within issue 41's bound: 1.10x,
or 1 us below 4 KiB. scripts/fattree.sh --calibrate writes both kinds on the emulated fat
tree. It is one run of each, minutes apart, not interleaved rounds: label it so.
"""

import json
import sys


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    with open(sys.argv[1]) as f:
        points = json.load(f)
    best = {}
    for p in points:
        key = (p["collective"], p["size_bytes"])
        if key not in best or p["measured_us"] < best[key][0]:
            best[key] = (p["measured_us"], p["algorithm"])
    within = total = 0
    for path in sys.argv[2:]:
        with open(path) as f:
            run = json.load(f)
        for r in run["rows"]:
            op = r["collective"]
            key = (op, r["size_bytes"])
            if key not in best:
                continue
            a = r["out_of_place"]["time_us"]
            b, algo = best[key]
            ok = a / b <= 1.10 or (r["size_bytes"] < 4096 and a - b <= 1.0)
            total += 1
            within += ok
            print(f"{op} {r['size_bytes']} B: auto {a:.2f} us ({r['algorithm']}), best "
                  f"{b:.2f} us ({algo}), {a / b:.2f}x{'' if ok else '  <- off'}")
    if total == 0:
        sys.exit("no (collective, size) is in both files")
    print(f"auto within 1.10x of the best fixed algorithm (or 1 us below 4 KiB): "
          f"{within}/{total}")


if __name__ == "__main__":
    main()
