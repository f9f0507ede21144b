/* float16 / bfloat16 <-> float32 conversions, round-to-nearest-even. */
#include <string.h>

#include "sparsecomm/kernels.h"

static inline uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

float sc_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t man = h & 0x3FFu;
  if (exp == 0x1F) return u2f(sign | 0x7F800000u | (man << 13)); /* Inf / NaN */
  if (exp == 0) {
    if (man == 0) return u2f(sign);
    /* subnormal: man * 2^-24 is exact in float32 */
    float f = (float)man * 5.9604644775390625e-08f;
    return u2f(sign | f2u(f));
  }
  return u2f(sign | ((exp + 112) << 23) | (man << 13));
}

uint16_t sc_f32_to_f16(float f) {
  uint32_t u = f2u(f);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return (uint16_t)(sign | 0x7E00u | ((a >> 13) & 0x3FFu)); /* NaN stays NaN */
  if (a >= 0x477FF000u) return (uint16_t)(sign | 0x7C00u); /* >= 65520 rounds to Inf */
  if (a < 0x38800000u) {
    /* result is subnormal (or zero): value / 2^-24 rounded to nearest even */
    if (a < 0x33000000u) return sign; /* < 2^-25: rounds to 0 (2^-25 ties to even 0) */
    uint32_t e = a >> 23;              /* biased exponent, 102..112 */
    uint32_t m = (a & 0x7FFFFFu) | 0x800000u;
    uint32_t shift = 126 - e;          /* 14..24: m >> shift gives units of 2^-24 */
    uint32_t q = m >> shift;
    uint32_t rem = m & ((1u << shift) - 1);
    uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1))) q++;
    return (uint16_t)(sign | q);
  }
  /* normal: rebias exponent, round mantissa from 23 to 10 bits */
  uint32_t r = a + 0xFFFu + ((a >> 13) & 1u);
  r -= (uint32_t)(127 - 15) << 23;
  return (uint16_t)(sign | (r >> 13));
}

float sc_bf16_to_f32(uint16_t h) { return u2f((uint32_t)h << 16); }

uint16_t sc_f32_to_bf16(float f) {
  uint32_t u = f2u(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
  u += 0x7FFFu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}
