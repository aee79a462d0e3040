"""strata as a torch.distributed backend.

``import strata_torch`` registers the backend ``"strata"`` for CPU tensors; then

    torch.distributed.init_process_group("strata")

works under torchrun (or with any init_method): rank, world size and the c10d store come from
PyTorch, and rank 0 shares strata's unique id through that store. Sub-groups
(``dist.new_group``) get their own strata communicator, rendezvoused the same way through the
sub-group's store.
"""

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
    )


def nccl_version():
    """The NCCL API level strata's library reports, as (major, minor, patch)."""
    v = library().version()
    return (v // 10000, v // 100 % 100, v % 100)


if BACKEND.upper() not in dist.Backend._plugins:
    dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu"])
