"""Wire checks: the C validation of received messages (``csrc/cpu/wire.c``, ops
``csrc/ops_wire.cpp``), as the decoders of :mod:`sparsecomm.formats` call it.

Every decoder calls one op, ``torch.ops.sparsecomm.wire_check_{header,coo,stream,qsgd}``
through :func:`wire_check`: header, sizes, padding, and for sparse forms the indices
(strictly ascending and < N, one fused O(count) pass, parallel for long messages) in full.
The op returns the parsed layout (positions: :class:`WireResult`), or for a malformed
message the field at fault (:data:`WIRE_FIELDS`), its position and the value received; the
message text is composed by the decoder, where the receiver's rank and expectations are
known. DenseStream messages have a check of their own, :func:`wire_check_densestream`.

Payloads on another device (CUDA), and CPU payloads while the ops' torch fallback is on
(``SPARSECOMM_OPS=torch``, :func:`sparsecomm.ops.use_torch_ops`): the op checks a host copy of
the fixed prefix (at most 48 bytes) against the message's size; the indices and padding
bytes are then checked on the device with torch (one synchronisation), and only a message
that fails there is copied to the host to find the field and position to report.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from ._switch import torch_ops_enabled

__all__ = ["WIRE_FIELDS", "WIRE_PREFIX_NBYTES", "WireResult", "wire_check", "wire_check_densestream"]

#: sc_wire_field (csrc/include/sparsecomm/wire.h), by code
WIRE_FIELDS = ("ok", "magic", "version", "kind", "value_dtype", "index_dtype", "reserved", "sender", "n", "count",
               "size", "index_order", "index_range", "offset", "bucket_size", "bits", "padding", "delta")
WIRE_PREFIX_NBYTES = 48  # SC_WIRE_PREFIX_NBYTES


class WireResult:
    """Positions in the result of :func:`wire_check` (``csrc/ops_wire.cpp``). ``[FIELD]`` is 0
    for a valid message, else the code of the field at fault (:data:`WIRE_FIELDS`), with its
    byte or entry position at ``[POSITION]`` and the value received at ``[VALUE]``."""

    (FIELD, KIND, VALUE_DTYPE, INDEX_DTYPE, SENDER, N, COUNT, DENSE, OFFSET, BITS, BUCKET,
     NSCALES, INDEX_POS, INDEX_SIZE, VALUE_POS, VALUE_SIZE, SCALE_POS) = range(17)
    POSITION, VALUE = 1, 2  # when [FIELD] is a field code


_OPS: dict[str, Callable] = {form: getattr(torch.ops.sparsecomm, f"wire_check_{form}").default
                             for form in ("header", "coo", "stream", "qsgd")}


def _op(form: str) -> Callable:
    return _OPS[form]


def _device_content_ok(payload: torch.Tensor, r: Sequence[int]) -> bool:
    """Indices and padding of a message on a device (its layout already checked)."""
    R = WireResult
    nbytes = payload.numel()
    checks = []
    count = r[R.COUNT]
    ipos, isize, vpos, vsize = r[R.INDEX_POS], r[R.INDEX_SIZE], r[R.VALUE_POS], r[R.VALUE_SIZE]
    if r[R.SCALE_POS] >= 0:  # QSGD: the two paddings
        checks.append(payload[r[R.SCALE_POS] + 4 * r[R.NSCALES]:vpos].any())
        checks.append(payload[vpos + count:].any())
    else:
        if ipos >= 0:
            iend = ipos + count * isize
            checks.append(payload[iend:vpos].any())
            if count:
                idx = payload[ipos:iend].view(torch.int32 if isize == 4 else torch.int64)
                checks.append((idx[1:] <= idx[:-1]).any())
                checks.append((idx[0] < 0) | (idx[-1] >= r[R.N]))
        checks.append(payload[vpos + count * vsize:nbytes].any())
    return not bool(torch.stack(checks).any()) if checks else True


def wire_check(form: str, payload: torch.Tensor, expect: list[int]) -> list[int]:
    """Run the check of ``form`` ("header", "coo", "stream" or "qsgd") on the uint8 ``payload``
    against the receiver's expectations ``expect`` (nine ints, -1: any; the order of
    ``csrc/ops_wire.cpp``); the op's result, indexed by :class:`WireResult`."""
    if payload.device.type == "cpu" and not torch_ops_enabled():
        return _OPS[form](payload, expect, -1)
    nbytes = payload.numel()
    r = _OPS[form](payload[:min(nbytes, WIRE_PREFIX_NBYTES)].cpu(), expect, nbytes)
    if r[WireResult.FIELD] == 0 and form != "header" and not _device_content_ok(payload, r):
        r = _OPS[form](payload.cpu(), expect, -1)
    return r


def wire_check_densestream(payload: torch.Tensor, expect: list[int]) -> list[int]:
    """The full check of a DenseStream message held on the host (``sc_wire_check_densestream``):
    ``expect`` is (value dtype code, sender, N, block count, lo, hi), -1: any. The result's
    ``[0]`` is 0 or the field at fault (then ``[1]`` its position, ``[2]`` the value), else
    ``[1:10]`` the layout (``csrc/ops_densestream.cpp``)."""
    return torch.ops.sparsecomm.wire_check_densestream.default(payload, expect)
