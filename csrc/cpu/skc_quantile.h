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

/* Quantify v: bucket[i] (magnitude bucket), splits and nb per sign. */
int skc_quantify(sc_dtype vt, const void* v, int64_t n, int64_t B, int64_t exact_max,
                    int32_t* bucket, quantized* qz, sc_error_info* err);

#endif
