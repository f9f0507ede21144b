// sparsecomm operator library: the TORCH_LIBRARY block, the top-k and COO ops.
//
// A binding checks the tensors it is given (csrc/checks.h: shapes, devices,
// dtypes, with messages naming the op and the argument), allocates outputs,
// calls one C kernel (csrc/cpu, C ABI in csrc/include/sparsecomm) and turns
// its status into an exception (call_kernel). Kernels validate the data
// (index order and range) themselves. Families add their ops from their own
// csrc/ops_*.cpp with TORCH_LIBRARY_FRAGMENT; fake (meta) kernels for
// torch.compile live in sparsecomm/ops/_fake.py. Ops that write in place
// return nothing (the custom-op convention).
#include <Python.h>

#include <torch/library.h>

#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "checks.h"
#include "op_checks.h"
#include "sparsecomm/kernels.h"

namespace {

using at::Tensor;
using namespace sparsecomm;

// ------------------------------------------------------------------ top-k

std::tuple<Tensor, Tensor> topk_with(sc_topk_path_t path, const char* op, const Tensor& x,
                                     int64_t k) {
  sc_dtype dt = check_topk_args(Device::Cpu, op, x, k);
  Tensor xc = x.contiguous();
  int64_t n = xc.numel();
  int64_t m = k < n ? k : n;
  Tensor vals = empty_out(m, xc.options());
  Tensor idx = empty_out(m, xc.options().dtype(at::kLong));
  call_kernel(op, {"x"}, sc_topk_path, path, dt, xc.data_ptr(), n, k, threads(), vals.data_ptr(),
              idx.data_ptr<int64_t>());
  return {vals, idx};
}

std::tuple<Tensor, Tensor> topk_cpu(const Tensor& x, int64_t k) {
  return topk_with(SC_TOPK_AUTO, "sparsecomm.topk", x, k);
}

std::tuple<Tensor, Tensor> topk_radix_cpu(const Tensor& x, int64_t k) {
  return topk_with(SC_TOPK_RADIX, "sparsecomm.topk_radix", x, k);
}

std::tuple<Tensor, Tensor> block_topk_cpu(const Tensor& x, int64_t num_blocks,
                                          int64_t k_per_block) {
  const char* op = "sparsecomm.block_topk";
  sc_dtype dt = check_block_topk_args(Device::Cpu, op, x, num_blocks, k_per_block);
  Tensor xc = x.contiguous();
  int64_t n = xc.numel();
  int64_t m = sc_block_topk_count(n, num_blocks, k_per_block);
  Tensor vals = empty_out(m, xc.options());
  Tensor idx = empty_out(m, xc.options().dtype(at::kLong));
  call_kernel(op, {"x"}, sc_block_topk, dt, xc.data_ptr(), n, num_blocks, k_per_block, threads(),
              vals.data_ptr(), idx.data_ptr<int64_t>());
  return {vals, idx};
}

// The residual add fused with the (block) top-k: acc += g, then the selection of
// the sums into the caller's values / indices (sc_block_topk_accum).
void topk_accum_cpu(Tensor& acc, const Tensor& g, int64_t num_blocks, int64_t k_per_block,
                    bool clear, Tensor& values, Tensor& indices) {
  const char* op = "sparsecomm.topk_accum_";
  check_vector(acc, op, "acc");
  check_vector(g, op, "g");
  check_vector(values, op, "values");
  check_vector(indices, op, "indices");
  check_contiguous(acc, op, "acc");
  check_contiguous(values, op, "values");
  check_contiguous(indices, op, "indices");
  check_num_blocks(num_blocks, op);
  check_nonnegative(k_per_block, op, "k_per_block");
  sc_dtype dt = value_dtype(acc, op, "acc", Floats::Full);
  check_same_dtype(acc, g, op, "acc", "g");
  check_same_dtype(acc, values, op, "acc", "values");
  TORCH_CHECK_TYPE(indices.scalar_type() == at::kLong, op, ": indices must be int64, got ",
                   indices.scalar_type());
  check_same_length(acc, g, op, "acc", "g");
  int64_t n = acc.numel();
  int64_t m = sc_block_topk_count(n, num_blocks, k_per_block);
  TORCH_CHECK_VALUE(values.numel() == m && indices.numel() == m, op,
                    ": values and indices must hold ", m, " entries (the block top-k count of N=",
                    n, ", num_blocks=", num_blocks, ", k_per_block=", k_per_block, "), got ",
                    values.numel(), " and ", indices.numel());
  Tensor gc = g.contiguous();
  call_kernel(op, {"acc", "g", "num_blocks", "k_per_block", "values", "indices"},
              sc_block_topk_accum, dt, acc.data_ptr(), gc.data_ptr(), n, num_blocks, k_per_block,
              clear ? 1 : 0, threads(), values.data_ptr(), indices.data_ptr<int64_t>());
}

int64_t release_caches() { return (int64_t)sc_topk_release_cache(); }

// ------------------------------------------------------------------ COO

std::tuple<Tensor, Tensor> merge_impl(const char* op, const std::vector<Tensor>& idx,
                                      const std::vector<Tensor>& val,
                                      const std::vector<std::string>& inames,
                                      const std::vector<std::string>& vnames, int64_t n) {
  MergeInputs in = merge_inputs(Device::Cpu, op, idx, val, inames, vnames);
  Tensor oi = empty_out(in.total, in.idx[0].options());
  Tensor ov = empty_out(in.total, in.val[0].options());
  int64_t n_out = 0;
  call_kernel(op, {inames.data(), inames.size()}, n, sc_merge_add_many, in.itype, in.vtype,
              (int64_t)in.idx.size(), in.idx_ptr.data(), in.val_ptr.data(), in.lens.data(), n,
              threads(), oi.data_ptr(), ov.data_ptr(), &n_out);
  if (n_out == in.total) return {oi, ov};
  return {oi.narrow(0, 0, n_out), ov.narrow(0, 0, n_out)};
}

std::tuple<Tensor, Tensor> merge_add_cpu(const Tensor& idx_a, const Tensor& val_a,
                                         const Tensor& idx_b, const Tensor& val_b, int64_t n) {
  return merge_impl("sparsecomm.merge_add", {idx_a, idx_b}, {val_a, val_b}, {"idx_a", "idx_b"},
                    {"val_a", "val_b"}, n);
}

std::tuple<Tensor, Tensor> merge_add_many_cpu(at::TensorList indices, at::TensorList values,
                                              int64_t n) {
  auto [inames, vnames] = merge_many_names(indices.size());
  return merge_impl("sparsecomm.merge_add_many", indices.vec(), values.vec(), inames, vnames, n);
}

void scatter_add_cpu(Tensor& dense, const Tensor& idx, const Tensor& val) {
  const char* op = "sparsecomm.scatter_add_";
  auto [vt, it] = check_scatter_args(Device::Cpu, op, dense, idx, val);
  Tensor ic = idx.contiguous(), vc = val.contiguous();
  call_kernel(op, {"dense", "idx", "val"}, dense.numel(), sc_scatter_add, it, vt, dense.data_ptr(),
              dense.numel(), ic.data_ptr(), vc.data_ptr(), ic.numel(), threads());
}

void scatter_set_cpu(Tensor& dense, const Tensor& idx, const Tensor& val, bool zero_rest) {
  const char* op = "sparsecomm.scatter_set_";
  auto [vt, it] = check_scatter_args(Device::Cpu, op, dense, idx, val);
  Tensor ic = idx.contiguous(), vc = val.contiguous();
  call_kernel(op, {"dense", "idx", "val"}, dense.numel(), sc_scatter_set, it, vt, dense.data_ptr(),
              dense.numel(), ic.data_ptr(), vc.data_ptr(), ic.numel(), zero_rest ? 1 : 0, threads());
}

// ------------------------------------------------------------------ checks

// A 0-dim int32 tensor: the SC_NONFINITE_* bits of what x holds (0: all finite).
Tensor nonfinite_flags_cpu(const Tensor& x) {
  const char* op = "sparsecomm.nonfinite_flags";
  sc_dtype dt = value_dtype(x, op, "x");
  Tensor xc = x.contiguous();
  int flags = 0;
  call_kernel(op, {"x"}, sc_nonfinite, dt, xc.data_ptr(), xc.numel(), threads(), &flags);
  return at::scalar_tensor(flags, xc.options().dtype(at::kInt));
}

Tensor gather_cpu(const Tensor& dense, const Tensor& idx) {
  const char* op = "sparsecomm.gather";
  auto [vt, it] = check_gather_args(Device::Cpu, op, dense, idx);
  Tensor dc = dense.contiguous(), ic = idx.contiguous();
  Tensor out = empty_out(ic.numel(), dc.options());
  call_kernel(op, {"dense", "idx"}, dc.numel(), sc_gather, it, vt, dc.data_ptr(), dc.numel(),
              ic.data_ptr(), ic.numel(), threads(), out.data_ptr());
  return out;
}

}  // namespace

TORCH_LIBRARY(sparsecomm, m) {
  m.def("topk(Tensor x, int k) -> (Tensor values, Tensor indices)");
  // same contract as topk, always through the exact radix path (tests, benchmarks)
  m.def("topk_radix(Tensor x, int k) -> (Tensor values, Tensor indices)");
  m.def("block_topk(Tensor x, int num_blocks, int k_per_block) -> (Tensor values, Tensor indices)");
  // acc += g fused with block_topk of the sums (num_blocks = 1: topk); clear zeroes the selection in acc
  m.def("topk_accum_(Tensor(a!) acc, Tensor g, int num_blocks, int k_per_block, bool clear, "
        "Tensor(b!) values, Tensor(c!) indices) -> ()");
  m.def("merge_add(Tensor idx_a, Tensor val_a, Tensor idx_b, Tensor val_b, int n=-1) -> (Tensor indices, Tensor values)");
  m.def("merge_add_many(Tensor[] indices, Tensor[] values, int n=-1) -> (Tensor indices, Tensor values)");
  m.def("scatter_add_(Tensor(a!) dense, Tensor idx, Tensor val) -> ()");
  // dense[idx] = val (repeats: the last wins); zero_rest: every other entry becomes 0
  m.def("scatter_set_(Tensor(a!) dense, Tensor idx, Tensor val, bool zero_rest=False) -> ()");
  m.def("gather(Tensor dense, Tensor idx) -> Tensor");
  // SC_NONFINITE_* bits (1 NaN, 2 +Inf, 4 -Inf) of what x holds, as a 0-dim int32 tensor
  m.def("nonfinite_flags(Tensor x) -> Tensor");
  // frees the top-k candidate cache; returns the bytes released
  m.def("release_caches() -> int", &release_caches);
}

TORCH_LIBRARY_IMPL(sparsecomm, CPU, m) {
  m.impl("topk", &topk_cpu);
  m.impl("topk_radix", &topk_radix_cpu);
  m.impl("block_topk", &block_topk_cpu);
  m.impl("topk_accum_", &topk_accum_cpu);
  m.impl("merge_add", &merge_add_cpu);
  m.impl("merge_add_many", &merge_add_many_cpu);
  m.impl("scatter_add_", &scatter_add_cpu);
  m.impl("scatter_set_", &scatter_set_cpu);
  m.impl("gather", &gather_cpu);
  m.impl("nonfinite_flags", &nonfinite_flags_cpu);
}

// _C.advise_huge(address, nbytes): transparent huge pages for a fresh CPU buffer
// before its first touch (the reducer's result when the caller passes no out=).
static PyObject* py_advise_huge(PyObject*, PyObject* args) {
  unsigned long long addr = 0, nbytes = 0;
  if (!PyArg_ParseTuple(args, "KK", &addr, &nbytes)) return nullptr;
  sparsecomm::advise_huge((uintptr_t)addr, (size_t)nbytes);
  Py_RETURN_NONE;
}

static PyMethodDef kModuleMethods[] = {
    {"advise_huge", py_advise_huge, METH_VARARGS,
     "advise_huge(address, nbytes): ask for transparent huge pages on a fresh buffer"},
    {nullptr, nullptr, 0, nullptr}};

// `import sparsecomm._C` loads this library, which registers the operators
// above with the dispatcher (torch.ops.sparsecomm.*). The module itself holds
// only advise_huge and CUDA_KERNELS.
extern "C" PyObject* PyInit__C(void) {
  static struct PyModuleDef module_def = {
      PyModuleDef_HEAD_INIT, "_C",
      "sparsecomm kernels; use torch.ops.sparsecomm.* or sparsecomm.ops", -1,
      kModuleMethods, nullptr, nullptr, nullptr, nullptr};
  PyObject* m = PyModule_Create(&module_def);
  // whether csrc/cuda's kernels are registered for CUDA tensors (sparsecomm.ops.CUDA_KERNELS)
#ifdef SPARSECOMM_CUDA_KERNELS
  if (m) PyModule_AddIntConstant(m, "CUDA_KERNELS", 1);
#else
  if (m) PyModule_AddIntConstant(m, "CUDA_KERNELS", 0);
#endif
  return m;
}
