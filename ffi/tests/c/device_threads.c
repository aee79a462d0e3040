/*
 * Ranks that share one GPU as threads of one process, through NCCL's C API, as a program
 * written for NVIDIA's NCCL does it (NCCL 2.30+ needs NCCL_MULTI_RANK_GPU_ENABLE=1 for this;
 * strata needs nothing):
 *
 *  1. ncclCommInitAll with the device list {0, 0, ...}, then grouped calls, one stream per rank:
 *     all-reduce (sum and avg, in and out of place), all-gather, reduce-scatter, broadcast,
 *     reduce, and a ring of sends and receives, at a size the low-latency kernels take, a
 *     medium one and one beyond them (stream programs);
 *  2. ncclCommInitRank from one thread per rank, every thread on GPU 0: an all-reduce each.
 *
 *   device_threads NRANKS        exit 0 and "all checks passed" when every check passed
 *
 * On the CUDA driver stand-in this proves ordering and data; on a GPU, the same program.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nccl.h"

typedef unsigned long long CUdeviceptr;
typedef void* CUcontext;
int cuInit(unsigned);
int cuDevicePrimaryCtxRetain(CUcontext*, int);
int cuCtxSetCurrent(CUcontext);
int cuMemAlloc_v2(CUdeviceptr*, size_t);
int cuMemFree_v2(CUdeviceptr);
int cuMemcpyHtoD_v2(CUdeviceptr, const void*, size_t);
int cuMemcpyDtoH_v2(void*, CUdeviceptr, size_t);
int cuStreamCreate(cudaStream_t*, unsigned);
int cuStreamSynchronize(cudaStream_t);
int cuStreamDestroy_v2(cudaStream_t);

#define MAXR 8
static int n_, failures_;
static CUcontext ctx_;

#define CU(call)                                                                      \
  do {                                                                                \
    int r_ = (call);                                                                  \
    if (r_ != 0) {                                                                    \
      fprintf(stderr, "%s:%d: %s = %d\n", __FILE__, __LINE__, #call, r_);             \
      exit(2);                                                                        \
    }                                                                                 \
  } while (0)
#define NCCL(call)                                                                    \
  do {                                                                                \
    ncclResult_t r_ = (call);                                                         \
    if (r_ != ncclSuccess) {                                                          \
      fprintf(stderr, "%s:%d: %s = %d: %s\n", __FILE__, __LINE__, #call, (int)r_,     \
              ncclGetLastError(NULL));                                                \
      exit(2);                                                                        \
    }                                                                                 \
  } while (0)

/* Rank r's input element i: small integers, so every sum is exact in float. */
static float in_val(int r, size_t i) { return (float)((r + 1) * 10 + (int)(i % 7)); }

static void check(const char* what, int r, const float* got, const float* want, size_t n) {
  for (size_t i = 0; i < n; i++) {
    if (got[i] != want[i]) {
      if (failures_ < 20)
        fprintf(stderr, "%s: rank %d element %zu is %g, want %g\n", what, r, i, got[i], want[i]);
      failures_++;
      return;
    }
  }
}

static ncclComm_t comms_[MAXR];
static cudaStream_t streams_[MAXR];
static CUdeviceptr send_[MAXR], recv_[MAXR];
static float *host_in_, *host_out_, *want_;

static void fill_inputs(size_t count, size_t per_rank_elems) {
  (void)count;
  for (int r = 0; r < n_; r++) {
    for (size_t i = 0; i < per_rank_elems; i++) host_in_[i] = in_val(r, i);
    CU(cuMemcpyHtoD_v2(send_[r], host_in_, per_rank_elems * 4));
  }
}

static void sync_all(void) {
  for (int r = 0; r < n_; r++) CU(cuStreamSynchronize(streams_[r]));
}

static void read_back(int r, size_t elems) { CU(cuMemcpyDtoH_v2(host_out_, recv_[r], elems * 4)); }

static void collectives(size_t count) {
  char what[128];
  /* all-reduce sum, out of place */
  fill_inputs(count, count);
  NCCL(ncclGroupStart());
  for (int r = 0; r < n_; r++)
    NCCL(ncclAllReduce((void*)send_[r], (void*)recv_[r], count, ncclFloat, ncclSum, comms_[r], streams_[r]));
  NCCL(ncclGroupEnd());
  sync_all();
  for (size_t i = 0; i < count; i++) {
    want_[i] = 0;
    for (int q = 0; q < n_; q++) want_[i] += in_val(q, i);
  }
  for (int r = 0; r < n_; r++) {
    read_back(r, count);
    snprintf(what, sizeof what, "all_reduce sum %zu", count);
    check(what, r, host_out_, want_, count);
  }
  /* all-reduce avg, in place (on the send buffers) */
  NCCL(ncclGroupStart());
  for (int r = 0; r < n_; r++)
    NCCL(ncclAllReduce((void*)send_[r], (void*)send_[r], count, ncclFloat, ncclAvg, comms_[r], streams_[r]));
  NCCL(ncclGroupEnd());
  sync_all();
  for (size_t i = 0; i < count; i++) want_[i] /= (float)n_;
  for (int r = 0; r < n_; r++) {
    CU(cuMemcpyDtoH_v2(host_out_, send_[r], count * 4));
    snprintf(what, sizeof what, "all_reduce avg in place %zu", count);
    /* the avg of small integers: compare what a float division gives */
    check(what, r, host_out_, want_, count);
  }
  /* all-gather: count per rank */
  fill_inputs(count, count);
  NCCL(ncclGroupStart());
  for (int r = 0; r < n_; r++)
    NCCL(ncclAllGather((void*)send_[r], (void*)recv_[r], count, ncclFloat, comms_[r], streams_[r]));
  NCCL(ncclGroupEnd());
  sync_all();
  for (int q = 0; q < n_; q++)
    for (size_t i = 0; i < count; i++) want_[q * count + i] = in_val(q, i);
  for (int r = 0; r < n_; r++) {
    read_back(r, count * n_);
    snprintf(what, sizeof what, "all_gather %zu", count);
    check(what, r, host_out_, want_, count * n_);
  }
  /* reduce-scatter: count per rank out, count * n in */
  fill_inputs(count, count * n_);
  NCCL(ncclGroupStart());
  for (int r = 0; r < n_; r++)
    NCCL(ncclReduceScatter((void*)send_[r], (void*)recv_[r], count, ncclFloat, ncclSum, comms_[r], streams_[r]));
  NCCL(ncclGroupEnd());
  sync_all();
  for (int r = 0; r < n_; r++) {
    for (size_t i = 0; i < count; i++) {
      want_[i] = 0;
      for (int q = 0; q < n_; q++) want_[i] += in_val(q, r * count + i);
    }
    read_back(r, count);
    snprintf(what, sizeof what, "reduce_scatter %zu", count);
    check(what, r, host_out_, want_, count);
  }
  /* broadcast from rank n-1, reduce to rank 0 */
  fill_inputs(count, count);
  NCCL(ncclGroupStart());
  for (int r = 0; r < n_; r++)
    NCCL(ncclBroadcast((void*)send_[r], (void*)recv_[r], count, ncclFloat, n_ - 1, comms_[r], streams_[r]));
  NCCL(ncclGroupEnd());
  sync_all();
  for (size_t i = 0; i < count; i++) want_[i] = in_val(n_ - 1, i);
  for (int r = 0; r < n_; r++) {
    read_back(r, count);
    snprintf(what, sizeof what, "broadcast %zu", count);
    check(what, r, host_out_, want_, count);
  }
  NCCL(ncclGroupStart());
  for (int r = 0; r < n_; r++)
    NCCL(ncclReduce((void*)send_[r], (void*)recv_[r], count, ncclFloat, ncclMax, 0, comms_[r], streams_[r]));
  NCCL(ncclGroupEnd());
  sync_all();
  for (size_t i = 0; i < count; i++) want_[i] = in_val(n_ - 1, i);
  read_back(0, count);
  snprintf(what, sizeof what, "reduce max %zu", count);
  check(what, 0, host_out_, want_, count);
  /* a ring of sends and receives: rank r sends to r+1 and receives from r-1 */
  NCCL(ncclGroupStart());
  for (int r = 0; r < n_; r++) {
    NCCL(ncclSend((void*)send_[r], count, ncclFloat, (r + 1) % n_, comms_[r], streams_[r]));
    NCCL(ncclRecv((void*)recv_[r], count, ncclFloat, (r + n_ - 1) % n_, comms_[r], streams_[r]));
  }
  NCCL(ncclGroupEnd());
  sync_all();
  for (int r = 0; r < n_; r++) {
    for (size_t i = 0; i < count; i++) want_[i] = in_val((r + n_ - 1) % n_, i);
    read_back(r, count);
    snprintf(what, sizeof what, "send/recv ring %zu", count);
    check(what, r, host_out_, want_, count);
  }
}

/* Part 2: one thread per rank, each calling ncclCommInitRank on GPU 0. */
static ncclUniqueId id_;
static void* rank_thread(void* arg) {
  int r = (int)(intptr_t)arg;
  size_t count = 1000;
  CU(cuCtxSetCurrent(ctx_));
  CUdeviceptr buf;
  cudaStream_t s;
  CU(cuMemAlloc_v2(&buf, count * 4));
  CU(cuStreamCreate(&s, 0));
  float* host = malloc(count * 4);
  for (size_t i = 0; i < count; i++) host[i] = in_val(r, i);
  CU(cuMemcpyHtoD_v2(buf, host, count * 4));
  ncclComm_t comm;
  NCCL(ncclCommInitRank(&comm, n_, id_, r));
  NCCL(ncclAllReduce((void*)buf, (void*)buf, count, ncclFloat, ncclSum, comm, s));
  CU(cuStreamSynchronize(s));
  CU(cuMemcpyDtoH_v2(host, buf, count * 4));
  for (size_t i = 0; i < count; i++) {
    float want = 0;
    for (int q = 0; q < n_; q++) want += in_val(q, i);
    if (host[i] != want) {
      fprintf(stderr, "init_rank threads: rank %d element %zu is %g, want %g\n", r, i, host[i], want);
      __atomic_add_fetch(&failures_, 1, __ATOMIC_RELAXED);
      break;
    }
  }
  NCCL(ncclCommDestroy(comm));
  CU(cuStreamDestroy_v2(s));
  free(host);
  return NULL;
}

int main(int argc, char** argv) {
  n_ = argc > 1 ? atoi(argv[1]) : 2;
  if (n_ < 2 || n_ > MAXR) return 2;
  CU(cuInit(0));
  CU(cuDevicePrimaryCtxRetain(&ctx_, 0));
  CU(cuCtxSetCurrent(ctx_));
  size_t big = 70000;
  host_in_ = malloc(big * MAXR * 4);
  host_out_ = malloc(big * MAXR * 4);
  want_ = malloc(big * MAXR * 4);
  /* Every buffer before any call: an allocation waits for the device, and so for calls
   * that wait on ranks of this same thread. */
  for (int r = 0; r < n_; r++) {
    CU(cuMemAlloc_v2(&send_[r], big * n_ * 4));
    CU(cuMemAlloc_v2(&recv_[r], big * n_ * 4));
    CU(cuStreamCreate(&streams_[r], 0));
  }
  int devs[MAXR] = {0};
  NCCL(ncclCommInitAll(comms_, n_, devs));
  for (int r = 0; r < n_; r++) {
    int dev = -1;
    NCCL(ncclCommCuDevice(comms_[r], &dev));
    if (dev != 0) {
      fprintf(stderr, "ncclCommCuDevice of rank %d says %d, want 0\n", r, dev);
      failures_++;
    }
  }
  size_t counts[] = {2, 1000, big};
  for (int c = 0; c < 3; c++) collectives(counts[c]);
  for (int r = 0; r < n_; r++) NCCL(ncclCommDestroy(comms_[r]));
  printf("ncclCommInitAll with {0, ...}: %d ranks, %s\n", n_, failures_ ? "FAILED" : "ok");

  NCCL(ncclGetUniqueId(&id_));
  pthread_t t[MAXR];
  for (int r = 0; r < n_; r++) pthread_create(&t[r], NULL, rank_thread, (void*)(intptr_t)r);
  for (int r = 0; r < n_; r++) pthread_join(t[r], NULL);
  printf("ncclCommInitRank from %d threads on GPU 0: %s\n", n_, failures_ ? "FAILED" : "ok");
  if (failures_) {
    printf("%d checks failed\n", failures_);
    return 1;
  }
  printf("all checks passed\n");
  return 0;
}
