/* Sparse-stream summation kernels (SparCML section 3) and QSGD packing
 * (section 5). See csrc/include/sparsecomm/stream.h for the contract. */
#include <math.h>
#include <string.h>

#include "common.h"
#include "sparsecomm/stream.h"

/* ------------------------------------------------- both inputs strictly ascending */
#define DEF_ASCENDING(NAME, IT)                                                         \
  static int NAME(const IT* ia, int64_t na, const IT* ib, int64_t nb, sc_error_info* err) { \
    for (int64_t i = 1; i < na; ++i)                                                    \
      if (ia[i] <= ia[i - 1]) {                                                         \
        err->input = 0; err->position = i; err->value = (int64_t)ia[i];                 \
        return SC_ERR_INDEX_ORDER;                                                      \
      }                                                                                 \
    for (int64_t i = 1; i < nb; ++i)                                                    \
      if (ib[i] <= ib[i - 1]) {                                                         \
        err->input = 1; err->position = i; err->value = (int64_t)ib[i];                 \
        return SC_ERR_INDEX_ORDER;                                                      \
      }                                                                                 \
    return SC_OK;                                                                       \
  }
DEF_ASCENDING(ascending_i32, int32_t)
DEF_ASCENDING(ascending_i64, int64_t)

/* ---------------------------------------------------------- sparse + sparse */
#define DEF_SS(NAME, IT, VT, ASCENDING)                                                 \
  static int NAME(const IT* ia, const VT* va, int64_t na, const IT* ib, const VT* vb,  \
                  int64_t nb, IT* io, VT* vo, int64_t* out_count, sc_error_info* err) { \
    int order = ASCENDING(ia, na, ib, nb, err);                                         \
    if (order != SC_OK) return order;                                                   \
    int64_t i = 0, j = 0, o = 0;                                                        \
    while (i < na && j < nb) {                                                          \
      IT x = ia[i], y = ib[j];                                                          \
      if (x < y) { io[o] = x; vo[o++] = va[i++]; }                                      \
      else if (y < x) { io[o] = y; vo[o++] = vb[j++]; }                                 \
      else { io[o] = x; vo[o++] = va[i++] + vb[j++]; }                                  \
    }                                                                                   \
    if (i < na) { memcpy(io + o, ia + i, (size_t)(na - i) * sizeof(IT));                \
                  memcpy(vo + o, va + i, (size_t)(na - i) * sizeof(VT)); o += na - i; } \
    if (j < nb) { memcpy(io + o, ib + j, (size_t)(nb - j) * sizeof(IT));                \
                  memcpy(vo + o, vb + j, (size_t)(nb - j) * sizeof(VT)); o += nb - j; } \
    *out_count = o;                                                                     \
    return SC_OK;                                                                       \
  }
DEF_SS(ss_i32_f32, int32_t, float, ascending_i32)
DEF_SS(ss_i64_f32, int64_t, float, ascending_i64)
DEF_SS(ss_i32_f64, int32_t, double, ascending_i32)
DEF_SS(ss_i64_f64, int64_t, double, ascending_i64)

int sc_stream_add_ss(sc_index_t it, sc_dtype vt, const void* ia, const void* va, int64_t na,
                     const void* ib, const void* vb, int64_t nb, void* io, void* vo,
                     int64_t* out_count, sc_error_info* err) {
  if (na < 0 || nb < 0) return SC_ERR_ARG;
  if (vt == SC_F32 && it == SC_I32) return ss_i32_f32(ia, va, na, ib, vb, nb, io, vo, out_count, err);
  if (vt == SC_F32 && it == SC_I64) return ss_i64_f32(ia, va, na, ib, vb, nb, io, vo, out_count, err);
  if (vt == SC_F64 && it == SC_I32) return ss_i32_f64(ia, va, na, ib, vb, nb, io, vo, out_count, err);
  if (vt == SC_F64 && it == SC_I64) return ss_i64_f64(ia, va, na, ib, vb, nb, io, vo, out_count, err);
  return SC_ERR_ARG;
}

/* ----------------------------------------------------------- sparse + dense */
#define DEF_SD(NAME, IT, VT)                                                           \
  static int NAME(VT* d, int64_t n, const IT* idx, const VT* val, int64_t c, int nt,  \
                  sc_error_info* err) {                                                \
    for (int64_t i = 0; i < c; ++i)                                                    \
      if ((int64_t)idx[i] < 0 || (int64_t)idx[i] >= n) {                               \
        err->input = 0; err->position = i; err->value = (int64_t)idx[i];               \
        return SC_ERR_INDEX_RANGE;                                                     \
      }                                                                                \
    /* indices of a stream are distinct, so the scatter parallelizes */               \
    _Pragma("omp parallel for num_threads(nt) if(c > 65536) schedule(static)")        \
    for (int64_t i = 0; i < c; ++i) d[idx[i]] += val[i];                               \
    (void)nt;                                                                          \
    return SC_OK;                                                                      \
  }
DEF_SD(sd_i32_f32, int32_t, float)
DEF_SD(sd_i64_f32, int64_t, float)
DEF_SD(sd_i32_f64, int32_t, double)
DEF_SD(sd_i64_f64, int64_t, double)

int sc_stream_add_sd(sc_index_t it, sc_dtype vt, void* dense, int64_t n, const void* idx,
                     const void* val, int64_t count, int nthreads, sc_error_info* err) {
  int nt = sc_clamp_threads(nthreads);
  if (n < 0 || count < 0) return SC_ERR_ARG;
  if (vt == SC_F32 && it == SC_I32) return sd_i32_f32(dense, n, idx, val, count, nt, err);
  if (vt == SC_F32 && it == SC_I64) return sd_i64_f32(dense, n, idx, val, count, nt, err);
  if (vt == SC_F64 && it == SC_I32) return sd_i32_f64(dense, n, idx, val, count, nt, err);
  if (vt == SC_F64 && it == SC_I64) return sd_i64_f64(dense, n, idx, val, count, nt, err);
  return SC_ERR_ARG;
}

/* ------------------------------------------------------------ dense + dense */
int sc_stream_add_dd(sc_dtype vt, void* a, const void* b, int64_t n, int nthreads) {
  int nt = sc_clamp_threads(nthreads);
  (void)nt;
  if (n < 0) return SC_ERR_ARG;
  if (vt == SC_F32) {
    float* restrict x = a;
    const float* restrict y = b;
#pragma omp parallel for simd num_threads(nt) if(n > 262144) schedule(static)
    for (int64_t i = 0; i < n; ++i) x[i] += y[i];
    return SC_OK;
  }
  if (vt == SC_F64) {
    double* restrict x = a;
    const double* restrict y = b;
#pragma omp parallel for simd num_threads(nt) if(n > 262144) schedule(static)
    for (int64_t i = 0; i < n; ++i) x[i] += y[i];
    return SC_OK;
  }
  return SC_ERR_ARG;
}

/* ------------------------------------------------------------ concatenation */
#define DEF_CAT(NAME, IT, ASCENDING)                                                    \
  static int NAME(const IT* ia, int64_t na, const IT* ib, int64_t nb, sc_error_info* err) { \
    int order = ASCENDING(ia, na, ib, nb, err);                                         \
    if (order != SC_OK) return order;                                                   \
    if (na && nb && ib[0] <= ia[na - 1]) {                                              \
      err->input = 1; err->position = 0; err->value = (int64_t)ib[0];                  \
      return SC_ERR_INDEX_ORDER;                                                        \
    }                                                                                   \
    return SC_OK;                                                                       \
  }
DEF_CAT(cat_check_i32, int32_t, ascending_i32)
DEF_CAT(cat_check_i64, int64_t, ascending_i64)

int sc_stream_concat(sc_index_t it, sc_dtype vt, const void* ia, const void* va, int64_t na,
                     const void* ib, const void* vb, int64_t nb, void* io, void* vo,
                     sc_error_info* err) {
  if (na < 0 || nb < 0) return SC_ERR_ARG;
  size_t is = it == SC_I32 ? 4 : it == SC_I64 ? 8 : 0;
  size_t vs = vt == SC_F32 ? 4 : vt == SC_F64 ? 8 : 0;
  if (!is || !vs) return SC_ERR_ARG;
  int st = it == SC_I32 ? cat_check_i32(ia, na, ib, nb, err) : cat_check_i64(ia, na, ib, nb, err);
  if (st) return st;
  memcpy(io, ia, (size_t)na * is);
  memcpy((char*)io + (size_t)na * is, ib, (size_t)nb * is);
  memcpy(vo, va, (size_t)na * vs);
  memcpy((char*)vo + (size_t)na * vs, vb, (size_t)nb * vs);
  return SC_OK;
}

/* --------------------------------------------------------------------- QSGD */
static inline double u01(uint64_t seed, int64_t i) {
  uint64_t s = seed ^ ((uint64_t)i * 0xD1B54A32D192ED03ull);
  return (double)(sc_rand(&s) >> 11) * (1.0 / 9007199254740992.0);
}

#define DEF_Q(NAME, VT)                                                                 \
  static void NAME(const VT* x, int64_t n, int bits, int64_t bucket, uint64_t seed,     \
                   uint8_t* packed, float* scales, int nt) {                            \
    const int s = (1 << (bits - 1)) - 1;                                                \
    const int64_t nb = (n + bucket - 1) / bucket;                                       \
    (void)nt;                                                                           \
    _Pragma("omp parallel for num_threads(nt) if(n > 262144) schedule(static)")        \
    for (int64_t b = 0; b < nb; ++b) {                                                  \
      int64_t lo = b * bucket, hi = lo + bucket < n ? lo + bucket : n;                  \
      double m = 0.0;                                                                   \
      for (int64_t i = lo; i < hi; ++i) { double a = fabs((double)x[i]); if (a > m) m = a; } \
      float scale = (float)m;                                                           \
      if ((double)scale < m) scale = nextafterf(scale, INFINITY);                       \
      scales[b] = scale;                                                                \
      for (int64_t i = lo; i < hi; ++i) {                                               \
        int q = s;                                                                      \
        if (scale > 0.0f) {                                                             \
          double r = fabs((double)x[i]) / (double)scale * s;                            \
          double l = floor(r);                                                          \
          if (u01(seed, i) < r - l) l += 1.0;                                           \
          if (l > s) l = s;                                                             \
          q = x[i] < 0 ? s - (int)l : s + (int)l;                                       \
        }                                                                               \
        if (bits == 8) packed[i] = (uint8_t)q;                                          \
        else if (i & 1) packed[i >> 1] = (uint8_t)((packed[i >> 1] & 0x0F) | (q << 4)); \
        else packed[i >> 1] = (uint8_t)((packed[i >> 1] & 0xF0) | q);                   \
      }                                                                                 \
    }                                                                                   \
  }
DEF_Q(q_f32, float)
DEF_Q(q_f64, double)

int sc_qsgd_quantize(sc_dtype vt, const void* x, int64_t n, int bits, int64_t bucket,
                     uint64_t seed, uint8_t* packed, float* scales, int nthreads) {
  int nt = sc_clamp_threads(nthreads);
  if (n < 0 || bucket < 1 || (bits != 4 && bits != 8)) return SC_ERR_ARG;
  /* 4-bit: buckets must start on a byte so threads never share one */
  if (bits == 4 && (bucket & 1)) return SC_ERR_ARG;
  if (bits == 4 && n > 0) packed[(n - 1) >> 1] = 0;
  if (vt == SC_F32) { q_f32(x, n, bits, bucket, seed, packed, scales, nt); return SC_OK; }
  if (vt == SC_F64) { q_f64(x, n, bits, bucket, seed, packed, scales, nt); return SC_OK; }
  return SC_ERR_ARG;
}

#define DEF_DQ(NAME, VT)                                                                \
  static void NAME(const uint8_t* packed, const float* scales, int64_t n, int bits,     \
                   int64_t bucket, VT* out, int nt) {                                   \
    const int s = (1 << (bits - 1)) - 1;                                                \
    (void)nt;                                                                           \
    _Pragma("omp parallel for num_threads(nt) if(n > 262144) schedule(static)")        \
    for (int64_t i = 0; i < n; ++i) {                                                   \
      int q = bits == 8 ? packed[i] : (i & 1) ? (packed[i >> 1] >> 4) : (packed[i >> 1] & 0x0F); \
      out[i] = (VT)((double)(q - s) * (double)scales[i / bucket] / (double)s);          \
    }                                                                                   \
  }
DEF_DQ(dq_f32, float)
DEF_DQ(dq_f64, double)

int sc_qsgd_dequantize(sc_dtype vt, const uint8_t* packed, const float* scales, int64_t n,
                       int bits, int64_t bucket, void* out, int nthreads) {
  int nt = sc_clamp_threads(nthreads);
  if (n < 0 || bucket < 1 || (bits != 4 && bits != 8)) return SC_ERR_ARG;
  if (vt == SC_F32) { dq_f32(packed, scales, n, bits, bucket, out, nt); return SC_OK; }
  if (vt == SC_F64) { dq_f64(packed, scales, n, bits, bucket, out, nt); return SC_OK; }
  return SC_ERR_ARG;
}
