"""Shared parts of the training examples: rank start-up, the DDP train loop, logging.

Start-up is that of ``ddp_demo.py``: under torchrun / ``sparsecomm.launch`` (RANK and
WORLD_SIZE set) the script joins the gloo group itself; otherwise it starts ``--nproc`` ranks
through ``sparsecomm.launch`` on links shaped to ``--bandwidth`` (root and iproute2 needed),
or with :func:`sparsecomm.testing.spawn` on plain loopback (``--bandwidth none``, or where
shaping is impossible).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from typing import Any, Callable, Iterable, Protocol

import torch
import torch.distributed as dist
import torch.nn as nn

import sparsecomm as sc
from sparsecomm.bench import baselines
from sparsecomm.launch import EmulatedNetwork, NetworkSetupError, describe_link, launch, parse_rate
from sparsecomm.testing import launched


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (a run of 0 updates or epochs has nothing to report)."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def add_common_args(parser: argparse.ArgumentParser, *, steps: int | None, epochs: int | None, batch: int | None,
                    lr: float | None, bandwidth: str = "none",
                    data_dir: str | None = "where the real data set lies (see the module doc)",
                    algorithm: bool = True) -> None:
    """The options every example takes. An example offers only those it uses, so that none is
    accepted and ignored: ``data_dir`` is ``--data-dir``'s help, None for an example that reads no
    data set; ``epochs``, ``batch``, ``lr`` None leave out ``--epochs`` (``--steps`` alone sets the
    run's length), ``--batch``, ``--lr``; ``algorithm`` False leaves out ``--algorithm``."""
    if algorithm:
        parser.add_argument("--algorithm", default="spardl", help=f"from: {', '.join(algorithm_names())}")
    parser.add_argument("--density", type=float, default=0.01, help="ignored (1.0) for dense")
    if data_dir is not None:
        parser.add_argument("--data-dir", default=None, help=data_dir)
    if epochs is not None:
        parser.add_argument("--epochs", type=positive_int, default=epochs,
                            help="passes over each rank's shard, when --steps is not given")
        parser.add_argument("--steps", type=positive_int, default=steps,
                            help="stop after this many updates, however many epochs that takes (overrides --epochs)")
    else:
        parser.add_argument("--steps", type=positive_int, default=steps, help="updates to train")
    if batch is not None:
        parser.add_argument("--batch", type=positive_int, default=batch, help="per-rank batch size")
    if lr is not None:
        parser.add_argument("--lr", type=float, default=lr)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--nproc", type=int, default=2, help="ranks to start when not under a launcher")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    parser.add_argument("--bandwidth", type=parse_rate, default=bandwidth,
                        help="emulated link rate per rank (1gbit, 100mbit, ...) or 'none' for loopback")
    parser.add_argument("--no-progress", action="store_true", help="no tqdm bar")


class HookState(Protocol):
    """What the examples read from a hook's state: sparsecomm's DDPHookState or a baseline's TorchHook."""

    density: float
    last_stats: dict[int, dict[str, Any]]

    def summary(self) -> str: ...


# COO codecs an algorithm name may carry after "+" (docs/skcompress.md)
_CODEC_SUFFIXES = {"delta_binary": ("index_codec", "delta_binary"), "skcompress": ("value_codec", "skcompress")}


def algorithm_names() -> list[str]:
    """What ``--algorithm(s)`` accepts: the registered algorithms and PyTorch's hooks as baselines."""
    return sc.algorithms.names() + baselines.names()


def check_algorithm(name: str) -> None:
    """A clear error, before any rank starts, for a name that is neither."""
    if not baselines.is_baseline(name):
        base, *codecs = name.split("+")
        sc.algorithms.get(base)
        unknown = [c for c in codecs if c not in _CODEC_SUFFIXES]
        if unknown:
            raise ValueError(f"unknown codec(s) {unknown} in {name!r}; use {', '.join(_CODEC_SUFFIXES)}")


def expand_algorithms(names: list[str] | None, default: str) -> list[str]:
    """``--algorithms`` as given, ``all`` for every name, or ``[default]`` when not given."""
    if names is None:
        return [default]
    return algorithm_names() if names == ["all"] else names


def banner(text: str) -> None:
    line = "=" * min(100, max(60, len(text) + 4))
    print(f"{line}\n  {text}\n{line}", flush=True)


def launch_on_emulated_network(cmd: list[str], args: argparse.Namespace) -> None:
    """With ``--bandwidth``, run ``cmd`` as ``--nproc`` ranks under ``sparsecomm.launch`` on links
    shaped to it and exit with its status; return (saying why) where shaping is impossible."""
    if not args.bandwidth:
        return
    try:
        EmulatedNetwork.check_possible()
    except NetworkSetupError as exc:
        print(f"cannot emulate a {args.bandwidth} network here ({exc}): running on plain loopback", flush=True)
        return
    print(f"running {args.nproc} ranks on an emulated {args.bandwidth} network (sparsecomm.launch)", flush=True)
    sys.exit(launch(cmd, args.nproc, args.bandwidth))


def start(script: str, argv: list[str] | None, args: argparse.Namespace, spawned: Callable,
          check: Callable[[str], None] = check_algorithm) -> list | None:
    """Run ``spawned(rank, world, args)`` on every rank: under a launcher, through one, or spawned;
    ``check`` refuses a bad ``--algorithm(s)`` name before any rank starts."""
    for name in getattr(args, "algorithms", None) or [args.algorithm]:
        check(name)
    if launched():
        dist.init_process_group("gloo")
        try:
            return [spawned(dist.get_rank(), dist.get_world_size(), args)]
        finally:
            dist.destroy_process_group()
    launch_on_emulated_network([sys.executable, os.path.abspath(script), *(sys.argv[1:] if argv is None else argv)],
                               args)
    from sparsecomm.testing import spawn

    return spawn(spawned, args.nproc, args, timeout=3600)


def shard(n: int, rank: int, world: int) -> slice:
    """Rank's contiguous share of n (shuffled) samples."""
    per = n // world
    return slice(rank * per, (rank + 1) * per)


def make_ddp(model: nn.Module, algorithm: str, density: float) -> tuple[nn.Module, HookState]:
    """DDP with sparsecomm's hook for ``algorithm`` (or PyTorch's, for a baseline name).

    ``algorithm`` may name COO codecs after a ``+`` (``spardl+skcompress``,
    ``topka+delta_binary+skcompress``: docs/skcompress.md). The state returned has
    ``density`` and per-bucket ``last_stats`` either way.
    """
    from torch.nn.parallel import DistributedDataParallel as DDP

    ddp = DDP(model)
    if baselines.is_baseline(algorithm):
        state = baselines.TorchHook(algorithm)
        state.register(ddp)
        return ddp, state
    name, *codecs = algorithm.split("+")
    options = dict(_CODEC_SUFFIXES[c] for c in codecs)
    state = sc.DDPHookState(name, 1.0 if name == "dense" else density, **options)
    ddp.register_comm_hook(state, sc.ddp_hook)
    return ddp, state


def batches(n: int, batch: int, epochs: int, steps: int | None, seed: int) -> Iterable[torch.Tensor]:
    """Index batches: a fresh permutation per epoch; ``steps`` (if given) caps the total."""
    gen = torch.Generator().manual_seed(seed)
    per_epoch = max(1, n // batch)
    total = steps if steps is not None else epochs * per_epoch
    done = 0
    while done < total:
        perm = torch.randperm(n, generator=gen)
        for i in range(per_epoch):
            if done == total:
                return
            yield perm[i * batch:(i + 1) * batch]
            done += 1


def train(ddp: nn.Module, state: HookState, optimizer: torch.optim.Optimizer, x: torch.Tensor,
          y: torch.Tensor, args: argparse.Namespace, rank: int, desc: str,
          scheduler: torch.optim.lr_scheduler.LRScheduler | None = None) -> dict:
    """The loop every example uses; returns losses, per-update times and bytes sent per step."""
    order = list(batches(len(x), args.batch, args.epochs, args.steps, args.seed + rank))
    bar = None
    # a redrawn bar needs a terminal; through a pipe (e.g. the launcher, which prefixes whole
    # lines) it would arrive as one line at the end, so print a plain line every fifth instead
    plain_every = 0
    if rank == 0 and not args.no_progress:
        if sys.stdout.isatty():
            from tqdm import tqdm
            bar = tqdm(total=len(order), desc=desc, file=sys.stdout, mininterval=1.0, leave=False)
        else:
            plain_every = max(1, len(order) // 5)
    losses, times, sent = [], [], []
    ddp.train()
    for idx in order:
        start = time.perf_counter()
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(ddp(x[idx]), y[idx])
        loss.backward()
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        times.append(time.perf_counter() - start)
        sent.append(sum(s.get("bytes_sent", 0) for s in state.last_stats.values()))
        losses.append(loss.item())
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{losses[-1]:.3f}", ms=f"{1000 * times[-1]:.0f}", refresh=False)
        elif plain_every and len(times) % plain_every == 0:
            print(f"{desc}: {len(times)}/{len(order)} updates, loss {losses[-1]:.3f}, "
                  f"{1000 * times[-1]:.0f} ms; {state.summary()}", flush=True)
    if bar is not None:
        bar.close()
    return {"losses": losses, "times": times, "bytes": sent}


@torch.no_grad()
def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int = 256) -> float:
    """Accuracy over the union of every rank's (x, y)."""
    model.eval()
    correct = sum((model(x[i:i + batch]).argmax(1) == y[i:i + batch]).sum().item() for i in range(0, len(x), batch))
    counts = torch.tensor([float(correct), float(len(x))], dtype=torch.float64)
    dist.all_reduce(counts)
    model.train()
    return (counts[0] / counts[1]).item()


def summarize(run: dict, acc: float) -> dict:
    """Median per-update time (after warm-up, max over ranks), median bytes/step, last losses."""
    measured = run["times"][3:] or run["times"]
    step_s = torch.tensor([sorted(measured)[len(measured) // 2]])
    dist.all_reduce(step_s, op=dist.ReduceOp.MAX)
    tail = run["losses"][-10:]
    return {"step_s": step_s.item(), "bytes": sorted(run["bytes"])[len(run["bytes"]) // 2],
            "final_loss": sum(tail) / len(tail), "finite": all(math.isfinite(v) for v in run["losses"]),
            "accuracy": acc, "steps": len(run["times"])}


def print_table(rows: list[dict]) -> None:
    print("| algorithm | density | updates | per-update (ms) | bytes/step (sent per rank) | final loss | test accuracy |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['algorithm']} | {r['density']:g} | {r['steps']} | {1000 * r['step_s']:.1f} | "
              f"{r['bytes'] / 1e6:.4f} MB | {r['final_loss']:.4f} | {100 * r['accuracy']:.2f}% |")
    sys.stdout.flush()


def print_comparison(rows: list[dict]) -> None:
    """Rows of several algorithms side by side, with the speedup of each over ``dense``."""
    dense = next((r for r in rows if r["algorithm"] == "dense"), None)
    print("| algorithm | per-update (ms) | speedup vs dense | bytes/step | test accuracy |")
    print("|---|---:|---:|---:|---:|")
    for r in rows:
        speedup = f"{dense['step_s'] / r['step_s']:.2f}x" if dense else "-"
        print(f"| {r['algorithm']} | {1000 * r['step_s']:.0f} | {speedup} | {r['bytes'] / 1e6:.3f} MB | "
              f"{100 * r['accuracy']:.1f}% |")
    sys.stdout.flush()


def report(ddp: nn.Module, state: HookState, run: dict, test_x: torch.Tensor, test_y: torch.Tensor,
           args: argparse.Namespace, rank: int, world: int, header: str, eval_batch: int | None = None) -> dict:
    """Test accuracy over the ranks' shares of the test set, and rank 0's summary table."""
    test_part = shard(len(test_x), rank, world)
    kwargs = {} if eval_batch is None else {"batch": eval_batch}
    acc = accuracy(ddp.module, test_x[test_part], test_y[test_part], **kwargs)
    row = {"algorithm": getattr(state, "label", state.algorithm), "density": state.density, **summarize(run, acc)}
    if rank == 0:
        print(f"\n{header}")
        print("per-update time: median over updates 4..N, max over ranks; bytes: sent per rank per update")
        print_table([row])
        print(f"loss finite: {row['finite']}, first {run['losses'][0]:.4f} -> last {run['losses'][-1]:.4f}")
        print(f"last update, rank 0: {state.summary()}")
        sys.stdout.flush()
    return row
