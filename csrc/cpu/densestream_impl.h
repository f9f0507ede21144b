/*
 * DenseStream kernels of densestream.c, instantiated once per value type.
 *
 * Required macros: VSFX (name suffix), VT (storage type), ACC (sum type),
 * LOAD(v) / STORE(a) (VT <-> ACC), ISZERO(v) (+0 or -0), ZERO (+0 as VT).
 *
 * Every producing kernel feeds the non-zero values of its result, in
 * ascending position, to one emitter, which builds the canonical blocks
 * (densestream.h: a new block when the zero run since the last non-zero is
 * longer than T, else the zeros and the value join the open block). So the
 * block rule is written once, and encode, add and slice agree on it.
 */
#define DCAT_(a, b) a##_##b
#define DCAT(a, b) DCAT_(a, b)
#define FN(name) DCAT(name, VSFX)

typedef struct {
  int64_t* starts; /* NULL: count only */
  int64_t* lengths;
  VT* values;
  int64_t nb, nv, last, max_zero_run;
  int64_t cap_blocks, cap_values; /* writing stops (overflow set) past these */
  int overflow;
} FN(ds_emitter);

static inline FN(ds_emitter) FN(ds_emitter_new)(int64_t* starts, int64_t* lengths, void* values,
                                                 int64_t max_zero_run, int64_t cap_blocks,
                                                 int64_t cap_values) {
  FN(ds_emitter) e = {starts, lengths, (VT*)values, 0, 0, -1, max_zero_run, cap_blocks, cap_values, 0};
  return e;
}

/* a non-zero value v at position p (> every position emitted before); counts always,
   writes while the capacities hold */
static inline void FN(ds_emit)(FN(ds_emitter)* e, int64_t p, VT v) {
  int64_t gap = p - e->last - 1;
  int join = e->nb > 0 && gap <= e->max_zero_run;
  int64_t add = join ? gap + 1 : 1;
  if (e->starts && !e->overflow) {
    if (e->nv + add > e->cap_values || (!join && e->nb >= e->cap_blocks)) {
      e->overflow = 1;
    } else if (join) {
      for (int64_t g = 0; g < gap; g++) e->values[e->nv + g] = ZERO;
      e->values[e->nv + gap] = v;
      e->lengths[e->nb - 1] += add;
    } else {
      e->starts[e->nb] = p;
      e->lengths[e->nb] = 1;
      e->values[e->nv] = v;
    }
  }
  e->nb += !join;
  e->nv += add;
  e->last = p;
}

/* the counts, or {-1, -1} when a writing run ran out of capacity */
static sc_ds_counts FN(ds_done)(const FN(ds_emitter)* e) {
  sc_ds_counts c = {e->nb, e->nv};
  if (e->overflow) c.nblocks = c.nvalues = -1;
  return c;
}

static sc_ds_counts FN(ds_encode_coo)(sc_index_t it, const void* idx, const VT* val, int64_t m,
                                      int64_t T, int64_t* starts, int64_t* lengths, void* values,
                                      int64_t cb, int64_t cv) {
  FN(ds_emitter) e = FN(ds_emitter_new)(starts, lengths, values, T, cb, cv);
  for (int64_t i = 0; i < m; i++) {
    if (ISZERO(val[i])) continue;
    int64_t p = it == SC_I32 ? (int64_t)((const int32_t*)idx)[i] : ((const int64_t*)idx)[i];
    FN(ds_emit)(&e, p, val[i]);
  }
  return FN(ds_done)(&e);
}

static sc_ds_counts FN(ds_encode_dense)(const VT* x, int64_t n, int64_t T, int64_t* starts,
                                        int64_t* lengths, void* values, int64_t cb, int64_t cv) {
  FN(ds_emitter) e = FN(ds_emitter_new)(starts, lengths, values, T, cb, cv);
  for (int64_t p = 0; p < n; p++)
    if (!ISZERO(x[p])) FN(ds_emit)(&e, p, x[p]);
  return FN(ds_done)(&e);
}

/* A cursor over the positions a DenseStream holds, in ascending order. */
typedef struct {
  const int64_t* s;
  const int64_t* l;
  const VT* v;
  int64_t nb, b, off, k; /* block, offset inside it, value index */
} FN(ds_cursor);

static inline int64_t FN(ds_pos)(const FN(ds_cursor)* c) {
  return c->b < c->nb ? c->s[c->b] + c->off : INT64_MAX;
}

static inline void FN(ds_next)(FN(ds_cursor)* c) {
  c->k++;
  if (++c->off == c->l[c->b]) {
    c->b++;
    c->off = 0;
  }
}

static sc_ds_counts FN(ds_add)(const int64_t* sa, const int64_t* la, const VT* va, int64_t nba,
                               const int64_t* sb, const int64_t* lb, const VT* vb, int64_t nbb,
                               int64_t T, int64_t* starts, int64_t* lengths, void* values,
                               int64_t cb, int64_t cv) {
  FN(ds_emitter) e = FN(ds_emitter_new)(starts, lengths, values, T, cb, cv);
  FN(ds_cursor) a = {sa, la, va, nba, 0, 0, 0}, b = {sb, lb, vb, nbb, 0, 0, 0};
  for (;;) {
    int64_t pa = FN(ds_pos)(&a), pb = FN(ds_pos)(&b);
    if (pa == INT64_MAX && pb == INT64_MAX) break; /* positions are < n <= INT64_MAX */
    VT v;
    int64_t p;
    if (pa == pb) {
      v = STORE(LOAD(a.v[a.k]) + LOAD(b.v[b.k]));
      p = pa;
      FN(ds_next)(&a);
      FN(ds_next)(&b);
    } else if (pa < pb) {
      v = a.v[a.k];
      p = pa;
      FN(ds_next)(&a);
    } else {
      v = b.v[b.k];
      p = pb;
      FN(ds_next)(&b);
    }
    if (!ISZERO(v)) FN(ds_emit)(&e, p, v);
  }
  return FN(ds_done)(&e);
}

static sc_ds_counts FN(ds_slice)(const int64_t* s, const int64_t* l, const VT* v, int64_t nb,
                                 int64_t lo, int64_t hi, int64_t T, int64_t* starts,
                                 int64_t* lengths, void* values, int64_t cb, int64_t cv) {
  FN(ds_emitter) e = FN(ds_emitter_new)(starts, lengths, values, T, cb, cv);
  /* first block ending after lo (blocks are sorted and disjoint: ends ascend) */
  int64_t a = 0, z = nb, k = 0;
  while (a < z) {
    int64_t mid = a + (z - a) / 2;
    if (s[mid] + l[mid] <= lo) a = mid + 1;
    else z = mid;
  }
  for (int64_t b = 0; b < a; b++) k += l[b];
  for (int64_t b = a; b < nb && s[b] < hi; k += l[b], b++) {
    int64_t from = s[b] < lo ? lo - s[b] : 0;
    int64_t to = s[b] + l[b] > hi ? hi - s[b] : l[b];
    for (int64_t j = from; j < to; j++)
      if (!ISZERO(v[k + j])) FN(ds_emit)(&e, s[b] + j, v[k + j]);
  }
  return FN(ds_done)(&e);
}

static void FN(ds_add_into)(VT* dense, const int64_t* s, const int64_t* l, const VT* v,
                            int64_t nb) {
  int64_t k = 0;
  for (int64_t b = 0; b < nb; b++) {
    VT* d = dense + s[b];
    for (int64_t j = 0; j < l[b]; j++, k++) d[j] = STORE(LOAD(d[j]) + LOAD(v[k]));
  }
}

static int64_t FN(ds_to_coo)(const int64_t* s, const int64_t* l, const VT* v, int64_t nb,
                             int64_t* idx, VT* val) {
  int64_t k = 0, m = 0;
  for (int64_t b = 0; b < nb; b++)
    for (int64_t j = 0; j < l[b]; j++, k++)
      if (!ISZERO(v[k])) {
        if (idx) {
          idx[m] = s[b] + j;
          val[m] = v[k];
        }
        m++;
      }
  return m;
}

#undef FN
#undef DCAT
#undef DCAT_
