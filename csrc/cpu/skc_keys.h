/* SKCompress, internal: the keys sections of a body, raw or delta-binary with an adaptive
 * (fixed or Huffman-coded) prefix. */
#ifndef SPARSECOMM_CPU_SKC_KEYS_H
#define SPARSECOMM_CPU_SKC_KEYS_H

#include <stdint.h>

#include "sparsecomm/abi.h"

/* A delta-binary section of this many keys or more is written as two streams. */
#define SKC_KEY_SPLIT 8192

/* Streams of a delta-binary section of n keys: 2 from SKC_KEY_SPLIT keys, else 1. */
int skc_key_streams(int64_t n);

/* Bytes of a raw keys section. */
static inline int64_t raw_key_size(int64_t N) { return N < (1ll << 31) ? 4 : 8; }

/* Chooses m and the prefix scheme for the deltas of keys[0..n) and writes the
 * delta-binary section at out (cap bytes); returns bytes written, -1 when cap is too
 * small, -2 out of memory, -3 when the keys are not strictly ascending in [0, N) (found on
 * the way: the caller looks for the first fault). */
int64_t skc_write_delta_keys(const int64_t* keys, int64_t n, int64_t N, int64_t want_m,
                                int want_prefix, uint8_t* out, int64_t cap);

/* The raw keys section (raw_key_size(N) bytes a key); bytes written, -1 when cap is too
 * small, -3 when the keys are not strictly ascending in [0, N). */
int64_t skc_write_raw_keys(const int64_t* keys, int64_t n, int64_t N, uint8_t* out, int64_t cap);

/* Reads a keys section of n keys at body[*pos..len); keys strictly ascending, < N. */
int skc_read_keys(const uint8_t* body, int64_t len, int64_t* pos, int codec, int64_t n,
                     int64_t N, int64_t* keys, sc_error_info* err);

#endif
