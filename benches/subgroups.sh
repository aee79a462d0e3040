#!/usr/bin/env bash
# Making process groups on strata against gloo: python/bench_groups.py under torchrun, the two
# backends in interleaved rounds, medians of the slowest rank's times.
#
#   NP=4 ROUNDS=7 bash benches/subgroups.sh      (STRATA_TORCH_PYTHON: a Python with torch)
set -euo pipefail
cd "$(dirname "$0")/.."
np="${NP:-4}" rounds="${ROUNDS:-7}"
py="${STRATA_TORCH_PYTHON:-python3}"
cargo build --release -p strata-ffi -q
out=$(mktemp)
for round in $(seq "$rounds"); do
  for backend in strata gloo; do
    PYTHONPATH="$PWD/python" STRATA_LIB="$PWD/target/release/libstrata_ffi.so" \
      STRATA_SOCKET_IFNAME="=lo" OMP_NUM_THREADS=1 timeout -s KILL 120 \
      "$py" -m torch.distributed.run --standalone --nproc-per-node "$np" python/bench_groups.py \
      --backend "$backend" 2>/dev/null | sed -n 's/^GROUPS //p' >> "$out"
  done
done
"$py" - "$out" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
keys = ["init_ms", "new_group_ms", "device_mesh_ms"]
by = {b: [r for r in runs if r["backend"] == b] for b in ("strata", "gloo")}
print(f"{runs[0]['np']} processes, {len(by['strata'])} and {len(by['gloo'])} runs, medians (ms):")
print(f"{'':16} {'strata':>9} {'gloo':>9} {'gloo/strata':>12}")
for k in keys:
    s = statistics.median(r[k] for r in by["strata"])
    g = statistics.median(r[k] for r in by["gloo"])
    print(f"{k:16} {s:9.2f} {g:9.2f} {g / s:12.2f}")
PY
rm -f "$out"
