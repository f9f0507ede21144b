/* COO kernels: index checks, merge_add, merge_add_many, scatter_add, scatter, gather.
 * Contract: csrc/include/sparsecomm/kernels.h. Type-generic bodies live in
 * coo_index_impl.h (per index type) and coo_impl.h (per index x value type). */
#include <stdlib.h>
#include <string.h>

#include "sparsecomm/kernels.h"
#include "common.h"

static inline float ld_f16(uint16_t h) { return sc_f16_bits_to_f32(h); }
static inline uint16_t st_f16(float f) { return sc_f32_to_f16_bits(f); }
static inline float ld_bf16(uint16_t h) { return sc_bf16_bits_to_f32(h); }
static inline uint16_t st_bf16(float f) { return sc_f32_to_bf16_bits(f); }

#define ISFX i32
#define IT int32_t
#include "coo_index_impl.h"
#include "coo_value_types.h"
#undef ISFX
#undef IT

#define ISFX i64
#define IT int64_t
#include "coo_index_impl.h"
#include "coo_value_types.h"
#undef ISFX
#undef IT

/* ------------------------------------------------------------ checks */

static int scan_indices(sc_index_t itype, const void* idx, int64_t n, int64_t limit, int nt,
                        int64_t* bad_range, int64_t* bad_order) {
  if (itype == SC_I32) scan_i32((const int32_t*)idx, n, limit, nt, bad_range, bad_order);
  else if (itype == SC_I64) scan_i64((const int64_t*)idx, n, limit, nt, bad_range, bad_order);
  else return SC_ERR_ARG;
  return SC_OK;
}

static int64_t index_at(sc_index_t itype, const void* idx, int64_t i) {
  return itype == SC_I32 ? (int64_t)((const int32_t*)idx)[i] : ((const int64_t*)idx)[i];
}

/* Strictly ascending and inside [0, limit): the first violation of either kind. */
static int check_sorted(sc_index_t itype, const void* idx, int64_t n, int64_t limit, int nt,
                        int64_t input, sc_error_info* err) {
  int64_t br, bo;
  if (n < 0) return sc_fail(err, SC_ERR_ARG, input, 0, n);
  if (scan_indices(itype, idx, n, limit, nt, &br, &bo)) return sc_fail(err, SC_ERR_ARG, input, 0, itype);
  if (bo < br) return sc_fail(err, SC_ERR_INDEX_ORDER, input, bo, index_at(itype, idx, bo));
  if (br != INT64_MAX) return sc_fail(err, SC_ERR_INDEX_RANGE, input, br, index_at(itype, idx, br));
  return SC_OK;
}

int sc_check_sorted_indices(sc_index_t itype, const void* idx, int64_t n,
                            int64_t limit, int nthreads, sc_error_info* err) {
  return check_sorted(itype, idx, n, limit, sc_clamp_threads(nthreads), 0, err);
}

/* [a, a + an) and [b, b + bn) share a byte */
static int overlaps(const void* a, size_t an, const void* b, size_t bn) {
  const char *x = (const char*)a, *y = (const char*)b;
  return an && bn && x < y + bn && y < x + an;
}

/* ------------------------------------------------------------ dispatch */

/* The (index type, value type) instance of each kernel (coo_impl.h's *_any). Assigning
 * and gathering copy bits: they dispatch on the value width only. */
typedef int (*merge_many_fn)(int64_t, const void* const*, const void* const*, const int64_t*, int,
                             void*, void*, int64_t*);
typedef void (*scatter_add_fn)(void*, const void*, const void*, int64_t, int);
typedef void (*scatter_set_fn)(void*, int64_t, const void*, const void*, int64_t, int, int, int);
typedef void (*gather_fn)(const void*, const void*, int64_t, int, void*);

static merge_many_fn merge_many_for(sc_index_t itype, sc_dtype vtype) {
  const int i32 = itype == SC_I32;
  switch (vtype) {
    case SC_F32: return i32 ? merge_many_any_i32_f32 : merge_many_any_i64_f32;
    case SC_F64: return i32 ? merge_many_any_i32_f64 : merge_many_any_i64_f64;
    case SC_F16: return i32 ? merge_many_any_i32_f16 : merge_many_any_i64_f16;
    case SC_BF16: return i32 ? merge_many_any_i32_bf16 : merge_many_any_i64_bf16;
    default: return NULL;
  }
}

static scatter_add_fn scatter_add_for(sc_index_t itype, sc_dtype vtype) {
  const int i32 = itype == SC_I32;
  switch (vtype) {
    case SC_F32: return i32 ? scatter_add_any_i32_f32 : scatter_add_any_i64_f32;
    case SC_F64: return i32 ? scatter_add_any_i32_f64 : scatter_add_any_i64_f64;
    case SC_F16: return i32 ? scatter_add_any_i32_f16 : scatter_add_any_i64_f16;
    case SC_BF16: return i32 ? scatter_add_any_i32_bf16 : scatter_add_any_i64_bf16;
    default: return NULL;
  }
}

/* ------------------------------------------------------------ merges */

int sc_merge_add_many(sc_index_t itype, sc_dtype vtype, int64_t p,
                      const void* const* idx, const void* const* val,
                      const int64_t* lens, int64_t limit, int nthreads, void* out_idx,
                      void* out_val, int64_t* out_n, sc_error_info* err) {
  const int nt = sc_clamp_threads(nthreads);
  *out_n = 0;
  if (p < 0) return sc_fail(err, SC_ERR_ARG, 0, 0, p);
  if (!sc_index_size(itype)) return sc_fail(err, SC_ERR_ARG, 0, 0, itype);
  if (vtype == SC_U8 || !sc_dtype_size(vtype)) return sc_fail(err, SC_ERR_ARG, 0, 0, vtype);
  /* inputs come from peers: order and range in full before the merge reads them */
  for (int64_t q = 0; q < p; q++) {
    int st = check_sorted(itype, idx[q], lens[q], limit, nt, q, err);
    if (st) return st;
  }
  if (p == 0) return SC_OK;
  merge_many_fn merge = merge_many_for(itype, vtype);
  int st = merge ? merge(p, idx, val, lens, nt, out_idx, out_val, out_n) : SC_ERR_ARG;
  return st ? sc_fail(err, st, 0, 0, 0) : SC_OK;
}

int sc_merge_add(sc_index_t itype, sc_dtype vtype,
                 const void* idx_a, const void* val_a, int64_t na,
                 const void* idx_b, const void* val_b, int64_t nb, int64_t limit,
                 int nthreads, void* out_idx, void* out_val, int64_t* out_n,
                 sc_error_info* err) {
  const void* idx[2] = {idx_a, idx_b};
  const void* val[2] = {val_a, val_b};
  int64_t lens[2] = {na, nb};
  return sc_merge_add_many(itype, vtype, 2, idx, val, lens, limit, nthreads, out_idx, out_val,
                           out_n, err);
}

/* ------------------------------------------------------------ scatter / gather */

/* The arguments of a scatter into dense, checked before anything is written: sizes,
 * types, no shared bytes (writing dense while reading idx or val from the same bytes
 * would change them mid-way), every index in [0, dense_n); *ascending: strictly. */
static int check_scatter(sc_index_t itype, sc_dtype vtype, const void* dense, int64_t dense_n,
                         const void* idx, const void* val, int64_t n, int nt, int* ascending,
                         sc_error_info* err) {
  if (n < 0) return sc_fail(err, SC_ERR_ARG, 1, 0, n);
  if (dense_n < 0) return sc_fail(err, SC_ERR_ARG, 0, 0, dense_n);
  const size_t vs = sc_dtype_size(vtype), is = sc_index_size(itype);
  if (vtype == SC_U8 || !vs) return sc_fail(err, SC_ERR_ARG, 0, 0, vtype);
  if (!is) return sc_fail(err, SC_ERR_ARG, 1, 0, itype);
  if (overlaps(dense, (size_t)dense_n * vs, val, (size_t)n * vs))
    return sc_fail(err, SC_ERR_OVERLAP, 2, 0, 0);
  if (overlaps(dense, (size_t)dense_n * vs, idx, (size_t)n * is))
    return sc_fail(err, SC_ERR_OVERLAP, 1, 0, 0);
  int64_t br, bo;
  scan_indices(itype, idx, n, dense_n, nt, &br, &bo);
  if (br != INT64_MAX) return sc_fail(err, SC_ERR_INDEX_RANGE, 1, br, index_at(itype, idx, br));
  *ascending = bo == INT64_MAX;
  return SC_OK;
}

int sc_scatter_add(sc_index_t itype, sc_dtype vtype, void* dense,
                   int64_t dense_n, const void* idx, const void* val,
                   int64_t n, int nthreads, sc_error_info* err) {
  const int nt = sc_clamp_threads(nthreads);
  int ascending;
  int st = check_scatter(itype, vtype, dense, dense_n, idx, val, n, nt, &ascending, err);
  if (st) return st;
  /* strictly ascending indices are distinct: the scatter may run in parallel;
     any other order (repeats included) runs serially in input order */
  const int pnt = ascending && n > 65536 ? nt : 1;
  scatter_add_fn scatter = scatter_add_for(itype, vtype);
  if (scatter) scatter(dense, idx, val, n, pnt);
  return SC_OK;
}

int sc_scatter_set(sc_index_t itype, sc_dtype vtype, void* dense, int64_t dense_n,
               const void* idx, const void* val, int64_t n, int zero_rest, int nthreads,
               sc_error_info* err) {
  const int nt = sc_clamp_threads(nthreads);
  int ascending;
  int st = check_scatter(itype, vtype, dense, dense_n, idx, val, n, nt, &ascending, err);
  if (st) return st;
  const size_t w = sc_dtype_size(vtype);
  /* parallel only over distinct entries; the zeroing pass splits dense itself */
  const int pnt = ascending ? nt : 1;
  scatter_set_fn assign = itype == SC_I32 ? (w == 8   ? scatter_set_any_i32_f64
                                             : w == 4 ? scatter_set_any_i32_f32
                                                      : scatter_set_any_i32_f16)
                                          : (w == 8   ? scatter_set_any_i64_f64
                                             : w == 4 ? scatter_set_any_i64_f32
                                                      : scatter_set_any_i64_f16);
  assign(dense, dense_n, idx, val, n, zero_rest != 0, ascending, pnt);
  return SC_OK;
}

int sc_gather(sc_index_t itype, sc_dtype vtype, const void* dense,
              int64_t dense_n, const void* idx, int64_t n, int nthreads,
              void* out, sc_error_info* err) {
  const int nt = sc_clamp_threads(nthreads);
  if (n < 0) return sc_fail(err, SC_ERR_ARG, 1, 0, n);
  if (dense_n < 0) return sc_fail(err, SC_ERR_ARG, 0, 0, dense_n);
  const size_t w = sc_dtype_size(vtype);
  if (vtype == SC_U8 || !w) return sc_fail(err, SC_ERR_ARG, 0, 0, vtype);
  if (!sc_index_size(itype)) return sc_fail(err, SC_ERR_ARG, 1, 0, itype);
  int64_t br, bo;
  scan_indices(itype, idx, n, dense_n, nt, &br, &bo);
  if (br != INT64_MAX) return sc_fail(err, SC_ERR_INDEX_RANGE, 1, br, index_at(itype, idx, br));
  gather_fn gather = itype == SC_I32 ? (w == 8   ? gather_any_i32_f64
                                       : w == 4 ? gather_any_i32_f32
                                                : gather_any_i32_f16)
                                    : (w == 8   ? gather_any_i64_f64
                                       : w == 4 ? gather_any_i64_f32
                                                : gather_any_i64_f16);
  gather(dense, idx, n, nt, out);
  return SC_OK;
}
