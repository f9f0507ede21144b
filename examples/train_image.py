"""VGG-16 / VGG-19 / ResNet-20 on CIFAR-10/100 with DDP and a sparsecomm hook.

    python examples/train_image.py --model resnet20 --algorithm spardl --density 0.01 --steps 50
    python examples/train_image.py --model vgg16 --algorithm dense --data-dir ~/data/cifar-10-batches-py --epochs 1
    python examples/train_image.py --model vgg16 --bandwidth 1gbit --nproc 4 --steps 20   # emulated cluster (root)

Data, in this order:

1. ``--data-dir`` holding CIFAR-10's python batches (``data_batch_1`` .. ``data_batch_5``,
   ``test_batch``) or CIFAR-100's (``train``, ``test``; fine labels, 100 classes). These are
   pickle files in the documented format; they are read with an unpickler that admits only
   numpy arrays, so a file that is not a CIFAR batch fails instead of running code.
2. ``--data-dir`` holding the binary version (``data_batch_*.bin`` / ``test_batch.bin``, or
   CIFAR-100's ``train.bin`` / ``test.bin``), read with numpy alone.
3. Otherwise GENERATED CIFAR-shaped data (3x32x32, 10 classes): every class has a fixed
   random low-frequency colour pattern, each image is its class's pattern at a random
   contrast plus noise, so accuracy can rise. This is announced at start.

Every rank trains on its own shard of the training set with SGD + momentum; the test set is
split between the ranks for evaluation. Logged: per-update time, bytes each rank sends per
step (``state.last_stats``), loss, test accuracy.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402
import models  # noqa: E402
from sparsecomm.launch import describe_link  # noqa: E402

# the CIFAR readers are the time-to-accuracy benchmark's (one copy, in the package)
from sparsecomm.bench.tasks import find_cifar, load_cifar  # noqa: E402,F401


def generated(n_train: int, n_test: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    patterns = torch.nn.functional.interpolate(torch.randn(10, 3, 4, 4, generator=gen), size=32, mode="bilinear",
                                               align_corners=False)
    out = []
    for n in (n_train, n_test):
        y = torch.randint(0, 10, (n,), generator=gen)
        contrast = 0.5 + torch.rand(n, 1, 1, 1, generator=gen)
        out += [patterns[y] * contrast + torch.randn(n, 3, 32, 32, generator=gen), y]
    return tuple(out)


def describe_data(args: argparse.Namespace) -> str:
    found = find_cifar(args.data_dir)
    if found:
        return f"data: {found[0]} from {args.data_dir}: {', '.join(os.path.basename(f) for f in found[1] + found[2])}"
    why = f"no CIFAR batches in {args.data_dir!r}" if args.data_dir else "no --data-dir"
    return (f"GENERATED DATA ({why}): CIFAR-shaped 3x32x32, 10 classes, {args.train_size} train / "
            f"{args.test_size} test images, class patterns + noise -- NOT CIFAR, accuracy is not comparable")


def run_rank(rank: int, world: int, args: argparse.Namespace) -> list[dict]:
    torch.set_num_threads(max(1, args.threads))
    found = find_cifar(args.data_dir)
    if rank == 0:
        _common.banner(describe_data(args))
    train_x, train_y, test_x, test_y = load_cifar(found) if found else generated(args.train_size, args.test_size)
    classes = int(train_y.max().item()) + 1 if found else 10
    classes = 100 if classes > 10 else 10
    perm = torch.randperm(len(train_x), generator=torch.Generator().manual_seed(args.seed))
    part = perm[_common.shard(len(train_x), rank, world)]
    x, y = train_x[part], train_y[part]
    rows = []
    for algorithm in args.algorithms:   # each from the same initial weights
        torch.manual_seed(args.seed)
        ddp, state = _common.make_ddp(models.build(args.model, classes), algorithm, args.density)
        optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)
        run = _common.train(ddp, state, optimizer, x, y, args, rank, desc=f"{args.model} {algorithm}")
        params = sum(p.numel() for p in ddp.module.parameters())
        rows.append(_common.report(ddp, state, run, test_x, test_y, args, rank, world,
                                   f"{args.model} ({params / 1e6:.2f} M parameters, {classes} classes): {world} "
                                   f"ranks x {len(x)} training images, batch {args.batch} per rank, lr {args.lr}",
                                   eval_batch=args.batch * 4))
        del ddp, state, optimizer
    if rank == 0 and len(rows) > 1:
        print(f"\n{args.model}, {world} ranks, {describe_link()[0]}, density {args.density:g}, "
              f"{args.steps or args.epochs} {'updates' if args.steps else 'epochs'} each:")
        _common.print_comparison(rows)
    return rows


def add_image_args(parser: argparse.ArgumentParser) -> None:
    """The training arguments of the image examples (this one, train_accelerate.py): the common
    ones, the model and the generated data's size."""
    _common.add_common_args(parser, steps=None, epochs=1, batch=32, lr=0.05)
    parser.add_argument("--model", choices=["vgg16", "vgg19", "resnet20"], default="resnet20")
    parser.add_argument("--train-size", type=int, default=5000, help="generated data only")
    parser.add_argument("--test-size", type=int, default=1000, help="generated data only")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_image_args(parser)
    parser.add_argument("--algorithms", nargs="+", default=None,
                        help="compare these in turn (from the same weights; 'all' = dense, every algorithm and "
                             "the PyTorch hooks); default: just --algorithm")
    args = parser.parse_args(argv)
    args.algorithms = _common.expand_algorithms(args.algorithms, args.algorithm)
    print(describe_data(args), flush=True)  # loud before any rank starts, and again from rank 0
    _common.start(__file__, argv, args, run_rank)


if __name__ == "__main__":
    main()
