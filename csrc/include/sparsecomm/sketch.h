/* Count-Sketch kernels of sparsecomm (gs-SGD: "Communication-Efficient Distributed
 * SGD with Sketching", the sketch of section 3). Conventions: sparsecomm/abi.h.
 *
 * A sketch is a rows x cols table T (row-major, float32 or float64). Coordinates
 * come in runs of SC_SKETCH_RUN = 16 consecutive ones (run r = i / 16, offset
 * o = i % 16); for row j one 64-bit hash of the run, computed on the fly (no
 * rows x N tables), gives the buckets and signs of all 16:
 *
 *   mix(z)     = splitmix64 finaliser:
 *                z ^= z >> 30; z *= 0xBF58476D1CE4E5B9; z ^= z >> 27;
 *                z *= 0x94D049BB133111EB; z ^= z >> 31
 *   key_j      = mix(seed + 0x9E3779B97F4A7C15 * (j + 1))      (mod 2^64)
 *   h          = mix(key_j ^ r)
 *   base_j(r)  = ((h >> 32) * cols) >> 32                        (Lemire range reduction)
 *   bucket_j(i)= (base_j(r) + o) mod cols
 *   sign_j(i)  = +1 if bit o of h is 0 else -1
 *
 * So a run occupies 16 consecutive buckets (wrapping at the row end): one vector
 * access instead of 16 random ones. Two coordinates of different runs still collide
 * with probability 1/cols (the offsets of two runs are independent and uniform), two
 * of the same run never (when cols >= 16), and signs are independent bits.
 *
 * build:    T[j][bucket_j(i)] += sign_j(i) * x[i], in increasing i for every row
 *           (so the result does not depend on the thread count);
 * estimate: est(i) = median over j of sign_j(i) * T[j][bucket_j(i)]
 *           (mean of the two middle values when rows is even).
 * Accumulation happens in the table dtype.
 */
#ifndef SPARSECOMM_SKETCH_H
#define SPARSECOMM_SKETCH_H

#include "sparsecomm/abi.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SC_SKETCH_MAX_ROWS 64
#define SC_SKETCH_RUN 16 /* coordinates per run (part of the hash family) */

/* Table and value dtypes: SC_F32 or SC_F64 (others: SC_ERR_ARG). rows in
 * [1, SC_SKETCH_MAX_ROWS], cols in [1, 2^32 - 1] (else SC_ERR_ARG, err->input 0
 * = rows, 1 = cols). Workspace allocation failure: SC_ERR_NOMEM. */

/* Add the sketch of the dense vector x[0..n) into table (rows x cols). */
int sc_sketch_build_dense(sc_dtype table_dtype, void* table, int64_t rows, int64_t cols,
                          uint64_t seed, sc_dtype x_dtype, const void* x, int64_t n,
                          int nthreads, sc_error_info* err);

/* Add the sketch of the COO vector (idx[0..m) int64, val[0..m)) into table.
 * Indices must lie in [0, n) (SC_ERR_INDEX_RANGE, nothing written); any order,
 * repeats add up in input order. */
int sc_sketch_build_coo(sc_dtype table_dtype, void* table, int64_t rows, int64_t cols,
                        uint64_t seed, int64_t n, const int64_t* idx, sc_dtype val_dtype,
                        const void* val, int64_t m, int nthreads, sc_error_info* err);

/* out[t] = estimate of coordinate idx[t] (idx == NULL: coordinates 0..m).
 * out has the table dtype. Indices must be >= 0 (SC_ERR_INDEX_RANGE). */
int sc_sketch_estimate(sc_dtype table_dtype, const void* table, int64_t rows, int64_t cols,
                       uint64_t seed, const int64_t* idx, int64_t m, void* out, int nthreads,
                       sc_error_info* err);

#ifdef __cplusplus
}
#endif
#endif
