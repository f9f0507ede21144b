/*
 * C tests of the ZEN kernels (csrc/include/sparsecomm/zen.h) against a reference written
 * here from the contract: the owner hash in plain integer steps, the stable partition by
 * sorting, the class bitmap by listing the class; malformed bitmaps and bad arguments.
 *
 *   make ctest / make sanitize     (one binary per csrc/tests/test_*.c)
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "sparsecomm/zen.h"

/* the contract's owner: splitmix64's output of (block + seed + gamma), fastrange of its top half */
static uint32_t ref_owner(int64_t i, int64_t block, uint64_t seed, uint64_t parts) {
  uint64_t z = (uint64_t)(i / block) + seed + 0x9E3779B97F4A7C15ull;
  z ^= z >> 30;
  z *= 0xBF58476D1CE4E5B9ull;
  z ^= z >> 27;
  z *= 0x94D049BB133111EBull;
  z ^= z >> 31;
  return (uint32_t)(((z >> 32) * parts) >> 32);
}

static int64_t random_sorted(int64_t* idx, int64_t n, double p) {
  int64_t m = 0;
  for (int64_t i = 0; i < n; i++)
    if (rnd_unit() < p) idx[m++] = i;
  return m;
}

static void test_partition(void) {
  const int64_t ns[] = {0, 1, 100, 5003};
  const int64_t parts_list[] = {1, 2, 3, 8, 33};
  const int64_t blocks[] = {1, 4, 64};
  for (int a = 0; a < 4; a++)
    for (int b = 0; b < 5; b++)
      for (int c = 0; c < 3; c++) {
        int64_t n = ns[a], parts = parts_list[b], block = blocks[c];
        uint64_t seed = rnd();
        int64_t* idx = xmalloc(sizeof(int64_t) * (size_t)(n + 1));
        float* val = xmalloc(sizeof(float) * (size_t)(n + 1));
        int64_t m = random_sorted(idx, n, 0.3);
        for (int64_t j = 0; j < m; j++) val[j] = (float)j;
        int64_t* oi = xmalloc(sizeof(int64_t) * (size_t)(m + 1));
        float* ov = xmalloc(sizeof(float) * (size_t)(m + 1));
        int64_t* counts = xmalloc(sizeof(int64_t) * (size_t)parts);
        CHECK(sc_zen_partition(SC_F32, idx, val, m, n, parts, seed, block, oi, ov, counts, NULL) == SC_OK);
        /* the reference: owner by owner, the input order within one */
        int64_t at = 0;
        for (int64_t o = 0; o < parts; o++) {
          int64_t count = 0;
          for (int64_t j = 0; j < m; j++) {
            if (ref_owner(idx[j], block, seed, (uint64_t)parts) != (uint32_t)o) continue;
            CHECK(oi[at] == idx[j] && ov[at] == val[j]);
            at++;
            count++;
          }
          CHECK(counts[o] == count);
        }
        CHECK(at == m);
        free(idx), free(val), free(oi), free(ov), free(counts);
      }
}

static void bitmap_case(int64_t n, int64_t block) {
  const int64_t parts = 5;
  const uint64_t seed = 12345;
  int64_t* cls = xmalloc(sizeof(int64_t) * n);
  int64_t* pick = xmalloc(sizeof(int64_t) * n);
  int64_t* back = xmalloc(sizeof(int64_t) * n);
  uint8_t* bm = xmalloc((size_t)n);
  for (int64_t o = 0; o < parts; o++) {
    int64_t cs = 0, m = 0, size = -1, count = -1;
    for (int64_t i = 0; i < n; i++)
      if (ref_owner(i, block, seed, parts) == (uint32_t)o) cls[cs++] = i;
    CHECK(sc_zen_class_size(n, parts, seed, block, o, &size, NULL) == SC_OK && size == cs);
    for (int64_t j = 0; j < cs; j++)
      if (rnd_unit() < 0.4) pick[m++] = j; /* positions in the class */
    for (int64_t j = 0; j < m; j++) back[j] = cls[pick[j]];
    const int64_t nb = (cs + 7) / 8;
    CHECK(sc_zen_bitmap_encode(back, m, n, parts, seed, block, o, bm, nb, NULL) == SC_OK);
    int ok = 1;
    for (int64_t j = 0, q = 0; j < 8 * nb; j++) {
      int want = q < m && pick[q] == j;
      if (want) q++;
      ok &= ((bm[j / 8] >> (j % 8)) & 1) == want;
    }
    CHECK(ok);
    memcpy(pick, back, sizeof(int64_t) * (size_t)m); /* the indices encoded */
    CHECK(sc_zen_bitmap_decode(bm, nb, n, parts, seed, block, o, NULL, 0, &count, NULL) == SC_OK && count == m);
    CHECK(sc_zen_bitmap_decode(bm, nb, n, parts, seed, block, o, back, m, &count, NULL) == SC_OK && count == m);
    CHECK(memcmp(back, pick, sizeof(int64_t) * (size_t)m) == 0);
    /* malformed: a wrong length, a padding bit */
    sc_error_info e = {0, 0, 0};
    CHECK(sc_zen_bitmap_decode(bm, nb + 1, n, parts, seed, block, o, NULL, 0, &count, &e) == SC_ERR_MALFORMED);
    /* the decoding call checks the same while it walks the class, and reads no byte past nbytes */
    bm[nb] = 0;
    e.position = 0;
    CHECK(sc_zen_bitmap_decode(bm, nb + 1, n, parts, seed, block, o, back, n, &count, &e) == SC_ERR_MALFORMED);
    CHECK(e.position == -1 && e.value == nb + 1);
    if (nb > 1) {
      uint8_t* shorter = xmalloc((size_t)nb - 1); /* exactly its bytes: ASan sees a read past them */
      memcpy(shorter, bm, (size_t)nb - 1);
      e.position = 0;
      CHECK(sc_zen_bitmap_decode(shorter, nb - 1, n, parts, seed, block, o, back, n, &count, &e) ==
            SC_ERR_MALFORMED);
      CHECK(e.position == -1 && e.value == nb - 1);
      free(shorter);
    }
    if (cs % 8) {
      bm[nb - 1] |= 0x80;
      CHECK(sc_zen_bitmap_decode(bm, nb, n, parts, seed, block, o, NULL, 0, &count, &e) == SC_ERR_MALFORMED);
      CHECK(e.position == nb - 1);
      e.position = 0;
      CHECK(sc_zen_bitmap_decode(bm, nb, n, parts, seed, block, o, back, n, &count, &e) == SC_ERR_MALFORMED);
      CHECK(e.position == nb - 1);
    }
    /* an index of another class cannot be encoded */
    int64_t other = -1;
    for (int64_t i = 0; i < n && other < 0; i++)
      if (ref_owner(i, block, seed, parts) != (uint32_t)o) other = i;
    CHECK(sc_zen_bitmap_encode(&other, 1, n, parts, seed, block, o, bm, nb, &e) == SC_ERR_ARG);
  }
  free(cls), free(pick), free(back), free(bm);
}

/* block 8: byte steps; block 64: the decoder's 64-bit steps; n cuts the last block short */
static void test_bitmap(void) {
  bitmap_case(1003, 8);
  bitmap_case(5003, 64);
  bitmap_case(5003, 128);
}

static void test_rejects(void) {
  int64_t idx[3] = {1, 5, 5}, oi[3], counts[4], size;
  float val[3] = {1, 2, 3}, ov[3];
  sc_error_info e = {0, 0, 0};
  CHECK(sc_zen_partition(SC_F32, idx, val, 3, 10, 4, 0, 1, oi, ov, counts, &e) == SC_ERR_INDEX_ORDER);
  CHECK(e.position == 2);
  idx[2] = 10;
  CHECK(sc_zen_partition(SC_F32, idx, val, 3, 10, 4, 0, 1, oi, ov, counts, &e) == SC_ERR_INDEX_RANGE);
  CHECK(sc_zen_partition(SC_F32, idx, val, 2, 10, 0, 0, 1, oi, ov, counts, &e) == SC_ERR_ARG);
  CHECK(sc_zen_partition(SC_F32, idx, val, 2, 10, 4, 0, 3, oi, ov, counts, &e) == SC_ERR_ARG);
  CHECK(sc_zen_class_size(10, 4, 0, 2, 4, &size, &e) == SC_ERR_ARG);
  CHECK(sc_zen_log2(1) == 0 && sc_zen_log2(64) == 6 && sc_zen_log2(6) == -1 && sc_zen_log2(0) == -1);
}

int main(void) {
  RUN(test_partition);
  RUN(test_bitmap);
  RUN(test_rejects);
  printf("%ld checks, %ld failed\n", g_checks, g_failed);
  return g_failed ? 1 : 0;
}
