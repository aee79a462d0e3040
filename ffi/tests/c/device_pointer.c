/*
 * A GPU pointer passed to this host-memory build is ncclInvalidArgument with a message that
 * says why, never a crash; host buffers on the same communicator keep working. Runs as one
 * rank. The fake driver (fake_cuda.c, path in argv[1]) is loaded only after the first calls,
 * as PyTorch loads CUDA lazily, and marks one buffer as device memory.
 */
#define _POSIX_C_SOURCE 200809L
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nccl.h"

int main(int argc, char** argv) {
  static float host[1024], gpu[1024];
  int failures = 0;
  ncclComm_t comm;
  int dev = 0;
  if (argc < 2 || ncclCommInitAll(&comm, 1, &dev) != ncclSuccess) {
    fprintf(stderr, "usage: device_pointer FAKE_LIBCUDA (or init failed: %s)\n", ncclGetLastError(NULL));
    return 2;
  }
  /* Calls before the driver is loaded: no pointer can be GPU memory yet. */
  if (ncclAllReduce(gpu, gpu, 1024, ncclFloat32, ncclSum, comm, NULL) != ncclSuccess) {
    fprintf(stderr, "FAILED: a host all_reduce before the driver was loaded\n");
    failures++;
  }
  void* driver = dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL);
  void (*mark)(void*, size_t) = driver ? (void (*)(void*, size_t))dlsym(driver, "fake_cuda_mark_device") : NULL;
  if (!mark) {
    fprintf(stderr, "cannot load %s: %s\n", argv[1], dlerror());
    return 2;
  }
  mark(gpu, sizeof gpu);
  ncclResult_t r = ncclAllReduce(gpu, host, 1024, ncclFloat32, ncclSum, comm, NULL);
  /* The text is valid until this thread's next error: keep a copy. */
  char* why = strdup(ncclGetLastError(comm));
  if (r != ncclInvalidArgument || strstr(why, "sendbuff") == NULL || strstr(why, "GPU memory") == NULL) {
    fprintf(stderr, "FAILED: device sendbuff gave %d: %s\n", (int)r, why);
    failures++;
  }
  r = ncclBroadcast(host, gpu + 8, 16, ncclFloat32, 0, comm, NULL);
  if (r != ncclInvalidArgument) {
    fprintf(stderr, "FAILED: device recvbuff gave %d\n", (int)r);
    failures++;
  }
  void* handle = NULL;
  if (ncclCommRegister(comm, gpu, sizeof gpu, &handle) != ncclInvalidArgument) {
    fprintf(stderr, "FAILED: registering device memory succeeded\n");
    failures++;
  }
  for (int i = 0; i < 1024; i++) host[i] = (float)i;
  if (ncclAllReduce(host, host, 1024, ncclFloat32, ncclSum, comm, NULL) != ncclSuccess ||
      host[1000] != 1000.0f) {
    fprintf(stderr, "FAILED: a host all_reduce after the rejections: %s\n", ncclGetLastError(comm));
    failures++;
  }
  ncclCommDestroy(comm);
  if (failures == 0) printf("device pointers rejected: %s\n", why);
  free(why);
  return failures == 0 ? 0 : 1;
}
