/* float16 / bfloat16 <-> float32 conversions, round-to-nearest-even: the ABI faces of
 * sparsecomm/bitexact.h, which the kernels inline. */
#include "sparsecomm/bitexact.h"
#include "sparsecomm/kernels.h"

float sc_f16_to_f32(uint16_t h) { return sc_f16_bits_to_f32(h); }

uint16_t sc_f32_to_f16(float f) { return sc_f32_to_f16_bits(f); }

float sc_bf16_to_f32(uint16_t h) { return sc_bf16_bits_to_f32(h); }

uint16_t sc_f32_to_bf16(float f) { return sc_f32_to_bf16_bits(f); }
