/* Fuzz target: COO messages (sc_wire_coo_layout, sc_wire_check_coo) and the
 * COO kernels on what a check accepts.
 *
 * Input: [1 byte: nthreads, expectations][message bytes]. Invariants:
 *   - the layout check reads only the 48-byte prefix (it gets a copy of just
 *     that much) and agrees with the full check on every layout field;
 *   - an accepted message has a zero index padding, strictly ascending
 *     indices < N (checked here by a reference loop), exact size;
 *   - a message rejected for its indices is rejected by sc_merge_add and
 *     sc_check_sorted_indices at the same position with the same reason;
 *   - on an accepted message sc_check_sorted_indices passes, sc_merge_add_many
 *     of (m, m, empty) returns m's indices with values m + m, and (N small)
 *     sc_scatter_add into zeros then sc_gather gives m's values back. */
#include "fuzz_common.h"
#include "sparsecomm/wire.h"

static sc_dtype vtype_of(int code) {
  return code == SC_WIRE_F32 ? SC_F32 : code == SC_WIRE_F64 ? SC_F64 : code == SC_WIRE_F16 ? SC_F16 : SC_BF16;
}

static void kernels_on_valid(const uint8_t* msg, const sc_wire_layout* L, int nt) {
  sc_index_t it = L->index_size == 4 ? SC_I32 : SC_I64;
  sc_dtype vt = vtype_of(L->h.value_dtype);
  const void* idx = msg + L->index_pos;
  const void* val = msg + L->value_pos;
  int64_t n = L->count, is = L->index_size, vs = L->value_size;
  sc_error_info e = fz_err();
  FUZZ_CHECK(sc_check_sorted_indices(it, idx, n, L->n, nt, &e) == SC_OK);

  const void* idxs[3] = {idx, idx, idx};
  const void* vals[3] = {val, val, val};
  int64_t lens[3] = {n, n, 0};
  uint8_t* oi = (uint8_t*)malloc((size_t)(2 * n * is + 1));
  uint8_t* ov = (uint8_t*)malloc((size_t)(2 * n * vs + 1));
  uint8_t* ri = (uint8_t*)malloc((size_t)(2 * n * is + 1));
  uint8_t* rv = (uint8_t*)malloc((size_t)(2 * n * vs + 1));
  int64_t on = -1;
  FUZZ_CHECK(sc_merge_add_many(it, vt, 3, idxs, vals, lens, L->n, nt, oi, ov, &on, &e) == SC_OK);
  int64_t rn = ref_merge(it, vt, 3, idxs, vals, lens, ri, rv);
  FUZZ_CHECK(on == n && rn == n);
  FUZZ_CHECK(memcmp(oi, idx, (size_t)(n * is)) == 0);
  for (int64_t i = 0; i < n; i++) FUZZ_CHECK(ref_same(vt, ov, i, rv, i));

  if (L->n <= (1 << 16)) {
    uint8_t* dense = (uint8_t*)calloc((size_t)(L->n * vs + 1), 1);
    FUZZ_CHECK(sc_scatter_add(it, vt, dense, L->n, idx, val, n, nt, &e) == SC_OK);
    FUZZ_CHECK(sc_gather(it, vt, dense, L->n, idx, n, nt, ov, &e) == SC_OK);
    for (int64_t i = 0; i < n; i++) {
      ref_put(vt, rv, i, ref_add(vt, 0.0, ref_get(vt, val, i)));
      FUZZ_CHECK(ref_same(vt, ov, i, rv, i));
    }
    free(dense);
  }
  free(oi);
  free(ov);
  free(ri);
  free(rv);
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
  if ((sel & 4) && fz_expect_own_header(&m, &w, &h) && (sel & 8)) w.count ^= 1; /* one expectation off */
  sc_wire_layout L1, L2;
  sc_error_info e1 = fz_err(), e2 = fz_err();
  int s1 = sc_wire_coo_layout(prefix, (int64_t)n, &w, &L1, &e1);
  int s2 = sc_wire_check_coo(msg, (int64_t)n, &w, nt, &L2, &e2);
  FUZZ_CHECK(s1 == SC_OK || s1 == SC_ERR_MALFORMED);
  FUZZ_CHECK(s2 == SC_OK || s2 == SC_ERR_MALFORMED);
  if (s1 != SC_OK) {
    FUZZ_CHECK(s2 == s1 && e1.input == e2.input && e1.position == e2.position && e1.value == e2.value);
  } else if (s2 != SC_OK) {
    FUZZ_CHECK(e2.input == SC_WF_PADDING || e2.input == SC_WF_INDEX_ORDER ||
               e2.input == SC_WF_INDEX_RANGE);
    if (e2.input != SC_WF_PADDING) {
      /* the kernels must reject the same indices at the same place */
      sc_index_t it = L1.index_size == 4 ? SC_I32 : SC_I64;
      const void* idx = msg + L1.index_pos;
      int range = -1;
      int64_t bad = ref_first_bad(it, idx, L1.count, L1.n, &range);
      FUZZ_CHECK(bad == e2.position && range == (e2.input == SC_WF_INDEX_RANGE));
      FUZZ_CHECK(e2.value == ref_idx(it, idx, bad));
      sc_error_info e3 = fz_err();
      int s3 = sc_check_sorted_indices(it, idx, L1.count, L1.n, nt, &e3);
      FUZZ_CHECK(s3 == (range ? SC_ERR_INDEX_RANGE : SC_ERR_INDEX_ORDER));
      FUZZ_CHECK(e3.position == bad && e3.value == e2.value);
      int64_t on = -1;
      uint8_t* oi = (uint8_t*)malloc((size_t)(L1.count * L1.index_size + 1));
      uint8_t* ov = (uint8_t*)malloc((size_t)(L1.count * L1.value_size + 1));
      sc_error_info e4 = fz_err();
      int s4 = sc_merge_add(it, vtype_of(L1.h.value_dtype), NULL, NULL, 0, idx, msg + L1.value_pos,
                            L1.count, L1.n, nt, oi, ov, &on, &e4);
      FUZZ_CHECK(s4 == s3 && e4.input == 1 && e4.position == bad);
      free(oi);
      free(ov);
    }
  } else {
    FUZZ_CHECK(memcmp(&L1, &L2, sizeof L1) == 0);
    FUZZ_CHECK(L2.index_pos == SC_WIRE_HEADER_NBYTES && L2.h.kind == SC_KIND_COO);
    int64_t iend = L2.index_pos + L2.count * L2.index_size;
    FUZZ_CHECK(L2.value_pos == ((iend + 7) & ~7) && L2.value_pos + L2.count * L2.value_size == (int64_t)n);
    for (int64_t i = iend; i < L2.value_pos; i++) FUZZ_CHECK(msg[i] == 0);
    int range;
    FUZZ_CHECK(ref_first_bad(L2.index_size == 4 ? SC_I32 : SC_I64, msg + L2.index_pos, L2.count, L2.n,
                            &range) < 0);
    kernels_on_valid(msg, &L2, nt);
  }
  fz_message_free(&m);
  return 0;
}
