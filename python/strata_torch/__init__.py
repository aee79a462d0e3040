"""strata as a torch.distributed backend.

``import strata_torch`` registers the backend ``"strata"`` for CPU tensors; then

    torch.distributed.init_process_group("strata")

works under torchrun (or with any init_method): rank, world size and the c10d store come from
PyTorch, and rank 0 shares strata's unique id through that store. Sub-groups
(``dist.new_group``) get their own strata communicator, made by their members alone from the
default group's table when that group is strata's (no message, no store), else rendezvoused
through the sub-group's store as the default group was.
"""

import os
from datetime import timedelta

import torch.distributed as dist

from ._nccl import NcclError, library_path
from .process_group import ProcessGroupStrata, library

__all__ = ["BACKEND", "NcclError", "ProcessGroupStrata", "library", "library_path", "nccl_version"]

BACKEND = "strata"


def _create(dist_backend_opts, backend_options=None):
    timeout = dist_backend_opts.timeout or timedelta(minutes=10)
    return ProcessGroupStrata(
        dist_backend_opts.store,
        dist_backend_opts.group_rank,
        dist_backend_opts.group_size,
        timeout,
        parent=_world_parent(dist_backend_opts),
    )


def _world_parent(opts):
    """For a sub-group of a job whose default group is strata's: (that group, the sub-group's
    global ranks, its name), from which its members alone make its communicator with no
    message (strataCommSubgroup). None for the default group itself, or when the default
    group is not strata's (the sub-group then rendezvouses through its store)."""
    ranks = list(opts.global_ranks_in_group or [])
    if not ranks or not dist.is_initialized():
        return None
    default = dist.distributed_c10d._get_default_group()
    world = getattr(default, "_strata_parent", lambda: None)()
    if world is None:
        return None
    return world, ranks, str(opts.group_id)


def nccl_version():
    """The NCCL API level strata's library reports, as (major, minor, patch)."""
    v = library().version()
    return (v // 10000, v // 100 % 100, v % 100)


if BACKEND.upper() not in dist.Backend._plugins:
    dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu"])

# PyTorch attaches its FlightRecorder hook to every group whose backend does not record its
# own calls, and attaching it costs 6-18 ms per group (measured on torch 2.15, most of the
# time of making a sub-group). strata records its own calls (its flight recorder, written out
# on a fault: docs/faults.md), so it is listed with gloo as recording itself, unless
# STRATA_TORCH_FLIGHT_RECORDER=1 asks for PyTorch's recorder as well.
_self_recording = getattr(dist.distributed_c10d, "_FR_SELF_RECORDING_BACKENDS", None)
if isinstance(_self_recording, set) and os.environ.get("STRATA_TORCH_FLIGHT_RECORDER") != "1":
    _self_recording.add(BACKEND)
