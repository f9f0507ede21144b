/* Shared helpers of the sparsecomm C kernels (internal). */
#ifndef SPARSECOMM_CPU_COMMON_H
#define SPARSECOMM_CPU_COMMON_H

#include <stdint.h>

#include "sparsecomm/abi.h"
#include "sparsecomm/bitexact.h"

#ifdef _OPENMP
#include <omp.h>
#endif

#define SC_MAYBE_UNUSED __attribute__((unused))

/* Upper bound on the threads a kernel uses (per-thread state lives on the stack). */
#define SC_MAX_THREADS 256

static inline int sc_clamp_threads(int nt) {
  if (nt < 1) return 1;
  if (nt > SC_MAX_THREADS) return SC_MAX_THREADS;
#ifndef _OPENMP
  return 1;
#else
  return nt;
#endif
}

/* splitmix64 */
static inline uint64_t sc_rand(uint64_t* s) { return sc_mix64(*s += 0x9E3779B97F4A7C15ull); }

/* End (exclusive) of block b of B over n elements: (b+1)*n/B; b = -1 gives 0. */
static inline int64_t sc_block_end(int64_t n, int64_t B, int64_t b) {
  return (int64_t)(((__int128)(b + 1) * (__int128)n) / (__int128)B);
}

/* Fills *e (when given) and returns st: every kernel reports failures this way. */
static inline int sc_fail(sc_error_info* e, int st, int64_t input, int64_t position,
                          int64_t value) {
  if (e) {
    e->input = input;
    e->position = position;
    e->value = value;
  }
  return st;
}

#endif
