"""P ranks in one process, with an alpha-beta model of time.

:func:`simulate` runs ``fn(comm)`` for P ranks on P threads of this process and returns
every rank's result together with the modelled communication time. Messages are copied
through in-memory mailboxes, so algorithms run exactly as they would on a network; only
time is modelled instead of measured:

* Each rank has a clock. In a round a rank sends its messages one after the other over
  a full-duplex link: message j leaves at ``t_start`` and arrives at
  ``t_start + alpha + beta * (bytes of messages 0..j)``.
* The rank's round ends at the later of its own sending time
  (``t_start + alpha + beta * bytes sent``) and the arrival of every message it receives.

Compute time is not modelled (it is measured elsewhere); the result is the
communication time of the message schedule, which is what the papers' alpha-beta tables describe.
Threads release the GIL inside torch ops; sweeps up to P = 64 take seconds.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from .base import (POLL_SLICE_S, REORDER_AFTER_S, Comm, CommAbortedError, CommError, CommStats, CommTimeoutError,
                   Message, parse_abort, reorder_message)

__all__ = ["SimComm", "SimulationResult", "simulate", "GBIT_BETA"]

#: seconds per byte of a 1 Gbit/s link
GBIT_BETA = 8.0 / 1e9
#: latency and seconds per byte of the links inside a simulated node (NVLink / shared memory class)
INTRA_ALPHA = 5e-6
INTRA_BETA = 1.0 / 50e9


@dataclass
class SimulationResult:
    """What :func:`simulate` returns."""

    results: list[Any]          # fn's return value on each rank, rank order
    time: float                 # modelled time: the latest rank clock
    rank_times: list[float]     # each rank's clock at the end
    stats: list[CommStats]      # each rank's counters


class _Aborted(CommAbortedError):
    pass


class _World:
    def __init__(self, size: int, alpha: float, beta: float, timeout: float,
                 intra_alpha: float = 0.0, intra_beta: float = 0.0):
        self.size = size
        self.alpha = alpha
        self.beta = beta
        self.intra_alpha = intra_alpha
        self.intra_beta = intra_beta
        self.timeout = timeout
        self.cond = threading.Condition()
        # mailbox[(src, dst, tag)] holds (payload, arrival time) in posting order
        self.mailbox: dict[tuple[int, int, int], deque] = {}
        self.failed: str | None = None
        # rank -> (peer it waits for, what it waits in), while blocked in a receive
        self.waiting: dict[int, tuple[int, str]] = {}

    def fail(self, message: str) -> None:
        with self.cond:
            if self.failed is None:
                self.failed = message
            self.cond.notify_all()


class SimComm(Comm):
    """One rank of a simulated world; created by :func:`simulate`, or by :meth:`split` of one
    (a group of the world's ranks on the same mailboxes under a key of its own, sharing the
    rank's clock and the world's failure state: an abort on any group stops every rank)."""

    in_one_process = True

    def __init__(self, world: _World, rank: int, device: torch.device | str = "cpu", *,
                 members: Sequence[int] | None = None, key: tuple = (), link: tuple[float, float] | None = None,
                 clock_of: "SimComm | None" = None):
        members = list(range(world.size)) if members is None else list(members)
        super().__init__(rank, len(members), device, world.timeout)
        self._world = world
        self._members = members          # world rank of each rank of this Comm
        self._key = key                  # () for the world; the split path for a group
        self._alpha, self._beta = (world.alpha, world.beta) if link is None else link
        self._clock_of = clock_of        # the world-level SimComm whose clock this rank shares
        self._splits = 0
        self._clock = 0.0
        # a mailbox message may fill the start of a longer buffer, as gloo's receive does;
        # on a GPU the buffers of the bound would be real memory
        self.receives_short = self.device.type == "cpu"

    @property
    def clock(self) -> float:
        """This rank's modelled time (shared by every group the rank is in)."""
        return self._clock if self._clock_of is None else self._clock_of._clock

    @clock.setter
    def clock(self, value: float) -> None:
        if self._clock_of is None:
            self._clock = value
        else:
            self._clock_of._clock = value

    def _split(self, groups: list[list[int]], index: int, local: bool) -> "SimComm":
        """The group's SimComm; ``local=True`` groups use the world's intra-node link
        (``simulate(intra_alpha=, intra_beta=)``), others this Comm's link."""
        self._splits += 1
        group = groups[index]
        world = self._world
        link = (world.intra_alpha, world.intra_beta) if local else (self._alpha, self._beta)
        return SimComm(world, group.index(self.rank), self.device, members=[self._members[r] for r in group],
                       key=self._key + ((self._splits, index),), link=link,
                       clock_of=self._clock_of or self)

    def _publish_abort(self, message: str) -> None:
        self._world.fail(message)

    def _post_and_wait(self, sends: Sequence[Message], recvs: Sequence[Message], short_ok: bool = False) -> None:
        world = self._world
        start = self.clock
        sent = 0
        me = self._members[self.rank]
        with world.cond:
            for peer, payload in sends:
                sent += payload.numel()
                arrival = start + self._alpha + self._beta * sent
                world.mailbox.setdefault((self._key, me, self._members[peer], self.tag),
                                         deque()).append((payload.clone(), arrival))
            world.cond.notify_all()
        finish = start + self._alpha + self._beta * sent if sends else start
        for peer, buffer in recvs:
            payload, arrival = self._take(peer)
            if payload.numel() > buffer.numel() or (payload.numel() < buffer.numel() and not short_ok):
                message = (f"simulated rank {self.rank} expected {buffer.numel()} bytes from rank {peer} "
                           f"but rank {peer} sent {payload.numel()}")
                raise CommError(message)  # the call scope (if any) fails the world
            buffer[:payload.numel()].copy_(payload)
            finish = max(finish, arrival)
        self.clock = finish

    def _post_and_wait_bounded(self, sends: Sequence[Message], recvs: Sequence[Message]) -> None:
        self._post_and_wait(sends, recvs, short_ok=True)

    def _take(self, peer: int) -> tuple[torch.Tensor, float]:
        world = self._world
        me, them = self._members[self.rank], self._members[peer]
        key = (self._key, them, me, self.tag)
        start = time.monotonic()
        label = self.waiting_in()
        with world.cond:
            try:
                while True:
                    ready = world.cond.wait_for(lambda: world.failed is not None or bool(world.mailbox.get(key)),
                                                timeout=POLL_SLICE_S)
                    if world.failed is not None and not world.mailbox.get(key):
                        failed, cause = parse_abort(world.failed)
                        self._broken = self._broken or world.failed
                        raise _Aborted(f"simulated rank {self.rank}: aborted because {world.failed}", failed, cause)
                    if ready:
                        return world.mailbox[key].popleft()
                    waited = time.monotonic() - start
                    if waited >= world.timeout:
                        raise CommTimeoutError(f"simulated rank {self.rank}: no message from rank {peer} "
                                               f"within {world.timeout} s")
                    world.waiting[me] = (them, label)
                    theirs = world.waiting.get(them)
                    if waited >= REORDER_AFTER_S and theirs is not None and theirs[0] == me \
                            and theirs[1] != label:
                        message = reorder_message((me, label), (them, theirs[1]))
                        world.failed = world.failed or message
                        world.cond.notify_all()
                        self._broken = self._broken or message
                        raise CommAbortedError(f"simulated rank {self.rank}: {message}")
            finally:
                world.waiting.pop(me, None)

    def _allreduce_dense(self, tensor: torch.Tensor) -> tuple[int, int]:  # pragma: no cover - see below
        raise NotImplementedError  # allreduce_dense is overridden with a real ring

    def allreduce_dense(self, tensor: torch.Tensor) -> torch.Tensor:
        """Ring reduce-scatter + ring all-gather on simulated messages (so counters and
        time come from the real message schedule). Half types are summed in float32."""
        size, rank = self.size, self.rank
        if size == 1 or tensor.numel() == 0:
            return tensor
        work = tensor.reshape(-1).float() if tensor.dtype in (torch.float16, torch.bfloat16) else tensor.reshape(-1)
        chunks = list(work.tensor_split(size))
        nbytes = [c.numel() * c.element_size() for c in chunks]
        right, left = (rank + 1) % size, (rank - 1) % size
        for step in range(size - 1):  # reduce-scatter: after it rank r owns chunk (r + 1) % P
            send_idx, recv_idx = (rank - step) % size, (rank - step - 1) % size
            incoming = torch.empty(nbytes[recv_idx], dtype=torch.uint8, device=work.device)
            self.exchange([(right, chunks[send_idx].contiguous().view(torch.uint8))], [(left, incoming)])
            chunks[recv_idx] += incoming.view(work.dtype)
        for step in range(size - 1):  # all-gather of the reduced chunks
            send_idx, recv_idx = (rank - step + 1) % size, (rank - step) % size
            incoming = torch.empty(nbytes[recv_idx], dtype=torch.uint8, device=work.device)
            self.exchange([(right, chunks[send_idx].contiguous().view(torch.uint8))], [(left, incoming)])
            chunks[recv_idx].copy_(incoming.view(work.dtype))
        if work.data_ptr() != tensor.data_ptr():
            tensor.copy_(work.view_as(tensor))
        return tensor


def simulate(size: int, fn: Callable[[SimComm], Any], alpha: float = 50e-6, beta: float = GBIT_BETA,
             timeout: float = 60.0, device: torch.device | str = "cpu", *,
             intra_alpha: float = INTRA_ALPHA, intra_beta: float = INTRA_BETA) -> SimulationResult:
    """Run ``fn(comm)`` on ``size`` simulated ranks and return their results and the
    alpha-beta modelled time (default: 50 us latency, 1 Gbit/s links).

    ``intra_alpha`` / ``intra_beta``: the link of groups split with ``local=True`` (the ranks
    of one node; default 5 us and 50 GB/s). Each rank's link is its own: L ranks of a node
    sharing one NIC is not modelled here (the cost model's two-level schedule does that).

    ``device``: where the ranks' messages live (``comm.device``; e.g. ``"cuda"``: P ranks
    sharing one GPU, every payload and receive buffer on it, copied device to device).

    If any rank raises, the others are released and the first exception is re-raised
    with that rank's traceback in its message.
    """
    if size < 1:
        raise ValueError(f"simulate: size must be >= 1, got {size}")
    if alpha < 0 or beta < 0:
        raise ValueError(f"simulate: alpha and beta must be >= 0, got {alpha}, {beta}")
    if intra_alpha < 0 or intra_beta < 0:
        raise ValueError(f"simulate: intra_alpha and intra_beta must be >= 0, got {intra_alpha}, {intra_beta}")
    world = _World(size, alpha, beta, timeout, intra_alpha, intra_beta)
    comms = [SimComm(world, r, device) for r in range(size)]
    results: list[Any] = [None] * size
    errors: list[tuple[int, BaseException, str] | None] = [None] * size

    def run(rank: int) -> None:
        try:
            results[rank] = fn(comms[rank])
        except BaseException as exc:  # noqa: BLE001 - reported to the caller below
            errors[rank] = (rank, exc, traceback.format_exc())
            world.fail(f"rank {rank} raised {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=run, args=(r,), name=f"sim-rank-{r}", daemon=True) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # report the root cause, not the ranks that were merely aborted because of it
    real = [e for e in errors if e is not None and not isinstance(e[1], _Aborted)]
    first = real[0] if real else next((e for e in errors if e is not None), None)
    if first is not None:
        rank, exc, text = first
        if isinstance(exc, (ValueError, TypeError, CommError)):
            raise type(exc)(f"{exc}\n--- simulated rank {rank} traceback ---\n{text}") from exc
        raise RuntimeError(f"simulated rank {rank} failed:\n{text}") from exc
    return SimulationResult(results=results, time=max(c.clock for c in comms),
                            rank_times=[c.clock for c in comms], stats=[c.stats for c in comms])
