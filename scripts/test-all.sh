#!/usr/bin/env bash
# The README's test command: every test, none skipped. It installs what the tests need into
# caches (scripts/test-deps.sh; the first run downloads PyTorch, about 4.4 GB), then runs the
# workspace's tests with STRATA_TESTS_ALL=1, under which a test that would skip fails instead,
# and the topology crate's tests with the hwloc feature. Extra arguments go to cargo test
# (a filter, for example). Needs root, or passwordless sudo for the packages: the emulated
# hosts are network namespaces.
#
# Plain `cargo test --release --workspace` is the quick inner loop: it installs nothing, and
# the tests whose tools are missing print one SKIPPED line each.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" != 0 ]; then
    echo "scripts/test-all.sh: the network-namespace tests need root; run it as root" >&2
    exit 2
fi
if [ -z "${STRATA_TEST_DEPS_READY:-}" ]; then
    deps="$(scripts/test-deps.sh)"   # (an assignment, so that a failure stops the run)
    eval "$deps"
fi
export STRATA_TESTS_ALL=1
export STRATA_SOCKET_IFNAME="${STRATA_SOCKET_IFNAME:-=lo}"   # the tests stay on loopback
cargo test --release --workspace "$@"
if [ $# = 0 ]; then
    cargo test --release -p strata-topology --features hwloc
fi
