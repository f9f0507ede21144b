// Sparse-stream and QSGD ops (SparCML, sections 3 and 5): bindings of
// csrc/cpu/stream.c (C ABI in csrc/include/sparsecomm/stream.h), written like
// every binding: checks from csrc/checks.h, one kernel call, raise_status.
// The stream's sparse + sparse and sparse + dense cases are merge_add and
// scatter_add_ (csrc/ops.cpp).
#include <torch/library.h>

#include <string>
#include <tuple>

#include "checks.h"
#include "sparsecomm/kernels.h"
#include "sparsecomm/stream.h"

namespace {

using at::Tensor;
using namespace sparsecomm;

void add_dd_cpu(Tensor& a, const Tensor& b) {
  const char* op = "sparsecomm.stream_add_dd_";
  check_vector(a, op, "a");
  check_vector(b, op, "b");
  check_contiguous(a, op, "a");
  check_same_length(a, b, op, "a", "b");
  check_same_dtype(a, b, op, "a", "b");
  sc_dtype vt = value_dtype(a, op, "a", Floats::Full);
  Tensor bc = b.contiguous();
  sc_error_info e{0, 0, 0};
  int st = sc_stream_add_dd(vt, a.data_ptr(), bc.data_ptr(), a.numel(), threads(), &e);
  const std::string names[] = {"a", "b"};
  if (st) raise_status(st, op, e, {names, 2});
}

std::tuple<Tensor, Tensor> concat_cpu(const Tensor& ia, const Tensor& va, const Tensor& ib,
                                      const Tensor& vb) {
  const char* op = "sparsecomm.stream_concat";
  check_vector(ia, op, "idx_a");
  check_vector(va, op, "val_a");
  check_vector(ib, op, "idx_b");
  check_vector(vb, op, "val_b");
  check_same_length(ia, va, op, "idx_a", "val_a");
  check_same_length(ib, vb, op, "idx_b", "val_b");
  check_same_dtype(ia, ib, op, "idx_a", "idx_b");
  check_same_dtype(va, vb, op, "val_a", "val_b");
  sc_index_t it = index_dtype(ia, op, "idx_a");
  sc_dtype vt = value_dtype(va, op, "val_a");
  Tensor a = ia.contiguous(), x = va.contiguous(), b = ib.contiguous(), y = vb.contiguous();
  int64_t cap = a.numel() + b.numel();
  Tensor io = empty_out(cap, a.options()), vo = empty_out(cap, x.options());
  sc_error_info e{0, 0, 0};
  int st = sc_stream_concat(it, vt, a.data_ptr(), x.data_ptr(), a.numel(), b.data_ptr(),
                            y.data_ptr(), b.numel(), threads(), io.data_ptr(), vo.data_ptr(), &e);
  const std::string names[] = {"idx_a", "idx_b"};
  if (st) raise_status(st, op, e, {names, 2});
  return {io, vo};
}

void check_qsgd_options(const char* op, int64_t bits, int64_t bucket) {
  TORCH_CHECK_VALUE(bits == 4 || bits == 8, op, ": bits must be 4 or 8, got ", bits);
  TORCH_CHECK_VALUE(bucket >= 1 && (bits == 8 || bucket % 2 == 0), op,
                    ": bucket_size must be >= 1 (and even for 4 bits), got ", bucket);
}

std::tuple<Tensor, Tensor> qsgd_quantize_cpu(const Tensor& x, int64_t bits, int64_t bucket,
                                             int64_t seed) {
  const char* op = "sparsecomm.qsgd_quantize";
  check_vector(x, op, "x");
  check_qsgd_options(op, bits, bucket);
  sc_dtype vt = value_dtype(x, op, "x", Floats::Full);
  Tensor xc = x.contiguous();
  int64_t n = xc.numel();
  Tensor packed = at::empty({(n * bits + 7) / 8}, xc.options().dtype(at::kByte));
  Tensor scales = at::empty({(n + bucket - 1) / bucket}, xc.options().dtype(at::kFloat));
  sc_error_info e{0, 0, 0};
  int st = sc_qsgd_quantize(vt, xc.data_ptr(), n, (int)bits, bucket, (uint64_t)seed,
                            packed.data_ptr<uint8_t>(), scales.data_ptr<float>(), threads(), &e);
  const std::string names[] = {"x"};
  if (st) raise_status(st, op, e, {names, 1});
  return {packed, scales};
}

Tensor qsgd_dequantize_cpu(const Tensor& packed, const Tensor& scales, int64_t n, int64_t bits,
                           int64_t bucket, at::ScalarType dtype) {
  const char* op = "sparsecomm.qsgd_dequantize";
  check_vector(packed, op, "packed");
  check_vector(scales, op, "scales");
  check_qsgd_options(op, bits, bucket);
  check_nonnegative(n, op, "n");
  TORCH_CHECK_TYPE(packed.scalar_type() == at::kByte, op, ": packed must be uint8, got ",
                   packed.scalar_type());
  TORCH_CHECK_TYPE(scales.scalar_type() == at::kFloat, op, ": scales must be float32, got ",
                   scales.scalar_type());
  TORCH_CHECK_VALUE(packed.numel() == (n * bits + 7) / 8, op, ": packed must hold ",
                    (n * bits + 7) / 8, " bytes for n = ", n, ", got ", packed.numel());
  TORCH_CHECK_VALUE(scales.numel() == (n + bucket - 1) / bucket, op, ": scales must hold ",
                    (n + bucket - 1) / bucket, " entries, got ", scales.numel());
  sc_dtype vt = value_dtype(dtype, op, "dtype", Floats::Full);
  Tensor out = at::empty({n}, packed.options().dtype(dtype));
  Tensor p = packed.contiguous(), s = scales.contiguous();
  sc_error_info e{0, 0, 0};
  int st = sc_qsgd_dequantize(vt, p.data_ptr<uint8_t>(), s.data_ptr<float>(), n, (int)bits,
                              bucket, out.data_ptr(), threads(), &e);
  const std::string names[] = {"packed", "scales"};
  if (st) raise_status(st, op, e, {names, 2});
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
