"""Fake (meta) kernels of every sparsecomm op: output shapes and dtypes without data,
so the ops trace under ``torch.compile`` and pass ``torch.library.opcheck``.

Sizes that depend on the data (the length of a merge's union) are unbacked symbolic
sizes (``ctx.new_dynamic_size()``); ops that write in place return nothing.
"""

from __future__ import annotations

import torch

__all__: list[str] = []


def _pair(values_like: torch.Tensor, m) -> tuple[torch.Tensor, torch.Tensor]:
    return values_like.new_empty(m), values_like.new_empty(m, dtype=torch.int64)


@torch.library.register_fake("sparsecomm::topk")
def _topk(x, k):
    return _pair(x, torch.sym_min(k, x.shape[0]))


@torch.library.register_fake("sparsecomm::topk_radix")
def _topk_radix(x, k):
    return _pair(x, torch.sym_min(k, x.shape[0]))


@torch.library.register_fake("sparsecomm::block_topk")
def _block_topk(x, num_blocks, k_per_block):
    # blocks of floor(n/B) + 1 (r of them) and floor(n/B) elements (sc_block_topk_count)
    n = x.shape[0]
    q, r = n // num_blocks, n % num_blocks
    m = r * torch.sym_min(k_per_block, q + 1) + (num_blocks - r) * torch.sym_min(k_per_block, q)
    return _pair(x, m)


@torch.library.register_fake("sparsecomm::topk_accum_")
def _topk_accum_(acc, g, num_blocks, k_per_block, clear, values, indices):
    return None


def _union(idx_like: torch.Tensor, val_like: torch.Tensor):
    m = torch.library.get_ctx().new_dynamic_size()
    return idx_like.new_empty(m), val_like.new_empty(m)


@torch.library.register_fake("sparsecomm::merge_add")
def _merge_add(idx_a, val_a, idx_b, val_b, n=-1):
    return _union(idx_a, val_a)


@torch.library.register_fake("sparsecomm::merge_add_many")
def _merge_add_many(indices, values, n=-1):
    return _union(indices[0], values[0])


@torch.library.register_fake("sparsecomm::scatter_add_")
def _scatter_add_(dense, idx, val):
    return None


@torch.library.register_fake("sparsecomm::scatter_set_")
def _scatter_set_(dense, idx, val, zero_rest=False):
    return None


@torch.library.register_fake("sparsecomm::nonfinite_flags")
def _nonfinite_flags(x):
    return x.new_empty((), dtype=torch.int32)


@torch.library.register_fake("sparsecomm::gather")
def _gather(dense, idx):
    return dense.new_empty(idx.shape[0])


@torch.library.register_fake("sparsecomm::stream_add_dd_")
def _stream_add_dd_(a, b):
    return None


@torch.library.register_fake("sparsecomm::stream_concat")
def _stream_concat(idx_a, val_a, idx_b, val_b):
    m = idx_a.shape[0] + idx_b.shape[0]
    return idx_a.new_empty(m), val_a.new_empty(m)


@torch.library.register_fake("sparsecomm::qsgd_quantize")
def _qsgd_quantize(x, bits, bucket, seed):
    n = x.shape[0]
    return (x.new_empty((n * bits + 7) // 8, dtype=torch.uint8),
            x.new_empty((n + bucket - 1) // bucket, dtype=torch.float32))


@torch.library.register_fake("sparsecomm::qsgd_dequantize")
def _qsgd_dequantize(packed, scales, n, bits, bucket, dtype):
    return packed.new_empty(n, dtype=dtype)


@torch.library.register_fake("sparsecomm::sketch_build_")
def _sketch_build_(table, x, seed):
    return None


@torch.library.register_fake("sparsecomm::sketch_build_coo_")
def _sketch_build_coo_(table, idx, val, n, seed):
    return None


@torch.library.register_fake("sparsecomm::sketch_estimate")
def _sketch_estimate(table, n, seed):
    return table.new_empty(n)


@torch.library.register_fake("sparsecomm::sketch_estimate_at")
def _sketch_estimate_at(table, idx, seed):
    return table.new_empty(idx.shape[0])


def _blocks(values_like: torch.Tensor):
    ctx = torch.library.get_ctx()
    nb, nv = ctx.new_dynamic_size(), ctx.new_dynamic_size()
    i64 = torch.int64
    return values_like.new_empty(nb, dtype=i64), values_like.new_empty(nb, dtype=i64), values_like.new_empty(nv)


@torch.library.register_fake("sparsecomm::densestream_encode_coo")
def _densestream_encode_coo(idx, val, n, width):
    return _blocks(val)


@torch.library.register_fake("sparsecomm::densestream_encode_dense")
def _densestream_encode_dense(x, width):
    return _blocks(x)


@torch.library.register_fake("sparsecomm::densestream_add")
def _densestream_add(starts_a, lengths_a, values_a, starts_b, lengths_b, values_b, n, width):
    return _blocks(values_a)


@torch.library.register_fake("sparsecomm::densestream_slice")
def _densestream_slice(starts, lengths, values, n, lo, hi, width):
    return _blocks(values)


@torch.library.register_fake("sparsecomm::densestream_add_into_")
def _densestream_add_into_(dense, starts, lengths, values):
    return None


@torch.library.register_fake("sparsecomm::densestream_to_coo")
def _densestream_to_coo(starts, lengths, values, n):
    m = torch.library.get_ctx().new_dynamic_size()
    return starts.new_empty(m), values.new_empty(m)


def _wire_check(payload, expect, nbytes=-1):
    # the result is data-dependent ints: under a fake tensor mode, unbacked symbols
    ctx = torch.library.get_ctx()
    return [ctx.new_dynamic_size() for _ in range(17)]


for _form in ("header", "coo", "stream", "qsgd"):
    torch.library.register_fake(f"sparsecomm::wire_check_{_form}")(_wire_check)


@torch.library.register_fake("sparsecomm::wire_check_densestream")
def _wire_check_densestream(payload, expect):
    ctx = torch.library.get_ctx()
    return [ctx.new_dynamic_size() for _ in range(11)]


@torch.library.register_fake("sparsecomm::skcompress_quantiles")
def _skcompress_quantiles(x, nq, exact_max):
    return x.new_empty(nq + 1, dtype=torch.float64)


@torch.library.register_fake("sparsecomm::skcompress_quantize")
def _skcompress_quantize(v, q, exact_max):
    return (v.new_empty(v.shape[0], dtype=torch.int32), v.new_empty((2, q // 2 + 1), dtype=torch.float64),
            v.new_empty(2, dtype=torch.int64))


@torch.library.register_fake("sparsecomm::skcompress_encode")
def _skcompress_encode(idx, val, n, index_codec, value_codec, q, s, t, r, m, prefix, exact_max):
    return val.new_empty(torch.library.get_ctx().new_dynamic_size(), dtype=torch.uint8)


@torch.library.register_fake("sparsecomm::skcompress_encode_decoded")
def _skcompress_encode_decoded(idx, val, n, index_codec, value_codec, q, s, t, r, m, prefix, exact_max):
    return (val.new_empty(torch.library.get_ctx().new_dynamic_size(), dtype=torch.uint8),
            val.new_empty(val.shape[0]))


@torch.library.register_fake("sparsecomm::skcompress_decode")
def _skcompress_decode(body, n, count, dtype, expect_index, expect_value):
    return body.new_empty(count, dtype=torch.int64), body.new_empty(count, dtype=dtype)


@torch.library.register_fake("sparsecomm::zen_partition")
def _zen_partition(idx, val, n, parts, seed, block):
    return idx.new_empty(idx.shape[0]), val.new_empty(val.shape[0]), idx.new_empty(parts)


@torch.library.register_fake("sparsecomm::zen_bitmap_encode")
def _zen_bitmap_encode(idx, n, parts, seed, block, owner):
    # ceil(class size / 8): the class depends on the hash, not on the shapes
    return idx.new_empty(torch.library.get_ctx().new_dynamic_size(), dtype=torch.uint8)


@torch.library.register_fake("sparsecomm::zen_bitmap_decode")
def _zen_bitmap_decode(bitmap, n, parts, seed, block, owner):
    return bitmap.new_empty(torch.library.get_ctx().new_dynamic_size(), dtype=torch.int64)
