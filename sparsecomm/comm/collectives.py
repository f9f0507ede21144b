"""Collective steps shared by several algorithms, built only on :meth:`Comm.exchange` and
:meth:`Comm.exchange_var`.

Each step is written once here and reused (SparDL's final all-gather, TopkA, the small
handshakes of the reducer all use :func:`bruck_allgather`; gs-SGD sums its sketches and
exact values with :func:`reduce_scatter_allgather_`, the transpose of the Bruck all-gather
followed by the all-gather itself; :func:`halving_allreduce_` is the paper's tree, kept as an
option).

The functions take what they run on as an argument -- a :class:`~sparsecomm.comm.base.Comm`,
or a view of some of its ranks (SparDL's teams) -- and only use what :class:`PeerGroup`
names, so this module never imports ``base``: ``base`` imports it
(``Comm.allgather_small`` is a Bruck all-gather), never the other way round.
"""

from __future__ import annotations

from typing import Protocol, Sequence

import numpy as np
import torch

from ..errors import WireFormatError
from ..formats.header import HEADER_NBYTES, Kind, check_header, pack_header

__all__ = ["bruck_allgather", "bruck_allgather_var", "allgather_int64", "halving_tree", "halving_allreduce_",
           "block_bounds", "bruck_reduce_scatter_", "reduce_scatter_allgather_", "allgather_slices_",
           "reduce_scatter_allgather_traffic", "bruck_reduce_scatter_rounds", "allgather_slices_rounds",
           "direct_reduce_scatter_into_", "direct_allgather_slices_", "direct_reduce_scatter_rounds",
           "direct_allgather_rounds",
           "halving_allreduce_traffic", "bruck_allgather_traffic"]


class PeerGroup(Protocol):
    """What these steps use of a :class:`sparsecomm.comm.base.Comm` (or of a view of some of
    its ranks): its place in the group and its rounds of point-to-point messages, of known
    sizes (``exchange``) or not (``exchange_var``, bounded by ``max_message_bytes``, the
    call's bound per message or None)."""

    max_message_bytes: int | None

    @property
    def rank(self) -> int: ...

    @property
    def size(self) -> int: ...

    @property
    def device(self) -> torch.device: ...

    def exchange(self, sends: Sequence[tuple[int, torch.Tensor]], recvs: Sequence[tuple[int, torch.Tensor]]
                 ) -> None: ...

    def exchange_var(self, sends: Sequence[tuple[int, torch.Tensor]], sources: Sequence[int],
                     max_nbytes: int | None = None) -> list[torch.Tensor]: ...


def bruck_allgather(comm: PeerGroup, block: torch.Tensor, block_nbytes: Sequence[int]) -> list[torch.Tensor]:
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


def bruck_allgather_var(comm: PeerGroup, block: torch.Tensor) -> list[torch.Tensor]:
    """Bruck all-gather when block sizes differ between ranks and are not known.

    The rounds of :func:`bruck_allgather`, each a variable-size round (``exchange_var``): a
    message of one block is the block; a message of ``c`` > 1 blocks starts with their ``c``
    sizes (int64). No round is spent on sizes where the Comm needs none for ``exchange_var``
    (:meth:`~sparsecomm.comm.base.Comm.sizes_take_a_round`); elsewhere each round is preceded
    by its size round. Received sizes are checked against the call's bound per block
    (``max_message_bytes``) and against the message that carried them.
    """
    size, rank = comm.size, comm.rank
    limit = comm.max_message_bytes
    held: list[torch.Tensor] = [block]   # held[j] is the block of rank (rank + j) % size
    distance = 1
    while distance < size:
        count = min(distance, size - distance)
        dest = (rank - distance) % size
        source = (rank + distance) % size
        if count == 1:
            outgoing = held[0]
        else:
            sizes = torch.tensor([b.numel() for b in held[:count]], dtype=torch.int64, device="cpu")
            outgoing = torch.cat([sizes.view(torch.uint8).to(block.device)] + held[:count])
        bound = None if limit is None else count * (limit + 8)
        incoming = comm.exchange_var([(dest, outgoing)], [source], max_nbytes=bound)[0]
        if count == 1:
            held.append(incoming)
        else:
            head = 8 * count
            if incoming.numel() < head:
                raise WireFormatError(f"rank {rank}: rank {source} sent {incoming.numel()} bytes for {count} blocks "
                                      f"of an all-gather, less than their {head} bytes of sizes")
            got = incoming[:head].cpu().view(torch.int64).tolist()
            if min(got) < 0 or (limit is not None and max(got) > limit) or sum(got) != incoming.numel() - head:
                raise WireFormatError(f"rank {rank}: rank {source} sent block sizes {got} in an all-gather message "
                                      f"of {incoming.numel()} bytes (sizes + blocks must fill it; each block at most "
                                      f"{limit} bytes)")
            held.extend(incoming[head:].split(got))
        distance *= 2
    return [held[(q - rank) % size] for q in range(size)]


def allgather_int64(comm: PeerGroup, values: Sequence[int], n: int) -> torch.Tensor:
    """All-gather of ``len(values)`` int64 per rank (the same length on every rank) as headed
    messages, for an algorithm's small control steps (counts, boundaries, histograms).

    Each block is ``[header: Kind.DENSE, value dtype int64, N = n, count][count x int64]``,
    the documented layout, sent with :func:`bruck_allgather` (ceil(log2 P) rounds,
    (P-1)(32 + 8 count) bytes per rank); every received header is checked (sender, N, count).
    Returns a (P, count) int64 tensor in rank order, equal on every rank.
    """
    rank, size = comm.rank, comm.size
    # control data: built and read on the host, sent on the Comm's device
    mine = torch.tensor(list(values), dtype=torch.int64, device="cpu")
    count = mine.numel()
    nbytes = HEADER_NBYTES + 8 * count
    block = torch.empty(nbytes, dtype=torch.uint8, device="cpu")
    block[:HEADER_NBYTES].copy_(torch.from_numpy(pack_header(Kind.DENSE, rank, n, count, torch.int64)))
    block[HEADER_NBYTES:].view(torch.int64).copy_(mine)
    blocks = bruck_allgather(comm, block.to(comm.device), [nbytes] * size)
    table = torch.empty((size, count), dtype=torch.int64, device="cpu")
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


def halving_allreduce_(comm: PeerGroup, tensor: torch.Tensor, n: int) -> torch.Tensor:
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
    # the header is built on the host and copied once to the tensor's device
    header = torch.from_numpy(pack_header(Kind.DENSE, rank, n, count, tensor.dtype)).to(tensor.device)

    def message() -> torch.Tensor:
        payload = torch.empty(nbytes, dtype=torch.uint8, device=tensor.device)
        payload[:HEADER_NBYTES].copy_(header)
        payload[HEADER_NBYTES:].view(tensor.dtype).copy_(tensor)
        return payload

    def receive(source: int) -> torch.Tensor:
        buf = torch.empty(nbytes, dtype=torch.uint8, device=tensor.device)
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


def _bruck_distances(size: int) -> list[int]:
    """The distances 1, 2, 4, ... < size of the Bruck all-gather's rounds."""
    distances, d = [], 1
    while d < size:
        distances.append(d)
        d *= 2
    return distances


def block_bounds(length: int, size: int) -> list[int]:
    """The P + 1 boundaries of a length-``length`` vector cut into ``size`` contiguous slices
    whose lengths differ by at most one: slice q is ``[bounds[q], bounds[q + 1])``."""
    return [q * length // size for q in range(size + 1)]


def bruck_reduce_scatter_(comm: PeerGroup, tensor: torch.Tensor, n: int) -> torch.Tensor:
    """Reduce-scatter (SUM) of a 1-D float tensor, in place, for any P without folding: the
    transpose of :func:`bruck_allgather` (SparDL section 2, Figure 2b, run backwards).

    The tensor is cut into P slices (:func:`block_bounds`); rank q ends with the sum over all
    ranks of slice q, in place (the rest of its tensor holds partial sums). Rounds run the
    all-gather's distances from the largest down to 1; at distance d with count
    c = min(d, P - d) rank r sends its partial sums of slices r + d .. r + d + c - 1 (mod P) to
    rank r + d and adds the ones rank r - d sends for slices r .. r + c - 1. Before that round
    rank r holds partial sums for slices r .. r + d + c - 1, after it for r .. r + d - 1: each
    slice's contributions reach its owner along exactly one path, as each block reaches each
    rank exactly once in the all-gather. So every rank sends every other rank's slice exactly
    once: (P - 1)/P of the tensor in ceil(log2 P) rounds, the reduce-scatter optimum, with no
    root and no folding step for P not a power of two. The additions follow the message schedule, so
    the summation order of a slice is fixed: the result does not depend on timing.

    Messages: ``[header: Kind.DENSE, value dtype, N = n, count][count values]`` (the round's
    slices, concatenated in order); the receiver checks the header. Returns the rank's own
    slice, a view of ``tensor``.
    """
    rank, size = comm.rank, comm.size
    bounds = block_bounds(tensor.numel(), size)

    def slices(first: int, count: int) -> list[tuple[int, int]]:
        return [(bounds[q], bounds[q + 1]) for q in ((first + i) % size for i in range(count))]

    for distance in reversed(_bruck_distances(size)):
        count = min(distance, size - distance)
        dest, source = (rank + distance) % size, (rank - distance) % size
        outgoing = slices(dest, count)
        incoming = slices(rank, count)
        out_count = sum(b - a for a, b in outgoing)
        in_count = sum(b - a for a, b in incoming)
        message = torch.empty(HEADER_NBYTES + out_count * tensor.element_size(), dtype=torch.uint8,
                              device=tensor.device)
        message[:HEADER_NBYTES].copy_(torch.from_numpy(pack_header(Kind.DENSE, rank, n, out_count, tensor.dtype)))
        body = message[HEADER_NBYTES:].view(tensor.dtype)
        at = 0
        for a, b in outgoing:
            body[at:at + b - a].copy_(tensor[a:b])
            at += b - a
        buf = torch.empty(HEADER_NBYTES + in_count * tensor.element_size(), dtype=torch.uint8, device=tensor.device)
        comm.exchange([(dest, message)], [(source, buf)])
        check_header(buf, receiver=rank, sender=source, kind=Kind.DENSE, n=n, value_dtype=tensor.dtype,
                     count=in_count)
        got = buf[HEADER_NBYTES:].view(tensor.dtype)
        at = 0
        for a, b in incoming:
            tensor[a:b].add_(got[at:at + b - a])
            at += b - a
    return tensor[bounds[rank]:bounds[rank + 1]]


def reduce_scatter_allgather_(comm: PeerGroup, tensor: torch.Tensor, n: int) -> torch.Tensor:
    """In-place SUM of a 1-D float tensor over ranks without a root: :func:`bruck_reduce_scatter_`
    then :func:`bruck_allgather` of the summed slices (each slice as its own headed message,
    ``[header: Kind.DENSE, value dtype, N = n, count = slice length][values]``, checked on
    receipt: sender = the slice's owner). 2 ceil(log2 P) rounds; every rank sends about
    2 (P - 1)/P of the tensor (exactly: :func:`reduce_scatter_allgather_traffic`). Every rank
    ends with the owners' bytes, so the result is bit-identical everywhere.
    """
    if comm.size == 1:
        return tensor
    bruck_reduce_scatter_(comm, tensor, n)
    return allgather_slices_(comm, tensor, n)


def allgather_slices_(comm: PeerGroup, tensor: torch.Tensor, n: int) -> torch.Tensor:
    """In place, every rank's slice of a 1-D tensor (:func:`block_bounds`: rank q holds slice
    q) to every rank, by :func:`bruck_allgather`: each slice as its own headed message,
    ``[header: Kind.DENSE, value dtype, N = n, count = slice length][values]``, checked on
    receipt (sender = the slice's owner). The second half of
    :func:`reduce_scatter_allgather_`; every rank ends with the owners' bytes."""
    rank, size = comm.rank, comm.size
    if size == 1:
        return tensor
    bounds = block_bounds(tensor.numel(), size)
    mine = tensor[bounds[rank]:bounds[rank + 1]]
    isize = tensor.element_size()
    block_nbytes = [HEADER_NBYTES + (bounds[q + 1] - bounds[q]) * isize for q in range(size)]
    block = torch.empty(block_nbytes[rank], dtype=torch.uint8, device=tensor.device)
    block[:HEADER_NBYTES].copy_(torch.from_numpy(pack_header(Kind.DENSE, rank, n, mine.numel(), tensor.dtype)))
    block[HEADER_NBYTES:].view(tensor.dtype).copy_(mine)
    for owner, got in enumerate(bruck_allgather(comm, block, block_nbytes)):
        if owner == rank:
            continue
        count = bounds[owner + 1] - bounds[owner]
        # the header names the slice's owner (the sender field of a forwarded block is its origin)
        check_header(got, receiver=rank, sender=owner, kind=Kind.DENSE, n=n, value_dtype=tensor.dtype, count=count)
        tensor[bounds[owner]:bounds[owner + 1]].copy_(got[HEADER_NBYTES:].view(tensor.dtype))
    return tensor


def _slice_messages(rank: int, peer: int, n: int, part: torch.Tensor) -> list[tuple[int, torch.Tensor]]:
    """A header and ``part``'s own bytes (no copy) for ``peer``; no body for an empty part."""
    header = torch.from_numpy(pack_header(Kind.DENSE, rank, n, part.numel(), part.dtype)).to(part.device)
    return [(peer, header)] + ([(peer, part.view(torch.uint8))] if part.numel() else [])


def _slice_buffers(peer: int, count: int, dtype: torch.dtype, device, into: torch.Tensor | None = None):
    """(header buffer, body buffer or None, receives): where ``peer``'s header and ``count``
    values land (``into``'s own bytes when given: no copy)."""
    header = torch.empty(HEADER_NBYTES, dtype=torch.uint8, device=device)
    body = None
    if count:
        body = into.view(torch.uint8) if into is not None else \
            torch.empty(count * dtype.itemsize, dtype=torch.uint8, device=device)
    return header, body, [(peer, header)] + ([(peer, body)] if body is not None else [])


def direct_reduce_scatter_into_(comm: PeerGroup, tensor: torch.Tensor, n: int, acc: torch.Tensor,
                                own: bool = True) -> None:
    """``acc += `` the sum over ranks of their slice ``rank`` of ``tensor`` (:func:`block_bounds`),
    the peers' in rank order, then this rank's own (``own=False``: not added, for a caller that
    adds it fused with its next pass), in ONE round: every rank sends each peer that peer's slice straight from
    ``tensor`` (a header message ``[Kind.DENSE, value dtype, N = n, count]``, then the slice's own
    bytes: no copy) and receives its own slice from each peer. For the few fast-linked ranks of
    a node (two-level reduction): (P - 1)/P of the tensor leaves each rank, like a ring or
    Bruck reduce-scatter, with one round's latency instead of log2 P or P - 1, and without
    packing. ``acc`` has the length of this rank's slice; ``tensor`` is not changed."""
    rank, size = comm.rank, comm.size
    bounds = block_bounds(tensor.numel(), size)
    lo, hi = bounds[rank], bounds[rank + 1]
    sends, recvs, got = [], [], {}
    for q in range(size):
        if q == rank:
            continue
        sends += _slice_messages(rank, q, n, tensor[bounds[q]:bounds[q + 1]])
        header, body, receives = _slice_buffers(q, hi - lo, tensor.dtype, tensor.device)
        recvs += receives
        got[q] = (header, body)
    comm.exchange(sends, recvs)
    for q in range(size):
        if q == rank:
            continue
        header, body = got[q]
        check_header(header, receiver=rank, sender=q, kind=Kind.DENSE, n=n, value_dtype=tensor.dtype, count=hi - lo)
        if body is not None:
            acc.add_(body.view(tensor.dtype))
    if own:
        acc.add_(tensor[lo:hi])


def direct_allgather_slices_(comm: PeerGroup, tensor: torch.Tensor, n: int) -> torch.Tensor:
    """In place, every rank's slice of ``tensor`` (:func:`block_bounds`) to every rank in ONE
    round: each rank sends its slice's own bytes to every peer (after a header, as in
    :func:`direct_reduce_scatter_into_`) and receives each peer's straight into that peer's
    slice of ``tensor``. Every rank ends with the owners' bytes."""
    rank, size = comm.rank, comm.size
    if size == 1:
        return tensor
    bounds = block_bounds(tensor.numel(), size)
    mine = tensor[bounds[rank]:bounds[rank + 1]]
    sends, recvs, headers = [], [], {}
    for q in range(size):
        if q == rank:
            continue
        sends += _slice_messages(rank, q, n, mine)
        part = tensor[bounds[q]:bounds[q + 1]]
        header, _, receives = _slice_buffers(q, part.numel(), tensor.dtype, tensor.device, into=part)
        recvs += receives
        headers[q] = (header, part.numel())
    comm.exchange(sends, recvs)
    for q, (header, count) in headers.items():
        check_header(header, receiver=rank, sender=q, kind=Kind.DENSE, n=n, value_dtype=tensor.dtype, count=count)
    return tensor


def direct_reduce_scatter_rounds(size: int, count: int,
                                 itemsize: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """The messages of :func:`direct_reduce_scatter_into_` of ``count`` values among ``size``
    ranks, sizes only: one round of (senders, receivers, bytes) in which rank r sends every peer
    q a header and, when not empty, slice q."""
    return _direct_rounds(size, count, itemsize, to_owner=True)


def direct_allgather_rounds(size: int, count: int, itemsize: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """The messages of :func:`direct_allgather_slices_`, sizes only: one round in which rank r
    sends every peer a header and, when not empty, its own slice r."""
    return _direct_rounds(size, count, itemsize, to_owner=False)


def _direct_rounds(size: int, count: int, itemsize: int, to_owner: bool):
    if size == 1:
        return []
    length = np.diff(np.asarray(block_bounds(count, size), dtype=np.int64))
    src, dst, nbytes = [], [], []
    for r in range(size):
        for q in range(size):
            if q == r:
                continue
            body = int(length[q] if to_owner else length[r])
            src += [r] + ([r] if body else [])
            dst += [q] + ([q] if body else [])
            nbytes += [HEADER_NBYTES] + ([body * itemsize] if body else [])
    return [(np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64), np.asarray(nbytes, dtype=np.int64))]


def bruck_reduce_scatter_rounds(size: int, count: int,
                                itemsize: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """The messages of :func:`bruck_reduce_scatter_` of ``count`` values of ``itemsize`` bytes
    among ``size`` ranks, sizes only: per round, (senders, receivers, bytes) of every rank,
    headers included. At distance d (largest first) rank r sends one headed message of slices
    r + d .. r + d + min(d, P - d) - 1 to rank r + d."""
    ranks, prefix = _slice_prefix(size, count)
    rounds = []
    for d in reversed(_bruck_distances(size)):
        c = min(d, size - d)
        body = prefix[ranks + d + c] - prefix[ranks + d]
        rounds.append((ranks, (ranks + d) % size, HEADER_NBYTES + itemsize * body))
    return rounds


def allgather_slices_rounds(size: int, count: int, itemsize: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """The messages of :func:`allgather_slices_` of ``count`` values, sizes only: per round,
    (senders, receivers, bytes) of every rank: :func:`bruck_allgather` of the headed slices (at
    distance d rank r sends the blocks of ranks r .. r + min(d, P - d) - 1 to rank r - d)."""
    if size == 1:
        return []
    ranks, prefix = _slice_prefix(size, count)
    rounds = []
    for d in _bruck_distances(size):
        c = min(d, size - d)
        rounds.append((ranks, (ranks - d) % size, c * HEADER_NBYTES + itemsize * (prefix[ranks + c] - prefix[ranks])))
    return rounds


def _slice_prefix(size: int, count: int) -> tuple[np.ndarray, np.ndarray]:
    """(0 .. size - 1, prefix sums of the :func:`block_bounds` slice lengths taken twice round)."""
    bounds = np.asarray(block_bounds(count, size), dtype=np.int64)
    length = np.diff(bounds)
    return np.arange(size, dtype=np.int64), np.concatenate([[0], np.cumsum(np.concatenate([length, length]))])


def reduce_scatter_allgather_traffic(size: int, rank: int, count: int, itemsize: int) -> tuple[int, int]:
    """(bytes sent, rounds) of ``rank`` in :func:`reduce_scatter_allgather_` of ``count``
    values of ``itemsize`` bytes among ``size`` ranks, headers included; written from the
    message schedule (:func:`bruck_reduce_scatter_rounds`, :func:`allgather_slices_rounds`),
    not measured."""
    if size == 1:
        return 0, 0
    rounds = bruck_reduce_scatter_rounds(size, count, itemsize) + allgather_slices_rounds(size, count, itemsize)
    return int(sum(nbytes[rank] for _, _, nbytes in rounds)), len(rounds)


def bruck_allgather_traffic(rank: int, block_nbytes: Sequence[int]) -> tuple[int, int]:
    """(bytes sent, rounds) of ``rank`` in :func:`bruck_allgather` of blocks of the given sizes:
    at distance d it sends the blocks of ranks rank .. rank + min(d, P - d) - 1."""
    size = len(block_nbytes)
    distances = _bruck_distances(size)
    sent = sum(block_nbytes[(rank + i) % size] for d in distances for i in range(min(d, size - d)))
    return sent, len(distances)


def halving_allreduce_traffic(size: int, rank: int, count: int, itemsize: int) -> tuple[int, int]:
    """(bytes sent, rounds) of ``rank`` in :func:`halving_allreduce_` of ``count`` values:
    one full message per edge of the :func:`halving_tree` it is on, up and down."""
    sent = rounds = 0
    for pairs in halving_tree(size):
        for sender, receiver in pairs:
            if rank in (sender, receiver):
                sent += HEADER_NBYTES + count * itemsize
                rounds += 2
    return sent, rounds
