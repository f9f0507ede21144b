/*
 * Non-finite scan of raw float bits, instantiated by finite.c once per format.
 * Required macros: SFX (name suffix), BITS (unsigned raw type), MAG (magnitude
 * mask), INF (the Inf pattern), SIGN (the sign bit). A NaN's magnitude bits are
 * above INF's; branch-free OR reductions, so the loop vectorizes.
 */
#define CAT_(a, b) a##_##b
#define CAT(a, b) CAT_(a, b)
#define FN(name) CAT(name, SFX)

static int FN(scan)(const BITS* x, int64_t lo, int64_t hi) {
  BITS any_nan = 0, pos_inf = 0, neg_inf = 0;
  for (int64_t i = lo; i < hi; i++) {
    BITS v = x[i], e = (BITS)(v & (BITS)MAG);
    BITS inf = (BITS)(e == (BITS)INF);
    BITS neg = (BITS)((v & (BITS)SIGN) != 0);
    any_nan |= (BITS)(e > (BITS)INF);
    pos_inf |= (BITS)(inf & (BITS)(neg ^ 1));
    neg_inf |= (BITS)(inf & neg);
  }
  if (any_nan) return SC_NONFINITE_NAN;
  return (pos_inf ? SC_NONFINITE_POS_INF : 0) | (neg_inf ? SC_NONFINITE_NEG_INF : 0);
}

#undef FN
#undef CAT
#undef CAT_
