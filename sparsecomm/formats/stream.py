"""Sparse streams (SparCML section 3): a vector range that is sparse or dense.

A :class:`SparseStream` describes the range ``[offset, offset + n)`` of a length-N vector,
either as sorted (index, value) pairs (indices relative to ``offset``) or as ``n`` dense
values. It switches to dense when its item count would pass

    delta(n) = floor(n * isize / (c + isize))        (c index bytes, isize value bytes)

the count past which the sparse form is no smaller than the dense one. Summation cases
(C kernels behind :mod:`sparsecomm.ops`):

* sparse + sparse -- the union size is upper-bounded by |H1| + |H2|; when that bound
  passes delta the result is built dense (scatter both), else the sorted merge;
* sparse + dense  -- scatter the sparse one into the dense one;
* dense + dense   -- vectorized in-place sum, no new stream;
* disjoint ranges (``concat``, the range of ``other`` starts where ``self`` ends) --
  concatenation, or dense when the joint count passes delta of the joint range.

Every value is computed as ``self + other`` element-wise, whichever representation
holds it, so the sum of the same streams is bit-identical in either form (x + 0 = x).

Wire layout (little-endian)::

    [header 32 B: kind COO (sparse) or DENSE, N = n (range length), count,
                  value dtype, index dtype (0 when dense)]
    [offset: int64, 8 B]
    sparse: [count indices, int32 if n < 2^31 else int64, zero-padded to 8 B][count values]
    dense:  [n values]
    (the value section is zero-padded to 8 B too, so concatenated messages stay aligned)

QSGD-quantized dense ranges (section 5, :func:`encode_qsgd`)::

    [header 32 B: kind DENSE, value dtype uint8, N = n, count = packed bytes]
    [offset int64][bucket_size int32][bits int32]
    [ceil(n / bucket_size) float32 scales, zero-padded to 8 B][packed bytes, zero-padded to 8 B]
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .header import HEADER_NBYTES, Kind, WireFormatError, check_header, index_dtype_for, pack_header, parse_header

__all__ = ["SparseStream", "stream_delta", "stream_nbytes", "encode_stream", "dense_stream_message", "decode_stream",
           "qsgd_nbytes", "encode_qsgd", "decode_qsgd"]


def _isize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _pad8(x: int) -> int:
    return (x + 7) // 8 * 8


def stream_delta(n: int, value_dtype: torch.dtype) -> int:
    """delta = n * isize / (c + isize): the most items a sparse range of length n may hold."""
    isize = _isize(value_dtype)
    c = _isize(index_dtype_for(n))
    return n * isize // (c + isize)


def _ops():
    from .. import _stream_ops  # late: formats must import without the extension for docs
    return _stream_ops


@dataclass
class SparseStream:
    """A range ``[offset, offset + n)`` held sparse (``indices`` relative, sorted) or dense."""

    n: int
    offset: int
    values: torch.Tensor
    indices: torch.Tensor | None = None  # None: dense

    # -- construction ---------------------------------------------------------------------
    @classmethod
    def sparse(cls, indices: torch.Tensor, values: torch.Tensor, n: int, offset: int = 0) -> "SparseStream":
        """From sorted relative indices (any integer dtype); dense at once if count > delta."""
        s = cls(n, offset, values, indices.to(index_dtype_for(n)))
        return s.densified() if s.count > stream_delta(n, values.dtype) else s

    @classmethod
    def dense_of(cls, values: torch.Tensor, offset: int = 0) -> "SparseStream":
        return cls(values.numel(), offset, values, None)

    # -- properties -----------------------------------------------------------------------
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

    def densified(self) -> "SparseStream":
        if self.is_dense:
            return self
        dense = torch.zeros(self.n, dtype=self.values.dtype, device=self.values.device)
        _ops().stream_add_sd_(dense, self.indices, self.values)
        return SparseStream(self.n, self.offset, dense, None)

    def write_into(self, out: torch.Tensor) -> None:
        """Overwrite ``out[offset:offset+n]`` with this range (``out`` 1-D, contiguous)."""
        view = out[self.offset:self.offset + self.n]
        if self.is_dense:
            view.copy_(self.values)
        else:
            view.zero_()
            _ops().stream_add_sd_(view, self.indices, self.values)

    # -- summation ------------------------------------------------------------------------
    def add(self, other: "SparseStream") -> "SparseStream":
        """``self + other`` over the same range. May reuse ``self``'s dense buffer in place."""
        if (self.n, self.offset) != (other.n, other.offset) or self.values.dtype != other.values.dtype:
            raise ValueError(f"SparseStream.add: ranges/dtypes differ: [{self.offset}, +{self.n}) "
                             f"{self.values.dtype} vs [{other.offset}, +{other.n}) {other.values.dtype}")
        ops = _ops()
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
        idx, val = _ops().stream_concat(self.indices.to(it), self.values, other.indices.to(it) + self.n,
                                        other.values)
        return SparseStream(n, self.offset, val, idx)


# -- wire ---------------------------------------------------------------------------------
def stream_nbytes(n: int, count: int, value_dtype: torch.dtype, dense: bool) -> int:
    isize = _isize(value_dtype)
    if dense:
        return HEADER_NBYTES + 8 + _pad8(n * isize)
    return HEADER_NBYTES + 8 + _pad8(count * _isize(index_dtype_for(n))) + _pad8(count * isize)


def encode_stream(stream: SparseStream, sender: int) -> torch.Tensor:
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
                  sender: int) -> SparseStream:
    """Validate a stream message (header, offset, size, index range) and view it (no copy)."""
    fields = parse_header(payload)
    kind = Kind.DENSE if fields["kind"] == int(Kind.DENSE) else Kind.COO
    dense = kind == Kind.DENSE
    fields = check_header(payload, receiver=receiver, sender=sender, kind=kind, n=n, value_dtype=value_dtype,
                          index_dtype=None if dense else index_dtype_for(n), count=n if dense else None)
    where = f"rank {receiver} received from rank {sender} a stream"
    count = fields["count"]
    if payload.numel() != stream_nbytes(n, count, value_dtype, dense):
        raise WireFormatError(f"{where} of {payload.numel()} bytes; its header announces "
                              f"{stream_nbytes(n, count, value_dtype, dense)}")
    got_offset = int(payload[HEADER_NBYTES:HEADER_NBYTES + 8].view(torch.int64)[0])
    if got_offset != offset:
        raise WireFormatError(f"{where}: offset differs: rank {sender} sent {got_offset}, "
                              f"rank {receiver} expected {offset}")
    pos = HEADER_NBYTES + 8
    if dense:
        return SparseStream(n, offset, payload[pos:pos + n * _isize(value_dtype)].view(value_dtype), None)
    if count > stream_delta(n, value_dtype):
        raise WireFormatError(f"{where} of {count} sparse items past delta = {stream_delta(n, value_dtype)}")
    it = index_dtype_for(n)
    indices = payload[pos:pos + count * _isize(it)].view(it)
    if count and (int(indices[0]) < 0 or int(indices[-1]) >= n):
        raise WireFormatError(f"{where} with indices outside [0, {n})")
    vpos = pos + _pad8(count * _isize(it))
    values = payload[vpos:vpos + count * _isize(value_dtype)].view(value_dtype)
    return SparseStream(n, offset, values, indices)


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
                                                                                      dtype=torch.int32))
    pos = HEADER_NBYTES + 16
    payload[pos:pos + 4 * scales.numel()].view(torch.float32).copy_(scales)
    pos += _pad8(4 * scales.numel())
    payload[pos:pos + packed.numel()].copy_(packed)
    return payload


def decode_qsgd(payload: torch.Tensor, *, n: int, offset: int, bits: int, bucket_size: int, receiver: int,
                sender: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate a QSGD message; returns (packed, scales) views."""
    check_header(payload, receiver=receiver, sender=sender, kind=Kind.DENSE, n=n, value_dtype=torch.uint8,
                 index_dtype=None, count=(n * bits + 7) // 8)
    where = f"rank {receiver} received from rank {sender} a QSGD range"
    if payload.numel() != qsgd_nbytes(n, bits, bucket_size):
        raise WireFormatError(f"{where} of {payload.numel()} bytes, expected {qsgd_nbytes(n, bits, bucket_size)}")
    got = (int(payload[HEADER_NBYTES:HEADER_NBYTES + 8].view(torch.int64)[0]),
           *payload[HEADER_NBYTES + 8:HEADER_NBYTES + 16].view(torch.int32).tolist())
    if tuple(got) != (offset, bucket_size, bits):
        raise WireFormatError(f"{where}: (offset, bucket_size, bits) differ: rank {sender} sent {tuple(got)}, "
                              f"rank {receiver} expected {(offset, bucket_size, bits)}")
    nb = -(-n // bucket_size)
    pos = HEADER_NBYTES + 16
    scales = payload[pos:pos + 4 * nb].view(torch.float32)
    packed = payload[pos + _pad8(4 * nb):pos + _pad8(4 * nb) + (n * bits + 7) // 8]
    return packed, scales
