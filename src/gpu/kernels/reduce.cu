/*
 * strata's GPU reduction kernels: every NCCL type and operator, elementwise.
 *
 *   strata_combine_<op>_<type>(T* dst, const T* a, const T* b, u64 n)   dst = a op b
 *   strata_divide_<type>(T* buf, u64 divisor, u64 n)                   buf /= divisor (avg)
 *   strata_scale_<type>(T* dst, const T* src, u64 scalar_bits, u64 n)  dst = src * scalar
 *
 * <op> is sum, prod, min or max; <type> one of i8 u8 i32 u32 i64 u64 f16 f32 f64 bf16 e4m3
 * e5m2. f16, bf16 and fp8 widen to f32, combine and round once to nearest even (fp8
 * saturating, as CUDA's satfinite), exactly as strata's host path does; integers wrap and
 * divide toward zero. Min and max keep `a` unless `b` compares below (above) it.
 *
 * The same source compiles three ways: with NVRTC at run time (strata), with NVRTC + ptxas in
 * CI for sm_80 and sm_90, and as plain C for the CUDA driver stand-in, whose host versions of
 * these kernels (STRATA_HOST) let the tests check this file's arithmetic against the host
 * path's bit for bit.
 */
#ifdef STRATA_HOST
#include <stdint.h>
#include <string.h>
typedef int8_t i8; typedef uint8_t u8; typedef uint16_t u16; typedef int32_t i32;
typedef uint32_t u32; typedef int64_t i64; typedef uint64_t u64;
#define DEVICE static inline
#define KERNEL(name) void name
#define FOR_EACH(i, n) for (u64 i = 0; i < (n); i++)
static inline u32 f2u(float f) { u32 u; memcpy(&u, &f, 4); return u; }
static inline float u2f(u32 u) { float f; memcpy(&f, &u, 4); return f; }
#else
typedef signed char i8; typedef unsigned char u8; typedef unsigned short u16; typedef int i32;
typedef unsigned int u32; typedef long long i64; typedef unsigned long long u64;
#define DEVICE __device__ __forceinline__
#define KERNEL(name) extern "C" __global__ void name
#define FOR_EACH(i, n) \
  for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (u64)gridDim.x * blockDim.x)
DEVICE u32 f2u(float f) { return __float_as_uint(f); }
DEVICE float u2f(u32 u) { return __uint_as_float(u); }
#endif

/* ----- narrow float formats, as strata's host path converts them ------------------------- */

DEVICE float f16_to_f32(u16 h) {
  u32 sign = (u32)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  if (exp == 0x1f) return u2f(sign | 0x7f800000u | (man << 13)); /* inf, NaN */
  if (exp == 0) { /* zero or subnormal: man * 2^-24, exact in f32 */
    float v = (float)man * u2f(0x33800000u);
    return sign ? -v : v;
  }
  return u2f(sign | ((exp + 112) << 23) | (man << 13));
}

DEVICE u16 f32_to_f16(float f) { /* round to nearest even */
  u32 x = f2u(f), sign = (x >> 16) & 0x8000, a = x & 0x7fffffff;
  if (a > 0x7f800000u) return (u16)(sign | 0x7e00 | ((a >> 13) & 0x3ff)); /* NaN stays NaN */
  if (a >= 0x477ff000u) return (u16)(sign | 0x7c00); /* rounds to inf (>= 65520) */
  if (a < 0x38800000u) { /* subnormal in f16: quantum 2^-24 */
    u32 shift = 126 - (a >> 23); /* shift of the implicit-one mantissa */
    if (shift > 24) return (u16)sign;
    /* value = m * 2^(e - 150); in quanta of 2^-24 that is m >> (126 - e), rounded */
    u32 m = (a & 0x7fffff) | 0x800000;
    u32 r = m >> shift;
    u32 rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1))) r++;
    return (u16)(sign | r);
  }
  u32 r = a + 0xfff + ((a >> 13) & 1);
  return (u16)(sign | ((r - 0x38000000u) >> 13));
}

DEVICE float bf16_to_f32(u16 h) { return u2f((u32)h << 16); }

DEVICE u16 f32_to_bf16(float f) {
  u32 x = f2u(f);
  if ((x & 0x7fffffff) > 0x7f800000u) return (u16)((x >> 16) | 0x40); /* quiet NaN */
  return (u16)((x + 0x7fff + ((x >> 16) & 1)) >> 16);
}

/* fp8: mant_bits, bias, largest finite code, NaN code, whether all-ones exponent is inf. */
DEVICE float fp8_to_f32(u8 code, int mant_bits, int bias, int max_code, int has_inf) {
  float sign = (code & 0x80) ? -1.0f : 1.0f;
  int mag = code & 0x7f, exp = mag >> mant_bits, man = mag & ((1 << mant_bits) - 1);
  int exp_max = 0x7f >> mant_bits;
  if (mag > max_code) {
    if (has_inf && mag == (exp_max << mant_bits)) return sign * u2f(0x7f800000u);
    return u2f(0x7fc00000u);
  }
  float scale = (float)(1 << mant_bits);
  /* 2^k built from bits: exact for the exponents these formats reach */
  if (exp == 0) return sign * ((float)man / scale) * u2f((u32)(127 + 1 - bias) << 23);
  return sign * (1.0f + (float)man / scale) * u2f((u32)(127 + exp - bias) << 23);
}

DEVICE u8 f32_to_fp8(float x, int mant_bits, int bias, int max_code, int nan_code) {
  u32 bits = f2u(x);
  if ((bits & 0x7fffffff) > 0x7f800000u) return (u8)nan_code;
  u8 sign = (bits & 0x80000000u) ? 0x80 : 0;
  u32 abits = bits & 0x7fffffff;
  float a = u2f(abits);
  int emin = 1 - bias;
  u32 code;
  if (abits < ((u32)(127 + emin) << 23)) {
    /* subnormal in the target: quanta of 2^(emin - mant_bits); round half to even */
    float q = a * u2f((u32)(127 + mant_bits - emin) << 23);
    float fl = (float)(u32)q;
    float rest = q - fl;
    code = (u32)fl;
    if (rest > 0.5f || (rest == 0.5f && (code & 1))) code++;
  } else {
    u32 shift = 23 - mant_bits;
    u32 round = ((1u << (shift - 1)) - 1) + ((abits >> shift) & 1);
    u32 sum = abits + round;
    if (sum < abits) sum = 0xffffffffu; /* saturating add */
    u32 r = sum >> shift, sub = (u32)(127 - bias) << mant_bits;
    code = r > sub ? r - sub : 0;
  }
  if (code > (u32)max_code) code = (u32)max_code;
  return (u8)(sign | code);
}

DEVICE float e4m3_to_f32(u8 c) { return fp8_to_f32(c, 3, 7, 0x7e, 0); }
DEVICE u8 f32_to_e4m3(float f) { return f32_to_fp8(f, 3, 7, 0x7e, 0x7f); }
DEVICE float e5m2_to_f32(u8 c) { return fp8_to_f32(c, 2, 15, 0x7b, 1); }
DEVICE u8 f32_to_e5m2(float f) { return f32_to_fp8(f, 2, 15, 0x7b, 0x7f); }

/* ----- the operators ------------------------------------------------------------------------ */

#define OP_sum(a, b) ((a) + (b))
#define OP_prod(a, b) ((a) * (b))
#define OP_min(a, b) ((b) < (a) ? (b) : (a))
#define OP_max(a, b) ((b) > (a) ? (b) : (a))

/* Integers wrap (combine in the unsigned type of the same width) and divide toward zero
 * (in the widest type of the same signedness, W). */
#define INT_TYPES(X) X(i8, u8, i64) X(u8, u8, u64) X(i32, u32, i64) X(u32, u32, u64) \
  X(i64, u64, i64) X(u64, u64, u64)

#define INT_COMBINE(T, U, op)                                                          \
  KERNEL(strata_combine_##op##_##T)(T* dst, const T* a, const T* b, u64 n) {           \
    FOR_EACH(i, n) {                                                                   \
      T x = a[i], y = b[i];                                                            \
      dst[i] = OPI_##op(T, U, x, y);                                                   \
    }                                                                                  \
  }
#define OPI_sum(T, U, x, y) (T)((U)(x) + (U)(y))
#define OPI_prod(T, U, x, y) (T)((U)(x) * (U)(y))
#define OPI_min(T, U, x, y) OP_min(x, y)
#define OPI_max(T, U, x, y) OP_max(x, y)

#define INT_KERNELS(T, U, W)                                                           \
  INT_COMBINE(T, U, sum) INT_COMBINE(T, U, prod) INT_COMBINE(T, U, min) INT_COMBINE(T, U, max) \
  KERNEL(strata_divide_##T)(T* buf, u64 divisor, u64 n) {                              \
    FOR_EACH(i, n) { buf[i] = (T)((W)buf[i] / (W)divisor); }                            \
  }                                                                                    \
  KERNEL(strata_scale_##T)(T* dst, const T* src, u64 bits, u64 n) {                   \
    T s = (T)bits;                                                                     \
    FOR_EACH(i, n) { dst[i] = (T)((U)src[i] * (U)s); }                                  \
  }
INT_TYPES(INT_KERNELS)

/* Wide floats combine in their own type. */
#define WIDE_COMBINE(T, op)                                                            \
  KERNEL(strata_combine_##op##_##T)(T* dst, const T* a, const T* b, u64 n) {           \
    FOR_EACH(i, n) { dst[i] = OP_##op(a[i], b[i]); }                                   \
  }
typedef float f32;
typedef double f64;
#define WIDE_KERNELS(T, BITS_T)                                                        \
  WIDE_COMBINE(T, sum) WIDE_COMBINE(T, prod) WIDE_COMBINE(T, min) WIDE_COMBINE(T, max) \
  KERNEL(strata_divide_##T)(T* buf, u64 divisor, u64 n) {                              \
    FOR_EACH(i, n) { buf[i] = buf[i] / (T)divisor; }                                    \
  }                                                                                    \
  KERNEL(strata_scale_##T)(T* dst, const T* src, u64 bits, u64 n) {                   \
    BITS_T b = (BITS_T)bits;                                                           \
    T s;                                                                               \
    FROM_BITS_##T(s, b);                                                               \
    FOR_EACH(i, n) { dst[i] = src[i] * s; }                                            \
  }
#ifdef STRATA_HOST
#define FROM_BITS_f32(s, b) memcpy(&(s), &(b), 4)
#define FROM_BITS_f64(s, b) memcpy(&(s), &(b), 8)
#else
#define FROM_BITS_f32(s, b) ((s) = __uint_as_float(b))
#define FROM_BITS_f64(s, b) ((s) = __longlong_as_double((long long)(b)))
#endif
WIDE_KERNELS(f32, u32)
WIDE_KERNELS(f64, u64)

/* Narrow floats: widen to f32, combine, round once. */
#define NARROW_COMBINE(T, S, op)                                                       \
  KERNEL(strata_combine_##op##_##T)(S* dst, const S* a, const S* b, u64 n) {           \
    FOR_EACH(i, n) {                                                                   \
      float x = T##_to_f32(a[i]), y = T##_to_f32(b[i]);                                \
      dst[i] = f32_to_##T(OP_##op(x, y));                                              \
    }                                                                                  \
  }
#define NARROW_KERNELS(T, S)                                                           \
  NARROW_COMBINE(T, S, sum) NARROW_COMBINE(T, S, prod) NARROW_COMBINE(T, S, min)       \
  NARROW_COMBINE(T, S, max)                                                            \
  KERNEL(strata_divide_##T)(S* buf, u64 divisor, u64 n) {                              \
    FOR_EACH(i, n) { buf[i] = f32_to_##T(T##_to_f32(buf[i]) / (float)divisor); }       \
  }                                                                                    \
  KERNEL(strata_scale_##T)(S* dst, const S* src, u64 bits, u64 n) {                   \
    float s = T##_to_f32((S)bits);                                                     \
    FOR_EACH(i, n) { dst[i] = f32_to_##T(T##_to_f32(src[i]) * s); }                     \
  }
NARROW_KERNELS(f16, u16)
NARROW_KERNELS(bf16, u16)
NARROW_KERNELS(e4m3, u8)
NARROW_KERNELS(e5m2, u8)

/* ----- the stand-in's table of host versions ------------------------------------------------ */
#ifdef STRATA_HOST
/* kind: 0 combine (dst, a, b, n), 1 divide (buf, divisor, n), 2 scale (dst, src, bits, n) */
typedef struct {
  const char* name;
  void* fn;
  int kind;
  int size;
} strata_kernel;
#define ENTRIES(T, SIZE)                                                               \
  {"strata_combine_sum_" #T, (void*)strata_combine_sum_##T, 0, SIZE},                 \
  {"strata_combine_prod_" #T, (void*)strata_combine_prod_##T, 0, SIZE},               \
  {"strata_combine_min_" #T, (void*)strata_combine_min_##T, 0, SIZE},                 \
  {"strata_combine_max_" #T, (void*)strata_combine_max_##T, 0, SIZE},                 \
  {"strata_divide_" #T, (void*)strata_divide_##T, 1, SIZE},                           \
  {"strata_scale_" #T, (void*)strata_scale_##T, 2, SIZE},
const strata_kernel strata_kernel_table[] = {
    ENTRIES(i8, 1) ENTRIES(u8, 1) ENTRIES(i32, 4) ENTRIES(u32, 4) ENTRIES(i64, 8)
    ENTRIES(u64, 8) ENTRIES(f16, 2) ENTRIES(f32, 4) ENTRIES(f64, 8) ENTRIES(bf16, 2)
    ENTRIES(e4m3, 1) ENTRIES(e5m2, 1) {0, 0, 0, 0}};
#endif
