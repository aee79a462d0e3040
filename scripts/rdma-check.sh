#!/usr/bin/env bash
# The RDMA checks for a machine that has RDMA hardware (InfiniBand or RoCE through rdma-core,
# and/or a hardware libfabric provider such as efa or cxi). CI has none and runs the same tests
# against the libibverbs stand-in and libfabric's tcp provider instead.
#
#   scripts/rdma-check.sh [--out DIR]
#
# 1. `collbench topo`: the devices and providers found and which one each local rank uses;
# 2. tests/rdma.rs with STRATA_RDMA_TESTS_REAL=1: the verbs matrices (every collective × type ×
#    reduction at 2, 3 and 4 processes) on rdma-core's own library and this machine's devices
#    (processes on one host connect through the NIC's loopback); the tests that inject faults
#    into the stand-in print that they skip;
# 3. collbench all-reduce sweeps, 8 B to 1 GiB, 2 ranks, over verbs and over libfabric (if a
#    hardware provider is there), and over strata's TCP for comparison, each as JSON in DIR.
#
# Between hosts, run collbench under your launcher with STRATA_TRANSPORT=verbs (or ofi), e.g.
#   srun -N2 --ntasks-per-node=8 env STRATA_TRANSPORT=verbs target/release/collbench -b 8 -e 1G
set -euo pipefail

OUT=""
while [ $# -gt 0 ]; do
    case "$1" in
        --out) OUT="$2"; shift ;;
        *) echo "usage: $0 [--out DIR]" >&2; exit 2 ;;
    esac
    shift
done
cd "$(dirname "$0")/.."
OUT=${OUT:-target/rdma-check}
mkdir -p "$OUT"

cargo build --release --bin collbench -q
BIN=target/release/collbench

echo "== what strata sees"
"$BIN" topo | sed -n '/^RDMA/,$p' | tee "$OUT/topo.txt"

echo "== tests/rdma.rs on this machine's devices"
STRATA_RDMA_TESTS_REAL=1 cargo test --release --test rdma -- --test-threads=1 --nocapture \
    2>&1 | tee "$OUT/tests.txt" | grep -E "^test |skipped:|test result"

sweep() {
    local transport=$1
    echo "== collbench all_reduce, 2 ranks, STRATA_TRANSPORT=$transport"
    STRATA_TRANSPORT=$transport timeout 900 "$BIN" --np 2 -b 8 -e 1G -f 4 -n 20 -w 5 \
        --json "$OUT/allreduce-$transport.json" | tee "$OUT/allreduce-$transport.txt"
}
if "$BIN" topo | grep -q "^  verbs .*active"; then
    sweep verbs
else
    echo "skipped: the verbs sweep (no active verbs port)"
fi
if "$BIN" topo | grep "^  ofi " | grep -vq "(software)"; then
    sweep ofi
else
    echo "skipped: the ofi sweep (no hardware libfabric provider)"
fi
sweep tcp
echo "results in $OUT"
