"""The 32-byte header every sparsecomm message starts with.

Layout (little-endian)::

    offset size field
    0      4    magic         0x4D435053 (bytes "SPCM")
    4      2    version       FORMAT_VERSION
    6      1    kind          Kind (COO, DENSE, SIGNATURE, DENSE_BLOCKS, COO_CODED, CLASS_BITMAP)
    7      1    value dtype   DTYPE_CODES
    8      1    index dtype   DTYPE_CODES (0: no indices)
    9      3    reserved      zero
    12     4    sender        rank of the sender in the Comm
    16     8    N             length of the dense vector the message describes
    24     8    count         number of entries that follow

The receiver validates every field it can know (:func:`check_header`, in C: ``csrc/cpu/wire.c``
through :func:`sparsecomm.ops.wire_check`); a mismatch raises :class:`WireFormatError` naming
both ranks and the field, never a silent wrong sum. :func:`raise_malformed` words that error for
every decoder of this package (the header's fields, sizes, indices and padding of each form).

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
from typing import Sequence

import numpy as np
import torch

from .. import ops
from ..errors import WireFormatError
from ..ops import WIRE_FIELDS, WIRE_PREFIX_NBYTES, WireResult

__all__ = ["AGREEMENT_FIELDS", "AGREEMENT_NBYTES", "AgreementKind", "HEADER_NBYTES", "FORMAT_VERSION", "MAGIC", "Kind", "WireFormatError", "DTYPE_CODES",
           "dtype_code", "dtype_from_code", "index_dtype_for", "pack_header", "parse_header", "check_header",
           "raise_malformed"]

HEADER_NBYTES = 32
FORMAT_VERSION = 1
MAGIC = 0x4D435053


class Kind(IntEnum):
    COO = 1
    DENSE = 2
    SIGNATURE = 3
    DENSE_BLOCKS = 4  # a DenseStream (formats/densestream.py)
    COO_CODED = 5  # a COO vector in a codec body (:mod:`.codec`)
    CLASS_BITMAP = 6  # a bitmap over a ZEN hash class and its values (:mod:`.zen`)


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
    try:
        return Kind(code).name
    except ValueError:  # not a kind of this format version: shown as received
        return code


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
    r = ops.wire_check("header", payload, [expected["kind"], expected["value_dtype"], expected["index_dtype"],
                                           sender, n, -1 if count is None else count, -1, -1, -1])
    if r[0]:
        raise_malformed(r, payload, what="a message", receiver=receiver, sender=sender,
                        expected=expected, shown=SHOWN)
    R = WireResult
    return {"magic": MAGIC, "version": FORMAT_VERSION, "kind": r[R.KIND],
            "value_dtype": r[R.VALUE_DTYPE], "index_dtype": r[R.INDEX_DTYPE],
            "reserved": [0, 0, 0], "sender": r[R.SENDER], "n": r[R.N],
            "count": r[R.COUNT]}


def raise_malformed(r: Sequence[int], payload: torch.Tensor, *, what: str, receiver: int, sender: int,
                    expected: dict, shown: dict | None = None, explain: dict | None = None,
                    index_pos: int = 32) -> None:
    """Raise the WireFormatError for a failed check: the ranks, the field, what was received
    and, where the receiver knows it, what it expected.

    ``expected``: field name -> the value the receiver expected (as on the wire);
    ``shown``: field name -> function turning a wire value into words (dtype names);
    ``explain``: field name -> function (value, position) -> the sentence for a field that
    is invalid in itself rather than different from an expectation; ``index_pos``: the
    first index byte of a sparse message (for the order error's previous index).
    """
    R = WireResult
    field = WIRE_FIELDS[r[R.FIELD]] if 0 < r[R.FIELD] < len(WIRE_FIELDS) else f"field {r[R.FIELD]}"
    pos, value = r[R.POSITION], r[R.VALUE]
    where = f"rank {receiver} received from rank {sender} {what}"
    show = (shown or {}).get(field, lambda v: v)
    if field in ("n", "count") and value < 0:  # unsigned on the wire
        value += 1 << 64
    if field == "magic":
        msg = (f"{where} without the sparsecomm magic (got {value:#x}): the peer is not running "
               "sparsecomm or the streams are out of step")
    elif field == "version":
        msg = (f"{where} in format version {value}, this rank speaks {FORMAT_VERSION}: install the same "
               "sparsecomm version on every rank")
    elif field in expected and expected[field] is not None and expected[field] != value:
        msg = (f"{where}: {field} differs: rank {sender} sent {show(value)}, rank {receiver} expected "
               f"{show(expected[field])}")
    elif explain and field in explain:
        msg = f"{where}: {explain[field](value, pos)}"
    elif field == "reserved":
        msg = (f"{where}: reserved header byte {pos} is {value}, must be 0 (a corrupt header or a "
               "newer format)")
    elif field == "size":
        nb = payload.numel()
        if nb < 32 or 0 <= pos <= WIRE_PREFIX_NBYTES and nb < pos:
            msg = f"{where} of {nb} bytes, shorter than its {pos}-byte fixed part (header and range fields)"
        else:
            count = int.from_bytes(bytes(payload[24:32].cpu().tolist()), "little")
            need = "more bytes than any message can hold" if pos < 0 else f"{pos} bytes"
            msg = f"{where} of {nb} bytes; its header announces {count} entries, i.e. {need}"
    elif field == "index_order":
        prev = _read_index(payload, index_pos, pos - 1)
        msg = (f"{where}: indices must be strictly ascending, but index [{pos}] = {value} follows "
               f"index [{pos - 1}] = {prev}")
    elif field == "index_range":
        n = expected.get("n")
        msg = f"{where}: index [{pos}] = {value} is outside [0, {n})"
    elif field == "padding":
        msg = (f"{where}: padding byte {pos} is {value:#04x}, must be 0 (the message's sections are out "
               "of step)")
    else:
        msg = f"{where}: {field} is invalid: got {show(value)} at byte {pos}"
    raise WireFormatError(msg)


def _read_index(payload: torch.Tensor, ipos: int, i: int) -> int:
    """Index i of a sparse message whose header passed (error path only)."""
    isize = 8 if int(payload[8]) == 6 else 4  # index dtype code: int64 or int32
    raw = bytes(payload[ipos + i * isize:ipos + (i + 1) * isize].cpu().tolist())
    return int.from_bytes(raw, "little", signed=True)
