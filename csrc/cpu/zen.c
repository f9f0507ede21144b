/* ZEN kernels: the hash partition of the index space and the class bitmap ("ZEN:
 * Empowering Distributed Training with Sparsity-driven Data Synchronization").
 * Contract: csrc/include/sparsecomm/zen.h. */
#include <stdint.h>
#include <string.h>

#include "sparsecomm/zen.h"
#include "common.h"

/* little-endian bytes as a uint64 (bit j of the word = bit j % 8 of byte j / 8) */
static inline uint64_t sc_zen_le64(uint64_t w) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  return __builtin_bswap64(w);
#else
  return w;
#endif
}

static int check_args(int64_t n, int64_t parts, int64_t block, sc_error_info* err) {
  if (n < 0) return sc_fail(err, SC_ERR_ARG, 1, 0, n);
  if (parts < 1 || parts > SC_ZEN_MAX_PARTS) return sc_fail(err, SC_ERR_ARG, 2, 0, parts);
  if (sc_zen_log2(block) < 0) return sc_fail(err, SC_ERR_ARG, 3, 0, block);
  return SC_OK;
}

/* idx strictly ascending in [0, n) */
static int check_indices(const int64_t* idx, int64_t m, int64_t n, sc_error_info* err) {
  for (int64_t j = 0; j < m; j++) {
    if (idx[j] < 0 || idx[j] >= n) return sc_fail(err, SC_ERR_INDEX_RANGE, 0, j, idx[j]);
    if (j && idx[j] <= idx[j - 1]) return sc_fail(err, SC_ERR_INDEX_ORDER, 0, j, idx[j]);
  }
  return SC_OK;
}

int sc_zen_partition(sc_dtype vtype, const int64_t* idx, const void* val, int64_t m, int64_t n, int64_t parts,
                     uint64_t seed, int64_t block, int64_t* out_idx, void* out_val, int64_t* counts,
                     sc_error_info* err) {
  int st = check_args(n, parts, block, err);
  if (st) return st;
  size_t vs = sc_dtype_size(vtype);
  if (vs == 0 || vtype == SC_U8) return sc_fail(err, SC_ERR_ARG, 5, 0, (int64_t)vtype);
  if (m < 0) return sc_fail(err, SC_ERR_ARG, 0, 0, m);
  st = check_indices(idx, m, n, err);
  if (st) return st;
  const int lb = sc_zen_log2(block);
  memset(counts, 0, (size_t)parts * sizeof(int64_t));
  /* ascending indices: consecutive entries of one block share its owner (hashed once) */
  int64_t last = -1;
  uint32_t o = 0;
  for (int64_t j = 0; j < m; j++) {
    int64_t b = idx[j] >> lb;
    if (b != last) {
      o = sc_zen_block_owner(seed, b, (uint64_t)parts);
      last = b;
    }
    counts[o]++;
  }
  /* counts -> running write positions, restored to counts at the end */
  int64_t sum = 0;
  for (int64_t c = 0; c < parts; c++) {
    int64_t k = counts[c];
    counts[c] = sum;
    sum += k;
  }
  const uint8_t* v = (const uint8_t*)val;
  uint8_t* ov = (uint8_t*)out_val;
  last = -1;
  for (int64_t j = 0; j < m; j++) {
    int64_t b = idx[j] >> lb;
    if (b != last) {
      o = sc_zen_block_owner(seed, b, (uint64_t)parts);
      last = b;
    }
    int64_t at = counts[o]++;
    out_idx[at] = idx[j];
    memcpy(ov + (size_t)at * vs, v + (size_t)j * vs, vs);
  }
  /* counts[c] is now the end of owner c's pairs: back to counts */
  int64_t prev = 0;
  for (int64_t c = 0; c < parts; c++) {
    int64_t end = counts[c];
    counts[c] = end - prev;
    prev = end;
  }
  return SC_OK;
}

static int class_size(int64_t n, int64_t parts, uint64_t seed, int64_t block, int64_t owner, int64_t* size,
                      sc_error_info* err) {
  int st = check_args(n, parts, block, err);
  if (st) return st;
  if (owner < 0 || owner >= parts) return sc_fail(err, SC_ERR_ARG, 4, 0, owner);
  const int64_t nblocks = n ? ((n - 1) / block) + 1 : 0;
  int64_t blocks = 0;
  for (int64_t b = 0; b < nblocks; b++) blocks += sc_zen_block_owner(seed, b, (uint64_t)parts) == (uint64_t)owner;
  int64_t s = blocks * block;
  if (nblocks && sc_zen_block_owner(seed, nblocks - 1, (uint64_t)parts) == (uint64_t)owner)
    s -= nblocks * block - n; /* the last block is short */
  *size = s;
  return SC_OK;
}

int sc_zen_class_size(int64_t n, int64_t parts, uint64_t seed, int64_t block, int64_t owner, int64_t* size,
                      sc_error_info* err) {
  return class_size(n, parts, seed, block, owner, size, err);
}

int sc_zen_bitmap_encode(const int64_t* idx, int64_t m, int64_t n, int64_t parts, uint64_t seed, int64_t block,
                         int64_t owner, uint8_t* bitmap, int64_t nbytes, sc_error_info* err) {
  int64_t cs = 0;
  int st = class_size(n, parts, seed, block, owner, &cs, err);
  if (st) return st;
  if (nbytes != (cs + 7) / 8) return sc_fail(err, SC_ERR_ARG, 5, 0, nbytes);
  if (m < 0) return sc_fail(err, SC_ERR_ARG, 0, 0, m);
  st = check_indices(idx, m, n, err);
  if (st) return st;
  memset(bitmap, 0, (size_t)nbytes);
  const int lb = sc_zen_log2(block);
  /* walk the blocks once, counting owner's blocks before the current index's block */
  int64_t b = 0, before = 0;
  for (int64_t j = 0; j < m; j++) {
    int64_t bj = idx[j] >> lb;
    for (; b < bj; b++) before += sc_zen_block_owner(seed, b, (uint64_t)parts) == (uint64_t)owner;
    if (sc_zen_block_owner(seed, bj, (uint64_t)parts) != (uint64_t)owner)
      return sc_fail(err, SC_ERR_ARG, 0, j, idx[j]);
    int64_t pos = before * block + (idx[j] & (block - 1));
    bitmap[pos >> 3] |= (uint8_t)(1u << (pos & 7));
  }
  return SC_OK;
}

int sc_zen_bitmap_decode(const uint8_t* bitmap, int64_t nbytes, int64_t n, int64_t parts, uint64_t seed,
                         int64_t block, int64_t owner, int64_t* out_idx, int64_t cap, int64_t* count,
                         sc_error_info* err) {
  int64_t cs = 0;
  int st = class_size(n, parts, seed, block, owner, &cs, err);
  if (st) return st;
  if (nbytes != (cs + 7) / 8) return sc_fail(err, SC_ERR_MALFORMED, 0, -1, nbytes);
  if (cs & 7) {
    uint8_t pad = (uint8_t)(bitmap[nbytes - 1] & (uint8_t)(0xFFu << (cs & 7)));
    if (pad) return sc_fail(err, SC_ERR_MALFORMED, 0, nbytes - 1, bitmap[nbytes - 1]);
  }
  if (!out_idx) {
    int64_t c = 0, j = 0;
    for (; j + 8 <= nbytes; j += 8) {
      uint64_t w;
      memcpy(&w, bitmap + j, 8);
      c += __builtin_popcountll(w);
    }
    for (; j < nbytes; j++) c += __builtin_popcount(bitmap[j]);
    *count = c;
    return SC_OK;
  }
  const int64_t nblocks = n ? ((n - 1) / block) + 1 : 0;
  int64_t pos = 0, c = 0;
  for (int64_t b = 0; b < nblocks && pos < cs; b++) {
    if (sc_zen_block_owner(seed, b, (uint64_t)parts) != (uint64_t)owner) continue;
    const int64_t lo = b * block, len = (lo + block <= n) ? block : n - lo;
    /* the block's bits [pos, pos + len), a byte (or its part) at a time, set bits by ctz */
    int64_t t = 0;
    if (!(pos & 7)) /* byte-aligned (every block when block >= 8): 64 bits at a time */
      for (; t + 64 <= len; t += 64) {
        uint64_t w;
        memcpy(&w, bitmap + ((pos + t) >> 3), 8);
        w = sc_zen_le64(w);
        while (w) {
          if (c >= cap) return sc_fail(err, SC_ERR_ARG, 0, c, cap);
          out_idx[c++] = lo + t + __builtin_ctzll(w);
          w &= w - 1;
        }
      }
    while (t < len) {
      const int64_t p = pos + t;
      const int sh = (int)(p & 7);
      const int take = (int)((8 - sh) < (len - t) ? (8 - sh) : (len - t));
      unsigned bits = ((unsigned)bitmap[p >> 3] >> sh) & ((1u << take) - 1u);
      while (bits) {
        if (c >= cap) return sc_fail(err, SC_ERR_ARG, 0, c, cap);
        out_idx[c++] = lo + t + __builtin_ctz(bits);
        bits &= bits - 1;
      }
      t += take;
    }
    pos += len;
  }
  *count = c;
  return SC_OK;
}
