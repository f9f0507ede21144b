/*
 * C tests of the SKCompress kernels (sparsecomm/skcompress.h), run from test_kernels.c's
 * main: the quantile sketch's rank-error bound after updates and after merges; codec
 * round trips over 1,021,000 random messages (a million of them tiny) (keys lossless; values never change sign, never
 * decode to a bucket further from zero or outside their group, checked against
 * sc_skc_quantize); every byte of a body flipped once (of large ones, 3000 random bytes)
 * must give SC_ERR_MALFORMED or a valid vector.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sparsecomm/skcompress.h"

static long s_checks = 0, s_failed = 0;
static int s_simd_twin = 0; /* the CPU runs a SIMD body: compare it with the baseline */
static long s_twin_every = 0;
#define SCHECK(cond)                                                                  \
  do {                                                                                \
    s_checks++;                                                                       \
    if (!(cond)) {                                                                    \
      s_failed++;                                                                     \
      if (s_failed < 30) fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
    }                                                                                 \
  } while (0)

static uint64_t s_rng = 7;
static uint64_t srnd(void) {
  uint64_t z = (s_rng += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
static double sunit(void) { return (double)(srnd() >> 11) / 9007199254740992.0; }

static int cmpd(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

static int64_t lower(const double* s, int64_t n, double x) {
  int64_t lo = 0, hi = n;
  while (lo < hi) { int64_t m = (lo + hi) / 2; if (s[m] < x) lo = m + 1; else hi = m; }
  return lo;
}
static int64_t upper(const double* s, int64_t n, double x) {
  int64_t lo = 0, hi = n;
  while (lo < hi) { int64_t m = (lo + hi) / 2; if (s[m] <= x) lo = m + 1; else hi = m; }
  return lo;
}

/* rank error of the quantiles of sketch s over the sorted data xs[0..n) */
static double worst_rank_error(const sc_qsketch* s, const double* xs, int64_t n, int64_t nq) {
  double* q = (double*)malloc(sizeof(double) * (size_t)nq);
  SCHECK(sc_qsketch_quantiles(s, nq, q, NULL) == SC_OK);
  double worst = 0;
  for (int64_t j = 0; j < nq; j++) {
    int64_t target = (j * n) / nq, lo = lower(xs, n, q[j]), hi = upper(xs, n, q[j]) - 1;
    double e = lo > target ? lo - target : (target > hi ? target - hi : 0);
    if (e > worst) worst = e;
  }
  free(q);
  return worst;
}

static void test_qsketch(void) {
  const int64_t k = 64, n = 50000, parts = 7;
  double* x = (double*)malloc(sizeof(double) * n);
  for (int64_t i = 0; i < n; i++) x[i] = (i % 3 == 0) ? floor(sunit() * 100) : sunit() * sunit();
  sc_qsketch* whole = sc_qsketch_new(k);
  sc_qsketch* merged = sc_qsketch_new(k);
  for (int64_t i = 0; i < n; i++) SCHECK(sc_qsketch_update(whole, x[i], NULL) == SC_OK);
  for (int64_t p = 0; p < parts; p++) { /* mergeable: parts built apart, merged in */
    sc_qsketch* part = sc_qsketch_new(k);
    for (int64_t i = p * n / parts; i < (p + 1) * n / parts; i++) sc_qsketch_update(part, x[i], NULL);
    SCHECK(sc_qsketch_merge(merged, part, NULL) == SC_OK);
    sc_qsketch_free(part);
  }
  SCHECK(sc_qsketch_count(whole) == n && sc_qsketch_count(merged) == n);
  qsort(x, (size_t)n, sizeof(double), cmpd);
  double bound_levels = floor(log2((double)n / k)) + 1;
  double e1 = worst_rank_error(whole, x, n, 200), e2 = worst_rank_error(merged, x, n, 200);
  SCHECK(e1 <= n * bound_levels / k);
  SCHECK(e2 <= n * bound_levels / k);
  SCHECK(sc_qsketch_levels(whole) - 1 <= bound_levels);
  SCHECK(sc_qsketch_update(whole, NAN, NULL) == SC_ERR_NAN);
  SCHECK(sc_qsketch_new(3) == NULL);
  sc_qsketch_free(whole);
  sc_qsketch_free(merged);
  free(x);
}

static sc_skc_options opts(int ic, int vc, int64_t q, int64_t s, double t, int64_t r) {
  sc_skc_options o = {ic, vc, q, s, t, r, 0, SC_SKC_PREFIX_AUTO, 64};
  return o;
}

/* One random message through the codec; checks as in the file comment. */
static void round_trip(int64_t n, int64_t N, sc_skc_options o, int flip_all) {
  int64_t* idx = (int64_t*)malloc(sizeof(int64_t) * (size_t)(n + 1));
  float* val = (float*)malloc(sizeof(float) * (size_t)(n + 1));
  int64_t c = 0;
  for (int64_t i = 0; i < N && c < n; i++) /* selection sampling: n of N, ascending */
    if ((double)(srnd() % (uint64_t)(N - i)) < (double)(n - c)) idx[c++] = i;
  n = c;
  int kind = (int)(srnd() % 4);
  for (int64_t i = 0; i < n; i++) {
    double u = sunit() - 0.5;
    val[i] = kind == 0 ? (float)u : kind == 1 ? (float)(u * u * u * 1e-3) : kind == 2 ? 0.125f : (float)fabs(u);
  }
  int64_t cap = sc_skc_encode_bound(&o, N, SC_F32, n);
  uint8_t* body = (uint8_t*)malloc((size_t)cap);
  int64_t len = -1;
  sc_error_info e = {0, 0, 0};
  float* sent = (float*)malloc(sizeof(float) * (size_t)(n + 1));
  SCHECK(sc_skc_encode(&o, N, idx, SC_F32, val, n, body, cap, &len, sent, &e) == SC_OK);
  int64_t* di = (int64_t*)malloc(sizeof(int64_t) * (size_t)(n + 1));
  float* dv = (float*)malloc(sizeof(float) * (size_t)(n + 1));
  SCHECK(sc_skc_decode(body, len, N, n, SC_F32, o.index_codec, o.value_codec, di, dv, &e) == SC_OK);
  /* what the encoder says receivers decode is what they decode, bit for bit */
  SCHECK(n == 0 || memcmp(sent, dv, sizeof(float) * (size_t)n) == 0);
  free(sent);
  if (s_simd_twin && (s_twin_every++ % 8 == 0 || n > 1000)) {
    /* the baseline body of the SIMD cell indices: the same message, the same values */
    uint8_t* base = (uint8_t*)malloc((size_t)cap);
    int64_t blen = -1;
    int64_t* bi = (int64_t*)malloc(sizeof(int64_t) * (size_t)(n + 1));
    float* bv = (float*)malloc(sizeof(float) * (size_t)(n + 1));
    sc_skc_set_simd(0);
    SCHECK(sc_skc_encode(&o, N, idx, SC_F32, val, n, base, cap, &blen, NULL, &e) == SC_OK);
    SCHECK(blen == len && memcmp(base, body, (size_t)len) == 0);
    SCHECK(sc_skc_decode(body, len, N, n, SC_F32, -1, -1, bi, bv, &e) == SC_OK);
    SCHECK(n == 0 || (memcmp(bi, di, sizeof(int64_t) * (size_t)n) == 0 &&
                      memcmp(bv, dv, sizeof(float) * (size_t)n) == 0));
    sc_skc_set_simd(1);
    free(base); free(bi); free(bv);
  }
  SCHECK(n == 0 || memcmp(di, idx, sizeof(int64_t) * (size_t)n) == 0);
  if (o.value_codec == SC_SKC_VALUE_RAW) {
    SCHECK(n == 0 || memcmp(dv, val, sizeof(float) * (size_t)n) == 0);
  } else {
    int64_t B = o.q / 2, G = (B + o.r - 1) / o.r;
    int32_t* b = (int32_t*)malloc(sizeof(int32_t) * (size_t)(n + 1));
    double* sp = (double*)malloc(sizeof(double) * (size_t)(2 * (B + 1)));
    int64_t used[2];
    SCHECK(sc_skc_quantize(SC_F32, val, n, o.q, o.exact_max, b, sp, used, NULL) == SC_OK);
    for (int64_t i = 0; i < n; i++) {
      int sg = val[i] >= 0;
      const double* s = sp + sg * (B + 1);
      SCHECK(sg ? dv[i] >= 0 : dv[i] <= 0);                 /* never a sign flip */
      double mag = fabs((double)dv[i]);
      SCHECK(mag <= s[b[i] + 1]);                            /* never beyond its bucket */
      /* the decoded bucket: one whose float mean is mag, in the same group, <= b[i] */
      int found = 0;
      for (int64_t j = (b[i] / G) * G; j <= b[i] && !found; j++)
        found = (float)(s[j] + (s[j + 1] - s[j]) * 0.5) == (float)mag;
      SCHECK(found);
    }
    free(b);
    free(sp);
  }
  if (flip_all) { /* every byte flipped (or flip_all random ones): malformed or still a
                   * valid vector, never a crash */
    for (int64_t f = 0; f < (flip_all > 1 ? flip_all : len); f++) {
      int64_t p = flip_all > 1 ? (int64_t)(srnd() % (uint64_t)len) : f;
      uint8_t* bad = (uint8_t*)malloc((size_t)len);
      memcpy(bad, body, (size_t)len);
      bad[p] ^= (uint8_t)(1 + srnd() % 255);
      int st = sc_skc_decode(bad, len, N, n, SC_F32, -1, -1, di, dv, &e);
      SCHECK(st == SC_OK || st == SC_ERR_MALFORMED);
      if (st == SC_OK)
        for (int64_t i = 0; i < n; i++) SCHECK(di[i] < N && (i == 0 || di[i] > di[i - 1]));
      free(bad);
    }
    SCHECK(sc_skc_decode(body, len - 1, N, n, SC_F32, -1, -1, di, dv, &e) == SC_ERR_MALFORMED);
  }
  free(idx); free(val); free(body); free(di); free(dv);
}

static void test_skcompress(long* checks, long* failed) {
  s_simd_twin = sc_skc_set_simd(1) > 0;
  printf("skcompress cell indices: %s\n", s_simd_twin ? "SIMD, checked against the baseline" : "baseline");
  test_qsketch();
  /* many random messages: small ones (all code paths) and a few large ones */
  for (int it = 0; it < 20000; it++) {
    int64_t N = 1 + (int64_t)(srnd() % 3000);
    int64_t n = (int64_t)(srnd() % (uint64_t)(N < 200 ? N + 1 : 201));
    int64_t q = 2 << (srnd() % 8);
    int64_t r = 1 + (int64_t)(srnd() % (uint64_t)(q / 2 < 255 ? q / 2 : 255));
    sc_skc_options o = opts((int)(srnd() % 2), 1, q, 1 + (int64_t)(srnd() % 4), 0.05 + sunit() * 2, r);
    round_trip(n, N, o, 0);
  }
  for (int it = 0; it < 200; it++) {
    sc_skc_options o = opts((int)(srnd() % 2), (int)(srnd() % 2), 256, 2, 0.2, 8);
    o.m = (int64_t[]){0, 2, 4, 8, 16}[srnd() % 5];
    o.prefix = (int)(srnd() % 3);
    round_trip(1 + (int64_t)(srnd() % 60), 1 + (int64_t)(srnd() % 100000), o, 1);
  }
  round_trip(100000, 1000000, opts(1, 1, 256, 2, 0.2, 8), 0); /* past exact_max: the sketch path */
  /* delta-binary sections of SKC_KEY_SPLIT = 8192 keys and more are two streams: round trips
   * around that size, and 3000 random byte flips of each body */
  for (int it = 0; it < 6; it++) {
    sc_skc_options o = opts(1, it % 2, 256, 2, 0.2, 8);
    o.exact_max = 1 << 20;
    round_trip(8190 + (int64_t)(srnd() % 8), 8200 + (int64_t)(srnd() % 400000), o, 3000);
  }
  /* a million tiny messages (few keys, narrow sketches: collisions everywhere) */
  for (int it = 0; it < 1000000; it++) {
    int64_t q = 2 << (srnd() % 5);
    int64_t r = 1 + (int64_t)(srnd() % (uint64_t)(q / 2));
    sc_skc_options o = opts((int)(srnd() % 2), 1, q, 1 + (int64_t)(srnd() % 3), 0.05 + sunit(), r);
    int64_t N = 1 + (int64_t)(srnd() % 48);
    round_trip((int64_t)(srnd() % (uint64_t)(N < 16 ? N + 1 : 17)), N, o, 0);
  }
  *checks += s_checks;
  *failed += s_failed;
}

/* its own binary (make ctest builds one per csrc/tests/test_*.c) */
int main(void) {
  long checks = 0, failed = 0;
  test_skcompress(&checks, &failed);
  printf("test_skcompress                  %s\n%ld checks, %ld failed\n", failed ? "FAILED" : "ok", checks, failed);
  return failed ? 1 : 0;
}
