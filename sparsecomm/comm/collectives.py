"""Collective steps shared by several algorithms, built only on :meth:`Comm.exchange`.

Each step is written once here and reused (SparDL's final all-gather, TopkA, the small
handshakes of the reducer all use :func:`bruck_allgather`; gs-SGD sums its sketches and
exact values with :func:`halving_allreduce_`).

The functions take the :class:`~sparsecomm.comm.base.Comm` they run on as an argument and
only call its methods, so this module needs ``Comm`` for type hints alone: ``base`` imports
it (``Comm.allgather_small`` is a Bruck all-gather), never the other way round.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import torch

from ..formats.header import HEADER_NBYTES, Kind, check_header, pack_header

if TYPE_CHECKING:
    from .base import Comm

__all__ = ["bruck_allgather", "bruck_allgather_var", "allgather_int64", "halving_tree", "halving_allreduce_"]


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
    sizes = [int(s) for s in comm.allgather_small(torch.tensor([block.numel()], dtype=torch.int64)).reshape(-1).tolist()]
    check = getattr(comm, "_check_size", None)  # peers' sizes are not trusted: bounded per call
    if check is not None:
        sizes = [n if q == comm.rank else check(n, q) for q, n in enumerate(sizes)]
    return bruck_allgather(comm, block, sizes)


def allgather_int64(comm: Comm, values: Sequence[int], n: int) -> torch.Tensor:
    """All-gather of ``len(values)`` int64 per rank (the same length on every rank) as headed
    messages, for an algorithm's small control steps (counts, boundaries, histograms).

    Each block is ``[header: Kind.DENSE, value dtype int64, N = n, count][count x int64]``,
    the documented layout, sent with :func:`bruck_allgather` (ceil(log2 P) rounds,
    (P-1)(32 + 8 count) bytes per rank); every received header is checked (sender, N, count).
    Returns a (P, count) int64 tensor in rank order, equal on every rank.
    """
    rank, size = comm.rank, comm.size
    mine = torch.tensor(list(values), dtype=torch.int64)
    count = mine.numel()
    nbytes = HEADER_NBYTES + 8 * count
    block = torch.empty(nbytes, dtype=torch.uint8)
    block[:HEADER_NBYTES].copy_(torch.from_numpy(pack_header(Kind.DENSE, rank, n, count, torch.int64)))
    block[HEADER_NBYTES:].view(torch.int64).copy_(mine)
    blocks = bruck_allgather(comm, block.to(comm.device), [nbytes] * size)
    table = torch.empty((size, count), dtype=torch.int64)
    for source, got in enumerate(blocks):
        got = got.cpu()
        if source != rank:
            check_header(got, receiver=rank, sender=source, kind=Kind.DENSE, n=n, value_dtype=torch.int64,
                         count=count)
        table[source].copy_(got[HEADER_NBYTES:].view(torch.int64))
    return table


def halving_tree(size: int) -> list[list[tuple[int, int]]]:
    """The rounds of gs-SGD's recursive halving ("A Distributed SGD Algorithm with Global
    Sketching", section III-A, Algorithm 1 lines 8-23 and Fig. 1) as lists of
    (sender, receiver).

    Participants are paired in id order; the odd one out (the largest id) passes to the
    next round. ceil(log2 size) rounds.
    """
    active = list(range(size))
    rounds = []
    while len(active) > 1:
        rounds.append([(active[i + 1], active[i]) for i in range(0, len(active) - 1, 2)])
        active = active[0::2]
    return rounds


def halving_allreduce_(comm: Comm, tensor: torch.Tensor, n: int) -> torch.Tensor:
    """In-place SUM of a 1-D float tensor over ranks: the :func:`halving_tree` to rank 0,
    then the same tree backwards (gs-SGD, "A Distributed SGD Algorithm with Global
    Sketching", section III-A: Algorithm 1 lines 8-23 sum the sketches on the first
    worker; running the tree backwards hands the sum to every worker).

    Messages: ``[header: Kind.DENSE, value dtype, N = n, count = numel][numel values]``;
    the receiver checks the header. Every rank ends with rank 0's bytes (bit-identical).
    At most 2 ceil(log2 P) rounds.
    """
    rank = comm.rank
    count = tensor.numel()
    nbytes = HEADER_NBYTES + count * tensor.element_size()
    header = torch.from_numpy(pack_header(Kind.DENSE, rank, n, count, tensor.dtype))

    def message() -> torch.Tensor:
        payload = torch.empty(nbytes, dtype=torch.uint8)
        payload[:HEADER_NBYTES].copy_(header)
        payload[HEADER_NBYTES:].view(tensor.dtype).copy_(tensor)
        return payload

    def receive(source: int) -> torch.Tensor:
        buf = torch.empty(nbytes, dtype=torch.uint8)
        comm.exchange([], [(source, buf)])
        check_header(buf, receiver=rank, sender=source, kind=Kind.DENSE, n=n, value_dtype=tensor.dtype,
                     count=count)
        return buf[HEADER_NBYTES:].view(tensor.dtype)

    rounds = halving_tree(comm.size)
    for pairs in rounds:
        for sender, receiver in pairs:
            if rank == sender:
                comm.exchange([(receiver, message())], [])
            elif rank == receiver:
                tensor.add_(receive(sender))
    for pairs in reversed(rounds):
        for sender, receiver in pairs:
            if rank == receiver:
                comm.exchange([(sender, message())], [])
            elif rank == sender:
                tensor.copy_(receive(receiver))
    return tensor
