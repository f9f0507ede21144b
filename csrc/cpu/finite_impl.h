/*
 * Non-finite scan of one value width, instantiated by finite.c once per type.
 *
 * Required macros: SFX (name suffix), W (unsigned raw type), MASK (the bits
 * without the sign), LIM (the largest finite key), INF (the key of Inf), SIGN
 * (the sign bit), TOP (the top bit's position).
 */
#define CAT_(a, b) a##_##b
#define CAT(a, b) CAT_(a, b)
#define FN(name) CAT(name, SFX)

/*
 * 1 if any key (bits & MASK) exceeds LIM (the largest finite key). Written as
 * arithmetic, not a branch or a compare: LIM - key is negative (top bit set)
 * exactly when key > LIM, and OR-ing those over the input vectorizes on any
 * target (SSE2: pand / psub / por), with no early exit. Two halves are read in
 * one loop: two streams keep more cache misses in flight on one core than one
 * (a single read stream is latency-bound at ~0.55 residual-add passes over
 * 15M float32, two at ~0.45; docs/benchmarks.md).
 */
static int FN(any_above)(const W* u, int64_t n) {
  const int64_t h = n / 2;
  W a = 0, b = 0;
  for (int64_t i = 0; i < h; i++) {
    a |= (W)((W)(LIM) - (W)(u[i] & (W)(MASK)));
    b |= (W)((W)(LIM) - (W)(u[h + i] & (W)(MASK)));
  }
  if (n & 1) a |= (W)((W)(LIM) - (W)(u[n - 1] & (W)(MASK)));
  return ((a | b) >> (TOP)) != 0;
}

/* The exact flags of x[lo, hi) (the rare path: something was found). */
static int FN(flags)(const W* u, int64_t lo, int64_t hi) {
  int f = 0;
  for (int64_t i = lo; i < hi; i++) {
    W key = (W)(u[i] & (W)(MASK));
    if (key > (W)(INF)) f |= SC_NONFINITE_NAN;
    else if (key == (W)(INF)) f |= (u[i] & (W)(SIGN)) ? SC_NONFINITE_NEG_INF : SC_NONFINITE_POS_INF;
  }
  return f;
}

#undef FN
#undef CAT
#undef CAT_
