"""TorchComm on gloo, P = 1..8 ranks, and the spawn helper itself.

Each world size is spawned once (the battery in ``_comm_checks.run_checks``); the tests
below compare what every rank received and counted against references computed here
from the message-size tables.
"""

from __future__ import annotations

import time

import pytest
import torch

import _comm_checks as cc
import _comm_reference as ref
from sparsecomm.comm.base import DEFAULT_TIMEOUT, CommTimeoutError
from sparsecomm.testing import SpawnError, spawn

pytestmark = pytest.mark.distributed

WORLD_SIZES = [1, 2, 3, 4, 5, 6, 7, 8]
SPAWN_TIMEOUT = 120.0


# -- functions run on the spawned ranks (top level: they are pickled by name) --------------
def _battery(rank, world_size):
    import torch.distributed as dist

    from sparsecomm.comm.torch_comm import TorchComm

    comm = TorchComm()
    out = cc.run_checks(comm)
    out["timeout"] = comm.timeout
    out["device"] = str(comm.device)
    out["comm_rank_size"] = [comm.rank, comm.size]
    out["explicit_timeout"] = TorchComm(timeout=7.5).timeout
    if world_size >= 3:
        # a subgroup without rank 0: group rank g = rank - 1
        members = list(range(1, world_size))
        group = dist.new_group(members)
        if rank == 0:
            try:
                TorchComm(group)
                out["sub"] = "no error"
            except ValueError:
                out["sub"] = "ValueError"
        else:
            sub = TorchComm(group)
            g, n = sub.rank, sub.size
            buf = torch.empty(cc.ring_size((g - 1) % n), dtype=torch.uint8)
            sub.sendrecv(cc.payload(g, (g + 1) % n, 3, cc.ring_size(g)), (g + 1) % n, buf, (g - 1) % n)
            total = sub.allreduce_small(torch.tensor([rank], dtype=torch.int64))
            dense = torch.full((5,), float(rank))
            sub.allreduce_dense(dense)
            out["sub"] = {"rank_size": [g, n], "ring": cc._hex(buf), "sum": int(total),
                          "dense": dense.tolist()}
        dist.barrier()
    return out


def _timeout_program(rank, world_size, timeout):
    from sparsecomm.comm.torch_comm import TorchComm

    return cc.run_timeout(TorchComm(timeout=timeout), timeout, settle=2 * timeout + 1.5)


def _ranks_return(rank, world_size, x):
    return {"rank": rank, "size": world_size, "x": x * (rank + 1)}


def _rank1_raises(rank, world_size):
    if rank == 1:
        raise KeyError("boom-from-rank-1")
    time.sleep(30)  # must be killed, not waited for
    return rank


def _sleeps(rank, world_size):
    time.sleep(60)


def _over_the_bound(rank, world_size):
    """Inside a call with a bound of 64 bytes, rank 0 tries to send 65 to rank 1 in a
    variable-size round; rank 1 waits for it with a receive of the bound."""
    from sparsecomm.comm.torch_comm import TorchComm

    comm = TorchComm(timeout=30)
    scope = comm.new_scope("over the bound")
    start = time.monotonic()
    try:
        with comm.call_scope(scope, max_message_bytes=64):
            if rank == 0:
                comm.exchange_var([(1, torch.ones(65, dtype=torch.uint8))], [])
            else:
                comm.exchange_var([], [0])
        return {"error": None}
    except Exception as e:  # noqa: BLE001 - reported to the test
        return {"error": type(e).__name__, "message": str(e), "failed_rank": getattr(e, "failed_rank", None),
                "seconds": time.monotonic() - start}


# -- cached runs ----------------------------------------------------------------------------
_RUNS: dict[int, object] = {}


def results(P: int) -> list[dict]:
    if P not in _RUNS:
        try:
            _RUNS[P] = spawn(_battery, P, timeout=SPAWN_TIMEOUT)
        except Exception as e:  # cache the failure too: one spawn per world size
            _RUNS[P] = e
    res = _RUNS[P]
    if isinstance(res, Exception):
        raise res
    return res


# -- tests ----------------------------------------------------------------------------------
@pytest.mark.parametrize("P", WORLD_SIZES)
def test_identity_and_defaults(P):
    for r, out in enumerate(results(P)):
        assert out["comm_rank_size"] == [r, P]
        assert out["device"] == "cpu"
        assert out["timeout"] == DEFAULT_TIMEOUT  # not the process group's own (120 s here)
        assert out["explicit_timeout"] == 7.5


@pytest.mark.parametrize("name, check, kwargs", ref.CASES, ids=ref.CASE_IDS)
@pytest.mark.parametrize("P", WORLD_SIZES)
def test_checks(P, name, check, kwargs):
    """gloo cannot probe: exchange_var pays a size round."""
    check(results(P), P, probe=False, **kwargs)


@pytest.mark.parametrize("P", [3, 5])
def test_subgroup_translates_ranks(P):
    outs = results(P)
    assert outs[0]["sub"] == "ValueError"  # not a member
    n = P - 1
    for r in range(1, P):
        sub = outs[r]["sub"]
        g = r - 1
        assert sub["rank_size"] == [g, n]
        assert sub["ring"] == ref.expected_payload((g - 1) % n, g, 3, cc.ring_size((g - 1) % n))
        assert sub["sum"] == sum(range(1, P))
        assert sub["dense"] == [float(sum(range(1, P)))] * 5


def test_variable_size_message_over_the_bound_fails_every_rank():
    """gloo fails the receiving process when a message is longer than its receive buffer, so
    the sender refuses one over the call's bound before sending: it raises WireFormatError
    naming the sizes, the receiver CommAbortedError naming rank 0, both quickly, no rank dies."""
    outs = spawn(_over_the_bound, 2, timeout=60)
    assert outs[0]["error"] == "WireFormatError", outs[0]
    assert "65 bytes to rank 1" in outs[0]["message"] and "bound of 64 bytes" in outs[0]["message"]
    assert outs[1]["error"] == "CommAbortedError" and outs[1]["failed_rank"] == 0, outs[1]
    assert outs[1]["seconds"] < 10, outs[1]


def test_needs_initialized_process_group():
    import torch.distributed as dist

    from sparsecomm.comm.torch_comm import TorchComm

    assert not dist.is_initialized()
    with pytest.raises(ValueError, match="init_process_group first, or pass comm="):
        TorchComm()


def test_timeout_names_pending_peer():
    timeout = 2.0
    ref.check_timeout(spawn(_timeout_program, 3, timeout, timeout=60), 3, timeout)


# -- the spawn helper -----------------------------------------------------------------------
def test_spawn_returns_in_rank_order():
    assert spawn(_ranks_return, 3, "ab", timeout=60) == [
        {"rank": r, "size": 3, "x": "ab" * (r + 1)} for r in range(3)]


def _returns_a_tensor_and_exits(rank, world_size):
    return torch.full((4,), float(rank))


def test_spawn_returns_tensors_by_value():
    """A tensor comes back by value: through the connection's pickler torch would send a
    shared-memory handle that the parent can open only while the child lives, and a child that
    exits first (a loaded machine) made the parent's recv fail with "Connection reset by peer"."""
    out = spawn(_returns_a_tensor_and_exits, 2, timeout=60)
    assert [t.tolist() for t in out] == [[0.0] * 4, [1.0] * 4]
    assert not any(t.is_shared() for t in out)


def test_spawn_reports_failing_rank_traceback():
    t0 = time.monotonic()
    with pytest.raises(SpawnError) as info:
        spawn(_rank1_raises, 2, timeout=60)
    assert time.monotonic() - t0 < 25  # rank 0 is killed, not waited for
    assert info.value.rank == 1
    text = str(info.value)
    assert "Traceback" in text and "boom-from-rank-1" in text and "_rank1_raises" in text


def test_spawn_timeout_kills_children():
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="did not finish"):
        spawn(_sleeps, 2, timeout=4)
    assert time.monotonic() - t0 < 15
