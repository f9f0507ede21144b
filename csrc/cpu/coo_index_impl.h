/*
 * Index-only COO kernels, instantiated by coo.c once per index type.
 *
 * Required macros: ISFX (name suffix), IT (index type).
 */
#define CATI_(a, b) a##_##b
#define CATI(a, b) CATI_(a, b)
#define FNI(name) CATI(name, ISFX)

/*
 * One fused pass over a[0..n): *bad_range = the first position whose index
 * leaves [0, limit) (limit < 0: no upper bound), *bad_order = the first
 * position whose index does not exceed its predecessor (INT64_MAX: none).
 * A thread stops at its first range error; the order scan goes on past an
 * order error, so a range error later in the vector is still found (the
 * scatter needs the range in full and the order only as a flag). Parallel over
 * nt contiguous chunks for large n; each chunk compares its first element
 * with the last of the chunk before, so the result does not depend on nt.
 */
static void FNI(scan)(const IT* a, int64_t n, int64_t limit, int nt, int64_t* bad_range,
                      int64_t* bad_order) {
  int64_t br = INT64_MAX, bo = INT64_MAX;
  if (n < 65536) nt = 1;
  int t;
#pragma omp parallel for num_threads(nt) schedule(static, 1) reduction(min : br, bo) if (nt > 1)
  for (t = 0; t < nt; t++) {
    const int64_t lo = n * t / nt, hi = n * (t + 1) / nt;
    int64_t prev = lo > 0 ? (int64_t)a[lo - 1] : INT64_MIN;
    int64_t first_order = INT64_MAX;
    for (int64_t i = lo; i < hi; i++) {
      const int64_t v = (int64_t)a[i];
      if (v < 0 || (limit >= 0 && v >= limit)) {
        br = i;
        break;
      }
      if (v <= prev && first_order == INT64_MAX) first_order = i;
      prev = v;
    }
    if (first_order < bo) bo = first_order;
  }
  *bad_range = br;
  *bad_order = bo;
}

#undef FNI
#undef CATI
#undef CATI_
