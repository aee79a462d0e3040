/*
 * A complete NCCL program: N ranks (processes forked here) average a 64 MiB gradient with
 * ncclAllReduce, time 1000 all-reduces of 8 bytes, then pass a token around a ring with
 * grouped ncclSend/ncclRecv.
 *
 *   scripts/build-libnccl.sh
 *   cc examples/c/allreduce.c -I target/strata-nccl/include -L target/strata-nccl/lib -lnccl \
 *      -Wl,-rpath,$PWD/target/strata-nccl/lib -o /tmp/allreduce
 *   STRATA_SOCKET_IFNAME==lo /tmp/allreduce 4
 *
 * The same source builds against NVIDIA's nccl.h; strata's buffers are host memory. Rank 0
 * makes the unique id and hands it to the others through pipes, as a launcher would through
 * its own channel (MPI_Bcast, a file, a key-value store).
 */
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "nccl.h"

#define CHECK(call)                                                                   \
  do {                                                                                \
    ncclResult_t r_ = (call);                                                         \
    if (r_ != ncclSuccess) {                                                          \
      fprintf(stderr, "rank %d: %s failed: %s (%s)\n", rank, #call,                   \
              ncclGetErrorString(r_), ncclGetLastError(NULL));                        \
      exit(1);                                                                        \
    }                                                                                 \
  } while (0)

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char** argv) {
  int nranks = argc > 1 ? atoi(argv[1]) : 4, rank = 0;
  if (nranks < 1) return 2;
  int pipes[64][2];
  if (nranks > 64) return 2;
  /* Fork before the first NCCL call: the library starts threads, and fork keeps only one. */
  for (int r = 1; r < nranks; r++) {
    if (pipe(pipes[r]) != 0) return 2;
    if (fork() == 0) {
      rank = r;
      break;
    }
  }
  ncclUniqueId id;
  if (rank == 0) {
    CHECK(ncclGetUniqueId(&id));
    for (int r = 1; r < nranks; r++)
      if (write(pipes[r][1], &id, sizeof id) != sizeof id) return 2;
  } else if (read(pipes[rank][0], &id, sizeof id) != sizeof id) {
    return 2;
  }

  ncclComm_t comm;
  CHECK(ncclCommInitRank(&comm, nranks, id, rank));

  size_t count = 16 << 20; /* 64 MiB of float */
  float* grad = malloc(count * sizeof(float));
  for (size_t i = 0; i < count; i++) grad[i] = (float)rank;
  double t = now();
  CHECK(ncclAllReduce(grad, grad, count, ncclFloat, ncclAvg, comm, NULL));
  t = now() - t;
  float want = (float)(nranks - 1) / 2.0f;
  /* Latency: 1000 all-reduces of one double, after 100 to warm up. */
  double one = 1.0;
  for (int i = 0; i < 100; i++) CHECK(ncclAllReduce(&one, &one, 1, ncclDouble, ncclMax, comm, NULL));
  double small = now();
  for (int i = 0; i < 1000; i++) CHECK(ncclAllReduce(&one, &one, 1, ncclDouble, ncclMax, comm, NULL));
  small = (now() - small) / 1000;
  int token = rank * 100, got = -1;
  CHECK(ncclGroupStart());
  CHECK(ncclSend(&token, 1, ncclInt32, (rank + 1) % nranks, comm, NULL));
  CHECK(ncclRecv(&got, 1, ncclInt32, (rank + nranks - 1) % nranks, comm, NULL));
  CHECK(ncclGroupEnd());
  printf("rank %d: average %g (want %g), %.1f ms for 64 MiB, %.1f us per 8 B all-reduce; "
         "token %d from rank %d\n",
         rank, grad[count - 1], want, t * 1e3, small * 1e6, got, (rank + nranks - 1) % nranks);
  int ok = grad[0] == want && grad[count - 1] == want && got == ((rank + nranks - 1) % nranks) * 100;
  CHECK(ncclCommDestroy(comm));
  free(grad);
  if (rank == 0) {
    int status, failed = 0;
    while (wait(&status) > 0) failed |= !WIFEXITED(status) || WEXITSTATUS(status) != 0;
    return failed || !ok;
  }
  return !ok;
}
