"""The README's demo: time to accuracy of every algorithm against dense DDP on real data, 4 ranks, emulated 1 Gbit/s.

    python examples/ddp_demo.py                           # 4 ranks, 1 Gbit/s links, every method (~8 min)
    python examples/ddp_demo.py --bandwidth 50mbit        # links scaled down 20x: a GPU-like ratio
    python examples/ddp_demo.py --bandwidth none          # plain loopback
    python examples/ddp_demo.py --nproc 2 --algorithms dense topka spardl --steps 40
    python examples/ddp_demo.py --recipe plain            # error feedback alone, the optimizer's momentum
    python -m sparsecomm.launch --nproc 4 --bandwidth 1gbit -- python examples/ddp_demo.py

Model and data (REAL): an MLP 64-2048-2048-10 (4.3 M parameters, a 17 MB float32 gradient per
step, so that communication matters; the width of SparCML's MNIST MLP) on scikit-learn's digits
(1,797 handwritten 8x8 images; 360 held out, the rest split among the ranks), SGD with momentum
0.9, batch 32 per rank. This is ``python -m sparsecomm.bench accuracy --task digits --hidden 2048``.

Methods (``--algorithms``, default ``all``): ``dense`` (the backend's own allreduce, through
the hook), every registered sparsecomm algorithm at ``--density`` (1%), and PyTorch's
``fp16_compress_hook`` and ``powerSGD_hook`` (rank 4) as ``torch_fp16`` / ``torch_powersgd``.
Each sparsecomm algorithm runs with the recipe the convergence study on real data recommends
(docs/convergence.md; ``--recipe``): ``dgc+mc`` (default) is momentum correction (Deep Gradient
Compression section 3.2: ``DDPHookState(momentum=0.9)``, the optimizer without momentum) with
DGC's density warm-up over the first fifth of the updates (``DensitySchedule.dgc``); ``mc``
momentum correction alone; ``plain`` error feedback with the optimizer's momentum. Rows are
labelled as ``bench accuracy`` names them (``topka@dgc+mc``). Every method trains from the same
initial weights and data order for ``--steps`` (80) updates, interleaved (turns of 4 updates,
then an evaluation), and the table gives the training wall time until the test accuracy first
reaches the target (99% of dense's best in the same run), the speedup over dense in that time,
the final accuracy and the bytes each rank sends per update; ``--out`` gets ``demo.json`` and
``demo.png`` (accuracy against wall time and against updates).

Compute-to-communication ratio: before the runs every rank times its forward + backward +
step alone (no communication, all ranks at once, as in the runs). The demo prints that, the
time dense spends beyond it, and their ratio. A 2-core CPU computes 10-50x slower than the
papers' GPUs, so on the same 1 Gbit/s link a GPU cluster spends a far larger share of each step
communicating; ``--bandwidth`` scales the link down by that factor (e.g. ``50mbit`` for 20x) to
reproduce a GPU-like ratio (slower: dense then takes seconds per step).

Without a launcher the script starts ``--nproc`` ranks itself through ``sparsecomm.launch`` on
links shaped to ``--bandwidth`` (root and iproute2 needed), or on plain loopback with a message
where that is impossible or with ``--bandwidth none``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402
from models import MLP  # noqa: E402
from sparsecomm.bench import accuracy as bench_accuracy  # noqa: E402
from sparsecomm.bench import baselines  # noqa: E402
from sparsecomm.bench.tasks import load_digits_split  # noqa: E402
from sparsecomm.launch import describe_link  # noqa: E402

INPUTS, CLASSES = 64, 10
# the digits task's batch per rank and SGD step size (sparsecomm.bench.tasks): the runs train with
# these, so the compute-only timing uses them too (the demo takes no --batch or --lr to ignore)
BATCH, LR = 32, 0.05
# what each sparsecomm algorithm's name gets under --recipe (bench accuracy's method modifiers)
RECIPES = {"dgc+mc": "@dgc+mc", "mc": "+mc", "plain": ""}


def with_recipe(methods: list[str], recipe: str) -> list[str]:
    """``methods`` with ``recipe``'s modifiers on every sparsecomm algorithm (not on dense, the
    reference, nor on PyTorch's hooks, which take none), unless a name already has modifiers."""
    suffix = RECIPES[recipe]
    return [m if (m == "dense" or baselines.is_baseline(m) or not suffix or "@" in m or "+" in m) else m + suffix
            for m in methods]


def compute_only_step_s(args: argparse.Namespace, x: torch.Tensor, y: torch.Tensor, steps: int = 6) -> float:
    """Median forward + backward + step time of the bare model (no DDP), slowest rank.

    Uses the first ``min(steps, args.steps)`` batches of ``BATCH`` of ``x`` (which holds six),
    so no step runs on an empty batch.
    """
    steps = min(steps, args.steps)
    torch.manual_seed(args.seed)
    model = MLP(INPUTS, args.hidden, CLASSES)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    times = []
    dist.barrier()  # every rank computes at once, sharing the cores as in the runs
    for step in range(steps):
        batch = slice(step * BATCH, (step + 1) * BATCH)
        start = time.perf_counter()
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x[batch]), y[batch]).backward()
        optimizer.step()
        times.append(time.perf_counter() - start)
    median = torch.tensor([statistics.median(times[1:])])
    dist.all_reduce(median, op=dist.ReduceOp.MAX)
    return median.item()


def run_rank(rank: int, world: int, args: argparse.Namespace) -> dict | None:
    torch.set_num_threads(max(1, args.threads))
    x, y = load_digits_split(args.seed)[:2]
    mine = slice(rank * BATCH * 6, (rank + 1) * BATCH * 6)   # six batches of this rank's own images
    x, y = x[mine], y[mine]
    compute_s = compute_only_step_s(args, x, y)
    cfg = {"task": "digits", "methods": args.algorithms, "density": args.density, "steps": args.steps,
           "eval_every": args.eval_every, "target": args.target, "target_fraction": 0.99, "stop_at_target": False,
           "hidden": args.hidden, "seed": args.seed, "threads": args.threads, "quiet": args.no_progress}
    report = bench_accuracy.run_rank(rank, world, cfg)
    if rank == 0:
        _report(report, compute_s, world, args)
    return report


def _suggested_rate(rate: str, factor: float) -> str:
    """``rate`` divided by ``factor``, in tc's units."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(kbit|mbit|gbit)", rate)
    if not match:
        return "a 10-50x slower rate"
    bits = float(match.group(1)) * {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}[match.group(2)] / factor
    return f"{bits / 1e6:.0f}mbit" if bits >= 1e6 else f"{bits / 1e3:.0f}kbit"


def _ratio_advice(ratio: float, rate: str | None) -> str:
    """What the measured communication-to-compute ``ratio`` means on links of ``rate``.

    Below 10x the run is CPU-like (a GPU computes 10-50x faster), so it suggests a link 20x
    slower for a GPU-like ratio; at 10x or more the ratio already is GPU-like.
    """
    if not rate:
        return ("On loopback communication is nearly free; run on emulated links (--bandwidth 1gbit, as root) "
                "for the papers' setting.")
    if ratio < 10:
        return (f"A GPU computes this step 10-50x faster, so on {rate} links a GPU cluster's ratio is "
                f"{10 * ratio:.0f}-{50 * ratio:.0f}x; to reproduce a GPU-like ratio here, scale the link down by "
                f"the same factor: --bandwidth {_suggested_rate(rate, 20)} (20x).")
    return f"That is about the ratio of a GPU cluster (10-50x faster compute) on links 10-50x faster than {rate}."


def _report(report: dict, compute_s: float, world: int, args: argparse.Namespace) -> None:
    rate = describe_link()[1]
    if report["batch"] != BATCH:   # the task changed its batch: the compute-only timing no longer matches
        print(f"note: the runs used batch {report['batch']}, the compute-only timing batch {BATCH}")
    print(f"\nsparsecomm demo: {world} ranks on {report['where']}; MLP {INPUTS}-{args.hidden}-{args.hidden}-{CLASSES} "
          f"({report['params'] / 1e6:.1f} M parameters, {4 * report['params'] / 1e6:.0f} MB gradient), "
          f"{report['steps']} updates of batch {report['batch']} per rank, density {args.density:g}, "
          f"recipe {args.recipe}; REAL data: scikit-learn's digits")
    bench_accuracy.print_report(report)
    dense = next((m for m in report["methods"] if m["method"] == "dense"), None)
    ratio = None
    if dense:
        comm_s = max(0.0, dense["step_s"] - compute_s)
        ratio = comm_s / compute_s
        print(f"\ncompute-to-communication: forward + backward + step alone takes {1000 * compute_s:.0f} ms per "
              f"update ({world} ranks sharing this machine's {os.cpu_count()} cores); dense spends "
              f"{1000 * comm_s:.0f} ms more communicating: communication = {ratio:.1f}x compute.")
        print(_ratio_advice(ratio, rate))
    result = {**report, "rate": rate, "compute_s": compute_s, "comm_over_compute": ratio}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "demo.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(f"\nwrote {os.path.join(args.out, 'demo.json')}")
    if bench_accuracy.plot(result, Path(args.out) / "demo.png"):
        print(f"wrote {os.path.join(args.out, 'demo.png')}")
    sys.stdout.flush()


def _spawned(rank: int, world: int, args: argparse.Namespace) -> list[dict]:
    return run_rank(rank, world, args)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    _common.add_common_args(parser, steps=80, epochs=None, batch=None, lr=None, bandwidth="1gbit", data_dir=None,
                            algorithm=False)
    parser.set_defaults(nproc=4)
    parser.add_argument("--algorithms", nargs="+", default=["all"],
                        help=f"'all' (dense, every algorithm, the PyTorch hooks) or names from: "
                             f"{', '.join(_common.algorithm_names())}")
    parser.add_argument("--hidden", type=int, default=2048, help="width of the two hidden layers")
    parser.add_argument("--recipe", choices=sorted(RECIPES), default="dgc+mc",
                        help="what every sparsecomm algorithm runs with: dgc+mc (momentum correction and DGC's "
                             "warm-up, the convergence study's recommendation), mc (momentum correction alone), "
                             "plain (error feedback, the optimizer's momentum)")
    parser.add_argument("--eval-every", type=int, default=4, help="updates between evaluations")
    parser.add_argument("--target", type=float, default=None,
                        help="absolute target test accuracy (default: 99%% of dense's best in the same run)")
    parser.add_argument("--out", default="demo_results", help="folder for demo.json and demo.png")
    args = parser.parse_args(argv)
    args.algorithms = with_recipe(bench_accuracy.expand_methods(args.algorithms), args.recipe)
    try:
        bench_accuracy.check_methods(args.algorithms)
    except ValueError as exc:
        parser.error(str(exc))
    if args.steps is None or args.steps < 4:
        parser.error("--steps must be >= 4")
    if args.target is None and "dense" not in args.algorithms:
        parser.error("without --target, dense must be among --algorithms (the target is 99% of its accuracy)")
    _common.start(__file__, argv, args, _spawned, check=lambda name: bench_accuracy.check_methods([name]))


if __name__ == "__main__":
    main()
