"""One non-finite policy for every algorithm (the reducer's ``nonfinite`` option).

Every registered algorithm, NaN, +Inf and -Inf on one and on several ranks (including +Inf on
one rank and -Inf on another at the same index, whose dense sum is NaN), under both policies,
on the simulated Comm (P = 2, 3, 4) and on gloo:

* ``propagate``: every rank's result equals the dense sum of the raw gradients -- the same NaN
  positions and the same signed Infs, and the same finite values (the gradients are small
  integers, so the reference sum is exact in any order) -- and every residual is bit-for-bit
  what it was before the step; the next finite step then gives exactly what it gives when the
  non-finite step never happened (no algorithm state moved either).
* ``raise``: every rank raises the same ValueError naming the ranks whose gradient was
  non-finite and what they held; residuals are unchanged the same way.

And the reason ``propagate`` is the hook's default: ``torch.amp.GradScaler`` in a CPU DDP run
on 2 gloo ranks, where one rank's gradient overflows, skips the step on every rank, and the
parameters stay equal across ranks.
"""

from __future__ import annotations

import math
import re

import pytest
import torch

import sparsecomm as sc
from sparsecomm.comm import simulate
from sparsecomm.testing import spawn

ALGORITHMS = sc.algorithms.names()
N, DENSITY = 60, 0.1
NAN, INF = float("nan"), float("inf")

#: (name, P -> {rank: {index: value}}): where each rank's gradient is non-finite (for P = 2 a
#: later entry for the same rank replaces an earlier one)
CASES = [
    ("nan-one-rank", lambda P: {0: {7: NAN}}),
    ("+inf-one-rank", lambda P: {P - 1: {0: INF}}),
    ("-inf-one-rank", lambda P: {1: {N - 1: -INF}}),
    ("nan-several-ranks", lambda P: {0: {3: NAN}, P - 1: {40: NAN}}),
    ("+inf-several-ranks-same-index", lambda P: {r: {11: INF} for r in range(P)}),
    ("+inf-one-rank-and--inf-another", lambda P: {0: {20: INF}, 1: {20: -INF}}),
    ("mixed", lambda P: {0: {5: INF, 6: -INF}, 1: {6: NAN}, P - 1: {30: -INF}}),
    ("inf-everywhere-on-one-rank", lambda P: {P - 1: {i: INF if i % 2 else -INF for i in range(N)}}),
]


def _grad(n: int, rank: int, step: int, dtype=torch.float32) -> torch.Tensor:
    """Small integers: every sum of them is exact in any order, in every dtype used here."""
    gen = torch.Generator().manual_seed(97 * step + rank)
    return torch.randint(-50, 51, (n,), generator=gen).to(dtype)


def _poison(grad: torch.Tensor, rank: int, where: dict[int, dict[int, float]]) -> torch.Tensor:
    grad = grad.clone()
    for index, value in where.get(rank, {}).items():
        grad[index] = value
    return grad


def _expected_flags(where: dict[int, dict[int, float]]) -> dict[int, str]:
    flags = {}
    for rank, values in where.items():
        v = list(values.values())
        if any(math.isnan(x) for x in v):
            flags[rank] = "NaN"
        else:
            flags[rank] = " and ".join(w for w, present in (("+Inf", INF in v), ("-Inf", -INF in v)) if present)
    return flags


def _run(algorithm: str, size: int, policy: str, where: dict, dtype=torch.float32, options: dict | None = None):
    """Per rank: (step 1 result, residual before the bad step, outcome of the bad step,
    residual after it, step 3 result and residual), and a clean run of steps 1 and 3 only."""
    def fn(comm):
        runs = []
        for with_bad_step in (True, False):
            reducer = sc.SparseAllreduce(algorithm, DENSITY, comm=comm, nonfinite=policy, **(options or {}))
            reducer(_grad(N, comm.rank, 1, dtype))
            before = reducer.residual.clone()
            outcome = None
            if with_bad_step:
                try:
                    outcome = (reducer(_poison(_grad(N, comm.rank, 2, dtype), comm.rank, where)),
                               dict(reducer.last_stats))
                except ValueError as exc:
                    outcome = str(exc)
            after = reducer.residual.clone()
            third = reducer(_grad(N, comm.rank, 3, dtype))
            runs.append((before, outcome, after, third, reducer.residual.clone()))
        return runs

    return simulate(size, fn).results


def _dense_reference(size: int, where: dict, dtype) -> torch.Tensor:
    """The dense sum of the raw gradients (exact: small integers, and non-finite values summed
    by IEEE rules, which do not depend on the order)."""
    total = torch.zeros(N, dtype=torch.float32)
    for rank in range(size):
        total += _poison(_grad(N, rank, 2, dtype), rank, where).float()
    return total.to(dtype)


def _same_as_dense(out: torch.Tensor, ref: torch.Tensor) -> bool:
    """Bit for bit where not NaN (so Infs with their signs), and NaN exactly where ref is."""
    nan = ref.isnan()
    return out.dtype == ref.dtype and torch.equal(out.isnan(), nan) and torch.equal(out[~nan], ref[~nan])


@pytest.mark.parametrize("size", [2, 3, 4])
@pytest.mark.parametrize("policy", ["propagate", "raise"])
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_nonfinite_policy_simulated(algorithm, policy, size):
    _check_policy(algorithm, policy, size, {})


#: option sets whose own code paths a NaN could slip through (gssgd's heavymix="random" fill
#: compares estimates with a threshold, false for NaN; the untruncated sketch; the tree)
VARIANTS = [("gssgd", {"heavymix": "random"}), ("gssgd", {"heavymix": "random", "p1": None}),
            ("gssgd", {"allreduce": "tree", "p2": 1})]


@pytest.mark.parametrize("size", [2, 3, 4])
@pytest.mark.parametrize("policy", ["propagate", "raise"])
@pytest.mark.parametrize("algorithm,options", VARIANTS)
def test_nonfinite_policy_option_variants(algorithm, options, policy, size):
    _check_policy(algorithm, policy, size, options)


def _check_policy(algorithm: str, policy: str, size: int, options: dict) -> None:
    for case, make in CASES:
        where = {rank % size: values for rank, values in make(size).items()}
        results = _run(algorithm, size, policy, where, options=options)
        ref = _dense_reference(size, where, torch.float32)
        bad_ranks = sorted(where)
        messages = set()
        for rank, ((before, outcome, after, third, last), (_, _, clean_after, clean_third, clean_last)) \
                in enumerate(results):
            label = (algorithm, policy, size, case, rank)
            assert torch.equal(after, before), label           # residual untouched, bit for bit
            assert torch.equal(third, clean_third), label      # the next step: as if the bad one never ran
            assert torch.equal(last, clean_last), label
            if policy == "propagate":
                out, stats = outcome
                assert _same_as_dense(out, ref), (label, out, ref)
                assert stats["nonfinite_ranks"] == ([] if algorithm == "dense" else bad_ranks), label
            else:
                assert isinstance(outcome, str), label
                messages.add(outcome)
        if policy == "raise":
            assert len(messages) == 1, (algorithm, size, case, messages)   # the same error on every rank
            message = messages.pop()
            assert message.startswith(f"non-finite gradient on ranks {bad_ranks} ("), message
            for rank, held in _expected_flags(where).items():
                assert re.search(rf"ranks \[[0-9, ]*\b{rank}\b[0-9, ]*\] have {re.escape(held)}[;)]", message), \
                    (case, rank, held, message)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_nonfinite_half_gradients_propagate(algorithm, dtype):
    """Half gradients (reduced in float32): the result is the dense sum rounded to the dtype,
    non-finite where it is; the float32 residual is untouched."""
    size = 3
    where = {0: {20: INF}, 1: {20: -INF, 21: INF}, 2: {9: NAN}}
    results = _run(algorithm, size, "propagate", where, dtype)
    ref = _dense_reference(size, where, dtype)
    for rank, ((before, outcome, after, third, _), (_, _, _, clean_third, _)) in enumerate(results):
        assert before.dtype == torch.float32 and torch.equal(after, before), (algorithm, dtype, rank)
        assert _same_as_dense(outcome[0], ref), (algorithm, dtype, rank, outcome[0])
        assert torch.equal(third, clean_third), (algorithm, dtype, rank)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_finite_check_is_one_small_counted_round(algorithm):
    """The flag round is reported apart (check_bytes, check_rounds), like the handshake: the
    call's agreement record (flag and fingerprint, 120 bytes) all-gathered, ceil(log2 P)
    rounds, (P-1) records + nothing else; dense under "propagate" sends it too (it carries
    the call's fingerprint) but does not read the gradient."""
    size = 5

    def fn(comm):
        stats = {}
        for policy in ("propagate", "raise"):
            reducer = sc.SparseAllreduce(algorithm, DENSITY, comm=comm, nonfinite=policy)
            reducer(_grad(N, comm.rank, 1))
            reducer(_grad(N, comm.rank, 2))
            stats[policy] = reducer.last_stats
        return stats

    for rank, stats in enumerate(simulate(size, fn).results):
        for policy, s in stats.items():
            assert s["check_rounds"] == math.ceil(math.log2(size)), (algorithm, policy, s)
            assert s["check_bytes"] == 120 * (size - 1), (algorithm, policy, s)
            assert s["nonfinite_ranks"] == []


def test_nonfinite_is_part_of_the_handshake():
    def fn(comm):
        policy = "raise" if comm.rank == 1 else "propagate"
        try:
            sc.SparseAllreduce("topka", DENSITY, comm=comm, nonfinite=policy)(_grad(N, comm.rank, 1))
        except ValueError as exc:
            return str(exc)

    for message in simulate(3, fn).results:
        # topka's own options are its COO codec options, shown with nonfinite in sorted order
        codec = "index_codec='none', m='auto', nonfinite='{}', prefix='auto', q=256, r=8, s=2, t=0.2, value_codec='none'"
        assert (f"options: ranks [0, 2] have {{{codec.format('propagate')}}}; "
                f"ranks [1] have {{{codec.format('raise')}}}") in message


# -- gloo: the same, between processes ----------------------------------------------------------
GLOO_CASES = ["+inf-one-rank-and--inf-another", "nan-several-ranks", "mixed"]


def _gloo_rank(rank, world_size):
    from sparsecomm.comm import TorchComm

    comm = TorchComm()
    outcomes = {}
    for algorithm in ALGORITHMS:
        for policy in ("propagate", "raise"):
            for case, make in CASES:
                if case not in GLOO_CASES:
                    continue
                where = {r % world_size: v for r, v in make(world_size).items()}
                reducer = sc.SparseAllreduce(algorithm, DENSITY, comm=comm, nonfinite=policy)
                reducer(_grad(N, rank, 1))
                before = reducer.residual.clone()
                try:   # lists, not tensors: tensors would travel back through shared memory
                    result = reducer(_poison(_grad(N, rank, 2), rank, where)).tolist()
                except ValueError as exc:
                    result = str(exc)
                outcomes[algorithm, policy, case] = (result, torch.equal(before, reducer.residual))
    return outcomes


@pytest.mark.distributed
def test_nonfinite_policy_on_gloo():
    size = 3
    runs = spawn(_gloo_rank, size, timeout=240)
    for algorithm in ALGORITHMS:
        for policy in ("propagate", "raise"):
            for case, make in CASES:
                if case not in GLOO_CASES:
                    continue
                where = {r % size: v for r, v in make(size).items()}
                ref = _dense_reference(size, where, torch.float32)
                results = [runs[rank][algorithm, policy, case] for rank in range(size)]
                label = (algorithm, policy, case)
                assert all(unchanged for _, unchanged in results), label
                if policy == "propagate":
                    assert all(_same_as_dense(torch.tensor(out), ref) for out, _ in results), label
                else:
                    messages = {out for out, _ in results}
                    assert len(messages) == 1 and all(isinstance(m, str) for m in messages), (label, messages)
                    assert messages.pop().startswith(f"non-finite gradient on ranks {sorted(where)} ("), label


# -- GradScaler skips the step on every rank ------------------------------------------------------
OVERFLOW_STEP = 2


def _grad_scaler_rank(rank, world_size, algorithm):
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4)), bucket_cap_mb=0.001)
    state = sc.DDPHookState(algorithm, 0.1)   # nonfinite="propagate" is the hook's default
    model.register_comm_hook(state, sc.ddp_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)
    gen = torch.Generator().manual_seed(rank)
    history = []
    for step in range(4):
        x = torch.randn(16, 8, generator=gen)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(x).float().square().mean()
        if step == OVERFLOW_STEP and rank == 1:
            loss = loss * float("inf")   # a hand-made overflow on one rank only
        opt.zero_grad()
        before = [p.detach().clone() for p in model.parameters()]
        residuals_before = {k: v.clone() for k, v in state.local_state_dict()["residuals"].items()}
        scaler.scale(loss).backward()
        scale = scaler.get_scale()
        scaler.step(opt)
        scaler.update()
        residuals_after = state.local_state_dict()["residuals"]
        history.append({
            "scale_before": scale, "scale_after": scaler.get_scale(),
            "params_unchanged": all(torch.equal(b, p) for b, p in zip(before, model.parameters())),
            "residuals_unchanged": residuals_before.keys() == residuals_after.keys() and all(
                torch.equal(residuals_before[k], residuals_after[k]) for k in residuals_before),
            "grads_finite": all(bool(torch.isfinite(p.grad).all()) for p in model.parameters()),
        })
    params = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).tolist()
    return history, params


@pytest.mark.distributed
@pytest.mark.parametrize("algorithm", ["topka", "gtopk", "spardl"])
def test_grad_scaler_skips_the_step_on_every_rank(algorithm):
    runs = spawn(_grad_scaler_rank, 2, algorithm, timeout=120)
    for rank, (history, params) in enumerate(runs):
        for step, record in enumerate(history):
            overflow = step == OVERFLOW_STEP
            assert record["grads_finite"] is not overflow, (algorithm, rank, step, record)
            assert record["params_unchanged"] is overflow, (algorithm, rank, step, record)
            # the scaler saw the overflow on every rank: it halved the scale everywhere
            assert (record["scale_after"] < record["scale_before"]) is overflow, (algorithm, rank, step, record)
            if overflow:
                assert record["residuals_unchanged"], (algorithm, rank, step)
        assert params == runs[0][1], (algorithm, rank)   # the ranks never diverged
