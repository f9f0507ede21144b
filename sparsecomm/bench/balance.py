"""How evenly a sparse allreduce spreads its bytes over the ranks, on real top-k gradients.

Range-partitioned algorithms give rank j the j-th part of the index space (SparCML's split
all-gather: P equal ranges, "SparCML: High-Performance Sparse Communication for Machine
Learning", section 5; DenseStream and Ok-Topk: boundaries balanced on the selections; SparDL:
a reduce-scatter over equal blocks), so the owner of a hot layer receives and sends more than
the others. ``zen`` ("ZEN: Empowering Distributed Training with Sparsity-driven Data
Synchronization", section 4) hashes the index blocks to owners instead. This benchmark measures
the difference on the gradients of the examples' models:

1. a task of :mod:`sparsecomm.bench.tasks` (its model, data and optimizer) trains one model
   ``--warmup`` steps on batches of the whole training set;
2. then, for two more steps, every rank r of P computes its gradient on a batch of its own
   shard (every P-th sample from r), the mean of the P gradients updates the model as DDP
   would; the flattened gradients of both steps are kept (``random``: ``torch.randn``);
3. every algorithm runs on P simulated ranks (:func:`sparsecomm.comm.simulated.simulate`)
   through :class:`~sparsecomm.SparseAllreduce`: the first step's gradient once (handshake,
   residual, Ok-Topk's boundaries), then the second step's, whose bytes are counted.

Counting: every round of the Comm (``Comm.exchange``, which ``sendrecv`` goes through, and
``Comm.exchange_var``, as its counters count them: size words included; ``allreduce_dense`` as
the ring it is counted as) adds its bytes sent and received to the rank's total and to a *phase*, named by the
algorithm's function that issued it and the Comm-level call in between, e.g.
``reduce/exchange_var`` (zen's push) and ``reduce/bruck_allgather_var`` (its pull). Rounds
outside the algorithm (the reducer's handshake and check) are not counted. Bytes are exact and
deterministic; no time is measured.

Usage::

    python -m sparsecomm.bench balance                                   # every task, P = 4 6 8, density 1 % and 0.1 %
    python -m sparsecomm.bench balance --tasks digits random --sizes 4 --json balance.json
    python -m sparsecomm.bench balance --algorithms zen zen:block=1 sparcml_split_allgather
    python -m sparsecomm.bench balance --from-json balance.json      # the tables again, nothing run
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Dict, List, Sequence

import torch

from ..comm.simulated import simulate
from ..reduce import SparseAllreduce
from . import tasks as task_defs

__all__ = ["main", "PhaseCounter", "rank_gradients", "measure", "summarize", "parse_algorithm", "run_balance",
           "DEFAULT_ALGORITHMS", "DEFAULT_TASKS"]

DEFAULT_ALGORITHMS = ("zen", "zen:block=64", "zen:block=1", "sparcml_split_allgather", "densestream", "oktopk",
                      "spardl")
DEFAULT_TASKS = ("vgg16", "resnet20", "lstm", "mlp", "digits", "random")

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_ALGORITHMS_DIR = os.path.join(_PACKAGE, "algorithms") + os.sep
_COMM_DIR = os.path.join(_PACKAGE, "comm") + os.sep


def _phase_of_caller(call: str) -> str | None:
    """``function/comm_call`` of the current round: the innermost frame in the algorithms
    package and the outermost frame of the comm package below it (else ``call``, the Comm
    method counted); None outside an algorithm."""
    frame = sys._getframe(2)
    comm_call = None
    while frame is not None:
        path = frame.f_code.co_filename
        if path.startswith(_ALGORITHMS_DIR):
            return f"{frame.f_code.co_name}/{comm_call or call}"
        if path.startswith(_COMM_DIR):
            comm_call = frame.f_code.co_name
        frame = frame.f_back
    return None


class PhaseCounter:
    """Bytes one rank sends and receives per phase, through the Comm it :meth:`watch`-es."""

    def __init__(self) -> None:
        self.phases: Dict[str, List[int]] = {}   # phase -> [sent, received]
        self.counting = False
        self._inside = False   # in a counted call: the Comm calls it makes are part of it

    def watch(self, comm) -> None:
        """Count ``comm``'s rounds while :attr:`counting`; wraps the instance's ``exchange``,
        ``exchange_var`` and ``allreduce_dense`` (each call counted by the difference of the
        Comm's own counters), the Comm works as before."""
        def counted(call, name: str):
            def run(*args, **kwargs):
                if self._inside:
                    return call(*args, **kwargs)
                before = comm.stats.snapshot()
                self._inside = True
                try:
                    return call(*args, **kwargs)
                finally:
                    self._inside = False
                    if self.counting:
                        done = comm.stats - before
                        self._add(_phase_of_caller(name), done.bytes_sent, done.bytes_recv)
            return run

        for name in ("exchange", "exchange_var", "allreduce_dense"):
            setattr(comm, name, counted(getattr(comm, name), name))

    def _add(self, phase: str | None, sent: int, received: int) -> None:
        if phase is None:
            return
        row = self.phases.setdefault(phase, [0, 0])
        row[0] += sent
        row[1] += received


def parse_algorithm(spec: str) -> tuple[str, Dict[str, Any]]:
    """``"zen:block=16,seed=3"`` -> ``("zen", {"block": 16, "seed": 3})`` (integers where they parse)."""
    name, _, rest = spec.partition(":")
    options: Dict[str, Any] = {}
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        if not eq:
            raise ValueError(f"balance: option {item!r} of {spec!r} must be key=value")
        try:
            options[key] = int(value)
        except ValueError:
            options[key] = value
    return name, options


def rank_gradients(task: str, size: int, warmup: int = 20, seed: int = 0, random_n: int = 1_000_000,
                   hidden: int | None = None, width: float | None = None) -> tuple[List[List[torch.Tensor]], str]:
    """Two consecutive steps' flattened float32 gradients of each of ``size`` ranks, and the
    model in words. ``task``: a task of :mod:`sparsecomm.bench.tasks` or ``"random"``
    (``random_n`` standard normal entries per rank and step)."""
    if task == "random":
        gen = torch.Generator().manual_seed(seed)
        return [[torch.randn(random_n, generator=gen) for _ in range(2)] for _ in range(size)], \
            f"random: N({0}, 1) entries, {random_n} per rank"
    t = task_defs.make_task(task, seed=seed, hidden=hidden, width=width, generated_sizes=(2048, 64))
    torch.manual_seed(seed)
    model = t.build()
    model.train()
    opt = t.optimizer(list(model.parameters()))
    gen = torch.Generator().manual_seed(seed + 1)
    params = [p for p in model.parameters() if p.requires_grad]

    def gradient(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        opt.zero_grad(set_to_none=False)
        task_defs.loss_of(model(x), y).backward()   # a language model's logits: every position
        return torch.cat([p.grad.reshape(-1) for p in params]).clone()

    n = len(t.train_x)
    for _ in range(warmup):
        pick = torch.randint(0, n, (t.batch,), generator=gen)
        gradient(t.train_x[pick], t.train_y[pick])
        opt.step()
    grads: List[List[torch.Tensor]] = [[] for _ in range(size)]
    for _ in range(2):
        for r in range(size):
            shard = torch.arange(r, n, size)
            pick = shard[torch.randint(0, len(shard), (t.batch,), generator=gen)]
            grads[r].append(gradient(t.train_x[pick], t.train_y[pick]))
        mean = torch.stack([g[-1] for g in grads]).mean(dim=0)
        offset = 0
        for p in params:   # the update DDP would make: every rank's model steps with the mean
            p.grad.copy_(mean[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
        opt.step()
    return grads, f"{t.model}; {sum(p.numel() for p in params)} parameters; {t.data}"


def _rank_run(comm, grads: List[List[torch.Tensor]], spec: str, density: float) -> Dict[str, List[int]]:
    name, options = parse_algorithm(spec)
    reducer = SparseAllreduce(name, density, comm=comm, **options)
    counter = PhaseCounter()
    counter.watch(comm)
    mine = grads[comm.rank]
    reducer(mine[0])
    counter.counting = True
    reducer(mine[1])
    return counter.phases


def measure(grads: List[List[torch.Tensor]], spec: str, density: float) -> List[Dict[str, List[int]]]:
    """Per rank: phase -> [bytes sent, bytes received] of the second step's call of algorithm
    ``spec`` (``name`` or ``name:key=value,...``) on the ranks' gradients ``grads[r][step]``."""
    return simulate(len(grads), lambda comm: _rank_run(comm, grads, spec, density), timeout=600.0).results


def summarize(per_rank: List[Dict[str, List[int]]]) -> Dict[str, Any]:
    """Largest and mean bytes per rank, sent and received, for the call and for each phase."""
    size = len(per_rank)
    phases = sorted({ph for r in per_rank for ph in r}, key=lambda ph: min(
        list(r).index(ph) for r in per_rank if ph in r))

    def stats(values: List[int]) -> Dict[str, Any]:
        mean = sum(values) / size
        return {"per_rank": values, "max": max(values), "mean": mean,
                "max_over_mean": max(values) / mean if mean else 1.0}

    out: Dict[str, Any] = {"sent": stats([sum(v[0] for v in r.values()) for r in per_rank]),
                           "received": stats([sum(v[1] for v in r.values()) for r in per_rank]),
                           "phases": {}}
    for ph in phases:
        out["phases"][ph] = {"sent": stats([r.get(ph, [0, 0])[0] for r in per_rank]),
                             "received": stats([r.get(ph, [0, 0])[1] for r in per_rank])}
    return out


def run_balance(task_names: Sequence[str], sizes: Sequence[int], densities: Sequence[float],
                algorithms: Sequence[str], warmup: int = 20, seed: int = 0, random_n: int = 1_000_000,
                log=print) -> List[Dict[str, Any]]:
    rows = []
    for task in task_names:
        for p in sizes:
            grads, model = rank_gradients(task, p, warmup, seed, random_n)
            n = grads[0][0].numel()
            log(f"{task} P={p}: {model}")
            for density in densities:
                for spec in algorithms:
                    s = summarize(measure(grads, spec, density))
                    rows.append(dict(task=task, model=model, P=p, N=n, density=density, algorithm=spec, **s))
                    log(f"  density {density:g} {spec}: received max/mean {s['received']['max_over_mean']:.2f}, "
                        f"sent max/mean {s['sent']['max_over_mean']:.2f}")
    return rows


def _kib(x: float) -> str:
    return f"{x / 1024:.1f}"


def markdown(rows: List[Dict[str, Any]], phases: bool = True) -> str:
    """One line per (task, P, density, algorithm): KiB per rank, largest / mean and their ratio,
    received and sent; then each phase's ratios (received, sent) when ``phases``."""
    head = ("| task | P | density | algorithm | recv max KiB | recv mean KiB | recv max/mean | sent max KiB | "
            "sent mean KiB | sent max/mean |" + (" phases: recv max/mean, sent max/mean |" if phases else ""))
    lines = [head, "|---|---:|---:|---|" + "---:|" * 6 + ("---|" if phases else "")]
    for r in rows:
        rec, sen = r["received"], r["sent"]
        line = (f"| {r['task']} | {r['P']} | {r['density']:g} | {r['algorithm']} | {_kib(rec['max'])} | "
                f"{_kib(rec['mean'])} | {rec['max_over_mean']:.2f} | {_kib(sen['max'])} | {_kib(sen['mean'])} | "
                f"{sen['max_over_mean']:.2f} |")
        if phases:
            line += " " + "; ".join(f"{ph} {v['received']['max_over_mean']:.2f}, {v['sent']['max_over_mean']:.2f}"
                                    for ph, v in r["phases"].items()) + " |"
        lines.append(line)
    return "\n".join(lines)


def ratio_markdown(rows: List[Dict[str, Any]]) -> str:
    """One line per (task, P, density), one column per algorithm: largest over mean bytes per
    rank, received / sent, for the whole call."""
    algorithms = list(dict.fromkeys(r["algorithm"] for r in rows))
    keys = list(dict.fromkeys((r["task"], r["P"], r["density"]) for r in rows))
    by = {(r["task"], r["P"], r["density"], r["algorithm"]): r for r in rows}
    lines = ["| task | P | density | " + " | ".join(algorithms) + " |", "|---|---:|---:|" + "---:|" * len(algorithms)]
    for task, p, density in keys:
        cells = []
        for a in algorithms:
            r = by.get((task, p, density, a))
            cells.append("" if r is None else
                         f"{r['received']['max_over_mean']:.2f} / {r['sent']['max_over_mean']:.2f}")
        lines.append(f"| {task} | {p} | {density:g} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sparsecomm.bench balance", description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", nargs="+", default=list(DEFAULT_TASKS),
                    help=f"tasks of the accuracy benchmark ({', '.join(task_defs.TASKS)}) or random")
    ap.add_argument("--algorithms", nargs="+", default=list(DEFAULT_ALGORITHMS),
                    help="NAME or NAME:key=value,... (options of the algorithm)")
    ap.add_argument("--sizes", type=int, nargs="+", default=[4, 6, 8], help="simulated ranks P")
    ap.add_argument("--densities", type=float, nargs="+", default=[0.01, 0.001])
    ap.add_argument("--warmup", type=int, default=20, help="training steps before the measured gradients")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--random-n", type=int, default=1_000_000, help="entries per rank of the random gradients")
    ap.add_argument("--no-phases", action="store_true", help="leave the per-phase column out of the table")
    ap.add_argument("--json", default=None, help="write the rows here")
    ap.add_argument("--from-json", default=None, help="print the tables of rows written before by --json; run nothing")
    args = ap.parse_args(list(argv) if argv is not None else None)
    if args.from_json:
        with open(args.from_json) as f:
            rows = json.load(f)
        print(markdown(rows, not args.no_phases) + "\n\n" + ratio_markdown(rows))
        return 0
    for task in args.tasks:
        if task != "random" and task not in task_defs.TASKS:
            ap.error(f"unknown task {task!r}; choose from {', '.join(task_defs.TASKS)} or random")
    rows = run_balance(args.tasks, args.sizes, args.densities, args.algorithms, args.warmup, args.seed,
                       args.random_n)
    print("bytes of one call per rank (the second measured step), largest and mean over the ranks")
    print(markdown(rows, not args.no_phases))
    print("\nlargest over mean bytes per rank, received / sent")
    print(ratio_markdown(rows))
    if args.json:
        with open(args.json, "w") as f:   # one row a line: diffable, a third of an indented file
            f.write("[\n" + ",\n".join(json.dumps(r) for r in rows) + "\n]\n")
    return 0
