"""``Comm`` over mpi4py, with buffer-based calls only (nothing is ever pickled).

Every round posts ``Isend``/``Irecv`` on a private duplicate of the user's communicator
(so sparsecomm's messages can never match the application's), then polls
``MPI.Request.Testall`` with a short back-off until all complete or ``timeout`` seconds
pass, when the pending receives are cancelled and :class:`CommTimeoutError` names the
peers still pending. The dense allreduce is an ``Iallreduce`` polled the same way.

Failing together: a second duplicate (the *control* communicator) carries small text
messages only: a rank that fails inside a call sends ``rank r failed: <cause>`` to every
peer; a rank whose round has waited longer than a poll slice (0.05 s) probes it between
slices (the fast path never looks), and after ``REORDER_AFTER_S`` tells the peers it waits
on what it waits in (reducer, call), so that two ranks in different calls raise the same
error. Messages carry the call's tag (:meth:`Comm.call_scope`), so different reducers'
messages never match; MPI errors surface as :class:`CommError`, never raw.

Variable-size rounds use matched probes (``Improbe`` + ``Message.Irecv``): the receiver
learns each size from the message itself, so they cost one round, not two.

CPU tensors are passed to MPI as zero-copy NumPy views. CUDA tensors are passed as
device buffers (``__cuda_array_interface__``) when ``cuda_aware=True`` (a CUDA-aware MPI
build), and otherwise staged through page-locked (pinned) host copies: the one place where
sparsecomm moves payloads through host memory, because a plain MPI library reads and writes
host buffers only.
"""

from __future__ import annotations

import time
from typing import Sequence

import torch

from .base import (BASE_TAG, DEFAULT_TIMEOUT, POLL_SLICE_S, REORDER_AFTER_S, Comm, CommError, CommTimeoutError,
                   Message, reorder_message, ring_allreduce_cost)

__all__ = ["MPIComm"]

#: Tag of every sparsecomm message (on the private duplicate communicator).
SPARSECOMM_TAG = BASE_TAG
#: Tags on the control communicator
_ABORT_TAG, _WAIT_TAG = 1, 2


def _pinned_copy(t: torch.Tensor) -> torch.Tensor:
    """A host copy of a device tensor for MPI without CUDA support (page-locked when CUDA is
    available, so the device-to-host copy runs at full speed)."""
    host = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=torch.cuda.is_available())
    host.copy_(t)
    return host


def _import_mpi():
    try:
        from mpi4py import MPI
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("MPIComm needs mpi4py and an MPI library: pip install 'mpi4py>=3.1' "
                          "(in a sparsecomm checkout, pip install '.[mpi]')") from e
    return MPI


class MPIComm(Comm):
    """A :class:`~sparsecomm.comm.base.Comm` over an mpi4py communicator.

    ``comm`` -- an ``mpi4py.MPI.Comm`` (``None``: ``MPI.COMM_WORLD``). The constructor
    duplicates it (``comm.Dup()``, a collective: every rank of ``comm`` must construct its
    MPIComm at the same point); :meth:`close` frees the duplicate.

    ``timeout`` -- seconds any round may wait before :class:`CommTimeoutError`.

    ``device`` -- where payloads live (``"cpu"`` by default). With a CUDA device, pass
    ``cuda_aware=True`` when the MPI library is CUDA-aware so device buffers go to MPI
    directly; otherwise they are staged through host memory.
    """

    can_probe = True
    #: Polling: re-test without sleeping for this long (low latency for small messages),
    #: then sleep between tests, doubling from 10 us up to ``poll_max_sleep_s``.
    poll_spin_s: float = 1e-4
    poll_max_sleep_s: float = 2e-4

    def __init__(self, comm=None, timeout: float = DEFAULT_TIMEOUT, *, device: torch.device | str = "cpu",
                 cuda_aware: bool = False):
        MPI = _import_mpi()
        self._MPI = MPI
        base = MPI.COMM_WORLD if comm is None else comm
        super().__init__(base.Get_rank(), base.Get_size(), device, timeout)
        self.user_comm = base
        self.mpi_comm = base.Dup()
        self.ctl_comm = base.Dup()  # side channel: aborts and what a slow waiter waits in
        tag_ub = self.mpi_comm.Get_attr(MPI.TAG_UB)
        self._tag_ub = int(tag_ub) if tag_ub else 32767
        self.cuda_aware = bool(cuda_aware)
        # requests given up on at a timeout keep their buffers alive here
        self._abandoned: list = []
        self._ctl_sends: list = []          # (request, buffer) of control messages in flight
        self._remote: str | None = None     # a peer's abort or a detected reorder
        self._peer_wait: dict[int, tuple[str, list[int], str]] = {}  # peer -> (seq, peers, label)
        self._seq = 0

    def close(self) -> None:
        """Free the duplicated communicators (collective). The MPIComm is unusable after."""
        if self.mpi_comm is not None and not self._MPI.Is_finalized():
            self.mpi_comm.Free()
            self.ctl_comm.Free()
        self.mpi_comm = None

    def _split(self, groups: list[list[int]], index: int, local: bool) -> "MPIComm":
        """``MPI_Comm_split`` with this rank's group as its colour and its position in the group
        as its key; the MPIComm duplicates the result, which is freed at once."""
        part = self.user_comm.Split(index, groups[index].index(self.rank))
        try:
            return MPIComm(part, self.timeout, device=self.device, cuda_aware=self.cuda_aware)
        finally:
            part.Free()

    @property
    def _tag(self) -> int:
        tag = self.tag
        return tag if tag <= self._tag_ub else 1 + tag % self._tag_ub

    # -- side channel ------------------------------------------------------------------------
    def _ctl_send(self, peers, tag: int, text: str) -> None:
        MPI = self._MPI
        self._ctl_sends = [(r, b) for r, b in self._ctl_sends if not r.Test()]
        data = bytearray(text.encode())
        for q in peers:
            self._ctl_sends.append((self.ctl_comm.Isend([data, MPI.BYTE], dest=q, tag=tag), data))

    def _publish_abort(self, message: str) -> None:
        self._ctl_send([q for q in range(self.size) if q != self.rank], _ABORT_TAG, message)
        deadline = time.monotonic() + 0.5  # let the small messages leave before we raise
        while time.monotonic() < deadline and not all(r.Test() for r, _ in self._ctl_sends):
            time.sleep(1e-4)

    def _read_ctl(self) -> None:
        """Receive every control message that arrived (slow path only)."""
        MPI = self._MPI
        status = MPI.Status()
        while self.ctl_comm.Iprobe(source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=status):
            src, tag = status.Get_source(), status.Get_tag()
            data = bytearray(status.Get_count(MPI.BYTE))
            self.ctl_comm.Recv([data, MPI.BYTE], source=src, tag=tag)
            text = data.decode(errors="replace")
            if tag == _ABORT_TAG:
                self._remote = self._remote or text
            elif tag == _WAIT_TAG:
                seq, peers, label = (text.split("|", 2) + ["", ""])[:3]
                self._peer_wait[src] = (seq, [int(q) for q in peers.split(",") if q], label)

    def _look(self, state: dict, start: float, peers: set) -> None:
        """One look at the control channel while a round is slow; sets ``_remote``."""
        self._read_ctl()
        if self._remote is not None or time.monotonic() - start < REORDER_AFTER_S or not peers:
            return
        label = state["label"]
        if not state["published"]:
            self._ctl_send(sorted(peers), _WAIT_TAG, f"{state['seq']}|{','.join(map(str, sorted(peers)))}|{label}")
            state["published"] = True
        conflict = None
        for q in sorted(peers):
            seq, their_peers, their_label = self._peer_wait.get(q, ("", [], ""))
            if their_label and self.rank in their_peers and their_label != label:
                conflict = (q, seq, their_label)
                break
        if conflict is None or state.get("suspect") != conflict:
            state["suspect"] = conflict  # confirm on a later look (a "done" may be in flight)
            return
        self._remote = reorder_message((self.rank, label), (conflict[0], conflict[2]))
        self._publish_abort(self._remote)

    # -- buffers ---------------------------------------------------------------------------
    def _check_device(self, t: torch.Tensor, what: str) -> None:
        if t.device != self.device:
            raise ValueError(f"rank {self.rank}: {what} is on {t.device}, this MPIComm moves "
                             f"tensors on {self.device}")

    def _sync_device(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()

    def _send_buf(self, t: torch.Tensor):
        """(MPI buffer spec, keep-alive) for sending ``t``."""
        if t.device.type == "cpu":
            return [t.numpy(), self._MPI.BYTE]
        if self.cuda_aware:
            return [t, self._MPI.BYTE]
        return [_pinned_copy(t).numpy(), self._MPI.BYTE]

    def _recv_buf(self, t: torch.Tensor):
        """(MPI buffer spec, host staging tensor or None) to receive into ``t``."""
        if t.device.type == "cpu":
            return [t.numpy(), self._MPI.BYTE], None
        if self.cuda_aware:
            return [t, self._MPI.BYTE], None
        host = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=torch.cuda.is_available())
        return [host.numpy(), self._MPI.BYTE], host

    # -- waiting ---------------------------------------------------------------------------
    def _wait(self, reqs: list, peers: list, deadline: float, what: str, poll=None) -> None:
        """Poll ``reqs`` until all complete or ``deadline``.

        ``peers[i]`` is ``(peer ranks, cancellable)`` for ``reqs[i]``. ``poll()``
        (optional) runs each turn, may append to ``reqs``/``peers`` and returns True while
        it still expects more; ``poll(final=True)`` returns the peers it still waits for.
        At the deadline the pending receives are cancelled (sends and collectives cannot
        be) and every pending request is kept referenced so MPI never writes or reads
        freed memory.
        """
        MPI = self._MPI
        start = time.monotonic()
        spin_until = start + self.poll_spin_s
        sleep = 1e-5
        self._seq += 1
        others = {q for ranks, _ in peers for q in ranks if q != self.rank}
        state = {"seq": self._seq, "label": self.waiting_in(), "published": False}
        next_look = start + POLL_SLICE_S
        try:
            while True:
                try:
                    more = poll() if poll is not None else False
                    if MPI.Request.Testall(reqs) and not more:
                        return
                except MPI.Exception as e:  # e.g. a truncated message: never a raw MPI error
                    self._give_up(reqs, peers)
                    raise CommError(f"{self.who()}: {what} failed: {e}") from e
                now = time.monotonic()
                if now >= next_look:
                    next_look = now + POLL_SLICE_S
                    self._look(state, start, others)
                    if self._remote is not None:
                        self._give_up(reqs, peers)
                        raise self._aborted_by_peer(self._remote)
                if now >= deadline:
                    break
                if now >= spin_until:  # back off so oversubscribed ranks leave the CPU to peers
                    time.sleep(min(sleep, max(deadline - now, 0.0)))
                    sleep = min(self.poll_max_sleep_s, sleep * 2)
            pending = self._give_up(reqs, peers)
            if poll is not None:
                pending.update(poll(final=True))
            raise CommTimeoutError(f"{self.who()}: {what} timed out after {self.timeout:g} s; "
                                   f"still waiting on peer(s) {sorted(map(self.root_rank, pending))}")
        finally:
            if state["published"]:
                self._ctl_send(sorted(others), _WAIT_TAG, f"{state['seq']}||")  # done waiting

    def _give_up(self, reqs: list, peers: list) -> set[int]:
        """Cancel the pending receives, keep every pending request referenced (MPI may still
        touch its buffer) and return the peers still pending."""
        MPI = self._MPI
        pending: set[int] = set()
        for req, (ranks, cancellable) in zip(reqs, peers):
            try:
                done = req == MPI.REQUEST_NULL or req.Test()
            except MPI.Exception:
                done = False
            if not done:
                pending.update(ranks)
                if cancellable:
                    try:
                        req.Cancel()
                    except MPI.Exception:
                        pass
                self._abandoned.append(req)
        return pending

    # -- Comm primitives -------------------------------------------------------------------
    def _post_and_wait(self, sends: Sequence[Message], recvs: Sequence[Message]) -> None:
        comm, MPI, tag = self.mpi_comm, self._MPI, self._tag
        for _, t in list(sends) + list(recvs):
            self._check_device(t, "payload")
        self._sync_device()
        reqs, peers, staged = [], [], []
        for peer, t in recvs:
            buf, host = self._recv_buf(t)
            reqs.append(comm.Irecv(buf, source=peer, tag=tag))
            peers.append(([peer], True))
            if host is not None:
                staged.append((t, host))
        for peer, t in sends:
            reqs.append(comm.Isend(self._send_buf(t), dest=peer, tag=tag))
            peers.append(([peer], False))
        self._wait(reqs, peers, time.monotonic() + self.timeout, "exchange")
        for t, host in staged:
            t.copy_(host)

    def _exchange_var(self, sends: Sequence[Message], sources: Sequence[int],
                      max_nbytes: int | None = None) -> list[torch.Tensor]:
        """One round: post the sends, then match each expected message with ``Improbe`` as it
        arrives, allocate a buffer of its size and receive it."""
        comm, MPI, tag = self.mpi_comm, self._MPI, self._tag  # peers were checked by Comm.exchange_var
        for _, t in sends:
            self._check_device(t, "payload")
        start = time.perf_counter()
        self._sync_device()
        reqs, peers = [], []
        for peer, t in sends:
            reqs.append(comm.Isend(self._send_buf(t), dest=peer, tag=tag))
            peers.append(([peer], False))
        results: list = [None] * len(sources)
        staged: list = []
        # per source, the indices still to match, in posting order (MPI's non-overtaking
        # rule matches a source's messages in the order they were sent)
        queue: dict[int, list[int]] = {}
        for i, peer in enumerate(sources):
            queue.setdefault(peer, []).append(i)
        status = MPI.Status()

        def poll(final: bool = False):
            if final:
                return [p for p, idx in queue.items() if idx]
            for peer, idx in queue.items():
                while idx:
                    msg = comm.Improbe(source=peer, tag=tag, status=status)
                    if msg is None:
                        break
                    n = self.check_message_size(status.Get_count(MPI.BYTE), peer, max_nbytes)  # before allocating
                    out = torch.empty(n, dtype=torch.uint8, device=self.device)
                    buf, host = self._recv_buf(out)
                    reqs.append(msg.Irecv(buf))
                    peers.append(([peer], True))
                    if host is not None:
                        staged.append((out, host))
                    results[idx.pop(0)] = out
            return any(queue.values())

        self._wait(reqs, peers, time.monotonic() + self.timeout, "exchange_var", poll=poll)
        for t, host in staged:
            t.copy_(host)
        self.stats.comm_s += time.perf_counter() - start
        self.stats.bytes_sent += sum(t.numel() for _, t in sends)
        self.stats.bytes_recv += sum(t.numel() for t in results)
        self.stats.rounds += 1
        return results

    _MPI_TYPES = {torch.float32: "FLOAT", torch.float64: "DOUBLE", torch.int32: "INT32_T",
                  torch.int64: "INT64_T", torch.int16: "INT16_T", torch.int8: "INT8_T",
                  torch.uint8: "UINT8_T", torch.complex64: "C_FLOAT_COMPLEX",
                  torch.complex128: "C_DOUBLE_COMPLEX"}

    def _allreduce_dense(self, tensor: torch.Tensor) -> tuple[int, int]:
        MPI = self._MPI
        self._check_device(tensor, "allreduce_dense tensor")
        self._guard_dense(tensor)
        counted = ring_allreduce_cost(tensor.numel() * tensor.element_size(), self.size)
        if tensor.dtype in (torch.float16, torch.bfloat16):
            work = tensor.float()  # MPI has no half-precision SUM: reduce in float32
        elif tensor.dtype in self._MPI_TYPES:
            work = tensor if tensor.is_contiguous() else tensor.contiguous()
        else:
            raise TypeError(f"MPIComm.allreduce_dense: unsupported dtype {tensor.dtype}")
        mpi_type = getattr(MPI, self._MPI_TYPES[work.dtype])
        staged = None
        if work.device.type == "cpu":
            buf = [work.numpy(), mpi_type]
        elif self.cuda_aware:
            buf = [work, mpi_type]
        else:
            staged = _pinned_copy(work)
            buf = [staged.numpy(), mpi_type]
        self._sync_device()
        req = self.mpi_comm.Iallreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
        others = [q for q in range(self.size) if q != self.rank]
        self._wait([req], [(others, False)], time.monotonic() + self.timeout, "allreduce_dense")
        if staged is not None:
            work.copy_(staged)
        if work is not tensor:
            tensor.copy_(work)
        return counted
