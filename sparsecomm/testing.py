"""Helpers to run a function on several torch.distributed ranks from one test.

:func:`spawn` starts ``world_size`` processes (``multiprocessing`` *forkserver* context
with torch preloaded, or *spawn*; never a fork of the caller),
joins them into one process group over loopback and runs ``fn(rank, world_size, *args,
**kwargs)`` in each. It returns every rank's return value in rank order, or raises
:class:`SpawnError` carrying the failing rank's full traceback, or :class:`TimeoutError`
(after killing every child) when the whole run takes longer than ``timeout`` seconds.

The rendezvous store is a :class:`torch.distributed.TCPStore` created by the parent on
a port the kernel picks (port 0), so concurrent test runs on one machine never race for
a port. ``MASTER_ADDR``/``MASTER_PORT`` are still set in the children for code that
reads them.

Return values travel back to the parent with pickle: this is between our own test
processes, never between peers of a sparsecomm algorithm.

A benchmark or example runs either way: as one rank a launcher started (:func:`launched`:
torchrun, ``python -m sparsecomm.launch``), or starting its ranks itself with :func:`spawn`;
:func:`run_ranks` takes whichever branch applies.
"""

from __future__ import annotations

import os
import pickle
import socket
import time
import traceback
from datetime import timedelta
from typing import Any, Callable

__all__ = ["spawn", "free_port", "SpawnError", "launched", "run_ranks"]

_LOOPBACK = "127.0.0.1"


class SpawnError(RuntimeError):
    """A rank started by :func:`spawn` raised or died.

    ``rank`` is the first rank that failed; ``failures`` maps every failed rank that
    reported before the others were stopped to its traceback text (or exit description).
    """

    def __init__(self, message: str, rank: int, failures: dict[int, str]):
        super().__init__(message)
        self.rank = rank
        self.failures = failures


def free_port(host: str = _LOOPBACK) -> int:
    """A TCP port that was free on ``host`` a moment ago (bind to port 0, then close).

    Another process may take it before you bind it again; :func:`spawn` itself avoids
    that race by letting its store bind port 0 directly.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _child(rank: int, world_size: int, backend: str, port: int, timeout: float,
           fn: Callable[..., Any], args: tuple, kwargs: dict, conn) -> None:
    """Body of one spawned rank: init the group, run ``fn``, send back the outcome."""
    try:
        os.environ["MASTER_ADDR"] = _LOOPBACK
        os.environ["MASTER_PORT"] = str(port)
        os.environ["RANK"] = str(rank)
        os.environ["WORLD_SIZE"] = str(world_size)
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        if backend == "nccl":
            torch.cuda.set_device(rank % torch.cuda.device_count())
        store = dist.TCPStore(_LOOPBACK, port, world_size, is_master=False,
                              timeout=timedelta(seconds=timeout), wait_for_workers=False)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=timeout))
    except BaseException:
        conn.send(("err", traceback.format_exc()))
        conn.close()
        return
    try:
        result = fn(rank, world_size, *args, **kwargs)
        try:
            # by value (plain pickle), not through the connection's pickler: torch registers
            # reductions there that send a tensor as a shared-memory handle, which the parent can
            # only open while this process lives -- a child exiting first (a loaded machine) made
            # the parent's recv fail with "Connection reset by peer"
            conn.send(("ok", pickle.dumps(result)))
        except Exception:  # unpicklable return value
            conn.send(("err", traceback.format_exc()))
    except BaseException:
        conn.send(("err", traceback.format_exc()))
    finally:
        conn.close()
        try:
            dist.destroy_process_group()
        except Exception:
            pass


def _stop(procs) -> None:
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + 2.0
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(1.0)


def _context(start_method: str):
    import multiprocessing as mp

    if start_method == "forkserver" and "forkserver" not in mp.get_all_start_methods():
        start_method = "spawn"
    ctx = mp.get_context(start_method)
    if start_method == "forkserver":
        # The fork server imports torch once; every child forks from it with torch already
        # loaded (about 0.1 s per child instead of seconds on a busy 2-core machine). It is
        # a clean single-threaded process, unlike the parent, so this is as safe as spawn.
        ctx.set_forkserver_preload(["torch", "torch.distributed"])
    return ctx


def spawn(fn: Callable[..., Any], world_size: int, *args: Any, backend: str = "gloo",
          timeout: float = 120.0, start_method: str = "forkserver", may_die: Any = (), **kwargs: Any) -> list:
    """Run ``fn(rank, world_size, *args, **kwargs)`` on ``world_size`` fresh processes.

    ``start_method`` is ``"forkserver"`` (default where available: a fork server that
    has imported torch once forks each child, which is what keeps start-up fast) or
    ``"spawn"`` (a fresh interpreter per child). Neither forks the calling process, so
    its threads and state never leak into the ranks; with the fork server, environment
    variables set in the caller after the server started are not seen by the children.

    Each child sets ``torch.set_num_threads(1)``, joins a ``backend`` process group
    (CPU and loopback for gloo; for NCCL each child takes GPU ``rank % device_count``)
    whose timeout is ``timeout``, runs ``fn`` and destroys the group. ``fn`` must be a
    picklable top-level function and its return values picklable.

    ``may_die`` -- ranks expected to die (e.g. SIGKILL themselves in a fault test): their
    return value is ``None`` and their death is not a failure.

    Returns the return values in rank order. Raises :class:`SpawnError` (with the first
    failing rank's traceback text in its message) when a rank raises or dies; the other
    ranks get a short grace period to report and are then killed. Raises
    :class:`TimeoutError` after killing every child when the whole run exceeds
    ``timeout`` seconds.
    """
    from multiprocessing.connection import wait

    import torch.distributed as dist

    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if not timeout > 0:
        raise ValueError(f"timeout must be positive seconds, got {timeout!r}")
    start = time.monotonic()
    deadline = start + timeout
    # The parent owns the store server on a kernel-chosen port: no port race.
    store = dist.TCPStore(_LOOPBACK, 0, world_size, is_master=True,
                          timeout=timedelta(seconds=timeout), wait_for_workers=False)
    port = store.port
    ctx = _context(start_method)
    procs, conns = [], []
    try:
        for rank in range(world_size):
            reader, writer = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_child, name=f"sparsecomm-rank{rank}", daemon=True,
                            args=(rank, world_size, backend, port, timeout, fn, args, kwargs, writer))
            p.start()
            writer.close()
            procs.append(p)
            conns.append(reader)

        results: dict[int, Any] = {}
        failures: dict[int, str] = {}
        first_failure: int | None = None
        grace_until = None
        pending = set(range(world_size))
        while pending:
            now = time.monotonic()
            limit = deadline if grace_until is None else min(deadline, grace_until)
            if now >= limit:
                break
            waitables = {conns[r]: r for r in pending}
            waitables.update({procs[r].sentinel: r for r in pending})
            ready = wait(list(waitables), timeout=limit - now)
            for obj in ready:
                r = waitables[obj]
                if r not in pending:
                    continue
                conn = conns[r]
                if conn.poll():
                    try:
                        status, value = conn.recv()
                    except EOFError:
                        status, value = "err", None
                else:
                    # sentinel fired with nothing to read: the process died silently
                    if obj is not procs[r].sentinel:
                        continue
                    status, value = "err", None
                if status == "err" and value is None:
                    procs[r].join(1.0)
                    if r in may_die:
                        pending.discard(r)
                        results[r] = None
                        continue
                    value = f"rank {r} exited without a result (exit code {procs[r].exitcode})"
                pending.discard(r)
                if status == "ok":
                    results[r] = pickle.loads(value)   # this harness's own child, pickled above
                else:
                    failures[r] = value
                    if first_failure is None:
                        first_failure = r
                        grace_until = time.monotonic() + 1.0
        if first_failure is not None:
            others = sorted(set(failures) - {first_failure})
            msg = (f"rank {first_failure} of {world_size} failed in {getattr(fn, '__name__', fn)}:\n"
                   f"{failures[first_failure]}")
            if others:
                msg += f"\n(ranks {others} failed too; see .failures)"
            if pending:
                msg += f"\n(ranks {sorted(pending)} did not finish and were killed)"
            raise SpawnError(msg, first_failure, failures)
        if pending:
            raise TimeoutError(f"spawn({getattr(fn, '__name__', fn)}, world_size={world_size}): "
                               f"ranks {sorted(pending)} did not finish within {timeout} s; "
                               f"all children killed")
        for p in procs:
            p.join(max(0.1, deadline - time.monotonic()))
        return [results[r] for r in range(world_size)]
    finally:
        _stop(procs)
        for c in conns:
            c.close()
        del store


def launched() -> bool:
    """Whether a launcher started this process as one rank of a job: torchrun, ``python -m
    sparsecomm.launch``, ``accelerate launch`` and the like set RANK and WORLD_SIZE."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def run_ranks(fn: Callable[..., Any], nproc: int, *args: Any, timeout: float) -> list:
    """``fn(rank, world_size, *args)`` on every rank: this process's rank when :func:`launched`,
    else ``nproc`` ranks started here with :func:`spawn`.

    Launched, this process joins the launcher's gloo group (``env://``, ``timeout`` seconds),
    runs ``fn`` once and leaves the group, and the list holds its own return value alone.
    Spawned, ``timeout`` bounds the whole run as in :func:`spawn`, and the list holds every
    rank's return value in rank order. So ``[0]`` is rank 0's value wherever rank 0's report
    is printed: in rank 0 when launched, in this process when spawned.
    """
    if not launched():
        return spawn(fn, nproc, *args, timeout=timeout)
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
    try:
        return [fn(dist.get_rank(), dist.get_world_size(), *args)]
    finally:
        dist.destroy_process_group()
