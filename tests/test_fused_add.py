"""The residual add fused with the first selection: every algorithm that takes the
gradient apart (``fuses_add``) gives bit for bit the results, residuals and byte counts of the
unfused path (the reducer adds, then the algorithm selects), on the sampled fast path (N above
the kernels' 65 536 threshold), over several steps of error feedback, also when ``out`` is the
gradient's own memory (the DDP hook's in-place call); a subclass that overrides ``reduce``
without opting in gets the gradient added by the reducer."""

from __future__ import annotations

import pytest
import torch

import sparsecomm
from sparsecomm.algorithms.topka import TopkAllgather
from sparsecomm.comm.simulated import simulate

N = 200_003
CASES = [(name, p, {}) for name in ("topka", "gtopk", "sparcml_recursive_double", "sparcml_split_allgather",
                                      "topkdsa", "sparcml") for p in (1, 2, 3)] + \
    [("spardl", p, {}) for p in (1, 2, 3, 4)] + [("spardl", 6, {"teams": 3}), ("spardl", 4, {"teams": 4}),
                                                 ("topka", 2, {"index_codec": "delta_binary"}),
                                                 ("gtopk", 4, {}), ("sparcml_split_allgather", 4, {})]


def _run(name, p, opts, fused, in_place, dtype=torch.float64):
    def rank(comm):
        reducer = sparsecomm.SparseAllreduce(name, 0.01, comm=comm, **opts)
        if not fused:
            reducer.algorithm.fuses_add = False  # the reducer adds, then the algorithm selects
        outs = []
        for step in range(3):
            g = torch.Generator().manual_seed(1000 * step + comm.rank)
            grad = torch.randn(N, generator=g, dtype=dtype)
            grad[::5] = 0.5  # massive ties at one magnitude
            if in_place:
                reducer(grad, out=grad)
                outs.append(grad)
            else:
                outs.append(reducer(grad))
            outs.append(reducer.residual.clone())
            outs.append(torch.tensor([reducer.last_stats["bytes_sent"], reducer.last_stats["rounds"]]))
        return outs
    return simulate(p, rank).results


@pytest.mark.parametrize("name,p,opts", CASES, ids=[f"{n}-P{p}-{'-'.join(o)}" for n, p, o in CASES])
def test_fused_equals_unfused(name, p, opts):
    dtype = torch.float32 if name == "topka" else torch.float64
    fused = _run(name, p, opts, True, False, dtype)
    unfused = _run(name, p, opts, False, False, dtype)
    for r in range(p):
        for a, b in zip(fused[r], unfused[r]):
            assert torch.equal(a, b), (name, p, r)


@pytest.mark.parametrize("name", ["topka", "spardl", "gtopk", "sparcml"])
def test_fused_in_place_out(name):
    fused = _run(name, 2, {}, True, True, torch.float32)
    unfused = _run(name, 2, {}, False, False, torch.float32)
    for r in range(2):
        for a, b in zip(fused[r], unfused[r]):
            assert torch.equal(a, b), (name, r)


class _OwnReduce(TopkAllgather):
    """A subclass with its own reduce that does not take grad=."""

    def reduce(self, acc, k, out):
        super().reduce(acc, k, out)


def test_subclass_without_opt_in_gets_the_gradient_added():
    alg = _OwnReduce(None)
    assert alg.fuses_add and not alg.takes_grad()
    assert TopkAllgather(None).takes_grad()
    off = TopkAllgather(None)
    off.fuses_add = False
    assert not off.takes_grad()

    def rank(comm):
        reducer = sparsecomm.SparseAllreduce("topka", 0.01, comm=comm)
        reducer.algorithm = _OwnReduce(comm)
        grad = torch.randn(N, generator=torch.Generator().manual_seed(comm.rank))
        out = reducer(grad)
        return grad, out, reducer.residual
    both = simulate(2, rank).results
    # conservation (lossless topka, zero residual carried in): out + e'_0 + e'_1 == g_0 + g_1
    assert torch.allclose(both[0][1] + both[0][2] + both[1][2], both[0][0] + both[1][0], atol=1e-5)
    assert torch.equal(both[0][1], both[1][1])
