"""Benchmark of sparsecomm's CPU kernels (top-k, block top-k, COO merges).

Checks correctness on every size it times, then reports medians of repeats and
ratios measured side by side in the same run:

* ``torch.topk(x.abs(), k)`` time / ``ops.topk(x, k)`` time  (speed-up)
* ``ops.topk`` time / one read pass time  (how many memory passes top-k costs)
* block_topk throughput (P blocks, k/P per block)
* merge_add / merge_add_many throughput (input elements per second)

Usage::

    python -m sparsecomm.bench kernels                      # N in 1M, 10M, 100M
    python -m sparsecomm.bench kernels --sizes 1M 10M --repeats 7 --json out.json

Also importable: ``from sparsecomm.bench.kernels import main; main(["--sizes", "1M"])``
(``benchmarks/bench_kernels.py`` in a checkout runs the same ``main``).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence

import torch

from .. import ops
from .common import format_size, parse_size

__all__ = ["main", "bench_topk", "bench_block_topk", "bench_merge", "markdown", "machine"]

DENSITIES = (0.001, 0.01, 0.1)


def median_time(fn: Callable[[], object], repeats: int, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def interleaved_medians(fns: Sequence[Callable[[], object]], repeats: int) -> List[float]:
    """Median time of each fn, run round-robin so that noise from other load on
    the machine hits all of them alike (the ratios stay meaningful)."""
    for f in fns:
        f()
    ts: List[List[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for j, f in enumerate(fns):
            t0 = time.perf_counter()
            f()
            ts[j].append(time.perf_counter() - t0)
    return [statistics.median(t) for t in ts]


def read_pass(x: torch.Tensor) -> Callable[[], object]:
    """One read pass over x (torch.sum, multi-threaded, memory bound)."""
    return lambda: torch.sum(x)


def check_topk(x: torch.Tensor, k: int) -> None:
    """ops.topk against torch.topk on |x| (values compared as magnitudes;
    tie order may differ in torch, so compare the selected magnitude multiset
    and the index/value consistency)."""
    v, i = ops.topk(x, k)
    assert i.numel() == min(k, x.numel())
    assert bool((i[1:] > i[:-1]).all()), "indices not ascending"
    assert torch.equal(v, x[i]), "values != x[indices]"
    ref = torch.topk(x.abs(), k, sorted=True).values
    got = torch.sort(v.abs(), descending=True).values
    assert torch.equal(got, ref), "selected magnitudes differ from torch.topk"


def bench_topk(sizes: Sequence[int], densities: Sequence[float], repeats: int,
               torch_repeats: int, dtype: torch.dtype) -> List[Dict]:
    rows = []
    for n in sizes:
        g = torch.Generator().manual_seed(n)
        x = torch.randn(n, generator=g, dtype=torch.float32).to(dtype)
        for d in densities:
            k = max(1, int(d * n))
            check_topk(x, k)
            t_read, t_sc = interleaved_medians([read_pass(x), lambda: ops.topk(x, k)], repeats)
            t_torch = median_time(lambda: torch.topk(x.abs(), k), torch_repeats, warmup=0)
            rows.append(dict(kernel="topk", n=n, density=d, k=k, dtype=str(dtype),
                             t_sc_ms=t_sc * 1e3, t_torch_ms=t_torch * 1e3,
                             t_read_ms=t_read * 1e3, speedup_vs_torch=t_torch / t_sc,
                             read_over_topk=t_read / t_sc, topk_in_reads=t_sc / t_read))
            print(f"  topk N={format_size(n)} d={d}: sc {t_sc * 1e3:.2f} ms, torch {t_torch * 1e3:.1f} ms, "
                  f"read {t_read * 1e3:.2f} ms", flush=True)
        del x
    return rows


def bench_block_topk(sizes: Sequence[int], density: float, blocks: Sequence[int],
                     repeats: int) -> List[Dict]:
    rows = []
    for n in sizes:
        x = torch.randn(n, generator=torch.Generator().manual_seed(n + 1))
        k = max(1, int(density * n))
        for P in blocks:
            kpb = max(1, k // P)
            v, i = ops.block_topk(x, P, kpb)  # correctness: each block vs torch
            for b in range(P):
                lo, hi = b * n // P, (b + 1) * n // P
                sel = (i >= lo) & (i < hi)
                ref = torch.topk(x[lo:hi].abs(), min(kpb, hi - lo)).values
                assert torch.equal(torch.sort(v[sel].abs(), descending=True).values, ref)
            t_read, t = interleaved_medians([read_pass(x), lambda: ops.block_topk(x, P, kpb)], repeats)
            rows.append(dict(kernel="block_topk", n=n, blocks=P, k_per_block=kpb, density=density,
                             t_sc_ms=t * 1e3, t_read_ms=t_read * 1e3,
                             elems_per_s=n / t, topk_in_reads=t / t_read))
            print(f"  block_topk N={format_size(n)} P={P}: {t * 1e3:.2f} ms", flush=True)
        del x
    return rows


def rand_coo(n: int, nnz: int, g: torch.Generator):
    idx = torch.randperm(n, generator=g)[:nnz].sort().values.to(torch.int32)
    return idx, torch.randn(nnz, generator=g)


def bench_merge(sizes: Sequence[int], density: float, ranks: Sequence[int],
                repeats: int) -> List[Dict]:
    rows = []
    for n in sizes:
        g = torch.Generator().manual_seed(n + 2)
        nnz = max(1, int(density * n))
        for P in ranks:
            ins = [rand_coo(n, nnz, g) for _ in range(P)]
            idx = [a for a, _ in ins]
            val = [b for _, b in ins]
            # correctness: dense sums
            ref = torch.zeros(n)
            for a, b in ins:
                ref.index_add_(0, a.long(), b)
            if P == 2:
                fn = lambda: ops.merge_add(idx[0], val[0], idx[1], val[1])  # noqa: E731
                name = "merge_add"
            else:
                fn = lambda: ops.merge_add_many(idx, val)  # noqa: E731
                name = "merge_add_many"
            oi, ov = fn()
            dense = torch.zeros(n)
            dense[oi.long()] = ov
            assert torch.allclose(dense, ref, atol=1e-5), name
            t = median_time(fn, repeats)
            total = P * nnz
            rows.append(dict(kernel=name, n=n, ranks=P, nnz_per_input=nnz, t_sc_ms=t * 1e3,
                             elems_per_s=total / t))
            print(f"  {name} N={format_size(n)} P={P} nnz={nnz}: {t * 1e3:.2f} ms", flush=True)
    return rows


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return (f"{cpu}, {os.cpu_count()} logical CPUs, torch {torch.__version__} "
            f"({torch.get_num_threads()} threads), Python {platform.python_version()}")


def _table(header: Sequence[str], align: str, lines: Sequence[Sequence[str]]) -> List[str]:
    """A markdown table: ``align`` has one character per column, ``l`` left, ``r`` right."""
    rule = ["---" if a == "l" else "---:" for a in align]
    return ["| " + " | ".join(header) + " |", "|" + "|".join(rule) + "|",
            *("| " + " | ".join(cells) + " |" for cells in lines), ""]


def markdown(rows: List[Dict]) -> str:
    """The rows as markdown tables, one per kernel family."""
    out: List[str] = []
    tk = [r for r in rows if r["kernel"] == "topk"]
    if tk:
        out += _table(["N", "density", "k", "sc.ops.topk ms", "torch.topk(abs) ms", "one read pass ms", "torch / sc",
                       "read / sc", "sc in read passes"], "rrrrrrrrr",
                      [[format_size(r["n"]), f"{r['density']}", f"{r['k']}", f"{r['t_sc_ms']:.2f}",
                        f"{r['t_torch_ms']:.1f}", f"{r['t_read_ms']:.2f}", f"{r['speedup_vs_torch']:.1f}x",
                        f"{r['read_over_topk']:.2f}", f"{r['topk_in_reads']:.2f}"] for r in tk])
    bt = [r for r in rows if r["kernel"] == "block_topk"]
    if bt:
        out += _table(["N", "blocks", "k/block", "block_topk ms", "Melem/s", "in read passes"], "rrrrrr",
                      [[format_size(r["n"]), f"{r['blocks']}", f"{r['k_per_block']}", f"{r['t_sc_ms']:.2f}",
                        f"{r['elems_per_s'] / 1e6:.0f}", f"{r['topk_in_reads']:.2f}"] for r in bt])
    mg = [r for r in rows if r["kernel"].startswith("merge")]
    if mg:
        out += _table(["kernel", "N", "inputs", "nnz per input", "ms", "input Melem/s"], "lrrrrr",
                      [[r["kernel"], format_size(r["n"]), f"{r['ranks']}", f"{r['nnz_per_input']}",
                        f"{r['t_sc_ms']:.2f}", f"{r['elems_per_s'] / 1e6:.0f}"] for r in mg])
    return "\n".join(out)


def main(argv: Optional[Sequence[str]] = None) -> List[Dict]:
    """Run the kernel benchmark with command-line ``argv`` (None: ``sys.argv[1:]``); returns its rows."""
    p = argparse.ArgumentParser(prog="python -m sparsecomm.bench kernels", description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", nargs="+", default=["1M", "10M", "100M"],
                   help="N values (suffixes K, M, G allowed); default 1M 10M 100M")
    p.add_argument("--densities", nargs="+", type=float, default=list(DENSITIES))
    p.add_argument("--repeats", type=int, default=5, help="timed repeats (median), >= 5 advised")
    p.add_argument("--torch-repeats", type=int, default=5, help="repeats of the slow torch.topk")
    p.add_argument("--dtype", default="float32", choices=["float32", "float64", "float16", "bfloat16"])
    p.add_argument("--blocks", nargs="+", type=int, default=[4, 8], help="P for block_topk")
    p.add_argument("--ranks", nargs="+", type=int, default=[2, 4, 8], help="inputs for merges")
    p.add_argument("--skip", nargs="*", default=[], choices=["topk", "block", "merge"])
    p.add_argument("--json", metavar="PATH", help="also write the rows as JSON")
    p.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: leave)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    sizes = [parse_size(s) for s in args.sizes]
    dtype = getattr(torch, args.dtype)
    print(f"# machine: {machine()}", flush=True)
    rows: List[Dict] = []
    if "topk" not in args.skip:
        rows += bench_topk(sizes, args.densities, args.repeats, args.torch_repeats, dtype)
    if "block" not in args.skip:
        rows += bench_block_topk(sizes, 0.01, args.blocks, args.repeats)
    if "merge" not in args.skip:
        rows += bench_merge(sizes, 0.01, args.ranks, args.repeats)
    print()
    print(markdown(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine(), "argv": list(argv or sys.argv[1:]), "rows": rows}, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
