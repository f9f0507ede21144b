// ZEN ops ("ZEN: Empowering Distributed Training with Sparsity-driven Data
// Synchronization", OSDI 2025): bindings of csrc/cpu/zen.c (C ABI in
// csrc/include/sparsecomm/zen.h), written like every binding: checks from
// csrc/op_checks.h (shared with the CUDA bindings, csrc/ops_cuda.cpp), outputs allocated,
// one kernel call through call_kernel.
#include <torch/library.h>

#include <cstring>
#include <tuple>

#include "checks.h"
#include "op_checks.h"
#include "sparsecomm/zen.h"

namespace {

using at::Tensor;
using namespace sparsecomm;

std::tuple<Tensor, Tensor, Tensor> partition_cpu(const Tensor& idx, const Tensor& val, int64_t n, int64_t parts,
                                                 int64_t seed, int64_t block) {
  const char* op = "sparsecomm.zen_partition";
  sc_dtype vt = check_zen_partition_args(Device::Cpu, op, idx, val, n, parts, block);
  Tensor ic = idx.contiguous(), vc = val.contiguous();
  Tensor oi = empty_out(ic.numel(), ic.options());
  Tensor ov = empty_out(vc.numel(), vc.options());
  Tensor counts = at::empty({parts}, ic.options());
  call_kernel(op, {kZenPartitionNames, 6}, n, sc_zen_partition, vt, ic.data_ptr<int64_t>(), vc.data_ptr(),
              ic.numel(), n, parts, (uint64_t)seed, block, oi.data_ptr<int64_t>(), ov.data_ptr(),
              counts.data_ptr<int64_t>());
  return {oi, ov, counts};
}

int64_t class_size(const char* op, int64_t n, int64_t parts, int64_t seed, int64_t block, int64_t owner) {
  int64_t size = 0;
  call_kernel(op, {kZenBitmapNames, 6}, sc_zen_class_size, n, parts, (uint64_t)seed, block, owner, &size);
  return size;
}

Tensor bitmap_encode_cpu(const Tensor& idx, int64_t n, int64_t parts, int64_t seed, int64_t block, int64_t owner) {
  const char* op = "sparsecomm.zen_bitmap_encode";
  check_zen_indices(Device::Cpu, op, idx);
  check_zen_class_args(op, n, parts, block, owner);
  Tensor ic = idx.contiguous();
  const int64_t nbytes = (class_size(op, n, parts, seed, block, owner) + 7) / 8;
  Tensor bitmap = at::empty({nbytes}, ic.options().dtype(at::kByte));
  call_kernel(op, {kZenBitmapNames, 6}, n, zen_encode_words(op, owner), sc_zen_bitmap_encode,
              ic.data_ptr<int64_t>(), ic.numel(), n, parts, (uint64_t)seed, block, owner,
              bitmap.data_ptr<uint8_t>(), nbytes);
  return bitmap;
}

Tensor bitmap_decode_cpu(const Tensor& bitmap, int64_t n, int64_t parts, int64_t seed, int64_t block,
                         int64_t owner) {
  const char* op = "sparsecomm.zen_bitmap_decode";
  check_zen_bitmap(Device::Cpu, op, bitmap);
  check_zen_class_args(op, n, parts, block, owner);
  Tensor bc = bitmap.contiguous();
  // every set bit is at most one index: the fill call validates the bitmap in full (length,
  // padding bits) while it decodes, so no separate counting walk over the class is needed
  const uint8_t* bits = bc.data_ptr<uint8_t>();
  const int64_t nbytes = bc.numel();
  int64_t bound = 0, j = 0;
  for (; j + 8 <= nbytes; j += 8) {
    uint64_t w;
    std::memcpy(&w, bits + j, 8);
    bound += sc_zen_popcount64(w);
  }
  for (; j < nbytes; j++) bound += sc_zen_popcount64(bits[j]);
  Tensor out = empty_out(bound, bc.options().dtype(at::kLong));
  int64_t count = 0;
  call_kernel(op, {kZenDecodeNames, 6}, sc_zen_bitmap_decode, bits, nbytes, n, parts, (uint64_t)seed, block, owner,
              out.data_ptr<int64_t>(), bound, &count);
  return count == bound ? out : out.narrow(0, 0, count).clone();
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
