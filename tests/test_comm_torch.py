"""TorchComm on gloo, P = 1..8 ranks, and the spawn helper itself.

Each world size is spawned once (the battery in ``_comm_checks.run_checks``); the tests
below compare what every rank received and counted against references computed here
from the message-size tables.
"""

from __future__ import annotations

import math
import time

import pytest
import torch

import _comm_checks as cc
from sparsecomm.comm.base import CommTimeoutError
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


# -- references -----------------------------------------------------------------------------
def hexb(b: bytes) -> str:
    return b.hex()


def expected_payload(src, dst, idx, n) -> str:
    return hexb(cc.payload_bytes(src, dst, idx, n))


def log_rounds(P: int) -> int:
    return math.ceil(math.log2(P)) if P > 1 else 0


def tensor_hex(t: torch.Tensor) -> str:
    return t.contiguous().view(-1).view(torch.uint8).numpy().tobytes().hex()


def from_hex(h: str, dtype: torch.dtype) -> torch.Tensor:
    return torch.frombuffer(bytearray(bytes.fromhex(h)), dtype=torch.uint8).view(dtype).clone()


# -- tests ----------------------------------------------------------------------------------
@pytest.mark.parametrize("P", WORLD_SIZES)
def test_identity_and_defaults(P):
    for r, out in enumerate(results(P)):
        assert out["comm_rank_size"] == [r, P]
        assert out["device"] == "cpu"
        assert out["timeout"] == SPAWN_TIMEOUT  # the process group's own timeout
        assert out["explicit_timeout"] == 7.5


@pytest.mark.parametrize("P", WORLD_SIZES)
def test_ring_exchange(P):
    for r, out in enumerate(results(P)):
        if P == 1:
            assert out["ring_stats"] == [0, 0, 0]
            continue
        prv = (r - 1) % P
        assert out["ring"] == expected_payload(prv, r, 0, cc.ring_size(prv))
        assert out["ring_stats"] == [cc.ring_size(r), cc.ring_size(prv), 1]


@pytest.mark.parametrize("P", WORLD_SIZES)
def test_all_to_all_one_round_keeps_pair_order(P):
    for r, out in enumerate(results(P)):
        others = [q for q in range(P) if q != r]
        assert out["a2a"] == {str(q): [expected_payload(q, r, i, cc.a2a_size(q, r, i)) for i in (0, 1)]
                              for q in others}
        sent = sum(cc.a2a_size(r, q, i) for q in others for i in (0, 1))
        recv = sum(cc.a2a_size(q, r, i) for q in others for i in (0, 1))
        assert out["a2a_stats"] == [sent, recv, 1 if P > 1 else 0]


@pytest.mark.parametrize("P", WORLD_SIZES)
def test_exchange_var_size_header(P):
    """gloo cannot probe: a size round (one int64 per message) precedes the payload round."""
    for r, out in enumerate(results(P)):
        others = [q for q in range(P) if q != r]
        assert out["var"] == {str(q): expected_payload(q, r, 5, cc.var_size(q, r)) for q in others}
        sent = sum(cc.var_size(r, q) + 8 for q in others)
        recv = sum(cc.var_size(q, r) + 8 for q in others)
        assert out["var_stats"] == [sent, recv, 2 if P > 1 else 0]
        if P > 1:
            prv = (r - 1) % P
            assert out["var_ring"] == expected_payload(prv, r, 6, cc.var_size(prv, 0))
            assert out["var_ring_stats"] == [cc.var_size(r, 0) + 8, cc.var_size(prv, 0) + 8, 2]


@pytest.mark.parametrize("P", WORLD_SIZES)
def test_allgather_small(P):
    ref = torch.stack([cc.small_input(q, torch.float64) for q in range(P)])
    for out in results(P):
        assert out["allgather_shape"] == [P, *cc.SMALL_SHAPE]
        assert out["allgather"] == tensor_hex(ref)
        nbytes = 6 * 8
        assert out["allgather_stats"] == [(P - 1) * nbytes, (P - 1) * nbytes, log_rounds(P)]


@pytest.mark.parametrize("op", ["sum", "max", "min"])
@pytest.mark.parametrize("dtype", ["float32", "int64"])
@pytest.mark.parametrize("P", WORLD_SIZES)
def test_allreduce_small(P, dtype, op):
    dt = getattr(torch, dtype)
    xs = [cc.small_input(q, dt) for q in range(P)]
    if op == "sum":  # rank order, in the input dtype: the contract for bit-identity
        ref = xs[0].clone()
        for x in xs[1:]:
            ref = ref + x
        approx = sum(x.double() for x in xs)
        assert torch.allclose(ref.double(), approx, rtol=1e-5, atol=1e-3)
    else:
        ref = xs[0].clone()
        for x in xs[1:]:
            ref = torch.maximum(ref, x) if op == "max" else torch.minimum(ref, x)
    key = f"allreduce_small_{dtype}_{op}"
    got = {out[key] for out in results(P)}
    assert got == {tensor_hex(ref)}, "not bit-identical to the rank-order reference on every rank"
    nbytes = 6 * dt.itemsize
    for out in results(P):
        assert out[key + "_stats"] == [(P - 1) * nbytes, (P - 1) * nbytes, log_rounds(P)]


@pytest.mark.parametrize("dtype", cc.DENSE_DTYPES)
@pytest.mark.parametrize("P", WORLD_SIZES)
def test_allreduce_dense(P, dtype):
    dt = getattr(torch, dtype)
    xs = [cc.dense_input(q, dtype).double() for q in range(P)]
    ref = sum(xs)
    bound = 2 * P * torch.finfo(dt).eps * sum(x.abs() for x in xs) + 1e-300
    outs = results(P)
    assert len({out[f"dense_{dtype}"] for out in outs}) == 1, "ranks disagree"
    got = from_hex(outs[0][f"dense_{dtype}"], dt).double()
    assert got.shape == ref.shape
    assert bool(((got - ref).abs() <= bound).all()), float((got - ref).abs().max())
    nbytes = cc.DENSE_N * dt.itemsize
    exp = [0, 0, 0] if P == 1 else [2 * (P - 1) * math.ceil(nbytes / P)] * 2 + [2 * (P - 1)]
    for out in outs:
        assert out[f"dense_{dtype}_same_object"] is True
        assert out[f"dense_{dtype}_stats"] == exp


@pytest.mark.parametrize("P", WORLD_SIZES)
def test_allreduce_dense_noncontiguous(P):
    ref = sum(cc.dense_input(q, "float32", 24).double() for q in range(P)).reshape(4, 6)
    for out in results(P):
        got = from_hex(out["dense_noncontig"], torch.float32).reshape(4, 6).double()
        assert torch.allclose(got, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("P", WORLD_SIZES)
def test_bruck_allgather(P):
    sizes = [cc.bruck_size(q) for q in range(P)]
    outs = results(P)
    for r, out in enumerate(outs):
        assert out["bruck"] == [expected_payload(q, 0, 7, sizes[q]) for q in range(P)]
        assert out["bruck_stats"][1] == sum(sizes) - sizes[r]  # every other block, once
        assert out["bruck_stats"][2] == log_rounds(P)
        assert out["bruck_equal"] == [expected_payload(q, 0, 8, 16) for q in range(P)]
        assert out["bruck_equal_stats"] == [(P - 1) * 16, (P - 1) * 16, log_rounds(P)]
    # every byte sent is received exactly once
    assert sum(o["bruck_stats"][0] for o in outs) == sum(o["bruck_stats"][1] for o in outs) == (P - 1) * sum(sizes)


@pytest.mark.parametrize("P", WORLD_SIZES)
def test_bruck_allgather_var(P):
    sizes = [cc.bruck_var_size(q) for q in range(P)]
    for r, out in enumerate(results(P)):
        assert out["bruck_var"] == [expected_payload(q, 0, 9, sizes[q]) for q in range(P)]
        # size all-gather (one int64 per rank) then the blocks: 2 ceil(log2 P) rounds
        assert out["bruck_var_stats"][1] == 8 * (P - 1) + sum(sizes) - sizes[r]
        assert out["bruck_var_stats"][2] == 2 * log_rounds(P)


@pytest.mark.parametrize("P", WORLD_SIZES)
def test_barrier_and_bad_peers(P):
    for out in results(P):
        assert out["barrier_stats"] == [P - 1, P - 1, log_rounds(P)]
        assert set(out["bad_peer"].values()) == {"ValueError"}, out["bad_peer"]


@pytest.mark.parametrize("P", [3, 5])
def test_subgroup_translates_ranks(P):
    outs = results(P)
    assert outs[0]["sub"] == "ValueError"  # not a member
    n = P - 1
    for r in range(1, P):
        sub = outs[r]["sub"]
        g = r - 1
        assert sub["rank_size"] == [g, n]
        assert sub["ring"] == expected_payload((g - 1) % n, g, 3, cc.ring_size((g - 1) % n))
        assert sub["sum"] == sum(range(1, P))
        assert sub["dense"] == [float(sum(range(1, P)))] * 5


def test_needs_initialized_process_group():
    import torch.distributed as dist

    from sparsecomm.comm.torch_comm import TorchComm

    assert not dist.is_initialized()
    with pytest.raises(ValueError, match="init_process_group first, or pass comm="):
        TorchComm()


def test_timeout_names_pending_peer():
    timeout = 2.0
    outs = spawn(_timeout_program, 3, timeout, timeout=60)
    last = outs[2]
    assert last["exchange"] == "CommTimeoutError", last
    assert "rank 2" in last["exchange_msg"] and "[0]" in last["exchange_msg"], last["exchange_msg"]
    assert timeout - 0.1 <= last["exchange_s"] <= timeout + 3, last["exchange_s"]
    assert last["allreduce"] == "CommTimeoutError", last
    assert "[0, 1]" in last["allreduce_msg"], last["allreduce_msg"]
    assert timeout - 0.1 <= last["allreduce_s"] <= timeout + 3, last["allreduce_s"]


# -- the spawn helper -----------------------------------------------------------------------
def test_spawn_returns_in_rank_order():
    assert spawn(_ranks_return, 3, "ab", timeout=60) == [
        {"rank": r, "size": 3, "x": "ab" * (r + 1)} for r in range(3)]


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
        spawn(_sleeps, 2, timeout=8)
    assert time.monotonic() - t0 < 20
