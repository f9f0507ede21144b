/*
 * Top-k by magnitude, part of topk_impl.h (whose macros it uses): the exact
 * selection. A threshold key T with its tie count, by quickselect (small n) or
 * radix histograms over per-thread segments, then the selected elements
 * emitted in index order.
 */
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
