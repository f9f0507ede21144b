// Count-Sketch ops (gs-SGD, section 3): bindings of csrc/cpu/sketch.c (C ABI
// in csrc/include/sparsecomm/sketch.h), written like every binding: checks
// from csrc/checks.h, one kernel call, raise_status.
#include <torch/library.h>

#include <string>

#include "checks.h"
#include "sparsecomm/sketch.h"

namespace {

using at::Tensor;
using namespace sparsecomm;

const std::string kNames[] = {"table", "idx", "val"};

sc_dtype check_table(const Tensor& table, const char* op) {
  TORCH_CHECK_VALUE(table.dim() == 2, op,
                    ": table must be a 2-D (rows x cols) tensor, got shape ", table.sizes());
  check_cpu(table, op, "table");
  TORCH_CHECK_VALUE(table.size(0) >= 1 && table.size(0) <= SC_SKETCH_MAX_ROWS, op,
                    ": table must have 1..", SC_SKETCH_MAX_ROWS, " rows, got ", table.size(0));
  TORCH_CHECK_VALUE(table.size(1) >= 1 && table.size(1) <= 0xFFFFFFFFll, op,
                    ": table must have 1..2^32-1 columns, got ", table.size(1));
  return value_dtype(table, op, "table", Floats::Full);
}

// int64 indices for the kernel (which checks their range).
Tensor index_vector(const Tensor& idx, const char* op) {
  check_vector(idx, op, "idx");
  index_dtype(idx, op, "idx");
  return idx.to(at::kLong).contiguous();
}

void sketch_build_cpu(Tensor& table, const Tensor& x, int64_t seed) {
  const char* op = "sparsecomm.sketch_build_";
  sc_dtype tt = check_table(table, op);
  check_contiguous(table, op, "table");
  check_vector(x, op, "x");
  sc_dtype xt = value_dtype(x, op, "x", Floats::Full);
  Tensor xc = x.contiguous();
  sc_error_info e{0, 0, 0};
  int st = sc_sketch_build_dense(tt, table.data_ptr(), table.size(0), table.size(1),
                                 (uint64_t)seed, xt, xc.data_ptr(), xc.numel(), threads(), &e);
  if (st) raise_status(st, op, e, {kNames, 3});
}

void sketch_build_coo_cpu(Tensor& table, const Tensor& idx, const Tensor& val, int64_t n,
                          int64_t seed) {
  const char* op = "sparsecomm.sketch_build_coo_";
  sc_dtype tt = check_table(table, op);
  check_contiguous(table, op, "table");
  check_nonnegative(n, op, "n");
  check_vector(val, op, "val");
  sc_dtype vt = value_dtype(val, op, "val", Floats::Full);
  Tensor ii = index_vector(idx, op);
  check_same_length(ii, val, op, "idx", "val");
  Tensor vv = val.contiguous();
  sc_error_info e{0, 0, 0};
  int st = sc_sketch_build_coo(tt, table.data_ptr(), table.size(0), table.size(1),
                               (uint64_t)seed, n, ii.data_ptr<int64_t>(), vt, vv.data_ptr(),
                               vv.numel(), threads(), &e);
  if (st) raise_status(st, op, e, {kNames, 3}, n);
}

Tensor sketch_estimate_cpu(const Tensor& table, int64_t n, int64_t seed) {
  const char* op = "sparsecomm.sketch_estimate";
  sc_dtype tt = check_table(table, op);
  check_nonnegative(n, op, "n");
  Tensor t = table.contiguous();
  Tensor out = empty_out(n, t.options());
  sc_error_info e{0, 0, 0};
  int st = sc_sketch_estimate(tt, t.data_ptr(), t.size(0), t.size(1), (uint64_t)seed, nullptr,
                              n, out.data_ptr(), threads(), &e);
  if (st) raise_status(st, op, e, {kNames, 3});
  return out;
}

Tensor sketch_estimate_at_cpu(const Tensor& table, const Tensor& idx, int64_t seed) {
  const char* op = "sparsecomm.sketch_estimate_at";
  sc_dtype tt = check_table(table, op);
  Tensor ii = index_vector(idx, op);
  Tensor t = table.contiguous();
  Tensor out = at::empty({ii.numel()}, t.options());
  sc_error_info e{0, 0, 0};
  int st = sc_sketch_estimate(tt, t.data_ptr(), t.size(0), t.size(1), (uint64_t)seed,
                              ii.data_ptr<int64_t>(), ii.numel(), out.data_ptr(), threads(), &e);
  if (st) raise_status(st, op, e, {kNames, 3});
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(sparsecomm, m) {
  m.def("sketch_build_(Tensor(a!) table, Tensor x, int seed) -> ()");
  m.def("sketch_build_coo_(Tensor(a!) table, Tensor idx, Tensor val, int n, int seed) -> ()");
  m.def("sketch_estimate(Tensor table, int n, int seed) -> Tensor");
  m.def("sketch_estimate_at(Tensor table, Tensor idx, int seed) -> Tensor");
}

TORCH_LIBRARY_IMPL(sparsecomm, CPU, m) {
  m.impl("sketch_build_", &sketch_build_cpu);
  m.impl("sketch_build_coo_", &sketch_build_coo_cpu);
  m.impl("sketch_estimate", &sketch_estimate_cpu);
  m.impl("sketch_estimate_at", &sketch_estimate_at_cpu);
}
