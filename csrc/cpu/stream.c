/* Sparse-stream kernels (SparCML section 3: dense + dense, disjoint concatenation)
 * and QSGD packing (section 5). Contract: csrc/include/sparsecomm/stream.h; the
 * sparse + sparse and sparse + dense sums are the COO kernels of coo.c. The QSGD
 * bodies live in qsgd_impl.h, instantiated here per value type. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "sparsecomm/kernels.h"
#include "sparsecomm/stream.h"
#include "common.h"

/* ------------------------------------------------------------ dense + dense */

/* x[i] += y[i]. y == x is fine as it is: every iteration reads and writes its own
 * element only, which is all `omp simd` asserts (no restrict anywhere). The simd loop
 * sits in its own function, below a plain `parallel for` over chunks, because a
 * combined `parallel for simd if (...)` turned simd off whenever the if was false
 * (every n up to the parallel threshold: OpenMP 5 applies the if to both), and clang
 * with -fno-strict-aliasing did not vectorize it at all (its stores might alias the
 * loop's shared bounds). */
static void add_f32(float* x, const float* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

static void add_f64(double* x, const double* y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

#define DD_CHUNK 65536 /* elements per task of the parallel path */

int sc_stream_add_dd(sc_dtype vt, void* a, const void* b, int64_t n, int nthreads,
                     sc_error_info* err) {
  const int nt = sc_clamp_threads(nthreads);
  (void)nt;
  if (n < 0) return sc_fail(err, SC_ERR_ARG, 0, 0, n);
  if (vt != SC_F32 && vt != SC_F64) return sc_fail(err, SC_ERR_ARG, 0, 0, vt);
  /* the same buffer doubles a; any other shared byte would be read after another
     element's (or thread's) write, so the sum would depend on the schedule */
  const uintptr_t bytes = (uintptr_t)n * sc_dtype_size(vt), x0 = (uintptr_t)a, y0 = (uintptr_t)b;
  if (x0 != y0 && n > 0 && x0 < y0 + bytes && y0 < x0 + bytes)
    return sc_fail(err, SC_ERR_OVERLAP, 1, 0, 0);
  const int64_t nchunks = n / DD_CHUNK + (n % DD_CHUNK != 0);
  int64_t c;
#pragma omp parallel for num_threads(nt) if (n > 262144) schedule(static)
  for (c = 0; c < nchunks; ++c) {
    const int64_t lo = c * DD_CHUNK, len = n - lo < DD_CHUNK ? n - lo : DD_CHUNK;
    if (vt == SC_F32) add_f32((float*)a + lo, (const float*)b + lo, len);
    else add_f64((double*)a + lo, (const double*)b + lo, len);
  }
  return SC_OK;
}

/* ------------------------------------------------------------ concatenation */
static int64_t index_at(sc_index_t it, const void* idx, int64_t i) {
  return it == SC_I32 ? (int64_t)((const int32_t*)idx)[i] : ((const int64_t*)idx)[i];
}

int sc_stream_concat(sc_index_t it, sc_dtype vt, const void* ia, const void* va, int64_t na,
                     const void* ib, const void* vb, int64_t nb, int nthreads, void* io,
                     void* vo, sc_error_info* err) {
  const size_t is = sc_index_size(it), vs = sc_dtype_size(vt);
  if (na < 0) return sc_fail(err, SC_ERR_ARG, 0, 0, na);
  if (nb < 0) return sc_fail(err, SC_ERR_ARG, 1, 0, nb);
  if (!is) return sc_fail(err, SC_ERR_ARG, 0, 0, it);
  if (!vs) return sc_fail(err, SC_ERR_ARG, 0, 0, vt);
  /* each input in order (one fused parallel pass each), then the boundary */
  int st = sc_check_sorted_indices(it, ia, na, -1, nthreads, err);
  if (st) return st; /* err->input is 0 */
  st = sc_check_sorted_indices(it, ib, nb, -1, nthreads, err);
  if (st) {
    if (err) err->input = 1;
    return st;
  }
  if (na && nb && index_at(it, ib, 0) <= index_at(it, ia, na - 1))
    return sc_fail(err, SC_ERR_INDEX_ORDER, 1, 0, index_at(it, ib, 0));
  if (na) {
    memcpy(io, ia, (size_t)na * is);
    memcpy(vo, va, (size_t)na * vs);
  }
  if (nb) {
    memcpy((char*)io + (size_t)na * is, ib, (size_t)nb * is);
    memcpy((char*)vo + (size_t)na * vs, vb, (size_t)nb * vs);
  }
  return SC_OK;
}

/* --------------------------------------------------------------------- QSGD */

#define SFX f32
#define VT float
#include "qsgd_impl.h"
#undef SFX
#undef VT

#define SFX f64
#define VT double
#include "qsgd_impl.h"
#undef SFX
#undef VT

/* n, bits and bucket as the header allows them; 4 bits: even buckets, so a byte
   never straddles two buckets (nor two threads) */
static int qsgd_args(sc_dtype vt, int64_t n, int bits, int64_t bucket, sc_error_info* err) {
  if (vt != SC_F32 && vt != SC_F64) return sc_fail(err, SC_ERR_ARG, 0, 0, vt);
  if (n < 0) return sc_fail(err, SC_ERR_ARG, 0, 0, n);
  if (bits != 4 && bits != 8) return sc_fail(err, SC_ERR_ARG, 0, 0, bits);
  if (bucket < 1 || (bits == 4 && (bucket & 1))) return sc_fail(err, SC_ERR_ARG, 0, 0, bucket);
  return SC_OK;
}

int sc_qsgd_quantize(sc_dtype vt, const void* x, int64_t n, int bits, int64_t bucket,
                     uint64_t seed, uint8_t* packed, float* scales, int nthreads,
                     sc_error_info* err) {
  const int nt = sc_clamp_threads(nthreads);
  int st = qsgd_args(vt, n, bits, bucket, err);
  if (st) return st;
  const int64_t bad = vt == SC_F32
                          ? qsgd_quantize_f32(x, n, bits, bucket, seed, packed, scales, nt)
                          : qsgd_quantize_f64(x, n, bits, bucket, seed, packed, scales, nt);
  if (bad != INT64_MAX) return sc_fail(err, SC_ERR_NAN, 0, bad, 0);
  return SC_OK;
}

/* First byte of packed (n levels of `bits` bits) holding a level above 2s, or for 4 bits
   with odd n a last byte whose unused high nibble is not 0 (INT64_MAX: none). A parallel
   flag pass, then a serial scan for the position on the failure path only. */
static int64_t qsgd_bad_byte(const uint8_t* p, int64_t n, int bits, int nt) {
  const int64_t full = bits == 8 ? n : n / 2; /* bytes holding two levels at 4 bits */
  int bad = 0;
  int64_t i;
  (void)nt;
  if (bits == 8) {
#pragma omp parallel for num_threads(nt) if (full > 262144) schedule(static) reduction(| : bad)
    for (i = 0; i < full; ++i) bad |= p[i] == 0xFF;
  } else {
#pragma omp parallel for num_threads(nt) if (full > 262144) schedule(static) reduction(| : bad)
    for (i = 0; i < full; ++i) bad |= ((p[i] & 0x0F) == 0x0F) | ((p[i] & 0xF0) == 0xF0);
  }
  if (bad) {
    for (i = 0; i < full; ++i)
      if (bits == 8 ? p[i] == 0xFF : (p[i] & 0x0F) == 0x0F || (p[i] & 0xF0) == 0xF0) return i;
  }
  if (bits == 4 && (n & 1) && p[full] > 14) return full; /* low level <= 14, high nibble 0 */
  return INT64_MAX;
}

/* First scale that is not finite and >= 0 (NaN, negative, Inf; INT64_MAX: none). */
static int64_t qsgd_bad_scale(const float* sc, int64_t nb, int nt) {
  int bad = 0;
  int64_t i;
  (void)nt;
#pragma omp parallel for num_threads(nt) if (nb > 262144) schedule(static) reduction(| : bad)
  for (i = 0; i < nb; ++i) bad |= !(sc[i] >= 0.0f && sc[i] <= FLT_MAX);
  if (bad) {
    for (i = 0; i < nb; ++i)
      if (!(sc[i] >= 0.0f && sc[i] <= FLT_MAX)) return i;
  }
  return INT64_MAX;
}

int sc_qsgd_dequantize(sc_dtype vt, const uint8_t* packed, const float* scales, int64_t n,
                       int bits, int64_t bucket, void* out, int nthreads, sc_error_info* err) {
  const int nt = sc_clamp_threads(nthreads);
  int st = qsgd_args(vt, n, bits, bucket, err);
  if (st) return st;
  /* packed and scales come from a peer: validated in full before anything is written */
  const int64_t pb = qsgd_bad_byte(packed, n, bits, nt);
  if (pb != INT64_MAX) return sc_fail(err, SC_ERR_MALFORMED, 0, pb, packed[pb]);
  const int64_t nb = n / bucket + (n % bucket != 0);
  const int64_t sb = qsgd_bad_scale(scales, nb, nt);
  if (sb != INT64_MAX) {
    uint32_t raw; /* the value as its float32 bit pattern */
    memcpy(&raw, &scales[sb], sizeof raw);
    return sc_fail(err, SC_ERR_MALFORMED, 1, sb, (int64_t)raw);
  }
  if (vt == SC_F32) qsgd_dequantize_f32(packed, scales, n, bits, bucket, out, nt);
  else qsgd_dequantize_f64(packed, scales, n, bits, bucket, out, nt);
  return SC_OK;
}
