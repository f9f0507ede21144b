/*
 * sparsecomm ZEN kernels: the hash partition of the index space ("ZEN: Empowering
 * Distributed Training with Sparsity-driven Data Synchronization", OSDI 2025: the
 * hash-based partition of the balanced parallelism), and the bitmap of one owner's hash
 * class. Conventions: sparsecomm/abi.h.
 *
 * The index space [0, n) is cut into blocks of `block` indices (a power of two, >= 1);
 * block b = i >> log2(block) belongs to owner
 *
 *   z = sc_mix64((uint64)b + seed + 0x9E3779B97F4A7C15)      (splitmix64's output)
 *   owner = (uint32)(((z >> 32) * parts) >> 32)                (fastrange of the top half)
 *
 * (sc_zen_owner), for 1 <= parts <= 2^31 - 1. Owner c's hash class is the ascending
 * list of the indices of its blocks (the last block of [0, n) may be short); position j
 * of the class is its j-th index. The torch implementation
 * (sparsecomm/ops/_torch_impl/zen.py) computes the same bits.
 *
 * Inputs of indices are int64, strictly ascending and in [0, n): SC_ERR_INDEX_ORDER /
 * SC_ERR_INDEX_RANGE (input 0) otherwise. Serial kernels, O(input + n / block) at most,
 * no workspace.
 */
#ifndef SPARSECOMM_ZEN_H
#define SPARSECOMM_ZEN_H

#include "sparsecomm/abi.h"
#include "sparsecomm/bitexact.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SC_ZEN_MAX_PARTS 2147483647LL

static inline SC_BITEXACT uint32_t sc_zen_block_owner(uint64_t seed, int64_t b, uint64_t parts) {
  uint64_t z = sc_mix64((uint64_t)b + seed + 0x9E3779B97F4A7C15ull);
  return (uint32_t)(((z >> 32) * parts) >> 32);
}

static inline SC_BITEXACT uint32_t sc_zen_owner(uint64_t seed, int64_t i, int log2_block, uint64_t parts) {
  return sc_zen_block_owner(seed, i >> log2_block, parts);
}

/* The set bits of x. Not __builtin_popcountll: without -mpopcnt (the extension builds for
 * baseline x86-64) that is a library call per word, which made a class bitmap's decode 3x slower. */
static inline SC_BITEXACT int sc_zen_popcount64(uint64_t x) {
  x = x - ((x >> 1) & 0x5555555555555555ull);
  x = (x & 0x3333333333333333ull) + ((x >> 2) & 0x3333333333333333ull);
  x = (x + (x >> 4)) & 0x0F0F0F0F0F0F0F0Full;
  return (int)((x * 0x0101010101010101ull) >> 56);
}

/* log2 of block when it is a power of two >= 1, else -1. */
static inline int sc_zen_log2(int64_t block) {
  if (block < 1 || (block & (block - 1))) return -1;
  int s = 0;
  while (((int64_t)1 << s) < block) s++;
  return s;
}

/* Stable partition of m pairs (idx ascending) by owner: out_idx / out_val hold owner 0's
 * pairs, then owner 1's, ..., each in input (ascending) order; counts[c] (parts entries)
 * the pairs of owner c. Values are copied as `vtype` elements. SC_ERR_ARG (input 2:
 * parts, 3: block) for parts outside 1..2^31-1 or block not a power of two. */
int sc_zen_partition(sc_dtype vtype, const int64_t* idx, const void* val, int64_t m, int64_t n, int64_t parts,
                     uint64_t seed, int64_t block, int64_t* out_idx, void* out_val, int64_t* counts,
                     sc_error_info* err);

/* The length of owner's hash class over [0, n) (argument checks as above; input 4: owner
 * outside [0, parts)); *size receives it. */
int sc_zen_class_size(int64_t n, int64_t parts, uint64_t seed, int64_t block, int64_t owner, int64_t* size,
                      sc_error_info* err);

/* The bitmap of m ascending indices of owner's class: bit j (byte j / 8, bit j % 8, LSB
 * first) set when the class's j-th index is among them; nbytes must be ceil(class size /
 * 8) (SC_ERR_ARG, input 5); every index must be in the class (SC_ERR_ARG, input 0, value the
 * index). Padding bits are written zero. */
int sc_zen_bitmap_encode(const int64_t* idx, int64_t m, int64_t n, int64_t parts, uint64_t seed, int64_t block,
                         int64_t owner, uint8_t* bitmap, int64_t nbytes, sc_error_info* err);

/* The ascending indices of the set bits of a received class bitmap, validated in full:
 * nbytes == ceil(class size / 8) (SC_ERR_MALFORMED, position -1, value nbytes) and every
 * padding bit zero (SC_ERR_MALFORMED, position = the byte, value = its bits). With out_idx
 * NULL it validates, then counts (*count); else it writes at most cap indices (SC_ERR_ARG if
 * more; the popcount of the whole bitmap is always enough) while it walks the class once, and
 * returns SC_OK only once the length and padding have been checked (on an error what it wrote
 * is to be discarded). */
int sc_zen_bitmap_decode(const uint8_t* bitmap, int64_t nbytes, int64_t n, int64_t parts, uint64_t seed,
                         int64_t block, int64_t owner, int64_t* out_idx, int64_t cap, int64_t* count,
                         sc_error_info* err);

#ifdef __cplusplus
}
#endif

#endif
