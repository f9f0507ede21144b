/* DenseStream kernels ("DenseStream: A Novel Data Representation for Gradient
 * Sparsification", section III-A) and the validation of DenseStream messages.
 * Contract: csrc/include/sparsecomm/densestream.h. The per-type bodies live in
 * densestream_impl.h, instantiated here once per value type. */
#include <stdint.h>
#include <string.h>

#include "sparsecomm/densestream.h"
#include "sparsecomm/kernels.h"
#include "common.h"

static inline float ld_f16(uint16_t h) { return sc_f16_bits_to_f32(h); }
static inline uint16_t st_f16(float f) { return sc_f32_to_f16_bits(f); }
static inline float ld_bf16(uint16_t h) { return sc_bf16_bits_to_f32(h); }
static inline uint16_t st_bf16(float f) { return sc_f32_to_bf16_bits(f); }

#define VSFX f32
#define VT float
#define LOAD(v) (v)
#define STORE(a) (a)
#define ISZERO(v) ((v) == 0.0f)
#define ZERO 0.0f
#include "densestream_impl.h"
#undef VSFX
#undef VT
#undef LOAD
#undef STORE
#undef ISZERO
#undef ZERO

#define VSFX f64
#define VT double
#define LOAD(v) (v)
#define STORE(a) (a)
#define ISZERO(v) ((v) == 0.0)
#define ZERO 0.0
#include "densestream_impl.h"
#undef VSFX
#undef VT
#undef LOAD
#undef STORE
#undef ISZERO
#undef ZERO

/* half types: zero is any pattern with all bits but the sign clear */
#define VSFX f16
#define VT uint16_t
#define LOAD(v) ld_f16(v)
#define STORE(a) st_f16(a)
#define ISZERO(v) (((v) & 0x7FFFu) == 0)
#define ZERO ((uint16_t)0)
#include "densestream_impl.h"
#undef VSFX
#undef VT
#undef LOAD
#undef STORE
#undef ISZERO
#undef ZERO

#define VSFX bf16
#define VT uint16_t
#define LOAD(v) ld_bf16(v)
#define STORE(a) st_bf16(a)
#define ISZERO(v) (((v) & 0x7FFFu) == 0)
#define ZERO ((uint16_t)0)
#include "densestream_impl.h"
#undef VSFX
#undef VT
#undef LOAD
#undef STORE
#undef ISZERO
#undef ZERO

/* ------------------------------------------------------------ arguments */

static int value_type_ok(sc_dtype vt) {
  return vt == SC_F32 || vt == SC_F64 || vt == SC_F16 || vt == SC_BF16;
}

static int width_ok(int64_t width) { return width >= 1 && width <= 8; }

int sc_ds_check_blocks(const int64_t* starts, const int64_t* lengths, int64_t nblocks,
                       int64_t nvalues, int64_t n, sc_error_info* err) {
  if (nblocks < 0 || nvalues < 0 || n < 0 || (nblocks > 0 && (!starts || !lengths)))
    return sc_fail(err, SC_ERR_ARG, 0, -1, nblocks);
  int64_t end = 0, sum = 0; /* end: of the previous block */
  for (int64_t b = 0; b < nblocks; b++) {
    int64_t s = starts[b], l = lengths[b];
    if (s < 0 || s >= n) return sc_fail(err, SC_ERR_INDEX_RANGE, 0, b, s);
    if (s < end) return sc_fail(err, SC_ERR_INDEX_ORDER, 0, b, s);
    if (l < 1 || l > n - s) return sc_fail(err, SC_ERR_INDEX_RANGE, 1, b, l);
    end = s + l;
    sum += l; /* <= end <= n: blocks are disjoint inside [0, n) */
  }
  if (sum != nvalues) return sc_fail(err, SC_ERR_ARG, 2, -1, sum);
  return SC_OK;
}

/* The outputs of a producing kernel: counting (all NULL) or writing (all set). */
static int outputs_ok(const int64_t* starts, const int64_t* lengths, const void* values,
                      sc_ds_counts* out) {
  if (!out) return 0;
  int none = !starts && !lengths && !values, all = starts && lengths && values;
  return none || all;
}

/* ------------------------------------------------------------ encode */

int sc_ds_encode_coo(sc_index_t it, sc_dtype vt, const void* idx, const void* val, int64_t m,
                     int64_t n, int64_t width, int64_t* starts, int64_t* lengths, void* values,
                     int64_t cap_blocks, int64_t cap_values, sc_ds_counts* out,
                     sc_error_info* err) {
  if (!value_type_ok(vt)) return sc_fail(err, SC_ERR_ARG, 1, -1, vt);
  if (!width_ok(width)) return sc_fail(err, SC_ERR_ARG, 3, -1, width);
  if (m < 0 || n < 0 || (m > 0 && !val) || !outputs_ok(starts, lengths, values, out))
    return sc_fail(err, SC_ERR_ARG, 0, -1, m);
  int st = sc_check_sorted_indices(it, idx, m, n, 1, err); /* err->input 0 */
  if (st) return st;
  sc_ds_counts got = {0, 0};
  const int64_t T = sc_ds_max_zero_run(width, (int64_t)sc_dtype_size(vt));
  switch (vt) {
    case SC_F32: got = ds_encode_coo_f32(it, idx, val, m, T, starts, lengths, values, cap_blocks, cap_values); break;
    case SC_F64: got = ds_encode_coo_f64(it, idx, val, m, T, starts, lengths, values, cap_blocks, cap_values); break;
    case SC_F16: got = ds_encode_coo_f16(it, idx, val, m, T, starts, lengths, values, cap_blocks, cap_values); break;
    default: got = ds_encode_coo_bf16(it, idx, val, m, T, starts, lengths, values, cap_blocks, cap_values); break;
  }
  if (got.nblocks < 0) return sc_fail(err, SC_ERR_ARG, -1, -1, cap_values); /* out of capacity */
  *out = got;
  return SC_OK;
}

int sc_ds_encode_dense(sc_dtype vt, const void* x, int64_t n, int64_t width, int64_t* starts,
                       int64_t* lengths, void* values, int64_t cap_blocks, int64_t cap_values,
                       sc_ds_counts* out, sc_error_info* err) {
  if (!value_type_ok(vt)) return sc_fail(err, SC_ERR_ARG, 0, -1, vt);
  if (!width_ok(width)) return sc_fail(err, SC_ERR_ARG, 1, -1, width);
  if (n < 0 || (n > 0 && !x) || !outputs_ok(starts, lengths, values, out))
    return sc_fail(err, SC_ERR_ARG, 0, -1, n);
  sc_ds_counts got = {0, 0};
  const int64_t T = sc_ds_max_zero_run(width, (int64_t)sc_dtype_size(vt));
  switch (vt) {
    case SC_F32: got = ds_encode_dense_f32(x, n, T, starts, lengths, values, cap_blocks, cap_values); break;
    case SC_F64: got = ds_encode_dense_f64(x, n, T, starts, lengths, values, cap_blocks, cap_values); break;
    case SC_F16: got = ds_encode_dense_f16(x, n, T, starts, lengths, values, cap_blocks, cap_values); break;
    default: got = ds_encode_dense_bf16(x, n, T, starts, lengths, values, cap_blocks, cap_values); break;
  }
  if (got.nblocks < 0) return sc_fail(err, SC_ERR_ARG, -1, -1, cap_values); /* out of capacity */
  *out = got;
  return SC_OK;
}

/* ------------------------------------------------------------ add, slice */

int sc_ds_add(sc_dtype vt, const int64_t* sa, const int64_t* la, const void* va, int64_t nba,
              int64_t nva, const int64_t* sb, const int64_t* lb, const void* vb, int64_t nbb,
              int64_t nvb, int64_t n, int64_t width, int64_t* starts, int64_t* lengths,
              void* values, int64_t cap_blocks, int64_t cap_values, sc_ds_counts* out,
              sc_error_info* err) {
  if (!value_type_ok(vt)) return sc_fail(err, SC_ERR_ARG, 2, -1, vt);
  if (!width_ok(width)) return sc_fail(err, SC_ERR_ARG, 6, -1, width);
  if (!outputs_ok(starts, lengths, values, out) || (nva > 0 && !va) || (nvb > 0 && !vb))
    return sc_fail(err, SC_ERR_ARG, 0, -1, 0);
  int st = sc_ds_check_blocks(sa, la, nba, nva, n, err);
  if (st) return st;
  st = sc_ds_check_blocks(sb, lb, nbb, nvb, n, err);
  if (st) {
    if (err) err->input += 3;
    return st;
  }
  sc_ds_counts got = {0, 0};
  const int64_t T = sc_ds_max_zero_run(width, (int64_t)sc_dtype_size(vt));
  switch (vt) {
    case SC_F32: got = ds_add_f32(sa, la, va, nba, sb, lb, vb, nbb, T, starts, lengths, values, cap_blocks, cap_values); break;
    case SC_F64: got = ds_add_f64(sa, la, va, nba, sb, lb, vb, nbb, T, starts, lengths, values, cap_blocks, cap_values); break;
    case SC_F16: got = ds_add_f16(sa, la, va, nba, sb, lb, vb, nbb, T, starts, lengths, values, cap_blocks, cap_values); break;
    default: got = ds_add_bf16(sa, la, va, nba, sb, lb, vb, nbb, T, starts, lengths, values, cap_blocks, cap_values); break;
  }
  if (got.nblocks < 0) return sc_fail(err, SC_ERR_ARG, -1, -1, cap_values); /* out of capacity */
  *out = got;
  return SC_OK;
}

int sc_ds_slice(sc_dtype vt, const int64_t* s, const int64_t* l, const void* v, int64_t nb,
                int64_t nv, int64_t n, int64_t lo, int64_t hi, int64_t width, int64_t* starts,
                int64_t* lengths, void* values, int64_t cap_blocks, int64_t cap_values,
                sc_ds_counts* out, sc_error_info* err) {
  if (!value_type_ok(vt)) return sc_fail(err, SC_ERR_ARG, 2, -1, vt);
  if (!width_ok(width)) return sc_fail(err, SC_ERR_ARG, 5, -1, width);
  if (!(0 <= lo && lo <= hi && hi <= n)) return sc_fail(err, SC_ERR_ARG, 3, -1, lo < 0 || lo > hi ? lo : hi);
  if (!outputs_ok(starts, lengths, values, out) || (nv > 0 && !v))
    return sc_fail(err, SC_ERR_ARG, 0, -1, 0);
  int st = sc_ds_check_blocks(s, l, nb, nv, n, err);
  if (st) return st;
  sc_ds_counts got = {0, 0};
  const int64_t T = sc_ds_max_zero_run(width, (int64_t)sc_dtype_size(vt));
  switch (vt) {
    case SC_F32: got = ds_slice_f32(s, l, v, nb, lo, hi, T, starts, lengths, values, cap_blocks, cap_values); break;
    case SC_F64: got = ds_slice_f64(s, l, v, nb, lo, hi, T, starts, lengths, values, cap_blocks, cap_values); break;
    case SC_F16: got = ds_slice_f16(s, l, v, nb, lo, hi, T, starts, lengths, values, cap_blocks, cap_values); break;
    default: got = ds_slice_bf16(s, l, v, nb, lo, hi, T, starts, lengths, values, cap_blocks, cap_values); break;
  }
  if (got.nblocks < 0) return sc_fail(err, SC_ERR_ARG, -1, -1, cap_values); /* out of capacity */
  *out = got;
  return SC_OK;
}

/* ------------------------------------------------------------ decode */

int sc_ds_add_into(sc_dtype vt, void* dense, int64_t n, const int64_t* s, const int64_t* l,
                   const void* v, int64_t nb, int64_t nv, sc_error_info* err) {
  if (!value_type_ok(vt)) return sc_fail(err, SC_ERR_ARG, 2, -1, vt);
  if ((n > 0 && !dense) || (nv > 0 && !v)) return sc_fail(err, SC_ERR_ARG, 2, -1, 0);
  int st = sc_ds_check_blocks(s, l, nb, nv, n, err);
  if (st) return st;
  /* the values must not share bytes with the part of dense being written */
  const size_t w = sc_dtype_size(vt);
  const uintptr_t d0 = (uintptr_t)dense, d1 = d0 + (uintptr_t)n * w;
  const uintptr_t v0 = (uintptr_t)v, v1 = v0 + (uintptr_t)nv * w;
  if (nv > 0 && n > 0 && v0 < d1 && d0 < v1) return sc_fail(err, SC_ERR_OVERLAP, 2, 0, 0);
  switch (vt) {
    case SC_F32: ds_add_into_f32(dense, s, l, v, nb); break;
    case SC_F64: ds_add_into_f64(dense, s, l, v, nb); break;
    case SC_F16: ds_add_into_f16(dense, s, l, v, nb); break;
    default: ds_add_into_bf16(dense, s, l, v, nb); break;
  }
  return SC_OK;
}

int sc_ds_to_coo(sc_dtype vt, const int64_t* s, const int64_t* l, const void* v, int64_t nb,
                 int64_t nv, int64_t n, int64_t* idx, void* val, int64_t cap, int64_t* count,
                 sc_error_info* err) {
  if (!value_type_ok(vt)) return sc_fail(err, SC_ERR_ARG, 2, -1, vt);
  if (!count || (!idx) != (!val) || (nv > 0 && !v)) return sc_fail(err, SC_ERR_ARG, 2, -1, 0);
  int st = sc_ds_check_blocks(s, l, nb, nv, n, err);
  if (st) return st;
  int64_t m;
  switch (vt) {
    case SC_F32: m = ds_to_coo_f32(s, l, v, nb, NULL, NULL); break;
    case SC_F64: m = ds_to_coo_f64(s, l, v, nb, NULL, NULL); break;
    case SC_F16: m = ds_to_coo_f16(s, l, v, nb, NULL, NULL); break;
    default: m = ds_to_coo_bf16(s, l, v, nb, NULL, NULL); break;
  }
  if (idx) {
    if (m > cap) return sc_fail(err, SC_ERR_ARG, 3, -1, cap);
    switch (vt) {
      case SC_F32: ds_to_coo_f32(s, l, v, nb, idx, val); break;
      case SC_F64: ds_to_coo_f64(s, l, v, nb, idx, val); break;
      case SC_F16: ds_to_coo_f16(s, l, v, nb, idx, val); break;
      default: ds_to_coo_bf16(s, l, v, nb, idx, val); break;
    }
  }
  *count = m;
  return SC_OK;
}

/* ------------------------------------------------------------ wire */

typedef unsigned __int128 u128;

static inline uint64_t ld_le(const uint8_t* p, int nbytes) {
  uint64_t v = 0;
  for (int i = nbytes - 1; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

static inline int ds_malformed(sc_error_info* err, int64_t field, int64_t position, int64_t value) {
  return sc_fail(err, SC_ERR_MALFORMED, field, position, value);
}

static inline u128 pad8w(u128 x) { return (x + 7) & ~(u128)7; }

int sc_wire_check_densestream(const uint8_t* msg, int64_t nbytes, const sc_wire_expect* want,
                              int64_t want_lo, int64_t want_hi, sc_ds_layout* out,
                              sc_error_info* err) {
  if (nbytes < 0 || (!msg && nbytes > 0) || want_lo < -1 || want_hi < -1)
    return sc_fail(err, SC_ERR_ARG, -1, -1, 0);
  sc_wire_expect w = want ? *want : sc_wire_expect_any();
  w.kind = SC_KIND_DENSE_BLOCKS;
  w.index_dtype = SC_WIRE_NONE;
  sc_ds_layout L;
  memset(&L, 0, sizeof L);
  int st = sc_wire_check_header(msg, nbytes, &w, &L.h, err); /* SC_ERR_ARG for a bad want */
  if (st) return st;
  if (L.h.value_dtype < SC_WIRE_F32 || L.h.value_dtype > SC_WIRE_BF16)
    return ds_malformed(err, SC_WF_VALUE_DTYPE, 7, L.h.value_dtype);
  L.n = (int64_t)L.h.n; /* < 2^63 once the header passed */
  L.nblocks = (int64_t)L.h.count;
  if (L.nblocks > L.n) return ds_malformed(err, SC_WF_COUNT, 24, L.nblocks);
  if (nbytes < SC_DS_PREFIX_NBYTES) return ds_malformed(err, SC_WF_SIZE, SC_DS_PREFIX_NBYTES, nbytes);
  L.lo = (int64_t)ld_le(msg + 32, 8);
  L.hi = (int64_t)ld_le(msg + 40, 8);
  if (L.lo < 0 || L.lo > L.n || (want_lo >= 0 && L.lo != want_lo))
    return ds_malformed(err, SC_WF_DS_RANGE, 32, L.lo);
  if (L.hi < L.lo || L.hi > L.n || (want_hi >= 0 && L.hi != want_hi))
    return ds_malformed(err, SC_WF_DS_RANGE, 40, L.hi);
  L.nvalues = (int64_t)ld_le(msg + 48, 8);
  if (L.nvalues < L.nblocks || L.nvalues > L.hi - L.lo)
    return ds_malformed(err, SC_WF_DS_NVALUES, 48, L.nvalues);
  L.width = msg[56];
  if (L.width != sc_ds_width(L.n)) return ds_malformed(err, SC_WF_DS_WIDTH, 56, L.width);
  for (int i = 57; i < 64; i++)
    if (msg[i]) return ds_malformed(err, SC_WF_RESERVED, i, msg[i]);
  L.value_size = (int64_t)sc_wire_dtype_size(L.h.value_dtype);
  const u128 fields = (u128)2 * (u128)L.width * (u128)L.nblocks; /* nblocks <= n < 2^63 */
  const u128 need = SC_DS_PREFIX_NBYTES + pad8w(fields) + pad8w((u128)L.nvalues * (u128)L.value_size);
  if (need != (u128)nbytes)
    return ds_malformed(err, SC_WF_SIZE, need > (u128)INT64_MAX ? -1 : (int64_t)need, nbytes);
  L.starts_pos = SC_DS_PREFIX_NBYTES;
  L.lengths_pos = SC_DS_PREFIX_NBYTES + L.width * L.nblocks;
  L.values_pos = SC_DS_PREFIX_NBYTES + (int64_t)pad8w(fields);
  for (int64_t i = L.starts_pos + (int64_t)fields; i < L.values_pos; i++)
    if (msg[i]) return ds_malformed(err, SC_WF_PADDING, i, msg[i]);
  for (int64_t i = L.values_pos + L.nvalues * L.value_size; i < nbytes; i++)
    if (msg[i]) return ds_malformed(err, SC_WF_PADDING, i, msg[i]);
  /* blocks: inside [lo, hi), sorted, disjoint; all sums stay below hi <= n < 2^63 */
  const int wd = (int)L.width;
  int64_t end = L.lo, sum = 0;
  for (int64_t b = 0; b < L.nblocks; b++) {
    uint64_t s = ld_le(msg + L.starts_pos + b * wd, wd);
    uint64_t len = ld_le(msg + L.lengths_pos + b * wd, wd) + 1; /* width <= 8: no wrap below 2^64 - 1 */
    if (s < (uint64_t)L.lo || s >= (uint64_t)L.hi)
      return ds_malformed(err, SC_WF_DS_BLOCK_RANGE, b, (int64_t)s);
    if ((int64_t)s < end) return ds_malformed(err, SC_WF_DS_BLOCK_ORDER, b, (int64_t)s);
    if (len == 0 || len > (uint64_t)(L.hi - (int64_t)s))
      return ds_malformed(err, SC_WF_DS_BLOCK_RANGE, b, (int64_t)((u128)s + len > (u128)INT64_MAX ? -1 : (int64_t)(s + len)));
    end = (int64_t)(s + len);
    sum += (int64_t)len;
  }
  if (sum != L.nvalues) return ds_malformed(err, SC_WF_DS_NVALUES, -1, sum);
  if (out) *out = L;
  return SC_OK;
}
