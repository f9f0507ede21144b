/* SKCompress, internal: canonical Huffman codes (lengths <= SC_SKC_MAX_CODE_LEN) of the
 * sketch cells and of the delta-binary prefixes. */
#ifndef SPARSECOMM_CPU_SKC_HUFFMAN_H
#define SPARSECOMM_CPU_SKC_HUFFMAN_H

#include <stdint.h>

#include "sparsecomm/abi.h"
#include "skc_bits.h"

/* Decoding table: 2^maxlen entries indexed by the next maxlen bits, each
 * (symbol << 4) | code length; 0 = no code starts with these bits. Symbols < 4096. */
typedef struct {
  int maxlen;
  uint16_t* e;
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

/* One symbol (the caller refilled r); -1 when the bits are no code. A stream running
 * short shows in br_consumed afterwards. */
static inline int hf_read(bit_reader* r, const hf_table* t) {
  unsigned e = t->e[br_top(r, t->maxlen)];
  br_skip(r, (int)(e & 15));
  return e ? (int)(e >> 4) : -1;
}

#endif
