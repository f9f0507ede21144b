// SKCompress ops: bindings of csrc/cpu/skcompress.c (C ABI and wire layout in
// csrc/include/sparsecomm/skcompress.h), written like every binding: checks from
// csrc/checks.h, one kernel call through call_kernel.
#include <torch/library.h>

#include <string>

#include "checks.h"
#include "sparsecomm/skcompress.h"

namespace {

using at::Tensor;
using namespace sparsecomm;

const std::string kArgNames[] = {"q", "s", "t", "r", "m", "prefix", "codec", "exact_max",
                                 "capacity", "val", "n"};
// err.input of a malformed body is the field (sc_skc_field)
const std::string kFieldNames[] = {"size", "codec", "reserved", "params", "buckets",
                                   "means", "lists", "code_table", "code", "padding",
                                   "prefix", "index_range", "index_order", "cell", "count",
                                   "revision"};
const std::string kVecNames[] = {"idx", "val"};

Tensor skcompress_quantiles_cpu(const Tensor& x, int64_t nq, int64_t exact_max) {
  const char* op = "sparsecomm.skcompress_quantiles";
  check_vector(x, op, "x");
  sc_dtype vt = value_dtype(x, op, "x", Floats::Full);
  TORCH_CHECK_VALUE(x.numel() >= 1, op, ": x must not be empty");
  TORCH_CHECK_VALUE(nq >= 1, op, ": nq must be >= 1, got ", nq);
  check_nonnegative(exact_max, op, "exact_max");
  Tensor xc = x.contiguous();
  Tensor out = at::empty({nq + 1}, x.options().dtype(at::kDouble));
  call_kernel(op, {"val"}, sc_skc_quantiles, vt, xc.data_ptr(), xc.numel(), nq, exact_max,
              out.data_ptr<double>());
  return out;
}

std::tuple<Tensor, Tensor, Tensor> skcompress_quantize_cpu(const Tensor& v, int64_t q,
                                                           int64_t exact_max) {
  const char* op = "sparsecomm.skcompress_quantize";
  check_vector(v, op, "v");
  sc_dtype vt = value_dtype(v, op, "v", Floats::Full);
  TORCH_CHECK_VALUE(q >= 2 && q <= SC_SKC_MAX_Q && q % 2 == 0, op,
                    ": q must be even and in [2, ", SC_SKC_MAX_Q, "], got ", q);
  check_nonnegative(exact_max, op, "exact_max");
  Tensor vc = v.contiguous();
  Tensor bucket = at::empty({vc.numel()}, v.options().dtype(at::kInt));
  Tensor splits = at::empty({2, q / 2 + 1}, v.options().dtype(at::kDouble));
  Tensor used = at::empty({2}, v.options().dtype(at::kLong));
  call_kernel(op, {kVecNames, 2}, sc_skc_quantize, vt, vc.data_ptr(), vc.numel(), q, exact_max,
              bucket.data_ptr<int32_t>(), splits.data_ptr<double>(), used.data_ptr<int64_t>());
  return {bucket, splits, used};
}

sc_skc_options make_options(int64_t index_codec, int64_t value_codec, int64_t q, int64_t s,
                            double t, int64_t r, int64_t m, int64_t prefix, int64_t exact_max) {
  sc_skc_options o;
  o.index_codec = (int)index_codec;
  o.value_codec = (int)value_codec;
  o.q = q;
  o.s = s;
  o.t = t;
  o.r = r;
  o.m = m;
  o.prefix = (int)prefix;
  o.exact_max = exact_max;
  return o;
}

// The body, and with decoded (n values of val's dtype) what receivers decode from it.
Tensor encode_body(const char* op, const Tensor& idx, const Tensor& val, int64_t n,
                   int64_t index_codec, int64_t value_codec, int64_t q, int64_t s, double t,
                   int64_t r, int64_t m, int64_t prefix, int64_t exact_max, Tensor* decoded) {
  check_vector(idx, op, "idx");
  check_vector(val, op, "val");
  index_dtype(idx, op, "idx");
  sc_dtype vt = value_dtype(val, op, "val", Floats::Full);
  check_same_length(idx, val, op, "idx", "val");
  check_nonnegative(n, op, "n");
  TORCH_CHECK_VALUE(index_codec >= 0 && index_codec <= 1 && value_codec >= 0 && value_codec <= 1,
                    op, ": unknown codec (index ", index_codec, ", value ", value_codec, ")");
  sc_skc_options o = make_options(index_codec, value_codec, q, s, t, r, m, prefix, exact_max);
  call_kernel(op, {kArgNames, 11}, sc_skc_check_options, &o);
  Tensor ii = idx.to(at::kLong).contiguous();
  Tensor vv = val.contiguous();
  int64_t cap = sc_skc_encode_bound(&o, n, vt, vv.numel());
  Tensor out = at::empty({cap}, val.options().dtype(at::kByte));
  if (decoded) *decoded = at::empty({vv.numel()}, vv.options());
  int64_t len = 0;
  sc_error_info e{0, 0, 0};
  int st = sc_skc_encode(&o, n, ii.data_ptr<int64_t>(), vt, vv.data_ptr(), vv.numel(),
                         out.data_ptr<uint8_t>(), cap, &len, decoded ? decoded->data_ptr() : nullptr,
                         &e);
  if (st == SC_ERR_ARG) raise_status(st, op, e, {kArgNames, 11});
  if (st) raise_status(st, op, e, {kVecNames, 2}, n);
  return out.narrow(0, 0, len).clone();
}

Tensor skcompress_encode_cpu(const Tensor& idx, const Tensor& val, int64_t n, int64_t index_codec,
                             int64_t value_codec, int64_t q, int64_t s, double t, int64_t r,
                             int64_t m, int64_t prefix, int64_t exact_max) {
  return encode_body("sparsecomm.skcompress_encode", idx, val, n, index_codec, value_codec, q, s,
                     t, r, m, prefix, exact_max, nullptr);
}

std::tuple<Tensor, Tensor> skcompress_encode_decoded_cpu(
    const Tensor& idx, const Tensor& val, int64_t n, int64_t index_codec, int64_t value_codec,
    int64_t q, int64_t s, double t, int64_t r, int64_t m, int64_t prefix, int64_t exact_max) {
  Tensor decoded;
  Tensor body = encode_body("sparsecomm.skcompress_encode_decoded", idx, val, n, index_codec,
                            value_codec, q, s, t, r, m, prefix, exact_max, &decoded);
  return {body, decoded};
}

std::tuple<Tensor, Tensor> skcompress_decode_cpu(const Tensor& body, int64_t n, int64_t count,
                                                 at::ScalarType dtype, int64_t expect_index,
                                                 int64_t expect_value) {
  const char* op = "sparsecomm.skcompress_decode";
  check_vector(body, op, "body");
  TORCH_CHECK_TYPE(body.scalar_type() == at::kByte, op, ": body must be uint8, got ",
                   body.scalar_type());
  sc_dtype vt = value_dtype(dtype, op, "dtype", Floats::Full);
  check_nonnegative(n, op, "n");
  check_nonnegative(count, op, "count");
  Tensor b = body.contiguous();
  // the kernel bounds count by the body before anything is allocated here
  int64_t bound = b.numel() * 4;
  if (count > bound || count > n) {
    sc_error_info e{SC_SKC_F_COUNT, 0, count};
    raise_status(SC_ERR_MALFORMED, op, e, {kFieldNames, 16});
  }
  Tensor idx = at::empty({count}, body.options().dtype(at::kLong));
  Tensor val = at::empty({count}, body.options().dtype(dtype));
  sc_error_info e{0, 0, 0};
  int st = sc_skc_decode(b.data_ptr<uint8_t>(), b.numel(), n, count, vt, (int)expect_index,
                         (int)expect_value, idx.data_ptr<int64_t>(), val.data_ptr(), &e);
  if (st == SC_ERR_MALFORMED) raise_status(st, op, e, {kFieldNames, 16});
  if (st) raise_status(st, op, e, {kArgNames, 11});
  return {idx, val};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(sparsecomm, m) {
  m.def("skcompress_quantiles(Tensor x, int nq, int exact_max) -> Tensor");
  m.def("skcompress_quantize(Tensor v, int q, int exact_max) -> (Tensor, Tensor, Tensor)");
  m.def("skcompress_encode(Tensor idx, Tensor val, int n, int index_codec, int value_codec, int q, "
        "int s, float t, int r, int m, int prefix, int exact_max) -> Tensor");
  m.def("skcompress_encode_decoded(Tensor idx, Tensor val, int n, int index_codec, int value_codec, "
        "int q, int s, float t, int r, int m, int prefix, int exact_max) -> (Tensor, Tensor)");
  m.def("skcompress_decode(Tensor body, int n, int count, ScalarType dtype, int expect_index, "
        "int expect_value) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(sparsecomm, CPU, m) {
  m.impl("skcompress_quantiles", &skcompress_quantiles_cpu);
  m.impl("skcompress_quantize", &skcompress_quantize_cpu);
  m.impl("skcompress_encode", &skcompress_encode_cpu);
  m.impl("skcompress_encode_decoded", &skcompress_encode_decoded_cpu);
  m.impl("skcompress_decode", &skcompress_decode_cpu);
}
