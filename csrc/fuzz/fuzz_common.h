/* Shared helpers of the libFuzzer targets (csrc/fuzz/fuzz_*.c).
 *
 * Built by `make fuzz` with clang -fsanitize=fuzzer,address,undefined
 * -fno-sanitize-recover=undefined against the kernels of csrc/cpu (no OpenMP: runs are
 * deterministic). A finding is a sanitizer report, a crash, or a failed
 * FUZZ_CHECK: an invariant of the kernel contracts (the headers in
 * csrc/include/sparsecomm) that the target verifies on every input. */
#ifndef SPARSECOMM_FUZZ_COMMON_H
#define SPARSECOMM_FUZZ_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sparsecomm/abi.h"
#include "sparsecomm/kernels.h"
#include "sparsecomm/wire.h"
#include "../tests/ref.h"

/* Reference code of the targets is not instrumented for coverage: the
 * fuzzer's guidance (and its time) goes to the kernels, not to our loops. */
#if defined(__clang__)
#define FZ_NOCOV __attribute__((no_sanitize("coverage")))
#else
#define FZ_NOCOV
#endif

#define FUZZ_CHECK(cond)                                                              \
  do {                                                                                \
    if (!(cond)) {                                                                    \
      fprintf(stderr, "%s:%d: invariant failed: %s\n", __FILE__, __LINE__, #cond);    \
      abort();                                                                        \
    }                                                                                 \
  } while (0)

/* Reads fixed-size fields from the front of the input; past the end, zeros. */
typedef struct {
  const uint8_t* p;
  size_t n;
} fz_reader;

FZ_NOCOV static inline uint64_t fz_u(fz_reader* r, int nbytes) {
  uint64_t v = 0;
  for (int i = 0; i < nbytes; i++) {
    uint64_t b = 0;
    if (r->n) { b = *r->p++; r->n--; }
    v |= b << (8 * i);
  }
  return v;
}

/* A heap copy of exactly n bytes (so ASan sees any read past them). */
FZ_NOCOV static inline uint8_t* fz_dup(const void* src, size_t n) {
  uint8_t* d = (uint8_t*)malloc(n ? n : 1);
  FUZZ_CHECK(d != NULL);
  if (n) memcpy(d, src, n);
  return d;
}

FZ_NOCOV static inline sc_error_info fz_err(void) {
  sc_error_info e = {-7, -7, -7};
  return e;
}

/* The rest of the input as a received message: a heap copy of all of it, and a copy of
 * its first SC_WIRE_PREFIX_NBYTES (what the layout-only checks may read), so ASan sees a
 * read past either. */
typedef struct {
  uint8_t* msg;
  uint8_t* prefix;
  size_t n;
} fz_message;

FZ_NOCOV static inline fz_message fz_message_take(const fz_reader* r) {
  fz_message m;
  m.n = r->n;
  m.msg = fz_dup(r->p, m.n);
  m.prefix = fz_dup(r->p, m.n < SC_WIRE_PREFIX_NBYTES ? m.n : SC_WIRE_PREFIX_NBYTES);
  return m;
}

FZ_NOCOV static inline void fz_message_free(fz_message* m) {
  free(m->prefix);
  free(m->msg);
}

/* Fills the header part of an expectation from the message's own header when that header
 * is valid (so the rest of the checks are reached); returns whether it did. */
FZ_NOCOV static inline int fz_expect_own_header(const fz_message* m, sc_wire_expect* w,
                                                sc_wire_header* h) {
  if (m->n < SC_WIRE_HEADER_NBYTES || sc_wire_check_header(m->msg, (int64_t)m->n, NULL, h, NULL) != SC_OK)
    return 0;
  w->value_dtype = h->value_dtype;
  w->sender = h->sender;
  w->n = (int64_t)h->n;
  w->count = (int64_t)h->count;
  return 1;
}

#endif
