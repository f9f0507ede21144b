/*
 * Top-k by magnitude, part of topk_impl.h (whose macros it uses): the
 * sampled-threshold fast path. A sample's k-th key bounds the threshold from
 * below, one pass filters the candidates above the bound into per-thread
 * buffers (adding a residual into x on the way for FT instances), and the
 * exact selection runs on the candidates only.
 */
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

/* Room for 16 more candidates in the thread's buffer: 0 when it is full and
 * cannot grow. */
static inline __attribute__((always_inline)) int FN(cbuf_room16)(FN(cbuf) * cb, int64_t cap,
                                                                  int64_t hint) {
  if (cb->n + 16 > cb->cap) {
    if (cb->n > cap || !FN(cbuf_grow)(cb, hint)) return 0;
  }
  return 1;
}

/*
 * The candidates of one 16 of topk_fast's filter loop: bit j of msk (key of
 * x[i + j] >= tm1 + 1) puts x[i + j] into the thread's buffer (which has room,
 * cbuf_room16) and, with `clear`, 0 into x[i + j] (while the line is hot; the
 * unselected are put back). Returns the running maximum key mx updated with
 * theirs. Inlined into each filter loop below, one per instruction set: the
 * SSE2 loops and, for float32 on x86-64, an AVX2 loop (topk.c) with the same
 * candidates and the same sums (no FMA, the same IEEE additions).
 */
static inline __attribute__((always_inline)) BITS FN(take16)(BITS* x, int64_t i, unsigned msk,
                                                              int clear, int64_t base,
                                                              FN(cbuf) * cb, BITS mx) {
  int64_t cn = cb->n;
  BITS* restrict cbb = cb->b;
  int64_t* restrict cbi = cb->i;
  while (msk) { /* one step per candidate */
    int j = __builtin_ctz(msk);
    msk &= msk - 1;
    BITS v = x[i + j];
    BITS key = (BITS)(v & KMASK);
    mx = key > mx ? key : mx;
    cbb[cn] = v;
    cbi[cn] = base + i + j;
    cn++;
    if (clear) x[i + j] = 0;
  }
  cb->n = cn;
  return mx;
}

/*
 * The filter loop of topk_fast over x[lo, hi) 16 elements at a time: mask16
 * (add_mask16 after adding g into x) gives the candidates of each 16, take16
 * keeps them. Returns where it stopped: the last full 16 before hi, or earlier
 * with *fail set when the buffer is full.
 */
static int64_t FN(filter)(BITS* x, int64_t base, int64_t lo, int64_t hi, BITS tm1, FN(cbuf) * cb,
                          int64_t cap, int64_t hint, BITS* mx_io, int* fail) {
  int64_t i = lo;
  BITS mx = *mx_io;
  for (; i + 16 <= hi; i += 16) {
    unsigned msk = FN(mask16)(x + i, tm1);
    if (!msk) continue; /* common case: no candidate among these 16 */
    if (!FN(cbuf_room16)(cb, cap, hint)) { *fail = 1; break; }
    mx = FN(take16)(x, i, msk, 0, base, cb, mx);
  }
  *mx_io = mx;
  return i;
}

#ifdef FT
static int64_t FN(filter_add)(BITS* x, const BITS* g, int clear, int64_t base, int64_t lo, int64_t hi,
                              BITS tm1, FN(cbuf) * cb, int64_t cap, int64_t hint, BITS* mx_io,
                              int* fail) {
  int64_t i = lo;
  BITS mx = *mx_io;
  for (; i + 16 <= hi; i += 16) {
    unsigned msk = FN(add_mask16)(x + i, g + i, tm1);
    if (!msk) continue;
    if (!FN(cbuf_room16)(cb, cap, hint)) { *fail = 1; break; }
    mx = FN(take16)(x, i, msk, clear, base, cb, mx);
  }
  *mx_io = mx;
  return i;
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
  int64_t i = lo;
  BITS mx = *mx_io;
  for (; i + 16 <= hi; i += 16) {
    unsigned msk = FN(add_mask16_avx2)(x + i, g + i, tm1);
    if (!msk) continue;
    if (!FN(cbuf_room16)(cb, cap, hint)) { *fail = 1; break; }
    mx = FN(take16)(x, i, msk, clear, base, cb, mx);
  }
  *mx_io = mx;
  return i;
}
#endif

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
