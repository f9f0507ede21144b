/* SKCompress, internal: the MinMaxSketch cells of a message (Min on insert, Max on query,
 * their Huffman coding), for one cell type. Included by skcompress.c once per type with
 *   CT  the cell type: uint8_t when every offset fits below 0xFF (G <= 255: the default
 *       G = 16, so 1.5M entries' 0.6M cells stay in L2), else uint16_t,
 *   SX  a name suffix.
 * The empty cell (no key reached it) is the type's largest value until cells_finish. */

#define CELLS_CAT2(a, b) a##b
#define CELLS_CAT(a, b) CELLS_CAT2(a, b)
#define CX(name) CELLS_CAT(name, SX)
#define CELL_EMPTY ((CT)~(CT)0)

#ifndef SKC_UMAX3
#define SKC_UMAX3
/* The largest of three, without a branch (a compare of cells would be a coin toss). */
static inline unsigned umax3(unsigned a, unsigned b, unsigned c) {
  unsigned m = a ^ ((a ^ b) & -(unsigned)(b > a));
  return m ^ ((m ^ c) & -(unsigned)(c > m));
}
#endif

/* Min on insert of every entry into its list's s rows; code[i] = list << 12 | offset. The
 * cells of a block of entries first (cell_index: no dependence from one to the next), then
 * their minima. */
static void CX(sketch_insert)(const int64_t* idx, const uint32_t* code, int64_t n, const uint64_t* lbase,
                              const uint64_t* lcols, int64_t s, const uint64_t* rk, CT* cells) {
  cell_index_fn index = cell_index();
  uint64_t i0[SKC_BLOCK], i1[SKC_BLOCK];
  for (int64_t b = 0; b < n; b += SKC_BLOCK) {
    int64_t m = n - b < SKC_BLOCK ? n - b : SKC_BLOCK;
    const uint32_t* c = code + b;
    for (int64_t p = 0; 2 * p < s; p++) {
      index(idx + b, c, 12, m, lbase, lcols, rk[p], (uint64_t)(2 * p), i0, i1);
      if (2 * p + 1 < s) {
        for (int64_t i = 0; i < m; i++) {
          CT off = (CT)(c[i] & 0xFFF), *c0 = cells + i0[i], *c1 = cells + i1[i];
          *c0 = off < *c0 ? off : *c0;
          *c1 = off < *c1 ? off : *c1;
        }
      } else { /* an odd s: the last row alone */
        for (int64_t i = 0; i < m; i++) {
          CT off = (CT)(c[i] & 0xFFF), *c0 = cells + i0[i];
          *c0 = off < *c0 ? off : *c0;
        }
      }
    }
  }
}

/* A cell no key reaches is never queried and goes as 0; freq[v] (zeroed) counts the cells. */
static void CX(cells_finish)(CT* cells, int64_t total, uint64_t* freq) {
  for (int64_t c = 0; c < total; c++) {
    CT v = cells[c] == CELL_EMPTY ? 0 : cells[c];
    cells[c] = v;
    freq[v]++;
  }
}

/* The cells' Huffman codes (e[v] = code << 4 | length) into w. */
static void CX(write_cells)(const CT* cells, int64_t total, const uint32_t* e, bit_writer* wp) {
  bit_writer w = *wp;
  for (int64_t c = 0; c < total; c++) {
    uint32_t x = e[cells[c]];
    bw_put(&w, x >> 4, (int)(x & 15));
  }
  *wp = w;
}

/* A Huffman-coded stream of values < 4096 (and < the type's largest) at stream[0 ..
 * ceil(nbits / 8)) into out[0..n): SC_OK when every code is one and the codes take exactly
 * nbits, else SC_ERR_MALFORMED with *bad = the first value that failed (n when only the
 * bit count is wrong). */
static int CX(read_codes)(const uint8_t* stream, int64_t nbits, const hf_table* t, int64_t n, CT* out,
                          int64_t* bad) {
  uint8_t tail[BR_TAIL];
  bit_reader r;
  br_init(&r, stream, nbits, tail);
  const uint16_t* tab = t->e;
  int tb = t->maxlen;
  int64_t i = 0;
  if (tb <= 18) { /* three codes a refill */
    for (; i + 3 <= n; i += 3) {
      br_refill(&r);
      unsigned e0 = tab[br_top(&r, tb)];
      br_skip(&r, (int)(e0 & 15));
      unsigned e1 = tab[br_top(&r, tb)];
      br_skip(&r, (int)(e1 & 15));
      unsigned e2 = tab[br_top(&r, tb)];
      br_skip(&r, (int)(e2 & 15));
      if (__builtin_expect(!e0 || !e1 || !e2, 0)) {
        *bad = !e0 ? i : !e1 ? i + 1 : i + 2;
        return SC_ERR_MALFORMED;
      }
      out[i] = (CT)(e0 >> 4);
      out[i + 1] = (CT)(e1 >> 4);
      out[i + 2] = (CT)(e2 >> 4);
    }
  }
  for (; i < n; i++) {
    br_refill(&r);
    unsigned e = tab[br_top(&r, tb)];
    br_skip(&r, (int)(e & 15));
    if (!e) { *bad = i; return SC_ERR_MALFORMED; }
    out[i] = (CT)(e >> 4);
  }
  if (br_consumed(&r) != nbits) { *bad = br_consumed(&r) > nbits ? n - 1 : n; return SC_ERR_MALFORMED; }
  return SC_OK;
}

/* Each key's value: its list's value at the Max of its cells; lid[i] >> shift is its list
 * (< lists): the decoder's list ids (shift 0) or the encoder's list << 12 | offset codes.
 * The cells of a block of keys first (cell_index), then their maxima and values. Checked on
 * the way, without a branch a key: each offset inside its list's buckets in use (a
 * malformed one reads a padding entry of the value table); the first fault is then
 * reported. */
static int CX(query_values)(const dec_list* L, const uint64_t* lbase, const uint64_t* lcols, const uint32_t* lid,
                            int shift, const CT* cells, int64_t s, const int64_t* keys, int64_t count,
                            const void* vtab, int vs, void* val_out, int64_t at, sc_error_info* err) {
  uint64_t rk[SC_SKC_MAX_ROWS];
  for (int64_t j = 0; j < (s + 1) / 2; j++) rk[j] = row_key(j);
  cell_index_fn index = cell_index();
  uint64_t i0[SKC_BLOCK], i1[SKC_BLOCK];
  uint16_t bw[SKC_BLOCK]; /* each key's Max */
  unsigned bad = 0;
  for (int64_t b = 0; b < count; b += SKC_BLOCK) {
    int64_t m = count - b < SKC_BLOCK ? count - b : SKC_BLOCK;
    const uint32_t* l = lid + b;
    for (int64_t i = 0; i < m; i++) bw[i] = 0;
    for (int64_t p = 0; 2 * p < s; p++) { /* each row pair */
      index(keys + b, l, shift, m, lbase, lcols, rk[p], (uint64_t)(2 * p), i0, i1);
      if (2 * p + 1 < s)
        for (int64_t i = 0; i < m; i++) bw[i] = (uint16_t)umax3(bw[i], cells[i0[i]], cells[i1[i]]);
      else /* an odd s: the last row alone */
        for (int64_t i = 0; i < m; i++) bw[i] = (uint16_t)umax3(bw[i], cells[i0[i]], 0);
    }
    if (vs == 4) {
      const float* vt = (const float*)vtab;
      float* o = (float*)val_out + b;
      for (int64_t i = 0; i < m; i++) {
        const dec_list* d = &L[l[i] >> shift];
        bad |= (int64_t)bw[i] >= d->lim;
        o[i] = vt[d->vals + bw[i]];
      }
    } else {
      const double* vt = (const double*)vtab;
      double* o = (double*)val_out + b;
      for (int64_t i = 0; i < m; i++) {
        const dec_list* d = &L[l[i] >> shift];
        bad |= (int64_t)bw[i] >= d->lim;
        o[i] = vt[d->vals + bw[i]];
      }
    }
  }
  if (bad)
    for (int64_t b = 0; b < count; b += SKC_BLOCK) {
      int64_t m = count - b < SKC_BLOCK ? count - b : SKC_BLOCK;
      /* the same maxima again, block by block, to find the first fault */
      for (int64_t i = 0; i < m; i++) {
        const dec_list* d = &L[lid[b + i] >> shift];
        uint64_t key = (uint64_t)keys[b + i], cols = d->cols;
        const CT* row = cells + d->base;
        unsigned v = 0;
        for (int64_t j = 0; j < s; j += 2, row += 2 * cols) {
          uint64_t h = sc_mix64(key ^ rk[j >> 1]);
          unsigned x = row[((h >> 32) * cols) >> 32];
          v = x > v ? x : v;
          if (j + 1 < s) {
            x = row[cols + (((h & 0xFFFFFFFFull) * cols) >> 32)];
            v = x > v ? x : v;
          }
        }
        if ((int64_t)v >= d->lim) return sc_fail(err, SC_ERR_MALFORMED, SC_SKC_F_CELL, at, (int64_t)v);
      }
    }
  return SC_OK;
}

#undef CELL_EMPTY
#undef CX
#undef CELLS_CAT
#undef CELLS_CAT2
