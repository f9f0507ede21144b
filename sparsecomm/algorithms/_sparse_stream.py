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
"""

from __future__ import annotations

import torch

from .. import ops
from ..formats.header import index_dtype_for
from ..formats.stream import StreamRange, decode_stream, stream_delta

__all__ = ["SparseStream", "decode_sparse_stream"]


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
            view.zero_()
            ops.stream_add_sd_(view, self.indices, self.values)

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


def decode_sparse_stream(payload: torch.Tensor, *, n: int, offset: int, value_dtype: torch.dtype, receiver: int,
                         sender: int) -> SparseStream:
    """:func:`~sparsecomm.formats.stream.decode_stream` (validate, view without a copy), as a
    stream that can be summed."""
    return SparseStream.of(decode_stream(payload, n=n, offset=offset, value_dtype=value_dtype, receiver=receiver,
                                         sender=sender))
