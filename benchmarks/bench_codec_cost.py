"""The COO codecs' cost as ``auto`` models it (``CODEC_COST`` in sparsecomm/tune/tables.py,
docs/skcompress.md, "auto and the codecs"): per codec variant, at densities 0.1%, 1% and 5% of
N = 15M, the coded bytes over plain COO bytes and the encode and decode nanoseconds per
nonzero; and a message's fixed cost in microseconds.

    python benchmarks/bench_codec_cost.py [--repeats 11] [--json docs/results/codec_cost.json]

Messages: the sorted top-k (by magnitude) of ``torch.randn(15M)``, float32 values, int32
indices, through ``CooCodec.encode`` / ``decode`` -- what an algorithm calls, header and all.
A lossy encode returns the values receivers decode (the encoder's own query), as an
algorithm uses it. The fixed cost is the codec's time on a message of 20 nonzeros of a
vector of 2M minus the plain COO message's (``encode_coo`` / ``decode_coo``) on the same.
One thread; medians of ``--repeats`` (fixed costs: of 201).
"""
from __future__ import annotations

import argparse
import json
import os
import time

import torch

from sparsecomm.tune import CODEC_VARIANTS, variant_options
from sparsecomm.bench.kernels import median_time
from sparsecomm.formats.codec import CooCodec
from sparsecomm.formats.coo import coo_nbytes, decode_coo, encode_coo

# auto's codec variants, each as the options a candidate "base+codecs" sets
VARIANTS = {codecs: variant_options(f"base+{codecs}") for codecs in CODEC_VARIANTS}
DENSITIES = (0.001, 0.01, 0.05)


def top_message(x: torch.Tensor, nnz: int):
    _, idx = torch.topk(x.abs(), nnz)
    idx, _ = idx.sort()
    return idx.to(torch.int32), x[idx]


def per_nonzero(n: int, repeats: int) -> dict[str, list[list[float]]]:
    x = torch.randn(n, generator=torch.Generator().manual_seed(0))
    out: dict[str, list[list[float]]] = {name: [] for name in VARIANTS}
    for density in DENSITIES:
        nnz = int(n * density)
        idx, val = top_message(x, nnz)
        plain = coo_nbytes(nnz, n, torch.float32)
        for name, options in VARIANTS.items():
            codec = CooCodec(options)
            message, _ = codec.encode(idx, val, n, 0)
            encode = median_time(lambda: codec.encode(idx, val, n, 0), repeats)
            decode = median_time(lambda: codec.decode(message, n=n, value_dtype=torch.float32, receiver=1, sender=0),
                              repeats)
            out[name].append([round(message.numel() / plain, 3), round(encode / nnz * 1e9, 1),
                              round(decode / nnz * 1e9, 1)])
            print(f"{density:>6} {name:24} bytes/plain {out[name][-1][0]:.3f}  encode {out[name][-1][1]:5.1f} ns/nz  "
                  f"decode {out[name][-1][2]:5.1f} ns/nz", flush=True)
    return out


def per_message(repeats: int = 201, n: int = 2_000_000, nnz: int = 20) -> dict[str, list[float]]:
    x = torch.randn(n, generator=torch.Generator().manual_seed(0))
    idx, val = top_message(x, nnz)
    plain_message = encode_coo(idx, val, n, 0)
    plain_encode = median_time(lambda: encode_coo(idx, val, n, 0), repeats)
    plain_decode = median_time(lambda: decode_coo(plain_message, n=n, value_dtype=torch.float32, receiver=1, sender=0),
                            repeats)
    out = {}
    for name, options in VARIANTS.items():
        codec = CooCodec(options)
        message, _ = codec.encode(idx, val, n, 0)
        encode = median_time(lambda: codec.encode(idx, val, n, 0), repeats) - plain_encode
        decode = median_time(lambda: codec.decode(message, n=n, value_dtype=torch.float32, receiver=1, sender=0),
                          repeats) - plain_decode
        out[name] = [round(encode * 1e6, 1), round(decode * 1e6, 1)]
        print(f"{name:24} per message: encode +{out[name][0]:.1f} us, decode +{out[name][1]:.1f} us", flush=True)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--N", type=int, default=15_000_000)
    ap.add_argument("--repeats", type=int, default=11)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load = os.getloadavg()[0]
    report = {
        "command": f"python benchmarks/bench_codec_cost.py --N {args.N} --repeats {args.repeats}",
        "date": started,
        "load": f"{load:.1f} (the machine's 1-minute load average at the start)",
        "columns": "per density 0.1%, 1%, 5%: [coded bytes / plain COO bytes, encode ns per nonzero, "
                   "decode ns per nonzero]; per_message_us: [encode, decode] over plain COO at 20 nonzeros",
        **per_nonzero(args.N, args.repeats),
        "per_message_us": per_message(),
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
