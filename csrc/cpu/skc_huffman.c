/* SKCompress: canonical Huffman code lengths, codes and decoding tables. */
#include "skc_huffman.h"

#include <stdlib.h>
#include <string.h>

#include "sparsecomm/skcompress.h"
#include "common.h"

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
int skc_huffman_lengths(const uint64_t* freq_in, int nsym, uint8_t* len) {
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
void skc_huffman_codes(const uint8_t* len, int nsym, uint32_t* code) {
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

/* Validates the lengths (<= 15; complete code, or exactly one symbol of length 1);
 * returns SC_OK, SC_ERR_MALFORMED (err filled at byte offset pos) or SC_ERR_NOMEM. */
int skc_hf_table_build(const uint8_t* len, int nsym, int allow_empty, int64_t pos,
                          hf_table* t, sc_error_info* err) {
  t->maxlen = 0;
  t->e = NULL;
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
  t->e = (uint16_t*)calloc(size, sizeof(uint16_t));
  uint32_t* code = (uint32_t*)malloc(sizeof(uint32_t) * (size_t)nsym);
  if (!t->e || !code) {
    free(t->e);
    free(code);
    t->e = NULL;
    return SC_ERR_NOMEM;
  }
  skc_huffman_codes(len, nsym, code);
  for (int i = 0; i < nsym; i++) {
    if (!len[i]) continue;
    int shift = t->maxlen - len[i];
    size_t first = (size_t)code[i] << shift, n = (size_t)1 << shift;
    uint16_t e = (uint16_t)((i << 4) | len[i]);
    for (size_t k = 0; k < n; k++) t->e[first + k] = e;
  }
  free(code);
  return SC_OK;
}

void skc_hf_table_free(hf_table* t) { free(t->e); }
