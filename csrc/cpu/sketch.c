/* Count-Sketch kernels. Contract and hash family: csrc/include/sparsecomm/sketch.h. The
 * build and estimate bodies live in sketch_impl.h, instantiated below once per (table,
 * value) type pair; this file holds the hashes, the tuning knobs and the dispatch.
 *
 * Why runs: a table row (cols floats: 6 MB at the gssgd default for N = 15M) does not
 * fit in L2 and the whole table (42 MB) not even in L3, so a family that sends every
 * coordinate to its own random bucket costs one random cache miss per coordinate and
 * row: ~7 ns per update (build) and ~10 ns per gather (estimate) here, all of it memory
 * latency (the hash itself is ~0.3 ns). The run family sends 16 consecutive coordinates
 * to 16 consecutive buckets at a hashed offset, so one run is one unaligned 16-wide
 * vector read-modify-write (two cache lines) and the random accesses drop 8x, with the
 * same collision probability 1/cols for any two coordinates of different runs. */
#include <stdlib.h>
#include <string.h>

#include "sparsecomm/sketch.h"
#include "common.h"

#define SK_RUN SC_SKETCH_RUN

/* The hash family is sparsecomm/bitexact.h's, shared with the CUDA kernels: the hash of
 * run r = i / 16 in the row with key `key` (sc_sketch_hash) gives its offset bucket
 * (sc_sketch_base) and the sign bit of the coordinate with offset o = i % 16 inside it. */

/* x86-64: an AVX-512 and an AVX2 clone of the hot loops, picked at load time (the run
 * read-modify-writes are one or two vector instructions there; the hashes need 64-bit
 * vector multiplies, which only AVX-512 has). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__has_attribute)
#if __has_attribute(target_clones)
#define SK_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#endif
#endif
#ifndef SK_CLONES
#define SK_CLONES
#endif

/* Runs hashed per block, ahead of the memory accesses, so their addresses are known
 * early and can be prefetched SK_PF runs ahead: without the prefetch the unaligned
 * vector read-modify-writes into an L3-resident row run 4x slower (the out-of-order
 * window covers only a few of them). Measured at N = 15M, 7 x 1.5M: SK_PF = 8 was
 * slower, 16 and 32 equal within noise (32 slightly ahead for builds); SK_RB = 64..256
 * made no difference. 2 MB pages for the table did not help either (not TLB-bound).
 * Both can be overridden with -D to re-tune on another machine. */
#ifndef SK_RB
#define SK_RB 128 /* runs per block; the estimate buffers rows x SK_RB x 16 values */
#endif
#ifndef SK_PF
#define SK_PF 32
#endif
/* the last element of the run at bucket b, kept inside the row: prefetch pointers must not
 * point past the table (the wrapping runs' tails are at the row's start, and not prefetched) */
#define SK_RUN_LAST(b, cols) ((uint64_t)(b) + SK_RUN - 1 < (uint64_t)(cols) ? (uint64_t)(b) + SK_RUN - 1 : (uint64_t)(cols) - 1)
#define SK_CHUNK (SK_RB * SK_RUN)

static inline void sk_hash_runs(uint64_t key, int64_t r0, int64_t len, uint64_t cols,
                                uint32_t* restrict base, uint32_t* restrict bits) {
  for (int64_t t = 0; t < len; ++t) {
    uint64_t h = sc_sketch_hash(key, (uint64_t)(r0 + t));
    base[t] = (uint32_t)sc_sketch_base(h, cols);
    bits[t] = (uint32_t)(h & 0xFFFF);
  }
}

/* Bucket and sign bit of single coordinates (idx[t], or i0 + t when idx is NULL): for
 * COO inputs, index lists and the last partial run. */
static inline uint64_t sk_bucket_of(uint64_t h, uint64_t o, uint64_t cols) {
  uint64_t q = sc_sketch_base(h, cols) + o;
  return q < cols ? q : (cols >= SK_RUN ? q - cols : q % cols); /* q < cols + 16 */
}

static inline void sk_hash_coords(uint64_t key, const int64_t* idx, int64_t i0, int64_t len,
                                  uint64_t cols, uint32_t* restrict bk, uint32_t* restrict sg) {
  for (int64_t t = 0; t < len; ++t) {
    uint64_t i = idx ? (uint64_t)idx[t] : (uint64_t)(i0 + t), o = i % SK_RUN;
    uint64_t h = sc_sketch_hash(key, i / SK_RUN);
    bk[t] = (uint32_t)sk_bucket_of(h, o, cols);
    sg[t] = (uint32_t)((h >> o) & 1);
  }
}

/* A per-thread workspace of the estimate: the rows x SK_CHUNK value buffer, then
 * rows x SK_RB run offsets and sign bits (or SK_CHUNK buckets and signs for an index list). */
static size_t sk_ws_bytes(int64_t rows, size_t esz) {
  size_t hashes = (size_t)rows * SK_RB > SK_CHUNK ? (size_t)rows * SK_RB : SK_CHUNK;
  return esz * (size_t)rows * SK_CHUNK + 2 * sizeof(uint32_t) * hashes;
}

static inline int sk_thread_num(void) {
#ifdef _OPENMP
  return omp_get_thread_num();
#else
  return 0;
#endif
}

/* compare-exchange of the median networks: a = min, b = max (branch-free) */
#define SK_CE(T, a, b) do { T lo_ = a < b ? a : b; T hi_ = a < b ? b : a; a = lo_; b = hi_; } while (0)

/* build kernels for every (table, value) pair; estimate kernels once per table type */
#define SFX f32_f32
#define TT float
#define XT float
#define ESFX f32
#include "sketch_impl.h"
#undef SFX
#undef TT
#undef XT
#undef ESFX

#define SFX f32_f64
#define TT float
#define XT double
#include "sketch_impl.h"
#undef SFX
#undef TT
#undef XT

#define SFX f64_f32
#define TT double
#define XT float
#include "sketch_impl.h"
#undef SFX
#undef TT
#undef XT

#define SFX f64_f64
#define TT double
#define XT double
#define ESFX f64
#include "sketch_impl.h"
#undef SFX
#undef TT
#undef XT
#undef ESFX

/* ------------------------------------------------------------ checks and dispatch */

/* rows in [1, SC_SKETCH_MAX_ROWS] (err->input 0), cols in [1, 2^32 - 1] (err->input 1):
 * buckets are stored as uint32 */
static int check_shape(int64_t rows, int64_t cols, sc_error_info* err) {
  if (rows < 1 || rows > SC_SKETCH_MAX_ROWS) return sc_fail(err, SC_ERR_ARG, 0, 0, rows);
  if (cols < 1 || cols > (int64_t)0xFFFFFFFFll) return sc_fail(err, SC_ERR_ARG, 1, 0, cols);
  return SC_OK;
}

static int is_float(sc_dtype t) { return t == SC_F32 || t == SC_F64; }

/* Every idx[0..m) inside [0, limit) (limit < 0: no upper bound), else SC_ERR_INDEX_RANGE
 * at the first offending position (err->input 0). A parallel flag pass for large m, then
 * a serial scan for the position on the failure path only. */
static int check_indices(const int64_t* idx, int64_t m, int64_t limit, int nthreads,
                         sc_error_info* err) {
  const uint64_t ulim = limit >= 0 ? (uint64_t)limit : (uint64_t)1 << 63; /* negatives >= 2^63 */
  int nt = m < 65536 ? 1 : sc_clamp_threads(nthreads);
  int bad = 0;
  int64_t i;
  (void)nt;
#pragma omp parallel for num_threads(nt) schedule(static) reduction(| : bad) if (nt > 1)
  for (i = 0; i < m; ++i) bad |= (uint64_t)idx[i] >= ulim;
  if (!bad) return SC_OK;
  for (i = 0; (uint64_t)idx[i] < ulim; ++i) {
  }
  return sc_fail(err, SC_ERR_INDEX_RANGE, 0, i, idx[i]);
}

static void build(sc_dtype tdt, void* table, int64_t rows, int64_t cols, uint64_t seed,
                  const int64_t* idx, sc_dtype vdt, const void* val, int64_t m, int nthreads) {
  int nt = sc_clamp_threads(nthreads);
  if (nt > rows) nt = (int)rows;
  if (m < 65536) nt = 1;
  if (tdt == SC_F32 && vdt == SC_F32) build_f32_f32(table, rows, cols, seed, idx, val, m, nt);
  else if (tdt == SC_F32) build_f32_f64(table, rows, cols, seed, idx, val, m, nt);
  else if (vdt == SC_F32) build_f64_f32(table, rows, cols, seed, idx, val, m, nt);
  else build_f64_f64(table, rows, cols, seed, idx, val, m, nt);
}

int sc_sketch_build_dense(sc_dtype table_dtype, void* table, int64_t rows, int64_t cols,
                          uint64_t seed, sc_dtype x_dtype, const void* x, int64_t n,
                          int nthreads, sc_error_info* err) {
  int st = check_shape(rows, cols, err);
  if (st) return st;
  if (!is_float(table_dtype) || !is_float(x_dtype) || n < 0) return SC_ERR_ARG;
  build(table_dtype, table, rows, cols, seed, NULL, x_dtype, x, n, nthreads);
  return SC_OK;
}

int sc_sketch_build_coo(sc_dtype table_dtype, void* table, int64_t rows, int64_t cols,
                        uint64_t seed, int64_t n, const int64_t* idx, sc_dtype val_dtype,
                        const void* val, int64_t m, int nthreads, sc_error_info* err) {
  int st = check_shape(rows, cols, err);
  if (st) return st;
  if (!is_float(table_dtype) || !is_float(val_dtype) || n < 0 || m < 0 || (m && !idx))
    return SC_ERR_ARG;
  /* the indices come from a peer or a user: all in range before the table is touched */
  st = check_indices(idx, m, n, nthreads, err);
  if (st) return st;
  build(table_dtype, table, rows, cols, seed, idx, val_dtype, val, m, nthreads);
  return SC_OK;
}

int sc_sketch_estimate(sc_dtype table_dtype, const void* table, int64_t rows, int64_t cols,
                       uint64_t seed, const int64_t* idx, int64_t m, void* out, int nthreads,
                       sc_error_info* err) {
  int st = check_shape(rows, cols, err);
  if (st) return st;
  if (!is_float(table_dtype) || m < 0) return SC_ERR_ARG;
  if (idx) {
    st = check_indices(idx, m, -1, nthreads, err);
    if (st) return st;
  }
  int nt = sc_clamp_threads(nthreads);
  if (m < 16384) nt = 1;
  int64_t nchunks = (m + SK_CHUNK - 1) / SK_CHUNK;
  if (nt > nchunks) nt = nchunks > 0 ? (int)nchunks : 1;
  size_t esz = table_dtype == SC_F32 ? sizeof(float) : sizeof(double);
  size_t wsb = (sk_ws_bytes(rows, esz) + 63) & ~(size_t)63;
  char* ws = malloc(wsb * (size_t)nt);
  if (!ws) return SC_ERR_NOMEM;
  if (table_dtype == SC_F32) estimate_f32(table, rows, cols, seed, idx, m, out, nt, ws, wsb);
  else estimate_f64(table, rows, cols, seed, idx, m, out, nt, ws, wsb);
  free(ws);
  return SC_OK;
}
