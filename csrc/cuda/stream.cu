// Sparse-stream and QSGD kernels on the GPU (contract: sparsecomm/cuda.h, the CPU kernels'
// in stream.h), with the CPU kernels' results bit for bit: the same splitmix64 draw per
// element, the same float64 arithmetic for levels and dequantized values (compiled with
// --fmad=false, so no fused multiply-add changes a rounding), the same validation order.
#include <math.h>
#include <string.h>

#include "common.cuh"

namespace {

using namespace sc_cuda;

template <typename S>
__global__ void add_kernel(S* a, const S* b, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    a[i] += b[i];
}

template <typename S>
__device__ inline int qsgd_level(S x, int64_t i, float scale, int s, uint64_t seed) {
  if (!(scale > 0.0f)) return s;
  double r = __dmul_rn(__ddiv_rn(fabs((double)x), (double)scale), (double)s);
  double l = floor(r);
  if (sc_qsgd_u01(seed, i) < __dsub_rn(r, l)) l += 1.0;
  if (l > s) l = s;
  return x < 0 ? s - (int)l : s + (int)l;
}

// One block per bucket: max |x| (float64), the float32 scale rounded up, a non-finite
// element's position.
template <typename S>
__global__ void qsgd_scales(const S* x, int64_t n, int64_t bucket, int64_t nb, float* scales,
                            unsigned long long* first_bad) {
  __shared__ double part[kThreads];
  __shared__ unsigned long long bad[kThreads];
  for (int64_t b = blockIdx.x; b < nb; b += gridDim.x) {
    const int64_t lo = b * bucket, hi = n - lo > bucket ? lo + bucket : n;
    double m = 0.0;
    unsigned long long first = kNone;
    for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
      double a = fabs((double)x[i]);
      if (a > m) m = a;
      if (!(a <= 3.4028234663852886e38) && first == kNone) first = (unsigned long long)i;
    }
    part[threadIdx.x] = m;
    bad[threadIdx.x] = first;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w >>= 1) {
      if ((int)threadIdx.x < w) {
        if (part[threadIdx.x + w] > part[threadIdx.x]) part[threadIdx.x] = part[threadIdx.x + w];
        if (bad[threadIdx.x + w] < bad[threadIdx.x]) bad[threadIdx.x] = bad[threadIdx.x + w];
      }
      __syncthreads();
    }
    if (threadIdx.x == 0) {
      if (bad[0] != kNone) {
        atomicMin(first_bad, bad[0]);
      } else {
        double mm = part[0];
        float scale = __double2float_rn(mm);
        if ((double)scale < mm) scale = nextafterf(scale, INFINITY);
        scales[b] = scale;
      }
    }
    __syncthreads();
  }
}

template <typename S>
__global__ void qsgd_levels(const S* x, int64_t n, int bits, int64_t bucket, uint64_t seed, const float* scales,
                            uint8_t* packed) {
  const int s = (1 << (bits - 1)) - 1;
  const int64_t bytes = bits == 8 ? n : (n + 1) / 2;
  for (int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; j < bytes; j += (int64_t)gridDim.x * blockDim.x) {
    if (bits == 8) {
      packed[j] = (uint8_t)qsgd_level(x[j], j, scales[j / bucket], s, seed);
    } else {  // an even bucket: both nibbles of a byte share a bucket
      int64_t i = 2 * j;
      float scale = scales[i / bucket];
      int q0 = qsgd_level(x[i], i, scale, s, seed);
      int q1 = i + 1 < n ? qsgd_level(x[i + 1], i + 1, scale, s, seed) : 0;
      packed[j] = (uint8_t)(q0 | (q1 << 4));
    }
  }
}

struct LevelBad {  // a packed byte holding a level above 2s, or a non-zero unused nibble
  const uint8_t* packed;
  int64_t n;
  int bits;
  __device__ bool operator()(int64_t j) const {
    const int top = 2 * ((1 << (bits - 1)) - 1);
    uint8_t v = packed[j];
    if (bits == 8) return v > top;
    int lo = v & 0x0F, hi = v >> 4;
    if (lo > top) return true;
    if (2 * j + 1 < n) return hi > top;
    return hi != 0;  // the unused high nibble of an odd n
  }
};

struct ScaleBad {
  const float* scales;
  __device__ bool operator()(int64_t b) const {
    float v = scales[b];
    return !(isfinite(v) && v >= 0.0f);
  }
};

template <typename S>
__global__ void qsgd_decode(const uint8_t* packed, const float* scales, int64_t n, int bits, int64_t bucket,
                            S* out) {
  const int s = (1 << (bits - 1)) - 1;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    int q = bits == 8 ? packed[i] : (i & 1) ? (packed[i >> 1] >> 4) : (packed[i >> 1] & 0x0F);
    out[i] = (S)__ddiv_rn(__dmul_rn((double)(q - s), (double)scales[i / bucket]), (double)s);
  }
}

template <typename I>
int concat_impl(const I* ia, int64_t na, const I* ib, int64_t nb, cudaStream_t s, sc_error_info* err) {
  Scratch scratch(s);
  SC_SCRATCH(slots, unsigned long long, scratch, 2);
  SC_CUDA_TRY(cudaMemsetAsync(slots, 0xFF, 2 * sizeof(unsigned long long), s));
  if (na) {
    first_bad_kernel<<<grid_for(na), kThreads, 0, s>>>(na, SortedBad<I>{ia, -1}, slots);
    SC_CUDA_LAUNCHED();
  }
  if (nb) {
    first_bad_kernel<<<grid_for(nb), kThreads, 0, s>>>(nb, SortedBad<I>{ib, -1}, slots + 1);
    SC_CUDA_LAUNCHED();
  }
  unsigned long long host[2];
  SC_CUDA_TRY(cudaMemcpyAsync(host, slots, sizeof host, cudaMemcpyDeviceToHost, s));
  SC_CUDA_TRY(cudaStreamSynchronize(s));
  for (int q = 0; q < 2; ++q) {
    if (host[q] == kNone) continue;
    int64_t pos = (int64_t)host[q];
    int64_t v = read_back(q ? ib : ia, pos, s);
    return fail(err, v < 0 ? SC_ERR_INDEX_RANGE : SC_ERR_INDEX_ORDER, q, pos, v);
  }
  if (na && nb) {
    int64_t last = read_back(ia, na - 1, s), first = read_back(ib, 0, s);
    if (first <= last) return fail(err, SC_ERR_INDEX_ORDER, 1, 0, first);
  }
  return SC_OK;
}

}  // namespace

extern "C" int sc_cuda_stream_add_dd(sc_dtype vt, void* a, const void* b, int64_t n, sc_stream_t stream,
                                     sc_error_info* err) {
  if (n < 0) return fail(err, SC_ERR_ARG, 0, 0, n);
  if (vt != SC_F32 && vt != SC_F64) return fail(err, SC_ERR_ARG, 0, 0, vt);
  const uintptr_t bytes = (uintptr_t)n * sc_dtype_size(vt), x0 = (uintptr_t)a, y0 = (uintptr_t)b;
  if (x0 != y0 && n > 0 && x0 < y0 + bytes && y0 < x0 + bytes) return fail(err, SC_ERR_OVERLAP, 1, 0, 0);
  if (n == 0) return SC_OK;
  cudaStream_t s = (cudaStream_t)stream;
  if (vt == SC_F32) add_kernel<float><<<grid_for(n), kThreads, 0, s>>>((float*)a, (const float*)b, n);
  else add_kernel<double><<<grid_for(n), kThreads, 0, s>>>((double*)a, (const double*)b, n);
  SC_CUDA_LAUNCHED();
  return SC_OK;
}

extern "C" int sc_cuda_stream_concat(sc_index_t it, sc_dtype vt, const void* ia, const void* va, int64_t na,
                                     const void* ib, const void* vb, int64_t nb, void* io, void* vo,
                                     sc_stream_t stream, sc_error_info* err) {
  const size_t is = sc_index_size(it), vs = sc_dtype_size(vt);
  if (na < 0) return fail(err, SC_ERR_ARG, 0, 0, na);
  if (nb < 0) return fail(err, SC_ERR_ARG, 1, 0, nb);
  if (!is) return fail(err, SC_ERR_ARG, 0, 0, it);
  if (!vs) return fail(err, SC_ERR_ARG, 0, 0, vt);
  cudaStream_t s = (cudaStream_t)stream;
  int st = it == SC_I32 ? concat_impl<int32_t>((const int32_t*)ia, na, (const int32_t*)ib, nb, s, err)
                        : concat_impl<int64_t>((const int64_t*)ia, na, (const int64_t*)ib, nb, s, err);
  if (st) return st;
  if (na) {
    SC_CUDA_TRY(cudaMemcpyAsync(io, ia, (size_t)na * is, cudaMemcpyDeviceToDevice, s));
    SC_CUDA_TRY(cudaMemcpyAsync(vo, va, (size_t)na * vs, cudaMemcpyDeviceToDevice, s));
  }
  if (nb) {
    SC_CUDA_TRY(cudaMemcpyAsync((char*)io + (size_t)na * is, ib, (size_t)nb * is, cudaMemcpyDeviceToDevice, s));
    SC_CUDA_TRY(cudaMemcpyAsync((char*)vo + (size_t)na * vs, vb, (size_t)nb * vs, cudaMemcpyDeviceToDevice, s));
  }
  return SC_OK;
}

extern "C" int sc_cuda_qsgd_quantize(sc_dtype vt, const void* x, int64_t n, int bits, int64_t bucket,
                                     uint64_t seed, uint8_t* packed, float* scales, sc_stream_t stream,
                                     sc_error_info* err) {
  if (n < 0) return fail(err, SC_ERR_ARG, 0, 0, n);
  if (bits != 4 && bits != 8) return fail(err, SC_ERR_ARG, 1, 0, bits);
  if (bucket < 1 || (bits == 4 && bucket % 2)) return fail(err, SC_ERR_ARG, 2, 0, bucket);
  if (vt != SC_F32 && vt != SC_F64) return fail(err, SC_ERR_ARG, 0, 0, vt);
  if (n == 0) return SC_OK;
  cudaStream_t s = (cudaStream_t)stream;
  const int64_t nb = n / bucket + (n % bucket != 0);
  Scratch scratch(s);
  SC_SCRATCH(slot, unsigned long long, scratch, 1);
  SC_CUDA_TRY(cudaMemsetAsync(slot, 0xFF, sizeof(unsigned long long), s));
  unsigned grid = (unsigned)(nb < 65535 * 16 ? nb : 65535 * 16);
  if (vt == SC_F32) qsgd_scales<float><<<grid, kThreads, 0, s>>>((const float*)x, n, bucket, nb, scales, slot);
  else qsgd_scales<double><<<grid, kThreads, 0, s>>>((const double*)x, n, bucket, nb, scales, slot);
  SC_CUDA_LAUNCHED();
  const int64_t bytes = bits == 8 ? n : (n + 1) / 2;
  if (vt == SC_F32)
    qsgd_levels<float><<<grid_for(bytes), kThreads, 0, s>>>((const float*)x, n, bits, bucket, seed, scales, packed);
  else
    qsgd_levels<double><<<grid_for(bytes), kThreads, 0, s>>>((const double*)x, n, bits, bucket, seed, scales,
                                                              packed);
  SC_CUDA_LAUNCHED();
  unsigned long long bad = kNone;
  SC_CUDA_TRY(cudaMemcpyAsync(&bad, slot, sizeof bad, cudaMemcpyDeviceToHost, s));
  SC_CUDA_TRY(cudaStreamSynchronize(s));
  if (bad != kNone) return fail(err, SC_ERR_NAN, 0, (int64_t)bad, 0);
  return SC_OK;
}

extern "C" int sc_cuda_qsgd_dequantize(sc_dtype vt, const uint8_t* packed, const float* scales, int64_t n,
                                       int bits, int64_t bucket, void* out, sc_stream_t stream,
                                       sc_error_info* err) {
  if (n < 0) return fail(err, SC_ERR_ARG, 0, 0, n);
  if (bits != 4 && bits != 8) return fail(err, SC_ERR_ARG, 1, 0, bits);
  if (bucket < 1 || (bits == 4 && bucket % 2)) return fail(err, SC_ERR_ARG, 2, 0, bucket);
  if (vt != SC_F32 && vt != SC_F64) return fail(err, SC_ERR_ARG, 0, 0, vt);
  if (n == 0) return SC_OK;
  cudaStream_t s = (cudaStream_t)stream;
  const int64_t bytes = (n * bits + 7) / 8, nb = n / bucket + (n % bucket != 0);
  Scratch scratch(s);
  SC_SCRATCH(slots, unsigned long long, scratch, 2);
  SC_CUDA_TRY(cudaMemsetAsync(slots, 0xFF, 2 * sizeof(unsigned long long), s));
  first_bad_kernel<<<grid_for(bytes), kThreads, 0, s>>>(bytes, LevelBad{packed, n, bits}, slots);
  SC_CUDA_LAUNCHED();
  first_bad_kernel<<<grid_for(nb), kThreads, 0, s>>>(nb, ScaleBad{scales}, slots + 1);
  SC_CUDA_LAUNCHED();
  unsigned long long host[2];
  SC_CUDA_TRY(cudaMemcpyAsync(host, slots, sizeof host, cudaMemcpyDeviceToHost, s));
  SC_CUDA_TRY(cudaStreamSynchronize(s));
  if (host[0] != kNone)
    return fail(err, SC_ERR_MALFORMED, 0, (int64_t)host[0], read_back(packed, (int64_t)host[0], s));
  if (host[1] != kNone) {
    float v = 0;
    cudaMemcpy(&v, scales + host[1], sizeof v, cudaMemcpyDeviceToHost);
    uint32_t u;
    memcpy(&u, &v, 4);
    return fail(err, SC_ERR_MALFORMED, 1, (int64_t)host[1], (int64_t)u);
  }
  if (vt == SC_F32) qsgd_decode<float><<<grid_for(n), kThreads, 0, s>>>(packed, scales, n, bits, bucket, (float*)out);
  else qsgd_decode<double><<<grid_for(n), kThreads, 0, s>>>(packed, scales, n, bits, bucket, (double*)out);
  SC_CUDA_LAUNCHED();
  return SC_OK;
}
