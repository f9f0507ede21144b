// Sparse-stream operators (SparCML, issue 4): schemas and CPU implementations.
// Argument checks here, arithmetic in csrc/cpu/stream.c (C ABI in
// csrc/include/sparsecomm/stream.h). Python wrappers: sparsecomm/_stream_ops.py.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <cstdint>
#include <string>
#include <tuple>

#include "sparsecomm/stream.h"

namespace {

using at::Tensor;

sc_dtype vdtype(const Tensor& t, const char* op, const char* name) {
  if (t.scalar_type() == at::kFloat) return SC_F32;
  if (t.scalar_type() == at::kDouble) return SC_F64;
  TORCH_CHECK_TYPE(false, op, ": ", name, " must be float32 or float64, got ", t.scalar_type());
}

sc_index_t idtype(const Tensor& t, const char* op, const char* name) {
  if (t.scalar_type() == at::kInt) return SC_I32;
  if (t.scalar_type() == at::kLong) return SC_I64;
  TORCH_CHECK_TYPE(false, op, ": ", name, " must be int32 or int64, got ", t.scalar_type());
}

void check(const Tensor& t, const char* op, const char* name) {
  TORCH_CHECK_VALUE(t.dim() == 1, op, ": ", name, " must be 1-D, got shape ", t.sizes());
  TORCH_CHECK_VALUE(t.device().is_cpu(), op, ": ", name, " must be a CPU tensor, got ", t.device());
}

void check_pair(const Tensor& i, const Tensor& v, const char* op, const char* iname,
                const char* vname) {
  check(i, op, iname);
  check(v, op, vname);
  TORCH_CHECK_VALUE(i.numel() == v.numel(), op, ": ", iname, " and ", vname,
                    " must have the same length, got ", i.numel(), " and ", v.numel());
}

[[noreturn]] void raise(int st, const char* op, const sc_error_info& e, int64_t limit) {
  const char* name = e.input == 0 ? "idx_a" : "idx_b";
  if (st == SC_ERR_INDEX_ORDER)
    TORCH_CHECK_VALUE(false, op, ": ", name, " must be strictly ascending (and, for concat, "
                      "every index of idx_a below every index of idx_b), but ", name, "[",
                      e.position, "] = ", e.value, " breaks the order");
  if (st == SC_ERR_INDEX_RANGE)
    TORCH_CHECK_VALUE(false, op, ": idx must hold indices in [0, ", limit, "), but idx[",
                      e.position, "] = ", e.value);
  TORCH_CHECK(false, op, ": invalid argument (status ", st, ")");
}

void same_types(const Tensor& ia, const Tensor& va, const Tensor& ib, const Tensor& vb,
                const char* op) {
  TORCH_CHECK_TYPE(ia.scalar_type() == ib.scalar_type(), op,
                   ": idx_a and idx_b must have the same dtype, got ", ia.scalar_type(),
                   " and ", ib.scalar_type());
  TORCH_CHECK_TYPE(va.scalar_type() == vb.scalar_type(), op,
                   ": val_a and val_b must have the same dtype, got ", va.scalar_type(),
                   " and ", vb.scalar_type());
}

// Checked, contiguous inputs of a two-stream op and an output buffer able to hold both.
struct TwoStreams {
  sc_index_t it;
  sc_dtype vt;
  Tensor a, x, b, y, io, vo;
};

TwoStreams two_streams(const Tensor& ia, const Tensor& va, const Tensor& ib, const Tensor& vb,
                       const char* op) {
  check_pair(ia, va, op, "idx_a", "val_a");
  check_pair(ib, vb, op, "idx_b", "val_b");
  same_types(ia, va, ib, vb, op);
  TwoStreams t{idtype(ia, op, "idx_a"), vdtype(va, op, "val_a"), ia.contiguous(), va.contiguous(),
               ib.contiguous(), vb.contiguous(), Tensor(), Tensor()};
  int64_t cap = t.a.numel() + t.b.numel();
  t.io = at::empty({cap}, t.a.options());
  t.vo = at::empty({cap}, t.x.options());
  return t;
}

std::tuple<Tensor, Tensor> add_ss(const Tensor& ia, const Tensor& va, const Tensor& ib,
                                  const Tensor& vb) {
  const char* op = "sparsecomm.stream_add_ss";
  TwoStreams t = two_streams(ia, va, ib, vb, op);
  int64_t count = 0;
  sc_error_info e{0, 0, 0};
  int st = sc_stream_add_ss(t.it, t.vt, t.a.data_ptr(), t.x.data_ptr(), t.a.numel(), t.b.data_ptr(),
                            t.y.data_ptr(), t.b.numel(), t.io.data_ptr(), t.vo.data_ptr(), &count, &e);
  if (st) raise(st, op, e, 0);
  return {t.io.narrow(0, 0, count), t.vo.narrow(0, 0, count)};
}

Tensor& add_sd_(Tensor& dense, const Tensor& idx, const Tensor& val) {
  const char* op = "sparsecomm.stream_add_sd_";
  check(dense, op, "dense");
  check_pair(idx, val, op, "idx", "val");
  TORCH_CHECK_VALUE(dense.is_contiguous(), op, ": dense must be contiguous");
  TORCH_CHECK_TYPE(val.scalar_type() == dense.scalar_type(), op,
                   ": val must have the dtype of dense (", dense.scalar_type(), "), got ",
                   val.scalar_type());
  sc_dtype vt = vdtype(dense, op, "dense");
  sc_index_t it = idtype(idx, op, "idx");
  Tensor i = idx.contiguous(), v = val.contiguous();
  sc_error_info e{0, 0, 0};
  int st = sc_stream_add_sd(it, vt, dense.data_ptr(), dense.numel(), i.data_ptr(), v.data_ptr(),
                            i.numel(), at::get_num_threads(), &e);
  if (st) raise(st, op, e, dense.numel());
  return dense;
}

Tensor& add_dd_(Tensor& a, const Tensor& b) {
  const char* op = "sparsecomm.stream_add_dd_";
  check(a, op, "a");
  check(b, op, "b");
  TORCH_CHECK_VALUE(a.is_contiguous(), op, ": a must be contiguous");
  TORCH_CHECK_VALUE(a.numel() == b.numel(), op, ": a and b must have the same length, got ",
                    a.numel(), " and ", b.numel());
  TORCH_CHECK_TYPE(a.scalar_type() == b.scalar_type(), op, ": b must have the dtype of a (",
                   a.scalar_type(), "), got ", b.scalar_type());
  sc_dtype vt = vdtype(a, op, "a");
  Tensor bc = b.contiguous();
  int st = sc_stream_add_dd(vt, a.data_ptr(), bc.data_ptr(), a.numel(), at::get_num_threads());
  TORCH_CHECK(st == 0, op, ": internal error ", st);
  return a;
}

std::tuple<Tensor, Tensor> concat(const Tensor& ia, const Tensor& va, const Tensor& ib,
                                  const Tensor& vb) {
  const char* op = "sparsecomm.stream_concat";
  TwoStreams t = two_streams(ia, va, ib, vb, op);
  sc_error_info e{0, 0, 0};
  int st = sc_stream_concat(t.it, t.vt, t.a.data_ptr(), t.x.data_ptr(), t.a.numel(), t.b.data_ptr(),
                            t.y.data_ptr(), t.b.numel(), t.io.data_ptr(), t.vo.data_ptr(), &e);
  if (st) raise(st, op, e, 0);
  return {t.io, t.vo};
}

std::tuple<Tensor, Tensor> qsgd_quantize(const Tensor& x, int64_t bits, int64_t bucket,
                                         int64_t seed) {
  const char* op = "sparsecomm.qsgd_quantize";
  check(x, op, "x");
  TORCH_CHECK_VALUE(bits == 4 || bits == 8, op, ": bits must be 4 or 8, got ", bits);
  TORCH_CHECK_VALUE(bucket >= 1 && (bits == 8 || bucket % 2 == 0), op,
                    ": bucket_size must be >= 1 (and even for 4 bits), got ", bucket);
  sc_dtype vt = vdtype(x, op, "x");
  Tensor xc = x.contiguous();
  int64_t n = xc.numel();
  Tensor packed = at::empty({(n * bits + 7) / 8}, xc.options().dtype(at::kByte));
  Tensor scales = at::empty({(n + bucket - 1) / bucket}, xc.options().dtype(at::kFloat));
  int st = sc_qsgd_quantize(vt, xc.data_ptr(), n, (int)bits, bucket, (uint64_t)seed,
                            packed.data_ptr<uint8_t>(), scales.data_ptr<float>(),
                            at::get_num_threads());
  TORCH_CHECK(st == 0, op, ": invalid argument (status ", st, ")");
  return {packed, scales};
}

Tensor qsgd_dequantize(const Tensor& packed, const Tensor& scales, int64_t n, int64_t bits,
                       int64_t bucket, at::ScalarType dtype) {
  const char* op = "sparsecomm.qsgd_dequantize";
  check(packed, op, "packed");
  check(scales, op, "scales");
  TORCH_CHECK_VALUE(bits == 4 || bits == 8, op, ": bits must be 4 or 8, got ", bits);
  TORCH_CHECK_VALUE(bucket >= 1 && n >= 0, op, ": bucket_size must be >= 1 and n >= 0");
  TORCH_CHECK_TYPE(packed.scalar_type() == at::kByte, op, ": packed must be uint8");
  TORCH_CHECK_TYPE(scales.scalar_type() == at::kFloat, op, ": scales must be float32");
  TORCH_CHECK_VALUE(packed.numel() == (n * bits + 7) / 8, op, ": packed must hold ",
                    (n * bits + 7) / 8, " bytes for n = ", n, ", got ", packed.numel());
  TORCH_CHECK_VALUE(scales.numel() == (n + bucket - 1) / bucket, op, ": scales must hold ",
                    (n + bucket - 1) / bucket, " entries, got ", scales.numel());
  Tensor out = at::empty({n}, packed.options().dtype(dtype));
  sc_dtype vt = vdtype(out, op, "dtype");
  Tensor p = packed.contiguous(), s = scales.contiguous();
  int st = sc_qsgd_dequantize(vt, p.data_ptr<uint8_t>(), s.data_ptr<float>(), n, (int)bits, bucket,
                              out.data_ptr(), at::get_num_threads());
  TORCH_CHECK(st == 0, op, ": invalid argument (status ", st, ")");
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(sparsecomm, m) {
  m.def("stream_add_ss(Tensor idx_a, Tensor val_a, Tensor idx_b, Tensor val_b) -> (Tensor, Tensor)");
  m.def("stream_add_sd_(Tensor(a!) dense, Tensor idx, Tensor val) -> Tensor(a!)");
  m.def("stream_add_dd_(Tensor(a!) a, Tensor b) -> Tensor(a!)");
  m.def("stream_concat(Tensor idx_a, Tensor val_a, Tensor idx_b, Tensor val_b) -> (Tensor, Tensor)");
  m.def("qsgd_quantize(Tensor x, int bits, int bucket, int seed) -> (Tensor, Tensor)");
  m.def("qsgd_dequantize(Tensor packed, Tensor scales, int n, int bits, int bucket, ScalarType dtype) -> Tensor");
}

TORCH_LIBRARY_IMPL(sparsecomm, CPU, m) {
  m.impl("stream_add_ss", &add_ss);
  m.impl("stream_add_sd_", &add_sd_);
  m.impl("stream_add_dd_", &add_dd_);
  m.impl("stream_concat", &concat);
  m.impl("qsgd_quantize", &qsgd_quantize);
  m.impl("qsgd_dequantize", &qsgd_dequantize);
}
