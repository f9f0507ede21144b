/* Fuzz target: the 32-byte message header (sc_wire_check_header).
 *
 * Input: [1 byte: which expectations to pass][message bytes]. The message is
 * checked three ways: with no expectation, with expectations taken from its
 * own fields (so deeper checks run), and with fuzzed expectations; each time
 * from a heap copy of exactly the message's bytes. Invariants: the check
 * reads only msg[0..32); an accepted header's fields are the bytes'; a
 * rejection names a known field and the byte offset of that field. */
#include "fuzz_common.h"
#include "sparsecomm/wire.h"

static const int64_t field_pos[] = {[SC_WF_MAGIC] = 0,  [SC_WF_VERSION] = 4,
                                    [SC_WF_KIND] = 6,   [SC_WF_VALUE_DTYPE] = 7,
                                    [SC_WF_INDEX_DTYPE] = 8, [SC_WF_SENDER] = 12,
                                    [SC_WF_N] = 16,     [SC_WF_COUNT] = 24};

static void check_one(const uint8_t* msg, size_t n, const sc_wire_expect* w) {
  sc_wire_header h;
  memset(&h, 0xA5, sizeof h);
  sc_error_info e = fz_err();
  int st = sc_wire_check_header(msg, (int64_t)n, w, &h, &e);
  if (st == SC_OK) {
    FUZZ_CHECK(n >= SC_WIRE_HEADER_NBYTES);
    uint32_t magic;
    memcpy(&magic, msg, 4);
    FUZZ_CHECK(h.magic == magic && h.magic == SC_WIRE_MAGIC);
    FUZZ_CHECK(h.version == SC_WIRE_VERSION && h.kind == msg[6] && h.value_dtype == msg[7]);
    FUZZ_CHECK(h.reserved[0] == 0 && h.reserved[1] == 0 && h.reserved[2] == 0);
    FUZZ_CHECK(h.n <= (uint64_t)INT64_MAX && h.count <= (uint64_t)INT64_MAX);
    if (w) {
      FUZZ_CHECK(w->kind < 0 || h.kind == w->kind);
      FUZZ_CHECK(w->sender < 0 || h.sender == (uint64_t)w->sender);
      FUZZ_CHECK(w->n < 0 || h.n == (uint64_t)w->n);
      FUZZ_CHECK(w->count < 0 || h.count == (uint64_t)w->count);
    }
  } else if (st == SC_ERR_MALFORMED) {
    FUZZ_CHECK(e.input > 0 && e.input < SC_WF_COUNT_OF_FIELDS);
    FUZZ_CHECK(strcmp(sc_wire_field_name(e.input), "unknown") != 0);
    if (e.input == SC_WF_SIZE) FUZZ_CHECK(n < SC_WIRE_HEADER_NBYTES && e.value == (int64_t)n);
    else if (e.input == SC_WF_RESERVED) FUZZ_CHECK(e.position >= 9 && e.position < 12 && msg[e.position]);
    else FUZZ_CHECK(e.input <= SC_WF_COUNT && e.position == field_pos[e.input]);
  } else {
    FUZZ_CHECK(0 && "unexpected status");
  }
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fz_reader r = {data, size};
  unsigned sel = (unsigned)fz_u(&r, 1);
  size_t n = r.n;
  /* at most the header is read: copy only what the check may touch */
  size_t keep = n < SC_WIRE_HEADER_NBYTES ? n : SC_WIRE_HEADER_NBYTES;
  uint8_t* msg = fz_dup(r.p, keep);
  check_one(msg, n, NULL);
  sc_wire_expect w = sc_wire_expect_any();
  check_one(msg, n, &w);
  if (keep == SC_WIRE_HEADER_NBYTES) {
    fz_reader h = {msg, keep};
    (void)fz_u(&h, 6);
    w.kind = (int64_t)fz_u(&h, 1) ^ (sel & 1);
    w.value_dtype = (int64_t)fz_u(&h, 1) ^ ((sel >> 1) & 1);
    w.index_dtype = (int64_t)fz_u(&h, 1) ^ ((sel >> 2) & 1);
    (void)fz_u(&h, 3);
    w.sender = (int64_t)fz_u(&h, 4) ^ ((sel >> 3) & 1);
    w.n = (int64_t)(fz_u(&h, 8) & (uint64_t)INT64_MAX) ^ ((sel >> 4) & 1);
    w.count = (int64_t)(fz_u(&h, 8) & (uint64_t)INT64_MAX) ^ ((sel >> 5) & 1);
    check_one(msg, n, &w);
  }
  /* a bad expectation is the caller's error, never a read */
  w.n = -2 - (int64_t)(sel >> 6);
  sc_error_info e = fz_err();
  FUZZ_CHECK(sc_wire_check_header(msg, (int64_t)n, &w, NULL, &e) == SC_ERR_ARG);
  free(msg);
  return 0;
}
