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

/* What the encoder takes from the quantification instead of plain buckets: per entry
 * map[bucket + B if non-negative], counted by list (the map's value >> 12) in counts
 * (4 x nl, zeroed by the caller). */
typedef struct {
  const uint32_t* map;
  int64_t* counts;
  int64_t nl;
} skc_bucket_map;

/* Quantify v (float32 / float64): out[i] (its magnitude bucket, or mapped by map when given),
 * the splits and nb per sign. Buckets by the exact selection of skc_select_impl.h when a
 * sign has <= exact_max values, else from the compactor sketch. scratch: NULL, or n + 1
 * values' worth of bytes of the value dtype (out may point into it). */
int skc_quantify(sc_dtype vt, const void* v, int64_t n, int64_t B, int64_t exact_max, int32_t* out,
                    const skc_bucket_map* map, void* scratch, quantized* qz, sc_error_info* err);

#endif
