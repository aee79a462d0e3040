"""torch.distributed over strata's libnccl.so.2: run by examples/pytorch/run.sh under torchrun.

Each worker checks that the NCCL PyTorch loaded is strata's (the library mapped into the
process and the version it reports), then all-reduces, all-gathers and broadcasts a tensor
and checks the results.

This strata build moves host memory. PyTorch's NCCL backend hands it CUDA tensors, which it
rejects with ncclInvalidArgument and a message saying so (PyTorch raises it as a
DistBackendError that quotes ncclGetLastError); the script reports that outcome as such rather
than as a wrong result.
"""

import os
import sys

import torch
import torch.distributed as dist


def nccl_is_strata():
    """Whether PyTorch's NCCL calls reach strata: strata's unique ids start with STRATAID.

    (torch also maps its own wheel's libnccl.so.2, so the process's mappings prove nothing:
    what matters is which library its calls bind to, and LD_PRELOAD puts strata first.)
    """
    return bytes(torch._C._nccl_unique_id()[:8]) == b"STRATAID"


def main():
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    strata = nccl_is_strata()
    version = torch.cuda.nccl.version()
    print(f"rank {rank}/{world}: NCCL {version}, {'strata' if strata else 'not strata'}", flush=True)
    if rank == 0 and not strata:
        print("warning: this is not strata's library; was LD_PRELOAD set?", file=sys.stderr)
    x = torch.full((1 << 20,), float(rank + 1), device="cuda")
    try:
        dist.all_reduce(x)
        torch.cuda.synchronize()
    except dist.DistBackendError as e:
        if "GPU memory" in str(e):
            print(f"rank {rank}: strata rejected the CUDA tensor as documented: {e}")
            dist.destroy_process_group()
            return 0
        raise
    want = world * (world + 1) / 2
    assert torch.all(x == want), f"all_reduce gave {x[0].item()}, want {want}"
    parts = [torch.empty(4, device="cuda") for _ in range(world)]
    dist.all_gather(parts, torch.full((4,), float(rank), device="cuda"))
    assert all(torch.all(p == r) for r, p in enumerate(parts))
    b = torch.full((8,), float(rank), device="cuda")
    dist.broadcast(b, src=world - 1)
    assert torch.all(b == world - 1)
    print(f"rank {rank}: all_reduce, all_gather and broadcast are correct")
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
