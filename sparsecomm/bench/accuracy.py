"""Time to accuracy: ``python -m sparsecomm.bench accuracy ...``.

Every method (dense, each sparsecomm algorithm at ``--density``, PyTorch's fp16 / PowerSGD
hooks) trains one task (:mod:`sparsecomm.bench.tasks`) with DDP from the same initial weights
and the same data order for the same step budget. The methods run *interleaved*: all models
live at once and take turns of ``eval_every`` updates each, so a load spike on a shared
machine hits every method alike. After each turn a method is evaluated on the held-out set
(test accuracy and loss; evaluation time is not counted). Recorded per method: accuracy and
loss against updates and against training wall time (the sum of its update times, each the
slowest rank's), time per update (median), bytes sent per rank per update (median), and the
time and updates to the target accuracy -- by default 99% of the best accuracy dense reaches
in the same run (``--target-fraction``), or ``--target`` (absolute).

A task declares its metric (:class:`sparsecomm.bench.tasks.Metric`): test accuracy, higher is
better, for every task but ``wikitext2`` and ``wikitext2_sgd``, whose metric is the perplexity of
their language model on the held-out text, lower is better (its next-word accuracy is recorded too). There the default
target is within 2% of the best (lowest) perplexity dense reaches in the same run
(``--target-margin``), and a method reaches it at its first evaluation at or below it. The
table, the JSON (``metric``, ``higher_is_better``; each curve point and ``best_`` / ``final_``
per method under the metric's name) and the plots name the metric. A sequential task (the
language model) trains by truncated backpropagation through time: every method carries its own
LSTM state from one update to the next, and the held-out text is read as streams the same way.

``NAME@SCHEDULE`` runs an algorithm with a density warm-up (:class:`sparsecomm.DensitySchedule`)
over the first ``--schedule-steps`` updates (default a fifth of the budget): ``@gs`` gs-SGD's
25% -> 7.25% -> 1.5% in three equal stages, ``@dgc`` DGC's exponential decay from 25% in four
stages; ``--density`` after it. ``@acc`` is adaptive density instead (Accordion's rule,
:meth:`sparsecomm.DensitySchedule.adaptive`): 10x ``--density`` in a critical regime (the first
interval, and any interval after one whose accumulated gradient's norm changed by 50% or more),
``--density`` otherwise, decided every ``--schedule-steps / 2`` updates.

``NAME+mc`` runs an algorithm with momentum correction (Deep Gradient Compression, Lin et al.
2018, section 3.2; :mod:`sparsecomm.reduce.local_update`): the task's SGD momentum moves into the
hook (``DDPHookState(momentum=m, nesterov=...)``, m and nesterov the optimizer's) and the optimizer
is rebuilt without it (``momentum=0``); so does its weight decay, which then joins each rank's
gradient before the hook (as in DGC, so the decay gathers momentum as it did in the optimizer).
``NAME+mcm`` adds momentum factor masking (DGC 3.3: ``momentum_masking=True``). A task that clips
its averaged gradient to a norm c (the language model) clips each rank's gradient before the hook
instead, to c sqrt(P) (DGC's local clipping, ``clip_norm=c P``: the hook clips each rank to
``clip_norm / sqrt(P)`` of a threshold on the *sum* over ranks, which is P times the average's);
``+clip=X`` sets c (also without ``+mc``). Modifiers compose with a warm-up in any order
(``topka@dgc+mc``). ``dense+mc`` trains as ``dense`` (every coordinate sent each step: a sanity
check). Refused for PyTorch's hooks and for a task whose optimizer has no momentum (Adam: use
``wikitext2_sgd`` instead of ``wikitext2``).

``NAME+res=bf16`` / ``NAME+res=int8`` keep the hook's residuals in bfloat16 or 8 bits between
steps (``DDPHookState(residual_dtype=...)``, :mod:`sparsecomm.reduce.residual_store`); ``+policy``
runs the default per-parameter policy (``policy=sparsecomm.Policy()``: 1-D parameters and those
under 4096 elements dense). The JSON records each method's ``state_bytes_per_param`` (residuals and
velocities the hook keeps, per parameter of the model) and mean ``residual_rounding``.

``--hierarchy flat node`` (or ``both``) trains every sparsecomm method in each hierarchy given,
interleaved in the same run: flat, and two-level (``DDPHookState(hierarchy="node")``: dense
inside a node, the algorithm between nodes on each rank's shard), on the launcher's nodes
(``python -m sparsecomm.launch --nnodes 2 --nproc-per-node 2 --bandwidth 1gbit``) or
``--nproc-per-node L`` when the benchmark starts its ranks itself. Two-level rows are labelled
``NAME (two-level)`` and add the bytes per rank per update sent between nodes; the target stays
a fraction of flat dense's best accuracy. PyTorch's hooks run flat only.

Run it under the launcher for real links (the emulated 1 Gbit/s cluster)::

    python -m sparsecomm.launch --nproc 4 --bandwidth 1gbit -- \\
        python -m sparsecomm.bench accuracy --task mlp --algorithms all

or alone (``--nproc`` ranks on loopback). Rank 0 prints the table and writes
``accuracy_<task>_P<P>.json`` and ``accuracy_<task>_P<P>.png`` (accuracy against wall time and
against updates) to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from .. import algorithms
from ..comm.topology import Topology
from ..hooks import DDPHookState, Policy, register
from ..launch import describe_link
from ..reduce import DensitySchedule
from ..testing import launched, run_ranks
from . import baselines
from .common import HIERARCHY_CHOICES, hierarchies_of
from .plots import plain_log_ticks, pyplot
from .tasks import (ACCURACY, LANGUAGE_TASKS, METRICS, TASKS, Metric, Task, detach_state, evaluation_sums, loss_of,
                    make_task, metric_of, stream_order, wikitext2_dir)

__all__ = ["main", "run_rank", "time_to_target", "schedule_preset", "format_table", "Method", "parse_method",
           "move_momentum"]

#: density warm-ups by name, over ``steps`` updates (``NAME@preset``)
SCHEDULE_PRESETS = ("gs", "dgc", "acc")
#: ``@acc``: the high density as a multiple of ``--density``, and the relative change of the
#: accumulated gradient's norm that marks a critical regime (Accordion's eta)
ACCORDION_HIGH, ACCORDION_ETA = 10.0, 0.5


def schedule_preset(name: str, steps: int, density: float = 0.01) -> DensitySchedule:
    """``gs``: gs-SGD's 25% -> 7.25% -> 1.5% (section 5's per-epoch list) in three equal
    stages of ``steps``; ``dgc``: DGC's exponential warm-up from 25% in four stages; ``acc``:
    Accordion's adaptive rule (Agarwal et al., MLSys 2021, section 3) between ``density`` and
    10x it (at most 1), decided every ``steps // 2`` updates (half a warm-up's length: a tenth of
    the default budget) with eta 0.5."""
    if name == "gs":
        return DensitySchedule.per_step([0.25, 0.0725, 0.015], every=max(1, steps // 3))
    if name == "dgc":
        return DensitySchedule.exponential(0.25, warmup_steps=max(4, steps), stages=4)
    if name == "acc":
        return DensitySchedule.adaptive(density, min(1.0, ACCORDION_HIGH * density), interval=max(1, steps // 2),
                                        eta=ACCORDION_ETA)
    raise ValueError(f"unknown density schedule {name!r}; choose from {', '.join(SCHEDULE_PRESETS)}")


#: ``NAME+MODIFIER``: momentum correction, with momentum factor masking, the local clipping norm
MODIFIERS = ("mc", "mcm", "clip=X", "res=bf16", "res=int8", "policy")
#: ``+res=NAME``: the hook's residual_dtype
RESIDUAL_FORMS = {"bf16": "bfloat16", "int8": "int8"}


@dataclass(frozen=True)
class Method:
    """One ``--algorithms`` entry: ``NAME[@SCHEDULE][+mc|+mcm][+clip=X]`` (parts after the name
    in any order)."""

    text: str                       # as given: the method's name in the table, JSON and plots
    name: str                       # a registered algorithm or one of PyTorch's hooks
    schedule: str = ""              # a SCHEDULE_PRESETS name, or "" (none)
    correction: str = ""            # "mc" (momentum correction), "mcm" (with masking), or "" (none)
    clip: float | None = None       # +clip=X: the hook's clip_norm
    residual: str = ""              # +res=bf16 / +res=int8: the hook's residual_dtype, or "" (float32)
    policy: bool = False            # +policy: the hook's default per-parameter policy (sparsecomm.Policy())

    @property
    def baseline(self) -> bool:
        return baselines.is_baseline(self.name)

    @property
    def modified(self) -> bool:
        return bool(self.correction) or self.clip is not None or bool(self.residual) or self.policy


def parse_method(text: str) -> Method:
    """``topka@dgc+mc`` -> Method(name="topka", schedule="dgc", correction="mc"). Checks the
    syntax only (:func:`check_methods` checks the names)."""
    parts = re.split(r"(?=[@+])", text)
    name, schedule, correction, clip, residual, policy = parts[0], "", "", None, "", False
    if not name:
        raise ValueError(f"{text!r}: no algorithm before {text[:1]!r} (NAME[@SCHEDULE][+mc|+mcm][+clip=X])")
    for part in parts[1:]:
        kind, value = part[0], part[1:]
        if kind == "@":
            if schedule:
                raise ValueError(f"{text!r}: two density schedules")
            if not value:
                raise ValueError(f"{text!r}: '@' without a density schedule; choose from {', '.join(SCHEDULE_PRESETS)}")
            schedule = value
        elif value in ("mc", "mcm"):
            if correction:
                raise ValueError(f"{text!r}: momentum correction given twice (+mc, or +mcm with masking)")
            correction = value
        elif value.startswith("clip="):
            if clip is not None:
                raise ValueError(f"{text!r}: +clip given twice")
            try:
                clip = float(value[5:])
            except ValueError:
                clip = math.nan
            if not (math.isfinite(clip) and clip > 0):
                raise ValueError(f"{text!r}: +clip=X needs a finite norm X > 0, got {value[5:]!r}")
        elif value.startswith("res="):
            if residual:
                raise ValueError(f"{text!r}: +res given twice")
            residual = value[4:]
            if residual not in RESIDUAL_FORMS:
                raise ValueError(f"{text!r}: +res=NAME keeps the residual in {' or '.join(RESIDUAL_FORMS)}, "
                                 f"not {residual!r}")
        elif value == "policy":
            if policy:
                raise ValueError(f"{text!r}: +policy given twice")
            policy = True
        else:
            raise ValueError(f"{text!r}: unknown modifier '+{value}'; choose from "
                             f"{', '.join('+' + m for m in MODIFIERS)}")
    return Method(text, name, schedule, correction, clip, residual, policy)


def move_momentum(optimizer: torch.optim.Optimizer, method: str = "", task: str = "the task"
                  ) -> tuple[float, bool, list[tuple[list[torch.Tensor], float]]]:
    """Momentum correction's optimizer: takes the momentum (and weight decay) out of
    ``optimizer``, an SGD with momentum, in place. Returns (momentum, nesterov, [(params, weight
    decay)] of the groups that had one): the hook's velocity takes the momentum, each rank's
    gradient the decay (:func:`add_weight_decay`). Refuses another optimizer, one without momentum,
    groups of different momenta, and dampening (which the velocity has not)."""
    what = f"{method!r}: " if method else ""
    groups = optimizer.param_groups
    if not isinstance(optimizer, torch.optim.SGD) or not all(g.get("momentum", 0) > 0 for g in groups):
        kind = type(optimizer).__name__
        has = "without momentum" if isinstance(optimizer, torch.optim.SGD) else "which has no SGD momentum"
        raise ValueError(f"{what}momentum correction (+mc, +mcm) moves the optimizer's momentum into the hook, but "
                         f"{task} trains with {kind} {has}; use a task trained with torch.optim.SGD(momentum > 0)"
                         f"{' (wikitext2_sgd instead of wikitext2)' if task == 'wikitext2' else ''}, or the method "
                         f"without +mc")
    momenta = {(g["momentum"], bool(g.get("nesterov", False))) for g in groups}
    if len(momenta) != 1:
        raise ValueError(f"{what}the optimizer's parameter groups have different momenta {sorted(momenta)}; the "
                         "hook keeps one")
    if any(g.get("dampening", 0) for g in groups):
        raise ValueError(f"{what}momentum correction has no dampening; the optimizer's is "
                         f"{groups[0].get('dampening')}")
    (momentum, nesterov), = momenta
    decays = []
    for g in groups:
        if g.get("weight_decay", 0):
            decays.append((list(g["params"]), g["weight_decay"]))
        g["momentum"], g["nesterov"], g["weight_decay"] = 0.0, False, 0.0
    return float(momentum), nesterov, decays


def add_weight_decay(decays: list[tuple[list[torch.Tensor], float]]) -> list:
    """``grad + decay * param`` for every parameter of ``decays`` as backward produces the
    gradient, before DDP's hook reads it (handles, to remove)."""
    handles = []
    for params, decay in decays:
        for p in params:
            handles.append(p.register_hook(lambda grad, p=p, decay=decay: grad.add(p.detach(), alpha=decay)))
    return handles


def time_to_target(curve: list[dict], target: float, metric: Metric = ACCURACY) -> tuple[float | None, int | None]:
    """(training seconds, updates) at the first evaluation whose ``metric`` reaches ``target``:
    accuracy >= it, perplexity <= it."""
    for point in curve:
        if metric.reached(point[metric.name], target):
            return point["time_s"], point["updates"]
    return None, None


def _build(method: str, task: Task, density: float, schedule_steps: int, topology: Topology | None = None,
           lr: float | None = None):
    """DDP model, hook state (or PyTorch hook), optimizer of ``method`` and the norm to clip the
    reduced gradient to (the task's, or None where the hook clips each rank's gradient); two-level
    over ``topology`` when one is given; ``lr`` overrides the task's learning rate."""
    spec = parse_method(method)
    ddp = DDP(task.build())
    optimizer = task.optimizer(list(ddp.parameters()))
    if lr is not None:
        for group in optimizer.param_groups:
            group["lr"] = lr
    clip = task.clip
    if spec.baseline:
        state = baselines.TorchHook(spec.name)
        state.register(ddp)
    else:
        schedule = schedule_preset(spec.schedule, schedule_steps, density) if spec.schedule else None
        placed = {} if topology is None else {"hierarchy": "node", "nodes": topology}
        local: dict[str, Any] = {}
        if spec.correction:
            momentum, nesterov, decays = move_momentum(optimizer, method, task.name)
            add_weight_decay(decays)
            local = {"momentum": momentum, "nesterov": nesterov, "momentum_masking": spec.correction == "mcm"}
        local_clip = spec.clip if spec.clip is not None else (task.clip if spec.correction else None)
        if local_clip is not None:   # each rank clips before the hook, instead of the average after it:
            # clip_norm is a threshold on the sum over ranks (each rank gets clip_norm / sqrt(P)), the
            # task's on the average -- P times less
            local["clip_norm"], clip = local_clip * dist.get_world_size(), None
        if spec.residual:
            local["residual_dtype"] = RESIDUAL_FORMS[spec.residual]
        if spec.policy:
            local["policy"] = Policy()
        state = DDPHookState(spec.name, 1.0 if spec.name == "dense" else density, density_schedule=schedule,
                             **placed, **local)
        register(ddp, state)
    return ddp, state, optimizer, clip


def _evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int,
              sequential: bool = False) -> tuple[float, float]:
    """(accuracy, mean loss) over every rank's share of the test set, per predicted position
    (:func:`sparsecomm.bench.tasks.evaluation_sums`: every token of a language model's text)."""
    totals = torch.tensor(evaluation_sums(model, x, y, batch, sequential), dtype=torch.float64)
    dist.all_reduce(totals)
    return (totals[0] / totals[2]).item(), (totals[1] / totals[2]).item()


def _order(n: int, batch: int, steps: int, seed: int, sequential: bool = False) -> list[torch.Tensor]:
    """Index batches of one rank: a fresh permutation per pass; the same for every method.
    ``sequential``: the streams of truncated backpropagation through time
    (:func:`sparsecomm.bench.tasks.stream_order`) instead."""
    if sequential:
        return stream_order(n, batch, steps)
    gen = torch.Generator().manual_seed(seed)
    out: list[torch.Tensor] = []
    while len(out) < steps:
        perm = torch.randperm(n, generator=gen)
        out += [perm[i:i + batch] for i in range(0, n - batch + 1, batch)][:steps - len(out)]
    return out


def run_rank(rank: int, world: int, cfg: dict) -> dict | None:
    """Train every method of ``cfg`` on this rank; rank 0 returns the report (others None)."""
    torch.set_num_threads(max(1, cfg["threads"]))
    task = make_task(cfg["task"], cfg.get("data_dir"), cfg["seed"], cfg.get("hidden"), cfg.get("width"))
    steps = cfg.get("steps") or task.steps
    eval_every = cfg.get("eval_every") or task.eval_every
    schedule_steps = cfg.get("schedule_steps") or max(1, steps // 5)
    per = len(task.train_x) // world
    x, y = task.train_x[rank * per:(rank + 1) * per], task.train_y[rank * per:(rank + 1) * per]
    if per < task.batch:
        raise ValueError(f"{cfg['task']}: {per} training samples per rank, fewer than a batch of {task.batch}")
    tper = len(task.test_x) // world
    test_x, test_y = task.test_x[rank * tper:(rank + 1) * tper], task.test_y[rank * tper:(rank + 1) * tper]
    order = _order(per, task.batch, steps, cfg["seed"] + rank, task.sequential)
    stream_len = per // task.batch   # sequential: the LSTM state starts from zeros every pass of the streams
    metric = task.metric
    hierarchies = cfg.get("hierarchies") or ["flat"]
    topology = None
    if "node" in hierarchies:   # the launcher's nodes, or the --nproc-per-node given without one
        topology = Topology(world // cfg["per_node"], cfg["per_node"]) if cfg.get("per_node") else Topology.from_env()
    runs = []
    for method in cfg["methods"]:  # the same initial weights for every method
        for hierarchy in hierarchies:
            if hierarchy == "node" and parse_method(method).baseline:
                continue
            torch.manual_seed(cfg["seed"])
            ddp, state, optimizer, clip = _build(method, task, cfg["density"], schedule_steps,
                                                 topology if hierarchy == "node" else None, cfg.get("lr"))
            acc, loss = _evaluate(ddp.module, test_x, test_y, task.eval_batch, task.sequential)
            runs.append({"method": method, "hierarchy": hierarchy, "ddp": ddp, "state": state,
                         "optimizer": optimizer, "clip": clip, "times": [], "bytes": [], "inter_bytes": [],
                         "train_loss": [],
                         "evals": [(0, acc, loss)], "done": False, "carry": None})
    target = cfg.get("target")
    start = time.perf_counter()
    for turn_start in range(0, steps, eval_every):
        for run in runs:   # interleaved: every method takes its turn of eval_every updates
            if run["done"]:
                continue
            ddp, state, optimizer = run["ddp"], run["state"], run["optimizer"]
            for step, idx in enumerate(order[turn_start:turn_start + eval_every], turn_start):
                t0 = time.perf_counter()
                optimizer.zero_grad()
                if task.sequential:
                    logits, carry = ddp(x[idx], None if step % stream_len == 0 else run["carry"])
                    run["carry"] = detach_state(carry)
                else:
                    logits = ddp(x[idx])
                loss = loss_of(logits, y[idx])
                loss.backward()
                if run["clip"]:
                    nn.utils.clip_grad_norm_(ddp.parameters(), run["clip"])
                optimizer.step()
                run["times"].append(time.perf_counter() - t0)
                run["bytes"].append(sum(s.get("bytes_sent", 0) for s in state.last_stats.values()))
                run["inter_bytes"].append(sum(s.get("inter_bytes_sent", 0) for s in state.last_stats.values()))
                run["train_loss"].append(loss.item())
            acc, test_loss = _evaluate(ddp.module, test_x, test_y, task.eval_batch, task.sequential)
            run["evals"].append((len(run["times"]), acc, test_loss))
            if target is not None and cfg.get("stop_at_target") and metric.reached(metric.of(acc, test_loss), target):
                run["done"] = True
        if rank == 0 and not cfg.get("quiet"):
            done = min(turn_start + eval_every, steps)
            named = "" if metric is ACCURACY else f"{metric.name} "
            width = max(len(_label(r["method"], r["hierarchy"])) for r in runs)
            print(f"[{time.perf_counter() - start:.0f} s] {done}/{steps} updates", flush=True)
            for r in runs:   # one short line per method (16 methods on one line ran to ~400 characters)
                print(f"  {_label(r['method'], r['hierarchy']):<{width}}  {named}"
                      f"{metric.show(metric.of(*r['evals'][-1][1:]))}", flush=True)
    methods = []
    for run in runs:
        # each update's time as the slowest rank saw it (DDP synchronises every update)
        times = torch.tensor(run["times"], dtype=torch.float64)
        dist.all_reduce(times, op=dist.ReduceOp.MAX)
        cumulative = [0.0] + torch.cumsum(times, 0).tolist()
        curve = [{"updates": u, "time_s": cumulative[u], "accuracy": a, "test_loss": l,
                  **({} if metric is ACCURACY else {metric.name: metric.of(a, l)})} for u, a, l in run["evals"]]
        state = run["state"]
        two_level = run["hierarchy"] == "node"
        methods.append({
            "method": run["method"], "label": _label(getattr(state, "label", run["method"]), run["hierarchy"]),
            **({"hierarchy": run["hierarchy"],
                "inter_bytes": statistics.median(run["inter_bytes"]) if two_level and run["inter_bytes"] else None}
               if "node" in hierarchies else {}),
            "density": state.density,
            "density_schedule": (state.density_schedule.spec_text()
                                 if getattr(state, "density_schedule", None) is not None else None),
            # momentum correction's options of the hook ({} when off) and the optimizer's momentum
            "local_update": (state.local_update.options() if hasattr(state, "local_update") else {}),
            "residual_dtype": getattr(state, "residual_dtype", None) or "float32",
            "policy": None if getattr(state, "policy", None) is None else state.policy.text(),
            # the hook's residuals and velocities kept between steps, per parameter of the model
            "state_bytes_per_param": _state_bytes(state) / sum(p.numel() for p in ddp.parameters()),
            "residual_rounding": _mean_stat(state, "residual_rounding"),
            "optimizer_momentum": run["optimizer"].param_groups[0].get("momentum"),
            "clip_after_reduction": run["clip"],
            "step_s": statistics.median(times.tolist()[1:] or times.tolist()),
            "bytes": statistics.median(run["bytes"]) if run["bytes"] else 0,
            "bytes_total": float(sum(run["bytes"])),
            "updates": len(run["times"]), "final_accuracy": curve[-1]["accuracy"],
            "best_accuracy": max(p["accuracy"] for p in curve), "final_test_loss": curve[-1]["test_loss"],
            **({} if metric is ACCURACY else {f"final_{metric.name}": curve[-1][metric.name],
                                              f"best_{metric.name}": metric.best([p[metric.name] for p in curve])}),
            "train_loss": run["train_loss"], "curve": curve})
        if hasattr(state, "close"):
            state.close()
    if rank != 0:
        return None
    dense = next((m for m in methods if m["method"] == "dense" and m.get("hierarchy", "flat") == "flat"), None)
    if target is None:
        if dense is None:
            raise ValueError("no --target given and dense is not among the methods: nothing to take the target from")
        best = dense[f"best_{metric.name}"]
        target = metric.target(best, cfg["target_fraction"], cfg.get("target_margin", 0.02))
        if metric.higher_is_better:
            how = f"{100 * cfg['target_fraction']:g}% of dense's best {metric.name} in this run ({100 * best:.2f}%)"
        else:
            how = (f"within {100 * cfg.get('target_margin', 0.02):g}% of dense's best {metric.name} in this run "
                   f"({best:.2f})")
    else:
        how = "given (--target)"
    for m in methods:
        m["time_to_target_s"], m["updates_to_target"] = time_to_target(m["curve"], target, metric)
    params = sum(p.numel() for p in task.build().parameters())
    where = cfg.get("where") or describe_link()[0]
    report = {"task": task.name, "data": task.data, "generated": task.generated, "model": task.model,
              "params": params, "P": world, "where": where, "batch": task.batch, "steps": steps,
              "seed": cfg["seed"], "lr": cfg.get("lr"),
              "metric": metric.name, "higher_is_better": metric.higher_is_better,
              "eval_every": eval_every, "density": cfg["density"], "schedule_steps": schedule_steps,
              "target": target, "target_how": how, "interleaved": True, "methods": methods}
    if topology is not None:
        report.update({"hierarchies": hierarchies, "nodes": topology.nodes, "ranks_per_node": topology.ranks_per_node})
    return report


def _state_bytes(state: Any) -> float:
    """The bytes a hook state keeps between steps (residuals, velocities); 0 for PyTorch's hooks."""
    stats = getattr(state, "last_stats", {}) or {}
    return float(sum(s.get("residual_bytes", 0) + s.get("velocity_bytes", 0) for s in stats.values()))


def _mean_stat(state: Any, key: str) -> float | None:
    values = [s[key] for s in (getattr(state, "last_stats", {}) or {}).values() if s.get(key) is not None]
    return statistics.fmean(values) if values else None


def _label(name: str, hierarchy: str) -> str:
    return f"{name} (two-level)" if hierarchy == "node" else name


def format_table(report: dict) -> str:
    """Markdown table: time to target, speedup over dense in it, updates, accuracy, costs."""
    dense = next((m for m in report["methods"] if m["method"] == "dense" and m.get("hierarchy", "flat") == "flat"),
                 None)
    base = dense["time_to_target_s"] if dense else None
    between = any("inter_bytes" in m for m in report["methods"])   # --hierarchy node: bytes between nodes
    metric = METRICS[report.get("metric", "accuracy")]
    lines = [f"| method | time to target (s) | speedup vs dense | updates to target | final {metric.name} | "
             "per-update (ms) | MB sent / rank / update |" + (" MB between nodes / rank / update |" if between else ""),
             "|---|---:|---:|---:|---:|---:|---:|" + ("---:|" if between else "")]
    for m in report["methods"]:
        t = m["time_to_target_s"]
        reached = t is not None
        speed = f"{base / t:.2f}x" if reached and base and t > 0 else "-"
        shown_t = f"{t:.1f}" if reached else "not reached"
        shown_u = str(m["updates_to_target"]) if reached else f">{m['updates']}"
        lines.append(f"| {m['label']} | {shown_t} | {speed} | {shown_u} | "
                     f"{metric.show(m[f'final_{metric.name}'])} | {1000 * m['step_s']:.0f} | "
                     f"{m['bytes'] / 1e6:.3f} |"
                     + (f" {m['inter_bytes'] / 1e6:.3f} |" if m.get("inter_bytes") is not None
                        else " - |" if between else ""))
    return "\n".join(lines)


def plot(report: dict, path: Path) -> Path | None:
    """The task's metric (accuracy; perplexity, on a log scale) against training wall time and
    against updates, one line per method (PyTorch's hooks dashed, the target dotted), in the
    style of the collectives' plots."""
    plt = pyplot()
    if plt is None:
        print("matplotlib is not installed: no plot (pip install matplotlib)")
        return None
    metric = METRICS[report.get("metric", "accuracy")]
    scale = 100 if metric is ACCURACY else 1
    fig, axes = plt.subplots(1, 2, figsize=(15, 5.2))
    colors = plt.get_cmap("tab20").colors
    for i, m in enumerate(report["methods"]):
        style = dict(marker="os^Dv"[i % 5], markersize=3, color=colors[(2 * i) % 20 + (i // 10) % 2],
                     linestyle=("--" if baselines.is_baseline(m["method"]) else "-." if "+mc" in m["method"]
                                else ":" if "@" in m["method"] else "-"),
                     label=m["label"], linewidth=2.2 if m["method"] == "dense" else 1.3)
        curve = m["curve"]
        axes[0].plot([p["time_s"] for p in curve], [scale * p[metric.name] for p in curve], **style)
        axes[1].plot([p["updates"] for p in curve], [scale * p[metric.name] for p in curve], **style)
    for ax, xlabel in zip(axes, ("training wall time (s, slowest rank; evaluation excluded)", "updates")):
        ax.axhline(scale * report["target"], color="black", linestyle=":", linewidth=1, label="target")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("test accuracy (%)" if metric is ACCURACY else f"held-out {metric.name} (lower is better)")
        if not metric.higher_is_better:
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
    axes[0].set_xscale("log")
    plain_log_ticks(axes[0].xaxis)
    axes[1].legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    tag = "GENERATED data" if report["generated"] else "real data"
    fig.suptitle(f"time to {metric.name}: {report['task']} ({report['model']}, {tag}), P = {report['P']}, "
                 f"{report['where']}, density {report['density']:g}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write(report: dict, out: str | os.PathLike) -> list[Path]:
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = (f"accuracy_{report['task']}_{report['nodes']}x{report['ranks_per_node']}" if "nodes" in report
            else f"accuracy_{report['task']}_P{report['P']}")
    path = out_dir / f"{stem}.json"
    path.write_text(json.dumps(report, indent=1))
    written = [path]
    png = plot(report, out_dir / f"{stem}.png")
    if png:
        written.append(png)
    return written


def print_report(report: dict) -> None:
    banner = f"DATA: {report['data']}"
    line = "=" * min(110, max(60, len(banner) + 4))
    print(f"\n{line}\n  {banner}\n{line}")
    metric = METRICS[report.get("metric", "accuracy")]
    print(f"time to {metric.name}: task {report['task']}, {report['model']} "
          f"({report['params'] / 1e6:.2f} M parameters), "
          f"P = {report['P']}, {report['where']}, batch {report['batch']} per rank, budget {report['steps']} updates, "
          f"evaluated every {report['eval_every']}, density {report['density']:g}")
    shown = f"{100 * report['target']:.2f}% test accuracy" if metric is ACCURACY else \
        f"{report['target']:.2f} held-out {metric.name}"
    print(f"target: {shown} ({report['target_how']}); every method from the same "
          "initial weights and data order, interleaved; time = training wall time of the slowest rank, evaluation "
          "excluded; per-update and bytes: medians")
    print(format_table(report))
    sys.stdout.flush()


def expand_methods(names: list[str]) -> list[str]:
    """``all``: dense, every registered algorithm, PyTorch's hooks (new algorithms join by themselves)."""
    out: list[str] = []
    for name in names:
        if name == "all":
            out += ["dense"] + [a for a in algorithms.names() if a != "dense"] + baselines.names()
        else:
            out.append(name)
    return list(dict.fromkeys(out))


def check_methods(methods: list[str]) -> list[Method]:
    """Each method parsed (:func:`parse_method`) and its names checked; ValueError naming the
    first bad one."""
    out = []
    for method in methods:
        spec = parse_method(method)
        out.append(spec)
        if spec.baseline:
            if spec.schedule:
                raise ValueError(f"{method!r}: PyTorch's hooks take no density schedule")
            if spec.modified:
                raise ValueError(f"{method!r}: PyTorch's hooks take no momentum correction, local clipping, residual "
                                 f"form or policy (options of sparsecomm's DDPHookState); run {spec.name!r} without "
                                 "modifiers")
            continue
        algorithms.get(spec.name)  # a clear error naming the registered ones
        if spec.schedule and spec.schedule not in SCHEDULE_PRESETS:
            raise ValueError(f"{method!r}: unknown density schedule {spec.schedule!r}; choose from "
                             f"{', '.join(SCHEDULE_PRESETS)}")
    return out


def check_task_methods(methods: list[str], task: Task) -> None:
    """Momentum correction needs the task's optimizer to be SGD with momentum
    (:func:`move_momentum`'s refusal, naming the method and task)."""
    corrected = [m for m in methods if parse_method(m).correction]
    if corrected:
        move_momentum(task.optimizer([nn.Parameter(torch.zeros(1))]), corrected[0], task.name)


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--task", choices=TASKS, default="mlp")
    ap.add_argument("--algorithms", nargs="+", default=["all"],
                    help="'all' (dense, every registered algorithm, torch_fp16, torch_powersgd) or names; "
                         f"NAME@SCHEDULE adds a density warm-up ({', '.join(SCHEDULE_PRESETS)}); NAME+mc momentum "
                         "correction (the task's SGD momentum in the hook, the optimizer without it), NAME+mcm with "
                         "momentum factor masking, NAME+clip=X local gradient clipping, NAME+res=bf16|int8 narrow residuals, "
                         "NAME+policy the default per-parameter policy; e.g. topka@dgc+mc")
    ap.add_argument("--density", type=float, default=0.01)
    ap.add_argument("--steps", type=int, default=None, help="step budget (default: the task's)")
    ap.add_argument("--eval-every", type=int, default=None, help="updates between evaluations (default: the task's)")
    ap.add_argument("--target", type=float, default=None,
                    help="absolute target: test accuracy in (0, 1], or held-out perplexity (> 0) for wikitext2 / "
                         "wikitext2_sgd")
    ap.add_argument("--target-fraction", type=float, default=0.99,
                    help="without --target, for an accuracy task: this fraction of dense's best accuracy in the "
                         "same run")
    ap.add_argument("--target-margin", type=float, default=0.02,
                    help="without --target, for wikitext2 / wikitext2_sgd (perplexity, lower is better): within "
                         "this fraction of dense's best perplexity in the same run (0.02: at most 1.02 times it)")
    ap.add_argument("--stop-at-target", action="store_true",
                    help="with --target: a method stops once it reaches it (saves time; its final accuracy is then "
                         "the accuracy at the target)")
    ap.add_argument("--schedule-steps", type=int, default=None,
                    help="updates of a NAME@SCHEDULE warm-up (default: a fifth of the budget)")
    ap.add_argument("--data-dir", default=None, help="CIFAR-10 batches (vgg16, resnet20), aclImdb (lstm), or a "
                    "folder with WikiText-2's test.txt and valid.txt (wikitext2, wikitext2_sgd; default: the copy "
                    "shipped)")
    ap.add_argument("--hidden", type=int, default=None,
                    help="mlp / digits: hidden width; wikitext2(_sgd): embedding and LSTM width")
    ap.add_argument("--width", type=float, default=None,
                    help="vgg16 / resnet20 / digits_cnn: channel width multiplier")
    ap.add_argument("--seed", type=int, default=0,
                    help="initial weights, data order (and the digits tasks' held-out split)")
    ap.add_argument("--lr", type=float, default=None, help="the optimizer's learning rate (default: the task's)")
    ap.add_argument("--nproc", type=int, default=4, help="ranks to start when not under a launcher")
    ap.add_argument("--hierarchy", nargs="+", choices=HIERARCHY_CHOICES, default=["flat"],
                    help="flat, node (two-level: dense inside a node, the algorithm between nodes) or both: "
                         "every sparsecomm method trained in each, interleaved in the same run")
    ap.add_argument("--nproc-per-node", type=int, default=None,
                    help="ranks per node of --hierarchy node when the benchmark starts its own ranks (under a "
                         "launcher: its LOCAL_WORLD_SIZE)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    ap.add_argument("--out", default="bench_results")
    ap.add_argument("--quiet", action="store_true", help="no progress line per turn")
    ap.add_argument("--timeout", type=float, default=3600.0)


def config(args: argparse.Namespace, ap: argparse.ArgumentParser) -> dict[str, Any]:
    methods = expand_methods(args.algorithms)
    try:
        check_methods(methods)
    except ValueError as exc:
        ap.error(str(exc))
    if not 0 < args.density <= 1:
        ap.error(f"--density must be in (0, 1], got {args.density}")
    metric = metric_of(args.task)
    if args.target is not None and metric.higher_is_better and not 0 < args.target <= 1:
        ap.error(f"--target must be in (0, 1], got {args.target}")
    if args.target is not None and not metric.higher_is_better and not args.target > 0:
        ap.error(f"--target ({args.task}: a {metric.name}) must be > 0, got {args.target}")
    if not 0 < args.target_fraction <= 1:
        ap.error(f"--target-fraction must be in (0, 1], got {args.target_fraction}")
    if not args.target_margin >= 0:
        ap.error(f"--target-margin must be >= 0, got {args.target_margin}")
    if args.task in LANGUAGE_TASKS and args.data_dir is not None:
        try:
            wikitext2_dir(args.data_dir)
        except ValueError as exc:
            ap.error(str(exc))
    if args.target is None and "dense" not in methods:
        ap.error("without --target, dense must be among --algorithms (the target is a fraction of its accuracy)")
    if args.lr is not None and not (math.isfinite(args.lr) and args.lr > 0):
        ap.error(f"--lr must be > 0, got {args.lr}")
    if any(parse_method(m).correction for m in methods):
        try:
            check_task_methods(methods, make_task(args.task, args.data_dir, args.seed, args.hidden, args.width,
                                                  generated_sizes=(100, 10)))
        except ValueError as exc:
            ap.error(str(exc))
    for name in ("steps", "eval_every", "schedule_steps"):
        value = getattr(args, name)
        if value is not None and value < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    hierarchies = hierarchies_of(ap, args, launched())
    if hierarchies == ["node"] and args.target is None:
        ap.error("--hierarchy node alone has no flat dense to take the target from: use --hierarchy both, "
                 "or give --target")
    return {"hierarchies": hierarchies, "per_node": args.nproc_per_node,
            "task": args.task, "methods": methods, "density": args.density, "steps": args.steps,
            "eval_every": args.eval_every, "target": args.target, "target_fraction": args.target_fraction,
            "target_margin": args.target_margin,
            "stop_at_target": args.stop_at_target, "schedule_steps": args.schedule_steps, "data_dir": args.data_dir,
            "hidden": args.hidden, "width": args.width, "seed": args.seed, "lr": args.lr, "threads": args.threads,
            "quiet": args.quiet}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sparsecomm.bench accuracy", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(ap)
    args = ap.parse_args(argv)
    cfg = config(args, ap)
    if not launched():
        if args.nproc < 1:
            ap.error("--nproc must be >= 1")
        cfg["where"] = "gloo loopback"
    report = run_ranks(run_rank, args.nproc, cfg, timeout=args.timeout)[0]
    if report is None:
        return 0
    print_report(report)
    for path in write(report, args.out):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
