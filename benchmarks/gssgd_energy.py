"""Energy captured per byte sent by gssgd's sketch configurations, on real gradients.

    python benchmarks/gssgd_energy.py                                  # the grid of docs/gssgd.md
    python benchmarks/gssgd_energy.py --hidden 1024 --steps 3 --configs "rows=5,sketch_size=10,p1=1,p2=2"

Gradients: the README demo's MLP (examples/ddp_demo.py: 784-H-H-10, generated MNIST-shaped
data, batch 32 per rank), P ranks each on its own data stream, along a dense SGD trajectory
(lr 0.05, momentum 0.9), so every configuration sees the same gradient sequence. Each
configuration runs ``--steps`` calls of ``SparseAllreduce("gssgd", density)`` with error
feedback on the simulated Comm. Per call: energy captured = ||out||^2 / ||top-k(total)||^2,
where total = sum over ranks of acc = out + the ranks' residuals after the call (conservation),
i.e. the fraction of the exact global top-k's energy the call delivered. Bytes: the slowest
rank's bytes sent as the simulated Comm counted them (checked against
``GlobalSketchSGD.rank_traffic``), and the same for topka / gtopk / spardl for reference.
Prints one row per configuration: mean energy over the calls after the first, bytes per rank,
bytes relative to a dense ring allreduce (2 (P-1)/P 4N), energy per MB.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import threading
import time

import torch
import torch.nn as nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
import sparsecomm as sc  # noqa: E402
from sparsecomm.algorithms.gssgd import GlobalSketchSGD  # noqa: E402
from sparsecomm.comm import simulate  # noqa: E402

GRID = [
    # the earlier default sketches and the rework's proposed sizes
    "p1=None,rows=7,columns=10k,p2=1,allreduce=tree",
    "p1=None,rows=5,sketch_size=5,p2=1",
    "p1=None,rows=7,sketch_size=14,p2=1",
    # local top-k truncation, sizes
    "p1=1,rows=7,sketch_size=14,p2=1",
    "p1=1,rows=3,sketch_size=3,p2=1", "p1=1,rows=3,sketch_size=6,p2=1", "p1=1,rows=3,sketch_size=12,p2=1",
    "p1=1,rows=5,sketch_size=5,p2=1", "p1=1,rows=5,sketch_size=10,p2=1", "p1=1,rows=5,sketch_size=20,p2=1",
    "p1=1,rows=7,sketch_size=7,p2=1", "p1=1,rows=7,sketch_size=28,p2=1",
    # candidates and truncation depth
    "p1=1,rows=5,sketch_size=5,p2=2", "p1=1,rows=5,sketch_size=10,p2=2", "p1=1,rows=5,sketch_size=10,p2=3",
    "p1=1,rows=3,sketch_size=6,p2=2", "p1=1,rows=5,sketch_size=20,p2=2",
    "p1=1,rows=5,sketch_size=5,p2=4", "p1=1,rows=5,sketch_size=10,p2=4", "p1=1,rows=3,sketch_size=6,p2=4",
    "p1=2,rows=5,sketch_size=10,p2=2", "p1=2,rows=5,sketch_size=10,p2=4",
    "topka", "gtopk", "spardl",
]


def parse(config: str) -> tuple[str, dict]:
    if "=" not in config:
        return config, {}
    options = {}
    for item in config.split(","):
        key, value = item.split("=")
        if value == "None":
            options[key] = None
        elif value.endswith("k") and key == "columns":
            options[key] = ("k", float(value[:-1]))  # a multiple of k, resolved per N
        elif key in ("rows",):
            options[key] = int(value)
        elif key in ("allreduce", "heavymix", "estimate"):
            options[key] = value
        else:
            options[key] = float(value)
    return "gssgd", options


def gradients(args) -> list[list[torch.Tensor]]:
    from ddp_demo import make_data
    from models import MLP
    torch.manual_seed(args.seed)
    model = MLP(784, args.hidden, 10)
    data = [make_data(rank, args.batch * args.steps) for rank in range(args.nproc)]
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    steps = []
    for step in range(args.steps):
        per_rank = []
        for rank in range(args.nproc):
            x, y = data[rank]
            b = slice(step * args.batch, (step + 1) * args.batch)
            model.zero_grad()
            nn.functional.cross_entropy(model(x[b]), y[b]).backward()
            per_rank.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]).clone())
        for p, g in zip(model.parameters(), torch.stack(per_rank).mean(0).split([p.numel() for p in model.parameters()])):
            p.grad = g.view_as(p).clone()
        opt.step()
        steps.append(per_rank)
    return steps


def run(name: str, options: dict, grads, density: float, nproc: int) -> tuple[list[float], int, float]:
    n = grads[0][0].numel()
    k = max(1, math.ceil(density * n))
    if isinstance(options.get("columns"), tuple):
        options = {**options, "columns": math.ceil(options["columns"][1] * k)}
    totals = [torch.zeros(n, dtype=torch.float64) for _ in grads]
    outs: list = [None] * len(grads)
    lock = threading.Lock()

    def fn(comm):
        reducer = sc.SparseAllreduce(name, density, comm=comm, **options)
        sent, seconds = [], []
        for step, per_rank in enumerate(grads):
            start = time.perf_counter()
            out = reducer(per_rank[comm.rank].clone())
            seconds.append(time.perf_counter() - start)
            sent.append(reducer.last_stats["bytes_sent"])
            with lock:
                totals[step] += reducer.residual.double()
                if comm.rank == 0:
                    totals[step] += out.double()
                    outs[step] = out.double()
        return sent, seconds

    results = simulate(nproc, fn, timeout=600).results
    energy = []
    for total, out in zip(totals, outs):
        best = total.abs().topk(k).values.pow(2).sum()
        energy.append(float(out.pow(2).sum() / best))
    sent = max(max(s) for s, _ in results)
    if name == "gssgd":
        formula = GlobalSketchSGD.rank_traffic(nproc, n, k, **options)[0]
        assert formula == sent, (options, formula, sent)
    seconds = sorted(max(r[1][i] for r in results) for i in range(len(grads)))[len(grads) // 2]
    return energy, sent, seconds


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--density", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--configs", nargs="*", default=GRID)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    grads = gradients(args)
    n = grads[0][0].numel()
    dense = 2 * (args.nproc - 1) / args.nproc * 4 * n
    print(f"MLP 784-{args.hidden}-{args.hidden}-10, N = {n}, P = {args.nproc}, density {args.density}, "
          f"k = {math.ceil(args.density * n)}, {args.steps} calls from a dense trajectory; "
          f"energy = mean over calls 2..{args.steps}")
    print(f"{'configuration':<48} {'energy':>7} {'min':>6} {'MB/rank':>8} {'x dense':>8} {'energy/MB':>9} {'call s':>7}")
    for config in args.configs:
        name, options = parse(config)
        energy, sent, seconds = run(name, options, grads, args.density, args.nproc)
        later = energy[1:] or energy
        mean = sum(later) / len(later)
        print(f"{config:<48} {mean:7.3f} {min(later):6.3f} {sent / 1e6:8.2f} {sent / dense:8.3f} "
              f"{mean / (sent / 1e6):9.4f} {seconds:7.2f}", flush=True)


if __name__ == "__main__":
    main()
