/*
 * strata's low-latency kernels: a whole collective in one launch, for small and medium
 * messages among the ranks of one host (one process or several, on one GPU or several).
 *
 * Compiled after reduce.cu (whose types, narrow-float conversions and operators it uses), the
 * same three ways: NVRTC at run time, NVRTC + ptxas in CI, and as C for the CUDA driver
 * stand-in (STRATA_HOST), whose cuLaunchKernel runs these host versions on the stream thread.
 *
 *   strata_ll_reduce(strata_ll_args)  all_reduce (one-shot and two-shot), reduce_scatter and
 *                                     reduce, any type and operator (avg, PreMulSum), named in
 *                                     the args
 *   strata_ll_copy(strata_ll_args)    all_gather and broadcast (any type: bytes)
 *
 * The protocol is NCCL's LL: data travels in 16-byte lines {data0, flag, data1, flag}, each
 * stored by one 16-byte store straight into the receiving rank's buffer (mapped here through
 * CUDA IPC, or the same process's memory), and the receiver polls a line until both flags
 * equal the call's number: data and its readiness arrive together, with no fence and no
 * separate signal. Every rank's program buffer has, per sending rank and per parity of the
 * call number, an area of `ll_stride` bytes of lines (two halves for two-shot's two phases).
 *
 * Reuse of an area: rank r writes call s into its areas at peer t of parity s mod 2. t read
 * that area last in call s - 2; at the start of each call every rank writes its call number
 * into each peer's *arrive* word, so before writing r waits until t has arrived at s - 1 (it
 * finished s - 2). Call numbers run 1..0xfffffffe and wrap (never 0: fresh memory is zeros);
 * `wait_for` is 0 when there is no earlier call to wait for.
 *
 * Mismatched calls: once it may write to rank t, a rank writes into t's flag area, in the
 * pair of its parity, its call's digest and then its call number; t reads no line of a rank
 * before that rank's pair shows this call number and the same digest. A rank whose peer
 * called something else (another count, type, operator, root or collective) therefore never
 * takes its lines: it waits until the monitor's timeout, whose diagnosis names both calls.
 *
 * For a timeout's diagnosis each call also writes, at its start, its header into the rank's
 * flag area and, per peer, the arrival it waits for (*expect*): a rank waits on the peers
 * whose arrive word is behind what it expects. Waits give up when the host sets the abort
 * word (after a fault or an abort): the call then ends with undefined results.
 *
 * Reductions run in rank order (0, 1, ..., p - 1) on every rank, so every rank gets the same
 * bits. Narrow floats accumulate in f32 and round once; integers wrap.
 */

typedef struct {
  u64 input, output;         /* device addresses of this rank's buffers (equal when in place) */
  u64 in_bytes, out_bytes;   /* their lengths */
  u64 count;                 /* elements: the vector, or one rank's block (all_gather,
                                reduce_scatter) */
  u64 bases;                 /* device address of u64[nranks]: every program buffer, as this
                                rank addresses it */
  u64 abort_word;            /* device address of a u32 the host sets to stop waiting */
  u64 scalar;                /* PreMulSum's scalar of this rank, as the bits of the type */
  u64 ll_off, ll_stride;     /* where the areas start in a program buffer, bytes per area */
  u32 rank, nranks, root, seq, wait_for;
  u32 coll;                  /* 0 all_reduce one-shot, 1 all_reduce two-shot, 2
                                reduce_scatter, 3 reduce, 4 all_gather, 5 broadcast */
  u32 op;                    /* 0 sum, 1 prod, 2 min, 3 max */
  u32 flags;                 /* 1: divide by nranks at the end (avg); 2: PreMulSum */
  u32 call_off, arrive_off, expect_off, es;
  u32 dtype;                 /* NCCL's type code (strata_ll_reduce) */
  u32 digest;                /* the call's arguments hashed (never 0): every rank's must match */
  u32 sig_off;               /* where the (call number, digest) pairs of the senders start */
  u32 pad_;
  u32 header[8];
} strata_ll_args;

#define LL_AR 0
#define LL_AR2 1
#define LL_RS 2
#define LL_REDUCE 3
#define LL_AG 4
#define LL_BCAST 5
#define LL_CYCLE 0xfffffffeull
/* The most ranks the kernels serve (the runtime keeps larger communicators off them). */
#define LL_MAX_RANKS 64

/* Whether arrival `have` is at or after call `want` on the cycle of call numbers. */
DEVICE int ll_ahead(u32 have, u32 want) {
  if (have == 0) return 0;
  u64 d = ((u64)have + LL_CYCLE - (u64)want) % LL_CYCLE;
  return d < LL_CYCLE / 2;
}

/* Whether this rank receives lines from rank q in this call, and sends lines to rank t. */
DEVICE int ll_recv_from(u32 coll, u32 me, u32 root, u32 q) {
  if (q == me) return 0;
  if (coll == LL_REDUCE) return me == root;
  if (coll == LL_BCAST) return q == root;
  return 1;
}
DEVICE int ll_send_to(u32 coll, u32 me, u32 root, u32 t) {
  if (t == me) return 0;
  if (coll == LL_REDUCE) return t == root;
  if (coll == LL_BCAST) return me == root;
  return 1;
}

#ifdef STRATA_HOST
/* ----- host versions (the stand-in): one thread does what the grid does ------------------- */
#include <sched.h>
#include <time.h>
#include <alloca.h>
typedef void* (*strata_view_fn)(u64 addr, u64 len);
#define LL_KERNEL(name) void name(const strata_ll_args* A, strata_view_fn view_)
#define LL_VIEW(addr, len) ((u8*)view_((addr), (len)))
#define LL_FIRST 0
#define LL_STRIDE 1
#define LL_LEAD 1           /* the thread that writes the header and the words */
#define LL_SYNC()

static inline void ll_store(u8* line, u64 v, u32 flag) {
  u32* w = (u32*)line;
  __atomic_store_n(&w[0], (u32)v, __ATOMIC_RELAXED);
  __atomic_store_n(&w[2], (u32)(v >> 32), __ATOMIC_RELAXED);
  __atomic_store_n(&w[1], flag, __ATOMIC_RELEASE);
  __atomic_store_n(&w[3], flag, __ATOMIC_RELEASE);
}
static inline int ll_try(const u8* line, u32 flag, u64* v) {
  const u32* w = (const u32*)line;
  if (__atomic_load_n(&w[1], __ATOMIC_ACQUIRE) != flag) return 0;
  if (__atomic_load_n(&w[3], __ATOMIC_ACQUIRE) != flag) return 0;
  *v = (u64)__atomic_load_n(&w[0], __ATOMIC_RELAXED) |
       ((u64)__atomic_load_n(&w[2], __ATOMIC_RELAXED) << 32);
  return 1;
}
static inline u32 ll_load_word(const u8* p) { return __atomic_load_n((const u32*)p, __ATOMIC_ACQUIRE); }
static inline void ll_store_word(u8* p, u32 v) { __atomic_store_n((u32*)p, v, __ATOMIC_RELEASE); }
#define LL_FENCE() __atomic_thread_fence(__ATOMIC_SEQ_CST)
/* The stand-in's ranks share two cores: spin briefly, then yield, then sleep, so a polling
 * kernel never starves the peers it waits for. */
static inline void ll_pause(u32 spins) {
  if (spins < 64) return;
  if (spins < 512) { sched_yield(); return; }
  struct timespec ts = {0, spins < 4096 ? 20000 : 100000};
  nanosleep(&ts, 0);
}
#define LL_CHECK_EVERY 64
#else
/* ----- the GPU --------------------------------------------------------------------------- */
#define LL_KERNEL(name) extern "C" __global__ void __launch_bounds__(256) name(strata_ll_args args_)
#define LL_VIEW(addr, len) ((u8*)(addr))
#define LL_FIRST ((u64)blockIdx.x * blockDim.x + threadIdx.x)
#define LL_STRIDE ((u64)gridDim.x * blockDim.x)
#define LL_LEAD (blockIdx.x == 0 && threadIdx.x == 0)
#define LL_SYNC() __syncthreads()

DEVICE void ll_store(u8* line, u64 v, u32 flag) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1,%2,%3,%4};" ::"l"(line), "r"((u32)v),
               "r"(flag), "r"((u32)(v >> 32)), "r"(flag)
               : "memory");
}
DEVICE int ll_try(const u8* line, u32 flag, u64* v) {
  u32 d0, f0, d1, f1;
  asm volatile("ld.volatile.global.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(d0), "=r"(f0), "=r"(d1), "=r"(f1)
               : "l"(line)
               : "memory");
  if (f0 != flag || f1 != flag) return 0;
  *v = (u64)d0 | ((u64)d1 << 32);
  return 1;
}
DEVICE u32 ll_load_word(const u8* p) { return *(const volatile u32*)p; }
DEVICE void ll_store_word(u8* p, u32 v) { *(volatile u32*)p = v; }
#define LL_FENCE() __threadfence_system()
DEVICE void ll_pause(u32 spins) { (void)spins; }
/* A look at the abort word crosses PCIe (it is host memory): not on every spin. */
#define LL_CHECK_EVERY 4096
#endif

#ifdef STRATA_HOST
#define LL_NOINLINE static
#else
#define LL_NOINLINE __device__ __noinline__
#endif

/* Polls `line` until it carries call `flag`; 0 if the abort word was set meanwhile. */
LL_NOINLINE int ll_wait(const u8* line, u32 flag, u64* v, const u8* abort_word, int* aborted) {
  u32 spins = 0, looked = 0;
  while (!*aborted && !ll_try(line, flag, v)) {
    if (++looked == LL_CHECK_EVERY) {
      looked = 0;
      if (ll_load_word(abort_word)) *aborted = 1;
    }
    ll_pause(spins < 0xffffffu ? ++spins : spins);
  }
  return !*aborted;
}

/* Polls the arrive word at `word` until it reaches call `want`. */
LL_NOINLINE void ll_wait_arrival(const u8* word, u32 want, const u8* abort_word, int* aborted) {
  u32 spins = 0, looked = 0;
  while (!*aborted && !ll_ahead(ll_load_word(word), want)) {
    if (++looked == LL_CHECK_EVERY) {
      looked = 0;
      if (ll_load_word(abort_word)) *aborted = 1;
    }
    ll_pause(spins < 0xffffffu ? ++spins : spins);
  }
}

/* Waits until a sender's pair (call number, digest) at `pair` shows call `seq`, then holds
 * on (until the abort word) if its digest is not `digest`: that rank called something else. */
LL_NOINLINE void ll_check_sender(const u8* pair, u32 seq, u32 digest, const u8* abort_word,
                                 int* aborted) {
  u32 spins = 0, looked = 0;
  for (;;) {
    if (ll_load_word(pair) == seq) {
      LL_FENCE();
      if (ll_load_word(pair + 4) == digest) return;
    }
    if (++looked == LL_CHECK_EVERY) {
      looked = 0;
      if (ll_load_word(abort_word)) {
        *aborted = 1;
        return;
      }
    }
    ll_pause(spins < 0xffffffu ? ++spins : spins);
  }
}

/* Up to 8 bytes of a buffer as a line's payload, and back (the tail of a buffer may be short
 * and a block of all_gather or reduce_scatter may start at any element). */
DEVICE u64 ll_pack(const u8* src, u64 len) {
  if (len == 8 && (((u64)src) & 7) == 0) return *(const u64*)src;
  u64 v = 0;
  for (u64 i = 0; i < len; i++) v |= (u64)src[i] << (8 * i);
  return v;
}
DEVICE void ll_unpack(u8* dst, u64 v, u64 len) {
  if (len == 8 && (((u64)dst) & 7) == 0) {
    *(u64*)dst = v;
    return;
  }
  for (u64 i = 0; i < len; i++) dst[i] = (u8)(v >> (8 * i));
}
DEVICE u64 ll_len(u64 bytes, u64 line) { u64 left = bytes - 8 * line; return left < 8 ? left : 8; }

/* ----- the set-up every kernel runs ---------------------------------------------------------
 * me, p, seq; `own` (this rank's program buffer), the areas lines arrive in from rank q
 * (LL_IN) and leave by for rank t (LL_OUT), phase 0 or 1; `in`, `out`; the prologue: header,
 * expectations and arrivals written, and the arrivals of the ranks this one sends to awaited.
 */
#ifdef STRATA_HOST
#define LL_AREAS                                                                           \
  u8** ins_ = (u8**)alloca(2 * p * sizeof(u8*));                                           \
  for (u32 q = 0; q < p; q++) {                                                            \
    ins_[q] = LL_VIEW(bases[me] + A->ll_off + ((u64)q * 2 + par) * A->ll_stride, A->ll_stride); \
    ins_[p + q] = LL_VIEW(bases[q] + A->ll_off + ((u64)me * 2 + par) * A->ll_stride,       \
                          A->ll_stride);                                                   \
  }
#define LL_IN(q, ph) (ins_[q] + (ph) * (A->ll_stride / 2))
#define LL_OUT(t, ph) (ins_[p + (t)] + (ph) * (A->ll_stride / 2))
#define LL_ARGS_PTR
#else
#define LL_AREAS
#define LL_IN(q, ph) \
  ((u8*)(bases[me] + A->ll_off + ((u64)(q) * 2 + par) * A->ll_stride + (ph) * (A->ll_stride / 2)))
#define LL_OUT(t, ph) \
  ((u8*)(bases[t] + A->ll_off + ((u64)me * 2 + par) * A->ll_stride + (ph) * (A->ll_stride / 2)))
#define LL_ARGS_PTR const strata_ll_args* A = &args_;
#endif

#define LL_SETUP                                                                           \
  LL_ARGS_PTR                                                                              \
  const u32 p = A->nranks, me = A->rank, seq = A->seq, coll = A->coll, root = A->root;     \
  const u64 par = seq & 1;                                                                 \
  const u64* bases = (const u64*)LL_VIEW(A->bases, 8 * (u64)p);                            \
  u8* own = LL_VIEW(bases[me], A->ll_off);                                                 \
  const u8* abort_word = LL_VIEW(A->abort_word, 4);                                        \
  const u8* in = A->in_bytes ? LL_VIEW(A->input, A->in_bytes) : (const u8*)0;              \
  u8* out = A->out_bytes ? LL_VIEW(A->output, A->out_bytes) : (u8*)0;                      \
  int aborted = 0;                                                                         \
  LL_AREAS                                                                                 \
  if (LL_LEAD) {                                                                           \
    for (u32 i = 0; i < 8; i++) ll_store_word(own + A->call_off + 4 * i, A->header[i]);   \
    for (u32 q = 0; q < p; q++) {                                                          \
      if (q == me) continue;                                                               \
      if (ll_recv_from(coll, me, root, q))                                                 \
        ll_store_word(own + A->expect_off + 4 * q, seq);                                   \
      else if (ll_send_to(coll, me, root, q) && A->wait_for)                               \
        ll_store_word(own + A->expect_off + 4 * q, A->wait_for);                           \
      ll_store_word(LL_VIEW(bases[q] + A->arrive_off + 4 * (u64)me, 4), seq);              \
    }                                                                                      \
  }                                                                                        \
  if (A->wait_for) {                                                                       \
    for (u32 t = (u32)(LL_FIRST % LL_STRIDE_IN_BLOCK); t < p; t += LL_BLOCK_THREADS)       \
      if (ll_send_to(coll, me, root, t))                                                   \
        ll_wait_arrival(own + A->arrive_off + 4 * t, A->wait_for, abort_word, &aborted);   \
  }                                                                                        \
  LL_SYNC();                                                                               \
  if (aborted) return;                                                                     \
  if (LL_LEAD) {                                                                           \
    for (u32 t = 0; t < p; t++) {                                                          \
      if (!ll_send_to(coll, me, root, t)) continue;                                        \
      u8* pair = LL_VIEW(bases[t] + A->sig_off + 8 * (par * p + me), 8);                  \
      ll_store_word(pair + 4, A->digest);                                                  \
      LL_FENCE();                                                                          \
      ll_store_word(pair, seq);                                                            \
    }                                                                                      \
  }                                                                                        \
  for (u32 q = (u32)(LL_FIRST % LL_STRIDE_IN_BLOCK); q < p; q += LL_BLOCK_THREADS)         \
    if (ll_recv_from(coll, me, root, q))                                                   \
      ll_check_sender(own + A->sig_off + 8 * (par * p + q), seq, A->digest, abort_word,    \
                      &aborted);                                                           \
  LL_SYNC();                                                                               \
  if (aborted) return;

#ifdef STRATA_HOST
#define LL_STRIDE_IN_BLOCK 1
#define LL_BLOCK_THREADS 1
#else
#define LL_STRIDE_IN_BLOCK blockDim.x
#define LL_BLOCK_THREADS blockDim.x
#endif

/* Sends `lines` lines of `src` (`bytes` long) to rank t's area, phase `ph`, scaled by `scale`
 * (a line → line function) when given. */
#define LL_SEND(t, ph, src, bytes, lines, SCALE)                                           \
  do {                                                                                     \
    u8* dst_ = LL_OUT(t, ph);                                                              \
    for (u64 k = LL_FIRST; k < (lines); k += LL_STRIDE) {                                  \
      u64 v_ = ll_pack((src) + 8 * k, ll_len(bytes, k));                                   \
      ll_store(dst_ + 16 * k, SCALE(v_), seq);                                             \
    }                                                                                      \
  } while (0)
#define LL_NO_SCALE(v) (v)

/* ----- copies: all_gather and broadcast -------------------------------------------------- */
LL_KERNEL(strata_ll_copy) {
  LL_SETUP
  const u64 bytes = A->count * A->es, lines = (bytes + 7) / 8;
  if (coll == LL_AG) {
    for (u32 j = 1; j < p; j++) {
      u32 t = (me + j) % p;
      LL_SEND(t, 0, in, bytes, lines, LL_NO_SCALE);
    }
    u8* mine = out + (u64)me * bytes;
    for (u64 k = LL_FIRST; k < lines; k += LL_STRIDE) {
      if (mine != in) ll_unpack(mine + 8 * k, ll_pack(in + 8 * k, ll_len(bytes, k)), ll_len(bytes, k));
      for (u32 j = 1; j < p; j++) {
        u32 q = (me + p - j) % p;
        u64 v;
        if (!ll_wait(LL_IN(q, 0) + 16 * k, seq, &v, abort_word, &aborted)) return;
        ll_unpack(out + (u64)q * bytes + 8 * k, v, ll_len(bytes, k));
      }
    }
  } else if (me == root) {
    for (u32 j = 1; j < p; j++) LL_SEND((me + j) % p, 0, in, bytes, lines, LL_NO_SCALE);
    if (out != in)
      for (u64 k = LL_FIRST; k < lines; k += LL_STRIDE)
        ll_unpack(out + 8 * k, ll_pack(in + 8 * k, ll_len(bytes, k)), ll_len(bytes, k));
  } else {
    for (u64 k = LL_FIRST; k < lines; k += LL_STRIDE) {
      u64 v;
      if (!ll_wait(LL_IN(root, 0) + 16 * k, seq, &v, abort_word, &aborted)) return;
      ll_unpack(out + 8 * k, v, ll_len(bytes, k));
    }
  }
}

/* ----- reductions ---------------------------------------------------------------------------
 * Per type: the accumulator, widening and narrowing, the operator, avg's division, PreMulSum's
 * scalar and product, as the host path computes them (reduce.cu's rules).
 */
#define LL_INT_TYPE(T, U, W)                                                               \
  typedef T ll_acc_##T;                                                                    \
  typedef T ll_st_##T;                                                                     \
  DEVICE T ll_in_##T(T x) { return x; }                                                    \
  DEVICE T ll_out_##T(T a) { return a; }                                                   \
  DEVICE T ll_op_##T(u32 op, T a, T b) {                                                   \
    return op == 0 ? (T)((U)a + (U)b) : op == 1 ? (T)((U)a * (U)b) : op == 2 ? OP_min(a, b) \
                                                                           : OP_max(a, b); \
  }                                                                                        \
  DEVICE T ll_div_##T(T a, u32 p) { return (T)((W)a / (W)p); }                             \
  DEVICE T ll_scalar_##T(u64 bits) { return (T)bits; }                                     \
  DEVICE T ll_mul_##T(T a, T s) { return (T)((U)a * (U)s); }
#define LL_WIDE_TYPE(T, BITS_T)                                                            \
  typedef T ll_acc_##T;                                                                    \
  typedef T ll_st_##T;                                                                     \
  DEVICE T ll_in_##T(T x) { return x; }                                                    \
  DEVICE T ll_out_##T(T a) { return a; }                                                   \
  DEVICE T ll_op_##T(u32 op, T a, T b) {                                                   \
    return op == 0 ? a + b : op == 1 ? a * b : op == 2 ? OP_min(a, b) : OP_max(a, b);      \
  }                                                                                        \
  DEVICE T ll_div_##T(T a, u32 p) { return a / (T)p; }                                     \
  DEVICE T ll_scalar_##T(u64 bits) {                                                       \
    BITS_T b = (BITS_T)bits;                                                               \
    T s;                                                                                   \
    FROM_BITS_##T(s, b);                                                                   \
    return s;                                                                              \
  }                                                                                        \
  DEVICE T ll_mul_##T(T a, T s) { return a * s; }
#define LL_NARROW_TYPE(T, S)                                                               \
  typedef float ll_acc_##T;                                                                \
  typedef S ll_st_##T;                                                                     \
  DEVICE float ll_in_##T(S x) { return T##_to_f32(x); }                                    \
  DEVICE S ll_out_##T(float a) { return f32_to_##T(a); }                                   \
  DEVICE float ll_op_##T(u32 op, float a, float b) {                                       \
    return op == 0 ? a + b : op == 1 ? a * b : op == 2 ? OP_min(a, b) : OP_max(a, b);      \
  }                                                                                        \
  DEVICE float ll_div_##T(float a, u32 p) { return a / (float)p; }                         \
  DEVICE float ll_scalar_##T(u64 bits) { return T##_to_f32((S)bits); }                     \
  DEVICE float ll_mul_##T(float a, float s) { return a * s; }

/* Line-level helpers of a type: a line scaled by this rank's scalar, folded into the
 * accumulators, and the accumulators as a line (divided for avg). */
#define LL_LINES(T)                                                                        \
  typedef union {                                                                          \
    u64 u;                                                                                 \
    ll_st_##T e[8 / sizeof(ll_st_##T)];                                                    \
  } ll_line_##T;                                                                           \
  DEVICE u64 ll_scaled_##T(u64 v, u64 bits) {                                              \
    ll_acc_##T s = ll_scalar_##T(bits);                                                    \
    ll_line_##T x;                                                                         \
    x.u = v;                                                                               \
    for (u32 i = 0; i < 8 / sizeof(ll_st_##T); i++)                                        \
      x.e[i] = ll_out_##T(ll_mul_##T(ll_in_##T(x.e[i]), s));                               \
    return x.u;                                                                            \
  }                                                                                        \
  DEVICE void ll_fold_##T(ll_acc_##T* acc, u64 v, u32 op, int first) {                     \
    ll_line_##T x;                                                                         \
    x.u = v;                                                                               \
    for (u32 i = 0; i < 8 / sizeof(ll_st_##T); i++)                                        \
      acc[i] = first ? ll_in_##T(x.e[i]) : ll_op_##T(op, acc[i], ll_in_##T(x.e[i]));       \
  }                                                                                        \
  DEVICE u64 ll_result_##T(const ll_acc_##T* acc, int divide, u32 p) {                     \
    ll_line_##T x;                                                                         \
    for (u32 i = 0; i < 8 / sizeof(ll_st_##T); i++)                                        \
      x.e[i] = ll_out_##T(divide ? ll_div_##T(acc[i], p) : acc[i]);                        \
    return x.u;                                                                            \
  }

LL_INT_TYPE(i8, u8, i64) LL_INT_TYPE(u8, u8, u64) LL_INT_TYPE(i32, u32, i64)
LL_INT_TYPE(u32, u32, u64) LL_INT_TYPE(i64, u64, i64) LL_INT_TYPE(u64, u64, u64)
LL_WIDE_TYPE(f32, u32) LL_WIDE_TYPE(f64, u64)
LL_NARROW_TYPE(f16, u16) LL_NARROW_TYPE(bf16, u16) LL_NARROW_TYPE(e4m3, u8)
LL_NARROW_TYPE(e5m2, u8)
LL_LINES(i8) LL_LINES(u8) LL_LINES(i32) LL_LINES(u32) LL_LINES(i64) LL_LINES(u64)
LL_LINES(f16) LL_LINES(f32) LL_LINES(f64) LL_LINES(bf16) LL_LINES(e4m3) LL_LINES(e5m2)

/* The accumulators of one line, whatever the type. */
typedef union {
  ll_acc_i8 m_i8[8]; ll_acc_u8 m_u8[8]; ll_acc_i32 m_i32[8]; ll_acc_u32 m_u32[8];
  ll_acc_i64 m_i64[8]; ll_acc_u64 m_u64[8]; ll_acc_f16 m_f16[8]; ll_acc_f32 m_f32[8];
  ll_acc_f64 m_f64[8]; ll_acc_bf16 m_bf16[8]; ll_acc_e4m3 m_e4m3[8]; ll_acc_e5m2 m_e5m2[8];
} ll_accs;

/* The type, by NCCL's code (ncclInt8 0 ... ncclFloat8e5m2 11), chosen per line: one kernel
 * for every type keeps NVRTC's work at run time small, and the branch is the same for every
 * thread. */
#define LL_BY_TYPE(dt, CASE)                                                               \
  switch (dt) {                                                                            \
    case 0: CASE(i8); case 1: CASE(u8); case 2: CASE(i32); case 3: CASE(u32);              \
    case 4: CASE(i64); case 5: CASE(u64); case 6: CASE(f16); case 7: CASE(f32);            \
    case 8: CASE(f64); case 9: CASE(bf16); case 10: CASE(e4m3); default: CASE(e5m2);       \
  }
#define LL_SCALED_CASE(T) return ll_scaled_##T(v, bits);
LL_NOINLINE u64 ll_scaled(u32 dt, u64 v, u64 bits) { LL_BY_TYPE(dt, LL_SCALED_CASE) }
#define LL_FOLD_CASE(T) ll_fold_##T(acc->m_##T, v, op, first); return;
LL_NOINLINE void ll_fold(u32 dt, ll_accs* acc, u64 v, u32 op, int first) { LL_BY_TYPE(dt, LL_FOLD_CASE) }
#define LL_RESULT_CASE(T) return ll_result_##T(acc->m_##T, divide, p);
LL_NOINLINE u64 ll_result(u32 dt, const ll_accs* acc, int divide, u32 p) { LL_BY_TYPE(dt, LL_RESULT_CASE) }

/* Line k of this rank's contribution from `mine` (scaled for PreMulSum). */
#define LL_MINE(mine, bytes, k) \
  (premul ? ll_scaled(A->dtype, ll_pack((mine) + 8 * (k), ll_len(bytes, k)), A->scalar)  \
          : ll_pack((mine) + 8 * (k), ll_len(bytes, k)))

/* Reduces line k of every rank's contribution, in rank order: this rank's `own_line`, the
 * others' from their areas (`from[q]` + 16 k); the result line into `*res`. 0 if the call
 * was aborted meanwhile. */
LL_NOINLINE int ll_fold_line(const strata_ll_args* A, u8* const* from, u64 k, u64 own_line,
                             int divide, const u8* abort_word, int* aborted, u64* res) {
  ll_accs acc;
  for (u32 q = 0; q < A->nranks; q++) {
    u64 v = own_line;
    if (q != A->rank && !ll_wait(from[q] + 16 * k, A->seq, &v, abort_word, aborted)) return 0;
    ll_fold(A->dtype, &acc, v, A->op, q == 0);
  }
  *res = ll_result(A->dtype, &acc, divide, A->nranks);
  return 1;
}
#define LL_FOLD(k, mine, bytes, from, res)                                                 \
  if (!ll_fold_line(A, from, k, LL_MINE(mine, bytes, k), divide, abort_word, &aborted, &res)) \
    return;

/* ----- all_reduce, reduce_scatter and reduce ------------------------------------------- */
LL_KERNEL(strata_ll_reduce) {
  LL_SETUP
  const int premul = (A->flags & 2) != 0, divide = (A->flags & 1) != 0;
  const u64 bytes = A->count * A->es, lines = (bytes + 7) / 8;
  /* Where each rank's lines arrive, per phase (phase 1: two-shot's results). */
  u8* from[LL_MAX_RANKS];
  for (u32 q = 0; q < p; q++) from[q] = LL_IN(q, 0);
  if (coll == LL_AR || coll == LL_REDUCE) {
    for (u32 j = 1; j < p; j++) {
      u32 t = (me + j) % p;
      if (!ll_send_to(coll, me, root, t)) continue;
      u8* dst = LL_OUT(t, 0);
      for (u64 k = LL_FIRST; k < lines; k += LL_STRIDE) ll_store(dst + 16 * k, LL_MINE(in, bytes, k), seq);
    }
    if (coll == LL_REDUCE && me != root) return;
    for (u64 k = LL_FIRST; k < lines; k += LL_STRIDE) {
      u64 r;
      LL_FOLD(k, in, bytes, from, r);
      ll_unpack(out + 8 * k, r, ll_len(bytes, k));
    }
  } else if (coll == LL_RS) {
    for (u32 j = 1; j < p; j++) {
      u32 t = (me + j) % p;
      u8* dst = LL_OUT(t, 0);
      const u8* blk = in + (u64)t * bytes;
      for (u64 k = LL_FIRST; k < lines; k += LL_STRIDE) ll_store(dst + 16 * k, LL_MINE(blk, bytes, k), seq);
    }
    const u8* mine = in + (u64)me * bytes;
    for (u64 k = LL_FIRST; k < lines; k += LL_STRIDE) {
      u64 r;
      LL_FOLD(k, mine, bytes, from, r);
      ll_unpack(out + 8 * k, r, ll_len(bytes, k));
    }
  } else {
    /* two-shot: rank q reduces lines [q L / p, (q + 1) L / p) and hands them to the others */
    for (u32 j = 1; j < p; j++) {
      u32 t = (me + j) % p;
      u64 lo = lines * t / p, n = lines * (t + 1) / p - lo;
      u8* dst = LL_OUT(t, 0);
      for (u64 k = LL_FIRST; k < n; k += LL_STRIDE)
        ll_store(dst + 16 * k, LL_MINE(in + 8 * lo, bytes - 8 * lo, k), seq);
    }
    u64 lo = lines * me / p, n = lines * (me + 1) / p - lo;
    for (u64 k = LL_FIRST; k < n; k += LL_STRIDE) {
      u64 r;
      LL_FOLD(k, in + 8 * lo, bytes - 8 * lo, from, r);
      ll_unpack(out + 8 * (lo + k), r, ll_len(bytes, lo + k));
      for (u32 j = 1; j < p; j++) ll_store(LL_OUT((me + j) % p, 1) + 16 * k, r, seq);
    }
    for (u32 j = 1; j < p; j++) {
      u32 q = (me + p - j) % p;
      u64 qlo = lines * q / p, qn = lines * (q + 1) / p - qlo;
      for (u64 k = LL_FIRST; k < qn; k += LL_STRIDE) {
        u64 v;
        if (!ll_wait(LL_IN(q, 1) + 16 * k, seq, &v, abort_word, &aborted)) return;
        ll_unpack(out + 8 * (qlo + k), v, ll_len(bytes, qlo + k));
      }
    }
  }
}

#ifdef STRATA_HOST
/* The stand-in's table of the host versions: name, function, size of the arguments. */
typedef struct {
  const char* name;
  void* fn;
  int args;
} strata_ll_kernel;
const strata_ll_kernel strata_ll_table[] = {
    {"strata_ll_copy", (void*)strata_ll_copy, (int)sizeof(strata_ll_args)},
    {"strata_ll_reduce", (void*)strata_ll_reduce, (int)sizeof(strata_ll_args)},
    {0, 0, 0}};
#endif
