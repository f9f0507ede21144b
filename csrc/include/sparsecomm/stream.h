/*
 * sparsecomm sparse-stream kernels (SparCML section 3) and QSGD packing
 * (section 5): the C ABI. Plain C99; values float32 / float64 (sc_dtype),
 * indices int32 / int64 (sc_index_t). Status codes are those of kernels.h.
 */
#ifndef SPARSECOMM_STREAM_H
#define SPARSECOMM_STREAM_H

#include <stdint.h>

#include "sparsecomm/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * sparse + sparse: merge two strictly ascending COO vectors (same index and
 * value dtypes) into io/vo (capacity na + nb), summing values of equal
 * indices (a + b). *out_count receives the number of entries written.
 * SC_ERR_INDEX_ORDER (e.input 0 or 1) when an input is not strictly ascending.
 */
int sc_stream_add_ss(sc_index_t it, sc_dtype vt, const void* ia, const void* va, int64_t na,
                     const void* ib, const void* vb, int64_t nb, void* io, void* vo,
                     int64_t* out_count, sc_error_info* err);

/* sparse + dense: dense[idx[i]] += val[i]; all indices checked in [0, n) first. */
int sc_stream_add_sd(sc_index_t it, sc_dtype vt, void* dense, int64_t n, const void* idx,
                     const void* val, int64_t count, int nthreads, sc_error_info* err);

/* dense + dense in place: a[i] += b[i] (vectorized). */
int sc_stream_add_dd(sc_dtype vt, void* a, const void* b, int64_t n, int nthreads);

/*
 * Disjoint ranges: concatenation of a then b (every index of a below every
 * index of b, each strictly ascending) into io/vo. SC_ERR_INDEX_ORDER otherwise.
 */
int sc_stream_concat(sc_index_t it, sc_dtype vt, const void* ia, const void* va, int64_t na,
                     const void* ib, const void* vb, int64_t nb, void* io, void* vo,
                     sc_error_info* err);

/*
 * QSGD: quantize x[0..n) in buckets of `bucket` elements with s = 2^(bits-1) - 1
 * levels per sign (bits 4 or 8). scales[b] = max |x| over bucket b (float32);
 * q = s + sign(x) * l, l = floor(|x| / scale * s) rounded up with probability
 * equal to the remainder (stochastic rounding, unbiased), packed little-end
 * first: bits 8 -> one byte per value, bits 4 -> two values per byte (low
 * nibble first). packed holds ceil(n * bits / 8) bytes. Random numbers:
 * splitmix64 of (seed, element index), so the result does not depend on threads.
 */
int sc_qsgd_quantize(sc_dtype vt, const void* x, int64_t n, int bits, int64_t bucket,
                     uint64_t seed, uint8_t* packed, float* scales, int nthreads);

/* Inverse: out[i] = (q_i - s) * scales[bucket(i)] / s, in the value dtype. */
int sc_qsgd_dequantize(sc_dtype vt, const uint8_t* packed, const float* scales, int64_t n,
                       int bits, int64_t bucket, void* out, int nthreads);

#ifdef __cplusplus
}
#endif

#endif
