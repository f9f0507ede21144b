// Wire-format validation ops: bindings of csrc/cpu/wire.c (C ABI in
// csrc/include/sparsecomm/wire.h), called by the decoders of
// sparsecomm/formats (through sparsecomm.ops.wire_check, sparsecomm/ops/_wire.py) on every received message.
//
//   wire_check_header(Tensor payload, int[] expect, int nbytes) -> SymInt[]
//   wire_check_coo   (Tensor payload, int[] expect, int nbytes) -> SymInt[]
//   wire_check_stream(Tensor payload, int[] expect, int nbytes) -> SymInt[]
//   wire_check_qsgd  (Tensor payload, int[] expect, int nbytes) -> SymInt[]
//
// payload: 1-D uint8 CPU tensor. nbytes = -1: payload is the whole message and
// is checked in full (indices, padding). nbytes >= 0: payload is a host copy
// of the first min(nbytes, 48) bytes of a message of nbytes bytes that lives
// elsewhere (a device), and only its layout is checked.
// expect: the 9 members of sc_wire_expect in order (kind, value_dtype,
// index_dtype, sender, n, count, offset, bits, bucket), -1 = not checked.
//
// Returns kResultLen ints (layout below; SymInt[] so the fake kernels of
// sparsecomm/ops/_wire.py can return unbacked symbols: an int[] result cannot
// carry them back through the dispatcher). A malformed message is a result, not
// an exception: result[0] is the sc_wire_field at fault, [1] its position,
// [2] the value received, so the decoder can raise WireFormatError naming the
// ranks and both values (it knows the receiver and what it expected; the
// binding does not). Errors of the caller (a bad tensor, a bad expectation)
// raise here through raise_status like every binding. One call, no tensor
// allocated: the per-message cost is the dispatcher's (a few microseconds)
// plus the O(count) index pass.
#include <torch/library.h>

#include <string>
#include <vector>

#include "checks.h"
#include "sparsecomm/wire.h"

namespace {

using at::Tensor;
using namespace sparsecomm;

// result layout (keep in sync with sparsecomm/ops/_wire.py: WIRE_FIELDS)
constexpr int64_t kResultLen = 17;

enum class Form { Header, Coo, Stream, Qsgd };

std::vector<c10::SymInt> check(Form form, const char* op, const Tensor& payload,
                           c10::IntArrayRef expect, int64_t nbytes) {
  check_vector(payload, op, "payload");
  TORCH_CHECK_TYPE(payload.scalar_type() == at::kByte, op, ": payload must be uint8, got ",
                   payload.scalar_type());
  check_contiguous(payload, op, "payload");
  TORCH_CHECK_VALUE(expect.size() == 9, op, ": expect must hold 9 ints (kind, value_dtype, "
                    "index_dtype, sender, n, count, offset, bits, bucket), got ", expect.size());
  const int64_t have = payload.numel();
  const bool layout_only = nbytes >= 0;
  if (layout_only) {
    const int64_t want = nbytes < SC_WIRE_PREFIX_NBYTES ? nbytes : SC_WIRE_PREFIX_NBYTES;
    TORCH_CHECK_VALUE(have == want, op, ": with nbytes = ", nbytes, " payload must be the first ",
                      want, " bytes of the message, got ", have, " bytes");
  } else {
    TORCH_CHECK_VALUE(nbytes == -1, op, ": nbytes must be -1 (payload is the message) or >= 0, got ",
                      nbytes);
    nbytes = have;
  }
  sc_wire_expect w;
  w.kind = expect[0];
  w.value_dtype = expect[1];
  w.index_dtype = expect[2];
  w.sender = expect[3];
  w.n = expect[4];
  w.count = expect[5];
  w.offset = expect[6];
  w.bits = expect[7];
  w.bucket = expect[8];

  const uint8_t* msg = payload.data_ptr<uint8_t>();
  sc_wire_layout L;
  sc_error_info e{0, 0, 0};
  int st;
  switch (form) {
    case Form::Header:
      st = sc_wire_check_header(msg, nbytes, &w, &L.h, &e);
      break;
    case Form::Coo:
      st = layout_only ? sc_wire_coo_layout(msg, nbytes, &w, &L, &e)
                       : sc_wire_check_coo(msg, nbytes, &w, threads(), &L, &e);
      break;
    case Form::Stream:
      st = layout_only ? sc_wire_stream_layout(msg, nbytes, &w, &L, &e)
                       : sc_wire_check_stream(msg, nbytes, &w, threads(), &L, &e);
      break;
    default:
      st = layout_only ? sc_wire_qsgd_layout(msg, nbytes, &w, &L, &e)
                       : sc_wire_check_qsgd(msg, nbytes, &w, &L, &e);
      break;
  }
  std::vector<c10::SymInt> r(kResultLen, c10::SymInt(-1));
  if (st == SC_ERR_MALFORMED) {
    r[0] = e.input;
    r[1] = e.position;
    r[2] = e.value;
    return r;
  }
  if (st != SC_OK) {
    const std::string names[] = {"expect[kind]",  "expect[value_dtype]", "expect[index_dtype]",
                                 "expect[sender]", "expect[n]",          "expect[count]",
                                 "expect[offset]", "expect[bits]",       "expect[bucket]"};
    raise_status(st, op, e, {names, 9});
  }
  r[0] = 0;
  r[1] = (int64_t)L.h.kind;
  r[2] = (int64_t)L.h.value_dtype;
  r[3] = (int64_t)L.h.index_dtype;
  r[4] = (int64_t)L.h.sender;
  r[5] = (int64_t)L.h.n;      // < 2^63 once validated
  r[6] = (int64_t)L.h.count;
  if (form != Form::Header) {
    r[7] = L.dense;
    r[8] = L.offset;
    r[9] = L.bits;
    r[10] = L.bucket;
    r[11] = L.nscales;
    r[12] = L.index_pos;
    r[13] = L.index_size;
    r[14] = L.value_pos;
    r[15] = L.value_size;
    r[16] = L.scale_pos;
  }
  return r;
}

std::vector<c10::SymInt> header_cpu(const Tensor& p, c10::IntArrayRef x, int64_t nbytes) {
  return check(Form::Header, "sparsecomm.wire_check_header", p, x, nbytes);
}
std::vector<c10::SymInt> coo_cpu(const Tensor& p, c10::IntArrayRef x, int64_t nbytes) {
  return check(Form::Coo, "sparsecomm.wire_check_coo", p, x, nbytes);
}
std::vector<c10::SymInt> stream_cpu(const Tensor& p, c10::IntArrayRef x, int64_t nbytes) {
  return check(Form::Stream, "sparsecomm.wire_check_stream", p, x, nbytes);
}
std::vector<c10::SymInt> qsgd_cpu(const Tensor& p, c10::IntArrayRef x, int64_t nbytes) {
  return check(Form::Qsgd, "sparsecomm.wire_check_qsgd", p, x, nbytes);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(sparsecomm, m) {
  m.def("wire_check_header(Tensor payload, int[] expect, int nbytes=-1) -> SymInt[]");
  m.def("wire_check_coo(Tensor payload, int[] expect, int nbytes=-1) -> SymInt[]");
  m.def("wire_check_stream(Tensor payload, int[] expect, int nbytes=-1) -> SymInt[]");
  m.def("wire_check_qsgd(Tensor payload, int[] expect, int nbytes=-1) -> SymInt[]");
}

TORCH_LIBRARY_IMPL(sparsecomm, CPU, m) {
  m.impl("wire_check_header", &header_cpu);
  m.impl("wire_check_coo", &coo_cpu);
  m.impl("wire_check_stream", &stream_cpu);
  m.impl("wire_check_qsgd", &qsgd_cpu);
}
