"""ZEN ops ("ZEN: Empowering Distributed Training with Sparsity-driven Data Synchronization",
OSDI 2025: the hash-based partition of its balanced parallelism): the Python face of
``csrc/ops_zen.cpp``.

The index space ``[0, n)`` is cut into blocks of ``block`` indices (a power of two; 1 hashes
every index, as the paper does); block ``b = i >> log2(block)`` belongs to owner
``fastrange(splitmix64(seed + b), parts)``, exactly::

    z = mix64(b + seed + 0x9E3779B97F4A7C15)      (uint64 arithmetic; mix64: splitmix64's output)
    owner = ((z >> 32) * parts) >> 32

so every owner gets about ``1 / parts`` of the blocks wherever the non-zeros lie. Owner ``c``'s
*hash class* is the ascending list of the indices of its blocks (the last block of ``[0, n)``
may be short); position ``j`` of the class is its ``j``-th index. ``seed`` is an int64 read as
its uint64 bits; ``parts`` is 1..2^31 - 1.
"""

from __future__ import annotations

from typing import Tuple

import torch

from ._errors import translating

__all__ = ["zen_partition", "zen_bitmap_encode", "zen_bitmap_decode", "zen_class_blocks"]

_ops = torch.ops.sparsecomm


@translating
def zen_partition(idx: torch.Tensor, val: torch.Tensor, n: int, parts: int, seed: int,
                  block: int) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Stable partition of the pairs ``(idx, val)`` (``idx`` int64, strictly ascending, < ``n``)
    by owner, in one pass and a prefix sum: ``(idx, val, counts)`` with owner 0's pairs first,
    then owner 1's, ..., each in ascending index order; ``counts`` (int64, ``parts`` entries)
    says how many each owner has."""
    return _ops.zen_partition(idx, val, n, parts, seed, block)


@translating
def zen_bitmap_encode(idx: torch.Tensor, n: int, parts: int, seed: int, block: int, owner: int) -> torch.Tensor:
    """The uint8 bitmap of ``owner``'s class holding the ascending int64 indices ``idx`` (all of
    that class): bit ``j`` (byte ``j // 8``, bit ``j % 8``, least significant first) is set when
    the class's ``j``-th index is in ``idx``; ``ceil(class size / 8)`` bytes, padding bits zero."""
    return _ops.zen_bitmap_encode(idx, n, parts, seed, block, owner)


@translating
def zen_bitmap_decode(bitmap: torch.Tensor, n: int, parts: int, seed: int, block: int, owner: int) -> torch.Tensor:
    """The ascending int64 indices whose bits ``bitmap`` sets (the inverse of
    :func:`zen_bitmap_encode`). A bitmap of another length than ``ceil(class size / 8)`` or
    with a padding bit set raises :class:`sparsecomm.errors.WireFormatError` (it came from a peer)."""
    return _ops.zen_bitmap_decode(bitmap, n, parts, seed, block, owner)


def zen_class_blocks(n: int, parts: int, seed: int, block: int,
                     device: torch.device | str = "cpu") -> Tuple[torch.Tensor, torch.Tensor]:
    """Every owner's blocks: ``(starts, counts)`` with ``starts`` the first index of every block
    of ``[0, n)`` grouped by owner (ascending within an owner) and ``counts`` the blocks per owner
    (:func:`zen_partition` of the block starts; O(n / block))."""
    starts = torch.arange(0, n, block, dtype=torch.int64, device=device)
    starts, _, counts = zen_partition(starts, torch.zeros(starts.numel(), dtype=torch.float32, device=device),
                                      n, parts, seed, block)
    return starts, counts
