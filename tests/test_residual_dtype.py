"""Residuals kept in bfloat16 or 8 bits between calls (``residual_dtype``), on simulated ranks.

The references are written here: bfloat16 rounding by torch's own cast, and the 8-bit form
(a power-of-two scale per block of 64, entries rounded to nearest in [-127, 127]) in plain
Python. A float32 reducer given the narrow reducer's stored residual must make the same call
the narrow one makes; only the narrowing of what it holds back differs.
"""

from __future__ import annotations

import math

import pytest
import torch

from sparsecomm import SparseAllreduce, Topology
from sparsecomm.comm.simulated import simulate
from sparsecomm.errors import AgreedValueError

P = 4
N = 1000          # not a multiple of the block: the short last block is covered
BLOCK = 64
STEPS = 4


def _grads(rank: int, steps: int = STEPS) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(500 + rank)
    return [torch.randn(N, generator=g) * (1 + 100 * (torch.rand(N, generator=g) < 0.01)) for _ in range(steps)]


def _int8_reference(x: torch.Tensor) -> torch.Tensor:
    """The 8-bit form's values, block by block, in Python floats."""
    values = x.tolist()
    out = []
    for start in range(0, len(values), BLOCK):
        block = values[start:start + BLOCK]
        peak = max(abs(v) for v in block)
        if peak == 0.0:
            out.extend(0.0 for _ in block)
            continue
        e = math.ceil(math.log2(peak / 127.0))
        while peak / 2.0 ** e > 127.0:     # log2's rounding, either way
            e += 1
        while peak / 2.0 ** (e - 1) <= 127.0:
            e -= 1
        out.extend(max(-127, min(127, round(v / 2.0 ** e))) * 2.0 ** e for v in block)
    return torch.tensor(out, dtype=torch.float32)


NARROW = {"bfloat16": lambda x: x.to(torch.bfloat16).to(torch.float32), "int8": _int8_reference}


def test_the_int8_reference_keeps_what_fits():
    x = torch.tensor([127.0, -1.0, 0.5] + [0.0] * 61 + [0.25, 3.0])
    got = _int8_reference(x)
    assert got[:3].tolist() == [127.0, -1.0, 0.0]   # 0.5 rounds to even: 0
    assert got[64:].tolist() == [0.25, 3.0]          # its own block, scale 2**-5


@pytest.mark.parametrize("hierarchy", ["flat", "node"])
@pytest.mark.parametrize("form", ["bfloat16", "int8"])
@pytest.mark.parametrize("algorithm", ["topka", "spardl", "gtopk", "zen"])
def test_each_call_is_a_float32_call_on_the_stored_residual(algorithm, form, hierarchy):
    """Per step: a float32 reducer loaded with the narrow reducer's state makes the same
    result; the narrow reducer then stores that reducer's residual, narrowed as the reference
    narrows it. Conservation follows: sum(g + e) == out + sum(e') + sum(what the narrowing lost)."""
    def fn(comm):
        nodes = Topology(2, P // 2) if hierarchy == "node" else None
        narrow = SparseAllreduce(algorithm, 0.05, comm=comm, hierarchy=hierarchy, nodes=nodes, residual_dtype=form)
        rows = []
        for step, g in enumerate(_grads(comm.rank)):
            ref = SparseAllreduce(algorithm, 0.05, comm=comm, hierarchy=hierarchy, nodes=nodes)
            if step:
                ref.load_state_dict(narrow.state_dict())
            want = ref(g.clone())
            got = narrow(g.clone())
            rows.append((want, got, ref.residual.clone(), narrow.residual.clone(), narrow.last_stats,
                         narrow.shard_bounds(N)))
            ref.close()
        return rows
    for rank, rows in enumerate(simulate(P, fn).results):
        for step, (want, got, ref_residual, residual, stats, (lo, hi)) in enumerate(rows):
            assert torch.equal(got, want), f"rank {rank} step {step}: the narrow reducer's result differs"
            # two levels: a rank keeps its shard of the node's sum (zeros elsewhere), narrowed in
            # blocks from the shard's start
            shard = ref_residual[lo:hi]
            assert torch.equal(residual[lo:hi], NARROW[form](shard)), f"rank {rank} step {step}"
            assert not residual[:lo].any() and not residual[hi:].any()
            lost = (shard - residual[lo:hi]).abs().sum() / shard.abs().sum()
            assert stats["residual_rounding"] == pytest.approx(float(lost), rel=1e-4, abs=1e-9)
            assert stats["residual_rounding"] > 0.0


@pytest.mark.parametrize("form", [None, "bfloat16", "int8"])
def test_memory_per_element_is_reported(form):
    def fn(comm):
        reducer = SparseAllreduce("topka", 0.05, comm=comm, residual_dtype=form)
        reducer(_grads(comm.rank, 1)[0])
        return reducer.last_stats
    stats = simulate(2, fn).results[0]
    want = {None: 4 * N, "bfloat16": 2 * N, "int8": N + math.ceil(N / BLOCK)}[form]
    assert stats["residual_bytes"] == want
    assert ("residual_rounding" in stats) == (form is not None)


@pytest.mark.parametrize("form", ["bfloat16", "int8"])
@pytest.mark.parametrize("algorithm", ["topka", "spardl"])
def test_a_resumed_narrow_reducer_continues_exactly(algorithm, form):
    """state_dict() holds the widened values; loading narrows them again to the same form."""
    def fn(comm):
        grads = _grads(comm.rank, 6)
        whole = SparseAllreduce(algorithm, 0.05, comm=comm, residual_dtype=form)
        want = [whole(g.clone()) for g in grads]
        first = SparseAllreduce(algorithm, 0.05, comm=comm, residual_dtype=form)
        for g in grads[:3]:
            first(g.clone())
        saved = first.state_dict()
        second = SparseAllreduce(algorithm, 0.05, comm=comm, residual_dtype=form)
        second.load_state_dict(saved)
        got = [second(g.clone()) for g in grads[3:]]
        return want[3:], got, whole.residual, second.residual
    for want, got, want_residual, got_residual in simulate(P, fn).results:
        for a, b in zip(want, got):
            assert torch.equal(a, b)
        assert torch.equal(want_residual, got_residual)


def test_float32_is_the_default():
    def fn(comm):
        a = SparseAllreduce("topka", 0.05, comm=comm)
        b = SparseAllreduce("topka", 0.05, comm=comm, residual_dtype=torch.float32)
        grads = _grads(comm.rank)
        return [a(g.clone()) for g in grads], [b(g.clone()) for g in grads], a.residual, b.residual
    for want, got, ra, rb in simulate(2, fn).results:
        assert all(torch.equal(x, y) for x, y in zip(want, got)) and torch.equal(ra, rb)


def test_ranks_with_another_residual_dtype_raise_together():
    def fn(comm):
        form = "int8" if comm.rank == 1 else None
        reducer = SparseAllreduce("topka", 0.05, comm=comm, residual_dtype=form)
        try:
            reducer(torch.ones(N))
        except AgreedValueError as exc:
            return str(exc)
        return None
    for msg in simulate(3, fn).results:
        assert msg is not None and "residual_dtype" in msg


def test_a_bad_residual_dtype_says_what_is_accepted():
    with pytest.raises(ValueError, match="torch.bfloat16 or 'int8'"):
        SparseAllreduce("topka", 0.05, comm=None, residual_dtype=torch.float16)


def test_a_hook_checkpoint_is_refused_by_a_state_with_another_residual_dtype():
    from sparsecomm import DDPHookState, FSDPHookState

    saved = DDPHookState("topka", 0.05, residual_dtype="int8").local_state_dict()
    assert saved["residual_dtype"] == "int8"
    with pytest.raises(ValueError, match="residual_dtype='int8'.*'float32'"):
        DDPHookState("topka", 0.05).load_state_dict(saved)
    DDPHookState("topka", 0.05, residual_dtype="int8").load_state_dict(saved)
    assert "residual_dtype" not in DDPHookState("topka", 0.05).local_state_dict()   # float32: the keys as before
    with pytest.raises(ValueError, match="residual_dtype must be"):
        FSDPHookState("topka", 0.05, residual_dtype="int4")
