"""The c10d Backend a ProcessGroupStrata registers for the CPU device.

torch.distributed's Python functions call the group's own methods; this Backend is what C++
finds when it asks the group for its CPU backend (the dispatcher's collectives, the group's
name and device types). Each call is handed to the group. It holds the group weakly: the
group's C++ side holds this Backend, and a strong reference back would keep both alive.
"""

import weakref

from torch._C._distributed_c10d import Backend as C10dBackend

# Every call c10d may route to a CPU backend, by the names its trampoline looks up.
CALLS = (
    "allreduce",
    "allreduce_coalesced",
    "broadcast",
    "reduce",
    "allgather",
    "all_gather_single",
    "_allgather_base",
    "allgather_coalesced",
    "allgather_into_tensor_coalesced",
    "reduce_scatter",
    "reduce_scatter_single",
    "_reduce_scatter_base",
    "reduce_scatter_tensor_coalesced",
    "all_to_all_single",
    "alltoall_base",
    "alltoall",
    "gather",
    "scatter",
    "send",
    "recv",
    "recv_anysource",
    "barrier",
    "monitored_barrier",
    "start_coalescing",
    "end_coalescing",
)


class _CpuBackend(C10dBackend):
    """Hands each c10d call to the ProcessGroupStrata that made it (see the module doc)."""

    def __init__(self, group):
        super().__init__(group.rank(), group.size())
        self._group = weakref.ref(group)

    def getBackendName(self):
        return "strata"

    def _owner(self):
        group = self._group()
        if group is None:
            raise RuntimeError("strata: this backend's process group is gone")
        return group


def _handing_to_group(name):
    def call(self, *args, **kwargs):
        return getattr(self._owner(), name)(*args, **kwargs)

    call.__name__ = name
    return call


for _name in CALLS:
    setattr(_CpuBackend, _name, _handing_to_group(_name))
