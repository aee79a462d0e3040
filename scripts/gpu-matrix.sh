#!/usr/bin/env bash
# The whole device matrix on the CUDA driver stand-in: every algorithm of every collective x
# every type x every operator, in and out of place, at one piece and several, as stream
# programs at 2, 3 and 4 processes on one host (CUDA IPC) and on 2 emulated hosts x 2 ranks
# (CUDA IPC inside a host, GPUDirect RDMA over the verbs stand-in between them; needs root for
# the network namespaces). CI runs a sample of it (three type/operator pairs per algorithm,
# every type x operator under the tuner's choice); this runs all of it, in a few minutes.
# LOGIC-LEVEL: the stand-ins prove data and ordering, never GPU or NIC speed.
#
#   scripts/gpu-matrix.sh
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -s target/kernels/nvrtc-dir ]; then
    scripts/compile-kernels.sh target/kernels
fi
STRATA_NVRTC_DIR="$(cat target/kernels/nvrtc-dir)"
export STRATA_NVRTC_DIR STRATA_GPU_FULL_MATRIX=1
cargo test --release --test gpu_standin -- \
    every_collective_algorithm_type_and_operator_as_stream_programs_at_2_3_and_4_processes
cargo test --release --test gpu_hosts -- \
    every_collective_algorithm_type_and_operator_on_2_hosts_of_2_gpus_over_ipc_and_gpudirect
