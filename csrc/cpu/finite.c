/* Non-finite scan of a gradient (the reducer's check before anything is
 * reduced). Contract: csrc/include/sparsecomm/kernels.h. */
#include <stdint.h>
#include <string.h>

#include "sparsecomm/kernels.h"
#include "common.h"

/*
 * 1 if any key (bits & MASK) exceeds LIM (the largest finite key). Written as
 * arithmetic, not a branch or a compare: LIM - key is negative (top bit set)
 * exactly when key > LIM, and OR-ing those over the input vectorizes on any
 * target (SSE2: pand / psub / por), with no early exit. Two halves are read in
 * one loop: two streams keep more cache misses in flight on one core than one
 * (a single read stream is latency-bound at ~0.55 residual-add passes over
 * 15M float32, two at ~0.45; docs/benchmarks.md).
 */
#define ANY_ABOVE(SFX, W, MASK, LIM, TOP)                                  \
  static int any_above_##SFX(const W* u, int64_t n) {                      \
    const int64_t h = n / 2;                                               \
    W a = 0, b = 0;                                                        \
    for (int64_t i = 0; i < h; i++) {                                      \
      a |= (W)((W)(LIM) - (W)(u[i] & (W)(MASK)));                          \
      b |= (W)((W)(LIM) - (W)(u[h + i] & (W)(MASK)));                      \
    }                                                                      \
    if (n & 1) a |= (W)((W)(LIM) - (W)(u[n - 1] & (W)(MASK)));             \
    return ((a | b) >> (TOP)) != 0;                                        \
  }

ANY_ABOVE(w32, uint32_t, 0x7FFFFFFFu, 0x7F7FFFFFu, 31)
ANY_ABOVE(w64, uint64_t, 0x7FFFFFFFFFFFFFFFull, 0x7FEFFFFFFFFFFFFFull, 63)
ANY_ABOVE(f16, uint16_t, 0x7FFFu, 0x7BFFu, 15)
ANY_ABOVE(bf16, uint16_t, 0x7FFFu, 0x7F7Fu, 15)

/* The exact flags of x[lo, hi) (the rare path: something was found). */
#define FLAGS(SFX, W, MASK, INF, SIGN)                                     \
  static int flags_##SFX(const W* u, int64_t lo, int64_t hi) {             \
    int f = 0;                                                             \
    for (int64_t i = lo; i < hi; i++) {                                    \
      W key = (W)(u[i] & (W)(MASK));                                       \
      if (key > (W)(INF)) f |= SC_NONFINITE_NAN;                           \
      else if (key == (W)(INF)) f |= (u[i] & (W)(SIGN)) ? SC_NONFINITE_NEG_INF : SC_NONFINITE_POS_INF; \
    }                                                                      \
    return f;                                                              \
  }

FLAGS(w32, uint32_t, 0x7FFFFFFFu, 0x7F800000u, 0x80000000u)
FLAGS(w64, uint64_t, 0x7FFFFFFFFFFFFFFFull, 0x7FF0000000000000ull, 0x8000000000000000ull)
FLAGS(f16, uint16_t, 0x7FFFu, 0x7C00u, 0x8000u)
FLAGS(bf16, uint16_t, 0x7FFFu, 0x7F80u, 0x8000u)

static int any_part(sc_dtype t, const void* x, int64_t lo, int64_t hi) {
  switch (t) {
    case SC_F32: return any_above_w32((const uint32_t*)x + lo, hi - lo);
    case SC_F64: return any_above_w64((const uint64_t*)x + lo, hi - lo);
    case SC_F16: return any_above_f16((const uint16_t*)x + lo, hi - lo);
    default: return any_above_bf16((const uint16_t*)x + lo, hi - lo);
  }
}

static int flags_part(sc_dtype t, const void* x, int64_t lo, int64_t hi) {
  switch (t) {
    case SC_F32: return flags_w32((const uint32_t*)x, lo, hi);
    case SC_F64: return flags_w64((const uint64_t*)x, lo, hi);
    case SC_F16: return flags_f16((const uint16_t*)x, lo, hi);
    default: return flags_bf16((const uint16_t*)x, lo, hi);
  }
}

int sc_nonfinite(sc_dtype dtype, const void* x, int64_t n, int nthreads, int* flags,
                 sc_error_info* err) {
  const int nt = sc_clamp_threads(nthreads);
  if (!flags) return sc_fail(err, SC_ERR_ARG, 0, 0, 0);
  *flags = 0;
  if (dtype != SC_F32 && dtype != SC_F64 && dtype != SC_F16 && dtype != SC_BF16)
    return sc_fail(err, SC_ERR_ARG, 0, 0, dtype);
  if (n < 0) return sc_fail(err, SC_ERR_ARG, 0, 0, n);
  const int pnt = n > 262144 ? nt : 1;
  int any = 0, f = 0;
  int t;
#pragma omp parallel for num_threads(pnt) schedule(static, 1) if (pnt > 1) reduction(| : any)
  for (t = 0; t < pnt; t++) any |= any_part(dtype, x, n * t / pnt, n * (t + 1) / pnt);
  if (!any) return SC_OK;
#pragma omp parallel for num_threads(pnt) schedule(static, 1) if (pnt > 1) reduction(| : f)
  for (t = 0; t < pnt; t++) f |= flags_part(dtype, x, n * t / pnt, n * (t + 1) / pnt);
  *flags = f;
  return SC_OK;
}
