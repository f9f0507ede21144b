/* Count-Sketch kernels of sparsecomm (C ABI, no torch, no Python).
 *
 * A sketch is a rows x cols table T (row-major, float32 or float64). For row j
 * the bucket and sign of coordinate i come from a 64-bit hash computed on the
 * fly (no rows x N tables):
 *
 *   mix(z)     = splitmix64 finaliser:
 *                z ^= z >> 30; z *= 0xBF58476D1CE4E5B9; z ^= z >> 27;
 *                z *= 0x94D049BB133111EB; z ^= z >> 31
 *   key_j      = mix(seed + 0x9E3779B97F4A7C15 * (j + 1))      (mod 2^64)
 *   h          = mix(key_j ^ i)
 *   bucket_j(i)= ((h >> 32) * cols) >> 32                        (Lemire range reduction)
 *   sign_j(i)  = +1 if (h & 1) == 0 else -1
 *
 * build:    T[j][bucket_j(i)] += sign_j(i) * x[i], in increasing i for every row
 *           (so the result does not depend on the thread count);
 * estimate: est(i) = median over j of sign_j(i) * T[j][bucket_j(i)]
 *           (mean of the two middle values when rows is even).
 * Accumulation happens in the table dtype.
 */
#ifndef SPARSECOMM_SKETCH_H
#define SPARSECOMM_SKETCH_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SC_SKETCH_MAX_ROWS 64

/* dtype codes: 0 = float32, 1 = float64 (for both table and values). */
enum { SC_SK_F32 = 0, SC_SK_F64 = 1 };

/* Add the sketch of the dense vector x[0..n) into table (rows x cols). */
int sc_sketch_build_dense(int table_dtype, void* table, int64_t rows, int64_t cols, uint64_t seed,
                          int x_dtype, const void* x, int64_t n, int nthreads);

/* Add the sketch of the COO vector (idx[0..m) int64, val[0..m)) into table. */
int sc_sketch_build_coo(int table_dtype, void* table, int64_t rows, int64_t cols, uint64_t seed,
                        const int64_t* idx, int val_dtype, const void* val, int64_t m, int nthreads);

/* out[t] = estimate of coordinate idx[t] (idx == NULL: coordinates 0..m). out has the table dtype. */
int sc_sketch_estimate(int table_dtype, const void* table, int64_t rows, int64_t cols, uint64_t seed,
                       const int64_t* idx, int64_t m, void* out, int nthreads);

#ifdef __cplusplus
}
#endif
#endif
