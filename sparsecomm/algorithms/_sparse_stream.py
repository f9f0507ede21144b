"""Summation on sparse streams (SparCML section 3, "Efficient Summation"), the arithmetic
behind SparCML's allreduces (:mod:`.sparcml`).

A :class:`SparseStream` is a :class:`~sparsecomm.formats.stream.StreamRange` (the wire
layout: a range ``[offset, offset + n)`` held sparse or dense) that can be added to another.
It switches to dense whenever its item count would pass delta(n), the count past which
the sparse form is no smaller than the dense one. Summation cases (C kernels reached
through :mod:`sparsecomm.ops`):

* sparse + sparse -- the union size is upper-bounded by |H1| + |H2|; when that bound
  passes delta the result is built dense (scatter both), else the sorted merge;
* sparse + dense  -- scatter the sparse one into the dense one;
* dense + dense   -- vectorized in-place sum, no new stream;
* disjoint ranges (``concat``, the range of ``other`` starts where ``self`` ends) --
  concatenation, or dense when the joint count passes delta of the joint range.

Every value is computed as ``self + other`` element-wise, whichever representation
holds it, so the sum of the same streams is bit-identical in either form (x + 0 = x).

Codecs ("SKCompress", sections 4-5; :class:`~sparsecomm.formats.codec.CooCodec`): with
``index_codec`` or ``value_codec`` set, a *sparse* stream travels as a coded COO message
(kind COO_CODED, N = the range's length, indices relative to its offset) instead of the
plain COO stream; a dense stream stays the plain DENSE stream (the codecs are for sorted
keys and their values, a dense range has neither). The coded message carries no offset:
every receiver knows the range it expects (the whole vector, or split range j), and the
header's N is checked against its length. The dense switch keeps the plain delta(n), so
the index codec changes no decision and no bit of a result.
"""

from __future__ import annotations

import torch

from .. import ops
from ..errors import WireFormatError
from ..formats.codec import CooCodec
from ..formats.header import HEADER_NBYTES, Kind, index_dtype_for
from ..formats.stream import StreamRange, decode_stream, encode_stream, stream_delta

__all__ = ["SparseStream", "decode_sparse_stream", "encode_sparse_stream"]


class SparseStream(StreamRange):
    """A range ``[offset, offset + n)`` held sparse (``indices`` relative, sorted) or dense,
    with the summation cases of SparCML section 3."""

    # -- construction ---------------------------------------------------------------------
    @classmethod
    def sparse(cls, indices: torch.Tensor, values: torch.Tensor, n: int, offset: int = 0) -> "SparseStream":
        """From sorted relative indices (any integer dtype); dense at once if count > delta."""
        s = cls(n, offset, values, indices.to(index_dtype_for(n)))
        return s.densified() if s.count > stream_delta(n, values.dtype) else s

    @classmethod
    def dense_of(cls, values: torch.Tensor, offset: int = 0) -> "SparseStream":
        return cls(values.numel(), offset, values, None)

    @classmethod
    def of(cls, stream: StreamRange) -> "SparseStream":
        """The same range and tensors (no copy), e.g. a received message's views."""
        return cls(stream.n, stream.offset, stream.values, stream.indices)

    def densified(self) -> "SparseStream":
        if self.is_dense:
            return self
        dense = torch.zeros(self.n, dtype=self.values.dtype, device=self.values.device)
        ops.stream_add_sd_(dense, self.indices, self.values)
        return SparseStream(self.n, self.offset, dense, None)

    def write_into(self, out: torch.Tensor) -> None:
        """Overwrite ``out[offset:offset+n]`` with this range (``out`` 1-D, contiguous)."""
        view = out[self.offset:self.offset + self.n]
        if self.is_dense:
            view.copy_(self.values)
        else:
            ops.scatter_set_(view, self.indices, self.values, zero_rest=True)  # distinct indices: one write

    # -- summation ------------------------------------------------------------------------
    def add(self, other: StreamRange) -> "SparseStream":
        """``self + other`` over the same range. May reuse ``self``'s dense buffer in place."""
        if (self.n, self.offset) != (other.n, other.offset) or self.values.dtype != other.values.dtype:
            raise ValueError(f"SparseStream.add: ranges/dtypes differ: [{self.offset}, +{self.n}) "
                             f"{self.values.dtype} vs [{other.offset}, +{other.n}) {other.values.dtype}")
        if self.is_dense and other.is_dense:
            ops.stream_add_dd_(self.values, other.values)
            return self
        if self.is_dense:
            ops.stream_add_sd_(self.values, other.indices, other.values)
            return self
        if other.is_dense:  # keep the order self + other: densify self, then add other
            return self.densified().add(other)
        if self.count + other.count > self.delta:  # upper bound |H1| + |H2| checked first
            return self.densified().add(other)
        idx, val = ops.stream_add_ss(self.indices, self.values, other.indices, other.values)
        return SparseStream(self.n, self.offset, val, idx)

    def concat(self, other: "SparseStream") -> "SparseStream":
        """The joint range of two adjacent disjoint ranges (``other`` starts where ``self`` ends)."""
        if other.offset != self.offset + self.n or self.values.dtype != other.values.dtype:
            raise ValueError(f"SparseStream.concat: range [{other.offset}, +{other.n}) does not follow "
                             f"[{self.offset}, +{self.n}) (or dtypes differ)")
        n = self.n + other.n
        if self.is_dense or other.is_dense or self.count + other.count > stream_delta(n, self.values.dtype):
            a, b = self.densified(), other.densified()
            return SparseStream(n, self.offset, torch.cat([a.values, b.values]), None)
        it = index_dtype_for(n)
        idx, val = ops.stream_concat(self.indices.to(it), self.values, other.indices.to(it) + self.n,
                                     other.values)
        return SparseStream(n, self.offset, val, idx)


def encode_sparse_stream(stream: SparseStream, sender: int, codec: CooCodec | None = None
                         ) -> tuple[torch.Tensor, SparseStream]:
    """``(message, sent)``: the stream's message and the stream receivers will decode from it.

    Without codecs (or for a dense stream) the plain stream message and ``stream`` itself.
    With them a sparse stream becomes a coded COO message; with a lossy ``value_codec``
    ``sent`` holds the values receivers decode (the encoder returns them), and the caller
    keeps ``stream.values - sent.values`` in its residual and goes on with ``sent``.
    """
    if codec is None or codec.plain or stream.is_dense:
        return encode_stream(stream, sender), stream
    message, values = codec.encode(stream.indices, stream.values, stream.n, sender)
    if values is stream.values:
        return message, stream
    return message, SparseStream(stream.n, stream.offset, values, stream.indices)


def decode_sparse_stream(payload: torch.Tensor, *, n: int, offset: int, value_dtype: torch.dtype, receiver: int,
                         sender: int, codec: CooCodec | None = None) -> SparseStream:
    """:func:`~sparsecomm.formats.stream.decode_stream` (validate, view without a copy), as a
    stream that can be summed.

    With ``codec`` (not plain) a sparse range must arrive as a coded COO message of those
    codecs and at most delta(n) items (:meth:`CooCodec.decode` validates the header and
    body); a plain sparse stream then raises :class:`WireFormatError`, as does a coded
    message without ``codec``. A dense range is the plain DENSE stream either way.
    """
    coded = codec is not None and not codec.plain
    if coded and payload.numel() >= HEADER_NBYTES and int(payload[6]) == int(Kind.COO_CODED):
        idx, val = codec.decode(payload, n=n, value_dtype=value_dtype, receiver=receiver, sender=sender)
        delta = stream_delta(n, value_dtype)
        if idx.numel() > delta:
            raise WireFormatError(f"rank {receiver} received from rank {sender} a coded sparse stream of "
                                  f"{idx.numel()} items for a range of {n}, past delta = {delta} (the sender "
                                  "should have sent it dense)")
        return SparseStream(n, offset, val, idx)
    if payload.storage_offset() % 8:  # after coded messages of any length in one buffer: realign to view
        payload = payload.clone()
    stream = SparseStream.of(decode_stream(payload, n=n, offset=offset, value_dtype=value_dtype, receiver=receiver,
                                           sender=sender))
    if coded and not stream.is_dense:
        raise WireFormatError(f"rank {receiver} received from rank {sender} a plain sparse stream where a coded "
                              f"one (index_codec={codec.index_codec!r}, value_codec={codec.value_codec!r}) was "
                              "expected: do all ranks use the same codec options?")
    return stream
