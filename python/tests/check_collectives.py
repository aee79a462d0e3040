"""One rank of a check of every torch.distributed call on the strata backend (run by torchrun).

Every collective runs on CPU tensors of every dtype strata has (plus bool and complex) with every
ReduceOp, in and out of place, contiguous or not, blocking and async, on the world and on a
sub-group, and each result is compared with arithmetic done locally. Bad arguments must raise
at once. Exit status 0 means every check passed; the last line says how many ran.
"""

import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

import strata_torch

RANK, WORLD = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
CHECKS = 0

DTYPES = [
    torch.int8,
    torch.uint8,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
]
INTEGER = {torch.int8, torch.uint8, torch.int32, torch.int64}
FP8 = {torch.float8_e4m3fn, torch.float8_e5m2}
SMALL_FLOATS = {torch.float16, torch.bfloat16} | FP8


def check(cond, what):
    global CHECKS
    if not cond:
        raise AssertionError(f"rank {RANK}/{WORLD}: {what}")
    CHECKS += 1


def same(got, want, what):
    # fp8 keeps 2 or 3 mantissa bits: an average rounds by up to one unit in the last place
    tol = 0.0 if got.dtype in INTEGER or got.dtype is torch.bool else 0.25 if got.dtype in FP8 else 0.1 if got.dtype in SMALL_FLOATS else 1e-6
    g, w = got.to(torch.float64) if not got.is_complex() else got, want.to(torch.float64) if not want.is_complex() else want
    ok = torch.allclose(g, w.to(g.dtype), rtol=tol, atol=tol) if g.numel() else True
    check(ok, f"{what}: got {got.reshape(-1)[:6].tolist()}, want {want.reshape(-1)[:6].tolist()}")


def value(rank, n, dtype, kind="sum"):
    """Rank ``rank``'s input: small exact values (products stay in range).

    strata rounds fp8 after every step of a schedule, as NCCL does, so fp8 inputs are chosen
    so that every partial sum is exact in both fp8 formats.
    """
    i = torch.arange(n, dtype=torch.float64)
    if dtype in FP8 and kind == "sum":
        v = (i % 2) + 1 + (rank % 2)
    elif kind == "prod":
        v = (i + rank) % 2 + 1
    elif kind == "avg_int":
        v = (i % 3 + rank + 1) * WORLD
    else:
        v = (i % 4) + rank + 1
    return v.to(dtype)


def expect(n, dtype, op, kind):
    vals = torch.stack([value(r, n, dtype, kind).to(torch.float64) for r in range(WORLD)])
    if op == dist.ReduceOp.SUM:
        w = vals.sum(0)
    elif op == dist.ReduceOp.PRODUCT:
        w = vals.prod(0)
    elif op == dist.ReduceOp.MIN:
        w = vals.min(0).values
    elif op == dist.ReduceOp.MAX:
        w = vals.max(0).values
    elif op == dist.ReduceOp.AVG:
        w = vals.sum(0) / WORLD
    else:  # PREMUL_SUM by 0.5
        w = vals.sum(0) * 0.5
    return w.to(dtype)


def ops_for(dtype):
    ops = [dist.ReduceOp.SUM, dist.ReduceOp.PRODUCT, dist.ReduceOp.MIN, dist.ReduceOp.MAX, dist.ReduceOp.AVG]
    if dtype not in INTEGER:
        ops.append("premul")
    return ops


def make_op(op):
    return dist._make_nccl_premul_sum(0.5) if op == "premul" else op


def kind_of(op, dtype):
    if op == dist.ReduceOp.PRODUCT:
        return "prod"
    if op == dist.ReduceOp.AVG and dtype in INTEGER:
        return "avg_int"
    return "sum"


def reductions(group=None):
    n = 37
    for dtype in DTYPES:
        for op in ops_for(dtype):
            kind = kind_of(op, dtype)
            want = expect(n, dtype, op, kind)
            x = value(RANK, n, dtype, kind)
            dist.all_reduce(x, op=make_op(op), group=group)
            same(x, want, f"all_reduce {dtype} {op}")
            # reduce to a root
            y = value(RANK, n, dtype, kind)
            dist.reduce(y, dst=WORLD - 1, op=make_op(op), group=group)
            if RANK == WORLD - 1:
                same(y, want, f"reduce {dtype} {op}")
            # reduce_scatter_tensor: every rank contributes WORLD blocks of n
            big = torch.cat([value(RANK, n, dtype, kind)] * WORLD)
            out = torch.empty(n, dtype=dtype)
            dist.reduce_scatter_tensor(out, big, op=make_op(op), group=group)
            same(out, want, f"reduce_scatter_tensor {dtype} {op}")
    # list forms and bitwise operators on integers and bool
    outs = torch.empty(5, dtype=torch.float32)
    dist.reduce_scatter(outs, [torch.full((5,), float(RANK + r)) for r in range(WORLD)], group=group)
    same(outs, torch.full((5,), float(sum(q + RANK for q in range(WORLD)))), "reduce_scatter list")
    for op, fold in [(dist.ReduceOp.BAND, torch.bitwise_and), (dist.ReduceOp.BOR, torch.bitwise_or), (dist.ReduceOp.BXOR, torch.bitwise_xor)]:
        vals = [torch.tensor([0b1011 << r, 0xFF, r, 7], dtype=torch.int32) for r in range(WORLD)]
        want = vals[0].clone()
        for v in vals[1:]:
            want = fold(want, v)
        x = vals[RANK].clone()
        dist.all_reduce(x, op=op)
        same(x, want, f"all_reduce {op}")
    b = torch.tensor([RANK == 0, False, True])
    dist.all_reduce(b)  # SUM on bool is a logical or
    check(b.tolist() == [True, False, True], f"bool sum {b}")
    c = torch.full((3,), complex(RANK, 1), dtype=torch.complex64)
    dist.all_reduce(c)
    check(torch.allclose(c, torch.full((3,), complex(WORLD * (WORLD - 1) / 2, WORLD), dtype=torch.complex64)), f"complex {c}")


def movement():
    for dtype in [torch.float32, torch.int64, torch.bfloat16, torch.bool, torch.complex128]:
        src = (torch.arange(6) + 10 * RANK).to(dtype)
        # all_gather (list) and all_gather_into_tensor
        parts = [torch.empty(6, dtype=dtype) for _ in range(WORLD)]
        dist.all_gather(parts, src)
        for r, p in enumerate(parts):
            same(p, (torch.arange(6) + 10 * r).to(dtype), f"all_gather {dtype} from {r}")
        flat = torch.empty(6 * WORLD, dtype=dtype)
        dist.all_gather_into_tensor(flat, src)
        same(flat, torch.cat(parts), f"all_gather_into_tensor {dtype}")
        # broadcast from the last rank
        b = src.clone()
        dist.broadcast(b, src=WORLD - 1)
        same(b, (torch.arange(6) + 10 * (WORLD - 1)).to(dtype), f"broadcast {dtype}")
    # in place all_gather_into_tensor: the input is this rank's block of the output
    buf = torch.zeros(4 * WORLD)
    buf[4 * RANK : 4 * RANK + 4] = RANK + 1
    dist.all_gather_into_tensor(buf, buf[4 * RANK : 4 * RANK + 4])
    same(buf, torch.arange(WORLD).repeat_interleave(4).float() + 1, "in-place all_gather_into_tensor")
    # gather and scatter to and from rank 0
    got = [torch.empty(3) for _ in range(WORLD)] if RANK == 0 else None
    dist.gather(torch.full((3,), float(RANK)), got, dst=0)
    if RANK == 0:
        for r, g in enumerate(got):
            same(g, torch.full((3,), float(r)), f"gather from {r}")
    piece = torch.empty(3)
    dist.scatter(piece, [torch.full((3,), float(r * 2)) for r in range(WORLD)] if RANK == 0 else None, src=0)
    same(piece, torch.full((3,), float(RANK * 2)), "scatter")


def all_to_all():
    # equal splits
    inp = torch.arange(WORLD * 2, dtype=torch.float32) + 100 * RANK
    out = torch.empty_like(inp)
    dist.all_to_all_single(out, inp)
    want = torch.cat([torch.arange(2 * RANK, 2 * RANK + 2, dtype=torch.float32) + 100 * r for r in range(WORLD)])
    same(out, want, "all_to_all_single equal")
    # uneven splits: rank r sends (p + 1) rows of 3 to rank p
    send_splits = [p + 1 for p in range(WORLD)]
    recv_splits = [RANK + 1] * WORLD
    inp = torch.cat([torch.full((p + 1, 3), float(RANK * 10 + p)) for p in range(WORLD)])
    out = torch.empty((sum(recv_splits), 3))
    dist.all_to_all_single(out, inp, recv_splits, send_splits)
    want = torch.cat([torch.full((RANK + 1, 3), float(r * 10 + RANK)) for r in range(WORLD)])
    same(out, want, "all_to_all_single with splits")
    # list form with different sizes per peer
    ins = [torch.full((p + 2,), float(RANK * 100 + p), dtype=torch.float64) for p in range(WORLD)]
    outs = [torch.empty(RANK + 2, dtype=torch.float64) for _ in range(WORLD)]
    dist.all_to_all(outs, ins)
    for r, o in enumerate(outs):
        same(o, torch.full((RANK + 2,), float(r * 100 + RANK), dtype=torch.float64), f"all_to_all from {r}")


def point_to_point():
    nxt, prv = (RANK + 1) % WORLD, (RANK - 1) % WORLD
    if WORLD > 1:
        if RANK == 0:
            dist.send(torch.arange(5.0), dst=1)
        elif RANK == 1:
            t = torch.empty(5)
            dist.recv(t, src=0)
            same(t, torch.arange(5.0), "send/recv")
    # a ring of 4 MiB messages: large enough that unbatched blocking sends would deadlock
    big = 1 << 20
    out, inp = torch.full((big,), float(RANK)), torch.empty(big)
    reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, out, nxt), dist.P2POp(dist.irecv, inp, prv)])
    for r in reqs:
        r.wait()
    same(inp[:: big // 7], torch.full((8,), float(prv)), "batch_isend_irecv ring")
    dist.barrier()


def asynchronous_and_views():
    x = torch.full((1000,), float(RANK + 1))
    work = dist.all_reduce(x, async_op=True)
    fut = work.get_future()
    check(work.wait() is True, "wait() returns True")
    value_ = fut.wait()
    check(isinstance(value_, list) and value_[0] is x, f"future value is the output list: {value_}")
    same(x, torch.full((1000,), float(WORLD * (WORLD + 1) / 2)), "async all_reduce")
    # several in flight at once, completed in issue order
    ts = [torch.full((100,), float(i + RANK)) for i in range(8)]
    works = [dist.all_reduce(t, async_op=True) for t in ts]
    for w in works:
        w.wait()
    for i, t in enumerate(ts):
        same(t, torch.full((100,), float(i * WORLD + WORLD * (WORLD - 1) / 2)), f"async #{i}")
    # a non-contiguous view (a transposed matrix's column-major walk) is reduced in place
    m = torch.arange(12, dtype=torch.float32).reshape(3, 4) + RANK
    view = m.t()
    check(not view.is_contiguous(), "the view is not contiguous")
    dist.all_reduce(view)
    same(m, (torch.arange(12, dtype=torch.float32).reshape(3, 4) * WORLD + WORLD * (WORLD - 1) / 2), "non-contiguous all_reduce")
    # a coalesced block of all-reduces
    ts = [torch.full((10,), 1.0), torch.full((20,), 2.0)]
    with dist._coalescing_manager(async_ops=True) as cm:
        for t in ts:
            dist.all_reduce(t)
    cm.wait()
    same(ts[1], torch.full((20,), 2.0 * WORLD), "coalesced all_reduce")
    # all_gather_coalesced: outputs laid out [rank][tensor], tensors of different shapes
    outs = [[torch.empty(3), torch.empty(2, 2)] for _ in range(WORLD)]
    dist.all_gather_coalesced(outs, [torch.full((3,), float(RANK)), torch.full((2, 2), 10.0 + RANK)])
    for q in range(WORLD):
        same(outs[q][0], torch.full((3,), float(q)), f"all_gather_coalesced from rank {q}, first")
        same(outs[q][1], torch.full((2, 2), 10.0 + q), f"all_gather_coalesced from rank {q}, second")


def bad_arguments():
    for name, call, err in [
        ("meta tensor", lambda: dist.all_reduce(torch.empty(3, device="meta")), ValueError),
        ("all_gather_into_tensor size", lambda: dist.all_gather_into_tensor(torch.empty(WORLD * 3 + 1), torch.empty(3)), ValueError),
        ("reduce_scatter_tensor size", lambda: dist.reduce_scatter_tensor(torch.empty(3), torch.empty(3 * WORLD + 2)), ValueError),
        ("all_to_all_single splits", lambda: dist.all_to_all_single(torch.empty(WORLD), torch.empty(WORLD), [1] * WORLD, [2] * WORLD), ValueError),
        ("bitwise on float", lambda: dist.all_reduce(torch.ones(3), op=dist.ReduceOp.BAND), TypeError),
    ]:
        try:
            call()
        except err as e:
            check("strata" in str(e), f"{name}: the error names strata: {e}")
        else:
            check(False, f"{name} was accepted")
    # a pre-multiplied sum on integers scales by the integer factor, as NCCL's does
    x = torch.full((3,), RANK + 1, dtype=torch.int32)
    dist.all_reduce(x, op=dist._make_nccl_premul_sum(2.0))
    same(x, torch.full((3,), WORLD * (WORLD + 1), dtype=torch.int32), "premul_sum on int32")
    # nothing was sent: the group still works
    x = torch.ones(4)
    dist.all_reduce(x)
    same(x, torch.full((4,), float(WORLD)), "all_reduce after refused calls")


def sub_groups():
    members = [0, WORLD - 1] if WORLD > 1 else [0]
    g = dist.new_group(members, backend="strata", timeout=timedelta(seconds=60))
    evens = dist.new_group([r for r in range(WORLD) if r % 2 == 0], backend="strata")
    if RANK in members:
        x = torch.full((5,), float(RANK))
        dist.all_reduce(x, group=g)
        same(x, torch.full((5,), float(sum(members))), "sub-group all_reduce")
        check(dist.get_world_size(g) == len(members), "sub-group size")
    if RANK % 2 == 0:
        reductions_small(evens)
    dist.barrier()


def reductions_small(group):
    ranks = [r for r in range(WORLD) if r % 2 == 0]
    x = torch.full((9,), float(RANK))
    dist.all_reduce(x, group=group, op=dist.ReduceOp.MAX)
    same(x, torch.full((9,), float(max(ranks))), "evens max")


def sparse_sums():
    """COO all_reduce as gloo's: each rank holds rank+1 entries (one repeated, so the input is
    uncoalesced) of a 6 x 2 matrix with 2-wide dense rows; all end with the coalesced sum."""
    def mine(r):
        rows = torch.tensor([[i % 6 for i in range(r + 1)] + [r % 6]])
        vals = torch.arange(r + 2, dtype=torch.float64).reshape(-1, 1).repeat(1, 2) + r
        return torch.sparse_coo_tensor(rows, vals, (6, 2), check_invariants=True)
    x = mine(RANK)
    dist.all_reduce(x)
    want = sum(mine(r).to_dense() for r in range(WORLD))
    check(x.is_sparse and x.is_coalesced(), "sparse all_reduce leaves a coalesced COO tensor")
    same(x.to_dense(), want, "sparse all_reduce sum")
    try:
        dist.all_reduce(mine(RANK), op=dist.ReduceOp.MAX)
    except ValueError as e:
        check("sums only" in str(e), f"sparse MAX refused with the reason: {e}")
    else:
        check(False, "sparse MAX was accepted")
    shape = (6, 2) if RANK else (7, 2)  # rank 0 disagrees: every rank raises the same error
    try:
        dist.all_reduce(torch.sparse_coo_tensor(torch.tensor([[0]]), torch.ones(1, 2), shape, check_invariants=True))
    except dist.DistBackendError as e:
        check("differ across ranks" in str(e), f"sparse shapes that differ: {e}")
    else:
        check(False, "sparse all_reduce of different shapes was accepted")


def main():
    dist.init_process_group("strata", timeout=timedelta(seconds=120))
    check(dist.get_backend() == "strata", f"backend {dist.get_backend()}")
    check(dist.get_rank() == RANK and dist.get_world_size() == WORLD, "rank and size from torchrun")
    reductions()
    movement()
    all_to_all()
    point_to_point()
    asynchronous_and_views()
    bad_arguments()
    sparse_sums()
    sub_groups()
    dist.destroy_process_group()
    print(f"rank {RANK}/{WORLD}: {CHECKS} checks passed (strata NCCL API {strata_torch.nccl_version()})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
