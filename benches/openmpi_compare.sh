#!/usr/bin/env bash
# All-reduce (float, sum) with Debian's Open MPI and with collbench, side by side in one run:
# same rank count, sizes, iterations and warm-up; both on this host over shared memory.
# Prints both time and busbw columns and strata/Open MPI ratios.
#   NP=2 MIN=8 MAX=64M ITERS=100 WARMUP=20 bash benches/openmpi_compare.sh
set -euo pipefail
cd "$(dirname "$0")/.."
NP=${NP:-2}; MIN=${MIN:-8}; MAX=${MAX:-64M}; ITERS=${ITERS:-100}; WARMUP=${WARMUP:-20}
bytes() { python3 -c "import sys; s=sys.argv[1].upper(); m={'K':1<<10,'M':1<<20,'G':1<<30}; print(int(s[:-1])*m[s[-1]] if s[-1] in m else int(s))" "$1"; }
if ! command -v mpicc >/dev/null; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && apt-get install -y -qq openmpi-bin libopenmpi-dev >/dev/null
  else
    echo "need mpicc: apt-get install openmpi-bin libopenmpi-dev" >&2; exit 1
  fi
fi
mkdir -p target/compare
mpicc -O2 -o target/compare/mpi_allreduce benches/mpi_allreduce.c
cargo build --release --bin collbench -q
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpirun --oversubscribe -np "$NP" --mca oob_tcp_if_include lo --mca btl_tcp_if_include lo \
  target/compare/mpi_allreduce "$(bytes "$MIN")" "$(bytes "$MAX")" "$ITERS" "$WARMUP" > target/compare/ompi.txt
# Let Open MPI's daemons finish exiting: on two cores they would take one from a rank.
sleep 2
STRATA_SOCKET_IFNAME="=lo" target/release/collbench --np "$NP" -b "$MIN" -e "$MAX" -n "$ITERS" -w "$WARMUP" -c 1 \
  -J target/compare/strata.json > target/compare/strata.txt
python3 - "$NP" <<'PY'
import json, sys
ompi = {int(l.split()[0]): (float(l.split()[1]), float(l.split()[2])) for l in open("target/compare/ompi.txt") if l.strip()}
rows = json.load(open("target/compare/strata.json"))["rows"]
print(f"# all_reduce float sum, {sys.argv[1]} ranks, one host (Open MPI: MPI_Allreduce; strata: collbench out-of-place)")
print(f"{'size(B)':>10} {'ompi us':>10} {'strata us':>10} {'ompi busbw':>11} {'strata busbw':>13} {'busbw ratio':>12}")
for r in rows:
    s = r["size_bytes"]
    if s not in ompi: continue
    ot, ob = ompi[s]; st, sb = r["out_of_place"]["time_us"], r["out_of_place"]["busbw_gbs"]
    ratio = sb / ob if ob > 0 else float("nan")
    print(f"{s:>10} {ot:>10.2f} {st:>10.2f} {ob:>11.3f} {sb:>13.3f} {ratio:>12.2f}")
PY
