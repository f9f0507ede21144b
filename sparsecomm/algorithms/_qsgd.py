"""QSGD low precision (SparCML section 5, Alistarh et al.) for dense ranges on the wire.

``quantize_range(x, ...)`` stochastically quantizes a dense range with a float32 scale
(max |x|) per bucket of ``bucket_size`` values, s = 2^(bits-1) - 1 levels per sign,
packed 2 values per byte at 4 bits, 1 at 8 bits; the message is
:func:`sparsecomm.formats.stream.encode_qsgd`. Stochastic rounding makes the dequantized
value unbiased: E[deq(q(x))] = x. Only the rank that owns a range quantizes it; every
rank (the owner too) uses the dequantized bytes, so results stay bit-identical.
"""

from __future__ import annotations

import torch

from .. import ops
from ..formats.stream import decode_qsgd, encode_qsgd, qsgd_nbytes

__all__ = ["QUANTIZE_BITS", "quantize_range", "dequantize_range", "qsgd_nbytes", "seed_for"]

QUANTIZE_BITS = (4, 8)


def seed_for(base: int, rank: int, step: int) -> int:
    """A per-(rank, step) seed: different random draws every step and on every rank."""
    x = (int(base) * 0x9E3779B97F4A7C15 + rank * 0xBF58476D1CE4E5B9 + step * 0x94D049BB133111EB) & (2**63 - 1)
    return x


def quantize_range(x: torch.Tensor, offset: int, bits: int, bucket_size: int, seed: int,
                   sender: int) -> torch.Tensor:
    """The QSGD message of a dense range ``x`` starting at ``offset``."""
    packed, scales = ops.qsgd_quantize(x.contiguous(), bits, bucket_size, seed)
    return encode_qsgd(packed, scales, x.numel(), offset, bits, bucket_size, sender)


def dequantize_range(payload: torch.Tensor, *, n: int, offset: int, bits: int, bucket_size: int,
                     dtype: torch.dtype, receiver: int, sender: int) -> torch.Tensor:
    packed, scales = decode_qsgd(payload, n=n, offset=offset, bits=bits, bucket_size=bucket_size,
                                 receiver=receiver, sender=sender)
    return ops.qsgd_dequantize(packed, scales, n, bits, bucket_size, dtype)
