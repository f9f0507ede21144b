"""Where a two-level call's time goes, beside the flat call of the same algorithm.

Starts ``P`` ranks on loopback (no shaped link: the phases inside a node and the local work
are what it isolates), splits them into nodes of ``L`` and times, per rank, after one warm-up
call, the median of 3 calls of:

* the node's reduce-scatter (``NodeComms.reduce_scatter_into_``: through the node's shared
  memory segment, or one round of messages with ``SPARSECOMM_NODE_SHM=0``), the algorithm
  between nodes on the rank's shard, the node's all-gather (``NodeComms.allgather_``);
* the whole two-level call and the whole flat call (a barrier before each).

The phases are timed by wrapping the methods of this process's ``NodeComms`` and algorithm. Usage::

    python benchmarks/two_level_phases.py [--n 15M] [--nproc 4] [--nproc-per-node 2] [--algorithm topka]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.distributed as dist

from sparsecomm import SparseAllreduce, Topology
from sparsecomm.bench.common import bench_gradient, parse_size
from sparsecomm.comm.torch_comm import TorchComm
from sparsecomm.testing import spawn


def _timed(table: dict, key: str, fn):
    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        result = fn(*args, **kwargs)
        table.setdefault(key, []).append(time.perf_counter() - start)
        return result
    return wrapper


def _rank(rank: int, size: int, n: int, per_node: int, algorithm: str) -> dict[str, float]:
    comm = TorchComm()
    nodes = Topology(size // per_node, per_node).split(comm)
    table: dict[str, list[float]] = {}
    nodes.reduce_scatter_into_ = _timed(table, "node reduce-scatter", nodes.reduce_scatter_into_)
    nodes.allgather_ = _timed(table, "node all-gather", nodes.allgather_)
    two_level = SparseAllreduce(algorithm, 0.01, comm=comm, hierarchy="node", nodes=nodes)
    two_level.algorithm.reduce = _timed(table, "algorithm between nodes", two_level.algorithm.reduce)
    flat = SparseAllreduce(algorithm, 0.01, comm=comm)
    grad, out = bench_gradient(rank, 0, n), torch.empty(n)
    for reducer in (two_level, flat):   # warm-up: handshake, buffers
        reducer(grad, out=out)
    table.clear()
    for _ in range(3):
        for name, reducer in (("two-level call", two_level), ("flat call", flat)):
            dist.barrier()
            start = time.perf_counter()
            reducer(grad, out=out)
            table.setdefault(name, []).append(time.perf_counter() - start)
    return {key: statistics.median(values) for key, values in table.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=parse_size, default=15_000_000)
    ap.add_argument("--nproc", type=int, default=4)
    ap.add_argument("--nproc-per-node", type=int, default=2)
    ap.add_argument("--algorithm", default="topka")
    args = ap.parse_args()
    if args.nproc % args.nproc_per_node:
        ap.error("--nproc-per-node must divide --nproc")
    results = spawn(_rank, args.nproc, args.n, args.nproc_per_node, args.algorithm, timeout=600)
    for rank, phases in enumerate(results):
        print(f"rank {rank}: " + ", ".join(f"{key} {value * 1e3:.0f} ms" for key, value in phases.items()))


if __name__ == "__main__":
    main()
