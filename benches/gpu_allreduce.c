/*
 * All-reduce on GPU buffers through the NCCL C API, timed with CUDA events as nccl-tests
 * times it: one binary, run against NVIDIA's libnccl.so.2 or strata's (pick with
 * LD_LIBRARY_PATH), so the two are measured by the same code (scripts/gpu-check.sh).
 *
 *   RANK, WORLD_SIZE, NCCL_TEST_ID_FILE as in ffi/tests/c/collectives.c
 *   gpu_allreduce MIN_BYTES MAX_BYTES ITERS   prints "bytes time_us busbw_GBs" per size on rank 0
 *
 * Each rank uses GPU (RANK % visible GPUs). Compiles against NVIDIA's nccl.h (with
 * ffi/tests/c/cuda-standin on the include path when CUDA's headers are absent) or strata's.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "nccl.h"

typedef unsigned long long CUdeviceptr;
typedef void* CUcontext;
typedef void* CUevent;
int cuInit(unsigned);
int cuDeviceGetCount(int*);
int cuDevicePrimaryCtxRetain(CUcontext*, int);
int cuCtxSetCurrent(CUcontext);
int cuMemAlloc_v2(CUdeviceptr*, size_t);
int cuMemsetD8_v2(CUdeviceptr, unsigned char, size_t);
int cuStreamCreate(cudaStream_t*, unsigned);
int cuStreamSynchronize(cudaStream_t);
int cuEventCreate(CUevent*, unsigned);
int cuEventRecord(CUevent, cudaStream_t);
int cuEventSynchronize(CUevent);
int cuEventElapsedTime(float*, CUevent, CUevent);

#define CU(x) do { int r_ = (x); if (r_) { fprintf(stderr, "%s = %d\n", #x, r_); exit(2); } } while (0)
#define NC(x) do { ncclResult_t r_ = (x); if (r_) { fprintf(stderr, "%s = %d: %s\n", #x, (int)r_, ncclGetLastError(NULL)); exit(2); } } while (0)

int main(int argc, char** argv) {
  if (argc < 4) { fprintf(stderr, "usage: %s MIN_BYTES MAX_BYTES ITERS\n", argv[0]); return 2; }
  size_t lo = strtoull(argv[1], 0, 0), hi = strtoull(argv[2], 0, 0);
  int iters = atoi(argv[3]), rank = atoi(getenv("RANK")), n = atoi(getenv("WORLD_SIZE"));
  const char* path = getenv("NCCL_TEST_ID_FILE");
  int ngpu;
  CUcontext ctx;
  CU(cuInit(0));
  CU(cuDeviceGetCount(&ngpu));
  CU(cuDevicePrimaryCtxRetain(&ctx, rank % ngpu));
  CU(cuCtxSetCurrent(ctx));
  ncclUniqueId id;
  if (rank == 0) {
    char tmp[4096];
    NC(ncclGetUniqueId(&id));
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE* f = fopen(tmp, "wb");
    fwrite(&id, sizeof id, 1, f);
    fclose(f);
    rename(tmp, path);
  } else {
    for (;;) {
      FILE* f = fopen(path, "rb");
      if (f && fread(&id, sizeof id, 1, f) == 1) { fclose(f); break; }
      if (f) fclose(f);
      usleep(10000);
    }
  }
  ncclComm_t comm;
  NC(ncclCommInitRank(&comm, n, id, rank));
  cudaStream_t s;
  CU(cuStreamCreate(&s, 1));
  CUdeviceptr buf;
  CU(cuMemAlloc_v2(&buf, hi));
  CU(cuMemsetD8_v2(buf, 0, hi));
  CUevent a, b;
  CU(cuEventCreate(&a, 0));
  CU(cuEventCreate(&b, 0));
  for (size_t bytes = lo; bytes <= hi; bytes *= 2) {
    size_t count = bytes / 4 ? bytes / 4 : 1;
    for (int i = 0; i < 5; i++) NC(ncclAllReduce((void*)buf, (void*)buf, count, ncclFloat, ncclSum, comm, s));
    CU(cuStreamSynchronize(s));
    CU(cuEventRecord(a, s));
    for (int i = 0; i < iters; i++) NC(ncclAllReduce((void*)buf, (void*)buf, count, ncclFloat, ncclSum, comm, s));
    CU(cuEventRecord(b, s));
    CU(cuEventSynchronize(b));
    float ms;
    CU(cuEventElapsedTime(&ms, a, b));
    double us = ms * 1e3 / iters, busbw = n > 1 ? (double)bytes / us / 1e3 * 2.0 * (n - 1) / n : 0;
    if (rank == 0) printf("%zu %.2f %.3f\n", bytes, us, busbw);
    if (bytes == hi) break;
  }
  NC(ncclCommDestroy(comm));
  return 0;
}
