/* Fuzz target: top-k and block top-k on arbitrary bytes (NaN, Inf, -0.0,
 * subnormals, ties).
 *
 * Input: [sel: bits 0-1 dtype (f32 f64 f16 bf16), bit 2 negate k, bits 3-4
 *         nthreads - 1, bits 5-7 all set: also run the radix path]
 *        [k u16][num_blocks u16][k_per_block u16][x bytes]
 * Invariants (reference checks of csrc/tests/ref.h):
 *   - a NaN anywhere in x: SC_ERR_NAN from sc_topk, the radix path and
 *     sc_block_topk; k < 0: SC_ERR_ARG;
 *   - otherwise min(k, n) entries, indices strictly ascending, values the bits
 *     of x at them, and every selected entry beats every other one: larger
 *     |x|, or equal |x| (+0 == -0) and a lower index;
 *   - the radix path gives the same bytes as the automatic path (on an eighth
 *     of the inputs: it allocates and clears 2^16-bin histograms per call,
 *     most of an execution's time at these sizes);
 *   - block top-k (num_blocks taken modulo n + 4, so 0 and more blocks than
 *     elements both occur): sc_block_topk_count entries, each block
 *     [b n/B, (b+1) n/B) contributes min(k_per_block, len) entries that
 *     satisfy the same selection rule inside the block. */
#include "fuzz_common.h"

FZ_NOCOV int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fz_reader r = {data, size};
  unsigned sel = (unsigned)fz_u(&r, 1);
  static const sc_dtype dts[4] = {SC_F32, SC_F64, SC_F16, SC_BF16};
  sc_dtype t = dts[sel & 3];
  int64_t k = (int64_t)fz_u(&r, 2);
  if (sel & 4) k = -k - 1;
  int64_t blocks = (int64_t)fz_u(&r, 2);
  int64_t kpb = (int64_t)fz_u(&r, 2);
  int nt = 1 + (int)((sel >> 3) & 3);
  size_t w = sc_dtype_size(t);
  int64_t n = (int64_t)(r.n / w);
  void* x = fz_dup(r.p, (size_t)n * w);
  blocks %= n + 4; /* 0 (rejected) to n + 3 (more blocks than elements) */
  int has_nan = 0;
  for (int64_t i = 0; i < n; i++) {
    double v = ref_get(t, x, i);
    if (v != v) has_nan = 1;
  }

  int64_t m = k < 0 ? 0 : (k < n ? k : n);
  int64_t* idx = (int64_t*)malloc((size_t)m * 8 + 8);
  int64_t* idx2 = (int64_t*)malloc((size_t)m * 8 + 8);
  void* vals = malloc((size_t)m * w + 8);
  void* vals2 = malloc((size_t)m * w + 8);
  sc_error_info e = fz_err();
  int st = sc_topk(t, x, n, k, nt, vals, idx, &e);
  int radix = (sel >> 5) == 7;
  int st2 = radix ? sc_topk_path(SC_TOPK_RADIX, t, x, n, k, nt, vals2, idx2, &e) : st;
  if (k < 0) {
    FUZZ_CHECK(st == SC_ERR_ARG && st2 == SC_ERR_ARG);
  } else if (has_nan) {
    FUZZ_CHECK(st == SC_ERR_NAN && st2 == SC_ERR_NAN);
  } else {
    FUZZ_CHECK(st == SC_OK && st2 == SC_OK);
    FUZZ_CHECK(ref_topk_ok(t, x, 0, n, idx, vals, m));
    if (radix)
      FUZZ_CHECK(memcmp(idx, idx2, (size_t)m * 8) == 0 && memcmp(vals, vals2, (size_t)m * w) == 0);
  }
  free(idx);
  free(idx2);
  free(vals);
  free(vals2);

  int64_t cnt = sc_block_topk_count(n, blocks, kpb);
  FUZZ_CHECK(cnt >= 0 && cnt <= n);
  idx = (int64_t*)malloc((size_t)cnt * 8 + 8);
  vals = malloc((size_t)cnt * w + 8);
  st = sc_block_topk(t, x, n, blocks, kpb, nt, vals, idx, &e);
  if (blocks < 1) {
    FUZZ_CHECK(st == SC_ERR_ARG);
  } else if (has_nan) {
    FUZZ_CHECK(st == SC_ERR_NAN);
  } else {
    FUZZ_CHECK(st == SC_OK);
    int64_t o = 0;
    for (int64_t b = 0; b < blocks && o <= cnt; b++) {
      int64_t lo = (int64_t)((__int128)b * n / blocks), hi = (int64_t)((__int128)(b + 1) * n / blocks);
      int64_t mb = kpb < hi - lo ? kpb : hi - lo;
      FUZZ_CHECK(o + mb <= cnt);
      FUZZ_CHECK(ref_topk_ok(t, x, lo, hi, idx + o, (char*)vals + w * o, mb));
      o += mb;
    }
    FUZZ_CHECK(o == cnt);
  }
  free(idx);
  free(vals);
  free(x);
  return 0;
}
