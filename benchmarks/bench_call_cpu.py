"""Where a sparse allreduce call's CPU time goes, per rank, with and without the COO codecs
(docs/skcompress.md, "Time per call on the emulated cluster"): for each algorithm and codec
variant, the wall time of a call, the CPU time of the calling thread and of the whole process
(gloo's threads included), and the calling thread's CPU time inside the ops that differ between
the variants -- the codec kernels, and the gathers and scatters that keep a lossy sender's error.

    python -m sparsecomm.launch --nproc 4 --bandwidth 1gbit -- \\
        python benchmarks/bench_call_cpu.py [--algorithms spardl topka] [--N 15000000] \\
        [--density 0.01] [--repeats 9] [--json FILE]

Each repeat calls every variant once, in the same order, each call between barriers, on a
fresh copy of the same gradient (rank r's ``randn(N)``, seed r), into a preallocated ``out=``
as ``sparsecomm.bench collectives`` does; the first repeat warms up and is not counted. One
torch thread per rank. The figures are medians over the counted calls; the table gives the
range over ranks. When several ranks share a core (4 ranks on 2 cores), the time a rank spends
waiting for the CPU is not in its CPU time: a call then takes about the sum of the ranks' CPU
times over the cores, whatever its bytes.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import time

import torch
import torch.distributed as dist

import sparsecomm
from sparsecomm import ops
from sparsecomm.tune import CODEC_VARIANTS, split_variant, variant_options

# the ops whose CPU time is counted apart: the codec kernels, and the residual's gathers and
# scatters (a lossy sender adds its error into the residual and journals what it changes)
TIMED_OPS = ("skcompress_encode", "skcompress_encode_decoded", "skcompress_decode",
             "gather", "scatter_add_", "scatter_set_")


def instrument(spent: dict[str, float]) -> None:
    """Replace each of ``TIMED_OPS`` on ``sparsecomm.ops`` by a wrapper adding its calling
    thread's CPU time to ``spent`` (the library looks its ops up on the module at each call)."""
    for name in TIMED_OPS:
        op = getattr(ops, name)

        def timed(*args, _op=op, _name=name, **kwargs):
            start = time.thread_time()
            try:
                return _op(*args, **kwargs)
            finally:
                spent[_name] += time.thread_time() - start
        setattr(ops, name, timed)


def measure(algorithms, n: int, density: float, repeats: int) -> dict[str, dict[str, float]]:
    """This rank's medians, in ms: ``{variant: {measure: ms}}``."""
    rank = dist.get_rank()
    spent: dict[str, float] = collections.defaultdict(float)
    instrument(spent)
    grad = torch.randn(n, generator=torch.Generator().manual_seed(rank))
    out = torch.empty(n)
    names = [name for a in algorithms for name in (a, *(f"{a}+{codecs}" for codecs in CODEC_VARIANTS))]
    reducers = {name: sparsecomm.SparseAllreduce(split_variant(name)[0], density, **variant_options(name))
                for name in names}
    rows: dict[str, list[dict[str, float]]] = {name: [] for name in reducers}
    for rep in range(repeats + 1):
        for name, reducer in reducers.items():
            x = grad.clone()
            dist.barrier()
            spent.clear()
            wall, thread, process = time.perf_counter(), time.thread_time(), time.process_time()
            reducer(x, out=out)
            row = {"wall": time.perf_counter() - wall, "thread_cpu": time.thread_time() - thread,
                   "process_cpu": time.process_time() - process, **{op: spent[op] for op in TIMED_OPS}}
            if rep:
                rows[name].append(row)
    return {name: {m: 1e3 * statistics.median(r[m] for r in rs) for m in rs[0]} for name, rs in rows.items()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--algorithms", nargs="+", default=["spardl", "topka"])
    ap.add_argument("--N", type=int, default=15_000_000)
    ap.add_argument("--density", type=float, default=0.01)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load = os.getloadavg()[0]
    mine = measure(args.algorithms, args.N, args.density, args.repeats)
    names = list(mine)
    measures = list(mine[names[0]])
    # every rank's medians as one float tensor (no objects cross the wire)
    flat = torch.tensor([mine[v][m] for v in names for m in measures], dtype=torch.float64)
    gathered = [torch.empty_like(flat) for _ in range(size)]
    dist.all_gather(gathered, flat)
    if rank == 0:
        table = torch.stack(gathered).view(size, len(names), len(measures))
        lo, hi = table.min(0).values, table.max(0).values
        width = max(len(v) for v in names)
        print(f"P = {size}, N = {args.N}, density {args.density}, medians of {args.repeats} calls, "
              f"ms per call and rank (min-max over ranks); {started}, load {load:.1f}")
        print(f"{'':{width}}  " + "  ".join(f"{m:>13}" for m in measures))
        for i, v in enumerate(names):
            print(f"{v:{width}}  " + "  ".join(f"{lo[i, j]:6.2f}-{hi[i, j]:6.2f}" for j in range(len(measures))))
        if args.json:
            report = {
                "command": f"python -m sparsecomm.launch --nproc {size} ... -- python benchmarks/bench_call_cpu.py "
                           f"--algorithms {' '.join(args.algorithms)} --N {args.N} --density {args.density} "
                           f"--repeats {args.repeats}",
                "date": started, "load": f"{load:.1f} (1-minute load average at the start)", "P": size,
                "measures": measures, "units": "ms per call, median over calls, one list entry per rank",
                "variants": {v: {m: [round(float(table[r, i, j]), 3) for r in range(size)]
                                 for j, m in enumerate(measures)} for i, v in enumerate(names)},
            }
            with open(args.json, "w") as f:
                json.dump(report, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
