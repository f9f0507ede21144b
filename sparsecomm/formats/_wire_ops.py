"""The C validation of received messages (``csrc/cpu/wire.c``, ops ``csrc/ops_wire.cpp``),
as the decoders of this package use it, and the words of their :class:`WireFormatError`.

Every decoder calls one op, ``torch.ops.sparsecomm.wire_check_{header,coo,stream,qsgd}``:
header, sizes, padding, and for sparse forms the indices (strictly ascending and < N, one
fused O(count) pass, parallel for long messages) in full. The op returns the parsed
layout, or for a malformed message the field at fault, its position and the value
received; the message text is composed here, where the receiver's rank and expectations
are known.

This module imports the extension (``sparsecomm._C``) when it is imported, and registers
the ops' fake kernels then, so they exist wherever the ops do (``torch.library.opcheck``,
``torch.compile``): ``sparsecomm.formats`` needs the built extension, as the package
already does (``sparsecomm/__init__`` imports ``sparsecomm.ops``).

Payloads on another device (CUDA), and CPU payloads while the ops' torch fallback is on
(``SPARSECOMM_OPS=torch``, ``sparsecomm.ops.use_torch_ops``): the op checks a host copy of the fixed prefix (at
most 48 bytes) against the message's size; the indices and padding bytes are then
checked on the device with torch (one synchronisation), and only a message that fails
there is copied to the host to find the field and position to report.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from .. import _C  # noqa: F401  (registers torch.ops.sparsecomm.wire_check_*)
from ..errors import WireFormatError
from ..ops._switch import torch_ops_enabled

__all__ = ["FIELDS", "check", "raise_malformed"]

# sc_wire_field (csrc/include/sparsecomm/wire.h), by code
FIELDS = ("ok", "magic", "version", "kind", "value_dtype", "index_dtype", "reserved", "sender", "n", "count",
          "size", "index_order", "index_range", "offset", "bucket_size", "bits", "padding", "delta")
PREFIX_NBYTES = 48  # SC_WIRE_PREFIX_NBYTES

# positions in the op's result (csrc/ops_wire.cpp); [0] is 0 or the field code
(R_FIELD, R_KIND, R_VALUE_DTYPE, R_INDEX_DTYPE, R_SENDER, R_N, R_COUNT, R_DENSE, R_OFFSET, R_BITS, R_BUCKET,
 R_NSCALES, R_INDEX_POS, R_INDEX_SIZE, R_VALUE_POS, R_VALUE_SIZE, R_SCALE_POS) = range(17)
R_POSITION, R_VALUE = 1, 2  # when [0] is a field code

def _fake(payload, expect, nbytes=-1):
    # the result is data-dependent ints: under a fake tensor mode, unbacked symbols
    ctx = torch.library.get_ctx()
    return [ctx.new_dynamic_size() for _ in range(17)]


_OPS: dict[str, Callable] = {}
for _form in ("header", "coo", "stream", "qsgd"):
    torch.library.register_fake(f"sparsecomm::wire_check_{_form}")(_fake)
    _OPS[_form] = getattr(torch.ops.sparsecomm, f"wire_check_{_form}").default


def _op(form: str) -> Callable:
    return _OPS[form]


def _device_content_ok(payload: torch.Tensor, r: Sequence[int]) -> bool:
    """Indices and padding of a message on a device (its layout already checked)."""
    nbytes = payload.numel()
    checks = []
    count = r[R_COUNT]
    ipos, isize, vpos, vsize = r[R_INDEX_POS], r[R_INDEX_SIZE], r[R_VALUE_POS], r[R_VALUE_SIZE]
    if r[R_SCALE_POS] >= 0:  # QSGD: the two paddings
        checks.append(payload[r[R_SCALE_POS] + 4 * r[R_NSCALES]:vpos].any())
        checks.append(payload[vpos + count:].any())
    else:
        if ipos >= 0:
            iend = ipos + count * isize
            checks.append(payload[iend:vpos].any())
            if count:
                idx = payload[ipos:iend].view(torch.int32 if isize == 4 else torch.int64)
                checks.append((idx[1:] <= idx[:-1]).any())
                checks.append((idx[0] < 0) | (idx[-1] >= r[R_N]))
        checks.append(payload[vpos + count * vsize:nbytes].any())
    return not bool(torch.stack(checks).any()) if checks else True


def check(form: str, payload: torch.Tensor, expect: list[int]) -> list[int]:
    """Run the check of ``form`` on ``payload``; the op's result (see the module doc)."""
    if payload.device.type == "cpu" and not torch_ops_enabled():
        return _OPS[form](payload, expect, -1)
    nbytes = payload.numel()
    r = _OPS[form](payload[:min(nbytes, PREFIX_NBYTES)].cpu(), expect, nbytes)
    if r[R_FIELD] == 0 and form != "header" and not _device_content_ok(payload, r):
        r = _OPS[form](payload.cpu(), expect, -1)
    return r


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
    field = FIELDS[r[R_FIELD]] if 0 < r[R_FIELD] < len(FIELDS) else f"field {r[R_FIELD]}"
    pos, value = r[R_POSITION], r[R_VALUE]
    where = f"rank {receiver} received from rank {sender} {what}"
    show = (shown or {}).get(field, lambda v: v)
    if field in ("n", "count") and value < 0:  # unsigned on the wire
        value += 1 << 64
    if field == "magic":
        msg = (f"{where} without the sparsecomm magic (got {value:#x}): the peer is not running "
               "sparsecomm or the streams are out of step")
    elif field == "version":
        from .header import FORMAT_VERSION
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
        if nb < 32 or 0 <= pos <= PREFIX_NBYTES and nb < pos:
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
