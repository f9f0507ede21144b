// Count-Sketch ops (gs-SGD, section 3): bindings of csrc/cpu/sketch.c (C ABI
// in csrc/include/sparsecomm/sketch.h), written like every binding: checks
// from csrc/op_checks.h (shared with the CUDA bindings), one kernel call
// through call_kernel.
#include <torch/library.h>

#include <string>

#include "checks.h"
#include "op_checks.h"
#include "sparsecomm/sketch.h"

namespace {

using at::Tensor;
using namespace sparsecomm;

void sketch_build_cpu(Tensor& table, const Tensor& x, int64_t seed) {
  const char* op = "sparsecomm.sketch_build_";
  sc_dtype tt = check_sketch_table(Device::Cpu, table, op);
  check_contiguous(table, op, "table");
  check_vector(x, op, "x");
  sc_dtype xt = value_dtype(x, op, "x", Floats::Full);
  Tensor xc = x.contiguous();
  call_kernel(op, {kSketchNames, 3}, sc_sketch_build_dense, tt, table.data_ptr(), table.size(0),
              table.size(1), (uint64_t)seed, xt, xc.data_ptr(), xc.numel(), threads());
}

void sketch_build_coo_cpu(Tensor& table, const Tensor& idx, const Tensor& val, int64_t n,
                          int64_t seed) {
  const char* op = "sparsecomm.sketch_build_coo_";
  sc_dtype tt = check_sketch_table(Device::Cpu, table, op);
  check_contiguous(table, op, "table");
  check_nonnegative(n, op, "n");
  check_vector(val, op, "val");
  sc_dtype vt = value_dtype(val, op, "val", Floats::Full);
  Tensor ii = sketch_indices(Device::Cpu, idx, table, op);
  check_same_length(ii, val, op, "idx", "val");
  Tensor vv = val.contiguous();
  call_kernel(op, {kSketchNames, 3}, n, sc_sketch_build_coo, tt, table.data_ptr(), table.size(0),
              table.size(1), (uint64_t)seed, n, ii.data_ptr<int64_t>(), vt, vv.data_ptr(),
              vv.numel(), threads());
}

Tensor sketch_estimate_cpu(const Tensor& table, int64_t n, int64_t seed) {
  const char* op = "sparsecomm.sketch_estimate";
  sc_dtype tt = check_sketch_table(Device::Cpu, table, op);
  check_nonnegative(n, op, "n");
  Tensor t = table.contiguous();
  Tensor out = empty_out(n, t.options());
  call_kernel(op, {kSketchNames, 3}, sc_sketch_estimate, tt, t.data_ptr(), t.size(0), t.size(1),
              (uint64_t)seed, nullptr, n, out.data_ptr(), threads());
  return out;
}

Tensor sketch_estimate_at_cpu(const Tensor& table, const Tensor& idx, int64_t seed) {
  const char* op = "sparsecomm.sketch_estimate_at";
  sc_dtype tt = check_sketch_table(Device::Cpu, table, op);
  Tensor ii = sketch_indices(Device::Cpu, idx, table, op);
  Tensor t = table.contiguous();
  Tensor out = at::empty({ii.numel()}, t.options());
  call_kernel(op, {kSketchNames, 3}, sc_sketch_estimate, tt, t.data_ptr(), t.size(0), t.size(1),
              (uint64_t)seed, ii.data_ptr<int64_t>(), ii.numel(), out.data_ptr(), threads());
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
