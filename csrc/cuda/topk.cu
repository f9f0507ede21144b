// Exact top-k and block top-k by magnitude on the GPU (contract: sparsecomm/cuda.h, the
// CPU kernels' in kernels.h). Same results as csrc/cpu/topk.c bit for bit: the selection
// is the same set (the k largest |x|, ties to the lower index) and the output is in index
// order, whatever the algorithm.
//
// Top-k: radix select on the magnitude bit patterns (|x| orders like the unsigned pattern
// with the sign cleared; Inf is the largest, anything above it is NaN). 8 bits per pass
// (2 passes for 16-bit types, 4 for float32, 8 for float64): a histogram of the next digit
// among the keys that share the prefix chosen so far, then one thread picks the digit in
// which the k-th largest lies. The state (prefix, mask, how many to take) stays on the
// device, so the passes run back to back without the host. Then a stable compaction: keys
// above the threshold T, and the first `need` keys equal to T by index (an exclusive scan
// of the equal ones), written at their inclusive-scan position: indices come out ascending.
// The NaN check rides on the first histogram pass; one synchronisation at the end reads it.
//
// Block top-k: one segmented radix sort of (|x| key descending, index) pairs per block
// (CUB's sort is stable, so equal keys keep index order), the first min(k, len) of each
// block, then a segmented sort of those indices back to ascending order.
#include <cub/cub.cuh>

#include "common.cuh"
#include "sparsecomm/kernels.h"

namespace {

using namespace sc_cuda;

template <typename K>
struct SelectState {
  K prefix;
  K mask;
  unsigned long long need;  // how many keys equal to the final prefix to take
};

template <typename Tr>
__global__ void digit_histogram(const typename Tr::S* x, int64_t n, const SelectState<typename Tr::K>* st,
                                int shift, unsigned long long* hist, unsigned long long* first_nan) {
  using K = typename Tr::K;
  __shared__ unsigned int local[256];
  for (int b = threadIdx.x; b < 256; b += blockDim.x) local[b] = 0;
  __syncthreads();
  const K prefix = st->prefix, mask = st->mask;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    K key = Tr::key(x[i]);
    if (first_nan && key > Tr::kInf) atomicMin(first_nan, (unsigned long long)i);
    if ((key & mask) == prefix) atomicAdd(&local[(key >> shift) & 0xFF], 1u);
  }
  __syncthreads();
  for (int b = threadIdx.x; b < 256; b += blockDim.x)
    if (local[b]) atomicAdd(&hist[b], (unsigned long long)local[b]);
}

// One thread: the digit (from the top) where the need-th largest key lies.
template <typename K>
__global__ void choose_digit(SelectState<K>* st, int shift, unsigned long long* hist) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  unsigned long long need = st->need, above = 0;
  int chosen = 0;
  for (int b = 255; b >= 0; --b) {
    if (above + hist[b] >= need) {
      chosen = b;
      break;
    }
    above += hist[b];
  }
  st->need = need - above;
  st->prefix |= (K)((K)chosen << shift);
  st->mask |= (K)((K)0xFF << shift);
  for (int b = 0; b < 256; ++b) hist[b] = 0;
}

template <typename Tr, typename C>
__global__ void equal_flags(const typename Tr::S* x, int64_t n, const SelectState<typename Tr::K>* st, C* flag) {
  const typename Tr::K t = st->prefix;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    flag[i] = Tr::key(x[i]) == t;
}

template <typename Tr, typename C>
__global__ void select_flags(const typename Tr::S* x, int64_t n, const SelectState<typename Tr::K>* st,
                             const C* equal_before, C* flag) {
  const typename Tr::K t = st->prefix;
  const unsigned long long need = st->need;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    typename Tr::K key = Tr::key(x[i]);
    flag[i] = key > t || (key == t && (unsigned long long)equal_before[i] < need);
  }
}

template <typename Tr, typename C>
__global__ void write_selected(const typename Tr::S* x, int64_t n, const C* inclusive, typename Tr::S* vals,
                               int64_t* idx) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    C before = i ? inclusive[i - 1] : 0;
    if (inclusive[i] != before) {
      idx[before] = i;
      vals[before] = x[i];
    }
  }
}

template <typename S>
__global__ void copy_all(const S* x, int64_t n, S* vals, int64_t* idx) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    vals[i] = x[i];
    idx[i] = i;
  }
}

template <typename Tr>
struct NanAt {
  const typename Tr::S* x;
  __device__ bool operator()(int64_t i) const { return Tr::key(x[i]) > Tr::kInf; }
};

template <typename Tr>
int nan_status(const typename Tr::S* x, int64_t pos, sc_error_info* err) {
  (void)x;
  return fail(err, SC_ERR_NAN, 0, pos, 0);
}

template <typename Tr, typename C>
int topk_impl(const typename Tr::S* x, int64_t n, int64_t k, typename Tr::S* vals, int64_t* idx,
              cudaStream_t s, sc_error_info* err) {
  using K = typename Tr::K;
  Scratch scratch(s);
  SC_SCRATCH(slot, unsigned long long, scratch, 1);
  if (k >= n || k == 0) {  // every element or none: only the NaN check is data-dependent
    cudaError_t e;
    int64_t bad = first_bad(n, NanAt<Tr>{x}, slot, s, &e);
    if (bad == -2) return cuda_fail(err, e);
    if (bad >= 0) return nan_status<Tr>(x, bad, err);
    if (k > 0 && n > 0) {
      copy_all<<<grid_for(n), kThreads, 0, s>>>(x, n, vals, idx);
      SC_CUDA_LAUNCHED();
    }
    return SC_OK;
  }
  SC_SCRATCH(state, SelectState<K>, scratch, 1);
  SC_SCRATCH(hist, unsigned long long, scratch, 256);
  SelectState<K> init{0, 0, (unsigned long long)k};
  unsigned long long none = kNone;
  SC_CUDA_TRY(cudaMemcpyAsync(state, &init, sizeof init, cudaMemcpyHostToDevice, s));
  SC_CUDA_TRY(cudaMemcpyAsync(slot, &none, sizeof none, cudaMemcpyHostToDevice, s));
  SC_CUDA_TRY(cudaMemsetAsync(hist, 0, 256 * sizeof(unsigned long long), s));
  const int bits = (int)sizeof(K) * 8;
  for (int shift = bits - 8; shift >= 0; shift -= 8) {
    digit_histogram<Tr><<<grid_for(n), kThreads, 0, s>>>(x, n, state, shift, hist,
                                                          shift == bits - 8 ? slot : nullptr);
    SC_CUDA_LAUNCHED();
    choose_digit<K><<<1, 1, 0, s>>>(state, shift, hist);
    SC_CUDA_LAUNCHED();
  }
  // stable compaction: flags in a, scans into b
  SC_SCRATCH(a, C, scratch, n);
  SC_SCRATCH(b, C, scratch, n);
  size_t temp_bytes = 0, t2 = 0;
  SC_CUDA_TRY(cub::DeviceScan::ExclusiveSum(nullptr, temp_bytes, a, b, n, s));
  SC_CUDA_TRY(cub::DeviceScan::InclusiveSum(nullptr, t2, a, b, n, s));
  if (t2 > temp_bytes) temp_bytes = t2;
  SC_SCRATCH(temp, unsigned char, scratch, temp_bytes);
  equal_flags<Tr, C><<<grid_for(n), kThreads, 0, s>>>(x, n, state, a);
  SC_CUDA_LAUNCHED();
  SC_CUDA_TRY(cub::DeviceScan::ExclusiveSum(temp, temp_bytes, a, b, n, s));
  select_flags<Tr, C><<<grid_for(n), kThreads, 0, s>>>(x, n, state, b, a);
  SC_CUDA_LAUNCHED();
  SC_CUDA_TRY(cub::DeviceScan::InclusiveSum(temp, temp_bytes, a, b, n, s));
  write_selected<Tr, C><<<grid_for(n), kThreads, 0, s>>>(x, n, b, vals, idx);
  SC_CUDA_LAUNCHED();
  unsigned long long nan_at = kNone;
  SC_CUDA_TRY(cudaMemcpyAsync(&nan_at, slot, sizeof nan_at, cudaMemcpyDeviceToHost, s));
  SC_CUDA_TRY(cudaStreamSynchronize(s));
  if (nan_at != kNone) return nan_status<Tr>(x, (int64_t)nan_at, err);
  return SC_OK;
}

// ------------------------------------------------------------------ block top-k

template <typename Tr>
__global__ void block_keys(const typename Tr::S* x, int64_t n, typename Tr::K* keys, int64_t* pos) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    keys[i] = Tr::key(x[i]);
    pos[i] = i;
  }
}

__host__ __device__ inline int64_t block_start(int64_t n, int64_t blocks, int64_t b) {
  // b n / B without overflow of b * n (the CPU kernels' sc_block_end(b - 1))
  return (int64_t)(((__int128)b * n) / blocks);
}

__global__ void block_offsets(int64_t n, int64_t blocks, int64_t k, int64_t* begin, int64_t* end,
                              int64_t* out_begin, int64_t* out_end) {
  for (int64_t b = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; b < blocks; b += (int64_t)gridDim.x * blockDim.x) {
    int64_t lo = block_start(n, blocks, b), hi = block_start(n, blocks, b + 1);
    begin[b] = lo;
    end[b] = hi;
    // output offset: sum over earlier blocks of min(k, len); lengths are q or q + 1
    int64_t q = n / blocks;
    // blocks with length q + 1 are those b where (b+1) n / B - b n / B = q + 1; count them
    // among the first b blocks: floor(b n / B) - b q
    int64_t big_before = lo - b * q;
    int64_t small_before = b - big_before;
    int64_t kq1 = k < q + 1 ? k : q + 1, kq = k < q ? k : q;
    out_begin[b] = big_before * kq1 + small_before * kq;
    out_end[b] = out_begin[b] + ((hi - lo) < k ? (hi - lo) : k);
  }
}

template <typename S>
__global__ void take_heads(const int64_t* sorted_pos, const int64_t* begin, const int64_t* out_begin,
                           const int64_t* out_end, int64_t blocks, int64_t* picked) {
  for (int64_t b = blockIdx.y; b < blocks; b += gridDim.y) {
    int64_t len = out_end[b] - out_begin[b];
    for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < len; t += (int64_t)gridDim.x * blockDim.x)
      picked[out_begin[b] + t] = sorted_pos[begin[b] + t];
  }
}

template <typename S>
__global__ void gather_values(const S* x, const int64_t* idx, int64_t m, S* vals) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < m; i += (int64_t)gridDim.x * blockDim.x)
    vals[i] = x[idx[i]];
}

template <typename Tr>
int block_topk_impl(const typename Tr::S* x, int64_t n, int64_t blocks, int64_t k, typename Tr::S* vals,
                    int64_t* idx, cudaStream_t s, sc_error_info* err) {
  using K = typename Tr::K;
  Scratch scratch(s);
  SC_SCRATCH(slot, unsigned long long, scratch, 1);
  cudaError_t e;
  int64_t bad = first_bad(n, NanAt<Tr>{x}, slot, s, &e);
  if (bad == -2) return cuda_fail(err, e);
  if (bad >= 0) return nan_status<Tr>(x, bad, err);
  int64_t m = sc_block_topk_count(n, blocks, k);
  if (m == 0) return SC_OK;
  if (blocks > 0x7FFFFFFF) return fail(err, SC_ERR_ARG, 1, 0, blocks);  // CUB segment counts are int
  SC_SCRATCH(keys, K, scratch, n);
  SC_SCRATCH(keys_sorted, K, scratch, n);
  SC_SCRATCH(pos, int64_t, scratch, n);
  SC_SCRATCH(pos_sorted, int64_t, scratch, n);
  SC_SCRATCH(begin, int64_t, scratch, blocks);
  SC_SCRATCH(end, int64_t, scratch, blocks);
  SC_SCRATCH(out_begin, int64_t, scratch, blocks);
  SC_SCRATCH(out_end, int64_t, scratch, blocks);
  block_keys<Tr><<<grid_for(n), kThreads, 0, s>>>(x, n, keys, pos);
  SC_CUDA_LAUNCHED();
  block_offsets<<<grid_for(blocks), kThreads, 0, s>>>(n, blocks, k, begin, end, out_begin, out_end);
  SC_CUDA_LAUNCHED();
  size_t temp_bytes = 0, t2 = 0;
  SC_CUDA_TRY(cub::DeviceSegmentedRadixSort::SortPairsDescending(
      nullptr, temp_bytes, keys, keys_sorted, pos, pos_sorted, n, (int)blocks, begin, end, 0,
      (int)sizeof(K) * 8, s));
  SC_CUDA_TRY(cub::DeviceSegmentedRadixSort::SortKeys(nullptr, t2, pos, idx, m, (int)blocks, out_begin,
                                                      out_end, 0, 64, s));
  if (t2 > temp_bytes) temp_bytes = t2;
  SC_SCRATCH(temp, unsigned char, scratch, temp_bytes);
  SC_CUDA_TRY(cub::DeviceSegmentedRadixSort::SortPairsDescending(
      temp, temp_bytes, keys, keys_sorted, pos, pos_sorted, n, (int)blocks, begin, end, 0,
      (int)sizeof(K) * 8, s));
  dim3 grid(grid_for(k < 1024 ? k : 1024), (unsigned)(blocks < 65535 ? blocks : 65535));
  take_heads<typename Tr::S><<<grid, kThreads, 0, s>>>(pos_sorted, begin, out_begin, out_end, blocks, pos);
  SC_CUDA_LAUNCHED();
  SC_CUDA_TRY(cub::DeviceSegmentedRadixSort::SortKeys(temp, temp_bytes, pos, idx, m, (int)blocks, out_begin,
                                                      out_end, 0, 64, s));
  gather_values<typename Tr::S><<<grid_for(m), kThreads, 0, s>>>(x, idx, m, vals);
  SC_CUDA_LAUNCHED();
  SC_CUDA_TRY(cudaStreamSynchronize(s));  // scratch is freed on the stream; the status is final
  return SC_OK;
}

}  // namespace

extern "C" int sc_cuda_topk(sc_dtype dtype, const void* x, int64_t n, int64_t k, void* out_vals,
                            int64_t* out_idx, sc_stream_t stream, sc_error_info* err) {
  if (n < 0) return fail(err, SC_ERR_ARG, 0, 0, n);
  if (k < 0) return fail(err, SC_ERR_ARG, 1, 0, k);
  cudaStream_t s = (cudaStream_t)stream;
  return dispatch_value(dtype, err, [&](auto tr) {
    using Tr = decltype(tr);
    using S = typename Tr::S;
    if (n < 0x7FFFFFFF)
      return topk_impl<Tr, int32_t>((const S*)x, n, k, (S*)out_vals, out_idx, s, err);
    return topk_impl<Tr, int64_t>((const S*)x, n, k, (S*)out_vals, out_idx, s, err);
  });
}

extern "C" int sc_cuda_block_topk(sc_dtype dtype, const void* x, int64_t n, int64_t num_blocks,
                                  int64_t k_per_block, void* out_vals, int64_t* out_idx, sc_stream_t stream,
                                  sc_error_info* err) {
  if (n < 0) return fail(err, SC_ERR_ARG, 0, 0, n);
  if (num_blocks < 1) return fail(err, SC_ERR_ARG, 1, 0, num_blocks);
  if (k_per_block < 0) return fail(err, SC_ERR_ARG, 2, 0, k_per_block);
  cudaStream_t s = (cudaStream_t)stream;
  return dispatch_value(dtype, err, [&](auto tr) {
    using Tr = decltype(tr);
    using S = typename Tr::S;
    return block_topk_impl<Tr>((const S*)x, n, num_blocks, k_per_block, (S*)out_vals, out_idx, s, err);
  });
}
