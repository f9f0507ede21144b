"""FSDP2 with a sparse allreduce between nodes vs native HSDP, time to accuracy on digits.

    python -m sparsecomm.launch --nproc 4 --bandwidth none -- python examples/fsdp_two_level.py --ranks-per-node 2
    torchrun --nnodes 2 --nproc-per-node 2 ... examples/fsdp_two_level.py     # topology from the environment
    python examples/fsdp_two_level.py --nproc 4 --ranks-per-node 2             # spawned here

The ranks form n nodes of L ranks (``--ranks-per-node``, else torchrun's LOCAL_WORLD_SIZE via
``sparsecomm.Topology.from_env``). Each mode trains the same MLP 64-H-H-10 from the same weights
on scikit-learn's digits (REAL data, bundled in the wheel; 360 images held out), every rank on
its own shard:

* ``hsdp``: native hybrid sharding, ``fully_shard`` on the 2-D ``(replicate, shard)`` mesh: a
  dense reduce-scatter inside the node, a dense allreduce of each shard between nodes;
* ``fsdp+<algorithm>``: ``fully_shard`` on the node's 1-D mesh and
  :func:`sparsecomm.fsdp.register_hook`: the same reduce-scatter, then the sparse algorithm
  (error feedback) on each shard between nodes.

It prints, per mode, the held-out accuracy after each epoch's time, the first time it reached
``--target``, and the final accuracy. Needs scikit-learn.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from models import MLP  # noqa: E402

import sparsecomm as sc  # noqa: E402
from sparsecomm.testing import launched, spawn  # noqa: E402

TEST = 360


def load(split_seed: int):
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target, dtype=torch.long)
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(split_seed))
    x, y = x[perm], y[perm]
    return x[TEST:], y[TEST:], x[:TEST], y[:TEST]


def shard_model(model: nn.Module, mesh) -> nn.Module:
    from torch.distributed.fsdp import fully_shard

    for sub in model.modules():
        if isinstance(sub, nn.Linear):
            fully_shard(sub, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor, rank: int, world: int) -> float:
    """Held-out accuracy over every rank's share of the test set (every rank runs the forward:
    FSDP all-gathers the parameters)."""
    per = len(x) // world
    part = slice(rank * per, (rank + 1) * per)
    with torch.no_grad():
        correct = (model(x[part]).argmax(dim=1) == y[part]).sum().to(torch.float64)
    counts = torch.stack([correct, torch.tensor(float(per), dtype=torch.float64)])
    dist.all_reduce(counts)
    return float(counts[0] / counts[1])


def train(mode: str, topology: sc.Topology, args, data, rank: int, world: int) -> dict:
    train_x, train_y, test_x, test_y = data
    per = len(train_x) // world
    x, y = train_x[rank * per:(rank + 1) * per], train_y[rank * per:(rank + 1) * per]
    torch.manual_seed(args.seed)
    model = MLP(64, args.hidden, 10)
    state = None
    if mode == "hsdp":
        model = shard_model(model, sc.fsdp.two_level_mesh(topology))
    else:
        algorithm = mode.split("+", 1)[1]
        model = shard_model(model, sc.fsdp.node_mesh(topology))
        state = sc.FSDPHookState(algorithm, 1.0 if algorithm == "dense" else args.density, nodes=topology)
        sc.fsdp.register_hook(model, state)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    curve, reached, spent = [], None, 0.0
    for epoch in range(args.epochs):
        order = torch.randperm(len(x), generator=torch.Generator().manual_seed(args.seed * 1000 + epoch))
        dist.barrier()
        start = time.perf_counter()
        for i in range(0, len(x) - args.batch + 1, args.batch):
            idx = order[i:i + args.batch]
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
            optimizer.step()
        spent += time.perf_counter() - start
        acc = accuracy(model, test_x, test_y, rank, world)
        curve.append((spent, acc))
        if reached is None and acc >= args.target:
            reached = (epoch + 1, spent)
    if state is not None:
        state.close()
    return {"mode": mode, "curve": curve, "reached": reached, "accuracy": curve[-1][1], "seconds": spent}


def run_rank(rank: int, world: int, args) -> list[dict]:
    torch.set_num_threads(max(1, args.threads))
    if args.ranks_per_node is not None:
        if world % args.ranks_per_node:
            raise SystemExit(f"--ranks-per-node {args.ranks_per_node} does not divide the {world} ranks")
        topology = sc.Topology(world // args.ranks_per_node, args.ranks_per_node)
    else:
        topology = sc.Topology.from_env()
    data = load(args.split_seed)
    modes = ["hsdp", *(f"fsdp+{a}" for a in args.algorithms)]
    rows = [train(mode, topology, args, data, rank, world) for mode in modes]
    if rank == 0:
        print(f"\ndigits (REAL data): {topology}, {len(data[0]) // world} training images per rank, {TEST} held out; "
              f"MLP 64-{args.hidden}-{args.hidden}-10, batch {args.batch} per rank, {args.epochs} epochs, "
              f"lr {args.lr}, density {args.density}")
        print(f"{'mode':<18} {'accuracy':>9} {'train s':>8}  first epoch (s) at >= {args.target:.0%}")
        for row in rows:
            hit = "never" if row["reached"] is None else f"epoch {row['reached'][0]} ({row['reached'][1]:.2f} s)"
            print(f"{row['mode']:<18} {row['accuracy']:>9.4f} {row['seconds']:>8.2f}  {hit}")
        sys.stdout.flush()
    return rows


def _spawned(rank: int, world: int, args) -> list[dict]:
    return run_rank(rank, world, args)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algorithms", nargs="+", default=["topka"],
                        help="sparsecomm algorithms run between nodes through the FSDP hook (default: topka)")
    parser.add_argument("--density", type=float, default=0.01)
    parser.add_argument("--ranks-per-node", type=int, default=None,
                        help="L, ranks per node (default: LOCAL_WORLD_SIZE, as torchrun sets it)")
    parser.add_argument("--nproc", type=int, default=4, help="ranks to spawn when not started by a launcher")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--target", type=float, default=0.95, help="accuracy whose first epoch is reported")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--split-seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    for name in args.algorithms:
        if name not in sc.algorithms.names():
            parser.error(f"unknown algorithm {name!r}; choose from {', '.join(sc.algorithms.names())}")
    try:
        import sklearn  # noqa: F401
    except ImportError:
        print("fsdp_two_level needs scikit-learn for its bundled digits data: pip install scikit-learn",
              file=sys.stderr)
        sys.exit(2)
    if launched():
        dist.init_process_group("gloo")
        try:
            run_rank(dist.get_rank(), dist.get_world_size(), args)
        finally:
            dist.destroy_process_group()
        return
    spawn(_spawned, args.nproc, args, timeout=3600)


if __name__ == "__main__":
    main()
