"""What the benchmark command lines share: size arguments and the gradients they time.

Used by :mod:`sparsecomm.bench.collectives`, :mod:`sparsecomm.bench.kernels` and the scripts in the
checkout's ``benchmarks/`` folder, so that ``--n 15M`` means the same everywhere and every
benchmark draws its gradients the same way.
"""

from __future__ import annotations

import torch

from ..tune import LAYOUTS

__all__ = ["parse_size", "format_size", "bench_gradient"]

_SUFFIXES = {"K": 10**3, "M": 10**6, "G": 10**9}


def parse_size(text: str) -> int:
    """An element count with an optional decimal suffix K, M or G (any case): ``"15M"``,
    ``"1.5k"``, ``"1000"``."""
    s = text.strip().upper()
    if s and s[-1] in _SUFFIXES:
        return int(float(s[:-1]) * _SUFFIXES[s[-1]])
    return int(s)


def format_size(n: int) -> str:
    """The shortest :func:`parse_size` spelling of ``n`` with an exact suffix: 10000000 -> ``"10M"``."""
    for unit in ("G", "M", "K"):
        if n >= _SUFFIXES[unit] and n % _SUFFIXES[unit] == 0:
            return f"{n // _SUFFIXES[unit]}{unit}"
    return str(n)


def bench_gradient(rank: int, step: int, n: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Rank ``rank``'s standard-normal gradient of ``n`` elements at ``step``.

    Seeded by (rank, step) alone, so a run draws the same vectors on any machine and each
    rank and step gets its own; drawn in float32 and converted, so a float64 check sees the
    same values as a float32 timing.
    """
    generator = torch.Generator().manual_seed(7919 * step + rank)
    return torch.randn(n, generator=generator).to(dtype)


#: the values of the benchmarks' ``--hierarchy``: each layout the reducer runs, or both of them
HIERARCHY_CHOICES = (*LAYOUTS, "both")


def hierarchies_of(ap, args, launched: bool) -> list[str]:
    """The hierarchies ``--hierarchy`` asks for (``both``: flat, then node), checked against how
    the ranks start: under a launcher the nodes' shape comes from its ``LOCAL_WORLD_SIZE``
    (``--nproc-per-node`` refused), without one ``--nproc-per-node`` must divide ``--nproc``;
    ``--nproc-per-node`` without node is refused. Errors through ``ap.error``."""
    from ..comm.topology import Topology

    hierarchies = list(LAYOUTS) if "both" in args.hierarchy else list(dict.fromkeys(args.hierarchy))
    if "node" not in hierarchies:
        if args.nproc_per_node is not None:
            ap.error("--nproc-per-node is only used with --hierarchy node or both")
        return hierarchies
    if launched:
        if args.nproc_per_node is not None:
            ap.error("--nproc-per-node is for ranks the benchmark starts itself; under a launcher the "
                     "topology comes from its LOCAL_WORLD_SIZE")
        try:
            Topology.from_env()
        except ValueError as exc:
            ap.error(f"--hierarchy node needs the nodes' shape: {exc} (e.g. python -m sparsecomm.launch "
                     "--nnodes 2 --nproc-per-node 2 ...)")
    elif args.nproc_per_node is None or args.nproc_per_node < 1 or args.nproc % args.nproc_per_node:
        ap.error(f"--hierarchy node without a launcher needs --nproc-per-node L dividing --nproc ({args.nproc}), "
                 "e.g. --nproc 4 --nproc-per-node 2")
    return hierarchies

