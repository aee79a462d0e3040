#!/usr/bin/env bash
# What `collbench status` asked once a second costs a healthy job: interleaved rounds of the
# same 4-rank all-reduce job, quiet and asked, and the median bus bandwidth of each.
#
#   scripts/status_cost.sh [--rounds N] [--np N] [--size BYTES] [--iters N] [--every S]
#
# Each round runs `collbench --np N -b SIZE -e SIZE -n ITERS` twice, in random order: once
# alone, once while `collbench status` asks it every --every seconds (default 1). The job's
# root is at STRATA_ROOT=127.0.0.1:<port> in both, so the only difference is the questions.
# Prints each run's "Avg bus bandwidth", the questions answered, and the medians and their
# ratio (asked / quiet).
set -euo pipefail

ROUNDS=7
NP=4
SIZE=64K
ITERS=200000
EVERY=1
while [ $# -gt 0 ]; do
    case "$1" in
        --rounds) ROUNDS="$2"; shift ;;
        --np) NP="$2"; shift ;;
        --size) SIZE="$2"; shift ;;
        --iters) ITERS="$2"; shift ;;
        --every) EVERY="$2"; shift ;;
        *) echo "usage: $0 [--rounds N] [--np N] [--size BYTES] [--iters N] [--every S]" >&2; exit 2 ;;
    esac
    shift
done
cd "$(dirname "$0")/.."
cargo build --release --bin collbench -q
BIN=$PWD/target/release/collbench
PORT=$((29700 + $$ % 100))
export STRATA_ROOT=127.0.0.1:$PORT
STRATA_SECRET=$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')
export STRATA_SECRET
ASKER=
trap '[ -n "$ASKER" ] && kill "$ASKER" 2>/dev/null || true' EXIT

# One run; with "asked", a status client asks every $EVERY s while it runs. Prints
# "<busbw> <questions answered>".
run() {
    local out answered=0
    if [ "$1" = asked ]; then
        (
            n=0
            while :; do
                if "$BIN" status --within 1 >/dev/null 2>&1 || [ $? = 3 ]; then n=$((n + 1)); echo "$n" >"$WORK/answered"; fi
                sleep "$EVERY"
            done
        ) &
        ASKER=$!
    fi
    out=$("$BIN" --np "$NP" -b "$SIZE" -e "$SIZE" -n "$ITERS" -w 200 --no-in-place 2>&1)
    if [ -n "$ASKER" ]; then
        kill "$ASKER" 2>/dev/null || true
        { wait "$ASKER"; } 2>/dev/null || true
        ASKER=
        answered=$(cat "$WORK/answered" 2>/dev/null || echo 0)
        rm -f "$WORK/answered"
    fi
    echo "$(echo "$out" | awk '/Avg bus bandwidth/ { print $NF }') $answered"
}

WORK=$(mktemp -d)
quiet=()
asked=()
for r in $(seq 1 "$ROUNDS"); do
    order=(quiet asked)
    [ $((RANDOM % 2)) = 0 ] && order=(asked quiet)
    for mode in "${order[@]}"; do
        read -r bw n <<<"$(run "$mode")"
        echo "round $r $mode: busbw $bw GB/s, $n views answered"
        if [ "$mode" = quiet ]; then quiet+=("$bw"); else asked+=("$bw"); fi
    done
done
rm -rf "$WORK"
median() { printf '%s\n' "$@" | sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
mq=$(median "${quiet[@]}")
ma=$(median "${asked[@]}")
echo "median busbw: quiet $mq GB/s, asked every ${EVERY} s $ma GB/s: ratio $(awk -v a="$ma" -v q="$mq" 'BEGIN { printf "%.3f", a / q }')"
echo "quiet: ${quiet[*]}"
echo "asked: ${asked[*]}"
