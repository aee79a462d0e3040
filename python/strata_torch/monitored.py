"""``dist.monitored_barrier`` for strata groups: a barrier that names the ranks that did not
arrive, with gloo's semantics and words (PyTorch's tests match them).

It runs over the group's c10d store, not the communicator, so it works while the
communicator is busy or stuck in a collective (the case it is for: some ranks hung in a
collective, the others asking who) and a failure leaves the communicator as it was. Each call
is numbered on each rank; rank 0 waits for every other rank's arrival key in rank order (or
for all of them at once with ``wait_all_ranks``) within the timeout, then releases them.
"""

import time
from datetime import timedelta

_POLL_S = 0.002


def _ms(seconds):
    return int(round(seconds * 1000))


def _key(number, *parts):
    """The store key of barrier ``number``'s ``parts`` (``release``, or ``arrived`` and a rank)."""
    return "/".join(["strata/monitored_barrier", str(number), *map(str, parts)])


def _arrived(store, key):
    return store.check([key])


def monitored_barrier(store, rank, size, number, timeout, wait_all_ranks, describe=None):
    """Runs barrier ``number`` of this group through ``store``; raises RuntimeError naming
    the ranks that did not arrive within ``timeout`` (a timedelta or seconds). ``describe``
    returns what this rank's communicator knows (its fault, if any) for the message."""
    seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
    start = time.monotonic()
    deadline = start + max(seconds, 0.0)
    release = _key(number, "release")
    if rank != 0:
        store.set(_key(number, "arrived", rank), "1")
        while not _arrived(store, release):
            if time.monotonic() >= deadline:
                raise RuntimeError(
                    f"Rank {rank} successfully reached monitoredBarrier, but received errors "
                    f"while waiting for send/recv from rank 0: rank 0 did not release barrier "
                    f"{number} within {_ms(seconds)} ms{_detail(describe)}"
                )
            time.sleep(_POLL_S)
        return
    others = list(range(1, size))
    if wait_all_ranks:
        missing = others
        while missing:
            missing = [r for r in missing if not _arrived(store, _key(number, "arrived", r))]
            if missing and time.monotonic() >= deadline:
                break
            if missing:
                time.sleep(_POLL_S)
        if missing:
            ranks = ", ".join(str(r) for r in missing)
            word = "Ranks" if len(missing) > 1 else "Rank"
            raise RuntimeError(
                f"{word} {ranks} failed to pass monitoredBarrier in {_ms(seconds)} ms"
                f"{_detail(describe)}"
            )
    else:
        for r in others:
            key = _key(number, "arrived", r)
            spent_before = time.monotonic() >= deadline
            while not _arrived(store, key):
                now = time.monotonic()
                if spent_before:
                    # The whole budget went before this rank's turn (or it was zero).
                    raise RuntimeError(
                        f"Rank 0 timed out in monitoredBarrier after {_ms(now - start)} ms"
                        f"{_detail(describe)}"
                    )
                if now >= deadline:
                    raise RuntimeError(
                        f"Rank {r} failed to pass monitoredBarrier in {_ms(seconds)} ms"
                        f"{_detail(describe)}"
                    )
                time.sleep(_POLL_S)
    # Every rank has arrived at this barrier, so each is past the one before: its release
    # key and this barrier's arrival keys are no longer read by anyone.
    _forget(store, [_key(number, "arrived", r) for r in others] + [_key(number - 1, "release")])
    store.set(release, "1")


def _forget(store, keys):
    """Deletes ``keys`` from the store (a job calling this every step must not grow the
    store); a store that cannot delete keeps them."""
    for key in keys:
        try:
            store.delete_key(key)
        except (RuntimeError, NotImplementedError, AttributeError):
            return


def _detail(describe):
    if describe is None:
        return ""
    known = describe()
    return f" ({known})" if known else ""
