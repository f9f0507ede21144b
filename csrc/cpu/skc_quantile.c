/* SKCompress: the mergeable quantile sketch (sc_qsketch_*), quantiles of a vector (exact
 * up to exact_max values, from the sketch above) and its sign-split quantile buckets
 * (sc_skc_quantize and the encoder's). Contract: sparsecomm/skcompress.h. */
#include "skc_quantile.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "sparsecomm/skcompress.h"
#include "common.h"
#include "skc_bits.h"
#include "skc_sort.h"

struct sc_qsketch {
  int64_t k;
  int64_t n;
  int nlevels;
  int64_t size[64];
  int64_t flips[64]; /* compactions done per level: the parity picks the kept offset */
  double* items[64];
};

sc_qsketch* sc_qsketch_new(int64_t k) {
  if (k < 2 || (k & 1) || k > (1ll << 30)) return NULL;
  sc_qsketch* s = (sc_qsketch*)calloc(1, sizeof(sc_qsketch));
  if (!s) return NULL;
  s->k = k;
  return s;
}

void sc_qsketch_free(sc_qsketch* s) {
  if (!s) return;
  for (int h = 0; h < 64; h++) free(s->items[h]);
  free(s);
}

static int level_alloc(sc_qsketch* s, int h) {
  if (h >= 64) return SC_ERR_NOMEM;
  if (!s->items[h]) {
    /* a level may hold up to 2k - 1 items between compactions during a merge */
    s->items[h] = (double*)malloc(sizeof(double) * (size_t)(2 * s->k));
    if (!s->items[h]) return SC_ERR_NOMEM;
  }
  if (h >= s->nlevels) s->nlevels = h + 1;
  return SC_OK;
}

/* Compact every level holding >= k items, bottom up. */
static int compact(sc_qsketch* s) {
  for (int h = 0; h < s->nlevels; h++) {
    while (s->size[h] >= s->k) {
      int st = level_alloc(s, h + 1);
      if (st) return st;
      double* it = s->items[h];
      int64_t k = s->k;
      int sst = skc_sort_doubles(it, k);
      if (sst) return sst;
      int64_t off = s->flips[h]++ & 1;
      double* up = s->items[h + 1];
      for (int64_t i = off; i < k; i += 2) up[s->size[h + 1]++] = it[i];
      /* items beyond the first k stay at this level */
      memmove(it, it + k, sizeof(double) * (size_t)(s->size[h] - k));
      s->size[h] -= k;
    }
  }
  return SC_OK;
}

int sc_qsketch_update(sc_qsketch* s, double x, sc_error_info* err) {
  if (x != x) return sc_fail(err, SC_ERR_NAN, 0, s->n, 0);
  int st = level_alloc(s, 0);
  if (st) return st;
  s->items[0][s->size[0]++] = x;
  s->n++;
  return s->size[0] >= s->k ? compact(s) : SC_OK;
}

int sc_qsketch_merge(sc_qsketch* dst, const sc_qsketch* src, sc_error_info* err) {
  if (dst->k != src->k) return sc_fail(err, SC_ERR_ARG, 1, 0, src->k);
  for (int h = 0; h < src->nlevels; h++) {
    int64_t i = 0;
    while (i < src->size[h]) {
      int st = level_alloc(dst, h);
      if (st) return st;
      /* copy in chunks that keep the level below 2k, compacting between them */
      int64_t room = 2 * dst->k - 1 - dst->size[h];
      int64_t take = src->size[h] - i < room ? src->size[h] - i : room;
      memcpy(dst->items[h] + dst->size[h], src->items[h] + i, sizeof(double) * (size_t)take);
      dst->size[h] += take;
      i += take;
      st = compact(dst);
      if (st) return st;
    }
  }
  dst->n += src->n;
  return SC_OK;
}

int64_t sc_qsketch_count(const sc_qsketch* s) { return s->n; }
int64_t sc_qsketch_levels(const sc_qsketch* s) {
  int64_t l = 0;
  for (int h = 0; h < s->nlevels; h++)
    if (s->size[h]) l = h + 1;
  return l;
}

typedef struct {
  double x;
  int64_t w;
} wx;

static int cmp_wx(const void* a, const void* b) {
  double x = ((const wx*)a)->x, y = ((const wx*)b)->x;
  return (x > y) - (x < y);
}

int sc_qsketch_quantiles(const sc_qsketch* s, int64_t nq, double* out, sc_error_info* err) {
  if (s->n < 1 || nq < 1) return sc_fail(err, SC_ERR_ARG, 0, 0, s->n);
  int64_t m = 0;
  for (int h = 0; h < s->nlevels; h++) m += s->size[h];
  wx* all = (wx*)malloc(sizeof(wx) * (size_t)m);
  if (!all) return SC_ERR_NOMEM;
  int64_t p = 0;
  for (int h = 0; h < s->nlevels; h++)
    for (int64_t i = 0; i < s->size[h]; i++) {
      all[p].x = s->items[h][i];
      all[p].w = (int64_t)1 << h;
      p++;
    }
  qsort(all, (size_t)m, sizeof(wx), cmp_wx);
  int64_t cum = 0, i = 0;
  for (int64_t j = 0; j < nq; j++) {
    int64_t target = (int64_t)(((__int128)j * s->n) / nq); /* want cumulative weight > target */
    while (i < m - 1 && cum + all[i].w <= target) cum += all[i++].w;
    out[j] = all[i].x;
  }
  free(all);
  return SC_OK;
}

/* ------------------------------------------------------------------ quantiles and buckets */

/* Quantiles of the doubles a[0..n) (n >= 1) at floor(j n / nq), j < nq; a may be reordered. */
static int quantiles_of(double* a, int64_t n, int64_t nq, int64_t exact_max, double* out) {
  if (n <= exact_max) {
    int st = skc_sort_doubles(a, n);
    if (st) return st;
    for (int64_t j = 0; j < nq; j++) out[j] = a[(int64_t)(((__int128)j * n) / nq)];
    return SC_OK;
  }
  sc_qsketch* s = sc_qsketch_new(SC_SKC_SKETCH_K);
  if (!s) return SC_ERR_NOMEM;
  int st = SC_OK;
  for (int64_t i = 0; i < n && !st; i++) st = sc_qsketch_update(s, a[i], NULL);
  if (!st) st = sc_qsketch_quantiles(s, nq, out, NULL);
  sc_qsketch_free(s);
  return st;
}

#define VT float
#define KT uint32_t
#define SX _f32
#include "skc_select_impl.h"
#undef VT
#undef KT
#undef SX
#define VT double
#define KT uint64_t
#define SX _f64
#include "skc_select_impl.h"
#undef VT
#undef KT
#undef SX

int sc_skc_quantiles(sc_dtype vt, const void* x, int64_t n, int64_t nq, int64_t exact_max,
                     double* out, sc_error_info* err) {
  if (vt != SC_F32 && vt != SC_F64) return sc_fail(err, SC_ERR_ARG, 0, 0, vt);
  if (n < 1) return sc_fail(err, SC_ERR_ARG, 1, 0, n);
  if (nq < 1) return sc_fail(err, SC_ERR_ARG, 2, 0, nq);
  for (int64_t i = 0; i < n; i++) {
    double a = load_value(vt, x, i);
    if (a != a) return sc_fail(err, SC_ERR_NAN, 0, i, 0);
  }
  if (n <= exact_max && n < ((int64_t)1 << 32))
    return vt == SC_F32 ? quantiles_exact_f32((const float*)x, n, nq, out)
                        : quantiles_exact_f64((const double*)x, n, nq, out);
  double* a = (double*)malloc(sizeof(double) * (size_t)n);
  if (!a) return SC_ERR_NOMEM;
  double mx = -INFINITY;
  for (int64_t i = 0; i < n; i++) {
    a[i] = load_value(vt, x, i);
    if (a[i] > mx) mx = a[i];
  }
  int st = quantiles_of(a, n, nq, exact_max, out);
  out[nq] = mx;
  free(a);
  return st;
}

int skc_quantify(sc_dtype vt, const void* v, int64_t n, int64_t B, int64_t exact_max, int32_t* out,
                    const skc_bucket_map* map, void* scratch, quantized* qz, sc_error_info* err) {
  return vt == SC_F32 ? quantify_f32((const float*)v, n, B, exact_max, out, map, scratch, qz, err)
                      : quantify_f64((const double*)v, n, B, exact_max, out, map, scratch, qz, err);
}

int sc_skc_quantize(sc_dtype vt, const void* v, int64_t n, int64_t q, int64_t exact_max,
                    int32_t* bucket, double* splits, int64_t* used, sc_error_info* err) {
  if (vt != SC_F32 && vt != SC_F64) return sc_fail(err, SC_ERR_ARG, 0, 0, vt);
  if (q < 2 || q > SC_SKC_MAX_Q || (q & 1)) return sc_fail(err, SC_ERR_ARG, 1, 0, q);
  if (n < 0) return sc_fail(err, SC_ERR_ARG, 2, 0, n);
  int64_t B = q / 2;
  memset(splits, 0, sizeof(double) * (size_t)(2 * (B + 1)));
  quantized qz;
  qz.splits[0] = splits;
  qz.splits[1] = splits + B + 1;
  int st = skc_quantify(vt, v, n, B, exact_max, bucket, NULL, NULL, &qz, err);
  if (st) return st;
  used[0] = qz.nb[0];
  used[1] = qz.nb[1];
  return SC_OK;
}
