/* Fuzz target: QSGD messages (sc_wire_qsgd_layout, sc_wire_check_qsgd) and
 * sc_qsgd_dequantize / sc_qsgd_quantize.
 *
 * Input: [1 byte: bit 0 value type (float32 / float64), bits 1-2 nthreads - 1,
 *         bit 3 expectations from the message's own fields][message bytes].
 * Invariants:
 *   - the layout check reads only the 48-byte prefix and agrees with the full
 *     check; an accepted layout has bits 4 or 8, bucket >= 1 (even for 4
 *     bits), count = ceil(N bits / 8), exact size and zero padding;
 *   - on an accepted message sc_qsgd_dequantize fails exactly when a level is
 *     above 2s, a scale is not finite and >= 0, or (4 bits, odd N) the unused
 *     nibble is not 0 (reference scan: same input and position), and
 *     otherwise writes (q - s) * scale / s;
 *   - sc_qsgd_quantize of the message's bytes read as values fails exactly at
 *     the first value no float32 scale holds (NaN, Inf, beyond FLT_MAX), and
 *     otherwise round-trips through dequantize within one level step. */
#include <float.h>
#include <math.h>

#include "fuzz_common.h"
#include "sparsecomm/stream.h"
#include "sparsecomm/wire.h"

/* reference validation of levels and scales: returns the input (0 packed,
 * 1 scales) at fault and sets *pos, or -1 */
FZ_NOCOV static int ref_bad(const uint8_t* packed, const float* scales, int64_t n, int bits,
                            int64_t bucket, int64_t* pos) {
  int s = (1 << (bits - 1)) - 1;
  for (int64_t i = 0; i < n; i++) {
    int q = bits == 8 ? packed[i] : (i & 1) ? packed[i >> 1] >> 4 : packed[i >> 1] & 15;
    if (q > 2 * s) { *pos = bits == 8 ? i : i >> 1; return 0; }
    if (bits == 4 && (n & 1) && i == n - 1 && (packed[i >> 1] >> 4)) { *pos = i >> 1; return 0; }
  }
  int64_t nb = n / bucket + (n % bucket != 0);
  for (int64_t b = 0; b < nb; b++) {
    float x;
    memcpy(&x, scales + b, 4);
    if (!(x >= 0.0f && x <= FLT_MAX)) { *pos = b; return 1; }
  }
  return -1;
}

FZ_NOCOV static void roundtrip(sc_dtype vt, const uint8_t* bytes, int64_t nbytes, int bits,
                               int64_t bucket, int nt) {
  int64_t vs = (int64_t)sc_dtype_size(vt), n = nbytes / vs;
  void* x = fz_dup(bytes, (size_t)(n * vs));
  int64_t nb = n / bucket + (n % bucket != 0);
  int64_t npk = (n * bits + 7) / 8;
  uint8_t* packed = (uint8_t*)malloc((size_t)npk + 1);
  float* scales = (float*)malloc((size_t)nb * 4 + 4);
  int64_t bad = -1;
  for (int64_t i = 0; i < n && bad < 0; i++) {
    double v = ref_get(vt, x, i);
    if (!(fabs(v) <= FLT_MAX)) bad = i;
  }
  sc_error_info e = fz_err();
  int st = sc_qsgd_quantize(vt, x, n, bits, bucket, 12345, packed, scales, nt, &e);
  if (bad >= 0) {
    FUZZ_CHECK(st == SC_ERR_NAN && e.position == bad);
  } else {
    FUZZ_CHECK(st == SC_OK);
    int s = (1 << (bits - 1)) - 1;
    void* out = malloc((size_t)(n * vs) + 1);
    FUZZ_CHECK(sc_qsgd_dequantize(vt, packed, scales, n, bits, bucket, out, nt, &e) == SC_OK);
    for (int64_t i = 0; i < n; i++) {
      double sc = scales[i / bucket];
      FUZZ_CHECK(sc >= fabs(ref_get(vt, x, i)));
      double xi = ref_get(vt, x, i), err = fabs(ref_get(vt, out, i) - xi);
      /* one level step, plus the rounding of the output to its dtype (a
       * float32 subnormal's spacing can exceed a tiny scale's step) */
      double ulp = vt == SC_F32 ? 1.5e-45 + fabs(xi) * 1.2e-7 : 5e-324 + fabs(xi) * 2.3e-16;
      FUZZ_CHECK(err <= sc / s * 1.0001 + ulp);
    }
    free(out);
  }
  free(x);
  free(packed);
  free(scales);
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fz_reader r = {data, size};
  unsigned sel = (unsigned)fz_u(&r, 1);
  sc_dtype vt = (sel & 1) ? SC_F64 : SC_F32;
  int nt = 1 + (int)((sel >> 1) & 3);
  fz_message m = fz_message_take(&r);
  uint8_t *msg = m.msg, *prefix = m.prefix;
  size_t n = m.n;

  sc_wire_expect w = sc_wire_expect_any();
  if ((sel & 8) && n >= SC_WIRE_PREFIX_NBYTES) {
    fz_reader h = {msg + 12, 36};
    w.sender = (int64_t)fz_u(&h, 4);
    w.n = (int64_t)(fz_u(&h, 8) & (uint64_t)INT64_MAX);
    (void)fz_u(&h, 8);
    w.offset = (int64_t)(fz_u(&h, 8) & (uint64_t)INT64_MAX);
    w.bucket = (int64_t)(uint32_t)fz_u(&h, 4);
    w.bits = (int64_t)(uint32_t)fz_u(&h, 4);
  }
  sc_wire_layout L1, L2;
  sc_error_info e1 = fz_err(), e2 = fz_err();
  int s1 = sc_wire_qsgd_layout(prefix, (int64_t)n, &w, &L1, &e1);
  int s2 = sc_wire_check_qsgd(msg, (int64_t)n, &w, &L2, &e2);
  FUZZ_CHECK(s1 == SC_OK || s1 == SC_ERR_MALFORMED);
  if (s1 != SC_OK) {
    FUZZ_CHECK(s2 == s1 && e1.input == e2.input && e1.position == e2.position && e1.value == e2.value);
  } else if (s2 != SC_OK) {
    FUZZ_CHECK(s2 == SC_ERR_MALFORMED && e2.input == SC_WF_PADDING && msg[e2.position] != 0);
  } else {
    FUZZ_CHECK(memcmp(&L1, &L2, sizeof L1) == 0);
    FUZZ_CHECK((L2.bits == 4 || L2.bits == 8) && L2.bucket >= 1 && !(L2.bits == 4 && (L2.bucket & 1)));
    FUZZ_CHECK((__int128)L2.count == ((__int128)L2.n * L2.bits + 7) / 8);
    FUZZ_CHECK(L2.scale_pos == SC_WIRE_PREFIX_NBYTES && L2.value_pos == L2.scale_pos + ((4 * L2.nscales + 7) & ~7));
    FUZZ_CHECK(L2.value_pos + ((L2.count + 7) & ~7) == (int64_t)n);
    const uint8_t* packed = msg + L2.value_pos;
    const float* scales = (const float*)(msg + L2.scale_pos);
    int64_t pos = -1;
    int which = ref_bad(packed, scales, L2.n, (int)L2.bits, L2.bucket, &pos);
    int64_t vs = (int64_t)sc_dtype_size(vt);
    void* out = malloc((size_t)(L2.n * vs) + 1);
    sc_error_info e = fz_err();
    int st = sc_qsgd_dequantize(vt, packed, scales, L2.n, (int)L2.bits, L2.bucket, out, nt, &e);
    if (which >= 0) {
      FUZZ_CHECK(st == SC_ERR_MALFORMED && e.input == which && e.position == pos);
    } else {
      FUZZ_CHECK(st == SC_OK);
      int s = (1 << (L2.bits - 1)) - 1;
      for (int64_t i = 0; i < L2.n; i++) {
        int q = L2.bits == 8 ? packed[i] : (i & 1) ? packed[i >> 1] >> 4 : packed[i >> 1] & 15;
        double want = (double)(q - s) * (double)scales[i / L2.bucket] / (double)s;
        FUZZ_CHECK(ref_get(vt, out, i) == (vt == SC_F64 ? want : (double)(float)want));
      }
    }
    free(out);
    /* the message's level and scale bytes as values to quantize */
    roundtrip(vt, msg + SC_WIRE_PREFIX_NBYTES, (int64_t)n - SC_WIRE_PREFIX_NBYTES, (int)L2.bits,
              L2.bucket, nt);
  }
  if (s1 != SC_OK && n > 1) /* arbitrary bytes through quantize with fixed arguments */
    roundtrip(vt, msg + 1, (int64_t)n - 1, (sel & 16) ? 4 : 8, (sel & 32) ? 2 : 3 + (sel & 16 ? 1 : 0), nt);
  fz_message_free(&m);
  return 0;
}
