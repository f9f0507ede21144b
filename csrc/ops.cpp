// sparsecomm operator library: schemas, argument checks, CPU implementations.
//
// This layer only checks arguments, dispatches dtypes and calls the C kernels
// of csrc/cpu (C ABI in csrc/include/sparsecomm/kernels.h). Errors a user can
// cause raise ValueError (bad value / shape / order / range) or TypeError
// (bad dtype) in Python, with a message naming the argument, what was
// expected and what was given.
#include <Python.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <cstdint>
#include <string>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "sparsecomm/kernels.h"

namespace {

using at::Tensor;

sc_dtype value_dtype(const Tensor& t, const char* op, const std::string& name) {
  switch (t.scalar_type()) {
    case at::kFloat: return SC_F32;
    case at::kDouble: return SC_F64;
    case at::kHalf: return SC_F16;
    case at::kBFloat16: return SC_BF16;
    default: break;
  }
  TORCH_CHECK_TYPE(false, op, ": ", name,
                   " must be float32, float64, float16 or bfloat16, got ",
                   t.scalar_type());
}

sc_index_t index_dtype(const Tensor& t, const char* op, const std::string& name) {
  if (t.scalar_type() == at::kInt) return SC_I32;
  if (t.scalar_type() == at::kLong) return SC_I64;
  TORCH_CHECK_TYPE(false, op, ": ", name, " must be int32 or int64, got ",
                   t.scalar_type());
}

void check_1d(const Tensor& t, const char* op, const std::string& name) {
  TORCH_CHECK_VALUE(t.dim() == 1, op, ": ", name,
                    " must be a 1-D tensor, got a ", t.dim(),
                    "-D tensor of shape ", t.sizes());
}

void check_cpu(const Tensor& t, const char* op, const std::string& name) {
  TORCH_CHECK_VALUE(t.device().is_cpu(), op, ": ", name,
                    " must be a CPU tensor for this kernel, got device ",
                    t.device());
}

int threads() { return at::get_num_threads(); }

// Large outputs are fresh allocations that the kernel then writes once: on
// Linux, ask for transparent huge pages before the first touch. Faulting in
// 4 KiB pages (one fault + zeroing each) was ~40% of topk's time at 10%
// density for N = 100M (120 MB of output); with 2 MiB pages it is a few %.
// A hint only: ignored where THP is off.
void advise_huge(const Tensor& t) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  const uintptr_t huge = (uintptr_t)2 << 20;
  size_t bytes = (size_t)t.numel() * t.element_size();
  if (bytes < 2 * huge) return;
  uintptr_t lo = ((uintptr_t)t.data_ptr() + huge - 1) & ~(huge - 1);
  uintptr_t hi = ((uintptr_t)t.data_ptr() + bytes) & ~(huge - 1);
  if (hi > lo) (void)madvise((void*)lo, hi - lo, MADV_HUGEPAGE);
#else
  (void)t;
#endif
}

// at::empty + advise_huge
Tensor empty_out(int64_t n, const at::TensorOptions& opt) {
  Tensor t = at::empty({n}, opt);
  advise_huge(t);
  return t;
}

[[noreturn]] void raise_status(int st, const char* op) {
  if (st == SC_ERR_NAN)
    TORCH_CHECK_VALUE(false, op,
                      ": input contains NaN; top-k by magnitude is undefined "
                      "for NaN (clean or mask the tensor first)");
  if (st == SC_ERR_NOMEM) TORCH_CHECK(false, op, ": out of memory");
  TORCH_CHECK(false, op, ": internal error (status ", st, ")");
}

void raise_index(int st, const char* op, const std::string& name,
                 const sc_error_info& e, int64_t limit) {
  if (st == SC_ERR_INDEX_ORDER)
    TORCH_CHECK_VALUE(false, op, ": ", name,
                      " must be strictly ascending (sorted, no duplicates), "
                      "but ", name, "[", e.position, "] = ", e.value,
                      " is not greater than ", name, "[", e.position - 1, "]");
  if (st == SC_ERR_INDEX_RANGE) {
    if (e.value < 0)
      TORCH_CHECK_VALUE(false, op, ": ", name, " must hold indices >= 0, but ",
                        name, "[", e.position, "] = ", e.value);
    TORCH_CHECK_VALUE(false, op, ": ", name, " must hold indices < ", limit,
                      ", but ", name, "[", e.position, "] = ", e.value);
  }
  raise_status(st, op);
}

// ------------------------------------------------------------------ top-k

std::tuple<Tensor, Tensor> topk_cpu(const Tensor& x, int64_t k) {
  const char* op = "sparsecomm.topk";
  check_1d(x, op, "x");
  check_cpu(x, op, "x");
  TORCH_CHECK_VALUE(k >= 0, op, ": k must be >= 0, got ", k);
  sc_dtype dt = value_dtype(x, op, "x");
  Tensor xc = x.contiguous();
  int64_t n = xc.numel();
  int64_t m = k < n ? k : n;
  Tensor vals = empty_out(m, xc.options());
  Tensor idx = empty_out(m, xc.options().dtype(at::kLong));
  int st = sc_topk(dt, xc.data_ptr(), n, k, threads(), vals.data_ptr(),
                   idx.data_ptr<int64_t>());
  if (st) raise_status(st, op);
  return {vals, idx};
}

std::tuple<Tensor, Tensor> block_topk_cpu(const Tensor& x, int64_t num_blocks,
                                          int64_t k_per_block) {
  const char* op = "sparsecomm.block_topk";
  check_1d(x, op, "x");
  check_cpu(x, op, "x");
  TORCH_CHECK_VALUE(num_blocks >= 1, op, ": num_blocks must be >= 1, got ",
                    num_blocks);
  TORCH_CHECK_VALUE(k_per_block >= 0, op, ": k_per_block must be >= 0, got ",
                    k_per_block);
  sc_dtype dt = value_dtype(x, op, "x");
  Tensor xc = x.contiguous();
  int64_t n = xc.numel();
  int64_t m = sc_block_topk_count(n, num_blocks, k_per_block);
  Tensor vals = empty_out(m, xc.options());
  Tensor idx = empty_out(m, xc.options().dtype(at::kLong));
  int st = sc_block_topk(dt, xc.data_ptr(), n, num_blocks, k_per_block,
                         threads(), vals.data_ptr(), idx.data_ptr<int64_t>());
  if (st) raise_status(st, op);
  return {vals, idx};
}

// ------------------------------------------------------------------ COO

struct CooIn {
  std::vector<Tensor> idx, val;
  sc_index_t itype;
  sc_dtype vtype;
};

// Checks a list of COO vectors (names idx_names[i] / val_names[i]).
CooIn check_coo(const char* op, const std::vector<Tensor>& idx,
                const std::vector<Tensor>& val,
                const std::vector<std::string>& idx_names,
                const std::vector<std::string>& val_names, int64_t limit) {
  CooIn in;
  TORCH_CHECK_VALUE(!idx.empty(), op, ": needs at least one input vector, got none");
  TORCH_CHECK_VALUE(idx.size() == val.size(), op,
                    ": indices and values must be lists of the same length, got ",
                    idx.size(), " and ", val.size());
  for (size_t i = 0; i < idx.size(); i++) {
    check_1d(idx[i], op, idx_names[i]);
    check_1d(val[i], op, val_names[i]);
    check_cpu(idx[i], op, idx_names[i]);
    check_cpu(val[i], op, val_names[i]);
    sc_index_t it = index_dtype(idx[i], op, idx_names[i]);
    sc_dtype vt = value_dtype(val[i], op, val_names[i]);
    if (i == 0) {
      in.itype = it;
      in.vtype = vt;
    } else {
      TORCH_CHECK_TYPE(idx[i].scalar_type() == idx[0].scalar_type(), op,
                       ": all index vectors must share one dtype, but ",
                       idx_names[0], " is ", idx[0].scalar_type(), " and ",
                       idx_names[i], " is ", idx[i].scalar_type());
      TORCH_CHECK_TYPE(val[i].scalar_type() == val[0].scalar_type(), op,
                       ": all value vectors must share one dtype, but ",
                       val_names[0], " is ", val[0].scalar_type(), " and ",
                       val_names[i], " is ", val[i].scalar_type());
    }
    TORCH_CHECK_VALUE(idx[i].numel() == val[i].numel(), op, ": ", idx_names[i],
                      " and ", val_names[i], " must have the same length, got ",
                      idx[i].numel(), " and ", val[i].numel());
    Tensor ic = idx[i].contiguous();
    sc_error_info e{0, 0, 0};
    int st = sc_check_sorted_indices(it, ic.data_ptr(), ic.numel(), limit,
                                     threads(), &e);
    if (st) raise_index(st, op, idx_names[i], e, limit);
    in.idx.push_back(ic);
    in.val.push_back(val[i].contiguous());
  }
  return in;
}

std::tuple<Tensor, Tensor> merge_many_impl(const char* op, const CooIn& in) {
  int64_t p = (int64_t)in.idx.size();
  std::vector<const void*> ip(p), vp(p);
  std::vector<int64_t> lens(p);
  int64_t total = 0;
  for (int64_t i = 0; i < p; i++) {
    ip[i] = in.idx[i].data_ptr();
    vp[i] = in.val[i].data_ptr();
    lens[i] = in.idx[i].numel();
    total += lens[i];
  }
  Tensor oi = empty_out(total, in.idx[0].options());
  Tensor ov = empty_out(total, in.val[0].options());
  int64_t n_out = 0;
  int st = sc_merge_add_many(in.itype, in.vtype, p, ip.data(), vp.data(),
                             lens.data(), threads(), oi.data_ptr(),
                             ov.data_ptr(), &n_out);
  if (st) raise_status(st, op);
  if (n_out == total) return {oi, ov};
  return {oi.narrow(0, 0, n_out), ov.narrow(0, 0, n_out)};
}

std::tuple<Tensor, Tensor> merge_add_cpu(const Tensor& idx_a, const Tensor& val_a,
                                         const Tensor& idx_b, const Tensor& val_b,
                                         int64_t n) {
  const char* op = "sparsecomm.merge_add";
  CooIn in = check_coo(op, {idx_a, idx_b}, {val_a, val_b}, {"idx_a", "idx_b"},
                       {"val_a", "val_b"}, n);
  return merge_many_impl(op, in);
}

std::tuple<Tensor, Tensor> merge_add_many_cpu(at::TensorList indices,
                                              at::TensorList values, int64_t n) {
  const char* op = "sparsecomm.merge_add_many";
  std::vector<std::string> in_names, vn_names;
  for (size_t i = 0; i < indices.size(); i++)
    in_names.push_back("indices[" + std::to_string(i) + "]");
  for (size_t i = 0; i < values.size(); i++)
    vn_names.push_back("values[" + std::to_string(i) + "]");
  while (vn_names.size() < in_names.size()) vn_names.push_back("values[?]");
  while (in_names.size() < vn_names.size()) in_names.push_back("indices[?]");
  CooIn in = check_coo(op, indices.vec(), values.vec(), in_names, vn_names, n);
  return merge_many_impl(op, in);
}

Tensor& scatter_add_cpu(Tensor& dense, const Tensor& idx, const Tensor& val) {
  const char* op = "sparsecomm.scatter_add_";
  check_1d(dense, op, "dense");
  check_1d(idx, op, "idx");
  check_1d(val, op, "val");
  check_cpu(dense, op, "dense");
  check_cpu(idx, op, "idx");
  check_cpu(val, op, "val");
  TORCH_CHECK_VALUE(dense.is_contiguous(), op,
                    ": dense must be contiguous (it is updated in place)");
  sc_dtype vt = value_dtype(dense, op, "dense");
  sc_index_t it = index_dtype(idx, op, "idx");
  TORCH_CHECK_TYPE(val.scalar_type() == dense.scalar_type(), op,
                   ": val must have the dtype of dense (", dense.scalar_type(),
                   "), got ", val.scalar_type());
  TORCH_CHECK_VALUE(idx.numel() == val.numel(), op,
                    ": idx and val must have the same length, got ",
                    idx.numel(), " and ", val.numel());
  Tensor ic = idx.contiguous(), vc = val.contiguous();
  sc_error_info e{0, 0, 0};
  int st = sc_scatter_add(it, vt, dense.data_ptr(), dense.numel(), ic.data_ptr(),
                          vc.data_ptr(), ic.numel(), threads(), &e);
  if (st) raise_index(st, op, "idx", e, dense.numel());
  return dense;
}

Tensor gather_cpu(const Tensor& dense, const Tensor& idx) {
  const char* op = "sparsecomm.gather";
  check_1d(dense, op, "dense");
  check_1d(idx, op, "idx");
  check_cpu(dense, op, "dense");
  check_cpu(idx, op, "idx");
  sc_dtype vt = value_dtype(dense, op, "dense");
  sc_index_t it = index_dtype(idx, op, "idx");
  Tensor dc = dense.contiguous(), ic = idx.contiguous();
  Tensor out = empty_out(ic.numel(), dc.options());
  sc_error_info e{0, 0, 0};
  int st = sc_gather(it, vt, dc.data_ptr(), dc.numel(), ic.data_ptr(),
                     ic.numel(), threads(), out.data_ptr(), &e);
  if (st) raise_index(st, op, "idx", e, dc.numel());
  return out;
}

void set_topk_path(int64_t mode) {
  TORCH_CHECK_VALUE(mode == 0 || mode == 1,
                    "sparsecomm._set_topk_path: mode must be 0 or 1, got ", mode);
  sc_topk_set_path((int)mode);
}

}  // namespace

TORCH_LIBRARY(sparsecomm, m) {
  m.def("topk(Tensor x, int k) -> (Tensor values, Tensor indices)");
  m.def("block_topk(Tensor x, int num_blocks, int k_per_block) -> (Tensor values, Tensor indices)");
  m.def("merge_add(Tensor idx_a, Tensor val_a, Tensor idx_b, Tensor val_b, int n=-1) -> (Tensor indices, Tensor values)");
  m.def("merge_add_many(Tensor[] indices, Tensor[] values, int n=-1) -> (Tensor indices, Tensor values)");
  m.def("scatter_add_(Tensor(a!) dense, Tensor idx, Tensor val) -> Tensor(a!)");
  m.def("gather(Tensor dense, Tensor idx) -> Tensor");
  // testing hook: 1 forces the exact radix top-k path, 0 restores automatic
  m.def("_set_topk_path(int mode) -> ()", &set_topk_path);
}

TORCH_LIBRARY_IMPL(sparsecomm, CPU, m) {
  m.impl("topk", &topk_cpu);
  m.impl("block_topk", &block_topk_cpu);
  m.impl("merge_add", &merge_add_cpu);
  m.impl("merge_add_many", &merge_add_many_cpu);
  m.impl("scatter_add_", &scatter_add_cpu);
  m.impl("gather", &gather_cpu);
}

// `import sparsecomm._C` loads this library, which registers the operators
// above with the dispatcher (torch.ops.sparsecomm.*). The module itself is
// empty.
extern "C" PyObject* PyInit__C(void) {
  static struct PyModuleDef module_def = {
      PyModuleDef_HEAD_INIT, "_C",
      "sparsecomm kernels; use torch.ops.sparsecomm.* or sparsecomm.ops", -1,
      nullptr, nullptr, nullptr, nullptr, nullptr};
  return PyModule_Create(&module_def);
}
