/*
 * Exact top-k by magnitude (see include/sparsecomm/kernels.h for the contract
 * and topk_impl.h for the algorithm).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sparsecomm/kernels.h"
#include "common.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

/* Inputs up to this size take the serial quickselect path. */
#define SC_SMALL_N 65536

/*
 * Candidate-buffer cache of the top-k fast path: one set of per-thread
 * buffers, used by one call at a time (others allocate their own), so a
 * training loop does not pay fresh multi-MB allocations (page faults and
 * zeroing) on every call. Bounded: buffers above SC_TOPK_CACHE_MAX_BYTES in
 * total are released when the call ends; sc_topk_release_cache() frees them.
 */
typedef struct {
  void* b;
  int64_t* i;
  size_t bbytes, ibytes;
} sc_cbuf_slot;

static sc_cbuf_slot sc_cache_slots[SC_MAX_THREADS];
static int sc_cache_busy = 0;

static int sc_cache_acquire(void) {
  return __atomic_exchange_n(&sc_cache_busy, 1, __ATOMIC_ACQUIRE) == 0;
}

/* Bytes held by the slots (caller holds the cache). */
static size_t sc_cache_held(void) {
  size_t total = 0;
  for (int u = 0; u < SC_MAX_THREADS; u++)
    total += sc_cache_slots[u].bbytes + sc_cache_slots[u].ibytes;
  return total;
}

static size_t sc_cache_free_all(void) {
  size_t total = sc_cache_held();
  for (int u = 0; u < SC_MAX_THREADS; u++) {
    free(sc_cache_slots[u].b);
    free(sc_cache_slots[u].i);
    memset(&sc_cache_slots[u], 0, sizeof(sc_cache_slots[u]));
  }
  return total;
}

static void sc_cache_release(void) {
  if (sc_cache_held() > SC_TOPK_CACHE_MAX_BYTES) (void)sc_cache_free_all();
  __atomic_store_n(&sc_cache_busy, 0, __ATOMIC_RELEASE);
}

size_t sc_topk_release_cache(void) {
  if (!sc_cache_acquire()) return 0; /* a call is using it: it keeps its buffers */
  size_t freed = sc_cache_free_all();
  __atomic_store_n(&sc_cache_busy, 0, __ATOMIC_RELEASE);
  return freed;
}

size_t sc_topk_cache_bytes(void) {
  if (!sc_cache_acquire()) return 0;
  size_t held = sc_cache_held();
  __atomic_store_n(&sc_cache_busy, 0, __ATOMIC_RELEASE);
  return held;
}

/*
 * AVX2 for the fused add + filter pass (float32), chosen at run time: the
 * build targets baseline x86-64 (SSE2), and the 256-bit body cuts the pass's
 * instructions by half (docs/kernels.md). sc_topk_set_avx2(0) forces the SSE2
 * body (the tests run both).
 */
#if (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__)) && \
    !defined(SC_NO_AVX2)
#include <immintrin.h>
#define SC_TOPK_AVX2 1
static int sc_avx2_allowed = 1;
static int sc_topk_use_avx2(void) {
  return __atomic_load_n(&sc_avx2_allowed, __ATOMIC_RELAXED) && __builtin_cpu_supports("avx2");
}
#endif

int sc_topk_set_avx2(int allow) {
#ifdef SC_TOPK_AVX2
  __atomic_store_n(&sc_avx2_allowed, allow != 0, __ATOMIC_RELAXED);
  return sc_topk_use_avx2();
#else
  (void)allow;
  return 0;
#endif
}

#define SFX u32
#define FT float
#define BITS uint32_t
#define SIGNREP 0x8000000080000000ull
#define KEYBITS 31
#define KMASK 0x7FFFFFFFu
#include "topk_impl.h"
#undef SFX
#undef FT
#undef BITS
#undef SIGNREP
#undef KEYBITS
#undef KMASK
#undef SC_TOPK_AVX2

#define SFX u64
#define FT double
#define BITS uint64_t
#define SIGNREP 0x8000000000000000ull
#define KEYBITS 63
#define KMASK 0x7FFFFFFFFFFFFFFFull
#include "topk_impl.h"
#undef SFX
#undef FT
#undef BITS
#undef SIGNREP
#undef KEYBITS
#undef KMASK

#define SFX u16
#define BITS uint16_t
#define SIGNREP 0x8000800080008000ull
#define KEYBITS 15
#define KMASK 0x7FFFu
#include "topk_impl.h"
#undef SFX
#undef FT
#undef BITS
#undef SIGNREP
#undef KEYBITS
#undef KMASK

/* Position of the first NaN of x (error path only: the selection found one). */
static int64_t first_nan(sc_dtype dtype, const void* x, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    int nan = 0;
    switch (dtype) {
      case SC_F32: nan = (((const uint32_t*)x)[i] & 0x7FFFFFFFu) > 0x7F800000u; break;
      case SC_F64: nan = (((const uint64_t*)x)[i] & 0x7FFFFFFFFFFFFFFFull) > 0x7FF0000000000000ull; break;
      case SC_F16: nan = (((const uint16_t*)x)[i] & 0x7FFFu) > 0x7C00u; break;
      case SC_BF16: nan = (((const uint16_t*)x)[i] & 0x7FFFu) > 0x7F80u; break;
      default: return 0;
    }
    if (nan) return i;
  }
  return 0;
}

/* Fills err for a kernel status: a NaN's position is found here, off the hot path. */
static int topk_fail(int st, sc_dtype dtype, const void* x, int64_t n, sc_error_info* err) {
  return sc_fail(err, st, 0, st == SC_ERR_NAN ? first_nan(dtype, x, n) : 0, 0);
}

int sc_topk_path(sc_topk_path_t path, sc_dtype dtype, const void* x, int64_t n, int64_t k,
                 int nthreads, void* out_vals, int64_t* out_idx, sc_error_info* err) {
  if (n < 0) return sc_fail(err, SC_ERR_ARG, 0, 0, n);
  if (k < 0) return sc_fail(err, SC_ERR_ARG, 1, 0, k);
  if (path != SC_TOPK_AUTO && path != SC_TOPK_RADIX) return sc_fail(err, SC_ERR_ARG, 2, 0, path);
  const int nt = sc_clamp_threads(nthreads), radix = path == SC_TOPK_RADIX;
  int st;
  switch (dtype) {
    case SC_F32:
      st = topk_core_u32((const uint32_t*)x, 0, n, k, 0x7F800000u, nt, radix,
                         (uint32_t*)out_vals, out_idx);
      break;
    case SC_F64:
      st = topk_core_u64((const uint64_t*)x, 0, n, k, 0x7FF0000000000000ull, nt, radix,
                         (uint64_t*)out_vals, out_idx);
      break;
    case SC_F16:
      st = topk_core_u16((const uint16_t*)x, 0, n, k, 0x7C00u, nt, radix,
                         (uint16_t*)out_vals, out_idx);
      break;
    case SC_BF16:
      st = topk_core_u16((const uint16_t*)x, 0, n, k, 0x7F80u, nt, radix,
                         (uint16_t*)out_vals, out_idx);
      break;
    default:
      return sc_fail(err, SC_ERR_ARG, 0, 0, dtype);
  }
  return st ? topk_fail(st, dtype, x, n, err) : SC_OK;
}

int sc_topk(sc_dtype dtype, const void* x, int64_t n, int64_t k, int nthreads,
            void* out_vals, int64_t* out_idx, sc_error_info* err) {
  return sc_topk_path(SC_TOPK_AUTO, dtype, x, n, k, nthreads, out_vals, out_idx, err);
}

int64_t sc_block_topk_count(int64_t n, int64_t num_blocks, int64_t k_per_block) {
  if (n <= 0 || num_blocks < 1 || k_per_block <= 0) return 0;
  int64_t total = 0;
  /* blocks have length floor(n/B) or floor(n/B)+1 */
  int64_t q = n / num_blocks, r = n % num_blocks;
  int64_t big = r, small = num_blocks - r; /* r blocks of q+1, B-r of q */
  total += big * (k_per_block < q + 1 ? k_per_block : q + 1);
  total += small * (k_per_block < q ? k_per_block : q);
  return total;
}

int sc_block_topk(sc_dtype dtype, const void* x, int64_t n, int64_t num_blocks,
                  int64_t k_per_block, int nthreads, void* out_vals,
                  int64_t* out_idx, sc_error_info* err) {
  if (n < 0) return sc_fail(err, SC_ERR_ARG, 0, 0, n);
  if (num_blocks < 1) return sc_fail(err, SC_ERR_ARG, 1, 0, num_blocks);
  if (k_per_block < 0) return sc_fail(err, SC_ERR_ARG, 2, 0, k_per_block);
  if (n == 0) return SC_OK;
  const int nt = sc_clamp_threads(nthreads);
  int st;
  switch (dtype) {
    case SC_F32:
      st = block_topk_u32((uint32_t*)x, NULL, 0, n, num_blocks, k_per_block, 0x7F800000u, nt,
                          (uint32_t*)out_vals, out_idx);
      break;
    case SC_F64:
      st = block_topk_u64((uint64_t*)x, NULL, 0, n, num_blocks, k_per_block,
                          0x7FF0000000000000ull, nt, (uint64_t*)out_vals, out_idx);
      break;
    case SC_F16:
      st = block_topk_u16((uint16_t*)x, NULL, 0, n, num_blocks, k_per_block, 0x7C00u, nt,
                          (uint16_t*)out_vals, out_idx);
      break;
    case SC_BF16:
      st = block_topk_u16((uint16_t*)x, NULL, 0, n, num_blocks, k_per_block, 0x7F80u, nt,
                          (uint16_t*)out_vals, out_idx);
      break;
    default:
      return sc_fail(err, SC_ERR_ARG, 0, 0, dtype);
  }
  return st ? topk_fail(st, dtype, x, n, err) : SC_OK;
}

/* [a, a + an) and [b, b + bn) share a byte */
static int topk_overlaps(const void* a, size_t an, const void* b, size_t bn) {
  const char *x = (const char*)a, *y = (const char*)b;
  return an && bn && x < y + bn && y < x + an;
}

int sc_block_topk_accum(sc_dtype dtype, void* acc, const void* g, int64_t n, int64_t num_blocks,
                        int64_t k_per_block, int clear, int nthreads, void* out_vals,
                        int64_t* out_idx, sc_error_info* err) {
  if (n < 0) return sc_fail(err, SC_ERR_ARG, 0, 0, n);
  if (num_blocks < 1) return sc_fail(err, SC_ERR_ARG, 2, 0, num_blocks);
  if (k_per_block < 0) return sc_fail(err, SC_ERR_ARG, 3, 0, k_per_block);
  if (dtype != SC_F32 && dtype != SC_F64) return sc_fail(err, SC_ERR_ARG, 0, 0, dtype);
  const size_t w = sc_dtype_size(dtype);
  const int64_t m = sc_block_topk_count(n, num_blocks, k_per_block);
  /* acc is written while g is read and the outputs are written: no shared bytes */
  if (topk_overlaps(acc, (size_t)n * w, g, (size_t)n * w)) return sc_fail(err, SC_ERR_OVERLAP, 1, 0, 0);
  if (topk_overlaps(acc, (size_t)n * w, out_vals, (size_t)m * w))
    return sc_fail(err, SC_ERR_OVERLAP, 4, 0, 0);
  if (topk_overlaps(acc, (size_t)n * w, out_idx, (size_t)m * sizeof(int64_t)))
    return sc_fail(err, SC_ERR_OVERLAP, 5, 0, 0);
  if (n == 0) return SC_OK;
  const int nt = sc_clamp_threads(nthreads);
  int st;
  if (dtype == SC_F32)
    st = block_topk_u32((uint32_t*)acc, (const uint32_t*)g, clear, n, num_blocks, k_per_block,
                        0x7F800000u, nt, (uint32_t*)out_vals, out_idx);
  else
    st = block_topk_u64((uint64_t*)acc, (const uint64_t*)g, clear, n, num_blocks, k_per_block,
                        0x7FF0000000000000ull, nt, (uint64_t*)out_vals, out_idx);
  /* clear: block_topk set +0.0 at the selected positions (what leaves the residual) */
  if (st) return topk_fail(st, dtype, acc, n, err);
  return SC_OK;
}
