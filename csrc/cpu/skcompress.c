/* SKCompress: quantile sketch, sign-split quantile buckets, grouped MinMaxSketch,
 * canonical Huffman codes and delta-binary keys with adaptive prefix. The contract,
 * the hash and the byte layout are in sparsecomm/skcompress.h. Single-threaded: one
 * message is encoded per call and its cost is dominated by two passes over it. This file
 * holds the options, the encoder and the decoder; the parts they are built of are
 * skc_quantile.c (quantiles and buckets), skc_keys.c (keys sections), skc_huffman.c
 * (codes), skc_sort.c and skc_bits.h (bytes and bits). */
#include "sparsecomm/skcompress.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "skc_bits.h"
#include "skc_huffman.h"
#include "skc_keys.h"
#include "skc_quantile.h"

/* The MinMaxSketch's hash: row j's key and a key's column among cols. */
static inline uint64_t row_key(int64_t j) { return sc_mix64(0x5C0DEull + (uint64_t)j); }

static inline int64_t cell_col(uint64_t rk, int64_t key, int64_t cols) {
  return (int64_t)(((sc_mix64((uint64_t)key ^ rk) >> 32) * (uint64_t)cols) >> 32);
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
                    ? skc_write_delta_keys(idx, n, N, o->m, o->prefix, out + pos, cap - pos)
                    : skc_write_raw_keys(idx, n, N, out + pos, cap - pos);
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
  st = skc_quantify(vt, val, n, B, o->exact_max, bucket, &qz, err);
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
  st = skc_huffman_lengths(freq, (int)G, clen);
  if (!st) skc_huffman_codes(clen, (int)G, code);
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
                     ? skc_write_delta_keys(lidx + lstart[l], nl, N, o->m, o->prefix, out + pos, cap - pos)
                     : skc_write_raw_keys(lidx + lstart[l], nl, N, out + pos, cap - pos);
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
    int st = skc_read_keys(body, len, &pos, ic, count, N, idx_out, err);
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
  st = skc_hf_table_build(body + pos, (int)G, total_cells == 0, pos, &t, err);
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
    st = skc_read_keys(body, len, &pos, ic, ln[l], N, lkeys + off, err);
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
  skc_hf_table_free(&t);
  free(means); free(ln); free(lc); free(cstart); free(lkeys); free(lvals); free(heap);
  free(lstart); free(lpos); free(cells);
  return st;
}
