/*
 * COO merge / scatter / gather kernels, instantiated by coo.c for every
 * (index type, value type) pair.
 *
 * Required macros: ISFX, IT (index type), VSFX, VT (raw value type), ACC
 * (accumulator type), LOAD(v) (VT -> ACC), STORE(a) (ACC -> VT).
 */
#define CAT3_(a, b, c) a##_##b##_##c
#define CAT3(a, b, c) CAT3_(a, b, c)
#define FN(name) CAT3(name, ISFX, VSFX)

/* Merge segment [a_lo,a_hi) x [b_lo,b_hi) into oi/ov; returns the count. */
static int64_t FN(merge2_seg)(const IT* ia, const VT* va, int64_t a_lo, int64_t a_hi,
                              const IT* ib, const VT* vb, int64_t b_lo, int64_t b_hi,
                              IT* oi, VT* ov) {
  int64_t i = a_lo, j = b_lo, o = 0;
  while (i < a_hi && j < b_hi) {
    IT x = ia[i], y = ib[j];
    if (x < y) { oi[o] = x; ov[o] = va[i]; i++; }
    else if (y < x) { oi[o] = y; ov[o] = vb[j]; j++; }
    else { ACC s = LOAD(va[i]); s += LOAD(vb[j]); oi[o] = x; ov[o] = STORE(s); i++; j++; }
    o++;
  }
  if (i < a_hi) { memcpy(oi + o, ia + i, (size_t)(a_hi - i) * sizeof(IT)); memcpy(ov + o, va + i, (size_t)(a_hi - i) * sizeof(VT)); o += a_hi - i; }
  if (j < b_hi) { memcpy(oi + o, ib + j, (size_t)(b_hi - j) * sizeof(IT)); memcpy(ov + o, vb + j, (size_t)(b_hi - j) * sizeof(VT)); o += b_hi - j; }
  return o;
}

/* Heap order of the merge: input s1's current index before s2's, ties by input. */
static inline int FN(heap_less)(const IT* const* idx, const int64_t* pos, int64_t s1, int64_t s2) {
  return idx[s1][pos[s1]] < idx[s2][pos[s2]] || (idx[s1][pos[s1]] == idx[s2][pos[s2]] && s1 < s2);
}

/* k-way merge of segments [lo[p], hi[p]) of the p inputs (binary heap). */
static int64_t FN(mergek_seg)(int64_t P, const IT* const* idx, const VT* const* val,
                              const int64_t* lo, const int64_t* hi, int64_t* pos,
                              int64_t* heap, IT* oi, VT* ov) {
  int64_t m = 0, o = 0;
  for (int64_t p = 0; p < P; p++) {
    pos[p] = lo[p];
    if (lo[p] < hi[p]) {
      /* sift up */
      int64_t c = m++;
      heap[c] = p;
      while (c > 0) {
        int64_t par = (c - 1) / 2;
        if (FN(heap_less)(idx, pos, heap[c], heap[par])) { int64_t tmp = heap[c]; heap[c] = heap[par]; heap[par] = tmp; c = par; }
        else break;
      }
    }
  }
  while (m > 0) {
    int64_t s = heap[0];
    IT v = idx[s][pos[s]];
    ACC acc = LOAD(val[s][pos[s]]);
    int first = 1;
    for (;;) {
      if (!first) {
        s = heap[0];
        if (idx[s][pos[s]] != v) break;
        acc += LOAD(val[s][pos[s]]);
      }
      first = 0;
      pos[s]++;
      if (pos[s] >= hi[s]) { heap[0] = heap[--m]; }
      /* sift down from the root */
      int64_t c = 0;
      for (;;) {
        int64_t l = 2 * c + 1, r = l + 1, b = c;
        if (l < m && FN(heap_less)(idx, pos, heap[l], heap[b])) b = l;
        if (r < m && FN(heap_less)(idx, pos, heap[r], heap[b])) b = r;
        if (b == c) break;
        int64_t tmp = heap[c]; heap[c] = heap[b]; heap[b] = tmp; c = b;
      }
      if (m == 0) break;
    }
    oi[o] = v;
    ov[o] = STORE(acc);
    o++;
  }
  return o;
}

/*
 * k-way merge with packed heap keys: (index << sb) | input, one integer
 * compare per heap step (needs index < 2^(63-sb), P <= 2^sb). Equal indices
 * pop in input order, so sums run in list order.
 */
static int64_t FN(mergek_packed)(int64_t P, int sb, const IT* const* idx, const VT* const* val,
                                 const int64_t* lo, const int64_t* hi, int64_t* pos,
                                 uint64_t* heap, IT* oi, VT* ov) {
  int64_t m = 0, o = 0;
  const uint64_t smask = ((uint64_t)1 << sb) - 1;
  for (int64_t p = 0; p < P; p++) {
    pos[p] = lo[p];
    if (lo[p] < hi[p]) {
      uint64_t key = ((uint64_t)(int64_t)idx[p][lo[p]] << sb) | (uint64_t)p;
      int64_t c = m++;
      while (c > 0) {
        int64_t par = (c - 1) / 2;
        if (key < heap[par]) { heap[c] = heap[par]; c = par; } else break;
      }
      heap[c] = key;
    }
  }
  while (m > 0) {
    uint64_t top = heap[0];
    uint64_t v = top >> sb;
    ACC acc = 0;
    int first = 1;
    while (m > 0 && (heap[0] >> sb) == v) {
      int64_t s = (int64_t)(heap[0] & smask);
      if (first) { acc = LOAD(val[s][pos[s]]); first = 0; }
      else acc += LOAD(val[s][pos[s]]);
      pos[s]++;
      uint64_t key;
      if (pos[s] < hi[s]) key = ((uint64_t)(int64_t)idx[s][pos[s]] << sb) | (uint64_t)s;
      else key = heap[--m];
      /* sift key down from the root */
      int64_t c = 0;
      for (;;) {
        int64_t l = 2 * c + 1;
        if (l >= m) break;
        int64_t b = (l + 1 < m && heap[l + 1] < heap[l]) ? l + 1 : l;
        if (heap[b] < key) { heap[c] = heap[b]; c = b; } else break;
      }
      if (m > 0) heap[c] = key;
    }
    oi[o] = (IT)v;
    ov[o] = STORE(acc);
    o++;
  }
  return o;
}

static int64_t FN(lower_bound)(const IT* a, int64_t n, int64_t v) {
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    int64_t mid = lo + (hi - lo) / 2;
    if ((int64_t)a[mid] < v) lo = mid + 1; else hi = mid;
  }
  return lo;
}

/*
 * Generic P-way merge, parallel over nt index-value ranges. Splits are index
 * values, so equal indices never straddle two threads and every sum is done
 * by one thread in list order (deterministic for any thread count).
 */
static int FN(merge_many)(int64_t P, const IT* const* idx, const VT* const* val,
                          const int64_t* lens, int nt, IT* oi, VT* ov, int64_t* out_n) {
  int64_t total = 0;
  int64_t vmin = INT64_MAX, vmax = INT64_MIN;
  for (int64_t p = 0; p < P; p++) {
    total += lens[p];
    if (lens[p] > 0) {
      if ((int64_t)idx[p][0] < vmin) vmin = idx[p][0];
      if ((int64_t)idx[p][lens[p] - 1] > vmax) vmax = idx[p][lens[p] - 1];
    }
  }
  *out_n = 0;
  if (total == 0) return SC_OK;
  if (total < 65536) nt = 1;
  /* splitter values: split[t] = smallest v with sum_p lower_bound(p, v) >= total*t/nt */
  int64_t* bounds = (int64_t*)malloc((size_t)(nt + 1) * (size_t)(P + 1) * sizeof(int64_t));
  /* per-thread heap state, padded to separate cache lines (no false sharing) */
  const size_t sstride = ((size_t)(2 * P + 2) + 15) / 16 * 16 + 16;
  int64_t* scratch = (int64_t*)malloc((size_t)nt * sstride * sizeof(int64_t));
  if (!bounds || !scratch) { free(bounds); free(scratch); return SC_ERR_NOMEM; }
  /* bounds row t: lower bounds of splitter t in each input, then their sum */
  for (int t = 0; t <= nt; t++) {
    int64_t* row = bounds + (size_t)t * (size_t)(P + 1);
    if (t == 0 || t == nt) {
      int64_t sum = 0;
      for (int64_t p = 0; p < P; p++) { row[p] = t == 0 ? 0 : lens[p]; sum += row[p]; }
      row[P] = sum;
      continue;
    }
    int64_t target = total * t / nt;
    int64_t lo = vmin, hi = vmax + 1; /* count(hi) == total >= target */
    while (lo < hi) {
      int64_t mid = lo + (hi - lo) / 2;
      int64_t c = 0;
      for (int64_t p = 0; p < P; p++) c += FN(lower_bound)(idx[p], lens[p], mid);
      if (c >= target) hi = mid; else lo = mid + 1;
    }
    int64_t sum = 0;
    for (int64_t p = 0; p < P; p++) { row[p] = FN(lower_bound)(idx[p], lens[p], lo); sum += row[p]; }
    row[P] = sum;
  }
  /* packed heap keys when the index and the input number fit in 63 bits */
  int sb = 1;
  while (((int64_t)1 << sb) < P) sb++;
  if (sb > 24 || (vmax >> (63 - sb)) != 0) sb = 0;
  int64_t cnt[SC_MAX_THREADS];
  int t;
#pragma omp parallel for num_threads(nt) schedule(static, 1) if (nt > 1)
  for (t = 0; t < nt; t++) {
    const int64_t* r0 = bounds + (size_t)t * (size_t)(P + 1);
    const int64_t* r1 = bounds + (size_t)(t + 1) * (size_t)(P + 1);
    int64_t d = r0[P];
    if (P == 1) {
      int64_t len = r1[0] - r0[0];
      memcpy(oi + d, idx[0] + r0[0], (size_t)len * sizeof(IT));
      memcpy(ov + d, val[0] + r0[0], (size_t)len * sizeof(VT));
      cnt[t] = len;
    } else if (P == 2) {
      cnt[t] = FN(merge2_seg)(idx[0], val[0], r0[0], r1[0], idx[1], val[1], r0[1], r1[1], oi + d, ov + d);
    } else if (sb > 0) {
      int64_t* sc = scratch + (size_t)t * sstride;
      cnt[t] = FN(mergek_packed)(P, sb, idx, val, r0, r1, sc, (uint64_t*)(sc + P), oi + d, ov + d);
    } else {
      int64_t* sc = scratch + (size_t)t * sstride;
      cnt[t] = FN(mergek_seg)(P, idx, val, r0, r1, sc, sc + P, oi + d, ov + d);
    }
  }
  /* compact the segments (each moves left, in order) */
  int64_t o = cnt[0];
  for (t = 1; t < nt; t++) {
    int64_t d = bounds[(size_t)t * (size_t)(P + 1) + P];
    if (d != o && cnt[t] > 0) {
      memmove(oi + o, oi + d, (size_t)cnt[t] * sizeof(IT));
      memmove(ov + o, ov + d, (size_t)cnt[t] * sizeof(VT));
    }
    o += cnt[t];
  }
  *out_n = o;
  free(bounds);
  free(scratch);
  return SC_OK;
}

/* dense[idx[i]] += val[i] in input order; nt > 1 only when the caller knows the
 * indices are distinct (then no two threads touch one entry). */
SC_MAYBE_UNUSED static void FN(scatter_add)(VT* dense, const IT* idx, const VT* val, int64_t n,
                                            int nt) {
  int64_t i;
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
  for (i = 0; i < n; i++) {
    ACC s = LOAD(dense[idx[i]]);
    s += LOAD(val[i]);
    dense[idx[i]] = STORE(s);
  }
}

/* dense[idx[i]] = val[i]; nt > 1 only for distinct (strictly ascending) indices.
 * With `zero_rest` every other entry becomes 0 as well: strictly ascending
 * indices write each entry of dense once, chunk by chunk (a memset of a chunk
 * that fits the L2 cache, then the values that fall in it, while its lines are
 * hot): one streaming write instead of a full memset and a scatter that misses
 * the cache once per value. Any other order: memset, then assign in order. */
SC_MAYBE_UNUSED static void FN(scatter_set)(VT* dense, int64_t dense_n, const IT* idx, const VT* val,
                                            int64_t n, int zero_rest, int ascending, int nt) {
  if (zero_rest && !ascending) {
    memset(dense, 0, (size_t)dense_n * sizeof(VT));
    zero_rest = 0;
  }
  if (!zero_rest) {
    int64_t i;
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1 && n > 32768)
    for (i = 0; i < n; i++) dense[idx[i]] = val[i];
    return;
  }
  const int64_t chunk = 16384; /* 64 KiB of float32 */
  int64_t nchunks = (dense_n + chunk - 1) / chunk, c;
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1 && dense_n > 262144)
  for (c = 0; c < nchunks; c++) {
    int64_t lo = c * chunk, hi = lo + chunk < dense_n ? lo + chunk : dense_n;
    /* first index >= lo (binary search: chunks are independent) */
    int64_t a = 0, b = n;
    while (a < b) {
      int64_t m = a + (b - a) / 2;
      if ((int64_t)idx[m] < lo) a = m + 1; else b = m;
    }
    memset(dense + lo, 0, (size_t)(hi - lo) * sizeof(VT));
    for (int64_t i = a; i < n && (int64_t)idx[i] < hi; i++) dense[idx[i]] = val[i];
  }
}

SC_MAYBE_UNUSED static void FN(gather)(const VT* dense, const IT* idx, int64_t n, int nt, VT* out) {
  int64_t i;
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1 && n > 32768)
  for (i = 0; i < n; i++) out[i] = dense[idx[i]];
}

/* The kernels above on untyped buffers: one signature for every type pair, so that
 * coo.c dispatches on the types by picking a function. */
SC_MAYBE_UNUSED static int FN(merge_many_any)(int64_t P, const void* const* idx,
                                              const void* const* val, const int64_t* lens, int nt,
                                              void* oi, void* ov, int64_t* out_n) {
  return FN(merge_many)(P, (const IT* const*)idx, (const VT* const*)val, lens, nt, (IT*)oi, (VT*)ov,
                        out_n);
}

SC_MAYBE_UNUSED static void FN(scatter_add_any)(void* dense, const void* idx, const void* val,
                                                int64_t n, int nt) {
  FN(scatter_add)((VT*)dense, (const IT*)idx, (const VT*)val, n, nt);
}

SC_MAYBE_UNUSED static void FN(scatter_set_any)(void* dense, int64_t dense_n, const void* idx,
                                                const void* val, int64_t n, int zero_rest,
                                                int ascending, int nt) {
  FN(scatter_set)((VT*)dense, dense_n, (const IT*)idx, (const VT*)val, n, zero_rest, ascending, nt);
}

SC_MAYBE_UNUSED static void FN(gather_any)(const void* dense, const void* idx, int64_t n, int nt,
                                           void* out) {
  FN(gather)((const VT*)dense, (const IT*)idx, n, nt, (VT*)out);
}

#undef FN
#undef CAT3
#undef CAT3_
