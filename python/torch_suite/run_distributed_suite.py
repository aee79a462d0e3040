"""PyTorch's own distributed test suite (`torch.testing._internal.distributed.distributed_test`,
the one `test/distributed/test_distributed_spawn.py` runs) on the strata backend.

    BACKEND=strata WORLD_SIZE=3 TEMP_DIR=$(mktemp -d) PYTHONPATH=python STRATA_LIB=... \\
        python python/torch_suite/run_distributed_suite.py [--gated-as-gloo] [unittest args]

A third-party backend is admitted by naming it in `DistTestCases.backend_feature["plugin"]`,
`["ddp"]` and `["subgroup"]` before the module is imported (plugin mode). With
`--gated-as-gloo` (or `STRATA_SUITE_GATE=gloo`) the module is imported as for gloo, so every
test gloo runs on CPU runs (and the tests' own checks of BACKEND take gloo's branches), while
every process group they make is strata's: a group asked of gloo, by name or by default, is
made on strata. Each test spawns WORLD_SIZE processes, which import this file again: the
set-up below runs in each. Checked against torch 2.15.0 (needs `expecttest` from PyPI).
"""

import os
import sys
import unittest

if "--gated-as-gloo" in sys.argv:
    sys.argv.remove("--gated-as-gloo")
    os.environ["STRATA_SUITE_GATE"] = "gloo"
GATE = os.environ.get("STRATA_SUITE_GATE", "plugin")
# PyTorch's runner writes JUnit XML (and needs `xmlrunner`) whenever CI is set in the
# environment, as CI machines do; this runner reports on stdout only.
os.environ.pop("CI", None)
os.environ.setdefault("BACKEND", "strata")
os.environ["BACKEND"] = "gloo" if GATE == "gloo" else "strata"

import strata_torch  # noqa: E402,F401  (registers the backend)
from torch.testing._internal.common_distributed import DistTestCases  # noqa: E402

if GATE != "gloo":
    for feature in ("plugin", "ddp", "subgroup"):
        DistTestCases.backend_feature[feature].add("strata")

from torch.testing._internal.common_utils import run_tests  # noqa: E402
from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest,
    TestDistBackend,
)

if GATE == "gloo":
    # Gated as for gloo, and the tests' own checks of BACKEND still read "gloo"; every
    # process group they make is strata's: gloo asked for by name, or by default, is strata.
    import torch.distributed as dist  # noqa: E402

    def _as_strata(backend):
        return "strata" if backend is None or str(backend).lower() == "gloo" else backend

    _init, _new_group = dist.init_process_group, dist.new_group

    def init_process_group(backend=None, *args, **kwargs):
        return _init(_as_strata(backend), *args, **kwargs)

    def new_group(ranks=None, timeout=None, backend=None, *args, **kwargs):
        return _new_group(ranks, timeout, _as_strata(backend), *args, **kwargs)

    dist.init_process_group, dist.new_group = init_process_group, new_group


class TestStrataWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()


if GATE == "gloo":
    # The one test gated mode cannot pass by construction: it asserts that the default
    # group's backend is named "gloo", and here every gloo group is strata's. unittest
    # prints the reason with the skip.
    TestStrataWithSpawn.test_get_backend = unittest.skip(
        "gated as for gloo: asserts the backend is named gloo; the group is strata's by construction"
    )(TestStrataWithSpawn.test_get_backend)


def _skip_decided_before_spawning():
    """The suite's run-time skips whose answer the parent already knows. A test wrapped in
    `skip_if_small_worldsize` (WORLD_SIZE below 8, unless MPI), `skip_if_no_gpu` (fewer
    accelerators than ranks) or `skip_if_lt_x_gpu(x)` (fewer than x, unless it allows CPU and
    there is none) spawns WORLD_SIZE processes only to have each exit with the skip code,
    about 10 s on a 2-core machine. Such a test is skipped here, by the same rule and with the
    suite's own words; every other test is left as it is."""
    import torch
    from torch.testing._internal.common_distributed import TEST_SKIPS

    world_size = int(os.environ["WORLD_SIZE"])
    available = torch.accelerator.is_available()
    devices = torch.accelerator.device_count() if available else 0

    def closure(f, name):
        names = f.__code__.co_freevars
        return f.__closure__[names.index(name)].cell_contents if name in names else None

    def reason(f):
        # functools.wraps copies the test's name onto a wrapper; its code keeps its own.
        outer = getattr(getattr(f, "__code__", None), "co_qualname", "").split(".<locals>")[0]
        if outer == "skip_if_small_worldsize":
            if os.environ["BACKEND"] != "mpi" and world_size < 8:
                return TEST_SKIPS["small_worldsize"].message
        elif outer == "skip_if_no_gpu":
            if not available:
                return TEST_SKIPS["no_accelerator"].message
            if devices < world_size:
                return TEST_SKIPS[f"multi-device-{world_size}"].message
        elif outer == "skip_if_lt_x_gpu":
            x = getattr(f, "_min_gpus_required", None)
            if x is not None and devices < x and not (closure(f, "allow_cpu") and not available):
                return TEST_SKIPS[f"multi-device-{x}"].message
        return None

    for name in unittest.TestLoader().getTestCaseNames(TestStrataWithSpawn):
        f = getattr(TestStrataWithSpawn, name)
        while f is not None and not getattr(f, "__unittest_skip__", False):
            why = reason(f)
            if why is not None:
                test = getattr(TestStrataWithSpawn, name)
                setattr(TestStrataWithSpawn, name, unittest.skip(why)(test))
                break
            f = getattr(f, "__wrapped__", None)


_skip_decided_before_spawning()


if __name__ == "__main__":
    run_tests()
