/* Count-Sketch kernels (see csrc/include/sparsecomm/sketch.h for the hash family).
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

static inline uint64_t sk_mix(uint64_t z) {
  z ^= z >> 30;
  z *= 0xBF58476D1CE4E5B9ull;
  z ^= z >> 27;
  z *= 0x94D049BB133111EBull;
  z ^= z >> 31;
  return z;
}

static inline uint64_t sk_key(uint64_t seed, int64_t row) {
  return sk_mix(seed + 0x9E3779B97F4A7C15ull * (uint64_t)(row + 1));
}

/* hash of run r = i / 16 in the row with key `key`; its offset bucket and the sign bit of
 * the coordinate with offset o = i % 16 inside the run. */
static inline uint64_t sk_hash(uint64_t key, uint64_t run) { return sk_mix(key ^ run); }
static inline uint64_t sk_base(uint64_t h, uint64_t cols) { return ((h >> 32) * cols) >> 32; }

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
    uint64_t h = sk_hash(key, (uint64_t)(r0 + t));
    base[t] = (uint32_t)sk_base(h, cols);
    bits[t] = (uint32_t)(h & 0xFFFF);
  }
}

/* Bucket and sign bit of single coordinates (idx[t], or i0 + t when idx is NULL): for
 * COO inputs, index lists and the last partial run. */
static inline uint64_t sk_bucket_of(uint64_t h, uint64_t o, uint64_t cols) {
  uint64_t q = sk_base(h, cols) + o;
  return q < cols ? q : (cols >= SK_RUN ? q - cols : q % cols); /* q < cols + 16 */
}

static inline void sk_hash_coords(uint64_t key, const int64_t* idx, int64_t i0, int64_t len,
                                  uint64_t cols, uint32_t* restrict bk, uint32_t* restrict sg) {
  for (int64_t t = 0; t < len; ++t) {
    uint64_t i = idx ? (uint64_t)idx[t] : (uint64_t)(i0 + t), o = i % SK_RUN;
    uint64_t h = sk_hash(key, i / SK_RUN);
    bk[t] = (uint32_t)sk_bucket_of(h, o, cols);
    sg[t] = (uint32_t)((h >> o) & 1);
  }
}

/* Builds: every row is one sequential pass over the input in increasing index order
 * (so every bucket receives its terms in increasing index order: the result cannot
 * depend on the thread count, and a run never hits the same bucket twice when
 * cols >= 16); rows are dealt to threads round-robin. One row (cols x 4 or 8 bytes)
 * stays in L2/L3 for its pass; the input is re-read once per row at streaming speed.
 * Signs are applied as a multiplication by +-1 (exact, and branch-free: a branch on a
 * random sign bit mispredicted half the time and cost 3x). Zero values of a dense input
 * add +-0 (which changes no table entry but a -0.0 the caller put there): skipping
 * all-zero runs saved their read-modify-writes but the check cost as much on dense
 * inputs, which is what gssgd sketches; sparse inputs have sketch_build_coo_. */
#define SK_BUILD(TT, XT)                                                                      \
  static inline void add_run_##TT##_##XT(TT* restrict dst, const XT* restrict src, uint32_t bits) { \
    for (int u = 0; u < SK_RUN; ++u) dst[u] += (TT)src[u] * (TT)(1 - 2 * (int)((bits >> u) & 1)); \
  }                                                                                           \
  SK_CLONES static void build_row_##TT##_##XT(TT* restrict trow, uint64_t cols, uint64_t key,  \
                                              const int64_t* idx, const XT* val, int64_t m) { \
    uint32_t base[SK_RB + SK_PF], bits[SK_RB + SK_PF];                                        \
    if (idx) { /* COO: any order, repeats add up in input order */                            \
      for (int64_t b = 0; b < m; b += SK_RB) {                                                \
        const int64_t len = m - b < SK_RB ? m - b : SK_RB;                                    \
        const int64_t ahead = m - b < SK_RB + SK_PF ? m - b : SK_RB + SK_PF;                  \
        sk_hash_coords(key, idx + b, 0, ahead, cols, base, bits);                             \
        for (int64_t t = 0; t < len; ++t) {                                                   \
          if (t + SK_PF < ahead) __builtin_prefetch(trow + base[t + SK_PF], 1);               \
          XT v = val[b + t];                                                                  \
          if (v == 0) continue;                                                               \
          trow[base[t]] += (TT)v * (TT)(1 - 2 * (int)bits[t]);                                \
        }                                                                                     \
      }                                                                                       \
      return;                                                                                 \
    }                                                                                         \
    const int64_t nruns = m / SK_RUN;                                                         \
    for (int64_t r = 0; r < nruns; r += SK_RB) {                                              \
      const int64_t len = nruns - r < SK_RB ? nruns - r : SK_RB;                              \
      const int64_t ahead = nruns - r < SK_RB + SK_PF ? nruns - r : SK_RB + SK_PF;            \
      sk_hash_runs(key, r, ahead, cols, base, bits);                                          \
      for (int64_t t = 0; t < len; ++t) {                                                     \
        if (t + SK_PF < ahead) {                                                              \
          __builtin_prefetch(trow + base[t + SK_PF], 1);                                      \
          __builtin_prefetch(trow + SK_RUN_LAST(base[t + SK_PF], cols), 1);                   \
        }                                                                                     \
        const XT* src = val + (r + t) * SK_RUN;                                               \
        if (base[t] + (uint64_t)SK_RUN <= cols) {                                             \
          add_run_##TT##_##XT(trow + base[t], src, bits[t]);                                  \
        } else { /* the run wraps around the row end (or cols < 16) */                        \
          for (int u = 0; u < SK_RUN; ++u)                                                    \
            trow[(base[t] + (uint64_t)u) % cols] += (TT)src[u] * (TT)(1 - 2 * (int)((bits[t] >> u) & 1)); \
        }                                                                                     \
      }                                                                                       \
    }                                                                                         \
    const int64_t i0 = nruns * SK_RUN;                                                        \
    sk_hash_coords(key, NULL, i0, m - i0, cols, base, bits);                                  \
    for (int64_t t = 0; t < m - i0; ++t) trow[base[t]] += (TT)val[i0 + t] * (TT)(1 - 2 * (int)bits[t]); \
  }                                                                                           \
  static void build_##TT##_##XT(TT* table, int64_t rows, int64_t cols, uint64_t seed,         \
                                const int64_t* idx, const XT* val, int64_t m, int nt) {       \
    _Pragma("omp parallel for num_threads(nt) schedule(static, 1) if (nt > 1)")               \
    for (int64_t j = 0; j < rows; ++j)                                                        \
      build_row_##TT##_##XT(table + j * cols, (uint64_t)cols, sk_key(seed, j), idx, val, m);  \
  }

SK_BUILD(float, float)
SK_BUILD(float, double)
SK_BUILD(double, float)
SK_BUILD(double, double)

static int check_shape(int64_t rows, int64_t cols) {
  if (rows < 1 || rows > SC_SKETCH_MAX_ROWS) return 1;
  if (cols < 1 || cols > (int64_t)0xFFFFFFFFll) return 2;
  return 0;
}

static int build(int tdt, void* table, int64_t rows, int64_t cols, uint64_t seed,
                 const int64_t* idx, int vdt, const void* val, int64_t m, int nthreads) {
  int st = check_shape(rows, cols);
  if (st) return st;
  int nt = sc_clamp_threads(nthreads);
  if (nt > rows) nt = (int)rows;
  if (m < 65536) nt = 1;
  if (tdt == SC_SK_F32 && vdt == SC_SK_F32) build_float_float(table, rows, cols, seed, idx, val, m, nt);
  else if (tdt == SC_SK_F32 && vdt == SC_SK_F64) build_float_double(table, rows, cols, seed, idx, val, m, nt);
  else if (tdt == SC_SK_F64 && vdt == SC_SK_F32) build_double_float(table, rows, cols, seed, idx, val, m, nt);
  else if (tdt == SC_SK_F64 && vdt == SC_SK_F64) build_double_double(table, rows, cols, seed, idx, val, m, nt);
  else return 3;
  return 0;
}

int sc_sketch_build_dense(int tdt, void* table, int64_t rows, int64_t cols, uint64_t seed,
                          int xdt, const void* x, int64_t n, int nthreads) {
  return build(tdt, table, rows, cols, seed, NULL, xdt, x, n, nthreads);
}

int sc_sketch_build_coo(int tdt, void* table, int64_t rows, int64_t cols, uint64_t seed,
                        const int64_t* idx, int vdt, const void* val, int64_t m, int nthreads) {
  return build(tdt, table, rows, cols, seed, idx, vdt, val, m, nthreads);
}

/* median of r values (r <= SC_SKETCH_MAX_ROWS), insertion sort in place */
#define SK_MEDIAN(TT)                                                 \
  static inline TT median_##TT(TT* a, int64_t r) {                    \
    for (int64_t p = 1; p < r; ++p) {                                 \
      TT v = a[p];                                                    \
      int64_t q = p - 1;                                              \
      while (q >= 0 && a[q] > v) { a[q + 1] = a[q]; --q; }            \
      a[q + 1] = v;                                                   \
    }                                                                 \
    if (r & 1) return a[r / 2];                                       \
    return (TT)((a[r / 2 - 1] + a[r / 2]) / (TT)2);                   \
  }
SK_MEDIAN(float)
SK_MEDIAN(double)

/* Estimates: coordinates in chunks of SK_CHUNK (128 runs); sign * T[j][bucket] of every
 * coordinate of the chunk goes to row j of a rows x SK_CHUNK buffer (L2-resident), then
 * the median over rows is taken per element: branch-free min/max networks for 3, 5 and 7
 * rows (vectorised across elements; the median value of an odd count does not depend on
 * how equal values are ordered), insertion sort otherwise. For all coordinates (idx ==
 * NULL) the hashes of every row's runs are computed first, so the prefetch SK_PF runs
 * ahead runs on from one row into the next without a gap: the table (rows x cols) is
 * larger than L3 at the gssgd default, and an unprefetched run read costs ~4x more.
 * OpenMP over chunks (static): each output element is computed independently, so the
 * thread count cannot matter. */
#ifdef _OPENMP
#define SK_OMP_TID(tid) do { tid = omp_get_thread_num(); } while (0)
#else
#define SK_OMP_TID(tid) do { tid = 0; } while (0)
#endif
#define SK_CE(TT, a, b) do { TT lo_ = a < b ? a : b; TT hi_ = a < b ? b : a; a = lo_; b = hi_; } while (0)

/* per-thread workspace: the rows x SK_CHUNK value buffer, then rows x SK_RB run offsets
 * and sign bits (or SK_CHUNK buckets and signs for an index list) */
static size_t sk_ws_bytes(int64_t rows, size_t esz) {
  size_t hashes = (size_t)rows * SK_RB > SK_CHUNK ? (size_t)rows * SK_RB : SK_CHUNK;
  return esz * (size_t)rows * SK_CHUNK + 2 * sizeof(uint32_t) * hashes;
}

#define SK_ESTIMATE(TT)                                                                      \
  SK_CLONES static void est_chunk_##TT(const TT* table, int64_t rows, uint64_t cols,          \
                                       const uint64_t* keys, const int64_t* idx, int64_t b,   \
                                       int64_t len, TT* restrict dst, TT* restrict buf,       \
                                       uint32_t* restrict base, uint32_t* restrict bits) {    \
    if (idx) {                                                                               \
      for (int64_t j = 0; j < rows; ++j) {                                                   \
        const TT* trow = table + (size_t)j * cols;                                           \
        TT* restrict o = buf + j * SK_CHUNK;                                                 \
        sk_hash_coords(keys[j], idx + b, 0, len, cols, base, bits);                          \
        for (int64_t t = 0; t < len; ++t) {                                                  \
          if (t + SK_PF < len) __builtin_prefetch(trow + base[t + SK_PF]);                   \
          o[t] = trow[base[t]] * (TT)(1 - 2 * (int)bits[t]);                                 \
        }                                                                                    \
      }                                                                                      \
    } else {                                                                                 \
      const int64_t nr = len / SK_RUN, r0 = b / SK_RUN, tail = len - nr * SK_RUN;           \
      for (int64_t j = 0; j < rows; ++j) sk_hash_runs(keys[j], r0, nr, cols, base + j * SK_RB, bits + j * SK_RB); \
      for (int64_t j = 0; j < rows; ++j) {                                                   \
        const TT* trow = table + (size_t)j * cols;                                           \
        const TT* nrow = trow + cols; /* the next row, for prefetches past this one's end */ \
        const uint32_t* bj = base + j * SK_RB;                                               \
        const uint32_t* sj = bits + j * SK_RB;                                               \
        TT* restrict o = buf + j * SK_CHUNK;                                                 \
        for (int64_t t = 0; t < nr; ++t) {                                                   \
          const TT* prow = NULL;                                                             \
          uint64_t pb = 0;                                                                   \
          if (t + SK_PF < nr) { prow = trow; pb = bj[t + SK_PF]; }                           \
          else if (j + 1 < rows && t + SK_PF - nr < nr) { prow = nrow; pb = bj[SK_RB + t + SK_PF - nr]; } \
          if (prow) { __builtin_prefetch(prow + pb); __builtin_prefetch(prow + SK_RUN_LAST(pb, cols)); } \
          TT* restrict ot = o + t * SK_RUN;                                                  \
          const uint64_t q = bj[t];                                                          \
          const uint32_t s = sj[t];                                                          \
          if (q + SK_RUN <= cols) {                                                          \
            const TT* restrict src = trow + q;                                               \
            for (int u = 0; u < SK_RUN; ++u) ot[u] = src[u] * (TT)(1 - 2 * (int)((s >> u) & 1)); \
          } else {                                                                           \
            for (int u = 0; u < SK_RUN; ++u)                                                 \
              ot[u] = trow[(q + (uint64_t)u) % cols] * (TT)(1 - 2 * (int)((s >> u) & 1));    \
          }                                                                                  \
        }                                                                                    \
      }                                                                                      \
      if (tail) { /* the last, partial run of the vector */                                  \
        uint32_t bk[SK_RUN], sg[SK_RUN];                                                     \
        for (int64_t j = 0; j < rows; ++j) {                                                 \
          const TT* trow = table + (size_t)j * cols;                                         \
          sk_hash_coords(keys[j], NULL, b + nr * SK_RUN, tail, cols, bk, sg);                \
          for (int64_t t = 0; t < tail; ++t)                                                 \
            buf[j * SK_CHUNK + nr * SK_RUN + t] = trow[bk[t]] * (TT)(1 - 2 * (int)sg[t]);   \
        }                                                                                    \
      }                                                                                      \
    }                                                                                        \
    const TT* restrict q = buf;                                                              \
    if (rows == 1) {                                                                         \
      for (int64_t t = 0; t < len; ++t) dst[t] = q[t];                                       \
    } else if (rows == 3) {                                                                  \
      for (int64_t t = 0; t < len; ++t) {                                                    \
        TT a0 = q[t], a1 = q[SK_CHUNK + t], a2 = q[2 * SK_CHUNK + t];                        \
        SK_CE(TT, a0, a1); SK_CE(TT, a1, a2); SK_CE(TT, a0, a1);                             \
        dst[t] = a1;                                                                         \
      }                                                                                      \
    } else if (rows == 5) {                                                                  \
      for (int64_t t = 0; t < len; ++t) {                                                    \
        TT a0 = q[t], a1 = q[SK_CHUNK + t], a2 = q[2 * SK_CHUNK + t],                        \
           a3 = q[3 * SK_CHUNK + t], a4 = q[4 * SK_CHUNK + t];                               \
        SK_CE(TT, a0, a3); SK_CE(TT, a1, a4);                                                \
        SK_CE(TT, a0, a2); SK_CE(TT, a1, a3);                                                \
        SK_CE(TT, a0, a1); SK_CE(TT, a2, a4);                                                \
        SK_CE(TT, a1, a2); SK_CE(TT, a3, a4);                                                \
        SK_CE(TT, a2, a3);                                                                   \
        dst[t] = a2;                                                                         \
      }                                                                                      \
    } else if (rows == 7) {                                                                  \
      for (int64_t t = 0; t < len; ++t) {                                                    \
        TT a0 = q[t], a1 = q[SK_CHUNK + t], a2 = q[2 * SK_CHUNK + t],                        \
           a3 = q[3 * SK_CHUNK + t], a4 = q[4 * SK_CHUNK + t],                               \
           a5 = q[5 * SK_CHUNK + t], a6 = q[6 * SK_CHUNK + t];                               \
        SK_CE(TT, a0, a6); SK_CE(TT, a2, a3); SK_CE(TT, a4, a5);                             \
        SK_CE(TT, a0, a2); SK_CE(TT, a1, a4); SK_CE(TT, a3, a6);                             \
        SK_CE(TT, a0, a1); SK_CE(TT, a2, a5); SK_CE(TT, a3, a4);                             \
        SK_CE(TT, a1, a2); SK_CE(TT, a4, a6);                                                \
        SK_CE(TT, a2, a3); SK_CE(TT, a4, a5);                                                \
        SK_CE(TT, a1, a2); SK_CE(TT, a3, a4); SK_CE(TT, a5, a6);                             \
        dst[t] = a3;                                                                         \
      }                                                                                      \
    } else {                                                                                 \
      for (int64_t t = 0; t < len; ++t) {                                                    \
        TT e[SC_SKETCH_MAX_ROWS];                                                            \
        for (int64_t j = 0; j < rows; ++j) e[j] = q[j * SK_CHUNK + t];                       \
        dst[t] = median_##TT(e, rows);                                                       \
      }                                                                                      \
    }                                                                                        \
  }                                                                                          \
  static void estimate_##TT(const TT* table, int64_t rows, int64_t cols, uint64_t seed,       \
                            const int64_t* idx, int64_t m, TT* out, int nt, char* ws,         \
                            size_t ws_bytes) {                                                \
    uint64_t keys[SC_SKETCH_MAX_ROWS];                                                       \
    for (int64_t j = 0; j < rows; ++j) keys[j] = sk_key(seed, j);                            \
    const int64_t nchunks = (m + SK_CHUNK - 1) / SK_CHUNK;                                   \
    _Pragma("omp parallel num_threads(nt) if (nt > 1)")                                      \
    {                                                                                        \
      int tid_ = 0;                                                                          \
      SK_OMP_TID(tid_);                                                                      \
      char* w = ws + (size_t)tid_ * ws_bytes;                                                \
      TT* buf = (TT*)w;                                                                      \
      uint32_t* base = (uint32_t*)(w + sizeof(TT) * (size_t)rows * SK_CHUNK);                \
      uint32_t* bits = base + (rows * SK_RB > SK_CHUNK ? rows * SK_RB : SK_CHUNK);           \
      _Pragma("omp for schedule(static)")                                                    \
      for (int64_t ch = 0; ch < nchunks; ++ch) {                                             \
        const int64_t b = ch * SK_CHUNK, len = m - b < SK_CHUNK ? m - b : SK_CHUNK;          \
        est_chunk_##TT(table, rows, (uint64_t)cols, keys, idx, b, len, out + b, buf, base, bits); \
      }                                                                                      \
    }                                                                                        \
  }
SK_ESTIMATE(float)
SK_ESTIMATE(double)

int sc_sketch_estimate(int tdt, const void* table, int64_t rows, int64_t cols, uint64_t seed,
                       const int64_t* idx, int64_t m, void* out, int nthreads) {
  int st = check_shape(rows, cols);
  if (st) return st;
  if (tdt != SC_SK_F32 && tdt != SC_SK_F64) return 3;
  int nt = sc_clamp_threads(nthreads);
  if (m < 16384) nt = 1;
  int64_t nchunks = (m + SK_CHUNK - 1) / SK_CHUNK;
  if (nt > nchunks) nt = nchunks > 0 ? (int)nchunks : 1;
  size_t esz = tdt == SC_SK_F32 ? sizeof(float) : sizeof(double);
  size_t wsb = (sk_ws_bytes(rows, esz) + 63) & ~(size_t)63;
  char* ws = malloc(wsb * (size_t)nt);
  if (!ws) return 4;
  if (tdt == SC_SK_F32) estimate_float(table, rows, cols, seed, idx, m, out, nt, ws, wsb);
  else estimate_double(table, rows, cols, seed, idx, m, out, nt, ws, wsb);
  free(ws);
  return 0;
}
