#!/usr/bin/env bash
# Builds strata's drop-in NCCL and lays it out as NCCL's wheel does:
#   target/strata-nccl/lib/libnccl.so.2   (SONAME libnccl.so.2)
#   target/strata-nccl/lib/libnccl.so     -> libnccl.so.2   (for -lnccl)
#   target/strata-nccl/lib/libstrata.so   -> libnccl.so.2
#   target/strata-nccl/include/nccl.h
# Prints the folder. Use it with LD_PRELOAD=target/strata-nccl/lib/libnccl.so.2, or compile
# against include/ and link with -L target/strata-nccl/lib -lnccl.
set -euo pipefail
cd "$(dirname "$0")/.."
# With strata itself in the build, its dependencies get the features they get in `cargo test
# --workspace` and `cargo run`, so that an earlier build's are reused rather than rebuilt.
cargo build --release -p strata -p strata-ffi >&2
out=target/strata-nccl
mkdir -p "$out/lib" "$out/include"
cp target/release/libstrata_ffi.so "$out/lib/libnccl.so.2.tmp"
mv "$out/lib/libnccl.so.2.tmp" "$out/lib/libnccl.so.2"
ln -sfn libnccl.so.2 "$out/lib/libnccl.so"
ln -sfn libnccl.so.2 "$out/lib/libstrata.so"
cp ffi/include/nccl.h "$out/include/nccl.h"
echo "$PWD/$out"
