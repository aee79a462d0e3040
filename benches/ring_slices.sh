#!/usr/bin/env bash
# Sliced ring all-reduce: bytes a host's ranks keep in flight (STRATA_RING_PIPELINE; 0 = the ring
# block by block) against all-reduce time, collbench with the ring forced, each setting in
# turn for ROUNDS rounds (interleaved), medians. This is how the default was chosen; run it on
# the machine you care about.
#   NP=2 ROUNDS=5 bash benches/ring_slices.sh
set -euo pipefail
cd "$(dirname "$0")/.."
NP=${NP:-2}; ROUNDS=${ROUNDS:-5}
SETTINGS=${SETTINGS:-"0 2097152 4194304 8388608"}
cargo build --release --bin collbench -q
out=target/ring_slices
mkdir -p "$out"
rm -f "$out"/*.json
for round in $(seq 1 "$ROUNDS"); do
  for s in $SETTINGS; do
    STRATA_RING_PIPELINE=$s STRATA_SOCKET_IFNAME="=lo" \
      target/release/collbench --np "$NP" -b 256K -e 64M -f 2 -n 20 -w 5 -c 0 --no-in-place \
      -A ring -J "$out/$s-$round.json" > /dev/null
  done
  echo "round $round of $ROUNDS done" >&2
done
python3 - "$out" "$ROUNDS" $SETTINGS <<'PY'
import json, statistics, sys
out, rounds, settings = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
table = {}
for s in settings:
    for r in range(1, rounds + 1):
        for row in json.load(open(f"{out}/{s}-{r}.json"))["rows"]:
            table.setdefault(s, {}).setdefault(row["size_bytes"], []).append(row["out_of_place"]["time_us"])
sizes = sorted(next(iter(table.values())))
print(f"# ring all_reduce float sum, time (us), median of {rounds} interleaved rounds; setting = STRATA_RING_PIPELINE bytes")
print(f"{'setting':>10}" + "".join(f"{s:>12}" for s in sizes))
for s in settings:
    print(f"{s:>10}" + "".join(f"{statistics.median(table[s][z]):>12.1f}" for z in sizes))
PY
