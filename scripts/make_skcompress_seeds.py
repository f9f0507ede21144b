#!/usr/bin/env python3
"""Write the decoder-mode seeds of csrc/fuzz/fuzz_skcompress.c into
csrc/fuzz/corpus/skcompress/: valid SKCompress bodies, each as [selector: expect the body's
codecs, value dtype][N - 1 u32][count u16][body] (the target's input format). Unlike
scripts/make_fuzz_corpus.py this encodes with the built extension
(``sparsecomm.ops.skcompress_encode``), so rerun it whenever the body layout changes
(``SC_SKC_REVISION``). The encoder-mode seeds (seed-16 .. seed-18: options and a vector, no
body) are left as they are.

    python scripts/make_skcompress_seeds.py
"""

from __future__ import annotations

import os
import struct
import sys

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from sparsecomm import ops  # noqa: E402

OUT = os.path.join(ROOT, "csrc", "fuzz", "corpus", "skcompress")


def seed(name: str, N: int, count: int, index_codec: int, value_codec: int, dtype=torch.float32,
         skewed: bool = False, **options) -> None:
    r = np.random.default_rng(count * 7 + N % 1000 + index_codec * 3 + value_codec)
    idx = np.sort(r.choice(N, size=count, replace=False)) if count else np.zeros(0, np.int64)
    v = r.standard_normal(count)
    if skewed:  # mostly positive and crowded: the list ids Huffman-coded
        v = np.abs(v) ** 4
        v[: count // 20] *= -1
    body = ops.skcompress_encode(torch.from_numpy(idx.astype(np.int64)), torch.from_numpy(v).to(dtype), N,
                                 index_codec=index_codec, value_codec=value_codec, **options)
    selector = 0x02 | (1 if dtype == torch.float64 else 0)
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(bytes([selector]) + struct.pack("<IH", N - 1, count) + body.numpy().tobytes())


def main() -> int:
    os.makedirs(OUT, exist_ok=True)
    k = 0
    # (N, count, index codec, value codec), each in float32 and float64
    for N, count, ic, vc in [(100, 5, 0, 0), (100, 5, 1, 0), (1000, 20, 1, 1), (1000, 20, 0, 1), (10, 0, 1, 1),
                             (1, 1, 1, 1), (5000, 40, 1, 1), (2 ** 32, 30, 1, 0)]:
        for dtype in (torch.float32, torch.float64):
            seed(f"seed-{k:02d}", N, count, ic, vc, dtype)
            k += 1
    seed("seed-19", 100_000, 9000, 1, 1)                    # two key streams (8192 keys and more)
    seed("seed-20", 3000, 200, 0, 1, skewed=True)           # Huffman-coded list ids
    seed("seed-21", 3000, 200, 1, 1, q=1024, r=1)           # G = 512: two-byte cells
    print(f"skcompress: {len(os.listdir(OUT))} seeds (body revision {ops.SKC_REVISION})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
