"""Where a sparse call's local compute goes: each phase in units of one residual-add pass.

For every algorithm asked for, a :class:`~sparsecomm.SparseAllreduce` runs on simulated
ranks (:func:`sparsecomm.comm.simulated.simulate`: messages are in-memory copies, so what is
timed is local compute plus the wait for the peer's compute), and the reducer's
``last_stats["phases_s"]`` splits each call into

* ``check``    -- the non-finite check of the gradient (one read of it) and its flag round,
* ``add``      -- the residual add ``acc = g + e`` (zero when the algorithm fuses it with its
  selection, see ``select``; ``--unfused`` adds rows ``NAME/unfused`` where the reducer adds
  first, timed in the same run),
* ``select``   -- choosing the entries to send (top-k, block top-k, B-SAG/R-SAG top-L; with
  the fused kernel also the residual add),
* ``residual`` -- removing what was sent from ``acc`` (and spardl's residual collection),
* ``merge``    -- decoding and combining received vectors (between rounds, too),
* ``scatter``  -- writing the result into the dense ``out`` (with no ``out=`` this is where
  a fresh result's pages are first touched),
* ``other``    -- the rest of the call (encoding, Comm bookkeeping, waiting for the peer).

The unit is one pass of ``e += g`` over N float32 (read two arrays, write one), timed in the
same run, on the same thread, with the same ``torch.get_num_threads()``, interleaved with the
calls so that a shared machine's load hits both alike. Every figure is a median of
``--repeats`` rounds; each round times the unit, then every algorithm with ``out=`` and
without.

Usage::

    python -m sparsecomm.bench phases                       # N = 15M, density 1 %, P = 1 and 2, T = 1 and 2
    python -m sparsecomm.bench phases --sizes 1 --threads 1 --repeats 9 --json phases.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any, Dict, List, Sequence

import torch

from ..comm.simulated import simulate
from ..reduce import SparseAllreduce
from .common import bench_gradient, format_size, parse_size

__all__ = ["main", "run_phases", "PHASES", "DEFAULT_ALGORITHMS"]

PHASES = ("check", "add", "select", "residual", "merge", "scatter", "other")
DEFAULT_ALGORITHMS = ("topka", "spardl", "gtopk", "sparcml_recursive_double", "sparcml_split_allgather", "sparcml")


UNFUSED = "/unfused"


def _rank_work(comm, algorithms: Sequence[str], n: int, density: float, repeats: int) -> List[Dict[str, Any]]:
    reducers = {}
    for a in algorithms:
        reducers[a] = SparseAllreduce(a.removesuffix(UNFUSED), density, comm=comm)
        if a.endswith(UNFUSED):  # the reducer adds the gradient itself, then the algorithm selects
            reducers[a].algorithm.fuses_add = False
    grads = [bench_gradient(comm.rank, step, n) for step in range(2)]
    out = torch.empty(n)
    e, g = torch.zeros(n), grads[0].clone()
    for a in algorithms:  # warm-up: handshake, layouts, caches, the out buffer's pages
        reducers[a](grads[0], out=out)
        reducers[a](grads[1])
    rows: List[Dict[str, Any]] = []
    for rep in range(repeats):
        comm.barrier()
        t0 = time.perf_counter()
        e.add_(g)
        unit = time.perf_counter() - t0
        for a in algorithms:
            for with_out in (True, False):
                grad = grads[rep % 2]
                comm.barrier()
                t0 = time.perf_counter()
                reducers[a](grad, out=out if with_out else None)
                wall = time.perf_counter() - t0
                st = reducers[a].last_stats
                phases = dict(st.get("phases_s", {}))
                phases["check"] = st["check_s"]
                known = sum(v for key, v in phases.items() if key in PHASES)
                phases["other"] = max(0.0, wall - known)
                rows.append(dict(rep=rep, algorithm=a, out=with_out, unit_s=unit, wall_s=wall,
                                 phases={p: phases.get(p, 0.0) for p in PHASES}))
    return rows


def run_phases(algorithms: Sequence[str], n: int, density: float, sizes: Sequence[int], threads: Sequence[int],
               repeats: int) -> List[Dict[str, Any]]:
    """Median phases in units of one residual-add pass, rank 0's figures, per (P, T, algorithm)."""
    table = []
    before = torch.get_num_threads()
    try:
        for t in threads:
            torch.set_num_threads(t)
            for p in sizes:
                res = simulate(p, lambda comm: _rank_work(comm, algorithms, n, density, repeats), timeout=600.0)
                rows = res.results[0]
                for a in algorithms:
                    for with_out in (True, False):
                        mine = [r for r in rows if r["algorithm"] == a and r["out"] == with_out]
                        unit = statistics.median(r["unit_s"] for r in rows if r["algorithm"] == a)
                        ratios = {ph: statistics.median(r["phases"][ph] / r["unit_s"] for r in mine) for ph in PHASES}
                        table.append(dict(algorithm=a, P=p, threads=t, out=with_out, n=n, density=density,
                                          repeats=repeats, unit_ms=unit * 1e3,
                                          wall_ms=statistics.median(r["wall_s"] for r in mine) * 1e3,
                                          passes=statistics.median(r["wall_s"] / r["unit_s"] for r in mine),
                                          phase_passes=ratios))
    finally:
        torch.set_num_threads(before)
    return table


def markdown(table: List[Dict[str, Any]]) -> str:
    head = ("| algorithm | P | T | out= | pass ms | call ms | call (passes) | "
            + " | ".join(PHASES) + " |")
    lines = [head, "|" + "---|" * 4 + "---:|" * (3 + len(PHASES))]
    for r in table:
        lines.append(f"| {r['algorithm']} | {r['P']} | {r['threads']} | {'yes' if r['out'] else 'no'} | "
                     f"{r['unit_ms']:.1f} | {r['wall_ms']:.1f} | {r['passes']:.2f} | "
                     + " | ".join(f"{r['phase_passes'][ph]:.2f}" for ph in PHASES) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sparsecomm.bench phases", description=__doc__.split("\n")[0])
    ap.add_argument("--algorithms", nargs="+", default=list(DEFAULT_ALGORITHMS))
    ap.add_argument("--n", type=parse_size, default=15_000_000)
    ap.add_argument("--density", type=float, default=0.01)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 2], help="simulated ranks P")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="torch threads per rank")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--unfused", action="store_true",
                    help="also time each algorithm with the residual add unfused (NAME/unfused rows: the reducer "
                         "adds the gradient first, then the algorithm selects from the sum), interleaved in the same run")
    ap.add_argument("--json", default=None, help="write the table here")
    args = ap.parse_args(list(argv) if argv is not None else None)
    algorithms = list(args.algorithms)
    if args.unfused:
        algorithms = [x for a in algorithms for x in (a, a + UNFUSED)]
    table = run_phases(algorithms, args.n, args.density, args.sizes, args.threads, args.repeats)
    print(f"N = {format_size(args.n)} float32, density {args.density}, medians of {args.repeats}; "
          f"phases in units of one `e += g` pass (rank 0)")
    print(markdown(table))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(table, f, indent=1)
    return 0
