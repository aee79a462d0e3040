"""ctypes bindings to strata's C ABI (the functions of ``libnccl.so.2`` this backend calls).

The library is found in this order: ``$STRATA_LIB``; the copy ``pip install`` put beside this
file (``_lib/libstrata.so``); ``target/release/libstrata_ffi.so`` of the repository this
package sits in (for running from a checkout). It is loaded by full path with ``RTLD_LOCAL``,
so it never takes the place of the NCCL that PyTorch's CUDA library has already loaded, and
every symbol is looked up in strata's own file.

Every call releases the GIL while it runs (ctypes does), so a collective on the backend's
worker thread overlaps Python and autograd work on other threads.
"""

import ctypes
import json
import os
import pathlib

SUCCESS = 0
IN_PROGRESS = 7
RESULT_NAMES = {
    0: "ncclSuccess",
    1: "ncclUnhandledCudaError",
    2: "ncclSystemError",
    3: "ncclInternalError",
    4: "ncclInvalidArgument",
    5: "ncclInvalidUsage",
    6: "ncclRemoteError",
    7: "ncclInProgress",
    8: "ncclTimeout",
}

# ncclRedOp_t
SUM, PROD, MAX, MIN, AVG = 0, 1, 2, 3, 4
# ncclScalarResidence_t
SCALAR_HOST_IMMEDIATE = 1
# ncclDataType_t
INT8, UINT8, INT32, UINT32, INT64, UINT64 = 0, 1, 2, 3, 4, 5
FLOAT16, FLOAT32, FLOAT64, BFLOAT16, FLOAT8E4M3, FLOAT8E5M2 = 6, 7, 8, 9, 10, 11

UNIQUE_ID_BYTES = 128


class UniqueId(ctypes.Structure):
    """ncclUniqueId: 128 opaque bytes."""

    _fields_ = [("internal", ctypes.c_char * UNIQUE_ID_BYTES)]


class NcclError(RuntimeError):
    """A call into strata failed: ``code`` is the ncclResult_t, the message strata's own."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


def _candidates():
    env = os.environ.get("STRATA_LIB")
    if env:
        yield pathlib.Path(env)
        return
    here = pathlib.Path(__file__).resolve().parent
    yield here / "_lib" / "libstrata.so"
    yield here.parent.parent / "target" / "release" / "libstrata_ffi.so"


def library_path():
    """The strata library this process loads (first candidate that exists)."""
    tried = []
    for path in _candidates():
        if path.is_file():
            return path
        tried.append(str(path))
    raise ImportError(
        "strata_torch: strata's library was not found (looked at "
        + ", ".join(tried)
        + "); install the package with `pip install ./python`, or build it with "
        "`cargo build --release -p strata-ffi`, or set STRATA_LIB to libstrata_ffi.so"
    )


P, I, N = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
_SIGNATURES = {
    "ncclGetVersion": [ctypes.POINTER(I)],
    "ncclGetUniqueId": [ctypes.POINTER(UniqueId)],
    "ncclCommInitRank": [ctypes.POINTER(P), I, UniqueId, I],
    "ncclCommSplit": [P, I, I, ctypes.POINTER(P), P],
    "ncclCommDestroy": [P],
    "ncclCommAbort": [P],
    "ncclCommGetAsyncError": [P, ctypes.POINTER(I)],
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
    "ncclGroupStart": [],
    "ncclGroupEnd": [],
    "ncclRedOpCreatePreMulSum": [ctypes.POINTER(I), P, I, I, P],
    "ncclRedOpDestroy": [I, P],
}


class Library:
    """strata's C ABI, loaded once per process."""

    def __init__(self, path=None):
        self.path = pathlib.Path(path) if path else library_path()
        self._lib = ctypes.CDLL(str(self.path), mode=os.RTLD_LOCAL | os.RTLD_NOW)
        self._lib.ncclGetErrorString.restype = ctypes.c_char_p
        self._lib.ncclGetErrorString.argtypes = [I]
        self._lib.ncclGetLastError.restype = ctypes.c_char_p
        self._lib.ncclGetLastError.argtypes = [P]
        for name, args in _SIGNATURES.items():
            fn = getattr(self._lib, name)
            fn.argtypes = args
            fn.restype = I
            setattr(self, name[4:], self._checked(fn, name))
        # strata's own: one communicator's deadline, without the environment.
        fn = self._lib.strataCommSetTimeout
        fn.argtypes = [P, ctypes.c_double]
        fn.restype = I
        self._set_timeout = self._checked(fn, "strataCommSetTimeout")
        fn = self._lib.strataCommGetStragglers
        fn.argtypes = [P, ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t)]
        fn.restype = I
        self._get_stragglers = self._checked(fn, "strataCommGetStragglers")
        fn = self._lib.strataCommGetStatus
        fn.argtypes = [P, ctypes.c_double, ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t)]
        fn.restype = I
        self._get_status = self._checked(fn, "strataCommGetStatus")
        fn = self._lib.strataRecvAny
        fn.argtypes = [P, N, I, ctypes.POINTER(I), P]
        fn.restype = I
        self._recv_any = self._checked(fn, "strataRecvAny")
        fn = self._lib.strataCommSubgroup
        fn.argtypes = [P, I, ctypes.POINTER(I), ctypes.c_char_p, ctypes.POINTER(P)]
        fn.restype = I
        self._subgroup = self._checked(fn, "strataCommSubgroup")

    def last_error(self, comm=None):
        """strata's message for the last failure on ``comm`` (or on this thread)."""
        text = self._lib.ncclGetLastError(comm)
        return text.decode(errors="replace") if text else ""

    def _checked(self, fn, name):
        def call(*args, comm=None):
            code = fn(*args)
            if code not in (SUCCESS, IN_PROGRESS):
                detail = self.last_error(comm) or self._lib.ncclGetErrorString(code).decode()
                raise NcclError(code, f"{name}: {RESULT_NAMES.get(code, code)}: {detail}")
            return code

        call.__name__ = name
        return call

    def version(self):
        """The NCCL API level the library reports (``X*10000 + Y*100 + Z``)."""
        v = I()
        self.GetVersion(ctypes.byref(v))
        return v.value

    def unique_id(self):
        """A new ncclUniqueId; this process serves its rendezvous."""
        uid = UniqueId()
        self.GetUniqueId(ctypes.byref(uid))
        return bytes(uid)

    def init_rank(self, nranks, unique_id, rank):
        """ncclCommInitRank on a 128-byte id; returns the communicator handle."""
        uid = UniqueId()
        ctypes.memmove(ctypes.addressof(uid), unique_id, UNIQUE_ID_BYTES)
        comm = P()
        self.CommInitRank(ctypes.byref(comm), nranks, uid, rank)
        return comm.value

    def subgroup(self, parent, parent_ranks, tag):
        """strataCommSubgroup: the communicator of ``parent``'s ranks ``parent_ranks`` (rank i
        of it is ``parent_ranks[i]``), made by those ranks alone with no message; returns it."""
        ranks = (I * len(parent_ranks))(*parent_ranks)
        comm = P()
        self._subgroup(parent, len(parent_ranks), ranks, tag.encode(), ctypes.byref(comm), comm=parent)
        return comm.value

    def set_timeout(self, comm, seconds):
        """strataCommSetTimeout: the deadline of each later call on ``comm``, in seconds."""
        self._set_timeout(comm, ctypes.c_double(seconds), comm=comm)

    def stragglers(self, comm):
        """strataCommGetStragglers: the peers this rank names as persistently slow, as dicts
        (``rank``, ``calls``, ``late_share``, ``stall_share``, ``median_late_ms``,
        ``own_stall_share``)."""
        length = ctypes.c_size_t(0)
        capacity = 4096
        while True:
            buf = ctypes.create_string_buffer(capacity)
            code = self._lib.strataCommGetStragglers(comm, buf, capacity, ctypes.byref(length))
            if code == SUCCESS:
                return json.loads(buf.value.decode())
            if length.value + 1 <= capacity:
                # Not a short buffer: raise the library's error.
                self._get_stragglers(comm, buf, capacity, ctypes.byref(length), comm=comm)
            capacity = length.value + 1

    def status(self, comm, within_s=1.0):
        """strataCommGetStatus: the live view of the communicator as a dict (``ranks`` with
        each rank's ``call`` and ``waiting_on``, ``silent``, ``holding_up``, ...)."""
        length = ctypes.c_size_t(0)
        capacity = 1 << 16
        while True:
            buf = ctypes.create_string_buffer(capacity)
            code = self._lib.strataCommGetStatus(comm, within_s, buf, capacity, ctypes.byref(length))
            if code == SUCCESS:
                return json.loads(buf.value.decode())
            if length.value + 1 <= capacity:
                # Not a short buffer: raise the library's error.
                self._get_status(comm, within_s, buf, capacity, ctypes.byref(length), comm=comm)
            # The view is gathered anew and may have grown a little.
            capacity = 2 * (length.value + 1)

    def recv_any(self, buf, count, dtype_code, comm):
        """strataRecvAny: receives into ``buf`` from whichever rank sends first; returns it."""
        source = I(-1)
        self._recv_any(buf, count, dtype_code, ctypes.byref(source), comm, comm=comm)
        return source.value

    def async_error(self, comm):
        """ncclCommGetAsyncError: the communicator's first fault (0 while healthy)."""
        err = I()
        self._lib.ncclCommGetAsyncError(comm, ctypes.byref(err))
        return err.value

    def premul_sum(self, scalar, dtype_code, comm):
        """A PreMulSum operator multiplying by ``scalar`` (a host double or float buffer)."""
        op = I()
        self.RedOpCreatePreMulSum(
            ctypes.byref(op), scalar, dtype_code, SCALAR_HOST_IMMEDIATE, comm, comm=comm
        )
        return op.value
