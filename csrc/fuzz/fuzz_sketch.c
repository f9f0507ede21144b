/* Fuzz target: the Count-Sketch kernels with fuzzed shapes, seeds, indices
 * and values, against a reference written from the hash family that
 * sparsecomm/sketch.h documents (not from sketch.c).
 *
 * Input: [sel: bit 0 table dtype (f32 / f64), bit 1 value dtype, bits 2-3
 *         nthreads - 1, bit 4 estimate at 0..m-1 (idx NULL)]
 *        [rows u8][cols u16, taken modulo 257][seed u64][n u16][m u8]
 *        [m int64 indices][m values]
 * Invariants: rows outside [1, 64] or cols 0 -> SC_ERR_ARG, table untouched;
 * sc_sketch_build_dense and (indices in [0, n)) sc_sketch_build_coo equal the
 * reference table bit for bit (NaN: any NaN); an index outside [0, n) ->
 * SC_ERR_INDEX_RANGE at the first one, table untouched; sc_sketch_estimate
 * equals the reference median (a negative index: SC_ERR_INDEX_RANGE). */
#include "fuzz_common.h"
#include "sparsecomm/sketch.h"

FZ_NOCOV static void check_estimate(sc_dtype tt, const void* table, int64_t rows, int64_t cols,
                                    uint64_t seed, const int64_t* idx, int64_t m, const void* out) {
  for (int64_t t = 0; t < m; t++) {
    double want;
    if (!ref_sketch_estimate(tt, table, rows, cols, seed, idx ? idx[t] : t, &want)) continue;
    double got = ref_get(tt, out, t);
    FUZZ_CHECK(got == want || (got != got && want != want));
  }
}

FZ_NOCOV int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fz_reader r = {data, size};
  unsigned sel = (unsigned)fz_u(&r, 1);
  sc_dtype tt = (sel & 1) ? SC_F64 : SC_F32, vt = (sel & 2) ? SC_F64 : SC_F32;
  int nt = 1 + (int)((sel >> 2) & 3);
  int64_t rows = (int64_t)fz_u(&r, 1);
  int64_t cols = (int64_t)(fz_u(&r, 2) % 257);
  uint64_t seed = fz_u(&r, 8);
  int64_t n = (int64_t)fz_u(&r, 2);
  int64_t m = (int64_t)fz_u(&r, 1);
  int64_t* idx = (int64_t*)malloc((size_t)m * 8 + 8);
  for (int64_t t = 0; t < m; t++) idx[t] = (int64_t)fz_u(&r, 8);
  size_t ts = sc_dtype_size(tt), vs = sc_dtype_size(vt);
  void* val = malloc((size_t)m * vs + 8);
  for (int64_t t = 0; t < m; t++) {
    uint64_t u = fz_u(&r, (int)vs);
    memcpy((char*)val + vs * t, &u, vs);
  }
  int shape_ok = rows >= 1 && rows <= SC_SKETCH_MAX_ROWS && cols >= 1;
  int64_t cells = shape_ok ? rows * cols : 1;
  void* table = calloc((size_t)cells, ts);
  void* ref = calloc((size_t)cells, ts);
  void* out = malloc((size_t)m * ts + 8);
  sc_error_info e = fz_err();

  int st = sc_sketch_build_dense(tt, table, rows, cols, seed, vt, val, m, nt, &e);
  if (!shape_ok) {
    FUZZ_CHECK(st == SC_ERR_ARG);
    FUZZ_CHECK(sc_sketch_build_coo(tt, table, rows, cols, seed, n, idx, vt, val, m, nt, &e) == SC_ERR_ARG);
    FUZZ_CHECK(sc_sketch_estimate(tt, table, rows, cols, seed, NULL, m, out, nt, &e) == SC_ERR_ARG);
    FUZZ_CHECK(memcmp(table, ref, (size_t)cells * ts) == 0);
  } else {
    FUZZ_CHECK(st == SC_OK);
    ref_sketch_build(tt, ref, rows, cols, seed, NULL, vt, val, m);
    FUZZ_CHECK(ref_same_all(tt, table, ref, cells));

    int64_t bad = -1;
    for (int64_t t = 0; t < m && bad < 0; t++)
      if (idx[t] < 0 || idx[t] >= n) bad = t;
    st = sc_sketch_build_coo(tt, table, rows, cols, seed, n, idx, vt, val, m, nt, &e);
    if (bad >= 0) {
      FUZZ_CHECK(st == SC_ERR_INDEX_RANGE && e.position == bad && e.value == idx[bad]);
    } else {
      FUZZ_CHECK(st == SC_OK);
      ref_sketch_build(tt, ref, rows, cols, seed, idx, vt, val, m);
    }
    FUZZ_CHECK(ref_same_all(tt, table, ref, cells));

    const int64_t* at = (sel & 16) ? NULL : idx;
    int64_t neg = -1;
    for (int64_t t = 0; at && t < m && neg < 0; t++)
      if (at[t] < 0) neg = t;
    st = sc_sketch_estimate(tt, table, rows, cols, seed, at, m, out, nt, &e);
    if (neg >= 0) {
      FUZZ_CHECK(st == SC_ERR_INDEX_RANGE && e.position == neg);
    } else {
      FUZZ_CHECK(st == SC_OK);
      check_estimate(tt, table, rows, cols, seed, at, m, out);
    }
  }
  free(idx);
  free(val);
  free(table);
  free(ref);
  free(out);
  return 0;
}
