/* SKCompress: quantile sketch, sign-split quantile buckets, grouped MinMaxSketch,
 * canonical Huffman codes and delta-binary keys with adaptive prefix. The contract,
 * the hash and the byte layout are in sparsecomm/skcompress.h. Single-threaded: one
 * message is encoded per call. This file holds the options, the encoder and the decoder;
 * the parts they are built of are skc_quantile.c (quantiles and buckets, with
 * skc_select_impl.h), skc_keys.c (keys sections), skc_huffman.c (codes), skc_sort.c and
 * skc_bits.h (bytes and bits).
 *
 * Passes of the encoder over the n entries: the values' sign, magnitude and range; the
 * radix select's histogram and gather (per sign, over its magnitudes); each entry's bucket,
 * list and offset (one table lookup) and the lists' sizes; the list ids; the sketch (the
 * cell indices of a block of entries, in vectors where the CPU has them, then the Min
 * updates); the cells' Huffman coding (0.4 cells an entry at the defaults); the keys
 * section (its histogram of delta lengths also checks the keys' order and range). The
 * decoder: the cells, the keys section, the list ids, then each key's cells and value. */
#include "sparsecomm/skcompress.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "skc_bits.h"
#include "skc_huffman.h"
#include "skc_keys.h"
#include "skc_quantile.h"

/* The MinMaxSketch's hash: the key of row pair j (rows 2j and 2j + 1); a key's hash h in a
 * pair gives its column in the first row from the high 32 bits of h, in the second from
 * the low 32 bits (sparsecomm/skcompress.h). */
static inline uint64_t row_key(int64_t j) { return sc_mix64(0x5C0DEull + (uint64_t)j); }

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

static int64_t varint_size(uint64_t v) {
  int64_t k = 1;
  while (v >= 0x80) { v >>= 7; k++; }
  return k;
}

static uint8_t* put_varint(uint8_t* p, uint64_t v) {
  while (v >= 0x80) { *p++ = (uint8_t)(v | 0x80); v >>= 7; }
  *p++ = (uint8_t)v;
  return p;
}

/* The first key out of range or order (a writer found one). */
static int key_fault(const int64_t* idx, int64_t n, int64_t N, sc_error_info* err) {
  for (int64_t i = 0; i < n; i++) {
    if (idx[i] < 0 || idx[i] >= N) return sc_fail(err, SC_ERR_INDEX_RANGE, 0, i, idx[i]);
    if (i && idx[i] <= idx[i - 1]) return sc_fail(err, SC_ERR_INDEX_ORDER, 0, i, idx[i]);
  }
  return sc_fail(err, SC_ERR_INDEX_ORDER, 0, 0, 0); /* not reached: the writer found a fault */
}

/* Bits of a fixed-width list id among lists >= 2. */
static int64_t id_width(int64_t lists) {
  int64_t w = 1;
  while (((int64_t)1 << w) < lists) w++;
  return w;
}

int64_t sc_skc_encode_bound(const sc_skc_options* o, int64_t N, sc_dtype vt, int64_t n) {
  int64_t vs = (int64_t)sc_dtype_size(vt);
  /* m, scheme, a table of 16, two u64 bit counts; a 64-bit delta and a 15-bit prefix in
   * less than 10 bytes, the streams' padding inside the 11th */
  int64_t key_sec = 2 + 16 + 8 + n * 11 + 8;
  int64_t raw = n * raw_key_size(N);
  if (raw > key_sec) key_sec = raw;
  if (o->value_codec == SC_SKC_VALUE_RAW) return SC_SKC_BODY_HEAD + key_sec + n * vs + 8;
  int64_t B = o->q / 2, r = o->r, lists = 2 * r;
  int64_t cols = (int64_t)ceil(o->t * (double)n) + lists;
  int64_t cells = o->s * cols;
  return SC_SKC_BODY_HEAD + 16 + 2 * B * vs + lists * 20 + 1 + lists + 8 + 2 * n + 8 + B + 8 + cells * 2 +
         8 + key_sec + 8;
}

/* Per list of the encoder: its sketch and its id's code. */
typedef struct {
  int64_t base;   /* first cell */
  int64_t cols;
  uint64_t code;  /* list id's Huffman code */
  int len;
} enc_list;

/* Per list of the decoder: its sketch, its decoded values (signed means by offset) and how
 * many offsets are buckets in use. */
typedef struct {
  int64_t base;
  uint64_t cols;
  int64_t lim;
  int64_t vals;   /* first of its G values in the value table */
} dec_list;

/* List l's G decoded values (its sign's means of its group's buckets, signed; 0 past the
 * buckets in use) into vtab[l G ..], from means[] as the body carries them (sign 0's nb[0],
 * then sign 1's); returns how many offsets are buckets in use. The decoder and the encoder
 * that returns what it decodes both build their value table here, so they agree bit for
 * bit. */
static int64_t list_values(int64_t l, int64_t r, int64_t G, const int64_t* nb, const double* means, int64_t vs,
                           void* vtab) {
  int64_t sg = l / r, g = l % r;
  const double* mv = means + (sg ? nb[0] : 0);
  for (int64_t o = 0; o < G; o++) {
    int64_t b = g * G + o;
    double x = b < nb[sg] ? (sg ? mv[b] : -mv[b]) : 0.0;
    if (vs == 4) ((float*)vtab)[l * G + o] = (float)x;
    else ((double*)vtab)[l * G + o] = x;
  }
  return nb[sg] - g * G < G ? nb[sg] - g * G : G;
}

/* ------------------------------------------------------------------ cell indices */

/* The cells of entries in blocks of SKC_BLOCK: for entry i (key keys[i], list lst[i] >>
 * shift), row pair p of its list's sketch: i0[i] in row 2p, i1[i] in row 2p + 1. One body,
 * compiled three times: AVX-512 (the 64-bit multiplies of the hash in vectors), AVX2 and
 * the baseline; which runs is chosen at run time (sc_skc_set_simd). The bodies compute the
 * same integers: the tests compare whole messages from each. */
#define SKC_BLOCK 256

typedef void (*cell_index_fn)(const int64_t* restrict keys, const uint32_t* restrict lst, int shift, int64_t n,
                              const uint64_t* restrict lbase, const uint64_t* restrict lcols, uint64_t rk,
                              uint64_t p2, uint64_t* restrict i0, uint64_t* restrict i1);

static inline __attribute__((always_inline)) void cell_index_body(
    const int64_t* restrict keys, const uint32_t* restrict lst, int shift, int64_t n,
    const uint64_t* restrict lbase, const uint64_t* restrict lcols, uint64_t rk, uint64_t p2,
    uint64_t* restrict i0, uint64_t* restrict i1) {
  for (int64_t i = 0; i < n; i++) {
    uint64_t l = lst[i] >> shift;
    uint64_t h = sc_mix64((uint64_t)keys[i] ^ rk);
    uint64_t cols = lcols[l], row = lbase[l] + p2 * cols;
    i0[i] = row + (((h >> 32) * cols) >> 32);
    i1[i] = row + cols + (((h & 0xFFFFFFFFull) * cols) >> 32);
  }
}

static void cell_index_base(const int64_t* restrict keys, const uint32_t* restrict lst, int shift, int64_t n,
                            const uint64_t* restrict lbase, const uint64_t* restrict lcols, uint64_t rk,
                            uint64_t p2, uint64_t* restrict i0, uint64_t* restrict i1) {
  cell_index_body(keys, lst, shift, n, lbase, lcols, rk, p2, i0, i1);
}

#if (defined(__x86_64__) || defined(_M_X64)) && (defined(__GNUC__) || defined(__clang__)) && \
    !defined(SC_NO_AVX2)
#define SKC_X86_SIMD 1
__attribute__((target("avx2"))) static void cell_index_avx2(
    const int64_t* restrict keys, const uint32_t* restrict lst, int shift, int64_t n,
    const uint64_t* restrict lbase, const uint64_t* restrict lcols, uint64_t rk, uint64_t p2,
    uint64_t* restrict i0, uint64_t* restrict i1) {
  cell_index_body(keys, lst, shift, n, lbase, lcols, rk, p2, i0, i1);
}

__attribute__((target("avx512f,avx512dq,avx512vl"))) static void cell_index_avx512(
    const int64_t* restrict keys, const uint32_t* restrict lst, int shift, int64_t n,
    const uint64_t* restrict lbase, const uint64_t* restrict lcols, uint64_t rk, uint64_t p2,
    uint64_t* restrict i0, uint64_t* restrict i1) {
  cell_index_body(keys, lst, shift, n, lbase, lcols, rk, p2, i0, i1);
}
#endif

static int skc_simd_allowed = 1;

static int skc_simd_level(void) {
#ifdef SKC_X86_SIMD
  if (!__atomic_load_n(&skc_simd_allowed, __ATOMIC_RELAXED)) return 0;
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512vl"))
    return 2;
  if (__builtin_cpu_supports("avx2")) return 1;
#endif
  return 0;
}

int sc_skc_set_simd(int allow) {
  __atomic_store_n(&skc_simd_allowed, allow != 0, __ATOMIC_RELAXED);
  return skc_simd_level();
}

static cell_index_fn cell_index(void) {
#ifdef SKC_X86_SIMD
  switch (skc_simd_level()) {
    case 2: return cell_index_avx512;
    case 1: return cell_index_avx2;
    default: break;
  }
#endif
  return cell_index_base;
}

#define CT uint8_t
#define SX _u8
#include "skc_cells_impl.h"
#undef CT
#undef SX
#define CT uint16_t
#define SX _u16
#include "skc_cells_impl.h"
#undef CT
#undef SX

/* The list ids in key order (code[i] >> 12) into w, which has room for them and 8 bytes. */
static void write_ids(const uint32_t* code, int64_t n, const enc_list* L, int fixed4, bit_writer* wp) {
  bit_writer w = *wp;
  int64_t i = 0;
  if (fixed4 && w.n == 0) { /* the default, 16 lists at 4 bits: two ids a byte */
    for (; i + 2 <= n; i += 2) w.p[i >> 1] = (uint8_t)(((code[i] >> 12) << 4) | (code[i + 1] >> 12));
    w.p += i >> 1;
  }
  for (; i < n; i++) {
    const enc_list* l = &L[code[i] >> 12];
    bw_put_fit(&w, l->code, l->len);
  }
  *wp = w;
}

static int encode_sketched(const sc_skc_options* o, int64_t N, const int64_t* idx, sc_dtype vt,
                           const void* val, int64_t n, uint8_t* out, int64_t cap, int64_t pos,
                           int64_t* out_len, void* decoded, sc_error_info* err) {
  int64_t vs = (int64_t)sc_dtype_size(vt);
  int64_t B = o->q / 2, r = o->r, G = (B + r - 1) / r, lists = 2 * r, s = o->s;
  /* the quantiles' scratch (n + 1 values), then each entry's list << 12 | offset */
  uint32_t* code = (uint32_t*)malloc((size_t)(vs * (n + 1)));
  double* splits = (double*)malloc(sizeof(double) * (size_t)(2 * (B + 1)));
  double* wire_means = (double*)malloc(sizeof(double) * (size_t)(2 * B + 1));
  uint32_t* lcode = (uint32_t*)malloc(sizeof(uint32_t) * (size_t)(2 * B));
  enc_list* L = (enc_list*)calloc((size_t)lists, sizeof(enc_list));
  int64_t* cnt = (int64_t*)calloc((size_t)(4 * lists), sizeof(int64_t));
  uint64_t* freq = (uint64_t*)calloc((size_t)(lists > G ? lists : G), sizeof(uint64_t));
  uint8_t* hlen = (uint8_t*)calloc((size_t)(lists > G ? lists : G), 1);
  uint32_t* hcode = (uint32_t*)calloc((size_t)(lists > G ? lists : G), sizeof(uint32_t));
  void* cells = NULL;
  int st = SC_OK;
  if (!code || !splits || !wire_means || !lcode || !L || !cnt || !freq || !hlen || !hcode) {
    st = SC_ERR_NOMEM;
    goto done;
  }
  /* bucket (plus B when non-negative) -> list << 12 | offset in the group */
  for (int64_t cb = 0; cb < 2 * B; cb++) {
    int64_t sg = cb >= B, b = cb - sg * B;
    lcode[cb] = (uint32_t)(((sg * r + b / G) << 12) | (b % G));
  }
  quantized qz;
  qz.splits[0] = splits;
  qz.splits[1] = splits + B + 1;
  skc_bucket_map map = {lcode, cnt, lists};
  st = skc_quantify(vt, val, n, B, o->exact_max, (int32_t*)code, &map, code, &qz, err);
  if (st) goto done;
  for (int64_t l = 0; l < lists; l++) cnt[l] += cnt[lists + l] + cnt[2 * lists + l] + cnt[3 * lists + l];
  int64_t total_cells = 0;
  for (int64_t l = 0; l < lists; l++) {
    int64_t nl = cnt[l];
    int64_t c = nl ? (int64_t)ceil(o->t * (double)nl) : 0;
    if (nl && c < 1) c = 1;
    L[l].cols = c;
    L[l].base = total_cells;
    total_cells += s * c;
    freq[l] = (uint64_t)nl;
  }
  /* the list ids' code: fixed width, or Huffman when that is smaller (table included) */
  st = skc_huffman_lengths(freq, (int)lists, hlen);
  if (st) goto done;
  skc_huffman_codes(hlen, (int)lists, hcode);
  int64_t width = id_width(lists), huff_bits = 8 * lists;
  for (int64_t l = 0; l < lists; l++) huff_bits += cnt[l] * hlen[l];
  int id_scheme = huff_bits < n * width;
  int64_t id_bits = id_scheme ? huff_bits - 8 * lists : n * width;
  for (int64_t l = 0; l < lists; l++) {
    L[l].code = id_scheme ? hcode[l] : (uint64_t)l;
    L[l].len = id_scheme ? hlen[l] : (int)width;
  }
  /* head, means, lists, id scheme, table and bit count */
  int64_t need = 16 + (qz.nb[0] + qz.nb[1]) * vs + 1 + (id_scheme ? lists : 0) + 8;
  for (int64_t l = 0; l < lists; l++) need += varint_size((uint64_t)cnt[l]) + varint_size((uint64_t)L[l].cols);
  /* the ids' stores reach 8 bytes past them; the cells and keys sections come after */
  if (cap - pos < need + (id_bits + 7) / 8 + 8) { st = sc_fail(err, SC_ERR_ARG, 8, 0, cap); goto done; }
  {
    uint8_t* p = out + pos;
    put_u32(p, (uint32_t)B);
    put_u16(p + 4, (uint16_t)G);
    p[6] = (uint8_t)s;
    p[7] = (uint8_t)r;
    put_u32(p + 8, (uint32_t)qz.nb[0]);
    put_u32(p + 12, (uint32_t)qz.nb[1]);
    p += 16;
    for (int sg = 0, k = 0; sg < 2; sg++)
      for (int64_t b = 0; b < qz.nb[sg]; b++, k++) {
        /* a + (b - a) / 2: inside [a, b] after rounding, also for subnormals */
        double mean = qz.splits[sg][b] + (qz.splits[sg][b + 1] - qz.splits[sg][b]) * 0.5;
        if (vt == SC_F32) { float f = (float)mean; memcpy(p, &f, 4); mean = f; }
        else memcpy(p, &mean, 8);
        wire_means[k] = mean; /* as the receiver reads it */
        p += vs;
      }
    for (int64_t l = 0; l < lists; l++) {
      p = put_varint(p, (uint64_t)cnt[l]);
      p = put_varint(p, (uint64_t)L[l].cols);
    }
    *p++ = (uint8_t)id_scheme;
    if (id_scheme) {
      memcpy(p, hlen, (size_t)lists);
      p += lists;
    }
    put_u64(p, (uint64_t)id_bits);
    p += 8;
    pos = p - out;
  }
  { /* the list ids */
    bit_writer w;
    bw_init(&w, out + pos, cap - pos);
    write_ids(code, n, L, !id_scheme && width == 4, &w);
    if (w.overflow || bw_bits(&w) != id_bits) { st = sc_fail(err, SC_ERR_ARG, 8, 0, cap); goto done; }
    pos += bw_bytes(&w);
  }
  /* the sketch (Min on insert), its cells' code and the coded cells; one byte a cell when the
   * offsets fit */
  int narrow = G <= 255;
  cells = malloc((size_t)(total_cells + 1) * (narrow ? 1 : 2));
  if (!cells) { st = SC_ERR_NOMEM; goto done; }
  memset(cells, 0xFF, (size_t)total_cells * (narrow ? 1 : 2));
  memset(freq, 0, sizeof(uint64_t) * (size_t)G);
  {
    uint64_t rk[SC_SKC_MAX_ROWS], lbase[2 * 255], lcols[2 * 255];
    for (int64_t j = 0; j < (s + 1) / 2; j++) rk[j] = row_key(j);
    for (int64_t l = 0; l < lists; l++) {
      lbase[l] = (uint64_t)L[l].base;
      lcols[l] = (uint64_t)L[l].cols;
    }
    if (narrow) {
      sketch_insert_u8(idx, code, n, lbase, lcols, s, rk, (uint8_t*)cells);
      cells_finish_u8((uint8_t*)cells, total_cells, freq);
    } else {
      sketch_insert_u16(idx, code, n, lbase, lcols, s, rk, (uint16_t*)cells);
      cells_finish_u16((uint16_t*)cells, total_cells, freq);
    }
    if (decoded && n) { /* the receiver's query on the same cells (its Huffman decode is lossless) */
      dec_list* D = (dec_list*)malloc(sizeof(dec_list) * (size_t)lists);
      void* vtab = malloc((size_t)(lists * G * vs));
      if (!D || !vtab) { free(D); free(vtab); st = SC_ERR_NOMEM; goto done; }
      for (int64_t l = 0; l < lists; l++) {
        D[l].base = L[l].base;
        D[l].cols = (uint64_t)L[l].cols;
        D[l].lim = list_values(l, r, G, qz.nb, wire_means, vs, vtab);
        D[l].vals = l * G;
      }
      st = narrow ? query_values_u8(D, lbase, lcols, code, 12, (const uint8_t*)cells, s, idx, n, vtab, (int)vs,
                                    decoded, 0, err)
                  : query_values_u16(D, lbase, lcols, code, 12, (const uint16_t*)cells, s, idx, n, vtab, (int)vs,
                                     decoded, 0, err);
      free(D);
      free(vtab);
      if (st) goto done;
    }
  }
  st = skc_huffman_lengths(freq, (int)G, hlen);
  if (st) goto done;
  skc_huffman_codes(hlen, (int)G, hcode);
  if (cap - pos < G + 8) { st = sc_fail(err, SC_ERR_ARG, 8, 0, cap); goto done; }
  memcpy(out + pos, hlen, (size_t)G);
  pos += G;
  {
    /* per value: code << 4 | length */
    for (int64_t v = 0; v < G; v++) hcode[v] = (hcode[v] << 4) | hlen[v];
    bit_writer w;
    bw_init(&w, out + pos + 8, cap - pos - 8);
    if (narrow)
      write_cells_u8((const uint8_t*)cells, total_cells, hcode, &w);
    else
      write_cells_u16((const uint16_t*)cells, total_cells, hcode, &w);
    if (w.overflow) { st = sc_fail(err, SC_ERR_ARG, 8, 0, cap); goto done; }
    put_u64(out + pos, (uint64_t)bw_bits(&w));
    pos += 8 + bw_bytes(&w);
  }
  {
    int64_t wr = o->index_codec == SC_SKC_INDEX_DELTA
                     ? skc_write_delta_keys(idx, n, N, o->m, o->prefix, out + pos, cap - pos)
                     : skc_write_raw_keys(idx, n, N, out + pos, cap - pos);
    if (wr == -2) { st = SC_ERR_NOMEM; goto done; }
    if (wr == -3) { st = key_fault(idx, n, N, err); goto done; }
    if (wr < 0) { st = sc_fail(err, SC_ERR_ARG, 8, 0, cap); goto done; }
    pos += wr;
  }
  *out_len = pos;
done:
  free(code); free(splits); free(wire_means); free(lcode); free(L); free(cnt); free(freq); free(hlen); free(hcode);
  free(cells);
  return st;
}

int sc_skc_encode(const sc_skc_options* o, int64_t N, const int64_t* idx, sc_dtype vt,
                  const void* val, int64_t n, uint8_t* out, int64_t cap, int64_t* out_len,
                  void* decoded, sc_error_info* err) {
  int st = sc_skc_check_options(o, err);
  if (st) return st;
  if (vt != SC_F32 && vt != SC_F64) return sc_fail(err, SC_ERR_ARG, 9, 0, vt);
  if (N < 0 || n < 0 || n > N) return sc_fail(err, SC_ERR_ARG, 10, n, N);
  if (cap < SC_SKC_BODY_HEAD) return sc_fail(err, SC_ERR_ARG, 8, 0, cap);
  /* the keys' order and range are checked where the keys are written (-3 there) */
  int64_t vs = (int64_t)sc_dtype_size(vt);
  memset(out, 0, SC_SKC_BODY_HEAD);
  out[0] = (uint8_t)o->index_codec;
  out[1] = (uint8_t)o->value_codec;
  out[2] = SC_SKC_REVISION;
  int64_t pos = SC_SKC_BODY_HEAD;
  if (o->value_codec == SC_SKC_VALUE_RAW) {
    int64_t w = o->index_codec == SC_SKC_INDEX_DELTA
                    ? skc_write_delta_keys(idx, n, N, o->m, o->prefix, out + pos, cap - pos)
                    : skc_write_raw_keys(idx, n, N, out + pos, cap - pos);
    if (w == -2) return SC_ERR_NOMEM;
    if (w == -3) return key_fault(idx, n, N, err);
    if (w < 0 || cap - pos - w < n * vs) return sc_fail(err, SC_ERR_ARG, 8, 0, cap);
    pos += w;
    if (n) memcpy(out + pos, val, (size_t)(n * vs));
    if (n && decoded) memcpy(decoded, val, (size_t)(n * vs));
    *out_len = pos + n * vs;
    return SC_OK;
  }
  return encode_sketched(o, N, idx, vt, val, n, out, cap, pos, out_len, decoded, err);
}

/* ------------------------------------------------------------------ decode */

/* A varint at body[*pos..len) (see the header): 0 when truncated, too long or not minimal. */
static int get_varint(const uint8_t* body, int64_t len, int64_t* pos, uint64_t* v) {
  uint64_t x = 0;
  int64_t p = *pos;
  for (int k = 0; k < 10; k++) {
    if (p >= len) return 0;
    uint8_t byte = body[p++];
    if (k == 9 && byte > 1) return 0; /* past 64 bits */
    x |= (uint64_t)(byte & 0x7F) << (7 * k);
    if (!(byte & 0x80)) {
      if (k && !byte) return 0; /* a needless trailing zero */
      *pos = p;
      *v = x;
      return 1;
    }
  }
  return 0;
}

/* The zero padding of a stream of nbits at body[at..]. */
static int check_padding(const uint8_t* body, int64_t at, uint64_t nbits, sc_error_info* err) {
  if (nbits & 7) {
    int64_t last_at = at + (int64_t)((nbits + 7) / 8) - 1;
    uint8_t last = body[last_at];
    if (last & ((1u << (8 - (nbits & 7))) - 1))
      return sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_PADDING, last_at, last);
  }
  return SC_OK;
}


/* The count Huffman-coded list ids at body[id_at..] (table t) into lid. */
static int read_ids(const uint8_t* body, int64_t id_at, int64_t id_bits, const hf_table* t, int64_t count,
                    uint32_t* lid, sc_error_info* err) {
  uint8_t tail[BR_TAIL];
  bit_reader r;
  br_init(&r, body + id_at, id_bits, tail);
  const uint16_t* tab = t->e;
  int tb = t->maxlen;
  for (int64_t i = 0; i < count; i++) {
    br_refill(&r);
    unsigned e = tab[br_top(&r, tb)];
    br_skip(&r, (int)(e & 15));
    if (__builtin_expect(!e, 0))
      return sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_CODE, id_at + (br_consumed(&r) >> 3), i);
    lid[i] = (uint16_t)(e >> 4);
  }
  return SC_OK;
}

/* Fixed-width id i (w bits at bit i w of ids[0..nbytes)): the fast read needs 8 bytes. */
static inline unsigned fixed_id_fast(const uint8_t* ids, int w, int64_t i) {
  uint64_t at = (uint64_t)i * (uint64_t)w;
  return (unsigned)((load_be64(ids + (at >> 3)) << (at & 7)) >> (64 - w));
}

static inline unsigned fixed_id_slow(const uint8_t* ids, int w, int64_t i) {
  unsigned v = 0;
  for (int b = 0; b < w; b++) {
    uint64_t at = (uint64_t)i * (uint64_t)w + (uint64_t)b;
    v = (v << 1) | ((ids[at >> 3] >> (7 - (at & 7))) & 1u);
  }
  return v;
}

/* The count fixed-width (w bits) list ids at ids[0..ceil(count w / 8)) into lid, each < lists:
 * at known bit offsets, so read without a chain from one to the next. */
static int read_fixed_ids(const uint8_t* ids, int64_t count, int w, int64_t lists, uint32_t* lid, int64_t at,
                          sc_error_info* err) {
  int64_t nbytes = (count * w + 7) / 8, i = 0;
  if (w == 4) { /* the default (2r = 16 lists): two ids a byte */
    for (; 2 * i + 2 <= count; i++) {
      lid[2 * i] = (uint32_t)(ids[i] >> 4);
      lid[2 * i + 1] = (uint32_t)(ids[i] & 15);
    }
    i *= 2;
  } else {
    for (; ((i * w) >> 3) + 8 <= nbytes && i < count; i++) lid[i] = fixed_id_fast(ids, w, i);
  }
  for (; i < count; i++) lid[i] = fixed_id_slow(ids, w, i);
  if (((int64_t)1 << w) > lists) {
    unsigned bad = 0;
    for (int64_t k = 0; k < count; k++) bad |= lid[k] >= (unsigned)lists;
    if (bad)
      for (int64_t k = 0; k < count; k++)
        if (lid[k] >= lists) return sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_LISTS, at + k * w / 8, lid[k]);
  }
  return SC_OK;
}

/* List l holds exactly ln[l] of the ids lid[0..count) (each < lists). */
static int check_id_counts(const uint32_t* lid, int64_t count, int64_t lists, const int64_t* ln, int64_t at,
                           sc_error_info* err) {
  int64_t* seen = (int64_t*)calloc((size_t)(4 * lists), sizeof(int64_t));
  if (!seen) return SC_ERR_NOMEM;
  int64_t *s0 = seen, *s1 = seen + lists, *s2 = s1 + lists, *s3 = s2 + lists, i = 0;
  for (; i + 4 <= count; i += 4) { /* four counters a list: runs of one list do not wait */
    s0[lid[i]]++;
    s1[lid[i + 1]]++;
    s2[lid[i + 2]]++;
    s3[lid[i + 3]]++;
  }
  for (; i < count; i++) s0[lid[i]]++;
  int st = SC_OK;
  for (int64_t l = 0; l < lists; l++)
    if (s0[l] + s1[l] + s2[l] + s3[l] != ln[l]) {
      st = sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_LISTS, at, l);
      break;
    }
  free(seen);
  return st;
}

static int decode_sketched(const uint8_t* body, int64_t len, int64_t pos, int ic, int64_t N,
                           int64_t count, sc_dtype vt, int64_t* idx_out, void* val_out,
                           sc_error_info* err) {
  int64_t vs = (int64_t)sc_dtype_size(vt);
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
  if (len - pos < (nb[0] + nb[1]) * vs) return sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_SIZE, pos, len);
  /* the value table: list l's G values (its sign's means of its group's buckets) */
  void* vtab = malloc((size_t)(lists * G * vs));
  dec_list* L = (dec_list*)malloc(sizeof(dec_list) * (size_t)lists);
  int64_t* ln = (int64_t*)malloc(sizeof(int64_t) * (size_t)lists);
  double* means = (double*)malloc(sizeof(double) * (size_t)(nb[0] + nb[1] + 1));
  void* cells = NULL;
  uint32_t* lid = NULL;
  hf_table idt = {0, NULL}, ct = {0, NULL};
  int st = SC_OK;
  if (!vtab || !L || !ln || !means) { st = SC_ERR_NOMEM; goto done; }
  for (int sg = 0; sg < 2; sg++)
    for (int64_t b = 0; b < nb[sg]; b++) {
      int64_t at = pos;
      double x;
      if (vt == SC_F32) { float f; memcpy(&f, body + pos, 4); x = f; }
      else memcpy(&x, body + pos, 8);
      pos += vs;
      double prev = b ? means[(sg ? nb[0] : 0) + b - 1] : 0.0;
      if (!isfinite(x) || x < prev) { st = sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_MEANS, at, b); goto done; }
      means[(sg ? nb[0] : 0) + b] = x;
    }
  int64_t total = 0, total_cells = 0;
  for (int64_t l = 0; l < lists; l++) {
    int64_t at = pos;
    uint64_t n_l, cols;
    if (!get_varint(body, len, &pos, &n_l)) { st = sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_LISTS, at, l); goto done; }
    int64_t sg = l / r, g = l % r;
    if (n_l > (uint64_t)(count - total) || (n_l > 0 && nb[sg] <= g * G)) {
      st = sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_LISTS, at, (int64_t)(n_l > INT64_MAX ? INT64_MAX : n_l));
      goto done;
    }
    int64_t at_cols = pos;
    if (!get_varint(body, len, &pos, &cols)) { st = sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_LISTS, at_cols, l); goto done; }
    if ((n_l == 0) != (cols == 0) || cols > 64 * n_l + 64) {
      st = sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_LISTS, at_cols, (int64_t)(cols > INT64_MAX ? INT64_MAX : cols));
      goto done;
    }
    ln[l] = (int64_t)n_l;
    total += (int64_t)n_l;
    L[l].base = total_cells;
    L[l].cols = cols;
    L[l].lim = list_values(l, r, G, nb, means, vs, vtab);
    L[l].vals = l * G;
    total_cells += s * (int64_t)cols;
  }
  if (total != count) { st = sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_LISTS, pos, total); goto done; }
  /* the list ids: fixed width, exactly count * width bits; or Huffman, a code exactly for
   * the non-empty lists, exactly sum n_l len_l bits */
  if (len - pos < 1) { st = sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_SIZE, pos, len); goto done; }
  int id_scheme = body[pos];
  if (id_scheme > 1) { st = sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_CODE_TABLE, pos, id_scheme); goto done; }
  pos++;
  int64_t want_id_bits = 0;
  if (id_scheme) {
    if (len - pos < lists) { st = sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_SIZE, pos, len); goto done; }
    for (int64_t l = 0; l < lists; l++) {
      if ((body[pos + l] != 0) != (ln[l] != 0)) {
        st = sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_CODE_TABLE, pos + l, body[pos + l]);
        goto done;
      }
      want_id_bits += ln[l] * body[pos + l];
    }
    st = skc_hf_table_build(body + pos, (int)lists, count == 0, pos, &idt, err);
    if (st) goto done;
    pos += lists;
  } else {
    want_id_bits = count * id_width(lists);
  }
  if (len - pos < 8) { st = sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_SIZE, pos, len); goto done; }
  uint64_t id_bits = get_u64(body + pos);
  if (id_bits != (uint64_t)want_id_bits) {
    st = sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_PADDING, pos, (int64_t)(id_bits > INT64_MAX ? INT64_MAX : id_bits));
    goto done;
  }
  pos += 8;
  int64_t id_at = pos, id_bytes = (want_id_bits + 7) / 8;
  if (len - pos < id_bytes) { st = sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_SIZE, pos, len); goto done; }
  st = check_padding(body, id_at, id_bits, err);
  if (st) goto done;
  pos += id_bytes;
  /* the cells */
  if (len - pos < G + 8) { st = sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_SIZE, pos, len); goto done; }
  st = skc_hf_table_build(body + pos, (int)G, total_cells == 0, pos, &ct, err);
  if (st) goto done;
  pos += G;
  uint64_t cbits = get_u64(body + pos);
  /* each cell takes >= 1 bit: bounds the allocation by the body */
  if (cbits > (uint64_t)(len - pos - 8) * 8 || (uint64_t)total_cells > cbits) {
    st = sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_SIZE, pos, (int64_t)(cbits > INT64_MAX ? INT64_MAX : cbits));
    goto done;
  }
  pos += 8;
  int narrow = G <= 255; /* one byte a cell */
  cells = malloc((size_t)(total_cells + 1) * (narrow ? 1 : 2));
  if (!cells) { st = SC_ERR_NOMEM; goto done; }
  /* an empty list's sketch (cols 0) is this cell: a malformed id naming that list reads 0
   * here, and its count gives it away */
  if (narrow) ((uint8_t*)cells)[total_cells] = 0;
  else ((uint16_t*)cells)[total_cells] = 0;
  if (total_cells) {
    int64_t bad = 0;
    int rc = narrow ? read_codes_u8(body + pos, (int64_t)cbits, &ct, total_cells, (uint8_t*)cells, &bad)
                    : read_codes_u16(body + pos, (int64_t)cbits, &ct, total_cells, (uint16_t*)cells, &bad);
    if (rc) {
      st = bad < total_cells ? sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_CODE, pos, bad)
                             : sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_PADDING, pos - 8, (int64_t)cbits);
      goto done;
    }
  } else if (cbits) {
    st = sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_PADDING, pos - 8, (int64_t)cbits);
    goto done;
  }
  st = check_padding(body, pos, cbits, err);
  if (st) goto done;
  pos += (int64_t)((cbits + 7) / 8);
  /* the keys, then each key's value */
  st = skc_read_keys(body, len, &pos, ic, count, N, idx_out, err);
  if (st) goto done;
  if (pos != len) { st = sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_SIZE, pos, len); goto done; }
  if (count) {
    lid = (uint32_t*)malloc(sizeof(uint32_t) * (size_t)count);
    if (!lid) { st = SC_ERR_NOMEM; goto done; }
    st = id_scheme ? read_ids(body, id_at, (int64_t)id_bits, &idt, count, lid, err)
                   : read_fixed_ids(body + id_at, count, (int)id_width(lists), lists, lid, id_at, err);
    if (!st) st = check_id_counts(lid, count, lists, ln, id_at, err);
    uint64_t lbase[2 * 255], lcols[2 * 255];
    for (int64_t l = 0; l < lists; l++) {
      lbase[l] = (uint64_t)L[l].base;
      lcols[l] = L[l].cols;
    }
    if (!st)
      st = narrow ? query_values_u8(L, lbase, lcols, lid, 0, (const uint8_t*)cells, s, idx_out, count, vtab,
                                    (int)vs, val_out, id_at, err)
                  : query_values_u16(L, lbase, lcols, lid, 0, (const uint16_t*)cells, s, idx_out, count, vtab,
                                     (int)vs, val_out, id_at, err);
  }
done:
  skc_hf_table_free(&idt);
  skc_hf_table_free(&ct);
  free(vtab); free(L); free(ln); free(means); free(cells); free(lid);
  return st;
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
  if (body[2] != SC_SKC_REVISION) return sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_REVISION, 2, body[2]);
  for (int i = 3; i < SC_SKC_BODY_HEAD; i++)
    if (body[i]) return sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_RESERVED, i, body[i]);
  /* every key costs at least 2 bits (raw: 32), so count is bounded by the body */
  if (count > N || count > len * 4) return sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_COUNT, 0, count);
  int64_t vs = (int64_t)sc_dtype_size(vt);
  int64_t pos = SC_SKC_BODY_HEAD;
  if (vc == SC_SKC_VALUE_RAW) {
    int st = skc_read_keys(body, len, &pos, ic, count, N, idx_out, err);
    if (st) return st;
    if (len - pos != count * vs) return sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_SIZE, pos, len);
    if (count) memcpy(val_out, body + pos, (size_t)(count * vs));
    return SC_OK;
  }
  return decode_sketched(body, len, pos, ic, N, count, vt, idx_out, val_out, err);
}
