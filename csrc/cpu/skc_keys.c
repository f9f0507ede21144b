/* SKCompress: writing and reading the keys sections of a body. Layout:
 * sparsecomm/skcompress.h.
 *
 * Speed: a delta and its prefix go out as one code of up to 47 bits (32-bit keys) through
 * the 64-bit bit writer, from a table indexed by the delta's bit length; the reader takes
 * a delta's prefix and length from one table lookup on its window. The fast reader checks
 * what it can without a branch per key (a code that is no code, a key past N, the bit count)
 * and, when anything is wrong, the checked reader reads the section again to report the
 * first fault at its byte (it is also the reader of 64-bit keys). */
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

/* occur[L] = deltas of bit length L (1..64); keys strictly ascending. Four counters per
 * length: neighbouring deltas often share a length, and one counter would make each
 * increment wait for the last. */
static void delta_lengths(const int64_t* keys, int64_t n, int64_t occur[65]) {
  int64_t part[4][65];
  memset(part, 0, sizeof part);
  uint64_t prev = (uint64_t)-1;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    uint64_t k0 = (uint64_t)keys[i], k1 = (uint64_t)keys[i + 1], k2 = (uint64_t)keys[i + 2],
             k3 = (uint64_t)keys[i + 3];
    part[0][64 - __builtin_clzll((k0 - prev - 1) | 1)]++;
    part[1][64 - __builtin_clzll((k1 - k0 - 1) | 1)]++;
    part[2][64 - __builtin_clzll((k2 - k1 - 1) | 1)]++;
    part[3][64 - __builtin_clzll((k3 - k2 - 1) | 1)]++;
    prev = k3;
  }
  for (; i < n; i++) {
    uint64_t k = (uint64_t)keys[i];
    part[0][64 - __builtin_clzll((k - prev - 1) | 1)]++;
    prev = k;
  }
  for (int L = 0; L <= 64; L++) occur[L] = part[0][L] + part[1][L] + part[2][L] + part[3][L];
}

int64_t skc_write_delta_keys(const int64_t* keys, int64_t n, int64_t N, int64_t want_m,
                                int want_prefix, uint8_t* out, int64_t cap) {
  int W = key_width(N);
  int64_t occur[65];
  delta_lengths(keys, n, occur);
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
  /* per bit length L: the prefix code of its interval count, its length and the data bits */
  uint64_t pcode[65];
  int plen[65], dlen[65];
  int pbits = log2_small(m);
  for (int L = 1; L <= W; L++) { /* a delta has at most W bits */
    int c = (L + b - 1) / b;
    pcode[L] = best_scheme ? code[c - 1] : (uint64_t)(c - 1);
    plen[L] = best_scheme ? best_len[c - 1] : pbits;
    dlen[L] = c * b;
  }
  bit_writer w;
  bw_init(&w, out + head, cap - head);
  uint64_t prev = (uint64_t)-1;
  int64_t stream_bits = best_bits - (best_scheme ? 8 * m : 0);
  if (W == 32 && cap - head >= (stream_bits + 7) / 8 + 8) {
    /* prefix + data <= 15 + 32 bits: one put, with room for its 8-byte store */
    for (int64_t i = 0; i < n; i++) {
      uint64_t k = (uint64_t)keys[i], d = k - prev - 1;
      prev = k;
      int L = 64 - __builtin_clzll(d | 1);
      bw_put_fit(&w, (pcode[L] << dlen[L]) | d, plen[L] + dlen[L]);
    }
  } else {
    for (int64_t i = 0; i < n; i++) {
      uint64_t k = (uint64_t)keys[i], d = k - prev - 1;
      prev = k;
      int L = 64 - __builtin_clzll(d | 1);
      bw_put(&w, pcode[L], plen[L]);
      bw_put_wide(&w, d, dlen[L]);
    }
  }
  if (w.overflow) return -1;
  put_u64(out + head - 8, (uint64_t)bw_bits(&w));
  return head + bw_bytes(&w);
}

int64_t skc_write_raw_keys(const int64_t* keys, int64_t n, int64_t N, uint8_t* out, int64_t cap) {
  int64_t ks = raw_key_size(N);
  if (cap < n * ks) return -1;
  if (ks == 4)
    for (int64_t i = 0; i < n; i++) put_u32(out + 4 * i, (uint32_t)keys[i]);
  else
    memcpy(out, keys, (size_t)(n * 8));
  return n * ks;
}

/* Raw keys, one check per key: the first fault at its byte. */
static int read_raw_checked(const uint8_t* body, int64_t p, int64_t n, int64_t N, int64_t ks,
                            int64_t* keys, sc_error_info* err) {
  int64_t prev = -1;
  for (int64_t i = 0; i < n; i++) {
    int64_t k = ks == 4 ? (int64_t)get_u32(body + p + 4 * i) : (int64_t)get_u64(body + p + 8 * i);
    if (k < 0 || k >= N) return sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_INDEX_RANGE, p + ks * i, k);
    if (k <= prev) return sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_INDEX_ORDER, p + ks * i, k);
    keys[i] = prev = k;
  }
  return SC_OK;
}

static int read_raw(const uint8_t* body, int64_t p, int64_t n, int64_t N, int64_t ks, int64_t* keys,
                    sc_error_info* err) {
  if (ks == 8) return read_raw_checked(body, p, n, N, ks, keys, err);
  /* 32-bit keys (N < 2^31): ascending and the last < N, checked without a branch per key */
  const uint8_t* q = body + p;
  uint64_t bad = 0;
  int64_t prev = -1;
  for (int64_t i = 0; i < n; i++) {
    int64_t k = (int64_t)get_u32(q + 4 * i);
    bad |= (uint64_t)(k <= prev);
    keys[i] = prev = k;
  }
  if (bad || (n && prev >= N)) return read_raw_checked(body, p, n, N, ks, keys, err);
  return SC_OK;
}

/* Delta-binary keys with one check per code (any key width): the first fault at its byte. */
static int read_delta_checked(const uint8_t* body, int64_t p, int64_t head, int64_t n, int64_t N,
                              int64_t m, int scheme, const hf_table* t, int64_t nbits,
                              int64_t* keys, sc_error_info* err) {
  uint8_t tail[BR_TAIL];
  bit_reader r;
  br_init(&r, body + p + head, nbits, tail);
  int W = key_width(N), b = W / (int)m, pbits = log2_small(m);
  int64_t prev = -1;
  for (int64_t i = 0; i < n; i++) {
    int64_t at = p + head + (br_consumed(&r) >> 3);
    uint64_t pv;
    br_refill(&r);
    if (scheme) {
      int sym = t->e ? hf_read(&r, t) : -1;
      if (sym < 0 || br_consumed(&r) > nbits) return sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_CODE, at, i);
      pv = (uint64_t)sym;
    } else {
      pv = br_top(&r, pbits);
      br_skip(&r, pbits);
      if (br_consumed(&r) > nbits) return sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_CODE, at, i);
    }
    if (pv >= (uint64_t)m) return sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_PREFIX, at, (int64_t)pv);
    uint64_t d = br_get_wide(&r, (int)(pv + 1) * b);
    if (br_consumed(&r) > nbits) return sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_CODE, at, i);
    /* key = prev + 1 + d must stay < N (no wrap: compare before adding) */
    if (d >= (uint64_t)(N - (prev + 1)))
      return sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_INDEX_RANGE, at, (int64_t)(d > INT64_MAX ? INT64_MAX : d));
    keys[i] = prev = prev + 1 + (int64_t)d;
  }
  if (br_consumed(&r) != nbits)
    return sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_PADDING, p + head - 8, nbits);
  return SC_OK;
}

/* 32-bit keys: per code one table lookup gives the prefix length and the data length. */
static int read_delta_fast(const uint8_t* stream, int64_t nbits, int64_t n, int64_t N, int64_t m,
                           int scheme, const hf_table* t, int64_t* keys) {
  int b = 32 / (int)m, pbits = log2_small(m);
  int tb = scheme ? t->maxlen : pbits;
  /* entry: prefix length | data length << 4 (0: no code) */
  uint16_t small[16];
  uint16_t* tab = small;
  if (scheme) {
    tab = (uint16_t*)malloc(sizeof(uint16_t) << tb);
    if (!tab) return SC_ERR_NOMEM;
    for (int64_t e = 0; e < (1ll << tb); e++) {
      unsigned h = t->e[e];
      tab[e] = h ? (uint16_t)((h & 15) | ((((h >> 4) + 1) * (unsigned)b) << 4)) : 0;
    }
  } else {
    for (int pv = 0; pv < m; pv++) tab[pv] = (uint16_t)(pbits | (((pv + 1) * b) << 4));
  }
  uint8_t tail[BR_TAIL];
  bit_reader r;
  br_init(&r, stream, nbits, tail);
  uint64_t prev = (uint64_t)-1, bad = 0, un = (uint64_t)N;
  int64_t i = 0;
  for (; i < n; i++) {
    br_refill(&r);
    unsigned e = tab[br_top(&r, tb)];
    if (__builtin_expect(!e, 0)) break;
    int pl = (int)(e & 15), dl = (int)(e >> 4);
    uint64_t d = (r.w << pl) >> (64 - dl);
    br_skip(&r, pl + dl);
    uint64_t k = prev + 1 + d; /* < 2^33 while prev < N <= 2^32 */
    bad |= (uint64_t)(k >= un);
    keys[i] = (int64_t)k;
    prev = k;
  }
  if (scheme) free(tab);
  return i == n && !bad && br_consumed(&r) == nbits ? SC_OK : SC_ERR_MALFORMED;
}

int skc_read_keys(const uint8_t* body, int64_t len, int64_t* pos, int codec, int64_t n,
                     int64_t N, int64_t* keys, sc_error_info* err) {
  int64_t p = *pos;
  if (codec == SC_SKC_INDEX_RAW) {
    int64_t ks = raw_key_size(N);
    if (n > (len - p) / ks) return sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_SIZE, p, len);
    int st = read_raw(body, p, n, N, ks, keys, err);
    if (st) return st;
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
  hf_table t = {0, NULL};
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
  int st = SC_ERR_MALFORMED;
  if (key_width(N) == 32 && (!scheme || t.e))
    st = read_delta_fast(body + p + head, (int64_t)nbits, n, N, m, scheme, &t, keys);
  if (st == SC_ERR_MALFORMED)
    st = read_delta_checked(body, p, head, n, N, m, scheme, &t, (int64_t)nbits, keys, err);
  skc_hf_table_free(&t);
  if (st) return st;
  int64_t nbytes = (int64_t)((nbits + 7) / 8);
  if (nbits & 7) {
    uint8_t last = body[p + head + nbytes - 1];
    if (last & ((1u << (8 - (nbits & 7))) - 1))
      return sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_PADDING, p + head + nbytes - 1, last);
  }
  *pos = p + head + nbytes;
  return SC_OK;
}
