/*
 * sparsecomm kernels: top-k selection, COO merges and scatters, half-type
 * conversions. Conventions (status, dtype codes, the trailing error
 * out-parameter, nthreads) are those of sparsecomm/abi.h.
 */
#ifndef SPARSECOMM_KERNELS_H
#define SPARSECOMM_KERNELS_H

#include "sparsecomm/abi.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- top-k */

/*
 * Exact top-k by magnitude of x[0..n). Writes m = min(k, n) entries:
 * out_idx ascending (int64), out_vals = x[out_idx] (raw bits, original sign).
 * Ties in |x| are broken by the lower index; +0.0 and -0.0 are equal; Inf is
 * the largest magnitude. Returns SC_ERR_NAN if x contains a NaN (outputs are
 * then unspecified). k < 0 -> SC_ERR_ARG.
 */
int sc_topk(sc_dtype dtype, const void* x, int64_t n, int64_t k, int nthreads,
            void* out_vals, int64_t* out_idx, sc_error_info* err);

/* Which algorithm sc_topk_path runs: SC_TOPK_AUTO is sc_topk's choice (serial
 * quickselect for small n, sampled threshold + one filtering pass, exact radix
 * fallback); SC_TOPK_RADIX always runs the exact radix path, so tests and
 * benchmarks can exercise it on any input. Same results either way. */
typedef enum { SC_TOPK_AUTO = 0, SC_TOPK_RADIX = 1 } sc_topk_path_t;

int sc_topk_path(sc_topk_path_t path, sc_dtype dtype, const void* x, int64_t n, int64_t k,
                 int nthreads, void* out_vals, int64_t* out_idx, sc_error_info* err);

/*
 * The fast path keeps one set of per-thread candidate buffers between calls
 * (reused by one call at a time; concurrent calls allocate their own). The
 * cache never holds more than SC_TOPK_CACHE_MAX_BYTES: a call that needed more
 * frees its buffers when it ends. sc_topk_release_cache() frees it now (safe
 * to call at any time; a call in progress keeps its buffers) and returns the
 * bytes released; sc_topk_cache_bytes() reports what is held.
 */
#define SC_TOPK_CACHE_MAX_BYTES ((size_t)256 << 20)
size_t sc_topk_release_cache(void);
size_t sc_topk_cache_bytes(void);

/* Number of entries sc_block_topk writes: sum_b min(k_per_block, len_b). */
int64_t sc_block_topk_count(int64_t n, int64_t num_blocks, int64_t k_per_block);

/*
 * Top-k inside each block b = [b*n/B, (b+1)*n/B) (integer division), B =
 * num_blocks >= 1. Block b contributes min(k_per_block, len_b) entries,
 * concatenated in block order; indices are global and ascending.
 */
int sc_block_topk(sc_dtype dtype, const void* x, int64_t n, int64_t num_blocks,
                  int64_t k_per_block, int nthreads, void* out_vals,
                  int64_t* out_idx, sc_error_info* err);

/*
 * The residual add fused with the selection: acc[i] += g[i] for every i (in
 * the value type, round to nearest: the bits of torch's acc.add_(g)), then
 * exactly sc_block_topk of the sums (num_blocks = 1: sc_topk), in one pass
 * over acc and g when the sampled fast path applies (the filter adds 16
 * elements, then tests them). With `clear` the selected positions of acc are
 * then set to +0.0 (what was selected leaves the residual). float32 and
 * float64 only (SC_ERR_ARG otherwise); acc must not share bytes with g or the
 * outputs (SC_ERR_OVERLAP, input 1, 4 or 5). out_vals / out_idx hold
 * sc_block_topk_count(n, num_blocks, k_per_block) entries. On SC_ERR_NAN (a
 * sum is NaN) acc holds the sums and nothing is cleared.
 */
int sc_block_topk_accum(sc_dtype dtype, void* acc, const void* g, int64_t n, int64_t num_blocks,
                        int64_t k_per_block, int clear, int nthreads, void* out_vals,
                        int64_t* out_idx, sc_error_info* err);

/*
 * Whether the fused add + filter pass of sc_block_topk_accum (float32) may use
 * its AVX2 body when the CPU has it (allow = 1, the default) or must use the
 * SSE2 baseline (allow = 0). Both give the same bits; the switch exists so the
 * tests cover both bodies and benchmarks can compare them. Process-wide.
 * Returns 1 if AVX2 is now in use.
 */
int sc_topk_set_avx2(int allow);

/* ---------------------------------------------------------------- COO */

/*
 * Check that idx[0..n) is strictly ascending and inside [0, limit)
 * (limit < 0: no upper bound); one fused O(n) pass, parallel for large n.
 * On failure fills *err (input = 0, the first bad position).
 */
int sc_check_sorted_indices(sc_index_t itype, const void* idx, int64_t n,
                            int64_t limit, int nthreads, sc_error_info* err);

/*
 * Union of two index-sorted COO vectors; values summed where the indices
 * coincide (a + b; half types in float32, rounded once). out_idx / out_val
 * must have room for na + nb entries; *out_n receives the result length.
 * Both inputs are checked to be strictly ascending and inside [0, limit)
 * (limit < 0: no upper bound) before anything is written: SC_ERR_INDEX_ORDER
 * or SC_ERR_INDEX_RANGE with err->input = 0 or 1 otherwise.
 */
int sc_merge_add(sc_index_t itype, sc_dtype vtype,
                 const void* idx_a, const void* val_a, int64_t na,
                 const void* idx_b, const void* val_b, int64_t nb, int64_t limit,
                 int nthreads, void* out_idx, void* out_val, int64_t* out_n,
                 sc_error_info* err);

/*
 * k-way union of p index-sorted COO vectors. Where several inputs hold the
 * same index the values are summed in list order (input 0 first; half types
 * accumulate in float32 and are rounded once). out arrays need room for
 * sum(lens) entries. Every input is checked as in sc_merge_add (err->input =
 * the failing input's position in the list).
 */
int sc_merge_add_many(sc_index_t itype, sc_dtype vtype, int64_t p,
                      const void* const* idx, const void* const* val,
                      const int64_t* lens, int64_t limit, int nthreads, void* out_idx,
                      void* out_val, int64_t* out_n, sc_error_info* err);

/*
 * dense[idx[i]] += val[i] for i = 0..n-1 in order (duplicates add up).
 * Half types: each addition is done in float32 and rounded to the dense
 * dtype. One fused pass first checks every index against [0, dense_n)
 * (nothing is written on failure) and whether the indices are strictly
 * ascending: only then (distinct indices) does the scatter run in parallel;
 * any other order, repeats included, is scattered serially in input order.
 * `val` must not overlap `dense` (SC_ERR_OVERLAP).
 */
int sc_scatter_add(sc_index_t itype, sc_dtype vtype, void* dense,
                   int64_t dense_n, const void* idx, const void* val,
                   int64_t n, int nthreads, sc_error_info* err);

/*
 * dense[idx[i]] = val[i] for i = 0..n-1 in order (a repeated index keeps its
 * last value); with `zero_rest` != 0 every entry of dense not in idx becomes 0
 * (dense is then exactly the COO vector (idx, val) written out). Values are
 * copied as bits. Indices are checked against [0, dense_n) first (nothing is
 * written on failure); strictly ascending indices run in parallel and, with
 * zero_rest, write dense once, chunk by chunk (a chunk zeroed, then its
 * values while its lines are hot), not a memset of all of it and then a
 * scatter. `val` / `idx` must not overlap `dense` (SC_ERR_OVERLAP).
 */
int sc_scatter_set(sc_index_t itype, sc_dtype vtype, void* dense, int64_t dense_n,
               const void* idx, const void* val, int64_t n, int zero_rest, int nthreads,
               sc_error_info* err);

/* out[i] = dense[idx[i]]; indices checked against [0, dense_n); unknown
 * index or value types give SC_ERR_ARG. */
int sc_gather(sc_index_t itype, sc_dtype vtype, const void* dense,
              int64_t dense_n, const void* idx, int64_t n, int nthreads,
              void* out, sc_error_info* err);

/* ------------------------------------------------------- checks */

/* Bits of sc_nonfinite's *flags. */
#define SC_NONFINITE_NAN 1
#define SC_NONFINITE_POS_INF 2
#define SC_NONFINITE_NEG_INF 4

/*
 * *flags = which non-finite values x[0..n) of a floating dtype holds: an OR of
 * SC_NONFINITE_NAN / _POS_INF / _NEG_INF, 0 when every element is finite. One
 * vectorized read of x (no early exit) decides whether anything is there; only
 * then a second pass tells the kinds apart. Other dtypes: SC_ERR_ARG.
 */
int sc_nonfinite(sc_dtype dtype, const void* x, int64_t n, int nthreads, int* flags,
                 sc_error_info* err);

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
