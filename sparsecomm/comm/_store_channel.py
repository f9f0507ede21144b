"""The abort channel of a TorchComm: a connection of its own to the rendezvous store, used
by one thread only (the channel thread), so that no other thread ever blocks in a store call.

A TCPStore client honours no timeout on a server that is stopped (not dead), and a store call
cannot be interrupted: with ``env://`` rendezvous rank 0 hosts the store, so a stopped rank 0
would block any store call forever. The channel thread runs the store calls others
:meth:`StoreChannel.request` and, between them, the Comm's look at its waiting round every
poll slice; callers wait for an answer with a deadline. :meth:`StoreChannel.close` shuts the
connection down (``shutdown(2)`` on its socket), which releases a blocked thread. The channel
also tells whether this process hosts the store (it holds the listening socket) and how to
name the store's host in an error.
"""

from __future__ import annotations

import collections
import os
import socket
import threading
import time
import weakref

import torch.distributed as dist

from .base import POLL_SLICE_S, CommError

__all__ = ["STORE_ANSWER_S", "ActiveRound", "StoreChannel", "StoreJob", "read_abort"]

#: seconds the store may take to answer the abort channel before it counts as unresponsive
#: (at most the Comm timeout): a store that answers takes milliseconds
STORE_ANSWER_S = 1.0


class ActiveRound:
    """One round a TorchComm waits on (read by the channel thread)."""

    __slots__ = ("seq", "start", "label", "peers", "published", "ended", "beat", "suspect")

    def __init__(self, seq: int, label: str, peers: frozenset):
        self.seq = seq
        self.start = time.monotonic()
        self.label = label
        self.peers = peers
        self.published = False
        self.ended = False
        self.beat = 0                       # bumped at each publication of what it waits in
        self.suspect: tuple | None = None   # (peer, peer's seq, peer's label, peer's beat)


def same_scope(label: str, other: str) -> bool:
    """Whether two waits (``Comm.waiting_in``: "<scope> [#id] call <n>") are calls of one scope.

    Such a pair is a lag, never a reorder: a rank still in call n of a scope while its peer waits
    in call n + 1 has received the peer's messages of call n (the peer finished it) and waits on a
    third rank, stopped or slow. Only that third rank's silence decides, as a timeout. Calls of
    different scopes (reducer A on one rank, B on the other) are the reorder."""
    return label.rpartition(" call ")[0] == other.rpartition(" call ")[0] != ""


def read_abort(store) -> str | None:
    """The abort a rank published in ``store``, or None (a job for the channel thread)."""
    if not store.check(["abort"]):
        return None
    return store.get("abort").decode(errors="replace")


def _socket_fds() -> dict[int, str]:
    """This process's socket descriptors (fd -> "socket:[inode]"); empty where /proc is missing."""
    out = {}
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return out
    for name in names:
        try:
            link = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if link.startswith("socket:"):
            out[int(name)] = link
    return out


def _sock_ends(fd: int):
    """(local, peer) address of socket ``fd``, without taking it over, or None."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        return None
    try:
        return sock.getsockname(), sock.getpeername()
    except OSError:
        return None
    finally:
        sock.detach()


def _tcp_store(store):
    """The TCPStore under a chain of PrefixStores, or None."""
    for _ in range(16):
        if isinstance(store, dist.TCPStore):
            return store
        store = getattr(store, "underlying_store", None)
        if store is None:
            return None
    return None


def _listens_here(port: int) -> bool:
    """Whether this process holds the listening socket of TCP ``port`` (it hosts the store)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f, None)
                for line in f:
                    cols = line.split()
                    if len(cols) > 9 and cols[3] == "0A" and int(cols[1].rsplit(":", 1)[1], 16) == port:
                        inodes.add(f"socket:[{cols[9]}]")
        except OSError:
            continue
    return bool(inodes) and any(link in inodes for link in _socket_fds().values())


class StoreJob:
    """One store call queued for the channel thread: ``done`` is set once it ran, with its
    ``result`` or the exception it raised (``exc``)."""

    __slots__ = ("fn", "done", "result", "exc")

    def __init__(self, fn):
        self.fn = fn
        self.done = threading.Event()
        self.result = None
        self.exc: BaseException | None = None


class StoreChannel:
    """The abort channel of one TorchComm: a store connection of its own, touched by one
    thread only. Store calls on a stopped store host block and honour no timeout, so they
    block that thread and nothing else: callers :meth:`request` an answer and wait for it with
    a deadline; :meth:`close` shuts the connection down, which releases the thread."""

    def __init__(self, base, prefix: str, rank: int):
        self.base = base  # keeps the store alive (on its host: its server) while the Comm lives
        self.tcp = _tcp_store(base)
        self.sock: tuple[int, object] | None = None  # (fd, ends) of the own connection
        store = base
        try:
            before = _socket_fds()
            store = base.clone()  # a new connection (TCPStore), the same prefixes
            if self.tcp is not None:
                new = [fd for fd, link in _socket_fds().items() if before.get(fd) != link]
                mine = [(fd, ends) for fd in new if (ends := _sock_ends(fd)) is not None
                        and ends[1][1] == self.tcp.port]
                if len(mine) == 1:
                    self.sock = mine[0]
        except Exception:  # noqa: BLE001 - a store without clone(): share the default one
            store = base
        self.store = dist.PrefixStore(prefix, store)
        self.rank = rank
        self._hosts: bool | None = None
        self.busy_since: float | None = None  # when the store call in progress began
        self.dead: str | None = None          # the connection failed (the store's host exited)
        self._jobs: collections.deque[StoreJob] = collections.deque()
        self._cv = threading.Condition()
        self._stopping = False
        self.thread: threading.Thread | None = None

    def hosts_store(self) -> bool:
        """Whether this process hosts the store (holds its listening socket); looked up once."""
        if self._hosts is None:
            self._hosts = self.tcp is not None and _listens_here(self.tcp.port)
        return self._hosts

    def describe(self) -> str:
        """The store and its host, for error messages."""
        if self.tcp is None:
            return "the rendezvous store"
        where = f"the rendezvous store at {self.tcp.host}:{self.tcp.port}"
        if os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true":
            return where + " (hosted by the torchrun agent)"
        if os.environ.get("MASTER_PORT") == str(self.tcp.port):
            return where + " (hosted by rank 0: env:// rendezvous)"
        return where

    # -- the thread --------------------------------------------------------------------------
    def start(self, watch: weakref.WeakMethod) -> None:
        """Start the thread; between jobs it calls ``watch()`` (the Comm's look at its waiting
        round) every poll slice, and ends once the Comm is gone."""
        if self.thread is None:
            self.thread = threading.Thread(target=self._serve, args=(watch,), daemon=True,
                                           name=f"sparsecomm-channel-r{self.rank}")
            self.thread.start()

    def _serve(self, watch: weakref.WeakMethod) -> None:
        """Jobs first (in order), then a look for the Comm's waiting round every poll slice."""
        while True:
            with self._cv:
                if not self._jobs and not self._stopping:
                    self._cv.wait(POLL_SLICE_S)
                job = self._jobs.popleft() if self._jobs else None
                stopping = self._stopping
            if job is not None:
                try:
                    job.result = self.do(job.fn)
                except BaseException as exc:  # noqa: BLE001 - handed to the requester
                    job.exc = exc
                job.done.set()
                continue
            if stopping:
                return
            look = watch()
            if look is None:
                return
            try:
                look()
            except Exception:  # noqa: BLE001 - the store may be gone (its host died): keep waiting
                pass
            del look

    def do(self, fn):
        """Run ``fn(store)`` (on the channel thread only)."""
        if self.dead is not None:
            raise CommError(f"{self.describe()} is gone: {self.dead}")
        self.busy_since = time.monotonic()
        try:
            return fn(self.store)
        except dist.DistNetworkError as exc:
            self.dead = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise
        finally:
            self.busy_since = None

    # -- callers -------------------------------------------------------------------------------
    def request(self, fn, wait_s: float | None, watch: weakref.WeakMethod | None = None) -> StoreJob:
        """Queue ``fn(store)`` for the channel thread and wait up to ``wait_s`` seconds for it
        (None: do not wait; ``watch``: see :meth:`start`). ``job.done`` tells whether it answered."""
        job = StoreJob(fn)
        with self._cv:
            self._jobs.append(job)
            self._cv.notify()
        if self.thread is None and watch is not None:
            self.start(watch)
        if wait_s is not None:
            job.done.wait(max(wait_s, 0.0))
        return job

    def flush(self, wait_s: float) -> None:
        """Wait up to ``wait_s`` seconds for the queued jobs to run (not if the store is silent)."""
        if self.thread is not None and self._jobs and self.silent_for() < STORE_ANSWER_S:
            self.request(lambda store: None, wait_s)

    def silent_for(self) -> float:
        """Seconds the store call in progress has been waiting for its answer (0: none)."""
        since = self.busy_since
        return 0.0 if since is None else max(time.monotonic() - since, 0.0)

    def await_abort(self, grace_s: float, answer_s: float, seen, watch: weakref.WeakMethod
                    ) -> tuple[str | None, float]:
        """``(abort, silent)``: a peer's published abort if the store has one within ``grace_s``
        (``seen()``: one the channel thread read meanwhile), else None. The store gets
        ``answer_s`` seconds (less what it has already been silent) to answer each look; if it
        does not, ``silent`` says for how long it has been silent (0.0 otherwise)."""
        end = time.monotonic() + grace_s
        while True:
            remote = seen()
            if remote is not None:
                return remote, 0.0
            job = self.request(read_abort, max(end - time.monotonic(), answer_s - self.silent_for()), watch)
            if not job.done.is_set():
                return None, self.silent_for()
            if job.exc is not None:
                return None, 0.0
            if job.result is not None:
                return job.result, 0.0
            if time.monotonic() >= end:
                return None, 0.0
            time.sleep(0.01)

    def wait_for_readers(self, readers: int, deadline: float, watch: weakref.WeakMethod) -> None:
        """Wait until ``deadline`` at most for ``readers`` ranks to have counted themselves
        among the readers of the abort (or for the store to stop answering)."""
        while time.monotonic() < deadline:
            job = self.request(lambda store: store.add("seen", 0), deadline - time.monotonic(), watch)
            if not job.done.is_set() or job.exc is not None or int(job.result) >= readers:
                return
            time.sleep(0.01)

    # -- what a waiting round publishes (channel thread only) ---------------------------------
    def publish_wait(self, active: ActiveRound) -> None:
        """Publish what this rank waits in: the round, its peers, the call's label, the beat."""
        peers = ",".join(str(q) for q in sorted(active.peers))
        mine = f"{active.seq}|{peers}|{active.label}|{active.beat}"
        self.do(lambda store: store.set(f"wait/{self.rank}", mine))

    def clear_wait(self) -> None:
        self.do(lambda store: store.set(f"wait/{self.rank}", ""))

    def conflicting_wait(self, active: ActiveRound) -> tuple | None:
        """The first peer of ``active`` that has published a wait on this rank in another call:
        ``(peer, its round, its call's label, its beat)``, or None."""
        for q in sorted(active.peers):
            key = f"wait/{q}"
            text = self.do(lambda store: store.get(key) if store.check([key]) else b"").decode(errors="replace")
            seq, _, rest = text.partition("|")
            their_peers, _, rest = rest.partition("|")
            label, _, beat = rest.rpartition("|")
            if seq and str(self.rank) in their_peers.split(",") and label != active.label \
                    and not same_scope(label, active.label):
                return (q, seq, label, beat)
        return None

    # -- ending ----------------------------------------------------------------------------------
    def stop(self) -> None:
        """Ask the thread to end after its queued jobs, without waiting for it."""
        with self._cv:
            self._stopping = True
            self._cv.notify()

    def close(self) -> bool:
        """Stop the thread (after its queued jobs, within about a second); if it is blocked in
        a store call, shut the connection down to release it. True when the thread is gone."""
        self.stop()
        thread = self.thread
        if thread is not None:
            thread.join(0.2)
            if thread.is_alive():
                self.shutdown()
                thread.join(1.0)
            if thread.is_alive():
                return False
        self.thread = None
        self._jobs.clear()
        self.store = self.base = self.tcp = None  # the connection closes with the last reference
        return True

    def shutdown(self) -> None:
        """Shut the own connection down (a blocked store call returns with an error)."""
        if self.sock is None:
            return
        fd, ends = self.sock
        if _sock_ends(fd) != ends:  # the descriptor is no longer our connection
            return
        sock = socket.socket(fileno=fd)
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        finally:
            sock.detach()
