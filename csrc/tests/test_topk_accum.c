/* sc_block_topk_accum: the residual add fused with the (block) top-k. Reference: the add
 * written here element by element, then sc_block_topk of the sums (whose own tests compare
 * it with a sort), and the cleared positions set here. Serial and parallel paths, the
 * sampled fast path and its fallbacks (ties everywhere, a full candidate buffer), NaN,
 * overlap and argument errors; the float32 cases with the AVX2 body of the fused pass (where
 * the CPU has it) and with the SSE2 body forced. */
#include <math.h>
#include <string.h>

#include "harness.h"
#include "sparsecomm/kernels.h"

enum { PAT_RANDOM, PAT_TIES, PAT_CONST, PAT_CANCEL, NPAT };

static void fill(float* e, float* g, int64_t n, int pat) {
  for (int64_t i = 0; i < n; i++) {
    switch (pat) {
      case PAT_RANDOM: e[i] = (float)(rnd_unit() - 0.5); g[i] = (float)(rnd_unit() - 0.5); break;
      case PAT_TIES: e[i] = (float)(rnd() % 3) - 1.0f; g[i] = (float)(rnd() % 2) * 0.5f; break;
      case PAT_CONST: e[i] = 1.0f; g[i] = 0.0f; break; /* every magnitude ties */
      default: e[i] = (float)(rnd_unit() - 0.5); g[i] = (i % 3) ? -e[i] : 0.25f; break; /* exact zeros */
    }
  }
}

static void check_case(int64_t n, int64_t B, int64_t kpb, int pat, int nt, int clear) {
  float* e = xmalloc((size_t)n * sizeof(float));
  float* g = xmalloc((size_t)n * sizeof(float));
  float* sum = xmalloc((size_t)n * sizeof(float));
  fill(e, g, n, pat);
  for (int64_t i = 0; i < n; i++) sum[i] = e[i] + g[i];
  int64_t m = sc_block_topk_count(n, B, kpb);
  float* rv = xmalloc((size_t)m * sizeof(float) + 1);
  int64_t* ri = xmalloc((size_t)m * sizeof(int64_t) + 1);
  float* v = xmalloc((size_t)m * sizeof(float) + 1);
  int64_t* ix = xmalloc((size_t)m * sizeof(int64_t) + 1);
  CHECK(sc_block_topk(SC_F32, sum, n, B, kpb, nt, rv, ri, NULL) == SC_OK);
  if (clear)
    for (int64_t j = 0; j < m; j++) sum[ri[j]] = 0.0f;
  CHECK(sc_block_topk_accum(SC_F32, e, g, n, B, kpb, clear, nt, v, ix, NULL) == SC_OK);
  CHECK(memcmp(e, sum, (size_t)n * sizeof(float)) == 0);
  CHECK(memcmp(ix, ri, (size_t)m * sizeof(int64_t)) == 0);
  CHECK(memcmp(v, rv, (size_t)m * sizeof(float)) == 0);
  free(e); free(g); free(sum); free(rv); free(ri); free(v); free(ix);
}

static void test_matches_add_then_select(void) {
  const int64_t sizes[] = {1, 5, 1000, 65537, 300001, 1000003};
  for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
    int64_t n = sizes[s];
    const int64_t ks[] = {0, 1, 17, n / 100 + 1, n - 1, n, n + 3};
    for (size_t q = 0; q < sizeof(ks) / sizeof(ks[0]); q++)
      for (int pat = 0; pat < NPAT; pat++)
        for (int nt = 1; nt <= 4; nt *= 4) {
          check_case(n, 1, ks[q] < 0 ? 0 : ks[q], pat, nt, (int)(q % 2));
          if (n >= 1000 && ks[q] <= n / 100 + 1) check_case(n, 3, ks[q], pat, nt, (int)((q + 1) % 2));
        }
  }
  check_case(10, 64, 1, PAT_RANDOM, 4, 1);  /* more blocks than elements */
  check_case(2000000, 2, 10000, PAT_TIES, 4, 1); /* blocks above 2^20: each block in parallel */
}

static void test_double(void) {
  const int64_t n = 300001, k = 3001;
  double* e = xmalloc(n * sizeof(double));
  double* g = xmalloc(n * sizeof(double));
  double* sum = xmalloc(n * sizeof(double));
  for (int64_t i = 0; i < n; i++) { e[i] = rnd_unit() - 0.5; g[i] = 1e-17 * (double)(rnd() % 5); sum[i] = e[i] + g[i]; }
  double *rv = xmalloc(k * sizeof(double)), *v = xmalloc(k * sizeof(double));
  int64_t *ri = xmalloc(k * sizeof(int64_t)), *ix = xmalloc(k * sizeof(int64_t));
  CHECK(sc_topk(SC_F64, sum, n, k, 2, rv, ri, NULL) == SC_OK);
  CHECK(sc_block_topk_accum(SC_F64, e, g, n, 1, k, 0, 2, v, ix, NULL) == SC_OK);
  CHECK(memcmp(e, sum, n * sizeof(double)) == 0);
  CHECK(memcmp(ix, ri, k * sizeof(int64_t)) == 0 && memcmp(v, rv, k * sizeof(double)) == 0);
  free(e); free(g); free(sum); free(rv); free(v); free(ri); free(ix);
}

static void test_nan_keeps_the_sums(void) {
  /* one block; three blocks (serial with 1 thread, block-parallel with 4); two blocks
     above 2^20 (serial over blocks): the NaN sits in the last block, so earlier blocks
     were selected (and cleared) before it failed and must be put back */
  const int64_t sizes[3][2] = {{400000, 1}, {400000, 3}, {2200000, 2}};
  for (int c = 0; c < 3; c++)
  for (int nt = 1; nt <= 4; nt *= 4) {
    const int64_t n = sizes[c][0], B = sizes[c][1], k = 4000;
    float* e = xmalloc(n * sizeof(float));
    float* g = xmalloc(n * sizeof(float));
    fill(e, g, n, PAT_RANDOM);
    g[n - 7] = NAN;
    float* sum = xmalloc(n * sizeof(float));
    for (int64_t i = 0; i < n; i++) sum[i] = e[i] + g[i];
    float* v = xmalloc(k * sizeof(float));
    int64_t* ix = xmalloc(k * sizeof(int64_t));
    sc_error_info err = {0, 0, 0};
    float* v2 = xmalloc((size_t)B * k * sizeof(float));
    int64_t* ix2 = xmalloc((size_t)B * k * sizeof(int64_t));
    free(v); free(ix);
    v = v2; ix = ix2;
    CHECK(sc_block_topk_accum(SC_F32, e, g, n, B, k, 1, nt, v, ix, &err) == SC_ERR_NAN);
    CHECK(err.position == n - 7);
    CHECK(isnan(e[n - 7]));
    int same = 1;
    for (int64_t i = 0; i < n; i++) same &= i == n - 7 || e[i] == sum[i];
    CHECK(same); /* every sum written, nothing cleared */
    free(e); free(g); free(sum); free(v); free(ix);
  }
}

static void test_arguments(void) {
  float a[64] = {0}, v[8];
  int64_t ix[8];
  double d[4] = {0};
  sc_error_info err = {0, 0, 0};
  CHECK(sc_block_topk_accum(SC_F32, a, a + 8, 32, 1, 4, 0, 1, v, ix, &err) == SC_ERR_OVERLAP && err.input == 1);
  CHECK(sc_block_topk_accum(SC_F32, a, a + 40, 16, 1, 4, 0, 1, a + 10, ix, &err) == SC_ERR_OVERLAP && err.input == 4);
  CHECK(sc_block_topk_accum(SC_F32, a, a + 40, 16, 1, 4, 0, 1, v, (int64_t*)(void*)(a + 2), &err) == SC_ERR_OVERLAP
        && err.input == 5);
  CHECK(sc_block_topk_accum(SC_F16, a, a + 40, 8, 1, 4, 0, 1, v, ix, &err) == SC_ERR_ARG);
  CHECK(sc_block_topk_accum(SC_F32, a, a + 40, -1, 1, 4, 0, 1, v, ix, &err) == SC_ERR_ARG);
  CHECK(sc_block_topk_accum(SC_F32, a, a + 40, 8, 0, 4, 0, 1, v, ix, &err) == SC_ERR_ARG);
  CHECK(sc_block_topk_accum(SC_F32, a, a + 40, 8, 1, -2, 0, 1, v, ix, &err) == SC_ERR_ARG);
  CHECK(sc_block_topk_accum(SC_F64, d, d + 2, 2, 1, 1, 1, 1, (double*)v, ix, &err) == SC_OK);
  CHECK(sc_block_topk_accum(SC_F32, a, a + 40, 0, 1, 4, 1, 1, v, ix, NULL) == SC_OK);
}

int main(void) {
  /* both bodies of the fused pass (float32): AVX2 where the CPU has it, then SSE2 forced */
  for (int allow = 1; allow >= 0; allow--) {
    int avx2 = sc_topk_set_avx2(allow);
    printf("fused filter pass: %s\n", avx2 ? "AVX2" : "SSE2");
    RUN(test_matches_add_then_select);
    RUN(test_nan_keeps_the_sums);
  }
  sc_topk_set_avx2(1);
  RUN(test_double);
  RUN(test_arguments);
  printf("%ld checks, %ld failed\n", g_checks, g_failed);
  return g_failed != 0;
}
