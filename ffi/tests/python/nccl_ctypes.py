"""One rank of a multi-process check of strata's libnccl.so.2 through ctypes and numpy.

Environment: RANK, WORLD_SIZE, NCCL_TEST_ID_FILE (rank 0 writes the unique id there, the
others read it) and STRATA_NCCL_LIB (the library to load). Every collective runs on numpy
arrays of several element types and is checked against numpy's own arithmetic; then a group
of sends and receives, the error codes of bad arguments and a non-blocking communicator.
Exit status 0 means every check passed.
"""

import ctypes
import os
import sys
import time

import numpy as np

SUCCESS, INVALID_ARGUMENT, INVALID_USAGE, IN_PROGRESS = 0, 4, 5, 7
SUM, PROD, MAX, MIN, AVG = 0, 1, 2, 3, 4
DTYPES = {
    np.int8: 0,
    np.uint8: 1,
    np.int32: 2,
    np.uint32: 3,
    np.int64: 4,
    np.uint64: 5,
    np.float16: 6,
    np.float32: 7,
    np.float64: 8,
}


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


class Config(ctypes.Structure):
    """ncclConfig_t, NCCL 2.30's layout."""

    _fields_ = [
        ("size", ctypes.c_size_t),
        ("magic", ctypes.c_uint),
        ("version", ctypes.c_uint),
        ("blocking", ctypes.c_int),
        ("cgaClusterSize", ctypes.c_int),
        ("minCTAs", ctypes.c_int),
        ("maxCTAs", ctypes.c_int),
        ("netName", ctypes.c_char_p),
        ("splitShare", ctypes.c_int),
        ("trafficClass", ctypes.c_int),
        ("commName", ctypes.c_char_p),
        ("collnetEnable", ctypes.c_int),
        ("CTAPolicy", ctypes.c_int),
        ("shrinkShare", ctypes.c_int),
        ("nvlsCTAs", ctypes.c_int),
        ("nChannelsPerNetPeer", ctypes.c_int),
        ("nvlinkCentricSched", ctypes.c_int),
        ("graphUsageMode", ctypes.c_int),
        ("numRmaCtx", ctypes.c_int),
        ("maxP2pPeers", ctypes.c_int),
        ("graphStreamOrdering", ctypes.c_int),
    ]

    @classmethod
    def initializer(cls):
        undef = -(2**31)
        c = cls()
        c.size, c.magic, c.version = ctypes.sizeof(cls), 0xCAFEBEEF, 23007
        for name, kind in cls._fields_[3:]:
            if kind is ctypes.c_int:
                setattr(c, name, undef)
        return c


rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
lib = ctypes.CDLL(os.environ["STRATA_NCCL_LIB"])
lib.ncclGetErrorString.restype = ctypes.c_char_p
lib.ncclGetLastError.restype = ctypes.c_char_p
P, I, N = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
for name, args in {
    "ncclAllReduce": [P, P, N, I, I, P, P],
    "ncclBroadcast": [P, P, N, I, I, P, P],
    "ncclReduce": [P, P, N, I, I, I, P, P],
    "ncclAllGather": [P, P, N, I, P, P],
    "ncclReduceScatter": [P, P, N, I, I, P, P],
    "ncclAlltoAll": [P, P, N, I, P, P],
    "ncclGather": [P, P, N, I, I, P, P],
    "ncclScatter": [P, P, N, I, I, P, P],
    "ncclSend": [P, N, I, I, P, P],
    "ncclRecv": [P, N, I, I, P, P],
}.items():
    getattr(lib, name).argtypes = args
failures = 0


def check(ok, what):
    global failures
    if not ok:
        failures += 1
        print(f"rank {rank}: FAILED {what}", file=sys.stderr)


def ok(code, what):
    if code != SUCCESS:
        msg = lib.ncclGetLastError(None).decode()
        sys.exit(f"rank {rank}: {what} returned {code}: {msg}")


def ptr(a):
    return ctypes.c_void_p(a.ctypes.data) if a is not None else None


def share_id(path):
    uid = UniqueId()
    if rank == 0:
        ok(lib.ncclGetUniqueId(ctypes.byref(uid)), "ncclGetUniqueId")
        with open(path + ".tmp", "wb") as f:
            f.write(bytes(uid))
        os.rename(path + ".tmp", path)
        return uid
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            with open(path, "rb") as f:
                raw = f.read()
            if len(raw) == 128:
                return UniqueId.from_buffer_copy(raw)
        except FileNotFoundError:
            pass
        time.sleep(0.005)
    sys.exit(f"rank {rank}: no unique id")


def inputs(dtype, count, r):
    """Rank r's input: small values, so sums and products stay exact in every type."""
    return ((np.arange(count) % 3) + r % 2 + 1).astype(dtype)


def collectives(comm, dtype, count):
    code = DTYPES[dtype]
    ins = [inputs(dtype, count * world, r) for r in range(world)]
    mine = ins[rank]
    stack = np.stack([a[:count] for a in ins])
    for op, want in [
        (SUM, stack.sum(axis=0, dtype=dtype)),
        (PROD, stack.prod(axis=0, dtype=dtype)),
        (MAX, stack.max(axis=0)),
        (MIN, stack.min(axis=0)),
    ]:
        out = np.zeros(count, dtype)
        ok(lib.ncclAllReduce(ptr(mine), ptr(out), count, code, op, comm, None), "all_reduce")
        check(np.array_equal(out, want.astype(dtype)), f"all_reduce op {op} {dtype.__name__} x{count}")
    if np.issubdtype(dtype, np.floating):
        out = np.zeros(count, dtype)
        ok(lib.ncclAllReduce(ptr(mine), ptr(out), count, code, AVG, comm, None), "avg")
        want = (stack.astype(np.float64).sum(axis=0) / world).astype(dtype)
        check(np.allclose(out.astype(np.float64), want.astype(np.float64), rtol=1e-3), f"avg {dtype.__name__}")
    root = world - 1
    buf = mine[:count].copy() if rank == root else np.zeros(count, dtype)
    ok(lib.ncclBroadcast(ptr(buf), ptr(buf), count, code, root, comm, None), "broadcast")
    check(np.array_equal(buf, ins[root][:count]), "broadcast")
    out = np.zeros(count, dtype)
    ok(lib.ncclReduce(ptr(mine), ptr(out), count, code, SUM, 0, comm, None), "reduce")
    if rank == 0:
        check(np.array_equal(out, stack.sum(axis=0, dtype=dtype)), "reduce")
    out = np.zeros(count * world, dtype)
    ok(lib.ncclAllGather(ptr(mine), ptr(out), count, code, comm, None), "all_gather")
    check(np.array_equal(out, np.concatenate([a[:count] for a in ins])), "all_gather")
    out = np.zeros(count, dtype)
    ok(lib.ncclReduceScatter(ptr(mine), ptr(out), count, code, SUM, comm, None), "reduce_scatter")
    full = np.stack(ins).sum(axis=0, dtype=dtype)
    check(np.array_equal(out, full[rank * count:(rank + 1) * count]), "reduce_scatter")
    send = (np.arange(count * world) % 5 + rank).astype(dtype)
    out = np.zeros(count * world, dtype)
    ok(lib.ncclAlltoAll(ptr(send), ptr(out), count, code, comm, None), "alltoall")
    want = np.concatenate(
        [((np.arange(count * world) % 5 + q).astype(dtype))[rank * count:(rank + 1) * count] for q in range(world)]
    )
    check(np.array_equal(out, want), "alltoall")
    out = np.zeros(count * world, dtype)
    ok(lib.ncclGather(ptr(mine), ptr(out), count, code, 0, comm, None), "gather")
    if rank == 0:
        check(np.array_equal(out, np.concatenate([a[:count] for a in ins])), "gather")
    out = np.zeros(count, dtype)
    ok(lib.ncclScatter(ptr(ins[0]), ptr(out), count, code, 0, comm, None), "scatter")
    check(np.array_equal(out, ins[0][rank * count:(rank + 1) * count]), "scatter")


def group_ring(comm):
    """Send to the next rank and receive from the previous one in one group (4 MiB each)."""
    nxt, prv = (rank + 1) % world, (rank + world - 1) % world
    send = np.full(1 << 20, rank, np.float32)
    got = np.zeros(1 << 20, np.float32)
    ok(lib.ncclGroupStart(), "group start")
    ok(lib.ncclSend(ptr(send), send.size, 7, nxt, comm, None), "send")
    ok(lib.ncclRecv(ptr(got), got.size, 7, prv, comm, None), "recv")
    ok(lib.ncclGroupEnd(), "group end")
    check(bool((got == prv).all()), "group send/recv")


def errors(comm):
    a = np.zeros(4, np.float32)
    check(lib.ncclAllReduce(ptr(a), ptr(a), 4, 99, SUM, comm, None) == INVALID_ARGUMENT, "bad dtype")
    check(b"datatype 99" in lib.ncclGetLastError(comm), "last error names the datatype")
    check(lib.ncclAllReduce(ptr(a), ptr(a), 4, 7, 42, comm, None) == INVALID_ARGUMENT, "bad op")
    check(lib.ncclAllReduce(None, ptr(a), 4, 7, SUM, comm, None) == INVALID_ARGUMENT, "NULL sendbuff")
    check(lib.ncclAllReduce(ptr(a), ptr(a), 4, 7, SUM, None, None) == INVALID_ARGUMENT, "NULL comm")
    check(lib.ncclReduce(ptr(a), ptr(a), 4, 7, SUM, world, comm, None) == INVALID_ARGUMENT, "bad root")
    check(lib.ncclAllReduce(ptr(a), ptr(a), 4, 7, SUM, ctypes.c_void_p(12345), None) == INVALID_ARGUMENT,
          "a garbage comm")
    check(lib.ncclGroupEnd() == INVALID_USAGE, "unmatched GroupEnd")


def nonblocking(comm):
    cfg = Config.initializer()
    cfg.blocking = 0
    child = ctypes.c_void_p()
    code = lib.ncclCommSplit(comm, 0, rank, ctypes.byref(child), ctypes.byref(cfg))
    check(code in (SUCCESS, IN_PROGRESS), f"non-blocking split returned {code}")
    state = ctypes.c_int(IN_PROGRESS)
    x, y = np.array([rank + 1.0]), np.zeros(1)
    for step in range(2):
        deadline = time.time() + 60
        while time.time() < deadline:
            ok(lib.ncclCommGetAsyncError(child, ctypes.byref(state)), "async error")
            if state.value != IN_PROGRESS:
                break
            time.sleep(0.001)
        check(state.value == SUCCESS, f"non-blocking state {state.value} at step {step}")
        if step == 0:
            code = lib.ncclAllReduce(ptr(x), ptr(y), 1, 8, SUM, child, None)
            check(code in (SUCCESS, IN_PROGRESS), f"non-blocking all_reduce returned {code}")
    check(y[0] == world * (world + 1) / 2, f"non-blocking sum {y[0]}")
    ok(lib.ncclCommDestroy(child), "destroy")


version = ctypes.c_int()
ok(lib.ncclGetVersion(ctypes.byref(version)), "version")
check(version.value == 23007, f"version {version.value}")
uid = share_id(os.environ["NCCL_TEST_ID_FILE"])
comm = ctypes.c_void_p()
ok(lib.ncclCommInitRank(ctypes.byref(comm), world, uid, rank), "init")
for dtype in DTYPES:
    for count in (1, 777, 65536):
        collectives(comm, dtype, count)
group_ring(comm)
errors(comm)
nonblocking(comm)
ok(lib.ncclCommDestroy(comm), "destroy")
check(lib.ncclCommDestroy(comm) == INVALID_ARGUMENT, "double destroy")
if failures == 0:
    print(f"rank {rank} of {world}: all checks passed")
sys.exit(1 if failures else 0)
