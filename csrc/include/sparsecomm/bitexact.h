/* The computations that the C kernels (csrc/cpu) and the CUDA kernels (csrc/cuda) must
 * do bit for bit the same, written once: the float16 / bfloat16 roundings, the splitmix64
 * mix behind QSGD's random draw and the Count-Sketch hash. Static inline functions in C
 * (C11) that nvcc compiles for host and device; integer arithmetic only, but for two
 * exact float products, so no compiler flag changes a result. Internal to the kernels:
 * not part of the ABI the bindings call. */
#ifndef SPARSECOMM_BITEXACT_H
#define SPARSECOMM_BITEXACT_H

#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define SC_BITEXACT __host__ __device__
#else
#define SC_BITEXACT
#endif

/* ------------------------------------------------------------------ float bits */

static inline SC_BITEXACT uint32_t sc_f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

static inline SC_BITEXACT float sc_f32_from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* float16 / bfloat16 <-> float32, round to nearest even, NaN kept NaN. */
static inline SC_BITEXACT float sc_f16_bits_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t man = h & 0x3FFu;
  if (exp == 0x1F) return sc_f32_from_bits(sign | 0x7F800000u | (man << 13)); /* Inf / NaN */
  if (exp == 0) {
    if (man == 0) return sc_f32_from_bits(sign);
    /* subnormal: man * 2^-24 is exact in float32 */
    float f = (float)man * 5.9604644775390625e-08f;
    return sc_f32_from_bits(sign | sc_f32_bits(f));
  }
  return sc_f32_from_bits(sign | ((exp + 112) << 23) | (man << 13));
}

static inline SC_BITEXACT uint16_t sc_f32_to_f16_bits(float f) {
  uint32_t u = sc_f32_bits(f);
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

static inline SC_BITEXACT float sc_bf16_bits_to_f32(uint16_t h) {
  return sc_f32_from_bits((uint32_t)h << 16);
}

static inline SC_BITEXACT uint16_t sc_f32_to_bf16_bits(float f) {
  uint32_t u = sc_f32_bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
  u += 0x7FFFu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

/* ------------------------------------------------------------------ hashes */

/* The splitmix64 output function (the generator adds 0x9E3779B97F4A7C15 to its state
 * before it). */
static inline SC_BITEXACT uint64_t sc_mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* QSGD: the uniform [0, 1) draw of element i, a function of (seed, i) only, so the
 * result does not depend on which thread quantizes which bucket. */
static inline SC_BITEXACT double sc_qsgd_u01(uint64_t seed, int64_t i) {
  uint64_t z = seed ^ ((uint64_t)i * 0xD1B54A32D192ED03ull);
  return (double)(sc_mix64(z + 0x9E3779B97F4A7C15ull) >> 11) * (1.0 / 9007199254740992.0);
}

/* Count-Sketch (sparsecomm/sketch.h): the key of a table row, the hash of run r of a row,
 * and the run's first bucket among cols. */
static inline SC_BITEXACT uint64_t sc_sketch_key(uint64_t seed, int64_t row) {
  return sc_mix64(seed + 0x9E3779B97F4A7C15ull * (uint64_t)(row + 1));
}

static inline SC_BITEXACT uint64_t sc_sketch_hash(uint64_t key, uint64_t run) {
  return sc_mix64(key ^ run);
}

static inline SC_BITEXACT uint64_t sc_sketch_base(uint64_t h, uint64_t cols) {
  return ((h >> 32) * cols) >> 32;
}

#endif
