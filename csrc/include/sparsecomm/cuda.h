/*
 * sparsecomm CUDA kernels (the .cu files of csrc/cuda): the ops of kernels.h, stream.h, sketch.h and zen.h on
 * device memory, with the same contracts and the same results bit for bit (tests/
 * test_cuda.py compares every op with the CPU kernel). Conventions of sparsecomm/abi.h,
 * plus:
 *
 *   - every pointer argument except `out_n`-style host results and `err` is device memory
 *     of the current device;
 *   - `stream` (a cudaStream_t; NULL = the legacy default stream) orders all the work;
 *     scratch memory comes from cudaMallocAsync on it (the device's stream-ordered pool)
 *     and is freed on it before returning;
 *   - a kernel that validates data (NaN, index order and range, wire fields) or returns a
 *     data-dependent size synchronizes the stream once to read the verdict, so the status
 *     it returns is final; the others only enqueue work and return SC_OK (or SC_ERR_ARG /
 *     SC_ERR_OVERLAP found from their arguments alone);
 *   - a CUDA runtime failure (launch, allocation) is SC_ERR_NOMEM for allocations and
 *     SC_ERR_ARG otherwise, with err->value = the cudaError_t code.
 *
 * No torch and no C++ in the interface: the bindings (csrc/ops_cuda.cpp) pass the current
 * torch stream and raw pointers, and `make cuda-check` compiles these files with nvcc alone.
 */
#ifndef SPARSECOMM_CUDA_H
#define SPARSECOMM_CUDA_H

#include "sparsecomm/abi.h"

#ifdef __cplusplus
extern "C" {
#endif

/* cudaStream_t without including the CUDA headers (it is `struct CUstream_st*`). */
typedef struct CUstream_st* sc_stream_t;

/* ---------------------------------------------------------------- top-k (kernels.h) */

/* sc_topk: exact top-k by |x| (radix select on the magnitude bit patterns, 8 bits per pass,
 * then a stable compaction: ties to the lower index, indices ascending); NaN -> SC_ERR_NAN
 * with err->position the first NaN. */
int sc_cuda_topk(sc_dtype dtype, const void* x, int64_t n, int64_t k, void* out_vals,
                 int64_t* out_idx, sc_stream_t stream, sc_error_info* err);

/* sc_block_topk: blocks [b n / B, (b+1) n / B); writes sc_block_topk_count(n, B, k) entries. */
int sc_cuda_block_topk(sc_dtype dtype, const void* x, int64_t n, int64_t num_blocks,
                       int64_t k_per_block, void* out_vals, int64_t* out_idx, sc_stream_t stream,
                       sc_error_info* err);

/* ---------------------------------------------------------------- COO (kernels.h) */

/* sc_merge_add_many: idx[p] / val[p] are device pointers held in HOST arrays of length p;
 * *out_n (host) receives the result length. Sums in list order, half types in float32. */
int sc_cuda_merge_add_many(sc_index_t itype, sc_dtype vtype, int64_t p, const void* const* idx,
                           const void* const* val, const int64_t* lens, int64_t limit,
                           void* out_idx, void* out_val, int64_t* out_n, sc_stream_t stream,
                           sc_error_info* err);

/* sc_scatter_add: strictly ascending indices scatter in parallel; any other order (repeats)
 * is summed per target in input order (a stable sort by index, then one sequential fold per
 * target), so results equal the CPU kernel's. */
int sc_cuda_scatter_add(sc_index_t itype, sc_dtype vtype, void* dense, int64_t dense_n,
                        const void* idx, const void* val, int64_t n, sc_stream_t stream,
                        sc_error_info* err);

int sc_cuda_gather(sc_index_t itype, sc_dtype vtype, const void* dense, int64_t dense_n,
                   const void* idx, int64_t n, void* out, sc_stream_t stream, sc_error_info* err);

/* ---------------------------------------------------------------- streams, QSGD (stream.h) */

int sc_cuda_stream_add_dd(sc_dtype vt, void* a, const void* b, int64_t n, sc_stream_t stream,
                          sc_error_info* err);

int sc_cuda_stream_concat(sc_index_t it, sc_dtype vt, const void* ia, const void* va, int64_t na,
                          const void* ib, const void* vb, int64_t nb, void* io, void* vo,
                          sc_stream_t stream, sc_error_info* err);

int sc_cuda_qsgd_quantize(sc_dtype vt, const void* x, int64_t n, int bits, int64_t bucket,
                          uint64_t seed, uint8_t* packed, float* scales, sc_stream_t stream,
                          sc_error_info* err);

int sc_cuda_qsgd_dequantize(sc_dtype vt, const uint8_t* packed, const float* scales, int64_t n,
                            int bits, int64_t bucket, void* out, sc_stream_t stream,
                            sc_error_info* err);

/* ---------------------------------------------------------------- Count-Sketch (sketch.h) */

/* Builds: per row, a stable sort of the coordinates by bucket, then one sequential fold per
 * bucket in index (dense) or input (COO) order: the CPU kernel's summation order. idx is
 * int64 (device). */
int sc_cuda_sketch_build_dense(sc_dtype table_dtype, void* table, int64_t rows, int64_t cols,
                               uint64_t seed, sc_dtype x_dtype, const void* x, int64_t n,
                               sc_stream_t stream, sc_error_info* err);

int sc_cuda_sketch_build_coo(sc_dtype table_dtype, void* table, int64_t rows, int64_t cols,
                             uint64_t seed, int64_t n, const int64_t* idx, sc_dtype val_dtype,
                             const void* val, int64_t m, sc_stream_t stream, sc_error_info* err);

/* idx == NULL: coordinates 0..m. Medians by the CPU kernel's networks (3, 5, 7 rows) or
 * insertion sort, so even the sign of a zero estimate matches. */
int sc_cuda_sketch_estimate(sc_dtype table_dtype, const void* table, int64_t rows, int64_t cols,
                            uint64_t seed, const int64_t* idx, int64_t m, void* out,
                            sc_stream_t stream, sc_error_info* err);

/* ---------------------------------------------------------------- ZEN (zen.h) */

/* sc_zen_partition: the owner of every pair (sc_zen_block_owner), a stable radix sort by owner,
 * a gather; counts (device, parts entries) from the sorted owners. */
int sc_cuda_zen_partition(sc_dtype vtype, const int64_t* idx, const void* val, int64_t m, int64_t n,
                          int64_t parts, uint64_t seed, int64_t block, int64_t* out_idx, void* out_val,
                          int64_t* counts, sc_stream_t stream, sc_error_info* err);

/* sc_zen_class_size; *size (host) receives it. */
int sc_cuda_zen_class_size(int64_t n, int64_t parts, uint64_t seed, int64_t block, int64_t owner,
                           int64_t* size, sc_stream_t stream, sc_error_info* err);

/* sc_zen_bitmap_encode: the owner's blocks selected by one owner test each, every index's class
 * position by a binary search among them, one thread per bitmap byte that holds a bit. */
int sc_cuda_zen_bitmap_encode(const int64_t* idx, int64_t m, int64_t n, int64_t parts, uint64_t seed,
                              int64_t block, int64_t owner, uint8_t* bitmap, int64_t nbytes,
                              sc_stream_t stream, sc_error_info* err);

/* sc_zen_bitmap_decode, validated as on the CPU; *count (host) receives the number of set bits
 * (out_idx NULL: only counts). */
int sc_cuda_zen_bitmap_decode(const uint8_t* bitmap, int64_t nbytes, int64_t n, int64_t parts,
                              uint64_t seed, int64_t block, int64_t owner, int64_t* out_idx, int64_t cap,
                              int64_t* count, sc_stream_t stream, sc_error_info* err);

#ifdef __cplusplus
}
#endif

#endif /* SPARSECOMM_CUDA_H */
