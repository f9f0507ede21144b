"""Benchmark of ``spardl`` beside ``topka`` and ``dense`` (docs/spardl.md).

For each P it first checks correctness on the gloo ranks (bit-identical output on every
rank, conservation sum_r (g_r + e_r) == out + sum_r e'_r, over three steps, for every
SparDL variant), then times every algorithm on the same ranks, interleaved round-robin so
that machine noise hits all of them alike, and reports medians and ratios measured in the
same run:

* per-step wall time (slowest rank), split into select + merge compute (``last_stats``)
  and wire time (``comm_s``); on this 2-core machine P ranks share two CPUs, so compute
  is reported apart from the wire;
* bytes sent per rank and rounds;
* ``dense time / algorithm time`` and ``topka time / spardl time``;
* the simulated alpha-beta communication time of the same schedule at 1 Gbit/s
  (alpha = 50 us) and Table 1's formula for it, i.e. what the algorithm costs on the
  papers' 1 Gbit/s clusters.

Usage::

    python benchmarks/bench_spardl.py                       # N = 15M, density 1%, P = 4 and 6
    python benchmarks/bench_spardl.py --n 1M --sizes 2 4 --repeats 3 --json out.json
    python -m sparsecomm.launch --nproc 4 --bandwidth 1gbit -- python benchmarks/bench_spardl.py
                                                            # on the emulated 1 Gbit/s cluster
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time

import numpy as np
import torch

try:
    import sparsecomm as sc
except ImportError:  # running from a checkout without installing
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import sparsecomm as sc

from sparsecomm.bench.common import bench_gradient, parse_size
from sparsecomm.comm import GBIT_BETA, simulate
from sparsecomm.testing import launched, spawn


def variants(size: int) -> list[tuple[str, str, dict]]:
    """(label, algorithm, options) timed for this P."""
    out = [("spardl", "spardl", {})]                       # the paper's default for this P
    if size >= 4 and size % 2 == 0:
        out.append(("spardl teams=1", "spardl", {"teams": 1}))
    if size % 3 == 0:
        out.append(("spardl B-SAG d=3", "spardl", {"teams": 3}))
    out += [("topka", "topka", {}), ("dense", "dense", {})]
    return out


def _rank(rank, size, n, density, repeats, check_n):
    from sparsecomm.comm import TorchComm

    torch.set_num_threads(1)
    comm = TorchComm()
    # correctness first, on a smaller vector: every SparDL variant, three steps
    checks = []
    for label, algorithm, options in variants(size):
        if algorithm != "spardl":
            continue
        reducer = sc.SparseAllreduce(algorithm, density, comm=comm, **options)
        steps = []
        for step in range(3):
            g = bench_gradient(rank, step, check_n, torch.float64)
            out = reducer(g)
            steps.append((g.numpy(), out.numpy().copy(), reducer.residual.numpy().copy()))
        checks.append((label, steps))
    # timing
    grads = [bench_gradient(rank, step, n) for step in range(2)]
    reducers = {label: sc.SparseAllreduce(algorithm, density, comm=comm, **options)
                for label, algorithm, options in variants(size)}
    out = torch.empty(n)
    for label, reducer in reducers.items():     # warm-up: handshake, layouts, buffers
        reducer(grads[0], out=out)
    rows = {label: [] for label in reducers}
    for rep in range(repeats):
        for label, reducer in reducers.items():
            comm.barrier()
            start = time.perf_counter()
            reducer(grads[rep % 2], out=out)
            wall = time.perf_counter() - start
            st = reducer.last_stats
            rows[label].append({"wall_s": wall, "select_s": st["select_s"], "merge_s": st["merge_s"],
                                "comm_s": st["comm_s"], "bytes_sent": st["bytes_sent"], "rounds": st["rounds"],
                                "nnz_out": st["nnz_out"]})
    return checks, rows


def check(size: int, checks_by_rank) -> None:
    for vi, (label, _) in enumerate(checks_by_rank[0]):
        carried = [0.0] * size
        for step in range(3):
            outs = [checks_by_rank[r][vi][1][step][1] for r in range(size)]
            for r in range(1, size):
                if not np.array_equal(outs[r], outs[0]):
                    raise AssertionError(f"P={size} {label} step {step}: rank {r} output differs from rank 0")
            total_in = sum(checks_by_rank[r][vi][1][step][0] + carried[r] for r in range(size))
            res = [checks_by_rank[r][vi][1][step][2] for r in range(size)]
            total_out = outs[0] + sum(res)
            err = float(np.abs(total_in - total_out).max())
            if err > 1e-9 * max(1.0, float(np.abs(total_in).max())):
                raise AssertionError(f"P={size} {label} step {step}: conservation off by {err}")
            carried = res


def simulated_comm_time(size: int, n: int, density: float, algorithm: str, options: dict) -> tuple[float, int]:
    """Alpha-beta time (1 Gbit/s, alpha 50 us) of one call after warm-up, and its bytes."""
    def fn(comm):
        reducer = sc.SparseAllreduce(algorithm, density, comm=comm, **options)
        g = bench_gradient(comm.rank, 0, n)
        reducer(g)
        before = comm.clock
        reducer(bench_gradient(comm.rank, 1, n))
        return comm.clock - before, reducer.last_stats["bytes_sent"]
    res = simulate(size, fn, alpha=50e-6, beta=GBIT_BETA, timeout=600).results
    return max(t for t, _ in res), max(b for _, b in res)


def table1_time(size, n, k, label, itemsize=4, alpha=50e-6, beta=GBIT_BETA):
    """Table 1 (alpha, beta in seconds, seconds per byte; an entry = index + value)."""
    ent = 4 + itemsize
    if label.startswith("spardl"):
        d = 2 if (label == "spardl" and size >= 4 and size % 2 == 0) else 1
        if "d=3" in label:
            d = 3
        if d == 1:
            return 2 * math.ceil(math.log2(size)) * alpha + 2 * k * (size - 1) / size * ent * beta
        q = size // d
        if d & (d - 1) == 0:
            return ((2 * math.ceil(math.log2(q)) + math.log2(d)) * alpha
                    + k * ((2 * size - 2 * d) / size + d / size * math.log2(d)) * ent * beta)
        # B-SAG: the upper bound of eq. (7); the final all-gather always sits at it because short
        # blocks are padded to L entries, the top-h all-gather is below it once h < dk/P
        return ((2 * math.ceil(math.log2(q)) + math.ceil(math.log2(d))) * alpha
                + k * (d * d + 2 * size - 3 * d) / size * ent * beta)
    if label == "topka":
        return math.ceil(math.log2(size)) * alpha + (size - 1) * k * ent * beta
    return 2 * (size - 1) * alpha + 2 * (size - 1) / size * n * itemsize * beta


_ROW_KEYS = ("wall_s", "select_s", "merge_s", "comm_s", "bytes_sent", "rounds", "nnz_out")


def _gather_launched(local, size: int) -> list:
    """Under ``python -m sparsecomm.launch``: all-gather every rank's (checks, rows) as
    plain tensors (nothing pickled between ranks) and rebuild spawn()'s result list."""
    import torch.distributed as dist

    checks, rows = local
    check_arr = torch.from_numpy(np.stack([np.stack([np.stack(step) for step in steps]) for _, steps in checks]))
    labels = list(rows)
    row_arr = torch.tensor([[[row[key] for key in _ROW_KEYS] for row in rows[label]] for label in labels],
                           dtype=torch.float64)
    check_all = [torch.empty_like(check_arr) for _ in range(size)]
    row_all = [torch.empty_like(row_arr) for _ in range(size)]
    dist.all_gather(check_all, check_arr)
    dist.all_gather(row_all, row_arr)
    results = []
    for rank in range(size):
        rank_checks = [(label, [tuple(step.numpy()) for step in check_all[rank][vi]])
                       for vi, (label, _) in enumerate(checks)]
        rank_rows = {label: [dict(zip(_ROW_KEYS, rep.tolist())) for rep in row_all[rank][li]]
                     for li, label in enumerate(labels)}
        results.append((rank_checks, rank_rows))
    return results


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", default="15M")
    ap.add_argument("--density", type=float, default=0.01)
    ap.add_argument("--sizes", type=int, nargs="+", default=[4, 6])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--check-n", type=int, default=100_003)
    ap.add_argument("--no-sim", action="store_true", help="skip the simulated 1 Gbit/s times")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    n = parse_size(args.n)
    k = max(1, math.ceil(args.density * n))
    report = {"n": n, "density": args.density, "k": k, "repeats": args.repeats, "sizes": {}}
    under_launcher = launched()
    where = (f"ranks started by the launcher (GLOO_SOCKET_IFNAME={os.environ.get('GLOO_SOCKET_IFNAME')})"
             if under_launcher else "gloo loopback")
    if os.environ.get("RANK", "0") == "0":
        print(f"N = {n}, density {args.density} (k = {k}), float32, {where}, 1 thread per rank, "
              f"{os.cpu_count()} CPUs; medians of {args.repeats}")
    if under_launcher:  # one P: the launcher's (e.g. on the emulated 1 Gbit/s network)
        import torch.distributed as dist

        dist.init_process_group("gloo")
        args.sizes = [dist.get_world_size()]
    for size in args.sizes:
        if under_launcher:
            results = _gather_launched(_rank(dist.get_rank(), size, n, args.density, args.repeats, args.check_n),
                                       size)
            if dist.get_rank() != 0:
                continue
        else:
            results = spawn(_rank, size, n, args.density, args.repeats, args.check_n, timeout=1800)
        check(size, [r[0] for r in results])
        print(f"\nP = {size}: correctness checked (consistency, conservation over 3 steps)")
        rows = {}
        for label in results[0][1]:
            per_rep = list(zip(*[results[r][1][label] for r in range(size)]))
            def med(key, agg=max):
                return statistics.median(agg(rank_row[key] for rank_row in rep) for rep in per_rep)
            rows[label] = {"wall_s": med("wall_s"), "select_s": med("select_s"), "merge_s": med("merge_s"),
                           "comm_s": med("comm_s"), "bytes_sent": med("bytes_sent"), "rounds": med("rounds"),
                           "nnz_out": med("nnz_out")}
        if not args.no_sim:
            for label, algorithm, options in variants(size):
                t, b = simulated_comm_time(size, n, args.density, algorithm, options)
                rows[label]["sim_1gbit_s"] = t
                rows[label]["table1_s"] = table1_time(size, n, k, label)
        dense = rows["dense"]["wall_s"]
        topka = rows["topka"]["wall_s"]
        hdr = (f"{'algorithm':<18}{'wall ms':>9}{'select':>8}{'merge':>8}{'comm':>8}{'MB sent':>9}{'rounds':>7}"
               f"{'dense/x':>8}{'topka/x':>8}{'sim 1G ms':>10}{'Table1':>8}")
        print(hdr)
        for label, row in rows.items():
            print(f"{label:<18}{row['wall_s'] * 1e3:>9.1f}{row['select_s'] * 1e3:>8.1f}{row['merge_s'] * 1e3:>8.1f}"
                  f"{row['comm_s'] * 1e3:>8.1f}{row['bytes_sent'] / 1e6:>9.2f}{int(row['rounds']):>7}"
                  f"{dense / row['wall_s']:>8.2f}{topka / row['wall_s']:>8.2f}"
                  + (f"{row['sim_1gbit_s'] * 1e3:>10.1f}{row['table1_s'] * 1e3:>8.1f}" if 'sim_1gbit_s' in row else ""))
        report["sizes"][size] = rows
    if args.json and os.environ.get("RANK", "0") == "0":
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    if under_launcher:
        dist.destroy_process_group()
    return report


if __name__ == "__main__":
    main()
