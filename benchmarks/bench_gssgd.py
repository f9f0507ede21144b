"""Benchmark of ``gssgd`` and ``gtopk`` beside ``topka`` and ``dense`` (docs/gssgd.md).

1. Correctness first: on simulated ranks, three steps of every algorithm, bit-identical
   output on every rank and conservation sum_r (g_r + e_r) == out + sum_r e'_r.
2. Sketch kernels: build (dense input) and estimate-all bandwidth in GB/s of the input
   vector, against one read pass (``x.sum()``) measured in the same run (ratios).
3. Algorithms on the simulated Comm (threads in one process, alpha = 50 us, 1 Gbit/s):
   medians of per-step wall time (the 2 cores are shared by all P ranks), bytes sent by
   rank 0 and in total, rounds, the alpha-beta communication time of the schedule, and
   ratios ``dense / algorithm`` for both.

With ``--baseline-lib`` an older ``csrc/cpu/sketch.c`` built as a plain C library is timed
beside the current kernels (step 2), and ``gssgd-base`` (gssgd with the baseline's build
and estimate patched in) beside ``gssgd`` (step 3). When the two libraries share the hash
family their tables and estimates must be bit-identical; when they do not (the run family
of 23f884f: see docs/gssgd.md) the bench prints the median estimate error of both instead.

Usage::

    python benchmarks/bench_gssgd.py                 # N = 4M, density 1%, P = 4
    python benchmarks/bench_gssgd.py --n 1M --sizes 2 4 8 --repeats 5
    # before/after in one run: build an older csrc/cpu/sketch.c as a plain C library
    git show 23f884f~1:csrc/cpu/sketch.c > /tmp/old.c
    gcc -std=c99 -O3 -fopenmp -fPIC -shared -Icsrc/include -Icsrc/cpu /tmp/old.c -o /tmp/old_sketch.so
    python benchmarks/bench_gssgd.py --n 15M --sizes 1 --threads 1 --baseline-lib /tmp/old_sketch.so
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time

import torch

try:
    import sparsecomm as sc
except ImportError:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import sparsecomm as sc
from sparsecomm.bench.common import bench_gradient, parse_size
from sparsecomm.comm import GBIT_BETA, simulate

ALGORITHMS = ["dense", "topka", "gtopk", "gssgd"]


def check(size, n, density):
    for alg in ALGORITHMS:
        def fn(comm):
            red = sc.SparseAllreduce(alg, density, comm=comm)
            hist = []
            for step in range(3):
                g = bench_gradient(comm.rank, step, n)
                before = red.residual.clone() if red.residual is not None else torch.zeros(n)
                out = red(g.clone())
                hist.append((g + before, out.clone(), red.residual.clone()))
            return hist
        res = simulate(size, fn).results
        for step in range(3):
            out = res[0][step][1]
            assert all(torch.equal(res[r][step][1], out) for r in range(size)), (alg, step)
            lhs = sum(res[r][step][0].double() for r in range(size))
            rhs = out.double() + sum(res[r][step][2].double() for r in range(size))
            assert torch.allclose(lhs, rhs, atol=1e-4), (alg, step)
    print(f"correctness: {', '.join(ALGORITHMS)} consistent and conserving over 3 steps at P={size}, N={n}")


def baseline_ops(path):
    """``sketch_build_(table, x, seed)`` and ``sketch_estimate(table, n, seed)`` of a C-ABI
    sketch library (an older csrc/cpu/sketch.c) via ctypes, for float32 tables and inputs;
    the estimate allocates its output like the op does."""
    import ctypes
    lib = ctypes.CDLL(path)
    c64, u64, vp = ctypes.c_int64, ctypes.c_uint64, ctypes.c_void_p

    def build(table, x, seed):
        assert table.dtype == x.dtype == torch.float32 and table.is_contiguous() and x.is_contiguous()
        rows, cols = table.shape
        assert lib.sc_sketch_build_dense(0, vp(table.data_ptr()), c64(rows), c64(cols), u64(seed & (2**64 - 1)), 0,
                                         vp(x.data_ptr()), c64(x.numel()), torch.get_num_threads()) == 0
        return table

    def estimate(table, n, seed):
        assert table.dtype == torch.float32 and table.is_contiguous()
        rows, cols = table.shape
        out = torch.empty(n)
        assert lib.sc_sketch_estimate(0, vp(table.data_ptr()), c64(rows), c64(cols), u64(seed & (2**64 - 1)), None,
                                      c64(n), vp(out.data_ptr()), torch.get_num_threads()) == 0
        return out
    return build, estimate


def bench_sketch(n, k, repeats, baseline_lib=None):
    x = torch.randn(n)
    rows, cols = 7, max(256, 10 * k)
    kernels = {"": (lambda t, v: sc.ops.sketch_build_(t, v, 1), lambda t: sc.ops.sketch_estimate(t, n, 1))}
    if baseline_lib:
        base_build, base_estimate = baseline_ops(baseline_lib)
        kernels = {"baseline ": (lambda t, v: base_build(t, v, 1), lambda t: base_estimate(t, n, 1)), **kernels}
    tables = {name: sc.ops.sketch_new(rows, cols) for name in kernels}
    t_read, t_build, t_est = [], {name: [] for name in kernels}, {name: [] for name in kernels}
    ests = {}
    for _ in range(repeats):  # interleaved so noise hits all alike
        t0 = time.perf_counter(); x.sum(); t_read.append(time.perf_counter() - t0)
        for name, (build, estimate) in kernels.items():
            table = tables[name]
            t1 = time.perf_counter(); table.zero_(); build(table, x); t2 = time.perf_counter()
            ests[name] = estimate(table); t3 = time.perf_counter()
            t_build[name].append(t2 - t1); t_est[name].append(t3 - t2)
    if baseline_lib:
        if torch.equal(tables["baseline "], tables[""]):
            assert torch.equal(ests["baseline "], ests[""]), "baseline and current estimates disagree"
            print("baseline and current kernels: bit-identical tables and estimates")
        else:  # another hash family: compare what matters, the estimation error
            print("baseline and current kernels use different hash families; median |estimate - x|: " +
                  ", ".join(f"{name or 'current '}{(ests[name] - x).abs().median().item():.4f}" for name in kernels))
    gb = n * 4 / 1e9
    r = statistics.median(t_read)
    print(f"sketch {rows}x{cols} of N={n} float32 ({torch.get_num_threads()} threads), medians of {repeats}: "
          f"read pass {gb / r:.2f} GB/s ({r * 1e3:.2f} ms)")
    for name in kernels:
        b, e = statistics.median(t_build[name]), statistics.median(t_est[name])
        print(f"  {name or 'current '}build {gb / b:.2f} GB/s ({b * 1e3:.1f} ms, read/build = {r / b:.3f}); "
              f"estimate all {gb / e:.2f} GB/s ({e * 1e3:.1f} ms, read/estimate = {r / e:.3f})")


def bench_algorithms(size, n, density, repeats, baseline_lib=None):
    rows = {}
    algorithms = ALGORITHMS + (["gssgd-base"] if baseline_lib else [])
    patched = dict(zip(("sketch_build_", "sketch_estimate"), baseline_ops(baseline_lib))) if baseline_lib else {}
    for rep in range(repeats):
        for alg in algorithms:  # interleaved so noise hits all alike
            def fn(comm):
                # gssgd-base patches the dense build and the full estimate: compare it with gssgd
                # run the same way (the whole acc sketched, all N estimated, the defaults before
                # the local top-k truncation and the sliced estimate), not with the current defaults
                options = {"p1": None, "estimate": "full"} if alg.startswith("gssgd") and baseline_lib else {}
                red = sc.SparseAllreduce(alg.replace("-base", ""), density, comm=comm, **options)
                g = bench_gradient(comm.rank, rep, n)
                t0 = time.perf_counter()
                red(g)
                return time.perf_counter() - t0, dict(red.last_stats)
            saved = {name: getattr(sc.ops, name) for name in patched}
            if alg.endswith("-base"):  # gssgd calls sc.ops.sketch_* at call time
                for name, op in patched.items():
                    setattr(sc.ops, name, op)
            try:
                sim = simulate(size, fn, alpha=50e-6, beta=GBIT_BETA, timeout=600)
            finally:
                for name, op in saved.items():
                    setattr(sc.ops, name, op)
            wall = max(t for t, _ in sim.results)
            stats = [s for _, s in sim.results]
            rows.setdefault(alg, []).append((wall, sim.time, stats[0]["bytes_sent"],
                                             sum(s["bytes_sent"] for s in stats), stats[0]["rounds"]))
    med = {alg: [statistics.median(v[i] for v in vals) for i in range(5)] for alg, vals in rows.items()}
    print(f"P={size} N={n} density={density} (k={math.ceil(density * n)}), medians of {repeats}:")
    print(f"  {'algorithm':10} {'wall ms':>9} {'sim 1Gbit ms':>12} {'rank0 MB':>9} {'total MB':>9} {'rounds':>6} "
          f"{'dense/wall':>10} {'dense/sim':>9}")
    for alg, (wall, simt, b0, btot, rnd) in med.items():
        print(f"  {alg:10} {wall * 1e3:9.1f} {simt * 1e3:12.2f} {b0 / 1e6:9.3f} {btot / 1e6:9.3f} {int(rnd):6d} "
              f"{med['dense'][0] / wall:10.2f} " +
              (f"{med['dense'][1] / simt:9.2f}" if simt else f"{'-':>9}"))  # P = 1: nothing sent


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=parse_size, default=4 * 10**6)
    ap.add_argument("--density", type=float, default=0.01)
    ap.add_argument("--sizes", type=int, nargs="+", default=[4])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    ap.add_argument("--baseline-lib", default=None,
                    help="C-ABI sketch library (an older csrc/cpu/sketch.c) timed beside the current kernels")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    check(max(args.sizes), 5003, args.density)
    bench_sketch(args.n, math.ceil(args.density * args.n), max(5, args.repeats), args.baseline_lib)
    for size in args.sizes:
        bench_algorithms(size, args.n, args.density, args.repeats, args.baseline_lib)


if __name__ == "__main__":
    main()
