// Count-Sketch kernels on the GPU (contract: sparsecomm/cuda.h; hash family and semantics:
// sketch.h), with the CPU kernels' results bit for bit.
//
// Builds: the CPU adds every row's terms to each bucket in increasing index (dense) or
// input (COO) order, and float sums depend on that order; so per row the coordinates are
// stably sorted by bucket (CUB radix sort on the bucket number), then one thread per
// non-empty bucket folds its terms in that order into the table entry. Signs multiply by
// +-1 (exact); a COO zero value is skipped, a dense zero adds +-0, as on the CPU.
// Estimates: one thread per coordinate, the rows' signed entries, then the CPU kernel's
// median: the same compare-exchange networks for 3, 5 and 7 rows, insertion sort
// otherwise, so even which zero (+0 or -0) a median returns is the same.
#include <cub/cub.cuh>

#include "common.cuh"
#include "sparsecomm/sketch.h"

namespace {

using namespace sc_cuda;

constexpr uint64_t kRun = SC_SKETCH_RUN;

__device__ inline uint32_t sk_bucket(uint64_t key, uint64_t i, uint64_t cols, int* sign_bit) {
  uint64_t h = sc_sketch_hash(key, i / kRun), o = i % kRun;
  uint64_t q = sc_sketch_base(h, cols) + o;
  *sign_bit = (int)((h >> o) & 1);
  return (uint32_t)(q < cols ? q : (cols >= kRun ? q - cols : q % cols));
}

struct Keys {
  uint64_t k[SC_SKETCH_MAX_ROWS];
};

// bucket of every coordinate in one row (idx == NULL: coordinate = position)
__global__ void row_buckets(uint64_t key, uint64_t cols, const int64_t* idx, int64_t m, uint32_t* bucket,
                            int64_t* pos) {
  for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < m; t += (int64_t)gridDim.x * blockDim.x) {
    int sign;
    bucket[t] = sk_bucket(key, idx ? (uint64_t)idx[t] : (uint64_t)t, cols, &sign);
    pos[t] = t;
  }
}

template <typename TT, typename XT>
__global__ void fold_buckets(TT* trow, uint64_t key, uint64_t cols, const int64_t* idx, const XT* val, int64_t m,
                             const uint32_t* bucket, const int64_t* order, bool skip_zero) {
  for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < m; t += (int64_t)gridDim.x * blockDim.x) {
    if (t > 0 && bucket[t] == bucket[t - 1]) continue;
    const uint32_t b = bucket[t];
    TT acc = trow[b];
    for (int64_t u = t; u < m && bucket[u] == b; ++u) {
      const int64_t p = order[u];
      const XT v = val[p];
      if (skip_zero && v == 0) continue;
      int sign;
      sk_bucket(key, idx ? (uint64_t)idx[p] : (uint64_t)p, cols, &sign);
      acc += (TT)v * (TT)(1 - 2 * sign);
    }
    trow[b] = acc;
  }
}

template <typename TT, typename XT>
int build(TT* table, int64_t rows, int64_t cols, uint64_t seed, const int64_t* idx, const XT* val, int64_t m,
          cudaStream_t s, sc_error_info* err) {
  if (m == 0) return SC_OK;
  Scratch scratch(s);
  SC_SCRATCH(bucket, uint32_t, scratch, m);
  SC_SCRATCH(bucket_sorted, uint32_t, scratch, m);
  SC_SCRATCH(pos, int64_t, scratch, m);
  SC_SCRATCH(pos_sorted, int64_t, scratch, m);
  int end_bit = 1;
  while (end_bit < 32 && (uint64_t)(cols - 1) >> end_bit) ++end_bit;
  size_t temp_bytes = 0;
  SC_CUDA_TRY(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, bucket, bucket_sorted, pos, pos_sorted, m, 0,
                                              end_bit, s));
  SC_SCRATCH(temp, unsigned char, scratch, temp_bytes);
  for (int64_t j = 0; j < rows; ++j) {
    const uint64_t key = sc_sketch_key(seed, j);
    row_buckets<<<grid_for(m), kThreads, 0, s>>>(key, (uint64_t)cols, idx, m, bucket, pos);
    SC_CUDA_LAUNCHED();
    SC_CUDA_TRY(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, bucket, bucket_sorted, pos, pos_sorted, m, 0,
                                                end_bit, s));
    fold_buckets<TT, XT><<<grid_for(m), kThreads, 0, s>>>(table + j * cols, key, (uint64_t)cols, idx, val, m,
                                                          bucket_sorted, pos_sorted, idx != nullptr);
    SC_CUDA_LAUNCHED();
  }
  SC_CUDA_TRY(cudaStreamSynchronize(s));  // the status is final when the build is done
  return SC_OK;
}

template <typename T>
__device__ inline void sk_ce(T& a, T& b) {
  T lo = a < b ? a : b;
  T hi = a < b ? b : a;
  a = lo;
  b = hi;
}

template <typename TT>
__global__ void estimate_kernel(const TT* table, int64_t rows, uint64_t cols, Keys keys, const int64_t* idx,
                                int64_t m, TT* out) {
  for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < m; t += (int64_t)gridDim.x * blockDim.x) {
    const uint64_t i = idx ? (uint64_t)idx[t] : (uint64_t)t;
    TT e[SC_SKETCH_MAX_ROWS];
    for (int64_t j = 0; j < rows; ++j) {
      int sign;
      uint32_t b = sk_bucket(keys.k[j], i, cols, &sign);
      e[j] = table[j * cols + b] * (TT)(1 - 2 * sign);
    }
    TT r;
    if (rows == 1) {
      r = e[0];
    } else if (rows == 3) {
      TT a0 = e[0], a1 = e[1], a2 = e[2];
      sk_ce(a0, a1); sk_ce(a1, a2); sk_ce(a0, a1);
      r = a1;
    } else if (rows == 5) {
      TT a0 = e[0], a1 = e[1], a2 = e[2], a3 = e[3], a4 = e[4];
      sk_ce(a0, a3); sk_ce(a1, a4);
      sk_ce(a0, a2); sk_ce(a1, a3);
      sk_ce(a0, a1); sk_ce(a2, a4);
      sk_ce(a1, a2); sk_ce(a3, a4);
      sk_ce(a2, a3);
      r = a2;
    } else if (rows == 7) {
      TT a0 = e[0], a1 = e[1], a2 = e[2], a3 = e[3], a4 = e[4], a5 = e[5], a6 = e[6];
      sk_ce(a0, a6); sk_ce(a2, a3); sk_ce(a4, a5);
      sk_ce(a0, a2); sk_ce(a1, a4); sk_ce(a3, a6);
      sk_ce(a0, a1); sk_ce(a2, a5); sk_ce(a3, a4);
      sk_ce(a1, a2); sk_ce(a4, a6);
      sk_ce(a2, a3); sk_ce(a4, a5);
      sk_ce(a1, a2); sk_ce(a3, a4); sk_ce(a5, a6);
      r = a3;
    } else {  // insertion sort, then the middle (mean of the two middle values when even)
      for (int64_t p = 1; p < rows; ++p) {
        TT v = e[p];
        int64_t q = p - 1;
        while (q >= 0 && e[q] > v) {
          e[q + 1] = e[q];
          --q;
        }
        e[q + 1] = v;
      }
      r = (rows & 1) ? e[rows / 2] : (TT)((e[rows / 2 - 1] + e[rows / 2]) / (TT)2);
    }
    out[t] = r;
  }
}

struct NegativeAt {
  const int64_t* idx;
  __device__ bool operator()(int64_t i) const { return idx[i] < 0; }
};

int check_shape(sc_dtype tt, int64_t rows, int64_t cols, sc_error_info* err) {
  if (rows < 1 || rows > SC_SKETCH_MAX_ROWS) return fail(err, SC_ERR_ARG, 0, 0, rows);
  if (cols < 1 || cols > 0xFFFFFFFFll) return fail(err, SC_ERR_ARG, 1, 0, cols);
  if (tt != SC_F32 && tt != SC_F64) return fail(err, SC_ERR_ARG, 0, 0, tt);
  return SC_OK;
}

template <typename XT>
int build_typed(sc_dtype tt, void* table, int64_t rows, int64_t cols, uint64_t seed, const int64_t* idx,
                const XT* val, int64_t m, cudaStream_t s, sc_error_info* err) {
  if (tt == SC_F32) return build<float, XT>((float*)table, rows, cols, seed, idx, val, m, s, err);
  return build<double, XT>((double*)table, rows, cols, seed, idx, val, m, s, err);
}

}  // namespace

extern "C" int sc_cuda_sketch_build_dense(sc_dtype table_dtype, void* table, int64_t rows, int64_t cols,
                                          uint64_t seed, sc_dtype x_dtype, const void* x, int64_t n,
                                          sc_stream_t stream, sc_error_info* err) {
  int st = check_shape(table_dtype, rows, cols, err);
  if (st) return st;
  if (n < 0) return fail(err, SC_ERR_ARG, 2, 0, n);
  cudaStream_t s = (cudaStream_t)stream;
  if (x_dtype == SC_F32) return build_typed(table_dtype, table, rows, cols, seed, nullptr, (const float*)x, n, s, err);
  if (x_dtype == SC_F64) return build_typed(table_dtype, table, rows, cols, seed, nullptr, (const double*)x, n, s, err);
  return fail(err, SC_ERR_ARG, 2, 0, x_dtype);
}

extern "C" int sc_cuda_sketch_build_coo(sc_dtype table_dtype, void* table, int64_t rows, int64_t cols,
                                        uint64_t seed, int64_t n, const int64_t* idx, sc_dtype val_dtype,
                                        const void* val, int64_t m, sc_stream_t stream, sc_error_info* err) {
  int st = check_shape(table_dtype, rows, cols, err);
  if (st) return st;
  if (n < 0 || m < 0) return fail(err, SC_ERR_ARG, 1, 0, n < 0 ? n : m);
  if (val_dtype != SC_F32 && val_dtype != SC_F64) return fail(err, SC_ERR_ARG, 2, 0, val_dtype);
  cudaStream_t s = (cudaStream_t)stream;
  if (m) {  // every index in [0, n) before the table is written
    Scratch scratch(s);
    SC_SCRATCH(slot, unsigned long long, scratch, 1);
    cudaError_t e;
    int64_t bad = first_bad(m, RangeBad<int64_t>{idx, n}, slot, s, &e);
    if (bad == -2) return cuda_fail(err, e);
    if (bad >= 0) return fail(err, SC_ERR_INDEX_RANGE, 1, bad, read_back(idx, bad, s));
  }
  if (val_dtype == SC_F32) return build_typed(table_dtype, table, rows, cols, seed, idx, (const float*)val, m, s, err);
  return build_typed(table_dtype, table, rows, cols, seed, idx, (const double*)val, m, s, err);
}

extern "C" int sc_cuda_sketch_estimate(sc_dtype table_dtype, const void* table, int64_t rows, int64_t cols,
                                       uint64_t seed, const int64_t* idx, int64_t m, void* out, sc_stream_t stream,
                                       sc_error_info* err) {
  int st = check_shape(table_dtype, rows, cols, err);
  if (st) return st;
  if (m < 0) return fail(err, SC_ERR_ARG, 1, 0, m);
  if (m == 0) return SC_OK;
  cudaStream_t s = (cudaStream_t)stream;
  if (idx) {
    Scratch scratch(s);
    SC_SCRATCH(slot, unsigned long long, scratch, 1);
    cudaError_t e;
    int64_t bad = first_bad(m, NegativeAt{idx}, slot, s, &e);
    if (bad == -2) return cuda_fail(err, e);
    if (bad >= 0) return fail(err, SC_ERR_INDEX_RANGE, 1, bad, read_back(idx, bad, s));
  }
  Keys keys;
  for (int64_t j = 0; j < rows; ++j) keys.k[j] = sc_sketch_key(seed, j);
  if (table_dtype == SC_F32)
    estimate_kernel<float><<<grid_for(m), kThreads, 0, s>>>((const float*)table, rows, (uint64_t)cols, keys, idx,
                                                             m, (float*)out);
  else
    estimate_kernel<double><<<grid_for(m), kThreads, 0, s>>>((const double*)table, rows, (uint64_t)cols, keys, idx,
                                                              m, (double*)out);
  SC_CUDA_LAUNCHED();
  return SC_OK;
}
