"""The ZEN hash partition and class bitmaps in torch (``csrc/include/sparsecomm/zen.h``):
the same owner bits as ``sc_zen_owner`` (splitmix64 on int64 tensors, :mod:`.splitmix`),
the same validation and error types (correct, not tuned)."""

from __future__ import annotations

import torch

from .._errors import WIRE_PREFIX
from .checks import check_nonnegative, check_same_length, check_sorted, check_values, check_vector
from .splitmix import mix64, srl, u64

__all__ = ["zen_owner", "zen_partition", "zen_bitmap_encode", "zen_bitmap_decode"]

MAX_PARTS = 2**31 - 1
_GOLDEN = 0x9E3779B97F4A7C15


def _check_args(op: str, n: int, parts: int, block: int) -> int:
    check_nonnegative(n, op, "n")
    if not 1 <= parts <= MAX_PARTS:
        raise ValueError(f"{op}: parts must be in 1..{MAX_PARTS}, got {parts}")
    if block < 1 or block & (block - 1):
        raise ValueError(f"{op}: block must be a power of two >= 1, got {block}")
    return block.bit_length() - 1


def _block_owner(blocks: torch.Tensor, seed: int, parts: int) -> torch.Tensor:
    """sc_zen_block_owner of int64 block numbers: fastrange of the top 32 bits of
    splitmix64's output (int64 products wrap like uint64; the last product is < 2^63)."""
    z = mix64(blocks + u64(seed + _GOLDEN))
    return (srl(z, 32) * parts) >> 32


def zen_owner(idx: torch.Tensor, seed: int, block: int, parts: int) -> torch.Tensor:
    """The owner of every index (int64)."""
    return _block_owner(idx >> (block.bit_length() - 1), seed, parts)


def _check_i64(op: str, idx: torch.Tensor) -> None:
    check_vector(idx, op, "idx")
    if idx.dtype != torch.int64:
        raise TypeError(f"{op}: idx must be int64, got {idx.dtype}")


def zen_partition(idx: torch.Tensor, val: torch.Tensor, n: int, parts: int, seed: int, block: int):
    op = "sparsecomm.zen_partition"
    _check_i64(op, idx)
    check_vector(val, op, "val")
    check_same_length(idx, val, op, "idx", "val")
    check_values(val, op, "val")
    _check_args(op, n, parts, block)
    check_sorted(op, idx, "idx", n)
    owner = zen_owner(idx, seed, block, parts)
    order = torch.sort(owner, stable=True).indices
    counts = torch.bincount(owner, minlength=parts).to(torch.int64)
    return idx[order], val[order], counts


def _class_blocks(n: int, parts: int, seed: int, block: int, owner: int, device,
                  limit: int | None = None) -> tuple[torch.Tensor, int]:
    """(owner's block numbers ascending, its class size). With ``limit`` the blocks are walked
    in chunks and the walk stops once the class holds more than ``limit`` indices: the size then
    only says that it is larger (a peer's bitmap is checked within its own length, not n's)."""
    nblocks = -(-n // block)
    chunk = max(nblocks, 1) if limit is None else _LIMITED_CHUNK
    found, size = [], 0
    for start in range(0, nblocks, chunk):
        b = torch.arange(start, min(start + chunk, nblocks), dtype=torch.int64, device=device)
        found.append(b[_block_owner(b, seed, parts) == owner])
        size += found[-1].numel() * block
        if limit is not None and size > limit:
            break
    mine = torch.cat(found) if found else torch.empty(0, dtype=torch.int64, device=device)
    if nblocks and mine.numel() and int(mine[-1]) == nblocks - 1:
        size -= nblocks * block - n
    return mine, size


#: blocks per chunk of a walk bounded by a bitmap's length
_LIMITED_CHUNK = 1 << 20


def _check_owner(op: str, parts: int, owner: int) -> None:
    if not 0 <= owner < parts:
        raise ValueError(f"{op}: owner must be in [0, parts = {parts}), got {owner}")


def zen_bitmap_encode(idx: torch.Tensor, n: int, parts: int, seed: int, block: int, owner: int) -> torch.Tensor:
    op = "sparsecomm.zen_bitmap_encode"
    _check_i64(op, idx)
    lb = _check_args(op, n, parts, block)
    _check_owner(op, parts, owner)
    blocks, size = _class_blocks(n, parts, seed, block, owner, idx.device)
    check_sorted(op, idx, "idx", n)
    b = idx >> lb
    rank = torch.searchsorted(blocks, b)
    inside = rank < blocks.numel()
    inside[inside.clone()] = blocks[rank[inside]] == b[inside]
    if not bool(inside.all()):
        p = int((~inside).nonzero()[0])
        raise ValueError(f"{op}: idx must hold indices of owner {owner}'s class, but idx[{p}] = {int(idx[p])}")
    pos = rank * block + (idx & (block - 1))
    bits = torch.zeros((size + 7) // 8 * 8, dtype=torch.uint8, device=idx.device)
    bits[pos] = 1
    weights = torch.tensor([1, 2, 4, 8, 16, 32, 64, 128], dtype=torch.uint8, device=idx.device)
    return (bits.view(-1, 8) * weights).sum(1, dtype=torch.int64).to(torch.uint8)


def zen_bitmap_decode(bitmap: torch.Tensor, n: int, parts: int, seed: int, block: int, owner: int) -> torch.Tensor:
    op = "sparsecomm.zen_bitmap_decode"
    check_vector(bitmap, op, "bitmap")
    if bitmap.dtype != torch.uint8:
        raise TypeError(f"{op}: bitmap must be uint8, got {bitmap.dtype}")
    _check_args(op, n, parts, block)
    _check_owner(op, parts, owner)
    nbytes = bitmap.numel()
    blocks, size = _class_blocks(n, parts, seed, block, owner, bitmap.device, limit=8 * nbytes)
    if nbytes != (size + 7) // 8:
        raise ValueError(f"{WIRE_PREFIX}{op}: bitmap is malformed at position -1 (value {nbytes})")
    if size & 7:
        last = int(bitmap[-1])
        if last & (0xFF << (size & 7)) & 0xFF:
            raise ValueError(f"{WIRE_PREFIX}{op}: bitmap is malformed at position {nbytes - 1} (value {last})")
    shifts = torch.arange(8, dtype=torch.uint8, device=bitmap.device)
    bits = ((bitmap.view(-1, 1) >> shifts) & 1).reshape(-1)[:size].bool()
    pos = bits.nonzero().reshape(-1)
    return blocks[pos // block] * block + pos % block
