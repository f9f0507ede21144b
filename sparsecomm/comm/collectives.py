"""Collective steps shared by several algorithms, built only on :meth:`Comm.exchange`.

Each step is written once here and reused (SparDL's final all-gather, TopkA, the small
handshakes of the reducer all use :func:`bruck_allgather`).
"""

from __future__ import annotations

from typing import Sequence

import torch

from .base import Comm

__all__ = ["bruck_allgather", "bruck_allgather_var"]


def bruck_allgather(comm: Comm, block: torch.Tensor, block_nbytes: Sequence[int]) -> list[torch.Tensor]:
    """Bruck all-gather (SparDL section 2, Figure 2b) of one uint8 block per rank.

    ``block_nbytes[q]`` is the size of rank q's block, known to every rank, so no size
    header is needed. ceil(log2 P) rounds; at the round with distance d = 2^s a rank sends
    the first min(d, P - d) blocks it holds (its own and the ones received so far) to
    rank - d and receives as many from rank + d: P-1 blocks sent in all, (P-1)/P of the
    total volume when the blocks have equal sizes.

    Returns the P blocks in rank order (the caller's own block included, not copied).
    """
    size, rank = comm.size, comm.rank
    if len(block_nbytes) != size:
        raise ValueError(f"bruck_allgather: block_nbytes has {len(block_nbytes)} entries for {size} ranks")
    if block.numel() != block_nbytes[rank]:
        raise ValueError(f"bruck_allgather: rank {rank} block has {block.numel()} bytes, "
                         f"block_nbytes says {block_nbytes[rank]}")
    # held[j] is the block of rank (rank + j) % size
    held: list[torch.Tensor] = [block]
    distance = 1
    while distance < size:
        count = min(distance, size - distance)
        dest = (rank - distance) % size
        source = (rank + distance) % size
        outgoing = held[0] if count == 1 else torch.cat(held[:count])
        incoming_sizes = [block_nbytes[(source + j) % size] for j in range(count)]
        incoming = torch.empty(sum(incoming_sizes), dtype=torch.uint8, device=block.device)
        comm.exchange([(dest, outgoing)], [(source, incoming)])
        held.extend(incoming.split(incoming_sizes))
        distance *= 2
    return [held[(q - rank) % size] for q in range(size)]


def bruck_allgather_var(comm: Comm, block: torch.Tensor) -> list[torch.Tensor]:
    """Bruck all-gather when block sizes differ between ranks and are not known.

    The sizes are all-gathered first (one int64 per rank, its own ceil(log2 P) rounds,
    counted), then the blocks.
    """
    sizes = comm.allgather_small(torch.tensor([block.numel()], dtype=torch.int64))
    return bruck_allgather(comm, block, [int(s) for s in sizes.reshape(-1).tolist()])
