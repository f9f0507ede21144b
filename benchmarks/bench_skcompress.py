"""SKCompress codec figures (docs/skcompress.md): bytes per nonzero of the COO codecs on real
gradients of the examples' models, and encode / decode throughput against one read pass.

    python benchmarks/bench_skcompress.py [--density 0.01] [--steps 5] [--repeats 7]
        [--synthetic-nnz 15000 150000 1500000] [--json out.json]

Gradients: error-feedback top-k messages (density 1%) of
* the digits MLP 64-256-256-10 on scikit-learn's bundled digits (REAL data, batch 128),
* ResNet-20 (examples/models.py) on a CIFAR-shaped batch of generated images (32 x 3x32x32),
* the 2-layer LSTM classifier on generated token sequences (16 x 100 tokens, vocab 5000),
each after ``--steps`` SGD steps (the message of the last step is measured), and the top-k
of random normal vectors of N = nnz / density for each ``--synthetic-nnz`` (and, up to
200,000 nonzeros, the same message with the values it decodes to: what spardl's R-SAG and
final all-gather re-encode -- values repeated, a few hundred distinct). Bytes per nonzero
are split into keys and values: keys = delta-binary keys alone (raw values); values = the
SKCompress value section (raw int32 keys subtracted); both = one message with both codecs.
COO sends 4 + 4 = 8 bytes per nonzero (float32 values, int32 keys); the 32-byte header is
left out everywhere.

Throughput (``sparsecomm.ops.skcompress_encode`` / ``skcompress_decode``, one thread), in
nonzeros per second, of three things per message:
* keys: the message with the delta-binary key codec alone (raw values);
* both: the message with both codecs;
* values: both minus keys -- the marginal cost of the value codec (its time is not measured
  apart: the value codec also decides the keys' order and lists);
* sender: what a lossy sender pays, the body with both codecs and the values receivers
  decode (``skcompress_encode_decoded``), against encoding and then decoding its own body.
"read" is one pass over the message's indices and values (``idx.sum()`` + ``val.sum()``),
the floor any codec pays; "x read" is a time over the read pass's. Each repeat times every
variant once, in turn (so a load change hits all of them); medians of ``--repeats``, in wall
time or (``--clock thread``) the thread's CPU time.
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


def _timed(fn, clock=time.perf_counter):
    t = clock()
    fn()
    return clock() - t


def throughput(indices, values, n, repeats, clock=time.perf_counter):
    """Medians of the read pass and of keys / both encode and decode; values = both - keys."""
    c = indices.numel()
    keys_body = ops.skcompress_encode(indices, values, n, index_codec=1, value_codec=0)
    both_body = ops.skcompress_encode(indices, values, n, index_codec=1, value_codec=1)
    variants = {
        "read": lambda: (indices.sum(), values.sum()),
        "keys_encode": lambda: ops.skcompress_encode(indices, values, n, index_codec=1, value_codec=0),
        "keys_decode": lambda: ops.skcompress_decode(keys_body, n, c, torch.float32),
        "both_encode": lambda: ops.skcompress_encode(indices, values, n, index_codec=1, value_codec=1),
        "both_decode": lambda: ops.skcompress_decode(both_body, n, c, torch.float32),
        "sender_encode": lambda: ops.skcompress_encode_decoded(indices, values, n, index_codec=1, value_codec=1),
    }
    for fn in variants.values():  # warm: first-touch allocations
        fn()
    times = {name: [] for name in variants}
    for _ in range(repeats):
        for name, fn in variants.items():
            times[name].append(_timed(fn, clock))
    med = {name: statistics.median(ts) for name, ts in times.items()}
    row = {"read_s": med["read"]}
    for part in ("keys", "both"):
        for op in ("encode", "decode"):
            t = med[f"{part}_{op}"]
            row[f"{part}_{op}_s"] = t
            row[f"{part}_{op}_nnz_per_s"] = c / t
            row[f"{part}_{op}_vs_read"] = t / med["read"]
    t = med["sender_encode"]
    row.update(sender_encode_s=t, sender_encode_nnz_per_s=c / t, sender_encode_vs_read=t / med["read"],
               sender_encode_vs_encode_then_decode=t / (med["both_encode"] + med["both_decode"]))
    for op in ("encode", "decode"):
        t = med[f"both_{op}"] - med[f"keys_{op}"]
        row[f"values_{op}_s"] = t
        row[f"values_{op}_nnz_per_s"] = c / t if t > 0 else float("inf")
        row[f"values_{op}_vs_read"] = t / med["read"]
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--density", type=float, default=0.01)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--synthetic-nnz", type=int, nargs="*", default=[15_000, 150_000, 1_500_000],
                    help="also time the top-k messages of random normal vectors of N = nnz / density")
    ap.add_argument("--clock", choices=("wall", "thread"), default="wall",
                    help="wall time (default), or the thread's CPU time (time.thread_time: leaves out the time "
                         "other processes hold the core, on a shared machine)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    clock = time.perf_counter if args.clock == "wall" else time.thread_time
    torch.set_num_threads(1)
    report = {}
    msgs = gradients(args.steps, args.density)
    for nnz in args.synthetic_nnz:
        n = int(round(nnz / args.density))
        g = torch.Generator().manual_seed(1)
        x = torch.randn(n, generator=g)
        v, i = ops.topk(x, nnz)
        msgs[f"random normal N={n}"] = (i, v, n)
        if nnz <= 200_000:   # ops.topk's indices ascend: the message as it is
            _, dv = ops.skcompress_decode(ops.skcompress_encode(i, v, n), n, nnz, torch.float32)
            msgs[f"decoded values N={n}"] = (i, dv, n)
        del x
    print(f"{'gradient':34} {'N':>11} {'nnz':>8} {'keys B/nz':>9} {'values B/nz':>11} {'both B/nz':>9} {'COO':>4}")
    rows = {}
    for name, (idx, val, n) in msgs.items():
        rows[name] = sizes(idx, val, n)
        r = rows[name]
        print(f"{name:34} {n:>11} {r['nnz']:>8} {r['keys_delta_binary']:>9.3f} {r['values_skcompress']:>11.3f} "
              f"{r['both']:>9.3f} {8:>4}")
    print()
    print(f"{'gradient':34} {'part':>6} {'enc Mnz/s':>9} {'dec Mnz/s':>9} {'enc/read':>8} {'dec/read':>8}   read")
    for name, (idx, val, n) in msgs.items():
        row = {**rows[name], **throughput(idx, val, n, args.repeats, clock), "clock": args.clock}
        report[name] = row
        for part in ("keys", "both", "values"):
            print(f"{name if part == 'keys' else '':34} {part:>6} {row[f'{part}_encode_nnz_per_s'] / 1e6:>9.1f} "
                  f"{row[f'{part}_decode_nnz_per_s'] / 1e6:>9.1f} {row[f'{part}_encode_vs_read']:>8.1f} "
                  f"{row[f'{part}_decode_vs_read']:>8.1f}" + (f"   {row['read_s'] * 1e6:.0f} us" if part == "keys" else ""))
        print(f"{'':34} {'sender':>6} {row['sender_encode_nnz_per_s'] / 1e6:>9.1f} {'':>9} "
              f"{row['sender_encode_vs_read']:>8.1f} {'':>8}   "
              f"{row['sender_encode_vs_encode_then_decode']:.2f}x encode then decode")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
