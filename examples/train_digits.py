"""Convergence on real data: scikit-learn's digits, dense allreduce vs a sparse algorithm.

    python examples/train_digits.py                                  # 2 ranks, dense vs spardl at 1%
    python examples/train_digits.py --nproc 4 --algorithms dense spardl topka
    python -m sparsecomm.launch --nproc 4 --bandwidth none -- python examples/train_digits.py

Data: REAL -- ``sklearn.datasets.load_digits`` (1797 8x8 grey images of 10 digits, bundled in
the scikit-learn wheel, nothing downloaded). A fixed shuffle (``--split-seed``) holds out 360
images as the test set; every rank trains on its own shard of the other 1437. The model is
an MLP 64-256-256-10 trained with SGD + momentum; each algorithm starts from the same
weights, and the sparse ones keep what they did not send as residual (error feedback).
Needs scikit-learn (``pip install scikit-learn``).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402
from models import MLP  # noqa: E402

from sparsecomm.bench.tasks import load_digits_split  # noqa: E402

TEST = 360


def load(split_seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(train x, train y, test x, test y): the time-to-accuracy benchmark's digits split."""
    return load_digits_split(split_seed, TEST)


def run_rank(rank: int, world: int, args: argparse.Namespace) -> list[dict]:
    torch.set_num_threads(max(1, args.threads))
    train_x, train_y, test_x, test_y = load(args.split_seed)
    part = _common.shard(len(train_x), rank, world)
    x, y = train_x[part], train_y[part]
    test_part = _common.shard(len(test_x), rank, world) if len(test_x) % world == 0 else slice(None)
    rows = []
    for algorithm in args.algorithms:
        torch.manual_seed(args.seed)
        ddp, state = _common.make_ddp(MLP(64, args.hidden, 10), algorithm, args.density)
        optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
        run = _common.train(ddp, state, optimizer, x, y, args, rank, desc=algorithm)
        if test_part == slice(None):  # every rank evaluates the whole set; count it once
            acc = _common.accuracy(ddp.module, test_x, test_y) if rank == 0 else _common.accuracy(ddp.module, test_x[:0], test_y[:0])
        else:
            acc = _common.accuracy(ddp.module, test_x[test_part], test_y[test_part])
        rows.append({"algorithm": algorithm, "density": state.density, **_common.summarize(run, acc)})
    if rank == 0:
        print(f"\ndigits (REAL data, scikit-learn): {world} ranks x {len(x)} training images each, "
              f"{len(test_x)} held out; MLP 64-{args.hidden}-{args.hidden}-10, batch {args.batch} per rank, "
              f"{args.epochs} epochs, lr {args.lr}")
        _common.print_table(rows)
        dense = next((r for r in rows if r["algorithm"] == "dense"), None)
        if dense:
            for r in rows:
                if r is not dense:
                    print(f"{r['algorithm']} vs dense: {100 * (r['accuracy'] - dense['accuracy']):+.2f} points")
        sys.stdout.flush()
    return rows


def _spawned(rank: int, world: int, args: argparse.Namespace) -> list[dict]:
    return run_rank(rank, world, args)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    _common.add_common_args(parser, steps=None, epochs=40, batch=32, lr=0.05, data_dir=None)
    parser.add_argument("--algorithms", nargs="+", default=None,
                        help="algorithms to compare in turn (default: dense and --algorithm)")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--split-seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.algorithms is None:
        args.algorithms = ["dense", args.algorithm] if args.algorithm != "dense" else ["dense"]
    try:
        import sklearn  # noqa: F401
    except ImportError:
        print("train_digits needs scikit-learn for its bundled digits data: pip install scikit-learn", file=sys.stderr)
        sys.exit(2)
    _common.start(__file__, argv, args, _spawned)


if __name__ == "__main__":
    main()
