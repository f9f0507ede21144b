"""The README's demo: every algorithm against dense DDP on 4 ranks of an emulated 1 Gbit/s cluster.

    python examples/ddp_demo.py                           # 4 ranks, 1 Gbit/s links, every algorithm
    python examples/ddp_demo.py --bandwidth 50mbit        # links scaled down 20x: a GPU-like ratio
    python examples/ddp_demo.py --bandwidth none          # plain loopback
    python examples/ddp_demo.py --nproc 2 --algorithms dense topka spardl --steps 20
    python -m sparsecomm.launch --nproc 4 --bandwidth 1gbit -- python examples/ddp_demo.py

Model: the MLP of SparCML's MNIST experiment, 784-4096-4096-10 (20.0 M parameters, an 80 MB
float32 gradient per step), so that communication matters. Data: GENERATED, not downloaded --
784-input (MNIST-shaped), 10-class samples, each a fixed random class prototype scaled by 0.2
plus unit noise; every rank trains on its own shard, accuracy is measured on held-out samples.

Algorithms (``--algorithms``, default ``all``): ``dense`` (the backend's own allreduce, through
the hook, as plain DDP does it), every
sparsecomm algorithm at ``--density`` (1%), and PyTorch's ``fp16_compress_hook`` and
``powerSGD_hook`` (rank 4) as ``torch_fp16`` / ``torch_powersgd`` -- what a user would pick
instead. Each runs ``--steps`` updates from the same initial weights; the table gives the
per-update time (median over updates 4..N, slowest rank), the speedup over dense, the bytes
each rank sends per update and the test accuracy reached; ``--out`` gets a PNG plot and a JSON.

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

import torch
import torch.distributed as dist
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # noqa: E402
from models import MLP  # noqa: E402
from sparsecomm.launch import describe_link, parse_rate  # noqa: E402

INPUTS, CLASSES = 784, 10


def make_data(stream: int, samples: int, seed: int = 0, separation: float = 0.2
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """``samples`` generated inputs of data stream ``stream`` and their labels.

    Each of the 10 classes has a fixed random 784-pixel prototype (the same on every rank);
    a sample is ``separation`` times its class's prototype plus unit Gaussian noise, so the
    classes overlap enough that 20 updates of dense SGD do not reach 100%.
    """
    gen = torch.Generator().manual_seed(seed)
    prototypes = torch.randn(CLASSES, INPUTS, generator=gen)
    gen.manual_seed(seed + 1000 + stream)
    y = torch.randint(0, CLASSES, (samples,), generator=gen)
    x = separation * prototypes[y] + torch.randn(samples, INPUTS, generator=gen)
    return x, y


def compute_only_step_s(args: argparse.Namespace, x: torch.Tensor, y: torch.Tensor, steps: int = 6) -> float:
    """Median forward + backward + step time of the bare model (no DDP), slowest rank.

    Uses the first ``min(steps, args.steps)`` batches of ``x`` (which holds ``args.steps``
    of them), so no step runs on an empty batch.
    """
    steps = min(steps, args.steps)
    torch.manual_seed(args.seed)
    model = MLP(INPUTS, args.hidden, CLASSES)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    times = []
    dist.barrier()  # every rank computes at once, sharing the cores as in the runs
    for step in range(steps):
        batch = slice(step * args.batch, (step + 1) * args.batch)
        start = time.perf_counter()
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x[batch]), y[batch]).backward()
        optimizer.step()
        times.append(time.perf_counter() - start)
    median = torch.tensor([statistics.median(times[1:])])
    dist.all_reduce(median, op=dist.ReduceOp.MAX)
    return median.item()


def run_rank(rank: int, world: int, args: argparse.Namespace) -> list[dict]:
    torch.set_num_threads(max(1, args.threads))
    x, y = make_data(rank, args.batch * args.steps)
    test_x, test_y = make_data(10_000 + rank, args.test_samples // world)
    compute_s = compute_only_step_s(args, x, y)
    rows = []
    for algorithm in args.algorithms:
        torch.manual_seed(args.seed)
        ddp, state = _common.make_ddp(MLP(INPUTS, args.hidden, CLASSES), algorithm, args.density)
        optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
        run = _common.train(ddp, state, optimizer, x, y, args, rank, desc=algorithm)
        acc = _common.accuracy(ddp.module, test_x, test_y)
        label = getattr(state, "label", algorithm)
        rows.append({"algorithm": label, "density": state.density, **_common.summarize(run, acc)})
        if rank == 0 and not args.no_progress:
            print(f"{label}: {1000 * rows[-1]['step_s']:.0f} ms per update, accuracy {100 * acc:.1f}%", flush=True)
        del ddp, state, optimizer
    if rank == 0:
        _report(rows, compute_s, world, args)
    return rows


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


def _report(rows: list[dict], compute_s: float, world: int, args: argparse.Namespace) -> None:
    where, rate = describe_link()
    params = sum(p.numel() for p in MLP(INPUTS, args.hidden, CLASSES).parameters())
    dense = next((r for r in rows if r["algorithm"] == "dense"), None)
    print(f"\nsparsecomm demo: {world} ranks on {where}; MLP {INPUTS}-{args.hidden}-{args.hidden}-{CLASSES} "
          f"({params / 1e6:.1f} M parameters, {4 * params / 1e6:.0f} MB gradient), {args.steps} updates of "
          f"batch {args.batch} per rank, density {args.density:g}; GENERATED data (noisy class prototypes, MNIST-shaped)")
    print("per-update time: median over updates 4..N, slowest rank; bytes: sent per rank per update\n")
    _common.print_comparison(rows)
    ratio = None
    if dense:
        comm_s = max(0.0, dense["step_s"] - compute_s)
        ratio = comm_s / compute_s
        print(f"\ncompute-to-communication: forward + backward + step alone takes {1000 * compute_s:.0f} ms per "
              f"update ({world} ranks sharing this machine's {os.cpu_count()} cores); dense spends "
              f"{1000 * comm_s:.0f} ms more communicating: communication = {ratio:.1f}x compute.")
        print(_ratio_advice(ratio, rate))
    result = {"world": world, "where": where, "rate": rate, "params": params, "steps": args.steps,
              "batch": args.batch, "density": args.density, "compute_s": compute_s,
              "comm_over_compute": ratio, "rows": rows}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "demo.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(f"\nwrote {os.path.join(args.out, 'demo.json')}")
    _plot(result, os.path.join(args.out, "demo.png"))
    sys.stdout.flush()


def _plot(result: dict, path: str) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot (pip install matplotlib)")
        return
    rows = result["rows"]
    names = [r["algorithm"] for r in rows]
    colors = ["tab:gray" if n == "dense" else "tab:orange" if n.startswith("torch_") else "tab:blue" for n in names]
    fig, axes = plt.subplots(1, 3, figsize=(16, 5.5))
    panels = [([1000 * r["step_s"] for r in rows], "per-update time (ms)"),
              ([r["bytes"] / 1e6 for r in rows], "MB sent per rank per update (log)"),
              ([100 * r["accuracy"] for r in rows], f"test accuracy after {result['steps']} updates (%)")]
    for ax, (values, title) in zip(axes, panels):
        ax.bar(names, values, color=colors)
        ax.set_title(title)
        plt.setp(ax.get_xticklabels(), rotation=50, ha="right", rotation_mode="anchor")
    axes[0].axhline(1000 * result["compute_s"], color="black", linestyle="--", linewidth=1,
                    label="compute alone")
    axes[0].legend()
    axes[1].set_yscale("log")
    fig.suptitle(f"{result['world']} ranks, {result['where']}: MLP with {result['params'] / 1e6:.1f} M parameters, "
                 f"density {result['density']:g} (blue: sparsecomm, orange: PyTorch hooks)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    print(f"wrote {path}")


def _spawned(rank: int, world: int, args: argparse.Namespace) -> list[dict]:
    return run_rank(rank, world, args)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    _common.add_common_args(parser, steps=20, epochs=1, batch=32, lr=0.05, bandwidth="1gbit")
    parser.set_defaults(nproc=4)
    parser.add_argument("--algorithms", nargs="+", default=["all"],
                        help=f"'all' (dense, every algorithm, the PyTorch hooks) or names from: "
                             f"{', '.join(_common.algorithm_names())}")
    parser.add_argument("--hidden", type=int, default=4096, help="width of the two hidden layers")
    parser.add_argument("--test-samples", type=int, default=4000)
    parser.add_argument("--out", default="demo_results", help="folder for demo.json and demo.png")
    args = parser.parse_args(argv)
    args.algorithms = _common.expand_algorithms(args.algorithms, "dense")
    if args.steps is None or args.steps < 4:
        parser.error("--steps must be >= 4 (the first 3 updates are warm-up and not timed)")
    _common.start(__file__, argv, args, _spawned)


if __name__ == "__main__":
    main()
