"""torchft on strata: a reconfigurable process group for torchft's Manager.

    from strata_torch.torchft import ProcessGroupStrataFT
    manager = torchft.Manager(pg=ProcessGroupStrataFT(), ...)

At each quorum torchft's Manager calls ``configure`` with a fresh store address: the group
aborts the communicator it had (ending any call in flight) and makes a new strata
communicator of the quorum's replicas through that store. ``errored`` reports the
communicator's fault (a dead or hung replica named by strata's watchdog) so the Manager skips
the step and reconfigures; ``abort`` interrupts calls in flight. Needs ``torchft`` (PyPI).
"""

from datetime import timedelta

from torchft.process_group import ProcessGroupWrapper

from .process_group import ProcessGroupStrata

__all__ = ["ProcessGroupStrataFT"]


class ProcessGroupStrataFT(ProcessGroupWrapper):
    """A torchft ``ProcessGroupWrapper`` whose group is a strata communicator."""

    def __init__(self, timeout=timedelta(seconds=60)):
        super().__init__(timeout=timeout)
        self._errored = None

    def _create_pg(self, store, rank, world_size):
        return ProcessGroupStrata(store, rank, world_size, timeout=self._timeout)

    def configure(self, store_addr, replica_id, rank, world_size, *args, **kwargs):
        self._errored = None
        super().configure(store_addr, replica_id, rank, world_size, *args, **kwargs)

    def abort(self, errored=True):
        # Set first, so that errored() says so while the abort releases waiting calls.
        if errored:
            self._errored = RuntimeError("strata: the process group was aborted")
        super().abort(errored=errored)

    def errored(self):
        if self._errored is not None:
            return self._errored
        pg = self._pg
        message = pg.async_error() if isinstance(pg, ProcessGroupStrata) else None
        return RuntimeError(f"strata: {message}") if message else None

    def getBackendName(self):
        return "torchft-strata"
