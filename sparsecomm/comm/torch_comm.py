"""``Comm`` over a torch.distributed process group (gloo, NCCL, or any backend with p2p).

Point-to-point payloads are ``torch.uint8`` tensors on :attr:`TorchComm.device` (CUDA for
NCCL, CPU otherwise). A round posts every send and receive with
:func:`torch.distributed.batch_isend_irecv` and waits for each request with a bounded
``Work.wait(timeout=...)``; whatever is still pending at the deadline is reported in a
:class:`~sparsecomm.comm.base.CommTimeoutError` naming this rank and the peers. Nothing
is ever pickled: only tensor payloads are sent, no ``*_object`` collective is used.

Isolation: a TorchComm runs on a process group of its own, created at construction with
:func:`torch.distributed.new_group` over the same ranks and backend, so its operations never
interleave with DDP's or the user's on their group. Its messages carry the tag of the
current call (:meth:`Comm.call_scope`), so two reducers' messages never match each other.

Side channel: the default store (a :class:`~torch.distributed.PrefixStore` of it keyed by
the private group's name). A rank that fails inside a call writes ``abort`` there, then
closes its connections; a rank whose round has waited longer than a poll slice (0.05 s)
looks at ``abort`` between slices (a watcher thread; the fast path touches no store), and
after ``REORDER_AFTER_S`` publishes what it waits in and compares with its peers'.
"""

from __future__ import annotations

import threading
import time
import weakref
from datetime import timedelta
from typing import Sequence

import torch
import torch.distributed as dist

from .base import (BASE_TAG, DEFAULT_TIMEOUT, POLL_SLICE_S, REORDER_AFTER_S, Comm, CommError,
                   CommTimeoutError, Message, reorder_message, ring_allreduce_cost)

__all__ = ["TorchComm"]

#: Tag of sparsecomm's point-to-point messages outside a call scope (backends that match
#: on tags, like gloo, then never confuse them with a user's untagged messages; NCCL
#: ignores tags). Inside a call the tag is the call's own (``base.scope_tag``).
SPARSECOMM_TAG = BASE_TAG
#: Tag of a receive that is never sent: waiting on it for 1 ms makes gloo close every
#: connection of the private group, which releases this rank's blocked waits (gloo has
#: no other way to interrupt a wait) and tells the peers at once.
_INTERRUPT_TAG = 0x7FFFFFF0

#: Comms built so far over each process group name (key prefixes when isolate=False)
_COMMS_PER_GROUP: dict[str, int] = {}
# c10d treats a zero timeout as "no timeout" (wait for the group's own timeout), so a
# wait never asks for less than this.
_MIN_WAIT = timedelta(milliseconds=1)
#: seconds a rank that saw a peer's connection close waits for that peer's published abort
_ABORT_GRACE_S = 0.5


def _group_device(group) -> torch.device:
    backend = str(dist.get_backend(group)).lower()
    if "nccl" in backend and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


class _Active:
    """One round being waited on (read by the watcher thread)."""

    __slots__ = ("seq", "start", "label", "peers", "published", "suspect")

    def __init__(self, seq: int, label: str, peers: frozenset):
        self.seq = seq
        self.start = time.monotonic()
        self.label = label
        self.peers = peers
        self.published = False
        self.suspect: tuple | None = None   # (peer, peer's state, first seen)


def _watch(ref: "weakref.ref[TorchComm]", stop: threading.Event) -> None:
    """Watcher thread of one TorchComm: looks at the side channel while a round is slow."""
    while not stop.wait(POLL_SLICE_S):
        comm = ref()
        if comm is None:
            return
        try:
            comm._watch_once()
        except Exception:  # noqa: BLE001 - the store may be gone (its host died): keep waiting
            pass
        del comm


class TorchComm(Comm):
    """A :class:`~sparsecomm.comm.base.Comm` over a torch.distributed process group.

    ``group`` -- a process group this process belongs to (``None``: the default group).
    ``rank``/``size`` are this process's rank in ``group`` and the group's size; peers
    passed to :meth:`exchange` are group ranks.

    ``timeout`` -- seconds any round may wait for its peers before raising
    :class:`~sparsecomm.comm.base.CommTimeoutError`; default
    :data:`~sparsecomm.comm.base.DEFAULT_TIMEOUT` (300 s), not the process group's own
    (often 30 minutes): a peer that died or stopped surfaces within minutes.

    ``isolate`` (default True) -- run on a private process group over the same ranks and
    backend, created here with :func:`torch.distributed.new_group`: DDP's and the user's
    collectives on ``group`` can then never interleave with sparsecomm's (an interleaving
    made gloo abort the process). Creating a group is collective: every rank of ``group``
    must construct its TorchComms in the same order (as SPMD code does). ``isolate=False``
    shares ``group`` itself; its stream of operations is then the caller's to order.

    Failing together: when a call raises on one rank (see :meth:`Comm.call_scope`) that rank
    writes the cause in the store and closes its private group; every peer raises
    :class:`~sparsecomm.comm.base.CommAbortedError` naming it within about 0.05 s. The Comm
    is then broken (later calls raise at once); build a new TorchComm on every rank to go on.

    With NCCL the payloads live on the current CUDA device, and the constructor runs one
    tiny all-reduce over the group (every rank of the group must construct its TorchComm)
    so that NCCL's communicator exists before the first partial point-to-point round.

    On gloo (measured with torch 2.13): a round that times out raises after ``timeout``
    seconds, not the group's timeout; gloo then closes the connection to the pending
    peer, so later rounds with that peer fail at once with
    :class:`~sparsecomm.comm.base.CommError` -- treat a timeout as fatal for the group.
    A gloo send completes only once the peer has posted the matching receive, and a
    peer that sends more bytes than the receiver expects makes gloo abort the receiving
    process (it cannot be caught): both sides of every message must agree on its size
    (per-call tags make messages of different calls never match).
    """

    def __init__(self, group=None, timeout: float | None = None, *, isolate: bool = True):
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
        super().__init__(rank, size, device, DEFAULT_TIMEOUT if timeout is None else timeout)
        self.user_group = group
        self.backend = str(dist.get_backend(group))
        if isolate and size > 1:
            ranks = None if group is dist.group.WORLD else dist.get_process_group_ranks(group)
            group = dist.new_group(ranks=ranks, backend=self.backend,
                                   use_local_synchronization=ranks is not None,
                                   group_desc="sparsecomm")
        self.group = group
        self._gloo = "gloo" in self.backend.lower()
        name = getattr(group, "group_name", None) or str(id(group))
        count = _COMMS_PER_GROUP[name] = _COMMS_PER_GROUP.get(name, 0) + 1
        self._store = None
        if size > 1:
            try:
                base = dist.distributed_c10d._get_default_store()
                self._store = dist.PrefixStore(f"sparsecomm/{name}/{count}/", base)
            except Exception:  # noqa: BLE001 - no store: local failures still raise locally
                self._store = None
        self._lock = threading.Lock()
        self._active: _Active | None = None
        self._seq = 0
        self._remote: str | None = None     # a peer's abort or a detected reorder
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None
        self._keep: list = []               # buffers of works given up on
        if device.type == "cuda" and size > 1:
            probe = torch.zeros(1, device=device)
            self._wait([dist.all_reduce(probe, group=group, async_op=True)], [list(range(size))],
                       "initial all_reduce")

    def close(self) -> None:
        """Stop the watcher thread (the private group stays until the process group ends)."""
        self._stop.set()

    def __del__(self) -> None:
        try:
            self._stop.set()
        except Exception:  # noqa: BLE001
            pass

    # -- side channel ------------------------------------------------------------------------
    def _start_watcher(self) -> None:
        if self._watcher is None and self._store is not None:
            self._watcher = threading.Thread(target=_watch, args=(weakref.ref(self), self._stop),
                                             name=f"sparsecomm-watch-r{self.rank}", daemon=True)
            self._watcher.start()

    def _read_abort(self) -> str | None:
        if self._store is None or not self._store.check(["abort"]):
            return None
        return self._store.get("abort").decode(errors="replace")

    def _await_abort(self, grace_s: float) -> str | None:
        """On the error path only (a connection a peer closed): the peer's abort, if it
        publishes one within ``grace_s``. gloo closes a pair when a wait on it times
        out, before that rank has published its CommTimeoutError; without the grace a peer
        could see only the closed connection and raise a CommError without the cause. A
        killed peer publishes nothing: its survivors raise CommError after the grace."""
        deadline = time.monotonic() + grace_s
        while True:
            try:
                message = self._read_abort()
            except Exception:  # noqa: BLE001 - the store may be gone too
                return None
            if message is not None or time.monotonic() >= deadline:
                return message
            time.sleep(0.01)

    def _publish_abort(self, message: str) -> None:
        if self._store is not None:
            self._store.compare_set("abort", "", message)
        self._interrupt()

    def _interrupt(self) -> None:
        """Release every wait of this rank on the private group, and the peers' on it."""
        if self.group is self.user_group:
            return  # never close a group we do not own
        if self._gloo:
            buf = torch.empty(1, dtype=torch.uint8)
            self._keep.append(buf)
            try:
                dist.irecv(buf, group=self.group, tag=_INTERRUPT_TAG,
                           group_src=(self.rank + 1) % self.size).wait(timeout=_MIN_WAIT)
            except Exception:  # noqa: BLE001 - the expected "timed out": pairs are closed now
                pass
        else:
            try:
                self.group.abort()
            except Exception:  # noqa: BLE001
                pass

    def _watch_once(self) -> None:
        """One look (watcher thread): a peer's abort, or peers waiting in another call."""
        active = self._active
        if active is None or self._remote is not None:
            return
        waited = time.monotonic() - active.start
        if waited < POLL_SLICE_S:
            return
        message = self._read_abort()
        if message is not None:
            self._remote = message
            self._interrupt()
            return
        if waited < REORDER_AFTER_S or not active.peers:
            return
        with self._lock:
            if self._active is not active:
                return
            if not active.published:
                peers = ",".join(str(q) for q in sorted(active.peers))
                self._store.set(f"wait/{self.rank}", f"{active.seq}|{peers}|{active.label}")
                active.published = True
        conflict = None
        for q in sorted(active.peers):
            key = f"wait/{q}"
            if not self._store.check([key]):
                continue
            seq, _, rest = self._store.get(key).decode(errors="replace").partition("|")
            peers, _, label = rest.partition("|")
            if seq and str(self.rank) in peers.split(",") and label != active.label:
                conflict = (q, seq, label)
                break
        if conflict is None:
            active.suspect = None
        elif active.suspect is None or active.suspect[:2] != conflict[:2]:
            active.suspect = (*conflict, time.monotonic())  # confirm on a later look
        elif time.monotonic() - active.suspect[3] >= POLL_SLICE_S:
            self._remote = reorder_message((self.rank, active.label), (conflict[0], conflict[2]))
            self._store.compare_set("abort", "", self._remote)  # before closing: peers read it
            self._interrupt()

    # -- helpers ---------------------------------------------------------------------------
    def _wait(self, works, peers_of_work: Sequence[Sequence[int]], what: str) -> None:
        """Wait for every work until one shared deadline (the watcher thread may release it
        early: a peer's abort, a reorder); map failures to Comm errors."""
        self._seq += 1
        active = _Active(self._seq, self.waiting_in(),
                         frozenset(q for peers in peers_of_work for q in peers if q != self.rank))
        self._active = active
        if self._watcher is None:
            self._start_watcher()
        try:
            self._wait_works(works, peers_of_work, what)
        except CommError as e:
            if self._remote is None:  # the error path only: did a peer fail first?
                # (our own timeout: one look; a closed connection: the peer's grace)
                self._remote = self._await_abort(0.0 if isinstance(e, CommTimeoutError) else _ABORT_GRACE_S)
            if self._remote is not None:
                raise self._aborted_by_peer(self._remote) from e
            raise
        finally:
            with self._lock:
                self._active = None
                if active.published:
                    try:
                        self._store.set(f"wait/{self.rank}", "")
                    except Exception:  # noqa: BLE001
                        pass
        if self._remote is not None:  # released while completing: the Comm is not trustworthy
            raise self._aborted_by_peer(self._remote)

    def _wait_works(self, works, peers_of_work: Sequence[Sequence[int]], what: str) -> None:
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

    def _post(self, post, what: str, peers):
        """Post operations; a backend error at posting (a connection a peer closed) is a
        CommError, or the peer's published abort -- never a raw backend exception."""
        try:
            return post()
        except RuntimeError as e:
            if self._remote is None:
                self._remote = self._await_abort(_ABORT_GRACE_S)
            if self._remote is not None:
                raise self._aborted_by_peer(self._remote) from e
            raise CommError(f"rank {self.rank} of {self.size}: posting {what} with peer(s) "
                            f"{sorted(set(peers))} failed: {e}") from e

    def _on_device(self, t: torch.Tensor, what: str) -> None:
        if t.device != self.device:
            raise ValueError(f"rank {self.rank}: {what} is on {t.device}, this TorchComm "
                             f"({self.backend}) moves tensors on {self.device}")

    # -- Comm primitives -------------------------------------------------------------------
    def _post_and_wait(self, sends: Sequence[Message], recvs: Sequence[Message]) -> None:
        self._post_tagged(sends, recvs, self.tag, "exchange")

    def _post_tagged(self, sends: Sequence[Message], recvs: Sequence[Message], tag: int, what: str) -> None:
        ops, peers = [], []
        # Empty messages are skipped on both sides (both know the size is 0), which keeps
        # the per-pair order of the remaining ones.
        for peer, t in sends:
            self._on_device(t, "send payload")
            if t.numel():
                ops.append(dist.P2POp(dist.isend, t, group=self.group, tag=tag, group_peer=peer))
                peers.append(peer)
        for peer, t in recvs:
            self._on_device(t, "receive buffer")
            if t.numel():
                ops.append(dist.P2POp(dist.irecv, t, group=self.group, tag=tag, group_peer=peer))
                peers.append(peer)
        if not ops:
            return
        works = self._post(lambda: dist.batch_isend_irecv(ops), what, peers)
        if len(works) == len(ops):
            peers_of_work = [[p] for p in peers]
        else:  # coalesced (NCCL): one work for the whole batch
            peers_of_work = [sorted(set(peers))] * len(works)
        self._wait(works, peers_of_work, what)

    def _allreduce_dense(self, tensor: torch.Tensor) -> tuple[int, int]:
        self._on_device(tensor, "allreduce_dense tensor")
        self._guard_dense(tensor)
        buf = tensor if tensor.is_contiguous() else tensor.contiguous()
        others = [r for r in range(self.size) if r != self.rank]
        work = self._post(lambda: dist.all_reduce(buf, op=dist.ReduceOp.SUM, group=self.group, async_op=True),
                          "allreduce_dense", others)
        self._wait([work], [[r for r in range(self.size) if r != self.rank]], "allreduce_dense")
        if buf is not tensor:
            tensor.copy_(buf)
        return ring_allreduce_cost(tensor.numel() * tensor.element_size(), self.size)

