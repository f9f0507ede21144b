/* Shared helpers of the libFuzzer targets (csrc/fuzz/fuzz_*.c).
 *
 * Built by `make fuzz` with clang -fsanitize=fuzzer,address,undefined
 * -fno-sanitize-recover=undefined against the kernels of csrc/cpu (no OpenMP: runs are
 * deterministic). A finding is a sanitizer report, a crash, or a failed
 * FUZZ_CHECK: an invariant of the kernel contracts (the headers in
 * csrc/include/sparsecomm) that the target verifies on every input. */
#ifndef SPARSECOMM_FUZZ_COMMON_H
#define SPARSECOMM_FUZZ_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sparsecomm/abi.h"
#include "sparsecomm/kernels.h"

/* Reference code of the targets is not instrumented for coverage: the
 * fuzzer's guidance (and its time) goes to the kernels, not to our loops. */
#if defined(__clang__)
#define FZ_NOCOV __attribute__((no_sanitize("coverage")))
#else
#define FZ_NOCOV
#endif

#define FUZZ_CHECK(cond)                                                              \
  do {                                                                                \
    if (!(cond)) {                                                                    \
      fprintf(stderr, "%s:%d: invariant failed: %s\n", __FILE__, __LINE__, #cond);    \
      abort();                                                                        \
    }                                                                                 \
  } while (0)

/* Reads fixed-size fields from the front of the input; past the end, zeros. */
typedef struct {
  const uint8_t* p;
  size_t n;
} fz_reader;

FZ_NOCOV static inline uint64_t fz_u(fz_reader* r, int nbytes) {
  uint64_t v = 0;
  for (int i = 0; i < nbytes; i++) {
    uint64_t b = 0;
    if (r->n) { b = *r->p++; r->n--; }
    v |= b << (8 * i);
  }
  return v;
}

/* A heap copy of exactly n bytes (so ASan sees any read past them). */
FZ_NOCOV static inline uint8_t* fz_dup(const void* src, size_t n) {
  uint8_t* d = (uint8_t*)malloc(n ? n : 1);
  FUZZ_CHECK(d != NULL);
  if (n) memcpy(d, src, n);
  return d;
}

FZ_NOCOV static inline sc_error_info fz_err(void) {
  sc_error_info e = {-7, -7, -7};
  return e;
}

/* ------------------------------------------------ reference arithmetic */

/* Value i of a vector of dtype t, exactly, as a double. */
FZ_NOCOV static inline double fz_get(sc_dtype t, const void* base, int64_t i) {
  switch (t) {
    case SC_F32: { float v; memcpy(&v, (const char*)base + 4 * i, 4); return v; }
    case SC_F64: { double v; memcpy(&v, (const char*)base + 8 * i, 8); return v; }
    case SC_F16: { uint16_t h; memcpy(&h, (const char*)base + 2 * i, 2); return sc_f16_to_f32(h); }
    case SC_BF16: { uint16_t h; memcpy(&h, (const char*)base + 2 * i, 2); return sc_bf16_to_f32(h); }
    default: return 0;
  }
}

/* Store v (already rounded to float for every type but float64). */
FZ_NOCOV static inline void fz_put(sc_dtype t, void* base, int64_t i, double v) {
  switch (t) {
    case SC_F32: { float f = (float)v; memcpy((char*)base + 4 * i, &f, 4); break; }
    case SC_F64: memcpy((char*)base + 8 * i, &v, 8); break;
    case SC_F16: { uint16_t h = sc_f32_to_f16((float)v); memcpy((char*)base + 2 * i, &h, 2); break; }
    case SC_BF16: { uint16_t h = sc_f32_to_bf16((float)v); memcpy((char*)base + 2 * i, &h, 2); break; }
    default: break;
  }
}

/* a + b in the kernels' accumulator: float64 for float64, float32 otherwise. */
FZ_NOCOV static inline double fz_add(sc_dtype t, double a, double b) {
  if (t == SC_F64) return a + b;
  return (double)((float)a + (float)b);
}

/* Same bits, or both NaN (a NaN's payload may change through float32). */
FZ_NOCOV static inline int fz_same(sc_dtype t, const void* a, int64_t ia, const void* b, int64_t ib) {
  size_t w = sc_dtype_size(t);
  if (!memcmp((const char*)a + w * ia, (const char*)b + w * ib, w)) return 1;
  double x = fz_get(t, a, ia), y = fz_get(t, b, ib);
  return x != x && y != y;
}

FZ_NOCOV static inline int64_t fz_idx(sc_index_t it, const void* base, int64_t i) {
  if (it == SC_I32) { int32_t v; memcpy(&v, (const char*)base + 4 * i, 4); return v; }
  int64_t v;
  memcpy(&v, (const char*)base + 8 * i, 8);
  return v;
}

FZ_NOCOV static inline void fz_set_idx(sc_index_t it, void* base, int64_t i, int64_t v) {
  if (it == SC_I32) { int32_t w = (int32_t)v; memcpy((char*)base + 4 * i, &w, 4); }
  else memcpy((char*)base + 8 * i, &v, 8);
}

/* First position where idx is not strictly ascending or not in [0, limit)
 * (limit < 0: no bound); at one position the range counts first. -1: none. */
FZ_NOCOV static inline int64_t fz_first_bad(sc_index_t it, const void* idx, int64_t n, int64_t limit,
                                   int* range) {
  for (int64_t i = 0; i < n; i++) {
    int64_t x = fz_idx(it, idx, i);
    if (x < 0 || (limit >= 0 && x >= limit)) { *range = 1; return i; }
    if (i > 0 && x <= fz_idx(it, idx, i - 1)) { *range = 0; return i; }
  }
  return -1;
}

/* Reference k-way merge of valid inputs: out_idx/out_val get the union,
 * values summed in list order in the accumulator; returns the count. */
FZ_NOCOV static inline int64_t fz_merge_ref(sc_index_t it, sc_dtype vt, int64_t p, const void* const* idx,
                                   const void* const* val, const int64_t* lens, void* out_idx,
                                   void* out_val) {
  int64_t pos[64] = {0}, o = 0;
  for (;;) {
    int64_t best = INT64_MAX;
    for (int64_t q = 0; q < p; q++)
      if (pos[q] < lens[q] && fz_idx(it, idx[q], pos[q]) < best) best = fz_idx(it, idx[q], pos[q]);
    if (best == INT64_MAX) break;
    double acc = 0;
    int first = 1;
    for (int64_t q = 0; q < p; q++)
      if (pos[q] < lens[q] && fz_idx(it, idx[q], pos[q]) == best) {
        double v = fz_get(vt, val[q], pos[q]++);
        acc = first ? v : fz_add(vt, acc, v);
        first = 0;
      }
    fz_set_idx(it, out_idx, o, best);
    fz_put(vt, out_val, o++, acc);
  }
  return o;
}

#endif
