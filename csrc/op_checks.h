// Argument checks of the ops bound on both devices (csrc/ops*.cpp for the CPU,
// csrc/ops_cuda.cpp for CUDA): each op's checks are written once here, with the
// device as an argument, so both bindings check the same things in the same
// order and say the same words. The tensor's device is checked against the
// op's first tensor argument (Placement, checks.h).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "checks.h"
#include "sparsecomm/sketch.h"
#include "sparsecomm/zen.h"

namespace sparsecomm {

// ------------------------------------------------------------------ top-k

inline sc_dtype check_topk_args(Device dev, const char* op, const Tensor& x, int64_t k) {
  Placement(dev, x).check_vector(x, op, "x");
  check_nonnegative(k, op, "k");
  return value_dtype(x, op, "x");
}

inline void check_num_blocks(int64_t num_blocks, const char* op) {
  TORCH_CHECK_VALUE(num_blocks >= 1, op, ": num_blocks must be >= 1, got ", num_blocks);
}

inline sc_dtype check_block_topk_args(Device dev, const char* op, const Tensor& x,
                                      int64_t num_blocks, int64_t k_per_block) {
  Placement(dev, x).check_vector(x, op, "x");
  check_num_blocks(num_blocks, op);
  check_nonnegative(k_per_block, op, "k_per_block");
  return value_dtype(x, op, "x");
}

// ------------------------------------------------------------------ COO

// The inputs of a merge, checked and made contiguous, as the kernel takes them.
struct MergeInputs {
  std::vector<Tensor> idx, val;
  std::vector<const void*> idx_ptr, val_ptr;
  std::vector<int64_t> lens;
  int64_t total = 0;
  sc_index_t itype = SC_I64;
  sc_dtype vtype = SC_F32;
};

// Merges take the COO vectors (idx[i], val[i]); the kernel checks order and range.
inline MergeInputs merge_inputs(Device dev, const char* op, const std::vector<Tensor>& idx,
                                const std::vector<Tensor>& val,
                                const std::vector<std::string>& inames,
                                const std::vector<std::string>& vnames) {
  TORCH_CHECK_VALUE(!idx.empty(), op, ": needs at least one input vector, got none");
  TORCH_CHECK_VALUE(idx.size() == val.size(), op,
                    ": indices and values must be lists of the same length, got ", idx.size(),
                    " and ", val.size());
  const Placement on(dev, idx[0]);
  MergeInputs in;
  for (size_t i = 0; i < idx.size(); i++) {
    on.check_vector(idx[i], op, inames[i]);
    on.check_vector(val[i], op, vnames[i]);
    sc_index_t it = index_dtype(idx[i], op, inames[i]);
    sc_dtype vt = value_dtype(val[i], op, vnames[i]);
    if (i == 0) {
      in.itype = it;
      in.vtype = vt;
    } else {
      check_same_dtype(idx[0], idx[i], op, inames[0], inames[i]);
      check_same_dtype(val[0], val[i], op, vnames[0], vnames[i]);
    }
    check_same_length(idx[i], val[i], op, inames[i], vnames[i]);
    in.idx.push_back(idx[i].contiguous());
    in.val.push_back(val[i].contiguous());
    in.idx_ptr.push_back(in.idx.back().data_ptr());
    in.val_ptr.push_back(in.val.back().data_ptr());
    in.lens.push_back(in.idx.back().numel());
    in.total += in.lens.back();
  }
  return in;
}

// The argument names of merge_add_many: indices[i] and values[i].
inline std::pair<std::vector<std::string>, std::vector<std::string>> merge_many_names(size_t n) {
  std::vector<std::string> inames, vnames;
  for (size_t i = 0; i < n; i++) {
    inames.push_back("indices[" + std::to_string(i) + "]");
    vnames.push_back("values[" + std::to_string(i) + "]");
  }
  return {inames, vnames};
}

// A scatter into dense (scatter_add_, scatter_set_): the value and index types; the
// kernel checks index range and overlap itself.
inline std::pair<sc_dtype, sc_index_t> check_scatter_args(Device dev, const char* op,
                                                          const Tensor& dense, const Tensor& idx,
                                                          const Tensor& val) {
  const Placement on(dev, dense);
  on.check_vector(dense, op, "dense");
  on.check_vector(idx, op, "idx");
  on.check_vector(val, op, "val");
  check_contiguous(dense, op, "dense");
  sc_dtype vt = value_dtype(dense, op, "dense");
  sc_index_t it = index_dtype(idx, op, "idx");
  check_same_dtype(dense, val, op, "dense", "val");
  check_same_length(idx, val, op, "idx", "val");
  return {vt, it};
}

inline std::pair<sc_dtype, sc_index_t> check_gather_args(Device dev, const char* op,
                                                         const Tensor& dense, const Tensor& idx) {
  const Placement on(dev, dense);
  on.check_vector(dense, op, "dense");
  on.check_vector(idx, op, "idx");
  sc_dtype vt = value_dtype(dense, op, "dense");
  sc_index_t it = index_dtype(idx, op, "idx");
  return {vt, it};
}

// ------------------------------------------------------------------ streams, QSGD

inline sc_dtype check_add_dd_args(Device dev, const char* op, const Tensor& a, const Tensor& b) {
  const Placement on(dev, a);
  on.check_vector(a, op, "a");
  on.check_vector(b, op, "b");
  check_contiguous(a, op, "a");
  check_same_length(a, b, op, "a", "b");
  check_same_dtype(a, b, op, "a", "b");
  return value_dtype(a, op, "a", Floats::Full);
}

inline std::pair<sc_index_t, sc_dtype> check_concat_args(Device dev, const char* op,
                                                         const Tensor& ia, const Tensor& va,
                                                         const Tensor& ib, const Tensor& vb) {
  const Placement on(dev, ia);
  on.check_vector(ia, op, "idx_a");
  on.check_vector(va, op, "val_a");
  on.check_vector(ib, op, "idx_b");
  on.check_vector(vb, op, "val_b");
  check_same_length(ia, va, op, "idx_a", "val_a");
  check_same_length(ib, vb, op, "idx_b", "val_b");
  check_same_dtype(ia, ib, op, "idx_a", "idx_b");
  check_same_dtype(va, vb, op, "val_a", "val_b");
  sc_index_t it = index_dtype(ia, op, "idx_a");
  sc_dtype vt = value_dtype(va, op, "val_a");
  return {it, vt};
}

inline void check_qsgd_options(const char* op, int64_t bits, int64_t bucket) {
  TORCH_CHECK_VALUE(bits == 4 || bits == 8, op, ": bits must be 4 or 8, got ", bits);
  TORCH_CHECK_VALUE(bucket >= 1 && (bits == 8 || bucket % 2 == 0), op,
                    ": bucket_size must be >= 1 (and even for 4 bits), got ", bucket);
}

// Sizes of a quantized vector of n entries: packed bytes and float32 scales.
inline int64_t qsgd_packed_bytes(int64_t n, int64_t bits) { return (n * bits + 7) / 8; }
inline int64_t qsgd_scale_count(int64_t n, int64_t bucket) { return (n + bucket - 1) / bucket; }

inline sc_dtype check_qsgd_quantize_args(Device dev, const char* op, const Tensor& x,
                                         int64_t bits, int64_t bucket) {
  Placement(dev, x).check_vector(x, op, "x");
  check_qsgd_options(op, bits, bucket);
  return value_dtype(x, op, "x", Floats::Full);
}

inline sc_dtype check_qsgd_dequantize_args(Device dev, const char* op, const Tensor& packed,
                                           const Tensor& scales, int64_t n, int64_t bits,
                                           int64_t bucket, at::ScalarType dtype) {
  const Placement on(dev, packed);
  on.check_vector(packed, op, "packed");
  on.check_vector(scales, op, "scales");
  check_qsgd_options(op, bits, bucket);
  check_nonnegative(n, op, "n");
  TORCH_CHECK_TYPE(packed.scalar_type() == at::kByte, op, ": packed must be uint8, got ",
                   packed.scalar_type());
  TORCH_CHECK_TYPE(scales.scalar_type() == at::kFloat, op, ": scales must be float32, got ",
                   scales.scalar_type());
  TORCH_CHECK_VALUE(packed.numel() == qsgd_packed_bytes(n, bits), op, ": packed must hold ",
                    qsgd_packed_bytes(n, bits), " bytes for n = ", n, ", got ", packed.numel());
  TORCH_CHECK_VALUE(scales.numel() == qsgd_scale_count(n, bucket), op, ": scales must hold ",
                    qsgd_scale_count(n, bucket), " entries, got ", scales.numel());
  return value_dtype(dtype, op, "dtype", Floats::Full);
}

// ------------------------------------------------------------------ Count-Sketch

// What err.input of the sketch kernels indexes.
inline const std::string kSketchNames[] = {"table", "idx", "val"};

inline sc_dtype check_sketch_table(Device dev, const Tensor& table, const char* op) {
  TORCH_CHECK_VALUE(table.dim() == 2, op,
                    ": table must be a 2-D (rows x cols) tensor, got shape ", table.sizes());
  Placement(dev, table).check(table, op, "table");
  TORCH_CHECK_VALUE(table.size(0) >= 1 && table.size(0) <= SC_SKETCH_MAX_ROWS, op,
                    ": table must have 1..", SC_SKETCH_MAX_ROWS, " rows, got ", table.size(0));
  TORCH_CHECK_VALUE(table.size(1) >= 1 && table.size(1) <= 0xFFFFFFFFll, op,
                    ": table must have 1..2^32-1 columns, got ", table.size(1));
  return value_dtype(table, op, "table", Floats::Full);
}

// int64 indices for the kernel (which checks their range), on the table's device.
inline Tensor sketch_indices(Device dev, const Tensor& idx, const Tensor& table, const char* op) {
  Placement(dev, table).check_vector(idx, op, "idx");
  index_dtype(idx, op, "idx");
  return idx.to(at::kLong).contiguous();
}

// ------------------------------------------------------------------ ZEN

// What err.input of the ZEN kernels indexes.
inline const std::string kZenPartitionNames[] = {"idx", "n", "parts", "block", "owner", "val"};
inline const std::string kZenBitmapNames[] = {"idx", "n", "parts", "block", "owner", "bitmap"};
// the decode's input 0 is the bitmap (a malformed one came from a peer)
inline const std::string kZenDecodeNames[] = {"bitmap", "n", "parts", "block", "owner", "idx"};

inline void check_zen_indices(Device dev, const char* op, const Tensor& idx) {
  Placement(dev, idx).check_vector(idx, op, "idx");
  TORCH_CHECK_TYPE(idx.scalar_type() == at::kLong, op, ": idx must be int64, got ", idx.scalar_type());
}

inline void check_zen_parts_block(const char* op, int64_t parts, int64_t block) {
  TORCH_CHECK_VALUE(parts >= 1 && parts <= SC_ZEN_MAX_PARTS, op, ": parts must be in 1..", SC_ZEN_MAX_PARTS,
                    ", got ", parts);
  TORCH_CHECK_VALUE(sc_zen_log2(block) >= 0, op, ": block must be a power of two >= 1, got ", block);
}

// zen_partition: the value type of val.
inline sc_dtype check_zen_partition_args(Device dev, const char* op, const Tensor& idx, const Tensor& val,
                                         int64_t n, int64_t parts, int64_t block) {
  check_zen_indices(dev, op, idx);
  Placement(dev, idx).check_vector(val, op, "val");
  check_same_length(idx, val, op, "idx", "val");
  sc_dtype vt = value_dtype(val, op, "val");
  check_zen_parts_block(op, parts, block);
  check_nonnegative(n, op, "n");
  return vt;
}

// The scalars that name one owner's hash class (zen_bitmap_encode, zen_bitmap_decode).
inline void check_zen_class_args(const char* op, int64_t n, int64_t parts, int64_t block, int64_t owner) {
  check_nonnegative(n, op, "n");
  check_zen_parts_block(op, parts, block);
  TORCH_CHECK_VALUE(owner >= 0 && owner < parts, op, ": owner must be in [0, parts = ", parts, "), got ",
                    owner);
}

inline void check_zen_bitmap(Device dev, const char* op, const Tensor& bitmap) {
  Placement(dev, bitmap).check_vector(bitmap, op, "bitmap");
  TORCH_CHECK_TYPE(bitmap.scalar_type() == at::kByte, op, ": bitmap must be uint8, got ", bitmap.scalar_type());
}

// call_kernel's words for a bitmap encode: an index of another class is said in words (the
// generic argument message cannot), the rest as every kernel's.
inline auto zen_encode_words(const char* op, int64_t owner) {
  return OwnWords{[op, owner](int st, const sc_error_info& e) {
    TORCH_CHECK_VALUE(!(st == SC_ERR_ARG && e.input == 0), op, ": idx must hold indices of owner ", owner,
                      "'s hash class, but idx[", e.position, "] = ", e.value, " is not in it");
  }};
}

}  // namespace sparsecomm
