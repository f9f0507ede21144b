/* Reference implementations shared by the C tests (csrc/tests) and the fuzz
 * targets (csrc/fuzz): plain loops written from the contracts in
 * csrc/include/sparsecomm, slow and obvious, to compare the kernels against. */
#ifndef SPARSECOMM_TESTS_REF_H
#define SPARSECOMM_TESTS_REF_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "sparsecomm/abi.h"
#include "sparsecomm/kernels.h"

/* not instrumented for coverage in fuzz builds: guidance goes to the kernels */
#if defined(__clang__)
#define REF_NOCOV __attribute__((no_sanitize("coverage")))
#else
#define REF_NOCOV
#endif

/* ------------------------------------------------ reference arithmetic */

/* Value i of a vector of dtype t, exactly, as a double. */
REF_NOCOV static inline double ref_get(sc_dtype t, const void* base, int64_t i) {
  switch (t) {
    case SC_F32: { float v; memcpy(&v, (const char*)base + 4 * i, 4); return v; }
    case SC_F64: { double v; memcpy(&v, (const char*)base + 8 * i, 8); return v; }
    case SC_F16: { uint16_t h; memcpy(&h, (const char*)base + 2 * i, 2); return sc_f16_to_f32(h); }
    case SC_BF16: { uint16_t h; memcpy(&h, (const char*)base + 2 * i, 2); return sc_bf16_to_f32(h); }
    default: return 0;
  }
}

/* Store v (already rounded to float for every type but float64). */
REF_NOCOV static inline void ref_put(sc_dtype t, void* base, int64_t i, double v) {
  switch (t) {
    case SC_F32: { float f = (float)v; memcpy((char*)base + 4 * i, &f, 4); break; }
    case SC_F64: memcpy((char*)base + 8 * i, &v, 8); break;
    case SC_F16: { uint16_t h = sc_f32_to_f16((float)v); memcpy((char*)base + 2 * i, &h, 2); break; }
    case SC_BF16: { uint16_t h = sc_f32_to_bf16((float)v); memcpy((char*)base + 2 * i, &h, 2); break; }
    default: break;
  }
}

/* a + b in the kernels' accumulator: float64 for float64, float32 otherwise. */
REF_NOCOV static inline double ref_add(sc_dtype t, double a, double b) {
  if (t == SC_F64) return a + b;
  return (double)((float)a + (float)b);
}

/* Same bits, or both NaN (a NaN's payload may change through float32). */
REF_NOCOV static inline int ref_same(sc_dtype t, const void* a, int64_t ia, const void* b, int64_t ib) {
  size_t w = sc_dtype_size(t);
  if (!memcmp((const char*)a + w * ia, (const char*)b + w * ib, w)) return 1;
  double x = ref_get(t, a, ia), y = ref_get(t, b, ib);
  return x != x && y != y;
}

/* ref_same over n elements: one memcmp, element by element only if that differs */
REF_NOCOV static inline int ref_same_all(sc_dtype t, const void* a, const void* b, int64_t n) {
  if (!memcmp(a, b, (size_t)n * sc_dtype_size(t))) return 1;
  for (int64_t i = 0; i < n; i++)
    if (!ref_same(t, a, i, b, i)) return 0;
  return 1;
}

REF_NOCOV static inline int64_t ref_idx(sc_index_t it, const void* base, int64_t i) {
  if (it == SC_I32) { int32_t v; memcpy(&v, (const char*)base + 4 * i, 4); return v; }
  int64_t v;
  memcpy(&v, (const char*)base + 8 * i, 8);
  return v;
}

REF_NOCOV static inline void ref_set_idx(sc_index_t it, void* base, int64_t i, int64_t v) {
  if (it == SC_I32) { int32_t w = (int32_t)v; memcpy((char*)base + 4 * i, &w, 4); }
  else memcpy((char*)base + 8 * i, &v, 8);
}

/* First position where idx is not strictly ascending or not in [0, limit)
 * (limit < 0: no bound); at one position the range counts first. -1: none. */
REF_NOCOV static inline int64_t ref_first_bad(sc_index_t it, const void* idx, int64_t n, int64_t limit,
                                   int* range) {
  for (int64_t i = 0; i < n; i++) {
    int64_t x = ref_idx(it, idx, i);
    if (x < 0 || (limit >= 0 && x >= limit)) { *range = 1; return i; }
    if (i > 0 && x <= ref_idx(it, idx, i - 1)) { *range = 0; return i; }
  }
  return -1;
}

/* Reference k-way merge of valid inputs: out_idx/out_val get the union,
 * values summed in list order in the accumulator; returns the count. */
REF_NOCOV static inline int64_t ref_merge(sc_index_t it, sc_dtype vt, int64_t p, const void* const* idx,
                                   const void* const* val, const int64_t* lens, void* out_idx,
                                   void* out_val) {
  int64_t pos[64] = {0}, o = 0;
  for (;;) {
    int64_t best = 0;
    int any = 0; /* no sentinel value: INT64_MAX is a valid index without a limit */
    for (int64_t q = 0; q < p; q++)
      if (pos[q] < lens[q] && (!any || ref_idx(it, idx[q], pos[q]) < best)) {
        best = ref_idx(it, idx[q], pos[q]);
        any = 1;
      }
    if (!any) break;
    double acc = 0;
    int first = 1;
    for (int64_t q = 0; q < p; q++)
      if (pos[q] < lens[q] && ref_idx(it, idx[q], pos[q]) == best) {
        double v = ref_get(vt, val[q], pos[q]++);
        acc = first ? v : ref_add(vt, acc, v);
        first = 0;
      }
    ref_set_idx(it, out_idx, o, best);
    ref_put(vt, out_val, o++, acc);
  }
  return o;
}


/* ------------------------------------------------------------- top-k */

/* |x_i|: the kernels' magnitude order, exact for every dtype (+0 == -0) */
REF_NOCOV static inline double ref_mag(sc_dtype t, const void* x, int64_t i) {
  double v = ref_get(t, x, i);
  return v < 0 ? -v : v;
}

/* 1 if (idx, vals)[0..m) is a correct top-m of x[lo, hi): indices strictly
 * ascending inside the range, values the bits of x there, and the worst
 * selected entry beats the best unselected one (larger |x|, or equal |x| and
 * a lower index). x must hold no NaN. */
REF_NOCOV static inline int ref_topk_ok(sc_dtype t, const void* x, int64_t lo, int64_t hi,
                                        const int64_t* idx, const void* vals, int64_t m) {
  size_t w = sc_dtype_size(t);
  double worst = 1.0 / 0.0;
  int64_t worst_i = -1;
  for (int64_t j = 0; j < m; j++) {
    if (idx[j] < lo || idx[j] >= hi || (j && idx[j] <= idx[j - 1])) return 0;
    if (memcmp((const char*)vals + w * j, (const char*)x + w * idx[j], w)) return 0;
    double a = ref_mag(t, x, idx[j]);
    if (a < worst || (a == worst && idx[j] > worst_i)) { worst = a; worst_i = idx[j]; }
  }
  double best = -1;
  int64_t best_i = -1, j = 0;
  for (int64_t i = lo; i < hi; i++) {
    if (j < m && idx[j] == i) { j++; continue; }
    double a = ref_mag(t, x, i);
    if (a > best) { best = a; best_i = i; }
  }
  return m == 0 || best_i < 0 || worst > best || (worst == best && worst_i < best_i);
}

/* ------------------------------------------------------------- sketch */

REF_NOCOV static inline uint64_t ref_mix(uint64_t z) {
  z ^= z >> 30;
  z *= 0xBF58476D1CE4E5B9ull;
  z ^= z >> 27;
  z *= 0x94D049BB133111EBull;
  z ^= z >> 31;
  return z;
}

/* bucket and sign of coordinate i in row j, as sparsecomm/sketch.h defines them */
REF_NOCOV static inline void ref_sketch_hash(uint64_t seed, int64_t j, int64_t i, int64_t cols,
                                             int64_t* bucket, double* sign) {
  uint64_t key = ref_mix(seed + 0x9E3779B97F4A7C15ull * (uint64_t)(j + 1));
  uint64_t r = (uint64_t)i / 16, o = (uint64_t)i % 16;
  uint64_t h = ref_mix(key ^ r);
  uint64_t base = ((h >> 32) * (uint64_t)cols) >> 32;
  *bucket = (int64_t)((base + o) % (uint64_t)cols);
  *sign = ((h >> o) & 1) ? -1.0 : 1.0;
}

/* T += sketch of (idx or 0..m-1, val): T[j][b] += (TT)v * sign in the table
 * dtype tt (SC_F32 or SC_F64), in input order for every row */
REF_NOCOV static inline void ref_sketch_build(sc_dtype tt, void* table, int64_t rows, int64_t cols,
                                              uint64_t seed, const int64_t* idx, sc_dtype vt,
                                              const void* val, int64_t m) {
  for (int64_t j = 0; j < rows; j++)
    for (int64_t t = 0; t < m; t++) {
      int64_t i = idx ? idx[t] : t, b;
      double sign, v = ref_get(vt, val, t);
      ref_sketch_hash(seed, j, i, cols, &b, &sign);
      int64_t at = j * cols + b;
      if (tt == SC_F32) {
        float x;
        memcpy(&x, (char*)table + 4 * at, 4);
        x += (float)v * (float)sign;
        memcpy((char*)table + 4 * at, &x, 4);
      } else {
        double x;
        memcpy(&x, (char*)table + 8 * at, 8);
        x += v * sign;
        memcpy((char*)table + 8 * at, &x, 8);
      }
    }
}

/* The estimate of coordinate i: median over rows of sign * T[j][bucket] (mean
 * of the middle two, in the table dtype, for an even count). Returns 0 when a
 * value is NaN (no order), 1 with *out set otherwise. */
REF_NOCOV static inline int ref_sketch_estimate(sc_dtype tt, const void* table, int64_t rows,
                                                int64_t cols, uint64_t seed, int64_t i,
                                                double* out) {
  double v[64];
  for (int64_t j = 0; j < rows; j++) {
    int64_t b;
    double sign;
    ref_sketch_hash(seed, j, i, cols, &b, &sign);
    v[j] = ref_get(tt, table, j * cols + b) * sign;
    if (v[j] != v[j]) return 0;
  }
  for (int64_t a = 1; a < rows; a++)
    for (int64_t c = a; c > 0 && v[c - 1] > v[c]; c--) {
      double s = v[c];
      v[c] = v[c - 1];
      v[c - 1] = s;
    }
  if (rows & 1) *out = v[rows / 2];
  else if (tt == SC_F32) *out = (double)(((float)v[rows / 2 - 1] + (float)v[rows / 2]) / 2.0f);
  else *out = (v[rows / 2 - 1] + v[rows / 2]) / 2.0;
  return 1;
}

/* ------------------------------------------------------------- DenseStream */

/* Canonical DenseStream of x[0..n) (sparsecomm/densestream.h): one block per maximal
 * group of non-zeros (+0 and -0 are zero, NaN is not) whose gaps hold at most T zeros.
 * Writes starts and lengths (room for n each); returns the block count and the value
 * count in *nvalues. The values of a block are x over it, zeros as +0. */
REF_NOCOV static inline int64_t ref_ds_blocks(sc_dtype t, const void* x, int64_t n, int64_t T,
                                              int64_t* starts, int64_t* lengths, int64_t* nvalues) {
  int64_t nb = 0, last = -1, nv = 0;
  for (int64_t i = 0; i < n; i++) {
    if (ref_get(t, x, i) == 0.0) continue;
    if (nb > 0 && i - last - 1 <= T) {
      lengths[nb - 1] = i - starts[nb - 1] + 1;
    } else {
      starts[nb] = i;
      lengths[nb] = 1;
      nb++;
    }
    last = i;
  }
  for (int64_t b = 0; b < nb; b++) nv += lengths[b];
  *nvalues = nv;
  return nb;
}

/* 1 if (starts, lengths, values) is exactly the canonical DenseStream of x: the blocks of
 * ref_ds_blocks, and each value the bits of x there, or +0 where x is zero. */
REF_NOCOV static inline int ref_ds_same(sc_dtype t, const void* x, int64_t n, int64_t T,
                                        const int64_t* starts, const int64_t* lengths,
                                        const void* values, int64_t nb, int64_t nv) {
  int64_t* s = (int64_t*)malloc((size_t)(n ? n : 1) * 8);
  int64_t* l = (int64_t*)malloc((size_t)(n ? n : 1) * 8);
  int64_t rv = 0, rb = ref_ds_blocks(t, x, n, T, s, l, &rv), k = 0;
  int ok = rb == nb && rv == nv;
  size_t w = sc_dtype_size(t);
  for (int64_t b = 0; ok && b < nb; b++) {
    ok = s[b] == starts[b] && l[b] == lengths[b];
    for (int64_t j = 0; ok && j < l[b]; j++, k++) {
      int64_t i = s[b] + j;
      if (ref_get(t, x, i) == 0.0) {
        static const uint8_t zeros[8] = {0};
        ok = memcmp((const char*)values + w * k, zeros, w) == 0;
      } else {
        ok = ref_same(t, values, k, x, i);
      }
    }
  }
  free(s);
  free(l);
  return ok;
}

#endif
