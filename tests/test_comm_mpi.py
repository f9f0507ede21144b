"""MPIComm under mpirun (marker ``mpi``): tests/_mpi_program.py runs the shared checks of
``_comm_checks`` on every rank and writes one JSON object per rank; the references of
``_comm_reference`` are computed here. MPI probes, so ``exchange_var`` costs one round.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys

import pytest

import _comm_reference as ref

pytestmark = pytest.mark.mpi

HERE = os.path.dirname(os.path.abspath(__file__))
PROGRAM = os.path.join(HERE, "_mpi_program.py")
MPIRUN = shutil.which("mpirun")
HAVE_MPI4PY = importlib.util.find_spec("mpi4py") is not None
RUN_TIMEOUT = 90  # seconds for one mpirun job (start-up imports torch on every rank)

needs_mpi = pytest.mark.skipif(
    MPIRUN is None or not HAVE_MPI4PY,
    reason="needs mpirun on PATH and mpi4py (pip install 'mpi4py>=3.1') "
           f"[mpirun: {MPIRUN or 'missing'}, mpi4py: {'ok' if HAVE_MPI4PY else 'missing'}]")


def mpirun(np_: int, out_dir, *args: str, may_die: tuple[int, ...] = ()) -> list[dict]:
    """Run the program's mode ``args[0]`` on ``np_`` ranks; every rank's JSON, in rank order.
    Ranks in ``may_die`` (killed by a fault test) write nothing and are left out; the job
    then runs with ``--enable-recovery`` (mpirun would otherwise stop the survivors when a
    rank dies) and its exit status is not checked."""
    recovery = ["--enable-recovery"] if may_die else []
    cmd = [MPIRUN, "--allow-run-as-root", "--oversubscribe", *recovery, "-np", str(np_),
           sys.executable, PROGRAM, *args[:1], str(out_dir), *args[1:]]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT, env=env)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"{' '.join(cmd)} did not finish within {RUN_TIMEOUT} s:\n"
                             f"{e.stdout}\n{e.stderr}") from None
    outs, problems = [], []
    for r in range(np_):
        if r in may_die:
            continue
        path = os.path.join(out_dir, f"rank{r}.json")
        if not os.path.exists(path):
            problems.append(f"rank {r} wrote no result")
            continue
        with open(path) as f:
            out = json.load(f)
        if "error" in out:
            problems.append(f"rank {r} failed:\n{out['error']}")
        outs.append(out)
    if (proc.returncode != 0 and not may_die) or problems:
        raise AssertionError(f"{' '.join(cmd)} exited {proc.returncode}\n" + "\n".join(problems)
                             + f"\n--- stdout ---\n{proc.stdout[-4000:]}\n--- stderr ---\n{proc.stderr[-4000:]}")
    assert [o["rank"] for o in outs] == [r for r in range(np_) if r not in may_die]
    return outs


_RUNS: dict[int, object] = {}


def results(P: int, tmp_path_factory) -> list[dict]:
    if P not in _RUNS:
        try:
            _RUNS[P] = mpirun(P, tmp_path_factory.mktemp(f"mpi{P}"), "checks")
        except BaseException as e:  # one mpirun per world size, failures included
            _RUNS[P] = e
    res = _RUNS[P]
    if isinstance(res, BaseException):
        raise res
    return res


@needs_mpi
@pytest.mark.parametrize("P", [2, 3])
def test_identity_and_isolation(P, tmp_path_factory):
    outs = results(P, tmp_path_factory)
    for r, out in enumerate(outs):
        assert out["size"] == P and out["timeout"] == 300.0 and out["can_probe"] is True
    # rank 1 got MPIComm's payload through MPIComm and the user's message through
    # COMM_WORLD, although both used the same source, tag and size
    assert outs[1]["isolation_comm"] == ref.expected_payload(0, 1, 4, 5)
    assert outs[1]["isolation_user"] == "ab" * 5


@needs_mpi
@pytest.mark.parametrize("name, check, kwargs", ref.CASES, ids=ref.CASE_IDS)
@pytest.mark.parametrize("P", [2, 3])
def test_checks(P, name, check, kwargs, tmp_path_factory):
    check(results(P, tmp_path_factory), P, probe=True, **kwargs)


@needs_mpi
def test_timeout_names_pending_peer(tmp_path):
    timeout = 2.0
    ref.check_timeout(mpirun(3, tmp_path, "timeout", str(timeout)), 3, timeout)


@needs_mpi
def test_local_error_fails_every_rank_within_2s(tmp_path):
    """A ValueError on rank 1 inside a call: ranks 0 and 2 raise a CommError naming rank 1
    and the cause within 2 s (the control communicator), the Comm then stays broken."""
    outs = mpirun(3, tmp_path, "fail")
    for alg in ("topka", "spardl", "dense", "gtopk"):
        for rank, out in enumerate(outs):
            got = out[alg]
            assert got["s"] < 2.0, (alg, rank, got)
            if rank == 1:
                assert got["type"] == "ValueError", (alg, got)
            else:
                assert got["type"] == "CommAbortedError" and "rank 1 failed: ValueError" in got["msg"], (alg, rank, got)
            assert out[alg + "/later"]["type"] == "CommAbortedError", out[alg + "/later"]


@needs_mpi
def test_reorder_is_the_same_error_on_both_ranks_within_2s(tmp_path):
    import re

    pattern = re.compile(r"ranks called the collectives in different orders: .*?in the same order\)")
    outs = mpirun(2, tmp_path, "reorder")
    for alg in ("topka", "spardl", "dense", "gtopk"):
        texts = []
        for rank, out in enumerate(outs):
            got = out[alg]
            assert got["comm_error"] and got["s"] < 2.0, (alg, rank, got)
            assert "MPI_ERR" not in got["msg"], got
            texts.append(pattern.search(got["msg"]).group(0))
        assert texts[0] == texts[1], texts


@needs_mpi
def test_argument_error_before_sending_fails_every_rank_within_2s(tmp_path):
    """Rank 1 passes a wrong ``out``: it raises its ValueError, ranks 0 and 2 a
    CommAbortedError naming rank 1 and the cause, within 2 s (the control communicator)."""
    outs = mpirun(3, tmp_path, "argument")
    for alg in ("topka", "spardl"):
        for rank, out in enumerate(outs):
            got = out[alg]
            assert got["s"] < 2.0, (alg, rank, got)
            if rank == 1:
                assert got["type"] == "ValueError" and "out must match grad" in got["msg"], got
            else:
                assert got["type"] == "CommAbortedError", (alg, rank, got)
                assert "rank 1 failed: ValueError: out must match grad" in got["msg"], (alg, rank, got)


@needs_mpi
@pytest.mark.parametrize("fault", ["kill", "stop"])
@pytest.mark.parametrize("algorithm", ["topka", "spardl"])
def test_killed_or_stopped_peer_is_a_comm_error_on_every_survivor(algorithm, fault, tmp_path):
    """mpirun -np 4 with MPIComm: one rank SIGKILLs or SIGSTOPs itself at a random moment of
    the reducer loop (tests/_faults.py); every survivor raises a CommError (CommTimeoutError
    for a stop), never a hang, a raw MPI exception or an abort."""
    import random
    import zlib

    from _faults import FAULT_RUNS, FAULT_TIMEOUT_S, check_fault_runs

    runs = []
    for run in range(FAULT_RUNS):
        seed = zlib.crc32(f"mpi/{algorithm}/{fault}/{run}".encode())
        victim = random.Random(seed).randrange(1, 4)  # the program draws the same
        out_dir = tmp_path / f"run{run}"
        out_dir.mkdir()
        outs = mpirun(4, out_dir, "fault", algorithm, fault, str(seed), str(FAULT_TIMEOUT_S), may_die=(victim,))
        assert all(o["victim"] == victim for o in outs), outs
        runs.append((outs, outs[0]["signalled_at"]))
    for summary in check_fault_runs(runs, fault, FAULT_TIMEOUT_S):
        print(f"fault {algorithm} {fault} mpi: {summary}")


def test_missing_mpi4py_is_a_clear_import_error(monkeypatch):
    from sparsecomm.comm.mpi_comm import MPIComm

    monkeypatch.setitem(sys.modules, "mpi4py", None)  # import mpi4py -> ImportError
    with pytest.raises(ImportError, match=r"pip install 'mpi4py>=3\.1' \(in a sparsecomm checkout, pip install '\.\[mpi\]'\)"):
        MPIComm()


_REBUILD = r'''
import gc, json, os, sys, threading
import torch
from mpi4py import MPI
from sparsecomm import SparseAllreduce
from sparsecomm.comm.mpi_comm import MPIComm

def counts():
    gc.collect()
    return {"fds": len(os.listdir("/proc/self/fd")), "tasks": len(os.listdir("/proc/self/task")),
            "threads": threading.active_count()}

out = {}
for i in range(int(sys.argv[2]) + 1):
    comm = MPIComm(timeout=60)
    SparseAllreduce("topka", 0.1, comm=comm)(torch.randn(1000))
    comm.close()
    del comm
    if i == 0:  # after the first: what MPI creates once per process is no leak of the rebuilds
        out["before"] = counts()
out["after"] = counts()
with open(os.path.join(sys.argv[1], f"rebuild{MPI.COMM_WORLD.Get_rank()}.json"), "w") as f:
    json.dump(out, f)
'''


@needs_mpi
def test_rebuilding_mpicomms_leaks_no_fd_or_thread(tmp_path):
    """100 MPIComms, each used for one reducer call and closed (its two duplicated
    communicators freed): descriptors and threads back to their count after the first."""
    script = tmp_path / "rebuild.py"
    script.write_text(_REBUILD)
    cmd = [MPIRUN, "--allow-run-as-root", "--oversubscribe", "-np", "2", sys.executable, str(script), str(tmp_path), "100"]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.path.dirname(HERE))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=RUN_TIMEOUT * 2, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for r in range(2):
        with open(tmp_path / f"rebuild{r}.json") as f:
            out = json.load(f)
        print(f"rebuild MPIComm rank {r}: {out}")
        assert all(out["after"][k] <= out["before"][k] for k in ("fds", "tasks", "threads")), out
