/*
 * sparsecomm kernels: the one C ABI every kernel family shares.
 *
 * Language: C11 with GNU extensions (gcc >= 9 or clang >= 10): the kernels use
 * __int128, vector extensions, __atomic builtins, __builtin_prefetch and
 * OpenMP pragmas. No torch, no Python: kernels work on raw buffers, so the same
 * headers serve the CPU files (csrc/cpu), the CUDA files (csrc/cuda, a stream
 * passed in), the torch bindings (csrc/ops*.cpp) and the fuzz targets.
 *
 * Every kernel
 *   - returns an sc_status (SC_OK = 0),
 *   - takes `sc_error_info* err` as its LAST argument; err may be NULL; on
 *     failure the kernel fills it (which input, position, offending value,
 *     and for wire decoders the field) with sc_fail() from csrc/cpu/common.h,
 *   - validates what it reads from a peer in full (order, range, sizes): a
 *     kernel never reads or writes outside the buffers its arguments describe,
 *     whatever the bytes,
 *   - takes `int nthreads` (OpenMP threads it may use; < 1 means 1) when it
 *     has a parallel path; results never depend on the thread count.
 *
 * The bindings map a status to one Python exception in one place
 * (csrc/checks.h, raise_status): SC_ERR_ARG, SC_ERR_NAN, SC_ERR_INDEX_*,
 * SC_ERR_OVERLAP -> ValueError; SC_ERR_NOMEM -> MemoryError;
 * SC_ERR_MALFORMED -> sparsecomm.WireFormatError (a ValueError).
 */
#ifndef SPARSECOMM_ABI_H
#define SPARSECOMM_ABI_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Value types. Floating point values are passed as raw bits: float16 and
 * bfloat16 as 16-bit patterns (uint16_t). SC_U8 is for packed bytes. */
typedef enum {
  SC_F32 = 0,
  SC_F64 = 1,
  SC_F16 = 2,
  SC_BF16 = 3,
  SC_U8 = 4
} sc_dtype;

/* Index types of COO vectors (top-k always writes int64 indices). */
typedef enum {
  SC_I32 = 0,
  SC_I64 = 1
} sc_index_t;

typedef enum {
  SC_OK = 0,
  SC_ERR_ARG = 1,          /* bad argument: dtype, negative size, shape, option */
  SC_ERR_NOMEM = 2,        /* an allocation failed */
  SC_ERR_NAN = 3,          /* input contains NaN where the kernel cannot order it */
  SC_ERR_INDEX_RANGE = 4,  /* an index is negative or >= the dense length */
  SC_ERR_INDEX_ORDER = 5,  /* indices not strictly ascending (sorted, distinct) */
  SC_ERR_OVERLAP = 6,      /* an output buffer partially overlaps an input */
  SC_ERR_MALFORMED = 7     /* a received message violates its wire format */
} sc_status;

/* Where a failure was found. Fields a kernel does not use stay as they were. */
typedef struct {
  int64_t input;     /* which input vector (0-based), or the wire field (sc_wire_field) */
  int64_t position;  /* position inside it (element, or byte offset for wire data) */
  int64_t value;     /* the offending value */
} sc_error_info;

/* Size in bytes of one element of a value type (0 for an unknown code). */
static inline size_t sc_dtype_size(sc_dtype t) {
  switch (t) {
    case SC_F32: return 4;
    case SC_F64: return 8;
    case SC_F16: return 2;
    case SC_BF16: return 2;
    case SC_U8: return 1;
  }
  return 0;
}

static inline size_t sc_index_size(sc_index_t t) {
  return t == SC_I32 ? 4 : (t == SC_I64 ? 8 : 0);
}

#ifdef __cplusplus
}
#endif

#endif /* SPARSECOMM_ABI_H */
