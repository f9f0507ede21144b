/* SKCompress: quantile sketch, sign-split quantile buckets, grouped MinMaxSketch,
 * canonical Huffman codes and delta-binary keys with adaptive prefix. The contract,
 * the hash and the byte layout are in sparsecomm/skcompress.h. Single-threaded: one
 * message is encoded per call and its cost is dominated by two passes over it. */
#include "sparsecomm/skcompress.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

/* ------------------------------------------------------------------ helpers */

static inline double load_value(sc_dtype vt, const void* p, int64_t i) {
  return vt == SC_F32 ? (double)((const float*)p)[i] : ((const double*)p)[i];
}

static inline void store_value(sc_dtype vt, void* p, int64_t i, double x) {
  if (vt == SC_F32)
    ((float*)p)[i] = (float)x;
  else
    ((double*)p)[i] = x;
}

static inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static inline uint64_t row_key(int64_t j) { return mix64(0x5C0DEull + (uint64_t)j); }

static inline int64_t cell_col(uint64_t rk, int64_t key, int64_t cols) {
  return (int64_t)(((mix64((uint64_t)key ^ rk) >> 32) * (uint64_t)cols) >> 32);
}

/* Ascending sort of doubles without NaN: LSD radix sort on order-preserving keys (sign bit
 * flipped for positives, all bits for negatives; -0.0 sorts before +0.0), 8-bit digits below
 * 2^15 elements and 16-bit digits above,
 * passes over constant digits skipped. Falls back to insertion sort for short arrays. */
static inline uint64_t order_key(double x) {
  uint64_t u;
  memcpy(&u, &x, 8);
  return (u >> 63) ? ~u : (u | 0x8000000000000000ull);
}

static inline double from_order_key(uint64_t k) {
  uint64_t u = (k >> 63) ? (k & 0x7FFFFFFFFFFFFFFFull) : ~k;
  double x;
  memcpy(&x, &u, 8);
  return x;
}

static int sort_doubles(double* a, int64_t n) {
  if (n < 64) {
    for (int64_t i = 1; i < n; i++) {
      double x = a[i];
      int64_t j = i - 1;
      while (j >= 0 && a[j] > x) { a[j + 1] = a[j]; j--; }
      a[j + 1] = x;
    }
    return SC_OK;
  }
  uint64_t* k = (uint64_t*)malloc(sizeof(uint64_t) * (size_t)n);
  uint64_t* tmp = (uint64_t*)malloc(sizeof(uint64_t) * (size_t)n);
  int64_t* count = (int64_t*)malloc(sizeof(int64_t) * 65536);
  if (!k || !tmp || !count) { free(k); free(tmp); free(count); return SC_ERR_NOMEM; }
  uint64_t all_or = 0, all_and = ~0ull;
  for (int64_t i = 0; i < n; i++) {
    k[i] = order_key(a[i]);
    all_or |= k[i];
    all_and &= k[i];
  }
  int bits = n < (1 << 15) ? 8 : 16;
  uint64_t mask = (1ull << bits) - 1;
  for (int shift = 0; shift < 64; shift += bits) {
    if ((((all_or ^ all_and) >> shift) & mask) == 0) continue; /* same digit everywhere */
    memset(count, 0, sizeof(int64_t) * (size_t)(mask + 1));
    for (int64_t i = 0; i < n; i++) count[(k[i] >> shift) & mask]++;
    int64_t sum = 0;
    for (uint64_t d = 0; d <= mask; d++) { int64_t c = count[d]; count[d] = sum; sum += c; }
    for (int64_t i = 0; i < n; i++) tmp[count[(k[i] >> shift) & mask]++] = k[i];
    uint64_t* t = k; k = tmp; tmp = t;
  }
  for (int64_t i = 0; i < n; i++) a[i] = from_order_key(k[i]);
  free(k); free(tmp); free(count);
  return SC_OK;
}

static inline void put_u16(uint8_t* p, uint16_t v) { memcpy(p, &v, 2); }
static inline void put_u32(uint8_t* p, uint32_t v) { memcpy(p, &v, 4); }
static inline void put_u64(uint8_t* p, uint64_t v) { memcpy(p, &v, 8); }
static inline uint16_t get_u16(const uint8_t* p) { uint16_t v; memcpy(&v, p, 2); return v; }
static inline uint32_t get_u32(const uint8_t* p) { uint32_t v; memcpy(&v, p, 4); return v; }
static inline uint64_t get_u64(const uint8_t* p) { uint64_t v; memcpy(&v, p, 8); return v; }

static inline int bit_length(uint64_t d) { return d ? 64 - __builtin_clzll(d) : 1; }

const char* sc_skc_field_name(int f) {
  static const char* names[] = {"size", "codec", "reserved", "params", "buckets",
                                "means", "lists", "code_table", "code", "padding",
                                "prefix", "index_range", "index_order", "cell", "count"};
  return (f >= 0 && f < (int)(sizeof names / sizeof names[0])) ? names[f] : "unknown";
}

/* ------------------------------------------------------------------ bit I/O */

typedef struct {
  uint8_t* p;
  int64_t cap;   /* bytes */
  int64_t nbytes;
  uint64_t acc;
  int nacc;
  int overflow;
} bit_writer;

/* n <= 32 bits of v, most significant first. */
static inline void bw_put(bit_writer* w, uint64_t v, int n) {
  if (n == 0) return;
  w->acc = (w->acc << n) | (v & ((1ull << n) - 1));
  w->nacc += n;
  while (w->nacc >= 8) {
    w->nacc -= 8;
    if (w->nbytes < w->cap)
      w->p[w->nbytes] = (uint8_t)(w->acc >> w->nacc);
    else
      w->overflow = 1;
    w->nbytes++;
  }
}

static inline void bw_put_wide(bit_writer* w, uint64_t v, int n) {
  if (n > 32) {
    bw_put(w, v >> 32, n - 32);
    bw_put(w, v & 0xFFFFFFFFull, 32);
  } else {
    bw_put(w, v, n);
  }
}

static inline void bw_flush(bit_writer* w) {
  if (w->nacc) bw_put(w, 0, 8 - w->nacc);
}

typedef struct {
  const uint8_t* p;
  int64_t nbits;
  int64_t pos;
} bit_reader;

/* n <= 32 bits at the current position, zeros past the end (callers check the count). */
static inline uint64_t br_peek(const bit_reader* r, int n) {
  int64_t byte = r->pos >> 3, nbytes = (r->nbits + 7) >> 3;
  int off = (int)(r->pos & 7);
  uint64_t w = 0;
  if (byte + 8 <= nbytes) {
    for (int i = 0; i < 8; i++) w = (w << 8) | r->p[byte + i];
  } else {
    for (int i = 0; i < 8; i++) w = (w << 8) | (byte + i < nbytes ? r->p[byte + i] : 0);
  }
  return (w << off) >> (64 - n);
}

static inline int br_get(bit_reader* r, int n, uint64_t* v) {
  if (n == 0) { *v = 0; return 1; }
  if (r->pos + n > r->nbits) return 0;
  *v = br_peek(r, n);
  r->pos += n;
  return 1;
}

static inline int br_get_wide(bit_reader* r, int n, uint64_t* v) {
  if (n > 32) {
    uint64_t hi, lo;
    if (!br_get(r, n - 32, &hi) || !br_get(r, 32, &lo)) return 0;
    *v = (hi << 32) | lo;
    return 1;
  }
  return br_get(r, n, v);
}

/* ------------------------------------------------------------------ Huffman */

typedef struct {
  uint64_t freq;
  int32_t sym;
} hf_leaf;

static int cmp_leaf(const void* a, const void* b) {
  const hf_leaf* x = (const hf_leaf*)a;
  const hf_leaf* y = (const hf_leaf*)b;
  if (x->freq != y->freq) return x->freq < y->freq ? -1 : 1;
  return (x->sym > y->sym) - (x->sym < y->sym);
}

/* Code lengths (<= 15) for freq[0..nsym); unused symbols get 0, a single used symbol 1. */
static int huffman_lengths(const uint64_t* freq_in, int nsym, uint8_t* len) {
  memset(len, 0, (size_t)nsym);
  int used = 0;
  for (int i = 0; i < nsym; i++) used += freq_in[i] != 0;
  if (used == 0) return SC_OK;
  if (used == 1) {
    for (int i = 0; i < nsym; i++)
      if (freq_in[i]) len[i] = 1;
    return SC_OK;
  }
  hf_leaf* leaves = (hf_leaf*)malloc(sizeof(hf_leaf) * (size_t)used);
  /* nodes: leaves 0..used-1, internal used..2used-2; parent links and weights */
  uint64_t* w = (uint64_t*)malloc(sizeof(uint64_t) * (size_t)(2 * used));
  int32_t* parent = (int32_t*)malloc(sizeof(int32_t) * (size_t)(2 * used));
  uint64_t* freq = (uint64_t*)malloc(sizeof(uint64_t) * (size_t)nsym);
  if (!leaves || !w || !parent || !freq) {
    free(leaves); free(w); free(parent); free(freq);
    return SC_ERR_NOMEM;
  }
  memcpy(freq, freq_in, sizeof(uint64_t) * (size_t)nsym);
  for (;;) {
    int u = 0;
    for (int i = 0; i < nsym; i++)
      if (freq[i]) { leaves[u].freq = freq[i]; leaves[u].sym = i; u++; }
    qsort(leaves, (size_t)used, sizeof(hf_leaf), cmp_leaf);
    for (int i = 0; i < used; i++) w[i] = leaves[i].freq;
    /* two queues: leaves in order, internal nodes in creation order (also sorted) */
    int lq = 0, iq = used, next = used;
    while (next < 2 * used - 1) {
      int pick[2];
      for (int c = 0; c < 2; c++) {
        if (lq < used && (iq >= next || w[lq] <= w[iq]))
          pick[c] = lq++;
        else
          pick[c] = iq++;
      }
      w[next] = w[pick[0]] + w[pick[1]];
      parent[pick[0]] = parent[pick[1]] = next;
      next++;
    }
    int maxlen = 0, root = 2 * used - 2;
    for (int i = 0; i < used; i++) {
      int d = 0;
      for (int x = i; x != root; x = parent[x]) d++;
      len[leaves[i].sym] = (uint8_t)(d > 255 ? 255 : d);
      if (d > maxlen) maxlen = d;
    }
    if (maxlen <= SC_SKC_MAX_CODE_LEN) break;
    for (int i = 0; i < nsym; i++)
      if (freq[i]) freq[i] = (freq[i] >> 1) | 1; /* flatten and rebuild */
  }
  free(leaves); free(w); free(parent); free(freq);
  return SC_OK;
}

/* Canonical codes from lengths (order: length, then symbol). */
static void huffman_codes(const uint8_t* len, int nsym, uint32_t* code) {
  int count[SC_SKC_MAX_CODE_LEN + 2] = {0};
  uint32_t next[SC_SKC_MAX_CODE_LEN + 2] = {0};
  for (int i = 0; i < nsym; i++) count[len[i]]++;
  count[0] = 0;
  uint32_t c = 0;
  for (int l = 1; l <= SC_SKC_MAX_CODE_LEN; l++) {
    c = (c + (uint32_t)count[l - 1]) << 1;
    next[l] = c;
  }
  for (int i = 0; i < nsym; i++)
    if (len[i]) code[i] = next[len[i]]++;
}

/* Decoding table: 2^maxlen entries (symbol, length); length 0 = no code. */
typedef struct {
  int maxlen;
  uint16_t* sym;
  uint8_t* len;
} hf_table;

/* Validates the lengths (<= 15; complete code, or exactly one symbol of length 1);
 * returns SC_OK, SC_ERR_MALFORMED (err filled at byte offset pos) or SC_ERR_NOMEM. */
static int hf_table_build(const uint8_t* len, int nsym, int allow_empty, int64_t pos,
                          hf_table* t, sc_error_info* err) {
  t->maxlen = 0;
  t->sym = NULL;
  t->len = NULL;
  uint64_t kraft = 0;
  int used = 0;
  for (int i = 0; i < nsym; i++) {
    if (len[i] > SC_SKC_MAX_CODE_LEN)
      return sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_CODE_TABLE, pos + i, len[i]);
    if (len[i]) {
      used++;
      kraft += 1ull << (SC_SKC_MAX_CODE_LEN - len[i]);
      if (len[i] > t->maxlen) t->maxlen = len[i];
    }
  }
  if (used == 0) {
    if (allow_empty) return SC_OK;
    return sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_CODE_TABLE, pos, 0);
  }
  int ok = kraft == (1ull << SC_SKC_MAX_CODE_LEN) || (used == 1 && t->maxlen == 1);
  if (!ok) return sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_CODE_TABLE, pos, (int64_t)kraft);
  size_t size = (size_t)1 << t->maxlen;
  t->sym = (uint16_t*)calloc(size, sizeof(uint16_t));
  t->len = (uint8_t*)calloc(size, 1);
  if (!t->sym || !t->len) {
    free(t->sym); free(t->len);
    t->sym = NULL; t->len = NULL;
    return SC_ERR_NOMEM;
  }
  uint32_t* code = (uint32_t*)malloc(sizeof(uint32_t) * (size_t)nsym);
  if (!code) {
    free(t->sym); free(t->len);
    t->sym = NULL; t->len = NULL;
    return SC_ERR_NOMEM;
  }
  huffman_codes(len, nsym, code);
  for (int i = 0; i < nsym; i++) {
    if (!len[i]) continue;
    int shift = t->maxlen - len[i];
    size_t first = (size_t)code[i] << shift, n = (size_t)1 << shift;
    for (size_t e = 0; e < n; e++) {
      t->sym[first + e] = (uint16_t)i;
      t->len[first + e] = len[i];
    }
  }
  free(code);
  return SC_OK;
}

static void hf_table_free(hf_table* t) {
  free(t->sym);
  free(t->len);
}

/* One symbol; 0 when the bits are no code or the stream ends inside it. */
static inline int hf_read(bit_reader* r, const hf_table* t, uint32_t* sym) {
  uint64_t e = br_peek(r, t->maxlen);
  int l = t->len[e];
  if (!l || r->pos + l > r->nbits) return 0;
  r->pos += l;
  *sym = t->sym[e];
  return 1;
}

/* ------------------------------------------------------------------ quantile sketch */

struct sc_qsketch {
  int64_t k;
  int64_t n;
  int nlevels;
  int64_t size[64];
  int64_t flips[64]; /* compactions done per level: the parity picks the kept offset */
  double* items[64];
};

sc_qsketch* sc_qsketch_new(int64_t k) {
  if (k < 2 || (k & 1) || k > (1ll << 30)) return NULL;
  sc_qsketch* s = (sc_qsketch*)calloc(1, sizeof(sc_qsketch));
  if (!s) return NULL;
  s->k = k;
  return s;
}

void sc_qsketch_free(sc_qsketch* s) {
  if (!s) return;
  for (int h = 0; h < 64; h++) free(s->items[h]);
  free(s);
}

static int level_alloc(sc_qsketch* s, int h) {
  if (h >= 64) return SC_ERR_NOMEM;
  if (!s->items[h]) {
    /* a level may hold up to 2k - 1 items between compactions during a merge */
    s->items[h] = (double*)malloc(sizeof(double) * (size_t)(2 * s->k));
    if (!s->items[h]) return SC_ERR_NOMEM;
  }
  if (h >= s->nlevels) s->nlevels = h + 1;
  return SC_OK;
}

/* Compact every level holding >= k items, bottom up. */
static int compact(sc_qsketch* s) {
  for (int h = 0; h < s->nlevels; h++) {
    while (s->size[h] >= s->k) {
      int st = level_alloc(s, h + 1);
      if (st) return st;
      double* it = s->items[h];
      int64_t k = s->k;
      int sst = sort_doubles(it, k);
      if (sst) return sst;
      int64_t off = s->flips[h]++ & 1;
      double* up = s->items[h + 1];
      for (int64_t i = off; i < k; i += 2) up[s->size[h + 1]++] = it[i];
      /* items beyond the first k stay at this level */
      memmove(it, it + k, sizeof(double) * (size_t)(s->size[h] - k));
      s->size[h] -= k;
    }
  }
  return SC_OK;
}

int sc_qsketch_update(sc_qsketch* s, double x, sc_error_info* err) {
  if (x != x) return sc_fail(err, SC_ERR_NAN, 0, s->n, 0);
  int st = level_alloc(s, 0);
  if (st) return st;
  s->items[0][s->size[0]++] = x;
  s->n++;
  return s->size[0] >= s->k ? compact(s) : SC_OK;
}

int sc_qsketch_merge(sc_qsketch* dst, const sc_qsketch* src, sc_error_info* err) {
  if (dst->k != src->k) return sc_fail(err, SC_ERR_ARG, 1, 0, src->k);
  for (int h = 0; h < src->nlevels; h++) {
    int64_t i = 0;
    while (i < src->size[h]) {
      int st = level_alloc(dst, h);
      if (st) return st;
      /* copy in chunks that keep the level below 2k, compacting between them */
      int64_t room = 2 * dst->k - 1 - dst->size[h];
      int64_t take = src->size[h] - i < room ? src->size[h] - i : room;
      memcpy(dst->items[h] + dst->size[h], src->items[h] + i, sizeof(double) * (size_t)take);
      dst->size[h] += take;
      i += take;
      st = compact(dst);
      if (st) return st;
    }
  }
  dst->n += src->n;
  return SC_OK;
}

int64_t sc_qsketch_count(const sc_qsketch* s) { return s->n; }
int64_t sc_qsketch_levels(const sc_qsketch* s) {
  int64_t l = 0;
  for (int h = 0; h < s->nlevels; h++)
    if (s->size[h]) l = h + 1;
  return l;
}

typedef struct {
  double x;
  int64_t w;
} wx;

static int cmp_wx(const void* a, const void* b) {
  double x = ((const wx*)a)->x, y = ((const wx*)b)->x;
  return (x > y) - (x < y);
}

int sc_qsketch_quantiles(const sc_qsketch* s, int64_t nq, double* out, sc_error_info* err) {
  if (s->n < 1 || nq < 1) return sc_fail(err, SC_ERR_ARG, 0, 0, s->n);
  int64_t m = 0;
  for (int h = 0; h < s->nlevels; h++) m += s->size[h];
  wx* all = (wx*)malloc(sizeof(wx) * (size_t)m);
  if (!all) return SC_ERR_NOMEM;
  int64_t p = 0;
  for (int h = 0; h < s->nlevels; h++)
    for (int64_t i = 0; i < s->size[h]; i++) {
      all[p].x = s->items[h][i];
      all[p].w = (int64_t)1 << h;
      p++;
    }
  qsort(all, (size_t)m, sizeof(wx), cmp_wx);
  int64_t cum = 0, i = 0;
  for (int64_t j = 0; j < nq; j++) {
    int64_t target = (int64_t)(((__int128)j * s->n) / nq); /* want cumulative weight > target */
    while (i < m - 1 && cum + all[i].w <= target) cum += all[i++].w;
    out[j] = all[i].x;
  }
  free(all);
  return SC_OK;
}

/* ------------------------------------------------------------------ quantiles and buckets */

/* Quantiles of the doubles a[0..n) (n >= 1) at floor(j n / nq), j < nq; a may be reordered. */
static int quantiles_of(double* a, int64_t n, int64_t nq, int64_t exact_max, double* out) {
  if (n <= exact_max) {
    int st = sort_doubles(a, n);
    if (st) return st;
    for (int64_t j = 0; j < nq; j++) out[j] = a[(int64_t)(((__int128)j * n) / nq)];
    return SC_OK;
  }
  sc_qsketch* s = sc_qsketch_new(SC_SKC_SKETCH_K);
  if (!s) return SC_ERR_NOMEM;
  int st = SC_OK;
  for (int64_t i = 0; i < n && !st; i++) st = sc_qsketch_update(s, a[i], NULL);
  if (!st) st = sc_qsketch_quantiles(s, nq, out, NULL);
  sc_qsketch_free(s);
  return st;
}

int sc_skc_quantiles(sc_dtype vt, const void* x, int64_t n, int64_t nq, int64_t exact_max,
                     double* out, sc_error_info* err) {
  if (vt != SC_F32 && vt != SC_F64) return sc_fail(err, SC_ERR_ARG, 0, 0, vt);
  if (n < 1) return sc_fail(err, SC_ERR_ARG, 1, 0, n);
  if (nq < 1) return sc_fail(err, SC_ERR_ARG, 2, 0, nq);
  double* a = (double*)malloc(sizeof(double) * (size_t)n);
  if (!a) return SC_ERR_NOMEM;
  double mx = -INFINITY;
  for (int64_t i = 0; i < n; i++) {
    a[i] = load_value(vt, x, i);
    if (a[i] != a[i]) { free(a); return sc_fail(err, SC_ERR_NAN, 0, i, 0); }
    if (a[i] > mx) mx = a[i];
  }
  int st = quantiles_of(a, n, nq, exact_max, out);
  out[nq] = mx;
  free(a);
  return st;
}

/* Splits of one sign: mags[0..n) (reordered), nb = min(B, n), splits[0..nb]. */
static int sign_splits(double* mags, int64_t n, int64_t B, int64_t exact_max, double* splits,
                       int64_t* nb_out) {
  if (n == 0) { *nb_out = 0; return SC_OK; }
  double mn = INFINITY, mx = -INFINITY;
  for (int64_t i = 0; i < n; i++) {
    if (mags[i] < mn) mn = mags[i];
    if (mags[i] > mx) mx = mags[i];
  }
  int64_t nb = n < B ? n : B;
  int st = quantiles_of(mags, n, nb, exact_max, splits);
  if (st) return st;
  splits[0] = mn;
  splits[nb] = mx;
  for (int64_t j = 1; j < nb; j++) { /* keep them ordered and inside [min, max] */
    if (splits[j] < splits[j - 1]) splits[j] = splits[j - 1];
    if (splits[j] > mx) splits[j] = mx;
  }
  *nb_out = nb;
  return SC_OK;
}

static inline int32_t bucket_of(const double* splits, int64_t nb, double a) {
  /* #{j in 1..nb-1 : splits[j] <= a} */
  int64_t lo = 1, hi = nb; /* search in [lo, hi) */
  while (lo < hi) {
    int64_t mid = (lo + hi) >> 1;
    if (splits[mid] <= a) lo = mid + 1; else hi = mid;
  }
  return (int32_t)(lo - 1);
}

typedef struct {
  int64_t n[2];
  int64_t nb[2];
  double* splits[2]; /* B + 1 each */
} quantized;

/* Quantify v: bucket[i] (magnitude bucket), splits and nb per sign. */
static int quantify(sc_dtype vt, const void* v, int64_t n, int64_t B, int64_t exact_max,
                    int32_t* bucket, quantized* qz, sc_error_info* err) {
  qz->n[0] = qz->n[1] = 0;
  for (int64_t i = 0; i < n; i++) {
    double x = load_value(vt, v, i);
    if (!isfinite(x)) return sc_fail(err, SC_ERR_NAN, 1, i, 0);
    qz->n[x >= 0]++;
  }
  double* mags[2];
  mags[0] = (double*)malloc(sizeof(double) * (size_t)(qz->n[0] + 1));
  mags[1] = (double*)malloc(sizeof(double) * (size_t)(qz->n[1] + 1));
  if (!mags[0] || !mags[1]) { free(mags[0]); free(mags[1]); return SC_ERR_NOMEM; }
  int64_t c[2] = {0, 0};
  for (int64_t i = 0; i < n; i++) {
    double x = load_value(vt, v, i);
    int sg = x >= 0;
    mags[sg][c[sg]++] = fabs(x);
  }
  int st = SC_OK;
  for (int sg = 0; sg < 2 && !st; sg++)
    st = sign_splits(mags[sg], qz->n[sg], B, exact_max, qz->splits[sg], &qz->nb[sg]);
  free(mags[0]);
  free(mags[1]);
  if (st) return st;
  for (int64_t i = 0; i < n; i++) {
    double x = load_value(vt, v, i);
    int sg = x >= 0;
    bucket[i] = bucket_of(qz->splits[sg], qz->nb[sg], fabs(x));
  }
  return SC_OK;
}

int sc_skc_quantize(sc_dtype vt, const void* v, int64_t n, int64_t q, int64_t exact_max,
                    int32_t* bucket, double* splits, int64_t* used, sc_error_info* err) {
  if (vt != SC_F32 && vt != SC_F64) return sc_fail(err, SC_ERR_ARG, 0, 0, vt);
  if (q < 2 || q > SC_SKC_MAX_Q || (q & 1)) return sc_fail(err, SC_ERR_ARG, 1, 0, q);
  if (n < 0) return sc_fail(err, SC_ERR_ARG, 2, 0, n);
  int64_t B = q / 2;
  memset(splits, 0, sizeof(double) * (size_t)(2 * (B + 1)));
  quantized qz;
  qz.splits[0] = splits;
  qz.splits[1] = splits + B + 1;
  int st = quantify(vt, v, n, B, exact_max, bucket, &qz, err);
  if (st) return st;
  used[0] = qz.nb[0];
  used[1] = qz.nb[1];
  return SC_OK;
}

/* ------------------------------------------------------------------ keys */

static int key_width(int64_t N) { return N <= (1ll << 32) ? 32 : 64; }

static const int64_t M_CHOICES[4] = {2, 4, 8, 16};

static inline int log2_small(int64_t m) { return m == 2 ? 1 : m == 4 ? 2 : m == 8 ? 3 : 4; }

/* Bytes of a raw keys section. */
static inline int64_t raw_key_size(int64_t N) { return N < (1ll << 31) ? 4 : 8; }

/* Choose m and the prefix scheme for the deltas of keys[0..n) and write the delta-binary
 * section at out (cap bytes); returns bytes written or -1 when cap is too small. */
static int64_t write_delta_keys(const int64_t* keys, int64_t n, int64_t N, int64_t want_m,
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
        if (huffman_lengths(freq, (int)m, len)) return -2;
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
  if (best_scheme) huffman_codes(best_len, (int)m, code);
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

static int64_t write_raw_keys(const int64_t* keys, int64_t n, int64_t N, uint8_t* out, int64_t cap) {
  int64_t ks = raw_key_size(N);
  if (cap < n * ks) return -1;
  for (int64_t i = 0; i < n; i++) {
    if (ks == 4) put_u32(out + 4 * i, (uint32_t)keys[i]);
    else put_u64(out + 8 * i, (uint64_t)keys[i]);
  }
  return n * ks;
}

/* Read a keys section of n keys at body[*pos..len); keys strictly ascending, < N. */
static int read_keys(const uint8_t* body, int64_t len, int64_t* pos, int codec, int64_t n,
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
    int st = hf_table_build(body + p + 2, (int)m, n == 0, p + 2, &t, err);
    if (st) return st;
  }
  uint64_t nbits = get_u64(body + p + head - 8);
  int64_t avail = len - p - head;
  if (nbits > (uint64_t)avail * 8 || (int64_t)((nbits + 7) / 8) > avail) {
    hf_table_free(&t);
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
  hf_table_free(&t);
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

/* ------------------------------------------------------------------ options */

int sc_skc_check_options(const sc_skc_options* o, sc_error_info* err) {
  if (o->index_codec != SC_SKC_INDEX_RAW && o->index_codec != SC_SKC_INDEX_DELTA)
    return sc_fail(err, SC_ERR_ARG, 6, 0, o->index_codec);
  if (o->value_codec != SC_SKC_VALUE_RAW && o->value_codec != SC_SKC_VALUE_SKETCH)
    return sc_fail(err, SC_ERR_ARG, 6, 1, o->value_codec);
  if (o->m != 0 && o->m != 2 && o->m != 4 && o->m != 8 && o->m != 16)
    return sc_fail(err, SC_ERR_ARG, 4, 0, o->m);
  if (o->prefix < SC_SKC_PREFIX_AUTO || o->prefix > SC_SKC_PREFIX_HUFFMAN)
    return sc_fail(err, SC_ERR_ARG, 5, 0, o->prefix);
  if (o->value_codec == SC_SKC_VALUE_SKETCH) {
    if (o->q < 2 || o->q > SC_SKC_MAX_Q || (o->q & 1)) return sc_fail(err, SC_ERR_ARG, 0, 0, o->q);
    if (o->s < 1 || o->s > SC_SKC_MAX_ROWS) return sc_fail(err, SC_ERR_ARG, 1, 0, o->s);
    if (!(o->t > 0 && o->t <= SC_SKC_MAX_T)) return sc_fail(err, SC_ERR_ARG, 2, 0, 0);
    if (o->r < 1 || o->r > o->q / 2 || o->r > 255) return sc_fail(err, SC_ERR_ARG, 3, 0, o->r);
    if (o->exact_max < 0) return sc_fail(err, SC_ERR_ARG, 7, 0, o->exact_max);
  }
  return SC_OK;
}

/* ------------------------------------------------------------------ encode */

int64_t sc_skc_encode_bound(const sc_skc_options* o, int64_t N, sc_dtype vt, int64_t n) {
  int64_t vs = (int64_t)sc_dtype_size(vt);
  int64_t key_sec = 2 + 16 + 8 + n * 11 + 8; /* 64-bit delta + 15-bit prefix < 11 bytes */
  int64_t raw = n * raw_key_size(N);
  if (raw > key_sec) key_sec = raw;
  if (o->value_codec == SC_SKC_VALUE_RAW) return SC_SKC_BODY_HEAD + key_sec + n * vs + 8;
  int64_t B = o->q / 2, r = o->r, lists = 2 * r;
  int64_t cols = (int64_t)ceil(o->t * (double)n) + lists;
  int64_t cells = o->s * cols;
  return SC_SKC_BODY_HEAD + 16 + 2 * B * vs + lists * 8 + B + 8 + cells * 2 + 8 +
         lists * (2 + 16 + 8 + 8) + key_sec;
}

int sc_skc_encode(const sc_skc_options* o, int64_t N, const int64_t* idx, sc_dtype vt,
                  const void* val, int64_t n, uint8_t* out, int64_t cap, int64_t* out_len,
                  sc_error_info* err) {
  int st = sc_skc_check_options(o, err);
  if (st) return st;
  if (vt != SC_F32 && vt != SC_F64) return sc_fail(err, SC_ERR_ARG, 9, 0, vt);
  if (N < 0 || n < 0 || n > N) return sc_fail(err, SC_ERR_ARG, 10, n, N);
  for (int64_t i = 0; i < n; i++) {
    if (idx[i] < 0 || idx[i] >= N) return sc_fail(err, SC_ERR_INDEX_RANGE, 0, i, idx[i]);
    if (i && idx[i] <= idx[i - 1]) return sc_fail(err, SC_ERR_INDEX_ORDER, 0, i, idx[i]);
  }
  if (cap < SC_SKC_BODY_HEAD) return sc_fail(err, SC_ERR_ARG, 8, 0, cap);
  int64_t vs = (int64_t)sc_dtype_size(vt);
  memset(out, 0, SC_SKC_BODY_HEAD);
  out[0] = (uint8_t)o->index_codec;
  out[1] = (uint8_t)o->value_codec;
  int64_t pos = SC_SKC_BODY_HEAD;
  if (o->value_codec == SC_SKC_VALUE_RAW) {
    int64_t w = o->index_codec == SC_SKC_INDEX_DELTA
                    ? write_delta_keys(idx, n, N, o->m, o->prefix, out + pos, cap - pos)
                    : write_raw_keys(idx, n, N, out + pos, cap - pos);
    if (w == -2) return SC_ERR_NOMEM;
    if (w < 0 || cap - pos - w < n * vs) return sc_fail(err, SC_ERR_ARG, 8, 0, cap);
    pos += w;
    if (n) memcpy(out + pos, val, (size_t)(n * vs));
    *out_len = pos + n * vs;
    return SC_OK;
  }

  int64_t B = o->q / 2, r = o->r, G = (B + r - 1) / r, lists = 2 * r, s = o->s;
  int32_t* bucket = (int32_t*)malloc(sizeof(int32_t) * (size_t)(n + 1));
  double* splits = (double*)malloc(sizeof(double) * (size_t)(2 * (B + 1)));
  int64_t* lidx = (int64_t*)malloc(sizeof(int64_t) * (size_t)(n + 1)); /* keys grouped by list */
  int32_t* loff = (int32_t*)malloc(sizeof(int32_t) * (size_t)(n + 1)); /* offset in group */
  int64_t* lstart = (int64_t*)calloc((size_t)(lists + 1), sizeof(int64_t));
  int64_t* lcols = (int64_t*)calloc((size_t)(lists + 1), sizeof(int64_t));
  int64_t* cstart = (int64_t*)calloc((size_t)(lists + 1), sizeof(int64_t));
  uint16_t* cells = NULL;
  st = SC_OK;
  if (!bucket || !splits || !lidx || !loff || !lstart || !lcols || !cstart) { st = SC_ERR_NOMEM; goto done; }
  quantized qz;
  qz.splits[0] = splits;
  qz.splits[1] = splits + B + 1;
  st = quantify(vt, val, n, B, o->exact_max, bucket, &qz, err);
  if (st) goto done;
  /* counting sort of the entries by list, keeping key order inside a list */
  for (int64_t i = 0; i < n; i++) {
    int sg = load_value(vt, val, i) >= 0;
    lstart[sg * r + bucket[i] / G + 1]++;
  }
  for (int64_t l = 0; l < lists; l++) lstart[l + 1] += lstart[l];
  {
    int64_t* fill = (int64_t*)malloc(sizeof(int64_t) * (size_t)lists);
    if (!fill) { st = SC_ERR_NOMEM; goto done; }
    memcpy(fill, lstart, sizeof(int64_t) * (size_t)lists);
    for (int64_t i = 0; i < n; i++) {
      int sg = load_value(vt, val, i) >= 0;
      int64_t l = sg * r + bucket[i] / G;
      lidx[fill[l]] = idx[i];
      loff[fill[l]] = (int32_t)(bucket[i] % G);
      fill[l]++;
    }
    free(fill);
  }
  int64_t total_cells = 0;
  for (int64_t l = 0; l < lists; l++) {
    int64_t nl = lstart[l + 1] - lstart[l];
    int64_t c = nl ? (int64_t)ceil(o->t * (double)nl) : 0;
    if (nl && c < 1) c = 1;
    lcols[l] = c;
    cstart[l] = total_cells;
    total_cells += s * c;
  }
  cells = (uint16_t*)malloc(sizeof(uint16_t) * (size_t)(total_cells + 1));
  if (!cells) { st = SC_ERR_NOMEM; goto done; }
  for (int64_t c = 0; c < total_cells; c++) cells[c] = 0xFFFF;
  for (int64_t l = 0; l < lists; l++) {
    int64_t cols = lcols[l];
    uint16_t* tab = cells + cstart[l];
    for (int64_t j = 0; j < s; j++) {
      uint64_t rk = row_key(j);
      uint16_t* row = tab + j * cols;
      for (int64_t e = lstart[l]; e < lstart[l + 1]; e++) {
        int64_t c = cell_col(rk, lidx[e], cols);
        if (loff[e] < row[c]) row[c] = (uint16_t)loff[e]; /* Min on insert */
      }
    }
  }
  uint64_t* freq = (uint64_t*)calloc((size_t)G, sizeof(uint64_t));
  uint8_t* clen = (uint8_t*)calloc((size_t)G, 1);
  uint32_t* code = (uint32_t*)calloc((size_t)G, sizeof(uint32_t));
  if (!freq || !clen || !code) { free(freq); free(clen); free(code); st = SC_ERR_NOMEM; goto done; }
  for (int64_t c = 0; c < total_cells; c++) {
    if (cells[c] == 0xFFFF) cells[c] = 0; /* a cell no key reaches: never queried */
    freq[cells[c]]++;
  }
  st = huffman_lengths(freq, (int)G, clen);
  if (!st) huffman_codes(clen, (int)G, code);
  free(freq);
  if (st) { free(clen); free(code); goto done; }
  {
    int64_t need = 16 + 2 * B * vs + lists * 8 + G + 8;
    if (cap - pos < need) { free(clen); free(code); st = sc_fail(err, SC_ERR_ARG, 8, 0, cap); goto done; }
    uint8_t* p = out + pos;
    put_u32(p, (uint32_t)B);
    put_u16(p + 4, (uint16_t)G);
    p[6] = (uint8_t)s;
    p[7] = (uint8_t)r;
    put_u32(p + 8, (uint32_t)qz.nb[0]);
    put_u32(p + 12, (uint32_t)qz.nb[1]);
    p += 16;
    for (int sg = 0; sg < 2; sg++)
      for (int64_t b = 0; b < qz.nb[sg]; b++) {
        /* a + (b - a) / 2: inside [a, b] after rounding, also for subnormals */
        double mean = qz.splits[sg][b] + (qz.splits[sg][b + 1] - qz.splits[sg][b]) * 0.5;
        if (vt == SC_F32) { float f = (float)mean; memcpy(p, &f, 4); }
        else memcpy(p, &mean, 8);
        p += vs;
      }
    for (int64_t l = 0; l < lists; l++) {
      put_u32(p, (uint32_t)(lstart[l + 1] - lstart[l]));
      put_u32(p + 4, (uint32_t)lcols[l]);
      p += 8;
    }
    memcpy(p, clen, (size_t)G);
    p += G;
    pos = p - out;
    bit_writer w = {out + pos + 8, cap - pos - 8, 0, 0, 0, 0};
    for (int64_t c = 0; c < total_cells; c++) bw_put(&w, code[cells[c]], clen[cells[c]]);
    int64_t bits = w.nbytes * 8 + w.nacc;
    bw_flush(&w);
    free(clen);
    free(code);
    if (w.overflow || cap - pos < 8) { st = sc_fail(err, SC_ERR_ARG, 8, 0, cap); goto done; }
    put_u64(out + pos, (uint64_t)bits);
    pos += 8 + w.nbytes;
  }
  for (int64_t l = 0; l < lists; l++) {
    int64_t nl = lstart[l + 1] - lstart[l];
    int64_t wr = o->index_codec == SC_SKC_INDEX_DELTA
                     ? write_delta_keys(lidx + lstart[l], nl, N, o->m, o->prefix, out + pos, cap - pos)
                     : write_raw_keys(lidx + lstart[l], nl, N, out + pos, cap - pos);
    if (wr == -2) { st = SC_ERR_NOMEM; goto done; }
    if (wr < 0) { st = sc_fail(err, SC_ERR_ARG, 8, 0, cap); goto done; }
    pos += wr;
  }
  *out_len = pos;
done:
  free(bucket); free(splits); free(lidx); free(loff); free(lstart); free(lcols); free(cstart);
  free(cells);
  return st;
}

/* ------------------------------------------------------------------ decode */

int sc_skc_body_codecs(const uint8_t* body, int64_t len, int* index_codec, int* value_codec) {
  if (!body || len < SC_SKC_BODY_HEAD) return SC_ERR_MALFORMED;
  *index_codec = body[0];
  *value_codec = body[1];
  return SC_OK;
}

typedef struct {
  int64_t key;
  int32_t list;
} heap_item;

static inline void heap_down(heap_item* h, int64_t n, int64_t i) {
  for (;;) {
    int64_t l = 2 * i + 1, m = i;
    if (l < n && h[l].key < h[m].key) m = l;
    if (l + 1 < n && h[l + 1].key < h[m].key) m = l + 1;
    if (m == i) return;
    heap_item t = h[i]; h[i] = h[m]; h[m] = t;
    i = m;
  }
}

int sc_skc_decode(const uint8_t* body, int64_t len, int64_t N, int64_t count, sc_dtype vt,
                  int expect_index, int expect_value, int64_t* idx_out, void* val_out,
                  sc_error_info* err) {
  if (vt != SC_F32 && vt != SC_F64) return sc_fail(err, SC_ERR_ARG, 0, 0, vt);
  if (len < 0 || N < 0 || count < 0 || (len > 0 && !body)) return sc_fail(err, SC_ERR_ARG, 1, 0, len);
  if (len < SC_SKC_BODY_HEAD) return sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_SIZE, 0, len);
  int ic = body[0], vc = body[1];
  if (ic > SC_SKC_INDEX_DELTA || (expect_index >= 0 && ic != expect_index))
    return sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_CODEC, 0, ic);
  if (vc > SC_SKC_VALUE_SKETCH || (expect_value >= 0 && vc != expect_value))
    return sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_CODEC, 1, vc);
  for (int i = 2; i < SC_SKC_BODY_HEAD; i++)
    if (body[i]) return sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_RESERVED, i, body[i]);
  /* every key costs at least 2 bits (raw: 32), so count is bounded by the body */
  if (count > N || count > len * 4) return sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_COUNT, 0, count);
  int64_t vs = (int64_t)sc_dtype_size(vt);
  int64_t pos = SC_SKC_BODY_HEAD;
  if (vc == SC_SKC_VALUE_RAW) {
    int st = read_keys(body, len, &pos, ic, count, N, idx_out, err);
    if (st) return st;
    if (len - pos != count * vs) return sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_SIZE, pos, len);
    if (count) memcpy(val_out, body + pos, (size_t)(count * vs));
    return SC_OK;
  }
  if (len - pos < 16) return sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_SIZE, pos, len);
  int64_t B = get_u32(body + pos), G = get_u16(body + pos + 4), s = body[pos + 6], r = body[pos + 7];
  if (B < 1 || B > SC_SKC_MAX_Q / 2) return sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_PARAMS, pos, B);
  if (s < 1 || s > SC_SKC_MAX_ROWS) return sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_PARAMS, pos + 6, s);
  if (r < 1 || r > B) return sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_PARAMS, pos + 7, r);
  if (G != (B + r - 1) / r) return sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_PARAMS, pos + 4, G);
  int64_t nb[2] = {get_u32(body + pos + 8), get_u32(body + pos + 12)};
  for (int sg = 0; sg < 2; sg++)
    if (nb[sg] > B) return sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_BUCKETS, pos + 8 + 4 * sg, nb[sg]);
  pos += 16;
  int64_t lists = 2 * r;
  if (len - pos < (nb[0] + nb[1]) * vs + lists * 8 + G + 8)
    return sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_SIZE, pos, len);
  double* means = (double*)malloc(sizeof(double) * (size_t)(nb[0] + nb[1] + 1));
  int64_t* ln = (int64_t*)malloc(sizeof(int64_t) * (size_t)lists);
  int64_t* lc = (int64_t*)malloc(sizeof(int64_t) * (size_t)lists);
  int64_t* cstart = (int64_t*)malloc(sizeof(int64_t) * (size_t)(lists + 1));
  int64_t* lkeys = (int64_t*)malloc(sizeof(int64_t) * (size_t)(count + 1));
  double* lvals = (double*)malloc(sizeof(double) * (size_t)(count + 1));
  heap_item* heap = (heap_item*)malloc(sizeof(heap_item) * (size_t)lists);
  int64_t* lstart = (int64_t*)malloc(sizeof(int64_t) * (size_t)(lists + 1));
  int64_t* lpos = (int64_t*)malloc(sizeof(int64_t) * (size_t)lists);
  uint16_t* cells = NULL;
  hf_table t = {0, NULL, NULL};
  int st = SC_OK;
  if (!means || !ln || !lc || !cstart || !lkeys || !lvals || !heap || !lstart || !lpos) { st = SC_ERR_NOMEM; goto done; }
  for (int sg = 0; sg < 2; sg++)
    for (int64_t b = 0; b < nb[sg]; b++) {
      int64_t at = pos;
      double x = vt == SC_F32 ? (double)({ float f; memcpy(&f, body + pos, 4); f; })
                              : ({ double d; memcpy(&d, body + pos, 8); d; });
      pos += vs;
      double prev = b ? means[(sg ? nb[0] : 0) + b - 1] : 0.0;
      if (!isfinite(x) || x < prev) {
        st = sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_MEANS, at, b);
        goto done;
      }
      means[(sg ? nb[0] : 0) + b] = x;
    }
  int64_t total = 0, total_cells = 0;
  for (int64_t l = 0; l < lists; l++) {
    ln[l] = get_u32(body + pos);
    lc[l] = get_u32(body + pos + 4);
    int64_t sg = l / r;
    if (ln[l] > count - total || (ln[l] > 0 && nb[sg] <= (l % r) * G)) {
      st = sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_LISTS, pos, ln[l]);
      goto done;
    }
    if ((ln[l] == 0) != (lc[l] == 0) || lc[l] > 64 * ln[l] + 64) {
      st = sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_LISTS, pos + 4, lc[l]);
      goto done;
    }
    total += ln[l];
    cstart[l] = total_cells;
    total_cells += s * lc[l];
    pos += 8;
  }
  cstart[lists] = total_cells;
  if (total != count) { st = sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_LISTS, pos - 8 * lists, total); goto done; }
  st = hf_table_build(body + pos, (int)G, total_cells == 0, pos, &t, err);
  if (st) goto done;
  pos += G;
  uint64_t cbits = get_u64(body + pos);
  /* each cell takes >= 1 bit: bounds the allocation by the body */
  if (cbits > (uint64_t)(len - pos - 8) * 8 || (uint64_t)total_cells > cbits) {
    st = sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_SIZE, pos, (int64_t)(cbits > INT64_MAX ? INT64_MAX : cbits));
    goto done;
  }
  pos += 8;
  cells = (uint16_t*)malloc(sizeof(uint16_t) * (size_t)(total_cells + 1));
  if (!cells) { st = SC_ERR_NOMEM; goto done; }
  {
    bit_reader br = {body + pos, (int64_t)cbits, 0};
    for (int64_t c = 0; c < total_cells; c++) {
      uint32_t sym;
      if (!hf_read(&br, &t, &sym)) {
        st = sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_CODE, pos + (br.pos >> 3), c);
        goto done;
      }
      cells[c] = (uint16_t)sym;
    }
    if (br.pos != br.nbits) { st = sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_PADDING, pos - 8, (int64_t)cbits); goto done; }
    int64_t nbytes = (int64_t)((cbits + 7) / 8);
    if (cbits & 7) {
      uint8_t last = body[pos + nbytes - 1];
      if (last & ((1u << (8 - (cbits & 7))) - 1)) {
        st = sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_PADDING, pos + nbytes - 1, last);
        goto done;
      }
    }
    pos += nbytes;
  }
  int64_t off = 0;
  for (int64_t l = 0; l < lists; l++) {
    lstart[l] = off;
    st = read_keys(body, len, &pos, ic, ln[l], N, lkeys + off, err);
    if (st) goto done;
    int64_t sg = l / r, g = l % r, cols = lc[l];
    const double* mv = means + (sg ? nb[0] : 0);
    for (int64_t e = 0; e < ln[l]; e++) {
      int64_t key = lkeys[off + e], best = 0;
      for (int64_t j = 0; j < s; j++) { /* Max on query */
        int64_t v = cells[cstart[l] + j * cols + cell_col(row_key(j), key, cols)];
        if (v > best) best = v;
      }
      int64_t b = g * G + best;
      if (b >= nb[sg]) { st = sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_CELL, pos, b); goto done; }
      lvals[off + e] = sg ? mv[b] : -mv[b];
    }
    off += ln[l];
  }
  lstart[lists] = off;
  if (pos != len) { st = sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_SIZE, pos, len); goto done; }
  {
    /* merge the 2r ascending lists; a key in two lists is malformed */
    int64_t hn = 0;
    for (int64_t l = 0; l < lists; l++) {
      lpos[l] = lstart[l];
      if (lstart[l] < lstart[l + 1]) { heap[hn].key = lkeys[lstart[l]]; heap[hn].list = (int32_t)l; hn++; }
    }
    for (int64_t i = hn / 2 - 1; i >= 0; i--) heap_down(heap, hn, i);
    int64_t prev = -1;
    for (int64_t o = 0; o < count; o++) {
      int32_t l = heap[0].list;
      int64_t e = lpos[l]++;
      if (lkeys[e] == prev) { st = sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_INDEX_ORDER, -1, prev); goto done; }
      idx_out[o] = prev = lkeys[e];
      store_value(vt, val_out, o, lvals[e]);
      if (lpos[l] < lstart[l + 1]) {
        heap[0].key = lkeys[lpos[l]];
      } else {
        heap[0] = heap[--hn];
      }
      heap_down(heap, hn, 0);
    }
  }
done:
  hf_table_free(&t);
  free(means); free(ln); free(lc); free(cstart); free(lkeys); free(lvals); free(heap);
  free(lstart); free(lpos); free(cells);
  return st;
}
