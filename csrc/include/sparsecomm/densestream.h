/*
 * sparsecomm DenseStream kernels ("DenseStream: A Novel Data Representation for
 * Gradient Sparsification", section III-A). Conventions: sparsecomm/abi.h.
 *
 * A DenseStream holds a sparse vector of length n as dense blocks: block b
 * covers [starts[b], starts[b] + lengths[b]) and holds lengths[b] consecutive
 * values; the values of all blocks lie back to back in one array. In memory
 * starts and lengths are int64; on the wire (sparsecomm/formats/densestream.py)
 * they take `width` bytes each (sc_ds_width).
 *
 * Canonical form (what every producing kernel here writes), section III-A:
 *   1) the first and last value of a block are non-zero;
 *   2) a block holds no run of more than T = sc_ds_max_zero_run(width, K)
 *      consecutive zeros, T = ceil(2 * width / K) with K the value size in
 *      bytes: a longer run costs more than the index and length of a new block
 *      (2 * width bytes), so the block is split there; a run of at most T zeros
 *      between two non-zeros stays inside the block.
 * So blocks are the maximal groups of non-zeros whose gaps are <= T zeros, and
 * the encoding of a vector is unique. "Zero" is +0.0 or -0.0 (a NaN is not
 * zero); zeros inside a block are written as +0.0.
 *
 * Blocks given as input (from a caller or decoded from a peer) need not be
 * canonical, only well formed, which every kernel checks first in full
 * (sc_ds_check_blocks): nblocks >= 0, every length >= 1, every start >= 0,
 * start[b] >= start[b-1] + length[b-1] (sorted, no overlap), every end <= n,
 * and the lengths summing to nvalues. Failures: SC_ERR_INDEX_RANGE (input 0
 * starts: a start < 0 or >= n; input 1 lengths: a length < 1 or an end past
 * n, value = the length), SC_ERR_INDEX_ORDER (input 0: a block starting
 * before the previous one ends, value = its start), SC_ERR_ARG (input 2: the
 * lengths sum to something other than nvalues, value = the sum).
 *
 * Producing kernels count or write: with the output pointers NULL they only
 * count (out->nblocks, out->nvalues); with outputs of cap_blocks / cap_values
 * elements they write, and return SC_ERR_ARG (the outputs partly written) if
 * the result does not fit. Callers either count first or allocate a bound:
 * encode_coo of m entries <= m blocks and min(n, m + (m - 1) T) values; add
 * <= nva + nvb blocks and min(n, nva + nvb + (nba + nbb) T) values; slice <=
 * nv blocks and nv values.
 * Value types: every sc_dtype but SC_U8. Sums of half types are computed in
 * float32 and rounded once. Serial kernels: O(input) time, no workspace.
 */
#ifndef SPARSECOMM_DENSESTREAM_H
#define SPARSECOMM_DENSESTREAM_H

#include "sparsecomm/abi.h"
#include "sparsecomm/wire.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes of an index or length field for a vector of n elements: the fewest
 * that hold n - 1 (starts are < n, lengths are stored minus one), at least 1.
 * Equals the paper's ceil(log2(n) / 8) for n >= 2. */
static inline int sc_ds_width(int64_t n) {
  int w = 1;
  uint64_t top = n > 1 ? (uint64_t)(n - 1) : 0;
  while (w < 8 && (top >> (8 * w)) != 0) w++;
  return w;
}

/* T = ceil(2 * width / vsize): the longest zero run a block keeps (section III-A, rule 2). */
static inline int64_t sc_ds_max_zero_run(int64_t width, int64_t vsize) {
  return vsize > 0 ? (2 * width + vsize - 1) / vsize : 0;
}

typedef struct {
  int64_t nblocks;
  int64_t nvalues;
} sc_ds_counts;

/* Well-formedness of blocks (see above). */
int sc_ds_check_blocks(const int64_t* starts, const int64_t* lengths, int64_t nblocks,
                       int64_t nvalues, int64_t n, sc_error_info* err);

/*
 * Canonical DenseStream of a COO vector (idx strictly ascending and < n,
 * checked in full as sc_check_sorted_indices does: err->input 0). Entries
 * whose value is zero are dropped (they are zeros of the vector). width 1..8.
 */
int sc_ds_encode_coo(sc_index_t it, sc_dtype vt, const void* idx, const void* val, int64_t m,
                     int64_t n, int64_t width, int64_t* starts, int64_t* lengths, void* values,
                     int64_t cap_blocks, int64_t cap_values, sc_ds_counts* out,
                     sc_error_info* err);

/* Canonical DenseStream of a dense vector x[0..n). */
int sc_ds_encode_dense(sc_dtype vt, const void* x, int64_t n, int64_t width, int64_t* starts,
                       int64_t* lengths, void* values, int64_t cap_blocks, int64_t cap_values,
                       sc_ds_counts* out, sc_error_info* err);

/*
 * a + b: the canonical DenseStream of the element-wise sum (a's value first:
 * a + b where both hold a position, the value of the one that does
 * otherwise). Sums that are exactly zero vanish, and blocks are re-split by
 * rule 2. Inputs checked with sc_ds_check_blocks (a: inputs 0..2, b: 3..5).
 */
int sc_ds_add(sc_dtype vt, const int64_t* sa, const int64_t* la, const void* va, int64_t nba,
              int64_t nva, const int64_t* sb, const int64_t* lb, const void* vb, int64_t nbb,
              int64_t nvb, int64_t n, int64_t width, int64_t* starts, int64_t* lengths,
              void* values, int64_t cap_blocks, int64_t cap_values, sc_ds_counts* out,
              sc_error_info* err);

/*
 * The part of a DenseStream inside [lo, hi) (0 <= lo <= hi <= n, else
 * SC_ERR_ARG), canonical: blocks cut at lo and hi lose the zeros at their new
 * ends, and gaps are re-split by rule 2. Indices stay global.
 */
int sc_ds_slice(sc_dtype vt, const int64_t* s, const int64_t* l, const void* v, int64_t nb,
                int64_t nv, int64_t n, int64_t lo, int64_t hi, int64_t width, int64_t* starts,
                int64_t* lengths, void* values, int64_t cap_blocks, int64_t cap_values,
                sc_ds_counts* out, sc_error_info* err);

/* dense[i] += value for every position i the blocks hold (dense has n elements). */
int sc_ds_add_into(sc_dtype vt, void* dense, int64_t n, const int64_t* s, const int64_t* l,
                   const void* v, int64_t nb, int64_t nv, sc_error_info* err);

/*
 * The non-zero entries as COO: idx (int64, ascending) and their values. Two
 * passes as above: NULL outputs count (*count), then cap >= *count writes.
 */
int sc_ds_to_coo(sc_dtype vt, const int64_t* s, const int64_t* l, const void* v, int64_t nb,
                 int64_t nv, int64_t n, int64_t* idx, void* val, int64_t cap, int64_t* count,
                 sc_error_info* err);

/* ------------------------------------------------------------------ wire */

/*
 * DenseStream message (sparsecomm/formats/densestream.py), little-endian:
 *   [header 32 B: kind SC_KIND_DENSE_BLOCKS, float value dtype, index dtype 0,
 *                 sender, N, count = nblocks]
 *   [lo int64][hi int64]     the range [lo, hi) of [0, N) the blocks lie in
 *   [nvalues int64]          values over all blocks
 *   [width uint8][7 bytes 0] field width: sc_ds_width(N)
 *   [nblocks starts, width bytes each][nblocks (length - 1), width bytes each]
 *   zero-padded to 8 B
 *   [nvalues values] zero-padded to 8 B
 * Checks, in message order (the first field at fault is reported, as wire.h):
 * the header (sc_wire_check_header with want: kind, index dtype 0, value
 * dtype, sender, n, count), a float value dtype, count <= N, 0 <= lo <= hi <=
 * N and equal to want_lo / want_hi when those are >= 0 (SC_WF_DS_RANGE, at
 * byte 32 or 40), nblocks <= nvalues <= hi - lo (SC_WF_DS_NVALUES), width ==
 * sc_ds_width(N) (SC_WF_DS_WIDTH), the 7 bytes after it zero
 * (SC_WF_RESERVED), the exact size (SC_WF_SIZE), padding zero
 * (SC_WF_PADDING), then block by block: lo <= start and start + length <= hi
 * (SC_WF_DS_BLOCK_RANGE, position = block, value = start or end), start >=
 * the previous block's end (SC_WF_DS_BLOCK_ORDER: unsorted or overlapping),
 * and the lengths summing to nvalues (SC_WF_DS_NVALUES, position -1, value =
 * the sum). Values are not checked (any bit pattern is a value) and blocks
 * need not be canonical. Reads nothing past msg[nbytes).
 */
#define SC_DS_PREFIX_NBYTES 64

/* err->input of SC_ERR_MALFORMED for the fields only this message has
 * (after sc_wire_field's codes). */
typedef enum {
  SC_WF_DS_RANGE = 32,       /* lo, hi */
  SC_WF_DS_NVALUES = 33,     /* nvalues, or the lengths' sum */
  SC_WF_DS_WIDTH = 34,       /* byte 56 */
  SC_WF_DS_BLOCK_ORDER = 35, /* a block starts before the previous one ends */
  SC_WF_DS_BLOCK_RANGE = 36  /* a block outside [lo, hi) */
} sc_ds_wire_field;

typedef struct {
  sc_wire_header h;
  int64_t n, nblocks, nvalues, lo, hi, width;
  int64_t starts_pos;  /* first byte of the start fields */
  int64_t lengths_pos; /* first byte of the length fields */
  int64_t values_pos;  /* first value byte */
  int64_t value_size;
} sc_ds_layout;

int sc_wire_check_densestream(const uint8_t* msg, int64_t nbytes, const sc_wire_expect* want,
                              int64_t want_lo, int64_t want_hi, sc_ds_layout* out,
                              sc_error_info* err);

#ifdef __cplusplus
}
#endif

#endif /* SPARSECOMM_DENSESTREAM_H */
