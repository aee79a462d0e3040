#!/usr/bin/env bash
# `collbench status` from another host: how soon it names a rank stopped inside an all-reduce,
# and the call the others wait in.
#
#   sudo scripts/status_netns.sh [--trials N] [--size BYTES]
#
# Builds 3 hosts as network namespaces (su-s0, su-s1, su-s2: 198.18.6.1-3/24) on one bridge
# in a switch namespace (su-ssw). A 4-rank job runs on su-s0 and su-s1, 2 ranks each, joined
# from the launcher's variables (RANK, WORLD_SIZE, MASTER_ADDR=198.18.6.1, MASTER_PORT), so
# rank 0 keeps the root and the job's secret derives from them, as for the client. Per trial:
# once the job answers, rank 2 (on su-s1) is stopped (SIGSTOP) and su-s2, a host outside the
# job, runs `collbench status --json` with the same variables every 0.1 s until a view names
# rank 2 as holding the job up in an all_reduce; it prints the seconds from the stop to that
# view. Default watchdog settings: the job ends itself 3 s after the stop, so a view must
# name the rank before that. Exits non-zero when a trial names no one in 2.5 s, or names
# someone else. Everything it creates is removed on exit; every rank runs under `timeout`.
set -euo pipefail

TRIALS=10
SIZE=64K
while [ $# -gt 0 ]; do
    case "$1" in
        --trials) TRIALS="$2"; shift ;;
        --size) SIZE="$2"; shift ;;
        *) echo "usage: $0 [--trials N] [--size BYTES]" >&2; exit 2 ;;
    esac
    shift
done

cd "$(dirname "$0")/.."
ROOT=$PWD
# shellcheck source=scripts/netns-lib.sh
source scripts/netns-lib.sh
HOSTS=3
N=4
VICTIM=2
SW=su-ssw
PIDS=()
WORK=$(mktemp -d)
PORT=$((29900 + $$ % 50 * 2))

if [ "$(id -u)" != 0 ]; then
    echo "status_netns.sh: needs root (network namespaces)" >&2
    exit 1
fi

cleanup() {
    for p in "${PIDS[@]}"; do kill -CONT "$p" 2>/dev/null || true; kill -9 "$p" 2>/dev/null || true; done
    for p in $(pgrep -x collbench); do
        tr '\0' '\n' 2>/dev/null <"/proc/$p/environ" | grep -qx "MASTER_PORT=$PORT" && kill -9 "$p" 2>/dev/null || true
    done
    del_star su-s "$SW" "$HOSTS"
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

cargo build --release --bin collbench -q
BIN=$ROOT/target/release/collbench

del_star su-s "$SW" "$HOSTS"
add_star su-s "$SW" "$HOSTS" 198.18.6.

on_host() {
    local h=$1
    shift
    ip netns exec "su-s$h" unshare --uts sh -c 'hostname "$0"; exec "$@"' "su-s$h" "$@"
}

# The view from the outside host, as JSON (nothing when it could not be asked).
ask() {
    on_host 2 env MASTER_ADDR=198.18.6.1 MASTER_PORT="$PORT" "$BIN" status --json --within 1 2>/dev/null || true
}

now() { date +%s.%N; }
times=()
for t in $(seq 1 "$TRIALS"); do
    PIDS=()
    for r in $(seq 0 $((N - 1))); do
        h=$((r / 2))
        on_host "$h" timeout 120 env RANK="$r" LOCAL_RANK=$((r % 2)) WORLD_SIZE="$N" \
            MASTER_ADDR=198.18.6.1 MASTER_PORT="$PORT" STRATA_SOCKET_IFNAME=eth0 \
            "$BIN" -b "$SIZE" -e "$SIZE" -n 100000000 -w 1 --no-in-place \
            >"$WORK/out$r" 2>"$WORK/err$r" &
        PIDS+=($!)
    done
    # Up when all four answer.
    up=0
    for _ in $(seq 1 100); do
        if ask | python3 -c 'import json,sys; v=json.load(sys.stdin); sys.exit(len(v["ranks"]) != 4)' 2>/dev/null; then
            up=1
            break
        fi
        sleep 0.2
    done
    [ "$up" = 1 ] || { echo "trial $t: the job never answered" >&2; tail -n 3 "$WORK"/err* >&2; exit 1; }
    sleep 1
    victim=
    for p in $(pgrep -x collbench); do
        env_of=$(tr '\0' '\n' 2>/dev/null <"/proc/$p/environ" || true)
        if echo "$env_of" | grep -qx "MASTER_PORT=$PORT" && echo "$env_of" | grep -qx "RANK=$VICTIM"; then
            victim=$p
        fi
    done
    [ -n "$victim" ] || { echo "trial $t: rank $VICTIM is not running" >&2; exit 1; }
    kill -STOP "$victim"
    stopped=$(now)
    named=
    while :; do
        view=$(ask)
        verdict=$(echo "$view" | python3 -c '
import json, sys
try:
    v = json.load(sys.stdin)
except ValueError:
    sys.exit(0)
for c in v["holding_up"]:
    if (c["call"] or "").startswith("all_reduce #"):
        print(c["rank"], c["call"], "| waited on by", c["waited_on_by"], "|", c["what"])
        break
')
        if [ -n "$verdict" ]; then
            named=$(now)
            break
        fi
        if awk -v a="$(now)" -v b="$stopped" 'BEGIN { exit !(a - b > 2.5) }'; then
            break
        fi
        sleep 0.1
    done
    kill -CONT "$victim" 2>/dev/null || true
    for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
    if [ -z "$named" ]; then
        echo "trial $t: no view named anyone within 2.5 s of the stop" >&2
        exit 1
    fi
    took=$(awk -v a="$named" -v b="$stopped" 'BEGIN { printf "%.2f", a - b }')
    echo "trial $t: named in ${took} s: rank $verdict"
    case "$verdict" in
        "$VICTIM "*) ;;
        *) echo "trial $t: named the wrong rank" >&2; exit 1 ;;
    esac
    times+=("$took")
    sleep 0.5
done
printf '%s\n' "${times[@]}" | sort -n | awk '{ a[NR] = $1 } END {
    printf "%d of %d trials named rank '"$VICTIM"' from another host; median %.2f s, worst %.2f s\n", NR, NR, a[int((NR + 1) / 2)], a[NR] }'
