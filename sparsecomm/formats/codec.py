"""COO messages through a codec: the one encode/decode pair every algorithm with sorted
COO messages calls instead of :func:`.encode_coo` / :func:`.decode_coo`.

Codecs ("SKCompress: compressing sparse and nonuniform gradient", sections 4-6), chosen by
algorithm options (declared in :data:`CODEC_OPTIONS`, checked by the algorithm's base class;
being options, they are part of the reducer's signature handshake, so ranks that disagree
raise the same ValueError on every rank before any message):

* ``index_codec``: ``"none"`` (int32/int64 indices) or ``"delta_binary"`` -- delta-binary
  keys with adaptive prefix (section 5; ``m`` in {2, 4, 8, 16} or ``"auto"``, ``prefix``
  ``"fixed"``, ``"huffman"`` or ``"auto"``: the smallest by exact bit count). Lossless: an
  algorithm's results stay bit-identical, only bytes change.
* ``value_codec``: ``"none"`` (raw values) or ``"skcompress"`` -- sign-split quantile buckets
  (``q`` in all), grouped MinMaxSketch (``s`` rows, ``t`` columns per key of each group's
  sketch, ``r`` groups per sign) and Huffman-coded cells (section 4). Lossy: a value decodes
  to the mean of a bucket of its own sign, never further from zero than its own.

Layout: with both codecs ``"none"`` the message is exactly :mod:`.coo`'s (kind COO, fixed
size). Otherwise ``[header 32 B: kind COO_CODED, value dtype, index dtype 0, sender, N,
count][body]``, the body as ``csrc/include/sparsecomm/skcompress.h`` lays it out; its first
two bytes name the codecs. Sizes vary with the data, so algorithms exchange these messages
with ``Comm.exchange_var`` / ``bruck_allgather_var``.

Error feedback with a lossy codec: :meth:`CooCodec.encode` returns the values the receivers
will decode (the encoder queries its own sketch as a receiver does, so nobody decodes
their own message); the caller keeps ``true - decoded`` in its
residual and uses the decoded values wherever it would have used its own, so every rank sums
the same numbers.

Unlike the rest of :mod:`sparsecomm.formats`, this module calls kernels beyond the wire
checks: the body's encoder and its validating decoder are C, reached through the public op
layer (``sparsecomm.ops.skcompress_encode/decode``).
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from ..errors import WireFormatError
from .. import ops
from ..options import Option
from .coo import coo_nbytes, decode_coo, encode_coo
from .header import HEADER_NBYTES, Kind, check_header, index_dtype_for, pack_header

__all__ = ["CODEC_OPTIONS", "CODEC_OPTION_DEFAULTS", "CooCodec"]

#: the codec options an algorithm with COO messages accepts (sections 4-5 of the paper; the
#: bounds are the C encoder's): algorithms with ``uses_coo_codec`` take these besides their own
CODEC_OPTIONS: dict[str, Option] = {
    "index_codec": Option("none", str, choices=tuple(ops.INDEX_CODECS)),
    "value_codec": Option("none", str, choices=tuple(ops.VALUE_CODECS)),
    "q": Option(256, int, min=2, max=ops.MAX_Q, even=True, doc="buckets in all, q/2 per sign"),
    "s": Option(2, int, min=1, max=ops.MAX_ROWS_SKC, doc="MinMaxSketch rows"),
    "t": Option(0.2, float, min=0, min_open=True, max=ops.MAX_T, doc="sketch columns per key of a group"),
    # declared after q: its bound reads q, checked by then
    "r": Option(8, int, min=1, max=255, check=lambda r, options: r <= options["q"] // 2,
                what="an int in 1..min(255, q/2)", doc="groups per sign"),
    "m": Option("auto", choices=("auto", 2, 4, 8, 16), doc="intervals of a delta key"),
    "prefix": Option("auto", str, choices=tuple(ops.PREFIXES)),
}
#: the codec options with their defaults
CODEC_OPTION_DEFAULTS: dict[str, Any] = {name: option.default for name, option in CODEC_OPTIONS.items()}


class CooCodec:
    """Encode and decode COO messages with the codecs of an algorithm's options."""

    def __init__(self, options: Mapping[str, Any]):
        self.index_codec = options.get("index_codec", "none")
        self.value_codec = options.get("value_codec", "none")
        self._index = ops.INDEX_CODECS[self.index_codec]
        self._value = ops.VALUE_CODECS[self.value_codec]
        m = options.get("m", "auto")
        self._args = dict(q=options.get("q", 256), s=options.get("s", 2), t=float(options.get("t", 0.2)),
                          r=options.get("r", 8), m=0 if m == "auto" else m,
                          prefix=ops.PREFIXES[options.get("prefix", "auto")],
                          exact_max=ops.EXACT_ALWAYS)

    @property
    def plain(self) -> bool:
        """Both codecs "none": the message is a plain COO message of known size."""
        return self._index == 0 and self._value == 0

    @property
    def lossless(self) -> bool:
        return self._value == 0

    @property
    def wire_revision(self) -> str:
        """The coded body's layout revision ("" for plain COO): ranks on builds that lay bodies
        out differently must not exchange them, so the algorithm adds this to its own
        :attr:`~sparsecomm.algorithms.base.Algorithm.wire_revision` (the handshake compares it)."""
        return "" if self.plain else f"coo-coded-r{ops.SKC_REVISION}"

    def fixed_nbytes(self, count: int, n: int, value_dtype: torch.dtype) -> int | None:
        """The size of a message of ``count`` entries when the receiver can know it, else None."""
        return coo_nbytes(count, n, value_dtype) if self.plain else None

    def encode(self, indices: torch.Tensor, values: torch.Tensor, n: int, sender: int
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(message, sent)``: the message of the sorted COO vector and the values receivers
        will decode from it (``values`` itself when the value codec is lossless)."""
        if self.plain:
            return encode_coo(indices, values, n, sender), values
        count = indices.numel()
        work = values if values.dtype in (torch.float32, torch.float64) else values.float()
        header = torch.from_numpy(pack_header(Kind.COO_CODED, sender, n, count, values.dtype, None))
        if self.lossless:
            body = ops.skcompress_encode(indices, work, n, index_codec=self._index, value_codec=self._value,
                                         **self._args)
            sent = values
        else:   # the encoder queries its own sketch: the values every receiver decodes, bit for bit
            body, decoded = ops.skcompress_encode_decoded(indices, work, n, index_codec=self._index,
                                                          value_codec=self._value, **self._args)
            sent = decoded.to(device=values.device, dtype=values.dtype)
        return torch.cat([header, body]).to(values.device), sent

    @staticmethod
    def readdress(message: torch.Tensor, sender: int) -> torch.Tensor:
        """A copy of an encoded message with ``sender`` in its header: how a rank forwards
        bytes it received (a lossy message cannot be re-encoded without changing its values)."""
        forwarded = message.clone()
        forwarded[12:16] = torch.tensor(list(int(sender).to_bytes(4, "little")), dtype=torch.uint8,
                                            device=forwarded.device)
        return forwarded

    def decode(self, payload: torch.Tensor, *, n: int, value_dtype: torch.dtype, receiver: int, sender: int,
               count: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Validate and decode a message: ``(indices, values)`` with indices of
        :func:`.index_dtype_for` ``(n)``. Anything malformed (header, codecs other than this
        codec's, body) raises :class:`WireFormatError` naming both ranks and the field."""
        if self.plain:
            return decode_coo(payload, n=n, value_dtype=value_dtype, receiver=receiver, sender=sender, count=count)
        fields = check_header(payload, receiver=receiver, sender=sender, kind=Kind.COO_CODED, n=n,
                              value_dtype=value_dtype, index_dtype=None, count=count)
        work = value_dtype if value_dtype in (torch.float32, torch.float64) else torch.float32
        try:
            idx, val = ops.skcompress_decode(payload[HEADER_NBYTES:], n, fields["count"], work,
                                             expect_index=self._index, expect_value=self._value)
        except WireFormatError as exc:
            detail = str(exc).split(": ", 1)[-1]
            raise WireFormatError(f"rank {receiver} received from rank {sender} a coded COO message "
                                  f"(index_codec={self.index_codec!r}, value_codec={self.value_codec!r}): "
                                  f"{detail}") from None
        device = payload.device
        return (idx.to(device=device, dtype=index_dtype_for(n)), val.to(device=device, dtype=value_dtype))
