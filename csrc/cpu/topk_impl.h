/*
 * Top-k by magnitude, instantiated once per key width by topk.c.
 *
 * Required macros: SFX (name suffix), BITS (unsigned raw type), KEYBITS
 * (number of magnitude bits), KMASK, SIGNREP (sign bit of every BITS lane
 * of a uint64_t). Optional: FT, the floating type of BITS (float, double):
 * defines the fused residual add (`gadd` of topk_fast, topk_accum_core).
 *
 * A value's key is bits & KMASK (sign dropped): for IEEE formats the integer
 * order of keys is the order of magnitudes, +0 and -0 share key 0, Inf has key
 * `inf` and every NaN has a key > inf. Selection works on keys only, values
 * are copied as raw bits.
 *
 * Selection = find the threshold key T and the number of ties `need_eq` such
 * that {key > T} plus the first `need_eq` elements with key == T (in index
 * order) are exactly the k selected elements; then emit them in index order.
 */
#define CAT_(a, b) a##_##b
#define CAT(a, b) CAT_(a, b)
#define FN(name) CAT(name, SFX)

/* r-th largest (1-based) of a[0..n), 3-way quickselect; reorders a. */
static BITS FN(qselect_desc)(BITS* a, int64_t n, int64_t r) {
  int64_t lo = 0, hi = n, target = r - 1;
  uint64_t rng = 0x9E3779B97F4A7C15ull ^ (uint64_t)n;
  for (;;) {
    if (hi - lo <= 16) {
      for (int64_t i = lo + 1; i < hi; i++) {
        BITS v = a[i];
        int64_t j = i - 1;
        while (j >= lo && a[j] < v) { a[j + 1] = a[j]; j--; }
        a[j + 1] = v;
      }
      return a[target];
    }
    /* median of three pseudo-random elements */
    BITS p0 = a[lo + (int64_t)(sc_rand(&rng) % (uint64_t)(hi - lo))];
    BITS p1 = a[lo + (int64_t)(sc_rand(&rng) % (uint64_t)(hi - lo))];
    BITS p2 = a[lo + (int64_t)(sc_rand(&rng) % (uint64_t)(hi - lo))];
    BITS pivot = p0 < p1 ? (p1 < p2 ? p1 : (p0 < p2 ? p2 : p0))
                         : (p0 < p2 ? p0 : (p1 < p2 ? p2 : p1));
    int64_t lt = lo, i = lo, gt = hi;
    while (i < gt) {
      BITS v = a[i];
      if (v > pivot) { a[i] = a[lt]; a[lt] = v; lt++; i++; }
      else if (v < pivot) { gt--; a[i] = a[gt]; a[gt] = v; }
      else i++;
    }
    if (target < lt) hi = lt;
    else if (target >= gt) lo = gt;
    else return pivot;
  }
}

/*
 * r-th largest (1-based) of the keys a[0..n) (reorders a): radix levels of up to
 * 11 bits from the top, each a histogram in L1 and a compaction of the digit
 * that holds the r-th, then qselect_desc once few are left. The sample's
 * threshold: 65536 keys in ~0.1 ms where qselect_desc alone took ~0.3 (its
 * three-way partition branches on every key).
 */
static BITS FN(kth_desc)(BITS* a, int64_t n, int64_t r) {
  uint32_t h[2048];
  int shift = KEYBITS;
  int64_t m = n, need = r;
  BITS prefix = 0;
  while (shift > 0 && m > 256) {
    int w = shift >= 11 ? 11 : shift, s = shift - w;
    BITS mask = (BITS)(((BITS)1 << w) - 1);
    memset(h, 0, sizeof(uint32_t) << w);
    for (int64_t i = 0; i < m; i++) h[(a[i] >> s) & mask]++;
    int64_t cum = 0;
    int d = (1 << w) - 1;
    for (; d > 0; d--) {
      if (cum + (int64_t)h[d] >= need) break;
      cum += h[d];
    }
    need -= cum;
    int64_t o = 0;
    for (int64_t i = 0; i < m; i++)
      if ((BITS)((a[i] >> s) & mask) == (BITS)d) a[o++] = a[i];
    m = o;
    prefix = (BITS)((prefix << w) | (BITS)d);
    shift = s;
  }
  if (shift == 0) return prefix; /* every remaining key equals prefix */
  return FN(qselect_desc)(a, m, need);
}

/*
 * 1 if any of the 16 keys at p is >= tm1 + 1: the sign bit of tm1 - key is set
 * iff key > tm1 (both are >= 0). Written with 16-byte GCC/Clang vector
 * extensions so it compiles to a handful of SIMD instructions on any target
 * (SSE2 / NEON) without -march flags.
 */
typedef BITS FN(v16b) __attribute__((vector_size(16)));
static inline int FN(any_gt16)(const BITS* p, BITS tm1) {
  enum { L = 16 / sizeof(BITS), NV = 16 / L };
  const FN(v16b) m = (FN(v16b)){0} + (BITS)KMASK;
  const FN(v16b) t = (FN(v16b)){0} + tm1;
  FN(v16b) acc = {0};
  for (int c = 0; c < NV; c++) {
    FN(v16b) v;
    memcpy(&v, p + c * L, 16);
    acc |= t - (v & m);
  }
  uint64_t h[2];
  memcpy(h, &acc, 16);
  return ((h[0] | h[1]) & SIGNREP) != 0;
}

/*
 * Bit j set iff key(p[j]) > tm1, for j < 16 (same sign-bit trick). SSE2
 * (every x86-64) extracts the sign bits with movemask; elsewhere a scalar loop.
 */
static inline unsigned FN(mask16)(const BITS* p, BITS tm1) {
#if defined(__SSE2__)
  if (sizeof(BITS) == 4) {
    const __m128i t = _mm_set1_epi32((int)(uint32_t)tm1), m = _mm_set1_epi32(0x7FFFFFFF);
    unsigned r = 0;
    for (int c = 0; c < 4; c++) {
      __m128i v = _mm_loadu_si128((const __m128i*)(const void*)(p + 4 * c));
      __m128i d = _mm_sub_epi32(t, _mm_and_si128(v, m));
      r |= (unsigned)_mm_movemask_ps(_mm_castsi128_ps(d)) << (4 * c);
    }
    return r;
  }
  if (sizeof(BITS) == 2) {
    const __m128i t = _mm_set1_epi16((short)(uint16_t)tm1), m = _mm_set1_epi16(0x7FFF);
    __m128i v0 = _mm_loadu_si128((const __m128i*)(const void*)p);
    __m128i v1 = _mm_loadu_si128((const __m128i*)(const void*)(p + 8));
    __m128i d0 = _mm_sub_epi16(t, _mm_and_si128(v0, m));
    __m128i d1 = _mm_sub_epi16(t, _mm_and_si128(v1, m));
    return (unsigned)_mm_movemask_epi8(_mm_packs_epi16(d0, d1));
  }
#endif
  unsigned r = 0;
  for (int j = 0; j < 16; j++) r |= (unsigned)((BITS)(tm1 - (BITS)(p[j] & KMASK)) >> KEYBITS) << j;
  return r;
}

#define OUT_INDEX(ix, base, i) ((ix) ? (ix)[i] : (base) + (i))

/* Serial exact top-k of x[0..n) (1 <= k < n). ix: index map or NULL. */
static int FN(topk_small)(const BITS* x, const int64_t* ix, int64_t base,
                          int64_t n, int64_t k, BITS inf, BITS* ov,
                          int64_t* oi) {
  BITS stack_buf[512];
  BITS* s = n <= 512 ? stack_buf : (BITS*)malloc((size_t)n * sizeof(BITS));
  if (!s) return SC_ERR_NOMEM;
  BITS mx = 0;
  for (int64_t i = 0; i < n; i++) {
    BITS key = (BITS)(x[i] & KMASK);
    s[i] = key;
    mx = key > mx ? key : mx;
  }
  if (mx > inf) { if (s != stack_buf) free(s); return SC_ERR_NAN; }
  BITS T = FN(qselect_desc)(s, n, k);
  if (s != stack_buf) free(s);
  int64_t gt = 0;
  for (int64_t i = 0; i < n; i++) gt += (BITS)(x[i] & KMASK) > T;
  int64_t need = k - gt, o = 0;
  for (int64_t i = 0; i < n; i++) {
    BITS key = (BITS)(x[i] & KMASK);
    if (key > T || (key == T && need > 0)) {
      if (key == T) need--;
      ov[o] = x[i];
      oi[o] = OUT_INDEX(ix, base, i);
      o++;
    }
  }
  return SC_OK;
}

/* A part of the input: bits b[0..n), index of b[j] = i ? i[j] : base + j. */
typedef struct {
  const BITS* b;
  const int64_t* i;
  int64_t base, n;
} FN(seg);

/*
 * Exact threshold by radix levels of up to 16 bits over nseg segments (one
 * per thread). Fills T, need_eq and per-segment counts gt_t (key > T) and
 * eq_t (key == T). Fails with SC_ERR_NAN on keys > inf.
 */
static int FN(select_hist)(const FN(seg) * sg, int nseg, int nt, int64_t k, BITS inf,
                           BITS* T_out, int64_t* need_eq_out, int64_t* gt_t,
                           int64_t* eq_t) {
  uint64_t* hist = (uint64_t*)malloc((size_t)nseg * 65536 * sizeof(uint64_t));
  if (!hist) return SC_ERR_NOMEM;
  int nan = 0;
  int shift = KEYBITS;
  uint64_t prefix = 0;
  int64_t need = k;
  unsigned sel = 0;
  for (int t = 0; t < nseg; t++) gt_t[t] = eq_t[t] = 0;
  while (shift > 0) {
    int w = shift >= 16 ? 16 : shift;
    int s = shift - w;
    int64_t nb = (int64_t)1 << w;
    int level0 = shift == KEYBITS;
    int t;
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1) if (nt > 1) reduction(| : nan)
    for (t = 0; t < nseg; t++) {
      uint64_t* h = hist + (size_t)t * 65536;
      memset(h, 0, (size_t)nb * sizeof(uint64_t));
      const BITS* x = sg[t].b;
      int64_t n = sg[t].n;
      if (level0) {
        BITS mx = 0;
        for (int64_t i = 0; i < n; i++) {
          BITS key = (BITS)(x[i] & KMASK);
          mx = key > mx ? key : mx;
          h[key >> s]++;
        }
        if (mx > inf) nan |= 1;
      } else {
        for (int64_t i = 0; i < n; i++) {
          BITS key = (BITS)(x[i] & KMASK);
          if ((uint64_t)(key >> shift) == prefix)
            h[(key >> s) & (BITS)(nb - 1)]++;
        }
      }
    }
    if (nan) { free(hist); return SC_ERR_NAN; }
    /* pick the digit holding the need-th largest */
    int64_t cum = 0;
    int64_t d;
    for (d = nb - 1; d >= 0; d--) {
      int64_t c = 0;
      for (int u = 0; u < nseg; u++) c += (int64_t)hist[(size_t)u * 65536 + d];
      if (cum + c >= need) break;
      cum += c;
    }
    if (d < 0) d = 0; /* cannot happen when k <= n */
    sel = (unsigned)d;
    need -= cum;
    for (int u = 0; u < nseg; u++) {
      const uint64_t* h = hist + (size_t)u * 65536;
      int64_t g = 0;
      for (int64_t e = d + 1; e < nb; e++) g += (int64_t)h[e];
      gt_t[u] += g;
    }
    prefix = (prefix << w) | sel;
    shift = s;
  }
  for (int u = 0; u < nseg; u++) eq_t[u] = (int64_t)hist[(size_t)u * 65536 + sel];
  free(hist);
  *T_out = (BITS)prefix;
  *need_eq_out = need;
  return SC_OK;
}

/* Emit the selection given T / need_eq / per-segment counts. */
static void FN(emit)(const FN(seg) * sg, int nseg, int nt, BITS T, int64_t need_eq,
                     const int64_t* gt_t, const int64_t* eq_t, BITS* ov, int64_t* oi) {
  int64_t quota[SC_MAX_THREADS], off[SC_MAX_THREADS];
  int64_t rem = need_eq, o = 0;
  for (int t = 0; t < nseg; t++) {
    quota[t] = eq_t[t] < rem ? eq_t[t] : rem;
    rem -= quota[t];
    off[t] = o;
    o += gt_t[t] + quota[t];
  }
  const BITS Tm1 = (BITS)(T - 1);
  int t;
#pragma omp parallel for num_threads(nt) schedule(dynamic, 1) if (nt > 1)
  for (t = 0; t < nseg; t++) {
    const BITS* x = sg[t].b;
    const int64_t* ix = sg[t].i;
    int64_t base = sg[t].base, hi = sg[t].n;
    int64_t q = quota[t], w = off[t];
    int64_t i = 0;
    for (; i + 16 <= hi; i += 16) {
      if (T > 0 && !FN(any_gt16)(x + i, Tm1)) continue; /* no key >= T here */
      for (int j = 0; j < 16; j++) {
        BITS key = (BITS)(x[i + j] & KMASK);
        if (key > T || (key == T && q > 0)) {
          if (key == T) q--;
          ov[w] = x[i + j];
          oi[w] = OUT_INDEX(ix, base, i + j);
          w++;
        }
      }
    }
    for (; i < hi; i++) {
      BITS key = (BITS)(x[i] & KMASK);
      if (key > T || (key == T && q > 0)) {
        if (key == T) q--;
        ov[w] = x[i];
        oi[w] = OUT_INDEX(ix, base, i);
        w++;
      }
    }
  }
}

/* Exact selection over segments (1 <= k < total length). */
static int FN(topk_exact_segs)(const FN(seg) * sg, int nseg, int nt, int64_t k, BITS inf,
                               BITS* ov, int64_t* oi) {
  int64_t gt_t[SC_MAX_THREADS], eq_t[SC_MAX_THREADS];
  BITS T;
  int64_t need_eq;
  int st = FN(select_hist)(sg, nseg, nt, k, inf, &T, &need_eq, gt_t, eq_t);
  if (st) return st;
  FN(emit)(sg, nseg, nt, T, need_eq, gt_t, eq_t, ov, oi);
  return SC_OK;
}

/* Exact selection over x[0..n) (1 <= k < n), split in nt parts; `radix`
 * forces the radix path even for small n (SC_TOPK_RADIX). */
static int FN(topk_exact)(const BITS* x, const int64_t* ix, int64_t base,
                          int64_t n, int64_t k, BITS inf, int nt, int radix, BITS* ov,
                          int64_t* oi) {
  if (n <= SC_SMALL_N && !radix) return FN(topk_small)(x, ix, base, n, k, inf, ov, oi);
  FN(seg) sg[SC_MAX_THREADS];
  for (int t = 0; t < nt; t++) {
    int64_t lo = n * t / nt, hi = n * (t + 1) / nt;
    sg[t].b = x + lo;
    sg[t].i = ix ? ix + lo : NULL;
    sg[t].base = base + lo;
    sg[t].n = hi - lo;
  }
  return FN(topk_exact_segs)(sg, nt, nt, k, inf, ov, oi);
}

typedef struct {
  BITS* b;
  int64_t* i;
  int64_t n, cap;
} FN(cbuf);

static int FN(cbuf_grow)(FN(cbuf) * c, int64_t hint) {
  int64_t nc = c->cap ? 2 * c->cap : (hint > 4096 ? hint : 4096);
  BITS* nb = (BITS*)realloc(c->b, (size_t)nc * sizeof(BITS));
  if (!nb) return 0;
  c->b = nb;
  int64_t* ni = (int64_t*)realloc(c->i, (size_t)nc * sizeof(int64_t));
  if (!ni) return 0;
  c->i = ni;
  c->cap = nc;
  return 1;
}

#ifdef FT
/* The sum of two values given as bits, in FT (round to nearest, as torch's add). */
static inline BITS FN(add_bits)(BITS a, BITS b) {
  FT fa, fb;
  memcpy(&fa, &a, sizeof(FT));
  memcpy(&fb, &b, sizeof(FT));
  fa += fb;
  memcpy(&a, &fa, sizeof(FT));
  return a;
}

/* x[0..16) += g[0..16) in FT with 16-byte vectors (memcpy: unaligned, no aliasing
 * assumptions; compiles to movups / addps / movups). */
typedef FT FN(v16f) __attribute__((vector_size(16)));
static inline void FN(add16)(BITS* x, const BITS* g) {
  enum { L = 16 / sizeof(FT), NV = 16 / L };
  for (int c = 0; c < NV; c++) {
    FN(v16f) a, b;
    memcpy(&a, x + c * L, 16);
    memcpy(&b, g + c * L, 16);
    a += b;
    memcpy(x + c * L, &a, 16);
  }
}

/* add16, then mask16 of the sums, without reading them back (SSE2, float32); else
 * the two steps. */
static inline unsigned FN(add_mask16)(BITS* x, const BITS* g, BITS tm1) {
#if defined(__SSE2__)
  if (sizeof(FT) == 4) {
    const __m128i t = _mm_set1_epi32((int)(uint32_t)tm1), m = _mm_set1_epi32(0x7FFFFFFF);
    __m128i d[4];
    for (int c = 0; c < 4; c++) {
      __m128 a = _mm_loadu_ps((const float*)(const void*)(x + 4 * c));
      __m128 b = _mm_loadu_ps((const float*)(const void*)(g + 4 * c));
      a = _mm_add_ps(a, b);
      _mm_storeu_ps((float*)(void*)(x + 4 * c), a);
      d[c] = _mm_sub_epi32(t, _mm_and_si128(_mm_castps_si128(a), m));
    }
    /* one sign test for the 16 (the common case: no candidate), the bits only if any */
    __m128i any = _mm_or_si128(_mm_or_si128(d[0], d[1]), _mm_or_si128(d[2], d[3]));
    if (!_mm_movemask_ps(_mm_castsi128_ps(any))) return 0;
    unsigned r = 0;
    for (int c = 0; c < 4; c++) r |= (unsigned)_mm_movemask_ps(_mm_castsi128_ps(d[c])) << (4 * c);
    return r;
  }
#endif
  FN(add16)(x, g);
  return FN(mask16)(x, tm1);
}

/* x[i] += g[i] for i < n, as FT. */
static inline void FN(add_run)(BITS* x, const BITS* g, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) FN(add16)(x + i, g + i);
  for (; i < n; i++) x[i] = FN(add_bits)(x[i], g[i]);
}
#endif

/*
 * The filter loop of topk_fast over x[lo, hi) 16 elements at a time: MASK16
 * (with ADD, after adding g into x) gives the candidates (key >= tm1 + 1) of
 * each 16, which go to the thread's buffer (and become 0 in x with `clear`).
 * Returns where it stopped: the last full 16 before hi, or earlier with *fail
 * set when the buffer is full. Stamped once per instruction set: the SSE2
 * body below and, for float32 on x86-64, an AVX2 body (topk.c) with the same
 * candidates and the same sums (no FMA, the same IEEE additions).
 */
#define SC_FILTER_BODY(MASK16_EXPR)                                                   \
  int64_t i = lo;                                                                  \
  BITS mx = *mx_io;                                                                \
  for (; i + 16 <= hi; i += 16) {                                                  \
    unsigned msk = MASK16_EXPR;                                                    \
    if (!msk) continue; /* common case: no candidate among these 16 */             \
    if (cb->n + 16 > cb->cap) {                                                    \
      if (cb->n > cap || !FN(cbuf_grow)(cb, hint)) { *fail = 1; break; }           \
    }                                                                              \
    int64_t cn = cb->n;                                                            \
    BITS* restrict cbb = cb->b;                                                    \
    int64_t* restrict cbi = cb->i;                                                 \
    while (msk) { /* one step per candidate */                                     \
      int j = __builtin_ctz(msk);                                                  \
      msk &= msk - 1;                                                              \
      BITS v = x[i + j];                                                           \
      BITS key = (BITS)(v & KMASK);                                                \
      mx = key > mx ? key : mx;                                                    \
      cbb[cn] = v;                                                                 \
      cbi[cn] = base + i + j;                                                      \
      cn++;                                                                        \
      if (clear) x[i + j] = 0; /* while the line is hot; unselected are put back */ \
    }                                                                              \
    cb->n = cn;                                                                    \
  }                                                                                \
  *mx_io = mx;                                                                     \
  return i;

static int64_t FN(filter)(BITS* x, int64_t base, int64_t lo, int64_t hi, BITS tm1, FN(cbuf) * cb,
                          int64_t cap, int64_t hint, BITS* mx_io, int* fail) {
  const int clear = 0;
  SC_FILTER_BODY(FN(mask16)(x + i, tm1))
}

#ifdef FT
static int64_t FN(filter_add)(BITS* x, const BITS* g, int clear, int64_t base, int64_t lo, int64_t hi,
                              BITS tm1, FN(cbuf) * cb, int64_t cap, int64_t hint, BITS* mx_io,
                              int* fail) {
  SC_FILTER_BODY(FN(add_mask16)(x + i, g + i, tm1))
}
#endif

#ifdef SC_TOPK_AVX2
/* add_mask16 in two 256-bit halves (float32 only). */
__attribute__((target("avx2"))) static inline unsigned FN(add_mask16_avx2)(BITS* x, const BITS* g,
                                                                            BITS tm1) {
  const __m256i t = _mm256_set1_epi32((int)(uint32_t)tm1), m = _mm256_set1_epi32(0x7FFFFFFF);
  __m256 a0 = _mm256_add_ps(_mm256_loadu_ps((const float*)(const void*)x),
                            _mm256_loadu_ps((const float*)(const void*)g));
  __m256 a1 = _mm256_add_ps(_mm256_loadu_ps((const float*)(const void*)(x + 8)),
                            _mm256_loadu_ps((const float*)(const void*)(g + 8)));
  _mm256_storeu_ps((float*)(void*)x, a0);
  _mm256_storeu_ps((float*)(void*)(x + 8), a1);
  __m256i d0 = _mm256_sub_epi32(t, _mm256_and_si256(_mm256_castps_si256(a0), m));
  __m256i d1 = _mm256_sub_epi32(t, _mm256_and_si256(_mm256_castps_si256(a1), m));
  if (!_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_or_si256(d0, d1)))) return 0;
  return (unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(d0)) |
         ((unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(d1)) << 8);
}

__attribute__((target("avx2"))) static int64_t FN(filter_add_avx2)(
    BITS* x, const BITS* g, int clear, int64_t base, int64_t lo, int64_t hi, BITS tm1, FN(cbuf) * cb,
    int64_t cap, int64_t hint, BITS* mx_io, int* fail) {
  SC_FILTER_BODY(FN(add_mask16_avx2)(x + i, g + i, tm1))
}
#endif
#undef SC_FILTER_BODY

/*
 * Sample-threshold fast path. Returns SC_OK when it produced the result,
 * SC_ERR_NAN, SC_ERR_NOMEM, or -1 when the caller must use the exact path
 * (the sample's bound failed or the fast path would not pay off).
 * Correctness never depends on the sample: the selection is exact among all
 * elements with key >= tlo, and it is used only if there are >= k of them.
 */
/*
 * With `gadd` (fused residual add, FT instances only) x is written: the pass
 * that filters the candidates first adds gadd into x, 16 elements at a time,
 * and filters the sums; the sample is taken from the sums too. *added says
 * whether x == x + gadd everywhere on return (0 when it returned before the
 * pass: the caller then adds); the result is the top-k of the sums.
 */
static int FN(topk_fast)(BITS* x, const BITS* gadd, int clear, int* added, int64_t base, int64_t n,
                         int64_t k, BITS inf, int nt, BITS* ov, int64_t* oi) {
  *added = 0;
  const int64_t nch = 256;
  int64_t s = n / 128;
  if (s < 4096) s = 4096;
  if (s > 65536) s = 65536;
  int64_t L = s / nch;
  s = L * nch;
  int64_t stride = n / nch;
  if (stride < L) return -1;
  double m = (double)k * (double)s / (double)n;
  int64_t r = (int64_t)ceil(m + 5.0 * sqrt(m) + 8.0);
  if (r >= s) return -1;
  double est = (double)r * (double)n / (double)s;
  if (est > (double)n / 3) return -1;

  BITS* smp = (BITS*)malloc((size_t)s * sizeof(BITS));
  if (!smp) return SC_ERR_NOMEM;
  uint64_t rng = 0xD1B54A32D192ED03ull ^ ((uint64_t)n * 31u + (uint64_t)k);
  for (int64_t c = 0; c < nch; c++) {
    int64_t start = c * stride + (int64_t)(sc_rand(&rng) % (uint64_t)(stride - L + 1));
    if (gadd) {
#ifdef FT
      for (int64_t j = 0; j < L; j++)
        smp[c * L + j] = (BITS)(FN(add_bits)(x[start + j], gadd[start + j]) & KMASK);
#endif
    } else {
      for (int64_t j = 0; j < L; j++) smp[c * L + j] = (BITS)(x[start + j] & KMASK);
    }
  }
  BITS smax = 0;
  for (int64_t j = 0; j < s; j++) smax = smp[j] > smax ? smp[j] : smax;
  BITS tlo = FN(kth_desc)(smp, s, r);
  free(smp);
  if (smax > inf) return SC_ERR_NAN; /* the sample holds a NaN */
  if (tlo == 0) return -1;           /* everything would be a candidate */
  /* tlo <= inf here, so every NaN (key > inf) becomes a candidate */

  int64_t cap = (int64_t)(3.0 * est) + 65536;
  /* first allocation: expected share plus slack (pages are touched lazily) */
  int64_t hint = (int64_t)(1.25 * est / nt) + 4096;
  FN(cbuf) bufs[SC_MAX_THREADS];
  memset(bufs, 0, sizeof(bufs));
  /* reuse the candidate buffers of an earlier call when they are free: fresh
     multi-MB allocations come from mmap and cost a page fault + zeroing per
     4 KiB page on every call (~1/3 of the time at 10% density) */
  const int cached = sc_cache_acquire();
  if (cached) {
    for (int u = 0; u < nt; u++) {
      sc_cbuf_slot* sl = &sc_cache_slots[u];
      bufs[u].b = (BITS*)sl->b;
      bufs[u].i = sl->i;
      int64_t cb_ = (int64_t)(sl->bbytes / sizeof(BITS)), ci_ = (int64_t)(sl->ibytes / sizeof(int64_t));
      bufs[u].cap = cb_ < ci_ ? cb_ : ci_;
      if (bufs[u].cap < hint) { /* grow to the hint now: realloc keeps one block */
        bufs[u].cap = hint / 2 > 0 ? hint / 2 : 1;
        if (!FN(cbuf_grow)(&bufs[u], hint)) bufs[u].cap = 0;
      }
    }
  }
  int fail = 0, nan = 0;
  const BITS tm1 = (BITS)(tlo - 1);
  int t;
#pragma omp parallel for num_threads(nt) schedule(static, 1) if (nt > 1) reduction(| : fail, nan)
  for (t = 0; t < nt; t++) {
    FN(cbuf)* cb = &bufs[t];
    int64_t lo = n * t / nt, hi = n * (t + 1) / nt;
    int64_t i = lo, summed = lo; /* gadd: x[lo, summed) holds the sums */
    (void)summed;
    BITS mx = 0;
#ifdef SC_TOPK_AVX2
    if (gadd && sc_topk_use_avx2())
      i = FN(filter_add_avx2)(x, gadd, clear, base, lo, hi, tm1, cb, cap, hint, &mx, &fail);
    else
#endif
#ifdef FT
    if (gadd)
      i = FN(filter_add)(x, gadd, clear, base, lo, hi, tm1, cb, cap, hint, &mx, &fail);
    else
#endif
      i = FN(filter)(x, base, lo, hi, tm1, cb, cap, hint, &mx, &fail);
#ifdef FT
    if (gadd) summed = fail ? i + 16 : i; /* a full buffer stops after adding its 16 */
#endif
    if (!fail) {
      for (; i < hi; i++) {
#ifdef FT
        if (gadd) { x[i] = FN(add_bits)(x[i], gadd[i]); summed = i + 1; }
#endif
        BITS key = (BITS)(x[i] & KMASK);
        if (key >= tlo) {
          if (cb->n + 1 > cb->cap && !FN(cbuf_grow)(cb, hint)) { fail = 1; break; }
          mx = key > mx ? key : mx;
          cb->b[cb->n] = x[i];
          cb->i[cb->n] = base + i;
          cb->n++;
          if (clear) x[i] = 0;
        }
      }
    }
#ifdef FT
    /* a full candidate buffer stopped the filter: the sums are still owed */
    if (gadd && summed < hi) FN(add_run)(x + summed, gadd + summed, hi - summed);
#endif
    if (mx > inf) nan = 1;
  }
  *added = gadd != NULL;
  int64_t C = 0;
  for (int u = 0; u < nt; u++) C += bufs[u].n;
  int st = -1;
  if (nan) {
    st = SC_ERR_NAN;
  } else if (!fail && C >= k) {
    FN(seg) sg[SC_MAX_THREADS];
    for (int u = 0; u < nt; u++) {
      sg[u].b = bufs[u].b;
      sg[u].i = bufs[u].i;
      sg[u].base = 0;
      sg[u].n = bufs[u].n;
    }
    if (C == k) {
      int64_t o = 0;
      for (int u = 0; u < nt; u++) {
        if (bufs[u].n) {
          memcpy(ov + o, bufs[u].b, (size_t)bufs[u].n * sizeof(BITS));
          memcpy(oi + o, bufs[u].i, (size_t)bufs[u].n * sizeof(int64_t));
        }
        o += bufs[u].n;
      }
      st = SC_OK;
    } else if (C <= SC_SMALL_N) {
      /* few candidates: serial quickselect on a contiguous copy */
      BITS* cb = (BITS*)malloc((size_t)C * sizeof(BITS));
      int64_t* ci = (int64_t*)malloc((size_t)C * sizeof(int64_t));
      if (!cb || !ci) {
        st = SC_ERR_NOMEM;
      } else {
        int64_t o = 0;
        for (int u = 0; u < nt; u++) {
          if (bufs[u].n) {
            memcpy(cb + o, bufs[u].b, (size_t)bufs[u].n * sizeof(BITS));
            memcpy(ci + o, bufs[u].i, (size_t)bufs[u].n * sizeof(int64_t));
          }
          o += bufs[u].n;
        }
        st = FN(topk_small)(cb, ci, 0, C, k, inf, ov, oi);
      }
      free(cb);
      free(ci);
    } else {
      /* many candidates: radix selection directly on the per-thread buffers */
      st = FN(topk_exact_segs)(sg, nt, nt, k, inf, ov, oi);
    }
  }
  if (clear) {
    /* the candidates were zeroed in the pass: put back every candidate the result does
       not hold (all of them when there is no result). Both lists ascend by index (the
       buffers in thread order, the result in index order), so one merge walk finds them,
       and the writes go to ~(C - k) entries instead of a miss per selected entry. */
    int64_t p = 0, kk = st == SC_OK ? k : 0;
    for (int u = 0; u < nt; u++) {
      const BITS* cbb = bufs[u].b;
      const int64_t* cbi = bufs[u].i;
      for (int64_t c = 0; c < bufs[u].n; c++) {
        if (p < kk && oi[p] == cbi[c]) { p++; continue; }
        x[cbi[c] - base] = cbb[c];
      }
    }
  }
  if (cached) {
    for (int u = 0; u < nt; u++) {
      sc_cbuf_slot* sl = &sc_cache_slots[u];
      sl->b = bufs[u].b;
      sl->i = bufs[u].i;
      sl->bbytes = (size_t)bufs[u].cap * sizeof(BITS);
      sl->ibytes = (size_t)bufs[u].cap * sizeof(int64_t);
    }
    sc_cache_release();
  } else {
    for (int u = 0; u < nt; u++) { free(bufs[u].b); free(bufs[u].i); }
  }
  return st;
}

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
