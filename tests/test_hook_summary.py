"""DDPHookState.summary(): one line on the last step, on 2 gloo ranks.

The model is one bias-free Linear(100, 10): 1000 float32 parameters, one DDP bucket, so DDP's
dense ring allreduce sends 2 (P - 1) ceil(4000 / P) = 4000 bytes per rank at P = 2 -- the
"dense's 4 kB" every line below compares with.
"""

from __future__ import annotations

import re

import torch
import torch.nn as nn

import sparsecomm as sc
from sparsecomm.testing import spawn

DENSE_BYTES = 4000   # 2 (P - 1) ceil(4 * 1000 / P), P = 2


def _train(rank: int, world: int, algorithm: str, steps: int, options: dict, nan_at: int | None = None):
    """``steps`` steps of the Linear; the summary before the first and after each, and each
    step's bytes_sent from last_stats."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = DDP(nn.Linear(100, 10, bias=False))
    state = sc.register(model, sc.DDPHookState(algorithm, 0.01, **options))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(rank)
    lines, sent = [state.summary()], []
    for step in range(steps):
        optimizer.zero_grad()
        x = torch.randn(8, 100, generator=gen)
        if step == nan_at and rank == 1:
            x[0, 0] = float("nan")
        model(x).square().mean().backward()
        optimizer.step()
        lines.append(state.summary())
        sent.append(sum(s["bytes_sent"] for s in state.last_stats.values()))
    state.close()
    return lines, sent


def _bytes(text: str) -> float:
    number, unit = text.split()
    return float(number) * {"B": 1, "kB": 1e3, "MB": 1e6}[unit]


LINE = re.compile(r"^step (\d+): (.+?): sent ([\d.]+ k?B) = ([\d.]+)x dense's 4 kB, 1 bucket(?: \(\+(.+) setup\))?$")


def test_summary_gives_bytes_their_ratio_to_dense_the_algorithm_and_the_density():
    lines, sent = spawn(_train, 2, "topka", 3, {"async_comm": False})[0]
    assert lines[0] == "topka at density 0.01: no step reduced yet"
    for step, (line, wire) in enumerate(zip(lines[1:], sent), start=1):
        m = LINE.match(line)
        assert m, line
        assert int(m[1]) == step and m[2] == "topka, density 0.01", line
        # the bytes this rank sent (last_stats' bytes_sent), to 3 digits, and their ratio to dense's
        assert _bytes(m[3]) == float(f"{wire:.3g}") and 0 < wire < DENSE_BYTES, line
        assert float(m[4]) == float(f"{wire / DENSE_BYTES:.3g}"), line
        assert (m[5] is not None) == (step == 1), line   # the first call's handshake only


def test_summary_under_auto_names_the_algorithm_on_trial_and_the_first_steps_measurement():
    lines, sent = spawn(_train, 2, "auto", 2, {})[0]
    first = LINE.match(lines[1])
    assert first, lines[1]
    # the first step is not "0 B": its own call sent bytes, and the link measurement is named apart
    assert sent[0] > 0 and _bytes(first[3]) > 0
    assert re.fullmatch(r"auto trying \w+, density 0\.01", first[2]), lines[1]
    assert _bytes(first[5]) > 1e6, lines[1]   # the ping-pong's 1 KB, 64 KB and 1 MB messages
    assert LINE.match(lines[2])[5] is None, lines[2]


def test_summary_during_warmup_and_after_a_nonfinite_gradient():
    lines, _ = spawn(_train, 2, "topka", 4, {"warmup_steps": 2}, nan_at=3)[0]
    assert lines[1:3] == [f"step {s}: warm-up, DDP's dense allreduce (2 warm-up steps; topka from step 3)"
                          for s in (1, 2)]
    assert LINE.match(lines[3])[2] == "topka, density 0.01", lines[3]
    # rank 1's NaN: the bucket went dense (the raw gradients' sum), as many bytes as dense's
    assert lines[4] == "step 4: topka, density 0.01, NaN/Inf on rank 1: dense sum: sent 4 kB = 1x dense's 4 kB, " \
                       "1 bucket", lines[4]


def _auto_placement(rank: int, world: int) -> list[str]:
    """hierarchy="auto" without a topology (no torchrun variables) is flat; past DDP's bucket
    rebuild at step 3 its reducers are rebuilt from the residual pieces."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4)), bucket_cap_mb=0.004)
    state = sc.register(model, sc.DDPHookState("topka", 0.1, hierarchy="auto", async_comm=False))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(4):
        optimizer.zero_grad()
        model(torch.randn(8, 16)).square().mean().backward()
        optimizer.step()
    state.close()
    return [state.summary(), state.step]


def test_auto_placement_without_a_topology_survives_the_bucket_rebuild():
    for line, step in spawn(_auto_placement, 2, timeout=120):
        assert step == 4 and line.startswith("step 4: topka, density 0.1: sent "), line
