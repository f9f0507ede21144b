/* Non-finite scan: which of NaN, +Inf, -Inf a float vector holds, in one read
 * (the reducer's check before an algorithm runs). Contract: kernels.h. */
#include <string.h>

#include "sparsecomm/kernels.h"
#include "common.h"

#define SFX f32
#define BITS uint32_t
#define MAG 0x7FFFFFFFu
#define INF 0x7F800000u
#define SIGN 0x80000000u
#include "finite_impl.h"
#undef SFX
#undef BITS
#undef MAG
#undef INF
#undef SIGN

#define SFX f64
#define BITS uint64_t
#define MAG 0x7FFFFFFFFFFFFFFFull
#define INF 0x7FF0000000000000ull
#define SIGN 0x8000000000000000ull
#include "finite_impl.h"
#undef SFX
#undef BITS
#undef MAG
#undef INF
#undef SIGN

#define SFX f16
#define BITS uint16_t
#define MAG 0x7FFFu
#define INF 0x7C00u
#define SIGN 0x8000u
#include "finite_impl.h"
#undef SFX
#undef INF

#define SFX bf16
#define INF 0x7F80u
#include "finite_impl.h"
#undef SFX
#undef BITS
#undef MAG
#undef INF
#undef SIGN

int sc_nonfinite_flags(sc_dtype dtype, const void* x, int64_t n, int nthreads, int* flags,
                       sc_error_info* err) {
  *flags = 0;
  if (n < 0) return sc_fail(err, SC_ERR_ARG, 0, 0, n);
  if (dtype != SC_F32 && dtype != SC_F64 && dtype != SC_F16 && dtype != SC_BF16)
    return sc_fail(err, SC_ERR_ARG, 0, 0, dtype);
  const int nt = n > 262144 ? sc_clamp_threads(nthreads) : 1;
  int parts[SC_MAX_THREADS];
  int t;
#pragma omp parallel for num_threads(nt) schedule(static, 1) if (nt > 1)
  for (t = 0; t < nt; t++) {
    int64_t lo = n * t / nt, hi = n * (t + 1) / nt;
    switch (dtype) {
      case SC_F32: parts[t] = scan_f32((const uint32_t*)x, lo, hi); break;
      case SC_F64: parts[t] = scan_f64((const uint64_t*)x, lo, hi); break;
      case SC_F16: parts[t] = scan_f16((const uint16_t*)x, lo, hi); break;
      default: parts[t] = scan_bf16((const uint16_t*)x, lo, hi); break;
    }
  }
  int all = 0;
  for (t = 0; t < nt; t++) all |= parts[t];
  *flags = (all & SC_NONFINITE_NAN) ? SC_NONFINITE_NAN : all;
  return SC_OK;
}
