#!/usr/bin/env bash
# collbench --device cuda on 2 emulated hosts x 2 ranks, on the CUDA driver stand-in and the
# libibverbs stand-in (RoCE, one address per rank's NIC): ranks of a host meet through CUDA
# IPC, ranks of different hosts through GPUDirect RDMA. Prints each path's collbench output,
# whose stand-in section says what one call moved through host memory. LOGIC-LEVEL ONLY: the
# stand-ins' times are neither GPU nor NIC speed.
#
#   sudo scripts/gpu_hosts_netns.sh [--paths "stream staged"] [--sizes "1M 64M"] [--op all_reduce]
#
# Needs NVRTC (scripts/compile-kernels.sh target/kernels writes target/kernels/nvrtc-dir).
# Everything it creates is removed on exit; every run is under `timeout`.
set -euo pipefail

PATHS="stream staged"
SIZES="1M 64M"
OP=all_reduce
while [ $# -gt 0 ]; do
    case "$1" in
        --paths) PATHS="$2"; shift ;;
        --sizes) SIZES="$2"; shift ;;
        --op) OP="$2"; shift ;;
        *) echo "usage: $0 [--paths \"stream staged\"] [--sizes \"1M 64M\"] [--op OP]" >&2; exit 2 ;;
    esac
    shift
done

cd "$(dirname "$0")/.."
ROOT=$PWD
# shellcheck source=scripts/netns-lib.sh
source scripts/netns-lib.sh
SW=st-dsw
WORK=$(mktemp -d)
if [ "$(id -u)" != 0 ]; then
    echo "gpu_hosts_netns.sh: needs root (network namespaces)" >&2
    exit 1
fi
NVRTC=$(cat target/kernels/nvrtc-dir 2>/dev/null || true)
if [ -z "$NVRTC" ]; then
    echo "gpu_hosts_netns.sh: run scripts/compile-kernels.sh target/kernels first (NVRTC)" >&2
    exit 1
fi
cleanup() {
    del_star st-d "$SW" 2
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

cargo build --release --bin collbench -q
cargo build --release -p strata-cuda-standin -p strata-ibverbs-standin -q
BIN=$ROOT/target/release/collbench

cleanup
mkdir -p "$WORK/lib"
cp target/release/libstrata_cuda_standin.so "$WORK/lib/libcuda.so.1"
cp target/release/libstrata_ibverbs_standin.so "$WORK/lib/libibverbs.so.1"
add_star st-d "$SW" 2 198.18.7.
for h in 0 1; do
    for l in 0 1; do
        ip -n "st-d$h" addr add "198.18.7.$((101 + 2 * h + l))/24" dev eth0
    done
done

PORT=29700
for path in $PATHS; do
    PORT=$((PORT + 2))
    pids=()
    for r in 0 1 2 3; do
        ip netns exec "st-d$((r / 2))" timeout 300 env RANK="$r" WORLD_SIZE=4 LOCAL_RANK=$((r % 2)) \
            MASTER_ADDR=198.18.7.1 MASTER_PORT="$PORT" STRATA_SOCKET_IFNAME=eth0 \
            STRATA_TRANSPORT=verbs STRATA_IBV_STANDIN_LINK=roce \
            STRATA_IBV_STANDIN_ADDR="198.18.7.$((101 + r))" STRATA_STANDIN_GPUS=2 \
            STRATA_GPU_PATH="$path" LD_LIBRARY_PATH="$WORK/lib:$NVRTC" \
            "$BIN" --op "$OP" --device cuda -b "${SIZES%% *}" -e "${SIZES##* }" -f 8 -n 3 -w 1 -c 1 \
            >"$WORK/out$r" 2>"$WORK/err$r" &
        pids+=($!)
    done
    for p in "${pids[@]}"; do
        if ! wait "$p"; then
            echo "gpu_hosts_netns.sh: a rank failed on path $path:" >&2
            cat "$WORK"/err* >&2
            exit 1
        fi
    done
    echo "=== STRATA_GPU_PATH=$path (2 hosts x 2 ranks; stand-ins: logic-level, not speed)"
    cat "$WORK/out0"
done
