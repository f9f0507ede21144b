"""gtopk against a numpy reference of the gTop-k tree (folding, merges keeping top-k of
the sum, dropped partial sums kept by the rank that dropped them), several steps."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import sparsecomm as sc
from sparsecomm.comm import simulate
from sparsecomm.testing import spawn

STEPS = 3


def ref_topk(v, k):
    order = np.lexsort((np.arange(len(v)), -np.abs(v)))  # |v| descending, lower index first
    return np.sort(order[:k])


def ref_gtopk_step(accs, k):
    """One call on every rank: returns (out, residuals)."""
    size, n = len(accs), len(accs[0])
    k = min(k, n)
    res = [a.copy() for a in accs]
    cur = []
    for r in range(size):
        sel = ref_topk(accs[r], k)
        cur.append({int(i): accs[r][i] for i in sel})
        res[r][sel] = 0

    def merge(r, other):
        merged = dict(cur[r])
        for i, v in other.items():
            merged[i] = merged.get(i, 0.0) + v
        idx = np.array(sorted(merged))
        vals = np.array([merged[i] for i in idx])
        keep = ref_topk(vals, k)
        drop = np.setdiff1d(np.arange(len(idx)), keep)
        res[r][idx[drop]] += vals[drop]
        cur[r] = {int(idx[j]): vals[j] for j in keep}

    p2 = 1 << (size.bit_length() - 1)
    for r in range(p2, size):
        merge(r - p2, cur[r])
    d = 1
    while d < p2:
        for r in range(0, p2, 2 * d):
            merge(r, cur[r + d])
        d *= 2
    out = np.zeros(n)
    for i, v in cur[0].items():
        out[i] = v
    return out, res


def rank_history(comm, density, grads_by_step):
    reducer = sc.SparseAllreduce("gtopk", density, comm=comm)
    hist = []
    for grads in grads_by_step:
        out = reducer(torch.from_numpy(grads[comm.rank]).clone())
        hist.append((out.numpy().copy(), reducer.residual.numpy().copy(), dict(reducer.last_stats)))
    return hist


def make(size, n, pattern, seed):
    rng = np.random.default_rng(seed)
    steps = []
    for _ in range(STEPS):
        if pattern == "overlap":
            base = rng.standard_normal(n)
            steps.append([(base + 0.1 * rng.standard_normal(n)).astype(np.float64) for _ in range(size)])
        elif pattern == "ties":
            steps.append([rng.integers(-2, 3, n).astype(np.float64) for _ in range(size)])
        else:
            steps.append([rng.standard_normal(n) for _ in range(size)])
    return steps


def check(size, n, density, pattern, results, grads_by_step):
    k = min(n, max(1, math.ceil(density * n)))
    residuals = [np.zeros(n) for _ in range(size)]
    p2 = 1 << (size.bit_length() - 1)
    rounds = 2 * int(math.log2(p2)) + (2 if size > p2 else 0)
    msg = 32 + (k * 4 + 7) // 8 * 8 + k * 8
    for step, grads in enumerate(grads_by_step):
        accs = [grads[r] + residuals[r] for r in range(size)]
        out, residuals = ref_gtopk_step(accs, k)
        for r in range(size):
            assert np.array_equal(results[r][step][0], results[0][step][0]), (step, r)
            np.testing.assert_allclose(results[r][step][1], residuals[r], rtol=1e-9, atol=1e-9)
            residuals[r] = results[r][step][1]
        np.testing.assert_allclose(results[0][step][0], out, rtol=1e-9, atol=1e-9)
        # conservation
        np.testing.assert_allclose(sum(accs), results[0][step][0] + sum(residuals), rtol=1e-9, atol=1e-9)
        assert np.count_nonzero(results[0][step][0]) <= k
        stats = [results[r][step][2] for r in range(size)]
        assert stats[0]["rounds"] == rounds and max(s["rounds"] for s in stats) == rounds
        assert sum(s["bytes_sent"] for s in stats) == 2 * (size - 1) * msg


@pytest.mark.parametrize("size,n,density,pattern", [
    (1, 100, 0.05, "random"), (3, 1025, 0.01, "random"), (5, 301, 0.1, "overlap"), (6, 2, 0.5, "random"),
    (7, 500, 0.02, "ties"), (12, 2000, 0.01, "random"), (33, 1025, 0.01, "overlap"), (64, 1025, 0.01, "random"),
    (4, 10, 1.0, "random")])
def test_gtopk_simulated(size, n, density, pattern):
    g = make(size, n, pattern, size * 7 + n)
    results = simulate(size, lambda comm: rank_history(comm, density, g)).results
    check(size, n, density, pattern, results, g)


def _gloo(rank, world_size, cases):
    from sparsecomm.comm import TorchComm
    comm = TorchComm()
    return [rank_history(comm, density, g) for density, g in cases]


@pytest.mark.parametrize("size", range(1, 9))
def test_gtopk_gloo(size):
    specs = [(1025, 0.01, "random"), (300, 0.05, "overlap")]
    cases = [(d, make(size, n, p, size + n)) for n, d, p in specs]
    runs = spawn(_gloo, size, cases, timeout=120)
    for c, (n, d, p) in enumerate(specs):
        check(size, n, d, p, [runs[r][c] for r in range(size)], cases[c][1])


def test_gtopk_empty_and_registry():
    assert "gtopk" in sc.algorithms.names()
    out = simulate(3, lambda comm: sc.SparseAllreduce("gtopk", 0.1, comm=comm)(torch.zeros(0))).results
    assert all(o.numel() == 0 for o in out)
