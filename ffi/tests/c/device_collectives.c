/*
 * One rank of the C ABI's check on GPU buffers: every collective, in and out of place, for
 * ten types, with every built-in operator on the reducing ones, plus a group of sends and
 * receives, each enqueued on a stream and checked by a copy enqueued on the same stream after
 * it; then that a call returns before its stream has run it (the stream is gated on a host
 * flag with cuStreamWaitValue32). Run against the CUDA driver stand-in this proves ordering
 * and data only; on a real GPU, the same program checks NVIDIA's semantics.
 *
 * RANK, WORLD_SIZE and NCCL_TEST_ID_FILE as in collectives.c. Exit 0 and "all checks passed"
 * when every check passed.
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "nccl.h"

/* The few driver calls this program makes (libcuda.so.1; no CUDA headers needed). */
typedef unsigned long long CUdeviceptr;
typedef void* CUcontext;
int cuInit(unsigned);
int cuDevicePrimaryCtxRetain(CUcontext*, int);
int cuCtxSetCurrent(CUcontext);
int cuMemAlloc_v2(CUdeviceptr*, size_t);
int cuMemFree_v2(CUdeviceptr);
int cuMemcpyHtoD_v2(CUdeviceptr, const void*, size_t);
int cuMemcpyDtoHAsync_v2(void*, CUdeviceptr, size_t, cudaStream_t);
int cuStreamCreate(cudaStream_t*, unsigned);
int cuStreamSynchronize(cudaStream_t);
int cuMemHostAlloc(void**, size_t, unsigned);
int cuMemHostGetDevicePointer_v2(CUdeviceptr*, void*, unsigned);
int cuStreamWaitValue32_v2(cudaStream_t, CUdeviceptr, unsigned, unsigned);
int cuPointerGetAttribute(void*, int, CUdeviceptr);

static int rank_, n_, failures_;

#define CU(call)                                                                        \
  do {                                                                                  \
    int r_ = (call);                                                                    \
    if (r_ != 0) {                                                                      \
      fprintf(stderr, "rank %d: %s:%d: %s = %d\n", rank_, __FILE__, __LINE__, #call, r_); \
      exit(2);                                                                          \
    }                                                                                   \
  } while (0)
#define NCCL(call)                                                                     \
  do {                                                                                 \
    ncclResult_t r_ = (call);                                                          \
    if (r_ != ncclSuccess) {                                                           \
      fprintf(stderr, "rank %d: %s:%d: %s = %d: %s\n", rank_, __FILE__, __LINE__, #call, \
              (int)r_, ncclGetLastError(NULL));                                        \
      exit(2);                                                                         \
    }                                                                                  \
  } while (0)

static ncclUniqueId share_id(const char* path) {
  ncclUniqueId id;
  if (rank_ == 0) {
    char tmp[4096];
    NCCL(ncclGetUniqueId(&id));
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE* f = fopen(tmp, "wb");
    fwrite(&id, sizeof id, 1, f);
    fclose(f);
    rename(tmp, path);
  } else {
    for (;;) {
      FILE* f = fopen(path, "rb");
      if (f && fread(&id, sizeof id, 1, f) == 1) {
        fclose(f);
        break;
      }
      if (f) fclose(f);
      usleep(10000);
    }
  }
  return id;
}

/* Element i of a buffer of type t, as a double, and back. Values stay small integers. */
static size_t type_size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    default: return 8;
  }
}
static uint16_t to_half(float f) { /* exact for the small integers used here */
  if (f == 0) return 0;
  int e;
  float m = frexpf(f, &e); /* f = m * 2^e, m in [0.5, 1) */
  return (uint16_t)(((e - 1 + 15) << 10) | ((uint16_t)((m * 2 - 1) * 1024) & 0x3ff));
}
static float from_half(uint16_t h) {
  int e = (h >> 10) & 0x1f;
  if (e == 0) return 0;
  return ldexpf(1 + (h & 0x3ff) / 1024.0f, e - 15);
}
static void set(ncclDataType_t t, void* b, size_t i, double v) {
  float f = (float)v;
  uint32_t bits;
  switch (t) {
    case ncclInt8: ((int8_t*)b)[i] = (int8_t)v; break;
    case ncclUint8: ((uint8_t*)b)[i] = (uint8_t)v; break;
    case ncclInt32: ((int32_t*)b)[i] = (int32_t)v; break;
    case ncclUint32: ((uint32_t*)b)[i] = (uint32_t)v; break;
    case ncclInt64: ((int64_t*)b)[i] = (int64_t)v; break;
    case ncclUint64: ((uint64_t*)b)[i] = (uint64_t)v; break;
    case ncclFloat32: ((float*)b)[i] = f; break;
    case ncclFloat64: ((double*)b)[i] = v; break;
    case ncclFloat16: ((uint16_t*)b)[i] = to_half(f); break;
    case ncclBfloat16: memcpy(&bits, &f, 4); ((uint16_t*)b)[i] = (uint16_t)(bits >> 16); break;
    default: break;
  }
}
static double get(ncclDataType_t t, const void* b, size_t i) {
  uint32_t bits;
  float f;
  switch (t) {
    case ncclInt8: return ((const int8_t*)b)[i];
    case ncclUint8: return ((const uint8_t*)b)[i];
    case ncclInt32: return ((const int32_t*)b)[i];
    case ncclUint32: return ((const uint32_t*)b)[i];
    case ncclInt64: return (double)((const int64_t*)b)[i];
    case ncclUint64: return (double)((const uint64_t*)b)[i];
    case ncclFloat32: return ((const float*)b)[i];
    case ncclFloat64: return ((const double*)b)[i];
    case ncclFloat16: return from_half(((const uint16_t*)b)[i]);
    case ncclBfloat16: bits = (uint32_t)((const uint16_t*)b)[i] << 16; memcpy(&f, &bits, 4); return f;
    default: return 0;
  }
}

/* Rank r's input element i: 1, 2 or 3, so sums, products, minima and maxima are exact. */
static double input(int r, size_t i) { return (double)((r + i) % 3 + 1); }

static double reduce(ncclRedOp_t op, size_t i) {
  double acc = input(0, i);
  for (int r = 1; r < n_; r++) {
    double v = input(r, i);
    if (op == ncclSum || op == ncclAvg) acc += v;
    if (op == ncclProd) acc *= v;
    if (op == ncclMin) acc = v < acc ? v : acc;
    if (op == ncclMax) acc = v > acc ? v : acc;
  }
  return acc;
}

static cudaStream_t stream_;

static CUdeviceptr upload(ncclDataType_t t, size_t count, double (*value)(size_t, void*), void* ctx) {
  size_t es = type_size(t), bytes = count > 0 ? count * es : es;
  void* h = calloc(1, bytes);
  for (size_t i = 0; i < count; i++) set(t, h, i, value(i, ctx));
  CUdeviceptr d;
  CU(cuMemAlloc_v2(&d, bytes));
  CU(cuMemcpyHtoD_v2(d, h, bytes));
  free(h);
  return d;
}

typedef enum { ALLREDUCE, BROADCAST, REDUCE, ALLGATHER, REDUCESCATTER, ALLTOALL, GATHER, SCATTER } coll_t;
static const char* names[] = {"all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "all_to_all", "gather", "scatter"};

struct fill { coll_t c; int in_place; size_t count; };
/* The input buffer (or the in-place buffer) of this rank, element i. */
static double fill_value(size_t i, void* ctx) {
  struct fill* f = ctx;
  size_t blk = f->count, p = (size_t)n_;
  switch (f->c) {
    case ALLGATHER: case GATHER:
      if (f->in_place) return i / blk == (size_t)rank_ ? input(rank_, i % blk) : 0;
      return input(rank_, i);
    case ALLTOALL: case SCATTER: return input(rank_, i) + (double)(i / blk);
    case REDUCESCATTER: return input(rank_, i);
    default: (void)p; return input(rank_, i);
  }
}

static double zero(size_t i, void* x) { (void)i; (void)x; return 0; }

static void check_one(coll_t c, ncclDataType_t t, ncclRedOp_t op, size_t count, int in_place, ncclComm_t comm) {
  size_t p = (size_t)n_, es = type_size(t);
  int root = n_ - 1, is_root = rank_ == root;
  size_t in_n = count, out_n = count;
  if (c == ALLGATHER) out_n = count * p;
  if (c == REDUCESCATTER) in_n = count * p;
  if (c == ALLTOALL) in_n = out_n = count * p;
  if (c == GATHER) out_n = count * p;
  if (c == SCATTER) in_n = count * p;
  struct fill f = {c, in_place, count};
  size_t big = in_n > out_n ? in_n : out_n;
  CUdeviceptr send = upload(t, in_place ? big : in_n, fill_value, &f);
  CUdeviceptr recv = send;
  if (!in_place) recv = upload(t, out_n, zero, NULL);
  const void* s = (const void*)send;
  void* r = (void*)recv;
  /* In place, the input sits at NCCL's position inside recvbuff. */
  if (in_place && (c == ALLGATHER || (c == GATHER))) s = (const char*)r + (size_t)rank_ * count * es;
  if (in_place && c == REDUCESCATTER) r = (char*)s + (size_t)rank_ * count * es;
  if (in_place && c == SCATTER) r = (char*)s + (size_t)rank_ * count * es;
  switch (c) {
    case ALLREDUCE: NCCL(ncclAllReduce(s, r, count, t, op, comm, stream_)); break;
    case BROADCAST: NCCL(ncclBroadcast(s, r, count, t, root, comm, stream_)); break;
    case REDUCE: NCCL(ncclReduce(s, r, count, t, op, root, comm, stream_)); break;
    case ALLGATHER: NCCL(ncclAllGather(s, r, count, t, comm, stream_)); break;
    case REDUCESCATTER: NCCL(ncclReduceScatter(s, r, count, t, op, comm, stream_)); break;
    case ALLTOALL: NCCL(ncclAlltoAll(s, r, count, t, comm, stream_)); break;
    case GATHER: NCCL(ncclGather(s, r, count, t, root, comm, stream_)); break;
    case SCATTER: NCCL(ncclScatter(s, r, count, t, root, comm, stream_)); break;
  }
  size_t check_n = out_n;
  if ((c == REDUCE || c == GATHER) && !is_root) check_n = 0;
  if (c == SCATTER && in_place) check_n = count;
  if (c == REDUCESCATTER && in_place) check_n = count;
  void* h = malloc(check_n * es + 1);
  if (check_n) CU(cuMemcpyDtoHAsync_v2(h, (CUdeviceptr)r, check_n * es, stream_));
  CU(cuStreamSynchronize(stream_));
  for (size_t i = 0; i < check_n; i++) {
    double want;
    switch (c) {
      case ALLREDUCE: case REDUCE: want = reduce(op, i); break;
      case BROADCAST: want = input(root, i); break;
      case ALLGATHER: case GATHER: want = input((int)(i / count), i % count); break;
      case REDUCESCATTER: want = reduce(op, (size_t)rank_ * count + i); break;
      case ALLTOALL: want = input((int)(i / count), (size_t)rank_ * count + i % count) + rank_; break;
      case SCATTER: want = input(root, (size_t)rank_ * count + i) + rank_; break;
      default: want = 0;
    }
    if (op == ncclAvg && (c == ALLREDUCE || c == REDUCE || c == REDUCESCATTER)) {
      want /= n_;
      if (t != ncclFloat32 && t != ncclFloat64 && t != ncclFloat16 && t != ncclBfloat16) want = floor(want);
    }
    double got = get(t, h, i);
    double tol = (t == ncclFloat16 || t == ncclBfloat16) ? 0.02 * fabs(want) + 0.01 : 1e-6;
    if (fabs(got - want) > tol) {
      if (failures_++ < 10)
        fprintf(stderr, "rank %d: FAILED %s type %d op %d count %zu in_place %d: [%zu] = %g, want %g\n",
                rank_, names[c], (int)t, (int)op, count, in_place, i, got, want);
      break;
    }
  }
  free(h);
  CU(cuMemFree_v2(send));
  if (!in_place) CU(cuMemFree_v2(recv));
}

static double ring_value(size_t i, void* x) { return (double)(*(int*)x * 1000 + (int)(i % 1000)); }

int main(int argc, char** argv) {
  (void)argc; (void)argv;
  rank_ = atoi(getenv("RANK"));
  n_ = atoi(getenv("WORLD_SIZE"));
  CUcontext ctx;
  CU(cuInit(0));
  CU(cuDevicePrimaryCtxRetain(&ctx, 0));
  CU(cuCtxSetCurrent(ctx));
  CU(cuStreamCreate(&stream_, 1));
  ncclUniqueId id = share_id(getenv("NCCL_TEST_ID_FILE"));
  ncclComm_t comm;
  NCCL(ncclCommInitRank(&comm, n_, id, rank_));

  ncclDataType_t types[] = {ncclInt8, ncclUint8, ncclInt32, ncclUint32, ncclInt64, ncclUint64,
                            ncclFloat16, ncclFloat32, ncclFloat64, ncclBfloat16};
  ncclRedOp_t ops[] = {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg};
  size_t counts[] = {1, 5000};
  for (int c = ALLREDUCE; c <= SCATTER; c++)
    for (size_t ti = 0; ti < sizeof types / sizeof *types; ti++)
      for (size_t oi = 0; oi < 5; oi++) {
        int reduces = c == ALLREDUCE || c == REDUCE || c == REDUCESCATTER;
        if (!reduces && oi > 0) break;
        for (int ip = 0; ip < 2; ip++)
          for (size_t ci = 0; ci < 2; ci++) check_one((coll_t)c, types[ti], ops[oi], counts[ci], ip, comm);
      }

  /* A ring of sends and receives in one group, on device buffers. */
  size_t count = 1 << 16;
  int me = rank_, from = (rank_ + n_ - 1) % n_;
  CUdeviceptr out = upload(ncclInt32, count, ring_value, &me), in = upload(ncclInt32, count, ring_value, &me);
  NCCL(ncclGroupStart());
  NCCL(ncclSend((void*)out, count, ncclInt32, (rank_ + 1) % n_, comm, stream_));
  NCCL(ncclRecv((void*)in, count, ncclInt32, from, comm, stream_));
  NCCL(ncclGroupEnd());
  int32_t* h = malloc(count * 4);
  CU(cuMemcpyDtoHAsync_v2(h, in, count * 4, stream_));
  CU(cuStreamSynchronize(stream_));
  for (size_t i = 0; i < count; i++)
    if (h[i] != (int32_t)ring_value(i, &from)) {
      fprintf(stderr, "rank %d: FAILED ring [%zu] = %d\n", rank_, i, h[i]);
      failures_++;
      break;
    }

  /* The call returns before its stream runs it: gate the stream on a host flag. */
  volatile unsigned* gate;
  CUdeviceptr gate_dev;
  CU(cuMemHostAlloc((void**)&gate, 64, 2 /* DEVICEMAP */));
  *gate = 0;
  CU(cuMemHostGetDevicePointer_v2(&gate_dev, (void*)gate, 0));
  CU(cuStreamWaitValue32_v2(stream_, gate_dev, 1, 1 /* EQ */));
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  NCCL(ncclAllReduce((void*)out, (void*)out, count, ncclInt32, ncclSum, comm, stream_));
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double ms = (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6;
  if (ms > 250) { fprintf(stderr, "rank %d: FAILED the call blocked %.0f ms\n", rank_, ms); failures_++; }
  usleep(200000);
  *gate = 1;
  CU(cuMemcpyDtoHAsync_v2(h, out, count * 4, stream_));
  CU(cuStreamSynchronize(stream_));
  double want = 0;
  for (int r = 0; r < n_; r++) want += ring_value(7, &r);
  if (h[7] != (int32_t)want) { fprintf(stderr, "rank %d: FAILED gated sum %d want %g\n", rank_, h[7], want); failures_++; }
  ncclResult_t async;
  NCCL(ncclCommGetAsyncError(comm, &async));
  if (async != ncclSuccess) { fprintf(stderr, "rank %d: FAILED async error %d\n", rank_, (int)async); failures_++; }
  free(h);

  /* ncclMemAlloc gives device memory when the driver is loaded and a device is current. */
  void* m;
  unsigned memory_type = 0;
  NCCL(ncclMemAlloc(&m, 1 << 20));
  CU(cuPointerGetAttribute(&memory_type, 2 /* MEMORY_TYPE */, (CUdeviceptr)m));
  if (memory_type != 2 /* DEVICE */) {
    fprintf(stderr, "rank %d: FAILED ncclMemAlloc gave memory of type %u\n", rank_, memory_type);
    failures_++;
  }
  NCCL(ncclMemFree(m));
  NCCL(ncclCommDestroy(comm));
  if (failures_) {
    fprintf(stderr, "rank %d: %d checks failed\n", rank_, failures_);
    return 1;
  }
  printf("rank %d: all checks passed\n", rank_);
  return 0;
}
