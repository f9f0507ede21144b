// Count-Sketch operators (issue 5): schemas as a fragment of the sparsecomm
// library (csrc/ops.cpp holds the one TORCH_LIBRARY) and their CPU impls,
// which only check arguments and call the C kernels of csrc/cpu/sketch.c.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <cstdint>

#include "sparsecomm/sketch.h"

namespace {

using at::Tensor;

int table_code(const Tensor& table, const char* op) {
  TORCH_CHECK_VALUE(table.dim() == 2, op, ": table must be a 2-D (rows x cols) tensor, got shape ",
                    table.sizes());
  TORCH_CHECK_VALUE(table.device().is_cpu(), op, ": table must be a CPU tensor, got ", table.device());
  TORCH_CHECK_VALUE(table.size(0) >= 1 && table.size(0) <= SC_SKETCH_MAX_ROWS, op,
                    ": table must have 1..", SC_SKETCH_MAX_ROWS, " rows, got ", table.size(0));
  TORCH_CHECK_VALUE(table.size(1) >= 1 && table.size(1) <= 0xFFFFFFFFll, op,
                    ": table must have 1..2^32-1 columns, got ", table.size(1));
  if (table.scalar_type() == at::kFloat) return SC_SK_F32;
  if (table.scalar_type() == at::kDouble) return SC_SK_F64;
  TORCH_CHECK_TYPE(false, op, ": table must be float32 or float64, got ", table.scalar_type());
}

int value_code(const Tensor& x, const char* op, const char* name) {
  TORCH_CHECK_VALUE(x.dim() == 1, op, ": ", name, " must be 1-D, got shape ", x.sizes());
  TORCH_CHECK_VALUE(x.device().is_cpu(), op, ": ", name, " must be a CPU tensor, got ", x.device());
  if (x.scalar_type() == at::kFloat) return SC_SK_F32;
  if (x.scalar_type() == at::kDouble) return SC_SK_F64;
  TORCH_CHECK_TYPE(false, op, ": ", name, " must be float32 or float64, got ", x.scalar_type());
}

Tensor checked_index(const Tensor& idx, int64_t n, const char* op) {
  TORCH_CHECK_VALUE(idx.dim() == 1, op, ": idx must be 1-D, got shape ", idx.sizes());
  TORCH_CHECK_VALUE(idx.device().is_cpu(), op, ": idx must be a CPU tensor, got ", idx.device());
  TORCH_CHECK_TYPE(idx.scalar_type() == at::kInt || idx.scalar_type() == at::kLong, op,
                   ": idx must be int32 or int64, got ", idx.scalar_type());
  Tensor i64 = idx.to(at::kLong).contiguous();
  if (i64.numel()) {
    int64_t lo = i64.min().item<int64_t>(), hi = i64.max().item<int64_t>();
    TORCH_CHECK_VALUE(lo >= 0, op, ": idx must hold indices >= 0, got ", lo);
    TORCH_CHECK_VALUE(n < 0 || hi < n, op, ": idx must hold indices < ", n, ", got ", hi);
  }
  return i64;
}

void check_status(int st, const char* op) {
  TORCH_CHECK_VALUE(st == 0, op, ": kernel rejected its arguments (status ", st, ")");
}

Tensor& sketch_build_cpu(Tensor& table, const Tensor& x, int64_t seed) {
  const char* op = "sparsecomm.sketch_build_";
  int tc = table_code(table, op);
  TORCH_CHECK_VALUE(table.is_contiguous(), op, ": table must be contiguous");
  int xc = value_code(x, op, "x");
  Tensor xx = x.contiguous();
  check_status(sc_sketch_build_dense(tc, table.data_ptr(), table.size(0), table.size(1), (uint64_t)seed, xc,
                                     xx.data_ptr(), xx.numel(), at::get_num_threads()), op);
  return table;
}

Tensor& sketch_build_coo_cpu(Tensor& table, const Tensor& idx, const Tensor& val, int64_t n, int64_t seed) {
  const char* op = "sparsecomm.sketch_build_coo_";
  int tc = table_code(table, op);
  TORCH_CHECK_VALUE(table.is_contiguous(), op, ": table must be contiguous");
  int vc = value_code(val, op, "val");
  Tensor ii = checked_index(idx, n, op);
  TORCH_CHECK_VALUE(ii.numel() == val.numel(), op, ": idx and val must have the same length, got ",
                    ii.numel(), " and ", val.numel());
  Tensor vv = val.contiguous();
  check_status(sc_sketch_build_coo(tc, table.data_ptr(), table.size(0), table.size(1), (uint64_t)seed,
                                   ii.data_ptr<int64_t>(), vc, vv.data_ptr(), vv.numel(),
                                   at::get_num_threads()), op);
  return table;
}

Tensor sketch_estimate_cpu(const Tensor& table, int64_t n, int64_t seed) {
  const char* op = "sparsecomm.sketch_estimate";
  int tc = table_code(table, op);
  TORCH_CHECK_VALUE(n >= 0, op, ": n must be >= 0, got ", n);
  Tensor t = table.contiguous();
  Tensor out = at::empty({n}, t.options());
  check_status(sc_sketch_estimate(tc, t.data_ptr(), t.size(0), t.size(1), (uint64_t)seed, nullptr, n,
                                  out.data_ptr(), at::get_num_threads()), op);
  return out;
}

Tensor sketch_estimate_at_cpu(const Tensor& table, const Tensor& idx, int64_t seed) {
  const char* op = "sparsecomm.sketch_estimate_at";
  int tc = table_code(table, op);
  Tensor ii = checked_index(idx, -1, op);
  Tensor t = table.contiguous();
  Tensor out = at::empty({ii.numel()}, t.options());
  check_status(sc_sketch_estimate(tc, t.data_ptr(), t.size(0), t.size(1), (uint64_t)seed,
                                  ii.data_ptr<int64_t>(), ii.numel(), out.data_ptr(), at::get_num_threads()),
               op);
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(sparsecomm, m) {
  m.def("sketch_build_(Tensor(a!) table, Tensor x, int seed) -> Tensor(a!)");
  m.def("sketch_build_coo_(Tensor(a!) table, Tensor idx, Tensor val, int n, int seed) -> Tensor(a!)");
  m.def("sketch_estimate(Tensor table, int n, int seed) -> Tensor");
  m.def("sketch_estimate_at(Tensor table, Tensor idx, int seed) -> Tensor");
}

TORCH_LIBRARY_IMPL(sparsecomm, CPU, m) {
  m.impl("sketch_build_", &sketch_build_cpu);
  m.impl("sketch_build_coo_", &sketch_build_coo_cpu);
  m.impl("sketch_estimate", &sketch_estimate_cpu);
  m.impl("sketch_estimate_at", &sketch_estimate_at_cpu);
}
