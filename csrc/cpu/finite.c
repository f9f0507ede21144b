/* Non-finite scan of a gradient (the reducer's check before anything is
 * reduced). Contract: csrc/include/sparsecomm/kernels.h. */
#include <stdint.h>
#include <string.h>

#include "sparsecomm/kernels.h"
#include "common.h"

/* the scan of each value width (finite_impl.h) */
#define SFX w32
#define W uint32_t
#define MASK 0x7FFFFFFFu
#define LIM 0x7F7FFFFFu
#define INF 0x7F800000u
#define SIGN 0x80000000u
#define TOP 31
#include "finite_impl.h"
#undef SFX
#undef W
#undef MASK
#undef LIM
#undef INF
#undef SIGN
#undef TOP

#define SFX w64
#define W uint64_t
#define MASK 0x7FFFFFFFFFFFFFFFull
#define LIM 0x7FEFFFFFFFFFFFFFull
#define INF 0x7FF0000000000000ull
#define SIGN 0x8000000000000000ull
#define TOP 63
#include "finite_impl.h"
#undef SFX
#undef W
#undef MASK
#undef LIM
#undef INF
#undef SIGN
#undef TOP

#define SFX f16
#define W uint16_t
#define MASK 0x7FFFu
#define LIM 0x7BFFu
#define INF 0x7C00u
#define SIGN 0x8000u
#define TOP 15
#include "finite_impl.h"
#undef SFX
#undef W
#undef MASK
#undef LIM
#undef INF
#undef SIGN
#undef TOP

#define SFX bf16
#define W uint16_t
#define MASK 0x7FFFu
#define LIM 0x7F7Fu
#define INF 0x7F80u
#define SIGN 0x8000u
#define TOP 15
#include "finite_impl.h"
#undef SFX
#undef W
#undef MASK
#undef LIM
#undef INF
#undef SIGN
#undef TOP

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
