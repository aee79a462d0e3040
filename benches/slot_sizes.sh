#!/usr/bin/env bash
# Shared-memory slot size, slot count and pipeline chunk against all-reduce time: collbench
# at 2 ranks for each setting in turn, ROUNDS rounds (the settings interleaved), medians.
# This is how the defaults (STRATA_SHM_SLOT_SIZE, STRATA_SHM_SLOTS, STRATA_CHUNK_SIZE) are
# chosen; run it on the machine you care about.
#   NP=2 ROUNDS=3 bash benches/slot_sizes.sh
set -euo pipefail
cd "$(dirname "$0")/.."
NP=${NP:-2}; ROUNDS=${ROUNDS:-3}
# slot_size:slots:chunk
SETTINGS=${SETTINGS:-"8192:128:524288 16384:64:524288 32768:32:524288 65536:16:524288 65536:32:524288 131072:16:524288 32768:32:131072 32768:32:2097152"}
cargo build --release --bin collbench -q
out=target/slot_sizes
mkdir -p "$out"
rm -f "$out"/*.json
for round in $(seq 1 "$ROUNDS"); do
  for s in $SETTINGS; do
    IFS=: read -r size slots chunk <<< "$s"
    STRATA_SHM_SLOT_SIZE=$size STRATA_SHM_SLOTS=$slots STRATA_CHUNK_SIZE=$chunk STRATA_SOCKET_IFNAME="=lo" \
      target/release/collbench --np "$NP" -b 64K -e 64M -f 4 -n 20 -w 5 -c 0 --no-in-place \
      -J "$out/$s-$round.json" > /dev/null
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
print(f"# all_reduce float sum, time (us), median of {rounds} interleaved rounds; setting = slot bytes:slots:chunk bytes")
print(f"{'setting':>24}" + "".join(f"{s:>12}" for s in sizes))
for s in settings:
    print(f"{s:>24}" + "".join(f"{statistics.median(table[s][z]):>12.1f}" for z in sizes))
PY
