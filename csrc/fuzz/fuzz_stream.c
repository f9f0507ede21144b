/* Fuzz target: sparse-stream messages (sc_wire_stream_layout,
 * sc_wire_check_stream) and the stream kernels on what a check accepts.
 *
 * Input: [1 byte: bits 0-1 nthreads - 1, bit 2 expectations from the
 *         message's own header, bit 3 one expectation off][message bytes].
 * Invariants:
 *   - the layout check reads only the 48-byte prefix and agrees with the full
 *     check; an accepted message has exact size, zero padding, count <= delta
 *     (sparse) or count == N (dense), and (sparse) strictly ascending indices
 *     < N (reference loop);
 *   - sparse: sc_stream_concat(m, m shifted by N) is the concatenation,
 *     sc_stream_concat(m, m) is SC_ERR_INDEX_ORDER unless m is empty, and a
 *     message rejected for its index order is rejected by sc_stream_concat at
 *     the same position;
 *   - dense float32/float64: sc_stream_add_dd(copy, m) adds, (a, a) doubles,
 *     and a partial overlap is SC_ERR_OVERLAP with nothing written. */
#include "fuzz_common.h"
#include "sparsecomm/stream.h"
#include "sparsecomm/wire.h"

static sc_dtype vtype_of(int code) {
  return code == SC_WIRE_F32 ? SC_F32 : code == SC_WIRE_F64 ? SC_F64 : code == SC_WIRE_F16 ? SC_F16 : SC_BF16;
}

static void sparse_kernels(const uint8_t* msg, const sc_wire_layout* L, int nt) {
  int64_t n = L->count, vs = L->value_size;
  const void* val = msg + L->value_pos;
  /* the message's indices widened to int64, and the same shifted past N */
  int64_t* a = (int64_t*)malloc((size_t)n * 8 + 8);
  int64_t* b = (int64_t*)malloc((size_t)n * 8 + 8);
  sc_index_t it = L->index_size == 4 ? SC_I32 : SC_I64;
  for (int64_t i = 0; i < n; i++) {
    a[i] = ref_idx(it, msg + L->index_pos, i);
    b[i] = a[i] + (L->n <= INT64_MAX / 2 ? L->n : 0); /* no shift past int64 */
  }
  sc_dtype vt = vtype_of(L->h.value_dtype);
  int64_t* io = (int64_t*)malloc((size_t)(2 * n) * 8 + 8);
  uint8_t* vo = (uint8_t*)malloc((size_t)(2 * n * vs) + 8);
  sc_error_info e = fz_err();
  if (L->n <= INT64_MAX / 2) {
    FUZZ_CHECK(sc_stream_concat(SC_I64, vt, a, val, n, b, val, n, nt, io, vo, &e) == SC_OK);
    FUZZ_CHECK(memcmp(io, a, (size_t)n * 8) == 0 && memcmp(io + n, b, (size_t)n * 8) == 0);
    FUZZ_CHECK(memcmp(vo, val, (size_t)(n * vs)) == 0 &&
               memcmp(vo + n * vs, val, (size_t)(n * vs)) == 0);
  }
  /* the message's own index type, twice: overlapping ranges */
  int st = sc_stream_concat(it, vt, msg + L->index_pos, val, n, msg + L->index_pos, val, n, nt, io,
                            vo, &e);
  FUZZ_CHECK(n == 0 ? st == SC_OK : (st == SC_ERR_INDEX_ORDER && e.input == 1));
  free(a);
  free(b);
  free(io);
  free(vo);
}

static void dense_kernels(const uint8_t* msg, const sc_wire_layout* L, int nt) {
  sc_dtype vt = vtype_of(L->h.value_dtype);
  if (vt != SC_F32 && vt != SC_F64) return;
  int64_t n = L->count, vs = L->value_size;
  const void* val = msg + L->value_pos;
  uint8_t* x = (uint8_t*)malloc((size_t)(n * vs) + 8);
  uint8_t* ref = (uint8_t*)malloc((size_t)(n * vs) + 8);
  for (int64_t i = 0; i < n; i++) ref_put(vt, x, i, (double)(i % 5) - 2.0);
  for (int64_t i = 0; i < n; i++) ref_put(vt, ref, i, ref_add(vt, ref_get(vt, x, i), ref_get(vt, val, i)));
  sc_error_info e = fz_err();
  FUZZ_CHECK(sc_stream_add_dd(vt, x, val, n, nt, &e) == SC_OK);
  for (int64_t i = 0; i < n; i++) FUZZ_CHECK(ref_same(vt, x, i, ref, i));
  for (int64_t i = 0; i < n; i++) ref_put(vt, ref, i, ref_add(vt, ref_get(vt, x, i), ref_get(vt, x, i)));
  FUZZ_CHECK(sc_stream_add_dd(vt, x, x, n, nt, &e) == SC_OK);
  for (int64_t i = 0; i < n; i++) FUZZ_CHECK(ref_same(vt, x, i, ref, i));
  if (n >= 3) { /* [x, x + n - 1) and [x + 1, x + n) share n - 2 values */
    memcpy(ref, x, (size_t)(n * vs));
    FUZZ_CHECK(sc_stream_add_dd(vt, x, x + vs, n - 1, nt, &e) == SC_ERR_OVERLAP);
    FUZZ_CHECK(memcmp(ref, x, (size_t)(n * vs)) == 0);
  }
  free(x);
  free(ref);
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fz_reader r = {data, size};
  unsigned sel = (unsigned)fz_u(&r, 1);
  int nt = 1 + (int)(sel & 3);
  fz_message m = fz_message_take(&r);
  uint8_t *msg = m.msg, *prefix = m.prefix;
  size_t n = m.n;

  sc_wire_expect w = sc_wire_expect_any();
  sc_wire_header h;
  if ((sel & 4) && n >= SC_WIRE_HEADER_NBYTES + 8 && fz_expect_own_header(&m, &w, &h)) {
    w.kind = (h.kind == SC_KIND_COO || h.kind == SC_KIND_DENSE) ? h.kind : SC_WIRE_ANY;
    memcpy(&w.offset, msg + SC_WIRE_HEADER_NBYTES, 8);
    if (w.offset < 0) w.offset = SC_WIRE_ANY;
    else if (sel & 8) w.offset ^= 1;
  }
  sc_wire_layout L1, L2;
  sc_error_info e1 = fz_err(), e2 = fz_err();
  int s1 = sc_wire_stream_layout(prefix, (int64_t)n, &w, &L1, &e1);
  int s2 = sc_wire_check_stream(msg, (int64_t)n, &w, nt, &L2, &e2);
  FUZZ_CHECK(s1 == SC_OK || s1 == SC_ERR_MALFORMED);
  FUZZ_CHECK(s2 == SC_OK || s2 == SC_ERR_MALFORMED);
  if (s1 != SC_OK) {
    FUZZ_CHECK(s2 == s1 && e1.input == e2.input && e1.position == e2.position && e1.value == e2.value);
    FUZZ_CHECK(e1.input > 0 && e1.input < SC_WF_COUNT_OF_FIELDS && e1.input != SC_WF_INDEX_ORDER &&
               e1.input != SC_WF_INDEX_RANGE && e1.input != SC_WF_PADDING);
  } else if (s2 != SC_OK) {
    FUZZ_CHECK(e2.input == SC_WF_PADDING || e2.input == SC_WF_INDEX_ORDER ||
               e2.input == SC_WF_INDEX_RANGE);
    if (e2.input == SC_WF_PADDING) {
      FUZZ_CHECK(e2.position >= 0 && e2.position < (int64_t)n && msg[e2.position] != 0);
    } else {
      FUZZ_CHECK(!L1.dense);
      sc_index_t it = L1.index_size == 4 ? SC_I32 : SC_I64;
      const void* idx = msg + L1.index_pos;
      int range = -1;
      int64_t bad = ref_first_bad(it, idx, L1.count, L1.n, &range);
      FUZZ_CHECK(bad == e2.position && range == (e2.input == SC_WF_INDEX_RANGE));
      FUZZ_CHECK(e2.value == ref_idx(it, idx, bad));
      if (!range) { /* the kernel sees the same order violation */
        void* io = malloc((size_t)(L1.count * L1.index_size) + 8);
        void* vo = malloc((size_t)(L1.count * L1.value_size) + 8);
        sc_error_info e3 = fz_err();
        int s3 = sc_stream_concat(it, vtype_of(L1.h.value_dtype), idx, msg + L1.value_pos, L1.count,
                                  NULL, NULL, 0, nt, io, vo, &e3);
        FUZZ_CHECK(s3 == SC_ERR_INDEX_ORDER && e3.input == 0 && e3.position == bad);
        free(io);
        free(vo);
      }
    }
  } else {
    FUZZ_CHECK(memcmp(&L1, &L2, sizeof L1) == 0);
    FUZZ_CHECK(L2.offset >= 0 && (w.offset < 0 || L2.offset == w.offset));
    int64_t vend = L2.value_pos + L2.count * L2.value_size;
    FUZZ_CHECK(((vend + 7) & ~7) == (int64_t)n);
    for (int64_t i = vend; i < (int64_t)n; i++) FUZZ_CHECK(msg[i] == 0);
    if (L2.dense) {
      FUZZ_CHECK(L2.count == L2.n && L2.index_pos < 0 && L2.value_pos == 40);
      dense_kernels(msg, &L2, nt);
    } else {
      FUZZ_CHECK((__int128)L2.count * (L2.index_size + L2.value_size) <=
                 (__int128)L2.n * L2.value_size);
      int range;
      FUZZ_CHECK(ref_first_bad(L2.index_size == 4 ? SC_I32 : SC_I64, msg + L2.index_pos, L2.count,
                              L2.n, &range) < 0);
      sparse_kernels(msg, &L2, nt);
    }
  }
  fz_message_free(&m);
  return 0;
}
