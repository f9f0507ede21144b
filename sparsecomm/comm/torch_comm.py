"""``Comm`` over a torch.distributed process group (gloo, NCCL, or any backend with p2p).

Point-to-point payloads are ``torch.uint8`` tensors on :attr:`TorchComm.device` (CUDA for
NCCL, CPU otherwise). A round posts every send and receive with
:func:`torch.distributed.batch_isend_irecv` and waits for each request with a bounded
``Work.wait(timeout=...)``; whatever is still pending at the deadline is reported in a
:class:`~sparsecomm.comm.base.CommTimeoutError` naming this rank and the peers. Nothing
is ever pickled: only tensor payloads are sent, no ``*_object`` collective is used.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Sequence

import torch
import torch.distributed as dist

from .base import Comm, CommError, CommTimeoutError, Message, ring_allreduce_cost

__all__ = ["TorchComm"]

#: Tag of sparsecomm's point-to-point messages (backends that match on tags, like gloo,
#: then never confuse them with a user's untagged messages; NCCL ignores tags).
SPARSECOMM_TAG = 0x5C0C

_DEFAULT_TIMEOUT = 300.0
# c10d treats a zero timeout as "no timeout" (wait for the group's own timeout), so a
# wait never asks for less than this.
_MIN_WAIT = timedelta(milliseconds=1)


def _group_device(group) -> torch.device:
    backend = str(dist.get_backend(group)).lower()
    if "nccl" in backend and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _group_timeout(group, device: torch.device) -> float | None:
    """The process group's own timeout in seconds, when torch lets us see it."""
    try:
        td = group._get_backend(device).options._timeout
        seconds = td.total_seconds()
        return seconds if seconds > 0 else None
    except Exception:
        return None


class TorchComm(Comm):
    """A :class:`~sparsecomm.comm.base.Comm` over a torch.distributed process group.

    ``group`` -- a process group this process belongs to (``None``: the default group).
    ``rank``/``size`` are this process's rank in ``group`` and the group's size; peers
    passed to :meth:`exchange` are group ranks.

    ``timeout`` -- seconds any round may wait for its peers before raising
    :class:`~sparsecomm.comm.base.CommTimeoutError`; defaults to the process group's own
    timeout when torch exposes it, else 300 s.

    With NCCL the payloads live on the current CUDA device, and the constructor runs one
    tiny all-reduce over the group (every rank of the group must construct its TorchComm)
    so that NCCL's communicator exists before the first partial point-to-point round.

    On gloo (measured with torch 2.13): a round that times out raises after ``timeout``
    seconds, not the group's timeout; gloo then closes the connection to the pending
    peer, so later rounds with that peer fail at once with
    :class:`~sparsecomm.comm.base.CommError` -- treat a timeout as fatal for the group.
    A gloo send completes only once the peer has posted the matching receive, and a
    peer that sends more bytes than the receiver expects makes gloo abort the receiving
    process (it cannot be caught): both sides of every message must agree on its size.
    """

    def __init__(self, group=None, timeout: float | None = None):
        if not (dist.is_available() and dist.is_initialized()):
            raise ValueError("TorchComm: torch.distributed is not initialized; "
                             "call torch.distributed.init_process_group first, or pass comm=...")
        if group is None:
            group = dist.group.WORLD
        rank = dist.get_rank(group)
        if rank < 0:
            raise ValueError("TorchComm: this process is not a member of the given process group")
        size = dist.get_world_size(group)
        device = _group_device(group)
        if timeout is None:
            timeout = _group_timeout(group, device) or _DEFAULT_TIMEOUT
        super().__init__(rank, size, device, timeout)
        self.group = group
        self.backend = str(dist.get_backend(group))
        if device.type == "cuda" and size > 1:
            probe = torch.zeros(1, device=device)
            self._wait([dist.all_reduce(probe, group=group, async_op=True)], [list(range(size))],
                       "initial all_reduce")

    # -- helpers ---------------------------------------------------------------------------
    def _wait(self, works, peers_of_work: Sequence[Sequence[int]], what: str) -> None:
        """Wait for every work until one shared deadline; map failures to Comm errors.

        After the deadline the remaining works get one last 1 ms look, so the error
        names every peer still pending, not just the first.
        """
        deadline = time.monotonic() + self.timeout
        first: BaseException | None = None
        pending: set[int] = set()
        failed: set[int] = set()
        for work, peers in zip(works, peers_of_work):
            if work is None:
                continue
            remaining = deadline - time.monotonic()
            try:
                work.wait(timeout=max(timedelta(seconds=max(remaining, 0.0)), _MIN_WAIT))
            except RuntimeError as e:  # gloo and NCCL report timeouts and failures this way
                # "Timed out waiting ..." (gloo p2p), "Operation timed out!" (gloo
                # collectives); anything else (e.g. a pair gloo closed after an earlier
                # timeout, a peer that died) is a CommError
                if "timed out" in str(e).lower() or time.monotonic() >= deadline - 1e-3:
                    pending.update(peers)
                else:
                    failed.update(peers)
                first = first or e
        if first is None:
            return
        if failed:
            raise CommError(f"rank {self.rank} of {self.size}: {what} failed with peer(s) "
                            f"{sorted(failed)}: {first}") from first
        raise CommTimeoutError(
            f"rank {self.rank} of {self.size}: {what} timed out after {self.timeout:g} s; "
            f"still waiting on peer(s) {sorted(pending)}") from first

    def _on_device(self, t: torch.Tensor, what: str) -> None:
        if t.device != self.device:
            raise ValueError(f"rank {self.rank}: {what} is on {t.device}, this TorchComm "
                             f"({self.backend}) moves tensors on {self.device}")

    # -- Comm primitives -------------------------------------------------------------------
    def _post_and_wait(self, sends: Sequence[Message], recvs: Sequence[Message]) -> None:
        ops, peers = [], []
        # Empty messages are skipped on both sides (both know the size is 0), which keeps
        # the per-pair order of the remaining ones.
        for peer, t in sends:
            self._on_device(t, "send payload")
            if t.numel():
                ops.append(dist.P2POp(dist.isend, t, group=self.group, tag=SPARSECOMM_TAG, group_peer=peer))
                peers.append(peer)
        for peer, t in recvs:
            self._on_device(t, "receive buffer")
            if t.numel():
                ops.append(dist.P2POp(dist.irecv, t, group=self.group, tag=SPARSECOMM_TAG, group_peer=peer))
                peers.append(peer)
        if not ops:
            return
        works = dist.batch_isend_irecv(ops)
        if len(works) == len(ops):
            peers_of_work = [[p] for p in peers]
        else:  # coalesced (NCCL): one work for the whole batch
            peers_of_work = [sorted(set(peers))] * len(works)
        self._wait(works, peers_of_work, "exchange")

    def _allreduce_dense(self, tensor: torch.Tensor) -> tuple[int, int]:
        self._on_device(tensor, "allreduce_dense tensor")
        buf = tensor if tensor.is_contiguous() else tensor.contiguous()
        work = dist.all_reduce(buf, op=dist.ReduceOp.SUM, group=self.group, async_op=True)
        self._wait([work], [[r for r in range(self.size) if r != self.rank]], "allreduce_dense")
        if buf is not tensor:
            tensor.copy_(buf)
        return ring_allreduce_cost(tensor.numel() * tensor.element_size(), self.size)

