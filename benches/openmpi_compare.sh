#!/usr/bin/env bash
# All-reduce (float, sum) with Debian's Open MPI and with collbench, side by side: same rank
# count, sizes, iterations and warm-up, both on this host over shared memory. The two run in
# turn for ROUNDS rounds (Open MPI, strata, Open MPI, strata, ...) so that a slow spell of this
# shared machine lands on both; each column is the median over the rounds. Prints time and
# busbw for each and the strata/Open MPI ratios, and writes the medians as collbench JSON
# (target/compare/median-{strata,ompi}.json) for `collbench plot`.
#   NP=2 MIN=8 MAX=64M ITERS=100 WARMUP=20 ROUNDS=3 bash benches/openmpi_compare.sh
set -euo pipefail
cd "$(dirname "$0")/.."
NP=${NP:-2}; MIN=${MIN:-8}; MAX=${MAX:-64M}; ITERS=${ITERS:-100}; WARMUP=${WARMUP:-20}
ROUNDS=${ROUNDS:-3}
bytes() { python3 -c "import sys; s=sys.argv[1].upper(); m={'K':1<<10,'M':1<<20,'G':1<<30}; print(int(s[:-1])*m[s[-1]] if s[-1] in m else int(s))" "$1"; }
if ! command -v mpicc >/dev/null; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && apt-get install -y -qq openmpi-bin libopenmpi-dev >/dev/null
  else
    echo "need mpicc: apt-get install openmpi-bin libopenmpi-dev" >&2; exit 1
  fi
fi
out=target/compare
mkdir -p "$out"
rm -f "$out"/ompi-*.txt "$out"/strata-*.json
mpicc -O2 -o "$out/mpi_allreduce" benches/mpi_allreduce.c
cargo build --release --bin collbench -q
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
for round in $(seq 1 "$ROUNDS"); do
  mpirun --oversubscribe -np "$NP" --mca oob_tcp_if_include lo --mca btl_tcp_if_include lo \
    "$out/mpi_allreduce" "$(bytes "$MIN")" "$(bytes "$MAX")" "$ITERS" "$WARMUP" > "$out/ompi-$round.txt"
  # Let Open MPI's daemons finish exiting: on two cores they would take one from a rank.
  sleep 2
  STRATA_SOCKET_IFNAME="=lo" target/release/collbench --np "$NP" -b "$MIN" -e "$MAX" -n "$ITERS" \
    -w "$WARMUP" -c 1 -J "$out/strata-$round.json" > /dev/null
  echo "round $round of $ROUNDS done" >&2
done
python3 - "$NP" "$ROUNDS" "$ITERS" "$WARMUP" "$out" <<'PY'
import json, statistics, sys
np_, rounds, iters, warmup, out = sys.argv[1:]
med = statistics.median
ompi, strata = {}, {}
for r in range(1, int(rounds) + 1):
    for line in open(f"{out}/ompi-{r}.txt"):
        if line.strip():
            s, t, b = line.split()
            ompi.setdefault(int(s), []).append((float(t), float(b)))
    for row in json.load(open(f"{out}/strata-{r}.json"))["rows"]:
        o = row["out_of_place"]
        strata.setdefault(row["size_bytes"], []).append((o["time_us"], o["busbw_gbs"]))
print(f"# all_reduce float sum, {np_} ranks, one host; medians of {rounds} interleaved rounds "
      f"({iters} iterations, {warmup} warm-up each)")
print("# Open MPI: MPI_Allreduce; strata: collbench out-of-place")
print(f"{'size(B)':>10} {'ompi us':>10} {'strata us':>10} {'ompi busbw':>11} {'strata busbw':>13} "
      f"{'busbw ratio':>12} {'time ratio':>11}")
worst = None
series = {"ompi": [], "strata": []}
for s in sorted(strata):
    if s not in ompi:
        continue
    ot, ob = med(x[0] for x in ompi[s]), med(x[1] for x in ompi[s])
    st, sb = med(x[0] for x in strata[s]), med(x[1] for x in strata[s])
    ratio = sb / ob if ob > 0 else float("nan")
    print(f"{s:>10} {ot:>10.2f} {st:>10.2f} {ob:>11.3f} {sb:>13.3f} {ratio:>12.2f} {ot / st:>11.2f}")
    worst = ratio if worst is None or ratio < worst else worst
    series["ompi"].append((s, ot, ob))
    series["strata"].append((s, st, sb))
print(f"# lowest strata/Open MPI busbw ratio: {worst:.2f}")
for name, label in (("ompi", "Open MPI MPI_Allreduce"), ("strata", "strata")):
    rows = [{"size_bytes": s, "out_of_place": {"time_us": t, "busbw_gbs": b}} for s, t, b in series[name]]
    json.dump({"label": f"{label}, {np_} ranks (median of {rounds})", "collective": "all_reduce",
               "ranks": int(np_), "rows": rows}, open(f"{out}/median-{name}.json", "w"), indent=1)
PY
