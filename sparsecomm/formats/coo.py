"""COO messages: a header, ``count`` indices, ``count`` values.

Layout: ``[header 32 B][indices: count x int32|int64, zero-padded to a multiple of 8 B]
[values: count x value dtype]``. Indices are int32 when N < 2^31 (else int64), sorted
ascending; values keep the dtype the algorithm works in. The padding keeps the value
section 8-byte aligned so it can be viewed in place without a copy.
"""

from __future__ import annotations

import torch

from .. import ops
from .header import HEADER_NBYTES, SHOWN, Kind, dtype_code, index_dtype_for, pack_header, raise_malformed

__all__ = ["coo_nbytes", "encode_coo", "decode_coo"]


def _index_section(count: int, n: int) -> int:
    raw = count * index_dtype_for(n).itemsize
    return (raw + 7) // 8 * 8


def coo_nbytes(count: int, n: int, value_dtype: torch.dtype) -> int:
    """Size in bytes of a COO message of ``count`` entries for a vector of length ``n``."""
    return HEADER_NBYTES + _index_section(count, n) + count * value_dtype.itemsize


def encode_coo(indices: torch.Tensor, values: torch.Tensor, n: int, sender: int) -> torch.Tensor:
    """Pack index-sorted ``indices`` (any integer dtype) and ``values`` into one message."""
    count = indices.numel()
    if values.numel() != count:
        raise ValueError(f"encode_coo: {count} indices but {values.numel()} values")
    index_dtype = index_dtype_for(n)
    payload = torch.empty(coo_nbytes(count, n, values.dtype), dtype=torch.uint8, device=values.device)
    payload[:HEADER_NBYTES].copy_(torch.from_numpy(pack_header(Kind.COO, sender, n, count, values.dtype,
                                                               index_dtype)))
    index_end = HEADER_NBYTES + count * index_dtype.itemsize
    payload[HEADER_NBYTES:index_end].view(index_dtype).copy_(indices)
    payload[index_end:HEADER_NBYTES + _index_section(count, n)].zero_()
    payload[HEADER_NBYTES + _index_section(count, n):].view(values.dtype).copy_(values)
    return payload


def decode_coo(payload: torch.Tensor, *, n: int, value_dtype: torch.dtype, receiver: int, sender: int,
               count: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate and view a COO message: returns (indices, values) as views into ``payload``.

    Validated in full before anything is viewed (``sc_wire_check_coo``, csrc/cpu/wire.c):
    the header against what this rank expects, the exact size, zero padding, and every
    index strictly ascending and < ``n`` (one fused O(count) pass). A violation raises
    :class:`WireFormatError` naming both ranks, the field and the values.
    """
    index_dtype = index_dtype_for(n)
    vcode = dtype_code(value_dtype)
    r = ops.wire_check("coo", payload,
                       [int(Kind.COO), vcode, -1, sender, n, -1 if count is None else count, -1, -1, -1])
    if r[0]:
        raise_malformed(
            r, payload, what="a COO message", receiver=receiver, sender=sender, shown=SHOWN,
            expected={"kind": int(Kind.COO), "value_dtype": vcode, "index_dtype": dtype_code(index_dtype),
                      "sender": sender, "n": n, "count": count},
            explain={"count": lambda v, _: f"count {v} is more than N = {n} (a COO message holds distinct "
                                           f"indices < N)"})
    got = r[ops.WireResult.COUNT]
    ipos, vpos = r[ops.WireResult.INDEX_POS], r[ops.WireResult.VALUE_POS]
    indices = payload[ipos:ipos + got * r[ops.WireResult.INDEX_SIZE]].view(index_dtype)
    values = payload[vpos:].view(value_dtype)
    return indices, values
