"""A short multi-rank DDP run comparing sparsecomm algorithms against dense allreduce.

    python examples/ddp_demo.py                       # 4 ranks on an emulated 1 Gbit/s network
    python examples/ddp_demo.py --bandwidth none      # 4 ranks on plain loopback
    python examples/ddp_demo.py --nproc 2 --algorithms dense topka --density 0.01
    torchrun --nproc-per-node 4 examples/ddp_demo.py  # or under torchrun / any launcher

Data: GENERATED, not downloaded -- a 784-input, 10-class problem labelled by a fixed random
teacher network (MNIST-shaped, so the model is the MLP of SparCML's MNIST experiment with
two wide hidden layers). Every rank trains on its own shard; accuracy is measured on a
held-out generated set. Without a launcher the script starts ``--nproc`` ranks itself: through
``sparsecomm.launch`` on links shaped to ``--bandwidth`` (default 1gbit, the papers' clusters;
needs root and iproute2), or on plain loopback when that is impossible or ``--bandwidth none``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

import sparsecomm as sc
from sparsecomm.launch import parse_rate

from _common import start  # noqa: E402  (examples/ is the script's directory)

INPUTS, CLASSES = 784, 10


def make_data(rank: int, samples: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    teacher_hidden = torch.randn(INPUTS, 64, generator=gen) / INPUTS ** 0.5
    teacher_out = torch.randn(64, CLASSES, generator=gen) / 8.0
    gen.manual_seed(seed + 1000 + rank)
    x = torch.randn(samples, INPUTS, generator=gen)
    y = (torch.tanh(x @ teacher_hidden) @ teacher_out).argmax(dim=1)
    return x, y


def make_model(hidden: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(INPUTS, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                         nn.Linear(hidden, CLASSES))


def train(algorithm: str, args: argparse.Namespace, rank: int, world: int) -> dict:
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(make_model(args.hidden))
    density = 1.0 if algorithm == "dense" else args.density
    state = sc.DDPHookState(algorithm, density)
    model.register_comm_hook(state, sc.ddp_hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    x, y = make_data(rank, args.batch * args.steps)
    step_times, step_bytes = [], []
    for step in range(args.steps):
        batch = slice(step * args.batch, (step + 1) * args.batch)
        dist.barrier()
        start = time.perf_counter()
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x[batch]), y[batch]).backward()
        optimizer.step()
        step_times.append(time.perf_counter() - start)
        step_bytes.append(sum(s["bytes_sent"] for s in state.last_stats.values()))
    test_x, test_y = make_data(10_000 + rank, 2000)
    with torch.no_grad():
        correct = (model.module(test_x).argmax(dim=1) == test_y).float().mean().item()
    measured = step_times[3:] or step_times  # the first steps include bucket rebuild and handshakes
    times = torch.tensor([sorted(measured)[len(measured) // 2]])
    acc = torch.tensor([correct])
    dist.all_reduce(times, op=dist.ReduceOp.MAX)
    dist.all_reduce(acc)
    return {"algorithm": algorithm, "density": density, "step_s": times.item(),
            "bytes": sorted(step_bytes)[len(step_bytes) // 2], "accuracy": acc.item() / world}


def run_rank(rank: int, world: int, args: argparse.Namespace) -> list[dict]:
    torch.set_num_threads(max(1, args.threads))
    results = [train(algorithm, args, rank, world) for algorithm in args.algorithms]
    if rank == 0:
        params = sum(p.numel() for p in make_model(args.hidden).parameters())
        link = os.environ.get("GLOO_SOCKET_IFNAME", "lo")
        print(f"\nsparsecomm demo: {world} ranks (network interface {link}), MLP {INPUTS}-{args.hidden}-{args.hidden}-{CLASSES} "
              f"({params / 1e6:.2f} M parameters), {args.steps} steps of batch {args.batch} per rank, "
              f"GENERATED data (teacher-labelled, MNIST-shaped)")
        print("per-update time is the median over steps 4..N, max over ranks; bytes are sent per rank per step\n")
        dense = next((r for r in results if r["algorithm"] == "dense"), None)
        print("| algorithm | density | per-update (ms) | speedup vs dense | bytes/step | test accuracy |")
        print("|---|---|---|---|---|---|")
        for r in results:
            speedup = f"{dense['step_s'] / r['step_s']:.2f}x" if dense else "-"
            print(f"| {r['algorithm']} | {r['density']:g} | {1000 * r['step_s']:.1f} | {speedup} | "
                  f"{r['bytes'] / 1e6:.3f} MB | {100 * r['accuracy']:.1f}% |")
        sys.stdout.flush()
    return results


def _spawned(rank: int, world: int, args: argparse.Namespace) -> list[dict]:
    return run_rank(rank, world, args)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nproc", type=int, default=4, help="ranks to start when not under a launcher")
    parser.add_argument("--algorithms", nargs="+", default=["dense", "topka", "spardl"],
                        help=f"from: {', '.join(sc.algorithms.names())}")
    parser.add_argument("--density", type=float, default=0.01)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.2)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    parser.add_argument("--bandwidth", type=parse_rate, default="1gbit",
                        help="emulated link rate per rank (e.g. 1gbit, 100mbit) or 'none' for loopback")
    args = parser.parse_args(argv)
    start(__file__, argv, args, _spawned)  # under a launcher, through one, or spawned on loopback

if __name__ == "__main__":
    main()
