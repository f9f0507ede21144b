/*
 * sparsecomm wire formats: validation of every message a rank receives.
 *
 * Messages are byte strings in the layouts documented in sparsecomm/formats
 * (header.py, coo.py, stream.py). A receiver calls the check for the message
 * kind it expects, passing what it knows (sc_wire_expect); the check returns
 * SC_OK with the parsed layout (sc_wire_layout: header fields, byte offsets of
 * the sections) or SC_ERR_MALFORMED with
 *     err->input    = the field at fault (sc_wire_field),
 *     err->position = its byte offset in the message (SC_WF_INDEX_ORDER /
 *                     SC_WF_INDEX_RANGE: the element position in the index
 *                     section; SC_WF_SIZE: the size the header implies, or
 *                     -1 when that overflows),
 *     err->value    = the value received (SC_WF_SIZE: the message's size;
 *                     N and count are unsigned on the wire: read as int64).
 * Checks run in the order of the fields in the message, so the first field at
 * fault is the one reported (a constraint on a field that depends on a later
 * one is checked after that one: the QSGD bucket after the bits, the QSGD
 * count after both); within the index section the first bad element is
 * reported (at one element, the range before the order) whatever the thread
 * count. Conventions otherwise as abi.h (err
 * last and nullable, SC_ERR_ARG for a bad argument of the caller: NULL msg
 * with nbytes > 0, negative nbytes, a bad expectation).
 *
 * Two depths:
 *   sc_wire_*_layout  header, fixed fields and sizes; reads at most
 *                     min(nbytes, SC_WIRE_PREFIX_NBYTES) bytes of msg, so a
 *                     receiver whose payload lives on a device can check a
 *                     host copy of the prefix (nbytes = the full size).
 *   sc_wire_check_*   the layout and then the whole message: padding bytes
 *                     zero, indices strictly ascending and < N in one fused
 *                     O(count) pass (parallel for count >= SC_WIRE_PAR_MIN).
 * The message may start at any address (sections are read with unaligned
 * loads); the layout reports where the sections are, and the caller views them.
 *
 * Not checked here: the values (any bit pattern is a value), and the QSGD
 * levels and scales, which sc_qsgd_dequantize (stream.h) validates as it reads.
 */
#ifndef SPARSECOMM_WIRE_H
#define SPARSECOMM_WIRE_H

#include "sparsecomm/abi.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SC_WIRE_HEADER_NBYTES 32
#define SC_WIRE_MAGIC 0x4D435053u /* bytes "SPCM" */
#define SC_WIRE_VERSION 1
/* The longest fixed part: header + offset + QSGD bucket and bits. */
#define SC_WIRE_PREFIX_NBYTES 48
/* Index sections of at least this many entries are checked in parallel. */
#define SC_WIRE_PAR_MIN ((int64_t)1 << 18)

/* Message kinds (header byte 6). */
/* SC_KIND_COO_CODED: a COO vector in a codec body (sparsecomm/skcompress.h), validated by
 * sc_skc_decode after the header. */
typedef enum {
  SC_KIND_COO = 1,
  SC_KIND_DENSE = 2,
  SC_KIND_SIGNATURE = 3,
  SC_KIND_DENSE_BLOCKS = 4, /* a DenseStream (densestream.h) */
  SC_KIND_COO_CODED = 5,    /* a COO vector in a codec body (skcompress.h) */
  SC_KIND_CLASS_BITMAP = 6, /* a bitmap over a ZEN hash class and its values (zen.h) */
  SC_KIND_LAST = 6
} sc_wire_kind;

/* Dtype codes on the wire (header bytes 7 and 8; sparsecomm.formats.DTYPE_CODES).
 * These are not sc_dtype: the wire has its own, stable codes; 0 = none. */
typedef enum {
  SC_WIRE_NONE = 0,
  SC_WIRE_F32 = 1,
  SC_WIRE_F64 = 2,
  SC_WIRE_F16 = 3,
  SC_WIRE_BF16 = 4,
  SC_WIRE_I32 = 5,
  SC_WIRE_I64 = 6,
  SC_WIRE_U8 = 7
} sc_wire_dtype;

/* Size in bytes of a wire dtype (0 for SC_WIRE_NONE and unknown codes). */
static inline int64_t sc_wire_dtype_size(int64_t code) {
  static const int8_t sizes[8] = {0, 4, 8, 2, 2, 4, 8, 1};
  return (code >= 0 && code < 8) ? sizes[code] : 0;
}

/* Which part of a message is at fault (err->input of SC_ERR_MALFORMED). */
typedef enum {
  SC_WF_NONE = 0,
  SC_WF_MAGIC = 1,        /* bytes 0..3 */
  SC_WF_VERSION = 2,      /* bytes 4..5 */
  SC_WF_KIND = 3,         /* byte 6 */
  SC_WF_VALUE_DTYPE = 4,  /* byte 7 */
  SC_WF_INDEX_DTYPE = 5,  /* byte 8 */
  SC_WF_RESERVED = 6,     /* bytes 9..11, must be zero */
  SC_WF_SENDER = 7,       /* bytes 12..15 */
  SC_WF_N = 8,            /* bytes 16..23 */
  SC_WF_COUNT = 9,        /* bytes 24..31 */
  SC_WF_SIZE = 10,        /* the message's length disagrees with its header */
  SC_WF_INDEX_ORDER = 11, /* indices not strictly ascending */
  SC_WF_INDEX_RANGE = 12, /* an index negative or >= N */
  SC_WF_OFFSET = 13,      /* stream / QSGD range offset (bytes 32..39) */
  SC_WF_BUCKET = 14,      /* QSGD bucket size (bytes 40..43) */
  SC_WF_BITS = 15,        /* QSGD bits per level (bytes 44..47) */
  SC_WF_PADDING = 16,     /* a padding byte is not zero */
  SC_WF_DELTA = 17,       /* a sparse stream holds more items than delta(N) */
  SC_WF_COUNT_OF_FIELDS = 18
} sc_wire_field;

/* Name of a field ("magic", "version", "kind", ...; "unknown" otherwise). */
const char* sc_wire_field_name(int64_t field);

/* What the receiver expects. Every member is checked when >= 0 and ignored
 * when -1 (SC_WIRE_ANY); other negative values are SC_ERR_ARG. Members a
 * check does not use are ignored. sc_wire_expect_any() fills all with -1. */
#define SC_WIRE_ANY (-1)
typedef struct {
  int64_t kind;        /* sc_wire_kind */
  int64_t value_dtype; /* sc_wire_dtype */
  int64_t index_dtype; /* sc_wire_dtype (header check only: COO and streams
                          derive it from N, see below) */
  int64_t sender;
  int64_t n;
  int64_t count;
  int64_t offset;      /* streams, QSGD */
  int64_t bits;        /* QSGD */
  int64_t bucket;      /* QSGD */
} sc_wire_expect;

static inline sc_wire_expect sc_wire_expect_any(void) {
  sc_wire_expect e = {-1, -1, -1, -1, -1, -1, -1, -1, -1};
  return e;
}

/* The header as received (little-endian on the wire, host order here). */
typedef struct {
  uint32_t magic;
  uint16_t version;
  uint8_t kind, value_dtype, index_dtype;
  uint8_t reserved[3];
  uint32_t sender;
  uint64_t n;
  uint64_t count;
} sc_wire_header;

/* Where the sections of a validated message are (byte offsets from msg). */
typedef struct {
  sc_wire_header h;
  int64_t n;          /* h.n (fits int64 once validated) */
  int64_t count;      /* entries: COO and sparse stream items, dense stream n,
                         QSGD packed bytes */
  int64_t dense;      /* streams: 1 when the range travels dense */
  int64_t offset;     /* streams, QSGD: first coordinate of the range */
  int64_t bits;       /* QSGD */
  int64_t bucket;     /* QSGD */
  int64_t nscales;    /* QSGD: ceil(n / bucket) */
  int64_t index_pos;  /* first index byte (sparse forms), else -1 */
  int64_t index_size; /* 4 or 8 (sparse forms), else 0 */
  int64_t value_pos;  /* first value byte (QSGD: packed levels) */
  int64_t value_size; /* bytes per value (QSGD: 1) */
  int64_t scale_pos;  /* QSGD: first float32 scale, else -1 */
  int64_t nbytes;     /* the message's size */
} sc_wire_layout;

/*
 * The 32-byte header: nbytes >= 32, magic, version, kind (1..SC_KIND_LAST), value and
 * index dtype codes (0..7), reserved bytes zero, N and count < 2^63, then each
 * against `want` (kind, value_dtype, index_dtype, sender, n, count). Reads
 * msg[0..32). `out` may be NULL.
 */
int sc_wire_check_header(const uint8_t* msg, int64_t nbytes, const sc_wire_expect* want,
                         sc_wire_header* out, sc_error_info* err);

/*
 * COO message (formats/coo.py): header with kind COO, a float value dtype
 * (f32 f64 f16 bf16), index dtype int32 if N < 2^31 else int64, then
 *   [count indices, zero-padded to 8 B][count values]      (no trailing pad)
 * and nbytes exactly that. want->kind and want->index_dtype are ignored.
 */
int sc_wire_coo_layout(const uint8_t* msg, int64_t nbytes, const sc_wire_expect* want,
                       sc_wire_layout* out, sc_error_info* err);
int sc_wire_check_coo(const uint8_t* msg, int64_t nbytes, const sc_wire_expect* want,
                      int nthreads, sc_wire_layout* out, sc_error_info* err);

/*
 * Sparse-stream message (formats/stream.py): header with kind COO (sparse)
 * or DENSE, a float value dtype, [offset int64 >= 0], then
 *   sparse: index dtype int32 if N < 2^31 else int64, count <= delta(N) =
 *           floor(N * vsize / (isize + vsize)),
 *           [count relative indices, zero-padded to 8 B][count values, padded]
 *   dense:  index dtype 0, count == N, [N values, zero-padded to 8 B]
 * want->kind: SC_KIND_COO or SC_KIND_DENSE to require one form, -1 for either;
 * want->count applies to the sparse form only.
 */
int sc_wire_stream_layout(const uint8_t* msg, int64_t nbytes, const sc_wire_expect* want,
                          sc_wire_layout* out, sc_error_info* err);
int sc_wire_check_stream(const uint8_t* msg, int64_t nbytes, const sc_wire_expect* want,
                         int nthreads, sc_wire_layout* out, sc_error_info* err);

/*
 * QSGD range (formats/stream.py): header with kind DENSE, value dtype uint8,
 * index dtype 0, count = ceil(N * bits / 8); [offset int64 >= 0][bucket int32]
 * [bits int32] with bits 4 or 8, bucket >= 1 and even for bits 4; then
 *   [ceil(N / bucket) float32 scales, zero-padded to 8 B][count bytes, padded].
 * Checks the layout and the padding; levels and scales are validated by
 * sc_qsgd_dequantize.
 */
int sc_wire_qsgd_layout(const uint8_t* msg, int64_t nbytes, const sc_wire_expect* want,
                        sc_wire_layout* out, sc_error_info* err);
int sc_wire_check_qsgd(const uint8_t* msg, int64_t nbytes, const sc_wire_expect* want,
                       sc_wire_layout* out, sc_error_info* err);

/*
 * The fused index pass on its own: idx (int32 if isize == 4, int64 if 8; any
 * alignment) must be strictly ascending and inside [0, limit). Reports
 * SC_WF_INDEX_RANGE or SC_WF_INDEX_ORDER at the first bad position (at
 * one position, the range is checked first).
 */
int sc_wire_check_indices(const uint8_t* idx, int64_t isize, int64_t count, int64_t limit,
                          int nthreads, sc_error_info* err);

#ifdef __cplusplus
}
#endif

#endif /* SPARSECOMM_WIRE_H */
