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

/* Elements per block: a block of the input stays in L1/L2 while every row of a
 * thread passes over it, so the input is read once from memory per thread. */
#define SK_BLOCK 2048

#define SK_BUILD_DENSE(TT, XT)                                                          \
  static void build_dense_##TT##_##XT(TT* table, int64_t rows, int64_t cols, uint64_t seed, \
                                      const XT* x, int64_t n, int nt) {                 \
    _Pragma("omp parallel num_threads(nt) if (nt > 1)")                                 \
    {                                                                                   \
      int tid = 0, T = 1;                                                               \
      SC_OMP_IDS(tid, T);                                                               \
      for (int64_t b = 0; b < n; b += SK_BLOCK) {                                       \
        int64_t e = b + SK_BLOCK < n ? b + SK_BLOCK : n;                                \
        for (int64_t j = tid; j < rows; j += T) {                                       \
          uint64_t key = sk_key(seed, j);                                               \
          TT* trow = table + j * cols;                                                  \
          for (int64_t i = b; i < e; ++i) {                                             \
            XT v = x[i];                                                                \
            if (v == 0) continue;                                                       \
            uint64_t h = sk_hash(key, (uint64_t)i);                                     \
            TT s = (TT)v;                                                               \
            trow[sk_bucket(h, (uint64_t)cols)] += (h & 1) ? -s : s;                     \
          }                                                                             \
        }                                                                               \
      }                                                                                 \
    }                                                                                   \
  }

#define SK_BUILD_COO(TT, XT)                                                            \
  static void build_coo_##TT##_##XT(TT* table, int64_t rows, int64_t cols, uint64_t seed, \
                                    const int64_t* idx, const XT* val, int64_t m, int nt) { \
    _Pragma("omp parallel num_threads(nt) if (nt > 1)")                                 \
    {                                                                                   \
      int tid = 0, T = 1;                                                               \
      SC_OMP_IDS(tid, T);                                                               \
      for (int64_t b = 0; b < m; b += SK_BLOCK) {                                       \
        int64_t e = b + SK_BLOCK < m ? b + SK_BLOCK : m;                                \
        for (int64_t j = tid; j < rows; j += T) {                                       \
          uint64_t key = sk_key(seed, j);                                               \
          TT* trow = table + j * cols;                                                  \
          for (int64_t t = b; t < e; ++t) {                                             \
            XT v = val[t];                                                              \
            if (v == 0) continue;                                                       \
            uint64_t h = sk_hash(key, (uint64_t)idx[t]);                                \
            TT s = (TT)v;                                                               \
            trow[sk_bucket(h, (uint64_t)cols)] += (h & 1) ? -s : s;                     \
          }                                                                             \
        }                                                                               \
      }                                                                                 \
    }                                                                                   \
  }

#ifdef _OPENMP
#define SC_OMP_IDS(tid, T) do { tid = omp_get_thread_num(); T = omp_get_num_threads(); } while (0)
#else
#define SC_OMP_IDS(tid, T) do { tid = 0; T = 1; } while (0)
#endif

SK_BUILD_DENSE(float, float)
SK_BUILD_DENSE(float, double)
SK_BUILD_DENSE(double, float)
SK_BUILD_DENSE(double, double)
SK_BUILD_COO(float, float)
SK_BUILD_COO(float, double)
SK_BUILD_COO(double, float)
SK_BUILD_COO(double, double)

static int check_shape(int64_t rows, int64_t cols) {
  if (rows < 1 || rows > SC_SKETCH_MAX_ROWS) return 1;
  if (cols < 1 || cols > (int64_t)0xFFFFFFFFll) return 2;
  return 0;
}

int sc_sketch_build_dense(int tdt, void* table, int64_t rows, int64_t cols, uint64_t seed,
                          int xdt, const void* x, int64_t n, int nthreads) {
  int st = check_shape(rows, cols);
  if (st) return st;
  int nt = sc_clamp_threads(nthreads);
  if (nt > rows) nt = (int)rows;
  if (n < 65536) nt = 1;
  if (tdt == SC_SK_F32 && xdt == SC_SK_F32) build_dense_float_float(table, rows, cols, seed, x, n, nt);
  else if (tdt == SC_SK_F32 && xdt == SC_SK_F64) build_dense_float_double(table, rows, cols, seed, x, n, nt);
  else if (tdt == SC_SK_F64 && xdt == SC_SK_F32) build_dense_double_float(table, rows, cols, seed, x, n, nt);
  else if (tdt == SC_SK_F64 && xdt == SC_SK_F64) build_dense_double_double(table, rows, cols, seed, x, n, nt);
  else return 3;
  return 0;
}

int sc_sketch_build_coo(int tdt, void* table, int64_t rows, int64_t cols, uint64_t seed,
                        const int64_t* idx, int vdt, const void* val, int64_t m, int nthreads) {
  int st = check_shape(rows, cols);
  if (st) return st;
  int nt = sc_clamp_threads(nthreads);
  if (nt > rows) nt = (int)rows;
  if (m < 65536) nt = 1;
  if (tdt == SC_SK_F32 && vdt == SC_SK_F32) build_coo_float_float(table, rows, cols, seed, idx, val, m, nt);
  else if (tdt == SC_SK_F32 && vdt == SC_SK_F64) build_coo_float_double(table, rows, cols, seed, idx, val, m, nt);
  else if (tdt == SC_SK_F64 && vdt == SC_SK_F32) build_coo_double_float(table, rows, cols, seed, idx, val, m, nt);
  else if (tdt == SC_SK_F64 && vdt == SC_SK_F64) build_coo_double_double(table, rows, cols, seed, idx, val, m, nt);
  else return 3;
  return 0;
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

#define SK_ESTIMATE(TT)                                                                  \
  static void estimate_##TT(const TT* table, int64_t rows, int64_t cols, uint64_t seed,   \
                            const int64_t* idx, int64_t m, TT* out, int nt) {            \
    uint64_t keys[SC_SKETCH_MAX_ROWS];                                                   \
    for (int64_t j = 0; j < rows; ++j) keys[j] = sk_key(seed, j);                        \
    _Pragma("omp parallel for num_threads(nt) schedule(static) if (nt > 1)")             \
    for (int64_t t = 0; t < m; ++t) {                                                    \
      TT buf[SC_SKETCH_MAX_ROWS];                                                        \
      uint64_t i = idx ? (uint64_t)idx[t] : (uint64_t)t;                                 \
      for (int64_t j = 0; j < rows; ++j) {                                               \
        uint64_t h = sk_hash(keys[j], i);                                                \
        TT v = table[j * cols + sk_bucket(h, (uint64_t)cols)];                           \
        buf[j] = (h & 1) ? -v : v;                                                       \
      }                                                                                  \
      out[t] = median_##TT(buf, rows);                                                   \
    }                                                                                    \
  }
SK_ESTIMATE(float)
SK_ESTIMATE(double)

int sc_sketch_estimate(int tdt, const void* table, int64_t rows, int64_t cols, uint64_t seed,
                       const int64_t* idx, int64_t m, void* out, int nthreads) {
  int st = check_shape(rows, cols);
  if (st) return st;
  int nt = sc_clamp_threads(nthreads);
  if (m < 16384) nt = 1;
  if (tdt == SC_SK_F32) estimate_float(table, rows, cols, seed, idx, m, out, nt);
  else if (tdt == SC_SK_F64) estimate_double(table, rows, cols, seed, idx, m, out, nt);
  else return 3;
  return 0;
}
