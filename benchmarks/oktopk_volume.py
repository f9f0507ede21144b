"""Ok-Topk's communication volume per rank during training, against the paper's bound, and how
close the global count G stays to k.

    python benchmarks/oktopk_volume.py --nproc 4                  # live: gloo ranks, DDP hook
    python benchmarks/oktopk_volume.py --mode replay --nproc 6 --before /tmp/oktopk_before.py

``live``: trains the digits example's model (scikit-learn's bundled digits, MLP 64-256-256-10,
the setup of examples/train_digits.py) with ``oktopk`` through the DDP hook on gloo ranks and
records every call of every rank.

``replay``: the same model and shards trained with the exact average of the ranks' gradients
(dense, one process), each rank's local gradient of every step kept; that one sequence of
real gradients is then fed to ``oktopk`` on simulated ranks, and with ``--before FILE`` also to
another version of the module (a copy of sparsecomm/algorithms/oktopk.py, registered here as
``oktopk_before``), so both see the same gradients.

Per call and rank the record holds the entries sent (split, balance, all-gather;
``Algorithm.last_volume``), the locally selected count c, the global count G, whether each
threshold was recomputed exactly, and the bytes the Comm counted. Prints the share of calls
above the paper's bound (6k(P-1)/P words = floor(3k(P-1)/P) entries) and the distribution
of G/k and c/k; ``--out`` writes every record as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import types

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))


def _live_rank(rank: int, world: int, args: argparse.Namespace) -> list[dict]:
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    import sparsecomm as sc
    from models import MLP
    from train_digits import load

    torch.set_num_threads(1)
    train_x, train_y, _, _ = load(0)
    per = len(train_x) // world
    x, y = train_x[rank * per:(rank + 1) * per], train_y[rank * per:(rank + 1) * per]
    torch.manual_seed(0)
    ddp = DDP(MLP(64, 256, 10))
    state = sc.DDPHookState("oktopk", args.density, async_comm=False, tau=args.tau, tau_prime=args.tau_prime)
    ddp.register_comm_hook(state, sc.ddp_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    gen = torch.Generator().manual_seed(1)
    records = []
    for epoch in range(args.epochs):
        perm = torch.randperm(len(x), generator=gen)
        for i in range(len(x) // 32):
            idx = perm[i * 32:(i + 1) * 32]
            opt.zero_grad()
            nn.functional.cross_entropy(ddp(x[idx]), y[idx]).backward()
            opt.step()
            for bucket, reducer in state._reducers.items():
                alg = reducer.algorithm
                records.append({"epoch": epoch, "bucket": bucket, "n": reducer.last_stats["n"],
                                **alg.last_volume, **alg.last_events,
                                "bytes_sent": reducer.last_stats["bytes_sent"],
                                "rounds": reducer.last_stats["rounds"]})
    return records


def dense_trace(world: int, epochs: int) -> list[list[torch.Tensor]]:
    """Every step's local gradient of every rank while the model trains on the exact average."""
    import torch.nn as nn

    from models import MLP
    from train_digits import load

    torch.set_num_threads(1)
    train_x, train_y, _, _ = load(0)
    per = len(train_x) // world
    shards = [(train_x[r * per:(r + 1) * per], train_y[r * per:(r + 1) * per]) for r in range(world)]
    torch.manual_seed(0)
    model = MLP(64, 256, 10)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    gens = [torch.Generator().manual_seed(1) for _ in range(world)]  # the live run's per-rank order
    trace = []
    for _ in range(epochs):
        perms = [torch.randperm(per, generator=g) for g in gens]
        for i in range(per // 32):
            grads = []
            for r, (x, y) in enumerate(shards):
                idx = perms[r][i * 32:(i + 1) * 32]
                model.zero_grad()
                nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
                grads.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]).clone())
            offset = 0
            for p in model.parameters():
                p.grad = sum(g[offset:offset + p.numel()] for g in grads).reshape(p.shape) / world
                offset += p.numel()
            opt.step()
            trace.append(grads)
    return trace


def load_before(path: str) -> str:
    """Register another version of the module under the name ``oktopk_before``."""
    from sparsecomm.algorithms import base

    if "oktopk_before" in base.names():
        return "oktopk_before"
    with open(path) as f:
        source = f.read().replace('name = "oktopk"', 'name = "oktopk_before"')
    module = types.ModuleType("sparsecomm.algorithms._oktopk_before")
    module.__package__ = "sparsecomm.algorithms"
    exec(compile(source, path, "exec"), module.__dict__)  # noqa: S102 - a local file named on the command line
    return "oktopk_before"


def replay(trace: list[list[torch.Tensor]], algorithm: str, args: argparse.Namespace) -> list[dict]:
    import sparsecomm as sc
    from sparsecomm.comm import simulate

    world = len(trace[0])

    def fn(comm):
        torch.set_num_threads(1)
        reducer = sc.SparseAllreduce(algorithm, args.density, comm=comm, tau=args.tau, tau_prime=args.tau_prime)
        records = []
        for step, grads in enumerate(trace):
            reducer(grads[comm.rank].clone())
            alg = reducer.algorithm
            records.append({"step": step, "rank": comm.rank, **alg.last_volume, **alg.last_events,
                            "bytes_sent": reducer.last_stats["bytes_sent"], "rounds": reducer.last_stats["rounds"]})
        return records

    return [r for recs in simulate(world, fn, timeout=600).results for r in recs]


def summary(name: str, every: list[dict], world: int) -> None:
    k, n = every[0]["k"], len(every)
    paper = 3 * k * (world - 1) // world
    always = 6 * k * (world - 1) // world
    entries = np.array([r["entries"] for r in every])
    g = np.array([r["global"] for r in every]) / k
    c = np.array([r["selected"] for r in every]) / k

    def dist(a):
        return f"median {np.median(a):.3f}, p5 {np.percentile(a, 5):.3f}, min {a.min():.3f}, max {a.max():.3f}"

    print(f"{name}: P = {world}, k = {k}, {n // world} calls x {world} ranks")
    print(f"  entries per call and rank: {dist(entries)}; paper's bound floor(3k(P-1)/P) = {paper}: "
          f"exceeded in {int((entries > paper).sum())} of {n} calls ({100 * (entries > paper).mean():.2f}%), "
          f"max {entries.max() / paper:.3f} of it; floor(6k(P-1)/P) = {always} exceeded in "
          f"{int((entries > always).sum())}")
    for phase in ("split", "balance", "allgather"):
        vals = np.array([r[phase] for r in every])
        print(f"  {phase}: median {np.median(vals):.0f}, max {vals.max()}")
    print(f"  G/k: {dist(g)}")
    print(f"  c/k: {dist(c)}")
    over = [r for r in every if r["entries"] > paper]
    if over:
        print("  over the paper's bound (step or epoch, rank, split, balance, all-gather, c, G):",
              [(r.get("step", r.get("epoch")), r.get("rank"), r["split"], r["balance"], r["allgather"],
                r["selected"], r["global"]) for r in over[:12]])
    for key in ("local_exact", "global_exact", "repartition"):
        print(f"  {key}: {np.mean([r[key] for r in every]):.3f} of the calls")
    print(f"  bytes sent per call and rank (Comm count): median {np.median([r['bytes_sent'] for r in every]):.0f}; "
          f"rounds median {np.median([r['rounds'] for r in every]):.0f}, max {max(r['rounds'] for r in every)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=("live", "replay"), default="live")
    ap.add_argument("--nproc", type=int, default=4)
    ap.add_argument("--density", type=float, default=0.01)
    ap.add_argument("--epochs", type=int, default=40)
    ap.add_argument("--tau", type=int, default=32)
    ap.add_argument("--tau-prime", dest="tau_prime", type=int, default=64)
    ap.add_argument("--before", default=None, help="replay: also run this copy of oktopk.py on the same gradients")
    ap.add_argument("--out", default=None, help="write every record (rank, call) as JSON here")
    args = ap.parse_args()
    results = {}
    if args.mode == "live":
        from sparsecomm.testing import spawn

        runs = spawn(_live_rank, args.nproc, args, timeout=3000)
        results["oktopk (live, DDP hook)"] = [dict(r, rank=rank) for rank, recs in enumerate(runs) for r in recs]
    else:
        trace = dense_trace(args.nproc, args.epochs)
        if args.before:
            results["before (replay)"] = replay(trace, load_before(args.before), args)
        results["oktopk (replay)"] = replay(trace, "oktopk", args)
    print(f"digits MLP (N = 85002, one bucket), density {args.density}, tau = {args.tau}, "
          f"tau' = {args.tau_prime}, {args.epochs} epochs")
    for name, every in results.items():
        summary(name, every, args.nproc)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f)


if __name__ == "__main__":
    main()
