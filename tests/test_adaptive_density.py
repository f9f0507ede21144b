"""Adaptive density (Accordion's rule, MLSys 2021, section 3): DensitySchedule.adaptive in
SparseAllreduce and the DDP hook. The reference regime is computed here from the reduced results:
per interval the norm of their sum, critical when it changed by at least eta (relative)."""

from __future__ import annotations

import math

import pytest
import torch

import sparsecomm as sc
from sparsecomm import DensitySchedule, SparseAllreduce
from sparsecomm.comm.simulated import simulate
from sparsecomm.testing import spawn

P = 3
N = 500
LOW, HIGH, INTERVAL, ETA = 0.01, 0.2, 3, 0.3


def _grad(rank: int, step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(10 * step + rank)
    # the scale moves in phases, so some intervals change a lot and others little
    scale = [1.0, 1.0, 1.0, 4.0, 4.0, 4.0, 4.1, 4.1, 4.1, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5][step % 15]
    return scale * torch.randn(N, generator=g, dtype=torch.float64)


def _expected_k(density: float) -> int:
    return max(1, math.ceil(density * N - 1e-9))


def _run(schedule, steps, save_at=None):
    def fn(comm):
        reducer = SparseAllreduce("topka", LOW, comm=comm, density_schedule=schedule)
        outs, ks, saved = [], [], None
        for step in range(steps):
            outs.append(reducer(_grad(comm.rank, step)))
            ks.append(reducer.last_stats["k"])
            if save_at is not None and step + 1 == save_at:
                saved = reducer.state_dict()
        return outs, ks, saved
    return simulate(P, fn).results


def test_the_regime_follows_the_norm_of_the_reduced_gradient_per_interval():
    steps = 15
    ranks = _run(DensitySchedule.adaptive(LOW, HIGH, INTERVAL, ETA), steps)
    outs, ks, _ = ranks[0]
    for rank in range(1, P):   # the same k and result on every rank
        assert ranks[rank][1] == ks and all(torch.equal(a, b) for a, b in zip(ranks[rank][0], outs))
    critical, last, expected = True, None, []
    for step in range(steps):
        expected.append(_expected_k(HIGH if critical else LOW))
        if (step + 1) % INTERVAL == 0:
            norm = float(sum(outs[step - INTERVAL + 1:step + 1]).norm())
            if last is not None:
                critical = abs(last - norm) / last >= ETA
            last = norm
    assert ks == expected
    assert _expected_k(LOW) in ks and ks.count(_expected_k(HIGH)) > INTERVAL   # both regimes were visited


def test_a_warm_up_runs_first_then_the_rule():
    warmup = DensitySchedule.per_step([0.5, 0.4], every=2)
    ranks = _run(DensitySchedule.adaptive(LOW, HIGH, INTERVAL, ETA, warmup=warmup), 4 + INTERVAL + 1)
    ks = ranks[0][1]
    assert ks[:4] == [_expected_k(0.5)] * 2 + [_expected_k(0.4)] * 2
    assert ks[4:4 + INTERVAL] == [_expected_k(HIGH)] * INTERVAL   # the first interval after it is critical


def test_a_resumed_reducer_keeps_the_regime_and_the_interval():
    schedule = DensitySchedule.adaptive(LOW, HIGH, INTERVAL, ETA)
    uninterrupted = _run(schedule, 12, save_at=7)   # mid-interval: 2 of 3 steps accumulated

    def fn(comm):
        reducer = SparseAllreduce("topka", LOW, comm=comm, density_schedule=schedule)
        reducer.load_state_dict(uninterrupted[comm.rank][2])
        return [reducer(_grad(comm.rank, step), step=step) for step in range(7, 12)]
    for rank, rest in enumerate(simulate(P, fn).results):
        assert all(torch.equal(a, b) for a, b in zip(uninterrupted[rank][0][7:], rest))
    assert uninterrupted[0][2]["density_state"]["accumulated"].any()


def test_the_schedule_is_a_value_checked_and_saved():
    schedule = DensitySchedule.adaptive(LOW, HIGH, INTERVAL, ETA, warmup=DensitySchedule.exponential(0.5, 4))
    assert DensitySchedule.from_state(schedule.to_state()) == schedule
    assert "adaptive(low=0.01, high=0.2, interval=3, eta=0.3" in schedule.spec_text()
    with pytest.raises(ValueError, match="must not exceed high"):
        DensitySchedule.adaptive(0.5, 0.1, 3)
    with pytest.raises(ValueError, match="eta"):
        DensitySchedule.adaptive(0.01, 0.1, 3, eta=0)
    with pytest.raises(ValueError, match="interval"):
        DensitySchedule.adaptive(0.01, 0.1, 0)
    with pytest.raises(ValueError, match="warmup"):
        DensitySchedule.adaptive(0.01, 0.1, 3, warmup=DensitySchedule.adaptive(0.01, 0.1, 3))


def _ddp(rank, world_size, path, load):
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(20, 64), nn.Tanh(), nn.Linear(64, 3)), bucket_cap_mb=0.001)
    state = sc.DDPHookState("topka", LOW, density_schedule=DensitySchedule.adaptive(LOW, HIGH, 2, ETA))
    model.register_comm_hook(state, sc.ddp_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    start = 0
    if load:
        saved = torch.load(path.format(rank=rank), weights_only=False)
        model.module.load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
        state.load_state_dict(saved["hook"])
        start = 5
    for step in range(start, 10):
        g = torch.Generator().manual_seed(step * 7 + rank)
        x, y = torch.randn(8, 20, generator=g) * (1 + step % 4), torch.randint(0, 3, (8,), generator=g)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        if not load and step + 1 == 5:
            torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(), "hook": state.state_dict()},
                       path.format(rank=rank))
    state.close()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy()


@pytest.mark.distributed
def test_the_hook_resumes_an_adaptive_schedule_exactly_in_fresh_processes(tmp_path):
    path = str(tmp_path / "ckpt{rank}.pt")
    first = spawn(_ddp, 2, path, False, timeout=240)
    saved = sc.DDPHookState("topka", LOW, density_schedule=DensitySchedule.adaptive(LOW, HIGH, 2, ETA))
    part = torch.load(path.format(rank=0), weights_only=False)["hook"]
    from sparsecomm.reduce.checkpoint import unpack_rank_part
    assert unpack_rank_part("DDPHookState", part, 0)["density_states"]
    saved.close()
    resumed = spawn(_ddp, 2, path, True, timeout=240)
    for rank in range(2):
        assert (first[rank] == resumed[rank]).all(), f"rank {rank} drifted after resume"
