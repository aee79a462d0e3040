/*
 * One benchmark binary for NVIDIA's NCCL and strata's drop-in alike (pick by LD_PRELOAD or
 * LD_LIBRARY_PATH): all-reduce, all-gather and reduce-scatter of float sums from MIN to MAX
 * bytes by factors of 2, timed with CUDA events as nccl-tests times them, each size checked. Sizes are
 * nccl-tests' (all-gather and reduce-scatter: the whole gathered or scattered buffer).
 *
 *   gpu_bench threads N MIN MAX   N ranks as threads of this process: ncclCommInitAll with
 *                                 the device list {0, ..., 0} (NCCL 2.30+ needs
 *                                 NCCL_MULTI_RANK_GPU_ENABLE=1), calls grouped, one stream
 *                                 per rank; the time is the slowest rank's
 *   gpu_bench procs MIN MAX       one rank of RANK / WORLD_SIZE (NCCL_TEST_ID_FILE carries the
 *                                 id) on GPU RANK mod the GPUs visible: with one GPU every rank
 *                                 shares it (under CUDA MPS to run at once)
 *   gpu_bench copy BYTES          the device-to-device copy rate of GPU 0: the bound of any
 *                                 collective among ranks that share it
 *
 * Prints one line per measurement:
 *   RESULT <coll> bytes=<B> us=<time per call> algbw=<GB/s> busbw=<GB/s> wrong=<elements>
 *   COPY bytes=<B> us=<time> rate=<GB/s, bytes read + written>
 * and "ncclGetVersion <code>" first, so each run says which library answered.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
int cuMemFree_v2(CUdeviceptr);
int cuMemsetD32_v2(CUdeviceptr, unsigned, size_t);
int cuMemcpyDtoH_v2(void*, CUdeviceptr, size_t);
int cuMemcpyDtoDAsync_v2(CUdeviceptr, CUdeviceptr, size_t, cudaStream_t);
int cuStreamCreate(cudaStream_t*, unsigned);
int cuStreamSynchronize(cudaStream_t);
int cuCtxSynchronize(void);
int cuEventCreate(CUevent*, unsigned);
int cuEventRecord(CUevent, cudaStream_t);
int cuEventSynchronize(CUevent);
int cuEventElapsedTime(float*, CUevent, CUevent);

#define CU(x) do { int r_ = (x); if (r_) { fprintf(stderr, "%s = %d\n", #x, r_); exit(2); } } while (0)
#define NC(x) do { ncclResult_t r_ = (x); if (r_) { fprintf(stderr, "%s = %d: %s\n", #x, (int)r_, ncclGetLastError(NULL)); exit(2); } } while (0)
#define MAXR 8

enum { AR, AG, RS };
static const char* NAMES[] = {"all_reduce", "all_gather", "reduce_scatter"};
static int nranks_, local_;  /* ranks in all, ranks driven by this process */
static int first_rank_;      /* the rank of local 0 */
static ncclComm_t comm_[MAXR];
static cudaStream_t stream_[MAXR];
static CUdeviceptr send_[MAXR], recv_[MAXR];
static CUevent t0_[MAXR], t1_[MAXR];

/* Elements of the send and receive buffers of `coll` at `bytes` (nccl-tests' sizes). */
static void shape(int coll, size_t bytes, size_t* count, size_t* in, size_t* out) {
  size_t elems = bytes / 4;
  if (coll == AR) { *count = elems; *in = elems; *out = elems; }
  else if (coll == AG) { *count = elems / nranks_; *in = *count; *out = *count * nranks_; }
  else { *count = elems / nranks_; *in = *count * nranks_; *out = *count; }
}

static void issue(int coll, size_t count) {
  if (local_ > 1) NC(ncclGroupStart());
  for (int l = 0; l < local_; l++) {
    void *s = (void*)send_[l], *r = (void*)recv_[l];
    if (coll == AR) NC(ncclAllReduce(s, r, count, ncclFloat, ncclSum, comm_[l], stream_[l]));
    else if (coll == AG) NC(ncclAllGather(s, r, count, ncclFloat, comm_[l], stream_[l]));
    else NC(ncclReduceScatter(s, r, count, ncclFloat, ncclSum, comm_[l], stream_[l]));
  }
  if (local_ > 1) NC(ncclGroupEnd());
}

/* Iterations for a size: about 64 MiB of traffic per timing, between 5 and 200 calls. */
static int iters_for(size_t bytes) {
  size_t it = (64u << 20) / (bytes ? bytes : 1);
  return it < 5 ? 5 : it > 200 ? 200 : (int)it;
}

static void run(size_t lo, size_t hi) {
  for (int coll = AR; coll <= RS; coll++) {
    for (size_t bytes = lo; bytes <= hi; bytes *= 2) {
      size_t count, in, out;
      shape(coll, bytes, &count, &in, &out);
      if (count == 0) continue;
      int iters = iters_for(bytes);
      for (int l = 0; l < local_; l++) {
        CU(cuMemsetD32_v2(send_[l], 0x3f800000u, in)); /* 1.0f */
        CU(cuMemsetD32_v2(recv_[l], 0, out));
      }
      CU(cuCtxSynchronize());
      issue(coll, count); /* checked below: its result is what the timed calls rewrite */
      for (int w = 0; w < 3; w++) issue(coll, count);
      for (int l = 0; l < local_; l++) CU(cuEventRecord(t0_[l], stream_[l]));
      for (int i = 0; i < iters; i++) issue(coll, count);
      for (int l = 0; l < local_; l++) CU(cuEventRecord(t1_[l], stream_[l]));
      float ms = 0;
      for (int l = 0; l < local_; l++) {
        float t;
        CU(cuEventSynchronize(t1_[l]));
        CU(cuEventElapsedTime(&t, t0_[l], t1_[l]));
        if (t > ms) ms = t;
      }
      /* Every element the same: the first, the middle and the last of each rank's output. */
      long wrong = 0;
      float want = coll == AG ? 1.0f : (float)nranks_;
      for (int l = 0; l < local_; l++) {
        size_t at[3] = {0, out / 2, out - 1};
        for (int k = 0; k < 3; k++) {
          float v;
          CU(cuMemcpyDtoH_v2(&v, recv_[l] + at[k] * 4, 4));
          if (v != want) wrong++;
        }
      }
      double us = ms * 1e3 / iters, algbw = (double)bytes / us / 1e3;
      double factor = coll == AR ? 2.0 * (nranks_ - 1) / nranks_ : (double)(nranks_ - 1) / nranks_;
      printf("RESULT %s bytes=%zu us=%.3f algbw=%.3f busbw=%.3f wrong=%ld rank=%d\n", NAMES[coll],
             bytes, us, algbw, algbw * factor, wrong, first_rank_);
      fflush(stdout);
    }
  }
}

static void alloc_all(size_t hi) {
  for (int l = 0; l < local_; l++) {
    CU(cuMemAlloc_v2(&send_[l], hi));
    CU(cuMemAlloc_v2(&recv_[l], hi));
    CU(cuStreamCreate(&stream_[l], 1 /* non-blocking */));
    CU(cuEventCreate(&t0_[l], 0));
    CU(cuEventCreate(&t1_[l], 0));
  }
}

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: gpu_bench threads N MIN MAX | procs MIN MAX | copy BYTES\n");
    return 2;
  }
  CUcontext ctx;
  int gpus = 1;
  CU(cuInit(0));
  CU(cuDeviceGetCount(&gpus));
  int gpu = !strcmp(argv[1], "procs") && getenv("RANK") ? atoi(getenv("RANK")) % gpus : 0;
  CU(cuDevicePrimaryCtxRetain(&ctx, gpu));
  CU(cuCtxSetCurrent(ctx));
  int version = 0;
  ncclGetVersion(&version);
  Dl_info where;
  printf("ncclGetVersion %d from %s\n", version,
         dladdr((void*)ncclAllReduce, &where) && where.dli_fname ? where.dli_fname : "?");
  if (!strcmp(argv[1], "copy")) {
    size_t bytes = strtoull(argv[2], 0, 0);
    CUdeviceptr a, b;
    cudaStream_t s;
    CUevent e0, e1;
    CU(cuMemAlloc_v2(&a, bytes));
    CU(cuMemAlloc_v2(&b, bytes));
    CU(cuStreamCreate(&s, 1));
    CU(cuEventCreate(&e0, 0));
    CU(cuEventCreate(&e1, 0));
    CU(cuMemcpyDtoDAsync_v2(b, a, bytes, s));
    CU(cuEventRecord(e0, s));
    for (int i = 0; i < 10; i++) CU(cuMemcpyDtoDAsync_v2(b, a, bytes, s));
    CU(cuEventRecord(e1, s));
    CU(cuEventSynchronize(e1));
    float ms;
    CU(cuEventElapsedTime(&ms, e0, e1));
    double us = ms * 1e3 / 10;
    printf("COPY bytes=%zu us=%.3f rate=%.1f\n", bytes, us, 2.0 * bytes / us / 1e3);
    return 0;
  }
  size_t lo, hi;
  if (!strcmp(argv[1], "threads")) {
    if (argc < 5) return 2;
    nranks_ = local_ = atoi(argv[2]);
    if (local_ < 1 || local_ > MAXR) return 2;
    lo = strtoull(argv[3], 0, 0);
    hi = strtoull(argv[4], 0, 0);
    alloc_all(hi);
    int devs[MAXR] = {0};
    NC(ncclCommInitAll(comm_, local_, devs));
  } else {
    if (argc < 4) return 2;
    lo = strtoull(argv[2], 0, 0);
    hi = strtoull(argv[3], 0, 0);
    first_rank_ = atoi(getenv("RANK"));
    nranks_ = atoi(getenv("WORLD_SIZE"));
    local_ = 1;
    alloc_all(hi);
    const char* path = getenv("NCCL_TEST_ID_FILE");
    ncclUniqueId id;
    if (first_rank_ == 0) {
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
    NC(ncclCommInitRank(&comm_[0], nranks_, id, first_rank_));
  }
  run(lo, hi);
  for (int l = 0; l < local_; l++) NC(ncclCommDestroy(comm_[l]));
  return 0;
}
