#!/usr/bin/env bash
# Builds and strips what scripts/gpu-lent-check.sh runs on a lent GPU machine (which has no
# Rust toolchain) into .gpu/ (git-ignored; carry it there): collbench, the drop-in
# libstrata_ffi.so, the tuner plugin for NVIDIA's NCCL and the GPU fault tests.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --bin collbench -p strata -p strata-ffi >&2
# The plugin's cdylib (a --bin build leaves library targets of other packages out); with strata
# in the build, the dependencies it shares are those already built, not built again.
cargo build --release -p strata -p strata-nccl-tuner >&2
cargo test --release --no-run --test gpu_faults >&2
mkdir -p .gpu
strip -o .gpu/collbench target/release/collbench
strip -o .gpu/libstrata_ffi.so target/release/libstrata_ffi.so
strip -o .gpu/libnccl-tuner-strata.so target/release/libnccl_tuner_strata.so
faults=$(ls -t target/release/deps/gpu_faults-* | grep -v '\.d$' | head -1)
strip -o .gpu/gpu_faults "$faults"
du -sh .gpu/* >&2
echo .gpu
