"""ResNet-20 (or VGG) on CIFAR-shaped images with Hugging Face Accelerate and a sparsecomm hook.

    python examples/train_accelerate.py --nproc 2 --steps 20                    # 2 processes (torch.distributed.run)
    python examples/train_accelerate.py --nproc 1 --steps 20                    # 1 process: nothing to reduce
    python examples/train_accelerate.py --nproc 2 --steps 20 --save-state ckpt --save-every 10
    python examples/train_accelerate.py --nproc 2 --steps 20 --resume ckpt/step10
    accelerate launch --cpu --num_processes 2 examples/train_accelerate.py --steps 20
    python -m sparsecomm.launch --nproc 2 --bandwidth 1gbit -- python examples/train_accelerate.py --steps 20

The training of ``train_image.py`` (its models and data: CIFAR batches from ``--data-dir``, an
error if the folder does not hold them; without ``--data-dir`` GENERATED CIFAR-shaped data, announced
at start) written the Accelerate way:
``accelerator.prepare(model, optimizer)``, then
``sparsecomm.integrations.accelerate.register(accelerator, model, state)``, the loop under
``accelerator.accumulate(model)`` with ``accelerator.backward(loss)``, ``save_state`` /
``load_state`` for checkpoints (the hook's state included), ``unwrap_model`` for evaluation.

Under a launcher (torchrun, ``accelerate launch``, ``sparsecomm.launch``: RANK and WORLD_SIZE set)
the script runs as one of its processes; otherwise ``--nproc 1`` runs here as a plain 1-process
run, and ``--nproc P`` starts P processes through ``torch.distributed.run`` (through
``sparsecomm.launch`` on links shaped to ``--bandwidth`` where that is possible: root and
iproute2). Without GPUs the Accelerator runs on the CPU (``cpu=True``, gloo).

Rank 0 prints, per optimizer step, what the hook reduced on its way (``state.summary()``: bytes
this rank sent, their ratio to a dense allreduce's, algorithm, density) and the loss, and per
epoch the totals. ``--accumulate A`` accumulates A micro-batches per
optimizer step: DDP's no_sync skips the hook on the others. ``--save-state DIR`` writes
``DIR/step<N>`` every ``--save-every`` steps and at the end; ``--resume DIR/step<N>`` continues
from one, with the same data order (each rank's batches are a fixed sequence of
``--seed``), so a resumed run prints the same per-step lines as the uninterrupted one.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402
import models  # noqa: E402
import train_image  # noqa: E402
from sparsecomm.bench.tasks import find_cifar, load_cifar  # noqa: E402

import sparsecomm as sc  # noqa: E402
from sparsecomm.testing import launched  # noqa: E402


def reduced(state: sc.DDPHookState, step: int) -> str:
    """What the hook did on optimizer step ``step``: ``state.summary()`` (bytes this rank sent,
    their ratio to a dense allreduce's, algorithm, density, buckets)."""
    if not state.last_stats and state.step == 0:
        return f"step {step}: not reduced (1 process: no hook)"
    return state.summary()


def run(args: argparse.Namespace) -> None:
    from sparsecomm.integrations.accelerate import register   # first: without Accelerate it names the pip extra
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=args.cpu or not torch.cuda.is_available(),
                              gradient_accumulation_steps=args.accumulate, mixed_precision=args.mixed_precision)
    torch.set_num_threads(max(1, args.threads))
    rank, world = accelerator.process_index, accelerator.num_processes
    # rank 0 only: accelerator.print prints on each node's first process (every rank under
    # sparsecomm.launch, whose ranks are nodes of their own)
    def say(text: str) -> None:
        if accelerator.is_main_process:
            print(text, flush=True)
    found = find_cifar(args.data_dir)
    if args.data_dir and not found:   # every process: main() checked, but the folder may have changed since
        raise ValueError(train_image.data_dir_error(args.data_dir))
    if accelerator.is_main_process:
        _common.banner(train_image.describe_data(args))
    train_x, train_y, test_x, test_y = load_cifar(found) if found else \
        train_image.generated(args.train_size, args.test_size)
    classes = 100 if found and int(train_y.max().item()) + 1 > 10 else 10
    part = torch.randperm(len(train_x), generator=torch.Generator().manual_seed(args.seed))
    part = part[_common.shard(len(train_x), rank, world)]
    x, y = train_x[part], train_y[part]

    torch.manual_seed(args.seed)
    model = models.build(args.model, classes)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)
    model, optimizer = accelerator.prepare(model, optimizer)
    name = args.algorithm
    state = register(accelerator, model, sc.DDPHookState(name, 1.0 if name == "dense" else args.density))
    if args.resume:
        accelerator.load_state(args.resume)   # model, optimizer, RNG, micro-batch count and the hook
    done = accelerator.step                   # micro-batches already trained (0 when fresh)
    order = list(_common.batches(len(x), args.batch, args.epochs,
                                 None if args.steps is None else args.steps * args.accumulate, args.seed + rank))
    per_epoch = max(1, len(x) // args.batch)
    total_steps = len(order) // args.accumulate
    say(f"{args.model} on {world} process(es) ({accelerator.distributed_type.value}, "
        f"{accelerator.device}, mixed precision {accelerator.mixed_precision}): {name} at density "
        f"{state.density:g}, {len(x)} images per process, batch {args.batch} x {args.accumulate} "
        f"accumulated, {total_steps} optimizer steps"
        + (f", resumed from {args.resume} after step {done // args.accumulate}" if done else ""))
    model.train()
    epoch_bytes, epoch_losses, start = 0, [], time.perf_counter()
    for micro in range(done, len(order)):
        idx = order[micro]
        with accelerator.accumulate(model):
            loss = torch.nn.functional.cross_entropy(model(x[idx].to(accelerator.device)),
                                                     y[idx].to(accelerator.device))
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        epoch_losses.append(loss.item())
        if accelerator.sync_gradients:
            step = (micro + 1) // args.accumulate
            epoch_bytes += sum(s["bytes_sent"] for s in state.last_stats.values())
            say(f"{reduced(state, step)}; loss {loss.item():.6f}")
            if args.save_state and (step % args.save_every == 0 or step == total_steps):
                accelerator.save_state(os.path.join(args.save_state, f"step{step}"))
                say(f"saved {os.path.join(args.save_state, f'step{step}')}")
        if (micro + 1) % per_epoch == 0 or micro + 1 == len(order):
            say(f"epoch {micro // per_epoch + 1}: {len(epoch_losses)} micro-batches in "
                f"{time.perf_counter() - start:.1f} s, mean loss "
                f"{sum(epoch_losses) / len(epoch_losses):.4f}, rank 0 sent {epoch_bytes / 1e6:.4f} MB")
            epoch_bytes, epoch_losses, start = 0, [], time.perf_counter()

    # evaluation on the bare module (the hook stays on the DDP wrapper); each process a share of the test set
    net = accelerator.unwrap_model(model).eval()
    share = _common.shard(len(test_x), rank, world)
    with torch.no_grad():
        logits = torch.cat([net(test_x[share][i:i + 4 * args.batch].to(accelerator.device))
                            for i in range(0, len(test_x[share]), 4 * args.batch)])
    counts = torch.tensor([float((logits.argmax(1).cpu() == test_y[share]).sum()), float(len(logits))],
                          device=accelerator.device)
    counts = accelerator.reduce(counts, reduction="sum")
    say(f"test accuracy {100 * counts[0].item() / counts[1].item():.2f}% "
        f"({int(counts[1].item())} images); hook steps {state.step}")
    state.close()
    accelerator.end_training()


def _without_nproc(argv: list[str]) -> list[str]:
    """``argv`` less ``--nproc N``: the processes do not need it, and torch.distributed.run's parser
    would take ``--nproc`` for an abbreviation of its own ``--nproc-per-node`` and stop."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--nproc":
            skip = True
        elif not arg.startswith("--nproc="):
            out.append(arg)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    train_image.add_image_args(parser)
    parser.add_argument("--accumulate", type=int, default=1, help="micro-batches per optimizer step")
    parser.add_argument("--mixed-precision", choices=["no", "bf16", "fp16"], default="no",
                        help="Accelerate's autocast of the forward pass (the gradients stay float32)")
    parser.add_argument("--cpu", action="store_true", help="train on the CPU even where GPUs are")
    parser.add_argument("--save-state", metavar="DIR", help="accelerator.save_state into DIR/step<N>")
    parser.add_argument("--save-every", type=int, default=10**9, help="optimizer steps between saves (and at the end)")
    parser.add_argument("--resume", metavar="DIR", help="accelerator.load_state(DIR) first (a DIR/step<N> of a save)")
    args = parser.parse_args(argv)
    if args.steps is not None and args.steps < 1 or args.accumulate < 1 or args.save_every < 1:
        parser.error("--steps, --accumulate and --save-every must be at least 1")
    error = train_image.data_dir_error(args.data_dir)
    if error:
        parser.error(error)
    if importlib.util.find_spec("accelerate") is None:
        parser.error("this example needs Hugging Face Accelerate: pip install 'accelerate>=1.0'")
    if args.algorithm not in sc.algorithms.names():
        parser.error(f"--algorithm {args.algorithm}: a sparsecomm algorithm ({', '.join(sc.algorithms.names())}); "
                     "PyTorch's own hooks go through DistributedDataParallelKwargs(comm_hook=...) instead")
    if launched() or args.nproc == 1:
        run(args)   # one process of a launched run, or a plain 1-process run
        return
    print(train_image.describe_data(args), flush=True)  # loud before any process starts
    cmd = [os.path.abspath(__file__), *_without_nproc(sys.argv[1:] if argv is None else argv)]
    _common.launch_on_emulated_network([sys.executable, *cmd], args)
    # torchrun's launcher: it sets the variables Accelerate reads and picks a free port (--standalone)
    sys.exit(subprocess.call([sys.executable, "-m", "torch.distributed.run", "--standalone",
                              "--nproc-per-node", str(args.nproc), *cmd]))


if __name__ == "__main__":
    main()
