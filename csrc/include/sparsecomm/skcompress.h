/* SKCompress kernels of sparsecomm ("SKCompress: compressing sparse and nonuniform
 * gradient", sections 4-6 and Appendix A). Conventions: sparsecomm/abi.h.
 *
 * Four parts, each usable on its own and all used by the message codec below:
 *
 * 1. Quantiles (section 4.1, step 1). Exact by default: an O(n) radix select over the
 *    bits of the values (a histogram of the key range, then only the keys of the bins
 *    holding a wanted rank, bin by bin). With more than exact_max values, a deterministic
 *    mergeable compactor hierarchy (the KLL/MRL family with a fixed capacity per level):
 *    level h holds items of weight 2^h; a full level (k items) is sorted and every other
 *    item (offset alternating per level) moves up with twice the weight. Error bound: a
 *    compaction at level h moves any rank by at most 2^h and there are at most n / (k 2^h)
 *    of them (each consumes weight k 2^h of the n inserted), so for any x
 *    |est_rank(x) - rank(x)| <= n * H / k, H = the number of levels that compacted
 *    (<= floor(log2(n / k)) + 1). Merging two sketches keeps the bound (the argument only
 *    counts weight).
 *
 * 2. Quantile-bucket quantification with separate signs (section 4.2, Solution 1).
 *    q buckets in all: B = q / 2 per sign, over magnitudes |v| (zeros count as
 *    positive). For a sign with n_s values, nb = min(B, n_s) buckets are used with
 *    splits s_0 = min |v|, s_nb = max |v| (both exact) and s_j = quantile(j / nb)
 *    (the item at 0-based rank floor(j n_s / nb)) in between. A magnitude a lies in
 *    bucket b = #{j in 1..nb-1 : s_j <= a}, so s_b <= a <= s_{b+1}; bucket b decodes
 *    to mean_b = (s_b + s_{b+1}) / 2 rounded once to the value dtype (rounding is
 *    monotone and both ends are representable, so s_b <= mean_b <= s_{b+1}).
 *    Indices count from zero outwards, so a smaller index is a smaller magnitude. The
 *    splits are the sender's choice: the receiver reads only the means.
 *
 * 3. Grouped MinMaxSketch (section 4.2; Appendix A.2, A.3). The B buckets of each
 *    sign form r groups of G = ceil(B / r) consecutive buckets; a key belongs to the
 *    list l = sign * r + group of its bucket (sign 0 negative), so 2r lists. Each list
 *    has its own sketch of s rows x cols cells holding the bucket offset inside the
 *    group (0..G-1): insert = Min over the key's s cells, query = Max. Every cell a key
 *    reaches holds a value <= its own offset, so the decoded offset never exceeds the
 *    true one: the decoded bucket is in the same sign and group, never further from zero,
 *    at most G - 1 buckets closer. Column of key k in row j: one hash serves a pair
 *    of rows,
 *      mix(z)   = splitmix64 finaliser (xor-shift 30, *0xBF58476D1CE4E5B9,
 *                 xor-shift 27, *0x94D049BB133111EB, xor-shift 31)
 *      h        = mix(k ^ mix(0x5C0DE + floor(j / 2)))
 *      col_j(k) = ((h >> 32) * cols) >> 32             (j even)
 *                 ((h & 0xFFFFFFFF) * cols) >> 32      (j odd)
 *    The keys are sent once, in ascending order, and each key's list l as a Huffman code
 *    (the list ids): Appendix A.3 delta-codes the keys of each group apart, which pays
 *    for the group in longer deltas (4.6-6.6 bits a key on real gradients, as much as an
 *    explicit id on random ones) and leaves the receiver a 2r-way merge.
 *
 * 4. Huffman coding (section 4.3, 5.2): canonical codes, lengths 1..15 (lengths over 15
 *    are avoided by halving the frequencies and rebuilding), sent as one byte per symbol
 *    (0 = unused); a single used symbol gets length 1. Codes are assigned in order of
 *    (length, symbol) and written most significant bit first.
 *
 * 5. Delta-binary keys with adaptive prefix (section 5). Sorted distinct keys become
 *    d_0 = k_0, d_i = k_i - k_{i-1} - 1. The key width W is 32 bits when N <= 2^32,
 *    else 64; with m intervals of b = W / m bits, a delta takes c = max(1, ceil(bits(d)
 *    / b)) intervals, written as the prefix c - 1 (log2 m bits, or a Huffman code over
 *    the m prefix values) then c * b bits of d. The encoder counts bits(d) once and
 *    computes the exact size of all 8 schemes (m in {2, 4, 8, 16} x fixed or Huffman,
 *    table included), keeping the smallest (ties: smaller m, fixed first).
 *
 * Message body (after the 32-byte sparsecomm header, kind COO_CODED; little-endian):
 *
 *   [u8 index_codec (0 raw, 1 delta_binary)][u8 value_codec (0 raw, 1 skcompress)]
 *   [u8 revision = SC_SKC_REVISION][5 x 0]
 *   value codec raw:        [keys section of all count keys][count raw values]
 *   value codec skcompress: [u32 B][u16 G][u8 s][u8 r]
 *                           [u32 nb_neg][u32 nb_pos][nb_neg means][nb_pos means]
 *                           2r x [varint n_l][varint cols_l]  (negative groups 0..r-1, then positive)
 *                           [2r bytes: Huffman code lengths of the list ids]
 *                           [u64 id bits][the count keys' list ids, Huffman coded, in key order]
 *                           [G bytes: Huffman code lengths of cell values]
 *                           [u64 cell bits][cells, Huffman coded, list by list, row-major]
 *                           [keys section of all count keys]
 *   keys section raw:          n keys as int32 (N < 2^31) or int64
 *   keys section delta_binary: [u8 m][u8 scheme (0 fixed, 1 Huffman)][m code lengths if Huffman]
 *                              K x [u64 bits of stream k][K bit streams, each zero-padded to a byte]
 *     K = 1 below 8192 keys, else 2: stream 0 holds the first floor(n / 2) keys, stream 1 the
 *     rest; each stream's first delta is taken from -1 (its key itself), so the two streams
 *     decode independently (two chains of codes at once); the scheme is chosen over both.
 *   varint: LEB128 (7 bits a byte, low first, high bit = more), at most 10 bytes, no
 *   needless trailing zero byte.
 * Means have the value dtype (float32 or float64).
 *
 * The decoder validates everything: codecs (and that they are the expected ones), the
 * revision, reserved bytes, B, G, s, r, nb <= B, means finite, >= 0 and non-decreasing,
 * list sizes summing to count, cols >= 1 exactly for non-empty lists and <= 64 n_l + 64,
 * varints, code tables (lengths <= 15, a complete code or one symbol of length 1; a list
 * id has a code exactly when its list is not empty), the id bit count (the sum of n_l
 * times its code length) and each list's id count, every code present, prefix values
 * < m, deltas keeping keys < N, keys strictly ascending (also from one key stream to the
 * next), a decoded bucket < nb, exact bit counts with zero padding, and the exact total
 * length. Failures: SC_ERR_MALFORMED with
 * err = (field sc_skc_field, byte offset, value).
 */
#ifndef SPARSECOMM_SKCOMPRESS_H
#define SPARSECOMM_SKCOMPRESS_H

#include "sparsecomm/abi.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SC_SKC_MAX_Q 4096        /* q (both signs) in [2, SC_SKC_MAX_Q], even */
#define SC_SKC_MAX_ROWS 16       /* s in [1, 16] */
#define SC_SKC_MAX_T 64.0        /* t (columns per key of a list) in (0, 64] */
#define SC_SKC_MAX_CODE_LEN 15
#define SC_SKC_SKETCH_K 4096     /* quantile sketch capacity per level */
#define SC_SKC_BODY_HEAD 8
/* The body layout's revision (body byte 2): bodies of another revision are refused. */
#define SC_SKC_REVISION 2

enum { SC_SKC_INDEX_RAW = 0, SC_SKC_INDEX_DELTA = 1 };
enum { SC_SKC_VALUE_RAW = 0, SC_SKC_VALUE_SKETCH = 1 };
enum { SC_SKC_PREFIX_AUTO = 0, SC_SKC_PREFIX_FIXED = 1, SC_SKC_PREFIX_HUFFMAN = 2 };

/* Fields a malformed body is reported in (err->input). */
typedef enum {
  SC_SKC_F_SIZE = 0,        /* body shorter or longer than its fields say */
  SC_SKC_F_CODEC = 1,       /* unknown codec, or not the expected one */
  SC_SKC_F_RESERVED = 2,
  SC_SKC_F_PARAMS = 3,      /* B, G, s, r */
  SC_SKC_F_BUCKETS = 4,     /* nb > B */
  SC_SKC_F_MEANS = 5,       /* a mean not finite, negative or decreasing */
  SC_SKC_F_LISTS = 6,       /* list sizes or columns */
  SC_SKC_F_CODE_TABLE = 7,  /* code lengths */
  SC_SKC_F_CODE = 8,        /* a bit pattern that is no code, or a stream running short */
  SC_SKC_F_PADDING = 9,     /* bit count or padding bits */
  SC_SKC_F_PREFIX = 10,     /* m, scheme, a prefix value */
  SC_SKC_F_INDEX_RANGE = 11,
  SC_SKC_F_INDEX_ORDER = 12,
  SC_SKC_F_CELL = 13,       /* a decoded bucket >= nb */
  SC_SKC_F_COUNT = 14,      /* count too large for the body */
  SC_SKC_F_REVISION = 15    /* a body of another layout revision */
} sc_skc_field;

typedef struct {
  int index_codec;    /* SC_SKC_INDEX_* */
  int value_codec;    /* SC_SKC_VALUE_* */
  int64_t q;          /* buckets in all (both signs), even, 2..SC_SKC_MAX_Q */
  int64_t s;          /* MinMaxSketch rows, 1..SC_SKC_MAX_ROWS */
  double t;           /* columns per key of each list's sketch, (0, SC_SKC_MAX_T] */
  int64_t r;          /* groups per sign, 1..q/2 */
  int64_t m;          /* 0 = choose, else 2, 4, 8 or 16 */
  int prefix;         /* SC_SKC_PREFIX_* */
  int64_t exact_max;  /* exact quantiles when a sign has <= exact_max values, else the sketch */
} sc_skc_options;

/* ---- quantile sketch ---- */
typedef struct sc_qsketch sc_qsketch;
/* k even, >= 2 (NULL on a bad k or no memory). */
sc_qsketch* sc_qsketch_new(int64_t k);
void sc_qsketch_free(sc_qsketch* s);
int sc_qsketch_update(sc_qsketch* s, double x, sc_error_info* err); /* NaN: SC_ERR_NAN */
int sc_qsketch_merge(sc_qsketch* dst, const sc_qsketch* src, sc_error_info* err);
int64_t sc_qsketch_count(const sc_qsketch* s);
int64_t sc_qsketch_levels(const sc_qsketch* s); /* levels holding items (H + 1) */
/* out[j] = the smallest item whose cumulative weight exceeds floor(j n / nq),
 * j = 0..nq-1 (n = count >= 1). */
int sc_qsketch_quantiles(const sc_qsketch* s, int64_t nq, double* out, sc_error_info* err);

/* Quantiles of x[0..n) (float32/float64): out[j] as above for j = 0..nq-1, out[nq] = max;
 * exact (radix select; -0.0 ranks below +0.0) when n <= exact_max, else from a sketch of
 * capacity SC_SKC_SKETCH_K. n >= 1, nq >= 1. NaN: SC_ERR_NAN. */
int sc_skc_quantiles(sc_dtype vt, const void* x, int64_t n, int64_t nq, int64_t exact_max,
                     double* out, sc_error_info* err);

/* Quantification of v[0..n) as the codec does it: bucket[i] = magnitude bucket of v[i]
 * (sign given by v), splits (2 x (q/2 + 1), row 0 negative, row 1 positive; entries past
 * used[row] + 1 are 0), used[2] = nb per sign. Non-finite: SC_ERR_NAN. */
int sc_skc_quantize(sc_dtype vt, const void* v, int64_t n, int64_t q, int64_t exact_max,
                    int32_t* bucket, double* splits, int64_t* used, sc_error_info* err);

/* Options check (SC_ERR_ARG, err->input = 0 q, 1 s, 2 t, 3 r, 4 m, 5 prefix, 6 codec,
 * 7 exact_max). */
int sc_skc_check_options(const sc_skc_options* o, sc_error_info* err);

/* Upper bound of the body size of sc_skc_encode for n entries. */
int64_t sc_skc_encode_bound(const sc_skc_options* o, int64_t N, sc_dtype vt, int64_t n);

/* Encode the COO vector (idx strictly ascending in [0, N), val float32/float64) into
 * out[0..cap); *out_len = bytes written. decoded (n values of vt, or NULL): the values
 * sc_skc_decode returns for this body, bit for bit -- what a lossy sender keeps as sent,
 * without decoding its own message (with the raw value codec, val). Errors: options
 * (SC_ERR_ARG), index order and range (SC_ERR_INDEX_ORDER / RANGE, err->position), a
 * non-finite value with the skcompress value codec (SC_ERR_NAN), cap too small
 * (SC_ERR_ARG, input 8). */
int sc_skc_encode(const sc_skc_options* o, int64_t N, const int64_t* idx, sc_dtype vt,
                  const void* val, int64_t n, uint8_t* out, int64_t cap, int64_t* out_len,
                  void* decoded, sc_error_info* err);

/* The MinMaxSketch's cell indices run in AVX-512 or AVX2 vectors where the CPU has them
 * (the same integers as the baseline body). allow = 0 forces the baseline, 1 lets the
 * CPU decide; returns the level in use (0 baseline, 1 AVX2, 2 AVX-512). For tests. */
int sc_skc_set_simd(int allow);

/* Validate and decode a body of len bytes holding count entries of a vector of length
 * N: idx_out (count, ascending) and val_out (count, dtype vt). expect_index /
 * expect_value: the codecs the receiver expects (-1: any). Nothing is read outside
 * body[0..len); on SC_ERR_MALFORMED the outputs are unspecified. */
int sc_skc_decode(const uint8_t* body, int64_t len, int64_t N, int64_t count, sc_dtype vt,
                  int expect_index, int expect_value, int64_t* idx_out, void* val_out,
                  sc_error_info* err);

#ifdef __cplusplus
}
#endif
#endif
