"""hierarchy="auto": SparseAllreduce chooses flat or two-level from the cost model, the same on
every rank, in the handshake and in the state_dict.

The links are given (the ping-pong's place, ``measure_links``, is replaced) so the choice is a
function of the model; the simulated Comm runs 2 nodes x 2 ranks."""

from __future__ import annotations

import pytest
import torch

import sparsecomm as sc
import sparsecomm.reduce.placement as placement_module
from sparsecomm.comm import simulate
from sparsecomm.costmodel import Links

N = 20000
#: 1 Gbit/s between nodes, 100 GB/s inside: the node's dense steps are nearly free
FAST_INSIDE = Links(1e-4, 8e-9, 5e-6, 1e-11)
#: the same slow link inside a node: two-level's dense reduce-scatter of N/2 values costs more than
#: topka's sparse messages save (4 ranks: flat topka sends 3 k entries per rank)
SLOW_INSIDE = Links(1e-4, 8e-9, 1e-4, 8e-9)


def _grad(rank: int) -> torch.Tensor:
    return torch.randn(N, generator=torch.Generator().manual_seed(rank))


def _run(links, state=None, measure=True):
    def fn(comm):
        red = sc.SparseAllreduce("topka", 0.01, comm=comm, hierarchy="auto", nodes=sc.Topology(2, 2))
        if state is not None and state[comm.rank] is not None:
            red.load_state_dict(state[comm.rank])
        out = red(_grad(comm.rank))
        return red.hierarchy_choice, out, red.state_dict()
    original = placement_module.measure_links

    def fixed(world, intra, inter):
        assert measure, "a resumed choice needs no ping-pong"
        return links
    placement_module.measure_links = fixed
    try:
        return simulate(4, fn).results
    finally:
        placement_module.measure_links = original


def _fixed_run(hierarchy):
    def fn(comm):
        topology = sc.Topology(2, 2) if hierarchy == "node" else None
        return sc.SparseAllreduce("topka", 0.01, comm=comm, hierarchy=hierarchy, nodes=topology)(_grad(comm.rank))
    return simulate(4, fn).results


@pytest.mark.parametrize("links, expected", [(FAST_INSIDE, "node"), (SLOW_INSIDE, "flat")])
def test_auto_runs_what_the_model_predicts_faster(links, expected):
    got = _run(links)
    assert [choice for choice, _, _ in got] == [expected] * 4
    reference = _fixed_run(expected)
    for (_, out, _), ref in zip(got, reference):
        assert torch.equal(out, ref)


def test_resume_keeps_the_choice_and_ranks_that_differ_raise():
    saved = [state for _, _, state in _run(FAST_INSIDE)]
    assert all(state["hierarchy"] == "node, 2 nodes x 2 ranks" for state in saved)
    # every rank resumes: the saved choice stands, with no ping-pong, under the other links
    assert [choice for choice, _, _ in _run(SLOW_INSIDE, saved, measure=False)] == ["node"] * 4
    # one rank resumes, the others decide afresh: the handshake raises on every rank
    with pytest.raises(ValueError, match="resumed node"):
        _run(SLOW_INSIDE, [saved[0], None, None, None])


def test_without_a_topology_auto_is_flat(monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)

    def fn(comm):
        red = sc.SparseAllreduce("topka", 0.01, comm=comm, hierarchy="auto")
        choice = red.hierarchy_choice
        red(_grad(comm.rank))
        return choice, "hierarchy" in red.state_dict()
    assert simulate(2, fn).results == [("flat", False)] * 2


def test_a_rank_failing_before_the_choice_raises_its_own_error_and_releases_its_peers(monkeypatch):
    """A rank that fails while the hierarchy is still undecided (its own error, not one every
    rank agrees on) relays the abort on the candidate node Comms and raises its own error; its
    peers are released with an error naming it rather than waiting."""
    def broken_links(world, intra, inter):
        if world.rank == 1:
            raise RuntimeError("rank 1's link measurement broke")
        return FAST_INSIDE
    monkeypatch.setattr(placement_module, "measure_links", broken_links)

    def fn(comm):
        red = sc.SparseAllreduce("topka", 0.01, comm=comm, hierarchy="auto", nodes=sc.Topology(2, 2))
        try:
            red(_grad(comm.rank))
        except Exception as exc:   # each rank's own error, to compare below
            return type(exc).__name__, str(exc)
        return None, None
    got = simulate(4, fn, timeout=30).results
    assert got[1] == ("RuntimeError", "rank 1's link measurement broke"), got[1]
    for rank in (0, 2, 3):
        assert got[rank][0] is not None and "rank 1" in got[rank][1], (rank, got[rank])
