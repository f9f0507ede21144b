/* SKCompress: writing and reading the keys sections of a body. Layout:
 * sparsecomm/skcompress.h. */
#include "skc_keys.h"

#include <stdlib.h>
#include <string.h>

#include "sparsecomm/skcompress.h"
#include "common.h"
#include "skc_bits.h"
#include "skc_huffman.h"

static int key_width(int64_t N) { return N <= (1ll << 32) ? 32 : 64; }

static const int64_t M_CHOICES[4] = {2, 4, 8, 16};

static inline int log2_small(int64_t m) { return m == 2 ? 1 : m == 4 ? 2 : m == 8 ? 3 : 4; }

int64_t skc_write_delta_keys(const int64_t* keys, int64_t n, int64_t N, int64_t want_m,
                                int want_prefix, uint8_t* out, int64_t cap) {
  int W = key_width(N);
  int64_t occur[65] = {0};
  for (int64_t i = 0; i < n; i++) {
    uint64_t d = i == 0 ? (uint64_t)keys[0] : (uint64_t)(keys[i] - keys[i - 1] - 1);
    occur[bit_length(d)]++;
  }
  int64_t best_bits = -1, best_m = 2;
  int best_scheme = 0;
  uint8_t best_len[16] = {0};
  for (int mi = 0; mi < 4; mi++) {
    int64_t m = M_CHOICES[mi];
    if (want_m && want_m != m) continue;
    int b = W / (int)m;
    uint64_t freq[16] = {0};
    int64_t data_bits = 0;
    for (int L = 1; L <= 64; L++) {
      if (!occur[L]) continue;
      int c = (L + b - 1) / b;
      freq[c - 1] += (uint64_t)occur[L];
      data_bits += occur[L] * (int64_t)c * b;
    }
    for (int scheme = 0; scheme < 2; scheme++) {
      if (want_prefix == SC_SKC_PREFIX_FIXED && scheme != 0) continue;
      if (want_prefix == SC_SKC_PREFIX_HUFFMAN && scheme != 1) continue;
      uint8_t len[16] = {0};
      int64_t bits = data_bits;
      if (scheme == 0) {
        bits += n * log2_small(m);
      } else {
        if (skc_huffman_lengths(freq, (int)m, len)) return -2;
        for (int s = 0; s < m; s++) bits += (int64_t)freq[s] * len[s];
        bits += 8 * m; /* the table */
      }
      if (best_bits < 0 || bits < best_bits) {
        best_bits = bits;
        best_m = m;
        best_scheme = scheme;
        memcpy(best_len, len, 16);
      }
    }
  }
  int64_t m = best_m;
  int b = W / (int)m;
  int64_t head = 2 + (best_scheme ? m : 0) + 8;
  if (cap < head) return -1;
  out[0] = (uint8_t)m;
  out[1] = (uint8_t)best_scheme;
  if (best_scheme) memcpy(out + 2, best_len, (size_t)m);
  uint32_t code[16] = {0};
  if (best_scheme) skc_huffman_codes(best_len, (int)m, code);
  bit_writer w = {out + head, cap - head, 0, 0, 0, 0};
  int pbits = log2_small(m);
  for (int64_t i = 0; i < n; i++) {
    uint64_t d = i == 0 ? (uint64_t)keys[0] : (uint64_t)(keys[i] - keys[i - 1] - 1);
    int c = (bit_length(d) + b - 1) / b;
    if (best_scheme)
      bw_put(&w, code[c - 1], best_len[c - 1]);
    else
      bw_put(&w, (uint64_t)(c - 1), pbits);
    bw_put_wide(&w, d, c * b);
  }
  int64_t bits = w.nbytes * 8 + w.nacc;
  bw_flush(&w);
  if (w.overflow) return -1;
  put_u64(out + head - 8, (uint64_t)bits);
  return head + w.nbytes;
}

int64_t skc_write_raw_keys(const int64_t* keys, int64_t n, int64_t N, uint8_t* out, int64_t cap) {
  int64_t ks = raw_key_size(N);
  if (cap < n * ks) return -1;
  for (int64_t i = 0; i < n; i++) {
    if (ks == 4) put_u32(out + 4 * i, (uint32_t)keys[i]);
    else put_u64(out + 8 * i, (uint64_t)keys[i]);
  }
  return n * ks;
}

int skc_read_keys(const uint8_t* body, int64_t len, int64_t* pos, int codec, int64_t n,
                     int64_t N, int64_t* keys, sc_error_info* err) {
  int64_t p = *pos;
  if (codec == SC_SKC_INDEX_RAW) {
    int64_t ks = raw_key_size(N);
    if (n > (len - p) / ks) return sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_SIZE, p, len);
    int64_t prev = -1;
    for (int64_t i = 0; i < n; i++) {
      int64_t k = ks == 4 ? (int64_t)get_u32(body + p + 4 * i) : (int64_t)get_u64(body + p + 8 * i);
      if (k < 0 || k >= N) return sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_INDEX_RANGE, p + ks * i, k);
      if (k <= prev) return sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_INDEX_ORDER, p + ks * i, k);
      keys[i] = prev = k;
    }
    *pos = p + n * ks;
    return SC_OK;
  }
  if (len - p < 2) return sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_SIZE, p, len);
  int64_t m = body[p];
  int scheme = body[p + 1];
  if (m != 2 && m != 4 && m != 8 && m != 16)
    return sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_PREFIX, p, m);
  if (scheme > 1) return sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_PREFIX, p + 1, scheme);
  int64_t head = 2 + (scheme ? m : 0) + 8;
  if (len - p < head) return sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_SIZE, p, len);
  hf_table t = {0, NULL, NULL};
  if (scheme) {
    int st = skc_hf_table_build(body + p + 2, (int)m, n == 0, p + 2, &t, err);
    if (st) return st;
  }
  uint64_t nbits = get_u64(body + p + head - 8);
  int64_t avail = len - p - head;
  if (nbits > (uint64_t)avail * 8 || (int64_t)((nbits + 7) / 8) > avail) {
    skc_hf_table_free(&t);
    return sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_SIZE, p + head - 8, (int64_t)nbits);
  }
  bit_reader r = {body + p + head, (int64_t)nbits, 0};
  int W = key_width(N), b = W / (int)m, pbits = log2_small(m);
  int64_t prev = -1;
  int st = SC_OK;
  for (int64_t i = 0; i < n; i++) {
    uint64_t pv, d;
    int64_t at = p + head + (r.pos >> 3);
    if (scheme) {
      uint32_t sym;
      if (t.sym == NULL || !hf_read(&r, &t, &sym)) { st = sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_CODE, at, i); break; }
      pv = sym;
    } else if (!br_get(&r, pbits, &pv)) {
      st = sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_CODE, at, i);
      break;
    }
    if (pv >= (uint64_t)m) { st = sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_PREFIX, at, (int64_t)pv); break; }
    if (!br_get_wide(&r, (int)(pv + 1) * b, &d)) { st = sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_CODE, at, i); break; }
    /* key = prev + 1 + d must stay < N (no wrap: compare before adding) */
    if (d >= (uint64_t)(N - (prev + 1))) {
      st = sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_INDEX_RANGE, at, (int64_t)(d > INT64_MAX ? INT64_MAX : d));
      break;
    }
    keys[i] = prev = prev + 1 + (int64_t)d;
  }
  skc_hf_table_free(&t);
  if (st) return st;
  if (r.pos != r.nbits) return sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_PADDING, p + head - 8, (int64_t)nbits);
  int64_t nbytes = (int64_t)((nbits + 7) / 8);
  if (nbits & 7) {
    uint8_t last = body[p + head + nbytes - 1];
    if (last & ((1u << (8 - (nbits & 7))) - 1))
      return sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_PADDING, p + head + nbytes - 1, last);
  }
  *pos = p + head + nbytes;
  return SC_OK;
}
