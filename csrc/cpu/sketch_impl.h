/*
 * Count-Sketch build and estimate kernels, instantiated by sketch.c once per
 * (table type, value type) pair. Contract and hash family:
 * csrc/include/sparsecomm/sketch.h; the why of runs, blocks and prefetches: sketch.c.
 *
 * Required macros: SFX (name suffix of the pair), TT (table type), XT (value type of
 * the input vector). Optional: ESFX; when defined, the estimate kernels of table type
 * TT are instantiated too, named with that suffix (sketch.c defines it on the pair
 * with XT == TT, so each table type gets them once).
 */
#define CAT_(a, b) a##_##b
#define CAT(a, b) CAT_(a, b)
#define FN(name) CAT(name, SFX)

/* Builds: every row is one sequential pass over the input in increasing index order
 * (so every bucket receives its terms in increasing index order: the result cannot
 * depend on the thread count, and a run never hits the same bucket twice when
 * cols >= 16); rows are dealt to threads round-robin. One row (cols x 4 or 8 bytes)
 * stays in L2/L3 for its pass; the input is re-read once per row at streaming speed.
 * Signs are applied as a multiplication by +-1 (exact, and branch-free: a branch on a
 * random sign bit mispredicted half the time and cost 3x). Zero values of a dense input
 * add +-0 (which changes no table entry but a -0.0 the caller put there): skipping
 * all-zero runs saved their read-modify-writes but the check cost as much on dense
 * inputs, which is what gssgd sketches; sparse inputs have sketch_build_coo_. */
static inline void FN(add_run)(TT* restrict dst, const XT* restrict src, uint32_t bits) {
  for (int u = 0; u < SK_RUN; ++u) dst[u] += (TT)src[u] * (TT)(1 - 2 * (int)((bits >> u) & 1));
}

SK_CLONES static void FN(build_row)(TT* restrict trow, uint64_t cols, uint64_t key,
                                    const int64_t* idx, const XT* val, int64_t m) {
  uint32_t base[SK_RB + SK_PF], bits[SK_RB + SK_PF];
  if (idx) { /* COO: any order, repeats add up in input order */
    for (int64_t b = 0; b < m; b += SK_RB) {
      const int64_t len = m - b < SK_RB ? m - b : SK_RB;
      const int64_t ahead = m - b < SK_RB + SK_PF ? m - b : SK_RB + SK_PF;
      sk_hash_coords(key, idx + b, 0, ahead, cols, base, bits);
      for (int64_t t = 0; t < len; ++t) {
        if (t + SK_PF < ahead) __builtin_prefetch(trow + base[t + SK_PF], 1);
        XT v = val[b + t];
        if (v == 0) continue;
        trow[base[t]] += (TT)v * (TT)(1 - 2 * (int)bits[t]);
      }
    }
    return;
  }
  const int64_t nruns = m / SK_RUN;
  for (int64_t r = 0; r < nruns; r += SK_RB) {
    const int64_t len = nruns - r < SK_RB ? nruns - r : SK_RB;
    const int64_t ahead = nruns - r < SK_RB + SK_PF ? nruns - r : SK_RB + SK_PF;
    sk_hash_runs(key, r, ahead, cols, base, bits);
    for (int64_t t = 0; t < len; ++t) {
      if (t + SK_PF < ahead) {
        __builtin_prefetch(trow + base[t + SK_PF], 1);
        __builtin_prefetch(trow + SK_RUN_LAST(base[t + SK_PF], cols), 1);
      }
      const XT* src = val + (r + t) * SK_RUN;
      if (base[t] + (uint64_t)SK_RUN <= cols) {
        FN(add_run)(trow + base[t], src, bits[t]);
      } else { /* the run wraps around the row end (or cols < 16) */
        for (int u = 0; u < SK_RUN; ++u)
          trow[(base[t] + (uint64_t)u) % cols] += (TT)src[u] * (TT)(1 - 2 * (int)((bits[t] >> u) & 1));
      }
    }
  }
  const int64_t i0 = nruns * SK_RUN;
  sk_hash_coords(key, NULL, i0, m - i0, cols, base, bits);
  for (int64_t t = 0; t < m - i0; ++t) trow[base[t]] += (TT)val[i0 + t] * (TT)(1 - 2 * (int)bits[t]);
}

static void FN(build)(TT* table, int64_t rows, int64_t cols, uint64_t seed, const int64_t* idx,
                      const XT* val, int64_t m, int nt) {
  (void)nt;
#pragma omp parallel for num_threads(nt) schedule(static, 1) if (nt > 1)
  for (int64_t j = 0; j < rows; ++j)
    FN(build_row)(table + j * cols, (uint64_t)cols, sc_sketch_key(seed, j), idx, val, m);
}

#ifdef ESFX
#define EFN(name) CAT(name, ESFX)

/* median of r values (r <= SC_SKETCH_MAX_ROWS), insertion sort in place */
static inline TT EFN(median)(TT* a, int64_t r) {
  for (int64_t p = 1; p < r; ++p) {
    TT v = a[p];
    int64_t q = p - 1;
    while (q >= 0 && a[q] > v) { a[q + 1] = a[q]; --q; }
    a[q + 1] = v;
  }
  if (r & 1) return a[r / 2];
  return (TT)((a[r / 2 - 1] + a[r / 2]) / (TT)2);
}

/* Estimates: coordinates in chunks of SK_CHUNK (128 runs); sign * T[j][bucket] of every
 * coordinate of the chunk goes to row j of a rows x SK_CHUNK buffer (L2-resident), then
 * the median over rows is taken per element: branch-free min/max networks for 3, 5 and 7
 * rows (vectorised across elements; the median value of an odd count does not depend on
 * how equal values are ordered), insertion sort otherwise. For all coordinates (idx ==
 * NULL) the hashes of every row's runs are computed first, so the prefetch SK_PF runs
 * ahead runs on from one row into the next without a gap: the table (rows x cols) is
 * larger than L3 at the gssgd default, and an unprefetched run read costs ~4x more.
 * OpenMP over chunks (static): each output element is computed independently, so the
 * thread count cannot matter. */
SK_CLONES static void EFN(est_chunk)(const TT* table, int64_t rows, uint64_t cols,
                                     const uint64_t* keys, const int64_t* idx, int64_t b,
                                     int64_t len, TT* restrict dst, TT* restrict buf,
                                     uint32_t* restrict base, uint32_t* restrict bits) {
  if (idx) {
    for (int64_t j = 0; j < rows; ++j) {
      const TT* trow = table + (size_t)j * cols;
      TT* restrict o = buf + j * SK_CHUNK;
      sk_hash_coords(keys[j], idx + b, 0, len, cols, base, bits);
      for (int64_t t = 0; t < len; ++t) {
        if (t + SK_PF < len) __builtin_prefetch(trow + base[t + SK_PF]);
        o[t] = trow[base[t]] * (TT)(1 - 2 * (int)bits[t]);
      }
    }
  } else {
    const int64_t nr = len / SK_RUN, r0 = b / SK_RUN, tail = len - nr * SK_RUN;
    for (int64_t j = 0; j < rows; ++j) sk_hash_runs(keys[j], r0, nr, cols, base + j * SK_RB, bits + j * SK_RB);
    for (int64_t j = 0; j < rows; ++j) {
      const TT* trow = table + (size_t)j * cols;
      const TT* nrow = trow + cols; /* the next row, for prefetches past this one's end */
      const uint32_t* bj = base + j * SK_RB;
      const uint32_t* sj = bits + j * SK_RB;
      TT* restrict o = buf + j * SK_CHUNK;
      for (int64_t t = 0; t < nr; ++t) {
        const TT* prow = NULL;
        uint64_t pb = 0;
        if (t + SK_PF < nr) { prow = trow; pb = bj[t + SK_PF]; }
        else if (j + 1 < rows && t + SK_PF - nr < nr) { prow = nrow; pb = bj[SK_RB + t + SK_PF - nr]; }
        if (prow) { __builtin_prefetch(prow + pb); __builtin_prefetch(prow + SK_RUN_LAST(pb, cols)); }
        TT* restrict ot = o + t * SK_RUN;
        const uint64_t q = bj[t];
        const uint32_t s = sj[t];
        if (q + SK_RUN <= cols) {
          const TT* restrict src = trow + q;
          for (int u = 0; u < SK_RUN; ++u) ot[u] = src[u] * (TT)(1 - 2 * (int)((s >> u) & 1));
        } else {
          for (int u = 0; u < SK_RUN; ++u)
            ot[u] = trow[(q + (uint64_t)u) % cols] * (TT)(1 - 2 * (int)((s >> u) & 1));
        }
      }
    }
    if (tail) { /* the last, partial run of the vector */
      uint32_t bk[SK_RUN], sg[SK_RUN];
      for (int64_t j = 0; j < rows; ++j) {
        const TT* trow = table + (size_t)j * cols;
        sk_hash_coords(keys[j], NULL, b + nr * SK_RUN, tail, cols, bk, sg);
        for (int64_t t = 0; t < tail; ++t)
          buf[j * SK_CHUNK + nr * SK_RUN + t] = trow[bk[t]] * (TT)(1 - 2 * (int)sg[t]);
      }
    }
  }
  const TT* restrict q = buf;
  if (rows == 1) {
    for (int64_t t = 0; t < len; ++t) dst[t] = q[t];
  } else if (rows == 3) {
    for (int64_t t = 0; t < len; ++t) {
      TT a0 = q[t], a1 = q[SK_CHUNK + t], a2 = q[2 * SK_CHUNK + t];
      SK_CE(TT, a0, a1); SK_CE(TT, a1, a2); SK_CE(TT, a0, a1);
      dst[t] = a1;
    }
  } else if (rows == 5) {
    for (int64_t t = 0; t < len; ++t) {
      TT a0 = q[t], a1 = q[SK_CHUNK + t], a2 = q[2 * SK_CHUNK + t],
         a3 = q[3 * SK_CHUNK + t], a4 = q[4 * SK_CHUNK + t];
      SK_CE(TT, a0, a3); SK_CE(TT, a1, a4);
      SK_CE(TT, a0, a2); SK_CE(TT, a1, a3);
      SK_CE(TT, a0, a1); SK_CE(TT, a2, a4);
      SK_CE(TT, a1, a2); SK_CE(TT, a3, a4);
      SK_CE(TT, a2, a3);
      dst[t] = a2;
    }
  } else if (rows == 7) {
    for (int64_t t = 0; t < len; ++t) {
      TT a0 = q[t], a1 = q[SK_CHUNK + t], a2 = q[2 * SK_CHUNK + t],
         a3 = q[3 * SK_CHUNK + t], a4 = q[4 * SK_CHUNK + t],
         a5 = q[5 * SK_CHUNK + t], a6 = q[6 * SK_CHUNK + t];
      SK_CE(TT, a0, a6); SK_CE(TT, a2, a3); SK_CE(TT, a4, a5);
      SK_CE(TT, a0, a2); SK_CE(TT, a1, a4); SK_CE(TT, a3, a6);
      SK_CE(TT, a0, a1); SK_CE(TT, a2, a5); SK_CE(TT, a3, a4);
      SK_CE(TT, a1, a2); SK_CE(TT, a4, a6);
      SK_CE(TT, a2, a3); SK_CE(TT, a4, a5);
      SK_CE(TT, a1, a2); SK_CE(TT, a3, a4); SK_CE(TT, a5, a6);
      dst[t] = a3;
    }
  } else {
    for (int64_t t = 0; t < len; ++t) {
      TT e[SC_SKETCH_MAX_ROWS];
      for (int64_t j = 0; j < rows; ++j) e[j] = q[j * SK_CHUNK + t];
      dst[t] = EFN(median)(e, rows);
    }
  }
}

/* ws: nt per-thread workspaces of ws_bytes each (see sk_ws_bytes) */
static void EFN(estimate)(const TT* table, int64_t rows, int64_t cols, uint64_t seed,
                          const int64_t* idx, int64_t m, TT* out, int nt, char* ws,
                          size_t ws_bytes) {
  uint64_t keys[SC_SKETCH_MAX_ROWS];
  for (int64_t j = 0; j < rows; ++j) keys[j] = sc_sketch_key(seed, j);
  const int64_t nchunks = (m + SK_CHUNK - 1) / SK_CHUNK;
  (void)nt;
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    char* w = ws + (size_t)sk_thread_num() * ws_bytes;
    TT* buf = (TT*)w;
    uint32_t* base = (uint32_t*)(w + sizeof(TT) * (size_t)rows * SK_CHUNK);
    uint32_t* bits = base + (rows * SK_RB > SK_CHUNK ? rows * SK_RB : SK_CHUNK);
#pragma omp for schedule(static)
    for (int64_t ch = 0; ch < nchunks; ++ch) {
      const int64_t b = ch * SK_CHUNK, len = m - b < SK_CHUNK ? m - b : SK_CHUNK;
      EFN(est_chunk)(table, rows, (uint64_t)cols, keys, idx, b, len, out + b, buf, base, bits);
    }
  }
}

#undef EFN
#endif /* ESFX */

#undef FN
#undef CAT
#undef CAT_
