/*
 * The fused index pass of wire.c, instantiated once per index type.
 *
 * Required macros: ISFX (name suffix), IT (signed index type), UT (its
 * unsigned twin). Indices are read with memcpy: a message may start at any
 * address, and the compiler turns these into plain (vector) loads.
 */
#define WCAT_(a, b) a##_##b
#define WCAT(a, b) WCAT_(a, b)
#define FN(name) WCAT(name, ISFX)

static inline IT FN(ld)(const uint8_t* p, int64_t i) {
  IT v;
  memcpy(&v, p + (size_t)i * sizeof(IT), sizeof(IT));
  return v;
}

/* Exact scan of [lo, hi): the first i with idx[i] outside [0, limit) or
 * idx[i] <= idx[i-1] (idx[lo-1] is read when lo > 0); -1 if none. */
static int64_t FN(scan_exact)(const uint8_t* p, int64_t lo, int64_t hi, UT limit, int* range) {
  for (int64_t i = lo; i < hi; i++) {
    IT x = FN(ld)(p, i);
    if ((UT)x >= limit) { *range = 1; return i; }
    if (i > 0 && x <= FN(ld)(p, i - 1)) { *range = 0; return i; }
  }
  return -1;
}

/* First bad position in [lo, hi) (as scan_exact), in blocks: a branch-free
 * vectorizable test per block, the exact scan only for a block that fails. */
static int64_t FN(first_bad)(const uint8_t* p, int64_t lo, int64_t hi, UT limit, int* range) {
  enum { BLOCK = 2048 };
  if (lo == 0 && hi > 0) {
    if ((UT)FN(ld)(p, 0) >= limit) { *range = 1; return 0; }
    lo = 1;
  }
  for (int64_t b = lo; b < hi; b += BLOCK) {
    int64_t e = hi - b < BLOCK ? hi : b + BLOCK;
    unsigned bad = 0;
    for (int64_t i = b; i < e; i++) {
      IT x = FN(ld)(p, i), prev = FN(ld)(p, i - 1);
      bad |= (unsigned)((UT)x >= limit) | (unsigned)(x <= prev);
    }
    if (bad) return FN(scan_exact)(p, b, e, limit, range);
  }
  return -1;
}

static int64_t FN(first_bad_par)(const uint8_t* p, int64_t n, UT limit, int nthreads,
                                 int* range) {
  int nt = sc_clamp_threads(nthreads);
  if (n < SC_WIRE_PAR_MIN || nt == 1) return FN(first_bad)(p, 0, n, limit, range);
  int64_t pos[SC_MAX_THREADS];
  int rng[SC_MAX_THREADS];
#pragma omp parallel for num_threads(nt) schedule(static, 1)
  for (int c = 0; c < nt; c++) {
    rng[c] = 0;
    pos[c] = FN(first_bad)(p, sc_block_end(n, nt, c - 1), sc_block_end(n, nt, c), limit, &rng[c]);
  }
  for (int c = 0; c < nt; c++)
    if (pos[c] >= 0) { *range = rng[c]; return pos[c]; }
  return -1;
}

#undef FN
#undef WCAT
#undef WCAT_
