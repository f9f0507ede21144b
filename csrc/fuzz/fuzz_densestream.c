/* Fuzz target: DenseStream messages (sc_wire_check_densestream) and the DenseStream
 * kernels (densestream.h) on what the check accepts and on raw blocks.
 *
 * Input: [1 byte sel][rest]. sel bit 0: the rest is a message, checked with
 * expectations from its own header (bit 1: one of them off by one); bit 0 clear and
 * bit 2 set: the rest is raw blocks for the kernels' own validation
 * ([n u16][nvalues u8][pairs of (start i8, length i8)]); otherwise a message checked
 * with no expectations.
 * Invariants:
 *   - the check returns SC_OK or SC_ERR_MALFORMED with a known field; an accepted
 *     message has the exact size, zero padding and reserved bytes, width sc_ds_width(N),
 *     and blocks inside [lo, hi), sorted, disjoint, lengths summing to nvalues
 *     (reference loop); a rejected one breaks one of these or an expectation;
 *   - on an accepted message with a range of at most 2^16: sc_ds_check_blocks accepts
 *     its blocks; add_into, encode_dense, add (with itself), slice and to_coo agree with
 *     the references of ref.h (ref_ds_same: the canonical blocks);
 *   - raw blocks: sc_ds_check_blocks agrees with a reference check, and every kernel
 *     taking blocks returns the same status without writing on failure. */
#include "fuzz_common.h"
#include "sparsecomm/densestream.h"

static sc_dtype vtype_of(int code) {
  return code == SC_WIRE_F32 ? SC_F32 : code == SC_WIRE_F64 ? SC_F64 : code == SC_WIRE_F16 ? SC_F16 : SC_BF16;
}

FZ_NOCOV static uint64_t ld(const uint8_t* p, int w) {
  uint64_t v = 0;
  for (int i = w - 1; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

/* the status sc_ds_check_blocks must return */
FZ_NOCOV static int ref_check(const int64_t* s, const int64_t* l, int64_t nb, int64_t nv, int64_t n) {
  int64_t end = 0, sum = 0;
  for (int64_t b = 0; b < nb; b++) {
    if (s[b] < 0 || s[b] >= n) return SC_ERR_INDEX_RANGE;
    if (s[b] < end) return SC_ERR_INDEX_ORDER;
    if (l[b] < 1 || l[b] > n - s[b]) return SC_ERR_INDEX_RANGE;
    end = s[b] + l[b];
    sum += l[b];
  }
  return sum == nv ? SC_OK : SC_ERR_ARG;
}

/* kernels on valid blocks (s, l relative to the range, values v) over m positions */
static void kernels(sc_dtype t, const int64_t* s, const int64_t* l, const void* v, int64_t nb, int64_t nv,
                    int64_t m) {
  size_t w = sc_dtype_size(t);
  sc_error_info e = fz_err();
  FUZZ_CHECK(sc_ds_check_blocks(s, l, nb, nv, m, &e) == SC_OK);
  uint8_t* x = (uint8_t*)calloc((size_t)m + 1, w); /* all +0 */
  FUZZ_CHECK(sc_ds_add_into(t, x, m, s, l, v, nb, nv, &e) == SC_OK);
  int64_t k = 0;
  for (int64_t b = 0; b < nb; b++)
    for (int64_t j = 0; j < l[b]; j++, k++) FUZZ_CHECK(ref_get(t, x, s[b] + j) == ref_get(t, v, k) || ref_get(t, v, k) != ref_get(t, v, k));
  int width = sc_ds_width(m);
  int64_t T = sc_ds_max_zero_run(width, (int64_t)w);
  /* canonical encodings: of x, of the message's blocks + themselves, of a slice */
  int64_t* os = (int64_t*)malloc((size_t)(m + 1) * 8);
  int64_t* ol = (int64_t*)malloc((size_t)(m + 1) * 8);
  uint8_t* ov = (uint8_t*)malloc((size_t)(m + 1) * w);
  sc_ds_counts c;
  FUZZ_CHECK(sc_ds_encode_dense(t, x, m, width, os, ol, ov, m, m, &c, &e) == SC_OK);
  FUZZ_CHECK(ref_ds_same(t, x, m, T, os, ol, ov, c.nblocks, c.nvalues));
  uint8_t* x2 = (uint8_t*)malloc((size_t)(m + 1) * w);
  for (int64_t i = 0; i < m; i++) ref_put(t, x2, i, ref_add(t, ref_get(t, x, i), ref_get(t, x, i)));
  if (sc_ds_add(t, s, l, v, nb, nv, s, l, v, nb, nv, m, width, os, ol, ov, m, m, &c, &e) == SC_OK) {
    int nan = 0;
    for (int64_t i = 0; i < m; i++) nan |= ref_get(t, x2, i) != ref_get(t, x2, i);
    if (!nan) FUZZ_CHECK(ref_ds_same(t, x2, m, T, os, ol, ov, c.nblocks, c.nvalues));
  } else {
    FUZZ_CHECK(0);
  }
  int64_t lo = m / 3, hi = m - m / 4;
  FUZZ_CHECK(sc_ds_slice(t, s, l, v, nb, nv, m, lo, hi, width, os, ol, ov, m, m, &c, &e) == SC_OK);
  for (int64_t i = 0; i < m; i++)
    if (i < lo || i >= hi) ref_put(t, x, i, 0.0);
  FUZZ_CHECK(ref_ds_same(t, x, m, T, os, ol, ov, c.nblocks, c.nvalues));
  int64_t cnt = -1, nz = 0;
  FUZZ_CHECK(sc_ds_to_coo(t, s, l, v, nb, nv, m, NULL, NULL, 0, &cnt, &e) == SC_OK);
  for (int64_t i = 0; i < nv; i++) nz += ref_get(t, v, i) != 0.0;
  FUZZ_CHECK(cnt == nz);
  free(os);
  free(ol);
  free(ov);
  free(x);
  free(x2);
}

static void message(const fz_message* m, unsigned sel) {
  sc_wire_expect w = sc_wire_expect_any();
  sc_wire_header h;
  int64_t lo = -1, hi = -1;
  if ((sel & 1) && fz_expect_own_header(m, &w, &h) && m->n >= SC_DS_PREFIX_NBYTES) {
    lo = (int64_t)ld(m->msg + 32, 8);
    hi = (int64_t)ld(m->msg + 40, 8);
    if (lo < 0) lo = -1;
    if (hi < 0) hi = -1;
    if ((sel & 2) && hi >= 0) hi ^= 1;
  }
  sc_ds_layout L;
  sc_error_info e = fz_err();
  int st = sc_wire_check_densestream(m->msg, (int64_t)m->n, &w, lo, hi, &L, &e);
  FUZZ_CHECK(st == SC_OK || st == SC_ERR_MALFORMED);
  if (st != SC_OK) {
    FUZZ_CHECK((e.input > 0 && e.input < SC_WF_COUNT_OF_FIELDS) ||
               (e.input >= SC_WF_DS_RANGE && e.input <= SC_WF_DS_BLOCK_RANGE));
    return;
  }
  const uint8_t* msg = m->msg;
  FUZZ_CHECK(L.width == sc_ds_width(L.n) && msg[56] == L.width && L.h.kind == SC_KIND_DENSE_BLOCKS);
  FUZZ_CHECK(0 <= L.lo && L.lo <= L.hi && L.hi <= L.n && L.nblocks <= L.nvalues && L.nvalues <= L.hi - L.lo);
  FUZZ_CHECK((lo < 0 || L.lo == lo) && (hi < 0 || L.hi == hi));
  int64_t fields = 2 * L.width * L.nblocks, vend = L.values_pos + L.nvalues * L.value_size;
  FUZZ_CHECK(L.values_pos == 64 + ((fields + 7) & ~7) && ((vend + 7) & ~7) == (int64_t)m->n);
  for (int i = 57; i < 64; i++) FUZZ_CHECK(msg[i] == 0);
  for (int64_t i = 64 + fields; i < L.values_pos; i++) FUZZ_CHECK(msg[i] == 0);
  for (int64_t i = vend; i < (int64_t)m->n; i++) FUZZ_CHECK(msg[i] == 0);
  int64_t* s = (int64_t*)malloc((size_t)L.nblocks * 8 + 8);
  int64_t* l = (int64_t*)malloc((size_t)L.nblocks * 8 + 8);
  int64_t end = L.lo, sum = 0;
  for (int64_t b = 0; b < L.nblocks; b++) {
    uint64_t sb = ld(msg + L.starts_pos + b * L.width, (int)L.width);
    uint64_t lb = ld(msg + L.lengths_pos + b * L.width, (int)L.width) + 1;
    FUZZ_CHECK(lb >= 1 && sb >= (uint64_t)end && sb + lb <= (uint64_t)L.hi);
    end = (int64_t)(sb + lb);
    sum += (int64_t)lb;
    s[b] = (int64_t)sb - L.lo; /* relative to the range */
    l[b] = (int64_t)lb;
  }
  FUZZ_CHECK(sum == L.nvalues);
  if (L.hi - L.lo <= (1 << 16))
    kernels(vtype_of(L.h.value_dtype), s, l, msg + L.values_pos, L.nblocks, L.nvalues, L.hi - L.lo);
  free(s);
  free(l);
}

static void raw_blocks(fz_reader* r) {
  int64_t n = (int64_t)fz_u(r, 2), nv = (int64_t)fz_u(r, 1);
  int64_t nb = (int64_t)(r->n / 2);
  if (nb > 64) nb = 64;
  int64_t s[64], l[64];
  for (int64_t b = 0; b < nb; b++) {
    s[b] = (int8_t)fz_u(r, 1);
    l[b] = (int8_t)fz_u(r, 1);
  }
  float v[256], dense[1024];
  for (int i = 0; i < 256; i++) v[i] = (float)(i % 7) - 3.0f;
  if (n > 1024) n = 1024;
  int want = ref_check(s, l, nb, nv, n);
  sc_error_info e = fz_err();
  FUZZ_CHECK(sc_ds_check_blocks(s, l, nb, nv, n, &e) == want);
  for (int i = 0; i < 1024; i++) dense[i] = 1.0f;
  FUZZ_CHECK(sc_ds_add_into(SC_F32, dense, n, s, l, v, nb, nv, &e) == want);
  if (want) for (int i = 0; i < 1024; i++) FUZZ_CHECK(dense[i] == 1.0f);
  sc_ds_counts c;
  FUZZ_CHECK(sc_ds_slice(SC_F32, s, l, v, nb, nv, n, 0, n, 1, NULL, NULL, NULL, 0, 0, &c, &e) == want);
  FUZZ_CHECK(sc_ds_add(SC_F32, s, l, v, nb, nv, NULL, NULL, NULL, 0, 0, n, 1, NULL, NULL, NULL, 0, 0, &c, &e) == want);
  int64_t cnt;
  FUZZ_CHECK(sc_ds_to_coo(SC_F32, s, l, v, nb, nv, n, NULL, NULL, 0, &cnt, &e) == want);
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fz_reader r = {data, size};
  unsigned sel = (unsigned)fz_u(&r, 1);
  if (!(sel & 1) && (sel & 4)) {
    raw_blocks(&r);
    return 0;
  }
  fz_message m = fz_message_take(&r);
  message(&m, sel);
  fz_message_free(&m);
  return 0;
}
