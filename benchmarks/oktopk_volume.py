"""Ok-Topk's communication volume per rank during training, against its bound.

    python benchmarks/oktopk_volume.py                      # 4 gloo ranks, digits MLP, 1%, 40 epochs

Trains the digits example's model (scikit-learn's bundled digits, MLP 64-256-256-10, the
setup of examples/train_digits.py) with ``oktopk`` through the DDP hook and records, for
every call of every bucket's reducer, the entries this rank sent (split, balance,
all-gather; ``Algorithm.last_volume``), the bound floor(6k(P-1)/P), whether each threshold
was recomputed exactly or reused, and the bytes the Comm counted. Prints a summary table
(docs/oktopk.md) and writes every record as JSON with ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))


def _rank(rank: int, world: int, args: argparse.Namespace) -> list[dict]:
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nproc", type=int, default=4)
    ap.add_argument("--density", type=float, default=0.01)
    ap.add_argument("--epochs", type=int, default=40)
    ap.add_argument("--tau", type=int, default=32)
    ap.add_argument("--tau-prime", dest="tau_prime", type=int, default=64)
    ap.add_argument("--out", default=None, help="write every record (rank, call) as JSON here")
    args = ap.parse_args()
    from sparsecomm.testing import spawn

    runs = spawn(_rank, args.nproc, args, timeout=3000)
    every = [dict(r, rank=rank) for rank, recs in enumerate(runs) for r in recs]
    if args.out:
        with open(args.out, "w") as f:
            json.dump(every, f)
    k, bound, n = every[0]["k"], every[0]["bound"], every[0]["n"]
    entries = [r["entries"] for r in every]
    paper = 3 * k * (args.nproc - 1) / args.nproc
    calls = len(every) // args.nproc
    print(f"oktopk, digits MLP (N = {n}, one bucket), P = {args.nproc}, density {args.density} (k = {k}), "
          f"tau = {args.tau}, tau' = {args.tau_prime}, {calls} calls per rank")
    print("| per call and rank | median | max | bound |")
    print("|---|---|---|---|")
    print(f"| entries sent (split + balance + all-gather) | {statistics.median(entries):.0f} | {max(entries)} | "
          f"{bound} = floor(6k(P-1)/P) |")
    for phase in ("split", "balance", "allgather", "selected", "global"):
        vals = [r[phase] for r in every]
        print(f"| {phase} | {statistics.median(vals):.0f} | {max(vals)} | |")
    print(f"| bytes sent (Comm count, all rounds) | {statistics.median(r['bytes_sent'] for r in every):.0f} | "
          f"{max(r['bytes_sent'] for r in every)} | |")
    print(f"| rounds | {statistics.median(r['rounds'] for r in every):.0f} | {max(r['rounds'] for r in every)} | |")
    print(f"entries / bound: median {statistics.median(entries) / bound:.3f}, max {max(entries) / bound:.3f}; "
          f"calls above the paper's balanced-case 3k(P-1)/P = {paper:.0f} entries: "
          f"{sum(e > paper for e in entries)} of {len(entries)}")
    for key in ("local_exact", "global_exact", "repartition"):
        print(f"{key}: {sum(r[key] for r in every) / len(every):.3f} of the calls")
    over = [r for r in every if r["entries"] > bound]
    print("calls over the bound:", len(over))


if __name__ == "__main__":
    main()
