#!/usr/bin/env bash
# Installs PyTorch from PyPI into a virtual environment kept between runs, and prints its
# python. Used by .ci/run; a user can run it too:
#
#   python=$(scripts/install-torch.sh)          # ~/.cache/strata/torch-<version>-venv
#
# PyPI's torch for Linux is a CUDA build: its libraries need the CUDA wheels it names (cuDNN,
# cuBLAS, NCCL, ...) just to import, even on a machine without a GPU. The smallest install that
# still imports and runs CPU collectives is torch itself plus those wheels and its pure-Python
# dependencies, without triton (1 GB, used only by torch.compile) and cuda-bindings: about
# 4.4 GB instead of 5.4 GB. The venv is reused while it imports torch at the pinned version.
# torchft (Meta's per-step fault tolerance, for strata_torch.torchft and its test) and
# expecttest (which PyTorch's own distributed test suite imports) go into the same venv; their
# requirements are small, and torch already satisfies torchft's torch>=2.7.
set -euo pipefail
TORCH_VERSION="${STRATA_TORCH_VERSION:-2.15.0}"
TORCHFT_VERSION=0.2.0
venv="${XDG_CACHE_HOME:-$HOME/.cache}/strata/torch-$TORCH_VERSION-venv"
py="$venv/bin/python"
pip=("$py" -m pip install --quiet --disable-pip-version-check)
ensure_extras() {
    if ! "$py" -c "import importlib.metadata as m; assert m.version('torchft') == '$TORCHFT_VERSION'" 2>/dev/null; then
        echo "installing torchft $TORCHFT_VERSION" >&2
        "${pip[@]}" "torchft==$TORCHFT_VERSION" >&2
    fi
    if ! "$py" -c "import expecttest" 2>/dev/null; then
        echo "installing expecttest" >&2
        "${pip[@]}" expecttest >&2
    fi
}
if "$py" -c "import torch, numpy; assert torch.__version__.split('+')[0] == '$TORCH_VERSION'" 2>/dev/null; then
    ensure_extras
    echo "$py"
    exit 0
fi
rm -rf "$venv"
python3 -m venv "$venv"
"${pip[@]}" --no-deps "torch==$TORCH_VERSION" >&2
# torch's requirements for Linux, read from the wheel that was just installed, less triton and
# cuda-bindings (see above).
reqs=$("$py" - <<'PY'
import importlib.metadata as md
skip = ("triton", "cuda-bindings")
for r in md.requires("torch") or []:
    name, _, marker = r.partition(";")
    if "extra ==" in marker or name.strip().startswith(skip):
        continue
    print(name.strip())
PY
)
mapfile -t reqs <<<"$reqs"
echo "installing torch's requirements less triton and cuda-bindings (pip will say torch requires them)" >&2
"${pip[@]}" numpy "${reqs[@]}" >&2
"$py" -c "import torch, torch.distributed as d; assert d.is_available()" >&2
ensure_extras
echo "$py"
