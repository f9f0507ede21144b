/* Fuzz target: the SKCompress body decoder (sparsecomm/skcompress.h), and the encoder
 * on fuzzed vectors.
 *
 * Input: [sel: bit 0 value dtype (f32 / f64), bit 1 expect the codecs the body names
 *         (else -1), bit 7 encoder mode][N u32 (+1)][count u16][the rest]
 * Decoder mode: the rest is a body (heap copy of exactly its length). Invariants:
 * sc_skc_decode returns SC_OK or SC_ERR_MALFORMED (count is first bounded by the body as
 * the binding does: count <= 4 len and <= N); on SC_OK the keys are strictly ascending
 * and < N and, with the skcompress value codec, every value is finite.
 * Encoder mode: the rest gives [index codec, value codec, q/2 - 1, s - 1, t / 16, r - 1,
 * m code, prefix, exact_max / 8] then count (at most 16384) (u32 key gap, f32 value) pairs
 * (zeros past the input); keys beyond N stop the vector.
 * Invariants: valid options encode to a body that decodes to the same keys (values
 * bit-identical with the raw value codec; same sign otherwise), within the bound.
 * Both modes, where the CPU runs the SIMD cell indices: the baseline twin
 * (sc_skc_set_simd(0)) gives the same body, and the same verdict and vector. */
#include <math.h>

#include "fuzz_common.h"
#include "sparsecomm/skcompress.h"

FZ_NOCOV static void decoder_mode(const uint8_t* body, size_t len, int64_t N, int64_t count,
                                  sc_dtype vt, int expect) {
  int ic = -1, vc = -1;
  if (expect && len >= SC_SKC_BODY_HEAD) { ic = body[0]; vc = body[1]; }
  if (count > (int64_t)len * 4 || count > N) return; /* the binding rejects these first */
  int64_t* idx = (int64_t*)malloc(sizeof(int64_t) * (size_t)(count + 1));
  double* val = (double*)malloc(sizeof(double) * (size_t)(count + 1));
  sc_error_info e = fz_err();
  int st = sc_skc_decode(body, (int64_t)len, N, count, vt, ic, vc, idx, val, &e);
  FUZZ_CHECK(st == SC_OK || st == SC_ERR_MALFORMED);
  if (sc_skc_set_simd(1) > 0) { /* the baseline cell indices: the same verdict and vector */
    int64_t* bi = (int64_t*)malloc(sizeof(int64_t) * (size_t)(count + 1));
    double* bv = (double*)malloc(sizeof(double) * (size_t)(count + 1));
    sc_skc_set_simd(0);
    int bst = sc_skc_decode(body, (int64_t)len, N, count, vt, ic, vc, bi, bv, NULL);
    sc_skc_set_simd(1);
    FUZZ_CHECK(bst == st);
    if (st == SC_OK && count) {
      FUZZ_CHECK(memcmp(bi, idx, sizeof(int64_t) * (size_t)count) == 0);
      FUZZ_CHECK(memcmp(bv, val, (vt == SC_F32 ? 4 : 8) * (size_t)count) == 0);
    }
    free(bi);
    free(bv);
  }
  if (st == SC_OK) {
    for (int64_t i = 0; i < count; i++) {
      FUZZ_CHECK(idx[i] >= 0 && idx[i] < N && (i == 0 || idx[i] > idx[i - 1]));
      if (len >= 2 && body[1] == SC_SKC_VALUE_SKETCH) {
        double x = vt == SC_F32 ? (double)((float*)val)[i] : val[i];
        FUZZ_CHECK(isfinite(x));
      }
    }
  }
  free(idx);
  free(val);
}

FZ_NOCOV static void encoder_mode(fz_reader* r, int64_t N, int64_t count) {
  sc_skc_options o;
  o.index_codec = (int)(fz_u(r, 1) % 2);
  o.value_codec = (int)(fz_u(r, 1) % 2);
  o.q = 2 * (1 + (int64_t)fz_u(r, 1));
  o.s = 1 + (int64_t)(fz_u(r, 1) % 16);
  o.t = (1 + (double)fz_u(r, 1)) / 16.0;
  o.r = 1 + (int64_t)fz_u(r, 1);
  o.m = (int64_t[]){0, 2, 4, 8, 16}[fz_u(r, 1) % 5];
  o.prefix = (int)(fz_u(r, 1) % 3);
  o.exact_max = (int64_t)(fz_u(r, 1) * 8);
  if (count > 16384) count = 16384; /* past SKC_KEY_SPLIT: two key streams */
  int64_t* idx = (int64_t*)malloc(sizeof(int64_t) * (size_t)(count + 1));
  float* val = (float*)malloc(sizeof(float) * (size_t)(count + 1));
  int64_t n = 0, key = -1;
  for (int64_t i = 0; i < count; i++) {
    uint64_t gap = fz_u(r, 4);
    uint32_t bits = (uint32_t)fz_u(r, 4);
    float v;
    memcpy(&v, &bits, 4);
    if (!isfinite(v)) v = 0.5f;
    if ((uint64_t)(N - 1 - key) <= gap) break;
    key += 1 + (int64_t)gap;
    idx[n] = key;
    val[n] = v;
    n++;
  }
  int valid = sc_skc_check_options(&o, NULL) == SC_OK;
  int64_t cap = valid ? sc_skc_encode_bound(&o, N, SC_F32, n) : 64;
  uint8_t* body = (uint8_t*)malloc((size_t)cap);
  int64_t len = -1;
  float* sent = (float*)malloc(sizeof(float) * (size_t)(n + 1));
  int st = sc_skc_encode(&o, N, idx, SC_F32, val, n, body, cap, &len, sent, NULL);
  FUZZ_CHECK(valid ? st == SC_OK : st == SC_ERR_ARG);
  if (st == SC_OK) {
    FUZZ_CHECK(len >= SC_SKC_BODY_HEAD && len <= cap);
    int64_t* di = (int64_t*)malloc(sizeof(int64_t) * (size_t)(n + 1));
    float* dv = (float*)malloc(sizeof(float) * (size_t)(n + 1));
    uint8_t* exact = fz_dup(body, (size_t)len);
    FUZZ_CHECK(sc_skc_decode(exact, len, N, n, SC_F32, o.index_codec, o.value_codec, di, dv, NULL) == SC_OK);
    for (int64_t i = 0; i < n; i++) {
      FUZZ_CHECK(di[i] == idx[i]);
      FUZZ_CHECK(memcmp(&dv[i], &sent[i], 4) == 0); /* the encoder's decoded values */
      if (o.value_codec == SC_SKC_VALUE_RAW)
        FUZZ_CHECK(memcmp(&dv[i], &val[i], 4) == 0);
      else
        FUZZ_CHECK(val[i] >= 0 ? dv[i] >= 0 : dv[i] <= 0);
    }
    if (sc_skc_set_simd(1) > 0) { /* the baseline cell indices write the same body */
      uint8_t* base = (uint8_t*)malloc((size_t)cap);
      int64_t blen = -1;
      sc_skc_set_simd(0);
      FUZZ_CHECK(sc_skc_encode(&o, N, idx, SC_F32, val, n, base, cap, &blen, NULL, NULL) == SC_OK);
      sc_skc_set_simd(1);
      FUZZ_CHECK(blen == len && memcmp(base, body, (size_t)len) == 0);
      free(base);
    }
    free(exact);
    free(di);
    free(dv);
  }
  free(body);
  free(sent);
  free(idx);
  free(val);
}

FZ_NOCOV int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fz_reader r = {data, size};
  unsigned sel = (unsigned)fz_u(&r, 1);
  int64_t N = 1 + (int64_t)fz_u(&r, 4);
  int64_t count = (int64_t)fz_u(&r, 2);
  if (sel & 0x80) {
    encoder_mode(&r, N, count);
    return 0;
  }
  uint8_t* body = fz_dup(r.p, r.n);
  decoder_mode(body, r.n, N, count, (sel & 1) ? SC_F64 : SC_F32, (sel >> 1) & 1);
  free(body);
  return 0;
}
