/*
 * C tests of the DenseStream kernels (csrc/include/sparsecomm/densestream.h) and their
 * wire check, against the reference of ref.h (ref_ds_blocks: the canonical blocks of a
 * dense vector, written from the contract) on random, clustered and adversarial inputs:
 * the zero-run rule at T and T + 1, n = 1, all-zero and all-dense vectors, cancellations
 * in sums, -0.0 and NaN values, every value type, malformed blocks and messages.
 *
 *   make ctest / make sanitize     (one binary per csrc/tests/test_*.c)
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "ref.h"
#include "sparsecomm/densestream.h"
#include "sparsecomm/kernels.h"
#include "sparsecomm/wire.h"

static const sc_dtype VTYPES[4] = {SC_F32, SC_F64, SC_F16, SC_BF16};

typedef struct {
  int64_t *s, *l;
  uint8_t* v;
  int64_t nb, nv;
} ds_t;

static void ds_free(ds_t* d) {
  free(d->s);
  free(d->l);
  free(d->v);
}

/* both passes of a producing kernel, through a function of this shape */
typedef int (*ds_fn)(void* ctx, int64_t* s, int64_t* l, void* v, sc_ds_counts cap, sc_ds_counts* out,
                     sc_error_info* e);

static int run2(ds_fn f, void* ctx, sc_dtype t, ds_t* out) {
  sc_ds_counts c = {0, 0};
  sc_error_info e = {0, 0, 0};
  memset(out, 0, sizeof *out);
  int st = f(ctx, NULL, NULL, NULL, c, &c, &e);
  if (st) return st;
  out->s = (int64_t*)xmalloc((size_t)c.nblocks * 8);
  out->l = (int64_t*)xmalloc((size_t)c.nblocks * 8);
  out->v = (uint8_t*)xmalloc((size_t)c.nvalues * sc_dtype_size(t));
  sc_ds_counts got = {-1, -1};
  st = f(ctx, out->s, out->l, out->v, c, &got, &e);
  out->nb = got.nblocks;
  out->nv = got.nvalues;
  CHECK(st != SC_OK || (got.nblocks == c.nblocks && got.nvalues == c.nvalues));
  return st;
}

typedef struct {
  sc_dtype t;
  const void* x;
  int64_t n, width;
} dense_ctx;

static int f_dense(void* p, int64_t* s, int64_t* l, void* v, sc_ds_counts cap, sc_ds_counts* out,
                   sc_error_info* e) {
  dense_ctx* c = (dense_ctx*)p;
  return sc_ds_encode_dense(c->t, c->x, c->n, c->width, s, l, v, cap.nblocks, cap.nvalues, out, e);
}

typedef struct {
  sc_dtype t;
  sc_index_t it;
  const void *idx, *val;
  int64_t m, n, width;
} coo_ctx;

static int f_coo(void* p, int64_t* s, int64_t* l, void* v, sc_ds_counts cap, sc_ds_counts* out,
                 sc_error_info* e) {
  coo_ctx* c = (coo_ctx*)p;
  return sc_ds_encode_coo(c->it, c->t, c->idx, c->val, c->m, c->n, c->width, s, l, v, cap.nblocks,
                          cap.nvalues, out, e);
}

typedef struct {
  sc_dtype t;
  const ds_t *a, *b;
  int64_t n, width;
} add_ctx;

static int f_add(void* p, int64_t* s, int64_t* l, void* v, sc_ds_counts cap, sc_ds_counts* out,
                 sc_error_info* e) {
  add_ctx* c = (add_ctx*)p;
  return sc_ds_add(c->t, c->a->s, c->a->l, c->a->v, c->a->nb, c->a->nv, c->b->s, c->b->l, c->b->v,
                   c->b->nb, c->b->nv, c->n, c->width, s, l, v, cap.nblocks, cap.nvalues, out, e);
}

typedef struct {
  sc_dtype t;
  const ds_t* a;
  int64_t n, lo, hi, width;
} slice_ctx;

static int f_slice(void* p, int64_t* s, int64_t* l, void* v, sc_ds_counts cap, sc_ds_counts* out,
                   sc_error_info* e) {
  slice_ctx* c = (slice_ctx*)p;
  return sc_ds_slice(c->t, c->a->s, c->a->l, c->a->v, c->a->nb, c->a->nv, c->n, c->lo, c->hi, c->width, s,
                     l, v, cap.nblocks, cap.nvalues, out, e);
}

/* A vector of n values: clusters of non-zeros (density within a cluster `fill`), some
 * -0.0, the rest +0; integers in [-4, 4] so that sums cancel now and then. */
static void clustered(sc_dtype t, void* x, int64_t n, double fill) {
  for (int64_t i = 0; i < n; i++) ref_put(t, x, i, 0.0);
  int64_t i = 0;
  while (i < n) {
    i += (int64_t)(rnd() % 12);
    int64_t len = 1 + (int64_t)(rnd() % 20);
    for (int64_t j = i; j < i + len && j < n; j++)
      if (rnd_unit() < fill) ref_put(t, x, j, (double)((int64_t)(rnd() % 9) - 4));
      else if (rnd() % 8 == 0) ref_put(t, x, j, -0.0);
    i += len;
  }
}

static void test_width_and_run(void) {
  CHECK(sc_ds_width(0) == 1 && sc_ds_width(1) == 1 && sc_ds_width(256) == 1 && sc_ds_width(257) == 2);
  CHECK(sc_ds_width(65536) == 2 && sc_ds_width(65537) == 3 && sc_ds_width(15000000) == 3);
  CHECK(sc_ds_width((int64_t)1 << 32) == 4 && sc_ds_width(((int64_t)1 << 32) + 1) == 5);
  CHECK(sc_ds_width(INT64_MAX) == 8);
  /* T = ceil(2 width / K) */
  CHECK(sc_ds_max_zero_run(3, 4) == 2 && sc_ds_max_zero_run(4, 4) == 2 && sc_ds_max_zero_run(1, 4) == 1);
  CHECK(sc_ds_max_zero_run(3, 8) == 1 && sc_ds_max_zero_run(3, 2) == 3 && sc_ds_max_zero_run(8, 2) == 8);
}

static void test_encode(void) {
  const int64_t ns[] = {1, 2, 7, 100, 1000, 70000};
  for (int ti = 0; ti < 4; ti++) {
    sc_dtype t = VTYPES[ti];
    size_t w = sc_dtype_size(t);
    for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
      for (int width = 1; width <= 8; width += 3) {
        int64_t n = ns[ni], T = sc_ds_max_zero_run(width, (int64_t)w);
        for (int mode = 0; mode < 4; mode++) {
          uint8_t* x = (uint8_t*)xmalloc((size_t)n * w);
          if (mode == 0) clustered(t, x, n, 0.5);
          else if (mode == 1) clustered(t, x, n, 1.0);
          else if (mode == 2) for (int64_t i = 0; i < n; i++) ref_put(t, x, i, 0.0); /* all zero */
          else for (int64_t i = 0; i < n; i++) ref_put(t, x, i, 1.0 + (double)(i % 3)); /* dense */
          dense_ctx dc = {t, x, n, width};
          ds_t d;
          CHECK(run2(f_dense, &dc, t, &d) == SC_OK);
          CHECK(ref_ds_same(t, x, n, T, d.s, d.l, d.v, d.nb, d.nv));
          if (mode == 2) CHECK(d.nb == 0 && d.nv == 0);
          if (mode == 3) CHECK(d.nb == 1 && d.s[0] == 0 && d.l[0] == n);
          /* the same vector as COO: every position that is not +0 (some -0.0 entries
             included, which are zeros and must vanish), int32 and int64 indices */
          int64_t* idx = (int64_t*)xmalloc((size_t)n * 8);
          int32_t* idx32 = (int32_t*)xmalloc((size_t)n * 4);
          uint8_t* val = (uint8_t*)xmalloc((size_t)n * w);
          int64_t m = 0;
          for (int64_t i = 0; i < n; i++)
            if (ref_get(t, x, i) != 0.0 || (x[i * w + w - 1] & 0x80)) {
              idx[m] = i;
              idx32[m] = (int32_t)i;
              memcpy(val + m * w, x + i * w, w);
              m++;
            }
          for (int it = 0; it < 2; it++) {
            coo_ctx cc = {t, it ? SC_I64 : SC_I32, it ? (void*)idx : (void*)idx32, val, m, n, width};
            ds_t c;
            CHECK(run2(f_coo, &cc, t, &c) == SC_OK);
            CHECK(c.nb == d.nb && c.nv == d.nv && !memcmp(c.s, d.s, (size_t)d.nb * 8) &&
                  !memcmp(c.l, d.l, (size_t)d.nb * 8) && !memcmp(c.v, d.v, (size_t)d.nv * w));
            ds_free(&c);
          }
          free(idx);
          free(idx32);
          free(val);
          ds_free(&d);
          free(x);
        }
      }
    }
  }
}

/* x = [v, T zeros, v, T + 1 zeros, v]: one block of T + 2 values, then a second block */
static void test_zero_run_boundary(void) {
  for (int ti = 0; ti < 4; ti++) {
    sc_dtype t = VTYPES[ti];
    size_t w = sc_dtype_size(t);
    for (int width = 1; width <= 8; width++) {
      int64_t T = sc_ds_max_zero_run(width, (int64_t)w), n = 2 * T + 6;
      uint8_t* x = (uint8_t*)xmalloc((size_t)n * w);
      for (int64_t i = 0; i < n; i++) ref_put(t, x, i, 0.0);
      ref_put(t, x, 1, 2.0);
      ref_put(t, x, 2 + T, -3.0);
      ref_put(t, x, 2 + T + T + 2, 5.0);
      dense_ctx dc = {t, x, n, width};
      ds_t d;
      CHECK(run2(f_dense, &dc, t, &d) == SC_OK);
      CHECK(d.nb == 2 && d.s[0] == 1 && d.l[0] == T + 2 && d.s[1] == 2 * T + 4 && d.l[1] == 1);
      CHECK(d.nv == T + 3);
      ds_free(&d);
      free(x);
    }
  }
}

static void test_add_slice_decode(void) {
  const int64_t ns[] = {1, 3, 50, 5000};
  for (int ti = 0; ti < 4; ti++) {
    sc_dtype t = VTYPES[ti];
    size_t w = sc_dtype_size(t);
    for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
      int64_t n = ns[ni];
      int width = sc_ds_width(n);
      int64_t T = sc_ds_max_zero_run(width, (int64_t)w);
      for (int rep = 0; rep < 6; rep++) {
        uint8_t* x = (uint8_t*)xmalloc((size_t)n * w);
        uint8_t* y = (uint8_t*)xmalloc((size_t)n * w);
        uint8_t* sum = (uint8_t*)xmalloc((size_t)n * w);
        clustered(t, x, n, 0.3 + 0.1 * rep);
        clustered(t, y, n, rep == 5 ? 0.0 : 0.6);
        if (rep == 4) /* y = -x: everything cancels */
          for (int64_t i = 0; i < n; i++) ref_put(t, y, i, -ref_get(t, x, i));
        for (int64_t i = 0; i < n; i++) ref_put(t, sum, i, ref_add(t, ref_get(t, x, i), ref_get(t, y, i)));
        dense_ctx dx = {t, x, n, width}, dy = {t, y, n, width};
        ds_t a, b, s;
        CHECK(run2(f_dense, &dx, t, &a) == SC_OK);
        CHECK(run2(f_dense, &dy, t, &b) == SC_OK);
        add_ctx ac = {t, &a, &b, n, width};
        CHECK(run2(f_add, &ac, t, &s) == SC_OK);
        CHECK(ref_ds_same(t, sum, n, T, s.s, s.l, s.v, s.nb, s.nv));
        if (rep == 4) CHECK(s.nb == 0);
        ds_free(&s);
        /* slices at every cut of a small vector, a few of a large one */
        for (int64_t c = 0; c < 12; c++) {
          int64_t lo = n < 12 ? c % (n + 1) : (int64_t)(rnd() % (uint64_t)(n + 1));
          int64_t hi = lo + (int64_t)(rnd() % (uint64_t)(n - lo + 1));
          slice_ctx sc = {t, &a, n, lo, hi, width};
          CHECK(run2(f_slice, &sc, t, &s) == SC_OK);
          uint8_t* part = (uint8_t*)xmalloc((size_t)n * w);
          for (int64_t i = 0; i < n; i++) ref_put(t, part, i, i >= lo && i < hi ? ref_get(t, x, i) : 0.0);
          CHECK(ref_ds_same(t, part, n, T, s.s, s.l, s.v, s.nb, s.nv));
          free(part);
          ds_free(&s);
        }
        /* add_into: y + blocks of x == sum (element-wise in the same arithmetic) */
        sc_error_info e = {0, 0, 0};
        CHECK(sc_ds_add_into(t, y, n, a.s, a.l, a.v, a.nb, a.nv, &e) == SC_OK);
        for (int64_t i = 0; i < n; i++) CHECK(ref_get(t, y, i) == ref_get(t, sum, i));
        /* to_coo: exactly the non-zeros of x */
        int64_t m = -1;
        CHECK(sc_ds_to_coo(t, a.s, a.l, a.v, a.nb, a.nv, n, NULL, NULL, 0, &m, &e) == SC_OK);
        int64_t* idx = (int64_t*)xmalloc((size_t)m * 8);
        uint8_t* val = (uint8_t*)xmalloc((size_t)m * w);
        CHECK(sc_ds_to_coo(t, a.s, a.l, a.v, a.nb, a.nv, n, idx, val, m, &m, &e) == SC_OK);
        int64_t j = 0;
        for (int64_t i = 0; i < n; i++)
          if (ref_get(t, x, i) != 0.0) {
            CHECK(j < m && idx[j] == i && ref_same(t, val, j, x, i));
            j++;
          }
        CHECK(j == m);
        int64_t m0 = m; /* one entry short: refused before anything is written */
        CHECK(sc_ds_to_coo(t, a.s, a.l, a.v, a.nb, a.nv, n, idx, val, m0 - 1, &m, &e) == SC_ERR_ARG && m == m0);
        free(idx);
        free(val);
        ds_free(&a);
        ds_free(&b);
        free(x);
        free(y);
        free(sum);
      }
    }
  }
}

static void test_nan_and_halves(void) {
  /* NaN is not zero: it starts and ends blocks and survives a sum */
  float x[5] = {0.0f, NAN, 0.0f, 0.0f, 1.0f};
  dense_ctx dc = {SC_F32, x, 5, 4}; /* T = 2 */
  ds_t d;
  CHECK(run2(f_dense, &dc, SC_F32, &d) == SC_OK);
  CHECK(d.nb == 1 && d.s[0] == 1 && d.l[0] == 4 && isnan(((float*)d.v)[0]));
  add_ctx ac = {SC_F32, &d, &d, 5, 4};
  ds_t s;
  CHECK(run2(f_add, &ac, SC_F32, &s) == SC_OK);
  CHECK(s.nb == 1 && isnan(((float*)s.v)[0]) && ((float*)s.v)[3] == 2.0f);
  ds_free(&s);
  ds_free(&d);
  /* half sums round once from float32: 2048 + 1 in float16 is 2048 (ties to even) */
  uint16_t h[2] = {sc_f32_to_f16(2048.0f), 0}, g[2] = {sc_f32_to_f16(1.0f), 0};
  dense_ctx dh = {SC_F16, h, 2, 1}, dg = {SC_F16, g, 2, 1};
  ds_t a, b;
  CHECK(run2(f_dense, &dh, SC_F16, &a) == SC_OK && run2(f_dense, &dg, SC_F16, &b) == SC_OK);
  add_ctx hc = {SC_F16, &a, &b, 2, 1};
  CHECK(run2(f_add, &hc, SC_F16, &s) == SC_OK);
  CHECK(s.nb == 1 && sc_f16_to_f32(((uint16_t*)s.v)[0]) == 2048.0f);
  ds_free(&s);
  ds_free(&a);
  ds_free(&b);
}

static void test_rejects(void) {
  sc_error_info e = {0, 0, 0};
  float v[8] = {1, 2, 3, 4, 5, 6, 7, 8}, dense[20] = {0};
  struct {
    int64_t s[3], l[3], nb, nv, n;
    int st, input;
    int64_t pos;
  } cases[] = {
      {{0, 5, 9}, {2, 2, 2}, 3, 6, 20, SC_OK, 0, 0},
      {{0, 5, 9}, {2, 2, 2}, 3, 6, 10, SC_ERR_INDEX_RANGE, 1, 2},  /* end 11 > n */
      {{0, 5, 19}, {2, 2, 2}, 3, 6, 20, SC_ERR_INDEX_RANGE, 1, 2}, /* end 21 > n */
      {{0, 5, 20}, {2, 2, 1}, 3, 5, 20, SC_ERR_INDEX_RANGE, 0, 2}, /* start >= n */
      {{-1, 5, 9}, {2, 2, 2}, 3, 6, 20, SC_ERR_INDEX_RANGE, 0, 0}, /* negative start */
      {{0, 1, 9}, {2, 2, 2}, 3, 6, 20, SC_ERR_INDEX_ORDER, 0, 1},  /* overlap */
      {{5, 0, 9}, {2, 2, 2}, 3, 6, 20, SC_ERR_INDEX_ORDER, 0, 1},  /* unsorted */
      {{0, 2, 9}, {2, 2, 2}, 3, 6, 20, SC_OK, 0, 0},               /* touching: allowed */
      {{0, 5, 9}, {2, 0, 2}, 3, 4, 20, SC_ERR_INDEX_RANGE, 1, 1},  /* empty block */
      {{0, 5, 9}, {2, 2, 2}, 3, 7, 20, SC_ERR_ARG, 2, -1},         /* lengths sum 6 != 7 */
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    e.input = e.position = -9;
    int st = sc_ds_check_blocks(cases[c].s, cases[c].l, cases[c].nb, cases[c].nv, cases[c].n, &e);
    CHECK(st == cases[c].st);
    if (st) CHECK(e.input == cases[c].input && e.position == cases[c].pos);
    /* every kernel that takes blocks checks them the same way, before writing */
    float before[20];
    memcpy(before, dense, sizeof dense);
    CHECK(sc_ds_add_into(SC_F32, dense, cases[c].n, cases[c].s, cases[c].l, v, cases[c].nb, cases[c].nv, &e) == st);
    if (st) CHECK(!memcmp(before, dense, sizeof dense));
    int64_t m;
    CHECK(sc_ds_to_coo(SC_F32, cases[c].s, cases[c].l, v, cases[c].nb, cases[c].nv, cases[c].n, NULL, NULL, 0, &m, &e) == st);
    sc_ds_counts got;
    CHECK(sc_ds_slice(SC_F32, cases[c].s, cases[c].l, v, cases[c].nb, cases[c].nv, cases[c].n, 0, cases[c].n, 1,
                      NULL, NULL, NULL, 0, 0, &got, &e) == st);
    int st_b = sc_ds_add(SC_F32, NULL, NULL, NULL, 0, 0, cases[c].s, cases[c].l, v, cases[c].nb, cases[c].nv,
                         cases[c].n, 1, NULL, NULL, NULL, 0, 0, &got, &e);
    CHECK(st_b == st && (st == SC_OK || e.input == cases[c].input + 3));
  }
  /* unsorted COO, out of range COO, bad widths, dtypes, capacities, ranges */
  int64_t idx[3] = {3, 2, 5};
  sc_ds_counts got;
  CHECK(sc_ds_encode_coo(SC_I64, SC_F32, idx, v, 3, 10, 1, NULL, NULL, NULL, 0, 0, &got, &e) == SC_ERR_INDEX_ORDER);
  idx[1] = 4;
  CHECK(sc_ds_encode_coo(SC_I64, SC_F32, idx, v, 3, 5, 1, NULL, NULL, NULL, 0, 0, &got, &e) == SC_ERR_INDEX_RANGE);
  CHECK(sc_ds_encode_coo(SC_I64, SC_F32, idx, v, 3, 10, 0, NULL, NULL, NULL, 0, 0, &got, &e) == SC_ERR_ARG);
  CHECK(sc_ds_encode_coo(SC_I64, SC_F32, idx, v, 3, 10, 9, NULL, NULL, NULL, 0, 0, &got, &e) == SC_ERR_ARG);
  CHECK(sc_ds_encode_dense(SC_U8, v, 3, 1, NULL, NULL, NULL, 0, 0, &got, &e) == SC_ERR_ARG);
  int64_t s[3], l[3];
  float o[8];
  idx[2] = 9; /* T = 1: blocks [3, 5) and [9, 10) */
  CHECK(sc_ds_encode_coo(SC_I64, SC_F32, idx, v, 3, 10, 1, s, l, o, 1, 8, &got, &e) == SC_ERR_ARG); /* 2 blocks */
  CHECK(sc_ds_encode_coo(SC_I64, SC_F32, idx, v, 3, 10, 1, s, l, o, 3, 2, &got, &e) == SC_ERR_ARG); /* 3 values */
  CHECK(sc_ds_encode_coo(SC_I64, SC_F32, idx, v, 3, 10, 1, s, NULL, o, 3, 8, &got, &e) == SC_ERR_ARG);
  int64_t bs[1] = {0}, bl[1] = {2};
  CHECK(sc_ds_slice(SC_F32, bs, bl, v, 1, 2, 10, 4, 3, 1, NULL, NULL, NULL, 0, 0, &got, &e) == SC_ERR_ARG);
  CHECK(sc_ds_slice(SC_F32, bs, bl, v, 1, 2, 10, 0, 11, 1, NULL, NULL, NULL, 0, 0, &got, &e) == SC_ERR_ARG);
  /* values overlapping the dense buffer written */
  CHECK(sc_ds_add_into(SC_F32, dense, 20, bs, bl, dense + 1, 1, 2, &e) == SC_ERR_OVERLAP);
}

/* ------------------------------------------------------------ wire */

typedef struct {
  uint8_t p[512];
  int64_t n;
} msg_t;

static void put_le(msg_t* m, uint64_t v, int nbytes) {
  for (int i = 0; i < nbytes; i++) m->p[m->n++] = (uint8_t)(v >> (8 * i));
}
static void set_le(msg_t* m, int64_t pos, uint64_t v, int nbytes) {
  for (int i = 0; i < nbytes; i++) m->p[pos + i] = (uint8_t)(v >> (8 * i));
}
static void pad(msg_t* m) {
  while (m->n % 8) m->p[m->n++] = 0;
}

/* a float32 DenseStream message of blocks (s, l) over [lo, hi) of n */
static msg_t ds_msg(const int64_t* s, const int64_t* l, int64_t nb, int64_t n, int64_t lo, int64_t hi) {
  msg_t m;
  memset(&m, 0, sizeof m);
  int64_t nv = 0;
  for (int64_t b = 0; b < nb; b++) nv += l[b];
  int w = sc_ds_width(n);
  put_le(&m, SC_WIRE_MAGIC, 4);
  put_le(&m, SC_WIRE_VERSION, 2);
  put_le(&m, SC_KIND_DENSE_BLOCKS, 1);
  put_le(&m, SC_WIRE_F32, 1);
  put_le(&m, 0, 4);
  put_le(&m, 2, 4); /* sender */
  put_le(&m, (uint64_t)n, 8);
  put_le(&m, (uint64_t)nb, 8);
  put_le(&m, (uint64_t)lo, 8);
  put_le(&m, (uint64_t)hi, 8);
  put_le(&m, (uint64_t)nv, 8);
  put_le(&m, (uint64_t)w, 8);
  for (int64_t b = 0; b < nb; b++) put_le(&m, (uint64_t)s[b], w);
  for (int64_t b = 0; b < nb; b++) put_le(&m, (uint64_t)(l[b] - 1), w);
  pad(&m);
  for (int64_t k = 0; k < nv; k++) put_le(&m, 0x3F800000u, 4);
  pad(&m);
  return m;
}

static int64_t ds_field(const msg_t* m, const sc_wire_expect* w, int64_t lo, int64_t hi, sc_ds_layout* L) {
  sc_error_info e = {0, 0, 0};
  int st = sc_wire_check_densestream(m->p, m->n, w, lo, hi, L, &e);
  return st == SC_OK ? 0 : st == SC_ERR_MALFORMED ? e.input : -st;
}

static void test_wire(void) {
  int64_t s[3] = {300, 310, 400}, l[3] = {5, 2, 100};
  sc_wire_expect w = sc_wire_expect_any();
  w.sender = 2;
  w.n = 1000;
  w.value_dtype = SC_WIRE_F32;
  sc_ds_layout L;
  msg_t m = ds_msg(s, l, 3, 1000, 250, 500);
  CHECK(ds_field(&m, &w, 250, 500, &L) == 0);
  CHECK(L.nblocks == 3 && L.nvalues == 107 && L.width == 2 && L.lo == 250 && L.hi == 500);
  CHECK(L.starts_pos == 64 && L.lengths_pos == 70 && L.values_pos == 80 && L.value_size == 4);
  CHECK(L.values_pos + 107 * 4 + 4 == m.n);
  CHECK(ds_field(&m, NULL, -1, -1, &L) == 0);
  /* what the receiver expects */
  CHECK(ds_field(&m, &w, 200, 500, &L) == SC_WF_DS_RANGE);
  CHECK(ds_field(&m, &w, 250, 501, &L) == SC_WF_DS_RANGE);
  w.n = 1001;
  CHECK(ds_field(&m, &w, -1, -1, &L) == SC_WF_N);
  w.n = 1000;
  w.count = 2;
  CHECK(ds_field(&m, &w, -1, -1, &L) == SC_WF_COUNT);
  w.count = -1;
  /* blocks: unsorted, overlapping, outside the range, past N */
  int64_t s2[3] = {310, 300, 400};
  msg_t b = ds_msg(s2, l, 3, 1000, 250, 500);
  CHECK(ds_field(&b, &w, -1, -1, &L) == SC_WF_DS_BLOCK_ORDER);
  int64_t s3[3] = {300, 304, 400};
  b = ds_msg(s3, l, 3, 1000, 250, 500);
  CHECK(ds_field(&b, &w, -1, -1, &L) == SC_WF_DS_BLOCK_ORDER);
  int64_t s4[3] = {300, 310, 450};
  b = ds_msg(s4, l, 3, 1000, 250, 500);
  CHECK(ds_field(&b, &w, -1, -1, &L) == SC_WF_DS_BLOCK_RANGE);
  int64_t s5[3] = {200, 310, 400};
  b = ds_msg(s5, l, 3, 1000, 250, 500);
  CHECK(ds_field(&b, &w, -1, -1, &L) == SC_WF_DS_BLOCK_RANGE);
  b = ds_msg(s4, l, 3, 500, 250, 500); /* end 550 > N = 500 */
  w.n = -1;
  CHECK(ds_field(&b, &w, -1, -1, &L) == SC_WF_DS_BLOCK_RANGE);
  w.n = 1000;
  /* fixed fields: range, nvalues, width, reserved, lengths sum */
  b = m;
  set_le(&b, 40, 2000, 8);
  CHECK(ds_field(&b, &w, -1, -1, &L) == SC_WF_DS_RANGE);
  b = m;
  set_le(&b, 32, 501, 8);
  CHECK(ds_field(&b, &w, -1, -1, &L) == SC_WF_DS_RANGE);
  b = m;
  set_le(&b, 48, 300, 8); /* nvalues > hi - lo */
  CHECK(ds_field(&b, &w, -1, -1, &L) == SC_WF_DS_NVALUES);
  b = m;
  set_le(&b, 56, 3, 1); /* width 3 for N = 1000 */
  CHECK(ds_field(&b, &w, -1, -1, &L) == SC_WF_DS_WIDTH);
  b = m;
  set_le(&b, 56, 0, 1);
  CHECK(ds_field(&b, &w, -1, -1, &L) == SC_WF_DS_WIDTH);
  b = m;
  set_le(&b, 60, 1, 1);
  CHECK(ds_field(&b, &w, -1, -1, &L) == SC_WF_RESERVED);
  b = m;
  set_le(&b, 70 + 4, 3, 2); /* last length 100 -> 4: lengths sum 11 != nvalues */
  CHECK(ds_field(&b, &w, -1, -1, &L) == SC_WF_DS_NVALUES);
  /* sizes: short, long, truncated prefix, padding */
  b = m;
  b.n -= 8;
  CHECK(ds_field(&b, &w, -1, -1, &L) == SC_WF_SIZE);
  b = m;
  b.n += 8;
  CHECK(ds_field(&b, &w, -1, -1, &L) == SC_WF_SIZE);
  b = m;
  b.n = 40;
  CHECK(ds_field(&b, &w, -1, -1, &L) == SC_WF_SIZE);
  b = m;
  b.p[77] = 1; /* field padding */
  CHECK(ds_field(&b, &w, -1, -1, &L) == SC_WF_PADDING);
  b = m;
  b.p[m.n - 1] = 1; /* value padding */
  CHECK(ds_field(&b, &w, -1, -1, &L) == SC_WF_PADDING);
  /* header: kind, index dtype, value dtype, count > N */
  b = m;
  b.p[6] = SC_KIND_COO;
  CHECK(ds_field(&b, &w, -1, -1, &L) == SC_WF_KIND);
  b = m;
  b.p[8] = SC_WIRE_I32;
  CHECK(ds_field(&b, &w, -1, -1, &L) == SC_WF_INDEX_DTYPE);
  b = m;
  b.p[7] = SC_WIRE_I64;
  w.value_dtype = -1;
  CHECK(ds_field(&b, &w, -1, -1, &L) == SC_WF_VALUE_DTYPE);
  b = m;
  set_le(&b, 24, 1001, 8);
  CHECK(ds_field(&b, &w, -1, -1, &L) == SC_WF_COUNT);
  /* an empty stream, N = 1, and a full-width length field (0xFF..: length 0 after +1) */
  msg_t z = ds_msg(NULL, NULL, 0, 1, 0, 1);
  CHECK(ds_field(&z, NULL, 0, 1, &L) == 0 && L.nblocks == 0 && L.width == 1);
  int64_t s1[1] = {0}, l1[1] = {1};
  z = ds_msg(s1, l1, 1, 1, 0, 1);
  CHECK(ds_field(&z, NULL, 0, 1, &L) == 0 && L.nvalues == 1);
  int64_t sb[1] = {0}, lb[1] = {1};
  z = ds_msg(sb, lb, 1, INT64_MAX, 0, INT64_MAX);
  CHECK(ds_field(&z, NULL, -1, -1, &L) == 0 && L.width == 8);
  set_le(&z, 64 + 8, UINT64_MAX, 8);
  CHECK(ds_field(&z, NULL, -1, -1, &L) == SC_WF_DS_BLOCK_RANGE);
  /* a bad expectation is the caller's error */
  w.sender = -5;
  CHECK(ds_field(&m, &w, -1, -1, &L) == -SC_ERR_ARG);
  CHECK(ds_field(&m, NULL, -3, -1, &L) == -SC_ERR_ARG);
}

int main(void) {
  RUN(test_width_and_run);
  RUN(test_encode);
  RUN(test_zero_run_boundary);
  RUN(test_add_slice_decode);
  RUN(test_nan_and_halves);
  RUN(test_rejects);
  RUN(test_wire);
  printf("%ld checks, %ld failed\n", g_checks, g_failed);
  return g_failed ? 1 : 0;
}
