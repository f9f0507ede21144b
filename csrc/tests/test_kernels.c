/*
 * C tests of the sparsecomm kernels: every function of kernels.h, stream.h,
 * sketch.h and wire.h on normal and adversarial inputs (repeated, unsorted and
 * out-of-range indices, overlapping buffers, NaN, empty inputs), checked
 * against the reference loops of ref.h or small tables written here, and at
 * sizes past the parallel thresholds (65536 / 262144 entries) with 1 and 4
 * threads (results must not depend on the thread count).
 *
 *   make ctest       plain -O2 -fopenmp build
 *   make sanitize    the same under ASan + UBSan
 *
 * No torch, no Python. Exit status 0 when every check passes.
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "ref.h"
#include "sparsecomm/kernels.h"
#include "sparsecomm/sketch.h"
#include "sparsecomm/stream.h"
#include "sparsecomm/wire.h"

static const sc_dtype VTYPES[4] = {SC_F32, SC_F64, SC_F16, SC_BF16};
static const int THREADS[2] = {1, 4};
#define PAR_N 300000 /* past every parallel threshold (65536, 262144, SC_WIRE_PAR_MIN) */

/* a random strictly ascending index vector of m entries in [0, limit) */
static void sorted_indices(sc_index_t it, void* idx, int64_t m, int64_t limit) {
  int64_t have = 0;
  for (int64_t i = 0; i < limit && have < m; i++)
    if ((uint64_t)(rnd() % (uint64_t)(limit - i)) < (uint64_t)(m - have)) ref_set_idx(it, idx, have++, i);
}

static void random_values(sc_dtype t, void* v, int64_t m) {
  for (int64_t i = 0; i < m; i++) ref_put(t, v, i, (rnd_unit() - 0.5) * 8.0);
}

/* ------------------------------------------------------------ messages */

typedef struct {
  uint8_t* p;
  int64_t n, cap;
} buf_t;

static void put(buf_t* b, const void* src, int64_t n) {
  if (b->n + n > b->cap) {
    b->cap = (b->n + n) * 2 + 64;
    b->p = (uint8_t*)realloc(b->p, (size_t)b->cap);
  }
  memcpy(b->p + b->n, src, (size_t)n);
  b->n += n;
}
static void put_u(buf_t* b, uint64_t v, int nbytes) {
  uint8_t t[8];
  for (int i = 0; i < nbytes; i++) t[i] = (uint8_t)(v >> (8 * i));
  put(b, t, nbytes);
}
static void pad8(buf_t* b) {
  while (b->n % 8) put_u(b, 0, 1);
}
static void header(buf_t* b, int kind, int vcode, int icode, uint32_t sender, uint64_t n, uint64_t count) {
  put_u(b, SC_WIRE_MAGIC, 4);
  put_u(b, SC_WIRE_VERSION, 2);
  put_u(b, (uint64_t)kind, 1);
  put_u(b, (uint64_t)vcode, 1);
  put_u(b, (uint64_t)icode, 1);
  put_u(b, 0, 3);
  put_u(b, sender, 4);
  put_u(b, n, 8);
  put_u(b, count, 8);
}
static int icode_for(int64_t n) { return n < ((int64_t)1 << 31) ? SC_WIRE_I32 : SC_WIRE_I64; }

/* COO message of idx (int64 here, written in the wire's index type) and float values */
static buf_t coo_msg(const int64_t* idx, int64_t m, int64_t n, int vcode, uint32_t sender) {
  buf_t b = {0};
  int ic = icode_for(n);
  header(&b, SC_KIND_COO, vcode, ic, sender, (uint64_t)n, (uint64_t)m);
  for (int64_t i = 0; i < m; i++) put_u(&b, (uint64_t)idx[i], ic == SC_WIRE_I32 ? 4 : 8);
  pad8(&b);
  for (int64_t i = 0; i < m; i++) put_u(&b, 0x3F800000u + (uint64_t)i, (int)sc_wire_dtype_size(vcode));
  return b;
}

static buf_t stream_msg(const int64_t* idx, int64_t m, int64_t n, int64_t offset, int dense) {
  buf_t b = {0};
  int ic = icode_for(n);
  header(&b, dense ? SC_KIND_DENSE : SC_KIND_COO, SC_WIRE_F32, dense ? 0 : ic, 1, (uint64_t)n,
         (uint64_t)(dense ? n : m));
  put_u(&b, (uint64_t)offset, 8);
  if (!dense) {
    for (int64_t i = 0; i < m; i++) put_u(&b, (uint64_t)idx[i], ic == SC_WIRE_I32 ? 4 : 8);
    pad8(&b);
  }
  for (int64_t i = 0; i < (dense ? n : m); i++) put_u(&b, 0x40000000u, 4);
  pad8(&b);
  return b;
}

static buf_t qsgd_msg(int64_t n, int bits, int64_t bucket, int64_t offset) {
  buf_t b = {0};
  int64_t count = (n * bits + 7) / 8, nb = (n + bucket - 1) / bucket;
  header(&b, SC_KIND_DENSE, SC_WIRE_U8, 0, 2, (uint64_t)n, (uint64_t)count);
  put_u(&b, (uint64_t)offset, 8);
  put_u(&b, (uint64_t)bucket, 4);
  put_u(&b, (uint64_t)bits, 4);
  for (int64_t i = 0; i < nb; i++) put_u(&b, 0x3F800000u, 4); /* 1.0f */
  pad8(&b);
  for (int64_t i = 0; i < count; i++) put_u(&b, bits == 8 ? 127 : (i == count - 1 && (n & 1) ? 7 : 0x77), 1);
  pad8(&b);
  return b;
}

static void set_u(buf_t* b, int64_t pos, uint64_t v, int nbytes) {
  for (int i = 0; i < nbytes; i++) b->p[pos + i] = (uint8_t)(v >> (8 * i));
}

/* the check's status and error field */
static int64_t field_of(int st, const sc_error_info* e) { return st == SC_OK ? 0 : st == SC_ERR_MALFORMED ? e->input : -st; }

/* ------------------------------------------------------------ wire: header */

static void test_wire_header(void) {
  buf_t b = {0};
  header(&b, SC_KIND_COO, SC_WIRE_F32, SC_WIRE_I32, 3, 1000, 10);
  sc_wire_header h;
  sc_error_info e;
  CHECK(sc_wire_check_header(b.p, b.n, NULL, &h, &e) == SC_OK);
  CHECK(h.kind == SC_KIND_COO && h.sender == 3 && h.n == 1000 && h.count == 10 && h.index_dtype == SC_WIRE_I32);
  sc_wire_expect w = sc_wire_expect_any();
  w.kind = SC_KIND_COO; w.value_dtype = SC_WIRE_F32; w.index_dtype = SC_WIRE_I32;
  w.sender = 3; w.n = 1000; w.count = 10;
  CHECK(sc_wire_check_header(b.p, b.n, &w, &h, &e) == SC_OK);
  CHECK(sc_wire_check_header(b.p, b.n, &w, NULL, NULL) == SC_OK);

  /* one byte changed -> that field, at its offset, with the received value */
  static const struct { int64_t pos; uint64_t v; int nbytes; int64_t field, value; } cases[] = {
      {0, 0x4D435054, 4, SC_WF_MAGIC, 0x4D435054}, {4, 2, 2, SC_WF_VERSION, 2},
      {6, 2, 1, SC_WF_KIND, 2},                    {6, 0, 1, SC_WF_KIND, 0},
      {6, 4, 1, SC_WF_KIND, 4},                    {7, 2, 1, SC_WF_VALUE_DTYPE, 2},
      {7, 8, 1, SC_WF_VALUE_DTYPE, 8},             {8, 6, 1, SC_WF_INDEX_DTYPE, 6},
      {9, 1, 1, SC_WF_RESERVED, 1},                {11, 0x80, 1, SC_WF_RESERVED, 0x80},
      {12, 4, 4, SC_WF_SENDER, 4},                 {16, 999, 8, SC_WF_N, 999},
      {16, UINT64_MAX, 8, SC_WF_N, -1},            {24, 11, 8, SC_WF_COUNT, 11},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    buf_t m = {0};
    put(&m, b.p, b.n);
    set_u(&m, cases[c].pos, cases[c].v, cases[c].nbytes);
    e.input = e.position = e.value = -7;
    int st = sc_wire_check_header(m.p, m.n, &w, &h, &e);
    CHECK(st == SC_ERR_MALFORMED && e.input == cases[c].field && e.position == cases[c].pos &&
          e.value == cases[c].value);
    free(m.p);
  }
  /* without expectations, only the format's own rules */
  buf_t m = {0};
  put(&m, b.p, b.n);
  set_u(&m, 24, (uint64_t)1 << 63, 8);
  CHECK(field_of(sc_wire_check_header(m.p, m.n, NULL, NULL, &e), &e) == SC_WF_COUNT);
  free(m.p);
  for (int64_t n = 0; n < SC_WIRE_HEADER_NBYTES; n++) { /* short */
    CHECK(sc_wire_check_header(b.p, n, NULL, NULL, &e) == SC_ERR_MALFORMED && e.input == SC_WF_SIZE &&
          e.value == n);
  }
  CHECK(sc_wire_check_header(NULL, 0, NULL, NULL, &e) == SC_ERR_MALFORMED);
  CHECK(sc_wire_check_header(NULL, 5, NULL, NULL, &e) == SC_ERR_ARG);
  CHECK(sc_wire_check_header(b.p, -1, NULL, NULL, &e) == SC_ERR_ARG);
  w.n = -2;
  CHECK(sc_wire_check_header(b.p, b.n, &w, NULL, &e) == SC_ERR_ARG && e.input == 4);
  CHECK(strcmp(sc_wire_field_name(SC_WF_INDEX_ORDER), "index_order") == 0);
  CHECK(strcmp(sc_wire_field_name(99), "unknown") == 0);
  free(b.p);
}

/* ------------------------------------------------------------ wire: COO */

static void test_wire_coo(void) {
  static const int64_t good[] = {1, 5, 9};
  static const int vcodes[] = {SC_WIRE_F32, SC_WIRE_F64, SC_WIRE_F16, SC_WIRE_BF16};
  sc_wire_layout L;
  sc_error_info e;
  for (int v = 0; v < 4; v++)
    for (int big = 0; big < 2; big++) {
      int64_t n = big ? ((int64_t)1 << 40) : 10;
      buf_t b = coo_msg(good, 3, n, vcodes[v], 7);
      CHECK(sc_wire_check_coo(b.p, b.n, NULL, 1, &L, &e) == SC_OK);
      int64_t is = big ? 8 : 4;
      CHECK(L.count == 3 && L.n == n && L.index_pos == 32 && L.index_size == is &&
            L.value_pos == 32 + ((3 * is + 7) & ~7) && L.value_size == sc_wire_dtype_size(vcodes[v]) &&
            L.value_pos + 3 * L.value_size == b.n);
      free(b.p);
    }
  /* empty */
  buf_t b = coo_msg(NULL, 0, 10, SC_WIRE_F32, 0);
  CHECK(b.n == 32 && sc_wire_check_coo(b.p, b.n, NULL, 4, &L, &e) == SC_OK && L.count == 0);
  free(b.p);

  /* table: indices -> field, position */
  static const struct { int64_t idx[4]; int m; int64_t field, pos, value; } bad_idx[] = {
      {{1, 5, 5}, 3, SC_WF_INDEX_ORDER, 2, 5},   {{5, 1, 9}, 3, SC_WF_INDEX_ORDER, 1, 1},
      {{1, 5, 10}, 3, SC_WF_INDEX_RANGE, 2, 10}, {{-1, 5, 9}, 3, SC_WF_INDEX_RANGE, 0, -1},
      {{3, 3}, 2, SC_WF_INDEX_ORDER, 1, 3},      {{0, 1, 2, 20}, 4, SC_WF_INDEX_RANGE, 3, 20},
      {{9, 12, 1}, 3, SC_WF_INDEX_RANGE, 1, 12}, /* the first bad position wins */
  };
  for (size_t c = 0; c < sizeof bad_idx / sizeof bad_idx[0]; c++) {
    b = coo_msg(bad_idx[c].idx, bad_idx[c].m, 10, SC_WIRE_F32, 0);
    int st = sc_wire_check_coo(b.p, b.n, NULL, 1, &L, &e);
    CHECK(st == SC_ERR_MALFORMED && e.input == bad_idx[c].field && e.position == bad_idx[c].pos &&
          e.value == bad_idx[c].value);
    /* the layout alone accepts it */
    CHECK(sc_wire_coo_layout(b.p, b.n, NULL, &L, &e) == SC_OK);
    free(b.p);
  }
  /* table: layout faults */
  b = coo_msg(good, 3, 10, SC_WIRE_F32, 7);
  struct { int64_t pos; uint64_t v; int nbytes; int64_t trim; int64_t field; } lay[] = {
      {44, 1, 1, 0, SC_WF_PADDING},            /* index padding */
      {0, 0, 0, 1, SC_WF_SIZE},                /* one byte short */
      {0, 0, 0, -4, SC_WF_SIZE},               /* four bytes long */
      {24, 11, 8, 0, SC_WF_COUNT},             /* count > N */
      {24, 4, 8, 0, SC_WF_SIZE},               /* count vs size */
      {8, SC_WIRE_I64, 1, 0, SC_WF_INDEX_DTYPE}, /* int64 indices for N < 2^31 */
      {7, SC_WIRE_U8, 1, 0, SC_WF_VALUE_DTYPE},  /* not a float */
      {7, SC_WIRE_I32, 1, 0, SC_WF_VALUE_DTYPE},
      {6, SC_KIND_DENSE, 1, 0, SC_WF_KIND},
  };
  for (size_t c = 0; c < sizeof lay / sizeof lay[0]; c++) {
    buf_t m = {0};
    put(&m, b.p, b.n);
    if (lay[c].trim < 0) put_u(&m, 0, (int)-lay[c].trim);
    m.n -= lay[c].trim > 0 ? lay[c].trim : 0;
    if (lay[c].nbytes) set_u(&m, lay[c].pos, lay[c].v, lay[c].nbytes);
    CHECK(field_of(sc_wire_check_coo(m.p, m.n, NULL, 1, &L, &e), &e) == lay[c].field);
    free(m.p);
  }
  /* expectations */
  sc_wire_expect w = sc_wire_expect_any();
  w.n = 10; w.value_dtype = SC_WIRE_F32; w.sender = 7; w.count = 3;
  w.kind = SC_KIND_DENSE;       /* ignored: a COO check wants COO */
  w.index_dtype = SC_WIRE_I64;  /* ignored: derived from N */
  CHECK(sc_wire_check_coo(b.p, b.n, &w, 1, &L, &e) == SC_OK);
  w.count = 2;
  CHECK(field_of(sc_wire_check_coo(b.p, b.n, &w, 1, &L, &e), &e) == SC_WF_COUNT);
  w.count = 3; w.sender = 6;
  CHECK(field_of(sc_wire_check_coo(b.p, b.n, &w, 1, &L, &e), &e) == SC_WF_SENDER);
  w.sender = 7; w.value_dtype = SC_WIRE_F64;
  CHECK(field_of(sc_wire_check_coo(b.p, b.n, &w, 1, &L, &e), &e) == SC_WF_VALUE_DTYPE);
  /* any alignment: the same message one byte into a buffer */
  uint8_t* shifted = (uint8_t*)xmalloc((size_t)b.n + 1);
  memcpy(shifted + 1, b.p, (size_t)b.n);
  CHECK(sc_wire_check_coo(shifted + 1, b.n, NULL, 1, &L, &e) == SC_OK);
  free(shifted);
  /* the layout reads only the prefix: a 48-byte copy with the full size */
  uint8_t* prefix = (uint8_t*)xmalloc(48);
  memcpy(prefix, b.p, 48);
  CHECK(sc_wire_coo_layout(prefix, b.n, NULL, &L, &e) == SC_OK && L.count == 3);
  CHECK(field_of(sc_wire_coo_layout(prefix, b.n + 1, NULL, &L, &e), &e) == SC_WF_SIZE);
  free(prefix);
  /* sizes past int64: rejected, not wrapped */
  buf_t h = {0};
  header(&h, SC_KIND_COO, SC_WIRE_F64, SC_WIRE_I64, 0, (uint64_t)INT64_MAX, (uint64_t)INT64_MAX / 4);
  CHECK(sc_wire_coo_layout(h.p, h.n, NULL, &L, &e) == SC_ERR_MALFORMED && e.input == SC_WF_SIZE &&
        e.position == -1);
  free(h.p);
  free(b.p);
}

/* large messages: the first bad index is found, at the same position, with 1
 * and 4 threads, wherever it is */
static void test_wire_coo_large(void) {
  const int64_t m = PAR_N, n = 3 * PAR_N;
  int64_t* idx = (int64_t*)xmalloc((size_t)m * 8);
  for (int64_t i = 0; i < m; i++) idx[i] = 3 * i + 1;
  for (int big = 0; big < 2; big++) {
    int64_t nn = big ? ((int64_t)1 << 33) : n;
    buf_t b = coo_msg(idx, m, nn, SC_WIRE_F32, 0);
    sc_wire_layout L;
    sc_error_info e;
    for (int t = 0; t < 2; t++) CHECK(sc_wire_check_coo(b.p, b.n, NULL, THREADS[t], &L, &e) == SC_OK);
    int64_t is = big ? 8 : 4;
    const int64_t where[] = {0, 1, m / 4 - 1, m / 4, m / 2 + 3, m - 1};
    for (size_t k = 0; k < sizeof where / sizeof where[0]; k++) {
      int64_t p = where[k], save = ref_idx(is == 4 ? SC_I32 : SC_I64, b.p + 32, p);
      /* order: repeat the previous index (position 0: make it negative) */
      ref_set_idx(is == 4 ? SC_I32 : SC_I64, b.p + 32, p, p ? idx[p - 1] : -5);
      for (int t = 0; t < 2; t++) {
        e.input = e.position = -7;
        int st = sc_wire_check_coo(b.p, b.n, NULL, THREADS[t], &L, &e);
        CHECK(st == SC_ERR_MALFORMED && e.position == p &&
              e.input == (p ? SC_WF_INDEX_ORDER : SC_WF_INDEX_RANGE));
      }
      /* a second fault later: still the first reported */
      if (p + 10 < m) {
        int64_t s2 = ref_idx(is == 4 ? SC_I32 : SC_I64, b.p + 32, p + 10);
        ref_set_idx(is == 4 ? SC_I32 : SC_I64, b.p + 32, p + 10, nn + 1);
        for (int t = 0; t < 2; t++)
          CHECK(sc_wire_check_coo(b.p, b.n, NULL, THREADS[t], &L, &e) == SC_ERR_MALFORMED && e.position == p);
        ref_set_idx(is == 4 ? SC_I32 : SC_I64, b.p + 32, p + 10, s2);
      }
      ref_set_idx(is == 4 ? SC_I32 : SC_I64, b.p + 32, p, save);
    }
    free(b.p);
  }
  /* sc_wire_check_indices: an int32 section against a limit past 2^31 still
   * rejects negatives */
  int32_t neg[3] = {1, 2, -2};
  sc_error_info e;
  CHECK(sc_wire_check_indices((const uint8_t*)neg, 4, 3, (int64_t)1 << 40, 1, &e) == SC_ERR_MALFORMED &&
        e.input == SC_WF_INDEX_RANGE && e.position == 2 && e.value == -2);
  CHECK(sc_wire_check_indices((const uint8_t*)neg, 3, 3, 10, 1, &e) == SC_ERR_ARG);
  free(idx);
}

/* ------------------------------------------------------------ wire: streams */

static void test_wire_stream(void) {
  sc_wire_layout L;
  sc_error_info e;
  sc_wire_expect w = sc_wire_expect_any();
  static const int64_t idx[] = {3, 50};
  buf_t b = stream_msg(idx, 2, 100, 7, 0);
  CHECK(sc_wire_check_stream(b.p, b.n, NULL, 1, &L, &e) == SC_OK);
  CHECK(!L.dense && L.offset == 7 && L.count == 2 && L.index_pos == 40 && L.value_pos == 48 && b.n == 56);
  w.offset = 7; w.n = 100; w.value_dtype = SC_WIRE_F32; w.sender = 1;
  CHECK(sc_wire_check_stream(b.p, b.n, &w, 1, &L, &e) == SC_OK);
  w.kind = SC_KIND_DENSE;
  CHECK(field_of(sc_wire_check_stream(b.p, b.n, &w, 1, &L, &e), &e) == SC_WF_KIND);
  w.kind = SC_KIND_SIGNATURE;
  CHECK(sc_wire_check_stream(b.p, b.n, &w, 1, &L, &e) == SC_ERR_ARG);
  w.kind = -1; w.offset = 8;
  CHECK(field_of(sc_wire_check_stream(b.p, b.n, &w, 1, &L, &e), &e) == SC_WF_OFFSET && e.value == 7);
  w.offset = 7;
  free(b.p);

  /* dense */
  b = stream_msg(NULL, 0, 5, 7, 1);
  CHECK(sc_wire_check_stream(b.p, b.n, NULL, 1, &L, &e) == SC_OK && L.dense && L.count == 5 &&
        L.value_pos == 40 && L.index_pos == -1 && b.n == 64);
  set_u(&b, 24, 4, 8);
  CHECK(field_of(sc_wire_check_stream(b.p, b.n, NULL, 1, &L, &e), &e) == SC_WF_COUNT);
  set_u(&b, 24, 5, 8);
  set_u(&b, 60, 9, 1); /* value padding */
  CHECK(field_of(sc_wire_check_stream(b.p, b.n, NULL, 1, &L, &e), &e) == SC_WF_PADDING && e.position == 60);
  set_u(&b, 60, 0, 1);
  set_u(&b, 8, SC_WIRE_I32, 1); /* dense with an index dtype */
  CHECK(field_of(sc_wire_check_stream(b.p, b.n, NULL, 1, &L, &e), &e) == SC_WF_INDEX_DTYPE);
  free(b.p);
  b = stream_msg(NULL, 0, 0, 0, 1); /* empty dense range */
  CHECK(sc_wire_check_stream(b.p, b.n, NULL, 1, &L, &e) == SC_OK && b.n == 40);
  free(b.p);

  /* delta(100) for float32 / int32 = 50: 50 items fit, 51 do not */
  int64_t many[51];
  for (int i = 0; i < 51; i++) many[i] = i;
  b = stream_msg(many, 50, 100, 0, 0);
  CHECK(sc_wire_check_stream(b.p, b.n, NULL, 1, &L, &e) == SC_OK);
  free(b.p);
  b = stream_msg(many, 51, 100, 0, 0);
  CHECK(field_of(sc_wire_check_stream(b.p, b.n, NULL, 1, &L, &e), &e) == SC_WF_DELTA && e.value == 51);
  free(b.p);

  /* indices, offset, size, kind */
  static const struct { int64_t idx[3]; int m; int64_t offset, trim, field; } cases[] = {
      {{50, 3}, 2, 0, 0, SC_WF_INDEX_ORDER},   {{3, 100}, 2, 0, 0, SC_WF_INDEX_RANGE},
      {{-3, 1}, 2, 0, 0, SC_WF_INDEX_RANGE},   {{3, 3}, 2, 0, 0, SC_WF_INDEX_ORDER},
      {{3, 50}, 2, -1, 0, SC_WF_OFFSET},       {{3, 50}, 2, 0, 8, SC_WF_SIZE},
      {{3, 50}, 2, 0, 41, SC_WF_SIZE},         {{3, 50, 60}, 3, 0, 0, SC_WF_NONE},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    b = stream_msg(cases[c].idx, cases[c].m, 100, cases[c].offset, 0);
    b.n -= cases[c].trim;
    CHECK(field_of(sc_wire_check_stream(b.p, b.n, NULL, 1, &L, &e), &e) == cases[c].field);
    free(b.p);
  }
  b = stream_msg(idx, 2, 100, 7, 0);
  set_u(&b, 6, SC_KIND_SIGNATURE, 1);
  CHECK(field_of(sc_wire_check_stream(b.p, b.n, NULL, 1, &L, &e), &e) == SC_WF_KIND);
  free(b.p);
  static const int64_t three[] = {3, 50, 60};
  b = stream_msg(three, 3, 100, 7, 0);
  set_u(&b, 40 + 12, 1, 1); /* index padding */
  CHECK(field_of(sc_wire_check_stream(b.p, b.n, NULL, 1, &L, &e), &e) == SC_WF_PADDING && e.position == 52);
  free(b.p);

  /* large sparse stream, parallel pass, bad index in the middle */
  const int64_t m = PAR_N, n = 4 * PAR_N;
  int64_t* big = (int64_t*)xmalloc((size_t)m * 8);
  for (int64_t i = 0; i < m; i++) big[i] = 4 * i + 2;
  b = stream_msg(big, m, n, 1000, 0);
  for (int t = 0; t < 2; t++) CHECK(sc_wire_check_stream(b.p, b.n, NULL, THREADS[t], &L, &e) == SC_OK);
  ref_set_idx(SC_I32, b.p + 40, m / 2, 1);
  for (int t = 0; t < 2; t++)
    CHECK(field_of(sc_wire_check_stream(b.p, b.n, NULL, THREADS[t], &L, &e), &e) == SC_WF_INDEX_ORDER &&
          e.position == m / 2);
  free(b.p);
  free(big);
}

/* ------------------------------------------------------------ wire: QSGD */

static void test_wire_qsgd(void) {
  sc_wire_layout L;
  sc_error_info e;
  const struct { int64_t n; int bits; int64_t bucket; } good[] = {
      {9, 4, 6}, {9, 8, 4}, {16, 4, 16}, {1, 8, 1}, {0, 8, 3}, {1000, 4, 2}, {7, 8, 100}};
  for (size_t c = 0; c < sizeof good / sizeof good[0]; c++) {
    buf_t b = qsgd_msg(good[c].n, good[c].bits, good[c].bucket, 5);
    CHECK(sc_wire_check_qsgd(b.p, b.n, NULL, &L, &e) == SC_OK);
    int64_t nb = (good[c].n + good[c].bucket - 1) / good[c].bucket;
    CHECK(L.bits == good[c].bits && L.bucket == good[c].bucket && L.nscales == nb && L.offset == 5 &&
          L.scale_pos == 48 && L.value_pos == 48 + ((4 * nb + 7) & ~7) &&
          L.count == (good[c].n * good[c].bits + 7) / 8);
    /* the levels and scales pass the kernel's own validation */
    double* out = (double*)xmalloc((size_t)good[c].n * 8);
    CHECK(sc_qsgd_dequantize(SC_F64, b.p + L.value_pos, (const float*)(b.p + L.scale_pos), L.n, (int)L.bits,
                             L.bucket, out, 1, &e) == SC_OK);
    free(out);
    free(b.p);
  }
  buf_t b = qsgd_msg(9, 4, 6, 5);
  sc_wire_expect w = sc_wire_expect_any();
  w.n = 9; w.bits = 4; w.bucket = 6; w.offset = 5; w.sender = 2;
  w.value_dtype = SC_WIRE_F32; /* ignored: QSGD travels as uint8 */
  CHECK(sc_wire_check_qsgd(b.p, b.n, &w, &L, &e) == SC_OK);
  w.bits = 8;
  CHECK(field_of(sc_wire_check_qsgd(b.p, b.n, &w, &L, &e), &e) == SC_WF_BITS && e.position == 44);
  w.bits = 4; w.bucket = 4;
  CHECK(field_of(sc_wire_check_qsgd(b.p, b.n, &w, &L, &e), &e) == SC_WF_BUCKET && e.position == 40);
  w.bucket = 6; w.offset = 6;
  CHECK(field_of(sc_wire_check_qsgd(b.p, b.n, &w, &L, &e), &e) == SC_WF_OFFSET);
  static const struct { int64_t pos; uint64_t v; int nbytes; int64_t trim, field; } cases[] = {
      {44, 5, 4, 0, SC_WF_BITS},         {44, 0, 4, 0, SC_WF_BITS},
      {40, 0, 4, 0, SC_WF_BUCKET},       {40, 5, 4, 0, SC_WF_BUCKET}, /* odd for 4 bits */
      {40, 0xFFFFFFFF, 4, 0, SC_WF_BUCKET}, {24, 4, 8, 0, SC_WF_COUNT},
      {8, SC_WIRE_I32, 1, 0, SC_WF_INDEX_DTYPE}, {7, SC_WIRE_F32, 1, 0, SC_WF_VALUE_DTYPE},
      {6, SC_KIND_COO, 1, 0, SC_WF_KIND},   {32, (uint64_t)-1, 8, 0, SC_WF_OFFSET},
      {0, 0, 0, 1, SC_WF_SIZE},            {0, 0, 0, 17, SC_WF_SIZE},
      {61, 1, 1, 0, SC_WF_PADDING},        /* packed padding: 5 bytes at 56, pad to 64 */
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    buf_t m = {0};
    put(&m, b.p, b.n);
    m.n -= cases[c].trim;
    if (cases[c].nbytes) set_u(&m, cases[c].pos, cases[c].v, cases[c].nbytes);
    CHECK(field_of(sc_wire_check_qsgd(m.p, m.n, NULL, &L, &e), &e) == cases[c].field);
    free(m.p);
  }
  free(b.p);
  b = qsgd_msg(9, 8, 4, 0); /* 3 scales: 12 bytes + 4 padding */
  set_u(&b, 48 + 13, 1, 1);
  CHECK(field_of(sc_wire_check_qsgd(b.p, b.n, NULL, &L, &e), &e) == SC_WF_PADDING && e.position == 61);
  free(b.p);
  /* N near 2^63: count and sizes in 128 bits, a size error, not a wrap */
  buf_t h = {0};
  int64_t n = INT64_MAX;
  header(&h, SC_KIND_DENSE, SC_WIRE_U8, 0, 0, (uint64_t)n, (uint64_t)(((unsigned __int128)n * 8 + 7) / 8));
  put_u(&h, 0, 8);
  put_u(&h, 1, 4);
  put_u(&h, 8, 4);
  CHECK(field_of(sc_wire_qsgd_layout(h.p, h.n, NULL, &L, &e), &e) == SC_WF_SIZE && e.position == -1);
  free(h.p);
}

/* ------------------------------------------------------------ top-k */

static void fill_topk_input(sc_dtype t, void* x, int64_t n, int mode) {
  for (int64_t i = 0; i < n; i++) {
    double v;
    switch (mode) {
      case 0: v = (rnd_unit() - 0.5) * 100; break;           /* distinct-ish */
      case 1: v = (double)((int64_t)(rnd() % 7) - 3); break;  /* many ties, +-0 */
      case 2: v = (i % 3 == 0) ? -0.0 : 0.0; break;           /* all zeros */
      default: v = (i % 97 == 5) ? (i & 1 ? INFINITY : -INFINITY) : rnd_unit(); break;
    }
    ref_put(t, x, i, v);
  }
}

static void test_topk(void) {
  const int64_t sizes[] = {0, 1, 2, 17, 1000, 70000, PAR_N};
  for (int d = 0; d < 4; d++)
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
      for (int mode = 0; mode < 4; mode++) {
        sc_dtype t = VTYPES[d];
        int64_t n = sizes[s];
        if (n == PAR_N && (mode == 2 || d >= 2)) continue; /* keep the run short */
        size_t w = sc_dtype_size(t);
        void* x = xmalloc((size_t)n * w);
        fill_topk_input(t, x, n, mode);
        const int64_t ks[] = {0, 1, n / 100 + 1, n / 2, n, n + 5};
        for (size_t kk = 0; kk < sizeof ks / sizeof ks[0]; kk++) {
          int64_t k = ks[kk], m = k < n ? k : n;
          int64_t* idx[2];
          void* val[2];
          for (int r = 0; r < 2; r++) {
            idx[r] = (int64_t*)xmalloc((size_t)m * 8);
            val[r] = xmalloc((size_t)m * w);
          }
          sc_error_info e;
          CHECK(sc_topk(t, x, n, k, 4, val[0], idx[0], &e) == SC_OK);
          CHECK(ref_topk_ok(t, x, 0, n, idx[0], val[0], m));
          CHECK(sc_topk_path(SC_TOPK_RADIX, t, x, n, k, 1, val[1], idx[1], &e) == SC_OK);
          CHECK(memcmp(idx[0], idx[1], (size_t)m * 8) == 0 && memcmp(val[0], val[1], (size_t)m * w) == 0);
          CHECK(sc_topk(t, x, n, k, 1, val[1], idx[1], &e) == SC_OK);
          CHECK(memcmp(idx[0], idx[1], (size_t)m * 8) == 0);
          for (int r = 0; r < 2; r++) {
            free(idx[r]);
            free(val[r]);
          }
        }
        /* NaN anywhere -> SC_ERR_NAN */
        if (n > 0) {
          int64_t at = n / 2;
          ref_put(t, x, at, NAN);
          int64_t* idx = (int64_t*)xmalloc((size_t)n * 8);
          void* val = xmalloc((size_t)n * w);
          sc_error_info e;
          CHECK(sc_topk(t, x, n, n / 3 + 1, 4, val, idx, &e) == SC_ERR_NAN);
          CHECK(sc_topk_path(SC_TOPK_RADIX, t, x, n, 1, 4, val, idx, &e) == SC_ERR_NAN);
          free(idx);
          free(val);
        }
        free(x);
      }
  float one = 1;
  int64_t i0;
  sc_error_info e;
  CHECK(sc_topk(SC_F32, &one, 1, -1, 1, &one, &i0, &e) == SC_ERR_ARG);
  CHECK(sc_topk(SC_U8, &one, 1, 1, 1, &one, &i0, &e) == SC_ERR_ARG);
  CHECK(sc_topk_cache_bytes() <= SC_TOPK_CACHE_MAX_BYTES);
  sc_topk_release_cache();
  CHECK(sc_topk_cache_bytes() == 0);
}

static void test_block_topk(void) {
  const int64_t ns[] = {0, 1, 10, 1000, PAR_N};
  const int64_t bs[] = {1, 3, 7, 64, 2000};
  const int64_t kps[] = {0, 1, 3, 1000};
  for (int d = 0; d < 4; d++)
    for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++)
      for (size_t bb = 0; bb < sizeof bs / sizeof bs[0]; bb++)
        for (size_t kk = 0; kk < sizeof kps / sizeof kps[0]; kk++) {
          sc_dtype t = VTYPES[d];
          int64_t n = ns[a], B = bs[bb], kp = kps[kk];
          if (n == PAR_N && (d >= 2 || kk == 3)) continue;
          size_t w = sc_dtype_size(t);
          void* x = xmalloc((size_t)n * w);
          fill_topk_input(t, x, n, (int)(bb % 4 == 2 ? 1 : bb % 4));
          int64_t cnt = sc_block_topk_count(n, B, kp);
          int64_t* idx = (int64_t*)xmalloc((size_t)cnt * 8);
          void* val = xmalloc((size_t)cnt * w);
          sc_error_info e;
          CHECK(sc_block_topk(t, x, n, B, kp, 4, val, idx, &e) == SC_OK);
          int64_t o = 0;
          for (int64_t b = 0; b < B; b++) {
            int64_t lo = b * n / B, hi = (b + 1) * n / B, mb = kp < hi - lo ? kp : hi - lo;
            CHECK(o + mb <= cnt);
            if (o + mb > cnt) break;
            CHECK(ref_topk_ok(t, x, lo, hi, idx + o, (char*)val + w * o, mb));
            o += mb;
          }
          CHECK(o == cnt);
          free(idx);
          free(val);
          free(x);
        }
  float x[4] = {1, NAN, 2, 3}, v[4];
  int64_t i[4];
  sc_error_info e;
  CHECK(sc_block_topk(SC_F32, x, 4, 2, 1, 1, v, i, &e) == SC_ERR_NAN);
  CHECK(sc_block_topk(SC_F32, x, 4, 0, 1, 1, v, i, &e) == SC_ERR_ARG);
  CHECK(sc_block_topk(SC_F32, x, 4, 2, -1, 1, v, i, &e) == SC_ERR_ARG);
  CHECK(sc_block_topk_count(10, 3, 2) == 6 && sc_block_topk_count(2, 5, 1) == 2);
}

/* ------------------------------------------------------------ COO */

static void test_check_sorted(void) {
  static const struct { int64_t idx[5]; int n; int64_t limit; int st; int64_t pos, value; } cases[] = {
      {{0, 1, 2}, 3, 3, SC_OK, 0, 0},            {{0, 1, 2}, 3, -1, SC_OK, 0, 0},
      {{}, 0, 0, SC_OK, 0, 0},                   {{5}, 1, 5, SC_ERR_INDEX_RANGE, 0, 5},
      {{1, 1}, 2, 9, SC_ERR_INDEX_ORDER, 1, 1},  {{2, 1, 0}, 3, 9, SC_ERR_INDEX_ORDER, 1, 1},
      {{-1, 0}, 2, 9, SC_ERR_INDEX_RANGE, 0, -1}, {{0, 4, 9, 3}, 4, 9, SC_ERR_INDEX_RANGE, 2, 9},
      {{0, 4, 3, 99}, 4, 9, SC_ERR_INDEX_ORDER, 2, 3}, {{-5, -4}, 2, -1, SC_ERR_INDEX_RANGE, 0, -5},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
    for (int it = 0; it < 2; it++) {
      sc_index_t t = it ? SC_I64 : SC_I32;
      int64_t buf[5];
      for (int i = 0; i < cases[c].n; i++) ref_set_idx(t, buf, i, cases[c].idx[i]);
      sc_error_info e = {-7, -7, -7};
      int st = sc_check_sorted_indices(t, buf, cases[c].n, cases[c].limit, 1, &e);
      CHECK(st == cases[c].st);
      if (st) CHECK(e.input == 0 && e.position == cases[c].pos && e.value == cases[c].value);
    }
  /* large: same first position for any thread count */
  int64_t n = PAR_N;
  int64_t* v = (int64_t*)xmalloc((size_t)n * 8);
  for (int64_t i = 0; i < n; i++) v[i] = 2 * i;
  sc_error_info e;
  for (int t = 0; t < 2; t++) CHECK(sc_check_sorted_indices(SC_I64, v, n, 2 * n, THREADS[t], &e) == SC_OK);
  v[n - 3] = v[n - 4];
  v[n - 1] = 5 * n;
  for (int t = 0; t < 2; t++)
    CHECK(sc_check_sorted_indices(SC_I64, v, n, 2 * n, THREADS[t], &e) == SC_ERR_INDEX_ORDER &&
          e.position == n - 3);
  free(v);
}

static void test_merge(void) {
  const int64_t totals[] = {0, 10, 1000, PAR_N};
  for (int d = 0; d < 4; d++)
    for (int it = 0; it < 2; it++)
      for (size_t tt = 0; tt < sizeof totals / sizeof totals[0]; tt++)
        for (int64_t p = 1; p <= 6; p += 2) {
          sc_index_t t = it ? SC_I64 : SC_I32;
          sc_dtype vt = VTYPES[d];
          if (totals[tt] == PAR_N && d >= 2 && it == 0) continue;
          int64_t limit = totals[tt] * 2 + 10;
          size_t is = sc_index_size(t), vs = sc_dtype_size(vt);
          void* idx[6];
          void* val[6];
          int64_t lens[6], sum = 0;
          for (int64_t q = 0; q < p; q++) {
            lens[q] = q == 1 ? 0 : totals[tt] / p; /* one empty input */
            sum += lens[q];
            idx[q] = xmalloc((size_t)lens[q] * is);
            val[q] = xmalloc((size_t)lens[q] * vs);
            sorted_indices(t, idx[q], lens[q], limit);
            random_values(vt, val[q], lens[q]);
          }
          void* oi = xmalloc((size_t)sum * is);
          void* ov = xmalloc((size_t)sum * vs);
          void* ri = xmalloc((size_t)sum * is);
          void* rv = xmalloc((size_t)sum * vs);
          int64_t rn = ref_merge(t, vt, p, (const void* const*)idx, (const void* const*)val, lens, ri, rv);
          for (int th = 0; th < 2; th++) {
            int64_t on = -1;
            sc_error_info e;
            CHECK(sc_merge_add_many(t, vt, p, (const void* const*)idx, (const void* const*)val, lens, limit,
                                    THREADS[th], oi, ov, &on, &e) == SC_OK);
            CHECK(on == rn && memcmp(oi, ri, (size_t)rn * is) == 0);
            int same = 1;
            for (int64_t i = 0; i < rn; i++) same &= ref_same(vt, ov, i, rv, i);
            CHECK(same);
          }
          if (p >= 3) { /* the two-input form */
            int64_t on = -1;
            sc_error_info e;
            CHECK(sc_merge_add(t, vt, idx[0], val[0], lens[0], idx[2], val[2], lens[2], limit, 4, oi, ov, &on,
                               &e) == SC_OK);
            const void* ii[2] = {idx[0], idx[2]};
            const void* vv[2] = {val[0], val[2]};
            int64_t l2[2] = {lens[0], lens[2]};
            CHECK(on == ref_merge(t, vt, 2, ii, vv, l2, ri, rv) && memcmp(oi, ri, (size_t)on * is) == 0);
            /* a bad input: its position in the list, its first bad index */
            if (lens[2] >= 2) {
              int64_t save = ref_idx(t, idx[2], 1);
              ref_set_idx(t, idx[2], 1, ref_idx(t, idx[2], 0));
              CHECK(sc_merge_add_many(t, vt, p, (const void* const*)idx, (const void* const*)val, lens, limit, 4,
                                      oi, ov, &on, &e) == SC_ERR_INDEX_ORDER && e.input == 2 && e.position == 1);
              ref_set_idx(t, idx[2], 1, limit);
              CHECK(sc_merge_add_many(t, vt, p, (const void* const*)idx, (const void* const*)val, lens, limit, 4,
                                      oi, ov, &on, &e) == SC_ERR_INDEX_RANGE && e.input == 2 && e.position == 1);
              ref_set_idx(t, idx[2], 1, save);
            }
          }
          for (int64_t q = 0; q < p; q++) {
            free(idx[q]);
            free(val[q]);
          }
          free(oi);
          free(ov);
          free(ri);
          free(rv);
        }
  /* float16: the sum is rounded once from float32 (2048 + 1 + 1 = 2050, not 2048) */
  uint16_t v0[1] = {sc_f32_to_f16(2048.0f)}, v1[1] = {sc_f32_to_f16(1.0f)}, v2[1] = {sc_f32_to_f16(1.0f)};
  int32_t i0[1] = {3};
  const void* ii[3] = {i0, i0, i0};
  const void* vv[3] = {v0, v1, v2};
  int64_t l3[3] = {1, 1, 1}, on;
  int32_t oi[3];
  uint16_t ov[3];
  sc_error_info e;
  CHECK(sc_merge_add_many(SC_I32, SC_F16, 3, ii, vv, l3, 10, 1, oi, ov, &on, &e) == SC_OK);
  CHECK(on == 1 && oi[0] == 3 && sc_f16_to_f32(ov[0]) == 2050.0f);
  CHECK(sc_merge_add_many(SC_I32, SC_U8, 3, ii, vv, l3, 10, 1, oi, ov, &on, &e) == SC_ERR_ARG);
  /* the extreme index INT64_MAX, without a limit (found by fuzz_coo_raw, in its reference) */
  int64_t a0[1] = {0}, a1[1] = {INT64_MAX}, a3[1] = {0};
  double w0[1] = {1}, w1[1] = {2}, w3[1] = {4};
  const void* ix[4] = {a0, a1, NULL, a3};
  const void* vx[4] = {w0, w1, NULL, w3};
  int64_t l4[4] = {1, 1, 0, 1}, oix[3];
  double ovx[3];
  CHECK(sc_merge_add_many(SC_I64, SC_F64, 4, ix, vx, l4, -1, 4, oix, ovx, &on, &e) == SC_OK);
  CHECK(on == 2 && oix[0] == 0 && ovx[0] == 5 && oix[1] == INT64_MAX && ovx[1] == 2);
  CHECK(sc_merge_add_many(SC_I64, SC_F64, 4, ix, vx, l4, INT64_MAX, 4, oix, ovx, &on, &e) == SC_ERR_INDEX_RANGE &&
        e.input == 1);
  CHECK(sc_merge_add_many(SC_I32, SC_F16, 0, ii, vv, l3, 10, 1, oi, ov, &on, &e) == SC_OK && on == 0);
}

static void test_scatter_gather(void) {
  for (int d = 0; d < 4; d++)
    for (int it = 0; it < 2; it++)
      for (int kind = 0; kind < 3; kind++) { /* ascending (parallel), repeated, unsorted */
        sc_index_t t = it ? SC_I64 : SC_I32;
        sc_dtype vt = VTYPES[d];
        int64_t dn = 2 * PAR_N, n = kind == 0 ? PAR_N : 5000;
        size_t is = sc_index_size(t), vs = sc_dtype_size(vt);
        void* idx = xmalloc((size_t)n * is);
        void* val = xmalloc((size_t)n * vs);
        void* dense = xmalloc((size_t)dn * vs);
        void* ref = xmalloc((size_t)dn * vs);
        if (kind == 0) sorted_indices(t, idx, n, dn);
        else for (int64_t i = 0; i < n; i++) ref_set_idx(t, idx, i, kind == 1 ? (int64_t)(rnd() % 50) : (int64_t)(rnd() % (uint64_t)dn));
        random_values(vt, val, n);
        for (int th = 0; th < 2; th++) {
          for (int64_t i = 0; i < dn; i++) ref_put(vt, dense, i, (double)(i % 5));
          memcpy(ref, dense, (size_t)dn * vs);
          for (int64_t i = 0; i < n; i++) {
            int64_t x = ref_idx(t, idx, i);
            ref_put(vt, ref, x, ref_add(vt, ref_get(vt, ref, x), ref_get(vt, val, i)));
          }
          sc_error_info e;
          CHECK(sc_scatter_add(t, vt, dense, dn, idx, val, n, THREADS[th], &e) == SC_OK);
          CHECK(memcmp(dense, ref, (size_t)dn * vs) == 0);
          void* out = xmalloc((size_t)n * vs);
          CHECK(sc_gather(t, vt, dense, dn, idx, n, THREADS[th], out, &e) == SC_OK);
          int ok = 1;
          for (int64_t i = 0; i < n; i++) ok &= !memcmp((char*)out + i * vs, (char*)dense + ref_idx(t, idx, i) * vs, vs);
          CHECK(ok);
          free(out);
        }
        /* an index out of range: nothing written, the first one reported */
        int64_t save = ref_idx(t, idx, n / 2);
        ref_set_idx(t, idx, n / 2, dn);
        ref_set_idx(t, idx, n - 1, -1);
        memcpy(ref, dense, (size_t)dn * vs);
        sc_error_info e;
        CHECK(sc_scatter_add(t, vt, dense, dn, idx, val, n, 4, &e) == SC_ERR_INDEX_RANGE && e.input == 1 &&
              e.position == n / 2 && e.value == dn);
        CHECK(memcmp(dense, ref, (size_t)dn * vs) == 0);
        void* out = xmalloc((size_t)n * vs);
        CHECK(sc_gather(t, vt, dense, dn, idx, n, 4, out, &e) == SC_ERR_INDEX_RANGE && e.position == n / 2);
        free(out);
        (void)save;
        /* values inside the dense buffer: rejected */
        CHECK(sc_scatter_add(t, vt, dense, dn, idx, (char*)dense + vs, 10, 4, &e) == SC_ERR_OVERLAP);
        free(idx);
        free(val);
        free(dense);
        free(ref);
      }
  /* half types add in float32 and round each time: 2048 + 1 + 1 in float16 stays 2048 */
  uint16_t dense[1] = {sc_f32_to_f16(2048.0f)}, val[2] = {sc_f32_to_f16(1.0f), sc_f32_to_f16(1.0f)};
  int32_t idx[2] = {0, 0};
  sc_error_info e;
  CHECK(sc_scatter_add(SC_I32, SC_F16, dense, 1, idx, val, 2, 1, &e) == SC_OK && sc_f16_to_f32(dense[0]) == 2048.0f);
  CHECK(sc_scatter_add(SC_I32, SC_F16, dense, 1, idx, val, -1, 1, &e) == SC_ERR_ARG);
  CHECK(sc_scatter_add(SC_I32, SC_F16, dense, 1, idx, val, 0, 1, &e) == SC_OK);
}

/* sc_scatter_set: assignment in input order (a repeat keeps its last value), with
 * and without zero_rest, against a reference loop; the dense length is not a
 * multiple of the 16384-entry chunk and some indices sit on chunk edges. */
static void test_scatter_set(void) {
  for (int d = 0; d < 4; d++)
    for (int it = 0; it < 2; it++)
      for (int kind = 0; kind < 4; kind++) /* ascending (parallel), repeated, unsorted, empty */
        for (int zero = 0; zero < 2; zero++) {
          sc_index_t t = it ? SC_I64 : SC_I32;
          sc_dtype vt = VTYPES[d];
          int64_t dn = 2 * PAR_N + 7, n = kind == 0 ? PAR_N : kind == 3 ? 0 : 5000;
          size_t is = sc_index_size(t), vs = sc_dtype_size(vt);
          void* idx = xmalloc((size_t)(n ? n : 1) * is);
          void* val = xmalloc((size_t)(n ? n : 1) * vs);
          void* dense = xmalloc((size_t)dn * vs);
          void* ref = xmalloc((size_t)dn * vs);
          if (kind == 0) {
            sorted_indices(t, idx, n, dn);
            ref_set_idx(t, idx, 0, 0); /* the first entry and a chunk edge */
            ref_set_idx(t, idx, n - 1, dn - 1);
          } else {
            for (int64_t i = 0; i < n; i++)
              ref_set_idx(t, idx, i, kind == 1 ? (int64_t)(rnd() % 50) : (int64_t)(rnd() % (uint64_t)dn));
          }
          random_values(vt, val, n);
          for (int th = 0; th < 2; th++) {
            for (int64_t i = 0; i < dn; i++) ref_put(vt, dense, i, (double)(i % 5) + 1.0);
            if (zero) memset(ref, 0, (size_t)dn * vs); /* all-zero bits are +0 in every type */
            else memcpy(ref, dense, (size_t)dn * vs);
            for (int64_t i = 0; i < n; i++)
              memcpy((char*)ref + ref_idx(t, idx, i) * vs, (char*)val + i * vs, vs);
            sc_error_info e;
            CHECK(sc_scatter_set(t, vt, dense, dn, idx, val, n, zero, THREADS[th], &e) == SC_OK);
            CHECK(memcmp(dense, ref, (size_t)dn * vs) == 0);
          }
          if (n) {
            /* out of range: nothing written, the first one reported */
            ref_set_idx(t, idx, n / 2, dn);
            memcpy(ref, dense, (size_t)dn * vs);
            sc_error_info e;
            CHECK(sc_scatter_set(t, vt, dense, dn, idx, val, n, zero, 4, &e) == SC_ERR_INDEX_RANGE && e.input == 1 &&
                  e.position == n / 2 && e.value == dn);
            CHECK(memcmp(dense, ref, (size_t)dn * vs) == 0);
            /* values or indices inside the dense buffer: rejected */
            CHECK(sc_scatter_set(t, vt, dense, dn, idx, (char*)dense + vs, 10, zero, 4, &e) == SC_ERR_OVERLAP && e.input == 2);
            CHECK(sc_scatter_set(t, vt, dense, dn, (char*)dense + vs, val, 10, zero, 4, &e) == SC_ERR_OVERLAP && e.input == 1);
          }
          free(idx);
          free(val);
          free(dense);
          free(ref);
        }
  /* zero_rest over 9 MiB (many chunks), at a 64-byte aligned base and at an element-aligned
     one, with values in the first and last elements and a run of adjacent ones */
  for (int d = 0; d < 4; d++)
    for (int shift = 0; shift < 2; shift++) {
      sc_dtype vt = VTYPES[d];
      size_t vs = sc_dtype_size(vt);
      int64_t dn = (int64_t)((9u << 20) / vs) + 13, n = dn / 90;
      char* buf = xmalloc((size_t)(dn + 64) * vs);
      void* dense = buf + shift * vs + (64 - ((uintptr_t)buf & 63)) % 64 * (shift == 0);
      void* ref = xmalloc((size_t)dn * vs);
      int32_t* idx = xmalloc((size_t)n * sizeof(int32_t));
      void* val = xmalloc((size_t)n * vs);
      sorted_indices(SC_I32, idx, n, dn);
      idx[0] = 0;
      idx[n - 1] = (int32_t)dn - 1;
      for (int64_t i = 1; i + 1 < n && i < 40; i++) idx[i] = (int32_t)(1000 + i); /* a run */
      random_values(vt, val, n);
      for (int th = 0; th < 2; th++) {
        for (int64_t i = 0; i < dn; i++) ref_put(vt, dense, i, 3.0);
        memset(ref, 0, (size_t)dn * vs);
        for (int64_t i = 0; i < n; i++) memcpy((char*)ref + idx[i] * vs, (char*)val + i * vs, vs);
        sc_error_info e;
        CHECK(sc_scatter_set(SC_I32, vt, dense, dn, idx, val, n, 1, THREADS[th], &e) == SC_OK);
        CHECK(memcmp(dense, ref, (size_t)dn * vs) == 0);
      }
      free(buf);
      free(ref);
      free(idx);
      free(val);
    }
  sc_error_info e;
  float dense[2] = {1, 2};
  int32_t idx[1] = {0};
  CHECK(sc_scatter_set(SC_I32, SC_F32, dense, 2, idx, dense, -1, 0, 1, &e) == SC_ERR_ARG);
  CHECK(sc_scatter_set(SC_I32, SC_U8, dense, 2, idx, dense, 0, 0, 1, &e) == SC_ERR_ARG);
}

/* sc_nonfinite: finite inputs give 0; one NaN / +Inf / -Inf planted anywhere
 * (first, middle, last, in either half of the two-stream scan, odd lengths) is
 * found and named, with 1 and 4 threads; the extremes of the finite range and
 * subnormals are finite. */
static void test_nonfinite(void) {
  for (int d = 0; d < 4; d++) {
    sc_dtype vt = VTYPES[d];
    size_t vs = sc_dtype_size(vt);
    const int64_t lens[4] = {1, 2, 17, PAR_N + 3};
    for (int li = 0; li < 4; li++) {
      int64_t n = lens[li];
      void* x = xmalloc((size_t)n * vs);
      random_values(vt, x, n);
      /* the largest finite magnitude and the smallest subnormal, both signs */
      const uint64_t big[4] = {0x7F7FFFFFull, 0x7FEFFFFFFFFFFFFFull, 0x7BFFull, 0x7F7Full};
      const uint64_t sign[4] = {0x80000000ull, 0x8000000000000000ull, 0x8000ull, 0x8000ull};
      memcpy(x, &big[d], vs);
      if (n > 1) { uint64_t v = big[d] | sign[d]; memcpy((char*)x + (n - 1) * vs, &v, vs); }
      if (n > 2) { uint64_t v = 1; memcpy((char*)x + vs, &v, vs); }
      for (int th = 0; th < 2; th++) {
        int f = -1;
        sc_error_info e;
        CHECK(sc_nonfinite(vt, x, n, THREADS[th], &f, &e) == SC_OK && f == 0);
      }
      const int64_t where[4] = {0, n / 2, n - 1, n / 2 - 1 > 0 ? n / 2 - 1 : 0};
      for (int w = 0; w < 4; w++)
        for (int kind = 0; kind < 3; kind++) { /* NaN, +Inf, -Inf */
          void* y = xmalloc((size_t)n * vs);
          memcpy(y, x, (size_t)n * vs);
          double v = kind == 0 ? NAN : kind == 1 ? INFINITY : -INFINITY;
          ref_put(vt, y, where[w], v);
          int want = kind == 0 ? SC_NONFINITE_NAN : kind == 1 ? SC_NONFINITE_POS_INF : SC_NONFINITE_NEG_INF;
          for (int th = 0; th < 2; th++) {
            int f = -1;
            sc_error_info e;
            CHECK(sc_nonfinite(vt, y, n, THREADS[th], &f, &e) == SC_OK && f == want);
          }
          free(y);
        }
      /* all three kinds at once */
      if (n >= 3) {
        ref_put(vt, x, 0, NAN);
        ref_put(vt, x, 1, INFINITY);
        ref_put(vt, x, n - 1, -INFINITY);
        int f = -1;
        sc_error_info e;
        CHECK(sc_nonfinite(vt, x, n, 4, &f, &e) == SC_OK &&
              f == (SC_NONFINITE_NAN | SC_NONFINITE_POS_INF | SC_NONFINITE_NEG_INF));
      }
      free(x);
    }
  }
  int f = -1;
  sc_error_info e;
  float one = 1;
  CHECK(sc_nonfinite(SC_F32, &one, 0, 1, &f, &e) == SC_OK && f == 0);
  CHECK(sc_nonfinite(SC_U8, &one, 1, 1, &f, &e) == SC_ERR_ARG);
  CHECK(sc_nonfinite(SC_F32, &one, -1, 1, &f, &e) == SC_ERR_ARG);
  CHECK(sc_nonfinite(SC_F32, &one, 1, 1, NULL, &e) == SC_ERR_ARG);
}

static void test_conversions(void) {
  static const struct { float f; uint16_t h, b; } t[] = {
      {1.0f, 0x3C00, 0x3F80},       {-2.0f, 0xC000, 0xC000},     {65504.0f, 0x7BFF, 0x4780},
      {0.0f, 0x0000, 0x0000},       {-0.0f, 0x8000, 0x8000},     {INFINITY, 0x7C00, 0x7F80},
      {65520.0f, 0x7C00, 0x4780},   /* rounds to inf in f16 */   {5.9604645e-08f, 0x0001, 0x3380},
  };
  for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
    CHECK(sc_f32_to_f16(t[i].f) == t[i].h);
    CHECK(sc_f32_to_bf16(t[i].f) == t[i].b);
  }
  CHECK(sc_f16_to_f32(0x3C00) == 1.0f && sc_bf16_to_f32(0x3F80) == 1.0f);
  CHECK(isnan(sc_f16_to_f32(sc_f32_to_f16(NAN))) && isnan(sc_bf16_to_f32(sc_f32_to_bf16(NAN))));
  CHECK(sc_f32_to_f16(1.0f + 0x1p-11f) == 0x3C00);               /* tie to even */
  CHECK(sc_f32_to_f16(1.0f + 0x1p-11f + 0x1p-12f) == 0x3C01);
  CHECK(sc_f32_to_bf16(1.0f + 0x1p-8f) == 0x3F80);                /* tie to even */
  int ok = 1;
  for (uint32_t h = 0; h < 0x10000; h++) { /* every float16 and bfloat16 round-trips */
    float f = sc_f16_to_f32((uint16_t)h), g = sc_bf16_to_f32((uint16_t)h);
    if (!isnan(f)) ok &= sc_f32_to_f16(f) == h;
    if (!isnan(g)) ok &= sc_f32_to_bf16(g) == h;
  }
  CHECK(ok);
}

/* ------------------------------------------------------------ streams */

static void test_stream_add_dd(void) {
  for (int d = 0; d < 2; d++) {
    sc_dtype vt = d ? SC_F64 : SC_F32;
    int64_t n = PAR_N;
    size_t vs = sc_dtype_size(vt);
    void* a = xmalloc((size_t)n * vs);
    void* b = xmalloc((size_t)n * vs);
    void* ref = xmalloc((size_t)n * vs);
    random_values(vt, a, n);
    random_values(vt, b, n);
    for (int64_t i = 0; i < n; i++) ref_put(vt, ref, i, ref_add(vt, ref_get(vt, a, i), ref_get(vt, b, i)));
    sc_error_info e;
    CHECK(sc_stream_add_dd(vt, a, b, n, 4, &e) == SC_OK && memcmp(a, ref, (size_t)n * vs) == 0);
    for (int64_t i = 0; i < n; i++) ref_put(vt, ref, i, ref_add(vt, ref_get(vt, a, i), ref_get(vt, a, i)));
    CHECK(sc_stream_add_dd(vt, a, a, n, 4, &e) == SC_OK && memcmp(a, ref, (size_t)n * vs) == 0);
    CHECK(sc_stream_add_dd(vt, a, (char*)a + vs, n - 1, 4, &e) == SC_ERR_OVERLAP);
    CHECK(memcmp(a, ref, (size_t)n * vs) == 0);
    CHECK(sc_stream_add_dd(vt, a, b, 0, 4, &e) == SC_OK);
    free(a);
    free(b);
    free(ref);
  }
  float x = 1;
  sc_error_info e;
  CHECK(sc_stream_add_dd(SC_F16, &x, &x, 1, 1, &e) == SC_ERR_ARG);
  CHECK(sc_stream_add_dd(SC_F32, &x, &x, -1, 1, &e) == SC_ERR_ARG);
}

static void test_stream_concat(void) {
  for (int it = 0; it < 2; it++)
    for (int big = 0; big < 2; big++) {
      sc_index_t t = it ? SC_I64 : SC_I32;
      int64_t na = big ? PAR_N : 5, nb = big ? PAR_N / 2 : 3;
      size_t is = sc_index_size(t);
      void* ia = xmalloc((size_t)na * is);
      void* ib = xmalloc((size_t)nb * is);
      float* va = (float*)xmalloc((size_t)na * 4);
      float* vb = (float*)xmalloc((size_t)nb * 4);
      for (int64_t i = 0; i < na; i++) { ref_set_idx(t, ia, i, 2 * i); va[i] = (float)i; }
      for (int64_t i = 0; i < nb; i++) { ref_set_idx(t, ib, i, 2 * na + 3 * i); vb[i] = -(float)i; }
      void* io = xmalloc((size_t)(na + nb) * is);
      float* vo = (float*)xmalloc((size_t)(na + nb) * 4);
      sc_error_info e;
      CHECK(sc_stream_concat(t, SC_F32, ia, va, na, ib, vb, nb, 4, io, vo, &e) == SC_OK);
      CHECK(memcmp(io, ia, (size_t)na * is) == 0 && memcmp((char*)io + na * is, ib, (size_t)nb * is) == 0);
      CHECK(memcmp(vo, va, (size_t)na * 4) == 0 && memcmp(vo + na, vb, (size_t)nb * 4) == 0);
      /* b starting at or below a's last index */
      ref_set_idx(t, ib, 0, 2 * (na - 1));
      CHECK(sc_stream_concat(t, SC_F32, ia, va, na, ib, vb, nb, 4, io, vo, &e) == SC_ERR_INDEX_ORDER && e.input == 1);
      ref_set_idx(t, ib, 0, 2 * na);
      /* a not ascending */
      ref_set_idx(t, ia, na - 1, 0);
      CHECK(sc_stream_concat(t, SC_F32, ia, va, na, ib, vb, nb, 4, io, vo, &e) == SC_ERR_INDEX_ORDER && e.input == 0 &&
            e.position == na - 1);
      CHECK(sc_stream_concat(t, SC_F32, ia, va, 0, ib, vb, 0, 4, io, vo, &e) == SC_OK);
      free(ia); free(ib); free(va); free(vb); free(io); free(vo);
    }
}

static void test_qsgd(void) {
  const int64_t ns[] = {0, 1, 9, 1001, PAR_N + 1};
  const int bits_[] = {4, 8};
  const int64_t buckets[] = {2, 6, 512};
  for (int d = 0; d < 2; d++)
    for (size_t a = 0; a < sizeof ns / sizeof ns[0]; a++)
      for (int bi = 0; bi < 2; bi++)
        for (size_t bu = 0; bu < sizeof buckets / sizeof buckets[0]; bu++) {
          sc_dtype vt = d ? SC_F64 : SC_F32;
          int64_t n = ns[a], bucket = buckets[bu];
          int bits = bits_[bi], s = (1 << (bits - 1)) - 1;
          size_t vs = sc_dtype_size(vt);
          void* x = xmalloc((size_t)n * vs);
          random_values(vt, x, n);
          if (n > 3) ref_put(vt, x, 3, 0.0);
          int64_t np = (n * bits + 7) / 8, nb = (n + bucket - 1) / bucket;
          uint8_t* p[2] = {(uint8_t*)xmalloc((size_t)np), (uint8_t*)xmalloc((size_t)np)};
          float* sc[2] = {(float*)xmalloc((size_t)nb * 4), (float*)xmalloc((size_t)nb * 4)};
          sc_error_info e;
          for (int th = 0; th < 2; th++)
            CHECK(sc_qsgd_quantize(vt, x, n, bits, bucket, 99, p[th], sc[th], THREADS[th], &e) == SC_OK);
          CHECK(memcmp(p[0], p[1], (size_t)np) == 0 && memcmp(sc[0], sc[1], (size_t)nb * 4) == 0);
          void* out = xmalloc((size_t)n * vs);
          CHECK(sc_qsgd_dequantize(vt, p[0], sc[0], n, bits, bucket, out, 4, &e) == SC_OK);
          int ok = 1;
          for (int64_t i = 0; i < n; i++) {
            double xi = ref_get(vt, x, i), step = sc[0][i / bucket] / s;
            ok &= sc[0][i / bucket] >= fabs(xi) && fabs(ref_get(vt, out, i) - xi) <= step * 1.0001 + 1e-30;
          }
          CHECK(ok);
          if (n >= 2) {
            /* a level above 2s, a bad scale, a bad unused nibble: MALFORMED, nothing written */
            memset(out, 0x5A, (size_t)n * vs);
            uint8_t save = p[0][np - 1];
            p[0][np - 1] = 0xFF;
            CHECK(sc_qsgd_dequantize(vt, p[0], sc[0], n, bits, bucket, out, 4, &e) == SC_ERR_MALFORMED &&
                  e.input == 0 && e.position == np - 1);
            CHECK(((uint8_t*)out)[0] == 0x5A);
            p[0][np - 1] = save;
            const float bad[3] = {NAN, -1.0f, INFINITY};
            for (int k = 0; k < 3; k++) {
              float sv = sc[0][nb - 1];
              sc[0][nb - 1] = bad[k];
              CHECK(sc_qsgd_dequantize(vt, p[0], sc[0], n, bits, bucket, out, 4, &e) == SC_ERR_MALFORMED &&
                    e.input == 1 && e.position == nb - 1);
              sc[0][nb - 1] = sv;
            }
            if (bits == 4 && (n & 1)) {
              p[0][np - 1] |= 0x10;
              CHECK(sc_qsgd_dequantize(vt, p[0], sc[0], n, bits, bucket, out, 4, &e) == SC_ERR_MALFORMED);
              p[0][np - 1] = save;
            }
            /* NaN or Inf in x: SC_ERR_NAN at its position */
            ref_put(vt, x, n - 1, NAN);
            CHECK(sc_qsgd_quantize(vt, x, n, bits, bucket, 99, p[1], sc[1], 4, &e) == SC_ERR_NAN &&
                  e.position == n - 1);
            ref_put(vt, x, n - 1, INFINITY);
            CHECK(sc_qsgd_quantize(vt, x, n, bits, bucket, 99, p[1], sc[1], 4, &e) == SC_ERR_NAN);
          }
          free(x); free(out);
          for (int k = 0; k < 2; k++) { free(p[k]); free(sc[k]); }
        }
  float x[4] = {1, 2, 3, 4}, s[4];
  uint8_t p[4];
  sc_error_info e;
  CHECK(sc_qsgd_quantize(SC_F32, x, 4, 5, 2, 0, p, s, 1, &e) == SC_ERR_ARG);
  CHECK(sc_qsgd_quantize(SC_F32, x, 4, 4, 3, 0, p, s, 1, &e) == SC_ERR_ARG); /* odd bucket, 4 bits */
  CHECK(sc_qsgd_quantize(SC_F32, x, 4, 8, 0, 0, p, s, 1, &e) == SC_ERR_ARG);
  CHECK(sc_qsgd_quantize(SC_F16, x, 4, 8, 2, 0, p, s, 1, &e) == SC_ERR_ARG);
}

/* ------------------------------------------------------------ sketch */

static void test_sketch(void) {
  const int64_t shapes[][2] = {{1, 1}, {3, 16}, {4, 100}, {5, 1000}, {7, 37}};
  for (int td = 0; td < 2; td++)
    for (int xd = 0; xd < 2; xd++)
      for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++)
        for (int big = 0; big < 2; big++) {
          sc_dtype tt = td ? SC_F64 : SC_F32, xt = xd ? SC_F64 : SC_F32;
          int64_t rows = shapes[sh][0], cols = shapes[sh][1];
          int64_t n = big ? 70000 : 333, m = big ? 70000 : 50;
          if (big && sh != 3) continue;
          size_t ts = sc_dtype_size(tt), xs = sc_dtype_size(xt);
          uint64_t seed = rnd();
          void* x = xmalloc((size_t)n * xs);
          random_values(xt, x, n);
          void* tab[2] = {calloc((size_t)(rows * cols), ts), calloc((size_t)(rows * cols), ts)};
          void* ref = calloc((size_t)(rows * cols), ts);
          sc_error_info e;
          for (int th = 0; th < 2; th++)
            CHECK(sc_sketch_build_dense(tt, tab[th], rows, cols, seed, xt, x, n, THREADS[th], &e) == SC_OK);
          ref_sketch_build(tt, ref, rows, cols, seed, NULL, xt, x, n);
          CHECK(memcmp(tab[0], ref, (size_t)(rows * cols) * ts) == 0);
          CHECK(memcmp(tab[1], ref, (size_t)(rows * cols) * ts) == 0);
          /* COO: any order, repeats */
          int64_t* idx = (int64_t*)xmalloc((size_t)m * 8);
          void* v = xmalloc((size_t)m * xs);
          for (int64_t i = 0; i < m; i++) idx[i] = (int64_t)(rnd() % (uint64_t)n);
          if (m > 2) idx[1] = idx[0];
          random_values(xt, v, m);
          for (int th = 0; th < 2; th++)
            CHECK(sc_sketch_build_coo(tt, tab[th], rows, cols, seed, n, idx, xt, v, m, THREADS[th], &e) == SC_OK);
          ref_sketch_build(tt, ref, rows, cols, seed, idx, xt, v, m);
          CHECK(memcmp(tab[0], ref, (size_t)(rows * cols) * ts) == 0 && memcmp(tab[1], ref, (size_t)(rows * cols) * ts) == 0);
          /* out of range: nothing written */
          idx[m / 2] = n;
          CHECK(sc_sketch_build_coo(tt, tab[0], rows, cols, seed, n, idx, xt, v, m, 4, &e) == SC_ERR_INDEX_RANGE &&
                e.position == m / 2 && e.value == n);
          idx[m / 2] = -1;
          CHECK(sc_sketch_build_coo(tt, tab[0], rows, cols, seed, n, idx, xt, v, m, 4, &e) == SC_ERR_INDEX_RANGE);
          CHECK(memcmp(tab[0], ref, (size_t)(rows * cols) * ts) == 0);
          idx[m / 2] = 0;
          /* estimates at idx and at 0..m-1 */
          void* out[2] = {xmalloc((size_t)m * ts), xmalloc((size_t)m * ts)};
          for (int with_idx = 0; with_idx < 2; with_idx++) {
            for (int th = 0; th < 2; th++)
              CHECK(sc_sketch_estimate(tt, tab[0], rows, cols, seed, with_idx ? idx : NULL, m, out[th], THREADS[th],
                                       &e) == SC_OK);
            CHECK(memcmp(out[0], out[1], (size_t)m * ts) == 0);
            int ok = 1;
            for (int64_t t = 0; t < m; t++) {
              double want;
              if (ref_sketch_estimate(tt, tab[0], rows, cols, seed, with_idx ? idx[t] : t, &want))
                ok &= ref_get(tt, out[0], t) == want;
            }
            CHECK(ok);
          }
          idx[0] = -3;
          CHECK(sc_sketch_estimate(tt, tab[0], rows, cols, seed, idx, m, out[0], 1, &e) == SC_ERR_INDEX_RANGE &&
                e.position == 0);
          free(out[0]); free(out[1]); free(idx); free(v); free(x);
          free(tab[0]); free(tab[1]); free(ref);
        }
  float t[4] = {0};
  float x[2] = {1, 2};
  int64_t i[2] = {0, 1};
  sc_error_info e;
  CHECK(sc_sketch_build_dense(SC_F32, t, 0, 4, 1, SC_F32, x, 2, 1, &e) == SC_ERR_ARG);
  CHECK(sc_sketch_build_dense(SC_F32, t, SC_SKETCH_MAX_ROWS + 1, 4, 1, SC_F32, x, 2, 1, &e) == SC_ERR_ARG);
  CHECK(sc_sketch_build_dense(SC_F32, t, 1, 0, 1, SC_F32, x, 2, 1, &e) == SC_ERR_ARG);
  CHECK(sc_sketch_build_coo(SC_F16, t, 1, 4, 1, 2, i, SC_F32, x, 2, 1, &e) == SC_ERR_ARG);
  CHECK(sc_sketch_estimate(SC_F32, t, 1, (int64_t)1 << 33, 1, NULL, 2, x, 1, &e) == SC_ERR_ARG);
  for (int k = 0; k < 4; k++) CHECK(t[k] == 0);
}

int main(void) {
  RUN(test_wire_header);
  RUN(test_wire_coo);
  RUN(test_wire_coo_large);
  RUN(test_wire_stream);
  RUN(test_wire_qsgd);
  RUN(test_topk);
  RUN(test_block_topk);
  RUN(test_check_sorted);
  RUN(test_merge);
  RUN(test_scatter_gather);
  RUN(test_scatter_set);
  RUN(test_nonfinite);
  RUN(test_conversions);
  RUN(test_stream_add_dd);
  RUN(test_stream_concat);
  RUN(test_qsgd);
  RUN(test_sketch);
  sc_topk_release_cache();
  printf("%ld checks, %ld failed\n", g_checks, g_failed);
  return g_failed ? 1 : 0;
}
