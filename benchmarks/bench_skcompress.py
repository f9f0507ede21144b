"""SKCompress codec figures (docs/skcompress.md): bytes per nonzero of the COO codecs on real
gradients of the examples' models, and encode / decode throughput against one read pass.

    python benchmarks/bench_skcompress.py [--density 0.01] [--steps 5] [--repeats 5] [--json out.json]

Gradients: error-feedback top-k messages (density 1%) of
* the digits MLP 64-256-256-10 on scikit-learn's bundled digits (REAL data, batch 128),
* ResNet-20 (examples/models.py) on a CIFAR-shaped batch of generated images (32 x 3x32x32),
* the 2-layer LSTM classifier on generated token sequences (16 x 100 tokens, vocab 5000),
each after ``--steps`` SGD steps (the message of the last step is measured). Bytes per nonzero
are split into keys and values: keys = delta-binary keys alone (raw values); values = the
SKCompress value section (raw int32 keys subtracted); both = one message with both codecs
(keys are then grouped into 2r lists, so their deltas grow). COO sends 4 + 4 = 8 bytes per
nonzero (float32 values, int32 keys); the 32-byte header is left out everywhere.
Throughput: encode and decode of one message (both codecs), in nonzeros per second, against
one read pass of the same message (``idx.sum()`` + ``val.sum()``): medians of ``--repeats``.
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
sys.path.insert(0, os.path.join(HERE, "..", "examples"))
sys.path.insert(0, os.path.join(HERE, ".."))

from models import MLP, LSTMClassifier, resnet20  # noqa: E402

from sparsecomm import ops  # noqa: E402


def _digits_batch(gen):
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.tensor(d.data, dtype=torch.float32) / 16.0
    y = torch.tensor(d.target)
    pick = torch.randint(0, len(x), (128,), generator=gen)
    return x[pick], y[pick]


def gradients(steps: int, density: float):
    """{model: (indices, values, N)} -- the top-k message after `steps` steps with error feedback."""
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    cases = {
        "digits MLP (real data)": (MLP(64, 256, 10), lambda: _digits_batch(gen)),
        "ResNet-20 (generated images)": (resnet20(), lambda: (torch.randn(32, 3, 32, 32, generator=gen),
                                                              torch.randint(0, 10, (32,), generator=gen))),
        "LSTM (generated tokens)": (LSTMClassifier(5000), lambda: (torch.randint(0, 5000, (16, 100), generator=gen),
                                                                   torch.randint(0, 2, (16,), generator=gen))),
    }
    out = {}
    for name, (model, batch) in cases.items():
        params = [p for p in model.parameters() if p.requires_grad]
        n = sum(p.numel() for p in params)
        residual = torch.zeros(n)
        k = max(1, int(density * n))
        opt = torch.optim.SGD(params, lr=0.05, momentum=0.9)
        for _ in range(steps):
            x, y = batch()
            model.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            acc = torch.cat([p.grad.reshape(-1) for p in params]) + residual
            values, indices = ops.topk(acc, k)
            residual = acc.clone()
            residual[indices] = 0
            sparse = torch.zeros(n)
            sparse[indices] = values
            offset = 0
            for p in params:  # apply the sparse step, as the training would
                p.grad.copy_(sparse[offset:offset + p.numel()].view_as(p))
                offset += p.numel()
            opt.step()
        out[name] = (indices, values, n)
    return out


def sizes(indices, values, n):
    c = indices.numel()
    enc = lambda ic, vc: ops.skcompress_encode(indices, values, n, index_codec=ic, value_codec=vc).numel() - 8
    keys = (enc(1, 0) - 4 * c) / c
    vals = (enc(0, 1) - 4 * c) / c
    both = enc(1, 1) / c
    return {"nnz": c, "N": n, "keys_delta_binary": keys, "values_skcompress": vals, "both": both, "coo": 8.0}


def _median_time(fn, repeats):
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def throughput(indices, values, n, repeats):
    c = indices.numel()
    body = ops.skcompress_encode(indices, values, n)
    t_read = _median_time(lambda: (indices.sum(), values.sum()), repeats)
    t_enc = _median_time(lambda: ops.skcompress_encode(indices, values, n), repeats)
    t_dec = _median_time(lambda: ops.skcompress_decode(body, n, c, torch.float32), repeats)
    return {"read_s": t_read, "encode_s": t_enc, "decode_s": t_dec,
            "encode_nnz_per_s": c / t_enc, "decode_nnz_per_s": c / t_dec,
            "encode_vs_read": t_enc / t_read, "decode_vs_read": t_dec / t_read}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--density", type=float, default=0.01)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--synthetic-n", type=int, default=15_000_000,
                    help="also time a message of a random N-long gradient at the density")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    report = {}
    msgs = gradients(args.steps, args.density)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(args.synthetic_n, generator=g)
    v, i = ops.topk(x, max(1, int(args.density * args.synthetic_n)))
    msgs[f"random normal N={args.synthetic_n}"] = (i, v, args.synthetic_n)
    print(f"{'gradient':34} {'N':>10} {'nnz':>8} {'keys B/nz':>9} {'values B/nz':>11} {'both B/nz':>9} "
          f"{'COO':>4} {'enc Mnz/s':>9} {'dec Mnz/s':>9} {'enc/read':>8} {'dec/read':>8}")
    for name, (idx, val, n) in msgs.items():
        row = {**sizes(idx, val, n), **throughput(idx, val, n, args.repeats)}
        report[name] = row
        print(f"{name:34} {n:>10} {row['nnz']:>8} {row['keys_delta_binary']:>9.3f} {row['values_skcompress']:>11.3f} "
              f"{row['both']:>9.3f} {8:>4} {row['encode_nnz_per_s'] / 1e6:>9.2f} {row['decode_nnz_per_s'] / 1e6:>9.2f} "
              f"{row['encode_vs_read']:>8.0f} {row['decode_vs_read']:>8.0f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
