// ZEN kernels on the GPU (contract: sparsecomm/cuda.h; the hash partition and class bitmaps:
// sparsecomm/zen.h), with the CPU kernels' results bit for bit: every owner comes from
// sc_zen_block_owner of zen.h, the inline function the CPU kernel calls, and every check
// runs in the CPU kernel's order with its status, position and value.
//
// Partition: the owner of every pair, then CUB's stable radix sort of (owner, position) on
// the owner's bits, so each owner's pairs keep their input (ascending) order, as the CPU's
// counting pass leaves them; a gather moves the pairs, and counts[c] is the length of
// owner c's run in the sorted owners (two binary searches per owner).
//
// Class bitmaps: the owner's blocks, ascending, are selected from all blocks by one owner
// test each (CUB's DeviceSelect::If over the block numbers); an index's class position is
// the rank of its block in that list (a binary search) times `block`, plus its offset in
// the block. Encode: the positions ascend as the indices do, so each byte of the bitmap
// takes its bits from one run of consecutive indices, and the first index of a run writes
// the whole byte (no atomics). Decode: the popcount of every byte, an inclusive scan for
// where its indices go, then one thread per byte writes them.
#include <cub/cub.cuh>
#include <thrust/iterator/counting_iterator.h>

#include "common.cuh"
#include "sparsecomm/zen.h"

namespace {

using namespace sc_cuda;

// The CPU kernel's argument checks (csrc/cpu/zen.c: check_args), in its order.
int check_args(int64_t n, int64_t parts, int64_t block, sc_error_info* err) {
  if (n < 0) return fail(err, SC_ERR_ARG, 1, 0, n);
  if (parts < 1 || parts > SC_ZEN_MAX_PARTS) return fail(err, SC_ERR_ARG, 2, 0, parts);
  if (sc_zen_log2(block) < 0) return fail(err, SC_ERR_ARG, 3, 0, block);
  return SC_OK;
}

int check_class_args(int64_t n, int64_t parts, int64_t block, int64_t owner, sc_error_info* err) {
  int st = check_args(n, parts, block, err);
  if (st) return st;
  if (owner < 0 || owner >= parts) return fail(err, SC_ERR_ARG, 4, 0, owner);
  return SC_OK;
}

int64_t block_count(int64_t n, int64_t block) { return n ? ((n - 1) / block) + 1 : 0; }

// The first position of the sorted a[0, len) not below v.
template <typename T>
__device__ inline int64_t lower_bound(const T* a, int64_t len, uint64_t v) {
  int64_t lo = 0, hi = len;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if ((uint64_t)a[mid] < v)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

// Block b belongs to owner.
struct OwnsBlock {
  uint64_t seed, parts, owner;
  __host__ __device__ bool operator()(int64_t b) const {
    return sc_zen_block_owner(seed, b, parts) == owner;
  }
};

// Index j of idx lies in a block of another owner.
struct OutsideClass {
  const int64_t* idx;
  int lb;
  OwnsBlock owns;
  __device__ bool operator()(int64_t j) const { return !owns(idx[j] >> lb); }
};

struct OwnedBlockCount {
  OwnsBlock owns;
  __device__ unsigned long long operator()(int64_t b) const { return owns(b) ? 1ull : 0ull; }
};

struct BytePopcount {
  const uint8_t* bitmap;
  __device__ unsigned long long operator()(int64_t q) const { return (unsigned long long)__popc(bitmap[q]); }
};

// Sum of f(i) over [0, n): one block-wide sum per block, one atomic add per block.
template <typename F>
__global__ void sum_kernel(int64_t n, F f, unsigned long long* total) {
  using Reduce = cub::BlockReduce<unsigned long long, kThreads>;
  __shared__ typename Reduce::TempStorage temp;
  unsigned long long c = 0;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    c += f(i);
  const unsigned long long b = Reduce(temp).Sum(c);
  if (threadIdx.x == 0 && b) atomicAdd(total, b);
}

// The sum on the host (one stream sync); false on a CUDA error (status in *e).
template <typename F>
bool device_sum(int64_t n, F f, unsigned long long* slot, cudaStream_t s, int64_t* out, cudaError_t* e) {
  unsigned long long h = 0;
  *out = 0;
  *e = cudaSuccess;
  if (n <= 0) return true;
  if ((*e = cudaMemsetAsync(slot, 0, sizeof h, s)) != cudaSuccess) return false;
  sum_kernel<<<grid_for(n), kThreads, 0, s>>>(n, f, slot);
  if ((*e = cudaGetLastError()) != cudaSuccess) return false;
  if ((*e = cudaMemcpyAsync(&h, slot, sizeof h, cudaMemcpyDeviceToHost, s)) != cudaSuccess) return false;
  if ((*e = cudaStreamSynchronize(s)) != cudaSuccess) return false;
  *out = (int64_t)h;
  return true;
}

// Owner's hash class: how many blocks it has, the class size (the CPU kernel's class_size:
// the last block of [0, n) may be short) and, when `list` is given, its blocks ascending
// (device memory from scratch, `blocks` entries).
struct Class {
  int64_t blocks = 0;
  int64_t size = 0;
  int64_t* list = nullptr;
};

int hash_class(int64_t n, int64_t parts, uint64_t seed, int64_t block, int64_t owner, bool list, Scratch& scratch,
               cudaStream_t s, Class* c, sc_error_info* err) {
  const int64_t nblocks = block_count(n, block);
  const OwnsBlock owns{seed, (uint64_t)parts, (uint64_t)owner};
  SC_SCRATCH(slot, unsigned long long, scratch, 1);
  cudaError_t e;
  if (!device_sum(nblocks, OwnedBlockCount{owns}, slot, s, &c->blocks, &e)) return cuda_fail(err, e);
  c->size = c->blocks * block;
  if (nblocks && owns(nblocks - 1)) c->size -= nblocks * block - n; /* the last block is short */
  if (!list) return SC_OK;
  SC_SCRATCH(blocks, int64_t, scratch, c->blocks);
  c->list = blocks;
  if (!c->blocks) return SC_OK;
  thrust::counting_iterator<int64_t> all(0);
  size_t temp_bytes = 0;
  SC_CUDA_TRY(cub::DeviceSelect::If(nullptr, temp_bytes, all, blocks, slot, nblocks, owns, s));
  SC_SCRATCH(temp, unsigned char, scratch, temp_bytes);
  SC_CUDA_TRY(cub::DeviceSelect::If(temp, temp_bytes, all, blocks, slot, nblocks, owns, s));
  return SC_OK;
}

// Strictly ascending in [0, n): the CPU kernel's check_indices (range before order at the
// same position), as SC_ERR_INDEX_RANGE / SC_ERR_INDEX_ORDER of input 0.
int check_indices(const int64_t* idx, int64_t m, int64_t n, Scratch& scratch, cudaStream_t s, sc_error_info* err) {
  if (m <= 0) return SC_OK;
  SC_SCRATCH(slot, unsigned long long, scratch, 1);
  cudaError_t e;
  const int64_t bad = first_bad(m, SortedBad<int64_t>{idx, n}, slot, s, &e);
  if (bad == -2) return cuda_fail(err, e);
  if (bad < 0) return SC_OK;
  const int64_t v = read_back(idx, bad, s);
  return fail(err, v < 0 || v >= n ? SC_ERR_INDEX_RANGE : SC_ERR_INDEX_ORDER, 0, bad, v);
}

// ------------------------------------------------------------------ partition

__global__ void owner_keys(const int64_t* idx, int64_t m, int lb, uint64_t seed, uint64_t parts, uint32_t* key,
                           int64_t* pos) {
  for (int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; j < m; j += (int64_t)gridDim.x * blockDim.x) {
    key[j] = sc_zen_block_owner(seed, idx[j] >> lb, parts);
    pos[j] = j;
  }
}

// Values move as raw elements of their width (2, 4 or 8 bytes).
template <typename W>
__global__ void gather_pairs(const int64_t* order, int64_t m, const int64_t* idx, const W* val, int64_t* out_idx,
                             W* out_val) {
  for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < m; t += (int64_t)gridDim.x * blockDim.x) {
    const int64_t j = order[t];
    out_idx[t] = idx[j];
    out_val[t] = val[j];
  }
}

__global__ void owner_counts(const uint32_t* key, int64_t m, int64_t parts, int64_t* counts) {
  for (int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; c < parts; c += (int64_t)gridDim.x * blockDim.x)
    counts[c] = lower_bound(key, m, (uint64_t)c + 1) - lower_bound(key, m, (uint64_t)c);
}

template <typename W>
int launch_gather(const int64_t* order, int64_t m, const int64_t* idx, const void* val, int64_t* out_idx,
                  void* out_val, cudaStream_t s, sc_error_info* err) {
  gather_pairs<W><<<grid_for(m), kThreads, 0, s>>>(order, m, idx, (const W*)val, out_idx, (W*)out_val);
  SC_CUDA_LAUNCHED();
  return SC_OK;
}

// ------------------------------------------------------------------ bitmaps

// The class position of every index (all in the class, so found in the list).
__global__ void class_positions(const int64_t* idx, int64_t m, int lb, int64_t block, const int64_t* list,
                                int64_t blocks, int64_t* pos) {
  for (int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; j < m; j += (int64_t)gridDim.x * blockDim.x) {
    const int64_t i = idx[j];
    pos[j] = lower_bound(list, blocks, (uint64_t)(i >> lb)) * block + (i & (block - 1));
  }
}

// pos strictly ascending: the first position of each byte's run writes the byte.
__global__ void encode_bytes(const int64_t* pos, int64_t m, uint8_t* bitmap) {
  for (int64_t t = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; t < m; t += (int64_t)gridDim.x * blockDim.x) {
    const int64_t q = pos[t] >> 3;
    if (t > 0 && (pos[t - 1] >> 3) == q) continue;
    unsigned bits = 0;
    for (int64_t u = t; u < m && (pos[u] >> 3) == q; ++u) bits |= 1u << (pos[u] & 7);
    bitmap[q] = (uint8_t)bits;
  }
}

__global__ void byte_popcounts(const uint8_t* bitmap, int64_t nbytes, int64_t* c) {
  for (int64_t q = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; q < nbytes; q += (int64_t)gridDim.x * blockDim.x)
    c[q] = __popc(bitmap[q]);
}

// Byte q's set bits, ascending, at out_idx[end[q] - popcount(q) ...]; every bit is inside
// the class (padding checked zero), so its block is in the list.
__global__ void decode_bytes(const uint8_t* bitmap, int64_t nbytes, const int64_t* end, int lb, int64_t block,
                             const int64_t* list, int64_t* out_idx) {
  for (int64_t q = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; q < nbytes; q += (int64_t)gridDim.x * blockDim.x) {
    unsigned bits = bitmap[q];
    int64_t at = end[q] - __popc(bits);
    while (bits) {
      const int64_t p = q * 8 + (__ffs((int)bits) - 1);
      out_idx[at++] = list[p >> lb] * block + (p & (block - 1));
      bits &= bits - 1;
    }
  }
}

}  // namespace

extern "C" int sc_cuda_zen_partition(sc_dtype vtype, const int64_t* idx, const void* val, int64_t m, int64_t n,
                                     int64_t parts, uint64_t seed, int64_t block, int64_t* out_idx, void* out_val,
                                     int64_t* counts, sc_stream_t stream, sc_error_info* err) {
  int st = check_args(n, parts, block, err);
  if (st) return st;
  const size_t vs = sc_dtype_size(vtype);
  if (vs == 0 || vtype == SC_U8) return fail(err, SC_ERR_ARG, 5, 0, (int64_t)vtype);
  if (m < 0) return fail(err, SC_ERR_ARG, 0, 0, m);
  cudaStream_t s = (cudaStream_t)stream;
  Scratch scratch(s);
  st = check_indices(idx, m, n, scratch, s, err);
  if (st) return st;
  if (m == 0) {
    SC_CUDA_TRY(cudaMemsetAsync(counts, 0, (size_t)parts * sizeof(int64_t), s));
    return SC_OK;
  }
  const int lb = sc_zen_log2(block);
  SC_SCRATCH(key, uint32_t, scratch, m);
  SC_SCRATCH(key_sorted, uint32_t, scratch, m);
  SC_SCRATCH(pos, int64_t, scratch, m);
  SC_SCRATCH(pos_sorted, int64_t, scratch, m);
  int end_bit = 1;  // owners are < parts: sort only their bits
  while (end_bit < 32 && (uint64_t)(parts - 1) >> end_bit) ++end_bit;
  size_t temp_bytes = 0;
  SC_CUDA_TRY(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, key, key_sorted, pos, pos_sorted, m, 0, end_bit,
                                              s));
  SC_SCRATCH(temp, unsigned char, scratch, temp_bytes);
  owner_keys<<<grid_for(m), kThreads, 0, s>>>(idx, m, lb, seed, (uint64_t)parts, key, pos);
  SC_CUDA_LAUNCHED();
  SC_CUDA_TRY(cub::DeviceRadixSort::SortPairs(temp, temp_bytes, key, key_sorted, pos, pos_sorted, m, 0, end_bit, s));
  if (vs == 2)
    st = launch_gather<uint16_t>(pos_sorted, m, idx, val, out_idx, out_val, s, err);
  else if (vs == 4)
    st = launch_gather<uint32_t>(pos_sorted, m, idx, val, out_idx, out_val, s, err);
  else
    st = launch_gather<uint64_t>(pos_sorted, m, idx, val, out_idx, out_val, s, err);
  if (st) return st;
  owner_counts<<<grid_for(parts), kThreads, 0, s>>>(key_sorted, m, parts, counts);
  SC_CUDA_LAUNCHED();
  return SC_OK;
}

extern "C" int sc_cuda_zen_class_size(int64_t n, int64_t parts, uint64_t seed, int64_t block, int64_t owner,
                                      int64_t* size, sc_stream_t stream, sc_error_info* err) {
  int st = check_class_args(n, parts, block, owner, err);
  if (st) return st;
  cudaStream_t s = (cudaStream_t)stream;
  Scratch scratch(s);
  Class c;
  st = hash_class(n, parts, seed, block, owner, false, scratch, s, &c, err);
  if (st) return st;
  *size = c.size;
  return SC_OK;
}

extern "C" int sc_cuda_zen_bitmap_encode(const int64_t* idx, int64_t m, int64_t n, int64_t parts, uint64_t seed,
                                         int64_t block, int64_t owner, uint8_t* bitmap, int64_t nbytes,
                                         sc_stream_t stream, sc_error_info* err) {
  int st = check_class_args(n, parts, block, owner, err);
  if (st) return st;
  cudaStream_t s = (cudaStream_t)stream;
  Scratch scratch(s);
  Class c;
  st = hash_class(n, parts, seed, block, owner, true, scratch, s, &c, err);
  if (st) return st;
  if (nbytes != (c.size + 7) / 8) return fail(err, SC_ERR_ARG, 5, 0, nbytes);
  if (m < 0) return fail(err, SC_ERR_ARG, 0, 0, m);
  st = check_indices(idx, m, n, scratch, s, err);
  if (st) return st;
  const int lb = sc_zen_log2(block);
  if (m) {  // every index in owner's class: an index of another class is SC_ERR_ARG of input 0
    SC_SCRATCH(slot, unsigned long long, scratch, 1);
    cudaError_t e;
    const OwnsBlock owns{seed, (uint64_t)parts, (uint64_t)owner};
    const int64_t bad = first_bad(m, OutsideClass{idx, lb, owns}, slot, s, &e);
    if (bad == -2) return cuda_fail(err, e);
    if (bad >= 0) return fail(err, SC_ERR_ARG, 0, bad, read_back(idx, bad, s));
  }
  if (nbytes) SC_CUDA_TRY(cudaMemsetAsync(bitmap, 0, (size_t)nbytes, s));
  if (!m) return SC_OK;
  SC_SCRATCH(pos, int64_t, scratch, m);
  class_positions<<<grid_for(m), kThreads, 0, s>>>(idx, m, lb, block, c.list, c.blocks, pos);
  SC_CUDA_LAUNCHED();
  encode_bytes<<<grid_for(m), kThreads, 0, s>>>(pos, m, bitmap);
  SC_CUDA_LAUNCHED();
  return SC_OK;
}

extern "C" int sc_cuda_zen_bitmap_decode(const uint8_t* bitmap, int64_t nbytes, int64_t n, int64_t parts,
                                         uint64_t seed, int64_t block, int64_t owner, int64_t* out_idx, int64_t cap,
                                         int64_t* count, sc_stream_t stream, sc_error_info* err) {
  int st = check_class_args(n, parts, block, owner, err);
  if (st) return st;
  cudaStream_t s = (cudaStream_t)stream;
  Scratch scratch(s);
  Class c;
  st = hash_class(n, parts, seed, block, owner, out_idx != nullptr, scratch, s, &c, err);
  if (st) return st;
  const int64_t cs = c.size;
  if (nbytes != (cs + 7) / 8) return fail(err, SC_ERR_MALFORMED, 0, -1, nbytes);
  if (cs & 7) {
    const int64_t last = read_back(bitmap, nbytes - 1, s);
    if (last & (0xFF << (cs & 7)) & 0xFF) return fail(err, SC_ERR_MALFORMED, 0, nbytes - 1, last);
  }
  if (!out_idx) {
    SC_SCRATCH(slot, unsigned long long, scratch, 1);
    cudaError_t e;
    if (!device_sum(nbytes, BytePopcount{bitmap}, slot, s, count, &e)) return cuda_fail(err, e);
    return SC_OK;
  }
  if (nbytes == 0) {
    *count = 0;
    return SC_OK;
  }
  SC_SCRATCH(ones, int64_t, scratch, nbytes);
  SC_SCRATCH(end, int64_t, scratch, nbytes);
  size_t temp_bytes = 0;
  SC_CUDA_TRY(cub::DeviceScan::InclusiveSum(nullptr, temp_bytes, ones, end, nbytes, s));
  SC_SCRATCH(temp, unsigned char, scratch, temp_bytes);
  byte_popcounts<<<grid_for(nbytes), kThreads, 0, s>>>(bitmap, nbytes, ones);
  SC_CUDA_LAUNCHED();
  SC_CUDA_TRY(cub::DeviceScan::InclusiveSum(temp, temp_bytes, ones, end, nbytes, s));
  int64_t total = 0;
  SC_CUDA_TRY(cudaMemcpyAsync(&total, end + nbytes - 1, sizeof total, cudaMemcpyDeviceToHost, s));
  SC_CUDA_TRY(cudaStreamSynchronize(s));
  if (total > cap) return fail(err, SC_ERR_ARG, 0, cap, cap);  // the CPU kernel stops at the (cap+1)-th bit
  decode_bytes<<<grid_for(nbytes), kThreads, 0, s>>>(bitmap, nbytes, end, sc_zen_log2(block), block, c.list, out_idx);
  SC_CUDA_LAUNCHED();
  *count = total;
  return SC_OK;
}
