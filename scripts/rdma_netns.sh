#!/usr/bin/env bash
# strata's RDMA protocol over libfabric's tcp provider against strata's own TCP transport, on
# the same emulated hosts.
#
#   sudo scripts/rdma_netns.sh [--rounds N] [--hosts N] [--sizes "1M 16M 64M"]
#
# Builds N hosts (default 4) as network namespaces (st-r0 …, 198.18.3.1-N/24) on one bridge in a
# switch namespace (st-rsw), with no shaping, so the figures are what the CPUs and the kernel's
# TCP can move. Runs collbench all-reduce (f32 sum, out of place) with one rank per host, the
# two transports interleaved (tcp, ofi, tcp, ofi, ...) for N rounds, and prints each size's
# median busbw of each and their ratio. Everything it creates is removed on exit, failure or
# interrupt; every run is under `timeout`.
set -euo pipefail

ROUNDS=3
HOSTS=4
SIZES="1M 16M 64M"
while [ $# -gt 0 ]; do
    case "$1" in
        --rounds) ROUNDS="$2"; shift ;;
        --hosts) HOSTS="$2"; shift ;;
        --sizes) SIZES="$2"; shift ;;
        *) echo "usage: $0 [--rounds N] [--hosts N] [--sizes \"1M 16M 64M\"]" >&2; exit 2 ;;
    esac
    shift
done

cd "$(dirname "$0")/.."
ROOT=$PWD
# shellcheck source=scripts/netns-lib.sh
source scripts/netns-lib.sh
SW=st-rsw
WORK=$(mktemp -d)

if [ "$(id -u)" != 0 ]; then
    echo "rdma_netns.sh: needs root (network namespaces)" >&2
    exit 1
fi
cleanup() {
    del_star st-r "$SW" "$HOSTS"
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

cargo build --release --bin collbench -q
BIN=$ROOT/target/release/collbench

cleanup
mkdir -p "$WORK"
add_star st-r "$SW" "$HOSTS" 198.18.3.

PORT=29900
# run TRANSPORT SIZE: prints the out-of-place busbw (GB/s) of one run.
run() {
    local transport=$1 size=$2 pids=() r
    PORT=$((PORT + 2))
    for r in $(seq 0 $((HOSTS - 1))); do
        ip netns exec "st-r$r" timeout 300 env RANK="$r" WORLD_SIZE="$HOSTS" \
            MASTER_ADDR=198.18.3.1 MASTER_PORT="$PORT" STRATA_SOCKET_IFNAME=eth0 \
            STRATA_TRANSPORT="$transport" STRATA_OFI_PROVIDER=tcp \
            "$BIN" --op all_reduce -b "$size" -e "$size" -n 10 -w 3 --no-in-place \
            >"$WORK/out$r" 2>"$WORK/err$r" &
        pids+=($!)
    done
    for p in "${pids[@]}"; do
        if ! wait "$p"; then
            echo "rdma_netns.sh: a $transport rank failed at $size:" >&2
            cat "$WORK"/err* >&2
            exit 1
        fi
    done
    awk '/^ +[0-9]/ { print $8 }' "$WORK/out0"
}

median() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

echo "# all-reduce f32 sum, $HOSTS emulated hosts (one rank each), veth + bridge, no shaping"
echo "# busbw GB/s, median of $ROUNDS interleaved rounds (tcp, ofi, tcp, ofi, ...)"
printf "%10s %12s %12s %10s\n" size tcp ofi+tcp ofi/tcp
for size in $SIZES; do
    : >"$WORK/tcp"
    : >"$WORK/ofi"
    for _ in $(seq 1 "$ROUNDS"); do
        run tcp "$size" >>"$WORK/tcp"
        run ofi "$size" >>"$WORK/ofi"
    done
    t=$(median <"$WORK/tcp")
    o=$(median <"$WORK/ofi")
    printf "%10s %12s %12s %10s   (tcp: %s; ofi: %s)\n" "$size" "$t" "$o" \
        "$(awk -v a="$o" -v b="$t" 'BEGIN { printf "%.2f", a / b }')" \
        "$(paste -sd' ' "$WORK/tcp")" "$(paste -sd' ' "$WORK/ofi")"
done
