"""Exact resume through the DDP hook (docs/reliability.md, "Resume matrix").

For every registered algorithm (and the variants with adaptive state: spardl's B-SAG h,
topkdsa's QSGD step, gssgd's random HEAVYMIX), every DDP configuration below and P = 2 and 3
(gloo, CPU): train STEPS steps without interruption, taking checkpoints (model, optimizer,
``DDPHookState.state_dict()``) after steps RESUME_AT; then, in FRESH processes, build the
model, DDP and hook state anew, load a checkpoint and train to STEPS. The parameters must be
bit-identical to the uninterrupted run's.

What makes this hard: a fresh DDP reduces its initial bucket layout in its first iteration
and rebuilds its buckets after it, so the resumed run's first step arrives in other buckets
than the uninterrupted run's step t+1. The hook reduces every step in the layout of the
first iteration it saw (its recorded layout, part of the state_dict), regrouping DDP's buckets when they
differ (sparsecomm/hooks/ddp.py, "Bucket rebuilds and exact resume").

One group of processes runs every (configuration, algorithm) uninterrupted; a second, fresh
group resumes them all: two process groups per P. The checkpoints travel through the parent
as ``torch.save`` bytes, as they would through a file.
"""

from __future__ import annotations

import contextlib
import io

import pytest
import torch

from sparsecomm.testing import spawn

STEPS = 4
#: checkpoints after step 1 (the hook has seen only DDP's initial layout), 2 (it has seen the rebuilt
#: one, to be adopted at step 2) and 3 (the rebuilt layout is the recorded layout)
RESUME_AT = (1, 2, 3)
#: DDP configurations: (DDP keyword arguments, parameter dtype, micro-batches per step)
CONFIGS = {
    "plain": ({}, torch.float32, 1),
    "bucket_cap_mb=0.01": ({"bucket_cap_mb": 0.01}, torch.float32, 1),
    "gradient_as_bucket_view": ({"bucket_cap_mb": 0.02, "gradient_as_bucket_view": True}, torch.float32, 1),
    "static_graph": ({"bucket_cap_mb": 0.02, "static_graph": True}, torch.float32, 1),
    "no_sync x2": ({"bucket_cap_mb": 0.02}, torch.float32, 2),
    "fp16": ({"bucket_cap_mb": 0.02}, torch.float16, 1),
    "bf16": ({"bucket_cap_mb": 0.02}, torch.bfloat16, 1),
    "find_unused_parameters": ({"bucket_cap_mb": 0.02, "find_unused_parameters": True}, torch.float32, 1),
    # the hook's own option: collectives inside the hook, the regrouping without the worker
    "async_comm=False": ({"bucket_cap_mb": 0.02}, torch.float32, 1),
    # density warm-up: another density at every checkpoint (0.5, 0.25, 0.1, then 0.05)
    "density_schedule": ({"bucket_cap_mb": 0.02}, torch.float32, 1),
    # residuals kept narrow between steps (their own test below, not the whole matrix)
    "residual bfloat16": ({"bucket_cap_mb": 0.02}, torch.float32, 1),
    "residual int8": ({"bucket_cap_mb": 0.01}, torch.bfloat16, 1),
    # a per-parameter policy: DDP's buckets split into a dense part and two sparse treatments
    "policy": ({"bucket_cap_mb": 0.01}, torch.float32, 1),
    "policy, one bucket": ({}, torch.float32, 1),
}
#: the configurations of their own tests only
FOCUSED = ("residual bfloat16", "residual int8", "policy", "policy, one bucket")
#: DDPHookState options of a configuration (beyond the algorithm's); the schedule as its
#: to_state() dict, which DDPHookState accepts like the DensitySchedule it describes
HOOK_OPTIONS = {"async_comm=False": {"async_comm": False},
                "density_schedule": {"density_schedule": {"kind": "per_step", "densities": [0.5, 0.25, 0.1],
                                                          "every": 1}},
                "residual bfloat16": {"residual_dtype": torch.bfloat16},
                "residual int8": {"residual_dtype": "int8"}}


def _policy():
    import sparsecomm

    return sparsecomm.Policy([sparsecomm.Rule("dense", max_ndim=1),
                              sparsecomm.Rule(sparsecomm.Treatment(density=0.2), below=2000)],
                             dense_1d=False, dense_below=0)


def _algorithms(world_size: int, only: list[str] | None = None) -> dict[str, tuple[str, dict]]:
    import sparsecomm

    table = {name: (name, {}) for name in sparsecomm.algorithms.names()}
    table["spardl B-SAG"] = ("spardl", {"teams": world_size, "sag": "bruck"})
    table["topkdsa QSGD 8"] = ("topkdsa", {"quantize_bits": 8, "bucket_size": 64})
    table["gssgd random"] = ("gssgd", {"heavymix": "random"})
    # auto's trial calls measure time: a checkpoint taken before they end may keep another
    # candidate, so the matrix compares its model-only choice; its default, measured trials are
    # test_auto_with_measured_trials_resumes_exactly_once_decided below
    table["auto"] = ("auto", {"tune": 0})
    return table if only is None else {label: table[label] for label in only}


def _build(config: str, algorithm: str, options: dict, comm, world_size: int, warmup: int = 0):
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    import sparsecomm

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.c = nn.Linear(24, 96), nn.Linear(96, 64), nn.Linear(64, 6)
            self.unused = nn.Linear(8, 8)

        def forward(self, x):
            return self.c(torch.relu(self.b(torch.relu(self.a(x)))))

    kwargs, dtype, _ = CONFIGS[config]
    torch.manual_seed(0)
    net = Net().to(dtype)
    if not kwargs.get("find_unused_parameters"):
        net.unused.requires_grad_(False)
    model = DDP(net, **kwargs)
    density = 1.0 if algorithm == "dense" else 0.05
    policy = {"policy": _policy()} if config.startswith("policy") else {}
    state = sparsecomm.DDPHookState(algorithm, density, comm=comm, warmup_steps=warmup,
                                    **HOOK_OPTIONS.get(config, {}), **policy, **options)
    model.register_comm_hook(state, sparsecomm.ddp_hook)
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.05, momentum=0.9)
    return model, state, optimizer


def _step(model, optimizer, config: str, rank: int, step: int) -> None:
    import torch.nn.functional as F

    _, dtype, micro = CONFIGS[config]
    optimizer.zero_grad()
    for m in range(micro):
        gen = torch.Generator().manual_seed(1000 * rank + 10 * step + m)
        x = torch.randn(16, 24, generator=gen).to(dtype)
        y = torch.randint(0, 6, (16,), generator=gen)
        sync = contextlib.nullcontext() if m == micro - 1 else model.no_sync()
        with sync:
            F.cross_entropy(model(x).float(), y).backward()
    optimizer.step()


def _params(model) -> bytes:
    # as torch.save bytes: tensors returned through multiprocessing would travel as shared
    # memory file descriptors, which die with the rank
    buf = io.BytesIO()
    torch.save([p.detach().clone() for p in model.parameters()], buf)
    return buf.getvalue()


def _uninterrupted(rank, world_size, configs, warmup, only):
    from sparsecomm.comm.torch_comm import TorchComm

    comm = TorchComm(timeout=60)  # one Comm for every model: each hook state scopes its own calls
    out = {}
    for config in configs:
        for label, (algorithm, options) in _algorithms(world_size, only).items():
            model, state, optimizer = _build(config, algorithm, options, comm, world_size, warmup)
            checkpoints = {}
            for step in range(STEPS):
                _step(model, optimizer, config, rank, step)
                if step + 1 in RESUME_AT:
                    buf = io.BytesIO()
                    torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                                "hook": state.state_dict()}, buf)
                    checkpoints[step + 1] = buf.getvalue()
            out[(config, label)] = {"params": _params(model), "checkpoints": checkpoints}
    return out


def _resumed(rank, world_size, configs, warmup, only, checkpoints):
    checkpoints = checkpoints[rank]
    from sparsecomm.comm.torch_comm import TorchComm

    comm = TorchComm(timeout=60)
    out = {}
    for config in configs:
        for label, (algorithm, options) in _algorithms(world_size, only).items():
            for t in RESUME_AT:
                model, state, optimizer = _build(config, algorithm, options, comm, world_size, warmup)
                saved = torch.load(io.BytesIO(checkpoints[(config, label)][t]))  # weights_only: plain data
                model.module.load_state_dict(saved["model"])
                optimizer.load_state_dict(saved["optimizer"])
                state.load_state_dict(saved["hook"])
                for step in range(t, STEPS):
                    _step(model, optimizer, config, rank, step)
                out[(config, label, t)] = (_params(model), state.regrouped_buckets)
    return out


def _run_matrix(world_size: int, configs: list[str], warmup: int = 0,
                only: list[str] | None = None) -> tuple[dict, int]:
    """{(config, algorithm label, t): max |difference| of the parameters over every rank}, and
    how many DDP buckets the resumed runs regrouped into the recorded layout (rank 0)."""
    first = spawn(_uninterrupted, world_size, configs, warmup, only, timeout=600)
    # every rank resumes from its own checkpoint
    checkpoints = [{key: value["checkpoints"] for key, value in ranks.items()} for ranks in first]
    second = spawn(_resumed, world_size, configs, warmup, only, checkpoints, timeout=600)
    diffs = {}
    for key, value in first[0].items():
        for t in RESUME_AT:
            worst = 0.0
            for rank in range(world_size):
                ref, got = (torch.load(io.BytesIO(first[rank][key]["params"])),
                            torch.load(io.BytesIO(second[rank][key + (t,)][0])))
                for a, b in zip(ref, got):
                    if not torch.equal(a, b):
                        worst = max(worst, float((a.double() - b.double()).abs().max()) or float("nan"))
            diffs[key + (t,)] = worst
    regrouped = sum(second[0][key][1] for key in second[0])
    return diffs, regrouped


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize("world_size", [2, 3])
def test_resume_through_the_hook_is_bit_exact(world_size):
    diffs, regrouped = _run_matrix(world_size, [config for config in CONFIGS if config not in FOCUSED])
    assert regrouped > 0, "no resumed run met buckets other than its recorded layout's: the test exercised nothing"
    inexact = {key: diff for key, diff in diffs.items() if diff != 0.0}
    assert not inexact, f"{len(inexact)} of {len(diffs)} resumes differ: {inexact}"


@pytest.mark.distributed
def test_resume_inside_and_after_warmup_is_bit_exact():
    """warmup_steps=2 with checkpoints after steps 1 and 2 (inside the warm-up) and 3 (after
    it): the warm-up's dense allreduce also runs on the recorded layout's buckets (gloo's ring sums are
    position dependent for P >= 3), P = 3, small buckets, three algorithms."""
    diffs, regrouped = _run_matrix(3, ["bucket_cap_mb=0.01"], warmup=2, only=["topka", "spardl", "gssgd"])
    assert regrouped > 0, "no resumed run met buckets other than its recorded layout's: the test exercised nothing"
    inexact = {key: diff for key, diff in diffs.items() if diff != 0.0}
    assert not inexact, f"{len(inexact)} of {len(diffs)} resumes differ: {inexact}"


@pytest.mark.distributed
def test_resume_inside_and_after_a_density_schedule_is_bit_exact():
    """A density warm-up (0.5, 0.25, 0.1 for steps 0-2, then 0.05) with checkpoints after steps
    1, 2 and 3: the resumed hook must use the density of the step it resumes at, P = 3, three
    algorithms (one with adaptive state: oktopk's thresholds)."""
    diffs, regrouped = _run_matrix(3, ["density_schedule"], only=["topka", "spardl", "oktopk"])
    assert regrouped > 0, "no resumed run met buckets other than its recorded layout's: the test exercised nothing"
    inexact = {key: diff for key, diff in diffs.items() if diff != 0.0}
    assert not inexact, f"{len(inexact)} of {len(diffs)} resumes differ: {inexact}"


@pytest.mark.distributed
def test_resume_with_narrow_residuals_is_bit_exact():
    """Residuals kept in bfloat16 and in 8 bits (bfloat16 parameters, the smallest buckets): the
    checkpoint holds the widened values, the resumed hook narrows them to the same form. P = 3."""
    diffs, regrouped = _run_matrix(3, ["residual bfloat16", "residual int8"], only=["topka", "spardl", "zen"])
    assert regrouped > 0, "no resumed run met buckets other than its recorded layout's: the test exercised nothing"
    inexact = {key: diff for key, diff in diffs.items() if diff != 0.0}
    assert not inexact, f"{len(inexact)} of {len(diffs)} resumes differ: {inexact}"


@pytest.mark.distributed
def test_resume_with_a_per_parameter_policy_is_bit_exact():
    """Biases dense, small weights at density 0.2, the rest at the state's density: the buckets'
    split (and each part's residuals) is in the checkpoint; small buckets and one bucket, P = 3."""
    diffs, regrouped = _run_matrix(3, ["policy", "policy, one bucket"], only=["topka", "spardl", "gssgd"])
    assert regrouped > 0, "no resumed run met buckets other than its recorded layout's: the test exercised nothing"
    inexact = {key: diff for key, diff in diffs.items() if diff != 0.0}
    assert not inexact, f"{len(inexact)} of {len(diffs)} resumes differ: {inexact}"


# -- auto with its default, measured trials ------------------------------------------------------

#: auto's default options (tune=2 calls per shortlisted candidate, alpha/beta from a ping-pong) on
#: the small-bucket model: each bucket shortlists up to 4 candidates, tries them in steps 0-1, DDP's
#: rebuild at step 2 changes the buckets, whose trials then restart and end after step 9
AUTO_STEPS = 12
#: checkpoints after step 1 (trials of the initial layout under way), 5 (the rebuilt layout's trials
#: under way), 10 and 11 (every bucket has kept its candidate)
AUTO_RESUME_AT = (1, 5, 10, 11)


def _choices(state) -> dict:
    """Per layout bucket: the kept candidate, or None while its trials are under way."""
    local = state.local_state_dict()
    return {j: s.get("choice") for j, s in local["algorithm_states"].items()}


def _decided(state) -> bool:
    local = state.local_state_dict()
    return (local["layout_final"] and local["next_layout"] is None
            and len(local["algorithm_states"]) == len(local["layout"])
            and all("choice" in s for s in local["algorithm_states"].values()))


def _auto_uninterrupted(rank, world_size):
    from sparsecomm.comm.torch_comm import TorchComm

    model, state, optimizer = _build("bucket_cap_mb=0.01", "auto", {}, TorchComm(timeout=60), world_size)
    checkpoints, decided = {}, {}
    for step in range(AUTO_STEPS):
        _step(model, optimizer, "bucket_cap_mb=0.01", rank, step)
        if step + 1 in AUTO_RESUME_AT:
            buf = io.BytesIO()
            torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                        "hook": state.state_dict()}, buf)
            checkpoints[step + 1], decided[step + 1] = buf.getvalue(), _decided(state)
    return {"params": _params(model), "checkpoints": checkpoints, "decided": decided, "choices": _choices(state)}


def _auto_resumed(rank, world_size, checkpoints):
    from sparsecomm.comm.torch_comm import TorchComm

    comm = TorchComm(timeout=60)
    out = {}
    for t in AUTO_RESUME_AT:
        model, state, optimizer = _build("bucket_cap_mb=0.01", "auto", {}, comm, world_size)
        saved = torch.load(io.BytesIO(checkpoints[rank][t]))
        model.module.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        state.load_state_dict(saved["hook"])
        for step in range(t, AUTO_STEPS):
            _step(model, optimizer, "bucket_cap_mb=0.01", rank, step)
        out[t] = {"params": _params(model), "choices": _choices(state)}
    return out


def _auto_resume_runs(world_size: int = 2) -> list[dict]:
    """One row per checkpoint: whether every bucket had kept its candidate when it was taken,
    whether the resumed run is bit-identical to the uninterrupted one, whether it made the same
    choices, and whether its ranks agree (the same parameters and choices on every rank)."""
    first = spawn(_auto_uninterrupted, world_size, timeout=600)
    second = spawn(_auto_resumed, world_size, [ranks["checkpoints"] for ranks in first], timeout=600)
    rows = []
    for t in AUTO_RESUME_AT:
        ref = [torch.load(io.BytesIO(first[r]["params"])) for r in range(world_size)]
        got = [torch.load(io.BytesIO(second[r][t]["params"])) for r in range(world_size)]
        rows.append({
            "t": t, "decided": first[0]["decided"][t],
            "identical": all(torch.equal(a, b) for r in range(world_size) for a, b in zip(ref[r], got[r])),
            "same_choices": second[0][t]["choices"] == first[0]["choices"],
            "ranks_agree": all(torch.equal(a, b) for r in range(1, world_size) for a, b in zip(got[0], got[r]))
            and all(second[r][t]["choices"] == second[0][t]["choices"] for r in range(world_size)),
        })
    return rows


@pytest.mark.distributed
def test_auto_with_measured_trials_resumes_exactly_once_decided():
    """auto with its defaults (tune=2, ping-pong): a checkpoint taken once every bucket has kept
    its candidate resumes bit-identically; one taken while trials are under way resumes them
    (same order, each rank's own times so far), re-times the rest in the new processes and so may
    keep another candidate -- but its ranks always agree, and it is bit-identical whenever it
    kept the uninterrupted run's candidates (the trial calls themselves run in a fixed order)."""
    rows = _auto_resume_runs()
    assert any(row["decided"] for row in rows) and any(not row["decided"] for row in rows), rows
    for row in rows:
        assert row["ranks_agree"], row
        if row["decided"]:
            assert row["identical"] and row["same_choices"], row
        else:
            # the same candidates kept: bit-identical. Others may be too (a lossless codec
            # variant reduces bit for bit as its plain algorithm; with 2 ranks a + b is b + a)
            if row["same_choices"]:
                assert row["identical"], row
