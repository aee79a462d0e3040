/* Loads a tuner plugin the way NCCL does and prints the cost tables it writes.
 *
 * NCCL's steps (src/plugin/plugin_open.cc and src/plugin/tuner.cc of NCCL 2.30): dlopen the
 * name in NCCL_TUNER_PLUGIN as given, then as libnccl-tuner-<name>.so; look up the newest
 * interface first (v7 for 2.32.6, then v6 .. v3); call init with the communicator's ranks and
 * nodes, NCCL's logger, NVLink domain info and tuning constants; per collective call, fill the
 * cost table (algorithm x protocol, -1 where NCCL does not allow an entry) and let the plugin
 * rewrite it and the channel count; finalize. The tables before the plugin are this harness's
 * stand-in for NCCL's own model (latency + bytes / bandwidth per protocol).
 *
 * usage: load_tuner NRANKS NNODES [VERSION]   (VERSION: 3..7; default: the newest found)
 *        LOAD_TUNER_BENCH=N load_tuner ...       also times N all-reduce calls of getCollInfo
 *                                                 over sizes 8 B-1 GiB ("bench NS per call")
 * prints: "symbol ncclTunerPlugin_vN", the plugin's log lines ("log LEVEL text"), "init RC",
 *         "constants unchanged|CHANGED", then per call
 *         "call FUNC NBYTES RC CHANNELS c00 c01 .. c62", and "null RC" for a NULL table.
 */
#define _POSIX_C_SOURCE 199309L
#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tuner.h"
#include "tuner_v4.h"
#include "tuner_v3.h"

static void logger(ncclDebugLogLevel level, unsigned long flags, const char* file, int line,
                   const char* fmt, ...) {
  (void)flags;
  (void)file;
  (void)line;
  va_list ap;
  printf("log %d ", (int)level);
  va_start(ap, fmt);
  vprintf(fmt, ap);
  va_end(ap);
  printf("\n");
}

static int ends_with_so(const char* s) {
  size_t n = strlen(s);
  return n >= 3 && strcmp(s + n - 3, ".so") == 0;
}

static void* open_like_nccl(const char* name) {
  char buf[512];
  if (name == NULL || name[0] == '\0') return dlopen("libnccl-tuner.so", RTLD_NOW | RTLD_LOCAL);
  void* h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
  if (h) return h;
  if (strchr(name, '/') == NULL && (strncmp(name, "lib", 3) != 0 || !ends_with_so(name))) {
    snprintf(buf, sizeof buf, "libnccl-tuner-%s.so", name);
    h = dlopen(buf, RTLD_NOW | RTLD_LOCAL);
  }
  return h;
}

/* The harness's stand-in for NCCL's own estimate, in microseconds. */
static float nccl_estimate(int algo, int proto, size_t bytes) {
  static const float base_us[NCCL_NUM_PROTOCOLS] = {6.8f, 14.0f, 8.4f};
  static const float gbps[NCCL_NUM_PROTOCOLS] = {10.0f, 18.0f, 20.0f};
  float algo_factor = algo == NCCL_ALGO_TREE ? 1.5f : algo == NCCL_ALGO_PAT ? 1.2f : 1.0f;
  return algo_factor * base_us[proto] + (float)bytes / (gbps[proto] * 1e3f);
}

/* Which entries NCCL allows for a collective in this harness: tree and ring (and NVLS, which
 * strata does not model) for all-reduce; ring and PAT for all-gather and reduce-scatter; ring
 * for broadcast and reduce. */
static int allowed(int func, int algo) {
  switch (func) {
    case ncclFuncAllReduce:
      return algo == NCCL_ALGO_TREE || algo == NCCL_ALGO_RING || algo == NCCL_ALGO_NVLS;
    case ncclFuncAllGather:
    case ncclFuncReduceScatter:
      return algo == NCCL_ALGO_RING || algo == NCCL_ALGO_PAT;
    default:
      return algo == NCCL_ALGO_RING;
  }
}

typedef ncclResult_t (*coll_info_fn)(void*, ncclFunc_t, size_t, int, float**, int, int, int, int*);

static int version;
static ncclTuner_v3_t* v3;
static ncclResult_t coll_info_v3(void* ctx, ncclFunc_t f, size_t n, int ops, float** t, int na, int np,
                                 int reg, int* ch) {
  (void)reg;
  return v3->getCollInfo(ctx, f, n, ops, t, na, np, ch);
}

int main(int argc, char** argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: %s NRANKS NNODES [VERSION]\n", argv[0]);
    return 2;
  }
  size_t n_ranks = strtoul(argv[1], NULL, 10), n_nodes = strtoul(argv[2], NULL, 10);
  int want = argc > 3 ? atoi(argv[3]) : 0;
  void* lib = open_like_nccl(getenv("NCCL_TUNER_PLUGIN"));
  if (!lib) {
    printf("dlopen failed: %s\n", dlerror());
    return 1;
  }
  void* sym = NULL;
  for (int v = 7; v >= 2 && sym == NULL; v--) {
    char name[32];
    if (want && v != want) continue;
    snprintf(name, sizeof name, "ncclTunerPlugin_v%d", v);
    sym = dlsym(lib, name);
    if (sym) {
      version = v;
      printf("symbol %s\n", name);
    }
  }
  if (!sym) {
    printf("no tuner symbol\n");
    return 0;
  }

  ncclNvlDomainInfo_v7_t nvl = {(int)n_nodes, (int)(n_ranks / n_nodes), (int)(n_ranks / n_nodes)};
  ncclTunerConstants_v7_t constants, before;
  memset(&constants, 0, sizeof constants);
  for (int a = 0; a < NCCL_NUM_ALGORITHMS; a++)
    for (int p = 0; p < NCCL_NUM_PROTOCOLS; p++) constants.baseLatencies[a][p] = 1.0 + a + 0.1 * p;
  memcpy(&before, &constants, sizeof constants);

  void* ctx = NULL;
  ncclResult_t rc;
  coll_info_fn coll_info;
  ncclResult_t (*finalize)(void*);
  if (version >= 5) {
    /* v5, v6 and v7 share init's and getCollInfo's signatures (v6-v7 add getChunkSize). */
    ncclTuner_v7_t* t = (ncclTuner_v7_t*)sym;
    printf("name %s\n", t->name);
    rc = t->init(&ctx, 0x5eed, n_ranks, n_nodes, logger, &nvl, &constants);
    coll_info = t->getCollInfo;
    finalize = t->finalize;
  } else if (version == 4) {
    ncclTuner_v4_t* t = (ncclTuner_v4_t*)sym;
    printf("name %s\n", t->name);
    rc = t->init(n_ranks, n_nodes, logger, &ctx);
    coll_info = t->getCollInfo;
    finalize = t->destroy;
  } else {
    v3 = (ncclTuner_v3_t*)sym;
    printf("name %s\n", v3->name);
    rc = v3->init(n_ranks, n_nodes, logger, &ctx);
    coll_info = coll_info_v3;
    finalize = v3->destroy;
  }
  printf("init %d\n", (int)rc);
  printf("constants %s\n", memcmp(&before, &constants, sizeof constants) ? "CHANGED" : "unchanged");
  if (rc != ncclSuccess) return 0;

  static const int funcs[] = {ncclFuncAllReduce, ncclFuncAllGather, ncclFuncReduceScatter,
                              ncclFuncBroadcast, ncclFuncReduce};
  for (size_t f = 0; f < sizeof funcs / sizeof funcs[0]; f++) {
    for (int k = 0; k <= 30; k++) {
      /* NCCL's nBytes: the whole gathered (scattered) buffer for all-gather (reduce-scatter). */
      size_t per_rank = (size_t)1 << k;
      int func = funcs[f];
      size_t n_bytes =
          (func == ncclFuncAllGather || func == ncclFuncReduceScatter) ? per_rank * n_ranks : per_rank;
      float table[NCCL_NUM_ALGORITHMS][NCCL_NUM_PROTOCOLS];
      for (int a = 0; a < NCCL_NUM_ALGORITHMS; a++)
        for (int p = 0; p < NCCL_NUM_PROTOCOLS; p++)
          table[a][p] = allowed(func, a) ? nccl_estimate(a, p, n_bytes) : NCCL_ALGO_PROTO_IGNORE;
      int channels = 0;
      rc = coll_info(ctx, (ncclFunc_t)func, n_bytes, 1, (float**)table, NCCL_NUM_ALGORITHMS,
                     NCCL_NUM_PROTOCOLS, 0, &channels);
      printf("call %d %zu %d %d", func, n_bytes, (int)rc, channels);
      for (int a = 0; a < NCCL_NUM_ALGORITHMS; a++)
        for (int p = 0; p < NCCL_NUM_PROTOCOLS; p++) printf(" %.9g", table[a][p]);
      printf("\n");
    }
  }
  const char* bench = getenv("LOAD_TUNER_BENCH");
  if (bench) {
    long n = atol(bench);
    float table[NCCL_NUM_ALGORITHMS][NCCL_NUM_PROTOCOLS];
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (long i = 0; i < n; i++) {
      size_t bytes = (size_t)8 << (i % 28);
      for (int a = 0; a < NCCL_NUM_ALGORITHMS; a++)
        for (int p = 0; p < NCCL_NUM_PROTOCOLS; p++)
          table[a][p] = allowed(ncclFuncAllReduce, a) ? nccl_estimate(a, p, bytes) : NCCL_ALGO_PROTO_IGNORE;
      int ch = 0;
      coll_info(ctx, ncclFuncAllReduce, bytes, 1, (float**)table, NCCL_NUM_ALGORITHMS, NCCL_NUM_PROTOCOLS, 0, &ch);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ns = ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / (double)(n > 0 ? n : 1);
    printf("bench %.1f ns per call (table filled by the harness included)\n", ns);
  }
  int channels = 0;
  printf("null %d\n", (int)coll_info(ctx, ncclFuncAllReduce, 8, 1, NULL, NCCL_NUM_ALGORITHMS,
                                     NCCL_NUM_PROTOCOLS, 0, &channels));
  printf("finalize %d\n", (int)finalize(ctx));
  dlclose(lib);
  return 0;
}
