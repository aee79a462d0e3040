#!/usr/bin/env bash
# torchrun restarts with c10d rendezvous at an endpoint (a store that outlives an attempt),
# strata beside gloo: 4 workers, --max-restarts 2, worker 1 exits with status 1 at step 5 of
# the first attempt (python/tests/check_restart.py). Prints one line per backend: how it
# ended, in which attempt, and how long it took.
#
#   scripts/torchrun_restart.sh [limit seconds per backend, default 180]
set -uo pipefail
cd "$(dirname "$0")/.."
limit="${1:-180}"
python="${STRATA_TORCH_PYTHON:-$(scripts/install-torch.sh)}"
cargo build --release -q -p strata-ffi
export PYTHONPATH="$PWD/python" STRATA_LIB="$PWD/target/release/libstrata_ffi.so"
export STRATA_SOCKET_IFNAME="${STRATA_SOCKET_IFNAME:-=lo}" OMP_NUM_THREADS=1
log="$(mktemp -d)"
trap 'rm -rf "$log"' EXIT
port=$((29600 + RANDOM % 300))
for backend in strata gloo; do
    port=$((port + 1))
    start=$(date +%s.%N)
    timeout "$limit" "$python" -m torch.distributed.run --nproc-per-node 4 --max-restarts 2 \
        --rdzv-backend c10d --rdzv-endpoint "127.0.0.1:$port" \
        python/tests/check_restart.py --backend "$backend" > "$log/$backend" 2>&1
    rc=$?
    took=$(echo "$(date +%s.%N) - $start" | bc)
    finished=$(grep -c "^RESTART ok attempt" "$log/$backend")
    attempt=$(grep -o "^RESTART ok attempt [0-9]*" "$log/$backend" | awk '{print $4}' | sort -u | tr '\n' ' ')
    if [ "$rc" = 124 ]; then verdict="did not finish in $limit s"; elif [ "$rc" = 0 ]; then verdict="finished"; else verdict="failed (exit $rc)"; fi
    printf '%-6s %-26s %d of 4 workers finished, in attempt %s %6.1f s\n' \
        "$backend" "$verdict" "$finished" "${attempt:-none}" "$took"
done
