// CUDA kernels of the sparsecomm ops (csrc/cuda/*.cu, C ABI in sparsecomm/cuda.h),
// registered for the CUDA dispatch key. Compiled only when the extension is built with
// them (setup.py: torch with CUDA, nvcc, and SPARSECOMM_CUDA_KERNELS=1, which defines
// SPARSECOMM_CUDA_KERNELS); otherwise CUDA tensors run the torch implementations of
// sparsecomm/ops/_torch_impl.py. The bindings mirror the CPU ones (csrc/ops.cpp,
// ops_stream.cpp, ops_sketch.cpp): the same checks and messages, outputs allocated on the
// input's device, one kernel call on the current stream, raise_status.
#ifdef SPARSECOMM_CUDA_KERNELS

#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <string>
#include <tuple>
#include <vector>

#include "checks.h"
#include "sparsecomm/cuda.h"
#include "sparsecomm/kernels.h"
#include "sparsecomm/sketch.h"

namespace {

using at::Tensor;
using namespace sparsecomm;

sc_stream_t stream() { return (sc_stream_t)c10::cuda::getCurrentCUDAStream().stream(); }

void check_cuda(const Tensor& t, const Tensor& first, const char* op, const std::string& name) {
  TORCH_CHECK_VALUE(t.is_cuda() && t.device() == first.device(), op, ": ", name,
                    " must be a CUDA tensor on ", first.device(), ", got device ", t.device());
}

void check_cuda_vector(const Tensor& t, const Tensor& first, const char* op, const std::string& name) {
  check_1d(t, op, name);
  check_cuda(t, first, op, name);
}

// ------------------------------------------------------------------ top-k

std::tuple<Tensor, Tensor> topk_cuda_named(const char* op, const Tensor& x, int64_t k) {
  check_cuda_vector(x, x, op, "x");
  check_nonnegative(k, op, "k");
  sc_dtype dt = value_dtype(x, op, "x");
  c10::cuda::CUDAGuard guard(x.device());
  Tensor xc = x.contiguous();
  int64_t n = xc.numel(), m = k < n ? k : n;
  Tensor vals = at::empty({m}, xc.options());
  Tensor idx = at::empty({m}, xc.options().dtype(at::kLong));
  sc_error_info e{0, 0, 0};
  int st = sc_cuda_topk(dt, xc.data_ptr(), n, k, vals.data_ptr(), idx.data_ptr<int64_t>(), stream(), &e);
  const std::string names[] = {"x"};
  if (st) raise_status(st, op, e, {names, 1});
  return {vals, idx};
}

std::tuple<Tensor, Tensor> topk_cuda(const Tensor& x, int64_t k) {
  return topk_cuda_named("sparsecomm.topk", x, k);
}

std::tuple<Tensor, Tensor> topk_radix_cuda(const Tensor& x, int64_t k) {
  return topk_cuda_named("sparsecomm.topk_radix", x, k);  // the CUDA top-k is always radix select
}

std::tuple<Tensor, Tensor> block_topk_cuda(const Tensor& x, int64_t num_blocks, int64_t k_per_block) {
  const char* op = "sparsecomm.block_topk";
  check_cuda_vector(x, x, op, "x");
  TORCH_CHECK_VALUE(num_blocks >= 1, op, ": num_blocks must be >= 1, got ", num_blocks);
  check_nonnegative(k_per_block, op, "k_per_block");
  sc_dtype dt = value_dtype(x, op, "x");
  c10::cuda::CUDAGuard guard(x.device());
  Tensor xc = x.contiguous();
  int64_t n = xc.numel(), m = sc_block_topk_count(n, num_blocks, k_per_block);
  Tensor vals = at::empty({m}, xc.options());
  Tensor idx = at::empty({m}, xc.options().dtype(at::kLong));
  sc_error_info e{0, 0, 0};
  int st = sc_cuda_block_topk(dt, xc.data_ptr(), n, num_blocks, k_per_block, vals.data_ptr(),
                              idx.data_ptr<int64_t>(), stream(), &e);
  const std::string names[] = {"x"};
  if (st) raise_status(st, op, e, {names, 1});
  return {vals, idx};
}

// ------------------------------------------------------------------ COO

std::tuple<Tensor, Tensor> merge_cuda_impl(const char* op, const std::vector<Tensor>& idx,
                                           const std::vector<Tensor>& val,
                                           const std::vector<std::string>& inames,
                                           const std::vector<std::string>& vnames, int64_t n) {
  TORCH_CHECK_VALUE(!idx.empty(), op, ": needs at least one input vector, got none");
  TORCH_CHECK_VALUE(idx.size() == val.size(), op,
                    ": indices and values must be lists of the same length, got ", idx.size(), " and ",
                    val.size());
  std::vector<Tensor> ic, vc;
  std::vector<const void*> ip, vp;
  std::vector<int64_t> lens;
  int64_t total = 0;
  for (size_t i = 0; i < idx.size(); i++) {
    check_cuda_vector(idx[i], idx[0], op, inames[i]);
    check_cuda_vector(val[i], idx[0], op, vnames[i]);
    index_dtype(idx[i], op, inames[i]);
    value_dtype(val[i], op, vnames[i]);
    if (i > 0) {
      check_same_dtype(idx[0], idx[i], op, inames[0], inames[i]);
      check_same_dtype(val[0], val[i], op, vnames[0], vnames[i]);
    }
    check_same_length(idx[i], val[i], op, inames[i], vnames[i]);
    ic.push_back(idx[i].contiguous());
    vc.push_back(val[i].contiguous());
    ip.push_back(ic.back().data_ptr());
    vp.push_back(vc.back().data_ptr());
    lens.push_back(ic.back().numel());
    total += lens.back();
  }
  c10::cuda::CUDAGuard guard(idx[0].device());
  Tensor oi = at::empty({total}, ic[0].options());
  Tensor ov = at::empty({total}, vc[0].options());
  int64_t n_out = 0;
  sc_error_info e{0, 0, 0};
  int st = sc_cuda_merge_add_many(index_dtype(ic[0], op, inames[0]), value_dtype(vc[0], op, vnames[0]),
                                  (int64_t)ic.size(), ip.data(), vp.data(), lens.data(), n, oi.data_ptr(),
                                  ov.data_ptr(), &n_out, stream(), &e);
  if (st) raise_status(st, op, e, {inames.data(), inames.size()}, n);
  if (n_out == total) return {oi, ov};
  return {oi.narrow(0, 0, n_out), ov.narrow(0, 0, n_out)};
}

std::tuple<Tensor, Tensor> merge_add_cuda(const Tensor& idx_a, const Tensor& val_a, const Tensor& idx_b,
                                          const Tensor& val_b, int64_t n) {
  return merge_cuda_impl("sparsecomm.merge_add", {idx_a, idx_b}, {val_a, val_b}, {"idx_a", "idx_b"},
                         {"val_a", "val_b"}, n);
}

std::tuple<Tensor, Tensor> merge_add_many_cuda(at::TensorList indices, at::TensorList values, int64_t n) {
  std::vector<std::string> inames, vnames;
  for (size_t i = 0; i < indices.size(); i++) {
    inames.push_back("indices[" + std::to_string(i) + "]");
    vnames.push_back("values[" + std::to_string(i) + "]");
  }
  return merge_cuda_impl("sparsecomm.merge_add_many", indices.vec(), values.vec(), inames, vnames, n);
}

void scatter_add_cuda(Tensor& dense, const Tensor& idx, const Tensor& val) {
  const char* op = "sparsecomm.scatter_add_";
  check_cuda_vector(dense, dense, op, "dense");
  check_cuda_vector(idx, dense, op, "idx");
  check_cuda_vector(val, dense, op, "val");
  check_contiguous(dense, op, "dense");
  sc_dtype vt = value_dtype(dense, op, "dense");
  sc_index_t it = index_dtype(idx, op, "idx");
  check_same_dtype(dense, val, op, "dense", "val");
  check_same_length(idx, val, op, "idx", "val");
  c10::cuda::CUDAGuard guard(dense.device());
  Tensor ic = idx.contiguous(), vc = val.contiguous();
  sc_error_info e{0, 0, 0};
  int st = sc_cuda_scatter_add(it, vt, dense.data_ptr(), dense.numel(), ic.data_ptr(), vc.data_ptr(), ic.numel(),
                               stream(), &e);
  const std::string names[] = {"dense", "idx", "val"};
  if (st) raise_status(st, op, e, {names, 3}, dense.numel());
}

Tensor gather_cuda(const Tensor& dense, const Tensor& idx) {
  const char* op = "sparsecomm.gather";
  check_cuda_vector(dense, dense, op, "dense");
  check_cuda_vector(idx, dense, op, "idx");
  sc_dtype vt = value_dtype(dense, op, "dense");
  sc_index_t it = index_dtype(idx, op, "idx");
  c10::cuda::CUDAGuard guard(dense.device());
  Tensor dc = dense.contiguous(), ic = idx.contiguous();
  Tensor out = at::empty({ic.numel()}, dc.options());
  sc_error_info e{0, 0, 0};
  int st = sc_cuda_gather(it, vt, dc.data_ptr(), dc.numel(), ic.data_ptr(), ic.numel(), out.data_ptr(), stream(),
                          &e);
  const std::string names[] = {"dense", "idx"};
  if (st) raise_status(st, op, e, {names, 2}, dc.numel());
  return out;
}

// ------------------------------------------------------------------ streams, QSGD

void add_dd_cuda(Tensor& a, const Tensor& b) {
  const char* op = "sparsecomm.stream_add_dd_";
  check_cuda_vector(a, a, op, "a");
  check_cuda_vector(b, a, op, "b");
  check_contiguous(a, op, "a");
  check_same_length(a, b, op, "a", "b");
  check_same_dtype(a, b, op, "a", "b");
  sc_dtype vt = value_dtype(a, op, "a", Floats::Full);
  c10::cuda::CUDAGuard guard(a.device());
  Tensor bc = b.contiguous();
  sc_error_info e{0, 0, 0};
  int st = sc_cuda_stream_add_dd(vt, a.data_ptr(), bc.data_ptr(), a.numel(), stream(), &e);
  const std::string names[] = {"a", "b"};
  if (st) raise_status(st, op, e, {names, 2});
}

std::tuple<Tensor, Tensor> concat_cuda(const Tensor& ia, const Tensor& va, const Tensor& ib, const Tensor& vb) {
  const char* op = "sparsecomm.stream_concat";
  check_cuda_vector(ia, ia, op, "idx_a");
  check_cuda_vector(va, ia, op, "val_a");
  check_cuda_vector(ib, ia, op, "idx_b");
  check_cuda_vector(vb, ia, op, "val_b");
  check_same_length(ia, va, op, "idx_a", "val_a");
  check_same_length(ib, vb, op, "idx_b", "val_b");
  check_same_dtype(ia, ib, op, "idx_a", "idx_b");
  check_same_dtype(va, vb, op, "val_a", "val_b");
  sc_index_t it = index_dtype(ia, op, "idx_a");
  sc_dtype vt = value_dtype(va, op, "val_a");
  c10::cuda::CUDAGuard guard(ia.device());
  Tensor a = ia.contiguous(), x = va.contiguous(), b = ib.contiguous(), y = vb.contiguous();
  int64_t cap = a.numel() + b.numel();
  Tensor io = at::empty({cap}, a.options()), vo = at::empty({cap}, x.options());
  sc_error_info e{0, 0, 0};
  int st = sc_cuda_stream_concat(it, vt, a.data_ptr(), x.data_ptr(), a.numel(), b.data_ptr(), y.data_ptr(),
                                 b.numel(), io.data_ptr(), vo.data_ptr(), stream(), &e);
  const std::string names[] = {"idx_a", "idx_b"};
  if (st) raise_status(st, op, e, {names, 2});
  return {io, vo};
}

void check_qsgd_options(const char* op, int64_t bits, int64_t bucket) {
  TORCH_CHECK_VALUE(bits == 4 || bits == 8, op, ": bits must be 4 or 8, got ", bits);
  TORCH_CHECK_VALUE(bucket >= 1 && (bits == 8 || bucket % 2 == 0), op,
                    ": bucket_size must be >= 1 (and even for 4 bits), got ", bucket);
}

std::tuple<Tensor, Tensor> qsgd_quantize_cuda(const Tensor& x, int64_t bits, int64_t bucket, int64_t seed) {
  const char* op = "sparsecomm.qsgd_quantize";
  check_cuda_vector(x, x, op, "x");
  check_qsgd_options(op, bits, bucket);
  sc_dtype vt = value_dtype(x, op, "x", Floats::Full);
  c10::cuda::CUDAGuard guard(x.device());
  Tensor xc = x.contiguous();
  int64_t n = xc.numel();
  Tensor packed = at::empty({(n * bits + 7) / 8}, xc.options().dtype(at::kByte));
  Tensor scales = at::empty({(n + bucket - 1) / bucket}, xc.options().dtype(at::kFloat));
  sc_error_info e{0, 0, 0};
  int st = sc_cuda_qsgd_quantize(vt, xc.data_ptr(), n, (int)bits, bucket, (uint64_t)seed, packed.data_ptr<uint8_t>(),
                                 scales.data_ptr<float>(), stream(), &e);
  const std::string names[] = {"x"};
  if (st) raise_status(st, op, e, {names, 1});
  return {packed, scales};
}

Tensor qsgd_dequantize_cuda(const Tensor& packed, const Tensor& scales, int64_t n, int64_t bits, int64_t bucket,
                            at::ScalarType dtype) {
  const char* op = "sparsecomm.qsgd_dequantize";
  check_cuda_vector(packed, packed, op, "packed");
  check_cuda_vector(scales, packed, op, "scales");
  check_qsgd_options(op, bits, bucket);
  check_nonnegative(n, op, "n");
  TORCH_CHECK_TYPE(packed.scalar_type() == at::kByte, op, ": packed must be uint8, got ", packed.scalar_type());
  TORCH_CHECK_TYPE(scales.scalar_type() == at::kFloat, op, ": scales must be float32, got ", scales.scalar_type());
  TORCH_CHECK_VALUE(packed.numel() == (n * bits + 7) / 8, op, ": packed must hold ", (n * bits + 7) / 8,
                    " bytes for n = ", n, ", got ", packed.numel());
  TORCH_CHECK_VALUE(scales.numel() == (n + bucket - 1) / bucket, op, ": scales must hold ",
                    (n + bucket - 1) / bucket, " entries, got ", scales.numel());
  sc_dtype vt = value_dtype(dtype, op, "dtype", Floats::Full);
  c10::cuda::CUDAGuard guard(packed.device());
  Tensor out = at::empty({n}, packed.options().dtype(dtype));
  Tensor p = packed.contiguous(), s = scales.contiguous();
  sc_error_info e{0, 0, 0};
  int st = sc_cuda_qsgd_dequantize(vt, p.data_ptr<uint8_t>(), s.data_ptr<float>(), n, (int)bits, bucket,
                                   out.data_ptr(), stream(), &e);
  const std::string names[] = {"packed", "scales"};
  if (st) raise_status(st, op, e, {names, 2});
  return out;
}

// ------------------------------------------------------------------ Count-Sketch

const std::string kSketchNames[] = {"table", "idx", "val"};

sc_dtype check_table(const Tensor& table, const char* op) {
  TORCH_CHECK_VALUE(table.dim() == 2, op, ": table must be a 2-D (rows x cols) tensor, got shape ", table.sizes());
  check_cuda(table, table, op, "table");
  TORCH_CHECK_VALUE(table.size(0) >= 1 && table.size(0) <= SC_SKETCH_MAX_ROWS, op, ": table must have 1..",
                    SC_SKETCH_MAX_ROWS, " rows, got ", table.size(0));
  TORCH_CHECK_VALUE(table.size(1) >= 1 && table.size(1) <= 0xFFFFFFFFll, op,
                    ": table must have 1..2^32-1 columns, got ", table.size(1));
  return value_dtype(table, op, "table", Floats::Full);
}

Tensor index_vector(const Tensor& idx, const Tensor& table, const char* op) {
  check_cuda_vector(idx, table, op, "idx");
  index_dtype(idx, op, "idx");
  return idx.to(at::kLong).contiguous();
}

void sketch_build_cuda(Tensor& table, const Tensor& x, int64_t seed) {
  const char* op = "sparsecomm.sketch_build_";
  sc_dtype tt = check_table(table, op);
  check_contiguous(table, op, "table");
  check_cuda_vector(x, table, op, "x");
  sc_dtype xt = value_dtype(x, op, "x", Floats::Full);
  c10::cuda::CUDAGuard guard(table.device());
  Tensor xc = x.contiguous();
  sc_error_info e{0, 0, 0};
  int st = sc_cuda_sketch_build_dense(tt, table.data_ptr(), table.size(0), table.size(1), (uint64_t)seed, xt,
                                      xc.data_ptr(), xc.numel(), stream(), &e);
  if (st) raise_status(st, op, e, {kSketchNames, 3});
}

void sketch_build_coo_cuda(Tensor& table, const Tensor& idx, const Tensor& val, int64_t n, int64_t seed) {
  const char* op = "sparsecomm.sketch_build_coo_";
  sc_dtype tt = check_table(table, op);
  check_contiguous(table, op, "table");
  check_nonnegative(n, op, "n");
  check_cuda_vector(val, table, op, "val");
  sc_dtype vt = value_dtype(val, op, "val", Floats::Full);
  c10::cuda::CUDAGuard guard(table.device());
  Tensor ii = index_vector(idx, table, op);
  check_same_length(ii, val, op, "idx", "val");
  Tensor vv = val.contiguous();
  sc_error_info e{0, 0, 0};
  int st = sc_cuda_sketch_build_coo(tt, table.data_ptr(), table.size(0), table.size(1), (uint64_t)seed, n,
                                    ii.data_ptr<int64_t>(), vt, vv.data_ptr(), vv.numel(), stream(), &e);
  if (st) raise_status(st, op, e, {kSketchNames, 3}, n);
}

Tensor sketch_estimate_cuda(const Tensor& table, int64_t n, int64_t seed) {
  const char* op = "sparsecomm.sketch_estimate";
  sc_dtype tt = check_table(table, op);
  check_nonnegative(n, op, "n");
  c10::cuda::CUDAGuard guard(table.device());
  Tensor t = table.contiguous();
  Tensor out = at::empty({n}, t.options());
  sc_error_info e{0, 0, 0};
  int st = sc_cuda_sketch_estimate(tt, t.data_ptr(), t.size(0), t.size(1), (uint64_t)seed, nullptr, n,
                                   out.data_ptr(), stream(), &e);
  if (st) raise_status(st, op, e, {kSketchNames, 3});
  return out;
}

Tensor sketch_estimate_at_cuda(const Tensor& table, const Tensor& idx, int64_t seed) {
  const char* op = "sparsecomm.sketch_estimate_at";
  sc_dtype tt = check_table(table, op);
  c10::cuda::CUDAGuard guard(table.device());
  Tensor ii = index_vector(idx, table, op);
  Tensor t = table.contiguous();
  Tensor out = at::empty({ii.numel()}, t.options());
  sc_error_info e{0, 0, 0};
  int st = sc_cuda_sketch_estimate(tt, t.data_ptr(), t.size(0), t.size(1), (uint64_t)seed,
                                   ii.data_ptr<int64_t>(), ii.numel(), out.data_ptr(), stream(), &e);
  if (st) raise_status(st, op, e, {kSketchNames, 3});
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(sparsecomm, CUDA, m) {
  m.impl("topk", &topk_cuda);
  m.impl("topk_radix", &topk_radix_cuda);
  m.impl("block_topk", &block_topk_cuda);
  m.impl("merge_add", &merge_add_cuda);
  m.impl("merge_add_many", &merge_add_many_cuda);
  m.impl("scatter_add_", &scatter_add_cuda);
  m.impl("gather", &gather_cuda);
  m.impl("stream_add_dd_", &add_dd_cuda);
  m.impl("stream_concat", &concat_cuda);
  m.impl("qsgd_quantize", &qsgd_quantize_cuda);
  m.impl("qsgd_dequantize", &qsgd_dequantize_cuda);
  m.impl("sketch_build_", &sketch_build_cuda);
  m.impl("sketch_build_coo_", &sketch_build_coo_cuda);
  m.impl("sketch_estimate", &sketch_estimate_cuda);
  m.impl("sketch_estimate_at", &sketch_estimate_at_cuda);
}

#endif  // SPARSECOMM_CUDA_KERNELS
