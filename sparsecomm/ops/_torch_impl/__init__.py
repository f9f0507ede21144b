"""Torch implementations of the ops, for devices without C kernels: the same contracts as
the C kernels and their bindings (argument checks, tie rule, summation order, validation,
error types), written with plain torch so they run on any device. Correct, not tuned.

They are registered for the CUDA dispatch key by :func:`register` unless the extension
was built with the CUDA kernels of ``csrc/cuda`` (``SPARSECOMM_CUDA_KERNELS=1``), and for
CPU tensors too while the fallback switch is on (``SPARSECOMM_OPS=torch`` or
:func:`sparsecomm.ops.use_torch_ops`), so the code a GPU user runs without CUDA kernels is
tested on every machine: ``tests/test_torch_fallback.py`` compares every op with the C
kernel bit for bit and runs every algorithm through it.

One module per family of C kernels: :mod:`.coo` (top-k, COO merges, scatters, gathers),
:mod:`.stream` (dense and sparse streams, QSGD), :mod:`.sketch` (Count-Sketch),
:mod:`.densestream`, :mod:`.zen`; :mod:`.checks` holds the argument checks they share and
:mod:`.splitmix` the hash QSGD and the sketch draw from.

Bit-identical to the C kernels on every device: top-k and block top-k, merges (sums in
list order, half types in float32 rounded once), gathers, scatters with distinct indices,
concatenation, QSGD (the same splitmix64 draws), dequantization, sketch hashing and
estimates (up to the sign of a zero estimate, which a median may pick either way).
Scatters with repeated indices and sketch builds use ``index_add_``: serial in input order
on CPU (so equal to the C kernels), in an unspecified order on CUDA (float sums may then
differ in the last bits between runs; gs-SGD broadcasts the root's sum, so ranks still agree).
"""

from __future__ import annotations

from typing import Callable, Dict, Optional, Sequence

import torch

from .coo import (block_topk, gather, merge_add, merge_add_many, nonfinite_flags, scatter_add_, scatter_set_, topk,
                  topk_accum_, topk_radix)
from .densestream import (densestream_add, densestream_add_into_, densestream_encode_coo, densestream_encode_dense,
                          densestream_slice, densestream_to_coo)
from .sketch import RUN, sketch_build_, sketch_build_coo_, sketch_estimate, sketch_estimate_at
from .stream import qsgd_dequantize, qsgd_quantize, stream_add_dd_, stream_concat
from .zen import zen_bitmap_decode, zen_bitmap_encode, zen_partition

__all__ = ["topk", "block_topk", "topk_accum_", "merge_add", "merge_add_many", "scatter_add_", "scatter_set_",
           "gather", "nonfinite_flags", "stream_add_dd_",
           "stream_concat", "qsgd_quantize", "qsgd_dequantize", "sketch_build_coo_", "sketch_build_",
           "sketch_estimate_at", "sketch_estimate", "densestream_encode_coo", "densestream_encode_dense",
           "densestream_add", "densestream_slice", "densestream_add_into_", "densestream_to_coo", "zen_partition", "zen_bitmap_encode",
           "zen_bitmap_decode", "impls",
           "register", "RUN"]


def _no_return(fn: Callable) -> Callable:
    def op(*args):
        fn(*args)
    return op


def impls() -> Dict[str, Callable]:
    """Op name -> torch implementation, with the op schemas' signatures."""
    return {
        "topk": topk, "topk_radix": topk_radix, "block_topk": block_topk,
        "topk_accum_": _no_return(topk_accum_), "merge_add": merge_add,
        "merge_add_many": lambda i, v, n=-1: merge_add_many(i, v, None if n < 0 else n),
        "scatter_add_": _no_return(scatter_add_), "scatter_set_": _no_return(scatter_set_), "gather": gather,
        "nonfinite_flags": nonfinite_flags,
        "stream_add_dd_": _no_return(stream_add_dd_), "stream_concat": stream_concat,
        "qsgd_quantize": qsgd_quantize, "qsgd_dequantize": qsgd_dequantize,
        "sketch_build_": _no_return(sketch_build_), "sketch_build_coo_": _no_return(sketch_build_coo_),
        "sketch_estimate": sketch_estimate, "sketch_estimate_at": sketch_estimate_at,
        "densestream_encode_coo": densestream_encode_coo, "densestream_encode_dense": densestream_encode_dense,
        "densestream_add": densestream_add, "densestream_slice": densestream_slice,
        "densestream_add_into_": _no_return(densestream_add_into_), "densestream_to_coo": densestream_to_coo,
        "zen_partition": zen_partition, "zen_bitmap_encode": zen_bitmap_encode, "zen_bitmap_decode": zen_bitmap_decode,
    }


def cuda_gaps() -> list:
    """The ops the extension registered no CUDA kernel for: with the CUDA kernels built, CUDA
    tensors still run these torch implementations (docs/kernels.md, "GPU"). Asked of the
    dispatcher rather than listed, so an op added without a CUDA kernel is never left with none."""
    return [name for name in impls()
            if not torch._C._dispatch_has_kernel_for_dispatch_key(f"sparsecomm::{name}", "CUDA")]


def register(device: str = "cuda", names: Optional[Sequence[str]] = None) -> None:
    """Registers these implementations as the ``device`` kernels of the sparsecomm ops
    (``names``: only those)."""
    for name, fn in impls().items():
        if names is None or name in names:
            torch.library.register_kernel(f"sparsecomm::{name}", device, fn)
