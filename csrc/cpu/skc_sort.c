/* SKCompress: the radix sort of doubles behind its exact quantiles and the compactions
 * of its quantile sketch. */
#include "skc_sort.h"

#include <stdlib.h>
#include <string.h>

#include "sparsecomm/abi.h"

/* Ascending sort of doubles without NaN: LSD radix sort on order-preserving keys (sign bit
 * flipped for positives, all bits for negatives; -0.0 sorts before +0.0), 8-bit digits below
 * 2^15 elements and 16-bit digits above,
 * passes over constant digits skipped. Falls back to insertion sort for short arrays. */
static inline uint64_t order_key(double x) {
  uint64_t u;
  memcpy(&u, &x, 8);
  return (u >> 63) ? ~u : (u | 0x8000000000000000ull);
}

static inline double from_order_key(uint64_t k) {
  uint64_t u = (k >> 63) ? (k & 0x7FFFFFFFFFFFFFFFull) : ~k;
  double x;
  memcpy(&x, &u, 8);
  return x;
}

int skc_sort_doubles(double* a, int64_t n) {
  if (n < 64) {
    for (int64_t i = 1; i < n; i++) {
      double x = a[i];
      int64_t j = i - 1;
      while (j >= 0 && a[j] > x) { a[j + 1] = a[j]; j--; }
      a[j + 1] = x;
    }
    return SC_OK;
  }
  uint64_t* k = (uint64_t*)malloc(sizeof(uint64_t) * (size_t)n);
  uint64_t* tmp = (uint64_t*)malloc(sizeof(uint64_t) * (size_t)n);
  int64_t* count = (int64_t*)malloc(sizeof(int64_t) * 65536);
  if (!k || !tmp || !count) { free(k); free(tmp); free(count); return SC_ERR_NOMEM; }
  uint64_t all_or = 0, all_and = ~0ull;
  for (int64_t i = 0; i < n; i++) {
    k[i] = order_key(a[i]);
    all_or |= k[i];
    all_and &= k[i];
  }
  int bits = n < (1 << 15) ? 8 : 16;
  uint64_t mask = (1ull << bits) - 1;
  for (int shift = 0; shift < 64; shift += bits) {
    if ((((all_or ^ all_and) >> shift) & mask) == 0) continue; /* same digit everywhere */
    memset(count, 0, sizeof(int64_t) * (size_t)(mask + 1));
    for (int64_t i = 0; i < n; i++) count[(k[i] >> shift) & mask]++;
    int64_t sum = 0;
    for (uint64_t d = 0; d <= mask; d++) { int64_t c = count[d]; count[d] = sum; sum += c; }
    for (int64_t i = 0; i < n; i++) tmp[count[(k[i] >> shift) & mask]++] = k[i];
    uint64_t* t = k; k = tmp; tmp = t;
  }
  for (int64_t i = 0; i < n; i++) a[i] = from_order_key(k[i]);
  free(k); free(tmp); free(count);
  return SC_OK;
}
