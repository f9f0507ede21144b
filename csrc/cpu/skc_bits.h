/* SKCompress bodies, internal: values as float64, little-endian integers, and the bit
 * writer and reader of the Huffman-coded and delta-binary sections (most significant bit
 * first). Header-only: these run once per value or per code. */
#ifndef SPARSECOMM_CPU_SKC_BITS_H
#define SPARSECOMM_CPU_SKC_BITS_H

#include <stdint.h>
#include <string.h>

#include "sparsecomm/abi.h"

static inline double load_value(sc_dtype vt, const void* p, int64_t i) {
  return vt == SC_F32 ? (double)((const float*)p)[i] : ((const double*)p)[i];
}

static inline void store_value(sc_dtype vt, void* p, int64_t i, double x) {
  if (vt == SC_F32)
    ((float*)p)[i] = (float)x;
  else
    ((double*)p)[i] = x;
}

static inline void put_u16(uint8_t* p, uint16_t v) { memcpy(p, &v, 2); }
static inline void put_u32(uint8_t* p, uint32_t v) { memcpy(p, &v, 4); }
static inline void put_u64(uint8_t* p, uint64_t v) { memcpy(p, &v, 8); }
static inline uint16_t get_u16(const uint8_t* p) { uint16_t v; memcpy(&v, p, 2); return v; }
static inline uint32_t get_u32(const uint8_t* p) { uint32_t v; memcpy(&v, p, 4); return v; }
static inline uint64_t get_u64(const uint8_t* p) { uint64_t v; memcpy(&v, p, 8); return v; }

static inline int bit_length(uint64_t d) { return d ? 64 - __builtin_clzll(d) : 1; }


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

#endif
