"""ZEN's messages ("ZEN: Empowering Distributed Training with Sparsity-driven Data
Synchronization", OSDI 2025): the pieces a rank pushes to each owner and the reduced class
an owner pulls back to every rank, over the hash classes of :mod:`sparsecomm.ops` (``zen_*``).

*Push* (rank -> owner c): a COO message (:mod:`.coo`) of the rank's selected pairs whose
indices lie in c's class, ascending. The owner checks, besides the COO checks, that every
index belongs to its class.

*Pull* (owner c -> every rank): c's reduced pairs in whichever form is fewest bytes for their
count m and c's class size s (ties: the first listed), the form in the header's kind byte:

============  ============  =================================================================
form          kind          body after the 32-byte header (N = n, sender = c, count = m)
============  ============  =================================================================
``index``     COO           the COO layout of :mod:`.coo`: m global indices (int32 when
                            n < 2^31, else int64, zero-padded to 8 B), m values
``bitmap``    CLASS_BITMAP  ceil(s / 8) bytes of the class bitmap (``zen_bitmap_encode``:
                            bit j set when the class's j-th index is present; zero-padded to
                            8 B), then the m values in ascending index order; index dtype 0
``dense``     DENSE         s values, the class's indices in ascending order (count = s)
============  ============  =================================================================

Every pull message in these forms is zero-padded to a multiple of 8 bytes, so that messages
concatenated by an all-gather stay aligned for in-place views. With a COO codec
(:class:`.codec.CooCodec`, the algorithm's ``index_codec`` / ``value_codec``) push messages and
the ``index`` form are the codec's messages (kind COO_CODED, whatever length the codec makes:
not padded, so the receiver copies a block that the all-gather left unaligned before viewing it).
Push messages are COO messages (``encode_coo``, or the codec's). The receiver validates
everything before it reads: the header against what it expects (sender c, N, value dtype, the count the
form implies), the exact size, every padding byte zero, and by form: indices strictly
ascending, < n and in c's class; a bitmap of exactly ceil(s / 8) bytes with zero padding
bits whose population is the header's count. A violation raises :class:`WireFormatError`.
"""

from __future__ import annotations

import torch

from .. import ops
from .codec import CooCodec
from .coo import coo_nbytes, decode_coo, encode_coo
from .header import HEADER_NBYTES, SHOWN, Kind, WireFormatError, check_header, pack_header, parse_header

__all__ = ["PULL_FORMS", "ZenClasses", "pull_nbytes", "choose_form", "encode_pull", "decode_pull", "pull_form_of",
           "decode_push"]

#: the pull forms, in the order ties are broken
PULL_FORMS = ("index", "bitmap", "dense")


def _pad8(x: int) -> int:
    return (x + 7) // 8 * 8


class ZenClasses:
    """Every owner's hash class over ``[0, n)``: ``block_counts`` and ``sizes`` (indices per
    class) as Python ints, ``offsets`` where each owner's blocks begin in :meth:`starts`.
    Built once per (n, parts, seed, block) (:meth:`build`, O(n / block)); both sides of every
    message derive it from the same options. The block starts themselves (n / block int64) are
    kept only once a dense pull needs the class's indices."""

    def __init__(self, n: int, parts: int, seed: int, block: int, device: torch.device,
                 block_counts: list[int], sizes: list[int]) -> None:
        self.n, self.parts, self.seed, self.block, self.device = n, parts, seed, block, torch.device(device)
        self.block_counts, self.sizes = block_counts, sizes
        self.offsets = [0]
        for c in block_counts:
            self.offsets.append(self.offsets[-1] + c)
        self._starts: torch.Tensor | None = None

    @classmethod
    def build(cls, n: int, parts: int, seed: int, block: int, device: torch.device | str = "cpu") -> "ZenClasses":
        starts, counts = ops.zen_class_blocks(n, parts, seed, block, device)
        block_counts = [int(c) for c in counts.tolist()]
        sizes = [c * block for c in block_counts]
        if n % block:  # the last block of [0, n) is short, and so is its owner's class
            last = ops.zen_partition(torch.tensor([n - 1], dtype=torch.int64, device=device),
                                     torch.zeros(1, device=device), n, parts, seed, block)[2]
            sizes[int(last.nonzero()[0])] -= block - n % block
        return cls(n, parts, seed, block, device, block_counts, sizes)

    def starts(self) -> torch.Tensor:
        """The first index of every block, grouped by owner, ascending within one (int64)."""
        if self._starts is None:
            self._starts = ops.zen_class_blocks(self.n, self.parts, self.seed, self.block, self.device)[0]
        return self._starts

    def indices(self, owner: int) -> torch.Tensor:
        """Owner's class, ascending (int64)."""
        mine = self.starts()[self.offsets[owner]:self.offsets[owner + 1]]
        step = torch.arange(self.block, dtype=torch.int64, device=mine.device)
        return (mine.view(-1, 1) + step).reshape(-1)[:self.sizes[owner]]

    def check_in_class(self, indices: torch.Tensor, owner: int, *, receiver: int, sender: int, what: str) -> None:
        """WireFormatError unless every (valid, ascending) index lies in owner's class."""
        if indices.numel() == 0:
            return
        idx = indices.to(torch.int64)
        _, _, counts = ops.zen_partition(idx, torch.zeros(idx.numel(), dtype=torch.float32, device=idx.device),
                                         self.n, self.parts, self.seed, self.block)
        if int(counts[owner]) != idx.numel():
            raise WireFormatError(f"rank {receiver} received from rank {sender} {what}: "
                                  f"{idx.numel() - int(counts[owner])} of its {idx.numel()} indices lie outside "
                                  f"owner {owner}'s hash class (the ranks disagree on n, seed or block)")


def pull_nbytes(form: str, count: int, class_size: int, n: int, dtype: torch.dtype) -> int:
    """Bytes of a pull message of ``count`` pairs over a class of ``class_size`` indices."""
    if form == "index":
        body = coo_nbytes(count, n, dtype)
    elif form == "bitmap":
        body = HEADER_NBYTES + _pad8((class_size + 7) // 8) + count * dtype.itemsize
    elif form == "dense":
        body = HEADER_NBYTES + class_size * dtype.itemsize
    else:
        raise ValueError(f"zen pull form must be one of {', '.join(PULL_FORMS)}, got {form!r}")
    return _pad8(body)


def choose_form(count: int, class_size: int, n: int, dtype: torch.dtype) -> str:
    """The pull form of fewest bytes (ties: the first of :data:`PULL_FORMS`)."""
    return min(PULL_FORMS, key=lambda f: (pull_nbytes(f, count, class_size, n, dtype), PULL_FORMS.index(f)))


def _padded(body: torch.Tensor) -> torch.Tensor:
    extra = _pad8(body.numel()) - body.numel()
    if not extra:
        return body
    return torch.cat([body, torch.zeros(extra, dtype=torch.uint8, device=body.device)])


def encode_pull(indices: torch.Tensor, values: torch.Tensor, form: str, classes: ZenClasses,
                sender: int) -> torch.Tensor:
    """Owner ``sender``'s reduced pairs (ascending int64 indices of its class) in ``form``
    (the plain forms; a codec's index form is :meth:`.codec.CooCodec.encode`'s message)."""
    n, count, dtype = classes.n, indices.numel(), values.dtype
    size = classes.sizes[sender]
    if form == "index":
        return _padded(encode_coo(indices, values, n, sender))
    payload = torch.zeros(pull_nbytes(form, count, size, n, dtype), dtype=torch.uint8, device=values.device)
    if form == "bitmap":
        bitmap = ops.zen_bitmap_encode(indices.to(torch.int64), n, classes.parts, classes.seed, classes.block,
                                       sender)
        payload[:HEADER_NBYTES].copy_(torch.from_numpy(pack_header(Kind.CLASS_BITMAP, sender, n, count, dtype)))
        payload[HEADER_NBYTES:HEADER_NBYTES + bitmap.numel()].copy_(bitmap)
        pos = HEADER_NBYTES + _pad8(bitmap.numel())
        payload[pos:pos + count * dtype.itemsize].view(dtype).copy_(values)
    elif form == "dense":
        payload[:HEADER_NBYTES].copy_(torch.from_numpy(pack_header(Kind.DENSE, sender, n, size, dtype)))
        dense = payload[HEADER_NBYTES:HEADER_NBYTES + size * dtype.itemsize].view(dtype)
        if count:
            # the class positions of the pairs: where each index sits in the ascending class
            dense[torch.searchsorted(classes.indices(sender), indices.to(torch.int64))] = values
    else:
        raise ValueError(f"zen pull form must be one of {', '.join(PULL_FORMS)}, got {form!r}")
    return payload


def _check_tail(payload: torch.Tensor, end: int, *, receiver: int, sender: int, what: str) -> None:
    """The message is exactly ``end`` bytes rounded up to 8, the rest zero."""
    nb = payload.numel()
    if nb != _pad8(end):
        raise WireFormatError(f"rank {receiver} received from rank {sender} {what} of {nb} bytes; its header "
                              f"announces {_pad8(end)} bytes")
    tail = payload[end:]
    if tail.numel() and bool(tail.any()):
        pos = end + int(tail.nonzero()[0])
        raise WireFormatError(f"rank {receiver} received from rank {sender} {what}: padding byte {pos} is "
                              f"{int(payload[pos]):#04x}, must be 0 (the message's sections are out of step)")


def decode_pull(payload: torch.Tensor, *, classes: ZenClasses, value_dtype: torch.dtype, receiver: int,
                sender: int, codec: CooCodec | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate owner ``sender``'s pull message in full and return its (indices, values):
    indices ascending (int32/int64 as sent for the index form, int64 otherwise). With a codec
    that is not plain, the index form is the codec's message (kind COO_CODED)."""
    n, size, what = classes.n, classes.sizes[sender], "a ZEN pull message"
    if payload.numel() and payload.data_ptr() % 8:
        payload = payload.clone()   # after a codec's block of another length: align for the views
    head = parse_header(payload)
    kind = head["kind"]
    if codec is not None and not codec.plain and kind == int(Kind.COO_CODED):
        indices, values = codec.decode(payload, n=n, value_dtype=value_dtype, receiver=receiver, sender=sender)
        classes.check_in_class(indices, sender, receiver=receiver, sender=sender, what=what)
        return indices, values
    if kind == int(Kind.COO) and (codec is None or codec.plain):
        end = coo_nbytes(min(head["count"], n + 1), n, value_dtype)
        indices, values = decode_coo(payload[:end], n=n, value_dtype=value_dtype, receiver=receiver, sender=sender)
        _check_tail(payload, end, receiver=receiver, sender=sender, what=what)
        classes.check_in_class(indices, sender, receiver=receiver, sender=sender, what=what)
        return indices, values
    if kind == int(Kind.DENSE):
        check_header(payload, receiver=receiver, sender=sender, kind=Kind.DENSE, n=n, value_dtype=value_dtype,
                     count=size)
        end = HEADER_NBYTES + size * value_dtype.itemsize
        _check_tail(payload, end, receiver=receiver, sender=sender, what=what)
        return classes.indices(sender), payload[HEADER_NBYTES:end].view(value_dtype)
    if kind == int(Kind.CLASS_BITMAP):
        head = check_header(payload, receiver=receiver, sender=sender, kind=Kind.CLASS_BITMAP, n=n,
                            value_dtype=value_dtype, index_dtype=None)
        count, nbits = head["count"], _pad8((size + 7) // 8)
        if count > size:
            raise WireFormatError(f"rank {receiver} received from rank {sender} {what}: count {count} is more "
                                  f"than its class's {size} indices")
        end = HEADER_NBYTES + nbits + count * value_dtype.itemsize
        _check_tail(payload, end, receiver=receiver, sender=sender, what=what)
        raw = payload[HEADER_NBYTES:HEADER_NBYTES + nbits]
        used = (size + 7) // 8
        if bool(raw[used:].any()):
            pos = HEADER_NBYTES + used + int(raw[used:].nonzero()[0])
            raise WireFormatError(f"rank {receiver} received from rank {sender} {what}: padding byte {pos} is "
                                  f"{int(payload[pos]):#04x}, must be 0 (the message's sections are out of step)")
        try:
            indices = ops.zen_bitmap_decode(raw[:used], n, classes.parts, classes.seed, classes.block, sender)
        except WireFormatError as exc:
            raise WireFormatError(f"rank {receiver} received from rank {sender} {what} whose class bitmap sets "
                                  f"a padding bit past its class's {size} indices ({exc})") from None
        if indices.numel() != count:
            raise WireFormatError(f"rank {receiver} received from rank {sender} {what}: its bitmap sets "
                                  f"{indices.numel()} bits, its header announces {count} values")
        pos = HEADER_NBYTES + nbits
        return indices, payload[pos:pos + count * value_dtype.itemsize].view(value_dtype)
    index_kind = "COO_CODED" if codec is not None and not codec.plain else "COO"
    raise WireFormatError(f"rank {receiver} received from rank {sender} {what} of kind "
                          f"{SHOWN['kind'](kind)}: expected {index_kind} (index list), CLASS_BITMAP or DENSE "
                          "(class values)")


def pull_form_of(payload: torch.Tensor) -> str:
    """The form of a pull message that :func:`decode_pull` accepted (its kind byte)."""
    return {int(Kind.COO): "index", int(Kind.COO_CODED): "index", int(Kind.CLASS_BITMAP): "bitmap",
            int(Kind.DENSE): "dense"}[int(payload[6])]


def decode_push(payload: torch.Tensor, *, classes: ZenClasses, value_dtype: torch.dtype, receiver: int,
                sender: int, codec: CooCodec | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Validate a push message to owner ``receiver`` (the COO or codec checks, then every index
    in the receiver's class) and view or decode it."""
    if codec is not None:
        indices, values = codec.decode(payload, n=classes.n, value_dtype=value_dtype, receiver=receiver,
                                       sender=sender)
    else:
        indices, values = decode_coo(payload, n=classes.n, value_dtype=value_dtype, receiver=receiver,
                                     sender=sender)
    classes.check_in_class(indices, receiver, receiver=receiver, sender=sender, what="a ZEN push message")
    return indices, values
