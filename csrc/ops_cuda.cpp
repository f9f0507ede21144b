// CUDA kernels of the sparsecomm ops (csrc/cuda/*.cu, C ABI in sparsecomm/cuda.h),
// registered for the CUDA dispatch key. Compiled only when the extension is built with
// them (setup.py: torch with CUDA, nvcc, and SPARSECOMM_CUDA_KERNELS=1, which defines
// SPARSECOMM_CUDA_KERNELS); otherwise CUDA tensors run the torch implementations of
// sparsecomm/ops/_torch_impl/. The bindings mirror the CPU ones (csrc/ops.cpp,
// ops_stream.cpp, ops_sketch.cpp, ops_zen.cpp): the same checks and messages (csrc/op_checks.h), outputs
// allocated on the input's device, one kernel call on the current stream (call_kernel).
#ifdef SPARSECOMM_CUDA_KERNELS

#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <string>
#include <tuple>
#include <vector>

#include "checks.h"
#include "op_checks.h"
#include "sparsecomm/cuda.h"
#include "sparsecomm/kernels.h"
#include "sparsecomm/sketch.h"
#include "sparsecomm/zen.h"

namespace {

using at::Tensor;
using namespace sparsecomm;

sc_stream_t stream() { return (sc_stream_t)c10::cuda::getCurrentCUDAStream().stream(); }

// ------------------------------------------------------------------ top-k

std::tuple<Tensor, Tensor> topk_cuda_named(const char* op, const Tensor& x, int64_t k) {
  sc_dtype dt = check_topk_args(Device::Cuda, op, x, k);
  c10::cuda::CUDAGuard guard(x.device());
  Tensor xc = x.contiguous();
  int64_t n = xc.numel(), m = k < n ? k : n;
  Tensor vals = at::empty({m}, xc.options());
  Tensor idx = at::empty({m}, xc.options().dtype(at::kLong));
  call_kernel(op, {"x"}, sc_cuda_topk, dt, xc.data_ptr(), n, k, vals.data_ptr(), idx.data_ptr<int64_t>(),
              stream());
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
  sc_dtype dt = check_block_topk_args(Device::Cuda, op, x, num_blocks, k_per_block);
  c10::cuda::CUDAGuard guard(x.device());
  Tensor xc = x.contiguous();
  int64_t n = xc.numel(), m = sc_block_topk_count(n, num_blocks, k_per_block);
  Tensor vals = at::empty({m}, xc.options());
  Tensor idx = at::empty({m}, xc.options().dtype(at::kLong));
  call_kernel(op, {"x"}, sc_cuda_block_topk, dt, xc.data_ptr(), n, num_blocks, k_per_block, vals.data_ptr(),
              idx.data_ptr<int64_t>(), stream());
  return {vals, idx};
}

// ------------------------------------------------------------------ COO

std::tuple<Tensor, Tensor> merge_cuda_impl(const char* op, const std::vector<Tensor>& idx,
                                           const std::vector<Tensor>& val,
                                           const std::vector<std::string>& inames,
                                           const std::vector<std::string>& vnames, int64_t n) {
  MergeInputs in = merge_inputs(Device::Cuda, op, idx, val, inames, vnames);
  c10::cuda::CUDAGuard guard(idx[0].device());
  Tensor oi = at::empty({in.total}, in.idx[0].options());
  Tensor ov = at::empty({in.total}, in.val[0].options());
  int64_t n_out = 0;
  call_kernel(op, {inames.data(), inames.size()}, n, sc_cuda_merge_add_many, in.itype, in.vtype,
              (int64_t)in.idx.size(), in.idx_ptr.data(), in.val_ptr.data(), in.lens.data(), n, oi.data_ptr(),
              ov.data_ptr(), &n_out, stream());
  if (n_out == in.total) return {oi, ov};
  return {oi.narrow(0, 0, n_out), ov.narrow(0, 0, n_out)};
}

std::tuple<Tensor, Tensor> merge_add_cuda(const Tensor& idx_a, const Tensor& val_a, const Tensor& idx_b,
                                          const Tensor& val_b, int64_t n) {
  return merge_cuda_impl("sparsecomm.merge_add", {idx_a, idx_b}, {val_a, val_b}, {"idx_a", "idx_b"},
                         {"val_a", "val_b"}, n);
}

std::tuple<Tensor, Tensor> merge_add_many_cuda(at::TensorList indices, at::TensorList values, int64_t n) {
  auto [inames, vnames] = merge_many_names(indices.size());
  return merge_cuda_impl("sparsecomm.merge_add_many", indices.vec(), values.vec(), inames, vnames, n);
}

void scatter_add_cuda(Tensor& dense, const Tensor& idx, const Tensor& val) {
  const char* op = "sparsecomm.scatter_add_";
  auto [vt, it] = check_scatter_args(Device::Cuda, op, dense, idx, val);
  c10::cuda::CUDAGuard guard(dense.device());
  Tensor ic = idx.contiguous(), vc = val.contiguous();
  call_kernel(op, {"dense", "idx", "val"}, dense.numel(), sc_cuda_scatter_add, it, vt, dense.data_ptr(),
              dense.numel(), ic.data_ptr(), vc.data_ptr(), ic.numel(), stream());
}

Tensor gather_cuda(const Tensor& dense, const Tensor& idx) {
  const char* op = "sparsecomm.gather";
  auto [vt, it] = check_gather_args(Device::Cuda, op, dense, idx);
  c10::cuda::CUDAGuard guard(dense.device());
  Tensor dc = dense.contiguous(), ic = idx.contiguous();
  Tensor out = at::empty({ic.numel()}, dc.options());
  call_kernel(op, {"dense", "idx"}, dc.numel(), sc_cuda_gather, it, vt, dc.data_ptr(), dc.numel(), ic.data_ptr(),
              ic.numel(), out.data_ptr(), stream());
  return out;
}

// ------------------------------------------------------------------ streams, QSGD

void add_dd_cuda(Tensor& a, const Tensor& b) {
  const char* op = "sparsecomm.stream_add_dd_";
  sc_dtype vt = check_add_dd_args(Device::Cuda, op, a, b);
  c10::cuda::CUDAGuard guard(a.device());
  Tensor bc = b.contiguous();
  call_kernel(op, {"a", "b"}, sc_cuda_stream_add_dd, vt, a.data_ptr(), bc.data_ptr(), a.numel(), stream());
}

std::tuple<Tensor, Tensor> concat_cuda(const Tensor& ia, const Tensor& va, const Tensor& ib, const Tensor& vb) {
  const char* op = "sparsecomm.stream_concat";
  auto [it, vt] = check_concat_args(Device::Cuda, op, ia, va, ib, vb);
  c10::cuda::CUDAGuard guard(ia.device());
  Tensor a = ia.contiguous(), x = va.contiguous(), b = ib.contiguous(), y = vb.contiguous();
  int64_t cap = a.numel() + b.numel();
  Tensor io = at::empty({cap}, a.options()), vo = at::empty({cap}, x.options());
  call_kernel(op, {"idx_a", "idx_b"}, sc_cuda_stream_concat, it, vt, a.data_ptr(), x.data_ptr(), a.numel(),
              b.data_ptr(), y.data_ptr(), b.numel(), io.data_ptr(), vo.data_ptr(), stream());
  return {io, vo};
}

std::tuple<Tensor, Tensor> qsgd_quantize_cuda(const Tensor& x, int64_t bits, int64_t bucket, int64_t seed) {
  const char* op = "sparsecomm.qsgd_quantize";
  sc_dtype vt = check_qsgd_quantize_args(Device::Cuda, op, x, bits, bucket);
  c10::cuda::CUDAGuard guard(x.device());
  Tensor xc = x.contiguous();
  int64_t n = xc.numel();
  Tensor packed = at::empty({qsgd_packed_bytes(n, bits)}, xc.options().dtype(at::kByte));
  Tensor scales = at::empty({qsgd_scale_count(n, bucket)}, xc.options().dtype(at::kFloat));
  call_kernel(op, {"x"}, sc_cuda_qsgd_quantize, vt, xc.data_ptr(), n, (int)bits, bucket, (uint64_t)seed,
              packed.data_ptr<uint8_t>(), scales.data_ptr<float>(), stream());
  return {packed, scales};
}

Tensor qsgd_dequantize_cuda(const Tensor& packed, const Tensor& scales, int64_t n, int64_t bits, int64_t bucket,
                            at::ScalarType dtype) {
  const char* op = "sparsecomm.qsgd_dequantize";
  sc_dtype vt = check_qsgd_dequantize_args(Device::Cuda, op, packed, scales, n, bits, bucket, dtype);
  c10::cuda::CUDAGuard guard(packed.device());
  Tensor out = at::empty({n}, packed.options().dtype(dtype));
  Tensor p = packed.contiguous(), s = scales.contiguous();
  call_kernel(op, {"packed", "scales"}, sc_cuda_qsgd_dequantize, vt, p.data_ptr<uint8_t>(), s.data_ptr<float>(), n,
              (int)bits, bucket, out.data_ptr(), stream());
  return out;
}

// ------------------------------------------------------------------ Count-Sketch

void sketch_build_cuda(Tensor& table, const Tensor& x, int64_t seed) {
  const char* op = "sparsecomm.sketch_build_";
  sc_dtype tt = check_sketch_table(Device::Cuda, table, op);
  check_contiguous(table, op, "table");
  Placement(Device::Cuda, table).check_vector(x, op, "x");
  sc_dtype xt = value_dtype(x, op, "x", Floats::Full);
  c10::cuda::CUDAGuard guard(table.device());
  Tensor xc = x.contiguous();
  call_kernel(op, {kSketchNames, 3}, sc_cuda_sketch_build_dense, tt, table.data_ptr(), table.size(0), table.size(1),
              (uint64_t)seed, xt, xc.data_ptr(), xc.numel(), stream());
}

void sketch_build_coo_cuda(Tensor& table, const Tensor& idx, const Tensor& val, int64_t n, int64_t seed) {
  const char* op = "sparsecomm.sketch_build_coo_";
  sc_dtype tt = check_sketch_table(Device::Cuda, table, op);
  check_contiguous(table, op, "table");
  check_nonnegative(n, op, "n");
  Placement(Device::Cuda, table).check_vector(val, op, "val");
  sc_dtype vt = value_dtype(val, op, "val", Floats::Full);
  c10::cuda::CUDAGuard guard(table.device());
  Tensor ii = sketch_indices(Device::Cuda, idx, table, op);
  check_same_length(ii, val, op, "idx", "val");
  Tensor vv = val.contiguous();
  call_kernel(op, {kSketchNames, 3}, n, sc_cuda_sketch_build_coo, tt, table.data_ptr(), table.size(0),
              table.size(1), (uint64_t)seed, n, ii.data_ptr<int64_t>(), vt, vv.data_ptr(), vv.numel(), stream());
}

Tensor sketch_estimate_cuda(const Tensor& table, int64_t n, int64_t seed) {
  const char* op = "sparsecomm.sketch_estimate";
  sc_dtype tt = check_sketch_table(Device::Cuda, table, op);
  check_nonnegative(n, op, "n");
  c10::cuda::CUDAGuard guard(table.device());
  Tensor t = table.contiguous();
  Tensor out = at::empty({n}, t.options());
  call_kernel(op, {kSketchNames, 3}, sc_cuda_sketch_estimate, tt, t.data_ptr(), t.size(0), t.size(1),
              (uint64_t)seed, nullptr, n, out.data_ptr(), stream());
  return out;
}

Tensor sketch_estimate_at_cuda(const Tensor& table, const Tensor& idx, int64_t seed) {
  const char* op = "sparsecomm.sketch_estimate_at";
  sc_dtype tt = check_sketch_table(Device::Cuda, table, op);
  c10::cuda::CUDAGuard guard(table.device());
  Tensor ii = sketch_indices(Device::Cuda, idx, table, op);
  Tensor t = table.contiguous();
  Tensor out = at::empty({ii.numel()}, t.options());
  call_kernel(op, {kSketchNames, 3}, sc_cuda_sketch_estimate, tt, t.data_ptr(), t.size(0), t.size(1),
              (uint64_t)seed, ii.data_ptr<int64_t>(), ii.numel(), out.data_ptr(), stream());
  return out;
}

// ------------------------------------------------------------------ ZEN

std::tuple<Tensor, Tensor, Tensor> zen_partition_cuda(const Tensor& idx, const Tensor& val, int64_t n, int64_t parts,
                                                      int64_t seed, int64_t block) {
  const char* op = "sparsecomm.zen_partition";
  sc_dtype vt = check_zen_partition_args(Device::Cuda, op, idx, val, n, parts, block);
  c10::cuda::CUDAGuard guard(idx.device());
  Tensor ic = idx.contiguous(), vc = val.contiguous();
  Tensor oi = at::empty({ic.numel()}, ic.options());
  Tensor ov = at::empty({vc.numel()}, vc.options());
  Tensor counts = at::empty({parts}, ic.options());
  call_kernel(op, {kZenPartitionNames, 6}, n, sc_cuda_zen_partition, vt, ic.data_ptr<int64_t>(), vc.data_ptr(),
              ic.numel(), n, parts, (uint64_t)seed, block, oi.data_ptr<int64_t>(), ov.data_ptr(),
              counts.data_ptr<int64_t>(), stream());
  return {oi, ov, counts};
}

Tensor zen_bitmap_encode_cuda(const Tensor& idx, int64_t n, int64_t parts, int64_t seed, int64_t block,
                              int64_t owner) {
  const char* op = "sparsecomm.zen_bitmap_encode";
  check_zen_indices(Device::Cuda, op, idx);
  check_zen_class_args(op, n, parts, block, owner);
  c10::cuda::CUDAGuard guard(idx.device());
  Tensor ic = idx.contiguous();
  int64_t size = 0;
  call_kernel(op, {kZenBitmapNames, 6}, sc_cuda_zen_class_size, n, parts, (uint64_t)seed, block, owner, &size,
              stream());
  const int64_t nbytes = (size + 7) / 8;
  Tensor bitmap = at::empty({nbytes}, ic.options().dtype(at::kByte));
  call_kernel(op, {kZenBitmapNames, 6}, n, zen_encode_words(op, owner), sc_cuda_zen_bitmap_encode,
              ic.data_ptr<int64_t>(), ic.numel(), n, parts, (uint64_t)seed, block, owner,
              bitmap.data_ptr<uint8_t>(), nbytes, stream());
  return bitmap;
}

Tensor zen_bitmap_decode_cuda(const Tensor& bitmap, int64_t n, int64_t parts, int64_t seed, int64_t block,
                              int64_t owner) {
  const char* op = "sparsecomm.zen_bitmap_decode";
  check_zen_bitmap(Device::Cuda, op, bitmap);
  check_zen_class_args(op, n, parts, block, owner);
  c10::cuda::CUDAGuard guard(bitmap.device());
  Tensor bc = bitmap.contiguous();
  int64_t count = 0;
  call_kernel(op, {kZenDecodeNames, 6}, sc_cuda_zen_bitmap_decode, bc.data_ptr<uint8_t>(), bc.numel(), n, parts,
              (uint64_t)seed, block, owner, nullptr, 0, &count, stream());
  Tensor out = at::empty({count}, bc.options().dtype(at::kLong));
  call_kernel(op, {kZenDecodeNames, 6}, sc_cuda_zen_bitmap_decode, bc.data_ptr<uint8_t>(), bc.numel(), n, parts,
              (uint64_t)seed, block, owner, out.data_ptr<int64_t>(), count, &count, stream());
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
  m.impl("zen_partition", &zen_partition_cuda);
  m.impl("zen_bitmap_encode", &zen_bitmap_encode_cuda);
  m.impl("zen_bitmap_decode", &zen_bitmap_decode_cuda);
}

#endif  // SPARSECOMM_CUDA_KERNELS
