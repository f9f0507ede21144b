/* SKCompress, internal: canonical Huffman codes (lengths <= SC_SKC_MAX_CODE_LEN) of the
 * sketch cells and of the delta-binary prefixes. */
#ifndef SPARSECOMM_CPU_SKC_HUFFMAN_H
#define SPARSECOMM_CPU_SKC_HUFFMAN_H

#include <stdint.h>

#include "sparsecomm/abi.h"
#include "skc_bits.h"

/* Decoding table: 2^maxlen entries (symbol, length); length 0 = no code. */
typedef struct {
  int maxlen;
  uint16_t* sym;
  uint8_t* len;
} hf_table;

/* Code lengths (<= 15) for freq[0..nsym); unused symbols get 0, a single used symbol 1:
 * SC_OK or SC_ERR_NOMEM. */
int skc_huffman_lengths(const uint64_t* freq_in, int nsym, uint8_t* len);

/* Canonical codes from lengths (order: length, then symbol). */
void skc_huffman_codes(const uint8_t* len, int nsym, uint32_t* code);

/* Validates the lengths (<= 15; complete code, or exactly one symbol of length 1) and
 * builds t; returns SC_OK, SC_ERR_MALFORMED (err filled at byte offset pos) or
 * SC_ERR_NOMEM. */
int skc_hf_table_build(const uint8_t* len, int nsym, int allow_empty, int64_t pos,
                          hf_table* t, sc_error_info* err);

void skc_hf_table_free(hf_table* t);

/* One symbol; 0 when the bits are no code or the stream ends inside it. */
static inline int hf_read(bit_reader* r, const hf_table* t, uint32_t* sym) {
  uint64_t e = br_peek(r, t->maxlen);
  int l = t->len[e];
  if (!l || r->pos + l > r->nbits) return 0;
  r->pos += l;
  *sym = t->sym[e];
  return 1;
}

#endif
