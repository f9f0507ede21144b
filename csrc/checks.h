// The one checks layer of the sparsecomm bindings (csrc/ops*.cpp).
//
// Bindings only: check the tensors a Python caller hands in (messages name the
// op and the argument, say what was expected and what was given), allocate
// outputs, call a C kernel and turn its status into an exception with
// raise_status (call_kernel does both, with an op's own words for a failure
// where it has them). Kernels validate the *data* (index
// order and range, wire fields) themselves, so nothing is checked twice: the
// Python face (sparsecomm/ops) does not re-check what is checked here. The
// argument checks of the ops bound on both devices are in op_checks.h.
//
// Status -> exception, in this one place (sparsecomm/ops/_errors.py maps the
// torch exception types to the Python ones users catch):
//   SC_ERR_ARG, SC_ERR_NAN, SC_ERR_INDEX_RANGE, SC_ERR_INDEX_ORDER,
//   SC_ERR_OVERLAP                -> c10::ValueError    -> ValueError
//   SC_ERR_NOMEM                  -> c10::OutOfMemoryError -> MemoryError
//   SC_ERR_MALFORMED              -> c10::ValueError whose message starts with
//                                    kWirePrefix          -> WireFormatError
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "sparsecomm/abi.h"

namespace sparsecomm {

using at::Tensor;

// The prefix that makes the Python face raise WireFormatError. The Python side's one
// copy is sparsecomm/ops/_errors.py: WIRE_PREFIX; tests/test_single_sources.py reads this
// line and fails when the two differ.
constexpr const char* kWirePrefix = "malformed message: ";

inline int threads() { return at::get_num_threads(); }

inline void check_1d(const Tensor& t, const char* op, const std::string& name) {
  TORCH_CHECK_VALUE(t.dim() == 1, op, ": ", name, " must be a 1-D tensor, got a ", t.dim(),
                    "-D tensor of shape ", t.sizes());
}

inline void check_cpu(const Tensor& t, const char* op, const std::string& name) {
  TORCH_CHECK_VALUE(t.device().is_cpu(), op, ": ", name,
                    " must be a CPU tensor for this kernel, got device ", t.device());
}

inline void check_cuda(const Tensor& t, const Tensor& first, const char* op,
                       const std::string& name) {
  TORCH_CHECK_VALUE(t.is_cuda() && t.device() == first.device(), op, ": ", name,
                    " must be a CUDA tensor on ", first.device(), ", got device ", t.device());
}

// The device a binding runs on: its CPU bindings take CPU tensors, its CUDA
// bindings CUDA tensors on the device of the op's first tensor argument.
enum class Device { Cpu, Cuda };

// The device rule of one call: `first` is the op's first tensor argument.
class Placement {
 public:
  Placement(Device device, const Tensor& first) : device_(device), first_(first) {}

  void check(const Tensor& t, const char* op, const std::string& name) const {
    if (device_ == Device::Cpu)
      check_cpu(t, op, name);
    else
      check_cuda(t, first_, op, name);
  }

  // 1-D and on the device: the shape every vector argument of the ops has.
  void check_vector(const Tensor& t, const char* op, const std::string& name) const {
    check_1d(t, op, name);
    check(t, op, name);
  }

 private:
  Device device_;
  const Tensor& first_;
};

// 1-D CPU tensor: the shape every vector argument of the ops has.
inline void check_vector(const Tensor& t, const char* op, const std::string& name) {
  check_1d(t, op, name);
  check_cpu(t, op, name);
}

inline void check_contiguous(const Tensor& t, const char* op, const std::string& name) {
  TORCH_CHECK_VALUE(t.is_contiguous(), op, ": ", name,
                    " must be contiguous (it is written in place)");
}

inline void check_same_length(const Tensor& a, const Tensor& b, const char* op,
                              const std::string& an, const std::string& bn) {
  TORCH_CHECK_VALUE(a.numel() == b.numel(), op, ": ", an, " and ", bn,
                    " must have the same length, got ", a.numel(), " and ", b.numel());
}

inline void check_same_dtype(const Tensor& a, const Tensor& b, const char* op,
                             const std::string& an, const std::string& bn) {
  TORCH_CHECK_TYPE(a.scalar_type() == b.scalar_type(), op, ": ", bn, " must have the dtype of ",
                   an, " (", a.scalar_type(), "), got ", b.scalar_type());
}

// Which floating types a kernel family takes.
enum class Floats { All, Full };  // All: f32 f64 f16 bf16; Full: f32 f64

inline sc_dtype value_dtype(at::ScalarType s, const char* op, const std::string& name,
                            Floats allowed = Floats::All) {
  switch (s) {
    case at::kFloat: return SC_F32;
    case at::kDouble: return SC_F64;
    case at::kHalf:
      if (allowed == Floats::All) return SC_F16;
      break;
    case at::kBFloat16:
      if (allowed == Floats::All) return SC_BF16;
      break;
    default: break;
  }
  TORCH_CHECK_TYPE(false, op, ": ", name, " must be ",
                   allowed == Floats::All ? "float32, float64, float16 or bfloat16"
                                          : "float32 or float64",
                   ", got ", s);
}

inline sc_dtype value_dtype(const Tensor& t, const char* op, const std::string& name,
                            Floats allowed = Floats::All) {
  return value_dtype(t.scalar_type(), op, name, allowed);
}

inline sc_index_t index_dtype(const Tensor& t, const char* op, const std::string& name) {
  if (t.scalar_type() == at::kInt) return SC_I32;
  if (t.scalar_type() == at::kLong) return SC_I64;
  TORCH_CHECK_TYPE(false, op, ": ", name, " must be int32 or int64, got ", t.scalar_type());
}

inline void check_nonnegative(int64_t v, const char* op, const char* name) {
  TORCH_CHECK_VALUE(v >= 0, op, ": ", name, " must be >= 0, got ", v);
}

// Large outputs are fresh allocations that the kernel then writes once: on
// Linux, ask for transparent huge pages before the first touch. Faulting in
// 4 KiB pages (one fault + zeroing each) was ~40% of topk's time at 10%
// density for N = 100M (120 MB of output); with 2 MiB pages it is a few %.
// A hint only: ignored where THP is off.
inline void advise_huge(uintptr_t address, size_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  const uintptr_t huge = (uintptr_t)2 << 20;
  if (bytes < 2 * huge) return;
  uintptr_t lo = (address + huge - 1) & ~(huge - 1);
  uintptr_t hi = (address + bytes) & ~(huge - 1);
  if (hi > lo) (void)madvise((void*)lo, hi - lo, MADV_HUGEPAGE);
#else
  (void)address;
  (void)bytes;
#endif
}

inline void advise_huge(const Tensor& t) {
  advise_huge((uintptr_t)t.data_ptr(), (size_t)t.numel() * t.element_size());
}

inline Tensor empty_out(int64_t n, const at::TensorOptions& opt) {
  Tensor t = at::empty({n}, opt);
  advise_huge(t);
  return t;
}

// Names of the inputs err.input refers to, for the messages.
struct InputNames {
  const std::string* names;
  size_t count;
  std::string operator()(int64_t i) const {
    if (i >= 0 && (size_t)i < count) return names[i];
    return "input " + std::to_string(i);
  }
};

// Raises the exception for a kernel's status. `inputs` names what err.input
// indexes; `limit` is the dense length index ranges were checked against.
[[noreturn]] inline void raise_status(int st, const char* op, const sc_error_info& e,
                                      InputNames inputs, int64_t limit = -1) {
  const std::string name = inputs(e.input);
  switch (st) {
    case SC_ERR_ARG:
      TORCH_CHECK_VALUE(false, op, ": the kernel rejected its arguments (", name,
                        "); see the op's documentation for the valid ranges");
    case SC_ERR_NOMEM:
      TORCH_CHECK_WITH(OutOfMemoryError, false, op,
                       ": out of memory allocating the kernel's workspace");
    case SC_ERR_NAN:
      TORCH_CHECK_VALUE(false, op, ": ", name, "[", e.position,
                        "] is NaN (or, for QSGD, infinite or beyond float32): this op cannot "
                        "order or scale it (clean or mask the tensor first)");
    case SC_ERR_INDEX_RANGE:
      if (e.value < 0)
        TORCH_CHECK_VALUE(false, op, ": ", name, " must hold indices >= 0, but ", name, "[",
                          e.position, "] = ", e.value);
      TORCH_CHECK_VALUE(false, op, ": ", name, " must hold indices < ", limit, ", but ", name,
                        "[", e.position, "] = ", e.value);
    case SC_ERR_INDEX_ORDER:
      TORCH_CHECK_VALUE(false, op, ": ", name,
                        " must be strictly ascending (sorted, no duplicates), but ", name, "[",
                        e.position, "] = ", e.value, " does not follow the entry before it");
    case SC_ERR_OVERLAP:
      TORCH_CHECK_VALUE(false, op, ": ", name,
                        " partially overlaps the tensor written in place; pass a copy");
    case SC_ERR_MALFORMED:
      TORCH_CHECK_VALUE(false, kWirePrefix, op, ": ", name, " is malformed at position ",
                        e.position, " (value ", e.value, ")");
    default:
      TORCH_CHECK(false, op, ": internal error (kernel status ", st, ")");
  }
}

// An op's own words for a failure that raise_status can only word generically
// (a kernel's SC_ERR_ARG on an input whose rule the op can name, say):
// `words(status, err)` raises for the failures it words and returns for the rest,
// which raise_status raises.
template <typename F>
struct OwnWords {
  F words;
};
template <typename F>
OwnWords(F) -> OwnWords<F>;

// Calls a kernel whose last parameter is its sc_error_info* (the arguments
// before it are `args`) and raises the exception for a failed status: first
// `own`'s words, then raise_status's. `inputs` names what err.input indexes,
// `limit` is the dense length index ranges were checked against.
template <typename F, typename... Params, typename... Args>
inline void call_kernel(const char* op, InputNames inputs, int64_t limit, OwnWords<F> own,
                        int (*kernel)(Params...), Args&&... args) {
  sc_error_info e{0, 0, 0};
  int st = kernel(std::forward<Args>(args)..., &e);
  if (!st) return;
  own.words(st, e);
  raise_status(st, op, e, inputs, limit);
}

// The same with raise_status's words only: the call of almost every op.
template <typename... Params, typename... Args>
inline void call_kernel(const char* op, InputNames inputs, int64_t limit,
                        int (*kernel)(Params...), Args&&... args) {
  call_kernel(op, inputs, limit, OwnWords{[](int, const sc_error_info&) {}}, kernel,
              std::forward<Args>(args)...);
}

// The same for a kernel that checks no index range.
template <typename... Params, typename... Args>
inline void call_kernel(const char* op, InputNames inputs, int (*kernel)(Params...),
                        Args&&... args) {
  call_kernel(op, inputs, -1, kernel, std::forward<Args>(args)...);
}

// The same with the names written at the call: call_kernel(op, {"idx", "val"}, ...).
template <typename... Params, typename... Args>
inline void call_kernel(const char* op, std::initializer_list<std::string> inputs, int64_t limit,
                        int (*kernel)(Params...), Args&&... args) {
  call_kernel(op, InputNames{inputs.begin(), inputs.size()}, limit, kernel,
              std::forward<Args>(args)...);
}

template <typename... Params, typename... Args>
inline void call_kernel(const char* op, std::initializer_list<std::string> inputs,
                        int (*kernel)(Params...), Args&&... args) {
  call_kernel(op, InputNames{inputs.begin(), inputs.size()}, -1, kernel,
              std::forward<Args>(args)...);
}

}  // namespace sparsecomm
