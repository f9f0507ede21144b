"""The background thread that runs gradient-bucket collectives in order.

Shared by the DDP hook (:mod:`sparsecomm.hooks.ddp`, ``async_comm=True``) and PyTorch's
PowerSGD hook off NCCL (:mod:`sparsecomm.bench.baselines`): each queues one job per bucket, in
bucket order (the same on every rank, so the ranks' collectives pair up), and DDP waits on
the job's Future in ``loss.backward()``.
"""

from __future__ import annotations

import atexit
import queue
import threading
import weakref
from typing import Any, Callable

import torch

__all__ = ["BucketWorker", "fail_future"]


class _Failure:
    """What a failed job's Future holds: DDP's C++ reducer casts a hook's result to a
    tensor, and pybind's cast error calls ``str()`` on it, which re-raises the original
    exception -- so ``loss.backward()`` raises the job's own exception (ValueError,
    CommError, CommTimeoutError...), not ``RuntimeError: Unable to cast ... to Tensor``.
    ``Future.wait()`` in Python raises it too (the unwrap function)."""

    __slots__ = ("exc",)

    def __init__(self, exc: BaseException):
        self.exc = exc

    def __str__(self) -> str:
        raise self.exc

    __repr__ = __str__


def _raise_failure(result: Any) -> Any:
    if isinstance(result, _Failure):
        raise result.exc
    return result


def fail_future(future: torch.futures.Future, exc: BaseException) -> None:
    """Complete ``future`` with ``exc`` so that both Python's ``wait()`` and DDP raise it
    with its own type (``Future.set_exception`` makes DDP raise "Unable to cast")."""
    future._set_unwrap_func(_raise_failure)
    future.set_result(_Failure(exc))


def _later_failure(first: BaseException) -> BaseException:
    """The error of a job skipped after ``first``: the same family of type, naming it."""
    from ..comm.base import CommError

    message = (f"sparsecomm: an earlier bucket's communication failed ({type(first).__name__}: {first}); "
               "this rank stops communicating")
    for cls in (CommError, ValueError, TypeError):
        if isinstance(first, cls):
            return cls(message)
    return RuntimeError(message)


_LIVE_WORKERS: "weakref.WeakSet[BucketWorker]" = weakref.WeakSet()


@atexit.register
def _stop_live_workers() -> None:
    # A worker thread that ran kernels owns thread-local runtime state (e.g. an OpenMP team);
    # left running into interpreter shutdown it sometimes aborted the process ("terminate
    # called without an active exception"). Let every worker return before shutdown; the
    # bound keeps a worker stuck on a dead peer from holding the exit past its own timeout.
    for worker in list(_LIVE_WORKERS):
        worker.stop(timeout=30.0)


class BucketWorker:
    """One daemon thread running queued (job, future) pairs in FIFO order.

    A job's result or exception is set on its future (with :func:`fail_future`, so the
    exception keeps its type through DDP). After a job has failed, every later
    job fails at once with an error naming the first failure, without running: a rank whose
    collective failed must not issue further collectives that would pair with other ranks'
    earlier ones.
    """

    def __init__(self) -> None:
        self._queue: queue.Queue = queue.Queue()
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="sparsecomm-ddp-hook", daemon=True)
        self._thread.start()
        _LIVE_WORKERS.add(self)

    def alive(self) -> bool:
        return self._thread.is_alive()

    def submit(self, job: Callable[[], Any], future: torch.futures.Future) -> None:
        self._queue.put((job, future))

    def drain(self) -> None:
        """Wait until every queued job has run (a no-op on the worker's own thread)."""
        if threading.current_thread() is not self._thread:
            self._queue.join()

    def stop(self, timeout: float | None = None) -> None:
        """Let the queued jobs run, then end the thread (waiting at most ``timeout`` seconds)."""
        self._queue.put(None)
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)
        _LIVE_WORKERS.discard(self)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                job, future = item
                if self._failure is not None:
                    fail_future(future, _later_failure(self._failure))
                    continue
                try:
                    future.set_result(job())
                except BaseException as exc:  # noqa: BLE001  (reaches the training loop via the Future)
                    self._failure = exc
                    fail_future(future, exc)
            finally:
                self._queue.task_done()
