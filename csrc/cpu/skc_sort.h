/* SKCompress, internal: the sort of its quantiles. */
#ifndef SPARSECOMM_CPU_SKC_SORT_H
#define SPARSECOMM_CPU_SKC_SORT_H

#include <stdint.h>

/* Sorts a[0..n) (no NaN) ascending, -0.0 before +0.0: SC_OK or SC_ERR_NOMEM. */
int skc_sort_doubles(double* a, int64_t n);

#endif
