// ZEN ops ("ZEN: Empowering Distributed Training with Sparsity-driven Data
// Synchronization", OSDI 2025): bindings of csrc/cpu/zen.c (C ABI in
// csrc/include/sparsecomm/zen.h), written like every binding: checks from
// csrc/checks.h, outputs allocated, one kernel call through call_kernel.
#include <torch/library.h>

#include <string>
#include <tuple>

#include "checks.h"
#include "sparsecomm/zen.h"

namespace {

using at::Tensor;
using namespace sparsecomm;

const std::string kPartitionNames[] = {"idx", "n", "parts", "block", "owner", "val"};
const std::string kBitmapNames[] = {"idx", "n", "parts", "block", "owner", "bitmap"};

void check_i64_indices(const Tensor& idx, const char* op) {
  check_vector(idx, op, "idx");
  TORCH_CHECK_TYPE(idx.scalar_type() == at::kLong, op, ": idx must be int64, got ", idx.scalar_type());
}

std::tuple<Tensor, Tensor, Tensor> partition_cpu(const Tensor& idx, const Tensor& val, int64_t n, int64_t parts,
                                                 int64_t seed, int64_t block) {
  const char* op = "sparsecomm.zen_partition";
  check_i64_indices(idx, op);
  check_vector(val, op, "val");
  check_same_length(idx, val, op, "idx", "val");
  sc_dtype vt = value_dtype(val, op, "val");
  TORCH_CHECK_VALUE(parts >= 1 && parts <= SC_ZEN_MAX_PARTS, op, ": parts must be in 1..", SC_ZEN_MAX_PARTS,
                    ", got ", parts);
  TORCH_CHECK_VALUE(sc_zen_log2(block) >= 0, op, ": block must be a power of two >= 1, got ", block);
  check_nonnegative(n, op, "n");
  Tensor ic = idx.contiguous(), vc = val.contiguous();
  Tensor oi = empty_out(ic.numel(), ic.options());
  Tensor ov = empty_out(vc.numel(), vc.options());
  Tensor counts = at::empty({parts}, ic.options());
  call_kernel(op, {kPartitionNames, 6}, n, sc_zen_partition, vt, ic.data_ptr<int64_t>(), vc.data_ptr(),
              ic.numel(), n, parts, (uint64_t)seed, block, oi.data_ptr<int64_t>(), ov.data_ptr(),
              counts.data_ptr<int64_t>());
  return {oi, ov, counts};
}

void check_class_args(const char* op, int64_t n, int64_t parts, int64_t block, int64_t owner) {
  check_nonnegative(n, op, "n");
  TORCH_CHECK_VALUE(parts >= 1 && parts <= SC_ZEN_MAX_PARTS, op, ": parts must be in 1..", SC_ZEN_MAX_PARTS,
                    ", got ", parts);
  TORCH_CHECK_VALUE(sc_zen_log2(block) >= 0, op, ": block must be a power of two >= 1, got ", block);
  TORCH_CHECK_VALUE(owner >= 0 && owner < parts, op, ": owner must be in [0, parts = ", parts, "), got ",
                    owner);
}

int64_t class_size(const char* op, int64_t n, int64_t parts, int64_t seed, int64_t block, int64_t owner) {
  int64_t size = 0;
  call_kernel(op, {kBitmapNames, 6}, sc_zen_class_size, n, parts, (uint64_t)seed, block, owner, &size);
  return size;
}

Tensor bitmap_encode_cpu(const Tensor& idx, int64_t n, int64_t parts, int64_t seed, int64_t block, int64_t owner) {
  const char* op = "sparsecomm.zen_bitmap_encode";
  check_i64_indices(idx, op);
  check_class_args(op, n, parts, block, owner);
  Tensor ic = idx.contiguous();
  const int64_t nbytes = (class_size(op, n, parts, seed, block, owner) + 7) / 8;
  Tensor bitmap = at::empty({nbytes}, ic.options().dtype(at::kByte));
  sc_error_info e{0, 0, 0};
  int st = sc_zen_bitmap_encode(ic.data_ptr<int64_t>(), ic.numel(), n, parts, (uint64_t)seed, block, owner,
                                bitmap.data_ptr<uint8_t>(), nbytes, &e);
  // an index of another class: said in words (the generic argument message cannot)
  TORCH_CHECK_VALUE(!(st == SC_ERR_ARG && e.input == 0), op, ": idx must hold indices of owner ", owner,
                    "'s hash class, but idx[", e.position, "] = ", e.value, " is not in it");
  if (st) raise_status(st, op, e, InputNames{kBitmapNames, 6}, n);
  return bitmap;
}

Tensor bitmap_decode_cpu(const Tensor& bitmap, int64_t n, int64_t parts, int64_t seed, int64_t block,
                         int64_t owner) {
  const char* op = "sparsecomm.zen_bitmap_decode";
  check_vector(bitmap, op, "bitmap");
  TORCH_CHECK_TYPE(bitmap.scalar_type() == at::kByte, op, ": bitmap must be uint8, got ", bitmap.scalar_type());
  check_class_args(op, n, parts, block, owner);
  Tensor bc = bitmap.contiguous();
  int64_t count = 0;
  call_kernel(op, {kBitmapNames, 6}, sc_zen_bitmap_decode, bc.data_ptr<uint8_t>(), bc.numel(), n, parts,
              (uint64_t)seed, block, owner, nullptr, 0, &count);
  Tensor out = empty_out(count, bc.options().dtype(at::kLong));
  call_kernel(op, {kBitmapNames, 6}, sc_zen_bitmap_decode, bc.data_ptr<uint8_t>(), bc.numel(), n, parts,
              (uint64_t)seed, block, owner, out.data_ptr<int64_t>(), count, &count);
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(sparsecomm, m) {
  // stable partition of ascending (idx, val) by hash owner: (idx, val) grouped by owner, counts per owner
  m.def("zen_partition(Tensor idx, Tensor val, int n, int parts, int seed, int block) -> "
        "(Tensor idx, Tensor val, Tensor counts)");
  // uint8 bitmap over owner's hash class of its ascending indices idx
  m.def("zen_bitmap_encode(Tensor idx, int n, int parts, int seed, int block, int owner) -> Tensor");
  // the ascending int64 indices of a class bitmap (validated: length, zero padding bits)
  m.def("zen_bitmap_decode(Tensor bitmap, int n, int parts, int seed, int block, int owner) -> Tensor");
}

TORCH_LIBRARY_IMPL(sparsecomm, CPU, m) {
  m.impl("zen_partition", &partition_cpu);
  m.impl("zen_bitmap_encode", &bitmap_encode_cpu);
  m.impl("zen_bitmap_decode", &bitmap_decode_cpu);
}
