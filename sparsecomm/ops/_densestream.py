"""DenseStream ops ("DenseStream: A Novel Data Representation for Gradient Sparsification",
section III-A): the Python face of ``csrc/ops_densestream.cpp``.

A DenseStream of a length-``n`` vector is three tensors ``(starts, lengths, values)``:
block b covers ``[starts[b], starts[b] + lengths[b])`` (int64, sorted, disjoint) and its
values lie back to back in ``values``. Every producing op returns the canonical form of
section III-A: the first and last value of each block non-zero, and no run of more than
``T = ceil(2 * width / K)`` zeros inside a block (``K`` the value size in bytes,
``width`` the bytes of an index or length field: a longer run costs more than a new
block's index and length, so the block is split there). The encoding of a vector is
unique. Zero means +0.0 or -0.0 (NaN is not zero); zeros inside blocks are +0.0.

``width`` (1..8) defaults to the fewest bytes that hold ``n - 1`` (the kernel's
``sc_ds_width``, also :func:`sparsecomm.formats.densestream.densestream_width`); the paper's
own experiments use 4 (an unsigned int).
Blocks handed in are checked in full (sorted, disjoint, inside ``[0, n)``, lengths >= 1
summing to ``values.numel()``): ``ValueError`` otherwise.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from ._errors import translating

__all__ = ["densestream_encode_coo", "densestream_encode_dense", "densestream_add", "densestream_slice",
           "densestream_add_into_", "densestream_to_coo"]

_ops = torch.ops.sparsecomm
Blocks = Tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def _w(width: Optional[int]) -> int:
    return 0 if width is None else width  # 0: the kernel's fewest bytes for n


@translating
def densestream_encode_coo(idx: torch.Tensor, val: torch.Tensor, n: int, width: Optional[int] = None) -> Blocks:
    """The DenseStream of a COO vector (``idx`` strictly ascending, < ``n``; int32 or int64).

    Entries whose value is zero are zeros of the vector and are dropped.
    """
    return _ops.densestream_encode_coo(idx, val, n, _w(width))


@translating
def densestream_encode_dense(x: torch.Tensor, width: Optional[int] = None) -> Blocks:
    """The DenseStream of a dense 1-D vector."""
    return _ops.densestream_encode_dense(x, _w(width))


@translating
def densestream_add(a: Blocks, b: Blocks, n: int, width: Optional[int] = None) -> Blocks:
    """``a + b`` as a DenseStream: blocks merged, overlaps summed as ``a + b`` (half types
    in float32, rounded once), exact zeros dropped, re-split by the zero-run rule."""
    return _ops.densestream_add(*a, *b, n, _w(width))


@translating
def densestream_slice(blocks: Blocks, n: int, lo: int, hi: int, width: Optional[int] = None) -> Blocks:
    """The part of a DenseStream inside ``[lo, hi)`` (global indices), canonical."""
    return _ops.densestream_slice(*blocks, n, lo, hi, _w(width))


@translating
def densestream_add_into_(dense: torch.Tensor, blocks: Blocks) -> torch.Tensor:
    """``dense[i] += v`` for every position the blocks hold; returns ``dense``."""
    _ops.densestream_add_into_(dense, *blocks)
    return dense


@translating
def densestream_to_coo(blocks: Blocks, n: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """The non-zero entries as COO ``(int64 indices ascending, values)``."""
    return _ops.densestream_to_coo(*blocks, n)
