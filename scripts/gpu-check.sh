#!/usr/bin/env bash
# The GPU path on a machine with NVIDIA GPUs (no stand-in): the GPU tests on the real driver
# (stream programs over CUDA IPC among the GPUs of the machine, host-staged, abort, timeouts),
# collbench --device cuda for every collective and algorithm, and strata against NVIDIA's NCCL
# (the nvidia-nccl-cu12 wheel) with
# one C program (benches/gpu_bench.c) run against each library, interleaved over three
# rounds, medians reported; on 1 GPU and on every GPU of the machine.
#
# GPUDirect RDMA needs two such machines with RDMA NICs (nvidia-peermem or dma-buf support):
# run collbench --device cuda under your launcher across them (STRATA_TRANSPORT=verbs; the
# header line and "Device paths of rank 0" say which peers take gdr). On one machine, the
# same protocol runs on the stand-ins: sudo scripts/gpu_hosts_netns.sh (logic-level).
#
#   scripts/gpu-check.sh [MAX_BYTES]      (default 1 GiB)
set -euo pipefail
cd "$(dirname "$0")/.."
max="${1:-1073741824}"
command -v nvidia-smi >/dev/null && nvidia-smi -L || { echo "gpu-check: no NVIDIA GPU here"; exit 1; }
ngpu=$(nvidia-smi -L | grep -c '^GPU')
export STRATA_SOCKET_IFNAME="=lo"

echo "== build, kernels (NVRTC from PyPI)"
cargo build --release --workspace
scripts/compile-kernels.sh target/kernels
STRATA_NVRTC_DIR="$(cat target/kernels/nvrtc-dir)"
export STRATA_NVRTC_DIR
export LD_LIBRARY_PATH="$STRATA_NVRTC_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

echo "== the GPU tests on the real driver"
STRATA_GPU_TESTS_REAL=1 cargo test --release --test gpu_standin --test gpu_faults -- --test-threads=1

echo "== NVIDIA's NCCL from PyPI"
venv="${STRATA_CACHE:-$HOME/.cache/strata}/nccl-cu12-venv"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install -q --no-deps nvidia-nccl-cu12
nv="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/nvidia/nccl"
cc -O2 -std=c11 -o target/gpu_bench_nvidia benches/gpu_bench.c -I"$nv/include" \
  -Iffi/tests/c/cuda-standin -L"$nv/lib" -l:libnccl.so.2 -Wl,-rpath,"$nv/lib" -lcuda -ldl

run() { # run LOG LIB NP: benches/gpu_bench.c on NP ranks (one per GPU), NVIDIA's NCCL or strata preloaded
  local log=$1 lib=$2 np=$3 idf pids=() preload=""
  [ "$lib" = strata ] && preload="$PWD/target/release/libstrata_ffi.so"
  idf=$(mktemp -u /tmp/strata-gpu-id.XXXXXX)
  for r in $(seq 0 $((np - 1))); do
    RANK=$r WORLD_SIZE=$np NCCL_TEST_ID_FILE=$idf LD_PRELOAD="$preload" \
      timeout 600 target/gpu_bench_nvidia procs 8 "$max" > "$idf.out.$r" &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
  cat "$idf".out.* > "$log"
  rm -f "$idf" "$idf".out.*
}

for np in $(printf '%s\n' 1 "$ngpu" | sort -un); do
  echo "== all-reduce, all-gather, reduce-scatter, $np GPU(s): NVIDIA NCCL vs strata, 3 interleaved rounds, medians"
  out=$(mktemp -d)
  for round in 1 2 3; do
    run "$out/procs_nccl_r$round.log" nccl "$np"
    run "$out/procs_strata_r$round.log" strata "$np"
  done
  python3 scripts/gpu_summary.py "$out"
  rm -rf "$out"
  echo "== collbench --device cuda, $np GPU(s): every collective (stream programs on one host)"
  for op in all_reduce all_gather reduce_scatter broadcast reduce all_to_all; do
    target/release/collbench --np "$np" --device cuda --op "$op" -b 8 -e "$max" -f 4 -n 20 -w 5
  done
  if [ "$np" -gt 1 ]; then
    echo "== collbench --device cuda, $np GPU(s): every all-reduce algorithm, every type, checked"
    target/release/collbench --np "$np" --device cuda --algo all -d all -b 8 -e 64M -f 64 -n 5 -w 2 -c 1
    echo "== the same all-reduce host-staged, for comparison"
    STRATA_GPU_PATH=staged target/release/collbench --np "$np" --device cuda -b 1M -e "$max" -f 4 -n 20 -w 5
  fi
done
