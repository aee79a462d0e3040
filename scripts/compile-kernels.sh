#!/usr/bin/env bash
# Compiles every CUDA kernel in src/gpu/kernels (reduce.cu, then ll.cu, as one program) with NVRTC and assembles it for sm_80 and sm_90
# with ptxas, from NVIDIA's PyPI packages (no GPU and no CUDA toolkit needed). The packages go
# into a cached virtual environment (~/.cache/strata/nvrtc-12.9.86-venv).
set -euo pipefail
cd "$(dirname "$0")/.."
version=12.9.86
venv="${STRATA_CACHE:-$HOME/.cache/strata}/nvrtc-$version-venv"
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import nvidia.cuda_nvrtc, nvidia.cuda_nvcc' 2>/dev/null; then
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --no-deps "nvidia-cuda-nvrtc-cu12==$version" "nvidia-cuda-nvcc-cu12==$version"
fi
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
out="${1:-target/kernels}"
"$venv/bin/python" scripts/compile_kernels.py \
  --nvrtc "$site/nvidia/cuda_nvrtc/lib/libnvrtc.so.12" \
  --ptxas "$site/nvidia/cuda_nvcc/bin/ptxas" \
  --out "$out" src/gpu/kernels/reduce.cu src/gpu/kernels/ll.cu
# Where libnvrtc.so.12 is, for the tests that compile the kernels at run time.
echo "$site/nvidia/cuda_nvrtc/lib" > "$out/nvrtc-dir"
