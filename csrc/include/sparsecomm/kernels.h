/*
 * sparsecomm C kernels: the C ABI.
 *
 * Plain C99, no torch, no Python. Every function works on raw buffers and
 * returns an sc_status (0 = success). Floating point values are passed as
 * raw bits: float32 = 32-bit, float64 = 64-bit, float16 / bfloat16 = 16-bit
 * patterns (uint16_t). Indices are int64_t (top-k output) or int32_t/int64_t
 * (COO helpers, see sc_index_t).
 *
 * `nthreads` is the number of OpenMP threads a kernel may use (the caller
 * passes at::get_num_threads(); values < 1 mean 1).
 */
#ifndef SPARSECOMM_KERNELS_H
#define SPARSECOMM_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  SC_F32 = 0,
  SC_F64 = 1,
  SC_F16 = 2,
  SC_BF16 = 3
} sc_dtype;

typedef enum {
  SC_I32 = 0,
  SC_I64 = 1
} sc_index_t;

typedef enum {
  SC_OK = 0,
  SC_ERR_NAN = 1,          /* top-k input contains NaN */
  SC_ERR_NOMEM = 2,        /* allocation failed */
  SC_ERR_ARG = 3,          /* bad argument (dtype, negative size, ...) */
  SC_ERR_INDEX_RANGE = 4,  /* an index is negative or >= the dense size */
  SC_ERR_INDEX_ORDER = 5   /* COO indices not strictly ascending */
} sc_status;

/* Extra information about an index error (which input, which position). */
typedef struct {
  int64_t input;     /* which index vector (0-based) */
  int64_t position;  /* position inside it */
  int64_t value;     /* offending index value */
} sc_error_info;

/* ---------------------------------------------------------------- top-k */

/*
 * Exact top-k by magnitude of x[0..n). Writes m = min(k, n) entries:
 * out_idx ascending (int64), out_vals = x[out_idx] (raw bits, original sign).
 * Ties in |x| are broken by the lower index; +0.0 and -0.0 are equal; Inf is
 * the largest magnitude. Returns SC_ERR_NAN if x contains a NaN (outputs are
 * then unspecified). k < 0 -> SC_ERR_ARG.
 */
int sc_topk(sc_dtype dtype, const void* x, int64_t n, int64_t k, int nthreads,
            void* out_vals, int64_t* out_idx);

/*
 * Testing hook (process-global, not for production use): mode 0 = automatic,
 * 1 = always the exact radix path (no sampling, no small-input shortcut), so
 * tests can exercise it on any input.
 */
void sc_topk_set_path(int mode);

/* Number of entries sc_block_topk writes: sum_b min(k_per_block, len_b). */
int64_t sc_block_topk_count(int64_t n, int64_t num_blocks, int64_t k_per_block);

/*
 * Top-k inside each block b = [b*n/B, (b+1)*n/B) (integer division), B =
 * num_blocks >= 1. Block b contributes min(k_per_block, len_b) entries,
 * concatenated in block order; indices are global and ascending.
 */
int sc_block_topk(sc_dtype dtype, const void* x, int64_t n, int64_t num_blocks,
                  int64_t k_per_block, int nthreads, void* out_vals,
                  int64_t* out_idx);

/* ---------------------------------------------------------------- COO */

/*
 * Check that idx[0..n) is strictly ascending and inside [0, limit)
 * (limit < 0: no upper bound). On failure fills *err (input = 0).
 */
int sc_check_sorted_indices(sc_index_t itype, const void* idx, int64_t n,
                            int64_t limit, int nthreads, sc_error_info* err);

/*
 * Union of two index-sorted COO vectors; values summed where the indices
 * coincide (a + b; half types in float32, rounded once). out_idx / out_val
 * must have room for na + nb entries; *out_n receives the result length.
 * Inputs must be strictly ascending (check with sc_check_sorted_indices).
 */
int sc_merge_add(sc_index_t itype, sc_dtype vtype,
                 const void* idx_a, const void* val_a, int64_t na,
                 const void* idx_b, const void* val_b, int64_t nb,
                 int nthreads, void* out_idx, void* out_val, int64_t* out_n);

/*
 * k-way union of p index-sorted COO vectors. Where several inputs hold the
 * same index the values are summed in list order (input 0 first; half types
 * accumulate in float32 and are rounded once). out arrays need room for
 * sum(lens) entries.
 */
int sc_merge_add_many(sc_index_t itype, sc_dtype vtype, int64_t p,
                      const void* const* idx, const void* const* val,
                      const int64_t* lens, int nthreads, void* out_idx,
                      void* out_val, int64_t* out_n);

/*
 * dense[idx[i]] += val[i] for i = 0..n-1 in order (duplicates add up).
 * Half types: each addition is done in float32 and rounded to the dense
 * dtype. Indices are checked against [0, dense_n) first (nothing is written
 * on failure).
 */
int sc_scatter_add(sc_index_t itype, sc_dtype vtype, void* dense,
                   int64_t dense_n, const void* idx, const void* val,
                   int64_t n, int nthreads, sc_error_info* err);

/* out[i] = dense[idx[i]]; indices checked against [0, dense_n). */
int sc_gather(sc_index_t itype, sc_dtype vtype, const void* dense,
              int64_t dense_n, const void* idx, int64_t n, int nthreads,
              void* out, sc_error_info* err);

/* ------------------------------------------------------- conversions */

/* IEEE binary16 / bfloat16 <-> float32, round-to-nearest-even. */
float sc_f16_to_f32(uint16_t h);
uint16_t sc_f32_to_f16(float f);
float sc_bf16_to_f32(uint16_t h);
uint16_t sc_f32_to_bf16(float f);

#ifdef __cplusplus
}
#endif

#endif /* SPARSECOMM_KERNELS_H */
