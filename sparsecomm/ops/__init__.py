"""Selection, sparse-vector, sparse-stream, QSGD, Count-Sketch, DenseStream, SKCompress and ZEN kernels, and
the checks of received messages: the one face of sparsecomm's op layer (the hot path of every
algorithm; the wire formats' validating decoders call the checks).

Every function here is a ``torch.ops.sparsecomm`` custom op (schemas in ``csrc/ops*.cpp``)
with a CPU kernel in C (``csrc/cpu``, multi-threaded with OpenMP using
``torch.get_num_threads()`` threads), a torch implementation for other devices
(``ops/_torch_impl/``) and a fake kernel for ``torch.compile`` (``ops/_fake.py``). Ops
that write in place return nothing at the op level; these Python faces return the
updated tensor for convenience.

Conventions shared by all functions:

* Top-k is by magnitude ``|x|``. Ties in ``|x|`` are broken by the lower index (``+0.0``
  and ``-0.0`` are equal), ``Inf`` is the largest magnitude, and an input containing NaN
  raises ``ValueError``. Indices are int64 and ascending, values are ``x[indices]`` with
  their original sign.
* COO vectors are pairs ``(idx, val)`` of 1-D tensors of the same length; ``idx`` is
  int32 or int64, strictly ascending (sorted, no duplicates); ``val`` is float32,
  float64, float16 or bfloat16. All vectors passed to one call share the index dtype and
  the value dtype. The kernels check order and range in full.
* float16 / bfloat16 sums are accumulated in float32 and rounded once
  (round-to-nearest-even) to the value dtype. Summation order is fixed (input order), so
  results are bit-identical for identical inputs on every rank.
* ``SPARSECOMM_OPS=torch`` (environment) or ``with use_torch_ops():`` runs every op's
  torch implementation on CPU tensors too (the GPU fallback path, tested everywhere).
* Errors (``ops/_errors.py``): bad shapes, values, orders or ranges raise ``ValueError``;
  bad dtypes ``TypeError``; an allocation failure ``MemoryError``; malformed peer data
  :class:`sparsecomm.errors.WireFormatError`.
"""

from __future__ import annotations

from .. import _C  # registers torch.ops.sparsecomm.*
from .._C import advise_huge  # transparent huge pages for a fresh CPU buffer (the reducer's results)
from . import _fake, _torch_impl  # noqa: F401  (fake kernels; torch kernels for CUDA)
from ._switch import apply_environment as _apply_environment
from ._switch import torch_ops_enabled, use_torch_ops
from ._coo import __all__ as _coo_all
from ._densestream import __all__ as _densestream_all
from ._densestream import (densestream_add, densestream_add_into_, densestream_encode_coo, densestream_encode_dense,
                           densestream_slice, densestream_to_coo)
from ._coo import (NONFINITE_NAN, NONFINITE_NEG_INF, NONFINITE_POS_INF, block_topk, block_topk_count, gather, merge_add,
                   merge_add_many, nonfinite_flags, release_caches,
                   scatter_add_, scatter_set_, topk, topk_accum_, topk_radix)
from ._sketch import __all__ as _sketch_all
from ._sketch import (MAX_ROWS, RUN, sketch_build_, sketch_build_coo_, sketch_estimate, sketch_estimate_at,
                      sketch_heavy_hitters, sketch_l2sq, sketch_merge_, sketch_new)
from ._skcompress import __all__ as _skcompress_all
from ._skcompress import (EXACT_ALWAYS, INDEX_CODECS, MAX_Q, MAX_ROWS_SKC, MAX_T, PREFIXES, SKC_REVISION, SKETCH_K,
                          VALUE_CODECS,
                          skcompress_decode, skcompress_encode, skcompress_encode_decoded, skcompress_quantiles,
                          skcompress_quantize)
from ._stream import __all__ as _stream_all
from ._stream import (qsgd_dequantize, qsgd_quantize, stream_add_dd_, stream_add_sd_, stream_add_ss,
                      stream_concat)
from ._wire import __all__ as _wire_all
from ._zen import __all__ as _zen_all
from ._zen import zen_bitmap_decode, zen_bitmap_encode, zen_class_blocks, zen_partition
from ._wire import WIRE_FIELDS, WIRE_PREFIX_NBYTES, WireResult, wire_check, wire_check_densestream

__all__ = [*_coo_all, *_stream_all, *_sketch_all, *_densestream_all, *_skcompress_all, *_wire_all, *_zen_all, "use_torch_ops",
           "torch_ops_enabled", "CUDA_KERNELS", "advise_huge", "torch_implementation"]

#: True when the extension was built with the CUDA kernels of csrc/cuda (opt-in at build time:
#: SPARSECOMM_CUDA_KERNELS=1, see setup.py); CUDA tensors then run them, else the torch
#: implementations of ops/_torch_impl/.
CUDA_KERNELS: bool = bool(getattr(_C, "CUDA_KERNELS", 0))
if not CUDA_KERNELS:
    _torch_impl.register("cuda")
else:
    _torch_impl.register("cuda", _torch_impl.cuda_gaps())
_apply_environment()


def torch_implementation(name: str):
    """The torch implementation of the op ``name`` (what CUDA tensors run in a build without
    the CUDA kernels), callable on any device: for comparisons and benchmarks."""
    table = _torch_impl.impls()
    if name not in table:
        raise ValueError(f"sparsecomm.ops has no op {name!r} with a torch implementation; "
                         f"known: {', '.join(sorted(table))}")
    return table[name]
