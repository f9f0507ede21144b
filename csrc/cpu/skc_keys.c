/* SKCompress: writing and reading the keys sections of a body. Layout:
 * sparsecomm/skcompress.h.
 *
 * Speed. A delta and its prefix go out as one code of up to 47 bits (32-bit keys) through
 * the 64-bit bit writer, from a table indexed by the delta's bit length, and two codes at
 * a time when two of the longest fit one 56-bit put. Reading is a chain from one code to
 * the next (a code's prefix gives its length, which gives the next code's position), so a
 * section of SKC_KEY_SPLIT or more keys is written as two streams, the first and the
 * second half of the keys, each starting from an absolute key: the reader follows both
 * chains at once. The fast reader checks what it can without a branch per key (a code
 * that is no code, a key past N, the bit counts) and, when anything is wrong, the checked
 * reader reads the section again to report the first fault at its byte (it is also the
 * reader of 64-bit keys). */
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

int skc_key_streams(int64_t n) { return n >= SKC_KEY_SPLIT ? 2 : 1; }

/* First key of stream s of k over n keys. */
static inline int64_t stream_start(int64_t n, int k, int s) { return s * (n / k); }

/* occur[L] += deltas of bit length L (1..64) among keys[0..n), the first taken from -1.
 * A key not above the one before (taken as unsigned) makes a delta of 2^63 or more: L = 64.
 * Four counters per length: neighbouring deltas often share a length, and one counter would
 * make each increment wait for the last. (63 - clz is the bit scan's own result: the tables
 * are indexed from L - 1.) */
static void delta_lengths(const int64_t* keys, int64_t n, int64_t occur[65]) {
  int64_t part[4][64];
  memset(part, 0, sizeof part);
  uint64_t prev = (uint64_t)-1;
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    uint64_t k0 = (uint64_t)keys[i], k1 = (uint64_t)keys[i + 1], k2 = (uint64_t)keys[i + 2],
             k3 = (uint64_t)keys[i + 3];
    part[0][63 - __builtin_clzll((k0 - prev - 1) | 1)]++;
    part[1][63 - __builtin_clzll((k1 - k0 - 1) | 1)]++;
    part[2][63 - __builtin_clzll((k2 - k1 - 1) | 1)]++;
    part[3][63 - __builtin_clzll((k3 - k2 - 1) | 1)]++;
    prev = k3;
  }
  for (; i < n; i++) {
    uint64_t k = (uint64_t)keys[i];
    part[0][63 - __builtin_clzll((k - prev - 1) | 1)]++;
    prev = k;
  }
  for (int L = 1; L <= 64; L++) occur[L] += part[0][L - 1] + part[1][L - 1] + part[2][L - 1] + part[3][L - 1];
}

/* Per delta bit length L: the code's prefix (above the data bits for 32-bit keys, alone for
 * 64-bit ones), its total length and its data length. */
typedef struct {
  uint64_t pre[65];
  int len[65];
  int data[65];
} code_table;

/* The keys[0..n) of one stream (the first from -1) into w; pairs when two codes fit a put. */
static void write_stream(const int64_t* keys, int64_t n, int W, const code_table* ct, int paired,
                         bit_writer* wp) {
  bit_writer w = *wp;
  const uint64_t* pre = ct->pre + 1; /* indexed by the bit scan, L - 1 */
  const int* len = ct->len + 1;
  uint64_t prev = (uint64_t)-1;
  int64_t i = 0;
  if (W == 32) {
    if (n) { /* the stream's first key: absolute, possibly long */
      uint64_t d = (uint64_t)keys[0];
      int L = 63 - __builtin_clzll(d | 1);
      bw_put_fit(&w, pre[L] | d, len[L]);
      prev = (uint64_t)keys[0];
      i = 1;
    }
    if (paired)
      for (; i + 2 <= n; i += 2) {
        uint64_t k0 = (uint64_t)keys[i], k1 = (uint64_t)keys[i + 1];
        uint64_t d0 = k0 - prev - 1, d1 = k1 - k0 - 1;
        prev = k1;
        int L0 = 63 - __builtin_clzll(d0 | 1), L1 = 63 - __builtin_clzll(d1 | 1);
        int l1 = len[L1];
        bw_put_fit(&w, ((pre[L0] | d0) << l1) | pre[L1] | d1, len[L0] + l1);
      }
    for (; i < n; i++) {
      uint64_t k = (uint64_t)keys[i], d = k - prev - 1;
      prev = k;
      int L = 63 - __builtin_clzll(d | 1);
      bw_put_fit(&w, pre[L] | d, len[L]);
    }
  } else { /* 64-bit keys: the prefix, then the data in up to two puts */
    for (; i < n; i++) {
      uint64_t k = (uint64_t)keys[i], d = k - prev - 1;
      prev = k;
      int L = 64 - __builtin_clzll(d | 1);
      bw_put_fit(&w, ct->pre[L], ct->len[L] - ct->data[L]);
      if (ct->data[L] > 32) {
        bw_put_fit(&w, d >> 32, ct->data[L] - 32);
        bw_put_fit(&w, d & 0xFFFFFFFFull, 32);
      } else {
        bw_put_fit(&w, d, ct->data[L]);
      }
    }
  }
  *wp = w;
}

int64_t skc_write_delta_keys(const int64_t* keys, int64_t n, int64_t N, int64_t want_m,
                                int want_prefix, uint8_t* out, int64_t cap) {
  int W = key_width(N), K = skc_key_streams(n);
  /* bit lengths of the deltas, per stream (each stream's first key from -1) */
  int64_t occ[2][65];
  memset(occ, 0, sizeof occ);
  for (int s = 0; s < K; s++) {
    int64_t a = stream_start(n, K, s), e = s + 1 < K ? stream_start(n, K, s + 1) : n;
    delta_lengths(keys + a, e - a, occ[s]);
  }
  int64_t occur[65];
  for (int L = 0; L <= 64; L++) occur[L] = occ[0][L] + occ[1][L];
  /* keys strictly ascending in [0, N): no delta of W + 1 bits or more (a step down is a delta
   * of 64 bits; a key past N, or a step from N - 1 up past it, one of more than W bits or a
   * last key >= N), and each stream after the first above the key before it */
  int bad = n && (keys[0] < 0 || keys[n - 1] >= N);
  for (int L = W + 1; L <= 64; L++) bad |= occur[L] != 0;
  for (int s = 1; s < K; s++) bad |= keys[stream_start(n, K, s)] <= keys[stream_start(n, K, s) - 1];
  if (bad) return -3;
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
  int64_t head = 2 + (best_scheme ? m : 0) + 8 * K;
  if (cap < head) return -1;
  out[0] = (uint8_t)m;
  out[1] = (uint8_t)best_scheme;
  if (best_scheme) memcpy(out + 2, best_len, (size_t)m);
  uint32_t code[16] = {0};
  if (best_scheme) skc_huffman_codes(best_len, (int)m, code);
  /* per bit length L (a delta has at most W bits): the prefix code above the c * b data
   * bits and the code's length */
  code_table ct;
  memset(&ct, 0, sizeof ct);
  int pbits = log2_small(m), longest = 0;
  for (int L = 1; L <= W; L++) {
    int c = (L + b - 1) / b;
    uint64_t pc = best_scheme ? code[c - 1] : (uint64_t)(c - 1);
    int pl = best_scheme ? best_len[c - 1] : pbits;
    ct.len[L] = pl + c * b;
    ct.data[L] = c * b;
    ct.pre[L] = W == 32 ? pc << (c * b) : pc;
  }
  /* bits per stream; the longest code of a key after a stream's first */
  int64_t bits[2] = {0, 0}, pos = head;
  for (int s = 0; s < K; s++) {
    for (int L = 1; L <= W; L++) bits[s] += occ[s][L] * ct.len[L];
    int64_t a = stream_start(n, K, s);
    if (a < n) {
      uint64_t d0 = (uint64_t)keys[a];
      int L0 = 64 - __builtin_clzll(d0 | 1);
      for (int L = 1; L <= W; L++)
        if ((occ[s][L] > (L == L0)) && ct.len[L] > longest) longest = ct.len[L];
    }
    put_u64(out + 2 + (best_scheme ? m : 0) + 8 * s, (uint64_t)bits[s]);
  }
  for (int s = 0; s < K; s++) {
    int64_t a = stream_start(n, K, s), e = s + 1 < K ? stream_start(n, K, s + 1) : n;
    int64_t bytes = (bits[s] + 7) / 8;
    bit_writer w;
    bw_init(&w, out + pos, cap - pos);
    if (cap - pos >= bytes + 8) {
      write_stream(keys + a, e - a, W, &ct, 2 * longest <= 56, &w);
    } else { /* no room for the 8-byte stores: code by code, inside the buffer */
      uint64_t prev = (uint64_t)-1;
      for (int64_t i = a; i < e; i++) {
        uint64_t k = (uint64_t)keys[i], d = k - prev - 1;
        prev = k;
        int L = 64 - __builtin_clzll(d | 1), data = ct.data[L];
        bw_put(&w, W == 32 ? ct.pre[L] >> data : ct.pre[L], ct.len[L] - data);
        bw_put_wide(&w, d, data);
      }
    }
    if (w.overflow || bw_bits(&w) != bits[s]) return -1;
    pos += bytes;
  }
  return pos;
}

int64_t skc_write_raw_keys(const int64_t* keys, int64_t n, int64_t N, uint8_t* out, int64_t cap) {
  int64_t ks = raw_key_size(N);
  uint64_t bad = n && (keys[0] < 0 || keys[n - 1] >= N);
  for (int64_t i = 1; i < n; i++) bad |= (uint64_t)(keys[i] <= keys[i - 1]);
  if (bad) return -3;
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

/* One delta-binary stream of n keys (the first from -1) with one check per code (any key
 * width): the first fault at its byte. prev_key: the last key of the stream before (-1). */
static int read_stream_checked(const uint8_t* body, int64_t at, int64_t nbits, int64_t bits_at, int64_t n,
                               int64_t N, int64_t m, int scheme, const hf_table* t, int64_t prev_key,
                               int64_t* keys, sc_error_info* err) {
  uint8_t tail[BR_TAIL];
  bit_reader r;
  br_init(&r, body + at, nbits, tail);
  int W = key_width(N), b = W / (int)m, pbits = log2_small(m);
  int64_t prev = -1;
  for (int64_t i = 0; i < n; i++) {
    int64_t pos = at + (br_consumed(&r) >> 3);
    uint64_t pv;
    br_refill(&r);
    if (scheme) {
      int sym = t->e ? hf_read(&r, t) : -1;
      if (sym < 0 || br_consumed(&r) > nbits) return sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_CODE, pos, i);
      pv = (uint64_t)sym;
    } else {
      pv = br_top(&r, pbits);
      br_skip(&r, pbits);
      if (br_consumed(&r) > nbits) return sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_CODE, pos, i);
    }
    if (pv >= (uint64_t)m) return sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_PREFIX, pos, (int64_t)pv);
    uint64_t d = br_get_wide(&r, (int)(pv + 1) * b);
    if (br_consumed(&r) > nbits) return sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_CODE, pos, i);
    /* key = prev + 1 + d must stay < N (no wrap: compare before adding) */
    if (d >= (uint64_t)(N - (prev + 1)))
      return sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_INDEX_RANGE, pos, (int64_t)(d > INT64_MAX ? INT64_MAX : d));
    keys[i] = prev = prev + 1 + (int64_t)d;
    if (i == 0 && prev <= prev_key) /* a stream's first key follows the stream before */
      return sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_INDEX_ORDER, pos, prev);
  }
  if (br_consumed(&r) != nbits) return sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_PADDING, bits_at, nbits);
  return SC_OK;
}

/* Decoding table of 32-bit keys: per the top tb bits, the code's total length (0: no code)
 * and its data length. */
typedef struct {
  int tb;
  int complete; /* every pattern of tb bits starts a code */
  uint8_t* total;
  uint8_t* data;
  uint8_t small[2][16];
} key_table;

static int key_table_build(key_table* kt, int64_t m, int scheme, const hf_table* t) {
  int b = 32 / (int)m, pbits = log2_small(m);
  kt->tb = scheme ? t->maxlen : pbits;
  kt->complete = 1;
  kt->total = kt->small[0];
  kt->data = kt->small[1];
  if (scheme) {
    kt->total = (uint8_t*)malloc((size_t)2 << kt->tb);
    if (!kt->total) return SC_ERR_NOMEM;
    kt->data = kt->total + ((size_t)1 << kt->tb);
    for (int64_t e = 0; e < (1ll << kt->tb); e++) {
      unsigned h = t->e[e];
      kt->data[e] = h ? (uint8_t)(((h >> 4) + 1) * (unsigned)b) : 0;
      kt->total[e] = h ? (uint8_t)((h & 15) + kt->data[e]) : 0;
      kt->complete &= h != 0;
    }
  } else {
    for (int pv = 0; pv < m; pv++) {
      kt->data[pv] = (uint8_t)((pv + 1) * b);
      kt->total[pv] = (uint8_t)(pbits + kt->data[pv]);
    }
  }
  return SC_OK;
}

static void key_table_free(key_table* kt) {
  if (kt->total != kt->small[0]) free(kt->total);
}

/* One code of a 32-bit key stream (at most 47 bits, below the 56 a refill leaves): the
 * key after *prev, which it becomes. With check, a pattern that is no code (only an
 * incomplete table, the one-symbol code, has them) and every key past N (un) are flagged in
 * *bad; without, the caller knows the table complete and checks the last key: keys grow by
 * at most 2^32 a code, so fewer than 2^31 codes cannot wrap and only the last can be past N.
 * Always inlined: check is a constant at each call, and the reader stays in registers. */
static inline __attribute__((always_inline)) int64_t key_step(bit_reader* r, const key_table* kt,
                                                              uint64_t* prev, uint64_t* bad,
                                                              uint64_t un, int check) {
  br_refill(r);
  unsigned x = (unsigned)br_top(r, kt->tb);
  int a = kt->total[x];
  uint64_t d = (r->w >> 1 >> (63 - a)) & ((1ull << kt->data[x]) - 1);
  br_skip(r, a);
  *prev = *prev + 1 + d;
  if (check) {
    *bad |= (uint64_t)(a == 0);
    *bad |= (uint64_t)(*prev >= un);
  }
  return (int64_t)*prev;
}

/* K streams read side by side into keys[0..n): the first from r0, the second (K == 2, from
 * key h on) from r1, each from -1. Returns the faults key_step flagged (with check). */
static inline __attribute__((always_inline)) uint64_t key_streams(bit_reader* r0, bit_reader* r1,
                                                                  const key_table* kt, int K, int64_t n,
                                                                  int64_t h, uint64_t un, int64_t* keys,
                                                                  int check) {
  uint64_t bad = 0, p0 = (uint64_t)-1, p1 = (uint64_t)-1;
  if (K == 1) {
    for (int64_t i = 0; i < n; i++) keys[i] = key_step(r0, kt, &p0, &bad, un, check);
  } else {
    int64_t i = 0;
    for (; i < h; i++) { /* the second stream holds h or h + 1 keys */
      keys[i] = key_step(r0, kt, &p0, &bad, un, check);
      keys[h + i] = key_step(r1, kt, &p1, &bad, un, check);
    }
    for (i = 2 * h; i < n; i++) keys[i] = key_step(r1, kt, &p1, &bad, un, check);
  }
  return bad;
}

/* 32-bit keys, K streams read side by side: SC_OK, or SC_ERR_MALFORMED for the checked
 * reader to place. */
static int read_streams_fast(const uint8_t* const* stream, const int64_t* nbits, int K, int64_t n,
                             int64_t N, const key_table* kt, int64_t* keys) {
  uint64_t bad = 0, un = (uint64_t)N;
  uint8_t tail0[BR_TAIL], tail1[BR_TAIL];
  bit_reader r0, r1;
  br_init(&r0, stream[0], nbits[0], tail0);
  br_init(&r1, stream[K - 1], nbits[K - 1], tail1);
  int64_t h = K == 1 ? 0 : stream_start(n, 2, 1);
  if (kt->complete && n < ((int64_t)1 << 31)) {
    bad = key_streams(&r0, &r1, kt, K, n, h, un, keys, 0);
    for (int s = 0; s < K; s++) { /* each stream's last key */
      int64_t last = s + 1 < K ? h - 1 : n - 1;
      if (last >= 0) bad |= (uint64_t)((uint64_t)keys[last] >= un);
    }
  } else {
    bad = key_streams(&r0, &r1, kt, K, n, h, un, keys, 1);
  }
  if (K == 2 && h && h < n) bad |= (uint64_t)(keys[h] <= keys[h - 1]);
  int ok = !bad && br_consumed(&r0) == nbits[0] && (K == 1 || br_consumed(&r1) == nbits[1]);
  return ok ? SC_OK : SC_ERR_MALFORMED;
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
  int K = skc_key_streams(n);
  int64_t table = 2 + (scheme ? m : 0), head = table + 8 * K;
  if (len - p < head) return sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_SIZE, p, len);
  /* the streams' bit counts: each inside the body, together too */
  int64_t nbits[2] = {0, 0}, at[2] = {0, 0}, end = p + head;
  for (int s = 0; s < K; s++) {
    uint64_t nb = get_u64(body + p + table + 8 * s);
    int64_t avail = len - end;
    if (nb > (uint64_t)avail * 8 || (int64_t)((nb + 7) / 8) > avail)
      return sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_SIZE, p + table + 8 * s, (int64_t)(nb > INT64_MAX ? INT64_MAX : nb));
    nbits[s] = (int64_t)nb;
    at[s] = end;
    end += (nbits[s] + 7) / 8;
  }
  hf_table t = {0, NULL};
  if (scheme) {
    int st = skc_hf_table_build(body + p + 2, (int)m, n == 0, p + 2, &t, err);
    if (st) return st;
  }
  int st = SC_ERR_MALFORMED, fast = key_width(N) == 32 && (!scheme || t.e);
  if (fast) {
    key_table kt;
    st = key_table_build(&kt, m, scheme, &t);
    if (!st) {
      const uint8_t* streams[2] = {body + at[0], body + at[1]};
      st = read_streams_fast(streams, nbits, K, n, N, &kt, keys);
      key_table_free(&kt);
    }
  }
  if (st == SC_ERR_MALFORMED) { /* 64-bit keys, or a fault to place */
    st = SC_OK;
    for (int s = 0; s < K && !st; s++) {
      int64_t a = stream_start(n, K, s), e = s + 1 < K ? stream_start(n, K, s + 1) : n;
      st = read_stream_checked(body, at[s], nbits[s], p + table + 8 * s, e - a, N, m, scheme, &t,
                               a ? keys[a - 1] : -1, keys + a, err);
    }
    /* the fast reader's faults are all the checked reader's */
    if (!st && fast) st = sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_CODE, p, 0);
  }
  skc_hf_table_free(&t);
  if (st) return st;
  for (int s = 0; s < K; s++)
    if (nbits[s] & 7) {
      int64_t last_at = at[s] + (nbits[s] + 7) / 8 - 1;
      uint8_t last = body[last_at];
      if (last & ((1u << (8 - (nbits[s] & 7))) - 1))
        return sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_PADDING, last_at, last);
    }
  *pos = end;
  return SC_OK;
}
