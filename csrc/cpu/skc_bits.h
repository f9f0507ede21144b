/* SKCompress bodies, internal: values as float64, little-endian integers, and the bit
 * writer and readers of the Huffman-coded and delta-binary sections (most significant bit
 * first). Header-only: these run once per value or per code.
 *
 * The writer keeps up to 63 pending bits in a 64-bit register and stores 8 bytes at a time
 * (big-endian, so the first bit is the most significant of the first byte); the reader
 * keeps a 64-bit window refilled without a branch on its fill level (a load of 8 bytes
 * shifted under the bits still held: "Reading bits in far too many ways", F. Giesen,
 * variant 4), so one refill serves every code of up to 56 bits. Near the end of its stream
 * the reader switches to a zero-padded copy of the last bytes: nothing is read outside the
 * stream, and a reader that runs past the end sees zeros and counts them (br_consumed). */
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
static inline uint64_t load_be64(const uint8_t* p) { return __builtin_bswap64(get_u64(p)); }
static inline void store_be64(uint8_t* p, uint64_t v) { put_u64(p, __builtin_bswap64(v)); }

static inline int bit_length(uint64_t d) { return d ? 64 - __builtin_clzll(d) : 1; }

/* ------------------------------------------------------------------ writer */

typedef struct {
  uint8_t* start;
  uint8_t* p;     /* the byte the pending bits begin in */
  uint8_t* end;   /* end of the buffer */
  uint64_t acc;   /* pending bits, most significant first; below them zeros */
  int n;          /* pending bits: 0..7 between puts */
  int overflow;
} bit_writer;

static inline void bw_init(bit_writer* w, uint8_t* p, int64_t cap) {
  w->start = w->p = p;
  w->end = p + (cap > 0 ? cap : 0);
  w->acc = 0;
  w->n = 0;
  w->overflow = 0;
}

/* Stores the pending bytes where fewer than 8 bytes remain: only inside the buffer;
 * returns 1 when they do not fit. (Values, not the writer: a writer whose address escapes
 * could not stay in registers.) */
static int bw_store_tail(uint8_t* p, const uint8_t* end, uint64_t acc, int n) {
  int64_t room = end - p, need = (n + 7) >> 3;
  for (int64_t i = 0; i < 8 && i < room; i++) p[i] = (uint8_t)(acc >> (56 - 8 * i));
  return need > room;
}

/* len <= 56 bits of v (v < 2^len), most significant first. */
static inline void bw_put(bit_writer* w, uint64_t v, int len) {
  w->acc |= (v << (63 - w->n - len)) << 1;
  w->n += len;
  if (__builtin_expect(w->p + 8 <= w->end, 1))
    store_be64(w->p, w->acc);
  else
    w->overflow |= bw_store_tail(w->p, w->end, w->acc, w->n);
  int whole = w->n >> 3;
  w->p += whole;
  w->acc <<= whole << 3;
  w->n &= 7;
}

/* bw_put where the caller made sure the stream's bytes plus 8 fit the buffer. */
static inline void bw_put_fit(bit_writer* w, uint64_t v, int len) {
  w->acc |= (v << (63 - w->n - len)) << 1;
  w->n += len;
  store_be64(w->p, w->acc);
  int whole = w->n >> 3;
  w->p += whole;
  w->acc <<= whole << 3;
  w->n &= 7;
}

/* Up to 64 bits. */
static inline void bw_put_wide(bit_writer* w, uint64_t v, int len) {
  if (len > 32) {
    bw_put(w, v >> 32, len - 32);
    bw_put(w, v & 0xFFFFFFFFull, 32);
  } else {
    bw_put(w, v, len);
  }
}

/* Bits written so far. */
static inline int64_t bw_bits(const bit_writer* w) { return (int64_t)(w->p - w->start) * 8 + w->n; }

/* Bytes of the stream, zero-padded to a byte (the last partial byte was stored by its put). */
static inline int64_t bw_bytes(const bit_writer* w) { return (int64_t)(w->p - w->start) + (w->n > 0); }

/* ------------------------------------------------------------------ reader */

typedef struct {
  const uint8_t* p;    /* next byte to load */
  const uint8_t* lim;  /* loads of 8 bytes stay below lim */
  uint64_t w;          /* window: cnt valid bits, most significant first, then stream bits */
  int cnt;
  int64_t origin;      /* stream byte of buf[0] */
  const uint8_t* buf;  /* the stream, or tail once switched */
  const uint8_t* stream;
  int64_t nbytes;
  int64_t nbits;
  uint8_t* tail;       /* BR_TAIL bytes of the caller's (a pointer, so that the reader's
                        * own address never escapes and it stays in registers) */
} bit_reader;

#define BR_TAIL 16

static inline void br_init(bit_reader* r, const uint8_t* p, int64_t nbits, uint8_t* tail) {
  r->stream = r->buf = r->p = p;
  r->nbits = nbits;
  r->nbytes = (nbits + 7) >> 3;
  r->lim = p + r->nbytes;
  r->w = 0;
  r->cnt = 0;
  r->origin = 0;
  r->tail = tail;
}

/* The next load would cross lim: continue from a zero-padded copy of the stream's rest
 * (fewer than 8 bytes; none once p is past the end, where the window's bits already are
 * the zeros past the stream). */
static inline __attribute__((always_inline)) void br_to_tail(bit_reader* r) {
  int64_t at = r->origin + (r->p - r->buf); /* stream byte of p */
  memset(r->tail, 0, BR_TAIL);
  if (at < r->nbytes) memcpy(r->tail, r->stream + at, (size_t)(r->nbytes - at));
  r->buf = r->p = r->tail;
  r->origin = at;
  r->lim = r->tail + BR_TAIL;
}

/* Afterwards cnt >= 56. */
static inline void br_refill(bit_reader* r) {
  if (__builtin_expect(r->p + 8 > r->lim, 0)) br_to_tail(r);
  r->w |= load_be64(r->p) >> r->cnt;
  r->p += (63 - r->cnt) >> 3;
  r->cnt |= 56;
}

/* The top n (1..56) bits of the window; the caller refilled. */
static inline uint64_t br_top(const bit_reader* r, int n) { return r->w >> (64 - n); }

static inline void br_skip(bit_reader* r, int n) {
  r->w <<= n;
  r->cnt -= n;
}

/* Bits consumed so far (more than nbits when the stream ran short). */
static inline int64_t br_consumed(const bit_reader* r) {
  return (r->origin + (r->p - r->buf)) * 8 - r->cnt;
}

/* n <= 56 bits. */
static inline uint64_t br_get(bit_reader* r, int n) {
  br_refill(r);
  uint64_t v = n ? br_top(r, n) : 0;
  br_skip(r, n);
  return v;
}

static inline uint64_t br_get_wide(bit_reader* r, int n) {
  if (n > 32) {
    uint64_t hi = br_get(r, n - 32);
    return (hi << 32) | br_get(r, 32);
  }
  return br_get(r, n);
}

#endif
