/* Fuzz target: the COO kernels on raw, unvalidated index and value bytes
 * (they validate peer data themselves, kernels.h).
 *
 * Input: [sel: bit 0 index type, bits 1-2 value type, bits 3-4 p - 1,
 *         bits 5-6 nthreads - 1, bit 7 overlap case]
 *        [limit u16: 0xFFFF = no bound][p lengths, 1 byte each]
 *        [the indices of every vector][the values of every vector]
 * (past the end of the input everything reads as 0). Invariants, against
 * reference loops written here: sc_check_sorted_indices reports the first bad
 * position (range before order at one position); sc_merge_add_many equals the
 * reference merge bit for bit or rejects the first bad input at its first bad
 * position; sc_scatter_add adds serially in input order (repeats included) or
 * rejects the first out-of-range index writing nothing (dense length:
 * min(limit, 2048), 64 without a bound); sc_gather copies or
 * rejects; sc_scatter_set copies bits in input order (a repeat keeps its last
 * value; with zero_rest, chosen by the parity of the first length, every other
 * entry is +0) or rejects writing nothing; a value vector inside the dense
 * buffer is SC_ERR_OVERLAP. */
#include "fuzz_common.h"

#define MAXP 4

FZ_NOCOV int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fz_reader r = {data, size};
  unsigned sel = (unsigned)fz_u(&r, 1);
  sc_index_t it = (sel & 1) ? SC_I64 : SC_I32;
  static const sc_dtype vts[4] = {SC_F32, SC_F64, SC_F16, SC_BF16};
  sc_dtype vt = vts[(sel >> 1) & 3];
  int64_t p = 1 + ((sel >> 3) & 3);
  int nt = 1 + (int)((sel >> 5) & 3);
  int64_t limit = (int64_t)fz_u(&r, 2);
  if (limit == 0xFFFF) limit = -1;
  int64_t lens[MAXP], total = 0;
  for (int64_t q = 0; q < p; q++) total += lens[q] = (int64_t)fz_u(&r, 1);
  size_t is = sc_index_size(it), vs = sc_dtype_size(vt);
  void* idx[MAXP];
  void* val[MAXP];
  for (int64_t q = 0; q < p; q++) {
    idx[q] = malloc(lens[q] * is + 1);
    for (int64_t i = 0; i < lens[q]; i++) {
      uint64_t u = fz_u(&r, (int)is);
      if (is == 4) { uint32_t w = (uint32_t)u; memcpy((char*)idx[q] + 4 * i, &w, 4); }
      else memcpy((char*)idx[q] + 8 * i, &u, 8);
    }
  }
  for (int64_t q = 0; q < p; q++) {
    val[q] = malloc(lens[q] * vs + 1);
    for (int64_t i = 0; i < lens[q]; i++) {
      uint64_t u = fz_u(&r, (int)vs);
      memcpy((char*)val[q] + vs * i, &u, vs); /* little-endian host */
    }
  }

  /* 1. the index check of each vector */
  int64_t first_bad[MAXP];
  int range[MAXP];
  for (int64_t q = 0; q < p; q++) {
    first_bad[q] = ref_first_bad(it, idx[q], lens[q], limit, &range[q]);
    sc_error_info e = fz_err();
    int st = sc_check_sorted_indices(it, idx[q], lens[q], limit, nt, &e);
    if (first_bad[q] < 0) {
      FUZZ_CHECK(st == SC_OK);
    } else {
      FUZZ_CHECK(st == (range[q] ? SC_ERR_INDEX_RANGE : SC_ERR_INDEX_ORDER));
      FUZZ_CHECK(e.input == 0 && e.position == first_bad[q]);
      FUZZ_CHECK(e.value == ref_idx(it, idx[q], first_bad[q]));
    }
  }

  /* 2. the k-way merge */
  {
    void* oi = malloc(total * is + 1);
    void* ov = malloc(total * vs + 1);
    void* ri = malloc(total * is + 1);
    void* rv = malloc(total * vs + 1);
    int64_t on = -1;
    sc_error_info e = fz_err();
    int st = sc_merge_add_many(it, vt, p, (const void* const*)idx, (const void* const*)val, lens,
                               limit, nt, oi, ov, &on, &e);
    int64_t q0 = -1;
    for (int64_t q = 0; q < p && q0 < 0; q++)
      if (first_bad[q] >= 0) q0 = q;
    if (q0 < 0) {
      FUZZ_CHECK(st == SC_OK);
      int64_t rn = ref_merge(it, vt, p, (const void* const*)idx, (const void* const*)val, lens,
                                ri, rv);
      FUZZ_CHECK(on == rn);
      FUZZ_CHECK(memcmp(oi, ri, rn * is) == 0);
      for (int64_t i = 0; i < rn; i++) FUZZ_CHECK(ref_same(vt, ov, i, rv, i));
    } else {
      FUZZ_CHECK(st == (range[q0] ? SC_ERR_INDEX_RANGE : SC_ERR_INDEX_ORDER));
      FUZZ_CHECK(e.input == q0 && e.position == first_bad[q0]);
    }
    if (p >= 2 && q0 < 0) { /* the two-input form agrees with the many form */
      int64_t on2 = -1;
      st = sc_merge_add(it, vt, idx[0], val[0], lens[0], idx[1], val[1], lens[1], limit, nt, ri,
                        rv, &on2, &e);
      const void* ii[2] = {idx[0], idx[1]};
      const void* vv[2] = {val[0], val[1]};
      FUZZ_CHECK(st == SC_OK);
      st = sc_merge_add_many(it, vt, 2, ii, vv, lens, limit, nt, oi, ov, &on, &e);
      FUZZ_CHECK(st == SC_OK && on == on2 && memcmp(oi, ri, on * is) == 0);
      FUZZ_CHECK(memcmp(ov, rv, on * vs) == 0);
    }
    free(oi);
    free(ov);
    free(ri);
    free(rv);
  }

  /* 3. scatter and gather of vector 0 into a dense vector */
  {
    int64_t dn = limit < 0 ? 64 : (limit < 2048 ? limit : 2048);
    void* dense = calloc(dn * vs + lens[0] * vs + 1, 1);
    void* ref = calloc(dn * vs + 1, 1);
    for (int64_t i = 0; i < dn; i++) ref_put(vt, dense, i, (double)(i % 7) - 3.0);
    memcpy(ref, dense, dn * vs);
    int64_t bad = -1;
    for (int64_t i = 0; i < lens[0] && bad < 0; i++) {
      int64_t x = ref_idx(it, idx[0], i);
      if (x < 0 || x >= dn) bad = i;
    }
    sc_error_info e = fz_err();
    int st = sc_scatter_add(it, vt, dense, dn, idx[0], val[0], lens[0], nt, &e);
    if (bad >= 0) {
      FUZZ_CHECK(st == SC_ERR_INDEX_RANGE && e.input == 1 && e.position == bad);
      FUZZ_CHECK(memcmp(dense, ref, dn * vs) == 0);
    } else {
      FUZZ_CHECK(st == SC_OK);
      for (int64_t i = 0; i < lens[0]; i++) {
        int64_t x = ref_idx(it, idx[0], i);
        ref_put(vt, ref, x, ref_add(vt, ref_get(vt, ref, x), ref_get(vt, val[0], i)));
      }
      FUZZ_CHECK(ref_same_all(vt, dense, ref, dn));
    }
    void* out = malloc(lens[0] * vs + 1);
    st = sc_gather(it, vt, dense, dn, idx[0], lens[0], nt, out, &e);
    if (bad >= 0) {
      FUZZ_CHECK(st == SC_ERR_INDEX_RANGE && e.position == bad);
    } else {
      FUZZ_CHECK(st == SC_OK);
      for (int64_t i = 0; i < lens[0]; i++)
        FUZZ_CHECK(memcmp((char*)out + vs * i, (char*)dense + vs * ref_idx(it, idx[0], i), vs) == 0);
    }
    if ((sel & 128) && dn > 0 && lens[0] > 0) {
      /* values read from inside the dense buffer: rejected before any write */
      memcpy(ref, dense, dn * vs);
      st = sc_scatter_add(it, vt, dense, dn, idx[0], (char*)dense + vs * (dn / 2), lens[0], nt, &e);
      FUZZ_CHECK(st == SC_ERR_OVERLAP);
      FUZZ_CHECK(memcmp(dense, ref, dn * vs) == 0);
    }
    /* sc_scatter_set of vector 0 (zero_rest by the first length's parity): bits copied in input order
       (the last of a repeat stays), every other entry +0 with zero_rest; nothing on a bad index */
    {
      const int zero_rest = (int)(lens[0] & 1); /* from the input: either way */
      for (int64_t i = 0; i < dn; i++) ref_put(vt, dense, i, (double)(i % 5) + 1.0);
      memcpy(ref, dense, dn * vs);
      st = sc_scatter_set(it, vt, dense, dn, idx[0], val[0], lens[0], zero_rest, nt, &e);
      if (bad >= 0) {
        FUZZ_CHECK(st == SC_ERR_INDEX_RANGE && e.input == 1 && e.position == bad);
        FUZZ_CHECK(memcmp(dense, ref, dn * vs) == 0);
      } else {
        FUZZ_CHECK(st == SC_OK);
        if (zero_rest) memset(ref, 0, dn * vs);
        for (int64_t i = 0; i < lens[0]; i++)
          memcpy((char*)ref + vs * ref_idx(it, idx[0], i), (char*)val[0] + vs * i, vs);
        FUZZ_CHECK(memcmp(dense, ref, dn * vs) == 0);
      }
    }
    free(out);
    free(ref);
    free(dense);
  }
  for (int64_t q = 0; q < p; q++) {
    free(idx[q]);
    free(val[q]);
  }
  return 0;
}
