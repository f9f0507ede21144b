// COO merges, scatter and gather on the GPU (contract: sparsecomm/cuda.h, the CPU kernels'
// in kernels.h), with the CPU kernels' results bit for bit.
//
// k-way merge: every input is validated (strictly ascending, in [0, limit)) by one kernel
// each and one synchronisation; the inputs are concatenated in list order and sorted by
// index with CUB's stable radix sort, so equal indices stay in list order; one thread per
// distinct index then sums its (at most p) values left to right -- the CPU kernel's order
// (half types in float32, rounded once). The result length is read back (one sync).
//
// Scatter: strictly ascending (so distinct) indices add in parallel, one element each. Any
// other order is summed per target in input order: a stable sort by index, then one
// thread per distinct target folds its values sequentially (half types rounded after every
// addition, as on the CPU), so repeats give the CPU's bits too.
#include <cub/cub.cuh>

#include "common.cuh"

namespace {

using namespace sc_cuda;

// Which input failed and where: one slot per input, first bad position (kNone: none).
template <typename I>
int check_inputs(int64_t p, const void* const* idx, const int64_t* lens, int64_t limit, cudaStream_t s,
                 Scratch& scratch, sc_error_info* err) {
  SC_SCRATCH(slots, unsigned long long, scratch, p);
  SC_CUDA_TRY(cudaMemsetAsync(slots, 0xFF, (size_t)p * sizeof(unsigned long long), s));
  for (int64_t q = 0; q < p; ++q) {
    if (lens[q] <= 0) continue;
    first_bad_kernel<<<grid_for(lens[q]), kThreads, 0, s>>>(lens[q], SortedBad<I>{(const I*)idx[q], limit},
                                                             slots + q);
    SC_CUDA_LAUNCHED();
  }
  unsigned long long* host = new unsigned long long[(size_t)p];
  cudaError_t e = cudaMemcpyAsync(host, slots, (size_t)p * sizeof(unsigned long long), cudaMemcpyDeviceToHost, s);
  if (e == cudaSuccess) e = cudaStreamSynchronize(s);
  int st = SC_OK;
  if (e != cudaSuccess) {
    st = cuda_fail(err, e);
  } else {
    for (int64_t q = 0; q < p; ++q) {
      if (host[q] == kNone) continue;
      int64_t pos = (int64_t)host[q];
      int64_t v = read_back((const I*)idx[q], pos, s);
      bool range = v < 0 || (limit >= 0 && v >= limit);
      st = fail(err, range ? SC_ERR_INDEX_RANGE : SC_ERR_INDEX_ORDER, q, pos, v);
      break;
    }
  }
  delete[] host;
  return st;
}

template <typename I>
__global__ void iota_positions(int64_t n, int64_t* pos) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    pos[i] = i;
}

template <typename I>
__global__ void head_flags(const I* keys, int64_t n, int64_t* flag) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    flag[i] = i == 0 || keys[i] != keys[i - 1];
}

// One thread per distinct index (the head of its run in the sorted keys): the values of
// the run, in list order, summed left to right.
template <typename Tr, typename I>
__global__ void sum_runs(const I* keys, const int64_t* order, const typename Tr::S* vals, int64_t n,
                         const int64_t* run_end, I* out_idx, typename Tr::S* out_val) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    if (i > 0 && keys[i] == keys[i - 1]) continue;
    int64_t r = run_end[i] - 1;  // the run's number: the inclusive count of heads, minus one
    typename Tr::A acc = Tr::load(vals[order[i]]);
    for (int64_t u = i + 1; u < n && keys[u] == keys[i]; ++u) acc = acc + Tr::load(vals[order[u]]);
    out_idx[r] = keys[i];
    out_val[r] = Tr::store(acc);
  }
}

template <typename Tr, typename I>
int merge_impl(int64_t p, const void* const* idx, const void* const* val, const int64_t* lens, int64_t limit,
               I* out_idx, typename Tr::S* out_val, int64_t* out_n, cudaStream_t s, sc_error_info* err) {
  using S = typename Tr::S;
  Scratch scratch(s);
  int st = check_inputs<I>(p, idx, lens, limit, s, scratch, err);
  if (st) return st;
  int64_t total = 0;
  for (int64_t q = 0; q < p; ++q) total += lens[q];
  *out_n = 0;
  if (total == 0) return SC_OK;
  SC_SCRATCH(keys, I, scratch, total);
  SC_SCRATCH(keys_sorted, I, scratch, total);
  SC_SCRATCH(vals, S, scratch, total);
  SC_SCRATCH(order, int64_t, scratch, total);
  SC_SCRATCH(order_sorted, int64_t, scratch, total);
  SC_SCRATCH(heads, int64_t, scratch, total);
  SC_SCRATCH(run_end, int64_t, scratch, total);
  int64_t at = 0;
  for (int64_t q = 0; q < p; ++q) {  // concatenation in list order
    if (!lens[q]) continue;
    SC_CUDA_TRY(cudaMemcpyAsync(keys + at, idx[q], (size_t)lens[q] * sizeof(I), cudaMemcpyDeviceToDevice, s));
    SC_CUDA_TRY(cudaMemcpyAsync(vals + at, val[q], (size_t)lens[q] * sizeof(S), cudaMemcpyDeviceToDevice, s));
    at += lens[q];
  }
  iota_positions<I><<<grid_for(total), kThreads, 0, s>>>(total, order);
  SC_CUDA_LAUNCHED();
  // indices are validated >= 0 (and < limit): sort only the bits they can use
  int end_bit = (int)sizeof(I) * 8;
  if (limit > 0) {
    end_bit = 1;
    while (end_bit < (int)sizeof(I) * 8 && (limit - 1) >> end_bit) ++end_bit;
  }
  size_t temp_bytes = 0, t2 = 0;
  SC_CUDA_TRY(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys, keys_sorted, order, order_sorted, total,
                                              0, end_bit, s));
  SC_CUDA_TRY(cub::DeviceScan::InclusiveSum(nullptr, t2, heads, run_end, total, s));
  if (t2 > temp_bytes) temp_bytes = t2;
  SC_SCRATCH(temp, unsigned char, scratch, temp_bytes);
  SC_CUDA_TRY(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, keys, keys_sorted, order, order_sorted, total, 0,
                                              end_bit, s));
  head_flags<I><<<grid_for(total), kThreads, 0, s>>>(keys_sorted, total, heads);
  SC_CUDA_LAUNCHED();
  SC_CUDA_TRY(cub::DeviceScan::InclusiveSum(temp, temp_bytes, heads, run_end, total, s));
  sum_runs<Tr, I><<<grid_for(total), kThreads, 0, s>>>(keys_sorted, order_sorted, vals, total, run_end, out_idx,
                                                       out_val);
  SC_CUDA_LAUNCHED();
  SC_CUDA_TRY(cudaMemcpyAsync(out_n, run_end + total - 1, sizeof(int64_t), cudaMemcpyDeviceToHost, s));
  SC_CUDA_TRY(cudaStreamSynchronize(s));
  return SC_OK;
}

// ------------------------------------------------------------------ scatter, gather

template <typename I>
struct NotAscending {
  const I* idx;
  __device__ bool operator()(int64_t i) const { return i > 0 && idx[i] <= idx[i - 1]; }
};

template <typename Tr, typename I>
__global__ void scatter_distinct(typename Tr::S* dense, const I* idx, const typename Tr::S* val, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    int64_t t = (int64_t)idx[i];
    dense[t] = Tr::store(Tr::load(dense[t]) + Tr::load(val[i]));
  }
}

template <typename I>
__global__ void widen(const I* idx, int64_t n, int64_t* out, int64_t* pos) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    out[i] = (int64_t)idx[i];
    pos[i] = i;
  }
}

template <typename Tr>
__global__ void scatter_runs(typename Tr::S* dense, const int64_t* keys, const int64_t* order,
                             const typename Tr::S* val, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    if (i > 0 && keys[i] == keys[i - 1]) continue;
    int64_t t = keys[i];
    typename Tr::S d = dense[t];
    for (int64_t u = i; u < n && keys[u] == t; ++u) d = Tr::store(Tr::load(d) + Tr::load(val[order[u]]));
    dense[t] = d;
  }
}

bool bytes_overlap(const void* a, size_t na, const void* b, size_t nb) {
  uintptr_t a0 = (uintptr_t)a, b0 = (uintptr_t)b;
  return na && nb && a0 < b0 + nb && b0 < a0 + na;
}

template <typename Tr, typename I>
int scatter_impl(typename Tr::S* dense, int64_t dense_n, const I* idx, const typename Tr::S* val, int64_t n,
                 cudaStream_t s, sc_error_info* err) {
  using S = typename Tr::S;
  if (bytes_overlap(dense, (size_t)dense_n * sizeof(S), val, (size_t)n * sizeof(S)))
    return fail(err, SC_ERR_OVERLAP, 2, 0, 0);
  if (bytes_overlap(dense, (size_t)dense_n * sizeof(S), idx, (size_t)n * sizeof(I)))
    return fail(err, SC_ERR_OVERLAP, 1, 0, 0);
  if (n == 0) return SC_OK;
  Scratch scratch(s);
  SC_SCRATCH(slots, unsigned long long, scratch, 2);
  SC_CUDA_TRY(cudaMemsetAsync(slots, 0xFF, 2 * sizeof(unsigned long long), s));
  first_bad_kernel<<<grid_for(n), kThreads, 0, s>>>(n, RangeBad<I>{idx, dense_n}, slots);
  SC_CUDA_LAUNCHED();
  first_bad_kernel<<<grid_for(n), kThreads, 0, s>>>(n, NotAscending<I>{idx}, slots + 1);
  SC_CUDA_LAUNCHED();
  unsigned long long host[2];
  SC_CUDA_TRY(cudaMemcpyAsync(host, slots, sizeof host, cudaMemcpyDeviceToHost, s));
  SC_CUDA_TRY(cudaStreamSynchronize(s));
  if (host[0] != kNone) {  // nothing written
    int64_t pos = (int64_t)host[0];
    return fail(err, SC_ERR_INDEX_RANGE, 1, pos, read_back(idx, pos, s));
  }
  if (host[1] == kNone) {
    scatter_distinct<Tr, I><<<grid_for(n), kThreads, 0, s>>>(dense, idx, val, n);
    SC_CUDA_LAUNCHED();
    return SC_OK;
  }
  SC_SCRATCH(keys, int64_t, scratch, n);
  SC_SCRATCH(keys_sorted, int64_t, scratch, n);
  SC_SCRATCH(order, int64_t, scratch, n);
  SC_SCRATCH(order_sorted, int64_t, scratch, n);
  widen<I><<<grid_for(n), kThreads, 0, s>>>(idx, n, keys, order);
  SC_CUDA_LAUNCHED();
  int end_bit = 1;
  while (end_bit < 63 && (dense_n - 1) >> end_bit) ++end_bit;
  size_t temp_bytes = 0;
  SC_CUDA_TRY(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys, keys_sorted, order, order_sorted, n, 0,
                                              end_bit, s));
  SC_SCRATCH(temp, unsigned char, scratch, temp_bytes);
  SC_CUDA_TRY(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, keys, keys_sorted, order, order_sorted, n, 0,
                                              end_bit, s));
  scatter_runs<Tr><<<grid_for(n), kThreads, 0, s>>>(dense, keys_sorted, order_sorted, val, n);
  SC_CUDA_LAUNCHED();
  return SC_OK;
}

template <typename S, typename I>
__global__ void gather_kernel(const S* dense, const I* idx, int64_t n, S* out) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    out[i] = dense[idx[i]];
}

}  // namespace

extern "C" int sc_cuda_merge_add_many(sc_index_t itype, sc_dtype vtype, int64_t p, const void* const* idx,
                                      const void* const* val, const int64_t* lens, int64_t limit, void* out_idx,
                                      void* out_val, int64_t* out_n, sc_stream_t stream, sc_error_info* err) {
  if (p < 1) return fail(err, SC_ERR_ARG, 0, 0, p);
  for (int64_t q = 0; q < p; ++q)
    if (lens[q] < 0) return fail(err, SC_ERR_ARG, q, 0, lens[q]);
  cudaStream_t s = (cudaStream_t)stream;
  return dispatch_index(itype, err, [&](auto it) {
    using I = decltype(it);
    return dispatch_value(vtype, err, [&](auto tr) {
      using Tr = decltype(tr);
      return merge_impl<Tr, I>(p, idx, val, lens, limit, (I*)out_idx, (typename Tr::S*)out_val, out_n, s, err);
    });
  });
}

extern "C" int sc_cuda_scatter_add(sc_index_t itype, sc_dtype vtype, void* dense, int64_t dense_n, const void* idx,
                                   const void* val, int64_t n, sc_stream_t stream, sc_error_info* err) {
  if (dense_n < 0) return fail(err, SC_ERR_ARG, 0, 0, dense_n);
  if (n < 0) return fail(err, SC_ERR_ARG, 1, 0, n);
  cudaStream_t s = (cudaStream_t)stream;
  return dispatch_index(itype, err, [&](auto it) {
    using I = decltype(it);
    return dispatch_value(vtype, err, [&](auto tr) {
      using Tr = decltype(tr);
      using S = typename Tr::S;
      return scatter_impl<Tr, I>((S*)dense, dense_n, (const I*)idx, (const S*)val, n, s, err);
    });
  });
}

extern "C" int sc_cuda_gather(sc_index_t itype, sc_dtype vtype, const void* dense, int64_t dense_n, const void* idx,
                              int64_t n, void* out, sc_stream_t stream, sc_error_info* err) {
  if (dense_n < 0) return fail(err, SC_ERR_ARG, 0, 0, dense_n);
  if (n < 0) return fail(err, SC_ERR_ARG, 1, 0, n);
  cudaStream_t s = (cudaStream_t)stream;
  return dispatch_index(itype, err, [&](auto it) {
    using I = decltype(it);
    return dispatch_value(vtype, err, [&](auto tr) {
      using S = typename decltype(tr)::S;
      if (n == 0) return (int)SC_OK;
      Scratch scratch(s);
      SC_SCRATCH(slot, unsigned long long, scratch, 1);
      cudaError_t e;
      int64_t bad = first_bad(n, RangeBad<I>{(const I*)idx, dense_n}, slot, s, &e);
      if (bad == -2) return cuda_fail(err, e);
      if (bad >= 0) return fail(err, SC_ERR_INDEX_RANGE, 1, bad, read_back((const I*)idx, bad, s));
      gather_kernel<S, I><<<grid_for(n), kThreads, 0, s>>>((const S*)dense, (const I*)idx, n, (S*)out);
      SC_CUDA_LAUNCHED();
      return (int)SC_OK;
    });
  });
}
