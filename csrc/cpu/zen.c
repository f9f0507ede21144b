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

/* Bit t set when block b0 + t (t < nb <= 64) belongs to owner: independent hashes and no
 * branch, so a walk over the blocks pays no misprediction for the (P - 1) / P it skips. */
static inline uint64_t owner_mask(uint64_t seed, int64_t b0, int64_t nb, uint64_t parts, uint64_t owner) {
  uint64_t mask = 0;
  for (int64_t t = 0; t < nb; t++) mask |= (uint64_t)(sc_zen_block_owner(seed, b0 + t, parts) == owner) << t;
  return mask;
}

/* copy one value of vs bytes (the common sizes as plain loads and stores) */
static inline void copy_value(uint8_t* dst, const uint8_t* src, size_t vs) {
  switch (vs) {
    case 4: memcpy(dst, src, 4); break;
    case 2: memcpy(dst, src, 2); break;
    case 8: memcpy(dst, src, 8); break;
    default: memcpy(dst, src, vs);
  }
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
    copy_value(ov + (size_t)at * vs, v + (size_t)j * vs, vs);
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
  /* one walk over the owner's blocks (64 owner tests at a time) beside the ascending indices:
   * `before` counts the owner's blocks below the current one, so a block's class position is
   * before * block; an index whose block the walk passes without a match is of another class */
  int64_t j = 0, before = 0;
  const int64_t nblocks = n ? ((n - 1) / block) + 1 : 0;
  for (int64_t b0 = 0; b0 < nblocks && j < m; b0 += 64) {
    const int64_t nb = nblocks - b0 < 64 ? nblocks - b0 : 64;
    if ((idx[j] >> lb) >= b0 + nb) { /* no index in these 64 blocks */
      before += sc_zen_popcount64(owner_mask(seed, b0, nb, (uint64_t)parts, (uint64_t)owner));
      continue;
    }
    uint64_t mask = owner_mask(seed, b0, nb, (uint64_t)parts, (uint64_t)owner);
    while (j < m && (idx[j] >> lb) < b0 + nb) {
      const int64_t t = (idx[j] >> lb) - b0;
      if (!((mask >> t) & 1)) return sc_fail(err, SC_ERR_ARG, 0, j, idx[j]);
      /* the owner's blocks of this chunk below block t */
      const uint64_t below = t ? (mask & (~0ull >> (64 - t))) : 0;
      const int64_t pos = (before + sc_zen_popcount64(below)) * block + (idx[j] & (block - 1));
      bitmap[pos >> 3] |= (uint8_t)(1u << (pos & 7));
      j++;
    }
    before += sc_zen_popcount64(mask);
  }
  return SC_OK;
}

/* a bitmap of nbytes over a class of cs indices: the length and the padding bits */
static int check_bitmap_tail(const uint8_t* bitmap, int64_t nbytes, int64_t cs, sc_error_info* err) {
  if (nbytes != (cs + 7) / 8) return sc_fail(err, SC_ERR_MALFORMED, 0, -1, nbytes);
  if (cs & 7) {
    uint8_t pad = (uint8_t)(bitmap[nbytes - 1] & (uint8_t)(0xFFu << (cs & 7)));
    if (pad) return sc_fail(err, SC_ERR_MALFORMED, 0, nbytes - 1, bitmap[nbytes - 1]);
  }
  return SC_OK;
}

int sc_zen_bitmap_decode(const uint8_t* bitmap, int64_t nbytes, int64_t n, int64_t parts, uint64_t seed,
                         int64_t block, int64_t owner, int64_t* out_idx, int64_t cap, int64_t* count,
                         sc_error_info* err) {
  if (!out_idx) {
    /* the class measured only as far as the bitmap reaches: a bitmap too short for its class is
     * found within its own length, not after a walk over all n / block blocks */
    int st = check_args(n, parts, block, err);
    if (st) return st;
    if (owner < 0 || owner >= parts) return sc_fail(err, SC_ERR_ARG, 4, 0, owner);
    if (nbytes < 0 || nbytes > n / 8 + (n % 8 != 0)) return sc_fail(err, SC_ERR_MALFORMED, 0, -1, nbytes);
    const int64_t nbits = nbytes * 8, nblocks = n ? ((n - 1) / block) + 1 : 0;
    int64_t cs = 0;
    for (int64_t b = 0; b < nblocks && cs <= nbits; b++)
      if (sc_zen_block_owner(seed, b, (uint64_t)parts) == (uint64_t)owner)
        cs += n - b * block < block ? n - b * block : block; /* the last block may be short */
    st = check_bitmap_tail(bitmap, nbytes, cs, err);
    if (st) return st;
    int64_t c = 0, j = 0;
    for (; j + 8 <= nbytes; j += 8) {
      uint64_t w;
      memcpy(&w, bitmap + j, 8);
      c += sc_zen_popcount64(w);
    }
    for (; j < nbytes; j++) c += sc_zen_popcount64(bitmap[j]);
    *count = c;
    return SC_OK;
  }
  int st = check_args(n, parts, block, err);
  if (st) return st;
  if (owner < 0 || owner >= parts) return sc_fail(err, SC_ERR_ARG, 4, 0, owner);
  /* one walk over the owner's blocks measures the class (pos) while it reads the bits; no bit
   * is read past nbytes, and the length and padding are checked when the class is known */
  const int64_t nbits = nbytes * 8;
  const int64_t nblocks = n ? ((n - 1) / block) + 1 : 0;
  int64_t pos = 0, c = 0;
  for (int64_t b0 = 0; b0 < nblocks; b0 += 64) {
    const int64_t nb = nblocks - b0 < 64 ? nblocks - b0 : 64;
    uint64_t mask = owner_mask(seed, b0, nb, (uint64_t)parts, (uint64_t)owner);
    for (; mask; mask &= mask - 1) {
      const int64_t b = b0 + __builtin_ctzll(mask);
      const int64_t lo = b * block, len = (lo + block <= n) ? block : n - lo;
      if (pos + len > nbits) return sc_fail(err, SC_ERR_MALFORMED, 0, -1, nbytes); /* shorter than the class */
      /* the block's bits [pos, pos + len), set bits by ctz */
      int64_t t = 0;
      if (!(pos & 7)) /* byte-aligned (every block when block >= 8): 64 bits at a time */
        for (; t + 64 <= len; t += 64) {
          uint64_t w;
          memcpy(&w, bitmap + ((pos + t) >> 3), 8);
          w = sc_zen_le64(w);
          /* capacity checked once per word, so the bit loop is a short dependency chain */
          const int64_t bits = sc_zen_popcount64(w);
          if (c + bits > cap) return sc_fail(err, SC_ERR_ARG, 0, c, cap);
          int64_t* o = out_idx + c;
          c += bits;
          for (const int64_t base = lo + t; w; w &= w - 1) *o++ = base + __builtin_ctzll(w);
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
  }
  st = check_bitmap_tail(bitmap, nbytes, pos, err);
  if (st) return st;
  *count = c;
  return SC_OK;
}
