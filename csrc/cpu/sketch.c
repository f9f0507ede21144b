/* Count-Sketch kernels (see csrc/include/sparsecomm/sketch.h for the hash family). */
#include <stdlib.h>
#include <string.h>

#include "sparsecomm/sketch.h"
#include "common.h"

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

/* bucket in [0, cols) and sign bit of coordinate i in the row with key `key`. */
static inline uint64_t sk_hash(uint64_t key, uint64_t i) { return sk_mix(key ^ i); }
static inline int64_t sk_bucket(uint64_t h, uint64_t cols) { return (int64_t)(((h >> 32) * cols) >> 32); }


/* Bucket and sign bit of a block of coordinates (base + t, or idx[t]) for one row: no
 * loop-carried dependence, so it vectorises (on x86-64 a clone for AVX-512, which has a
 * 64-bit vector multiply, is picked at load time). Hashing a block ahead of the table
 * updates matters more than the hash itself: with the hash fused into the update loop
 * the store addresses are known late and the scatter ran ~4x slower than hash + scatter. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__has_attribute)
#if __has_attribute(target_clones)
#define SK_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#endif
#endif
#ifndef SK_CLONES
#define SK_CLONES
#endif
#define SK_HBLOCK 1024

SK_CLONES static void sk_hash_block(uint64_t key, const int64_t* idx, int64_t base, int64_t len,
                                    uint64_t cols, uint32_t* restrict bk, uint32_t* restrict sg) {
  if (idx) {
    for (int64_t t = 0; t < len; ++t) {
      uint64_t h = sk_hash(key, (uint64_t)idx[t]);
      bk[t] = (uint32_t)(((h >> 32) * cols) >> 32);
      sg[t] = (uint32_t)(h & 1);
    }
  } else {
    for (int64_t t = 0; t < len; ++t) {
      uint64_t h = sk_hash(key, (uint64_t)(base + t));
      bk[t] = (uint32_t)(((h >> 32) * cols) >> 32);
      sg[t] = (uint32_t)(h & 1);
    }
  }
}

/* Builds: every row is one sequential pass over the whole input in increasing index
 * order (the result cannot depend on the thread count); rows are dealt to threads
 * round-robin. One row of the table (cols x 4 or 8 bytes) stays in L2 for its pass,
 * where interleaving all rows per input block thrashed L2 with random writes into the
 * whole table; the input is re-read once per row, from L3 or memory at streaming speed.
 * Zero values are skipped (sparse inputs skip the hash too; on dense inputs the branch
 * is predicted). */
/* One builder for both inputs: idx == NULL means a dense vector (coordinate = position). */
#define SK_BUILD(TT, XT)                                                                \
  static void build_##TT##_##XT(TT* table, int64_t rows, int64_t cols, uint64_t seed,   \
                                    const int64_t* idx, const XT* val, int64_t m, int nt) { \
    const uint64_t c = (uint64_t)cols;                                                  \
    _Pragma("omp parallel for num_threads(nt) schedule(static, 1) if (nt > 1)")         \
    for (int64_t j = 0; j < rows; ++j) {                                                \
      const uint64_t key = sk_key(seed, j);                                             \
      TT* restrict trow = table + j * cols;                                             \
      uint32_t bk[SK_HBLOCK], sg[SK_HBLOCK];                                            \
      for (int64_t b = 0; b < m; b += SK_HBLOCK) {                                      \
        const int64_t len = m - b < SK_HBLOCK ? m - b : SK_HBLOCK;                      \
        sk_hash_block(key, idx ? idx + b : NULL, b, len, c, bk, sg);                    \
        for (int64_t t = 0; t < len; ++t) {                                             \
          XT v = val[b + t];                                                            \
          if (v == 0) continue;                                                         \
          TT s = (TT)v;                                                                 \
          trow[bk[t]] += sg[t] ? -s : s;                                                \
        }                                                                               \
      }                                                                                 \
    }                                                                                   \
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

/* Estimates: coordinates in chunks of SK_CHUNK; for each row one tight pass over the
 * chunk writes sign * T[j][bucket] into row j of a rows x SK_CHUNK buffer, then the
 * median over rows is taken per element: branch-free min/max networks for 3, 5 and 7
 * rows (vectorised across elements; the median value of an odd count does not depend on
 * how equal values are ordered), insertion sort otherwise. OpenMP over chunks (static):
 * each output element is computed independently, so the thread count cannot matter. */
#define SK_CHUNK 1024
#ifdef _OPENMP
#define SK_OMP_TID(tid) do { tid = omp_get_thread_num(); } while (0)
#else
#define SK_OMP_TID(tid) do { tid = 0; } while (0)
#endif
#define SK_CE(TT, a, b) do { TT lo_ = a < b ? a : b; TT hi_ = a < b ? b : a; a = lo_; b = hi_; } while (0)

#define SK_ESTIMATE(TT)                                                                  \
  static void estimate_##TT(const TT* table, int64_t rows, int64_t cols, uint64_t seed,   \
                            const int64_t* idx, int64_t m, TT* out, int nt, TT* bufs) {  \
    uint64_t keys[SC_SKETCH_MAX_ROWS];                                                   \
    const uint64_t c = (uint64_t)cols;                                                   \
    for (int64_t j = 0; j < rows; ++j) keys[j] = sk_key(seed, j);                        \
    const int64_t nchunks = (m + SK_CHUNK - 1) / SK_CHUNK;                               \
    _Pragma("omp parallel num_threads(nt) if (nt > 1)")                                  \
    {                                                                                    \
      int tid_ = 0;                                                                      \
      SK_OMP_TID(tid_);                                                                  \
      TT* buf = bufs + (size_t)tid_ * (size_t)rows * SK_CHUNK;                           \
      _Pragma("omp for schedule(static)")                                                \
      for (int64_t ch = 0; ch < nchunks; ++ch) {                                         \
        const int64_t b = ch * SK_CHUNK, len = m - b < SK_CHUNK ? m - b : SK_CHUNK;      \
        for (int64_t j = 0; j < rows; ++j) {                                             \
          const TT* restrict trow = table + j * cols;                                    \
          TT* restrict o = buf + j * SK_CHUNK;                                           \
          const uint64_t key = keys[j];                                                  \
          uint32_t bk[SK_CHUNK], sg[SK_CHUNK];                                           \
          sk_hash_block(key, idx ? idx + b : NULL, b, len, c, bk, sg);                   \
          for (int64_t t = 0; t < len; ++t) {                                            \
            TT v = trow[bk[t]];                                                          \
            o[t] = sg[t] ? -v : v;                                                       \
          }                                                                              \
        }                                                                                \
        TT* restrict dst = out + b;                                                      \
        const TT* restrict q = buf;                                                      \
        if (rows == 1) {                                                                 \
          for (int64_t t = 0; t < len; ++t) dst[t] = q[t];                               \
        } else if (rows == 3) {                                                          \
          for (int64_t t = 0; t < len; ++t) {                                            \
            TT a0 = q[t], a1 = q[SK_CHUNK + t], a2 = q[2 * SK_CHUNK + t];                \
            SK_CE(TT, a0, a1); SK_CE(TT, a1, a2); SK_CE(TT, a0, a1);                                 \
            dst[t] = a1;                                                                 \
          }                                                                              \
        } else if (rows == 5) {                                                          \
          for (int64_t t = 0; t < len; ++t) {                                            \
            TT a0 = q[t], a1 = q[SK_CHUNK + t], a2 = q[2 * SK_CHUNK + t],                \
               a3 = q[3 * SK_CHUNK + t], a4 = q[4 * SK_CHUNK + t];                       \
            SK_CE(TT, a0, a3); SK_CE(TT, a1, a4);                                                \
            SK_CE(TT, a0, a2); SK_CE(TT, a1, a3);                                                \
            SK_CE(TT, a0, a1); SK_CE(TT, a2, a4);                                                \
            SK_CE(TT, a1, a2); SK_CE(TT, a3, a4);                                                \
            SK_CE(TT, a2, a3);                                                               \
            dst[t] = a2;                                                                 \
          }                                                                              \
        } else if (rows == 7) {                                                          \
          for (int64_t t = 0; t < len; ++t) {                                            \
            TT a0 = q[t], a1 = q[SK_CHUNK + t], a2 = q[2 * SK_CHUNK + t],                \
               a3 = q[3 * SK_CHUNK + t], a4 = q[4 * SK_CHUNK + t],                       \
               a5 = q[5 * SK_CHUNK + t], a6 = q[6 * SK_CHUNK + t];                       \
            SK_CE(TT, a0, a6); SK_CE(TT, a2, a3); SK_CE(TT, a4, a5);                                 \
            SK_CE(TT, a0, a2); SK_CE(TT, a1, a4); SK_CE(TT, a3, a6);                                 \
            SK_CE(TT, a0, a1); SK_CE(TT, a2, a5); SK_CE(TT, a3, a4);                                 \
            SK_CE(TT, a1, a2); SK_CE(TT, a4, a6);                                                \
            SK_CE(TT, a2, a3); SK_CE(TT, a4, a5);                                                \
            SK_CE(TT, a1, a2); SK_CE(TT, a3, a4); SK_CE(TT, a5, a6);                                 \
            dst[t] = a3;                                                                 \
          }                                                                              \
        } else {                                                                         \
          for (int64_t t = 0; t < len; ++t) {                                            \
            TT e[SC_SKETCH_MAX_ROWS];                                                    \
            for (int64_t j = 0; j < rows; ++j) e[j] = q[j * SK_CHUNK + t];               \
            dst[t] = median_##TT(e, rows);                                               \
          }                                                                              \
        }                                                                                \
      }                                                                                  \
    }                                                                                    \
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
  void* bufs = malloc(esz * (size_t)nt * (size_t)rows * SK_CHUNK);
  if (!bufs) return 4;
  if (tdt == SC_SK_F32) estimate_float(table, rows, cols, seed, idx, m, out, nt, bufs);
  else estimate_double(table, rows, cols, seed, idx, m, out, nt, bufs);
  free(bufs);
  return 0;
}
