"""algorithm="auto": the same choice on every rank, the cheapest by the model, in last_stats and
the handshake, kept through state_dict, and bad options refused."""

from __future__ import annotations

import pytest
import torch

import sparsecomm as sc
from sparsecomm.algorithms.auto import choose_algorithm
from sparsecomm.comm import simulate
from sparsecomm.errors import AgreedValueError


def _grad(rank: int, n: int, step: int = 0) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(100 * step + rank))


@pytest.mark.parametrize("P,n,density,alpha,beta,expect", [
    (4, 20_000, 1.0, 1e-4, 8e-9, "dense"),          # nothing sparse to gain: dense
    (4, 2_000_000, 0.001, 1e-4, 8e-9, None),          # sparse wins at 1 Gbit/s
    (2, 300, 0.5, 1e-3, 1e-12, None),                 # latency-bound tiny bucket
])
def test_choice_is_the_cheapest_and_identical_everywhere(P, n, density, alpha, beta, expect):
    def fn(comm):
        red = sc.SparseAllreduce("auto", density, comm=comm, alpha=alpha, beta=beta)
        out = red(_grad(comm.rank, n))
        return red.last_stats, out
    results = simulate(P, fn).results
    stats = [r[0] for r in results]
    choices = {s["auto_choice"] for s in stats}
    assert len(choices) == 1
    choice = choices.pop()
    k = sc.k_for(density, n)
    ref = choose_algorithm(P, n, k, alpha, beta)
    assert choice == ref["algorithm"] == min(ref["predictions"], key=ref["predictions"].get)
    if expect:
        assert choice == expect
    else:
        assert choice != "dense"
    for s in stats:
        assert s["auto_predicted_s"] == pytest.approx(ref["predicted_s"])
        assert s["auto_measured_s"] == s["total_s"] > 0
        assert (s["auto_alpha"], s["auto_beta"]) == (alpha, beta)
    for r in results[1:]:
        assert torch.equal(r[1], results[0][1])
    # the result is the chosen algorithm's, bit for bit
    def direct(comm):
        return sc.SparseAllreduce(choice, density, comm=comm)(_grad(comm.rank, n))
    assert torch.equal(simulate(P, direct).results[0], results[0][1])


def test_pingpong_fit_is_rank_zeros_on_every_rank():
    def fn(comm):
        red = sc.SparseAllreduce("auto", 0.01, comm=comm)
        red(_grad(comm.rank, 50_000))
        return red.last_stats
    stats = simulate(3, fn, alpha=0.0, beta=0.0).results
    assert len({(s["auto_alpha"], s["auto_beta"], s["auto_choice"]) for s in stats}) == 1
    assert stats[0]["auto_beta"] >= 0 and stats[0]["handshake_rounds"] > 0


def test_handshake_names_a_different_choice():
    def fn(comm):   # rank 1 is told other costs, so it picks another algorithm
        opts = dict(alpha=1e-4, beta=8e-9) if comm.rank != 1 else dict(alpha=1e-4, beta=8e-9,
                                                                        candidates=("gtopk",))
        sc.SparseAllreduce("auto", 0.01, comm=comm, **opts)(_grad(comm.rank, 30_000))
    with pytest.raises(AgreedValueError, match="auto/topka.*auto/gtopk"):
        simulate(2, fn)


def test_state_dict_keeps_the_choice():
    n, density = 40_000, 0.01

    def fn(comm):
        red = sc.SparseAllreduce("auto", density, comm=comm, alpha=1e-4, beta=8e-9,
                                 candidates=("gtopk", "topka"))
        red(_grad(comm.rank, n, 0))
        state = red.state_dict()
        # a resumed reducer told other costs keeps the saved choice and continues identically
        resumed = sc.SparseAllreduce("auto", density, comm=comm, alpha=1.0, beta=1e-3,
                                     candidates=("gtopk", "topka"))
        resumed.load_state_dict(state)
        a = red(_grad(comm.rank, n, 1)).clone()
        b = resumed(_grad(comm.rank, n, 1))
        return state["algorithm_state"]["choice"], resumed.last_stats["auto_choice"], torch.equal(a, b), \
            torch.equal(red.residual, resumed.residual)
    for first, second, same_out, same_res in simulate(2, fn).results:
        assert first == second and same_out and same_res


@pytest.mark.parametrize("options,match", [
    ({"alpha": -1.0, "beta": 1e-9}, "alpha"), ({"alpha": float("nan"), "beta": 1e-9}, "alpha"),
    ({"alpha": 1e-4}, "both"), ({"candidates": "topka"}, "candidates"), ({"candidates": ("auto",)}, "candidates"),
    ({"candidates": ("nosuch",)}, "candidates"), ({"compute": {"topka": -1}}, "compute"),
])
def test_bad_options(options, match):
    with pytest.raises(ValueError, match=match):
        sc.algorithms.get("auto")(None, **options)


@pytest.mark.distributed
def test_resume_through_the_ddp_hook_keeps_the_choice():
    """tests/test_resume.py's matrix for auto (its ping-pong fit measured, not given): a run
    resumed from checkpoints after steps 1, 2 and 3 continues bit-identically, so every bucket
    made the same choice as in the uninterrupted run."""
    from test_resume import _run_matrix
    diffs, regrouped = _run_matrix(2, ["bucket_cap_mb=0.01"], only=["auto"])
    assert regrouped > 0
    assert all(d == 0.0 for d in diffs.values()), diffs
