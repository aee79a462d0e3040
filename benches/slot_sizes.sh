#!/usr/bin/env bash
# Shared-memory slot size, slot count and pipeline chunk against all-reduce time: collbench
# at 2 ranks for each setting in turn, ROUNDS rounds (the settings interleaved), medians.
# This is how the defaults (STRATA_SHM_SLOT_SIZE, STRATA_SHM_SLOTS, STRATA_CHUNK_SIZE) are
# chosen; run it on the machine you care about.
# Every row is timed after the rings' first lap (collbench's warm-up), as a training loop runs.
#   NP=2 ROUNDS=3 bash benches/slot_sizes.sh
#   NP=2 ROUNDS=5 MIN=64 MAX=16M FACTOR=8 SETTINGS="8192:128:524288 8192:256:524288" bash benches/slot_sizes.sh
set -euo pipefail
cd "$(dirname "$0")/.."
NP=${NP:-2}; ROUNDS=${ROUNDS:-3}; MIN=${MIN:-64K}; MAX=${MAX:-64M}; FACTOR=${FACTOR:-4}
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
      target/release/collbench --np "$NP" -b "$MIN" -e "$MAX" -f "$FACTOR" -n 20 -w 5 -c 0 --no-in-place \
      -J "$out/$s-$round.json" > /dev/null
  done
  echo "round $round of $ROUNDS done" >&2
done
python3 benches/settings_medians.py "$out" "$ROUNDS" "slot bytes:slots:chunk bytes" $SETTINGS
