"""Benchmark of sparsecomm's CPU kernels (top-k, block top-k, COO merges): the checkout's
entry point to :mod:`sparsecomm.bench.kernels`, which also runs from an installed wheel as
``python -m sparsecomm.bench kernels``.

Usage::

    python benchmarks/bench_kernels.py                      # N in 1M, 10M, 100M
    python benchmarks/bench_kernels.py --sizes 1M 10M --repeats 7 --json out.json
"""
from __future__ import annotations

import os
import sys

try:
    from sparsecomm.bench.kernels import main
except ImportError:  # running from a checkout without installing
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from sparsecomm.bench.kernels import main

if __name__ == "__main__":
    main()
