#!/usr/bin/env bash
# The GPU checks of scripts/gpu-check.sh in the minutes a lent GPU machine gives, with
# binaries built elsewhere: such a machine has CUDA, PyTorch and NVIDIA's NCCL wheel but no
# Rust toolchain and no network. Build and strip the binaries here, carry them, run this there:
#
#   cargo build --release --workspace && cargo test --release --no-run --test gpu_standin --test gpu_faults
#   mkdir -p .gpu && for f in target/release/{collbench,libstrata_ffi.so} \
#       target/release/deps/gpu_{standin,faults}-*[^.d]; do strip -o .gpu/${f##*/} $f; done
#   scripts/gpu-lent-check.sh .gpu          (logs under $OUT, else /tmp/gpu-lent)
#
# Every step has its own deadline, so a hang costs that step alone. With one GPU every rank
# shares it (device = rank mod GPUs): the stream programs, CUDA IPC and stream memory
# operations then run on the real driver between processes, but NVLink is not exercised, and
# NVIDIA's NCCL refuses two ranks on one GPU, so the busbw comparison needs a machine with
# at least 2 GPUs (scripts/gpu-check.sh).
set -uo pipefail
cd "$(dirname "$0")/.."
bin="$(cd "${1:?usage: gpu-lent-check.sh BIN_DIR}" && pwd)"
out="${OUT:-/tmp/gpu-lent}"
mkdir -p "$out"
export STRATA_SOCKET_IFNAME="=lo"
step() { # step NAME SECONDS CMD...: runs CMD under a deadline, its output into $out/NAME.log
  local name=$1 limit=$2 t0=$SECONDS rc
  shift 2
  echo "== $name (limit ${limit}s)"
  timeout -s KILL "$limit" "$@" > "$out/$name.log" 2>&1
  rc=$?
  echo "   rc=$rc after $((SECONDS - t0)) s"
  tail -n "${TAIL:-15}" "$out/$name.log"
}

nvidia-smi -L 2>/dev/null || echo "no nvidia-smi (a stand-in run?)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)

# NVRTC: strata loads libnvrtc.so.12 or libnvrtc.so; a CUDA 13 machine has libnvrtc.so.13.
if [ -z "${STRATA_NVRTC_DIR:-}" ]; then
  nvrtc=$(ls /usr/local/cuda/lib64/libnvrtc.so.1[0-9]* /usr/local/cuda/targets/*/lib/libnvrtc.so.1[0-9]* \
    /opt/torch/.venv/lib/python3*/site-packages/nvidia/cu1[0-9]/lib/libnvrtc.so.1[0-9]* 2>/dev/null |
    grep -v builtins | head -1)
  [ -n "$nvrtc" ] || { echo "no libnvrtc found"; exit 1; }
  mkdir -p /tmp/strata-nvrtc && ln -sf "$nvrtc" /tmp/strata-nvrtc/libnvrtc.so
  STRATA_NVRTC_DIR="/tmp/strata-nvrtc:$(dirname "$nvrtc")"
  echo "NVRTC: $nvrtc"
fi
export STRATA_NVRTC_DIR
export LD_LIBRARY_PATH="$STRATA_NVRTC_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
cb="$bin/collbench"
# STEPS picks stages (default all): sanity tests algos check rates nccl topo.
steps=" ${STEPS:-sanity tests algos check queues rates nccl topo} "
want() { [[ "$steps" == *" $1 "* ]]; }

want sanity && step sanity 30 "$cb" --np 1 --device cuda -b 8 -e 64M -f 8 -n 5 -w 2 -c 1
# The GPU tests one at a time, each under its own deadline: ranks sharing one GPU are
# time-sliced by the driver (each wait on another process's stream can cost a slice of about
# 2.4 ms), so the multi-process matrices run far slower than on a GPU each.
if want tests; then
  for t in gpu_standin gpu_faults; do
    for name in $(STRATA_GPU_TESTS_REAL=1 "$bin/$t" --list 2>/dev/null | sed -n 's/: test$//p'); do
      # TESTS: only these (names), e.g. the ones a cut-short run did not reach.
      [ -n "${TESTS:-}" ] && [[ " $TESTS " != *" $name "* ]] && continue
      TAIL=3 step "$t.$name" "${TEST_LIMIT:-90}" env STRATA_GPU_TESTS_REAL=1 "$bin/$t" --exact "$name" --test-threads=1
    done
  done
fi
if want algos; then
# Correctness on the real driver: every all-reduce algorithm x type x operator at 2 and 3
# ranks on stream programs; every other collective checked at 4.
step algos_2 60 "$cb" --np 2 --device cuda --algo all -d all -o all -b 8 -e 4M -f 512 -n 1 -w 1 -c 1
step algos_3 60 "$cb" --np 3 --device cuda --algo all -d all -b 8 -e 4M -f 512 -n 1 -w 1 -c 1
fi
want check && for op in all_gather reduce_scatter broadcast reduce all_to_all send_recv; do
  TAIL=8 step "check_4_$op" 20 "$cb" --np 4 --device cuda --op "$op" -d all -b 8 -e 4M -f 512 -n 1 -w 1 -c 1
done
# Megatron-LM sets CUDA_DEVICE_MAX_CONNECTIONS=1: every stream of a process then shares one
# hardware queue, so a stream waiting on a peer holds up the process's other streams (the lanes
# of a step, the monitor's). Not yet run on a GPU.
if want queues; then
  step queues_1_all_reduce 60 env CUDA_DEVICE_MAX_CONNECTIONS=1 "$cb" --np 2 --device cuda --algo all -b 8 -e 4M -f 512 -n 1 -w 1 -c 1
  step queues_1_all_to_all 30 env CUDA_DEVICE_MAX_CONNECTIONS=1 "$cb" --np 3 --device cuda --op all_to_all -b 8 -e 4M -f 512 -n 1 -w 1 -c 1
  TAIL=3 step queues_1_timeout 70 env CUDA_DEVICE_MAX_CONNECTIONS=1 STRATA_GPU_TESTS_REAL=1 "$bin/gpu_faults" --exact \
    a_stream_program_waiting_on_a_rank_that_never_calls_times_out_naming_it --test-threads=1
fi
# Rates on one shared GPU (not NVLink): strata's stream programs, then host staging beside.
want rates && for np in 1 2; do
  for op in all_reduce all_gather reduce_scatter; do
    TAIL=6 step "rate_${np}_$op" 30 "$cb" --np "$np" --device cuda --op "$op" -b 64M -e 1G -f 4 -n 10 -w 3 -c 0 --no-in-place
  done
done
want rates && TAIL=6 step rate_2_staged 45 env STRATA_GPU_PATH=staged "$cb" --np 2 --device cuda -b 64M -e 256M -f 4 -n 5 -w 2 -c 0 --no-in-place

# NVIDIA's NCCL beside strata, one program against each library's libnccl.so.2.
site=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' 2>/dev/null)
nv=$(dirname "$(dirname "$(find "$site/nvidia" -name libnccl.so.2 2>/dev/null | head -1)")")
cudalib=$(ldconfig -p | awk '/libcuda.so.1 /{print $NF; exit}')
if ! want nccl; then
  :
elif [ -n "$nv" ] && [ -f "$nv/lib/libnccl.so.2" ] && [ -n "$cudalib" ]; then
  cc -O2 -std=c11 -o /tmp/gpu_allreduce benches/gpu_allreduce.c -I"$nv/include" \
    -Iffi/tests/c/cuda-standin "$nv/lib/libnccl.so.2" "$cudalib" || echo "cc failed"
  mkdir -p /tmp/strata-lib && ln -sf "$bin/libstrata_ffi.so" /tmp/strata-lib/libnccl.so.2
  pair() { # pair LIBDIR NP: the C program on NP ranks against that libnccl.so.2
    local idf pids=()
    idf=$(mktemp -u /tmp/strata-gpu-id.XXXXXX)
    for r in $(seq 0 $(($2 - 1))); do
      RANK=$r WORLD_SIZE=$2 NCCL_TEST_ID_FILE=$idf LD_LIBRARY_PATH="$1:$LD_LIBRARY_PATH" \
        /tmp/gpu_allreduce 8 268435456 20 > "$idf.out.$r" 2>&1 &
      pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p"; done
    cat "$idf.out.0"
    rm -f "$idf" "$idf".out.*
  }
  # STRATA_LIB_BASELINE: an older libstrata_ffi.so timed in the same rounds.
  if [ -n "${STRATA_LIB_BASELINE:-}" ]; then
    mkdir -p /tmp/strata-base && ln -sf "$(realpath "$STRATA_LIB_BASELINE")" /tmp/strata-base/libnccl.so.2
  fi
  for round in 1 2 3; do
    TAIL=0 step "nccl_1_r$round" 30 bash -c "$(declare -f pair); pair '$nv/lib' 1"
    TAIL=0 step "strata_1_r$round" 30 bash -c "$(declare -f pair); pair /tmp/strata-lib 1"
    [ -n "${STRATA_LIB_BASELINE:-}" ] &&
      TAIL=0 step "baseline_1_r$round" 30 bash -c "$(declare -f pair); pair /tmp/strata-base 1"
  done
  echo "bytes, then us per call at 1 rank (medians of 3 rounds): nccl strata${STRATA_LIB_BASELINE:+ baseline}"
  python3 - "$out" <<'PY'
import glob, statistics, sys
d = sys.argv[1]
cols = {}
for who in ["nccl", "strata", "baseline"]:
    rows = {}
    for f in glob.glob(f"{d}/{who}_1_r*.log"):
        for line in open(f):
            p = line.split()
            if len(p) == 3 and p[0].isdigit():
                rows.setdefault(int(p[0]), []).append(float(p[1]))
    if rows:
        cols[who] = {b: statistics.median(v) for b, v in rows.items()}
for b in sorted(cols.get("nccl", {})):
    print(b, *(f"{cols[w].get(b, float('nan')):.2f}" for w in cols))
PY
  TAIL=2 step nccl_2_one_gpu 30 bash -c "$(declare -f pair); pair '$nv/lib' 2"
else
  echo "NVIDIA's NCCL wheel or libcuda not found: no NCCL comparison"
fi
want topo && TAIL=30 step topo 20 "$cb" topo
# At most 8 files come back from a lent machine: the logs go as one archive.
(cd "$out" && tar czf logs.tgz ./*.log && rm -f ./*.log)
echo "GPUs: $ngpu; logs in $out/logs.tgz"
