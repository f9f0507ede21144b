/* COO helpers: index checks, merge_add, merge_add_many, scatter_add, gather. */
#include <stdlib.h>
#include <string.h>

#include "sparsecomm/kernels.h"
#include "common.h"

static inline float ld_f16(uint16_t h) { return sc_f16_to_f32(h); }
static inline uint16_t st_f16(float f) { return sc_f32_to_f16(f); }
static inline float ld_bf16(uint16_t h) { return sc_bf16_to_f32(h); }
static inline uint16_t st_bf16(float f) { return sc_f32_to_bf16(f); }

#define ISFX i32
#define IT int32_t
#include "coo_value_types.h"
#undef ISFX
#undef IT

#define ISFX i64
#define IT int64_t
#include "coo_value_types.h"
#undef ISFX
#undef IT

/* ------------------------------------------------------------ checks */

#define CHECK_SORTED(IT_)                                                       \
  do {                                                                          \
    const IT_* a = (const IT_*)idx;                                             \
    int64_t bad_pos = INT64_MAX;                                                \
    int bad_kind = 0;                                                           \
    int t;                                                                      \
    _Pragma("omp parallel for num_threads(nt) schedule(static, 1) if (nt > 1)") \
    for (t = 0; t < nt; t++) {                                                  \
      int64_t lo = n * t / nt, hi = n * (t + 1) / nt;                           \
      int64_t fp = INT64_MAX;                                                   \
      int fk = 0;                                                               \
      for (int64_t i = lo; i < hi; i++) {                                       \
        int64_t v = (int64_t)a[i];                                              \
        if (v < 0 || (limit >= 0 && v >= limit)) { fp = i; fk = SC_ERR_INDEX_RANGE; break; } \
        if (i > 0 && (int64_t)a[i - 1] >= v) { fp = i; fk = SC_ERR_INDEX_ORDER; break; } \
      }                                                                         \
      if (fk) {                                                                 \
        _Pragma("omp critical(sc_check)")                                       \
        { if (fp < bad_pos) { bad_pos = fp; bad_kind = fk; } }                  \
      }                                                                         \
    }                                                                           \
    if (bad_kind) {                                                             \
      if (err) { err->input = 0; err->position = bad_pos; err->value = (int64_t)a[bad_pos]; } \
      return bad_kind;                                                          \
    }                                                                           \
    return SC_OK;                                                               \
  } while (0)

int sc_check_sorted_indices(sc_index_t itype, const void* idx, int64_t n,
                            int64_t limit, int nthreads, sc_error_info* err) {
  int nt = sc_clamp_threads(nthreads);
  if (n < 0) return SC_ERR_ARG;
  if (n < 65536) nt = 1;
  if (itype == SC_I32) CHECK_SORTED(int32_t);
  if (itype == SC_I64) CHECK_SORTED(int64_t);
  return SC_ERR_ARG;
}

#define CHECK_RANGE(IT_)                                                        \
  do {                                                                          \
    const IT_* a = (const IT_*)idx;                                             \
    int bad = 0;                                                                \
    int64_t i;                                                                  \
    _Pragma("omp parallel for num_threads(nt) schedule(static) reduction(|: bad) if (nt > 1)") \
    for (i = 0; i < n; i++) bad |= ((uint64_t)(int64_t)a[i] >= (uint64_t)limit); \
    if (bad) {                                                                  \
      for (i = 0; i < n; i++)                                                   \
        if ((uint64_t)(int64_t)a[i] >= (uint64_t)limit) {                       \
          if (err) { err->input = 0; err->position = i; err->value = (int64_t)a[i]; } \
          return SC_ERR_INDEX_RANGE;                                            \
        }                                                                       \
    }                                                                           \
    return SC_OK;                                                               \
  } while (0)

/* every index in [0, limit) (any order, duplicates allowed) */
static int check_range(sc_index_t itype, const void* idx, int64_t n, int64_t limit,
                       int nt, sc_error_info* err) {
  if (n < 65536) nt = 1;
  if (itype == SC_I32) CHECK_RANGE(int32_t);
  CHECK_RANGE(int64_t);
}

/* ------------------------------------------------------------ dispatch */


int sc_merge_add_many(sc_index_t itype, sc_dtype vtype, int64_t p,
                      const void* const* idx, const void* const* val,
                      const int64_t* lens, int nthreads, void* out_idx,
                      void* out_val, int64_t* out_n) {
  int nt = sc_clamp_threads(nthreads);
  *out_n = 0;
  if (p < 0) return SC_ERR_ARG;
  if (p == 0) return SC_OK;
#define MM(ISFX_, IT_, VSFX_, VT_)                                              \
  return merge_many_##ISFX_##_##VSFX_(p, (const IT_* const*)idx, (const VT_* const*)val, \
                                      lens, nt, (IT_*)out_idx, (VT_*)out_val, out_n)
  if (itype == SC_I32) {
    switch (vtype) {
      case SC_F32: MM(i32, int32_t, f32, float);
      case SC_F64: MM(i32, int32_t, f64, double);
      case SC_F16: MM(i32, int32_t, f16, uint16_t);
      case SC_BF16: MM(i32, int32_t, bf16, uint16_t);
    }
  } else if (itype == SC_I64) {
    switch (vtype) {
      case SC_F32: MM(i64, int64_t, f32, float);
      case SC_F64: MM(i64, int64_t, f64, double);
      case SC_F16: MM(i64, int64_t, f16, uint16_t);
      case SC_BF16: MM(i64, int64_t, bf16, uint16_t);
    }
  }
#undef MM
  return SC_ERR_ARG;
}

int sc_merge_add(sc_index_t itype, sc_dtype vtype,
                 const void* idx_a, const void* val_a, int64_t na,
                 const void* idx_b, const void* val_b, int64_t nb,
                 int nthreads, void* out_idx, void* out_val, int64_t* out_n) {
  const void* idx[2] = {idx_a, idx_b};
  const void* val[2] = {val_a, val_b};
  int64_t lens[2] = {na, nb};
  return sc_merge_add_many(itype, vtype, 2, idx, val, lens, nthreads, out_idx, out_val, out_n);
}

int sc_scatter_add(sc_index_t itype, sc_dtype vtype, void* dense,
                   int64_t dense_n, const void* idx, const void* val,
                   int64_t n, int nthreads, sc_error_info* err) {
  int nt = sc_clamp_threads(nthreads);
  if (n < 0 || dense_n < 0) return SC_ERR_ARG;
  int st = check_range(itype, idx, n, dense_n, nt, err);
  if (st) return st;
#define SA(ISFX_, IT_, VSFX_, VT_) \
  return scatter_add_##ISFX_##_##VSFX_((VT_*)dense, (const IT_*)idx, (const VT_*)val, n)
  if (itype == SC_I32) {
    switch (vtype) {
      case SC_F32: SA(i32, int32_t, f32, float);
      case SC_F64: SA(i32, int32_t, f64, double);
      case SC_F16: SA(i32, int32_t, f16, uint16_t);
      case SC_BF16: SA(i32, int32_t, bf16, uint16_t);
    }
  } else if (itype == SC_I64) {
    switch (vtype) {
      case SC_F32: SA(i64, int64_t, f32, float);
      case SC_F64: SA(i64, int64_t, f64, double);
      case SC_F16: SA(i64, int64_t, f16, uint16_t);
      case SC_BF16: SA(i64, int64_t, bf16, uint16_t);
    }
  }
#undef SA
  return SC_ERR_ARG;
}

int sc_gather(sc_index_t itype, sc_dtype vtype, const void* dense,
              int64_t dense_n, const void* idx, int64_t n, int nthreads,
              void* out, sc_error_info* err) {
  int nt = sc_clamp_threads(nthreads);
  if (n < 0 || dense_n < 0) return SC_ERR_ARG;
  int st = check_range(itype, idx, n, dense_n, nt, err);
  if (st) return st;
  int w = vtype == SC_F64 ? 8 : (vtype == SC_F32 ? 4 : 2);
  /* gathering is type-agnostic: dispatch on the value width only */
#define GA(ISFX_, IT_, VSFX_, VT_) \
  do { gather_##ISFX_##_##VSFX_((const VT_*)dense, (const IT_*)idx, n, nt, (VT_*)out); return SC_OK; } while (0)
  if (itype == SC_I32) {
    if (w == 8) GA(i32, int32_t, f64, double);
    if (w == 4) GA(i32, int32_t, f32, float);
    GA(i32, int32_t, f16, uint16_t);
  }
  if (w == 8) GA(i64, int64_t, f64, double);
  if (w == 4) GA(i64, int64_t, f32, float);
  GA(i64, int64_t, f16, uint16_t);
#undef GA
}
