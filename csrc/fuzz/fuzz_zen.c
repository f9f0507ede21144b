/* Fuzz target: ZEN class bitmaps as a peer sends them (sc_zen_bitmap_decode) and the
 * partition kernel on the decoded indices.
 *
 * Input: [u16 n][u8 parts - 1][u8: bits 0-2 log2 block][u8 seed][u8 owner (mod parts)]
 *        [bitmap bytes].
 * Invariants (reference: the class listed by a plain loop over the contract's hash):
 *   - decode accepts exactly when the bitmap has ceil(class size / 8) bytes and no set
 *     padding bit, else SC_ERR_MALFORMED;
 *   - an accepted bitmap decodes to the class positions of its set bits, in ascending
 *     order (the count pass agrees, and so does the decoding call made without it), and
 *     encoding them gives the same bytes back;
 *   - sc_zen_partition of the decoded indices puts all of them with `owner`, in order. */
#include "fuzz_common.h"
#include "sparsecomm/zen.h"

FZ_NOCOV static uint32_t ref_owner(int64_t i, int64_t block, uint64_t seed, uint64_t parts) {
  uint64_t z = (uint64_t)(i / block) + seed + 0x9E3779B97F4A7C15ull;
  z ^= z >> 30;
  z *= 0xBF58476D1CE4E5B9ull;
  z ^= z >> 27;
  z *= 0x94D049BB133111EBull;
  z ^= z >> 31;
  return (uint32_t)(((z >> 32) * parts) >> 32);
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fz_reader r = {data, size};
  const int64_t n = (int64_t)fz_u(&r, 2);
  const int64_t parts = (int64_t)fz_u(&r, 1) + 1;
  const int64_t block = (int64_t)1 << (fz_u(&r, 1) & 7);
  const uint64_t seed = fz_u(&r, 1);
  const int64_t owner = (int64_t)(fz_u(&r, 1) % (uint64_t)parts);
  uint8_t* bitmap = fz_dup(r.p, r.n);
  const int64_t nbytes = (int64_t)r.n;

  int64_t* cls = (int64_t*)malloc((size_t)n * 8 + 8);
  int64_t cs = 0;
  for (int64_t i = 0; i < n; i++)
    if (ref_owner(i, block, seed, (uint64_t)parts) == (uint32_t)owner) cls[cs++] = i;
  int ok = nbytes == (cs + 7) / 8;
  for (int64_t j = cs; ok && j < 8 * nbytes; j++) ok = !((bitmap[j / 8] >> (j % 8)) & 1);

  int64_t count = -1;
  sc_error_info e = {0, 0, 0};
  int st = sc_zen_bitmap_decode(bitmap, nbytes, n, parts, seed, block, owner, NULL, 0, &count, &e);
  FUZZ_CHECK(ok ? st == SC_OK : st == SC_ERR_MALFORMED);
  /* decoding straight away, as the torch binding does (cap: the popcount of every byte): the
   * same verdict, and the same count, with no read past nbytes */
  int64_t bound = 0;
  for (int64_t j = 0; j < nbytes; j++) bound += __builtin_popcount(bitmap[j]);
  int64_t* direct = (int64_t*)malloc((size_t)bound * 8 + 8);
  int64_t direct_count = -1;
  int direct_st = sc_zen_bitmap_decode(bitmap, nbytes, n, parts, seed, block, owner, direct, bound, &direct_count, &e);
  FUZZ_CHECK(ok ? direct_st == SC_OK && direct_count == count : direct_st == SC_ERR_MALFORMED);
  if (st == SC_OK) {
    int64_t* got = (int64_t*)malloc((size_t)count * 8 + 8);
    int64_t again = -1;
    FUZZ_CHECK(sc_zen_bitmap_decode(bitmap, nbytes, n, parts, seed, block, owner, got, count, &again, &e) ==
               SC_OK && again == count);
    FUZZ_CHECK(count == 0 || memcmp(direct, got, (size_t)count * 8) == 0);
    int64_t q = 0;
    for (int64_t j = 0; j < cs; j++)
      if ((bitmap[j / 8] >> (j % 8)) & 1) {
        FUZZ_CHECK(q < count && got[q] == cls[j]);
        q++;
      }
    FUZZ_CHECK(q == count);
    uint8_t* back = (uint8_t*)malloc((size_t)nbytes + 1);
    FUZZ_CHECK(sc_zen_bitmap_encode(got, count, n, parts, seed, block, owner, back, nbytes, &e) == SC_OK);
    FUZZ_CHECK(nbytes == 0 || memcmp(back, bitmap, (size_t)nbytes) == 0);
    float* val = (float*)calloc((size_t)count + 1, 4);
    int64_t* oi = (int64_t*)malloc((size_t)count * 8 + 8);
    float* ov = (float*)malloc((size_t)count * 4 + 4);
    int64_t* counts = (int64_t*)malloc((size_t)parts * 8);
    FUZZ_CHECK(sc_zen_partition(SC_F32, got, val, count, n, parts, seed, block, oi, ov, counts, &e) == SC_OK);
    FUZZ_CHECK(counts[owner] == count && (count == 0 || memcmp(oi, got, (size_t)count * 8) == 0));
    free(got), free(back), free(val), free(oi), free(ov), free(counts);
  }
  free(direct);
  free(cls);
  free(bitmap);
  return 0;
}
