/* SKCompress, internal: exact order statistics and bucket lookup over unsigned keys whose
 * integer order is the order of the values (float magnitudes as their bits; signed floats
 * as order keys), and the quantification of a value vector with them. Included by
 * skc_quantile.c once per value type with
 *   VT  the value type (float or double),  KT  the unsigned integer of its width,
 *   SX  a name suffix.
 *
 * Selection (several ranks at once) is a radix select over the key range [lo, hi]: one
 * histogram pass over bins of 2^shift keys (about one bin per key, at most 2^16; bins that
 * fine also keep neighbouring keys from waiting on one counter), the ranks located in the
 * cumulative counts, one pass gathering the keys of the bins that hold a rank, and the same
 * on each such bin's keys (a range up to 2^16 times narrower) until a bin holds few keys or
 * one key value. O(n) per level, and a level only sees the keys of bins that hold a rank:
 * for the q/2 - 1 quantiles of a sign, a few keys each where the keys spread evenly over
 * their range; more where they crowd (such a bin is worked on again, on its keys only). */

#define SEL_CAT2(a, b) a##b
#define SEL_CAT(a, b) SEL_CAT2(a, b)
#define SEL(name) SEL_CAT(name, SX)

typedef struct {
  KT lo;
  int shift;
  int64_t nbins;
} SEL(binning);

/* Bins of 2^shift keys over [lo, hi]: about n / per bins, 64 .. 2^max_log2. */
static SEL(binning) SEL(make_binning)(KT lo, KT hi, int64_t n, int64_t per, int max_log2) {
  SEL(binning) b;
  int hb = 6;
  while (hb < max_log2 && ((int64_t)1 << (hb + 1)) <= n / per) hb++;
  KT span = hi - lo;
  int sb = span ? (int)(sizeof(KT) * 8) - (sizeof(KT) == 4 ? __builtin_clz((uint32_t)span)
                                                             : __builtin_clzll((uint64_t)span))
                : 0;
  b.lo = lo;
  b.shift = sb > hb ? sb - hb : 0;
  b.nbins = (int64_t)(span >> b.shift) + 1;
  return b;
}

static void SEL(insertion_sort)(KT* a, int64_t n) {
  for (int64_t i = 1; i < n; i++) {
    KT x = a[i];
    int64_t j = i - 1;
    while (j >= 0 && a[j] > x) { a[j + 1] = a[j]; j--; }
    a[j + 1] = x;
  }
}

/* out[j] = the key of rank ranks[j] (0-based, ascending, < n) among a[0..n) (reordered
 * only when short); lo / hi: the least and the largest key. */
static int SEL(select_ranks)(KT* a, int64_t n, KT lo, KT hi, const int64_t* ranks, int64_t m,
                             KT* out) {
  if (m == 0) return SC_OK;
  if (lo == hi) {
    for (int64_t j = 0; j < m; j++) out[j] = lo;
    return SC_OK;
  }
  if (n <= 48) {
    SEL(insertion_sort)(a, n);
    for (int64_t j = 0; j < m; j++) out[j] = a[ranks[j]];
    return SC_OK;
  }
  SEL(binning) bn = SEL(make_binning)(lo, hi, n, 1, 16);
  int sh = bn.shift;
  uint32_t* hist = (uint32_t*)calloc((size_t)bn.nbins, sizeof(uint32_t));
  /* per rank: its bin's slot among the bins holding ranks, and its rank inside the bin */
  int64_t* sub_rank = (int64_t*)malloc(sizeof(int64_t) * (size_t)m);
  int64_t* slot_of = (int64_t*)malloc(sizeof(int64_t) * (size_t)m);
  int64_t* slot_bin = (int64_t*)malloc(sizeof(int64_t) * (size_t)(m + 1));
  int64_t* slot_start = (int64_t*)malloc(sizeof(int64_t) * (size_t)(m + 2));
  uint16_t* slot_map = NULL;
  KT* cand = NULL;
  int st = SC_OK;
  if (!hist || !sub_rank || !slot_of || !slot_bin || !slot_start) { st = SC_ERR_NOMEM; goto done; }
  for (int64_t i = 0; i < n; i++) hist[(a[i] - lo) >> sh]++;
  int64_t nslots = 0, cum = 0, j = 0;
  slot_start[0] = 0;
  for (int64_t k = 0; k < bn.nbins && j < m; k++) {
    int64_t c = hist[k];
    if (j < m && ranks[j] < cum + c) {
      slot_bin[nslots] = k;
      slot_start[nslots + 1] = slot_start[nslots] + c;
      while (j < m && ranks[j] < cum + c) {
        sub_rank[j] = ranks[j] - cum;
        slot_of[j] = nslots;
        j++;
      }
      nslots++;
    }
    cum += c;
  }
  /* gather the keys of the bins holding ranks, bin by bin: first, without a branch, every
   * such key and its slot in key order (the count lives in a register: a key of another bin
   * is written past the last one and overwritten), then by slot */
  slot_map = (uint16_t*)calloc((size_t)bn.nbins, sizeof(uint16_t));
  int64_t total = slot_start[nslots];
  cand = (KT*)malloc(sizeof(KT) * (size_t)(2 * total + 1));
  uint16_t* cslot = (uint16_t*)malloc(sizeof(uint16_t) * (size_t)(total + 1));
  int64_t* fill = (int64_t*)malloc(sizeof(int64_t) * (size_t)(nslots + 1));
  if (!slot_map || !cand || !cslot || !fill) { free(cslot); free(fill); st = SC_ERR_NOMEM; goto done; }
  for (int64_t s = 0; s < nslots; s++) slot_map[slot_bin[s]] = (uint16_t)(s + 1);
  {
    KT* ck = cand + total; /* total + 1 places */
    int64_t k = 0;
    for (int64_t i = 0; i < n; i++) {
      unsigned s = slot_map[(a[i] - lo) >> sh];
      ck[k] = a[i];
      cslot[k] = (uint16_t)s;
      k += s != 0;
    }
    memcpy(fill, slot_start, sizeof(int64_t) * (size_t)nslots);
    for (int64_t c = 0; c < total; c++) cand[fill[cslot[c] - 1]++] = ck[c];
  }
  free(cslot);
  free(fill);
  /* each bin: its ranks, on its keys */
  for (int64_t s = 0, jr = 0; s < nslots && !st; s++) {
    int64_t j0 = jr;
    while (jr < m && slot_of[jr] == s) jr++;
    KT* sub = cand + slot_start[s];
    int64_t c = slot_start[s + 1] - slot_start[s];
    KT slo = sub[0], shi = sub[0];
    for (int64_t i = 1; i < c; i++) {
      if (sub[i] < slo) slo = sub[i];
      if (sub[i] > shi) shi = sub[i];
    }
    st = SEL(select_ranks)(sub, c, slo, shi, sub_rank + j0, jr - j0, out + j0);
  }
done:
  free(hist);
  free(sub_rank);
  free(slot_of);
  free(slot_bin);
  free(slot_start);
  free(slot_map);
  free(cand);
  return st;
}

/* Bucket lookup of one sign: bucket(a) = #{j in 1..nb-1 : split[j] <= a} for keys a in
 * [split[0], split[nb]], through a table over bins of the key range (about four bins per
 * key, at most 2^16, two bytes each): a bin without a split inside holds its keys' bucket,
 * one load; a bin with a split inside holds the bucket of its first key, marked, and its
 * keys count the splits from there. Those are few keys where values spread (the bins are
 * narrower than a bucket wherever the keys crowd), but where values repeat -- sums of
 * decoded values, which take few distinct values -- the splits are those values and nearly
 * every key lies in a marked bin: the count starts at the bin's first split and takes the
 * next SPLIT_RUN splits at once, without a branch; only a bin holding more splits (a value
 * repeated over more than SPLIT_RUN quantiles) goes on with a binary search. */
typedef struct {
  SEL(binning) bn;
  const KT* split;   /* split[0..nb-1], then SPLIT_RUN keys above any magnitude */
  int64_t nb;
  uint16_t* tab;     /* per bin: its first key's bucket, | BUCKET_SPLIT if a split is inside;
                      * the split copy lives in the same block */
} SEL(bucket_table);

#ifndef SPLIT_RUN
#define SPLIT_RUN 8
#endif

#ifndef BUCKET_SPLIT
#define BUCKET_SPLIT 0x8000u
#endif

static int SEL(bucket_table_build)(SEL(bucket_table)* t, const KT* split, int64_t nb, int64_t n) {
  t->nb = nb;
  t->bn = SEL(make_binning)(split[0], split[nb], 4 * n, 1, 16);
  size_t tab_bytes = (sizeof(uint16_t) * (size_t)t->bn.nbins + sizeof(KT) - 1) / sizeof(KT) * sizeof(KT);
  t->tab = (uint16_t*)malloc(tab_bytes + sizeof(KT) * (size_t)(nb + SPLIT_RUN));
  if (!t->tab) return SC_ERR_NOMEM;
  KT* pad = (KT*)((char*)t->tab + tab_bytes);
  memcpy(pad, split, sizeof(KT) * (size_t)nb);
  for (int64_t j = nb; j < nb + SPLIT_RUN; j++) pad[j] = ~(KT)0;
  t->split = pad;
  /* bin k holds #{j : split[j] <= its first key}: runs of equal entries, split by split;
   * then the bins with a split past their first key are marked */
  KT mask = (KT)((((KT)1) << t->bn.shift) - 1);
  int64_t k0 = 0;
  for (int64_t j = 1; j < nb; j++) {
    KT off = split[j] - t->bn.lo;
    int64_t kj = (int64_t)(off >> t->bn.shift) + ((off & mask) != 0); /* first bin starting >= split */
    for (int64_t k = k0; k < kj; k++) t->tab[k] = (uint16_t)(j - 1);
    if (kj > k0) k0 = kj;
  }
  for (int64_t k = k0; k < t->bn.nbins; k++) t->tab[k] = (uint16_t)(nb - 1);
  for (int64_t j = 1; j < nb; j++) {
    KT off = split[j] - t->bn.lo;
    if (off & mask) t->tab[off >> t->bn.shift] |= (uint16_t)BUCKET_SPLIT;
  }
  return SC_OK;
}

/* A key of a bin with a split inside, e its table entry: #{j in 1..nb-1 : split[j] <= a}.
 * The splits below the bin's first split are the entry's bucket; the next SPLIT_RUN are
 * counted at once (ascending, so the count is a position; past nb they count 0). */
static unsigned SEL(bucket_search)(const SEL(bucket_table)* t, KT a, unsigned e) {
  int64_t lo = (int64_t)(e & ~BUCKET_SPLIT) + 1, hi = t->nb;
  const KT* run = t->split + lo;
  unsigned c = 0;
  for (int i = 0; i < SPLIT_RUN; i++) c += run[i] <= a;
  if (c < SPLIT_RUN) return (unsigned)(lo - 1) + c;
  lo += SPLIT_RUN;
  while (lo < hi) { /* split[lo - 1] <= a: the answer is in [lo - 1, hi - 1] */
    int64_t mid = (lo + hi) >> 1;
    if (t->split[mid] <= a) lo = mid + 1; else hi = mid;
  }
  return (unsigned)(lo - 1);
}

static inline unsigned SEL(bucket_lookup)(const SEL(bucket_table)* t, KT a) {
  unsigned e = t->tab[(a - t->bn.lo) >> t->bn.shift];
  return __builtin_expect(e & BUCKET_SPLIT, 0) ? SEL(bucket_search)(t, a, e) : e;
}

#define SEL_BITS ((int)sizeof(KT) * 8)
#define SEL_SIGN ((KT)1 << (SEL_BITS - 1))
/* the bits of an infinity: a magnitude at or above it is not finite */
#define SEL_INF (sizeof(KT) == 4 ? (KT)0x7F800000u : (KT)0x7FF0000000000000ull)

static inline KT SEL(bits_of)(const VT* v, int64_t i) {
  KT u;
  memcpy(&u, v + i, sizeof u);
  return u;
}

static inline VT SEL(value_of)(KT u) {
  VT x;
  memcpy(&x, &u, sizeof x);
  return x;
}

/* The ranks floor(j n / nq), j = j0 .. j1 - 1. */
static int64_t* SEL(rank_list)(int64_t n, int64_t nq, int64_t j0, int64_t j1) {
  int64_t* r = (int64_t*)malloc(sizeof(int64_t) * (size_t)(j1 - j0 + 1));
  if (r)
    for (int64_t j = j0; j < j1; j++) r[j - j0] = (int64_t)(((__int128)j * n) / nq);
  return r;
}

/* Exact quantiles of the signed values x[0..n) (no NaN): out[j] = the item of rank
 * floor(j n / nq), j < nq, then out[nq] = the largest; -0.0 ranks below +0.0. */
static int SEL(quantiles_exact)(const VT* x, int64_t n, int64_t nq, double* out) {
  KT* k = (KT*)malloc(sizeof(KT) * (size_t)n);
  int64_t* ranks = SEL(rank_list)(n, nq, 0, nq);
  KT* got = (KT*)malloc(sizeof(KT) * (size_t)nq);
  int st = SC_OK;
  if (!k || !ranks || !got) { st = SC_ERR_NOMEM; goto done; }
  KT lo = ~(KT)0, hi = 0;
  for (int64_t i = 0; i < n; i++) {
    KT u = SEL(bits_of)(x, i);
    KT key = (u & SEL_SIGN) ? ~u : (u | SEL_SIGN);
    k[i] = key;
    lo = key < lo ? key : lo;
    hi = key > hi ? key : hi;
  }
  st = SEL(select_ranks)(k, n, lo, hi, ranks, nq, got);
  if (st) goto done;
  for (int64_t j = 0; j <= nq; j++) {
    KT key = j < nq ? got[j] : hi;
    KT u = (key & SEL_SIGN) ? (key & ~SEL_SIGN) : ~key;
    out[j] = (double)SEL(value_of)(u);
  }
done:
  free(k);
  free(ranks);
  free(got);
  return st;
}

/* The splits of one sign from its magnitudes a[0..n) (n >= 1, reordered) with least lo and
 * largest hi: nb = min(B, n) buckets, split[0] = lo, split[nb] = hi, split[j] = the item of
 * rank floor(j n / nb) -- by the exact selection when n <= exact_max, else from the
 * compactor sketch (kept ordered and inside [lo, hi]). */
static int SEL(sign_splits)(KT* a, int64_t n, KT lo, KT hi, int64_t B, int64_t exact_max, KT* split,
                            int64_t* nb_out) {
  int64_t nb = n < B ? n : B;
  int st = SC_OK;
  if (n <= exact_max && n < ((int64_t)1 << 32)) {
    int64_t* ranks = SEL(rank_list)(n, nb, 1, nb);
    if (!ranks) return SC_ERR_NOMEM;
    st = SEL(select_ranks)(a, n, lo, hi, ranks, nb - 1, split + 1);
    free(ranks);
  } else {
    double* d = (double*)malloc(sizeof(double) * (size_t)(n + nb + 1));
    if (!d) return SC_ERR_NOMEM;
    for (int64_t i = 0; i < n; i++) d[i] = (double)SEL(value_of)(a[i]);
    st = quantiles_of(d, n, nb, exact_max, d + n);
    for (int64_t j = 1; j < nb && !st; j++) {
      KT u;
      VT x = (VT)d[n + j];
      memcpy(&u, &x, sizeof u);
      split[j] = u;
    }
    free(d);
  }
  if (st) return st;
  split[0] = lo;
  split[nb] = hi;
  for (int64_t j = 1; j < nb; j++) { /* keep them ordered and inside [lo, hi] */
    if (split[j] < split[j - 1]) split[j] = split[j - 1];
    if (split[j] > hi) split[j] = hi;
  }
  *nb_out = nb;
  return SC_OK;
}

/* The bucket tables of both signs, their bins' first key, width and table as arrays the
 * sign indexes (0: negative, 1: the others), so a lookup picks its sign without a branch. */
typedef struct {
  KT lo[2];
  int shift[2];
  const uint16_t* tab[2];
  const SEL(bucket_table)* t;
} SEL(sign_tables);

/* The mapped bucket of v[i]: its sign's table entry, searched on when a split lies inside
 * its bin, then through that sign's map mp[sign]. Always inlined: quantify calls it four
 * times an iteration, on independent values, for the lookups to overlap. */
static inline __attribute__((always_inline)) uint32_t SEL(mapped_bucket)(const VT* v, int64_t i,
                                                                         const SEL(sign_tables)* sb,
                                                                         const uint32_t* const* mp) {
  KT u = SEL(bits_of)(v, i), mag = u & ~SEL_SIGN;
  int pos = (int)(((u >> (SEL_BITS - 1)) & (KT)(mag != 0)) ^ 1);
  uint32_t c = sb->tab[pos][(mag - sb->lo[pos]) >> sb->shift[pos]];
  if (__builtin_expect(c & BUCKET_SPLIT, 0)) c = SEL(bucket_search)(&sb->t[pos], mag, c);
  return mp[pos][c];
}

/* Sign-split quantile buckets of v[0..n): qz (n, nb and the splits as doubles per sign) and
 * per entry out[i] = its bucket, or with a map, map[its bucket + B if non-negative] counted
 * in lists[(i & 3) * nl + (out[i] >> 12)]. scratch: n + 1 keys (out may be scratch itself:
 * it is written last), or NULL. */
static int SEL(quantify)(const VT* v, int64_t n, int64_t B, int64_t exact_max, int32_t* out,
                         const skc_bucket_map* map, void* scratch, quantized* qz, sc_error_info* err) {
  KT* a = scratch ? (KT*)scratch : (KT*)malloc(sizeof(KT) * (size_t)(n + 1));
  KT* split = (KT*)malloc(sizeof(KT) * (size_t)(2 * (B + 1)));
  SEL(bucket_table) t[2];
  t[0].tab = t[1].tab = NULL;
  int st = SC_OK;
  if (!a || !split) { st = SC_ERR_NOMEM; goto done; }
  /* one pass: sign and magnitude bits, negatives from the front and the others from the
   * back; both places are written, so no branch on the sign (a write to the other sign's
   * place is overwritten by that sign's next entry, or is the same entry's) */
  int64_t cn = 0, cp = 0;
  for (int64_t i = 0; i < n; i++) {
    KT u = SEL(bits_of)(v, i), mag = u & ~SEL_SIGN;
    KT neg = (u >> (SEL_BITS - 1)) & (KT)(mag != 0);
    a[cn] = mag;
    a[n - 1 - cp] = mag;
    cn += (int64_t)neg;
    cp += (int64_t)(neg ^ 1);
  }
  /* finite, least and largest per sign: contiguous, so vectorised */
  KT bad = 0, lo0 = ~(KT)0, hi0 = 0, lo1 = ~(KT)0, hi1 = 0;
  for (int64_t i = 0; i < cn; i++) {
    KT x = a[i];
    lo0 = x < lo0 ? x : lo0;
    hi0 = x > hi0 ? x : hi0;
  }
  for (int64_t i = cn; i < n; i++) {
    KT x = a[i];
    lo1 = x < lo1 ? x : lo1;
    hi1 = x > hi1 ? x : hi1;
  }
  bad = (cn && hi0 >= SEL_INF) || (cp && hi1 >= SEL_INF);
  if (bad) {
    for (int64_t i = 0; i < n; i++)
      if ((SEL(bits_of)(v, i) & ~SEL_SIGN) >= SEL_INF) { st = sc_fail(err, SC_ERR_NAN, 1, i, 0); goto done; }
  }
  qz->n[0] = cn;
  qz->n[1] = cp;
  KT lo[2] = {lo0, lo1}, hi[2] = {hi0, hi1};
  KT* arr[2] = {a, a + (n - cp)};
  for (int sg = 0; sg < 2; sg++) {
    qz->nb[sg] = 0;
    if (!qz->n[sg]) continue;
    KT* sp = split + sg * (B + 1);
    st = SEL(sign_splits)(arr[sg], qz->n[sg], lo[sg], hi[sg], B, exact_max, sp, &qz->nb[sg]);
    if (st) goto done;
    for (int64_t j = 0; j <= qz->nb[sg]; j++) qz->splits[sg][j] = (double)SEL(value_of)(sp[j]);
    st = SEL(bucket_table_build)(&t[sg], sp, qz->nb[sg], qz->n[sg]);
    if (st) goto done;
  }
  /* per sign: the bins' first key, width and table, as arrays the sign indexes */
  SEL(sign_tables) sb = {{t[0].bn.lo, t[1].bn.lo}, {t[0].bn.shift, t[1].bn.shift}, {t[0].tab, t[1].tab}, t};
  if (!map) {
    for (int64_t i = 0; i < n; i++) {
      KT u = SEL(bits_of)(v, i), mag = u & ~SEL_SIGN;
      int pos = (int)(((u >> (SEL_BITS - 1)) & (KT)(mag != 0)) ^ 1);
      out[i] = (int32_t)SEL(bucket_lookup)(&t[pos], mag);
    }
  } else { /* four counters a list: runs of one list do not wait on one counter */
    const uint32_t* mp[2] = {map->map, map->map + B};
    int64_t nl = map->nl, *c0 = map->counts, *c1 = c0 + nl, *c2 = c1 + nl, *c3 = c2 + nl;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
      uint32_t x0 = SEL(mapped_bucket)(v, i, &sb, mp);
      uint32_t x1 = SEL(mapped_bucket)(v, i + 1, &sb, mp);
      uint32_t x2 = SEL(mapped_bucket)(v, i + 2, &sb, mp);
      uint32_t x3 = SEL(mapped_bucket)(v, i + 3, &sb, mp);
      out[i] = (int32_t)x0;
      out[i + 1] = (int32_t)x1;
      out[i + 2] = (int32_t)x2;
      out[i + 3] = (int32_t)x3;
      c0[x0 >> 12]++;
      c1[x1 >> 12]++;
      c2[x2 >> 12]++;
      c3[x3 >> 12]++;
    }
    for (; i < n; i++) {
      uint32_t x = SEL(mapped_bucket)(v, i, &sb, mp);
      out[i] = (int32_t)x;
      c0[x >> 12]++;
    }
  }
done:
  if (!scratch) free(a);
  free(split);
  free(t[0].tab);
  free(t[1].tab);
  return st;
}

#undef SEL_BITS
#undef SEL_SIGN
#undef SEL_INF
#undef SEL
#undef SEL_CAT
#undef SEL_CAT2
