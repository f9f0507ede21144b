"""One rank of the fault suite's env:// and torchrun runs (tests/test_fault_suite.py).

Started as a plain process per rank with ``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT``
(``init_process_group`` with env:// rendezvous: rank 0 hosts the TCPStore, as under
``python -m sparsecomm.launch``) or by ``python -m torch.distributed.run`` (its agent hosts the
store). The ranks talk to the test through files in ``--dir`` only (the store may be frozen):

``stop``  -- for each algorithm: a Comm, the handshake call, a barrier, then rank 0 writes
            ``<alg>.ready`` and every rank calls the reducer in a loop until it raises. The test
            SIGSTOPs rank 0, waits for the survivors' ``<alg>.r<rank>.json`` (what they raised, when,
            and their thread count before the Comm and after ``close()``), then SIGCONTs rank 0;
            rank 0 reports too, and every rank goes on to the next algorithm after a barrier of the
            default group.
``fail``  -- rank ``--failing`` (default 0) raises a ValueError inside call 2 of the reducer.
            Rank 0 lets its error (its own, or the failing peer's CommAbortedError) propagate
            (``--exit raise``: the interpreter exits with it) or ends the process at once
            (``--exit now``: ``os._exit(1)``, no atexit; ``--exit kill``: SIGKILL to itself); the
            store goes with it under env://. The other ranks report what they raised.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time

import torch
import torch.distributed as dist

N = 4096
DENSITY = 0.05


def _write(path: str, data: dict) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(data, f)
    os.replace(path + ".tmp", path)


def _outcome(exc: BaseException | None) -> dict:
    from sparsecomm.comm.base import CommAbortedError, CommError, CommTimeoutError

    if exc is None:
        return {"type": None, "at": time.time()}
    return {"type": type(exc).__name__, "msg": str(exc)[:2000], "at": time.time(),
            "comm_error": isinstance(exc, CommError), "timeout_error": isinstance(exc, CommTimeoutError),
            "aborted": isinstance(exc, CommAbortedError)}


def _loop(reducer, grad, hang_s: float, reraise: bool = False):
    start = time.monotonic()
    try:
        while time.monotonic() - start < hang_s:
            reducer(grad)
    except Exception as exc:  # noqa: BLE001 - reported to the test
        if reraise:
            raise
        return exc
    return None


def stop(args, rank: int, world: int) -> None:
    from sparsecomm import SparseAllreduce
    from sparsecomm.comm.torch_comm import TorchComm

    grad = torch.randn(N, generator=torch.Generator().manual_seed(rank))
    for alg in args.algorithms.split(","):
        threads_before = threading.active_count()
        comm = TorchComm(timeout=args.timeout)
        reducer = SparseAllreduce(alg, DENSITY, comm=comm)
        reducer(grad)  # the handshake, on every rank
        comm.barrier()
        if rank == 0:
            _write(os.path.join(args.dir, f"{alg}.ready"), {"pid": os.getpid()})
        exc = _loop(reducer, grad, args.hang)
        out = _outcome(exc)
        if rank != 0:
            comm.close()  # while rank 0 may still be stopped: releases the channel thread
            out["threads_before"], out["threads_after"] = threads_before, threading.active_count()
        # rank 0 keeps its broken Comms until the exit (closing one waits for its readers)
        _write(os.path.join(args.dir, f"{alg}.r{rank}.json"), out)
        del reducer
        dist.barrier()  # every rank (rank 0 once the test has resumed it) before the next algorithm


def fail(args, rank: int, world: int) -> None:
    from sparsecomm import SparseAllreduce
    from sparsecomm.comm.torch_comm import TorchComm

    alg = args.algorithms
    reducer = SparseAllreduce(alg, DENSITY, comm=TorchComm(timeout=args.timeout))
    grad = torch.randn(N, generator=torch.Generator().manual_seed(rank))
    reducer(grad)
    reducer.comm.barrier()
    if rank == args.failing:
        def broken(*a, **k):
            raise ValueError("injected failure on the store's host" if rank == 0 else
                             f"injected failure on rank {rank}")
        reducer.algorithm.reduce = broken
    if rank == 0:
        if args.exit == "raise":
            _loop(reducer, grad, args.hang, reraise=True)  # the process exits with the error (exit code 1)
        _loop(reducer, grad, args.hang)
        if args.exit == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        os._exit(1)  # the process ends at once (no atexit), and the store with it
    exc = _loop(reducer, grad, args.hang)
    _write(os.path.join(args.dir, f"{alg}.r{rank}.json"), _outcome(exc))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["stop", "fail"])
    parser.add_argument("--dir", required=True)
    parser.add_argument("--algorithms", required=True)
    parser.add_argument("--timeout", type=float, default=2.0)
    parser.add_argument("--hang", type=float, default=60.0)
    parser.add_argument("--exit", choices=["raise", "now", "kill"], default="raise")
    parser.add_argument("--failing", type=int, default=0)
    args = parser.parse_args()
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    dist.init_process_group("gloo")  # env:// (or torchrun's variables)
    rank, world = dist.get_rank(), dist.get_world_size()
    _write(os.path.join(args.dir, f"pid{rank}"), {"pid": os.getpid()})
    (stop if args.mode == "stop" else fail)(args, rank, world)
    if args.mode == "stop":
        dist.destroy_process_group()
    sys.stdout.flush()


if __name__ == "__main__":
    main()
