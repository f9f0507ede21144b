"""Throughput of the sparsecomm ops on one GPU (run by scripts/gpu_check.sh).

Side by side in one run, medians of CUDA-event timings after a warm-up:

* top-k: ``ops.topk(x, k)`` against ``torch.topk(x.abs(), k)`` and against one HBM read
  pass of ``x`` (``torch.amax``, a reduction that reads every element once), at
  N = 25M..140M float32 and densities 0.1 % and 1 %; results checked equal to the CPU
  kernel's at the smallest N;
* merge: ``ops.merge_add_many`` of P = 8 sorted COO vectors of k = 1 % N entries each
  (input entries per second);
* sketch: ``ops.sketch_build_`` of N values into a 7 x 10k table and ``ops.sketch_estimate``
  of all N coordinates (coordinates per second).

Usage::

    python benchmarks/bench_cuda.py [--sizes 25M 50M 100M 140M] [--repeats 9] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from typing import Callable, Dict, List

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sparsecomm import ops  # noqa: E402
from sparsecomm.bench.common import format_size, parse_size  # noqa: E402


def cuda_time(fn: Callable[[], object], repeats: int) -> float:
    """Median seconds of fn on the current stream (CUDA events), after one warm-up call."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def bench_topk(n: int, repeats: int, check: bool) -> List[Dict]:
    g = torch.Generator(device="cuda").manual_seed(n)
    x = torch.randn(n, device="cuda", generator=g)
    read = cuda_time(lambda: torch.amax(x), repeats)
    rows = []
    for density in (0.001, 0.01):
        k = max(1, int(density * n))
        ours = cuda_time(lambda: ops.topk(x, k), repeats)
        theirs = cuda_time(lambda: torch.topk(x.abs(), k, sorted=False), repeats)
        impl = cuda_time(lambda: ops.torch_implementation("topk")(x, k), repeats)
        if check:
            v, i = ops.topk(x, k)
            cv, ci = ops.topk(x.cpu(), k)
            assert torch.equal(i.cpu(), ci) and torch.equal(v.cpu(), cv), "CUDA top-k differs from the CPU kernel"
        rows.append({"op": "topk", "n": n, "k": k, "density": density, "s": ours, "torch_topk_s": theirs,
                     "read_pass_s": read, "torch_impl_s": impl, "speedup_vs_torch_topk": theirs / ours, "read_passes": ours / read,
                     "hbm_read_GBps": n * 4 / read / 1e9})
    return rows


def bench_merge(n: int, repeats: int) -> Dict:
    parts, k = 8, max(1, n // 100)
    g = torch.Generator(device="cuda").manual_seed(1)
    idx = [torch.randperm(n, device="cuda", generator=g)[:k].sort().values for _ in range(parts)]
    val = [torch.randn(k, device="cuda", generator=g) for _ in range(parts)]
    t = cuda_time(lambda: ops.merge_add_many(idx, val, n), repeats)
    impl = cuda_time(lambda: ops.torch_implementation("merge_add_many")(idx, val, n), repeats)
    return {"op": "merge_add_many", "n": n, "parts": parts, "k": k, "s": t, "torch_impl_s": impl,
            "entries_per_s": parts * k / t}


def bench_sketch(n: int, repeats: int) -> List[Dict]:
    x = torch.randn(n, device="cuda")
    table = torch.zeros(7, 10_000, device="cuda")
    build = cuda_time(lambda: ops.sketch_build_(table.zero_(), x, 5), repeats)
    est = cuda_time(lambda: ops.sketch_estimate(table, n, 5), repeats)
    build_impl = cuda_time(lambda: ops.torch_implementation("sketch_build_")(table.zero_(), x, 5), repeats)
    est_impl = cuda_time(lambda: ops.torch_implementation("sketch_estimate")(table, n, 5), repeats)
    return [{"op": "sketch_build_", "n": n, "rows": 7, "cols": 10_000, "s": build, "torch_impl_s": build_impl,
             "coords_per_s": n / build},
            {"op": "sketch_estimate", "n": n, "rows": 7, "cols": 10_000, "s": est, "torch_impl_s": est_impl,
             "coords_per_s": n / est}]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", nargs="+", default=["25M", "50M", "100M", "140M"])
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_cuda: no CUDA device", file=sys.stderr)
        return 2
    sizes = [parse_size(s) for s in args.sizes]
    rows: List[Dict] = []
    for j, n in enumerate(sizes):
        rows += bench_topk(n, args.repeats, check=j == 0)
        rows.append(bench_merge(n, args.repeats))
        rows += bench_sketch(n, args.repeats)
    info = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "cuda_kernels": ops.CUDA_KERNELS, "repeats": args.repeats, "rows": rows}
    print(f"# {info['device']}, torch {info['torch']} (CUDA {info['cuda']}), "
          f"sparsecomm CUDA kernels: {info['cuda_kernels']}, medians of {args.repeats}")
    print("| op | N | k / parts | time ms | torch impl ms | vs torch.topk | read passes | rate |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        if r["op"] == "topk":
            print(f"| topk | {format_size(r['n'])} | {r['k']} | {r['s'] * 1e3:.3f} | {r['torch_impl_s'] * 1e3:.3f} "
                  f"| {r['speedup_vs_torch_topk']:.2f}x "
                  f"| {r['read_passes']:.2f} (read {r['read_pass_s'] * 1e3:.3f} ms, {r['hbm_read_GBps']:.0f} GB/s) | |")
        elif r["op"] == "merge_add_many":
            print(f"| merge_add_many | {format_size(r['n'])} | {r['parts']} x {r['k']} | {r['s'] * 1e3:.3f} "
                  f"| {r['torch_impl_s'] * 1e3:.3f} | | "
                  f"| {r['entries_per_s'] / 1e9:.2f} G entries/s |")
        else:
            print(f"| {r['op']} | {format_size(r['n'])} | {r['rows']} x {r['cols']} | {r['s'] * 1e3:.3f} "
                  f"| {r['torch_impl_s'] * 1e3:.3f} | | "
                  f"| {r['coords_per_s'] / 1e9:.2f} G coords/s |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(info, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
