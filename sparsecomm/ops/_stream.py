"""Sparse-stream summation and QSGD ops (SparCML, section 3 and section 5): the Python
face of ``csrc/ops_stream.cpp``.

A stream's four summation cases map onto kernels as follows:

* sparse + sparse -- :func:`stream_add_ss`, the COO merge (:func:`sparsecomm.ops.merge_add`);
* sparse + dense  -- :func:`stream_add_sd_`, the COO scatter (:func:`sparsecomm.ops.scatter_add_`);
* dense + dense   -- :func:`stream_add_dd_`, a vectorized in-place sum;
* disjoint ranges -- :func:`stream_concat`, concatenation with the order checked.
"""

from __future__ import annotations

from typing import Tuple

import torch

from ._coo import merge_add, scatter_add_
from ._errors import translating

__all__ = ["stream_add_ss", "stream_add_sd_", "stream_add_dd_", "stream_concat", "qsgd_quantize",
           "qsgd_dequantize"]

_ops = torch.ops.sparsecomm


def stream_add_ss(idx_a: torch.Tensor, val_a: torch.Tensor, idx_b: torch.Tensor,
                  val_b: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """sparse + sparse: the sorted union, equal indices summed as ``a + b``."""
    return merge_add(idx_a, val_a, idx_b, val_b)


def stream_add_sd_(dense: torch.Tensor, idx: torch.Tensor, val: torch.Tensor) -> torch.Tensor:
    """sparse + dense, in place: ``dense[idx] += val``; returns ``dense``."""
    return scatter_add_(dense, idx, val)


@translating
def stream_add_dd_(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """dense + dense, in place: ``a += b`` (float32/float64, ``a`` contiguous); returns ``a``.

    ``b`` may be ``a`` itself; a ``b`` that partially overlaps ``a`` raises ``ValueError``.
    """
    _ops.stream_add_dd_(a, b)
    return a


@translating
def stream_concat(idx_a: torch.Tensor, val_a: torch.Tensor, idx_b: torch.Tensor,
                  val_b: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Disjoint, ordered ranges: ``(cat(idx_a, idx_b), cat(val_a, val_b))``.

    Each input strictly ascending and every index of a below every index of b
    (checked; ``ValueError`` otherwise).
    """
    return _ops.stream_concat(idx_a, val_a, idx_b, val_b)


@translating
def qsgd_quantize(x: torch.Tensor, bits: int, bucket_size: int, seed: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """QSGD stochastic quantization of a 1-D float32/float64 tensor (SparCML section 5).

    Returns ``(packed uint8, per-bucket float32 scales)``: ``s = 2^(bits-1) - 1`` levels
    per sign (``bits`` 4 or 8), unbiased stochastic rounding from splitmix64 of
    ``(seed, index)`` (so results do not depend on the thread count); 4-bit values
    two to a byte, low nibble first. NaN raises ``ValueError``.
    """
    return _ops.qsgd_quantize(x, bits, bucket_size, int(seed) & (2**63 - 1))


@translating
def qsgd_dequantize(packed: torch.Tensor, scales: torch.Tensor, n: int, bits: int, bucket_size: int,
                    dtype: torch.dtype) -> torch.Tensor:
    """Inverse of :func:`qsgd_quantize`: ``n`` values in ``dtype``.

    ``packed`` and ``scales`` usually come from a peer: levels above ``2s``, non-finite
    or negative scales and a non-zero unused nibble raise
    :class:`sparsecomm.errors.WireFormatError` before anything is decoded.
    """
    return _ops.qsgd_dequantize(packed, scales, n, bits, bucket_size, dtype)
