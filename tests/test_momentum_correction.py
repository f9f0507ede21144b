"""Momentum correction, momentum factor masking and local gradient clipping (Deep Gradient
Compression, sections 3.2 and 3.3) in SparseAllreduce, on simulated ranks.

The references are written here: the momentum buffer torch.optim.SGD keeps (``b <- m b + g``,
Nesterov's step ``g + m b``) of the averaged gradient, plain sums, and clipping by hand.
"""

from __future__ import annotations

import math

import pytest
import torch

from sparsecomm import SparseAllreduce, Topology, algorithms
from sparsecomm.comm.simulated import simulate
from sparsecomm.errors import AgreedValueError

P = 4
N = 600
STEPS = 5
M = 0.9


def _grads(rank: int, steps: int = STEPS, n: int = N) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + rank)
    return [torch.randn(n, generator=g, dtype=torch.float64) for _ in range(steps)]


def _run(algorithm: str, density: float, hierarchy: str = "flat", steps: int = STEPS, **local):
    """Every rank's results, per step, and its reducer's residual and velocity at the end."""
    def fn(comm):
        nodes = Topology(2, P // 2) if hierarchy == "node" else None
        reducer = SparseAllreduce(algorithm, density, comm=comm, hierarchy=hierarchy, nodes=nodes, **local)
        outs = [reducer(g.clone()) for g in _grads(comm.rank, steps)]
        return outs, reducer.residual, reducer.velocity
    return simulate(P, fn).results


def _sum_over_ranks(step: int) -> torch.Tensor:
    return sum(_grads(r)[step] for r in range(P))


def _exact_at_density_one() -> list[str]:
    """The algorithms whose result at density 1 is the exact sum (checked here, without momentum)."""
    exact = []
    for name in algorithms.names():
        if name == "auto":
            continue
        try:
            results = _run(name, 1.0, steps=2)
        except ValueError:
            continue
        if all(torch.allclose(results[0][0][s], _sum_over_ranks(s), atol=1e-9) for s in range(2)):
            exact.append(name)
    return exact


EXACT = ["dense", "densestream", "gssgd", "gtopk", "sparcml", "sparcml_recursive_double", "sparcml_split_allgather",
         "spardl", "topka", "topkdsa", "zen"]


def test_the_algorithms_compared_here_are_exact_at_density_one():
    missing = [name for name in EXACT if name not in _exact_at_density_one()]
    assert not missing, f"not exact at density 1 without momentum: {missing}"


@pytest.mark.parametrize("hierarchy", ["flat", "node"])
@pytest.mark.parametrize("algorithm", EXACT)
def test_momentum_at_density_one_is_dense_momentum_sgd(algorithm, hierarchy):
    """Without masking, the reduced velocity is torch's momentum buffer of the summed gradient:
    plain SGD on it takes the steps of SGD(momentum=m) on the dense allreduce."""
    results = _run(algorithm, 1.0, hierarchy, momentum=M)
    buf = None
    for step in range(STEPS):
        g = _sum_over_ranks(step)
        buf = g.clone() if buf is None else M * buf + g
        for rank in range(P):
            torch.testing.assert_close(results[rank][0][step], buf, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("algorithm", [name for name in algorithms.names() if name != "auto"])
def test_every_algorithm_reduces_the_velocity_a_plain_reducer_would(algorithm):
    """Every algorithm (those not exact at density 1 too: oktopk's threshold, skcompress's sketch),
    at 5%: the reducer with momentum gives what a reducer without it gives when fed the velocity
    the test computes, u <- m u + g, per rank."""
    def fn(comm):
        with_momentum = SparseAllreduce(algorithm, 0.05, comm=comm, momentum=M)
        plain = SparseAllreduce(algorithm, 0.05, comm=comm)
        u = torch.zeros(N, dtype=torch.float64)
        pairs = []
        for g in _grads(comm.rank):
            u = M * u + g
            pairs.append((with_momentum(g.clone()), plain(u.clone())))
        return pairs
    for rank, pairs in enumerate(simulate(P, fn).results):
        for step, (a, b) in enumerate(pairs):
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9, msg=f"rank {rank} step {step}")


@pytest.mark.parametrize("hierarchy", ["flat", "node"])
@pytest.mark.parametrize("algorithm", ["dense", "topka", "spardl", "zen"])
def test_nesterov_at_density_one_is_dense_nesterov_sgd(algorithm, hierarchy):
    results = _run(algorithm, 1.0, hierarchy, momentum=M, nesterov=True)
    buf = None
    for step in range(STEPS):
        g = _sum_over_ranks(step)
        buf = g.clone() if buf is None else M * buf + g
        for rank in range(P):
            torch.testing.assert_close(results[rank][0][step], g + M * buf, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("hierarchy", ["flat", "node"])
@pytest.mark.parametrize("algorithm", ["dense", "topka", "spardl", "gtopk"])
def test_masking_at_density_one_is_plain_sgd(algorithm, hierarchy):
    """Every coordinate is sent each step, so masking clears every velocity: the plain sum."""
    results = _run(algorithm, 1.0, hierarchy, momentum=M, momentum_masking=True)
    for step in range(STEPS):
        for rank in range(P):
            torch.testing.assert_close(results[rank][0][step], _sum_over_ranks(step), rtol=1e-9, atol=1e-9)
        assert not results[0][2].any()


@pytest.mark.parametrize("hierarchy", ["flat", "node"])
@pytest.mark.parametrize("masking", [False, True])
@pytest.mark.parametrize("algorithm", ["topka", "spardl", "sparcml", "gtopk", "zen"])
def test_conservation_with_velocity(algorithm, masking, hierarchy):
    """At density 5%, over the steps: what went out plus what the ranks keep is the sum of the
    velocities that joined. The velocities are rebuilt here from the gradients and the masks
    (masking: cleared where the rank's residual changed, read from a second run step by step)."""
    def fn(comm):
        nodes = Topology(2, P // 2) if hierarchy == "node" else None
        reducer = SparseAllreduce(algorithm, 0.05, comm=comm, hierarchy=hierarchy, nodes=nodes,
                                  momentum=M, momentum_masking=masking)
        record = []
        for g in _grads(comm.rank):
            before_v = None if reducer.velocity is None else reducer.velocity.clone()
            before_e = None if reducer.residual is None else reducer.residual.clone()
            out = reducer(g.clone())
            record.append((out, before_v, before_e, reducer.velocity.clone(), reducer.residual.clone()))
        return record
    ranks = simulate(P, fn).results
    for step in range(STEPS):
        out = ranks[0][step][0]
        joined = torch.zeros(N, dtype=torch.float64)   # sum over ranks of (velocity fed + residual before)
        kept = torch.zeros(N, dtype=torch.float64)
        for rank in range(P):
            _, before_v, before_e, after_v, after_e = ranks[rank][step]
            kept += after_e
            joined += torch.zeros(N, dtype=torch.float64) if before_e is None else before_e
        # the velocity fed this step, over ranks: m * (velocity before) + gradient, summed
        # (flat: each rank's; two-level: the shard owner's velocity of the node's sum)
        fed = sum(M * (torch.zeros(N, dtype=torch.float64) if ranks[r][step][1] is None else ranks[r][step][1])
                  for r in range(P)) + _sum_over_ranks(step)
        torch.testing.assert_close(out + kept, joined + fed, rtol=1e-9, atol=1e-8)
        if masking:   # cleared exactly where the residual changed
            for rank in range(P):
                _, _, before_e, after_v, after_e = ranks[rank][step]
                before_e = torch.zeros(N, dtype=torch.float64) if before_e is None else before_e
                v_fed = M * (torch.zeros(N, dtype=torch.float64) if ranks[rank][step][1] is None
                             else ranks[rank][step][1])
                if hierarchy == "flat":
                    v_fed = v_fed + _grads(rank)[step]
                    changed = (before_e + v_fed) != after_e
                    assert not after_v[changed].any()
                    torch.testing.assert_close(after_v[~changed], v_fed[~changed])


@pytest.mark.parametrize("hierarchy", ["flat", "node"])
def test_clipping_scales_each_rank_to_its_share_of_the_threshold(hierarchy):
    clip = 20.0
    results = _run("topka", 1.0, hierarchy, clip_norm=clip)
    bound = clip / math.sqrt(P)
    for step in range(STEPS):
        expected = torch.zeros(N, dtype=torch.float64)
        for rank in range(P):
            g = _grads(rank)[step]
            norm = float(g.norm())
            expected += g * (bound / norm if norm > bound else 1.0)
        torch.testing.assert_close(results[0][0][step], expected, rtol=1e-9, atol=1e-9)
    assert float(_grads(0)[0].norm()) > bound   # the case clips


def test_the_options_are_agreed_before_any_message():
    def fn(comm):
        reducer = SparseAllreduce("topka", 0.1, comm=comm, momentum=0.9 if comm.rank else 0.8)
        try:
            reducer(torch.randn(N))
        except AgreedValueError as exc:
            return str(exc)
        return None
    for msg in simulate(2, fn).results:
        assert msg is not None and "momentum=0.8" in msg and "momentum=0.9" in msg, msg


@pytest.mark.parametrize("hierarchy", ["flat", "node"])
def test_a_resumed_reducer_continues_exactly(hierarchy):
    """state_dict after 3 steps, loaded into a new reducer on every rank: the last 2 steps match
    the uninterrupted run's bit for bit (residual and velocity restored)."""
    def fn(comm):
        nodes = Topology(2, P // 2) if hierarchy == "node" else None
        kw = dict(comm=comm, hierarchy=hierarchy, nodes=nodes, momentum=M, nesterov=True, clip_norm=30.0)
        grads = _grads(comm.rank)
        first = SparseAllreduce("topka", 0.05, **kw)
        outs = [first(g.clone()) for g in grads]
        again = SparseAllreduce("topka", 0.05, **kw)
        for g in grads[:3]:
            again(g.clone())
        saved = again.state_dict()
        assert saved["velocity"] is not None and saved["velocity"].any()
        resumed = SparseAllreduce("topka", 0.05, **kw)
        resumed.load_state_dict(saved)
        rest = [resumed(g.clone()) for g in grads[3:]]
        return outs[3:], rest
    for uninterrupted, resumed in simulate(P, fn).results:
        for a, b in zip(uninterrupted, resumed):
            assert torch.equal(a, b)


def test_bad_options_say_what_to_do():
    with pytest.raises(ValueError, match=r"momentum must be a number in \[0, 1\)"):
        SparseAllreduce("topka", 0.1, comm=_one(), momentum=1.5)
    with pytest.raises(ValueError, match="needs a momentum"):
        SparseAllreduce("topka", 0.1, comm=_one(), nesterov=True)
    with pytest.raises(ValueError, match="clip_norm must be a finite number > 0"):
        SparseAllreduce("topka", 0.1, comm=_one(), clip_norm=-1)
    with pytest.raises(ValueError, match="has momentum=0"):
        reducer = SparseAllreduce("topka", 0.1, comm=_one())
        reducer.load_state_dict({**reducer.state_dict(), "velocity": torch.zeros(3)})


def _one():
    from sparsecomm.comm.simulated import SimComm, _World

    world = _World(1, 0.0, 0.0, 10.0, 0.0, 0.0)
    return SimComm(world, 0, "cpu")


def test_an_optimizer_with_momentum_of_its_own_is_named():
    from sparsecomm.reduce.local_update import LocalUpdate, momentum_twice

    params = [torch.nn.Parameter(torch.zeros(2))]
    on = LocalUpdate(momentum=0.9)
    assert momentum_twice(on, [torch.optim.SGD(params, lr=0.1)]) is None
    assert "momentum=0.5" in momentum_twice(on, [torch.optim.SGD(params, lr=0.1, momentum=0.5)])
    assert "betas=" in momentum_twice(on, [torch.optim.Adam(params)])
    assert momentum_twice(LocalUpdate(), [torch.optim.SGD(params, lr=0.1, momentum=0.5)]) is None
