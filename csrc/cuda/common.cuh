// Shared pieces of the CUDA kernels (csrc/cuda/*.cu): status and error reporting, scratch
// memory on the caller's stream, the value types of abi.h with the CPU kernels' exact
// half-type conversions, and "first bad position" reductions for validation.
// Header-only, included once by each .cu file (every helper is static or inline).
#ifndef SPARSECOMM_CUDA_COMMON_CUH
#define SPARSECOMM_CUDA_COMMON_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include "sparsecomm/bitexact.h"
#include "sparsecomm/cuda.h"

namespace sc_cuda {

constexpr int kThreads = 256;
constexpr unsigned long long kNone = ~0ull;  // "no bad position" for atomicMin

inline int fail(sc_error_info* err, int status, int64_t input, int64_t position, int64_t value) {
  if (err) {
    err->input = input;
    err->position = position;
    err->value = value;
  }
  return status;
}

// A CUDA runtime error as a status: allocations are NOMEM, anything else ARG (the
// launch configuration or a pointer the caller passed), err->value = the cudaError_t.
inline int cuda_fail(sc_error_info* err, cudaError_t e) {
  cudaGetLastError();  // clear a sticky launch error
  return fail(err, e == cudaErrorMemoryAllocation ? SC_ERR_NOMEM : SC_ERR_ARG, -1, 0, (int64_t)e);
}

#define SC_CUDA_TRY(expr)                          \
  do {                                             \
    cudaError_t sc_e_ = (expr);                    \
    if (sc_e_ != cudaSuccess) return sc_cuda::cuda_fail(err, sc_e_); \
  } while (0)

#define SC_CUDA_LAUNCHED() SC_CUDA_TRY(cudaGetLastError())

inline unsigned grid_for(int64_t n, int threads = kThreads) {
  int64_t g = (n + threads - 1) / threads;
  if (g < 1) g = 1;
  return (unsigned)(g > 65535LL * 32 ? 65535LL * 32 : g);  // grid-stride loops cover the rest
}

// Scratch memory from the stream-ordered pool, freed on the same stream when it goes out
// of scope (so every error path releases it).
class Scratch {
 public:
  explicit Scratch(cudaStream_t s) : stream_(s) {}
  ~Scratch() {
    for (int i = 0; i < count_; ++i) cudaFreeAsync(ptr_[i], stream_);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  // nullptr on failure (*status set)
  template <typename T>
  T* get(size_t elements, cudaError_t* status) {
    void* p = nullptr;
    size_t bytes = elements * sizeof(T);
    if (count_ == kMax) {
      *status = cudaErrorMemoryAllocation;
      return nullptr;
    }
    *status = cudaMallocAsync(&p, bytes ? bytes : 1, stream_);
    if (*status != cudaSuccess) return nullptr;
    ptr_[count_++] = p;
    return static_cast<T*>(p);
  }

 private:
  static constexpr int kMax = 16;
  cudaStream_t stream_;
  void* ptr_[kMax] = {};
  int count_ = 0;
};

#define SC_SCRATCH(var, type, scratch, elements)                         \
  type* var;                                                             \
  do {                                                                   \
    cudaError_t sc_e_ = cudaSuccess;                                     \
    var = (scratch).get<type>((size_t)(elements), &sc_e_);              \
    if (!var) return sc_cuda::cuda_fail(err, sc_e_);                     \
  } while (0)

// ------------------------------------------------------------------ value types
// the CPU kernels' half-type roundings: sparsecomm/bitexact.h

// Value traits: storage type S, accumulation type A (float32 for the half types),
// magnitude key type K (the bit pattern without the sign: unsigned order = |x| order).
struct F32 {
  using S = float;
  using A = float;
  using K = uint32_t;
  static constexpr K kInf = 0x7F800000u;
  __device__ static A load(S v) { return v; }
  __device__ static S store(A v) { return v; }
  __device__ static K key(S v) { return __float_as_uint(v) & 0x7FFFFFFFu; }
};
struct F64 {
  using S = double;
  using A = double;
  using K = unsigned long long;
  static constexpr K kInf = 0x7FF0000000000000ull;
  __device__ static A load(S v) { return v; }
  __device__ static S store(A v) { return v; }
  __device__ static K key(S v) { return (K)__double_as_longlong(v) & 0x7FFFFFFFFFFFFFFFull; }
};
struct F16 {
  using S = uint16_t;
  using A = float;
  using K = uint16_t;
  static constexpr K kInf = 0x7C00u;
  __device__ static A load(S v) { return sc_f16_bits_to_f32(v); }
  __device__ static S store(A v) { return sc_f32_to_f16_bits(v); }
  __device__ static K key(S v) { return (K)(v & 0x7FFFu); }
};
struct BF16 {
  using S = uint16_t;
  using A = float;
  using K = uint16_t;
  static constexpr K kInf = 0x7F80u;
  __device__ static A load(S v) { return sc_bf16_bits_to_f32(v); }
  __device__ static S store(A v) { return sc_f32_to_bf16_bits(v); }
  __device__ static K key(S v) { return (K)(v & 0x7FFFu); }
};

// Calls f(Traits{}) for a value dtype of abi.h; SC_ERR_ARG for others.
template <typename F>
inline int dispatch_value(sc_dtype t, sc_error_info* err, F&& f) {
  switch (t) {
    case SC_F32: return f(F32{});
    case SC_F64: return f(F64{});
    case SC_F16: return f(F16{});
    case SC_BF16: return f(BF16{});
    default: return fail(err, SC_ERR_ARG, 0, 0, (int64_t)t);
  }
}

template <typename F>
inline int dispatch_index(sc_index_t t, sc_error_info* err, F&& f) {
  switch (t) {
    case SC_I32: return f(int32_t{});
    case SC_I64: return f(int64_t{});
    default: return fail(err, SC_ERR_ARG, 0, 0, (int64_t)t);
  }
}

// ------------------------------------------------------------------ validation

// Lowest i in [0, n) with bad(i), or kNone: atomicMin of positions into *first.
template <typename Bad>
__global__ void first_bad_kernel(int64_t n, Bad bad, unsigned long long* first) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    if (bad(i)) {
      atomicMin(first, (unsigned long long)i);
      return;  // later positions of this thread are larger
    }
  }
}

// The first position where `bad` holds (host value, after one stream sync): -1 if none,
// -2 on a CUDA error (status in *e).
template <typename Bad>
inline int64_t first_bad(int64_t n, Bad bad, unsigned long long* slot, cudaStream_t s, cudaError_t* e) {
  *e = cudaSuccess;
  if (n <= 0) return -1;
  unsigned long long h = kNone;
  if ((*e = cudaMemcpyAsync(slot, &h, sizeof h, cudaMemcpyHostToDevice, s)) != cudaSuccess) return -2;
  first_bad_kernel<<<grid_for(n), kThreads, 0, s>>>(n, bad, slot);
  if ((*e = cudaGetLastError()) != cudaSuccess) return -2;
  if ((*e = cudaMemcpyAsync(&h, slot, sizeof h, cudaMemcpyDeviceToHost, s)) != cudaSuccess) return -2;
  if ((*e = cudaStreamSynchronize(s)) != cudaSuccess) return -2;
  return h == kNone ? -1 : (int64_t)h;
}

// Index i of an index vector breaks "strictly ascending, in [0, limit)" (limit < 0: no
// upper bound): the CPU kernels' fused check (sc_check_sorted_indices).
template <typename I>
struct SortedBad {
  const I* idx;
  int64_t limit;
  __device__ bool operator()(int64_t i) const {
    int64_t v = (int64_t)idx[i];
    if (v < 0 || (limit >= 0 && v >= limit)) return true;
    return i > 0 && v <= (int64_t)idx[i - 1];
  }
};

template <typename I>
struct RangeBad {
  const I* idx;
  int64_t limit;
  __device__ bool operator()(int64_t i) const {
    int64_t v = (int64_t)idx[i];
    return v < 0 || v >= limit;
  }
};

// Reads one element of a device array to the host (error paths: the offending value).
template <typename T>
inline int64_t read_back(const T* p, int64_t i, cudaStream_t s) {
  T v{};
  if (cudaMemcpyAsync(&v, p + i, sizeof(T), cudaMemcpyDeviceToHost, s) != cudaSuccess) return 0;
  cudaStreamSynchronize(s);
  return (int64_t)v;
}

}  // namespace sc_cuda

#endif  // SPARSECOMM_CUDA_COMMON_CUH
