"""The README's quick start as a whole program: DDP with sparsecomm's hook on scikit-learn's digits.

    torchrun --nproc-per-node 2 examples/minimal_ddp.py
    python -m sparsecomm.launch --nproc 2 -- python examples/minimal_ddp.py      # emulated 1 Gbit/s links (root)
    torchrun --nproc-per-node 2 examples/minimal_ddp.py --steps 50 --resume     # continue from ckpt_rank<r>.pt

Every rank is one process of a launcher (torchrun, ``python -m sparsecomm.launch``, srun), which
sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT. The model is an MLP 64-128-10 on the 8x8
digit images bundled with scikit-learn (1797, nothing downloaded; the last 297 held out), each
rank training on its own shard with plain SGD. Rank 0 prints ``state.summary()`` every
``--log-every`` steps: the bytes this rank sent, their ratio to a dense allreduce's, the algorithm,
the density. At the end every rank saves its own checkpoint, ``ckpt_rank<r>.pt`` in the current
folder (the hook's state is per rank: each rank's residuals); ``--resume`` loads it first and
trains ``--steps`` more, continuing the data order from the hook's step count.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
import sparsecomm as sc

HELD_OUT = 297


def digits(rank: int, world: int) -> tuple[torch.Tensor, ...]:
    """This rank's shard of the first 1500 digits (inputs scaled to [0, 1]), and the held-out 297."""
    from sklearn.datasets import load_digits

    data = load_digits()
    x, y = torch.tensor(data.data, dtype=torch.float32) / 16.0, torch.tensor(data.target)
    train = len(x) - HELD_OUT
    per = train // world
    return x[rank * per:(rank + 1) * per], y[rank * per:(rank + 1) * per], x[train:], y[train:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=100, help="updates to train (each of --batch per rank)")
    parser.add_argument("--batch", type=int, default=32, help="per-rank batch size")
    parser.add_argument("--log-every", type=int, default=20, help="steps between rank 0's lines")
    parser.add_argument("--resume", action="store_true", help="load ckpt_rank<r>.pt first (saved by an earlier run)")
    args = parser.parse_args()

    dist.init_process_group("gloo")                 # or nccl / mpi; launch with torchrun
    torch.manual_seed(0)                            # the same initial weights on every rank
    model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)))
    state = sc.DDPHookState("topka", density=0.01)  # each rank sends its top 1% per bucket
    sc.register(model, state)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)   # no state of its own to checkpoint
    rank = dist.get_rank()
    if args.resume:   # in fresh processes, with as many ranks as saved: each rank its own file
        saved = torch.load(f"ckpt_rank{rank}.pt")
        model.load_state_dict(saved["model"]); state.load_state_dict(saved["hook"])
        if rank == 0:
            print(f"resumed from ckpt_rank<r>.pt after step {state.step}", flush=True)

    x, y, test_x, test_y = digits(rank, dist.get_world_size())
    per_epoch = len(x) // args.batch
    for step in range(state.step, state.step + args.steps):   # the hook counts the steps it reduced
        epoch, i = divmod(step, per_epoch)
        batch = torch.randperm(len(x), generator=torch.Generator().manual_seed(epoch))[i * args.batch:][:args.batch]
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x[batch]), y[batch])
        loss.backward()                             # the hook reduces each gradient bucket here
        optimizer.step()
        if rank == 0 and (step + 1) % args.log_every == 0:
            print(f"{state.summary()}; loss {loss.item():.3f}", flush=True)

    torch.save({"model": model.state_dict(), "hook": state.state_dict()}, f"ckpt_rank{rank}.pt")
    with torch.no_grad():   # every rank holds the same weights: rank 0 evaluates
        accuracy = (model.module(test_x).argmax(1) == test_y).float().mean().item()
    if rank == 0:
        print(f"done: {dist.get_world_size()} ranks, hook step {state.step}, held-out accuracy {accuracy:.3f}; "
              f"saved ckpt_rank0.pt .. ckpt_rank{dist.get_world_size() - 1}.pt", flush=True)
    state.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
