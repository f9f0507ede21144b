// DenseStream ops ("DenseStream: A Novel Data Representation for Gradient
// Sparsification", section III-A): bindings of csrc/cpu/densestream.c (C ABI in
// csrc/include/sparsecomm/densestream.h), written like every binding: checks
// from csrc/checks.h, outputs allocated (the header's bounds, then narrowed to
// what the kernel wrote: one pass; encode_dense and to_coo, whose bound is N,
// count first), one kernel call through call_kernel.
//
// A DenseStream is three tensors: starts (int64), lengths (int64) and values
// (the value dtype, all blocks back to back).
#include <torch/library.h>

#include <algorithm>
#include <string>
#include <tuple>
#include <vector>

#include "checks.h"
#include "sparsecomm/densestream.h"

namespace {

using at::Tensor;
using namespace sparsecomm;
using Blocks = std::tuple<Tensor, Tensor, Tensor>;

// width 0: the fewest bytes that hold n - 1 (sc_ds_width)
int64_t width_for(int64_t width, int64_t n, const char* op) {
  TORCH_CHECK_VALUE(width >= 0 && width <= 8, op,
                    ": width must be 1..8 bytes, or 0 for the fewest that hold n - 1, got ", width);
  return width ? width : sc_ds_width(n);
}

// starts / lengths int64 of one length, values a float dtype; contiguous copies
struct BlocksIn {
  Tensor s, l, v;
  sc_dtype vt;
};

BlocksIn blocks_in(const Tensor& s, const Tensor& l, const Tensor& v, const char* op,
                   const std::string& prefix) {
  check_vector(s, op, prefix + "starts");
  check_vector(l, op, prefix + "lengths");
  check_vector(v, op, prefix + "values");
  TORCH_CHECK_TYPE(s.scalar_type() == at::kLong, op, ": ", prefix, "starts must be int64, got ",
                   s.scalar_type());
  TORCH_CHECK_TYPE(l.scalar_type() == at::kLong, op, ": ", prefix, "lengths must be int64, got ",
                   l.scalar_type());
  check_same_length(s, l, op, prefix + "starts", prefix + "lengths");
  sc_dtype vt = value_dtype(v, op, prefix + "values");
  return {s.contiguous(), l.contiguous(), v.contiguous(), vt};
}

const std::string kBlockNames[] = {"starts", "lengths", "values"};
const std::string kPairNames[] = {"starts_a", "lengths_a", "values_a",
                                  "starts_b", "lengths_b", "values_b"};

Blocks alloc_blocks(const sc_ds_counts& c, const Tensor& like) {
  auto i64 = like.options().dtype(at::kLong);
  return {at::empty({c.nblocks}, i64), at::empty({c.nblocks}, i64), empty_out(c.nvalues, like.options())};
}

// The outputs cut to what the kernel wrote (views of the bound-sized buffers).
Blocks narrowed(const Blocks& b, const sc_ds_counts& c) {
  return {std::get<0>(b).narrow(0, 0, c.nblocks), std::get<1>(b).narrow(0, 0, c.nblocks),
          std::get<2>(b).narrow(0, 0, c.nvalues)};
}

int64_t run_of(int64_t width, const Tensor& values) {
  return sc_ds_max_zero_run(width, values.element_size());
}

Blocks encode_coo_cpu(const Tensor& idx, const Tensor& val, int64_t n, int64_t width) {
  const char* op = "sparsecomm.densestream_encode_coo";
  check_vector(idx, op, "idx");
  check_vector(val, op, "val");
  check_same_length(idx, val, op, "idx", "val");
  check_nonnegative(n, op, "n");
  width = width_for(width, n, op);
  sc_index_t it = index_dtype(idx, op, "idx");
  sc_dtype vt = value_dtype(val, op, "val");
  Tensor ic = idx.contiguous(), vc = val.contiguous();
  const int64_t m = ic.numel(), T = run_of(width, vc);
  sc_ds_counts cap{m, std::min(n, m + (m > 0 ? m - 1 : 0) * T)};  // densestream.h's bound
  Blocks out = alloc_blocks(cap, vc);
  sc_ds_counts c{0, 0};
  call_kernel(op, {"idx", "val", "n", "width", "capacity"}, n, sc_ds_encode_coo, it, vt, ic.data_ptr(),
              vc.data_ptr(), m, n, width, std::get<0>(out).data_ptr<int64_t>(),
              std::get<1>(out).data_ptr<int64_t>(), std::get<2>(out).data_ptr(), cap.nblocks, cap.nvalues, &c);
  return narrowed(out, c);
}

Blocks encode_dense_cpu(const Tensor& x, int64_t width) {
  const char* op = "sparsecomm.densestream_encode_dense";
  check_vector(x, op, "x");
  width = width_for(width, x.numel(), op);
  sc_dtype vt = value_dtype(x, op, "x");
  Tensor xc = x.contiguous();
  const std::string names[] = {"x", "width", "capacity"};
  sc_ds_counts c{0, 0};
  call_kernel(op, {names, 3}, sc_ds_encode_dense, vt, xc.data_ptr(), xc.numel(), width, nullptr, nullptr,
              nullptr, 0, 0, &c);
  Blocks out = alloc_blocks(c, xc);
  call_kernel(op, {names, 3}, sc_ds_encode_dense, vt, xc.data_ptr(), xc.numel(), width,
              std::get<0>(out).data_ptr<int64_t>(), std::get<1>(out).data_ptr<int64_t>(),
              std::get<2>(out).data_ptr(), c.nblocks, c.nvalues, &c);
  return out;
}

Blocks add_cpu(const Tensor& sa, const Tensor& la, const Tensor& va, const Tensor& sb,
               const Tensor& lb, const Tensor& vb, int64_t n, int64_t width) {
  const char* op = "sparsecomm.densestream_add";
  BlocksIn a = blocks_in(sa, la, va, op, "a: ");
  BlocksIn b = blocks_in(sb, lb, vb, op, "b: ");
  check_same_dtype(va, vb, op, "values_a", "values_b");
  check_nonnegative(n, op, "n");
  width = width_for(width, n, op);
  const int64_t T = run_of(width, a.v);
  sc_ds_counts cap{a.v.numel() + b.v.numel(),
                   std::min(n, a.v.numel() + b.v.numel() + (a.s.numel() + b.s.numel()) * T)};
  Blocks out = alloc_blocks(cap, a.v);
  sc_ds_counts c{0, 0};
  call_kernel(op, {kPairNames, 6}, n, sc_ds_add, a.vt, a.s.data_ptr<int64_t>(), a.l.data_ptr<int64_t>(),
              a.v.data_ptr(), a.s.numel(), a.v.numel(), b.s.data_ptr<int64_t>(), b.l.data_ptr<int64_t>(),
              b.v.data_ptr(), b.s.numel(), b.v.numel(), n, width, std::get<0>(out).data_ptr<int64_t>(),
              std::get<1>(out).data_ptr<int64_t>(), std::get<2>(out).data_ptr(), cap.nblocks, cap.nvalues, &c);
  return narrowed(out, c);
}

Blocks slice_cpu(const Tensor& s, const Tensor& l, const Tensor& v, int64_t n, int64_t lo,
                 int64_t hi, int64_t width) {
  const char* op = "sparsecomm.densestream_slice";
  BlocksIn a = blocks_in(s, l, v, op, "");
  check_nonnegative(n, op, "n");
  TORCH_CHECK_VALUE(0 <= lo && lo <= hi && hi <= n, op, ": the range [lo, hi) must satisfy 0 <= lo <= hi <= n = ",
                    n, ", got [", lo, ", ", hi, ")");
  width = width_for(width, n, op);
  sc_ds_counts cap{a.v.numel(), a.v.numel()};
  Blocks out = alloc_blocks(cap, a.v);
  sc_ds_counts c{0, 0};
  call_kernel(op, {kBlockNames, 3}, n, sc_ds_slice, a.vt, a.s.data_ptr<int64_t>(), a.l.data_ptr<int64_t>(),
              a.v.data_ptr(), a.s.numel(), a.v.numel(), n, lo, hi, width, std::get<0>(out).data_ptr<int64_t>(),
              std::get<1>(out).data_ptr<int64_t>(), std::get<2>(out).data_ptr(), cap.nblocks, cap.nvalues, &c);
  return narrowed(out, c);
}

void add_into_cpu(Tensor& dense, const Tensor& s, const Tensor& l, const Tensor& v) {
  const char* op = "sparsecomm.densestream_add_into_";
  check_vector(dense, op, "dense");
  check_contiguous(dense, op, "dense");
  BlocksIn a = blocks_in(s, l, v, op, "");
  check_same_dtype(dense, v, op, "dense", "values");
  call_kernel(op, {kBlockNames, 3}, dense.numel(), sc_ds_add_into, a.vt, dense.data_ptr(), dense.numel(),
              a.s.data_ptr<int64_t>(), a.l.data_ptr<int64_t>(), a.v.data_ptr(), a.s.numel(), a.v.numel());
}

std::tuple<Tensor, Tensor> to_coo_cpu(const Tensor& s, const Tensor& l, const Tensor& v, int64_t n) {
  const char* op = "sparsecomm.densestream_to_coo";
  BlocksIn a = blocks_in(s, l, v, op, "");
  check_nonnegative(n, op, "n");
  int64_t m = 0;
  call_kernel(op, {kBlockNames, 3}, n, sc_ds_to_coo, a.vt, a.s.data_ptr<int64_t>(), a.l.data_ptr<int64_t>(),
              a.v.data_ptr(), a.s.numel(), a.v.numel(), n, nullptr, nullptr, 0, &m);
  Tensor idx = at::empty({m}, a.s.options()), val = at::empty({m}, a.v.options());
  call_kernel(op, {kBlockNames, 3}, n, sc_ds_to_coo, a.vt, a.s.data_ptr<int64_t>(), a.l.data_ptr<int64_t>(),
              a.v.data_ptr(), a.s.numel(), a.v.numel(), n, idx.data_ptr<int64_t>(), val.data_ptr(), m, &m);
  return {idx, val};
}

// Wire check of a DenseStream message (sparsecomm/formats/densestream.py).
// expect: value_dtype, sender, n, count (nblocks), lo, hi; -1 = not checked.
// Returns 11 ints: a malformed message gives [field, position, value, -1...]
// (the decoder words the error); a valid one [0, nblocks, nvalues, lo, hi,
// width, starts_pos, lengths_pos, values_pos, value_size, n]. SymInt[] like
// the other wire checks (csrc/ops_wire.cpp) so a fake kernel can return
// unbacked symbols.
constexpr int64_t kDsResultLen = 11;

std::vector<c10::SymInt> wire_check_cpu(const Tensor& payload, c10::IntArrayRef expect) {
  const char* op = "sparsecomm.wire_check_densestream";
  check_vector(payload, op, "payload");
  TORCH_CHECK_TYPE(payload.scalar_type() == at::kByte, op, ": payload must be uint8, got ",
                   payload.scalar_type());
  check_contiguous(payload, op, "payload");
  TORCH_CHECK_VALUE(expect.size() == 6, op, ": expect must hold 6 ints (value_dtype, sender, n, "
                    "count, lo, hi), got ", expect.size());
  sc_wire_expect w = sc_wire_expect_any();
  w.value_dtype = expect[0];
  w.sender = expect[1];
  w.n = expect[2];
  w.count = expect[3];
  sc_ds_layout L;
  sc_error_info e{0, 0, 0};
  int st = sc_wire_check_densestream(payload.data_ptr<uint8_t>(), payload.numel(), &w, expect[4],
                                     expect[5], &L, &e);
  std::vector<c10::SymInt> r(kDsResultLen, c10::SymInt(-1));
  if (st == SC_ERR_MALFORMED) {
    r[0] = e.input;
    r[1] = e.position;
    r[2] = e.value;
    return r;
  }
  if (st != SC_OK) {
    const std::string names[] = {"expect"};
    raise_status(st, op, e, {names, 1});
  }
  const int64_t vals[kDsResultLen] = {0, L.nblocks, L.nvalues, L.lo, L.hi, L.width,
                                      L.starts_pos, L.lengths_pos, L.values_pos, L.value_size, L.n};
  for (int64_t i = 0; i < kDsResultLen; i++) r[i] = vals[i];
  return r;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(sparsecomm, m) {
  m.def("densestream_encode_coo(Tensor idx, Tensor val, int n, int width) -> (Tensor starts, Tensor lengths, Tensor values)");
  m.def("densestream_encode_dense(Tensor x, int width) -> (Tensor starts, Tensor lengths, Tensor values)");
  m.def("densestream_add(Tensor starts_a, Tensor lengths_a, Tensor values_a, Tensor starts_b, Tensor lengths_b, Tensor values_b, int n, int width) -> (Tensor starts, Tensor lengths, Tensor values)");
  m.def("densestream_slice(Tensor starts, Tensor lengths, Tensor values, int n, int lo, int hi, int width) -> (Tensor starts, Tensor lengths, Tensor values)");
  m.def("densestream_add_into_(Tensor(a!) dense, Tensor starts, Tensor lengths, Tensor values) -> ()");
  m.def("densestream_to_coo(Tensor starts, Tensor lengths, Tensor values, int n) -> (Tensor indices, Tensor values)");
  m.def("wire_check_densestream(Tensor payload, int[] expect) -> SymInt[]");
}

TORCH_LIBRARY_IMPL(sparsecomm, CPU, m) {
  m.impl("densestream_encode_coo", &encode_coo_cpu);
  m.impl("densestream_encode_dense", &encode_dense_cpu);
  m.impl("densestream_add", &add_cpu);
  m.impl("densestream_slice", &slice_cpu);
  m.impl("densestream_add_into_", &add_into_cpu);
  m.impl("densestream_to_coo", &to_coo_cpu);
  m.impl("wire_check_densestream", &wire_check_cpu);
}
