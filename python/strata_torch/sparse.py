"""Sparse (COO) all_reduce, as gloo does it: every rank gathers every rank's indices and
values and sums them, so each ends with the same coalesced sum, written into its tensor.

Three all-gathers: a fixed header (nnz, sparse and dense dimensions, shape), then the
indices and the values, each padded to the largest nnz. Ranks whose tensors differ in shape
all raise the same error (each sees every header), and nothing more is sent.
"""

import torch
import torch.distributed as dist

MAX_DIMS = 32
_HEADER = 3 + MAX_DIMS


def check_sparse(tensor, op):
    """Refuses at the call what the sparse path cannot do."""
    if tensor.layout != torch.sparse_coo:
        raise ValueError(f"strata: sparse all_reduce takes COO tensors, not {tensor.layout}")
    if tensor.device.type != "cpu":
        raise ValueError(f"strata: the sparse all_reduce tensor is on {tensor.device}; strata's backend moves CPU tensors")
    if tensor.dim() > MAX_DIMS:
        raise ValueError(f"strata: sparse all_reduce takes at most {MAX_DIMS} dimensions, not {tensor.dim()}")
    if op != dist.ReduceOp.SUM:
        raise ValueError(f"strata: sparse all_reduce sums only (as gloo's), not {op}")


def sparse_allreduce(gather, size, tensor):
    """Sums the COO ``tensor`` over the group in place; ``gather(output, input)`` all-gathers
    one dense CPU tensor into ``output`` (``size`` times its elements)."""
    mine = tensor.coalesce()
    header = torch.zeros(_HEADER, dtype=torch.int64)
    header[0], header[1], header[2] = mine._nnz(), mine.sparse_dim(), mine.dim()
    header[3 : 3 + mine.dim()] = torch.tensor(mine.shape, dtype=torch.int64)
    headers = torch.empty(size, _HEADER, dtype=torch.int64)
    gather(headers, header)
    if not torch.all(headers[:, 1:] == headers[0, 1:]):
        shapes = sorted({(int(h[1]), tuple(int(x) for x in h[3 : 3 + int(h[2])])) for h in headers})
        raise ValueError(
            "strata: sparse all_reduce tensors differ across ranks in (sparse dims, shape): "
            + ", ".join(str(s) for s in shapes)
        )
    counts = [int(n) for n in headers[:, 0]]
    most = max(counts)
    sparse_dim, dense_shape = mine.sparse_dim(), tuple(mine.shape[mine.sparse_dim() :])
    indices = torch.zeros(sparse_dim, most, dtype=torch.int64)
    indices[:, : mine._nnz()] = mine._indices()
    values = torch.zeros((most, *dense_shape), dtype=mine.dtype)
    values[: mine._nnz()] = mine._values()
    all_indices = torch.empty(size, sparse_dim, most, dtype=torch.int64)
    all_values = torch.empty((size, most, *dense_shape), dtype=mine.dtype)
    gather(all_indices, indices.contiguous())
    gather(all_values, values)
    total = torch.sparse_coo_tensor(
        torch.cat([all_indices[r, :, :n] for r, n in enumerate(counts)], dim=1),
        torch.cat([all_values[r, :n] for r, n in enumerate(counts)]),
        mine.shape,
        check_invariants=True,
    ).coalesce()
    tensor.copy_(total)
