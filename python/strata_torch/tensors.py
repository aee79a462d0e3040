"""How torch tensors and reduce operators map onto strata's NCCL types and operators."""

import torch
import torch.distributed as dist

from . import _nccl as nccl

DTYPES = {
    torch.int8: nccl.INT8,
    torch.uint8: nccl.UINT8,
    torch.int32: nccl.INT32,
    torch.int64: nccl.INT64,
    torch.float16: nccl.FLOAT16,
    torch.float32: nccl.FLOAT32,
    torch.float64: nccl.FLOAT64,
    torch.bfloat16: nccl.BFLOAT16,
    torch.float8_e4m3fn: nccl.FLOAT8E4M3,
    torch.float8_e5m2: nccl.FLOAT8E5M2,
    # Reduced as unsigned bytes with SUM -> MAX and PRODUCT -> MIN, as PyTorch's NCCL does.
    torch.bool: nccl.UINT8,
}
for _name, _code in (("uint32", nccl.UINT32), ("uint64", nccl.UINT64)):
    if hasattr(torch, _name):
        DTYPES[getattr(torch, _name)] = _code

# Complex numbers are pairs of reals: sums (and averages, and real pre-multiplied sums) are
# element-wise on the pairs.
COMPLEX_PARTS = {torch.complex64: torch.float32, torch.complex128: torch.float64}

# Keyed by the RedOpType's integer value: hashing the pybind enum itself costs a microsecond.
OPS = {
    int(dist.ReduceOp.SUM): nccl.SUM,
    int(dist.ReduceOp.PRODUCT): nccl.PROD,
    int(dist.ReduceOp.MAX): nccl.MAX,
    int(dist.ReduceOp.MIN): nccl.MIN,
    int(dist.ReduceOp.AVG): nccl.AVG,
}
BITWISE = {
    int(dist.ReduceOp.BAND): torch.bitwise_and,
    int(dist.ReduceOp.BOR): torch.bitwise_or,
    int(dist.ReduceOp.BXOR): torch.bitwise_xor,
}
PREMUL_SUM = int(dist.ReduceOp.PREMUL_SUM)

# (dtype, RedOpType value) -> (ncclDataType_t, ncclRedOp_t) where no view or operator mapping
# is needed: the all-reduce fast path.
PLAIN_REDUCTIONS = {
    (dtype, kind): (code, op)
    for dtype, code in DTYPES.items()
    if dtype is not torch.bool
    for kind, op in OPS.items()
}


def check_cpu(tensor, what):
    """Refuses what this backend cannot move, with the reason."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"strata: {what} must be a torch.Tensor, not {type(tensor).__name__}")
    if tensor.device.type != "cpu":
        raise ValueError(
            f"strata: {what} is on {tensor.device}; the strata backend moves CPU tensors "
            "(CUDA tensors go through ProcessGroupNCCL with strata's libnccl.so.2, see "
            "examples/pytorch/)"
        )
    if tensor.is_sparse or tensor.layout != torch.strided:
        raise ValueError(f"strata: {what} has layout {tensor.layout}; only dense tensors move")


def reduce_type(tensor, op_kind):
    """The (ncclDataType_t, view to reduce) for ``tensor`` under operator kind ``op_kind``."""
    dtype = tensor.dtype
    if dtype in COMPLEX_PARTS:
        if op_kind not in ("sum", "avg", "premul"):
            raise ValueError(f"strata: {op_kind} is not defined on complex tensors")
        return DTYPES[COMPLEX_PARTS[dtype]], torch.view_as_real(tensor)
    if dtype not in DTYPES:
        raise TypeError(f"strata: no reduction for dtype {dtype}")
    if dtype is torch.bool and op_kind in ("avg", "premul"):
        raise ValueError(f"strata: {op_kind} is not defined on bool tensors")
    return DTYPES[dtype], tensor.view(torch.uint8) if dtype is torch.bool else tensor


def op_type(op):
    """The integer RedOpType of a ReduceOp (or of a bare RedOpType)."""
    return int(op if isinstance(op, dist.ReduceOp.RedOpType) else op.op)


def op_kind(op):
    """'sum', 'avg', 'premul', 'bitwise' or the plain operator name, from a ReduceOp."""
    kind = op_type(op)
    if kind == PREMUL_SUM:
        return "premul"
    if kind in BITWISE:
        return "bitwise"
    if kind not in OPS:
        raise ValueError(f"strata: unsupported reduce operator {op}")
    return {nccl.SUM: "sum", nccl.AVG: "avg", nccl.PROD: "product"}.get(OPS[kind], "min/max")


def nccl_op(op, dtype):
    """The ncclRedOp_t for a non-premul operator on ``dtype``."""
    kind = op_type(op)
    code = OPS[kind]
    if dtype is torch.bool:
        code = {nccl.SUM: nccl.MAX, nccl.PROD: nccl.MIN}.get(code, code)
    return code


def as_bytes(tensor):
    """A flat uint8 view of a contiguous tensor (for collectives that only move data)."""
    return tensor.reshape(-1).view(torch.uint8)


class Staged:
    """A contiguous stand-in for a tensor that may not be: copies back on ``finish()``."""

    def __init__(self, tensor, copy_in=True):
        self.target = tensor
        self.contiguous = tensor.is_contiguous()
        if self.contiguous:
            self.tensor = tensor
        else:
            self.tensor = tensor.contiguous() if copy_in else torch.empty_like(
                tensor, memory_format=torch.contiguous_format
            )

    def finish(self):
        if not self.contiguous:
            self.target.copy_(self.tensor)
