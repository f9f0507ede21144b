"""The record one call's message schedule fills round by round (:class:`Traffic`): bytes sent and
received and rounds per rank, the per-round cost, and its alpha-beta time."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from ..formats.header import HEADER_NBYTES
from ..formats.stream import stream_delta, stream_nbytes
from .links import Links

__all__ = ["Traffic", "UNNAMED_PEER", "stream_message_nbytes"]

#: a message's receiver in a round whose peers are not known (:meth:`Traffic.spread`): a rank on
#: another node that receives what the sender sends
UNNAMED_PEER = -1


class Traffic:
    """Per-rank bytes and rounds of one call, and its round-by-round cost.

    The time (:meth:`time`): rounds run one after another; a rank's cost in a round is
    ``messages * alpha + bytes * beta`` on its sending side and on its receiving side
    (full-duplex links), the round costs what its slowest rank pays. ``exact`` is False for an
    estimate; ``notes`` say how a figure was obtained (e.g. what a chooser chose).

    On a cluster of nodes (:meth:`time_on_nodes`) the same rounds cost what their messages
    cost on the link each one takes: the record keeps every round's messages for it."""

    def __init__(self, size: int):
        self.size = size
        self.sent = np.zeros(size, dtype=np.int64)
        self.recv = np.zeros(size, dtype=np.int64)
        self.rounds = np.zeros(size, dtype=np.int64)
        #: per round: (messages sent, bytes sent, messages received, bytes received) of each rank
        self._cost: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        #: per round (aligned with ``_cost``): (senders, receivers, bytes, ranks taking part)
        self._messages: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        self.exact = True
        self.notes: list[str] = []
        #: (size round, the round of the payloads it announces), indices into ``_messages``
        self._size_rounds: list[tuple[int, int]] = []

    @classmethod
    def spread(cls, size: int, nbytes: int, rounds: int) -> "Traffic":
        """Every rank sends ``nbytes`` in ``rounds`` rounds of one message each way, the bytes
        spread evenly over the rounds: for a message schedule known only by its slowest rank's totals.
        What a rank receives is not known from them: ``recv`` stays 0 (in the time, each rank
        receives what it sends); the peers are not named (on a cluster: on other nodes).
        The last round carries what the even shares leave over, so ``sent`` is ``nbytes``."""
        t = cls(size)
        ranks = np.arange(size)
        unnamed = np.full(size, UNNAMED_PEER)
        share = nbytes // max(rounds, 1)
        for r in range(int(rounds)):
            last = r == rounds - 1
            t.round(ranks, unnamed, np.full(size, nbytes - share * (rounds - 1) if last else share))
        return t

    def round(self, src: Sequence[int], dst: Sequence[int], nbytes: Sequence[int],
              idle: Sequence[int] = ()) -> None:
        """One round of messages ``src[i] -> dst[i]`` of ``nbytes[i]`` bytes; ``idle`` ranks take
        part without a message (a receive of nothing still counts the round there). A receiver
        :data:`UNNAMED_PEER` is a rank on another node receiving what the sender sends (not
        counted in ``recv``)."""
        src = np.asarray(src, dtype=np.int64).reshape(-1)
        dst = np.asarray(dst, dtype=np.int64).reshape(-1)
        nb = np.asarray(nbytes, dtype=np.int64).reshape(-1)
        p = self.size
        named = dst != UNNAMED_PEER
        ms = np.bincount(src, minlength=p)
        bs = np.bincount(src, weights=nb, minlength=p).astype(np.int64)
        mr = np.bincount(dst[named], minlength=p)
        br = np.bincount(dst[named], weights=nb[named], minlength=p).astype(np.int64)
        self.sent += bs
        self.recv += br
        if not named.all():
            mr = mr + np.bincount(src[~named], minlength=p)
            br = br + np.bincount(src[~named], weights=nb[~named], minlength=p).astype(np.int64)
        part = (ms > 0) | (mr > 0)
        if len(idle):
            part[np.asarray(idle, dtype=np.int64)] = True
        if not part.any():
            return
        self.rounds += part
        self._cost.append((ms, bs, mr, br))
        self._messages.append((src, dst, nb, np.flatnonzero(part)))

    def run_concurrently(self, parts: Sequence[tuple["Traffic", Sequence[int]]]) -> None:
        """Append the rounds of several calls that run at the same time on disjoint groups of
        this record's ranks: ``parts`` are (the call's record, the ranks here of its ranks 0, 1,
        ...). Round j here holds round j of every part (the calls start together)."""
        for j in range(max((len(t._messages) for t, _ in parts), default=0)):
            src, dst, nb, idle = [], [], [], []
            for t, ranks in parts:
                if j >= len(t._messages):
                    continue
                ranks = np.asarray(ranks, dtype=np.int64)
                s, d, b, part = t._messages[j]
                src.append(ranks[s])
                dst.append(np.where(d == UNNAMED_PEER, UNNAMED_PEER, ranks[np.maximum(d, 0)]))
                nb.append(b)
                idle.append(ranks[part])
            self.round(np.concatenate(src), np.concatenate(dst), np.concatenate(nb), idle=np.concatenate(idle))

    def var_round(self, src, dst, nbytes, receivers: Sequence[int] = ()) -> None:
        """``exchange_var``: a round of 8-byte sizes, then the payloads (the size round a Comm
        sends where :meth:`~sparsecomm.comm.base.Comm.sizes_take_a_round`; :meth:`unsized`
        gives the record without it)."""
        first = len(self._messages)
        self.round(src, dst, [8] * len(src), idle=receivers)
        self.round(src, dst, nbytes, idle=receivers)
        if len(self._messages) == first + 2:
            self._size_rounds.append((first, first + 1))

    def bruck_allgather(self, members: Sequence[int], block_nbytes: Sequence[int], var: bool = False) -> None:
        """:func:`~sparsecomm.comm.collectives.bruck_allgather` inside ``members`` (global
        ranks), block q of ``block_nbytes[q]`` bytes; with ``var``,
        :func:`~sparsecomm.comm.collectives.bruck_allgather_var`: each round variable-size, a
        message of c > 1 blocks headed by their c sizes (8 bytes each)."""
        q = len(members)
        members = np.asarray(members, dtype=np.int64)
        sz = np.asarray(block_nbytes, dtype=np.int64)
        ext = np.concatenate([sz, sz])
        csum = np.concatenate([[0], np.cumsum(ext)])
        pos = np.arange(q)
        d = 1
        while d < q:
            count = min(d, q - d)
            nb = csum[pos + count] - csum[pos]
            if var:
                self.var_round(members[pos], members[(pos - d) % q], nb + (8 * count if count > 1 else 0))
            else:
                self.round(members[pos], members[(pos - d) % q], nb)
            d *= 2

    def coded(self, ratio: float) -> "Traffic":
        """This record with every message's bytes times ``ratio`` (a COO codec's bytes over the
        plain message's), each message variable-size (after a round of sizes, which
        :meth:`unsized` folds away): the schedule of an algorithm whose messages go through a
        coded codec, as an estimate (``exact`` False). For schedules without variable-size
        rounds of their own (every message of fixed size when plain: topka, spardl)."""
        out = Traffic(self.size)
        out.exact, out.notes = False, list(self.notes) + [f"coded: bytes x {ratio:.3f}"]
        for src, dst, nb, part in self._messages:
            out.var_round(src, dst, np.ceil(nb * ratio).astype(np.int64), receivers=part)
        return out

    def unsized(self) -> "Traffic":
        """This record as sent by a Comm whose variable-size rounds take no size round (a bound
        on a backend that receives short, or MPI's probes): each size round's 8-byte messages
        travel in the round of the payloads they announce, and an empty payload as one byte
        (the bounded receive is always posted). Only the bounded receive sends that byte; a
        probing Comm sends none, so its bytes are at most one per empty message lower."""
        out = Traffic(self.size)
        out.exact, out.notes = self.exact, list(self.notes)
        skip = {size for size, _ in self._size_rounds}
        announced = {payload for _, payload in self._size_rounds}
        for i, (src, dst, nb, part) in enumerate(self._messages):
            if i in skip:
                continue
            out.round(src, dst, 8 + np.maximum(nb, 1) if i in announced else nb, idle=part)
        return out

    def allgather_int64(self, count: int) -> None:
        """:func:`~sparsecomm.comm.collectives.allgather_int64` of ``count`` values per rank
        (headed messages) over all ranks."""
        self.bruck_allgather(range(self.size), [HEADER_NBYTES + 8 * count] * self.size)

    def time(self, alpha: float, beta: float) -> float:
        """Seconds of the call at ``alpha`` s per message and ``beta`` s per byte (compute aside)."""
        total = 0.0
        for ms, bs, mr, br in self._cost:
            total += float(np.maximum(ms * alpha + bs * beta, mr * alpha + br * beta).max())
        return total

    def _link_split(self, ranks_per_node: int):
        """Per round: (senders, receivers, bytes, whether the message stays in its node); rank
        r is on node r // ranks_per_node (torchrun's layout)."""
        for src, dst, nb, _ in self._messages:
            inside = (dst != UNNAMED_PEER) & (src // ranks_per_node == np.maximum(dst, 0) // ranks_per_node)
            yield src, dst, nb, inside

    def time_on_nodes(self, ranks_per_node: int, links: Links) -> float:
        """Seconds of the call when its ranks sit on nodes of ``ranks_per_node`` (rank r on node
        r // ranks_per_node) joined by ``links``. Rounds run one after another; in a round a
        message between two ranks of one node takes the sender's and the receiver's own
        intra-node links (``messages * intra_alpha + bytes * intra_beta`` on each side, as
        :meth:`time`); the messages leaving or entering a node share its one NIC: the node pays
        ``alpha`` times the most messages any of its ranks sends (the ranks start their
        messages at once) plus ``beta`` times the bytes of all of them, on each side (a
        full-duplex NIC). The round costs the slowest rank's intra-node side or the slowest
        node's NIC, whichever is longer (the two kinds of link run at the same time). With
        ``ranks_per_node = 1`` this is :meth:`time` at ``alpha``, ``beta``."""
        p, per = self.size, ranks_per_node
        nodes = -(-p // per)
        total = 0.0
        for src, dst, nb, inside in self._link_split(per):
            cost = 0.0
            if inside.any():
                s, d, b = src[inside], dst[inside], nb[inside]
                send, recv = (np.bincount(ends, minlength=p) * links.intra_alpha
                              + np.bincount(ends, weights=b, minlength=p) * links.intra_beta for ends in (s, d))
                cost = float(np.maximum(send, recv).max())
            out = ~inside
            if out.any():
                s, d, b = src[out], dst[out], nb[out]
                # an unnamed receiver receives on another node what its sender sends
                d = np.where(d == UNNAMED_PEER, s, d)
                sides = []
                for ends in (s, d):
                    msgs = np.bincount(ends, minlength=nodes * per).reshape(nodes, per).max(1)
                    nbytes = np.bincount(ends // per, weights=b, minlength=nodes)
                    sides.append(msgs * links.alpha + nbytes * links.beta)
                cost = max(cost, float(np.maximum(*sides).max()))
            total += cost
        return total

    def sent_by_level(self, ranks_per_node: int) -> tuple[np.ndarray, np.ndarray]:
        """(bytes each rank sends inside its node, bytes it sends to other nodes), rank order."""
        inside_sent = np.zeros(self.size, dtype=np.int64)
        outside_sent = np.zeros(self.size, dtype=np.int64)
        for src, _, nb, inside in self._link_split(ranks_per_node):
            inside_sent += np.bincount(src[inside], weights=nb[inside], minlength=self.size).astype(np.int64)
            outside_sent += np.bincount(src[~inside], weights=nb[~inside], minlength=self.size).astype(np.int64)
        return inside_sent, outside_sent

    @property
    def bytes_per_rank(self) -> int:
        """The most bytes any rank sends (the study's "bytes per rank")."""
        return int(self.sent.max()) if self.size else 0

    @property
    def max_rounds(self) -> int:
        return int(self.rounds.max()) if self.size else 0


def stream_message_nbytes(n: int, count: int, dtype: torch.dtype) -> int:
    """Bytes of a sparse stream of ``count`` items over a range of ``n``, dense past delta
    (the SparseStream rule)."""
    dense = count > stream_delta(n, dtype)
    return stream_nbytes(n, 0 if dense else count, dtype, dense)
