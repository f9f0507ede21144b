"""VGG-16 / VGG-19 / ResNet-20 on CIFAR-10/100 with DDP and a sparsecomm hook.

    python examples/train_image.py --model resnet20 --algorithm spardl --density 0.01 --steps 50
    python examples/train_image.py --model vgg16 --algorithm dense --data-dir ~/data/cifar-10-batches-py --epochs 1
    python examples/train_image.py --model vgg16 --bandwidth 1gbit --nproc 4 --steps 20   # emulated cluster (root)

Data: ``--data-dir DIR`` trains on CIFAR, and DIR must hold it, in one of these layouts (the
first found wins):

1. CIFAR-10's python batches (``data_batch_1`` .. ``data_batch_5``, ``test_batch``: what
   ``cifar-10-python.tar.gz`` unpacks into ``cifar-10-batches-py/``) or CIFAR-100's (``train``,
   ``test``; fine labels, 100 classes). These are pickle files in the documented format; they are
   read with an unpickler that admits only numpy arrays, so a file that is not a CIFAR batch
   fails instead of running code.
2. The binary version (``data_batch_1.bin`` .. ``data_batch_5.bin``, ``test_batch.bin``:
   ``cifar-10-binary.tar.gz``'s ``cifar-10-batches-bin/``; or CIFAR-100's ``train.bin`` /
   ``test.bin``), read with numpy alone.

Both are at https://www.cs.toronto.edu/~kriz/cifar.html. A DIR that does not hold either (missing,
empty, a file missing, or the folder above ``cifar-10-batches-py/``) is an error before any rank
starts, naming what it lacks: never a silent switch to other data. Without ``--data-dir`` the
run uses GENERATED CIFAR-shaped data (3x32x32, 10 classes): every class has a fixed random
low-frequency colour pattern, each image is its class's pattern at a random contrast plus noise,
so accuracy can rise. It is announced at start, framed, and is not CIFAR.

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


CIFAR_URL = "https://www.cs.toronto.edu/~kriz/cifar.html"
DATA_DIR_HELP = ("a folder holding CIFAR-10's python batches (data_batch_1..5, test_batch: cifar-10-batches-py/) or "
                 "their binary version (data_batch_1..5.bin, test_batch.bin), or CIFAR-100's; from "
                 f"{CIFAR_URL}. A folder without them is an error. Without --data-dir: GENERATED CIFAR-shaped "
                 "data (announced)")
# what find_cifar looks for, by layout: (name, the files)
_LAYOUTS = [("CIFAR-10 python batches", [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]),
            ("CIFAR-10 binary version", [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]),
            ("CIFAR-100 python batches", ["train", "test"]),
            ("CIFAR-100 binary version", ["train.bin", "test.bin"])]


def data_dir_error(data_dir: str | None) -> str | None:
    """Why ``data_dir`` does not hold CIFAR in a layout :func:`find_cifar` reads, naming the
    layouts and where to get them; None when it does, or when no folder was given (generated data)."""
    if data_dir is None or find_cifar(data_dir):
        return None
    if not os.path.exists(data_dir):
        why = "there is no such folder"
    elif not os.path.isdir(data_dir):
        why = "it is not a folder"
    else:
        present = set(os.listdir(data_dir))
        nested = [d for d in ("cifar-10-batches-py", "cifar-10-batches-bin", "cifar-100-python", "cifar-100-binary")
                  if os.path.isdir(os.path.join(data_dir, d))]
        partial = [(name, [f for f in files if f not in present]) for name, files in _LAYOUTS
                   if any(f in present for f in files)]
        if nested:
            why = f"it holds {nested[0]}/: pass --data-dir {os.path.join(data_dir, nested[0])}"
        elif partial:
            name, missing = min(partial, key=lambda p: len(p[1]))
            why = f"it has part of the {name} but not {', '.join(missing)}"
        elif not present:
            why = "the folder is empty"
        else:
            shown = sorted(present)
            why = f"it holds none of their files (it has {', '.join(shown[:5])}{', ...' if len(shown) > 5 else ''})"
    return (f"--data-dir {data_dir}: no CIFAR data set there ({why}). Expected in that folder: CIFAR-10's python "
            "batches data_batch_1 .. data_batch_5 and test_batch (cifar-10-python.tar.gz unpacks them into "
            "cifar-10-batches-py/), or the binary version data_batch_1.bin .. data_batch_5.bin and test_batch.bin "
            "(cifar-10-binary.tar.gz: cifar-10-batches-bin/); CIFAR-100: train and test, or train.bin and test.bin. "
            f"Download from {CIFAR_URL}, or leave out --data-dir to train on generated CIFAR-shaped data.")


def describe_data(args: argparse.Namespace) -> str:
    found = find_cifar(args.data_dir)
    if found:
        return f"data: {found[0]} from {args.data_dir}: {', '.join(os.path.basename(f) for f in found[1] + found[2])}"
    error = data_dir_error(args.data_dir)
    if error:   # main() refused it already; a caller that did not gets the reason, not a fallback
        raise ValueError(error)
    return (f"GENERATED DATA (no --data-dir): CIFAR-shaped 3x32x32, 10 classes, {args.train_size} train / "
            f"{args.test_size} test images, class patterns + noise -- NOT CIFAR, accuracy is not comparable")


def run_rank(rank: int, world: int, args: argparse.Namespace) -> list[dict]:
    torch.set_num_threads(max(1, args.threads))
    found = find_cifar(args.data_dir)
    if args.data_dir and not found:   # every rank: main() checked, but the folder may have changed since
        raise ValueError(data_dir_error(args.data_dir))
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
    _common.add_common_args(parser, steps=None, epochs=1, batch=32, lr=0.05, data_dir=DATA_DIR_HELP)
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
    error = data_dir_error(args.data_dir)
    if error:
        parser.error(error)
    print(describe_data(args), flush=True)  # loud before any rank starts, and again from rank 0
    _common.start(__file__, argv, args, run_rank)


if __name__ == "__main__":
    main()
