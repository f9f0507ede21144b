"""Planted heavy hitters recovered by gssgd against the bytes it sends: the trade-off of sketch
size and candidates against recall.

    python benchmarks/gssgd_recall.py                         # the table of docs/gssgd.md
    python benchmarks/gssgd_recall.py --n 100000 --k 1000 --P 4 --seeds 3

Gradients: k coordinates of magnitude ~1 (uniform 0.9..1.1, random signs) in Gaussian noise of
scale 0.01, either on every rank ("every") or each on a random nonempty subset of about half the
ranks ("some"); the planted ones are then the exact global top-k. One call of
``SparseAllreduce("gssgd", k / n)`` on the simulated Comm per seed; recall = the fraction of the
global top-k among the k outputs. Bytes: the slowest rank's, ``GlobalSketchSGD.rank_traffic`` (what the
Comm counts, tests/test_gssgd.py). Prints one row per configuration: rows, sketch cells per
selected entry, p2, bytes per rank, bytes per output entry, mean and min recall per case.
"""

from __future__ import annotations

import argparse
import math
import warnings

import numpy as np
import torch

import sparsecomm as sc
from sparsecomm.algorithms.gssgd import GlobalSketchSGD
from sparsecomm.comm import simulate

GRID = [
    {"sketch_size": 5}, {"sketch_size": 10}, {"sketch_size": 20}, {"sketch_size": 30}, {"sketch_size": 40},
    {"sketch_size": 60}, {"sketch_size": 80},
    {"sketch_size": 10, "p2": 16}, {"sketch_size": 10, "p2": 32},
    {"rows": 3, "sketch_size": 40}, {"rows": 7, "sketch_size": 20}, {"rows": 7, "sketch_size": 40},
    {"rows": 7, "sketch_size": 40, "p2": 4}, {"sketch_size": 40, "p2": 4},
    {},  # the defaults: the width of the heavy-hitter guarantee
]


def planted(size: int, n: int, k: int, everywhere: bool, seed: int):
    rng = np.random.default_rng(seed)
    heavy = rng.choice(n, k, replace=False)
    sign = np.where(rng.random(k) < 0.5, -1.0, 1.0)
    present = np.ones((size, k), bool) if everywhere else rng.random((size, k)) < 0.5
    present[rng.integers(0, size, k), np.arange(k)] = True
    grads = []
    for r in range(size):
        g = 0.01 * rng.standard_normal(n)
        g[heavy] += present[r] * sign * rng.uniform(0.9, 1.1, k)
        grads.append(torch.from_numpy(g.astype(np.float32)))
    total = sum(g.double() for g in grads)
    return grads, set(total.abs().topk(k).indices.tolist())


def recall(size: int, n: int, k: int, everywhere: bool, seed: int, options: dict) -> float:
    grads, best = planted(size, n, k, everywhere, seed)
    outs = simulate(size, lambda c: sc.SparseAllreduce("gssgd", k / n, comm=c, **options)(
        grads[c.rank].clone())).results
    return len(set(outs[0].nonzero().squeeze(1).tolist()) & best) / k


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--k", type=int, default=200)
    ap.add_argument("--P", type=int, default=4)
    ap.add_argument("--seeds", type=int, default=3)
    args = ap.parse_args()
    warnings.simplefilter("ignore", RuntimeWarning)
    n, k, P = args.n, args.k, args.P
    dense = 2 * (P - 1) / P * 4 * n
    print(f"N = {n}, k = {k} (density {k / n:.3%}), P = {P}, {args.seeds} seeds; dense ring allreduce "
          f"{dense / 1e6:.3f} MB / rank")
    print("| rows | cells / entry | p2 | bytes / rank | bytes / output entry | x dense | recall, every rank: mean (min) "
          "| some ranks: mean (min) |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for options in GRID:
        o = {**GlobalSketchSGD.option_defaults, **options}
        _, rows, cols, _ = GlobalSketchSGD._shape(n, k, o)
        sent = GlobalSketchSGD.rank_traffic(P, n, k, **options)[0]
        cells = f"{rows * cols / k:.1f}" + ("" if options.get("sketch_size") else " (auto)")
        res = []
        for everywhere in (True, False):
            got = [recall(P, n, k, everywhere, seed, options) for seed in range(args.seeds)]
            res.append(f"{np.mean(got):.3f} ({min(got):.3f})")
        print(f"| {rows} | {cells} | {o['p2']:g} | {sent} | {sent / k:.1f} | {sent / dense:.3f} | {res[0]} | {res[1]} |",
              flush=True)


if __name__ == "__main__":
    main()
