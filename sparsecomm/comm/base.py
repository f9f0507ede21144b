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
  (MPI probes). The default sends each message's size in an 8-byte message just before it.
  Inside a reducer call (a bound :attr:`~Comm.max_message_bytes` is set) on a backend whose
  receive may be longer than the message (:attr:`~Comm.receives_short`: gloo, the simulated
  world), the receiver posts a buffer of the bound beside the size, so sizes and payloads
  travel in one round; otherwise (NCCL, calls outside a reducer) the sizes take a round of
  their own first, and it is counted.

Counters (:class:`CommStats`) are cumulative per Comm; the reducer snapshots them around
a call to report per-call figures. A *round* is one sequential communication step: all
messages posted together and completed together count as one round.

Failing together. Every call of a reducer runs inside :meth:`Comm.call_scope`, which gives
the call's messages a tag of their own (reducer id, call number) so that messages of
different reducers or calls can never be matched with each other, and which, when the
call raises on this rank, :meth:`aborts <Comm.abort>` the Comm: the cause is published on
the backend's side channel (the process group's store, an MPI control communicator, the
simulated world) and every peer's pending or next operation raises
:class:`CommAbortedError` naming this rank and the cause within a poll slice (0.05 s).
A waiter that has waited ``reorder_after_s`` compares what it waits in (reducer, call)
with its peers'; two ranks waiting on each other in different calls raise the same
:class:`CommError` naming both. After an abort the Comm is broken -- its pending
operations cannot be trusted -- and every later call raises at once with the original
cause; recover by building a new Comm (for TorchComm: a new one over the same group,
constructed on every rank) and reloading state.
"""

from __future__ import annotations

import contextlib
import math
import time
import zlib
from abc import ABC, abstractmethod
from dataclasses import dataclass, fields
from typing import Iterator, Sequence

import torch

from .collectives import bruck_allgather

__all__ = ["Comm", "CommStats", "check_groups", "CommTimeoutError", "CommError", "CommAbortedError", "CommPeerTimeoutError", "CallScope",
           "ring_allreduce_cost", "DEFAULT_TIMEOUT", "abort_together"]

#: Default seconds a round may wait for its peers (every backend): long enough for a slow
#: step of a large model, short enough that a stuck job fails within minutes, not hours.
DEFAULT_TIMEOUT = 300.0
#: Seconds between two looks at the side channel while a round waits.
POLL_SLICE_S = 0.05
#: Seconds a round waits before it compares what it waits in with its peers.
REORDER_AFTER_S = 0.5
#: Tag of messages sent outside any call scope (user code, tests).
BASE_TAG = 0x5C0C
#: Set in the tag of the size check before a dense allreduce
_GUARD_BIT = 0x20000000


class CommError(RuntimeError):
    """A communication step failed (peer gone, protocol violation)."""


class CommTimeoutError(CommError, TimeoutError):
    """A peer did not answer within the Comm's timeout."""


class CommAbortedError(CommError):
    """The Comm was aborted: a rank failed inside a call (``failed_rank``, ``cause``), or
    ranks were found waiting in different calls. The Comm stays broken."""

    def __init__(self, message: str, failed_rank: int | None = None, cause: str = ""):
        super().__init__(message)
        self.failed_rank = failed_rank
        self.cause = cause


class CommPeerTimeoutError(CommAbortedError, CommTimeoutError):
    """The Comm was aborted because a rank timed out waiting for a peer (``cause`` is its
    CommTimeoutError): a peer is stuck or stopped. Both a :class:`CommAbortedError` and a
    :class:`CommTimeoutError`, so every survivor of a stopped peer can catch the latter."""


def aborted_error(message: str, failed_rank: int | None, cause: str) -> CommAbortedError:
    """The error a rank raises for an abort: :class:`CommPeerTimeoutError` when the cause was
    a timeout, else :class:`CommAbortedError`."""
    cls = CommPeerTimeoutError if cause.startswith(CommTimeoutError.__name__ + ":") else CommAbortedError
    return cls(message, failed_rank, cause)


class CallScope:
    """One caller of a Comm (a reducer, the hook's warm-up): an id equal on every rank
    (scopes are numbered in creation order, the same in SPMD code), a label for error
    messages, and the number of calls so far."""

    __slots__ = ("id", "label", "calls")

    def __init__(self, id: int, label: str):
        self.id = id
        self.label = label
        self.calls = 0


def scope_tag(scope_id: int, call: int) -> int:
    """The point-to-point tag of call ``call`` of scope ``scope_id``: 31 bits (gloo and MPI
    take non-negative int32 tags), distinct for 16384 scopes x 65536 consecutive calls."""
    return 0x40000000 | ((scope_id & 0x3FFF) << 16) | (call & 0xFFFF)


def abort_together(comms: Sequence["Comm | None"], cause: str) -> None:
    """Abort several Comms of one call as one (a two-level call's world, intra- and inter-node
    Comms): each is marked broken and publishes ``cause`` first -- every peer waiting on any of
    them is released at once -- and only then does each wait for its readers, against one shared
    bound, so a store host pays that wait once, not once per Comm. A Comm already broken keeps
    its first cause; None entries are skipped."""
    published = []
    since = time.monotonic()
    for comm in comms:
        if comm is None or comm._broken is not None:
            continue
        comm._broken = format_abort(comm.root_rank(comm.rank), cause)
        if comm.size > 1:
            try:
                comm._publish_abort(comm._broken)
                published.append(comm)
            except Exception:  # noqa: BLE001 - best effort: the side channel may be gone too
                pass
    for comm in published:
        try:
            comm._settle_abort(since)
        except Exception:  # noqa: BLE001 - best effort, as the publishing
            pass


def format_abort(rank: int, cause: str) -> str:
    return f"rank {rank} failed: {cause}"


def parse_abort(message: str) -> tuple[int | None, str]:
    """(failed rank, cause) of a published abort message."""
    head, _, cause = message.partition(" failed: ")
    try:
        return int(head.split()[-1]), cause
    except (ValueError, IndexError):
        return None, message


def reorder_message(mine: tuple[int, str], theirs: tuple[int, str]) -> str:
    """The same text on both ranks of a mismatched pair (ranks in ascending order)."""
    (a, la), (b, lb) = sorted([mine, theirs])
    return (f"ranks called the collectives in different orders: rank {a} waits in {la} while rank {b} "
            f"waits in {lb} (every rank must call the same reducers in the same order)")


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


def check_groups(groups: Sequence[Sequence[int]], size: int, rank: int) -> int:
    """The index of the group that holds ``rank``; a ValueError unless ``groups`` cut
    ``range(size)`` into disjoint non-empty groups."""
    seen: list[int] = []
    for group in groups:
        if len(group) == 0:
            raise ValueError(f"split: empty group in {[list(g) for g in groups]}")
        seen.extend(int(r) for r in group)
    if sorted(seen) != list(range(size)):
        raise ValueError(f"split: the groups {[list(g) for g in groups]} must hold each rank 0..{size - 1} "
                         "exactly once")
    return next(i for i, group in enumerate(groups) if rank in [int(r) for r in group])


def _check_payload(t: torch.Tensor, what: str) -> None:
    if t.dtype != torch.uint8 or t.dim() != 1 or not t.is_contiguous():
        raise TypeError(f"{what} must be a contiguous 1-D torch.uint8 tensor, got dtype={t.dtype} "
                        f"shape={tuple(t.shape)} contiguous={t.is_contiguous()}")


class Comm(ABC):
    """A group of ``size`` ranks; this object is rank ``rank`` of it."""

    #: True when the backend can learn a message's size without a size round (MPI Probe).
    can_probe: bool = False
    #: True when a receive may be posted with a buffer longer than the message it gets (gloo
    #: accepts it; NCCL does not): variable-size rounds then need no size round of their own
    #: when the call has a bound (:meth:`sizes_take_a_round`)
    receives_short: bool = False
    #: True when every rank is a thread of this process (the simulated world): no shared memory
    #: between processes is needed, and the modelled links must carry the bytes
    in_one_process: bool = False

    def __init__(self, rank: int, size: int, device: torch.device | str = "cpu", timeout: float = DEFAULT_TIMEOUT):
        if size < 1 or not (0 <= rank < size):
            raise ValueError(f"invalid rank {rank} for a group of size {size}")
        if not timeout > 0:
            raise ValueError(f"timeout must be positive seconds, got {timeout!r}")
        self._rank = rank
        self._size = size
        self.device = torch.device(device)
        self.timeout = float(timeout)
        self.stats = CommStats()
        self._scopes = 0
        #: (scope, call number) this rank is in, or None outside any call scope
        self._current: tuple[CallScope, int] | None = None
        #: what a wait outside any call scope is in, for reorder errors (:meth:`outside_calls`)
        self._outside: str | None = None
        self.tag = BASE_TAG
        #: the abort message once the Comm is broken
        self._broken: str | None = None
        #: bound on a size received in a variable-size round (set per call by the reducer)
        self.max_message_bytes: int | None = None
        self._dense_agreed = None   # the call whose size and dtype a caller proved equal (mark_dense_agreed)
        self._scratch: list[torch.Tensor] = []   # receive buffers of bounded rounds (_receive_scratch)

    # -- failing together ------------------------------------------------------------------
    def new_scope(self, label: str) -> CallScope:
        """A new caller of this Comm (every rank must create its scopes in the same order)."""
        self._scopes += 1
        return CallScope(self._scopes, f"{label} [#{self._scopes}]")

    def waiting_in(self) -> str:
        """What this rank is in, for reorder errors: the scope's label and call number."""
        if self._current is None:
            return self._outside or "a call outside any reducer"
        scope, call = self._current
        return f"{scope.label} call {call}"

    @contextlib.contextmanager
    def outside_calls(self, label: str) -> Iterator[None]:
        """Name the collective steps inside (outside any call scope, on the Comm's own tag) for
        reorder errors, so a rank that meets a peer in another step is told which."""
        saved, self._outside = self._outside, label
        try:
            yield
        finally:
            self._outside = saved

    @contextlib.contextmanager
    def call_scope(self, scope: CallScope, max_message_bytes: int | None = None,
                   agreed=None) -> Iterator[None]:
        """Run one call of ``scope``: its messages carry the call's own tag, and if the body
        raises on this rank the Comm is aborted (the cause is published to every peer) before
        the exception propagates. Raises :class:`CommAbortedError` at once if the Comm is
        already broken.

        Not aborted (the Comm stays usable): an error for which ``agreed(exc)`` is true --
        one every rank raises by agreement (the reducer's
        :class:`~sparsecomm.errors.AgreedValueError`: the handshake mismatch,
        ``nonfinite="raise"``). Callers check their arguments before entering the scope,
        so such errors stay local."""
        self.check_usable()
        saved = (self._current, self.tag, self.max_message_bytes)
        scope.calls += 1
        self._current = (scope, scope.calls)
        self.tag = scope_tag(scope.id, scope.calls)
        self.max_message_bytes = max_message_bytes
        try:
            yield
        except BaseException as exc:
            if self._broken is None and not isinstance(exc, CommAbortedError) \
                    and not (agreed is not None and agreed(exc)):
                self.abort(f"{type(exc).__name__}: {exc}")
            raise
        finally:
            self._current, self.tag, self.max_message_bytes = saved

    def check_usable(self) -> None:
        """Raise :class:`CommAbortedError` if the Comm was aborted."""
        if self._broken is not None:
            failed, cause = parse_abort(self._broken)
            raise aborted_error(f"{self.who()}: this Comm was aborted ({self._broken}); "
                                "build a new Comm on every rank to continue", failed, cause)

    def abort(self, cause: str) -> None:
        """Mark this Comm broken and tell every peer that this rank failed with ``cause``;
        their pending and later operations raise :class:`CommAbortedError` naming it.
        Idempotent: only the first cause is kept."""
        abort_together([self], cause)

    def _publish_abort(self, message: str) -> None:
        """Backend hook: make ``message`` visible to every peer and release their waits."""

    def _settle_abort(self, since: float) -> None:
        """Backend hook, after :meth:`_publish_abort`: wait for what must happen before this
        rank goes on (a store host: its peers reading the abort), at most until the backend's
        bound counted from ``since``, when the publishing began. Nothing by default."""

    def _aborted_by_peer(self, message: str) -> CommAbortedError:
        """Record a peer's abort (or a detected reorder) and build the error to raise."""
        if self._broken is None:
            self._broken = message
        failed, cause = parse_abort(message)
        return aborted_error(f"{self.who()}: {message}", failed, cause)

    def check_message_size(self, n: int, peer: int, limit: int | None = None) -> int:
        """``n``, the size ``peer`` announced for a variable-size message, if the current call can
        legitimately send that much (``limit``, by default :attr:`max_message_bytes`); else a
        WireFormatError."""
        from ..errors import WireFormatError

        limit = self.max_message_bytes if limit is None else limit
        if n < 0 or (limit is not None and n > limit):
            raise WireFormatError(f"rank {self.rank}: rank {peer} announced a message of {n} bytes, more than "
                                  f"the {limit} bytes this call can legitimately send (corrupted size header?)")
        return n

    # -- sub-groups -----------------------------------------------------------------------
    def split(self, groups: Sequence[Sequence[int]], *, local: bool = False) -> "Comm":
        """The Comm of the group in ``groups`` that holds this rank (ranks numbered by their
        position in the group). ``groups`` must cut ``range(size)`` into disjoint non-empty
        groups. Collective: every rank calls it with the same groups, in the same order, at
        the same point (SPMD code does). ``local=True`` says the groups' ranks share a machine
        (a node's fast links): a simulated backend then models them with its intra-node link.
        The new Comm has its own side channel: a caller that spans several Comms aborts
        every one of them when it fails (the two-level reducer does)."""
        index = check_groups(groups, self.size, self.rank)
        self.check_usable()
        groups = [list(map(int, g)) for g in groups]
        sub = self._split(groups, index, local)
        sub.root_ranks = [self.root_rank(r) for r in groups[index]]
        return sub

    #: a Comm made by :meth:`split`: the rank of each of its ranks in the first Comm it was split
    #: from; errors name ranks by it (a rank's number in a group names another process)
    root_ranks: list[int] | None = None

    def root_rank(self, rank: int) -> int:
        """``rank``'s number in the Comm this one was split from (itself when not split)."""
        return rank if self.root_ranks is None else self.root_ranks[rank]

    def who(self) -> str:
        """This rank, as errors name it."""
        if self.root_ranks is None:
            return f"rank {self.rank} of {self.size}"
        return f"rank {self.root_rank(self.rank)} ({self.rank} of {self.size} in its group)"

    def _split(self, groups: list[list[int]], index: int, local: bool) -> "Comm":
        raise NotImplementedError(f"{type(self).__name__} cannot be split into groups; use a TorchComm, "
                                  "an MPIComm or a simulated world")

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

    def _post_and_wait_bounded(self, sends: Sequence[Message], recvs: Sequence[Message]) -> None:
        """:meth:`_post_and_wait` where a receive buffer may be longer than the message that
        fills its start (only where :attr:`receives_short`); the backend's own receive when it
        accepts that."""
        self._post_and_wait(sends, recvs)

    def sizes_take_a_round(self, bounded: bool | None = None) -> bool:
        """Whether a variable-size round (:meth:`exchange_var`) costs a round of sizes before
        its payloads: not on a backend that probes, nor on one that :attr:`receives_short`
        when the call has a bound (``bounded``; default: whether the current call has one --
        every reducer call does)."""
        bounded = self.max_message_bytes is not None if bounded is None else bounded
        return not (self.can_probe or (self.receives_short and bounded))

    def var_message_nbytes(self, n: int, bounded: bool | None = None) -> int:
        """Bytes a variable-size message of ``n`` bytes puts on the wire in the current call
        (``bounded`` as in :meth:`sizes_take_a_round`), its size included: ``n`` where the
        backend probes, else 8 more (the size), and at least one byte of payload when the
        sizes travel along (:meth:`_exchange_bounded`)."""
        if self.can_probe:
            return n
        return 8 + (n if self.sizes_take_a_round(bounded) else max(n, 1))

    def _exchange_var(self, sends: Sequence[Message], sources: Sequence[int],
                      max_nbytes: int | None = None) -> list[torch.Tensor]:
        """Variable-size round: with a bound on a backend that :attr:`receives_short`, each
        payload travels just after its 8-byte size into a buffer of the bound (one round);
        otherwise a round of sizes first, then the payloads."""
        bound = self.max_message_bytes if max_nbytes is None else max_nbytes
        if not self.sizes_take_a_round(bounded=bound is not None):
            return self._exchange_bounded(sends, sources, bound)
        size_bufs = [torch.empty(8, dtype=torch.uint8, device=self.device) for _ in sources]
        size_msgs = [(peer, torch.tensor([t.numel()], dtype=torch.int64, device="cpu").view(torch.uint8).to(self.device))
                     for peer, t in sends]
        self.exchange(size_msgs, list(zip(sources, size_bufs)))
        sizes = [self.check_message_size(int(b.cpu().view(torch.int64)[0]), peer, bound)
                 for peer, b in zip(sources, size_bufs)]
        recv_bufs = [torch.empty(n, dtype=torch.uint8, device=self.device) for n in sizes]
        self.exchange(sends, list(zip(sources, recv_bufs)))
        return recv_bufs

    def _receive_scratch(self, count: int, nbytes: int) -> list[torch.Tensor]:
        """``count`` receive buffers of at least ``nbytes``, kept by this Comm from round to
        round: a fresh buffer of the bound is mapped memory whose pages fault in as the bytes
        arrive (about 1 ms per MB with 4 ranks on 2 cores), a reused one is already mapped up
        to the largest message it took. Only the bytes received are resident."""
        scratch = self._scratch
        for i in range(count):
            if i == len(scratch):
                scratch.append(torch.empty(nbytes, dtype=torch.uint8, device=self.device))
            elif scratch[i].numel() < nbytes:
                scratch[i] = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        return scratch[:count]

    def _exchange_bounded(self, sends: Sequence[Message], sources: Sequence[int], bound: int) -> list[torch.Tensor]:
        """One round without a size round: every message is sent after its size (8 bytes, the
        same connection) and received into a buffer of ``bound`` bytes (kept for the next
        rounds, :meth:`_receive_scratch`), then copied out at its size. An empty payload
        travels as one byte (a receive is always posted). A sender whose message exceeds the
        bound raises before sending anything (the backend would fail the receiver's process
        otherwise); a size beyond the bound raises WireFormatError. The size is trusted as
        the size round's is: the decoders validate every byte of what it delimits."""
        from ..errors import WireFormatError

        for peer, t in sends:
            if t.numel() > bound:
                raise WireFormatError(f"rank {self.rank}: a variable-size message of {t.numel()} bytes to rank {peer} "
                                      f"exceeds this call's bound of {bound} bytes")
        sizes = torch.tensor([t.numel() for _, t in sends], dtype=torch.int64, device="cpu").view(torch.uint8)
        sizes = sizes.to(self.device)
        filler = torch.zeros(1, dtype=torch.uint8, device=self.device)
        out: list[Message] = []
        for i, (peer, t) in enumerate(sends):
            out.append((peer, sizes[8 * i:8 * i + 8]))
            out.append((peer, t if t.numel() else filler))
        size_bufs = torch.empty(8 * len(sources), dtype=torch.uint8, device=self.device)
        bufs = self._receive_scratch(len(sources), max(bound, 1))
        recvs: list[Message] = []
        for i, peer in enumerate(sources):
            recvs.append((peer, size_bufs[8 * i:8 * i + 8]))
            recvs.append((peer, bufs[i]))
        self.check_usable()
        start = time.perf_counter()
        self._post_and_wait_bounded(out, recvs)
        self.stats.comm_s += time.perf_counter() - start
        got = size_bufs.cpu().view(torch.int64).tolist() if sources else []
        results = []
        for peer, n, buf in zip(sources, got, bufs):
            n = self.check_message_size(int(n), peer, bound)
            results.append(buf[:n].clone())   # the scratch is the next round's
        self.stats.bytes_sent += sum(self.var_message_nbytes(t.numel(), bounded=True) for _, t in sends)
        self.stats.bytes_recv += sum(self.var_message_nbytes(t.numel(), bounded=True) for t in results)
        self.stats.rounds += 1
        return results

    def _guard_dense(self, tensor: torch.Tensor) -> None:
        """Inside a call, before a backend's dense allreduce (which takes no tag): swap
        (bytes, dtype) with the ring neighbours on the call's tag with bit 29 set. Neighbours
        in another call never match (the reorder check reports it); a size difference raises
        here instead of making gloo abort the process. Not counted: not part of the algorithm.
        Skipped in a call whose caller has already all-gathered and compared the size, dtype
        and call with every rank and said so with :meth:`mark_dense_agreed` (the reducer's
        agreement record, before its dense paths)."""
        if self._current is None or self.size < 2 or self._dense_agreed == self._current:
            return
        mine = torch.tensor([tensor.numel() * tensor.element_size(), zlib.crc32(str(tensor.dtype).encode())],
                            dtype=torch.int64, device="cpu")
        neighbours = sorted({(self.rank + 1) % self.size, (self.rank - 1) % self.size})
        bufs = [torch.empty(16, dtype=torch.uint8, device=self.device) for _ in neighbours]
        tag = self.tag
        self.tag = tag | _GUARD_BIT
        try:
            self._post_and_wait([(q, mine.view(torch.uint8).to(self.device)) for q in neighbours],
                                list(zip(neighbours, bufs)))
        finally:
            self.tag = tag
        for q, b in zip(neighbours, bufs):
            theirs = b.cpu().view(torch.int64)
            if not torch.equal(theirs, mine):
                (a, va), (c, vc) = sorted([(self.rank, mine), (q, theirs)], key=lambda x: x[0])
                raise CommError(f"allreduce_dense in {self.waiting_in()}: rank {a} has {int(va[0])} bytes, "
                                f"rank {c} has {int(vc[0])} bytes (or another dtype)")

    def mark_dense_agreed(self) -> None:
        """Inside a call: every rank has all-gathered and compared this call's size and dtype,
        so a dense allreduce later in the same call needs no neighbour size check."""
        self._dense_agreed = self._current

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
        self.check_usable()
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

    def exchange_var(self, sends: Sequence[Message], sources: Sequence[int],
                     max_nbytes: int | None = None) -> list[torch.Tensor]:
        """Like :meth:`exchange` when the receiver cannot know the sizes; returns the
        received payloads in the order of ``sources``. Costs one extra round (the sizes)
        where :meth:`sizes_take_a_round`. ``max_nbytes`` bounds this round's messages (every
        rank must pass the same; default :attr:`max_message_bytes`, set per call by the
        reducer); a received size beyond it raises
        :class:`~sparsecomm.errors.WireFormatError` naming the peer, without allocating."""
        self._check_peers([peer for peer, _ in sends] + list(sources))
        for peer, t in sends:
            _check_payload(t, "payload")
        if not sends and not sources:
            return []
        self.check_usable()
        return self._exchange_var(sends, sources, max_nbytes)

    def allreduce_dense(self, tensor: torch.Tensor) -> torch.Tensor:
        """In-place SUM of ``tensor`` over all ranks with the backend's own algorithm.

        Counted as a ring allreduce (2(P-1) rounds, 2(P-1)/P of the bytes), since the
        backend's internals are not observable.
        """
        if self.size == 1 or tensor.numel() == 0:
            return tensor
        self.check_usable()
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
        self.allgather_small(torch.zeros(1, dtype=torch.uint8, device=self.device))
