"""The 32-byte header every sparsecomm message starts with.

Layout (little-endian)::

    offset size field
    0      4    magic         0x4D435053 (bytes "SPCM")
    4      2    version       FORMAT_VERSION
    6      1    kind          Kind (COO, DENSE, SIGNATURE, DENSE_BLOCKS, COO_CODED)
    7      1    value dtype   DTYPE_CODES
    8      1    index dtype   DTYPE_CODES (0: no indices)
    9      3    reserved      zero
    12     4    sender        rank of the sender in the Comm
    16     8    N             length of the dense vector the message describes
    24     8    count         number of entries that follow

The receiver validates every field it can know (:func:`check_header`, in C: ``csrc/cpu/wire.c``
through :mod:`._wire_ops`); a mismatch raises :class:`WireFormatError` naming both ranks and
the field, never a silent wrong sum.

The reducer's agreement record (:data:`AGREEMENT_FIELDS`) is the one message every call of a
:class:`~sparsecomm.SparseAllreduce` sends first: ``AGREEMENT_NBYTES`` bytes (int64 per field,
native order, all-gathered), the same size whatever the call is -- the first call's handshake,
a later call's check (which also carries the non-finite flag) or a call that reuses the reducer
for another tensor without ``reset()`` (the ``kind`` field tells them apart). So ranks at
different points (one reset, another not; another step, N, k or dtype) always exchange equal
sizes on the call's tag, compare every field and raise the same error, before any message
whose size depends on those values.
"""

from __future__ import annotations

from enum import IntEnum

import numpy as np
import torch

from ..errors import WireFormatError
from . import _wire_ops

__all__ = ["AGREEMENT_FIELDS", "AGREEMENT_NBYTES", "AgreementKind", "HEADER_NBYTES", "FORMAT_VERSION", "MAGIC", "Kind", "WireFormatError", "DTYPE_CODES",
           "dtype_code", "dtype_from_code", "index_dtype_for", "pack_header", "parse_header", "check_header"]

HEADER_NBYTES = 32
FORMAT_VERSION = 1
MAGIC = 0x4D435053


class Kind(IntEnum):
    COO = 1
    DENSE = 2
    SIGNATURE = 3
    DENSE_BLOCKS = 4  # a DenseStream (formats/densestream.py)
    COO_CODED = 5  # a COO vector in a codec body (:mod:`.codec`)


class AgreementKind(IntEnum):
    """What a rank's agreement record announces (field ``kind``)."""
    HANDSHAKE = 1   # the first call after construction, reset() or load_state_dict()
    CALL = 2        # a later call, agreed at an earlier handshake
    REUSED = 3      # a later call with another N, dtype or device, without reset()


#: the reducer's agreement record, one int64 each; ``nonfinite`` (the last) is data, not compared
AGREEMENT_FIELDS = ("magic", "format version", "kind", "sparsecomm version", "algorithm", "options", "density",
                    "N", "dtype", "k", "checkpoint", "calls", "step", "resets", "nonfinite")
AGREEMENT_NBYTES = 8 * len(AGREEMENT_FIELDS)

DTYPE_CODES: dict[torch.dtype, int] = {
    torch.float32: 1, torch.float64: 2, torch.float16: 3, torch.bfloat16: 4,
    torch.int32: 5, torch.int64: 6, torch.uint8: 7,
}
_DTYPES_BY_CODE = {code: dtype for dtype, code in DTYPE_CODES.items()}

_HEADER = np.dtype([("magic", "<u4"), ("version", "<u2"), ("kind", "u1"), ("value_dtype", "u1"),
                    ("index_dtype", "u1"), ("reserved", "u1", (3,)), ("sender", "<u4"),
                    ("n", "<u8"), ("count", "<u8")])
assert _HEADER.itemsize == HEADER_NBYTES


def dtype_code(dtype: torch.dtype | None) -> int:
    if dtype is None:
        return 0
    try:
        return DTYPE_CODES[dtype]
    except KeyError:
        raise ValueError(f"dtype {dtype} cannot travel in a sparsecomm message; "
                         f"supported: {', '.join(str(d) for d in DTYPE_CODES)}") from None


def dtype_from_code(code: int) -> torch.dtype | None:
    return None if code == 0 else _DTYPES_BY_CODE.get(code)


def index_dtype_for(n: int) -> torch.dtype:
    """int32 indices when N < 2^31, else int64: the COO and sparse-stream layouts (:mod:`.coo`,
    :mod:`.stream`) keep 4-byte indices wherever they can address the vector."""
    return torch.int32 if n < 2**31 else torch.int64


def pack_header(kind: Kind, sender: int, n: int, count: int, value_dtype: torch.dtype | None,
                index_dtype: torch.dtype | None = None) -> np.ndarray:
    """The header as 32 uint8 (numpy; the caller copies it into its payload tensor)."""
    header = np.zeros(1, dtype=_HEADER)
    header["magic"] = MAGIC
    header["version"] = FORMAT_VERSION
    header["kind"] = int(kind)
    header["value_dtype"] = dtype_code(value_dtype)
    header["index_dtype"] = dtype_code(index_dtype)
    header["sender"] = sender
    header["n"] = n
    header["count"] = count
    return header.view(np.uint8)


def parse_header(payload: torch.Tensor) -> dict:
    """Fields of the header at the start of a uint8 payload (any device)."""
    if payload.numel() < HEADER_NBYTES:
        raise WireFormatError(f"message of {payload.numel()} bytes is shorter than the "
                              f"{HEADER_NBYTES}-byte sparsecomm header")
    raw = payload[:HEADER_NBYTES].cpu().numpy().view(_HEADER)[0]
    return {name: (raw[name].item() if raw[name].ndim == 0 else raw[name].tolist()) for name in _HEADER.names}


def _kind_name(code: int):
    return Kind(code).name if code in Kind._value2member_map_ else code


# how the error messages show a header field's wire value
SHOWN = {"value_dtype": dtype_from_code, "index_dtype": dtype_from_code, "kind": _kind_name}


def check_header(payload: torch.Tensor, *, receiver: int, sender: int, kind: Kind, n: int,
                 value_dtype: torch.dtype | None, index_dtype: torch.dtype | None = None,
                 count: int | None = None) -> dict:
    """Parse and validate a header against what the receiver expects; return its fields.

    The check is the C one (``sc_wire_check_header``: magic, version, kind, dtype codes,
    reserved bytes zero, sender, N, count); a mismatch raises :class:`WireFormatError`
    naming both ranks, the field and both values.
    """
    expected = {"kind": int(kind), "value_dtype": dtype_code(value_dtype), "index_dtype": dtype_code(index_dtype),
                "sender": sender, "n": n, "count": count}
    r = _wire_ops.check("header", payload, [expected["kind"], expected["value_dtype"], expected["index_dtype"],
                                            sender, n, -1 if count is None else count, -1, -1, -1])
    if r[0]:
        _wire_ops.raise_malformed(r, payload, what="a message", receiver=receiver, sender=sender,
                                  expected=expected, shown=SHOWN)
    return {"magic": MAGIC, "version": FORMAT_VERSION, "kind": r[_wire_ops.R_KIND],
            "value_dtype": r[_wire_ops.R_VALUE_DTYPE], "index_dtype": r[_wire_ops.R_INDEX_DTYPE],
            "reserved": [0, 0, 0], "sender": r[_wire_ops.R_SENDER], "n": r[_wire_ops.R_N],
            "count": r[_wire_ops.R_COUNT]}
