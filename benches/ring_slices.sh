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
python3 benches/settings_medians.py "$out" "$ROUNDS" "ring forced; STRATA_RING_PIPELINE bytes" $SETTINGS
