"""Per-call time of the sparse algorithms through TorchComm (gloo) and MPIComm in the same
processes, on the emulated cluster, with the alpha-beta bound of what each call sent.

Run under the launcher's MPI backend (gloo works there too), e.g.::

    python -m sparsecomm.launch --nproc 4 --bandwidth 1gbit --backend mpi -- \\
        python benchmarks/bench_floor.py --N 15000000 --density 0.01 --repeats 9

Every rank draws the benchmark gradients (:func:`sparsecomm.bench.common.bench_gradient`),
builds one reducer per (algorithm, comm), warms each up (handshake, layouts, caches), then
times ``--repeats`` rounds interleaved over them: a barrier, one call with ``out=`` (the
DDP hook's way; ``--no-out`` also times calls without it). Per call the slowest rank's wall
time is taken; the table shows medians. bound = rounds * alpha + bytes_sent * beta with beta
from the launcher's measured link rate and alpha the median half round trip of a 1 KB MPI
ping-pong between ranks 0 and 1; ``bound / call`` is the fraction of the call the wire model
explains. ``--path`` puts another checkout first on ``sys.path`` (before/after comparisons;
mpirun does not forward PYTHONPATH).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--N", type=int, default=15_000_000)
    ap.add_argument("--density", type=float, default=0.01)
    ap.add_argument("--algorithms", nargs="+", default=["topka", "spardl"])
    ap.add_argument("--comms", nargs="+", default=["gloo", "mpi"], choices=["gloo", "mpi"])
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--no-out", action="store_true", help="also time calls without out=")
    ap.add_argument("--label", default="")
    ap.add_argument("--path", default=None, help="import sparsecomm from this checkout")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.path:
        sys.path.insert(0, os.path.abspath(args.path))
    import numpy as np
    import torch
    import torch.distributed as dist
    from mpi4py import MPI

    import sparsecomm
    from sparsecomm.bench.common import bench_gradient
    from sparsecomm.comm import MPIComm, TorchComm

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    world = MPI.COMM_WORLD
    comms = {}
    if "gloo" in args.comms:
        comms["gloo"] = TorchComm()
    if "mpi" in args.comms:
        comms["mpi"] = MPIComm(world)

    # alpha: 1 KB MPI ping-pong between ranks 0 and 1; beta: the launcher's measured rate
    buf = np.zeros(1024, dtype=np.uint8)
    halves = []
    for _ in range(21):
        world.Barrier()
        t0 = time.perf_counter()
        if rank == 0:
            world.Send(buf, dest=1)
            world.Recv(buf, source=1)
        elif rank == 1:
            world.Recv(buf, source=0)
            world.Send(buf, dest=0)
        halves.append((time.perf_counter() - t0) / 2)
    alpha = world.bcast(statistics.median(halves[1:]) if rank == 0 else None, root=0)
    rate = float(os.environ.get("SPARSECOMM_MEASURED_BANDWIDTH") or 0.96e9)
    beta = 8.0 / rate

    grads = [bench_gradient(rank, step, args.N) for step in range(2)]
    out = torch.empty(args.N)
    runs = [(a, c, o) for a in args.algorithms for c in comms for o in ((True, False) if args.no_out else (True,))]
    reducers = {(a, c): sparsecomm.SparseAllreduce(a, args.density, comm=comms[c]) for a in args.algorithms
                for c in comms}
    for a, c, _ in runs:
        reducers[(a, c)](grads[0], out=out)
        reducers[(a, c)](grads[1], out=out)
    walls = {r: [] for r in runs}
    stats = {}
    for rep in range(args.repeats):
        for run in runs:
            a, c, with_out = run
            world.Barrier()
            t0 = time.perf_counter()
            reducers[(a, c)](grads[rep % 2], out=out if with_out else None)
            wall = time.perf_counter() - t0
            walls[run].append(world.allreduce(wall, op=MPI.MAX))
            st = reducers[(a, c)].last_stats
            stats[run] = (world.allreduce(st["bytes_sent"], op=MPI.MAX), st["rounds"])
    if rank == 0:
        rows = []
        print(f"{args.label} P={size} N={args.N} density={args.density} alpha={alpha * 1e6:.1f}us "
              f"beta={beta * 1e9:.3f}ns/B repeats={args.repeats} (medians, slowest rank, 1 thread per rank)")
        print("| algorithm | comm | out= | call ms | min ms | MB sent / rank | rounds | bound ms | bound / call |")
        print("|---|---|---|---:|---:|---:|---:|---:|---:|")
        for run in runs:
            a, c, with_out = run
            med = statistics.median(walls[run])
            nbytes, rounds = stats[run]
            bound = rounds * alpha + nbytes * beta
            rows.append(dict(label=args.label, P=size, algorithm=a, comm=c, out=with_out, call_ms=med * 1e3,
                             min_ms=min(walls[run]) * 1e3, bytes_sent=nbytes, rounds=rounds, bound_ms=bound * 1e3,
                             walls_ms=[w * 1e3 for w in walls[run]]))
            print(f"| {a} | {c} | {'yes' if with_out else 'no'} | {med * 1e3:.1f} | {min(walls[run]) * 1e3:.1f} | "
                  f"{nbytes / 1e6:.2f} | {rounds} | {bound * 1e3:.1f} | {bound / med:.2f} |")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(dict(alpha_s=alpha, beta_s_per_byte=beta, rows=rows), f, indent=1)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
