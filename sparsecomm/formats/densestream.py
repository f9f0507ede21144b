"""DenseStream messages ("DenseStream: A Novel Data Representation for Gradient
Sparsification", section III-A): a sparse vector as dense blocks (start, length, the
values of the whole region).

The paper's block is ``[index][length][values]``; here the fields of all blocks travel
first and the values of all blocks after them (same bytes but for padding), so the
values are one contiguous section a receiver views without a copy. Index and length
fields take ``width`` bytes, the fewest that hold ``N - 1`` (:func:`densestream_width`,
the paper's ``ceil(log2(N) / 8)``); a length is stored minus one (blocks are never
empty), so ``N`` itself never needs a field.

Layout (little-endian)::

    [header 32 B: kind DENSE_BLOCKS, value dtype, index dtype 0, sender, N,
                  count = number of blocks]
    [lo int64][hi int64]   the range [lo, hi) of [0, N) the blocks lie in
    [nvalues int64]        values over all blocks
    [width uint8][7 zero bytes]
    [starts: count x width B][lengths - 1: count x width B], zero-padded to 8 B
    [nvalues values], zero-padded to 8 B

Decoding validates everything before anything is read (``sc_wire_check_densestream``,
``csrc/cpu/densestream.c``): the header against what the receiver expects, the range
(against the expected one), the counts, the width, the exact size, every padding byte,
and every block inside ``[lo, hi)``, sorted and not overlapping, with lengths summing to
``nvalues``. A violation raises :class:`WireFormatError` naming both ranks, the field and
the values. The values are not checked (any bit pattern is a value).

This module is layout only: the fields are packed and unpacked with tensor views; the
kernels that build and sum DenseStreams are ``sparsecomm.ops.densestream_*``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import WireFormatError
from .. import ops
from .header import HEADER_NBYTES, SHOWN, Kind, dtype_code, pack_header, raise_malformed

__all__ = ["DenseBlocks", "densestream_width", "densestream_max_zero_run", "densestream_nbytes",
           "densestream_payload_nbytes", "encode_densestream", "decode_densestream"]

PREFIX_NBYTES = HEADER_NBYTES + 32
_FIELDS_DS = {32: "range", 33: "nvalues", 34: "width", 35: "block_order", 36: "block_range"}


def densestream_width(n: int) -> int:
    """Bytes of an index or length field for a vector of ``n`` elements: the fewest that
    hold ``n - 1``, at least 1 (the paper's ``ceil(log2(N) / 8)`` for N >= 2)."""
    return max(1, (max(n - 1, 0).bit_length() + 7) // 8)


def densestream_max_zero_run(n: int, value_dtype: torch.dtype, width: int | None = None) -> int:
    """``T = ceil(2 * width / K)``: the longest run of zeros a block keeps (section III-A,
    rule 2); a longer run costs more than a new block's index and length."""
    w = densestream_width(n) if width is None else width
    k = value_dtype.itemsize
    return -(-2 * w // k)


def _pad8(x: int) -> int:
    return (x + 7) // 8 * 8


def densestream_payload_nbytes(nblocks: int, nvalues: int, n: int, value_dtype: torch.dtype,
                               width: int | None = None) -> int:
    """The representation's own bytes, as the paper counts them (eq. 3): ``2 width`` per
    block plus ``K`` per value; no header, no padding."""
    w = densestream_width(n) if width is None else width
    return 2 * w * nblocks + nvalues * value_dtype.itemsize


def densestream_nbytes(nblocks: int, nvalues: int, n: int, value_dtype: torch.dtype) -> int:
    """Size of a DenseStream message."""
    w = densestream_width(n)
    return PREFIX_NBYTES + _pad8(2 * w * nblocks) + _pad8(nvalues * value_dtype.itemsize)


@dataclass
class DenseBlocks:
    """A DenseStream over ``[lo, hi)`` of a length-``n`` vector: blocks (global int64
    ``starts``, ``lengths``) and their ``values`` back to back."""

    n: int
    lo: int
    hi: int
    starts: torch.Tensor
    lengths: torch.Tensor
    values: torch.Tensor

    @property
    def blocks(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(starts, lengths, values)``, the argument of the ``densestream_*`` ops."""
        return self.starts, self.lengths, self.values

    @property
    def nblocks(self) -> int:
        return self.starts.numel()


def encode_densestream(d: DenseBlocks, sender: int) -> torch.Tensor:
    """One uint8 message for ``d`` (blocks inside ``[d.lo, d.hi)``, as the ops make them)."""
    n, nb, vdt = d.n, d.nblocks, d.values.dtype
    nv = d.values.numel()
    w = densestream_width(n)
    payload = torch.zeros(densestream_nbytes(nb, nv, n, vdt), dtype=torch.uint8, device=d.values.device)
    payload[:HEADER_NBYTES].copy_(torch.from_numpy(pack_header(Kind.DENSE_BLOCKS, sender, n, nb, vdt, None)))
    payload[HEADER_NBYTES:HEADER_NBYTES + 24].view(torch.int64).copy_(torch.tensor([d.lo, d.hi, nv], dtype=torch.int64, device=payload.device))
    payload[HEADER_NBYTES + 24] = w
    pos = PREFIX_NBYTES
    if nb:
        # the low `w` bytes of each little-endian int64
        fields = torch.stack([d.starts, d.lengths - 1]).to(torch.int64).contiguous()
        payload[pos:pos + 2 * w * nb].view(2, nb, w).copy_(fields.view(torch.uint8).view(2, nb, 8)[:, :, :w])
    pos += _pad8(2 * w * nb)
    payload[pos:pos + nv * d.values.element_size()].view(vdt).copy_(d.values)
    return payload


def _unpack(raw: torch.Tensor, nb: int, w: int) -> torch.Tensor:
    wide = torch.zeros(nb, 8, dtype=torch.uint8, device=raw.device)
    wide[:, :w] = raw.view(nb, w)
    return wide.view(torch.int64).reshape(nb)


def decode_densestream(payload: torch.Tensor, *, n: int, value_dtype: torch.dtype, receiver: int, sender: int,
                       lo: int | None = None, hi: int | None = None, count: int | None = None) -> DenseBlocks:
    """Validate a DenseStream message in full (see the module doc) and return its blocks:
    int64 starts and lengths unpacked from the fields, the values a view of ``payload``.

    ``lo``/``hi``: the range the receiver expects the blocks in (None: any), ``count``:
    the number of blocks it expects (None: any). Payloads on another device are checked
    through a host copy.
    """
    vcode = dtype_code(value_dtype)
    host = payload if payload.device.type == "cpu" else payload.cpu()
    r = ops.wire_check_densestream(
        host, [vcode, sender, n, -1 if count is None else count, -1 if lo is None else lo,
               -1 if hi is None else hi])
    if r[0]:
        _raise(r, host, n=n, vcode=vcode, receiver=receiver, sender=sender, lo=lo, hi=hi, count=count)
    nb, nv, got_lo, got_hi, w, spos, lpos, vpos, vsize = (int(x) for x in r[1:10])
    starts = _unpack(payload[spos:spos + nb * w], nb, w)
    lengths = _unpack(payload[lpos:lpos + nb * w], nb, w) + 1
    values = payload[vpos:vpos + nv * vsize].view(value_dtype)
    return DenseBlocks(n, got_lo, got_hi, starts, lengths, values)


def _raise(r, payload: torch.Tensor, *, n: int, vcode: int, receiver: int, sender: int, lo, hi, count) -> None:
    field, pos, value = int(r[0]), int(r[1]), int(r[2])
    where = f"rank {receiver} received from rank {sender} a DenseStream"
    if field in _FIELDS_DS:
        name = _FIELDS_DS[field]
        if name == "range":
            which, want = ("lo", lo) if pos == 32 else ("hi", hi)
            msg = (f"{where}: range {which} = {value} " + (f"differs from the expected {want}" if want is not None
                                                           and value != want else f"is outside [0, N = {n}]"
                                                           " or below lo"))
        elif name == "nvalues":
            msg = (f"{where}: its blocks' lengths sum to {value}, its header says otherwise" if pos < 0 else
                   f"{where}: nvalues = {value} is below the block count or above the range's length")
        elif name == "width":
            msg = (f"{where}: field width {value} bytes, but N = {n} needs exactly {densestream_width(n)} "
                   "(the fewest that hold N - 1)")
        elif name == "block_order":
            msg = (f"{where}: block [{pos}] starts at {value}, before the previous block ends "
                   "(blocks must be sorted and must not overlap)")
        else:
            msg = f"{where}: block [{pos}] reaches {value}, outside its range" + (
                f" [{lo}, {hi})" if lo is not None and hi is not None else "")
        raise WireFormatError(msg)
    if ops.WIRE_FIELDS[field] == "size" and pos == PREFIX_NBYTES and payload.numel() < PREFIX_NBYTES:
        raise WireFormatError(f"{where} of {payload.numel()} bytes, shorter than its {PREFIX_NBYTES}-byte fixed "
                              "part (header, range, counts and width)")
    # the fields every message has: the shared wording
    full = [field, pos, value] + [-1] * 14
    raise_malformed(
        full, payload, what="a DenseStream", receiver=receiver, sender=sender, shown=SHOWN,
        expected={"kind": int(Kind.DENSE_BLOCKS), "value_dtype": vcode, "index_dtype": 0, "sender": sender,
                  "n": n, "count": count},
        explain={"count": lambda v, _: f"{v} blocks, more than N = {n} (blocks are disjoint and non-empty)",
                 "value_dtype": lambda v, _: f"value dtype {SHOWN['value_dtype'](v)} is not a float type"})

