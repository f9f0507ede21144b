"""One rank of a fault run, shared by the gloo test (tests/test_fail_together.py, through
``sparsecomm.testing.spawn``) and the MPI program (tests/_mpi_program.py, under mpirun).

Every rank calls one reducer in a loop. On rank ``victim`` a timer thread sends the process
SIGKILL or SIGSTOP ``delay_s`` after the loop starts: a random point of some call (inside a
round, between rounds, inside a kernel). Each survivor reports what it raised, whether that
is a CommError / CommTimeoutError, and when (wall clock, compared with the victim's own record
of the moment it signalled itself). A survivor that raises nothing within ``hang_s`` reports a
hang instead of hanging the test. A SIGSTOPped victim is SIGKILLed by rank 0 once every
survivor has reported (the run must end); a stop is therefore always seen as a stop.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from typing import Callable

import torch

N = 4096
DENSITY = 0.05
#: fault runs per (algorithm, fault) in a test run (SPARSECOMM_FAULT_RUNS; docs/reliability.md's counts used 5)
FAULT_RUNS = int(os.environ.get("SPARSECOMM_FAULT_RUNS", "1"))
#: the Comm timeout of the fault runs: a stopped peer surfaces after it
FAULT_TIMEOUT_S = 2.0
#: what "together" means: every survivor has raised within the timeout + this many seconds
LIMIT_S = 2.0
SIGNALS = {"kill": signal.SIGKILL, "stop": signal.SIGSTOP}


def faulted_rank(comm, algorithm: str, victim: int, fault: str, delay_s: float,
                 mark: Callable[[float], None], done: Callable[[dict], None], hang_s: float = 30.0) -> dict:
    """Run the loop on this rank of ``comm``. ``mark(t)`` records the victim's signal time
    (called by the victim just before it signals itself); ``done(outcome)`` reports a
    survivor's outcome (rank 0's ``done`` then waits for all and kills a stopped victim)."""
    from sparsecomm import SparseAllreduce
    from sparsecomm.comm.base import CommError, CommTimeoutError

    reducer = SparseAllreduce(algorithm, DENSITY, comm=comm)
    grad = torch.randn(N, generator=torch.Generator().manual_seed(comm.rank))
    reducer(grad)  # the handshake, on every rank
    comm.barrier()
    if comm.rank == victim:
        def fire():
            mark(time.time())
            os.kill(os.getpid(), SIGNALS[fault])
        threading.Timer(delay_s, fire).start()
    start = time.monotonic()
    calls = 0
    outcome: dict
    try:
        while time.monotonic() - start < hang_s:
            reducer(grad)
            calls += 1
        outcome = {"type": None, "hang": True}
    except Exception as exc:  # noqa: BLE001 - reported to the test
        outcome = {"type": type(exc).__name__, "msg": str(exc)[:500], "comm_error": isinstance(exc, CommError),
                   "timeout_error": isinstance(exc, CommTimeoutError), "hang": False}
    outcome.update(at=time.time(), calls=calls)
    if comm.rank == victim:  # a stopped victim gets here only if the signal came after the loop
        return outcome
    done(outcome)
    return outcome


def summarize(outcomes: list[dict], killed_at: float) -> dict:
    """Counts and latencies of one run's survivors (seconds after the signal)."""
    latencies = [o["at"] - killed_at for o in outcomes if not o.get("hang")]
    return {"survivors": len(outcomes), "hangs": sum(bool(o.get("hang")) for o in outcomes),
            "raw": sum(not o.get("comm_error", False) for o in outcomes if not o.get("hang")),
            "timeouts": sum(bool(o.get("timeout_error")) for o in outcomes),
            "max_s": max(latencies, default=float("nan")), "types": sorted({o["type"] or "-" for o in outcomes})}


def check_fault_runs(runs: list[tuple[list[dict], float]], fault: str, timeout_s: float) -> list[dict]:
    """Every survivor of every run raised a CommError (never a hang or a raw backend error),
    a CommTimeoutError for a stopped peer, within the Comm timeout + LIMIT_S of the signal."""
    summaries = []
    for outcomes, signalled_at in runs:
        summary = summarize(outcomes, signalled_at)
        assert summary["hangs"] == 0 and summary["raw"] == 0, (summary, outcomes)
        if fault == "stop":
            assert summary["timeouts"] == summary["survivors"], (summary, outcomes)
        assert summary["max_s"] < timeout_s + LIMIT_S, (summary, outcomes)
        summaries.append(summary)
    return summaries
