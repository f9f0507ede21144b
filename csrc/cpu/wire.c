/*
 * Validation of received messages (contract: sparsecomm/wire.h; layouts:
 * sparsecomm/formats/{header,coo,stream}.py).
 *
 * Every size is computed in 128-bit arithmetic before it is compared with the
 * message's length, so no header value (N, count, bucket up to 2^63) can wrap
 * a computation into a small, plausible number; nothing past msg[nbytes) is
 * read, and the layout functions read at most SC_WIRE_PREFIX_NBYTES bytes.
 */
#include <stdint.h>
#include <string.h>

#include "common.h"
#include "sparsecomm/wire.h"

typedef unsigned __int128 u128;

#define I64_MAX_U ((uint64_t)INT64_MAX)

static inline int wire_fail(sc_error_info* err, int64_t field, int64_t position, int64_t value) {
  return sc_fail(err, SC_ERR_MALFORMED, field, position, value);
}

static inline int wire_arg(sc_error_info* err, int64_t what) {
  return sc_fail(err, SC_ERR_ARG, what, -1, 0);
}

/* Little-endian loads, any alignment. */
static inline uint64_t ld_le(const uint8_t* p, int nbytes) {
  uint64_t v = 0;
  for (int i = nbytes - 1; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

static inline int64_t pad8(int64_t x) { return (x + 7) & ~(int64_t)7; }
static inline u128 pad8w(u128 x) { return (x + 7) & ~(u128)7; }

/* Size the header implies, as err->position wants it: -1 when past int64. */
static inline int64_t size_pos(u128 need) {
  return need > (u128)I64_MAX_U ? -1 : (int64_t)need;
}

const char* sc_wire_field_name(int64_t field) {
  static const char* const names[SC_WF_COUNT_OF_FIELDS] = {
      "none",       "magic",       "version",     "kind",   "value_dtype", "index_dtype",
      "reserved",   "sender",      "n",           "count",  "size",        "index_order",
      "index_range", "offset",     "bucket_size", "bits",   "padding",     "delta"};
  return (field >= 0 && field < SC_WF_COUNT_OF_FIELDS) ? names[field] : "unknown";
}

static int check_expect(const sc_wire_expect* w, sc_error_info* err) {
  if (!w) return SC_OK;
  const int64_t* f = &w->kind;
  for (int i = 0; i < 9; i++)
    if (f[i] < -1) return wire_arg(err, i);
  return SC_OK;
}

static int check_buffer(const uint8_t* msg, int64_t nbytes, sc_error_info* err) {
  if (nbytes < 0 || (!msg && nbytes > 0)) return wire_arg(err, -1);
  return SC_OK;
}

/* ---------------------------------------------------------------- header */

static int header_impl(const uint8_t* msg, int64_t nbytes, const sc_wire_expect* w,
                       sc_wire_header* h, sc_error_info* err) {
  if (nbytes < SC_WIRE_HEADER_NBYTES)
    return wire_fail(err, SC_WF_SIZE, SC_WIRE_HEADER_NBYTES, nbytes);
  h->magic = (uint32_t)ld_le(msg, 4);
  h->version = (uint16_t)ld_le(msg + 4, 2);
  h->kind = msg[6];
  h->value_dtype = msg[7];
  h->index_dtype = msg[8];
  memcpy(h->reserved, msg + 9, 3);
  h->sender = (uint32_t)ld_le(msg + 12, 4);
  h->n = ld_le(msg + 16, 8);
  h->count = ld_le(msg + 24, 8);

  if (h->magic != SC_WIRE_MAGIC) return wire_fail(err, SC_WF_MAGIC, 0, h->magic);
  if (h->version != SC_WIRE_VERSION) return wire_fail(err, SC_WF_VERSION, 4, h->version);
  if (h->kind < SC_KIND_COO || h->kind > SC_KIND_COO_CODED ||
      (w && w->kind >= 0 && h->kind != w->kind))
    return wire_fail(err, SC_WF_KIND, 6, h->kind);
  if (h->value_dtype > SC_WIRE_U8 || (w && w->value_dtype >= 0 && h->value_dtype != w->value_dtype))
    return wire_fail(err, SC_WF_VALUE_DTYPE, 7, h->value_dtype);
  if (h->index_dtype > SC_WIRE_U8 || (w && w->index_dtype >= 0 && h->index_dtype != w->index_dtype))
    return wire_fail(err, SC_WF_INDEX_DTYPE, 8, h->index_dtype);
  for (int i = 0; i < 3; i++)
    if (h->reserved[i]) return wire_fail(err, SC_WF_RESERVED, 9 + i, h->reserved[i]);
  if (w && w->sender >= 0 && (int64_t)h->sender != w->sender)
    return wire_fail(err, SC_WF_SENDER, 12, h->sender);
  if (h->n > I64_MAX_U || (w && w->n >= 0 && h->n != (uint64_t)w->n))
    return wire_fail(err, SC_WF_N, 16, (int64_t)h->n);
  if (h->count > I64_MAX_U || (w && w->count >= 0 && h->count != (uint64_t)w->count))
    return wire_fail(err, SC_WF_COUNT, 24, (int64_t)h->count);
  return SC_OK;
}

int sc_wire_check_header(const uint8_t* msg, int64_t nbytes, const sc_wire_expect* want,
                         sc_wire_header* out, sc_error_info* err) {
  int st = check_buffer(msg, nbytes, err);
  if (st == SC_OK) st = check_expect(want, err);
  if (st != SC_OK) return st;
  sc_wire_header h;
  st = header_impl(msg, nbytes, want, &h, err);
  if (st == SC_OK && out) *out = h;
  return st;
}

/* Header checks of a message whose kind the caller fixes and whose index
 * dtype follows from N; value dtype a float. */
static int header_for(const uint8_t* msg, int64_t nbytes, const sc_wire_expect* want,
                      int64_t kind, sc_wire_layout* L, sc_error_info* err) {
  int st = check_buffer(msg, nbytes, err);
  if (st == SC_OK) st = check_expect(want, err);
  if (st != SC_OK) return st;
  sc_wire_expect w = want ? *want : sc_wire_expect_any();
  w.kind = kind;
  w.index_dtype = SC_WIRE_ANY;
  memset(L, 0, sizeof(*L));
  L->index_pos = L->scale_pos = -1;
  L->nbytes = nbytes;
  st = header_impl(msg, nbytes, &w, &L->h, err);
  if (st != SC_OK) return st;
  L->n = (int64_t)L->h.n;
  L->count = (int64_t)L->h.count;
  return SC_OK;
}

static int is_float_code(int64_t c) { return c >= SC_WIRE_F32 && c <= SC_WIRE_BF16; }

/* The index dtype a sparse message over N coordinates must use. */
static int64_t index_code_for(int64_t n) {
  return n < ((int64_t)1 << 31) ? SC_WIRE_I32 : SC_WIRE_I64;
}

static int check_zero(const uint8_t* msg, int64_t lo, int64_t hi, sc_error_info* err) {
  for (int64_t i = lo; i < hi; i++)
    if (msg[i]) return wire_fail(err, SC_WF_PADDING, i, msg[i]);
  return SC_OK;
}

/* ---------------------------------------------------------------- indices */

#define ISFX i32
#define IT int32_t
#define UT uint32_t
#include "wire_impl.h"
#undef ISFX
#undef IT
#undef UT

#define ISFX i64
#define IT int64_t
#define UT uint64_t
#include "wire_impl.h"
#undef ISFX
#undef IT
#undef UT

int sc_wire_check_indices(const uint8_t* idx, int64_t isize, int64_t count, int64_t limit,
                          int nthreads, sc_error_info* err) {
  if ((isize != 4 && isize != 8) || count < 0 || limit < 0 || (!idx && count > 0))
    return wire_arg(err, -1);
  if (count == 0) return SC_OK;
  int range = 0;
  int64_t pos, value;
  if (isize == 4) {
    /* Capping the limit at 2^31 is exact for int32: every index >= 0 is
     * below it, and a negative one reads as >= 2^31 unsigned. */
    uint32_t lim = limit > ((int64_t)1 << 31) ? (uint32_t)1 << 31 : (uint32_t)limit;
    pos = first_bad_par_i32(idx, count, lim, nthreads, &range);
    if (pos < 0) return SC_OK;
    value = ld_i32(idx, pos);
  } else {
    pos = first_bad_par_i64(idx, count, (uint64_t)limit, nthreads, &range);
    if (pos < 0) return SC_OK;
    value = ld_i64(idx, pos);
  }
  return wire_fail(err, range ? SC_WF_INDEX_RANGE : SC_WF_INDEX_ORDER, pos, value);
}

/* ---------------------------------------------------------------- COO */

int sc_wire_coo_layout(const uint8_t* msg, int64_t nbytes, const sc_wire_expect* want,
                       sc_wire_layout* out, sc_error_info* err) {
  sc_wire_layout L;
  int st = header_for(msg, nbytes, want, SC_KIND_COO, &L, err);
  if (st != SC_OK) return st;
  if (!is_float_code(L.h.value_dtype)) return wire_fail(err, SC_WF_VALUE_DTYPE, 7, L.h.value_dtype);
  if (L.h.index_dtype != index_code_for(L.n))
    return wire_fail(err, SC_WF_INDEX_DTYPE, 8, L.h.index_dtype);
  if (L.count > L.n) return wire_fail(err, SC_WF_COUNT, 24, L.count);
  L.index_size = sc_wire_dtype_size(L.h.index_dtype);
  L.value_size = sc_wire_dtype_size(L.h.value_dtype);
  u128 isec = pad8w((u128)L.count * (u128)L.index_size);
  u128 need = SC_WIRE_HEADER_NBYTES + isec + (u128)L.count * (u128)L.value_size;
  if (need != (u128)nbytes) return wire_fail(err, SC_WF_SIZE, size_pos(need), nbytes);
  L.index_pos = SC_WIRE_HEADER_NBYTES;
  L.value_pos = SC_WIRE_HEADER_NBYTES + (int64_t)isec;
  if (out) *out = L;
  return SC_OK;
}

int sc_wire_check_coo(const uint8_t* msg, int64_t nbytes, const sc_wire_expect* want,
                      int nthreads, sc_wire_layout* out, sc_error_info* err) {
  sc_wire_layout L;
  int st = sc_wire_coo_layout(msg, nbytes, want, &L, err);
  if (st != SC_OK) return st;
  st = check_zero(msg, L.index_pos + L.count * L.index_size, L.value_pos, err);
  if (st != SC_OK) return st;
  st = sc_wire_check_indices(msg + L.index_pos, L.index_size, L.count, L.n, nthreads, err);
  if (st != SC_OK) return st;
  if (out) *out = L;
  return SC_OK;
}

/* ---------------------------------------------------------------- streams */

int sc_wire_stream_layout(const uint8_t* msg, int64_t nbytes, const sc_wire_expect* want,
                          sc_wire_layout* out, sc_error_info* err) {
  sc_wire_layout L;
  int64_t want_kind = want ? want->kind : SC_WIRE_ANY;
  if (want_kind != SC_WIRE_ANY && want_kind != SC_KIND_COO && want_kind != SC_KIND_DENSE)
    return wire_arg(err, 0);
  sc_wire_expect w = want ? *want : sc_wire_expect_any();
  int64_t want_count = w.count;
  w.count = SC_WIRE_ANY; /* applies to the sparse form only */
  int st = header_for(msg, nbytes, &w, want_kind, &L, err);
  if (st != SC_OK) return st;
  if (L.h.kind != SC_KIND_COO && L.h.kind != SC_KIND_DENSE)
    return wire_fail(err, SC_WF_KIND, 6, L.h.kind);
  L.dense = L.h.kind == SC_KIND_DENSE;
  if (!is_float_code(L.h.value_dtype)) return wire_fail(err, SC_WF_VALUE_DTYPE, 7, L.h.value_dtype);
  int64_t icode = L.dense ? SC_WIRE_NONE : index_code_for(L.n);
  if (L.h.index_dtype != icode) return wire_fail(err, SC_WF_INDEX_DTYPE, 8, L.h.index_dtype);
  L.value_size = sc_wire_dtype_size(L.h.value_dtype);
  if (L.dense) {
    if (L.count != L.n) return wire_fail(err, SC_WF_COUNT, 24, L.count);
  } else {
    if (want_count >= 0 && L.count != want_count) return wire_fail(err, SC_WF_COUNT, 24, L.count);
    L.index_size = sc_wire_dtype_size(icode);
    /* delta(N) = floor(N * vsize / (isize + vsize)) */
    u128 delta = (u128)L.n * (u128)L.value_size / (u128)(L.index_size + L.value_size);
    if ((u128)L.count > delta) return wire_fail(err, SC_WF_DELTA, 24, L.count);
  }
  if (nbytes < SC_WIRE_HEADER_NBYTES + 8)
    return wire_fail(err, SC_WF_SIZE, SC_WIRE_HEADER_NBYTES + 8, nbytes);
  L.offset = (int64_t)ld_le(msg + SC_WIRE_HEADER_NBYTES, 8);
  if (L.offset < 0 || (w.offset >= 0 && L.offset != w.offset))
    return wire_fail(err, SC_WF_OFFSET, SC_WIRE_HEADER_NBYTES, L.offset);
  u128 isec = pad8w((u128)L.count * (u128)L.index_size);
  u128 need = SC_WIRE_HEADER_NBYTES + 8 + isec + pad8w((u128)L.count * (u128)L.value_size);
  if (need != (u128)nbytes) return wire_fail(err, SC_WF_SIZE, size_pos(need), nbytes);
  L.index_pos = L.dense ? -1 : SC_WIRE_HEADER_NBYTES + 8;
  L.value_pos = SC_WIRE_HEADER_NBYTES + 8 + (int64_t)isec;
  if (out) *out = L;
  return SC_OK;
}

int sc_wire_check_stream(const uint8_t* msg, int64_t nbytes, const sc_wire_expect* want,
                         int nthreads, sc_wire_layout* out, sc_error_info* err) {
  sc_wire_layout L;
  int st = sc_wire_stream_layout(msg, nbytes, want, &L, err);
  if (st != SC_OK) return st;
  if (!L.dense) {
    st = check_zero(msg, L.index_pos + L.count * L.index_size, L.value_pos, err);
    if (st != SC_OK) return st;
  }
  st = check_zero(msg, L.value_pos + L.count * L.value_size, nbytes, err);
  if (st != SC_OK) return st;
  if (!L.dense) {
    st = sc_wire_check_indices(msg + L.index_pos, L.index_size, L.count, L.n, nthreads, err);
    if (st != SC_OK) return st;
  }
  if (out) *out = L;
  return SC_OK;
}

/* ---------------------------------------------------------------- QSGD */

int sc_wire_qsgd_layout(const uint8_t* msg, int64_t nbytes, const sc_wire_expect* want,
                        sc_wire_layout* out, sc_error_info* err) {
  sc_wire_layout L;
  sc_wire_expect w = want ? *want : sc_wire_expect_any();
  w.value_dtype = SC_WIRE_U8;
  int st = check_expect(want, err);
  if (st != SC_OK) return st;
  st = header_for(msg, nbytes, &w, SC_KIND_DENSE, &L, err);
  if (st != SC_OK) return st;
  if (L.h.index_dtype != SC_WIRE_NONE) return wire_fail(err, SC_WF_INDEX_DTYPE, 8, L.h.index_dtype);
  if (nbytes < SC_WIRE_PREFIX_NBYTES)
    return wire_fail(err, SC_WF_SIZE, SC_WIRE_PREFIX_NBYTES, nbytes);
  L.offset = (int64_t)ld_le(msg + SC_WIRE_HEADER_NBYTES, 8);
  if (L.offset < 0 || (w.offset >= 0 && L.offset != w.offset))
    return wire_fail(err, SC_WF_OFFSET, SC_WIRE_HEADER_NBYTES, L.offset);
  L.bucket = (int32_t)(uint32_t)ld_le(msg + 40, 4);
  L.bits = (int32_t)(uint32_t)ld_le(msg + 44, 4);
  /* bits before bucket: whether a bucket is valid depends on bits */
  if ((L.bits != 4 && L.bits != 8) || (w.bits >= 0 && L.bits != w.bits))
    return wire_fail(err, SC_WF_BITS, 44, L.bits);
  if (L.bucket < 1 || (L.bits == 4 && (L.bucket & 1)) || (w.bucket >= 0 && L.bucket != w.bucket))
    return wire_fail(err, SC_WF_BUCKET, 40, L.bucket);
  u128 packed = ((u128)L.n * (u128)L.bits + 7) / 8;
  if ((u128)L.count != packed) return wire_fail(err, SC_WF_COUNT, 24, L.count);
  L.nscales = L.n / L.bucket + (L.n % L.bucket != 0);
  L.value_size = 1;
  u128 need = SC_WIRE_PREFIX_NBYTES + pad8w((u128)L.nscales * 4) + pad8w((u128)L.count);
  if (need != (u128)nbytes) return wire_fail(err, SC_WF_SIZE, size_pos(need), nbytes);
  L.scale_pos = SC_WIRE_PREFIX_NBYTES;
  L.value_pos = SC_WIRE_PREFIX_NBYTES + pad8(L.nscales * 4);
  if (out) *out = L;
  return SC_OK;
}

int sc_wire_check_qsgd(const uint8_t* msg, int64_t nbytes, const sc_wire_expect* want,
                       sc_wire_layout* out, sc_error_info* err) {
  sc_wire_layout L;
  int st = sc_wire_qsgd_layout(msg, nbytes, want, &L, err);
  if (st != SC_OK) return st;
  st = check_zero(msg, L.scale_pos + 4 * L.nscales, L.value_pos, err);
  if (st == SC_OK) st = check_zero(msg, L.value_pos + L.count, nbytes, err);
  if (st != SC_OK) return st;
  if (out) *out = L;
  return SC_OK;
}
