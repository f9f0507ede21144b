"""Table I of "DenseStream: A Novel Data Representation for Gradient Sparsification"
(section IV-B): DenseStream bytes / key-value (COO) bytes of the local top-k selection, on
real gradients taken while training the examples' VGG-16 and ResNet-20 (docs/densestream.md).

Each model trains once (SGD, momentum 0.9, on the full gradient) and every density keeps
its own error-feedback accumulator beside it, as a top-k worker would (Algorithm 2 lines
4-8: G = residual + gradient, the top-k of |G| is selected, the rest stays as the
residual), over the whole flattened gradient (every parameter, in ``parameters()`` order):
one backward pass per update serves the three densities. (The paper trains one run per
density with the sparsified update; sharing one dense trajectory keeps VGG-16 within reach of
a 2-core machine and changes only which weights the gradients are taken at.) At every
update each selection is encoded with the library's kernels (``ops.densestream_encode_coo``)
and the ratio is recorded in two settings:

* ``paper``: the paper's experiments (section IV-A: "we fix the datatype for storing an
  index or a length to an unsigned int"): 4-byte index and length fields, so T = 2 for
  float32, against key-value pairs of a 4-byte index and a 4-byte value;
* ``wire``: this library's DenseStream message, fields of ``densestream_width(N)`` bytes
  (3 for both models), against its COO message (int32 index + float32 value); payload
  bytes only (the fixed 64-byte DenseStream / 32-byte COO header and padding left out, as
  in the paper's eq. 3).

Reported: the mean ratio over the ``--window`` first updates ("early") and the last ones
("later") of ``--steps`` updates, and beside them the ratio for the same N and k at
uniformly random indices ("random": what no locality gives). The data is the examples' GENERATED CIFAR-shaped task
(examples/train_image.py: class colour patterns + noise, 3x32x32, 10 classes) unless
``--data-dir`` holds CIFAR batches: CIFAR cannot be downloaded on the machines this was
written on, so epochs 1/5/50 of CIFAR-10 in the paper become early/later updates here.

    python benchmarks/densestream_table1.py                       # both models, 1% 5% 10%
    python benchmarks/densestream_table1.py --models resnet20 --steps 40 --window 10
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples"))
import models  # noqa: E402
import train_image  # noqa: E402

from sparsecomm import ops  # noqa: E402
from sparsecomm.formats.densestream import densestream_payload_nbytes, densestream_width  # noqa: E402


def ratios(indices: torch.Tensor, values: torch.Tensor, n: int) -> dict[str, float]:
    k = indices.numel()
    out = {}
    for setting, width, key_bytes in (("paper", 4, 4 + 4), ("wire", densestream_width(n), 4 + 4)):
        s, _, v = ops.densestream_encode_coo(indices, values, n, width=width)
        out[setting] = densestream_payload_nbytes(s.numel(), v.numel(), n, values.dtype, width) / (key_bytes * k)
        out[f"{setting}_blocks_per_k"] = s.numel() / k
    return out


def run(model_name: str, args, data) -> list[dict]:
    torch.manual_seed(args.seed)
    model = models.build(model_name, 10)
    params = [p for p in model.parameters() if p.requires_grad]
    n = sum(p.numel() for p in params)
    ks = {d: max(1, int(round(d * n))) for d in args.densities}
    residual = {d: torch.zeros(n) for d in args.densities}
    per_step: dict[float, list[dict]] = {d: [] for d in args.densities}
    x, y = data
    opt = torch.optim.SGD(params, lr=args.lr, momentum=0.9, weight_decay=5e-4)
    gen = torch.Generator().manual_seed(args.seed)
    start = time.perf_counter()
    for step in range(args.steps):
        idx = torch.randint(0, len(x), (args.batch,), generator=gen)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
        loss.backward()
        grad = torch.cat([p.grad.reshape(-1) for p in params])
        for d in args.densities:
            acc = residual[d].add_(grad)                                      # Algorithm 2 line 4
            values, indices = ops.topk(acc, ks[d])                            # lines 5-7
            per_step[d].append(ratios(indices, values, n))
            acc.index_fill_(0, indices, 0)                                    # line 8: the residual
        opt.step()
        if args.verbose:
            print(f"  {model_name} step {step + 1}: loss {loss.item():.3f} " + " ".join(
                f"{d:.0%} {per_step[d][-1]['paper']:.3f}/{per_step[d][-1]['wire']:.3f}" for d in args.densities),
                flush=True)
    w, seconds = args.window, time.perf_counter() - start
    rows = []
    for d in args.densities:
        row = {"model": model_name, "n": n, "density": d, "k": ks[d], "steps": args.steps, "window": w,
               "seconds": seconds}
        for setting in ("paper", "wire"):
            row[f"{setting}_early"] = statistics.fmean(r[setting] for r in per_step[d][:w])
            row[f"{setting}_later"] = statistics.fmean(r[setting] for r in per_step[d][-w:])
            row[f"{setting}_blocks_per_k_later"] = statistics.fmean(r[f"{setting}_blocks_per_k"]
                                                                    for r in per_step[d][-w:])
        # the same N and k at uniformly random indices: what no locality would give
        rand = torch.randperm(n, generator=torch.Generator().manual_seed(1))[:ks[d]].sort().values
        base = ratios(rand, torch.ones(ks[d]), n)
        row["paper_random"], row["wire_random"] = base["paper"], base["wire"]
        rows.append(row)
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["vgg16", "resnet20"], choices=["vgg16", "vgg19", "resnet20"])
    ap.add_argument("--densities", nargs="+", type=float, default=[0.01, 0.05, 0.10])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--window", type=int, default=10, help="updates averaged at the start and at the end")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--train-size", type=int, default=5000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None, help="also write the rows here")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    found = train_image.find_cifar(args.data_dir)
    if found:
        x, y = train_image.load_cifar(found)[:2]
        print(f"data: {found[0]} from {args.data_dir}")
    else:
        x, y = train_image.generated(args.train_size, 1)[:2]
        print(f"data: GENERATED CIFAR-shaped task (examples/train_image.py), {args.train_size} images -- NOT CIFAR")
    rows = []
    for model_name in args.models:
        for r in run(model_name, args, (x, y)):
            rows.append(r)
            print(f"{model_name} N={r['n']} density {r['density']:.0%} k={r['k']}: paper {r['paper_early']:.3f} -> "
                  f"{r['paper_later']:.3f}, wire {r['wire_early']:.3f} -> {r['wire_later']:.3f} "
                  f"({r['seconds']:.0f} s)", flush=True)
    print(f"\nDenseStream bytes / key-value bytes, mean over updates 1-{args.window} (early) and "
          f"{args.steps - args.window + 1}-{args.steps} (later):\n")
    print("| model | N | setting | " + " | ".join(f"{d:.0%} early | {d:.0%} later | {d:.0%} random"
                                                 for d in args.densities) + " |")
    print("|---|---|---|" + "---|---|---|" * len(args.densities))
    for model_name in args.models:
        mine = [r for r in rows if r["model"] == model_name]
        for setting, words in (("paper", "4 B fields (paper)"), ("wire", f"{densestream_width(mine[0]['n'])} B fields")):
            cells = " | ".join(f"{r[f'{setting}_early']:.3f} | {r[f'{setting}_later']:.3f} | "
                               f"{r[f'{setting}_random']:.3f}" for r in mine)
            print(f"| {model_name} | {mine[0]['n']:,} | {words} | {cells} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
