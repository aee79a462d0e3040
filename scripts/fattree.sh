#!/usr/bin/env bash
# An emulated fat tree on one machine, and collbench across it.
#
#   sudo scripts/fattree.sh [--quick] [--out DIR]
#
# Builds 8 hosts as network namespaces (st-h0 … st-h7, 198.18.0.1-8/24), a switch namespace
# (st-sw) holding one bridge per leaf (2 hosts each) and a spine bridge joining the 4 leaves.
# tc htb shapes every host link to 1 Gbit/s each way and every leaf uplink to 500 Mbit/s each
# way, so the spine tier is oversubscribed 4:1. Pure TCP ACKs get their own htb class ahead
# of data, as a switch's shallow queues would let them through. The fabric is described to
# strata by examples/topology/emulated-fat-tree.toml (one rank per host, named h0-h7 by a
# private UTS namespace per rank).
#
# It then prints:
#   1. single flows: per-message latency and bandwidth between two leaves through the shaped
#      path, and between two namespaces joined without shaping (what the CPUs can move);
#   2. for the launcher placement (rank i on host i) and a scattered one (rank i on leaf
#      i mod 4): all-reduce busbw of a topology-blind ring (STRATA_RANK_ORDER=launcher), of
#      every fixed algorithm, and of strata's automatic choice, 8 B to 64 MiB, with the cost
#      model's prediction on every row, and the CPU load of the machine during the runs.
# --quick runs 8 B to 4 MiB with a few algorithms (what CI runs to keep the script working).
# --health H instead shapes host H's link to half its rate (both ways) and runs
# `collbench health` on the 8 hosts, once with every link equal and once with H's at half.
# --calibrate instead runs `collbench calibrate` on the 8 hosts (launcher placement, 8 B to
# FATTREE_CAL_MAX, default 4M), writing DIR/profile.toml (--out, else a temporary file), then
# calibrate again with STRATA_COST_PROFILE naming it and --no-write: the second run's
# "before" column is the profile's prediction against times measured afresh. Each run's points
# go to DIR/profile.json and DIR/profile_check.json, for `collbench calibrate --refit`; then
# the rounds of --auto-vs-best with that profile.
# --auto-vs-best PROFILE runs, with STRATA_COST_PROFILE=PROFILE, FATTREE_ROUNDS rounds (default
# 4) of collbench per collective (8 B to FATTREE_CAL_MAX by 8x; 200 calls a row to 32 KiB, 20
# above), each timing every fixed algorithm and strata's choice side by side (--algo all,auto,
# and auto,all in even rounds; DIR/auto_rK_OP_fromSIZE.json), and benches/auto_vs_best.py sets
# auto's median beside the best algorithm's median per size.
# Everything it creates is removed on exit, failure or interrupt; every run has a deadline.
set -euo pipefail

QUICK=0
OUT=""
HEALTH=""
CALIBRATE=0
AUTO_PROFILE=""
while [ $# -gt 0 ]; do
    case "$1" in
        --quick) QUICK=1 ;;
        --out) OUT="$2"; shift ;;
        --health) HEALTH="$2"; shift ;;
        --calibrate) CALIBRATE=1 ;;
        --auto-vs-best) AUTO_PROFILE="$2"; shift ;;
        *) echo "usage: $0 [--quick] [--out DIR] [--health HOST | --calibrate | --auto-vs-best PROFILE]" >&2; exit 2 ;;
    esac
    shift
done

cd "$(dirname "$0")/.."
ROOT=$PWD
# shellcheck source=scripts/netns-lib.sh
source scripts/netns-lib.sh
TOPO=$ROOT/examples/topology/emulated-fat-tree.toml
HOSTS=8
PER_LEAF=2
LEAVES=$((HOSTS / PER_LEAF))
HOST_RATE=1000
UPLINK_RATE=500
SW=st-sw
PIDS=()

if [ "$(id -u)" != 0 ]; then
    echo "fattree.sh: needs root (network namespaces and tc)" >&2
    exit 1
fi
for tool in ip tc unshare timeout; do
    command -v "$tool" >/dev/null || { echo "fattree.sh: $tool not found" >&2; exit 1; }
done

cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    for h in $(seq 0 $((HOSTS - 1))); do ip netns del "st-h$h" 2>/dev/null || true; done
    ip netns del st-x0 2>/dev/null || true
    ip netns del st-x1 2>/dev/null || true
    ip netns del "$SW" 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM
cleanup

cargo build --release --bin collbench -q
BIN=$ROOT/target/release/collbench
[ -n "$OUT" ] && mkdir -p "$OUT"

shape() { # namespace device rate_mbit [change]
    # A parent class holds the link at its rate; pure TCP ACKs (IP packets under 128 bytes) go
    # first, as a switch's shallow queues would let them, instead of waiting behind the
    # opposite direction's data in a deep FIFO (which halves every bidirectional flow).
    # `change` re-rates a link shaped before.
    local ns=$1 dev=$2 rate=$3 verb=${4:-add}
    [ "$verb" = add ] && ip netns exec "$ns" tc qdisc add dev "$dev" root handle 1: htb default 10 r2q 100
    ip netns exec "$ns" tc class "$verb" dev "$dev" parent 1: classid 1:1 htb \
        rate "${rate}mbit" ceil "${rate}mbit" quantum 60000
    ip netns exec "$ns" tc class "$verb" dev "$dev" parent 1:1 classid 1:5 htb prio 0 \
        rate "$((rate / 20))mbit" ceil "${rate}mbit" quantum 1514
    ip netns exec "$ns" tc class "$verb" dev "$dev" parent 1:1 classid 1:10 htb prio 1 \
        rate "$((rate - rate / 20))mbit" ceil "${rate}mbit" quantum 60000
    [ "$verb" = add ] && ip netns exec "$ns" tc filter add dev "$dev" parent 1: protocol ip prio 1 u32 \
        match ip protocol 6 0xff match u16 0x0000 0xff80 at 2 flowid 1:5
    return 0
}

# --- the fabric ---------------------------------------------------------------------------
ip netns add "$SW"
ip -n "$SW" link set lo up
ip -n "$SW" link add spine type bridge
ip -n "$SW" link set spine up
for l in $(seq 0 $((LEAVES - 1))); do
    ip -n "$SW" link add "leaf$l" type bridge
    ip -n "$SW" link set "leaf$l" up
    ip -n "$SW" link add "up$l" type veth peer name "dn$l"
    ip -n "$SW" link set "up$l" master "leaf$l" up
    ip -n "$SW" link set "dn$l" master spine up
    shape "$SW" "up$l" "$UPLINK_RATE"   # leaf -> spine
    shape "$SW" "dn$l" "$UPLINK_RATE"   # spine -> leaf
done
for h in $(seq 0 $((HOSTS - 1))); do
    ns=st-h$h
    add_host "$ns" "st-e$h" "st-p$h" "$SW" "leaf$((h / PER_LEAF))" "198.18.0.$((h + 1))/24"
    shape "$ns" eth0 "$HOST_RATE"        # host -> leaf
    shape "$SW" "st-p$h" "$HOST_RATE"    # leaf -> host
done
# Two namespaces joined directly, without shaping: the CPU's own limit.
ip netns add st-x0
ip netns add st-x1
ip link add st-x0e type veth peer name st-x1e
ip link set st-x0e netns st-x0
ip link set st-x1e netns st-x1
ip -n st-x0 addr add 198.19.0.1/24 dev st-x0e
ip -n st-x1 addr add 198.19.0.2/24 dev st-x1e
for x in 0 1; do ip -n "st-x$x" link set "st-x${x}e" up; ip -n "st-x$x" link set lo up; done
echo "# fabric: $HOSTS hosts, $PER_LEAF per leaf, $LEAVES leaves; host links $HOST_RATE Mbit/s, leaf uplinks $UPLINK_RATE Mbit/s (4:1)"

# --- running ranks --------------------------------------------------------------------------
PORT=29400
EXTRA_ENV=("STRATA_TOPO_FILE=$TOPO")
# run_job LIMIT_S NS_OF_RANK... -- ARGS...: one collbench rank per namespace; rank 0 prints.
run_job() {
    local limit=$1; shift
    local nss=()
    while [ "$1" != "--" ]; do nss+=("$1"); shift; done
    shift
    local n=${#nss[@]}
    PORT=$((PORT + 2))
    local master
    master=$(ip -n "${nss[0]}" -4 -o addr show | awk '$2 != "lo" {print $4}' | cut -d/ -f1 | head -1)
    local pids=()
    local cpus
    cpus=$(nproc)
    for r in $(seq 0 $((n - 1))); do
        local ns=${nss[$r]} name=${nss[$r]#st-}
        # Every emulated host says LOCAL_RANK=0, and a rank its launcher left free is bound to
        # CPU `local rank mod cores`: all of them would land on CPU 0. Spread them over this
        # machine's CPUs instead, rank r on CPU r mod cores (a rank already bound stays so).
        local cmd=(ip netns exec "$ns" unshare --uts sh -c 'hostname "$0"; exec "$@"' "$name"
            taskset -c $((r % cpus)) timeout "$limit" env RANK="$r" WORLD_SIZE="$n" LOCAL_RANK=0 LOCAL_WORLD_SIZE=1
            MASTER_ADDR="$master" MASTER_PORT="$PORT" STRATA_SOCKET_IFNAME="^lo"
            STRATA_INIT_TIMEOUT=60 STRATA_TIMEOUT="$limit" "${EXTRA_ENV[@]}"
            "$BIN" "$@")
        # Rank 0 prints the table (inheriting stdout, so a redirected log is appended to, not
        # truncated); the others' tables are the same and go nowhere.
        if [ "$r" = 0 ]; then "${cmd[@]}" & else "${cmd[@]}" >/dev/null & fi
        pids+=($!)
        PIDS+=($!)
    done
    local rc=0
    for p in "${pids[@]}"; do wait "$p" || rc=1; done
    return $rc
}

# Every host, rank i on host i (the launcher's placement).
all=()
for r in $(seq 0 $((HOSTS - 1))); do all+=("st-h$r"); done

if [ -n "$HEALTH" ]; then
    echo
    echo "## collbench health, every link as built"
    run_job 120 "${all[@]}" -- health --bytes 2M || true
    half=$((HOST_RATE / 2))
    shape "st-h$HEALTH" eth0 "$half" change   # host -> leaf
    shape "$SW" "st-p$HEALTH" "$half" change  # leaf -> host
    echo
    echo "## collbench health, host h$HEALTH's link at $half Mbit/s each way"
    run_job 120 "${all[@]}" -- health --bytes 2M || true
    exit 0
fi

if [ "$CALIBRATE" = 1 ]; then
    profile=${OUT:-$(mktemp -d)}/profile.toml
    rm -f "$profile"
    cal=(calibrate -e "${FATTREE_CAL_MAX:-4M}" --rounds 3)
    echo
    echo "## collbench calibrate on 8 hosts, writing $profile"
    run_job 1800 "${all[@]}" -- "${cal[@]}" --profile "$profile" --json "${profile%.toml}.json"
    echo
    echo "## again with STRATA_COST_PROFILE=$profile: 'before' is the profile's prediction"
    EXTRA_ENV+=("STRATA_COST_PROFILE=$profile")
    run_job 1800 "${all[@]}" -- "${cal[@]}" --no-write --json "${profile%.toml}_check.json"
    AUTO_PROFILE=$profile
fi

if [ -n "$AUTO_PROFILE" ]; then
    [ -f "$AUTO_PROFILE" ] || { echo "fattree.sh: no profile $AUTO_PROFILE" >&2; exit 2; }
    dir=${OUT:-$(dirname "$AUTO_PROFILE")}
    EXTRA_ENV=("STRATA_TOPO_FILE=$TOPO" "STRATA_COST_PROFILE=$AUTO_PROFILE")
    runs=()
    for k in $(seq 1 "${FATTREE_ROUNDS:-4}"); do
        # Auto last in odd rounds and first in even ones: where a table stands in a run moves
        # its times (the same algorithm 0.7x apart at 8 B), and no side should have one place.
        order=all,auto
        [ $((k % 2)) = 0 ] && order=auto,all
        for op in all_reduce all_gather reduce_scatter; do
            # 200 timed calls a row up to 32 KiB (20 calls of under a millisecond moved by a
            # quarter between runs), collbench's 20 above it.
            for band in "-b 8 -e 32K -n 200 -w 20" "-b 256K -e ${FATTREE_CAL_MAX:-4M}"; do
                echo
                echo "## round $k, $op, $band: --algo $order, with $AUTO_PROFILE"
                from=${band#-b }
                runs+=("$dir/auto_r${k}_${op}_from${from%% *}.json")
                # shellcheck disable=SC2086
                run_job 1800 "${all[@]}" -- --op "$op" --algo "$order" $band -f 8 --no-in-place \
                    -c 1 -J "${runs[-1]}"
            done
        done
    done
    echo
    echo "## auto beside the best fixed algorithm, medians of the rounds"
    python3 benches/auto_vs_best.py "${runs[@]}"
    exit 0
fi

cpu_busy() { # prints "busy total" jiffies
    awk '/^cpu /{print $2+$3+$4+$7+$8, $2+$3+$4+$5+$6+$7+$8}' /proc/stat
}

if [ -z "${FATTREE_SKIP_SINGLE:-}" ]; then
echo
echo "## 1. single flows (send_recv, 2 ranks)"
echo "# through the shaped path, h0 (leaf 0) <-> h2 (leaf 1): each row is a send and its reply,"
echo "# so algbw is half the one-way rate; expect ~0.03 GB/s, i.e. ~60 MB/s each way (500 Mbit/s)"
run_job 120 st-h0 st-h2 -- --op send_recv -b 8 -e 16M -f 16 -n 10 -w 2 --no-in-place -c 0
echo "# without shaping, st-x0 <-> st-x1: what two cores can push through veth"
EXTRA_ENV=()
run_job 120 st-x0 st-x1 -- --op send_recv -b 8 -e 16M -f 16 -n 10 -w 2 --no-in-place -c 0
fi

# --- the all-reduce sweeps ------------------------------------------------------------------
if [ "$QUICK" = 1 ]; then
    BANDS=("-b 8 -e 4M -f 8 -n 5 -w 1")
    FIXED=ring,rhd,hier_ring
else
    BANDS=("-b 8 -e 512K -f 2 -n 40 -w 5" "-b 1M -e 8M -f 2 -n 8 -w 2" "-b 16M -e 64M -f 2 -n 3 -w 1")
    FIXED=all
fi
# Overrides for exploring: FATTREE_ALGOS=ring,rd FATTREE_BANDS="-b 8 -e 8 -n 300 -w 20"
FIXED=${FATTREE_ALGOS:-$FIXED}
if [ -n "${FATTREE_BANDS:-}" ]; then
    BANDS=("$FATTREE_BANDS")
fi
scattered=()
for r in $(seq 0 $((HOSTS - 1))); do
    scattered+=("st-h$(( (r % LEAVES) * PER_LEAF + r / LEAVES ))")
done

sweep() { # title algo env... -- namespaces
    local title=$1 algo=$2; shift 2
    local envs=()
    while [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    for band in "${BANDS[@]}"; do
        echo "### $title, $band"
        local json=()
        if [ -n "$OUT" ]; then
            json=(-J "$OUT/$(echo "$title $band" | tr -c 'A-Za-z0-9\n' '_').json")
        fi
        EXTRA_ENV=("STRATA_TOPO_FILE=$TOPO" "${envs[@]}")
        # shellcheck disable=SC2086
        run_job 1800 "$@" -- --algo "$algo" $band --no-in-place -c 1 "${json[@]}"
    done
}

for placement in launcher scattered; do
    if [ "$placement" = launcher ]; then nss=("${all[@]}"); else nss=("${scattered[@]}"); fi
    echo
    echo "## 2. all_reduce, $placement placement: rank -> host ${nss[*]#st-}"
    before=$(cpu_busy)
    sweep "$placement: topology-blind ring" ring STRATA_RANK_ORDER=launcher -- "${nss[@]}"
    sweep "$placement: fixed algorithms" "$FIXED" STRATA_RANK_ORDER=topology -- "${nss[@]}"
    sweep "$placement: auto" auto STRATA_RANK_ORDER=topology -- "${nss[@]}"
    after=$(cpu_busy)
    echo "$before $after" | awk '{printf "# CPU busy during the %s runs: %.0f%% of both cores\n", "'"$placement"'", 100*($3-$1)/($4-$2)}'
done
echo
echo "# done; tearing the fabric down"
