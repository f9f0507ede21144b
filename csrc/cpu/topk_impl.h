/*
 * Top-k by magnitude, instantiated once per key width by topk.c.
 *
 * Required macros: SFX (name suffix), BITS (unsigned raw type), KEYBITS
 * (number of magnitude bits), KMASK, SIGNREP (sign bit of every BITS lane
 * of a uint64_t). Optional: FT, the floating type of BITS (float, double):
 * defines the fused residual add (`gadd` of topk_fast, topk_maybe_add).
 *
 * A value's key is bits & KMASK (sign dropped): for IEEE formats the integer
 * order of keys is the order of magnitudes, +0 and -0 share key 0, Inf has key
 * `inf` and every NaN has a key > inf. Selection works on keys only, values
 * are copied as raw bits.
 *
 * Selection = find the threshold key T and the number of ties `need_eq` such
 * that {key > T} plus the first `need_eq` elements with key == T (in index
 * order) are exactly the k selected elements; then emit them in index order.
 *
 * Split by job, each part included here once per key width:
 *   topk_exact_impl.h  the exact selection (quickselect, radix threshold, emit)
 *   topk_fast_impl.h   the sampled-threshold fast path and the fused residual add
 *   this file          the entry points: top-k, the residual add, block top-k
 */
#define CAT_(a, b) a##_##b
#define CAT(a, b) CAT_(a, b)
#define FN(name) CAT(name, SFX)
#define OUT_INDEX(ix, base, i) ((ix) ? (ix)[i] : (base) + (i))

#include "topk_exact_impl.h"
#include "topk_fast_impl.h"

/* NaN scan (used when no selection is needed). */
static int FN(has_nan_range)(const BITS* x, int64_t lo, int64_t hi, BITS inf) {
  BITS mx = 0;
  for (int64_t i = lo; i < hi; i++) {
    BITS key = (BITS)(x[i] & KMASK);
    mx = key > mx ? key : mx;
  }
  return mx > inf;
}

static int FN(has_nan)(const BITS* x, int64_t n, BITS inf, int nt) {
  if (nt == 1 || n <= 65536) return FN(has_nan_range)(x, 0, n, inf);
  int nan = 0;
  int t;
#pragma omp parallel for num_threads(nt) schedule(static, 1) reduction(| : nan)
  for (t = 0; t < nt; t++) nan |= FN(has_nan_range)(x, n * t / nt, n * (t + 1) / nt, inf);
  return nan;
}

/* Full top-k of x[0..n), global indices base + i. */
static int FN(topk_core)(const BITS* x, int64_t base, int64_t n, int64_t k,
                         BITS inf, int nt, int radix, BITS* ov, int64_t* oi) {
  if (n <= 0) return SC_OK;
  if (k <= 0) return FN(has_nan)(x, n, inf, nt) ? SC_ERR_NAN : SC_OK;
  if (k >= n) {
    if (FN(has_nan)(x, n, inf, nt)) return SC_ERR_NAN;
    memcpy(ov, x, (size_t)n * sizeof(BITS));
    for (int64_t i = 0; i < n; i++) oi[i] = base + i;
    return SC_OK;
  }
  if (radix) return FN(topk_exact)(x, NULL, base, n, k, inf, nt, 1, ov, oi);
  if (n <= SC_SMALL_N) return FN(topk_small)(x, NULL, base, n, k, inf, ov, oi);
  int added;
  int st = FN(topk_fast)((BITS*)x, NULL, 0, &added, base, n, k, inf, nt, ov, oi);
  if (st != -1) return st;
  return FN(topk_exact)(x, NULL, base, n, k, inf, nt, 0, ov, oi);
}

#ifdef FT
/* x[0..n) += g[0..n), nt threads over chunks (the residual add when no fused
 * filter pass runs). */
static void FN(add_all)(BITS* x, const BITS* g, int64_t n, int nt) {
  const int64_t chunk = 65536, nchunks = (n + chunk - 1) / chunk;
  int64_t c;
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1 && n > 262144)
  for (c = 0; c < nchunks; c++) {
    int64_t lo = c * chunk, len = n - lo < chunk ? n - lo : chunk;
    FN(add_run)(x + lo, g + lo, len);
  }
}
#endif

/*
 * Top-k of x[0..n) (g == NULL), or of the sums x + g, which are written into x
 * first (g != NULL, FT instances only): the sampled fast path adds while it
 * filters (one pass over x and g); any other path adds first, then selects.
 * Either way the result is topk_core's on the sums. `clear` (x is written):
 * the selected entries of x become +0 on success (the fast path zeroes its
 * candidates in its pass and puts the unselected back); on failure x holds
 * the sums.
 */
static int FN(topk_maybe_add)(BITS* x, const BITS* g, int clear, int64_t base, int64_t n, int64_t k,
                              BITS inf, int nt, BITS* ov, int64_t* oi) {
#ifdef FT
  if (g) {
    int added = 0, st = -1;
    if (k > 0 && k < n && n > SC_SMALL_N)
      st = FN(topk_fast)(x, g, clear, &added, base, n, k, inf, nt, ov, oi);
    if (!added) FN(add_all)(x, g, n, nt);
    if (st != -1) return st;
  }
#endif
  int st = FN(topk_core)(x, base, n, k, inf, nt, 0, ov, oi);
  if (!st && clear) {
    int64_t m = k < n ? k : n;
    for (int64_t j = 0; j < m; j++) x[oi[j] - base] = 0;
  }
  return st;
}

/* Block top-k of x, or of x + g (written into x first, see topk_maybe_add). */
static int FN(block_topk)(BITS* x, const BITS* g, int clear, int64_t n, int64_t B, int64_t kpb,
                          BITS inf, int nt, BITS* ov, int64_t* oi) {
  /* out offsets: block b starts at sum_{j<b} min(kpb, len_j) */
  if (B == 1) return FN(topk_maybe_add)(x, g, clear, 0, n, kpb, inf, nt, ov, oi);
#ifdef FT
  if (g && B >= n) FN(add_all)(x, g, n, nt);
#endif
  if (B >= n) {
    /* every block holds at most one element (len_b = floor or ceil of n/B <= 1),
       so each non-empty block contributes its element when kpb >= 1: no per-block
       table (B may be as large as 2^63 - 1) */
    if (FN(has_nan)(x, n, inf, nt)) return SC_ERR_NAN;
    if (kpb == 0) return SC_OK;
    memcpy(ov, x, (size_t)n * sizeof(BITS));
    for (int64_t i = 0; i < n; i++) oi[i] = i;
    if (clear) memset(x, 0, (size_t)n * sizeof(BITS));
    return SC_OK;
  }
  int64_t* off = (int64_t*)malloc((size_t)(B + 1) * sizeof(int64_t));
  if (!off) return SC_ERR_NOMEM;
  off[0] = 0;
  for (int64_t b = 0; b < B; b++) {
    int64_t len = sc_block_end(n, B, b) - sc_block_end(n, B, b - 1);
    off[b + 1] = off[b] + (kpb < len ? kpb : len);
  }
  int err = SC_OK;
  if (nt == 1 || n / B >= ((int64_t)1 << 20)) {
    int64_t done = B; /* blocks before this one were selected (and cleared) */
    for (int64_t b = 0; b < B && (!err || g); b++) {
      int64_t lo = sc_block_end(n, B, b - 1), hi = sc_block_end(n, B, b);
#ifdef FT
      if (err) { /* a failed block ends the selection; the sums are still owed */
        FN(add_all)(x + lo, g + lo, hi - lo, nt);
        continue;
      }
#endif
      err = FN(topk_maybe_add)(x + lo, g ? g + lo : NULL, clear, lo, hi - lo, kpb, inf, nt, ov + off[b],
                               oi + off[b]);
      if (err) done = b;
    }
    /* a failed selection leaves x holding the sums: put back what earlier blocks cleared */
    if (err && clear)
      for (int64_t j = 0; j < off[done]; j++) x[oi[j]] = ov[j];
  } else {
    int64_t b;
    int64_t chunk = B / ((int64_t)nt * 64);
    if (chunk < 1) chunk = 1;
    int e_nan = 0, e_mem = 0;
#pragma omp parallel for num_threads(nt) schedule(dynamic, chunk) reduction(| : e_nan, e_mem)
    for (b = 0; b < B; b++) {
      int64_t lo = sc_block_end(n, B, b - 1), hi = sc_block_end(n, B, b);
      /* cleared after all blocks succeed (below): a failure leaves x the sums */
      int st = FN(topk_maybe_add)(x + lo, g ? g + lo : NULL, 0, lo, hi - lo, kpb, inf, 1,
                                  ov + off[b], oi + off[b]);
      if (st == SC_ERR_NAN) e_nan = 1;
      else if (st) e_mem = 1;
    }
    err = e_nan ? SC_ERR_NAN : (e_mem ? SC_ERR_NOMEM : SC_OK);
    if (!err && clear) {
      int64_t j, m = off[B];
#pragma omp parallel for num_threads(nt) schedule(static) if (m > 65536)
      for (j = 0; j < m; j++) x[oi[j]] = 0;
    }
  }
  free(off);
  return err;
}

#undef OUT_INDEX
#undef FN
#undef CAT
#undef CAT_
