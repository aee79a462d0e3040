#!/usr/bin/env bash
# A rank slowed to half speed mid-run, named by collbench; or a clean run that names no one.
#
#   sudo scripts/stragglers_netns.sh [--size BYTES] [--iters N] [--after S]
#                                    [--stop MS --period MS] [--clean]
#
# Builds 2 hosts as network namespaces (st-s0, st-s1: 198.18.5.1-2/24) on one bridge in a
# switch namespace (st-ssw) and runs collbench on them, 4 ranks per host (8 in all; the ranks
# of a host share memory, the hosts talk TCP). After --after seconds (default 5) it stops rank
# 5 for --stop ms of every --period ms (default 100 of 200; SIGSTOP/SIGCONT: half speed)
# until the run ends, and prints
# when the first rank named it (from the `warn` lines, NCCL_DEBUG=WARN) against the moment
# the throttle began, and collbench's `# Stragglers:` line. --clean runs the same job with no
# throttle: the line must say `none`. Exits non-zero when the wrong rank, or no rank, is
# named. Everything it creates is removed on exit, failure or interrupt; every rank runs
# under `timeout`.
set -euo pipefail

SIZE=1M
ITERS=12000
AFTER=5
CLEAN=0
STOP_MS=100
PERIOD_MS=200
while [ $# -gt 0 ]; do
    case "$1" in
        --size) SIZE="$2"; shift ;;
        --iters) ITERS="$2"; shift ;;
        --after) AFTER="$2"; shift ;;
        --stop) STOP_MS="$2"; shift ;;
        --period) PERIOD_MS="$2"; shift ;;
        --clean) CLEAN=1 ;;
        *) echo "usage: $0 [--size BYTES] [--iters N] [--after S] [--stop MS --period MS] [--clean]" >&2; exit 2 ;;
    esac
    shift
done

cd "$(dirname "$0")/.."
ROOT=$PWD
# shellcheck source=scripts/netns-lib.sh
source scripts/netns-lib.sh
HOSTS=2
PER_HOST=4
N=$((HOSTS * PER_HOST))
VICTIM=5
SW=st-ssw
PIDS=()
THROTTLE=
WORK=$(mktemp -d)

if [ "$(id -u)" != 0 ]; then
    echo "stragglers_netns.sh: needs root (network namespaces)" >&2
    exit 1
fi

PORT=$((29800 + $$ % 100 * 2))

# The collbench processes of this job (under the namespace and timeout wrappers), found by
# their environment; with an argument (`RANK=5`), only those that also have it.
job_ranks() {
    local p
    for p in $(pgrep -x collbench); do
        tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "MASTER_PORT=$PORT" || continue
        [ $# -eq 0 ] || tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "$1" || continue
        echo "$p"
    done
}

cleanup() {
    [ -n "$THROTTLE" ] && kill "$THROTTLE" 2>/dev/null || true
    [ -n "${victim:-}" ] && kill -CONT "$victim" 2>/dev/null || true
    for p in "${PIDS[@]}" $(job_ranks); do kill -9 "$p" 2>/dev/null || true; done
    del_star st-s "$SW" "$HOSTS"
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

cargo build --release --bin collbench -q
BIN=$ROOT/target/release/collbench

del_star st-s "$SW" "$HOSTS"
add_star st-s "$SW" "$HOSTS" 198.18.5.

for r in $(seq 0 $((N - 1))); do
    h=$((r / PER_HOST))
    ip netns exec "st-s$h" unshare --uts sh -c 'hostname "$0"; exec "$@"' "st-s$h" \
        timeout 600 env RANK="$r" LOCAL_RANK=$((r % PER_HOST)) WORLD_SIZE="$N" \
        MASTER_ADDR=198.18.5.1 MASTER_PORT="$PORT" STRATA_SOCKET_IFNAME=eth0 \
        NCCL_DEBUG=WARN \
        "$BIN" --op all_reduce -b "$SIZE" -e "$SIZE" -n "$ITERS" -w 5 --no-in-place \
        >"$WORK/out$r" 2>"$WORK/err$r" &
    PIDS+=($!)
done

now() { date +%s.%N; }
start=$(now)
began=
if [ "$CLEAN" = 0 ]; then
    sleep "$AFTER"
    victim=$(job_ranks "RANK=$VICTIM")
    [ -n "$victim" ] || { echo "rank $VICTIM is not running" >&2; tail -n 3 "$WORK"/err* "$WORK"/out* >&2; exit 1; }
    began=$(now)
    (
        stopped=$(awk -v ms="$STOP_MS" 'BEGIN { printf "%.3f", ms / 1000 }')
        running=$(awk -v ms="$((PERIOD_MS - STOP_MS))" 'BEGIN { printf "%.3f", ms / 1000 }')
        while kill -STOP "$victim" 2>/dev/null; do
            sleep "$stopped"
            kill -CONT "$victim" 2>/dev/null || break
            sleep "$running"
        done
    ) &
    THROTTLE=$!
fi
for p in "${PIDS[@]}"; do
    # The throttle's last stop must not outlive it: wait with it running.
    while kill -0 "$p" 2>/dev/null; do sleep 0.2; done
done
if [ -n "$THROTTLE" ]; then
    kill "$THROTTLE" 2>/dev/null || true
    kill -CONT "$victim" 2>/dev/null || true
fi
took=$(echo "$(now) $start" | awk '{printf "%.0f", $1 - $2}')

line=$(grep -h "# Stragglers:" "$WORK/out0" || true)
if [ -z "$line" ]; then
    echo "collbench printed no straggler line; rank 0 said:" >&2
    cat "$WORK/out0" "$WORK/err0" >&2
    exit 1
fi
grep -E "^#? *[0-9]+ " "$WORK/out0" | tail -2
echo "$line"
first=$({ grep -h "is a straggler" "$WORK"/err* || true; } | sed -E 's/\x1b\[[0-9;]*m//g' | awk '{print $1}' | sort | head -1)
if [ "$CLEAN" = 1 ]; then
    echo "clean run of $N ranks on $HOSTS hosts: ${took} s"
    if [ "$line" != "# Stragglers: none" ] || [ -n "$first" ]; then
        echo "a clean run named someone" >&2
        grep -h "straggler" "$WORK"/err* >&2 || true
        exit 1
    fi
    exit 0
fi
if [ -z "$first" ]; then
    echo "no rank named rank $VICTIM" >&2
    exit 1
fi
named_at=$(date -d "$first" +%s.%N)
after=$(echo "$named_at $began" | awk '{printf "%.1f", $1 - $2}')
echo "rank $VICTIM stopped $STOP_MS ms of every $PERIOD_MS ms from +${AFTER} s; first named ${after} s later (run of ${took} s)"
grep -h "is a straggler" "$WORK"/err* | sed -E 's/\x1b\[[0-9;]*m//g' | head -3
case "$line" in
    "# Stragglers: rank $VICTIM ("*) ;;
    *) echo "collbench named someone else: $line" >&2; exit 1 ;;
esac
if echo "$line" | grep -q "; rank [0-9]"; then
    echo "collbench named more than rank $VICTIM: $line" >&2
    exit 1
fi
