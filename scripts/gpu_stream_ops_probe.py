"""GPU-side cost of the stream operations strata's stream programs are made of (run on a GPU machine
with cuda-bindings: `python3 scripts/gpu_stream_ops_probe.py`; docs/gpu.md quotes an H200).

The stream is held at a wait on a host word while the operations are enqueued, then released,
so the events time what the GPU does, not how fast the host enqueues.
"""
import ctypes
import sys

from cuda.bindings import driver as cu


def ck(r):
    err = r[0] if isinstance(r, tuple) else r
    if err != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeError(str(err))
    return r[1:] if isinstance(r, tuple) else ()


ck(cu.cuInit(0))
(dev,) = ck(cu.cuDeviceGet(0))
(ctx,) = ck(cu.cuDevicePrimaryCtxRetain(dev))
ck(cu.cuCtxSetCurrent(ctx))
A = cu.CUdevice_attribute
for name in ["CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1",
             "CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS_V1",
             "CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR_V1",
             "CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS"]:
    if hasattr(A, name):
        try:
            print(name, ck(cu.cuDeviceGetAttribute(getattr(A, name), dev))[0])
        except Exception as e:  # noqa: BLE001
            print(name, "error", e)
(stream,) = ck(cu.cuStreamCreate(1))
(dptr,) = ck(cu.cuMemAlloc(1 << 16))
(hptr,) = ck(cu.cuMemHostAlloc(1 << 16, cu.CU_MEMHOSTALLOC_DEVICEMAP | cu.CU_MEMHOSTALLOC_PORTABLE))
(hdev,) = ck(cu.cuMemHostGetDevicePointer(hptr, 0))
gate = ctypes.c_uint32.from_address(int(hptr) + 60000)
e0 = ck(cu.cuEventCreate(0))[0]
e1 = ck(cu.cuEventCreate(0))[0]
GEQ = cu.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ
gen = [0]


def timed(label, n, enqueue):
    """Per-operation microseconds of `enqueue(i)` run n times back to back on the GPU."""
    best = None
    for _ in range(3):
        gen[0] += 1
        ck(cu.cuStreamWaitValue32(stream, int(hdev) + 60000, gen[0], GEQ))
        ck(cu.cuEventRecord(e0, stream))
        for i in range(n):
            enqueue(i)
        ck(cu.cuEventRecord(e1, stream))
        gate.value = gen[0]
        ck(cu.cuEventSynchronize(e1))
        (ms,) = ck(cu.cuEventElapsedTime(e0, e1))
        best = ms if best is None else min(best, ms)
    print(f"{label:<48} {1000 * best / n:8.3f} us each (n={n}, best of 3)")


N = 200
try:
    timed("cuStreamWriteValue32 -> device memory", N,
          lambda i: ck(cu.cuStreamWriteValue32(stream, int(dptr) + 4 * (i % 8), i, 0)))
    timed("cuStreamWriteValue32 -> host-mapped memory", N,
          lambda i: ck(cu.cuStreamWriteValue32(stream, int(hdev) + 4 * (i % 8), i, 0)))
    timed("cuStreamWaitValue32 (already met)", N,
          lambda i: ck(cu.cuStreamWaitValue32(stream, int(hdev) + 60000, 0, GEQ)))
    timed("cuStreamWaitValue32 on device word (met)", N,
          lambda i: ck(cu.cuStreamWaitValue32(stream, int(dptr) + 40000, 0, GEQ)))
    timed("cuEventRecord", N, lambda i: ck(cu.cuEventRecord(e0 if i % 2 else e1, stream)))
    timed("cuMemcpyDtoDAsync 32 B", N,
          lambda i: ck(cu.cuMemcpyDtoDAsync(int(dptr) + 1024, int(dptr) + 2048, 32, stream)))
except Exception as e:  # noqa: BLE001
    print("probe failed:", e)
try:
    timed("cuStreamWriteValue64 -> device memory", N,
          lambda i: ck(cu.cuStreamWriteValue64(stream, int(dptr) + 8 * (i % 4), i, 0)))
except Exception as e:  # noqa: BLE001
    print("WriteValue64 failed:", e)
try:
    def batch8(i):
        ps = []
        for j in range(8):
            p = cu.CUstreamBatchMemOpParams()
            p.writeValue.operation = cu.CUstreamBatchMemOpType.CU_STREAM_MEM_OP_WRITE_VALUE_32
            p.writeValue.address = int(dptr) + 4 * j
            p.writeValue.value = i
            p.writeValue.flags = 0
            ps.append(p)
        ck(cu.cuStreamBatchMemOp(stream, 8, ps, 0))
    timed("cuStreamBatchMemOp of 8 writes (per batch)", 50, batch8)
except Exception as e:  # noqa: BLE001
    print("BatchMemOp failed:", e)
sys.stdout.flush()
