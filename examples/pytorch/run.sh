#!/usr/bin/env bash
# Runs allreduce.py under torchrun with strata's libnccl.so.2 in place of the NCCL wheel that
# PyTorch pins. PyTorch finds its NCCL through an RPATH into that wheel, so LD_LIBRARY_PATH does
# not replace it; LD_PRELOAD of a library whose SONAME is libnccl.so.2 does.
#
#   examples/pytorch/run.sh [processes]      (default 2; one GPU each)
#
# torchrun gives every worker RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and
# MASTER_PORT; PyTorch's store (on MASTER_PORT) carries the ncclUniqueId, so strata needs
# nothing else. Set STRATA_SOCKET_IFNAME (or NCCL_SOCKET_IFNAME) to the interface ranks on
# other hosts reach this one by; on one host the default below keeps traffic on loopback.
set -euo pipefail
cd "$(dirname "$0")/../.."
lib="$(scripts/build-libnccl.sh)/lib/libnccl.so.2"
export STRATA_SOCKET_IFNAME="${STRATA_SOCKET_IFNAME:-=lo}"
LD_PRELOAD="$lib" exec torchrun --standalone --nproc-per-node="${1:-2}" \
    examples/pytorch/allreduce.py
