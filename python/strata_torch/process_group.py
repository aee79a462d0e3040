"""ProcessGroupStrata: a torch.distributed process group whose collectives run on strata.

Each method checks its arguments on the caller's thread (a bad call raises at once and sends
nothing), then hands a closure that makes strata's C calls to the group's Worker, which runs it
inline or queued in issue order. Outputs that are not contiguous are staged and copied back.
"""

import ctypes
import itertools
import os
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from . import _nccl as nccl
from . import monitored, sparse
from .cpu_backend import _CpuBackend
from .tensors import (
    PLAIN_REDUCTIONS,
    op_type,
    BITWISE,
    Staged,
    as_bytes,
    check_cpu,
    nccl_op,
    op_kind,
    reduce_type,
)
from .work import StrataWork, Worker

_LIB = None
_LIB_LOCK = threading.Lock()
_GROUP_NUMBERS = itertools.count()
UNIQUE_ID_KEY = "strata/unique_id"
# What the library says when an id's root listened first and now refuses every connection.
STALE_ID = "or the id is stale"


def unique_id_key():
    """Where rank 0 leaves the unique id in the store: per torchrun restart attempt
    (``TORCHELASTIC_RESTART_COUNT``), since with c10d rendezvous at an endpoint the store
    outlives an attempt and a restarted rank would read the id of a root that died with the
    last one."""
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    return UNIQUE_ID_KEY if attempt is None else f"{UNIQUE_ID_KEY}/attempt{attempt}"


def _newer_id(store, key, stale, deadline):
    """The id at ``key`` once it differs from ``stale``; None if it does not by ``deadline``."""
    while time.monotonic() < deadline:
        uid = store.get(key)
        if uid != stale:
            return uid
        time.sleep(0.1)
    return None


def library():
    """strata's C ABI, loaded on first use."""
    global _LIB
    with _LIB_LOCK:
        if _LIB is None:
            _LIB = nccl.Library()
        return _LIB


def _ptr(t):
    return ctypes.c_void_p(t.data_ptr())


def _reduce_op_of(opts):
    """The ReduceOp in an options object (or one passed in its place)."""
    if isinstance(opts, (dist.ReduceOp, dist.ReduceOp.RedOpType)):
        return opts
    return getattr(opts, "reduceOp", dist.ReduceOp.SUM)


def _async_of(opts):
    return bool(getattr(opts, "asyncOp", True))


class ProcessGroupStrata(dist.ProcessGroup):
    """A process group on one strata communicator (see the module doc).

    torch.distributed calls its methods directly and gets its Work objects back as they are.
    It also registers a c10d Backend for the CPU device (``_CpuBackend``, which hands every
    call back to it), so that the group has device types as a C++ group has: what asks for
    a CPU-capable group (``dist.monitored_barrier``, the flight recorder) or calls through
    the C++ dispatcher finds one."""

    supports_coalescing = True

    def __init__(self, store, rank, size, timeout=timedelta(minutes=10), parent=None):
        super().__init__(rank, size)
        self._store = store
        self._monitored_barriers = 0
        self._lib = library()
        self._timeout = timeout
        self._number = next(_GROUP_NUMBERS)
        self._coalesced = None
        self._comm = self._init_comm(store, rank, size, parent)
        self._worker = Worker(f"strata-pg{self._number}-r{rank}")
        self._closed = False
        self._cpu_backend = _CpuBackend(self)
        self._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.CUSTOM, self._cpu_backend)
        self._set_default_backend(dist.ProcessGroup.BackendType.CUSTOM)

    # -- set-up and teardown ------------------------------------------------------------------

    def _init_comm(self, store, rank, size, parent=None):
        """From ``parent`` = (a strata group, this group's ranks in it, a name the members
        share): made by the members alone (strataCommSubgroup). Else rank 0 makes the unique
        id and shares it through the c10d store, and all join."""
        if parent is not None:
            group, ranks, tag = parent
            try:
                comm = self._lib.subgroup(group._comm, ranks, tag)
            except nccl.NcclError as e:
                raise dist.DistBackendError(f"strata: sub-group {tag} of ranks {ranks}: {e}") from e
            if len(ranks) != size or ranks.index(group.rank()) != rank:
                self._lib.CommDestroy(comm)
                raise dist.DistBackendError(
                    f"strata: sub-group {tag}: rank {rank}/{size} is not place "
                    f"{ranks.index(group.rank())} of {ranks}")
            return self._set_timeout_or_destroy(comm, rank, size)
        key = unique_id_key()
        if rank == 0:
            uid = self._lib.unique_id()
            store.set(key, uid)
        else:
            uid = store.get(key)
        deadline = time.monotonic() + self._timeout.total_seconds()
        while True:
            if len(uid) != nccl.UNIQUE_ID_BYTES:
                raise RuntimeError(f"strata: the store holds a {len(uid)}-byte unique id, not 128")
            # The group's timeout is this communicator's own deadline (strataCommSetTimeout),
            # not the environment: ranks of several groups may be made at once from threads of
            # one process (torchft's tests do), and none waits for another's init.
            try:
                comm = self._lib.init_rank(size, uid, rank)
                return self._set_timeout_or_destroy(comm, rank, size)
            except nccl.NcclError as e:
                # An id whose root is gone, read from a store that outlived the run that
                # wrote it (an elastic re-rendezvous that kept the restart count): wait for
                # this run's rank 0 to write a new one.
                fresh = rank != 0 and STALE_ID in str(e) and _newer_id(store, key, uid, deadline)
                if not fresh:
                    raise dist.DistBackendError(f"strata: init of rank {rank}/{size}: {e}") from e
                uid = fresh

    def _set_timeout_or_destroy(self, comm, rank, size):
        """Gives ``comm`` the group's timeout; destroys it if that fails."""
        try:
            self._lib.set_timeout(comm, max(self._timeout.total_seconds(), 0.001))
        except nccl.NcclError as e:
            self._lib.CommDestroy(comm)
            raise dist.DistBackendError(f"strata: rank {rank}/{size}: {e}") from e
        return comm

    def _strata_parent(self):
        """This group, if its communicator can make sub-groups (open); else None."""
        return None if self._closed else self

    def getBackendName(self):
        return "strata"

    def name(self):
        return "strata"

    def _get_backend_name(self):
        return "strata"

    def _get_backend(self, device):
        return self

    def stragglers(self):
        """The ranks of this group this rank names as persistently slow (see strata's
        ``Communicator::stragglers``): a list of dicts with ``rank`` (in this group),
        ``calls``, ``late_share``, ``stall_share``, ``median_late_ms`` and
        ``own_stall_share``; empty while no one is slow. Each rank names the peers it stalls
        on, so gather every rank's list for the whole picture."""
        self._check_open()
        return self._lib.stragglers(self._comm)

    def status(self, within_s=1.0):
        """The live view of this group, asked of its ranks without stopping them (what
        ``collbench status`` prints): a dict with ``ranks`` (each rank's ``call``, its
        ``for_s``, ``waiting_on``, ``stragglers``, ``fault``), ``silent`` (ranks that gave no
        answer within ``within_s`` seconds) and ``holding_up`` (who the others wait on). Any
        rank may call it alone, at any time; it is not a collective."""
        self._check_open()
        return self._lib.status(self._comm, float(within_s))

    def async_error(self):
        """The fault that broke this group's communicator (strata's message), or None while it
        is healthy; "aborted" once aborted or shut down. Never blocks."""
        if self._closed:
            return "aborted"
        if self._lib.async_error(self._comm) in (nccl.SUCCESS, nccl.IN_PROGRESS):
            return None
        return self._lib.last_error(self._comm) or "the communicator failed"

    def abort(self):
        """Ends every call in flight on this group now (ncclCommAbort)."""
        if not self._closed:
            self._closed = True
            self._lib.CommAbort(self._comm)
            self._worker.stop()

    def shutdown(self):
        """Runs what is queued, then destroys the communicator."""
        if not self._closed:
            self._closed = True
            self._worker.stop()
            self._lib.CommDestroy(self._comm)

    def _check_open(self):
        if self._closed:
            raise dist.DistBackendError("strata: this process group was shut down or aborted")

    # -- running calls ------------------------------------------------------------------------

    def _submit(self, name, outputs, run, async_op, staged=(), p2p=False):
        """Queues (or runs) ``run`` and returns its Work; ``staged`` outputs are copied back.

        Between start_coalescing and end_coalescing the call is kept for the batch instead.
        """
        self._check_open()
        if self._coalesced is not None:
            self._coalesced.append((run, staged, p2p))
            return self._coalesced_work
        work = StrataWork(outputs, name, self._timeout)
        if not staged:
            return self._worker.submit(run, work, async_op)

        def call():
            run()
            for s in staged:
                s.finish()

        return self._worker.submit(call, work, async_op)

    def _reduction(self, tensor, op):
        """(ncclDataType_t, ncclRedOp_t, view, release) for reducing ``tensor`` with ``op``."""
        kind = op_kind(op)
        dtype_code, view = reduce_type(tensor, kind)
        if kind != "premul":
            return dtype_code, nccl_op(op, tensor.dtype), view, lambda: None
        factor = op.factor
        scalar_dtype = view.dtype
        scalar = (
            factor.detach().to("cpu", scalar_dtype).reshape(1)
            if isinstance(factor, torch.Tensor)
            else torch.tensor([factor], dtype=scalar_dtype)
        )
        code = self._lib.premul_sum(_ptr(scalar), dtype_code, self._comm)
        return dtype_code, code, view, lambda: self._lib.RedOpDestroy(code, self._comm)

    def _bitwise(self, tensor, op):
        if tensor.dtype.is_floating_point or tensor.dtype.is_complex:
            raise TypeError(f"strata: {op} needs an integer or bool tensor, not {tensor.dtype}")
        return BITWISE[op_type(op)]

    def _gather_fold(self, flat, fold):
        """All-gathers ``flat`` and folds the ranks' copies with ``fold`` (bitwise ops)."""
        every = torch.empty((self.size(), flat.numel()), dtype=flat.dtype)
        self._lib.AllGather(
            _ptr(flat), _ptr(every), flat.numel() * flat.element_size(), nccl.UINT8, self._comm, None, comm=self._comm
        )
        out = every[0].clone()
        for r in range(1, self.size()):
            fold(out, every[r], out=out)
        return out

    # -- all-reduce ---------------------------------------------------------------------------

    def _allreduce_one(self, tensor, op):
        """A closure that all-reduces ``tensor`` in place (checked now, run later)."""
        check_cpu(tensor, "all_reduce tensor")
        staged = Staged(tensor)
        if op_type(op) in BITWISE:
            fold = self._bitwise(tensor, op)

            def run_bitwise():
                staged.tensor.copy_(self._gather_fold(staged.tensor.reshape(-1), fold).view_as(staged.tensor))
                staged.finish()

            return run_bitwise
        dtype_code, code, view, release = self._reduction(staged.tensor, op)

        def run():
            try:
                self._lib.AllReduce(_ptr(view), _ptr(view), view.numel(), dtype_code, code, self._comm, None, comm=self._comm)
            finally:
                release()
            staged.finish()

        return run

    def allreduce(self, tensors, opts=None):
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        op = _reduce_op_of(opts)
        if any(t.is_sparse for t in tensors):
            return self._allreduce_sparse(tensors, op, _async_of(opts))
        run = self._allreduce_plain(tensors[0], op) if len(tensors) == 1 else None
        if run is None:
            runs = [self._allreduce_one(t, op) for t in tensors]
            run = lambda: [r() for r in runs]  # noqa: E731
        return self._submit("all_reduce", tensors, run, _async_of(opts))

    def _allreduce_sparse(self, tensors, op, async_op):
        for t in tensors:
            sparse.check_sparse(t, op)

        def gather(output, input_):
            self._all_gather_flat(output, input_, "sparse all_reduce")()

        def run():
            for t in tensors:
                sparse.sparse_allreduce(gather, self.size(), t)

        return self._submit("all_reduce (sparse)", tensors, run, async_op)

    def _allreduce_plain(self, t, op):
        """The common case with few checks (a dense, contiguous CPU tensor of a type strata
        reduces natively, a built-in operator), or None for the general path."""
        codes = PLAIN_REDUCTIONS.get((t.dtype, op_type(op)))
        if codes is None or t.layout is not torch.strided or t.device.type != "cpu" or not t.is_contiguous():
            return None
        ptr, count, comm, all_reduce = t.data_ptr(), t.numel(), self._comm, self._lib.AllReduce
        dtype_code, op_code = codes
        return lambda: all_reduce(ptr, ptr, count, dtype_code, op_code, comm, None, comm=comm)

    def allreduce_coalesced(self, tensors, opts=None):
        return self.allreduce(tensors, opts)

    # -- broadcast and reduce -----------------------------------------------------------------

    def broadcast(self, tensors, opts=None):
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        root = self._root(getattr(opts, "rootRank", 0), "broadcast")
        for t in tensors:
            check_cpu(t, "broadcast tensor")
        staged = [Staged(t) for t in tensors]

        def run():
            for s in staged:
                b = as_bytes(s.tensor)
                self._lib.Broadcast(_ptr(b), _ptr(b), b.numel(), nccl.UINT8, root, self._comm, None, comm=self._comm)

        return self._submit("broadcast", tensors, run, _async_of(opts), staged)

    def reduce(self, tensors, opts=None):
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        root, op = self._root(getattr(opts, "rootRank", 0), "reduce"), _reduce_op_of(opts)
        runs = []
        for t in tensors:
            check_cpu(t, "reduce tensor")
            staged = Staged(t)
            if op_kind(op) == "bitwise":
                fold = self._bitwise(t, op)

                def run_bitwise(s=staged, fold=fold):
                    out = self._gather_fold(s.tensor.reshape(-1), fold)
                    if self.rank() == root:
                        s.tensor.copy_(out.view_as(s.tensor))
                        s.finish()

                runs.append(run_bitwise)
                continue
            dtype_code, code, view, release = self._reduction(staged.tensor, op)

            def run(view=view, dtype_code=dtype_code, code=code, release=release, s=staged):
                try:
                    self._lib.Reduce(_ptr(view), _ptr(view), view.numel(), dtype_code, code, root, self._comm, None, comm=self._comm)
                finally:
                    release()
                s.finish()

            runs.append(run)
        return self._submit("reduce", tensors, lambda: [r() for r in runs], _async_of(opts))

    # -- all-gather ---------------------------------------------------------------------------

    def _all_gather_flat(self, output, input_, name):
        """A closure all-gathering ``input_`` into the contiguous ``output`` (bytes)."""
        check_cpu(input_, f"{name} input")
        check_cpu(output, f"{name} output")
        if output.numel() != input_.numel() * self.size() or output.dtype != input_.dtype:
            raise ValueError(
                f"strata: {name} output has {output.numel()} {output.dtype} elements; it needs "
                f"{self.size()} x {input_.numel()} {input_.dtype}"
            )
        src, dst = Staged(input_), Staged(output, copy_in=False)

        def run():
            a, b = as_bytes(src.tensor), as_bytes(dst.tensor)
            self._lib.AllGather(_ptr(a), _ptr(b), a.numel(), nccl.UINT8, self._comm, None, comm=self._comm)
            dst.finish()

        return run

    def all_gather_single(self, output, input_, opts=None):
        run = self._all_gather_flat(output, input_, "all_gather_into_tensor")
        return self._submit("all_gather_into_tensor", [output], run, _async_of(opts))

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        runs = [self._all_gather_flat(o, i, "all_gather_into_tensor") for o, i in zip(outputs, inputs, strict=True)]
        return self._submit("all_gather_into_tensor_coalesced", outputs, lambda: [r() for r in runs], _async_of(opts))

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def allgather(self, output_tensors, input_tensors, opts=None):
        runs = []
        for outs, inp in zip(output_tensors, input_tensors, strict=True):
            self._check_list(outs, "all_gather output list")
            flat = torch.empty((self.size(), *inp.shape), dtype=inp.dtype)
            gather = self._all_gather_flat(flat, inp, "all_gather")

            def run(gather=gather, flat=flat, outs=outs):
                gather()
                for r, o in enumerate(outs):
                    o.copy_(flat[r].view_as(o))

            runs.append(run)
        return self._submit("all_gather", output_tensors, lambda: [r() for r in runs], _async_of(opts))

    def allgather_coalesced(self, output_lists, input_list, opts=None):
        # c10d lays these out [rank][tensor]; allgather takes [tensor][rank].
        self._check_list(output_lists, "all_gather_coalesced output list")
        if len(output_lists) != self.size() or any(
            len(outs) != len(input_list) for outs in output_lists
        ):
            raise ValueError(
                f"strata: all_gather_coalesced wants {self.size()} output lists (one per rank) "
                f"of {len(input_list)} tensors (one per input)"
            )
        by_input = [[output_lists[r][i] for r in range(self.size())] for i in range(len(input_list))]
        return self.allgather(by_input, input_list, opts)

    # -- reduce-scatter -----------------------------------------------------------------------

    def _reduce_scatter_flat(self, output, input_, op, name):
        """A closure reduce-scattering the contiguous ``input_`` into ``output``."""
        check_cpu(input_, f"{name} input")
        check_cpu(output, f"{name} output")
        if input_.numel() != output.numel() * self.size() or output.dtype != input_.dtype:
            raise ValueError(
                f"strata: {name} input has {input_.numel()} {input_.dtype} elements; it needs "
                f"{self.size()} x {output.numel()} {output.dtype}"
            )
        src, dst = Staged(input_), Staged(output, copy_in=False)
        if op_kind(op) == "bitwise":
            fold = self._bitwise(output, op)

            def run_bitwise():
                whole = self._gather_fold(src.tensor.reshape(-1), fold)
                n = output.numel()
                dst.tensor.copy_(whole[self.rank() * n : (self.rank() + 1) * n].view_as(dst.tensor))
                dst.finish()

            return run_bitwise
        dtype_code, code, view_in, release = self._reduction(src.tensor, op)
        _, view_out = reduce_type(dst.tensor, op_kind(op))

        def run():
            try:
                self._lib.ReduceScatter(_ptr(view_in), _ptr(view_out), view_out.numel(), dtype_code, code, self._comm, None, comm=self._comm)
            finally:
                release()
            dst.finish()

        return run

    def reduce_scatter_single(self, output, input_, opts=None):
        run = self._reduce_scatter_flat(output, input_, _reduce_op_of(opts), "reduce_scatter_tensor")
        return self._submit("reduce_scatter_tensor", [output], run, _async_of(opts))

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        op = _reduce_op_of(opts)
        runs = [
            self._reduce_scatter_flat(o, i, op, "reduce_scatter_tensor")
            for o, i in zip(outputs, inputs, strict=True)
        ]
        return self._submit("reduce_scatter_tensor_coalesced", outputs, lambda: [r() for r in runs], _async_of(opts))

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        op = _reduce_op_of(opts)
        runs = []
        for out, ins in zip(output_tensors, input_tensors, strict=True):
            self._check_list(ins, "reduce_scatter input list")
            for t in ins:
                check_cpu(t, "reduce_scatter input")
                if t.numel() != out.numel() or t.dtype != out.dtype:
                    raise ValueError("strata: reduce_scatter inputs must each match the output's size and dtype")
            flat = torch.empty((self.size(), out.numel()), dtype=out.dtype)
            scatter = self._reduce_scatter_flat(out, flat, op, "reduce_scatter")

            def run(scatter=scatter, flat=flat, ins=ins):
                for r, t in enumerate(ins):
                    flat[r].copy_(t.reshape(-1))
                scatter()

            runs.append(run)
        return self._submit("reduce_scatter", output_tensors, lambda: [r() for r in runs], _async_of(opts))

    # -- all-to-all ---------------------------------------------------------------------------

    def all_to_all_single(self, output, input_, output_split_sizes, input_split_sizes, opts=None):
        check_cpu(input_, "all_to_all_single input")
        check_cpu(output, "all_to_all_single output")
        if output.dtype != input_.dtype:
            raise ValueError(f"strata: all_to_all_single input is {input_.dtype}, output {output.dtype}")
        in_rows = self._splits(input_, input_split_sizes, "input")
        out_rows = self._splits(output, output_split_sizes, "output")
        row_in = input_.numel() // max(input_.shape[0], 1) if input_.dim() else 1
        row_out = output.numel() // max(output.shape[0], 1) if output.dim() else 1
        if input_.dim() and output.dim() and row_in != row_out:
            raise ValueError("strata: all_to_all_single input and output rows differ in size")
        src, dst = Staged(input_), Staged(output, copy_in=False)
        esize = input_.element_size() * row_in
        equal = len(set(in_rows)) == 1 and in_rows == out_rows

        def run():
            a, b = as_bytes(src.tensor), as_bytes(dst.tensor)
            if equal:
                self._lib.AlltoAll(_ptr(a), _ptr(b), in_rows[0] * esize, nccl.UINT8, self._comm, None, comm=self._comm)
            else:
                self._exchange(a, b, [r * esize for r in in_rows], [r * esize for r in out_rows])
            dst.finish()

        return self._submit("all_to_all_single", [output], run, _async_of(opts))

    alltoall_base = all_to_all_single

    def alltoall(self, output_tensors, input_tensors, opts=None):
        self._check_list(output_tensors, "all_to_all output list")
        self._check_list(input_tensors, "all_to_all input list")
        for t in [*output_tensors, *input_tensors]:
            check_cpu(t, "all_to_all tensor")
        src = [Staged(t) for t in input_tensors]
        dst = [Staged(t, copy_in=False) for t in output_tensors]

        def run():
            self._lib.GroupStart()
            try:
                for peer in range(self.size()):
                    a, b = as_bytes(src[peer].tensor), as_bytes(dst[peer].tensor)
                    self._lib.Send(_ptr(a), a.numel(), nccl.UINT8, peer, self._comm, None, comm=self._comm)
                    self._lib.Recv(_ptr(b), b.numel(), nccl.UINT8, peer, self._comm, None, comm=self._comm)
            finally:
                self._lib.GroupEnd(comm=self._comm)
            for d in dst:
                d.finish()

        return self._submit("all_to_all", output_tensors, run, _async_of(opts))

    def _splits(self, tensor, sizes, what):
        """Rows per peer for all_to_all_single (equal when ``sizes`` is empty)."""
        n = self.size()
        rows = tensor.shape[0] if tensor.dim() else tensor.numel()
        if not sizes:
            if rows % n:
                raise ValueError(f"strata: all_to_all_single {what} has {rows} rows, not a multiple of {n} ranks")
            return [rows // n] * n
        sizes = [int(s) for s in sizes]
        if len(sizes) != n or any(s < 0 for s in sizes) or sum(sizes) != rows:
            raise ValueError(f"strata: all_to_all_single {what} split sizes {sizes} do not divide its {rows} rows among {n} ranks")
        return sizes

    def _exchange(self, a, b, send_bytes, recv_bytes):
        """One group of sends and receives: ``send_bytes[p]`` of ``a`` go to p, and so on."""
        so = ro = 0
        self._lib.GroupStart()
        try:
            for peer in range(self.size()):
                self._lib.Send(ctypes.c_void_p(a.data_ptr() + so), send_bytes[peer], nccl.UINT8, peer, self._comm, None, comm=self._comm)
                self._lib.Recv(ctypes.c_void_p(b.data_ptr() + ro), recv_bytes[peer], nccl.UINT8, peer, self._comm, None, comm=self._comm)
                so, ro = so + send_bytes[peer], ro + recv_bytes[peer]
        finally:
            self._lib.GroupEnd(comm=self._comm)

    # -- gather and scatter -------------------------------------------------------------------

    def gather(self, output_tensors, input_tensors, opts=None):
        root = self._root(getattr(opts, "rootRank", 0), "gather")
        (inp,) = input_tensors
        check_cpu(inp, "gather input")
        outs = output_tensors[0] if output_tensors else []
        if self.rank() == root:
            self._check_list(outs, "gather output list")
        flat = torch.empty((self.size() if self.rank() == root else 0, inp.numel()), dtype=inp.dtype)
        src = Staged(inp)

        def run():
            a, b = as_bytes(src.tensor), as_bytes(flat)
            self._lib.Gather(_ptr(a), _ptr(b), a.numel(), nccl.UINT8, root, self._comm, None, comm=self._comm)
            for r, o in enumerate(outs if self.rank() == root else []):
                o.copy_(flat[r].view_as(o))

        return self._submit("gather", output_tensors, run, _async_of(opts))

    def scatter(self, output_tensors, input_tensors, opts=None):
        root = self._root(getattr(opts, "rootRank", 0), "scatter")
        (out,) = output_tensors
        check_cpu(out, "scatter output")
        ins = input_tensors[0] if input_tensors else []
        if self.rank() == root:
            self._check_list(ins, "scatter input list")
            flat = torch.stack([t.reshape(-1) for t in ins])
            if flat.shape[1] != out.numel():
                raise ValueError("strata: scatter inputs must each match the output's size")
        else:
            flat = torch.empty((0,), dtype=out.dtype)
        dst = Staged(out, copy_in=False)

        def run():
            a, b = as_bytes(flat), as_bytes(dst.tensor)
            self._lib.Scatter(_ptr(a), _ptr(b), b.numel(), nccl.UINT8, root, self._comm, None, comm=self._comm)
            dst.finish()

        return self._submit("scatter", output_tensors, run, _async_of(opts))

    # -- point-to-point and barrier -----------------------------------------------------------

    def send(self, tensors, dst_rank, tag=0):
        (t,) = tensors
        check_cpu(t, "send tensor")
        peer = self._root(dst_rank, "send")
        src = Staged(t)

        def run():
            a = as_bytes(src.tensor)
            self._lib.Send(_ptr(a), a.numel(), nccl.UINT8, peer, self._comm, None, comm=self._comm)

        return self._submit("send", tensors, run, True, p2p=True)

    def recv(self, tensors, src_rank, tag=0):
        (t,) = tensors
        check_cpu(t, "recv tensor")
        peer = self._root(src_rank, "recv")
        dst = Staged(t, copy_in=False)

        def run():
            b = as_bytes(dst.tensor)
            self._lib.Recv(_ptr(b), b.numel(), nccl.UINT8, peer, self._comm, None, comm=self._comm)

        return self._submit("recv", tensors, run, True, staged=[dst], p2p=True)

    def recv_anysource(self, tensors, tag=0):
        """Receives from whichever rank's send arrives first (strataRecvAny); the Work's
        ``_source_rank()`` names it once complete."""
        (t,) = tensors
        check_cpu(t, "recv tensor")
        dst = Staged(t, copy_in=False)
        source = []

        def run():
            b = as_bytes(dst.tensor)
            source.append(self._lib.recv_any(_ptr(b), b.numel(), nccl.UINT8, self._comm))

        # Not p2p: it never joins a GroupStart..End batch (strataRecvAny refuses one).
        work = self._submit("recv from any source", tensors, run, True, staged=[dst])
        work._source_box = source
        return work

    def barrier(self, opts=None):
        token = torch.zeros(1, dtype=torch.uint8)

        def run():
            self._lib.AllReduce(_ptr(token), _ptr(token), 1, nccl.UINT8, nccl.SUM, self._comm, None, comm=self._comm)

        return self._submit("barrier", [token], run, _async_of(opts))

    def monitored_barrier(self, opts=None, wait_all_ranks=False):
        """A barrier that names the ranks that did not arrive within the timeout (``opts``
        is BarrierOptions or a timedelta; see ``monitored.py``). Blocks; never touches the
        communicator, so it answers even while a collective is stuck."""
        self._check_open()
        timeout = opts if isinstance(opts, timedelta) else getattr(opts, "timeout", self._timeout)
        self._monitored_barriers += 1

        def describe():
            fault = self.async_error()
            return f"this rank's communicator: {fault}" if fault else ""

        monitored.monitored_barrier(
            self._store, self.rank(), self.size(), self._monitored_barriers, timeout, wait_all_ranks, describe
        )

    # -- coalescing (batch_isend_irecv, _coalescing_manager) ----------------------------------

    def start_coalescing(self, device=None):
        if self._coalesced is not None:
            raise RuntimeError("strata: coalescing already started on this group")
        self._coalesced = []
        self._coalesced_work = StrataWork([], "coalesced calls", self._timeout)
        self._coalesced_work._queued()

    _start_coalescing = start_coalescing

    def end_coalescing(self, device=None):
        if self._coalesced is None:
            raise RuntimeError("strata: end_coalescing without start_coalescing")
        calls, work = self._coalesced, self._coalesced_work
        self._coalesced = None

        def run():
            # Consecutive sends and receives progress together in one group; any other call
            # runs in its place in the order it was made.
            i = 0
            while i < len(calls):
                j = i
                while j < len(calls) and calls[j][2]:
                    j += 1
                if j == i:
                    calls[i][0]()
                    j = i + 1
                else:
                    self._lib.GroupStart()
                    try:
                        for call in calls[i:j]:
                            call[0]()
                    finally:
                        self._lib.GroupEnd(comm=self._comm)
                for _, staged, _ in calls[i:j]:
                    for st in staged:
                        st.finish()
                i = j

        return self._worker.submit(run, work, True)

    _end_coalescing = end_coalescing

    # -- argument checks ----------------------------------------------------------------------

    def _root(self, rank, what):
        if not 0 <= rank < self.size():
            raise ValueError(f"strata: {what} names rank {rank}; this group has ranks 0..{self.size() - 1}")
        return rank

    def _check_list(self, tensors, what):
        if len(tensors) != self.size():
            raise ValueError(f"strata: {what} has {len(tensors)} tensors; this group has {self.size()} ranks")
