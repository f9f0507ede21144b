"""Convergence of gssgd against gtopk, spardl, topka and dense: test accuracy along training,
at equal updates and at equal bytes sent.

    python benchmarks/gssgd_convergence.py --task digits --updates 600 --every 50
    python benchmarks/gssgd_convergence.py --task demo --hidden 1024 --updates 300 --every 25

Tasks: ``digits`` -- examples/train_digits.py's setting (scikit-learn's digits, REAL data, MLP
64-256-256-10, SGD lr 0.05 momentum 0.9, batch 32 per rank, the same held-out 360 images);
``demo`` -- the README demo's (examples/ddp_demo.py: MLP 784-H-H-10 on GENERATED noisy class
prototypes, held-out samples of every stream). P ranks on the simulated Comm (one process,
the sum of the ranks' gradients through ``SparseAllreduce`` with error feedback, divided by P,
as the DDP hook does); every algorithm starts from the same weights and sees the same batches.
Prints, every ``--every`` updates, the test accuracy and the bytes sent per rank so far; then the
accuracy each algorithm reaches at the byte budget the sparse algorithms share (the least total
any of them sent), for the equal-bytes comparison.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading

import torch
import torch.nn as nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
import sparsecomm as sc  # noqa: E402
from sparsecomm.comm import simulate  # noqa: E402


def task_data(args):
    from models import MLP
    if args.task == "digits":
        from train_digits import load
        train_x, train_y, test_x, test_y = load(0)
        model = lambda: MLP(64, 256, 10)  # noqa: E731
        shards = [(train_x[r::args.nproc], train_y[r::args.nproc]) for r in range(args.nproc)]
    else:
        from ddp_demo import make_data
        model = lambda: MLP(784, args.hidden, 10)  # noqa: E731
        shards = [make_data(r, args.batch * args.updates) for r in range(args.nproc)]
        test = [make_data(100 + r, 500) for r in range(2)]
        test_x, test_y = torch.cat([t[0] for t in test]), torch.cat([t[1] for t in test])
    return model, shards, test_x, test_y


def train(algorithm: str, args, model_fn, shards, test_x, test_y) -> list[tuple[int, int, float]]:
    torch.manual_seed(args.seed)
    model = model_fn()
    params = list(model.parameters())
    opt = torch.optim.SGD(params, lr=args.lr, momentum=0.9)
    n = sum(p.numel() for p in params)
    gen = torch.Generator().manual_seed(args.seed)
    orders = [torch.randperm(len(x), generator=gen) for x, _ in shards]
    grads: list = [None] * args.nproc
    curve, sent_total = [], 0

    # one simulate() world for the whole run, so residuals persist: ranks loop over the updates
    # and wait on a barrier for the main thread's optimizer step between them
    barrier = threading.Barrier(args.nproc + 1)
    results: list = [None] * args.nproc

    def world(comm):
        reducer = sc.SparseAllreduce(algorithm, 1.0 if algorithm == "dense" else args.density, comm=comm)
        for _ in range(args.updates):
            barrier.wait()  # gradients ready
            out = reducer(grads[comm.rank])
            results[comm.rank] = (out, reducer.last_stats["bytes_sent"])
            barrier.wait()  # results taken

    runner = threading.Thread(target=lambda: simulate(args.nproc, world, timeout=600))
    runner.start()
    for update in range(1, args.updates + 1):
        for rank, (x, y) in enumerate(shards):
            pos = (update - 1) * args.batch % len(x)
            idx = orders[rank][pos:pos + args.batch]
            model.zero_grad()
            nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
            grads[rank] = torch.cat([p.grad.reshape(-1) for p in params]).clone()
        barrier.wait()
        barrier.wait()
        out = results[0][0] / args.nproc
        sent_total += max(r[1] for r in results)
        for p, g in zip(params, out.split([p.numel() for p in params])):
            p.grad = g.view_as(p).clone()
        opt.step()
        if update % args.every == 0 or update == args.updates:
            with torch.no_grad():
                acc = float((model(test_x).argmax(1) == test_y).float().mean())
            curve.append((update, sent_total, acc))
    runner.join()
    assert n == results[0][0].numel()
    return curve


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", choices=["digits", "demo"], default="digits")
    parser.add_argument("--algorithms", nargs="+", default=["dense", "gssgd", "gtopk", "spardl", "topka"])
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--density", type=float, default=0.01)
    parser.add_argument("--updates", type=int, default=600)
    parser.add_argument("--every", type=int, default=50)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="JSON of the curves")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    model_fn, shards, test_x, test_y = task_data(args)
    curves = {}
    for algorithm in args.algorithms:
        curves[algorithm] = train(algorithm, args, model_fn, shards, test_x, test_y)
        print(f"{algorithm}: " + ", ".join(f"{u}:{100 * a:.1f}%" for u, _, a in curves[algorithm]), flush=True)
    print(f"\n{args.task}, P = {args.nproc}, density {args.density}: test accuracy (%) at equal updates")
    print("| updates | " + " | ".join(args.algorithms) + " |")
    print("|---:|" + "---:|" * len(args.algorithms))
    for i, (update, _, _) in enumerate(curves[args.algorithms[0]]):
        print(f"| {update} | " + " | ".join(f"{100 * curves[a][i][2]:.1f}" for a in args.algorithms) + " |")
    sparse = [a for a in args.algorithms if a != "dense"]
    budget = min(curves[a][-1][1] for a in sparse)
    print(f"\nat equal bytes: the last point of each sparse algorithm within {budget / 1e6:.2f} MB sent per rank")
    print("| algorithm | updates | MB sent / rank | accuracy % | MB / update |")
    print("|---|---:|---:|---:|---:|")
    for a in sparse:
        within = [c for c in curves[a] if c[1] <= budget] or curves[a][:1]
        update, sent, acc = within[-1]
        print(f"| {a} | {update} | {sent / 1e6:.2f} | {100 * acc:.1f} | {curves[a][-1][1] / curves[a][-1][0] / 1e6:.4f} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "curves": curves}, f)


if __name__ == "__main__":
    main()
