"""Sparse streams on the wire (SparCML section 3, "Vector Representations" and
"Auto-Switching to a Dense Format"): a vector range that travels sparse or dense.

A :class:`StreamRange` describes the range ``[offset, offset + n)`` of a length-N vector,
either as sorted (index, value) pairs (indices relative to ``offset``) or as ``n`` dense
values. A sparse range may hold at most

    delta(n) = floor(n * isize / (c + isize))        (c index bytes, isize value bytes)

items, the count past which the sparse form is no smaller than the dense one. This module
is only the layout (sizes, encode, validate-and-view); the summation cases that keep a
stream under delta are :mod:`sparsecomm.algorithms._sparse_stream`, next to SparCML, their
user, so that ``formats`` needs no kernel.

Wire layout (little-endian)::

    [header 32 B: kind COO (sparse) or DENSE, N = n (range length), count,
                  value dtype, index dtype (0 when dense)]
    [offset: int64, 8 B]
    sparse: [count indices, int32 if n < 2^31 else int64, zero-padded to 8 B][count values]
    dense:  [n values]
    (the value section is zero-padded to 8 B too, so concatenated messages stay aligned)

QSGD-quantized dense ranges (SparCML section 5, "Low-Precision Support"; :func:`encode_qsgd`)::

    [header 32 B: kind DENSE, value dtype uint8, N = n, count = packed bytes]
    [offset int64][bucket_size int32][bits int32]
    [ceil(n / bucket_size) float32 scales, zero-padded to 8 B][packed bytes, zero-padded to 8 B]
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import ops
from .header import HEADER_NBYTES, SHOWN, Kind, dtype_code, index_dtype_for, pack_header, raise_malformed

__all__ = ["StreamRange", "stream_delta", "stream_nbytes", "encode_stream", "dense_stream_message", "decode_stream",
           "qsgd_nbytes", "encode_qsgd", "decode_qsgd"]


def _isize(dtype: torch.dtype) -> int:
    return dtype.itemsize


def _pad8(x: int) -> int:
    return (x + 7) // 8 * 8


def stream_delta(n: int, value_dtype: torch.dtype) -> int:
    """delta = n * isize / (c + isize): the most items a sparse range of length n may hold."""
    isize = _isize(value_dtype)
    c = _isize(index_dtype_for(n))
    return n * isize // (c + isize)


@dataclass
class StreamRange:
    """The range ``[offset, offset + n)`` as it travels: sorted (relative ``indices``,
    ``values``) pairs, or ``n`` dense ``values`` when ``indices`` is None.

    Only the layout lives here; the arithmetic on streams (the summation cases) is
    :class:`sparsecomm.algorithms._sparse_stream.SparseStream`, a subclass.
    """

    n: int
    offset: int
    values: torch.Tensor
    indices: torch.Tensor | None = None  # None: dense

    @property
    def is_dense(self) -> bool:
        return self.indices is None

    @property
    def count(self) -> int:
        """Items stored: nnz when sparse, n when dense."""
        return self.values.numel()

    @property
    def delta(self) -> int:
        return stream_delta(self.n, self.values.dtype)


# -- wire ---------------------------------------------------------------------------------
def stream_nbytes(n: int, count: int, value_dtype: torch.dtype, dense: bool) -> int:
    isize = _isize(value_dtype)
    if dense:
        return HEADER_NBYTES + 8 + _pad8(n * isize)
    return HEADER_NBYTES + 8 + _pad8(count * _isize(index_dtype_for(n))) + _pad8(count * isize)


def encode_stream(stream: StreamRange, sender: int) -> torch.Tensor:
    """One uint8 message for a stream."""
    n, count, vdt = stream.n, stream.count, stream.values.dtype
    nbytes = stream_nbytes(n, count, vdt, stream.is_dense)
    payload = torch.empty(nbytes, dtype=torch.uint8, device=stream.values.device)
    it = None if stream.is_dense else index_dtype_for(n)
    kind = Kind.DENSE if stream.is_dense else Kind.COO
    payload[:HEADER_NBYTES].copy_(torch.from_numpy(pack_header(kind, sender, n, count, vdt, it)))
    payload[HEADER_NBYTES:HEADER_NBYTES + 8].view(torch.int64).fill_(stream.offset)
    pos = HEADER_NBYTES + 8
    if not stream.is_dense:
        isec = _pad8(count * _isize(it))
        payload[pos:pos + count * _isize(it)].view(it).copy_(stream.indices)
        payload[pos + count * _isize(it):pos + isec].zero_()
        pos += isec
    vend = pos + count * _isize(vdt)
    payload[pos:vend].view(vdt).copy_(stream.values)
    payload[vend:].zero_()
    return payload


def dense_stream_message(n: int, offset: int, value_dtype: torch.dtype, sender: int,
                         device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """An empty dense stream message to fill in place: returns (payload, its n-value view,
    zeroed). Lets an owner reduce straight into the bytes it will send."""
    payload = torch.empty(stream_nbytes(n, n, value_dtype, True), dtype=torch.uint8, device=device)
    payload[:HEADER_NBYTES].copy_(torch.from_numpy(pack_header(Kind.DENSE, sender, n, n, value_dtype, None)))
    payload[HEADER_NBYTES:HEADER_NBYTES + 8].view(torch.int64).fill_(offset)
    pos = HEADER_NBYTES + 8
    payload[pos + n * _isize(value_dtype):].zero_()
    values = payload[pos:pos + n * _isize(value_dtype)].view(value_dtype)
    values.zero_()
    return payload, values


def decode_stream(payload: torch.Tensor, *, n: int, offset: int, value_dtype: torch.dtype, receiver: int,
                  sender: int) -> StreamRange:
    """Validate a stream message and view it (no copy).

    Validated in full before anything is viewed (``sc_wire_check_stream``, csrc/cpu/wire.c):
    the header against what this rank expects, the offset, the exact size and zero padding,
    and by form: sparse -- at most delta items, relative indices strictly ascending and
    < ``n`` (one fused O(count) pass); dense -- count == ``n``. A violation raises
    :class:`WireFormatError` naming both ranks, the field and the values.
    """
    vcode = dtype_code(value_dtype)
    r = ops.wire_check("stream", payload, [-1, vcode, -1, sender, n, -1, offset, -1, -1])
    if r[0]:
        dense = payload.numel() > 6 and int(payload[6]) == int(Kind.DENSE)
        raise_malformed(
            r, payload, what="a stream", receiver=receiver, sender=sender, shown=SHOWN, index_pos=HEADER_NBYTES + 8,
            expected={"value_dtype": vcode, "index_dtype": 0 if dense else dtype_code(index_dtype_for(n)),
                      "sender": sender, "n": n, "count": n if dense else None, "offset": offset},
            explain={"kind": lambda v, _: f"kind {SHOWN['kind'](v)} is neither COO (a sparse range) nor DENSE",
                     "delta": lambda v, _: f"{v} sparse items, past delta = {stream_delta(n, value_dtype)} "
                                           "(the dense form would be smaller)",
                     "offset": lambda v, _: f"offset {v} is negative"})
    count, vpos = r[ops.WireResult.COUNT], r[ops.WireResult.VALUE_POS]
    values = payload[vpos:vpos + count * r[ops.WireResult.VALUE_SIZE]].view(value_dtype)
    if r[ops.WireResult.DENSE]:
        return StreamRange(n, offset, values, None)
    ipos = r[ops.WireResult.INDEX_POS]
    indices = payload[ipos:ipos + count * r[ops.WireResult.INDEX_SIZE]].view(index_dtype_for(n))
    return StreamRange(n, offset, values, indices)


# -- QSGD dense ranges --------------------------------------------------------------------
def qsgd_nbytes(n: int, bits: int, bucket_size: int) -> int:
    nb = -(-n // bucket_size)
    return HEADER_NBYTES + 16 + _pad8(4 * nb) + _pad8((n * bits + 7) // 8)


def encode_qsgd(packed: torch.Tensor, scales: torch.Tensor, n: int, offset: int, bits: int, bucket_size: int,
                sender: int) -> torch.Tensor:
    payload = torch.zeros(qsgd_nbytes(n, bits, bucket_size), dtype=torch.uint8, device=packed.device)
    payload[:HEADER_NBYTES].copy_(torch.from_numpy(pack_header(Kind.DENSE, sender, n, packed.numel(),
                                                               torch.uint8, None)))
    payload[HEADER_NBYTES:HEADER_NBYTES + 8].view(torch.int64).fill_(offset)
    payload[HEADER_NBYTES + 8:HEADER_NBYTES + 16].view(torch.int32).copy_(torch.tensor([bucket_size, bits],
                                                                                      dtype=torch.int32, device="cpu"))
    pos = HEADER_NBYTES + 16
    payload[pos:pos + 4 * scales.numel()].view(torch.float32).copy_(scales)
    pos += _pad8(4 * scales.numel())
    payload[pos:pos + packed.numel()].copy_(packed)
    return payload


def decode_qsgd(payload: torch.Tensor, *, n: int, offset: int, bits: int, bucket_size: int, receiver: int,
                sender: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate a QSGD message's layout and return (packed, scales) views.

    ``sc_wire_check_qsgd`` (csrc/cpu/wire.c): the header, offset, bits, bucket size, the
    count of packed bytes, the exact size and zero padding. The levels and scales
    themselves are validated by ``qsgd_dequantize`` as it reads them.
    """
    u8 = dtype_code(torch.uint8)
    r = ops.wire_check("qsgd", payload, [int(Kind.DENSE), u8, 0, sender, n, -1, offset, bits, bucket_size])
    if r[0]:
        raise_malformed(
            r, payload, what="a QSGD range", receiver=receiver, sender=sender, shown=SHOWN,
            expected={"kind": int(Kind.DENSE), "value_dtype": u8, "index_dtype": 0, "sender": sender, "n": n,
                      "count": (n * bits + 7) // 8, "offset": offset, "bits": bits, "bucket_size": bucket_size},
            explain={"offset": lambda v, _: f"offset {v} is negative"})
    spos, nscales = r[ops.WireResult.SCALE_POS], r[ops.WireResult.NSCALES]
    vpos, count = r[ops.WireResult.VALUE_POS], r[ops.WireResult.COUNT]
    return payload[vpos:vpos + count], payload[spos:spos + 4 * nscales].view(torch.float32)
