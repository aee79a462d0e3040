#!/usr/bin/env bash
# One emulated host cut off from the network in the middle of all-reduces.
#
#   sudo scripts/faults_netns.sh [--trials N] [--transport tcp|ofi]
#
# Builds 4 hosts as network namespaces (st-f0 … st-f3, 198.18.1.1-4/24) on one bridge in a
# switch namespace (st-fsw), runs collbench on them (one rank per host, small all-reduces in a
# loop), and after 2 s takes host 2's link down: its TCP connections neither close nor reset,
# so only the watchdog's missed heartbeats can tell. Each survivor must exit with an error
# naming rank 2 within a deadline; the script prints how long each took (from the cut to the
# rank's exit) and the median and maximum over all trials. Everything it creates is removed
# on exit, failure or interrupt; every rank runs under `timeout`. --transport ofi runs the ranks
# over libfabric's tcp provider (the RDMA protocol) instead of strata's TCP transport.
set -euo pipefail

TRIALS=3
TRANSPORT=tcp
while [ $# -gt 0 ]; do
    case "$1" in
        --trials) TRIALS="$2"; shift ;;
        --transport) TRANSPORT="$2"; shift ;;
        *) echo "usage: $0 [--trials N] [--transport tcp|ofi]" >&2; exit 2 ;;
    esac
    shift
done

cd "$(dirname "$0")/.."
ROOT=$PWD
# shellcheck source=scripts/netns-lib.sh
source scripts/netns-lib.sh
HOSTS=4
VICTIM=2
SW=st-fsw
PIDS=()
WORK=$(mktemp -d)

if [ "$(id -u)" != 0 ]; then
    echo "faults_netns.sh: needs root (network namespaces)" >&2
    exit 1
fi

cleanup() {
    for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
    del_star st-f "$SW" "$HOSTS"
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

cargo build --release --bin collbench -q
BIN=$ROOT/target/release/collbench

build_fabric() {
    cleanup_fabric
    add_star st-f "$SW" "$HOSTS" 198.18.1.
}
cleanup_fabric() {
    del_star st-f "$SW" "$HOSTS"
}

now() { date +%s.%N; }

ALL=()
PORT=29700
for t in $(seq 1 "$TRIALS"); do
    build_fabric
    PORT=$((PORT + 2))
    pids=()
    for r in $(seq 0 $((HOSTS - 1))); do
        # Each rank gets its own host name (a private UTS namespace), as on real hosts.
        ip netns exec "st-f$r" unshare --uts sh -c 'hostname "$0"; exec "$@"' "st-f$r" \
            timeout 60 env RANK="$r" WORLD_SIZE="$HOSTS" \
            MASTER_ADDR=198.18.1.1 MASTER_PORT="$PORT" STRATA_SOCKET_IFNAME="^lo" \
            STRATA_TRANSPORT="$TRANSPORT" STRATA_OFI_PROVIDER=tcp STRATA_INIT_TIMEOUT=30 \
            "$BIN" --op all_reduce -b 4K -e 4K -n 100000000 -w 0 --no-in-place \
            >"$WORK/out$r" 2>"$WORK/err$r" &
        pids+=($!)
        PIDS+=($!)
    done
    sleep 2
    for r in $(seq 0 $((HOSTS - 1))); do
        if ! kill -0 "${pids[$r]}" 2>/dev/null; then
            echo "trial $t: rank $r exited before the cut:" >&2
            cat "$WORK/err$r" >&2
            exit 1
        fi
    done
    cut_at=$(now)
    ip -n "st-f$VICTIM" link set eth0 down
    declare -A exited=()
    deadline=$(( $(date +%s) + 30 ))
    while [ "${#exited[@]}" -lt $((HOSTS - 1)) ] && [ "$(date +%s)" -lt "$deadline" ]; do
        for r in $(seq 0 $((HOSTS - 1))); do
            [ "$r" = "$VICTIM" ] && continue
            if [ -z "${exited[$r]:-}" ] && ! kill -0 "${pids[$r]}" 2>/dev/null; then
                exited[$r]=$(now)
            fi
        done
        sleep 0.02
    done
    kill -9 "${pids[$VICTIM]}" 2>/dev/null || true
    line="trial $t:"
    for r in $(seq 0 $((HOSTS - 1))); do
        [ "$r" = "$VICTIM" ] && continue
        if [ -z "${exited[$r]:-}" ]; then
            echo "trial $t: rank $r did not notice the cut within 30 s" >&2
            exit 1
        fi
        if ! grep -q "rank $VICTIM (host st-f$VICTIM" "$WORK/err$r"; then
            echo "trial $t: rank $r did not name rank $VICTIM:" >&2
            cat "$WORK/err$r" >&2
            exit 1
        fi
        ms=$(echo "${exited[$r]} $cut_at" | awk '{printf "%.0f", ($1 - $2) * 1000}')
        ALL+=("$ms")
        line="$line rank $r ${ms} ms;"
    done
    for p in "${pids[@]}"; do { wait "$p"; } 2>/dev/null || true; done
    echo "$line"
    [ "$t" = 1 ] && echo "  rank 0 said: $(grep -m1 "collbench: rank" "$WORK/err0" || true)"
    unset exited
done
printf '%s\n' "${ALL[@]}" | sort -n | awk -v trials="$TRIALS" '
    { v[NR] = $1 } END {
        printf "'"$TRANSPORT"': host %d cut off: every survivor exited naming it; cut to exit median %d ms, max %d ms (%d trials, %d survivors)\n",
            '"$VICTIM"', v[int((NR + 1) / 2)], v[NR], trials, NR }'
