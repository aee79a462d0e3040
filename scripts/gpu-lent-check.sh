#!/usr/bin/env bash
# The prepared run for a lent GPU machine (one H100 or H200, CUDA, PyTorch with NVIDIA's NCCL
# wheel, no Rust toolchain, no network): strata beside NVIDIA's NCCL on the one GPU, as NCCL
# 2.30+ runs two ranks on one GPU (NCCL_MULTI_RANK_GPU_ENABLE=1). Under 8 minutes; every step
# has its own deadline, so a hang costs that step alone; one table printed and JSON written
# ($OUT/summary.json; logs in $OUT/logs.tgz). Build and strip the binaries here, carry them:
#
#   scripts/gpu-prepare.sh                      # .gpu/: collbench, libstrata_ffi.so, test binaries
#   scripts/gpu-lent-check.sh .gpu              # on the lent machine ($OUT, else /tmp/gpu-lent)
#
# Steps, in order, so that a first figure exists even if time runs out (STEPS picks some;
# MAX_BYTES caps the sweeps, CUDA_DRIVER_LIB names another libcuda.so.1: .ci/run dry-runs the
# script on the CUDA stand-in with both, so that it does not rot between lent machines):
#   env      the GPU, driver, NCCL wheel, MPS
#   copy     the device-to-device copy rate: the bound of any collective among ranks of one GPU
#   threads  benches/gpu_bench.c, 2 ranks as threads of one process (ncclCommInitAll {0, 0}),
#            all-reduce, all-gather, reduce-scatter 8 B to 1 GiB, NVIDIA's NCCL then strata
#            (LD_PRELOAD), 3 interleaved rounds
#   tuner    NVIDIA's NCCL with strata's tuner plugin (NCCL_TUNER_PLUGIN=libnccl-tuner-strata.so,
#            STRATA_TOPO_FILE=examples/topology/meta-24k-h100.toml): its log shows the plugin
#            loaded and priced, and the threads sweep to 1 MiB runs on its choices
#   mps      the same as 2 processes under a private CUDA MPS daemon (without MPS: processes
#            time-sliced, sizes to 1 MiB, to state that cost); collbench's check under MPS
#            tells whether CUDA IPC and stream memory operations work between MPS clients
#   ddp      scripts/gpu_ddp.py, PyTorch DDP, 2 processes on the GPU, NCCL then strata
#   owed     the device monitor's read deadline (gpu_faults), stream programs under
#            CUDA_DEVICE_MAX_CONNECTIONS=1
#   check    collbench --threads 2 --device cuda: every collective, type and operator, as
#            kernels and as stream programs (0 wrong)
set -uo pipefail
cd "$(dirname "$0")/.."
bin="$(cd "${1:?usage: gpu-lent-check.sh BIN_DIR}" && pwd)"
out="${OUT:-/tmp/gpu-lent}"
mkdir -p "$out"
export STRATA_SOCKET_IFNAME="=lo"
export NCCL_MULTI_RANK_GPU_ENABLE=1 # NVIDIA's NCCL: two ranks on one GPU; strata ignores it
steps=" ${STEPS:-env copy threads tuner mps ddp owed check} "
max=${MAX_BYTES:-$((1 << 30))} # the largest size of the threads and mps sweeps
want() { [[ "$steps" == *" $1 "* ]]; }
failed=""
step() { # step NAME SECONDS CMD...: CMD under a deadline, its output into $out/NAME.log
  local name=$1 limit=$2 t0=$SECONDS rc
  shift 2
  echo "== $name (limit ${limit}s)"
  timeout -s KILL "$limit" "$@" > "$out/$name.log" 2>&1
  rc=$?
  echo "   rc=$rc after $((SECONDS - t0)) s"
  tail -n "${TAIL:-6}" "$out/$name.log"
  [ $rc = 0 ] || failed="$failed $name"
  return $rc
}

# Python with torch (the machine's, or its venv), NVIDIA's NCCL beside it, NVRTC.
py=""
for p in python3 /opt/torch/.venv/bin/python; do
  "$p" -c "import torch" 2>/dev/null && { py=$p; break; }
done
site=$([ -n "$py" ] && "$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
nvlib=$(find "$site/nvidia" -name libnccl.so.2 2>/dev/null | head -1)
nvinc=$(find "$site/nvidia" -name nccl.h 2>/dev/null | head -1)
# CUDA_DRIVER_LIB: another libcuda.so.1 (the stand-in, for a dry run of this script).
cudalib=${CUDA_DRIVER_LIB:-$(ldconfig -p | awk '/libcuda.so.1 /{print $NF; exit}')}
if [ -z "${STRATA_NVRTC_DIR:-}" ]; then
  nvrtc=$(ls /usr/local/cuda/lib64/libnvrtc.so.1[0-9]* /usr/local/cuda/targets/*/lib/libnvrtc.so.1[0-9]* \
    "$site"/nvidia/cu1[0-9]/lib/libnvrtc.so.1[0-9]* "$site"/nvidia/cuda_nvrtc/lib/libnvrtc.so.1[0-9]* 2>/dev/null |
    grep -v builtins | head -1)
  if [ -n "$nvrtc" ]; then
    mkdir -p /tmp/strata-nvrtc && ln -sf "$nvrtc" /tmp/strata-nvrtc/libnvrtc.so
    STRATA_NVRTC_DIR="/tmp/strata-nvrtc:$(dirname "$nvrtc")"
  fi
fi
export STRATA_NVRTC_DIR="${STRATA_NVRTC_DIR:-}"
export LD_LIBRARY_PATH="${STRATA_NVRTC_DIR}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
strata="$bin/libstrata_ffi.so"
cb="$bin/collbench"

if want env; then
  {
    nvidia-smi --query-gpu=name,driver_version,memory.total,compute_mode --format=csv,noheader ||
      echo "no nvidia-smi (a dry run on the stand-in?)"
    [ -n "$py" ] && echo "python: $py; torch: $("$py" -c 'import torch; print(torch.__version__, "NCCL", torch.cuda.nccl.version())' 2>&1)"
    echo "NVIDIA NCCL: $nvlib; header: $nvinc; driver: $cudalib; NVRTC: $STRATA_NVRTC_DIR"
    echo "MPS: $(command -v nvidia-cuda-mps-control || echo none)"
  } > "$out/env.log" 2>&1
  cat "$out/env.log"
fi

# The harness against NVIDIA's header and library; strata is preloaded over the same binary.
harness=/tmp/strata-gpu-bench
if [ -n "$nvlib" ] && [ -n "$nvinc" ] && [ -n "$cudalib" ]; then
  cc -O2 -std=c11 -o "$harness" benches/gpu_bench.c -I"$(dirname "$nvinc")" -Iffi/tests/c/cuda-standin \
    -L"$(dirname "$nvlib")" -lnccl -Wl,-rpath,"$(dirname "$nvlib")" "$cudalib" -ldl || failed="$failed cc"
else
  echo "no NVIDIA NCCL wheel: the harness runs strata alone (both columns)"
  mkdir -p /tmp/strata-lib && ln -sf "$strata" /tmp/strata-lib/libnccl.so.2
  cc -O2 -std=c11 -o "$harness" benches/gpu_bench.c -Iffi/include -L/tmp/strata-lib -l:libnccl.so.2 \
    -Wl,-rpath,/tmp/strata-lib "$cudalib" -ldl || failed="$failed cc"
fi
lib_env() { # lib_env nccl|strata: the environment that picks the library
  if [ "$1" = strata ]; then echo "LD_PRELOAD=$strata"; else echo "STRATA_UNUSED=1"; fi
}

want copy && step copy 30 "$harness" copy "$max"

# 2 ranks as threads, NCCL first in each round (a first NCCL figure exists even if cut short).
if want threads; then
  for round in 1 2 3; do
    for lib in nccl strata; do
      TAIL=2 step "threads_${lib}_r$round" 100 env "$(lib_env $lib)" "$harness" threads 2 8 "$max"
    done
  done
fi

# NVIDIA's NCCL steered by strata's tuner plugin: loaded by name, priced at init, runs.
if want tuner; then
  if [ -n "$nvlib" ] && [ -f "$bin/libnccl-tuner-strata.so" ]; then
    TAIL=4 step tuner 100 env NCCL_TUNER_PLUGIN="$bin/libnccl-tuner-strata.so" \
      STRATA_TOPO_FILE="$PWD/examples/topology/meta-24k-h100.toml" NCCL_DEBUG=INFO \
      NCCL_DEBUG_SUBSYS=INIT,TUNING "$harness" threads 2 8 $((1 << 20))
    grep -h "strata tuner:\|TUNER/Plugin\|tuner plugin" "$out/tuner.log" | sort | uniq -c | head -5
    grep -q "strata tuner: 2 ranks on 1 nodes" "$out/tuner.log" || failed="$failed tuner_not_loaded"
  else
    echo "== tuner: skipped (needs NVIDIA's NCCL wheel and $bin/libnccl-tuner-strata.so)"
  fi
fi

procs() { # procs NAME LIB MAX LIMIT: gpu_bench as 2 processes
  local name=$1 lib=$2 max=$3 limit=$4 idf
  idf=$(mktemp -u /tmp/strata-gpu-id.XXXXXX)
  # shellcheck disable=SC2016
  TAIL=2 step "$name" "$limit" bash -c '
    for r in 0 1; do
      env '"$(lib_env "$lib")"' RANK=$r WORLD_SIZE=2 NCCL_TEST_ID_FILE='"$idf"' '"$harness"' procs 8 '"$max"' &
    done
    wait'
  rm -f "$idf"
}

if want mps; then
  if command -v nvidia-cuda-mps-control >/dev/null; then
    mps=$(mktemp -d /tmp/strata-mps.XXXXXX)
    export CUDA_MPS_PIPE_DIRECTORY="$mps/pipe" CUDA_MPS_LOG_DIRECTORY="$mps/log"
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    trap 'echo quit | nvidia-cuda-mps-control 2>/dev/null' EXIT
    if nvidia-cuda-mps-control -d; then
      for round in 1 2; do
        for lib in nccl strata; do procs "mps_${lib}_r$round" "$lib" "$max" 120; done
      done
      # CUDA IPC and stream memory operations between MPS clients: strata's stream programs
      # and kernels need both; a right result says they work.
      TAIL=4 step mps_strata_check 60 "$cb" --np 2 --device cuda -d all -b 8 -e 4M -f 64 -n 1 -w 1 -c 1
      TAIL=4 step mps_strata_check_programs 60 env STRATA_GPU_KERNEL=off "$cb" --np 2 --device cuda -b 8 -e 4M -f 64 -n 1 -w 1 -c 1
      TAIL=2 step mps_stop 10 bash -c 'echo quit | nvidia-cuda-mps-control'
    else
      echo "the MPS daemon did not start (log: $CUDA_MPS_LOG_DIRECTORY)"
    fi
    trap - EXIT
  else
    echo "no nvidia-cuda-mps-control: processes time-sliced on the GPU, sizes to 1 MiB"
    for lib in nccl strata; do procs "procs_${lib}_r1" "$lib" $((1 << 20)) 90; done
  fi
fi

if want ddp && [ -n "$py" ]; then
  for lib in nccl strata; do
    mps_env=""
    [ -n "${mps:-}" ] && nvidia-cuda-mps-control -d 2>/dev/null && mps_env=1
    TAIL=3 step "ddp_$lib" 120 env "$(lib_env $lib)" "$py" -m torch.distributed.run --standalone \
      --nproc-per-node 2 scripts/gpu_ddp.py --steps 30 --out "$out/ddp_$lib.json"
    [ -n "$mps_env" ] && echo quit | nvidia-cuda-mps-control
  done
fi

if want owed; then
  for t in a_stream_program_waiting_on_a_rank_that_never_calls_times_out_naming_it \
    a_kernel_waiting_on_a_rank_that_never_calls_times_out_naming_it; do
    TAIL=3 step "owed_$t" 60 env STRATA_GPU_TESTS_REAL=1 "$bin/gpu_faults" --exact "$t" --test-threads=1
  done
  # Megatron-LM sets CUDA_DEVICE_MAX_CONNECTIONS=1: every stream of a process then shares one
  # hardware queue, so a stream waiting on a peer holds up the process's others.
  TAIL=4 step owed_queues_1 60 env CUDA_DEVICE_MAX_CONNECTIONS=1 STRATA_GPU_KERNEL=off "$cb" --np 2 --device cuda --algo all -b 8 -e 4M -f 512 -n 1 -w 1 -c 1
  TAIL=3 step owed_queues_1_timeout 70 env CUDA_DEVICE_MAX_CONNECTIONS=1 STRATA_GPU_TESTS_REAL=1 "$bin/gpu_faults" --exact \
    a_stream_program_waiting_on_a_rank_that_never_calls_times_out_naming_it --test-threads=1
fi

if want check; then
  for op in all_reduce all_gather reduce_scatter broadcast reduce; do
    TAIL=3 step "check_threads_$op" 60 "$cb" --threads 2 --device cuda --op "$op" -d all -o all -b 8 -e 1M -f 64 -n 1 -w 1 -c 1
  done
  TAIL=3 step check_threads_programs 60 env STRATA_GPU_KERNEL=off "$cb" --threads 2 --device cuda -d all -b 8 -e 1M -f 64 -n 1 -w 1 -c 1
fi

"${py:-python3}" scripts/gpu_summary.py "$out" | tee "$out/summary.txt"
# At most 8 files come back from a lent machine: the logs go as one archive.
(cd "$out" && tar czf logs.tgz ./*.log ./*.json && rm -f ./*.log)
echo "logs in $out/logs.tgz, table in $out/summary.txt, JSON in $out/summary.json"
if [ -n "$failed" ]; then
  echo "steps that failed:$failed"
  exit 1
fi
