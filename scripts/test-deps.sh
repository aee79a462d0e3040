#!/usr/bin/env bash
# Installs what the whole test suite needs, into caches kept between runs, and prints the
# settings that point the tests at it as `export` lines (the progress goes to stderr):
#
#   deps="$(scripts/test-deps.sh)" && eval "$deps"
#
# * Debian packages (as root, or with passwordless sudo): libhwloc-dev, libudev-dev and
#   pkg-config for the `hwloc` feature; libfabric1 for the libfabric transport's tests;
#   slurmctld, slurmd and slurm-client for the tests under a real Slurm (tests/slurm.rs);
#   prometheus, which scrapes a running job in tests/metrics.rs.
# * PyTorch from PyPI in a cached venv (scripts/install-torch.sh; it has numpy, torchft and
#   expecttest too): STRATA_TORCH_PYTHON.
# * NVIDIA's nccl.h and libnccl.so.2 from the nvidia-nccl-cu13 wheel torch pins:
#   STRATA_NVIDIA_NCCL_DIR.
# * NVRTC and ptxas from PyPI, which compile the CUDA kernels (scripts/compile-kernels.sh):
#   STRATA_NVRTC_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
[ "$(id -u)" = 0 ] || SUDO="sudo -n"
apt_install() {
    echo "installing Debian packages: $*" >&2
    $SUDO apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "$@" >/dev/null
}
if ! pkg-config --exists hwloc 2>/dev/null || ! pkg-config --exists libudev 2>/dev/null; then
    apt_install libhwloc-dev libudev-dev pkg-config
fi
ldconfig -p | grep -q 'libfabric\.so\.1 ' || apt_install libfabric1
command -v slurmd >/dev/null && command -v srun >/dev/null ||
    apt_install --no-install-recommends slurmctld slurmd slurm-client
command -v prometheus >/dev/null || apt_install --no-install-recommends prometheus

torch_python="$(scripts/install-torch.sh)"
"$torch_python" -c "import torch; print('torch', torch.__version__, 'pins NCCL', torch.cuda.nccl.version())" >&2
nccl_dir="$("$torch_python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/nvidia/nccl"
[ -f "$nccl_dir/include/nccl.h" ] && [ -f "$nccl_dir/lib/libnccl.so.2" ] ||
    { echo "no NVIDIA NCCL in $nccl_dir" >&2; exit 1; }

scripts/compile-kernels.sh target/kernels >&2
nvrtc_dir="$(cat target/kernels/nvrtc-dir)"

printf 'export STRATA_TORCH_PYTHON=%q\n' "$torch_python"
printf 'export STRATA_NVIDIA_NCCL_DIR=%q\n' "$nccl_dir"
printf 'export STRATA_NVRTC_DIR=%q\n' "$nvrtc_dir"
echo 'export STRATA_TEST_DEPS_READY=1'
