/* SKCompress, internal: the sign-split quantile buckets of a value vector. */
#ifndef SPARSECOMM_CPU_SKC_QUANTILE_H
#define SPARSECOMM_CPU_SKC_QUANTILE_H

#include <stdint.h>

#include "sparsecomm/abi.h"

typedef struct {
  int64_t n[2];
  int64_t nb[2];
  double* splits[2]; /* B + 1 each */
} quantized;

/* Quantify v (float32 / float64): bucket[i] (magnitude bucket; plus B for a non-negative
 * entry when combined), the splits and nb per sign. Buckets by the exact selection of
 * skc_select_impl.h when a sign has <= exact_max values, else from the compactor sketch. */
int skc_quantify(sc_dtype vt, const void* v, int64_t n, int64_t B, int64_t exact_max,
                    int32_t* bucket, int combined, quantized* qz, sc_error_info* err);

#endif
