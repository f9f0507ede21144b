/*
 * QSGD quantize / dequantize (SparCML section 5), instantiated by stream.c once
 * per value type. Contract: csrc/include/sparsecomm/stream.h.
 *
 * Required macros: SFX (name suffix), VT (value type: float or double).
 * sc_qsgd_u01(seed, i) (sparsecomm/bitexact.h) is the uniform draw of element i.
 */
#define CAT_(a, b) a##_##b
#define CAT(a, b) CAT_(a, b)
#define FN(name) CAT(name, SFX)

/* Level of x (element i) in [0, 2s] under its bucket's scale: l = floor(|x| / scale * s),
 * rounded up with probability equal to the remainder; a zero scale (all-zero bucket)
 * gives the middle level s. */
static inline int FN(qsgd_level)(VT x, int64_t i, float scale, int s, uint64_t seed) {
  if (!(scale > 0.0f)) return s;
  double r = fabs((double)x) / (double)scale * s;
  double l = floor(r);
  if (sc_qsgd_u01(seed, i) < r - l) l += 1.0;
  if (l > s) l = s;
  return x < 0 ? s - (int)l : s + (int)l;
}

/*
 * One pass per bucket (buckets are independent, so they are dealt to threads):
 * max |x| -> the float32 scale, then the levels. 4 bits write whole bytes, two
 * nibbles at a time: the bucket is even, so a bucket starts on a byte and no byte
 * is shared by two threads; an odd n ends on a byte whose high nibble is 0. A value
 * no float32 scale can hold (NaN, Inf, or a float64 beyond FLT_MAX) stops its bucket;
 * the lowest such position over all buckets is returned (INT64_MAX: none), so the
 * result does not depend on the thread count.
 */
static int64_t FN(qsgd_quantize)(const VT* x, int64_t n, int bits, int64_t bucket,
                                 uint64_t seed, uint8_t* packed, float* scales, int nt) {
  const int s = (1 << (bits - 1)) - 1;
  const int64_t nb = n / bucket + (n % bucket != 0);
  int64_t bad = INT64_MAX;
  int64_t b;
  (void)nt;
#pragma omp parallel for num_threads(nt) if (n > 262144) schedule(static) reduction(min : bad)
  for (b = 0; b < nb; ++b) {
    const int64_t lo = b * bucket, hi = n - lo > bucket ? lo + bucket : n;
    double m = 0.0;
    int finite = 1;
    for (int64_t i = lo; i < hi; ++i) {
      double a = fabs((double)x[i]);
      if (a > m) m = a;
      finite &= a <= (double)FLT_MAX; /* false for NaN */
    }
    if (!finite) {
      int64_t i = lo;
      while (fabs((double)x[i]) <= (double)FLT_MAX) ++i;
      if (i < bad) bad = i;
      continue;
    }
    float scale = (float)m;
    if ((double)scale < m) scale = nextafterf(scale, INFINITY);
    scales[b] = scale;
    if (bits == 8) {
      for (int64_t i = lo; i < hi; ++i) packed[i] = (uint8_t)FN(qsgd_level)(x[i], i, scale, s, seed);
    } else {
      for (int64_t i = lo; i < hi; i += 2) {
        int q0 = FN(qsgd_level)(x[i], i, scale, s, seed);
        int q1 = i + 1 < hi ? FN(qsgd_level)(x[i + 1], i + 1, scale, s, seed) : 0;
        packed[i >> 1] = (uint8_t)(q0 | (q1 << 4));
      }
    }
  }
  return bad;
}

/* out[i] = (q_i - s) * scale / s; the caller has validated packed and scales. */
static void FN(qsgd_dequantize)(const uint8_t* packed, const float* scales, int64_t n, int bits,
                                int64_t bucket, VT* out, int nt) {
  const int s = (1 << (bits - 1)) - 1;
  int64_t i;
  (void)nt;
#pragma omp parallel for num_threads(nt) if (n > 262144) schedule(static)
  for (i = 0; i < n; ++i) {
    int q = bits == 8 ? packed[i] : (i & 1) ? (packed[i >> 1] >> 4) : (packed[i >> 1] & 0x0F);
    out[i] = (VT)((double)(q - s) * (double)scales[i / bucket] / (double)s);
  }
}

#undef FN
#undef CAT
#undef CAT_
