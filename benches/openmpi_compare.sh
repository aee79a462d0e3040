#!/usr/bin/env bash
# All-reduce (float, sum) with Debian's Open MPI and with collbench, side by side: same rank
# count, sizes, iterations and warm-up, both on this host over shared memory. The two run in
# turn for ROUNDS rounds (Open MPI, strata, Open MPI, strata, ...) so that a slow spell of this
# shared machine lands on both; each column is the median over the rounds. Prints time and
# busbw for each and the strata/Open MPI ratios, and writes the medians as collbench JSON
# (target/compare/median-{strata,ompi}.json) for `collbench plot`.
#
# Each round also times benches/pingpong.c before and after its two runs: the time for a cache
# line to cross between cores 0 and 1 with no library around it. On a shared VM that floor
# moves between states within seconds (about 30, 65 and 265 ns per exchange on the 2-core EPYC
# guest this was written on), and small messages move with it, so each round's ratio is also
# printed beside its floor, with the median ratio over the rounds of each steady floor.
#   NP=2 MIN=8 MAX=64M ITERS=100 WARMUP=20 ROUNDS=3 [COLLBENCH=path] bash benches/openmpi_compare.sh
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
rm -f "$out"/ompi-*.txt "$out"/strata-*.json "$out"/floor-*.txt
mpicc -O2 -o "$out/mpi_allreduce" benches/mpi_allreduce.c
cc -O2 -o "$out/pingpong" benches/pingpong.c
floor() { "$out/pingpong" 300000 | awk '/ns per exchange/{print $1}'; }
# COLLBENCH names another build to compare (one built from another commit, say).
if [ -z "${COLLBENCH:-}" ]; then
  cargo build --release --bin collbench -q
  COLLBENCH=target/release/collbench
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
for round in $(seq 1 "$ROUNDS"); do
  floor > "$out/floor-$round.txt"
  mpirun --oversubscribe -np "$NP" --mca oob_tcp_if_include lo --mca btl_tcp_if_include lo \
    "$out/mpi_allreduce" "$(bytes "$MIN")" "$(bytes "$MAX")" "$ITERS" "$WARMUP" > "$out/ompi-$round.txt"
  # Let Open MPI's daemons finish exiting: on two cores they would take one from a rank.
  sleep 2
  STRATA_SOCKET_IFNAME="=lo" "$COLLBENCH" --np "$NP" -b "$MIN" -e "$MAX" -n "$ITERS" \
    -w "$WARMUP" -c 1 -J "$out/strata-$round.json" > /dev/null
  floor >> "$out/floor-$round.txt"
  echo "round $round of $ROUNDS done" >&2
done
python3 - "$NP" "$ROUNDS" "$ITERS" "$WARMUP" "$out" <<'PY'
import json, math, statistics, sys
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

# The same, round by round, beside each round's cross-core floor (pingpong before and after).
floors = []
for r in range(1, int(rounds) + 1):
    try:
        vals = [float(x) for x in open(f"{out}/floor-{r}.txt").read().split()]
    except (OSError, ValueError):
        vals = []
    floors.append(vals)
known = [min(v) for v in floors if len(v) == 2]
if not known:
    print("# cross-core floor: not measured (pingpong needs cores 0 and 1)")
else:
    low = min(known)
    def state(v):
        # A round whose floor moved by more than a quarter between its ends straddles states;
        # a steady one is named by its floor, to the nearest power of two above the lowest.
        if len(v) != 2 or max(v) > 1.25 * min(v):
            return None
        return round(math.log2(max(v) / low))
    states = [state(v) for v in floors]
    sizes = [s for s in sorted(strata) if s in ompi]
    print("# per round: cross-core floor in ns (before, after) and Open MPI/strata time ratio "
          "(above 1: strata faster)")
    print(f"{'round':>5} {'floor ns':>13} " + " ".join(f"{s:>8}" for s in sizes))
    per_round = []
    for r, v in enumerate(floors):
        ratios = [ompi[s][r][0] / strata[s][r][0] if strata[s][r][0] > 0 else float("nan")
                  for s in sizes]
        per_round.append(ratios)
        fl = "/".join(f"{x:.0f}" for x in v) or "-"
        print(f"{r + 1:>5} {fl:>13} " + " ".join(f"{x:>8.2f}" for x in ratios))
    for group in sorted({g for g in states if g is not None}):
        rs = [r for r, g in enumerate(states) if g == group]
        fl = med(x for r in rs for x in floors[r])
        meds = [med(per_round[r][i] for r in rs) for i in range(len(sizes))]
        print(f"# {len(rs)} round(s) with a steady floor near {fl:.0f} ns, median ratio: "
              + ", ".join(f"{s} B {m:.2f}" for s, m in zip(sizes, meds)))
    moved = states.count(None)
    if moved:
        print(f"# {moved} round(s) whose floor moved by more than a quarter are in no group")
PY
