/*
 * One rank of a multi-process check of the NCCL C API: every collective out of place and in
 * place, every reduction operator, PreMulSum, grouped send/recv, split, a non-blocking
 * communicator, GroupSimulateEnd, registration, and the error codes of bad arguments.
 *
 * It uses nothing but nccl.h, so it compiles against strata's header or NVIDIA's. Rank and
 * size come from RANK and WORLD_SIZE; rank 0 writes the unique id to $NCCL_TEST_ID_FILE and
 * the others read it. Exit status 0 means every check passed; each failure prints a line.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "nccl.h"

static int rank_, nranks_, failures_;

#define CHECK(cond, ...)                                       \
  do {                                                         \
    if (!(cond)) {                                             \
      fprintf(stderr, "rank %d: FAILED %s:%d: ", rank_, __FILE__, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                            \
      fprintf(stderr, "\n");                                   \
      failures_++;                                             \
    }                                                          \
  } while (0)

#define NCCL_OK(call)                                                                   \
  do {                                                                                  \
    ncclResult_t r_ = (call);                                                           \
    if (r_ != ncclSuccess) {                                                            \
      fprintf(stderr, "rank %d: FAILED %s:%d: %s returned %d (%s): %s\n", rank_, __FILE__, \
              __LINE__, #call, (int)r_, ncclGetErrorString(r_), ncclGetLastError(NULL)); \
      exit(2);                                                                          \
    }                                                                                   \
  } while (0)

static void sleep_ms(int ms) {
  struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&t, NULL);
}

/* Rank 0 publishes the id through a file (written aside, then renamed); the others wait.
 * With NCCL_COMM_ID set, every rank asks for the id itself, as NCCL programs do then. */
static ncclUniqueId share_id(const char* path) {
  ncclUniqueId id;
  if (getenv("NCCL_COMM_ID")) {
    NCCL_OK(ncclGetUniqueId(&id));
    return id;
  }
  if (rank_ == 0) {
    char tmp[4096];
    NCCL_OK(ncclGetUniqueId(&id));
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE* f = fopen(tmp, "wb");
    if (!f || fwrite(&id, sizeof id, 1, f) != 1 || fclose(f) != 0 || rename(tmp, path) != 0) {
      perror("writing the unique id");
      exit(2);
    }
    return id;
  }
  for (int i = 0; i < 30000; i++) {
    FILE* f = fopen(path, "rb");
    if (f) {
      size_t got = fread(&id, sizeof id, 1, f);
      fclose(f);
      if (got == 1) return id;
    }
    sleep_ms(2);
  }
  fprintf(stderr, "rank %d: no unique id at %s after 60 s\n", rank_, path);
  exit(2);
}

/* The test value of rank r at index i: small integers, exact in float. */
static float v(int r, size_t i) { return (float)(r + 1) + (float)(i % 7); }

static void check_collectives(ncclComm_t comm, size_t count) {
  int n = nranks_, r = rank_;
  float* send = malloc(sizeof(float) * count * n);
  float* recv = malloc(sizeof(float) * count * n);
  float* buf = malloc(sizeof(float) * count * n);
  int32_t* isend = malloc(sizeof(int32_t) * count * n);
  int32_t* irecv = malloc(sizeof(int32_t) * count * n);
  size_t i;
  for (i = 0; i < count * n; i++) send[i] = v(r, i);

  /* AllReduce with each operator, out of place; sum again in place. */
  const ncclRedOp_t ops[] = {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg};
  for (int k = 0; k < 5; k++) {
    for (i = 0; i < count; i++) isend[i] = (int32_t)(r + 1 + (i % 3 == 0));
    NCCL_OK(ncclAllReduce(isend, irecv, count, ncclInt32, ops[k], comm, NULL));
    for (i = 0; i < count; i++) {
      int32_t want = 0, prod = 1, mx = INT32_MIN, mn = INT32_MAX;
      for (int q = 0; q < n; q++) {
        int32_t x = (int32_t)(q + 1 + (i % 3 == 0));
        want += x;
        prod *= x;
        mx = x > mx ? x : mx;
        mn = x < mn ? x : mn;
      }
      int32_t expect = k == 0 ? want : k == 1 ? prod : k == 2 ? mx : k == 3 ? mn : want / n;
      if (irecv[i] != expect) {
        CHECK(0, "all_reduce op %d count %zu [%zu] = %d, want %d", k, count, i, irecv[i], expect);
        break;
      }
    }
  }
  memcpy(buf, send, sizeof(float) * count);
  NCCL_OK(ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, comm, NULL));
  for (i = 0; i < count; i++) {
    float want = 0;
    for (int q = 0; q < n; q++) want += v(q, i);
    if (buf[i] != want) {
      CHECK(0, "in-place all_reduce count %zu [%zu] = %g, want %g", count, i, buf[i], want);
      break;
    }
  }

  /* Broadcast from the last rank, out of place and in place (ncclBcast). */
  int root = n - 1;
  memset(recv, 0, sizeof(float) * count);
  NCCL_OK(ncclBroadcast(send, recv, count, ncclFloat32, root, comm, NULL));
  for (i = 0; i < count; i++)
    if (recv[i] != v(root, i)) {
      CHECK(0, "broadcast [%zu] = %g, want %g", i, recv[i], v(root, i));
      break;
    }
  for (i = 0; i < count; i++) buf[i] = r == root ? v(root, i) : -1.0f;
  NCCL_OK(ncclBcast(buf, count, ncclFloat32, root, comm, NULL));
  for (i = 0; i < count; i++)
    if (buf[i] != v(root, i)) {
      CHECK(0, "bcast [%zu] = %g, want %g", i, buf[i], v(root, i));
      break;
    }

  /* Reduce (max) to rank 1 % n; non-roots pass a NULL recvbuff. */
  root = 1 % n;
  NCCL_OK(ncclReduce(send, r == root ? recv : NULL, count, ncclFloat32, ncclMax, root, comm, NULL));
  if (r == root)
    for (i = 0; i < count; i++)
      if (recv[i] != v(n - 1, i)) {
        CHECK(0, "reduce max [%zu] = %g, want %g", i, recv[i], v(n - 1, i));
        break;
      }

  /* AllGather, out of place and in place (input at block rank). */
  NCCL_OK(ncclAllGather(send, recv, count, ncclFloat32, comm, NULL));
  for (int q = 0; q < n; q++)
    for (i = 0; i < count; i++)
      if (recv[q * count + i] != v(q, i)) {
        CHECK(0, "all_gather block %d [%zu] = %g, want %g", q, i, recv[q * count + i], v(q, i));
        q = n;
        break;
      }
  for (i = 0; i < count; i++) buf[r * count + i] = v(r, i);
  NCCL_OK(ncclAllGather(buf + r * count, buf, count, ncclFloat32, comm, NULL));
  CHECK(memcmp(buf, recv, sizeof(float) * count * n) == 0, "in-place all_gather differs");

  /* ReduceScatter, out of place and in place (output at block rank). */
  NCCL_OK(ncclReduceScatter(send, recv, count, ncclFloat32, ncclSum, comm, NULL));
  for (i = 0; i < count; i++) {
    float want = 0;
    for (int q = 0; q < n; q++) want += v(q, r * count + i);
    if (recv[i] != want) {
      CHECK(0, "reduce_scatter [%zu] = %g, want %g", i, recv[i], want);
      break;
    }
  }
  memcpy(buf, send, sizeof(float) * count * n);
  NCCL_OK(ncclReduceScatter(buf, buf + r * count, count, ncclFloat32, ncclSum, comm, NULL));
  CHECK(memcmp(buf + r * count, recv, sizeof(float) * count) == 0, "in-place reduce_scatter differs");

  /* AlltoAll: block b of rank r's input goes to rank b. */
  for (int b = 0; b < n; b++)
    for (i = 0; i < count; i++) isend[b * count + i] = r * 10000 + b * 100 + (int32_t)(i % 50);
  NCCL_OK(ncclAlltoAll(isend, irecv, count, ncclInt32, comm, NULL));
  for (int q = 0; q < n; q++)
    for (i = 0; i < count; i++)
      if (irecv[q * count + i] != q * 10000 + r * 100 + (int32_t)(i % 50)) {
        CHECK(0, "alltoall block %d [%zu] = %d", q, i, irecv[q * count + i]);
        q = n;
        break;
      }

  /* Gather to and Scatter from rank n/2. */
  root = n / 2;
  NCCL_OK(ncclGather(send, r == root ? recv : NULL, count, ncclFloat32, root, comm, NULL));
  if (r == root)
    for (int q = 0; q < n; q++)
      for (i = 0; i < count; i++)
        if (recv[q * count + i] != v(q, i)) {
          CHECK(0, "gather block %d [%zu] = %g", q, i, recv[q * count + i]);
          q = n;
          break;
        }
  for (int b = 0; b < n; b++)
    for (i = 0; i < count; i++) isend[b * count + i] = b * 100 + (int32_t)(i % 50);
  NCCL_OK(ncclScatter(r == root ? isend : NULL, irecv, count, ncclInt32, root, comm, NULL));
  for (i = 0; i < count; i++)
    if (irecv[i] != r * 100 + (int32_t)(i % 50)) {
      CHECK(0, "scatter [%zu] = %d", i, irecv[i]);
      break;
    }

  /* A ring shift with send and receive in one group (deadlocks without fusion for large
   * counts), plus a second, nested group in the same call. */
  int next = (r + 1) % n, prev = (r + n - 1) % n;
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclSend(send, count, ncclFloat32, next, comm, NULL));
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclRecv(recv, count, ncclFloat32, prev, comm, NULL));
  NCCL_OK(ncclGroupEnd());
  NCCL_OK(ncclGroupEnd());
  for (i = 0; i < count; i++)
    if (recv[i] != v(prev, i)) {
      CHECK(0, "group send/recv [%zu] = %g, want %g", i, recv[i], v(prev, i));
      break;
    }

  /* PreMulSum: each rank scales by r + 1, read now (host immediate) or at the call. */
  float scalar = (float)(r + 1);
  ncclRedOp_t premul, premul_late;
  NCCL_OK(ncclRedOpCreatePreMulSum(&premul, &scalar, ncclFloat32, ncclScalarHostImmediate, comm));
  CHECK((int)premul >= (int)ncclNumOps, "premulsum op %d is a built-in value", (int)premul);
  float late = 0;
  NCCL_OK(ncclRedOpCreatePreMulSum(&premul_late, &late, ncclFloat32, ncclScalarDevice, comm));
  late = 2.0f; /* read when the call runs */
  NCCL_OK(ncclAllReduce(send, recv, count, ncclFloat32, premul, comm, NULL));
  NCCL_OK(ncclAllReduce(send, buf, count, ncclFloat32, premul_late, comm, NULL));
  for (i = 0; i < count; i++) {
    float want = 0, want_late = 0;
    for (int q = 0; q < n; q++) {
      want += (float)(q + 1) * v(q, i);
      want_late += 2.0f * v(q, i);
    }
    if (recv[i] != want || buf[i] != want_late) {
      CHECK(0, "premulsum [%zu] = %g / %g, want %g / %g", i, recv[i], buf[i], want, want_late);
      break;
    }
  }
  NCCL_OK(ncclRedOpDestroy(premul, comm));
  NCCL_OK(ncclRedOpDestroy(premul_late, comm));
  CHECK(ncclAllReduce(send, recv, count, ncclFloat32, premul, comm, NULL) == ncclInvalidArgument,
        "a destroyed premulsum op is accepted");

  free(send);
  free(recv);
  free(buf);
  free(isend);
  free(irecv);
}

static void check_errors(ncclComm_t comm) {
  float x[4] = {0}, y[4 * 64];
  CHECK(ncclAllReduce(x, y, 4, (ncclDataType_t)42, ncclSum, comm, NULL) == ncclInvalidArgument,
        "an unknown datatype is accepted");
  CHECK(strstr(ncclGetLastError(comm), "datatype 42") != NULL, "last error: %s",
        ncclGetLastError(comm));
  CHECK(ncclAllReduce(x, y, 4, ncclFloat32, (ncclRedOp_t)77, comm, NULL) == ncclInvalidArgument,
        "an unknown op is accepted");
  CHECK(ncclAllReduce(NULL, y, 4, ncclFloat32, ncclSum, comm, NULL) == ncclInvalidArgument,
        "a NULL sendbuff is accepted");
  CHECK(ncclAllReduce(NULL, NULL, 0, ncclFloat32, ncclSum, NULL, NULL) == ncclInvalidArgument,
        "a NULL comm is accepted");
  CHECK(ncclBroadcast(x, y, 4, ncclFloat32, nranks_, comm, NULL) == ncclInvalidArgument,
        "root out of range is accepted");
  CHECK(ncclSend(x, 4, ncclFloat32, -1, comm, NULL) == ncclInvalidArgument,
        "a negative peer is accepted");
  CHECK(ncclRecv(y, 4, ncclFloat32, nranks_, comm, NULL) == ncclInvalidArgument,
        "peer out of range is accepted");
  CHECK(ncclGroupEnd() == ncclInvalidUsage, "GroupEnd without GroupStart is accepted");
  /* An error inside a group is reported again by GroupEnd, and nothing of it runs. */
  NCCL_OK(ncclGroupStart());
  CHECK(ncclAllReduce(x, y, 4, (ncclDataType_t)-1, ncclSum, comm, NULL) == ncclInvalidArgument,
        "bad datatype in a group is accepted");
  CHECK(ncclGroupEnd() == ncclInvalidArgument, "GroupEnd hides the group's error");
  ncclConfig_t bad = NCCL_CONFIG_INITIALIZER;
  bad.magic = 0;
  ncclComm_t none;
  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  CHECK(ncclCommInitRankConfig(&none, nranks_, id, rank_, &bad) == ncclInvalidArgument,
        "an uninitialised config is accepted");
  CHECK(ncclCommInitRank(&none, 0, id, 0) == ncclInvalidArgument, "nranks 0 is accepted");
  int count = -1, me = -1;
  NCCL_OK(ncclCommCount(comm, &count));
  NCCL_OK(ncclCommUserRank(comm, &me));
  CHECK(count == nranks_ && me == rank_, "count %d rank %d", count, me);
  CHECK(ncclCommCount(comm, NULL) == ncclInvalidArgument, "a NULL count is accepted");
  void* h = NULL;
  NCCL_OK(ncclCommRegister(comm, y, sizeof y, &h));
  NCCL_OK(ncclCommDeregister(comm, h));
  CHECK(ncclCommDeregister(comm, h) == ncclInvalidArgument, "a double deregister is accepted");
  void* mem = NULL;
  NCCL_OK(ncclMemAlloc(&mem, 1 << 20));
  CHECK(mem != NULL && ((uintptr_t)mem & 4095) == 0, "ncclMemAlloc gave %p", mem);
  NCCL_OK(ncclMemFree(mem));
  CHECK(ncclMemFree(y) == ncclInvalidArgument, "freeing foreign memory is accepted");
  ncclResult_t async = ncclInternalError;
  NCCL_OK(ncclCommGetAsyncError(comm, &async));
  CHECK(async == ncclSuccess, "async error %d after argument errors", (int)async);
}

int main(void) {
  const char* r = getenv("RANK");
  const char* n = getenv("WORLD_SIZE");
  const char* path = getenv("NCCL_TEST_ID_FILE");
  if (!r || !n || !path) {
    fprintf(stderr, "set RANK, WORLD_SIZE and NCCL_TEST_ID_FILE\n");
    return 2;
  }
  rank_ = atoi(r);
  nranks_ = atoi(n);
  Dl_info where;
  if (dladdr((void*)ncclAllReduce, &where) && rank_ == 0)
    printf("ncclAllReduce comes from %s\n", where.dli_fname);
  int version = 0;
  NCCL_OK(ncclGetVersion(&version));
  CHECK(version >= 22700, "version %d", version);

  ncclUniqueId id = share_id(path);
  ncclComm_t comm;
  NCCL_OK(ncclCommInitRank(&comm, nranks_, id, rank_));
  const size_t counts[] = {1, 1000, 300000};
  for (int k = 0; k < 3; k++) check_collectives(comm, counts[k]);
  check_errors(comm);

  /* Split: even and odd ranks; the last rank of an odd-sized world opts out. */
  int color = (nranks_ % 2 == 1 && rank_ == nranks_ - 1) ? NCCL_SPLIT_NOCOLOR : rank_ % 2;
  ncclComm_t half;
  NCCL_OK(ncclCommSplit(comm, color, -rank_, &half, NULL));
  if (color == NCCL_SPLIT_NOCOLOR) {
    CHECK(half == NULL, "NCCL_SPLIT_NOCOLOR gave a communicator");
  } else {
    int hn = 0, hr = -1;
    NCCL_OK(ncclCommCount(half, &hn));
    NCCL_OK(ncclCommUserRank(half, &hr));
    int members = 0, higher = 0;
    for (int q = 0; q < nranks_; q++) {
      int c = (nranks_ % 2 == 1 && q == nranks_ - 1) ? -1 : q % 2;
      if (c == color) {
        members++;
        higher += q > rank_;
      }
    }
    CHECK(hn == members && hr == higher, "split: %d of %d, want %d of %d", hr, hn, higher, members);
    int32_t one = 1, total = 0;
    NCCL_OK(ncclAllReduce(&one, &total, 1, ncclInt32, ncclSum, half, NULL));
    CHECK(total == members, "split all_reduce %d, want %d", total, members);
    NCCL_OK(ncclCommDestroy(half));
  }

  /* A non-blocking communicator split off the world: calls return ncclInProgress and
   * complete in the background; GetAsyncError reports when. */
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  ncclComm_t nb = NULL;
  ncclResult_t res = ncclCommSplit(comm, 0, rank_, &nb, &cfg);
  CHECK(res == ncclSuccess || res == ncclInProgress, "non-blocking split returned %d", (int)res);
  ncclResult_t state = ncclInProgress;
  for (int t = 0; t < 60000 && state == ncclInProgress; t++) {
    NCCL_OK(ncclCommGetAsyncError(nb, &state));
    if (state == ncclInProgress) sleep_ms(1);
  }
  CHECK(state == ncclSuccess, "non-blocking init ended with %d: %s", (int)state, ncclGetLastError(nb));
  double d = rank_ + 0.5, dsum = 0;
  res = ncclAllReduce(&d, &dsum, 1, ncclFloat64, ncclSum, nb, NULL);
  CHECK(res == ncclInProgress || res == ncclSuccess, "non-blocking all_reduce returned %d", (int)res);
  state = ncclInProgress;
  for (int t = 0; t < 60000 && state == ncclInProgress; t++) {
    NCCL_OK(ncclCommGetAsyncError(nb, &state));
    if (state == ncclInProgress) sleep_ms(1);
  }
  CHECK(state == ncclSuccess && dsum == nranks_ * nranks_ / 2.0, "non-blocking sum %g (state %d)",
        dsum, (int)state);
  res = ncclCommFinalize(nb);
  CHECK(res == ncclSuccess || res == ncclInProgress, "finalize returned %d", (int)res);
  NCCL_OK(ncclCommDestroy(nb));

  /* The cost model prices a group instead of running it. */
  float big[4096];
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  NCCL_OK(ncclGroupStart());
  NCCL_OK(ncclAllReduce(big, big, 4096, ncclFloat32, ncclSum, comm, NULL));
  NCCL_OK(ncclGroupSimulateEnd(&sim));
  CHECK(nranks_ == 1 || sim.estimatedTime > 0, "estimated time %g", sim.estimatedTime);

  NCCL_OK(ncclCommFinalize(comm));
  NCCL_OK(ncclCommDestroy(comm));
  CHECK(ncclAllReduce(big, big, 1, ncclFloat32, ncclSum, comm, NULL) == ncclInvalidArgument,
        "a destroyed communicator is accepted");
  CHECK(ncclCommDestroy(comm) == ncclInvalidArgument, "a double destroy is accepted");
  if (failures_ == 0) printf("rank %d of %d: all checks passed\n", rank_, nranks_);
  return failures_ == 0 ? 0 : 1;
}
