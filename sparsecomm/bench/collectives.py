"""The collective benchmark: ``python -m sparsecomm.bench collectives ...``.

It is meant to run under the launcher (:mod:`sparsecomm.launch`), e.g. on the
emulated 1 Gbit/s cluster::

    python -m sparsecomm.launch --nproc 4 --bandwidth 1gbit -- \\
        python -m sparsecomm.bench collectives --algorithms all --N 15000000 --density 0.01 --repeats 3

Without a launcher (no RANK / WORLD_SIZE in the environment) it starts ``--nproc`` ranks
itself on loopback with :func:`sparsecomm.testing.spawn`. On every rank it

1. checks every algorithm on a small vector (``--check-n``, float64, 3 steps with error
   feedback) against the dense reference:

   * all algorithms: ``out`` is bit-identical on every rank, and conservation
     ``sum_r (g_r + e_r) == out + sum_r e'_r`` holds (relative tolerance 1e-9);
   * lossless ones (the instance's ``lossless``): every rank either sends an entry whole or
     keeps it whole (``e'_r[i]`` is exactly 0 or exactly ``acc_r[i]``), and
     ``out == sum_r (acc_r - e'_r)`` -- the exact sum of what the ranks let through -- up to
     the rounding of a float64 sum in another order (relative 1e-12; the JSON says whether
     it was bit-exact);

2. fits alpha and beta by a ping-pong between ranks 0 and 1 (1 KB .. ``--pingpong-max``,
   default 64 MB, half round trip, median of a few trips per size), ordinary least squares
   on ``t = alpha + beta * bytes``; if the intercept is negative, alpha is the smallest
   message's time less its beta * bytes (see :func:`sparsecomm.traffic.fit_alpha_beta`);

3. times every algorithm (interleaved repeats after one warm-up call, ``auto`` after its trial
   calls too; ``--shuffle``: each repeat in its own order, the same on every rank; a barrier
   before each call, slowest rank per repeat, medians) and reports the median wall time, bytes sent
   and rounds per rank, speedup over ``dense``, and ``bound / measured`` where
   ``bound = rounds * alpha + bytes_sent * beta`` of the slowest rank and ``measured`` its
   wire time (``last_stats["comm_s"]``);

4. writes ``collectives.csv``, ``collectives.json`` and ``collectives_P{P}.json`` to ``--out``
   and, if matplotlib can be imported, PNG plots: bar charts per algorithm, time vs density
   when several densities were given, and time vs P when ``--out`` holds runs at several P
   (one launch per P into the same folder, same N and first density).

``--hierarchy flat node`` (or ``both``) times every algorithm twice in the same launch, flat and
two-level (``SparseAllreduce(hierarchy="node")``: dense inside a node, the algorithm between nodes
on each shard), interleaved per repeat, same N and density. The topology is the launcher's
(:meth:`sparsecomm.Topology.from_env`, e.g. ``python -m sparsecomm.launch --nnodes 2
--nproc-per-node 2 --bandwidth 1gbit``), or ``--nproc-per-node L`` when the benchmark starts its
ranks itself. The rows then also give the bytes per node on the inter-node link and inside the
node (:class:`sparsecomm.bench.links.LinkCounter`: point-to-point messages counted per destination,
the backend's dense allreduce by its ring count; summed over the node's ranks, the busiest
node, median over repeats), the bytes the node's interface really sent when the launcher gave
each node its own (``/proc/net/dev``), and the two-level speedup over flat from the same repeats
(the speedup over dense compares with dense in the same hierarchy).
Each hierarchy is checked as above, except that a two-level reducer's residual holds its node's
sum of its shard, so the per-rank lossless test is replaced by conservation alone. The report is
``collectives_{n}x{L}.json``; the time-vs-P plot is left to flat runs.

``--algorithms`` also takes PyTorch's own hooks, ``torch_fp16`` (``fp16_compress_hook``) and
``torch_powersgd`` (``powerSGD_hook``, rank 4), through :mod:`sparsecomm.bench.baselines` on the
same flat gradient cut into VGG-like matrices; ``all`` includes them. They are checked for
consistency across ranks and, for fp16, closeness to the mean, for PowerSGD conservation
with its error feedback.

``--gradients TASK`` (a task of :mod:`sparsecomm.bench.tasks`: digits, mlp, vgg16, resnet20,
lstm; ``--width`` for vgg16 / resnet20, ``--hidden`` for mlp / digits) times the algorithms on
real gradients instead of ``bench_gradient``'s standard normal ones: rank 0 trains the task's
model ``--gradients-warmup`` steps and computes every rank's gradient of two consecutive steps
on the rank's own shard, the model stepping with their mean in between as under DDP
(:func:`sparsecomm.bench.balance.rank_gradients`, the gradients the balance benchmark counts
bytes on), and scatters each rank its own two; N is the model's parameter count (``--N`` is
refused). The timing loop alternates the two steps as it does with random gradients; the
correctness checks stay on random vectors of ``--check-n``. The report's ``gradients`` field
names the source, the model and N, and gives each rank's norm and exactly-zero entries per step.

Results travel between ranks only as plain tensors (``all_gather``, ``scatter``), never pickled.
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import random
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.distributed as dist

from .. import algorithms
from ..comm.topology import NodeComms, Topology
from ..comm.torch_comm import TorchComm
from ..traffic import fit_alpha_beta
from ..tune import VARIANT_CODECS, pingpong
from ..launch import describe_link
from ..reduce import SparseAllreduce, k_for
from ..testing import launched, run_ranks
from . import baselines
from . import tasks as task_defs
from .balance import rank_gradients
from .baselines import TorchHook, bucket_shapes, is_baseline, powersgd_counts
from .common import HIERARCHY_CHOICES, bench_gradient, hierarchies_of
from .links import LinkCounter, interface_tx_bytes
from .plots import line_plot, pyplot

__all__ = ["main"]

_FIELDS = ("wall_s", "comm_s", "bytes_sent", "rounds")
#: per call and rank, with --hierarchy node: bytes to ranks of this node and of other nodes, and
#: the node interface's transmitted bytes (local rank 0 only; NaN where there is no interface)
_LINK_FIELDS = ("intra_bytes", "inter_bytes", "link_tx_bytes")
_CHECK_STEPS = 3
#: what ``--gradients random`` times, as the report's ``gradients.model`` says it
RANDOM_GRADIENTS = "standard normal entries, drawn per rank and step (bench_gradient)"
#: the tasks whose model size ``--width`` / ``--hidden`` set (sparsecomm.bench.tasks.make_task)
_WIDTH_TASKS, _HIDDEN_TASKS = ("vgg16", "resnet20"), ("mlp", "digits")


# -- helpers shared by every rank -----------------------------------------------------------


def _variant(label: str) -> tuple[str, dict]:
    """``"topka+delta_binary+skcompress"`` -> ("topka", {"index_codec": ..., "value_codec": ...}):
    an algorithm with the COO codecs of sparsecomm.formats.codec, benchmarked beside the plain one;
    ``"gssgd+sketch_size=10"`` -> ("gssgd", {"sketch_size": 10}): an option set by name."""
    name, *suffixes = label.split("+")
    options = {}
    for suffix in suffixes:
        if "=" in suffix:  # "gssgd+sketch_size=10": an option of the algorithm (int, float, None or text)
            key, text = suffix.split("=", 1)
            for convert in (int, float):
                try:
                    options[key] = convert(text)
                    break
                except ValueError:
                    pass
            else:
                options[key] = None if text == "None" else text
            continue
        if suffix not in VARIANT_CODECS:
            raise ValueError(f"unknown codec {suffix!r} in {label!r}; use {', '.join(VARIANT_CODECS)}")
        key, value = VARIANT_CODECS[suffix]
        options[key] = value
    return name, options


def _reducer(label: str, density: float, comm, nodes: NodeComms | None = None) -> SparseAllreduce:
    """The reducer of ``label``: flat, or two-level over ``nodes`` (split once, shared)."""
    name, options = _variant(label)
    if nodes is not None:
        return SparseAllreduce(name, density, comm=comm, hierarchy="node", nodes=nodes, **options)
    return SparseAllreduce(name, density, comm=comm, **options)


def _gather(t: torch.Tensor) -> list[torch.Tensor]:
    out = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t.contiguous())
    return out


def _check_same_everywhere(name: str, step: int, outs: list[torch.Tensor]) -> None:
    """Every rank's output of a step must be bit-identical to rank 0's."""
    for r in range(1, len(outs)):
        if not torch.equal(outs[r], outs[0]):
            raise AssertionError(f"{name} step {step}: rank {r}'s output differs from rank 0's")


def _check_algorithm(name: str, density: float, n: int, comm, nodes: NodeComms | None = None) -> dict:
    """Run 3 steps in float64 and check them; identical verdict on every rank. Two-level
    (``nodes``): the residual is the node's sum of this rank's shard, so a lossless algorithm
    is held to conservation and identical outputs, not to whole entries per rank."""
    reducer = _reducer(name, density, comm, nodes)
    lossless = bool(reducer.algorithm.lossless)
    whole_entries = lossless and nodes is None   # flat: each rank sends an entry whole or keeps it
    carried = torch.zeros(n, dtype=torch.float64)
    bit_exact = True
    worst_cons = worst_lossless = 0.0
    energies = []   # lossy: ||out||^2 / ||exact global top-k of the summed acc||^2, per step
    for step in range(_CHECK_STEPS):
        g = bench_gradient(comm.rank, step, n, torch.float64)
        acc = carried + g if step else g.clone()       # what the reducer forms: e + g
        out = reducer(g).clone()
        res = reducer.residual.clone()
        outs, accs, ress = _gather(out), _gather(acc), _gather(res)
        _check_same_everywhere(name, step, outs)
        total_in = torch.stack(accs).sum(0)
        total_out = outs[0] + torch.stack(ress).sum(0)
        scale = max(1.0, float(total_in.abs().max()))
        err = float((total_in - total_out).abs().max()) / scale
        worst_cons = max(worst_cons, err)
        if err > 1e-9:
            raise AssertionError(f"{name} step {step}: conservation off by {err:.3g} (relative)")
        k = reducer.last_stats.get("k_total") or reducer.last_stats.get("k") or 1   # two-level: k is per shard
        best = float(total_in.abs().topk(min(n, max(1, k))).values.pow(2).sum())
        if not lossless and best > 0:
            energies.append(float(outs[0].pow(2).sum()) / best)
        if whole_entries:
            for r, (a, e) in enumerate(zip(accs, ress)):
                if not bool(((e == 0) | (e == a)).all()):
                    raise AssertionError(f"{name} (lossless) step {step}: rank {r} kept part of an entry")
            sent = accs[0] - ress[0]
            for r in range(1, len(accs)):
                sent = sent + (accs[r] - ress[r])
            bit_exact = bit_exact and torch.equal(sent, outs[0])
            lerr = float((sent - outs[0]).abs().max()) / scale
            worst_lossless = max(worst_lossless, lerr)
            if lerr > 1e-12:
                raise AssertionError(f"{name} (lossless) step {step}: out differs from the sum of the "
                                     f"sent entries by {lerr:.3g} (relative)")
        carried = res
    return {"lossless": lossless, "conservation_rel_err": worst_cons,
            "lossless_rel_err": worst_lossless if whole_entries else None,
            "bit_exact": bit_exact if whole_entries else None,
            "energy_captured": min(energies) if energies else None}


def _check_baseline(name: str, n: int, comm) -> dict:
    """PyTorch's hooks (average, not sum): identical on every rank; fp16 the mean up to
    half-precision rounding; PowerSGD the exact mean during its vanilla warm-up steps, then
    matrices of rank <= its rank (what it promises; the error memory makes up the rest)."""

    hook = TorchHook(name)
    shapes = bucket_shapes(n, rows=64, cols=576)     # small matrices, so PowerSGD compresses
    steps = _CHECK_STEPS + (2 if name == "torch_powersgd" else 0)
    worst = 0.0
    for step in range(steps):
        g = bench_gradient(comm.rank, step, n, torch.float64)
        carried = hook.residual()
        acc = g + carried if carried is not None else g.clone()
        out = hook.allreduce(g.clone(), shapes).clone()
        outs, accs = _gather(out), _gather(acc)
        _check_same_everywhere(name, step, outs)
        total_in = torch.stack(accs).sum(0)
        scale = max(1.0, float(total_in.abs().max()))
        if hook.residual() is None:   # fp16, or PowerSGD's vanilla warm-up steps: out is the mean
            err = float((total_in / len(outs) - outs[0]).abs().max()) / scale
            limit = 4 * 2.0 ** -10 if name == "torch_fp16" else 1e-12
            worst = max(worst, err)
            if err > limit:
                raise AssertionError(f"{name} step {step}: off the mean by {err:.3g} (relative), "
                                     f"more than {limit:.3g}")
            continue
        offset = 0   # compressed: every matrix PowerSGD compresses comes back with rank <= its rank
        for shape in shapes:
            numel = math.prod(shape)
            if powersgd_counts([shape], hook.powersgd_rank)[1]:
                matrix = outs[0][offset:offset + numel].view(shape[0], -1)
                tol = 1e-9 * max(float(matrix.abs().max()), 1e-300)
                rank = int(torch.linalg.matrix_rank(matrix, atol=tol))
                if rank > hook.powersgd_rank:
                    raise AssertionError(f"{name} step {step}: a {tuple(shape)} matrix came back with rank {rank}, "
                                         f"more than PowerSGD's {hook.powersgd_rank}")
            offset += numel
    return {"lossless": False, "max_rel_err": worst, "lossless_rel_err": None, "bit_exact": None,
            "baseline": True}


class _BaselineRunner:
    """A PyTorch hook in the timing loop: ``runner(grad, out=out)`` and ``last_stats`` like a reducer.

    The hook works in place on its bucket, so each call copies the gradient into a buffer
    first (the sparse reducers also form gradient + residual inside the call). Its wire time
    cannot be told apart from its compression compute: ``comm_s`` is the wall time.
    """

    def __init__(self, name: str, n: int) -> None:
        self.hook = TorchHook(name)
        self.shapes = bucket_shapes(n)
        self.bucket = torch.empty(n)
        self.warmup_calls = 3 if name == "torch_powersgd" else 1   # past PowerSGD's 2 vanilla steps
        self.last_stats: dict = {}

    def __call__(self, grad: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        start = time.perf_counter()
        self.bucket.copy_(grad)
        out.copy_(self.hook.allreduce(self.bucket, self.shapes))
        wall = time.perf_counter() - start
        self.last_stats = {**self.hook.last_stats[0], "comm_s": wall}
        return out


def _timed_gradients(rank: int, size: int, cfg: dict, say) -> tuple[list[torch.Tensor], dict]:
    """This rank's two float32 gradients of the timing loop and, on every rank, the report's
    ``gradients`` entry (rank 0's is the one reported; ``per_rank`` is filled in later).

    ``random``: :func:`bench_gradient` of ``cfg["n"]``. A task: rank 0 alone runs
    :func:`rank_gradients` for all ``size`` ranks (the ranks' shards and the mean step between
    the two steps need every rank's gradient; one process computing them costs the model's
    warm-up once instead of once per rank on shared cores) and scatters each rank its own.
    Rank 0 first broadcasts whether it succeeded and N, so a failure there is an error on
    every rank at once rather than a wait for tensors that never come."""
    task = cfg["gradients"]
    if task == "random":
        n = cfg["n"]
        return [bench_gradient(rank, step, n) for step in range(2)], {"source": "random", "model": RANDOM_GRADIENTS,
                                                                       "N": n}
    grads, model, failure, compute_s = None, "", None, 0.0
    if rank == 0:
        say(f"computing every rank's {task} gradients on rank 0 ({cfg['gradients_warmup']} warm-up steps, "
            "then two steps on each rank's shard) ...", flush=True)
        start = time.perf_counter()
        try:
            grads, model = rank_gradients(task, size, warmup=cfg["gradients_warmup"], hidden=cfg["hidden"],
                                          width=cfg["width"])
        except Exception as exc:   # reported on every rank below, raised here with its traceback
            failure = exc
        compute_s = time.perf_counter() - start
    header = torch.tensor([0, 0] if rank or failure else [1, grads[0][0].numel()], dtype=torch.int64)
    dist.broadcast(header, 0)
    if not header[0]:
        if failure is not None:
            raise RuntimeError(f"--gradients {task}: rank 0 could not compute the gradients: {failure}") from failure
        raise RuntimeError(f"--gradients {task}: rank 0 could not compute the gradients; its error says why")
    n = int(header[1])
    start = time.perf_counter()
    mine = []
    for step in range(2):
        buf = torch.empty(n)
        dist.scatter(buf, [grads[r][step].contiguous() for r in range(size)] if rank == 0 else None, src=0)
        mine.append(buf)
    distribute_s = time.perf_counter() - start
    del grads
    return mine, {"source": task, "model": model, "N": n, "warmup_steps": cfg["gradients_warmup"],
                  "computed_on": "rank 0", "compute_s": compute_s, "scatter_s": distribute_s}


def _gradient_stats(grads: list[torch.Tensor]) -> torch.Tensor:
    """Per step: the L2 norm and the count of exactly zero entries (float64, to gather)."""
    return torch.tensor([[float(g.double().norm()), float((g == 0).sum())] for g in grads], dtype=torch.float64)


@dataclass
class _Run:
    """What every phase of one rank's run shares: the Comm, the node split, the entries timed."""

    rank: int
    size: int
    cfg: dict
    comm: TorchComm
    say: Callable[..., None]   # print on rank 0, nothing elsewhere
    nodes: NodeComms | None = None       # two-level: split once, shared by every two-level reducer
    node_of: list[int] | None = None     # two-level: every rank's node
    counter: LinkCounter | None = None   # two-level: bytes per destination, inside the node or not
    #: (algorithm, hierarchy), each algorithm's hierarchies side by side
    entries: list[tuple[str, str]] = field(default_factory=list)

    @property
    def two_level(self) -> bool:
        return "node" in self.cfg["hierarchies"]

    def label(self, algorithm: str, hierarchy: str) -> str:
        return f"{algorithm}/{hierarchy}" if self.two_level else algorithm

    @property
    def labels(self) -> list[str]:
        return [self.label(a, h) for a, h in self.entries]

    def nodes_for(self, hierarchy: str) -> NodeComms | None:
        """The node split for a two-level entry, None for a flat one."""
        return self.nodes if hierarchy == "node" else None


def _setup(rank: int, size: int, cfg: dict) -> _Run:
    """Threads, the Comm and, two-level, the node split and the link counter on it."""
    torch.set_num_threads(cfg["threads"])
    run = _Run(rank, size, cfg, TorchComm(), print if rank == 0 else (lambda *a, **k: None))
    if run.two_level:   # split once, before anything is counted; every two-level reducer shares it
        topology = (Topology(size // cfg["per_node"], cfg["per_node"]) if cfg.get("per_node")
                    else Topology.from_env())
        comm = run.comm
        nodes = run.nodes = topology.split(comm)
        node_of = run.node_of = [int(row[0]) for row in comm.allgather_small(
            torch.tensor([nodes.topology.node], dtype=torch.int64)).tolist()]
        counter = run.counter = LinkCounter()
        counter.watch(comm, lambda peer: node_of[peer] == nodes.topology.node)
        if nodes.intra is not None:
            counter.watch(nodes.intra, lambda peer: True)
        if nodes.inter is not None:
            counter.watch(nodes.inter, lambda peer: False)
    run.entries = [(a, h) for a in cfg["algorithms"] for h in cfg["hierarchies"]]
    return run


def _check_all(run: _Run) -> dict[str, dict]:
    """1. correctness: every entry on ``--check-n`` random entries; the verdicts said on rank 0."""
    cfg = run.cfg
    checks = {}
    for name, h in run.entries:
        checks[run.label(name, h)] = (_check_baseline(name, cfg["check_n"], run.comm) if is_baseline(name)
                                      else _check_algorithm(name, cfg["densities"][0], cfg["check_n"], run.comm,
                                                            run.nodes_for(h)))
    run.say(f"correctness checked on N = {cfg['check_n']} (float64, {_CHECK_STEPS} steps): "
            + ", ".join(f"{a}{' (lossless)' if c['lossless'] else ''}" for a, c in checks.items()), flush=True)
    run.say("energy captured (lossy; least over the checked steps, of the exact global top-k's): "
            + ", ".join(f"{a} {c['energy_captured']:.3f}" for a, c in checks.items()
                        if c.get("energy_captured") is not None), flush=True)
    return checks


def _pingpong_trips(size: int) -> int:
    """Timed round trips per ping-pong size: fewer for the large ones, which take long on slow links."""
    return 2 if size >= 16 << 20 else (3 if size >= 1 << 20 else 10)


def _alpha_beta(run: _Run) -> dict:
    """2. alpha-beta: the ping-pong's sizes and half round trips, the fit, the peer of rank 0."""
    sizes = []
    s = 1 << 10
    while s <= run.cfg["pingpong_max"]:
        sizes.append(s)
        s <<= 2
    # two-level: rank 0 and the first rank of node 1 (across the inter-node link), else 0 and 1
    peer = run.node_of.index(1) if run.two_level and run.nodes.topology.nodes > 1 else 1
    if run.size >= 2 and sizes:
        halves = pingpong(run.comm, sizes, peer, trips=_pingpong_trips, before_size=dist.barrier)
        alpha, beta = fit_alpha_beta(sizes, halves)
    else:
        halves, alpha, beta = [], 0.0, 0.0
    run.say(f"ping-pong rank 0 <-> {peer}, {sizes[0] if sizes else 0} B .. {sizes[-1] if sizes else 0} B: "
            f"alpha = {alpha * 1e6:.1f} us, beta = {beta * 1e9:.3f} ns/B "
            f"({8 / beta / 1e9 if beta else 0:.3f} Gbit/s)", flush=True)
    return {"sizes": sizes, "halves": halves, "alpha": alpha, "beta": beta, "peer": peer}


def _time_all(run: _Run, grads: list[torch.Tensor], n: int) -> tuple[torch.Tensor, dict]:
    """3. timing: per density, every entry warmed up, then interleaved repeats. Returns this
    rank's figures [entries, densities, repeats, fields] and what ``auto`` chose per (entry, density)."""
    cfg, dens = run.cfg, run.cfg["densities"]
    fields = _FIELDS + (_LINK_FIELDS if run.two_level else ())
    # the node's interface counter covers all its ranks: local rank 0 reads it
    reads_link = run.two_level and run.nodes.topology.local_rank == 0 and interface_tx_bytes() is not None
    out = torch.empty(n)
    data = torch.zeros(len(run.entries), len(dens), cfg["repeats"], len(fields), dtype=torch.float64)
    chosen: dict = {}
    for di, d in enumerate(dens):
        reducers = [_BaselineRunner(a, n) if is_baseline(a) else _reducer(a, d, run.comm, run.nodes_for(h))
                    for a, h in run.entries]
        _warm_up(run, reducers, grads[0], out, d, chosen)
        for rep in range(cfg["repeats"]):
            order = list(range(len(reducers)))
            if cfg.get("shuffle"):   # seeded by the repeat: the same order on every rank
                random.Random(rep).shuffle(order)
            for ai in order:
                data[ai, di, rep] = _timed_call(run, reducers[ai], grads[rep % 2], out, reads_link)
        del reducers
    return data, chosen


def _warm_up(run: _Run, reducers: list, grad: torch.Tensor, out: torch.Tensor, density: float,
             chosen: dict) -> None:
    """The calls before the timed ones: handshake, layouts, buffers; ``auto``'s trial calls too,
    its choice kept in ``chosen`` and said on rank 0."""
    labels = run.labels
    for ai, red in enumerate(reducers):
        for _ in range(getattr(red, "warmup_calls", 1)):
            red(grad, out=out)
        while red.last_stats.get("auto_tuning"):     # auto: its trial calls are its warm-up too
            red(grad, out=out)
        if "auto_choice" in red.last_stats:         # auto: which algorithm it runs (same on every rank)
            st = red.last_stats
            chosen[(labels[ai], density)] = st["auto_choice"]
            trials = ", ".join(f"{a} {t * 1e3:.1f}" for a, t in (st["auto_trials"] or {}).items())
            run.say(f"{labels[ai]} at density {density:g} chose {st['auto_choice']} (predicted "
                    f"{st['auto_predicted_s'] * 1e3:.1f} ms{'; measured ' + trials + ' ms' if trials else ''})",
                    flush=True)


def _timed_call(run: _Run, red, grad: torch.Tensor, out: torch.Tensor, reads_link: bool) -> torch.Tensor:
    """One timed call after a barrier: its fields (float64), two-level with the link bytes."""
    dist.barrier()
    if run.two_level:   # every rank past the barrier before the counters are read
        link_before = interface_tx_bytes() if reads_link else None
        counted_before = run.counter.totals()
        dist.barrier()
    start = time.perf_counter()
    red(grad, out=out)
    wall = time.perf_counter() - start
    st = red.last_stats
    row = [wall, st["comm_s"], st["bytes_sent"], st["rounds"]]
    if run.two_level:   # every rank done before the interface counter is read again
        intra, inter = (a - b for a, b in zip(run.counter.totals(), counted_before))
        dist.barrier()
        row += [intra, inter, interface_tx_bytes() - link_before if reads_link else math.nan]
    return torch.tensor(row, dtype=torch.float64)


def _rows(run: _Run, everyone: torch.Tensor, checks: dict, link: dict, chosen: dict, n: int) -> list[dict]:
    """One row per entry and density from every rank's figures [P, entries, densities, repeats,
    fields]: medians of the slowest rank per repeat, speedups, the alpha-beta bound."""
    dens, hierarchies, label = run.cfg["densities"], run.cfg["hierarchies"], run.label
    algos = run.labels
    slowest = everyone[..., :len(_FIELDS)].amax(0)     # per repeat: the slowest rank's figures
    per_node = _per_node(everyone[..., len(_FIELDS):], run.node_of) if run.two_level else None
    rows = []
    for di, d in enumerate(dens):
        med = {a: {f: float(np.median(slowest[ai, di, :, fi].numpy())) for fi, f in enumerate(_FIELDS)}
               for ai, a in enumerate(algos)}
        for ai, (a, h) in enumerate(run.entries):
            m = med[algos[ai]]
            dense_t = med[label("dense", h)]["wall_s"] if label("dense", h) in med else None
            bound = m["rounds"] * link["alpha"] + m["bytes_sent"] * link["beta"]
            row = {"algorithm": a, "P": run.size, "N": n, "density": d,      # baselines ignore d
                   "k": None if is_baseline(a) else k_for(d, n), "baseline": is_baseline(a),
                   "lossless": checks[algos[ai]]["lossless"], "repeats": run.cfg["repeats"],
                   "time_s": m["wall_s"], "comm_s": m["comm_s"],
                   "bytes_sent": int(m["bytes_sent"]), "rounds": int(m["rounds"]),
                   "speedup_vs_dense": dense_t / m["wall_s"] if dense_t else None,
                   "bound_s": bound, "bound_over_measured": bound / m["comm_s"] if m["comm_s"] > 0 else None,
                   "energy_captured_check": checks[algos[ai]].get("energy_captured"),
                   **({"chose": chosen[(algos[ai], d)]} if (algos[ai], d) in chosen else {})}
            if run.two_level:
                flat_t = med[label(a, "flat")]["wall_s"] if h == "node" and "flat" in hierarchies else None
                row.update({"hierarchy": h, **per_node[ai][di],
                            "speedup_vs_flat": flat_t / m["wall_s"] if flat_t else None})
            rows.append(row)
    return rows


def _report(run: _Run, gradients: dict, checks: dict, link: dict, rows: list[dict]) -> dict:
    """Rank 0's report: the run's parameters, the link's fit, the checks and the rows."""
    cfg = run.cfg
    report = {"P": run.size, "N": gradients["N"], "gradients": gradients, "densities": cfg["densities"],
              "repeats": cfg["repeats"], "alpha_s": link["alpha"],
              "beta_s_per_byte": link["beta"], "pingpong": {"bytes": link["sizes"], "half_rtt_s": link["halves"]},
              "checks": checks, "rows": rows, "where": cfg["where"],
              **({"pingpong_peer": link["peer"]} if run.two_level else {}),
              "order": "shuffled per repeat" if cfg.get("shuffle") else "listed"}
    if run.two_level:
        report.update({"hierarchies": cfg["hierarchies"], "nodes": run.nodes.topology.nodes,
                       "ranks_per_node": run.nodes.topology.ranks_per_node,
                       "link_accounting": "point-to-point messages counted per destination rank; the backend's "
                                          "dense allreduce by its ring count, sent to the next rank of its group; "
                                          "per node: summed over its ranks, the busiest node, median over repeats; "
                                          "link_tx: the node interface's transmitted bytes (/proc/net/dev)"})
    return report


def _worker(rank: int, size: int, cfg: dict) -> dict | None:
    """Everything one rank does; returns the report on rank 0 (None elsewhere)."""
    run = _setup(rank, size, cfg)
    # the timed gradients first: a task's take rank 0 a while, and a failure there should end
    # the run before the checks and the ping-pong
    grads, gradients = _timed_gradients(rank, size, cfg, run.say)
    gradient_stats = _gather(_gradient_stats(grads))   # [P] x [step, (norm, zeros)]
    if gradients["source"] != "random":
        run.say(f"gradients: {gradients['model']}; computed on rank 0 in {gradients['compute_s']:.1f} s, "
                f"scattered in {gradients['scatter_s']:.1f} s", flush=True)
    checks = _check_all(run)
    link = _alpha_beta(run)
    data, chosen = _time_all(run, grads, gradients["N"])
    everyone = torch.stack(_gather(data))              # [P, entries, densities, repeats, fields]
    if rank != 0:
        return None
    rows = _rows(run, everyone, checks, link, chosen, gradients["N"])
    gradients["per_rank"] = [{"rank": r, "norm": stats[:, 0].tolist(), "zeros": [int(z) for z in stats[:, 1]]}
                             for r, stats in enumerate(gradient_stats)]
    return _report(run, gradients, checks, link, rows)


def _per_node(link: torch.Tensor, node_of: list[int]) -> list[list[dict]]:
    """Per entry and density: the bytes one node's ranks sent inside the node and to other
    nodes (summed over its ranks; the busiest node of each repeat; median over repeats) and its
    interface's measured bytes (None without one). ``link``: [P, entries, densities, repeats, 3]."""
    nodes = sorted(set(node_of))
    summed = torch.stack([link[[r for r, nd in enumerate(node_of) if nd == node]].nansum(0) for node in nodes])
    measured = not bool(torch.isnan(link[..., 2]).all())
    out = []
    for ai in range(link.shape[1]):
        out.append([])
        for di in range(link.shape[2]):
            busiest = summed[:, ai, di].amax(0)   # [repeats, 3]
            med = [float(np.median(busiest[:, f].numpy())) for f in range(3)]
            out[-1].append({"node_intra_bytes": int(med[0]), "node_inter_bytes": int(med[1]),
                            "node_link_tx_bytes": int(med[2]) if measured else None})
    return out


# -- reporting --------------------------------------------------------------------------------
_CSV_COLS = ("algorithm", "P", "N", "density", "k", "baseline", "lossless", "repeats", "time_s", "comm_s", "bytes_sent",
             "rounds", "speedup_vs_dense", "bound_s", "bound_over_measured")
_NODE_CSV_COLS = ("hierarchy", "node_inter_bytes", "node_link_tx_bytes", "node_intra_bytes", "speedup_vs_flat")


def _table(rows) -> str:
    if rows and "hierarchy" in rows[0]:
        return _node_table(rows)
    lines = [f"{'algorithm':<26}{'density':>8}{'time ms':>10}{'comm ms':>10}{'MB sent':>10}{'rounds':>7}"
             f"{'speedup':>9}{'bound/meas':>11}"]
    for r in rows:
        sp = f"{r['speedup_vs_dense']:.2f}" if r["speedup_vs_dense"] else "-"
        bm = f"{r['bound_over_measured']:.2f}" if r["bound_over_measured"] else "-"
        lines.append(f"{r['algorithm']:<26}{r['density']:>8g}{r['time_s'] * 1e3:>10.1f}{r['comm_s'] * 1e3:>10.1f}"
                     f"{r['bytes_sent'] / 1e6:>10.2f}{r['rounds']:>7}{sp:>9}{bm:>11}")
    return "\n".join(lines)


def _node_table(rows) -> str:
    """The --hierarchy table: per algorithm its flat and two-level rows, the node's link bytes."""
    lines = [f"{'algorithm':<22}{'hierarchy':>10}{'density':>8}{'time ms':>10}{'inter MB/node':>15}"
             f"{'link tx MB':>12}{'intra MB/node':>15}{'vs dense':>10}{'vs flat':>9}"]
    for r in rows:
        sp = f"{r['speedup_vs_dense']:.2f}" if r["speedup_vs_dense"] else "-"
        vf = f"{r['speedup_vs_flat']:.2f}" if r["speedup_vs_flat"] else "-"
        tx = f"{r['node_link_tx_bytes'] / 1e6:.2f}" if r["node_link_tx_bytes"] is not None else "-"
        lines.append(f"{r['algorithm']:<22}{r['hierarchy']:>10}{r['density']:>8g}{r['time_s'] * 1e3:>10.1f}"
                     f"{r['node_inter_bytes'] / 1e6:>15.2f}{tx:>12}{r['node_intra_bytes'] / 1e6:>15.2f}{sp:>10}{vf:>9}")
    return "\n".join(lines)


def _write(report: dict, out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    written = [out_dir / "collectives.csv", out_dir / "collectives.json"]
    two_level = "hierarchies" in report
    cols = _CSV_COLS + (_NODE_CSV_COLS if two_level else ())
    with open(written[0], "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        for r in report["rows"]:
            w.writerow({c: r[c] for c in cols})
    with open(written[1], "w") as f:
        json.dump(report, f, indent=1)
    # one file per P as well: runs at several P (one launch each) into the same --out make the
    # time-vs-P plot below; a two-level run is named by its shape and kept out of that plot
    per_p = out_dir / (f"collectives_{report['nodes']}x{report['ranks_per_node']}.json" if two_level
                       else f"collectives_P{report['P']}.json")
    per_p.write_text(json.dumps(report, indent=1))
    written.append(per_p)
    plt = pyplot()
    if plt is None:
        print("matplotlib is not installed: skipping the PNG plots")
        return written
    rows, dens = report["rows"], report["densities"]
    algos = list(dict.fromkeys(r["algorithm"] for r in rows))
    grads = f"{report['gradients']['source']} gradients"
    fig = bars_figure(plt, report)
    fig.savefig(out_dir / "collectives_bars.png", dpi=110)
    written.append(out_dir / "collectives_bars.png")
    plt.close(fig)
    if len(dens) > 1:
        key = (lambda r: f"{r['algorithm']} ({r['hierarchy']})") if two_level else (lambda r: r["algorithm"])
        series = {}
        for r in rows:
            series.setdefault(key(r), []).append((r["density"], r["time_s"]))
        series = {a: sorted(points) for a, points in series.items()}
        written.append(line_plot(plt, out_dir / "time_vs_density.png", series, "density",
                                  f"P = {report['P']}, N = {report['N']} ({grads}; {report['where']})", log_x=True))
    by_p = {} if two_level else _runs_by_p(out_dir, report)
    if len(by_p) > 1:
        series = {a: [(p, r["time_s"]) for p, run in sorted(by_p.items()) for r in run["rows"]
                      if r["algorithm"] == a and r["density"] == dens[0]] for a in algos}
        written.append(line_plot(plt, out_dir / "time_vs_P.png", series, "P (ranks)",
                                  f"N = {report['N']} ({grads}), density {dens[0]} ({report['where']})",
                                  xticks=sorted(by_p)))
    return written


def bars_figure(plt, report: dict):
    """Time, bytes and speedup over dense per algorithm at the first density, one bar each. The
    speedup panel says so when dense is not in the run (nothing to compare with); the title is
    wrapped to the figure's width and kept inside it."""
    rows, dens = report["rows"], report["densities"]
    two_level = "hierarchies" in report
    first = [r for r in rows if r["density"] == dens[0]]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.8), layout="constrained")
    bytes_key, bytes_label = ("node_inter_bytes", "bytes per node between nodes") if two_level else \
        ("bytes_sent", "bytes sent per rank")
    names = [r["algorithm"] + (f" ({r['hierarchy']})" if two_level else "") for r in first]
    for ax, key, label in zip(axes, ("time_s", bytes_key, "speedup_vs_dense"),
                              ("median time per call (s)", bytes_label, "speedup over dense")):
        ax.set_title(label)
        if key == "speedup_vs_dense" and not any(r[key] for r in first):
            ax.set_axis_off()
            ax.text(0.5, 0.5, "no speedup over dense:\ndense is not in this run\n(add dense to --algorithms)",
                    ha="center", va="center", transform=ax.transAxes, fontsize=11)
            continue
        ax.bar(names, [r[key] or 0 for r in first])
        plt.setp(ax.get_xticklabels(), rotation=50, ha="right", rotation_mode="anchor")
    grads = f"{report['gradients']['source']} gradients"
    title = f"P = {report['P']}, N = {report['N']} ({grads}), density {dens[0]} ({report['where']})"
    fig.suptitle(textwrap.fill(title, 130))
    return fig


def _gradients_model(report: dict) -> str:
    """What a report's gradients were (reports from before ``--gradients`` timed random ones)."""
    return report.get("gradients", {}).get("model", RANDOM_GRADIENTS)


def _runs_by_p(out_dir: Path, report: dict) -> dict[int, dict]:
    """The ``collectives_P*.json`` runs in ``out_dir`` with this run's N, gradients, first density
    and link."""
    runs = {}
    for path in sorted(out_dir.glob("collectives_P*.json")):
        try:
            run = json.loads(path.read_text())
        except (OSError, ValueError):
            continue   # a file we did not write, or a half-written one: not ours to plot
        if (run.get("N") == report["N"] and report["densities"][0] in run.get("densities", [])
                and run.get("where") == report["where"] and _gradients_model(run) == _gradients_model(report)):
            runs[int(run["P"])] = run
    return runs


# -- CLI --------------------------------------------------------------------------------------
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sparsecomm.bench collectives",
                                 description="Check, then time, every sparse allreduce algorithm.")
    ap.add_argument("--algorithms", nargs="+", default=["all"],
                    help="names of sparsecomm algorithms and/or PyTorch hook baselines (torch_fp16, "
                         "torch_powersgd), or 'all' for every one of both")
    ap.add_argument("--N", type=int, default=None,
                    help="elements of the random gradients (default 15000000); with --gradients TASK, N is the "
                         "model's parameter count and --N is refused")
    ap.add_argument("--gradients", default="random", metavar="random|TASK",
                    help="what the timing loop reduces: random (standard normal entries per rank and step, the "
                         "default) or the real gradients of a task of the accuracy benchmark "
                         f"({', '.join(task_defs.TASKS)}): "
                         "rank 0 trains its model --gradients-warmup steps, computes two consecutive steps' gradients "
                         "of every rank on the rank's own shard (the model stepping with their mean, as under DDP) and "
                         "sends each rank its own; N is then the model's parameter count. The correctness checks stay "
                         "on random vectors of --check-n")
    ap.add_argument("--width", type=float, default=None,
                    help=f"channel width of {' and '.join(_WIDTH_TASKS)} with --gradients (1: the paper's; the tasks' "
                         "defaults are 0.125 and 0.5; vgg16 at width 1 has 15.2 M parameters)")
    ap.add_argument("--hidden", type=int, default=None,
                    help=f"hidden units of {' and '.join(_HIDDEN_TASKS)} with --gradients (defaults 2048 and 256)")
    ap.add_argument("--gradients-warmup", type=int, default=None,
                    help="training steps before the two gradient steps with --gradients TASK (default 5; the "
                         "balance benchmark uses 20)")
    ap.add_argument("--density", type=float, nargs="+", default=[0.01])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default="bench_results")
    ap.add_argument("--nproc", type=int, default=2, help="ranks to start when not under a launcher")
    ap.add_argument("--check-n", type=int, default=100_003)
    ap.add_argument("--pingpong-max", type=int, default=64 << 20, help="largest ping-pong message (bytes)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    ap.add_argument("--shuffle", action="store_true",
                    help="run each repeat's algorithms in a shuffled order (seeded by the repeat, the same on "
                         "every rank) instead of the listed order, so no algorithm always runs after the same one")
    ap.add_argument("--hierarchy", nargs="+", choices=HIERARCHY_CHOICES, default=["flat"],
                    help="flat (every rank a peer), node (dense inside a node, the algorithm between nodes) or "
                         "both: each algorithm timed in every hierarchy given, interleaved in the same launch; "
                         "with node the rows add the bytes per node on the inter-node link")
    ap.add_argument("--nproc-per-node", type=int, default=None,
                    help="ranks per node of --hierarchy node when the benchmark starts its own ranks (under a "
                         "launcher the topology is the launcher's LOCAL_WORLD_SIZE)")
    ap.add_argument("--timeout", type=float, default=3600.0)
    ap.add_argument("--codecs", nargs="+", default=[],
                    help="also run every chosen algorithm that takes the COO codecs with these codecs: "
                         "delta_binary, skcompress or delta_binary+skcompress (labels like topka+skcompress; "
                         "such labels are also accepted in --algorithms)")
    args = ap.parse_args(argv)

    known = algorithms.names() + baselines.names()
    names = known if args.algorithms == ["all"] else args.algorithms
    for codec in args.codecs:
        names = names + [f"{a}+{codec}" for a in names if "+" not in a and a in algorithms.names()
                         and "value_codec" in algorithms.get(a).option_defaults]

    def _known(label):
        try:
            base, options = _variant(label)
        except ValueError:
            return False
        if base in algorithms.names() and options and all("=" in x for x in label.split("+")[1:]):
            return set(options) <= set(algorithms.get(base).option_defaults)   # "gssgd+sketch_size=10"
        return label in known or (base in algorithms.names() and "value_codec" in algorithms.get(base).option_defaults)

    bad = [a for a in names if not _known(a)]
    if bad:
        ap.error(f"unknown algorithm(s) {', '.join(map(repr, bad))}; known: {', '.join(known)} (or 'all')")
    task = args.gradients
    if task == "random":
        given = [opt for opt, v in (("--width", args.width), ("--hidden", args.hidden),
                                    ("--gradients-warmup", args.gradients_warmup)) if v is not None]
        if given:
            ap.error(f"{', '.join(given)} set(s) the model of --gradients TASK; with random gradients use --N")
        n = 15_000_000 if args.N is None else args.N
    else:
        if task not in task_defs.TASKS:
            ap.error(f"unknown --gradients {task!r}; choose random or a task: {', '.join(task_defs.TASKS)}")
        if args.N is not None:
            ap.error(f"--N is the model's parameter count with --gradients {task}; drop --N "
                     f"(--width sets the size of {' and '.join(_WIDTH_TASKS)}, "
                     f"--hidden of {' and '.join(_HIDDEN_TASKS)})")
        if args.width is not None and (task not in _WIDTH_TASKS or not args.width > 0):
            ap.error(f"--width must be > 0 and is for {' and '.join(_WIDTH_TASKS)}; {task} has no width"
                     if task not in _WIDTH_TASKS else f"--width must be > 0, got {args.width}")
        if args.hidden is not None and (task not in _HIDDEN_TASKS or args.hidden < 1):
            ap.error(f"--hidden is for {' and '.join(_HIDDEN_TASKS)}; {task} has no hidden width"
                     if task not in _HIDDEN_TASKS else f"--hidden must be >= 1, got {args.hidden}")
        if args.gradients_warmup is not None and args.gradients_warmup < 0:
            ap.error(f"--gradients-warmup must be >= 0, got {args.gradients_warmup}")
        n = None
    if args.repeats < 1 or (n is not None and n < 1) or args.check_n < 1:
        ap.error("--repeats, --N and --check-n must be >= 1")
    bad_d = [d for d in args.density if not 0 < d <= 1]
    if bad_d:
        ap.error(f"--density values must be in (0, 1], got {bad_d}")
    names = list(dict.fromkeys(names))
    under_launcher = launched()
    where = describe_link()[0] if under_launcher else "gloo loopback"
    per_node = None
    if "node" in args.hierarchy or "both" in args.hierarchy:
        with_baselines = [a for a in names if is_baseline(a)]
        if with_baselines:
            ap.error(f"--hierarchy node times sparsecomm's algorithms only; drop {', '.join(with_baselines)} "
                     "(PyTorch's hooks run flat) or time them in a flat run")
    hierarchies = hierarchies_of(ap, args, under_launcher)
    if "node" in hierarchies and not under_launcher:
        per_node = args.nproc_per_node
        where = (f"gloo loopback, {Topology(args.nproc // per_node, per_node)} given by --nproc-per-node "
                 "(no separate link per node)")
    cfg = {"algorithms": names, "n": n, "gradients": task, "width": args.width, "hidden": args.hidden,
           "gradients_warmup": 5 if args.gradients_warmup is None else args.gradients_warmup,
           "densities": args.density, "repeats": args.repeats,
           "check_n": args.check_n, "pingpong_max": args.pingpong_max, "threads": args.threads, "where": where,
           "shuffle": args.shuffle, "hierarchies": hierarchies, "per_node": per_node}
    if not under_launcher and args.nproc < 2:
        ap.error("--nproc must be >= 2")
    report = run_ranks(_worker, args.nproc, cfg, timeout=args.timeout)[0]
    if report is None:
        return 0
    if "hierarchies" in report:
        print(f"\n{report['nodes']} nodes x {report['ranks_per_node']} ranks: flat and two-level in the same launch; "
              "bytes per node: summed over its ranks, the busiest node")
    source = report["gradients"]
    print(f"\ngradients: {'random, ' if source['source'] == 'random' else source['source'] + ': '}{source['model']}")
    print(f"P = {report['P']}, N = {report['N']}, {report['where']}, medians of {report['repeats']} ({report['order']} order) "
          f"(slowest rank), alpha = {report['alpha_s'] * 1e6:.1f} us, beta = {report['beta_s_per_byte'] * 1e9:.3f} ns/B")
    print(_table(report["rows"]))
    for p in _write(report, Path(args.out)):
        print(f"wrote {p}")
    return 0
