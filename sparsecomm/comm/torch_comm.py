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

Side channel: the rendezvous store, through a connection of this Comm's own
(``Store.clone()`` of the default store, keys under a prefix named after the private group),
used by one thread only (the Comm's channel thread). A rank that fails inside a call writes
``abort`` there, then closes its connections; a rank whose round has waited longer than a poll
slice (0.05 s) looks at ``abort`` between slices (on the channel thread; the fast path touches
no store), and after ``REORDER_AFTER_S`` publishes what it waits in and compares with its
peers'. Only the channel thread makes store calls (:mod:`._store_channel` says why); everyone
else waits for its answer with a deadline, and a store that has not answered within
``min(1 s, timeout)`` makes the round's error a :class:`CommTimeoutError` naming the store and
its host.
"""

from __future__ import annotations

import atexit
import math
import time
import weakref
from datetime import timedelta
from typing import Sequence

import torch
import torch.distributed as dist

from ._store_channel import STORE_ANSWER_S, ActiveRound, StoreChannel, read_abort
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


#: seconds a rank waits for its abort to be written before it closes its connections
_PUBLISH_WAIT_S = 0.5
#: seconds the rank that hosts the store waits, at close() or exit, for every peer to have
#: read the abort of a broken Comm (its exit takes the store, and the cause, with it)
_EXIT_ACK_S = 3.0
#: the same wait, when the host publishes its own abort or raises a peer's, before it raises
#: (a process may end at once after an error: os._exit, a signal, a launcher tearing the job down)
_HOST_ACK_S = 1.0


_LIVE: "weakref.WeakSet[TorchComm]" = weakref.WeakSet()


@atexit.register
def _before_exit() -> None:
    # The rank that hosts the store takes it (and every published abort) with it when it
    # exits: give the peers of a broken Comm a bounded moment to read the cause first.
    comms = list(_LIVE)
    for comm in comms:  # what is queued (an acknowledgement) leaves first, if the store answers
        if comm._chan is not None:
            comm._chan.flush(0.5)
    deadline = time.monotonic() + _EXIT_ACK_S  # one bound for all of them
    for comm in comms:
        try:
            comm._wait_for_readers(deadline)
        except Exception:  # noqa: BLE001 - best effort at exit
            pass


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
        self._owns_group = group is not self.user_group   # close() destroys it
        self._gloo = "gloo" in self.backend.lower()
        # gloo fills the start of a longer receive buffer (NCCL needs the exact count)
        self.receives_short = self._gloo
        name = getattr(group, "group_name", None) or str(id(group))
        count = _COMMS_PER_GROUP[name] = _COMMS_PER_GROUP.get(name, 0) + 1
        self._chan: StoreChannel | None = None
        if size > 1:
            try:
                base = dist.distributed_c10d._get_default_store()
            except Exception:  # noqa: BLE001 - no store: local failures still raise locally
                base = None
            if base is not None:
                self._chan = StoreChannel(base, f"sparsecomm/{name}/{count}/", rank)
        self._active: ActiveRound | None = None
        self._seq = 0
        self._remote: str | None = None     # a peer's abort or a detected reorder
        self._acked = False                 # this rank has counted itself among the abort's readers
        self._silent: float = 0.0           # seconds the store had not answered, at the last error
        self._closed = False
        self._keep: list = []               # buffers of works given up on
        _LIVE.add(self)
        if device.type == "cuda" and size > 1:
            probe = torch.zeros(1, device=device)
            self._wait([dist.all_reduce(probe, group=group, async_op=True)], [list(range(size))],
                       "initial all_reduce")

    def close(self) -> None:
        """Release what this Comm took: its channel thread and store connection, and its
        private process group (``dist.destroy_process_group(group)``: its sockets and gloo's
        threads). Call it on every rank once the Comm is no longer used (a peer still
        communicating on it gets a CommError). On the rank that hosts the store, closing a
        broken Comm first waits (at most 3 s) until every peer has read the abort. Later calls
        raise CommError. Idempotent."""
        if self._closed:
            return
        self._closed = True
        _LIVE.discard(self)
        if self._chan is not None:
            try:
                self._wait_for_readers()
            except Exception:  # noqa: BLE001 - best effort
                pass
            self._chan.close()
        if self._owns_group:
            try:
                dist.destroy_process_group(self.group)
            except Exception:  # noqa: BLE001 - already gone (the default group was destroyed)
                pass
        self._keep.clear()

    def _split(self, groups: list[list[int]], index: int, local: bool) -> "TorchComm":
        """A process group per group, made with :func:`torch.distributed.new_group` (over the
        default group every process creates every group, in order, as c10d requires; over a
        smaller group only the members of each, with local synchronization), and a TorchComm
        on this rank's, which owns it (``close()`` destroys it)."""
        members = dist.get_process_group_ranks(self.user_group)
        spans_world = self.user_group is dist.group.WORLD or len(members) == dist.get_world_size()
        mine = None
        for i, group in enumerate(groups):
            if not spans_world and i != index:
                continue
            made = dist.new_group(ranks=[members[r] for r in group], backend=self.backend,
                                  use_local_synchronization=not spans_world, group_desc="sparsecomm-split")
            if i == index:
                mine = made
        sub = TorchComm(mine, timeout=self.timeout, isolate=False)
        sub._owns_group = True
        return sub

    def __del__(self) -> None:
        try:
            if self._chan is not None:
                self._chan.stop()
        except Exception:  # noqa: BLE001
            pass

    def check_usable(self) -> None:
        if self._closed:
            raise CommError(f"rank {self.rank} of {self.size}: this TorchComm was closed; build a new one "
                            "on every rank to continue")
        super().check_usable()

    # -- side channel (store calls run on the channel thread only) ---------------------------
    def _watcher(self) -> weakref.WeakMethod:
        """What the channel thread calls every poll slice; it does not keep the Comm alive."""
        return weakref.WeakMethod(self._watch_once)

    def _start_watcher(self) -> None:
        if self._chan is not None:
            self._chan.start(self._watcher())

    def _ack(self) -> None:
        """Count this rank among the readers of the abort (once; the store's host waits for
        all of them before it exits). Not waited for."""
        if not self._acked and self._chan is not None:
            self._acked = True
            self._chan.request(lambda store: store.add("seen", 1), None, self._watcher())

    def _aborted_by_peer(self, message: str):
        first = self._broken is None
        self._ack()
        error = super()._aborted_by_peer(message)
        if first:
            # The store's host raises a peer's abort only once every rank has read it (or the
            # bound passed): its process may end right after the error (os._exit, a signal, a
            # launcher tearing the job down), and the store and the cause would go with it.
            self._wait_for_readers(time.monotonic() + _HOST_ACK_S)
        return error

    def _await_abort(self, grace_s: float) -> str | None:
        """On the error path only: a peer's published abort, if the store has one within
        ``grace_s`` (a connection a peer closed: gloo closes a pair when a wait on it times
        out, before that rank has published its CommTimeoutError; without the grace a peer
        could see only the closed connection). The store gets ``min(1 s, timeout)`` to answer
        (less what it has already been silent); if it does not, ``self._silent`` says for how
        long it has been silent and None is returned. A killed peer publishes nothing: its
        survivors get None after the grace."""
        self._silent = 0.0
        chan = self._chan
        if chan is None or chan.dead is not None:
            return None
        message, self._silent = chan.await_abort(grace_s, min(STORE_ANSWER_S, self.timeout),
                                                 lambda: self._remote, self._watcher())
        return message

    def _unanswered(self, exc: CommError) -> CommTimeoutError | None:
        """The error to raise when the store did not answer the abort channel on the error
        path: a CommTimeoutError naming the round's peers (``exc``) and the store's host."""
        if self._silent <= 0.0 or self._chan is None:
            return None
        kind = "timed out" if isinstance(exc, CommTimeoutError) else "failed"
        return CommTimeoutError(
            f"{exc}; and {self._chan.describe()} has not answered for {self._silent:.1f} s (the abort channel "
            f"of this Comm): its host is stopped or unreachable, so this rank cannot learn why the round {kind}")

    def _publish_abort(self, message: str) -> None:
        if self._chan is not None:
            self._acked = True

            def publish(store):
                store.compare_set("abort", "", message)
                store.add("seen", 1)
            # written before the connections close (the peers' grace reads it), unless the
            # store does not answer: then the connections close anyway
            silent = self._chan.silent_for() >= min(STORE_ANSWER_S, self.timeout)
            self._chan.request(publish, 0.0 if silent else min(_PUBLISH_WAIT_S, self.timeout), self._watcher())
        self._interrupt()

    def _settle_abort(self, since: float) -> None:
        if self._chan is not None:
            self._wait_for_readers(since + _HOST_ACK_S)

    def _wait_for_readers(self, deadline: float | None = None) -> None:
        """On the rank that hosts the store, with this Comm broken: wait (at most
        ``min(3 s, timeout)``, or until ``deadline``) until every rank has read the abort."""
        chan = self._chan
        if self._broken is None or chan is None or chan.tcp is None or chan.dead is not None \
                or not chan.hosts_store():
            return
        deadline = min(deadline or math.inf, time.monotonic() + min(_EXIT_ACK_S, self.timeout))
        chan.wait_for_readers(self.size, deadline, self._watcher())

    def _interrupt(self) -> None:
        """Release every wait of this rank on the private group, and the peers' on it."""
        if not self._owns_group:
            return  # never close a group we do not own (a split's group is its own)
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
        """One look (channel thread): a peer's abort, or peers waiting in another call.

        A peer's published wait counts as a reorder only once its beat (bumped at each of its
        looks) has moved while the conflict stood: a stopped peer's last entry never moves,
        so a stopped peer is a timeout, never a reorder."""
        active = self._active
        chan = self._chan
        if active is None or self._remote is not None or chan is None:
            return
        waited = time.monotonic() - active.start
        if waited < POLL_SLICE_S:
            return
        message = chan.do(read_abort)
        if message is not None:
            self._remote = message
            self._interrupt()
            return
        if waited < REORDER_AFTER_S or not active.peers or active.ended:
            return
        active.published = True
        active.beat += 1
        chan.publish_wait(active)
        if active.ended:  # the round ended meanwhile and may have missed the entry: clear it
            chan.clear_wait()
            return
        conflict = chan.conflicting_wait(active)
        if conflict is None:
            active.suspect = None
        elif active.suspect is None or active.suspect[:3] != conflict[:3]:
            active.suspect = conflict  # confirm once the peer has looked again
        elif active.suspect[3] != conflict[3]:
            self._remote = reorder_message((self.rank, active.label), (conflict[0], conflict[2]))
            chan.do(lambda store: store.compare_set("abort", "", self._remote))  # before closing: peers read it
            self._interrupt()

    # -- helpers ---------------------------------------------------------------------------
    def _wait(self, works, peers_of_work: Sequence[Sequence[int]], what: str) -> None:
        """Wait for every work until one shared deadline (the channel thread may release it
        early: a peer's abort, a reorder); map failures to Comm errors."""
        self._seq += 1
        active = ActiveRound(self._seq, self.waiting_in(),
                         frozenset(q for peers in peers_of_work for q in peers if q != self.rank))
        self._active = active
        self._start_watcher()
        try:
            self._wait_works(works, peers_of_work, what)
        except CommError as e:
            raise self._failed(e, 0.0 if isinstance(e, CommTimeoutError) else _ABORT_GRACE_S) from e
        finally:
            self._active = None
            active.ended = True
            if active.published and self._chan is not None:  # not waited for
                self._chan.request(lambda store: store.set(f"wait/{self.rank}", ""), None)
        if self._remote is not None:  # released while completing: the Comm is not trustworthy
            raise self._aborted_by_peer(self._remote)

    def _failed(self, exc: CommError, grace_s: float) -> CommError:
        """The error path of a round (``exc``: its timeout or closed connection): a peer's
        published abort if there is one (our own timeout: one look; a closed connection: the
        peer's grace), a CommTimeoutError if the store does not answer, else ``exc``."""
        if self._remote is None:
            self._remote = self._await_abort(grace_s)
        if self._remote is not None:
            return self._aborted_by_peer(self._remote)
        return self._unanswered(exc) or exc

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
            raise CommError(f"{self.who()}: {what} failed with peer(s) "
                            f"{sorted(map(self.root_rank, failed))}: {first}") from first
        raise CommTimeoutError(
            f"{self.who()}: {what} timed out after {self.timeout:g} s; "
            f"still waiting on peer(s) {sorted(map(self.root_rank, pending))}") from first

    def _post(self, post, what: str, peers):
        """Post operations; a backend error at posting (a connection a peer closed) is a
        CommError, or the peer's published abort -- never a raw backend exception."""
        try:
            return post()
        except RuntimeError as e:
            error = CommError(f"{self.who()}: posting {what} with peer(s) "
                              f"{sorted(set(map(self.root_rank, peers)))} failed: {e}")
            raise self._failed(error, _ABORT_GRACE_S) from e

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

