// Sparse-stream and QSGD ops (SparCML, sections 3 and 5): bindings of
// csrc/cpu/stream.c (C ABI in csrc/include/sparsecomm/stream.h), written like
// every binding: checks from csrc/op_checks.h (shared with the CUDA bindings),
// one kernel call through call_kernel.
// The stream's sparse + sparse and sparse + dense cases are merge_add and
// scatter_add_ (csrc/ops.cpp).
#include <torch/library.h>

#include <string>
#include <tuple>

#include "checks.h"
#include "op_checks.h"
#include "sparsecomm/kernels.h"
#include "sparsecomm/stream.h"

namespace {

using at::Tensor;
using namespace sparsecomm;

void add_dd_cpu(Tensor& a, const Tensor& b) {
  const char* op = "sparsecomm.stream_add_dd_";
  sc_dtype vt = check_add_dd_args(Device::Cpu, op, a, b);
  Tensor bc = b.contiguous();
  call_kernel(op, {"a", "b"}, sc_stream_add_dd, vt, a.data_ptr(), bc.data_ptr(), a.numel(),
              threads());
}

std::tuple<Tensor, Tensor> concat_cpu(const Tensor& ia, const Tensor& va, const Tensor& ib,
                                      const Tensor& vb) {
  const char* op = "sparsecomm.stream_concat";
  auto [it, vt] = check_concat_args(Device::Cpu, op, ia, va, ib, vb);
  Tensor a = ia.contiguous(), x = va.contiguous(), b = ib.contiguous(), y = vb.contiguous();
  int64_t cap = a.numel() + b.numel();
  Tensor io = empty_out(cap, a.options()), vo = empty_out(cap, x.options());
  call_kernel(op, {"idx_a", "idx_b"}, sc_stream_concat, it, vt, a.data_ptr(), x.data_ptr(),
              a.numel(), b.data_ptr(), y.data_ptr(), b.numel(), threads(), io.data_ptr(),
              vo.data_ptr());
  return {io, vo};
}

std::tuple<Tensor, Tensor> qsgd_quantize_cpu(const Tensor& x, int64_t bits, int64_t bucket,
                                             int64_t seed) {
  const char* op = "sparsecomm.qsgd_quantize";
  sc_dtype vt = check_qsgd_quantize_args(Device::Cpu, op, x, bits, bucket);
  Tensor xc = x.contiguous();
  int64_t n = xc.numel();
  Tensor packed = at::empty({qsgd_packed_bytes(n, bits)}, xc.options().dtype(at::kByte));
  Tensor scales = at::empty({qsgd_scale_count(n, bucket)}, xc.options().dtype(at::kFloat));
  call_kernel(op, {"x"}, sc_qsgd_quantize, vt, xc.data_ptr(), n, (int)bits, bucket,
              (uint64_t)seed, packed.data_ptr<uint8_t>(), scales.data_ptr<float>(), threads());
  return {packed, scales};
}

Tensor qsgd_dequantize_cpu(const Tensor& packed, const Tensor& scales, int64_t n, int64_t bits,
                           int64_t bucket, at::ScalarType dtype) {
  const char* op = "sparsecomm.qsgd_dequantize";
  sc_dtype vt =
      check_qsgd_dequantize_args(Device::Cpu, op, packed, scales, n, bits, bucket, dtype);
  Tensor out = at::empty({n}, packed.options().dtype(dtype));
  Tensor p = packed.contiguous(), s = scales.contiguous();
  call_kernel(op, {"packed", "scales"}, sc_qsgd_dequantize, vt, p.data_ptr<uint8_t>(),
              s.data_ptr<float>(), n, (int)bits, bucket, out.data_ptr(), threads());
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(sparsecomm, m) {
  m.def("stream_add_dd_(Tensor(a!) a, Tensor b) -> ()");
  m.def("stream_concat(Tensor idx_a, Tensor val_a, Tensor idx_b, Tensor val_b) -> (Tensor indices, Tensor values)");
  m.def("qsgd_quantize(Tensor x, int bits, int bucket, int seed) -> (Tensor packed, Tensor scales)");
  m.def("qsgd_dequantize(Tensor packed, Tensor scales, int n, int bits, int bucket, ScalarType dtype) -> Tensor");
}

TORCH_LIBRARY_IMPL(sparsecomm, CPU, m) {
  m.impl("stream_add_dd_", &add_dd_cpu);
  m.impl("stream_concat", &concat_cpu);
  m.impl("qsgd_quantize", &qsgd_quantize_cpu);
  m.impl("qsgd_dequantize", &qsgd_dequantize_cpu);
}
