"""MPIComm checks, run by tests/test_comm_mpi.py under ``mpirun -np P``.

    mpirun -np P python tests/_mpi_program.py checks OUT_DIR
    mpirun -np P python tests/_mpi_program.py timeout OUT_DIR SECONDS
    mpirun -np P python tests/_mpi_program.py fail OUT_DIR      (a ValueError on rank 1)
    mpirun -np P python tests/_mpi_program.py reorder OUT_DIR   (ranks call reducers in other orders)
    mpirun -np P python tests/_mpi_program.py argument OUT_DIR  (rank 1 passes a wrong out=)
    mpirun --enable-recovery -np P python tests/_mpi_program.py fault OUT_DIR ALGORITHM kill|stop SEED TIMEOUT
                                                       (tests/_faults.py: a rank SIGKILLs / SIGSTOPs itself)

Each rank writes ``OUT_DIR/rank<r>.json`` (one JSON object; files rather than stdout so
mpirun's output forwarding can never interleave two ranks' lines) and prints one line
``sparsecomm-mpi rank r/P ok`` or the traceback. A rank that raises writes its traceback
and aborts the job, so the other ranks never hang.
"""

from __future__ import annotations

import json
import os
import sys
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), HERE]

import numpy as np  # noqa: E402
import torch  # noqa: E402
from mpi4py import MPI  # noqa: E402

import _comm_checks as cc  # noqa: E402


def isolation(comm) -> dict:
    """A user message on COMM_WORLD with sparsecomm's tag and size must not be taken by
    MPIComm (its duplicate communicator), nor MPIComm's by the user."""
    from sparsecomm.comm import mpi_comm

    world, r = MPI.COMM_WORLD, comm.rank
    if comm.size < 2 or r > 1:
        return {}
    user = np.full(5, 0xAB, dtype=np.uint8)
    if r == 0:
        world.Send([user, MPI.BYTE], dest=1, tag=mpi_comm.SPARSECOMM_TAG)
        comm.exchange([(1, cc.payload(0, 1, 4, 5))], [])
        return {}
    buf = torch.empty(5, dtype=torch.uint8)
    comm.exchange([], [(0, buf)])
    got_user = np.empty(5, dtype=np.uint8)
    world.Recv([got_user, MPI.BYTE], source=0, tag=mpi_comm.SPARSECOMM_TAG)
    return {"isolation_comm": cc._hex(buf), "isolation_user": got_user.tobytes().hex()}


FAIL_ALGORITHMS = ["topka", "spardl", "dense", "gtopk"]


def _outcome(fn) -> dict:
    import time

    from sparsecomm.comm.base import CommError

    t0 = time.monotonic()
    try:
        fn()
        return {"type": None, "s": time.monotonic() - t0}
    except Exception as exc:  # noqa: BLE001 - reported to the test
        return {"type": type(exc).__name__, "msg": str(exc), "comm_error": isinstance(exc, CommError),
                "s": time.monotonic() - t0}


def _raise_on_call(*args, **kwargs):
    raise ValueError("injected failure on this rank")


def fail_together(mode: str) -> dict:
    """Each case on a fresh MPIComm (an abort breaks a Comm): ``fail`` -- rank 1 raises inside
    a call; ``reorder`` -- rank 0 calls reducers A, B and rank 1 calls B, A."""
    from sparsecomm import SparseAllreduce
    from sparsecomm.comm.mpi_comm import MPIComm

    out: dict = {"rank": MPI.COMM_WORLD.Get_rank()}
    n = 4096
    for alg in FAIL_ALGORITHMS:
        comm = MPIComm(timeout=60)
        a, b = SparseAllreduce(alg, 0.05, comm=comm), SparseAllreduce(alg, 0.05, comm=comm)
        ga, gb = torch.randn(n), torch.randn(2 * n)
        a(ga), b(gb)
        MPI.COMM_WORLD.Barrier()
        if mode == "fail":
            if comm.rank == 1:
                a.algorithm.reduce = _raise_on_call
            out[alg] = _outcome(lambda: a(ga))
            out[alg + "/later"] = _outcome(lambda: b(gb))
        else:
            calls = [lambda: a(ga), lambda: b(gb)]
            out[alg] = _outcome(lambda: [call() for call in (calls if comm.rank == 0 else calls[::-1])])
        MPI.COMM_WORLD.Barrier()
    return out


def argument_error() -> dict:
    """Rank 1 passes a wrong ``out`` (caught before anything is sent): ValueError there,
    CommAbortedError elsewhere. (A reducer reused for another N is no argument error: the
    call's agreement record names it on every rank, tests/test_agreement.py.)"""
    from sparsecomm import SparseAllreduce
    from sparsecomm.comm.mpi_comm import MPIComm

    out: dict = {"rank": MPI.COMM_WORLD.Get_rank()}
    n = 4096
    for alg in ("topka", "spardl"):
        reducer = SparseAllreduce(alg, 0.05, comm=MPIComm(timeout=60))
        reducer(torch.randn(n))
        MPI.COMM_WORLD.Barrier()
        out[alg] = _outcome(lambda: reducer(torch.randn(n), out=torch.empty(n - 1 if reducer.comm.rank == 1 else n)))
        MPI.COMM_WORLD.Barrier()
    return out


def fault(out_dir: str, algorithm: str, kind: str, seed: int, timeout: float) -> None:
    """One fault run (tests/_faults.py); the victim's pid and signal time, and each survivor's
    report, go through files in OUT_DIR. Writes rank<r>.json itself, before telling rank 0."""
    import random
    import signal
    import time

    from _faults import faulted_rank

    from sparsecomm.comm.mpi_comm import MPIComm

    rank, size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
    rng = random.Random(seed)
    victim, delay = rng.randrange(1, size), rng.uniform(0.02, 0.4)
    path = lambda name: os.path.join(out_dir, name)  # noqa: E731
    if rank == victim:
        with open(path("victim_pid"), "w") as f:
            f.write(str(os.getpid()))

    def mark(t: float) -> None:
        with open(path("signalled_at.tmp"), "w") as f:
            f.write(repr(t))
        os.replace(path("signalled_at.tmp"), path("signalled_at"))

    def done(outcome: dict) -> None:
        with open(path("signalled_at")) as f:  # written by the victim before it signalled itself
            signalled_at = float(f.read())
        with open(path(f"rank{rank}.json"), "w") as f:
            json.dump({**outcome, "rank": rank, "victim": victim, "delay": delay, "signalled_at": signalled_at}, f)
        open(path(f"done{rank}"), "w").close()
        if rank == 0:  # the run must end: a stopped victim is killed once every survivor reported
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not all(
                    os.path.exists(path(f"done{r}")) for r in range(size) if r != victim):
                time.sleep(0.01)
            with open(path("victim_pid")) as f:
                try:
                    os.kill(int(f.read()), signal.SIGKILL)
                except ProcessLookupError:
                    pass

    faulted_rank(MPIComm(timeout=timeout), algorithm, victim, kind, delay, mark, done)


def main() -> None:
    mode, out_dir = sys.argv[1], sys.argv[2]
    rank = MPI.COMM_WORLD.Get_rank()
    try:
        torch.set_num_threads(1)
        from sparsecomm.comm.mpi_comm import MPIComm

        if mode == "checks":
            comm = MPIComm()
            out = cc.run_checks(comm)
            out["timeout"] = comm.timeout
            out["can_probe"] = comm.can_probe
            out.update(isolation(comm))
            comm.barrier()
            comm.close()
        elif mode == "timeout":
            seconds = float(sys.argv[3])
            out = cc.run_timeout(MPIComm(timeout=seconds), seconds, settle=2 * seconds + 1.5)
        elif mode in ("fail", "reorder"):
            out = fail_together(mode)
        elif mode == "argument":
            out = argument_error()
        elif mode == "fault":
            fault(out_dir, sys.argv[3], sys.argv[4], int(sys.argv[5]), float(sys.argv[6]))
            # the job lost a rank: MPI_Finalize (at interpreter exit) would wait for it forever
            sys.stdout.flush()
            os._exit(0)
        else:
            raise SystemExit(f"unknown mode {mode!r}")
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump(out, f)
        print(f"sparsecomm-mpi rank {rank}/{MPI.COMM_WORLD.Get_size()} ok", flush=True)
    except BaseException:
        tb = traceback.format_exc()
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump({"rank": rank, "error": tb}, f)
        print(f"sparsecomm-mpi rank {rank} failed:\n{tb}", flush=True)
        MPI.COMM_WORLD.Abort(1)


if __name__ == "__main__":
    main()
