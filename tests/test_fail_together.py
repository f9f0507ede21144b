"""Failing together (docs/reliability.md): isolation from DDP's collectives, a local error
or a reorder raising on every rank within 2 s, a SIGKILLed peer surfacing as CommError,
exception types through the async hook, and the bound on received sizes.

Each case runs in its own Comm (an abort breaks a Comm for good), several cases per spawn to
keep the number of process starts low. Timings are measured on the ranks from a common start
(a barrier on the default group, or the dead rank's own clock written to the store).
"""

from __future__ import annotations

import os
import re
import signal
import time

import pytest
import torch

from sparsecomm.comm import simulate
from sparsecomm.comm.base import CommAbortedError, CommError, CommTimeoutError
from sparsecomm.errors import WireFormatError
from sparsecomm.testing import spawn

N = 4096
DENSITY = 0.05
#: what "together" means: every rank has raised within this many seconds of the failure
LIMIT_S = 2.0
ALGORITHMS = ["topka", "spardl", "dense", "gtopk"]
REORDER = re.compile(r"ranks called the collectives in different orders: .*?in the same order\)")


def _raise_on_call(*args, **kwargs):
    raise ValueError("injected failure on this rank")


def _outcome(fn) -> dict:
    t0 = time.monotonic()
    try:
        fn()
        return {"type": None, "s": time.monotonic() - t0}
    except Exception as exc:  # noqa: BLE001 - the test inspects it
        return {"type": type(exc).__name__, "msg": str(exc), "comm_error": isinstance(exc, CommError),
                "s": time.monotonic() - t0}


# -- functions run on the spawned ranks ------------------------------------------------------
def _local_error(rank, world_size, algorithms, bad_rank):
    import torch.distributed as dist

    from sparsecomm import SparseAllreduce
    from sparsecomm.comm.torch_comm import TorchComm

    out = {}
    gen = torch.Generator().manual_seed(rank)
    for alg in algorithms:
        reducer = SparseAllreduce(alg, DENSITY, comm=TorchComm(timeout=60))
        reducer(torch.randn(N, generator=gen))  # a clean call: the failure is not in the handshake
        if rank == bad_rank:
            reducer.algorithm.reduce = _raise_on_call
        dist.barrier()
        out[alg] = _outcome(lambda: reducer(torch.randn(N, generator=gen)))
        out[alg + "/later"] = _outcome(lambda: reducer(torch.randn(N, generator=gen)))
    return out


def _reorder(rank, world_size, algorithms):
    import torch.distributed as dist

    from sparsecomm import SparseAllreduce
    from sparsecomm.comm.torch_comm import TorchComm

    out = {}
    for alg in algorithms:
        comm = TorchComm(timeout=60)
        a, b = SparseAllreduce(alg, DENSITY, comm=comm), SparseAllreduce(alg, DENSITY, comm=comm)
        ga, gb = torch.randn(N), torch.randn(2 * N)
        a(ga), b(gb)  # in order once
        dist.barrier()
        calls = [lambda: a(ga), lambda: b(gb)]
        out[alg] = _outcome(lambda: [call() for call in (calls if rank == 0 else calls[::-1])])
    return out


def _unused_parameters(rank, world_size, configs, models):
    """DDP with find_unused_parameters and a dense allreduce in the async hook: DDP's own
    allreduce of the used-parameter map runs while the hook's worker communicates."""
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    import sparsecomm

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.unused = nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 16)

        def forward(self, x):
            return self.b(torch.relu(self.a(x)))

    out = {}
    for algorithm, warmup in configs:
        params = []
        for run in range(models):
            torch.manual_seed(run)
            model = DDP(Net(), find_unused_parameters=True, bucket_cap_mb=0.001)
            model.register_comm_hook(sparsecomm.DDPHookState(algorithm, 0.5, warmup_steps=warmup),
                                     sparsecomm.ddp_hook)
            gen = torch.Generator().manual_seed(rank)
            for _ in range(4):
                model(torch.randn(8, 16, generator=gen)).sum().backward()
            params.append(torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None]))
        out[f"{algorithm}/{warmup}"] = [p.tolist() for p in params]
    return out


def _sigkill(rank, world_size, algorithm, victim):
    import torch.distributed as dist

    from sparsecomm import SparseAllreduce
    from sparsecomm.comm.torch_comm import TorchComm

    store = dist.distributed_c10d._get_default_store()
    reducer = SparseAllreduce(algorithm, DENSITY, comm=TorchComm(timeout=60))
    gen = torch.Generator().manual_seed(rank)
    for call in range(50):
        if rank == victim and call == 3:
            store.set("killed_at", repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            reducer(torch.randn(N, generator=gen))
        except Exception as exc:  # noqa: BLE001
            return {"type": type(exc).__name__, "comm_error": isinstance(exc, CommError), "msg": str(exc),
                    "after_s": time.time() - float(store.get("killed_at")), "call": call}
    return {"type": None}


class _TimeoutComm:
    """Mixed into a TorchComm: every round times out at once (a stand-in for a dead link)."""

    def _post_and_wait(self, sends, recvs):
        raise CommTimeoutError(f"rank {self.rank}: injected timeout")


def _hook_types(rank, world_size):
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    import sparsecomm
    from sparsecomm.comm.torch_comm import TorchComm

    out = {}
    # 1. a ValueError on rank 1 inside the bucket's reducer: ValueError there, CommError on rank 0
    model = DDP(nn.Linear(16, 16))
    state = sparsecomm.DDPHookState("topka", 0.25)
    model.register_comm_hook(state, sparsecomm.ddp_hook)
    for step in range(3):
        if step == 2 and rank == 1:
            sparsecomm.algorithms.get("topka").reduce = _raise_on_call
        out[f"value/{step}"] = _outcome(lambda: model(torch.randn(4, 16)).sum().backward())
    out["value/later"] = _outcome(lambda: model(torch.randn(4, 16)).sum().backward())
    # 2. CommTimeoutError from the Comm, on both ranks
    comm = type("TimeoutComm", (_TimeoutComm, TorchComm), {})(timeout=60)
    model = DDP(nn.Linear(16, 16))
    model.register_comm_hook(sparsecomm.DDPHookState("topka", 0.25, comm=comm), sparsecomm.ddp_hook)
    out["timeout"] = _outcome(lambda: model(torch.randn(4, 16)).sum().backward())
    return out


# -- tests ------------------------------------------------------------------------------------
@pytest.mark.distributed
def test_local_error_fails_every_rank_within_2s():
    """A ValueError on rank 1 inside a call: rank 1 raises it, ranks 0 and 2 raise a
    CommError naming rank 1 and the cause, all within 2 s; the Comm then stays broken."""
    results = spawn(_local_error, 3, ALGORITHMS, 1, timeout=120)
    for alg in ALGORITHMS:
        for rank, out in enumerate(results):
            got = out[alg]
            assert got["s"] < LIMIT_S, (alg, rank, got)
            if rank == 1:
                assert got["type"] == "ValueError" and "injected failure" in got["msg"], (alg, got)
            else:
                assert got["type"] == "CommAbortedError", (alg, rank, got)
                assert "rank 1 failed: ValueError: injected failure" in got["msg"], (alg, rank, got)
            later = out[alg + "/later"]
            assert later["type"] == "CommAbortedError" and later["s"] < 0.1, (alg, rank, later)
            assert "rank 1 failed" in later["msg"] and "new Comm" in later["msg"], later


@pytest.mark.distributed
def test_reorder_is_the_same_error_on_both_ranks_within_2s():
    """Rank 0 calls reducers A, B; rank 1 calls B, A: no gloo abort, no hang -- the same
    error naming both reducers and calls on both ranks."""
    results = spawn(_reorder, 2, ALGORITHMS, timeout=120)
    for alg in ALGORITHMS:
        texts = []
        for rank, out in enumerate(results):
            got = out[alg]
            assert got["comm_error"] and got["s"] < LIMIT_S, (alg, rank, got)
            found = REORDER.search(got["msg"])
            assert found, (alg, rank, got)
            texts.append(found.group(0))
        assert texts[0] == texts[1], texts
        assert "[#1] call 2" in texts[0] and "[#2] call 2" in texts[0], texts[0]


@pytest.mark.distributed
@pytest.mark.slow
def test_find_unused_parameters_with_dense_in_the_async_hook():
    """The configurations that aborted both ranks 6 times in 8 (gloo "Received data size
    doesn't match"): 4 models x 4 steps each, algorithm dense and topka with warm-up."""
    configs = [("dense", 0), ("topka", 2)]
    results = spawn(_unused_parameters, 2, configs, 4, timeout=180)
    for key in results[0]:
        assert results[0][key] == results[1][key], key  # the averaged gradients agree


@pytest.mark.distributed
@pytest.mark.parametrize("algorithm", ["topka", "spardl"])
def test_sigkilled_peer_is_a_comm_error_on_every_survivor(algorithm):
    results = spawn(_sigkill, 4, algorithm, 2, may_die=(2,), timeout=120)
    assert results[2] is None
    for rank in (0, 1, 3):
        got = results[rank]
        assert got["type"] is not None and got["comm_error"], (rank, got)
        assert got["after_s"] < 5.0, (rank, got)


@pytest.mark.distributed
def test_async_hook_keeps_exception_types():
    results = spawn(_hook_types, 2, timeout=120)
    for rank, out in enumerate(results):
        assert out["value/0"]["type"] is None and out["value/1"]["type"] is None, out
        got = out["value/2"]
        if rank == 1:
            assert got["type"] == "ValueError" and "injected failure" in got["msg"], got
        else:
            assert got["type"] == "CommAbortedError" and "rank 1 failed: ValueError" in got["msg"], got
        assert "Unable to cast" not in got["msg"]
        assert out["value/later"]["comm_error"] or out["value/later"]["type"] == "ValueError", out["value/later"]
        assert out["timeout"]["type"] == "CommTimeoutError" and "injected timeout" in out["timeout"]["msg"], out


# -- in-process (simulate) ----------------------------------------------------------------------
def _sim_local_error(comm, alg):
    from sparsecomm import SparseAllreduce

    reducer = SparseAllreduce(alg, DENSITY, comm=comm)
    reducer(torch.randn(N))
    if comm.rank == 1:
        reducer.algorithm.reduce = _raise_on_call
    return _outcome(lambda: reducer(torch.randn(N)))


def _sim_reorder(comm, alg):
    from sparsecomm import SparseAllreduce

    a, b = SparseAllreduce(alg, DENSITY, comm=comm), SparseAllreduce(alg, DENSITY, comm=comm)
    ga, gb = torch.randn(N), torch.randn(2 * N)
    a(ga), b(gb)
    calls = [lambda: a(ga), lambda: b(gb)]
    return _outcome(lambda: [call() for call in (calls if comm.rank == 0 else calls[::-1])])


@pytest.mark.parametrize("alg", ALGORITHMS)
def test_simulated_local_error_fails_every_rank(alg):
    outs = simulate(3, lambda comm: _sim_local_error(comm, alg)).results
    for rank, got in enumerate(outs):
        assert got["s"] < LIMIT_S, (rank, got)
        if rank == 1:
            assert got["type"] == "ValueError", got
        else:
            assert got["comm_error"] and "rank 1 failed: ValueError: injected failure" in got["msg"], (rank, got)


@pytest.mark.parametrize("alg", ALGORITHMS)
def test_simulated_reorder_is_an_error(alg):
    outs = simulate(2, lambda comm: _sim_reorder(comm, alg)).results
    texts = []
    for rank, got in enumerate(outs):
        assert got["comm_error"] and got["s"] < LIMIT_S, (rank, got)
        texts.append(REORDER.search(got["msg"]).group(0))
    assert texts[0] == texts[1]


def test_exchange_var_refuses_an_oversized_size_header():
    """A corrupted size header (1.15e18 bytes) raises WireFormatError naming the sender
    instead of allocating; the sender then fails with the receiver's cause."""
    def fn(comm):
        scope = comm.new_scope("test")
        with comm.call_scope(scope, max_message_bytes=1 << 20):
            if comm.rank == 0:
                bogus = torch.tensor([1_150_000_000_000_000_000], dtype=torch.int64).view(torch.uint8)
                return _outcome(lambda: comm.exchange([(1, bogus)], [(1, torch.empty(8, dtype=torch.uint8))]))
            return _outcome(lambda: comm.exchange_var([(0, torch.zeros(8, dtype=torch.uint8))], [0]))

    outs = simulate(2, fn).results
    assert outs[1]["type"] == "WireFormatError" and "rank 0 announced a message of 1150000000000000000" \
        in outs[1]["msg"], outs[1]
    assert issubclass(WireFormatError, ValueError)
