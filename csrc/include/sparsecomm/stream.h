/*
 * sparsecomm sparse-stream and QSGD kernels (SparCML: "SparCML: High-Performance
 * Sparse Communication for Machine Learning", section 3 (sparse streams) and
 * section 5 (QSGD in the dense phase)). Conventions: sparsecomm/abi.h.
 *
 * The sparse + sparse and sparse + dense summation cases of a stream are the
 * COO kernels of kernels.h (sc_merge_add, sc_scatter_add): they validate their
 * inputs in full and handle repeated indices, so no second copy lives here.
 */
#ifndef SPARSECOMM_STREAM_H
#define SPARSECOMM_STREAM_H

#include "sparsecomm/abi.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * dense + dense in place: a[i] += b[i], float32 / float64 (vectorized,
 * parallel for large n). a == b (the same buffer) doubles a; a partial overlap
 * of the two ranges is rejected with SC_ERR_OVERLAP before anything is written.
 */
int sc_stream_add_dd(sc_dtype vt, void* a, const void* b, int64_t n, int nthreads,
                     sc_error_info* err);

/*
 * Disjoint ranges: the concatenation of a then b into io / vo (capacity
 * na + nb). Each input must be strictly ascending and every index of a below
 * every index of b: SC_ERR_INDEX_ORDER otherwise (err->input 0 or 1).
 * Any value type of abi.h.
 */
int sc_stream_concat(sc_index_t it, sc_dtype vt, const void* ia, const void* va, int64_t na,
                     const void* ib, const void* vb, int64_t nb, int nthreads, void* io,
                     void* vo, sc_error_info* err);

/*
 * QSGD: quantize x[0..n) (float32 / float64) in buckets of `bucket` elements
 * with s = 2^(bits-1) - 1 levels per sign (bits 4 or 8).
 * scales[b] = max |x| over bucket b, rounded up to float32;
 * q = s + sign(x) * l, l = floor(|x| / scale * s) rounded up with probability
 * equal to the remainder (stochastic rounding, unbiased), so q is in [0, 2s].
 * Packed little end first: bits 8 -> one byte per value, bits 4 -> two values
 * per byte (low nibble first; an odd n leaves the last high nibble 0). packed
 * holds ceil(n * bits / 8) bytes, every byte written. Random numbers:
 * splitmix64 of (seed, element index), so results do not depend on threads.
 * bits 4 needs an even bucket (a byte never straddles two buckets; SC_ERR_ARG).
 * A value no float32 scale can hold (NaN, +-Inf, or a float64 beyond FLT_MAX):
 * SC_ERR_NAN, err input 0, position of the first such element, value 0.
 */
int sc_qsgd_quantize(sc_dtype vt, const void* x, int64_t n, int bits, int64_t bucket,
                     uint64_t seed, uint8_t* packed, float* scales, int nthreads,
                     sc_error_info* err);

/*
 * Inverse: out[i] = (q_i - s) * scales[bucket(i)] / s in the value dtype.
 * packed and scales come from a peer, so they are validated in full first:
 * every level q_i in [0, 2s] (a nibble or byte above 2s), every scale finite
 * and >= 0, and for bits 4 with odd n the unused last nibble 0; otherwise
 * SC_ERR_MALFORMED and nothing is written: err->input 0 = packed (position =
 * byte offset, value = the byte) or 1 = scales (position = bucket, value = the
 * float32 bit pattern). bits 4 with an odd bucket: SC_ERR_ARG (the bucket is the
 * receiver's own parameter).
 */
int sc_qsgd_dequantize(sc_dtype vt, const uint8_t* packed, const float* scales, int64_t n,
                       int bits, int64_t bucket, void* out, int nthreads, sc_error_info* err);

#ifdef __cplusplus
}
#endif

#endif /* SPARSECOMM_STREAM_H */
