"""Density warm-up (sparsecomm/reduce/density.py): values, validation, the reducer's k per call,
conservation under a changing k for every algorithm, the signature handshake, the hook's
state_dict. Exact resume with a schedule is in tests/test_resume.py."""

from __future__ import annotations

import pytest
import torch

import sparsecomm as sc
from sparsecomm import DensitySchedule
from sparsecomm.comm import simulate

# (schedule, final density, [(step, expected density)]) -- expected values written by hand
VALUES = [
    # gs-SGD's per-epoch list (section 5) with 0.4% after it, 3 steps per epoch
    (DensitySchedule.per_epoch([0.25, 0.0725, 0.015], steps_per_epoch=3), 0.004,
     [(0, 0.25), (2, 0.25), (3, 0.0725), (5, 0.0725), (6, 0.015), (8, 0.015), (9, 0.004), (1000, 0.004)]),
    (DensitySchedule.per_step([0.5, 0.1]), 0.01, [(0, 0.5), (1, 0.1), (2, 0.01)]),
    # DGC's 25% -> 0.1% in 4 stages (its 75%, 93.75%, 98.4375%, 99.6%, 99.9% sparsity divides the
    # density by 4 per stage; from 25% to exactly 0.1% the factor is 0.004 ** (1/4) = 0.2515),
    # 2 steps per stage: 0.25 * 0.2515 ** s
    (DensitySchedule.exponential(0.25, warmup_steps=8, stages=4), 0.001,
     [(0, 0.25), (1, 0.25), (2, 0.0628717), (4, 0.0158114), (6, 0.00397635), (7, 0.00397635), (8, 0.001)]),
    # one stage per step: 0.1 * (0.001 / 0.1) ** (s / 2) = 0.1, 0.01, then the final 0.001
    (DensitySchedule.exponential(0.1, warmup_steps=2), 0.001, [(0, 0.1), (1, 0.01), (2, 0.001)]),
]


@pytest.mark.parametrize("schedule, final, table", VALUES)
def test_density_at_matches_the_table(schedule, final, table):
    for step, expected in table:
        assert schedule.density_at(step, final) == pytest.approx(expected, rel=1e-6), (schedule, step)


@pytest.mark.parametrize("schedule", [v[0] for v in VALUES])
def test_state_round_trip_and_equality(schedule):
    again = DensitySchedule.from_state(schedule.to_state())
    assert again == schedule and again.spec_text() == schedule.spec_text()
    assert DensitySchedule.per_step([0.5, 0.1]) != DensitySchedule.per_step([0.5, 0.2])


BAD = [
    (lambda: DensitySchedule.per_epoch([], 3), "non-empty list"),
    (lambda: DensitySchedule.per_epoch([0.5, 0.0], 3), r"entry 1 must be a number in \(0, 1\]"),
    (lambda: DensitySchedule.per_epoch([0.5, float("nan")], 3), r"entry 1 must be a number"),
    (lambda: DensitySchedule.per_epoch([1.5], 3), r"entry 0 must be a number"),
    (lambda: DensitySchedule.per_epoch([0.5], 0), "steps_per_epoch .* must be an integer >= 1"),
    (lambda: DensitySchedule.exponential(0.0, 10), r"start must be a number in \(0, 1\]"),
    (lambda: DensitySchedule.exponential(0.25, 0), "warmup_steps must be an integer >= 1"),
    (lambda: DensitySchedule.exponential(0.25, 4, stages=5), r"stages \(5\) cannot exceed warmup_steps \(4\)"),
    (lambda: sc.DDPHookState("topka", 0.01, density_schedule=lambda step: 0.1), "not a callable"),
    (lambda: sc.DDPHookState("topka", 0.01, density_schedule=[0.25, 0.1]), "must be a sparsecomm.DensitySchedule"),
]


@pytest.mark.parametrize("build, message", BAD)
def test_bad_schedules_raise_a_clear_value_error(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_reducer_k_follows_the_schedule_per_call():
    schedule = DensitySchedule.per_step([0.5, 0.2, 0.05])

    def fn(comm):
        reducer = sc.SparseAllreduce("topka", 0.01, comm=comm, density_schedule=schedule)
        ks = []
        for step in range(5):
            reducer(torch.randn(1000, generator=torch.Generator().manual_seed(10 * step + comm.rank)))
            ks.append(reducer.last_stats["k"])
        explicit = sc.SparseAllreduce("topka", 0.01, comm=comm, density_schedule=schedule)
        explicit(torch.ones(1000), step=1)
        return ks, explicit.last_stats["k"], reducer.state_dict()["calls"]

    for ks, k_at_1, calls in simulate(2, fn).results:
        assert ks == [500, 200, 50, 10, 10] and k_at_1 == 200 and calls == 5


@pytest.mark.parametrize("algorithm", sc.algorithms.names())
def test_error_feedback_loses_nothing_while_k_changes(algorithm):
    """sum_r (g_r + e_r) == out + sum_r e'_r at every call while the schedule moves k from 30%
    to 1%: no algorithm may keep state that assumes one k."""
    n, size, steps = 1537, 3, 5
    schedule = DensitySchedule.per_step([0.3, 0.1, 0.03])
    density = 1.0 if algorithm == "dense" else 0.01

    def fn(comm):
        reducer = sc.SparseAllreduce(algorithm, density, comm=comm, density_schedule=schedule)
        rows = []
        for step in range(steps):
            grad = torch.randn(n, dtype=torch.float64, generator=torch.Generator().manual_seed(100 * step + comm.rank))
            before = grad + (reducer.residual if reducer.residual is not None else 0)
            out = reducer(grad)
            rows.append((before, out, reducer.residual.clone()))
        return rows

    ranks = simulate(size, fn).results
    for step in range(steps):
        total_in = sum(r[step][0] for r in ranks)
        out = ranks[0][step][1]
        for r in ranks:
            assert torch.equal(r[step][1], out), f"{algorithm}: step {step}: ranks differ"
        total_out = out + sum(r[step][2] for r in ranks)
        scale = float(total_in.abs().max())
        assert float((total_in - total_out).abs().max()) <= 1e-9 * scale, f"{algorithm} step {step}"


def test_ranks_with_different_schedules_raise_the_same_error():
    def fn(comm):
        schedule = DensitySchedule.per_step([0.5] if comm.rank == 0 else [0.25])
        try:
            sc.SparseAllreduce("topka", 0.01, comm=comm, density_schedule=schedule)(torch.ones(100))
        except ValueError as exc:
            return str(exc)
        return None

    messages = simulate(2, fn).results
    for message in messages:
        assert message is not None and "options: ranks [0] have {" in message, message
        assert "density_schedule='per_step(densities=[0.5], every=1)'" in message
        assert "density_schedule='per_step(densities=[0.25], every=1)'" in message


def test_hook_state_keeps_the_schedule_and_refuses_another():
    schedule = DensitySchedule.exponential(0.25, warmup_steps=8, stages=4)
    state = sc.DDPHookState("spardl", 0.001, density_schedule=schedule, warmup_steps=1)
    assert [state.density_at(s) for s in (0, 1, 2, 8)] == [1.0, 0.25, 0.0628717, 0.001]
    saved = state.state_dict()
    local = state.local_state_dict()   # this rank's part of the saved state, as plain data
    assert local["density_schedule"] == {"kind": "exponential", "start": 0.25, "warmup_steps": 8, "stages": 4}
    same = sc.DDPHookState("spardl", 0.001, density_schedule=DensitySchedule.from_state(local["density_schedule"]),
                           warmup_steps=1)
    same.load_state_dict(saved)
    with pytest.raises(ValueError, match="density_schedule"):
        sc.DDPHookState("spardl", 0.001).load_state_dict(saved)


@pytest.mark.parametrize("step, message", [(-1, "step must be an integer >= 0, got -1"),
                                           ("a", r"step must be an integer >= 0, got 'a' \(str\)"),
                                           (1.5, r"got 1.5 \(float\)"), (True, "got True")])
def test_a_step_that_is_no_step_is_a_clear_value_error(step, message):
    """The schedule, the hook and the reducer refuse a negative or non-integer step (a step of -1
    once gave the final density silently, 'a' an internal TypeError); a peer of the rank that
    passed it is aborted, naming it and the cause, instead of waiting."""
    schedule = DensitySchedule.per_step([0.5, 0.1])
    with pytest.raises(ValueError, match=message):
        schedule.density_at(step, 0.01)
    with pytest.raises(ValueError, match=message):
        sc.DDPHookState("topka", 0.01, density_schedule=schedule).density_at(step)

    def fn(comm):
        reducer = sc.SparseAllreduce("topka", 0.01, comm=comm, density_schedule=schedule)
        try:
            reducer(torch.ones(100), step=step if comm.rank == 1 else 0)
        except Exception as exc:   # each rank's own error, compared below
            return type(exc).__name__, str(exc)
        return None, ""
    results = simulate(2, fn).results
    assert results[1][0] == "ValueError" and "step must be an integer >= 0" in results[1][1], results[1]
    assert "rank 1 failed: ValueError: step must be an integer >= 0" in results[0][1], results[0]


def test_numpy_and_torch_integer_steps_are_steps():
    import numpy as np

    schedule = DensitySchedule.per_step([0.5, 0.1])
    assert schedule.density_at(np.int64(1), 0.01) == schedule.density_at(torch.tensor(1), 0.01) == 0.1
