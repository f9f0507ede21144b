"""The ``Comm`` interface every algorithm is written against.

A ``Comm`` moves contiguous ``torch.uint8`` payloads between ranks. Algorithms never call
torch.distributed or MPI directly: they call :meth:`Comm.exchange` (one round of
point-to-point messages, possibly to and from many peers), :meth:`Comm.exchange_var`
(the same when the receiver cannot know the size), :meth:`Comm.allreduce_dense` (the
backend's own dense allreduce, for the ``dense`` baseline and warm-up) and the small
helpers built on them. Each backend implements three primitives:

* ``_post_and_wait(sends, recvs)`` -- post every send and receive, complete them all or
  raise :class:`CommTimeoutError` after ``self.timeout`` seconds;
* ``_allreduce_dense(tensor)`` -- in-place SUM with the backend's native algorithm;
* optionally ``_exchange_var(...)`` -- variable-size receive without a size round
  (MPI probes); the default sends a size header first and counts it as a round.

Counters (:class:`CommStats`) are cumulative per Comm; the reducer snapshots them around
a call to report per-call figures. A *round* is one sequential communication step: all
messages posted together and completed together count as one round.
"""

from __future__ import annotations

import math
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, fields
from typing import Sequence

import torch

from .collectives import bruck_allgather

__all__ = ["Comm", "CommStats", "CommTimeoutError", "CommError", "ring_allreduce_cost"]


class CommError(RuntimeError):
    """A communication step failed (peer gone, protocol violation)."""


class CommTimeoutError(CommError, TimeoutError):
    """A peer did not answer within the Comm's timeout."""


@dataclass
class CommStats:
    """Cumulative counters of one rank. Subtract two snapshots for one call's figures."""

    bytes_sent: int = 0
    bytes_recv: int = 0
    rounds: int = 0
    comm_s: float = 0.0

    def snapshot(self) -> "CommStats":
        return CommStats(**{f.name: getattr(self, f.name) for f in fields(self)})

    def __sub__(self, other: "CommStats") -> "CommStats":
        return CommStats(**{f.name: getattr(self, f.name) - getattr(other, f.name) for f in fields(self)})


def ring_allreduce_cost(nbytes: int, size: int) -> tuple[int, int]:
    """(bytes sent per rank, rounds) of a ring reduce-scatter + all-gather.

    Used to count a backend's native dense allreduce, whose internals we cannot observe:
    2 (P-1) rounds of ceil(nbytes / P) bytes each.
    """
    if size <= 1:
        return 0, 0
    chunk = math.ceil(nbytes / size)
    return 2 * (size - 1) * chunk, 2 * (size - 1)


Message = tuple[int, torch.Tensor]  # (peer rank, contiguous uint8 payload)


def _check_payload(t: torch.Tensor, what: str) -> None:
    if t.dtype != torch.uint8 or t.dim() != 1 or not t.is_contiguous():
        raise TypeError(f"{what} must be a contiguous 1-D torch.uint8 tensor, got dtype={t.dtype} "
                        f"shape={tuple(t.shape)} contiguous={t.is_contiguous()}")


class Comm(ABC):
    """A group of ``size`` ranks; this object is rank ``rank`` of it."""

    #: True when the backend can learn a message's size without a size round (MPI Probe).
    can_probe: bool = False

    def __init__(self, rank: int, size: int, device: torch.device | str = "cpu", timeout: float = 300.0):
        if size < 1 or not (0 <= rank < size):
            raise ValueError(f"invalid rank {rank} for a group of size {size}")
        if not timeout > 0:
            raise ValueError(f"timeout must be positive seconds, got {timeout!r}")
        self._rank = rank
        self._size = size
        self.device = torch.device(device)
        self.timeout = float(timeout)
        self.stats = CommStats()

    # -- identity -------------------------------------------------------------------------
    @property
    def rank(self) -> int:
        return self._rank

    @property
    def size(self) -> int:
        return self._size

    def __repr__(self) -> str:
        return f"{type(self).__name__}(rank={self.rank}, size={self.size}, device={self.device})"

    # -- primitives a backend implements -------------------------------------------------
    @abstractmethod
    def _post_and_wait(self, sends: Sequence[Message], recvs: Sequence[Message]) -> None:
        """Post all sends and receives at once, then wait for all of them.

        Receive buffers are preallocated with the exact expected size. Must raise
        :class:`CommTimeoutError` (naming the peers still pending) after ``self.timeout``.
        Messages between the same pair of ranks are delivered in posting order.
        """

    @abstractmethod
    def _allreduce_dense(self, tensor: torch.Tensor) -> tuple[int, int]:
        """In-place SUM over ranks; returns (bytes sent, rounds) to count for it."""

    def _exchange_var(self, sends: Sequence[Message], sources: Sequence[int]) -> list[torch.Tensor]:
        """Variable-size round: a size header round first, then the payload round."""
        size_bufs = [torch.empty(8, dtype=torch.uint8, device=self.device) for _ in sources]
        size_msgs = [(peer, torch.tensor([t.numel()], dtype=torch.int64).view(torch.uint8).to(self.device))
                     for peer, t in sends]
        self.exchange(size_msgs, list(zip(sources, size_bufs)))
        sizes = [int(b.cpu().view(torch.int64)[0]) for b in size_bufs]
        recv_bufs = [torch.empty(n, dtype=torch.uint8, device=self.device) for n in sizes]
        self.exchange(sends, list(zip(sources, recv_bufs)))
        return recv_bufs

    def _check_peers(self, peers: Sequence[int]) -> None:
        for peer in peers:
            if not (0 <= peer < self.size) or peer == self.rank:
                raise ValueError(f"rank {self.rank}: invalid peer {peer} (size {self.size}, no self-messages)")

    # -- what algorithms call --------------------------------------------------------------
    def exchange(self, sends: Sequence[Message], recvs: Sequence[Message]) -> None:
        """One round: send every ``(peer, payload)`` in ``sends`` and fill every
        ``(peer, buffer)`` in ``recvs`` (exact sizes known to the receiver)."""
        self._check_peers([peer for peer, _ in list(sends) + list(recvs)])
        for _, t in list(sends) + list(recvs):
            _check_payload(t, "payload")
        if not sends and not recvs:
            return
        start = time.perf_counter()
        self._post_and_wait(sends, recvs)
        self.stats.comm_s += time.perf_counter() - start
        self.stats.bytes_sent += sum(t.numel() for _, t in sends)
        self.stats.bytes_recv += sum(t.numel() for _, t in recvs)
        self.stats.rounds += 1

    def sendrecv(self, send: torch.Tensor, dest: int, recv: torch.Tensor, source: int) -> torch.Tensor:
        """One round: send ``send`` to ``dest`` and receive ``recv`` (exact size) from ``source``."""
        self.exchange([(dest, send)], [(source, recv)])
        return recv

    def exchange_var(self, sends: Sequence[Message], sources: Sequence[int]) -> list[torch.Tensor]:
        """Like :meth:`exchange` when the receiver cannot know the sizes; returns the
        received payloads in the order of ``sources``. Costs one extra round (a size
        header) unless the backend can probe."""
        self._check_peers([peer for peer, _ in sends] + list(sources))
        for peer, t in sends:
            _check_payload(t, "payload")
        if not sends and not sources:
            return []
        return self._exchange_var(sends, sources)

    def allreduce_dense(self, tensor: torch.Tensor) -> torch.Tensor:
        """In-place SUM of ``tensor`` over all ranks with the backend's own algorithm.

        Counted as a ring allreduce (2(P-1) rounds, 2(P-1)/P of the bytes), since the
        backend's internals are not observable.
        """
        if self.size == 1 or tensor.numel() == 0:
            return tensor
        start = time.perf_counter()
        sent, rounds = self._allreduce_dense(tensor)
        self.stats.comm_s += time.perf_counter() - start
        self.stats.bytes_sent += sent
        self.stats.bytes_recv += sent
        self.stats.rounds += rounds
        return tensor

    def allgather_small(self, tensor: torch.Tensor) -> torch.Tensor:
        """All-gather of a small tensor with the same shape and dtype on every rank.

        Returns a tensor of shape ``(size, *tensor.shape)`` in rank order. Built on the
        shared Bruck all-gather so its rounds are counted like any other step.
        """
        flat = tensor.detach().contiguous().reshape(-1)
        payload = flat.view(torch.uint8) if flat.numel() else flat.to(torch.uint8)
        blocks = bruck_allgather(self, payload.to(self.device), [payload.numel()] * self.size)
        stacked = torch.stack([b.view(tensor.dtype) if b.numel() else b.to(tensor.dtype) for b in blocks])
        return stacked.reshape(self.size, *tensor.shape)

    def allreduce_small(self, tensor: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """Reduce a small tensor over ranks (``sum``, ``max`` or ``min``), summing in
        rank order so that every rank gets a bit-identical result."""
        if op not in ("sum", "max", "min"):
            raise ValueError(f"allreduce_small: op must be 'sum', 'max' or 'min', got {op!r}")
        gathered = self.allgather_small(tensor)
        if op == "sum":
            out = gathered[0].clone()
            for r in range(1, self.size):
                out += gathered[r]
            return out
        if op == "max":
            return gathered.amax(dim=0)
        return gathered.amin(dim=0)

    def barrier(self) -> None:
        """Synchronise all ranks (a one-byte all-gather)."""
        self.allgather_small(torch.zeros(1, dtype=torch.uint8))
