"""The tuner's measured tables: the candidates, each algorithm's local compute per element, and
the COO codecs' cost, with the rules that read them (log-density interpolation, codec-variant
names).

``auto`` (:mod:`sparsecomm.tune.auto`), ``hierarchy="auto"`` (:mod:`sparsecomm.reduce.placement`)
and the benchmarks (``bench scale``, ``bench collectives``' codec labels,
benchmarks/bench_codec_cost.py) read the same tables here; how they were measured is in
docs/scale.md ("Calibration") and docs/skcompress.md ("auto").
"""

from __future__ import annotations

import math

import torch

from ..traffic import Traffic

__all__ = ["CANDIDATES", "COMPUTE_NS", "VARIANT_CODECS", "CODEC_VARIANTS", "CODEC_BASES", "CODEC_SHARE", "CODEC_COST",
           "compute_ns", "in_log_density", "split_variant", "variant_options", "with_codec_variants",
           "codec_seconds"]

#: the algorithms auto chooses among, in order of preference on equal predictions (gssgd is
#: left out: the scale study's model finds it slower than gtopk at every P up to 1024;
#: docs/scale.md)
CANDIDATES = ("dense", "topka", "spardl", "gtopk", "sparcml_recursive_double", "sparcml_split_allgather",
              "topkdsa", "oktopk", "densestream", "zen")

#: local compute per element of N (ns) at densities 0.1%, 1%, 5%: the measured wall time per
#: call at P = 4, N = 15M on the emulated 1 Gbit/s cluster (docs/benchmarks.md, docs/densestream.md
#: Table II; 4 ranks on 2 shared cores) less the modelled wire time of its message schedule, divided by N
#: (calibration in docs/scale.md). oktopk and densestream were not measured at 0.1%: their 1%
#: value stands in. skcompress: simulated P = 4, N = 2M. zen: measured the same way in two launches beside
#: sparcml_split_allgather and topka (docs/zen.md, "auto"), scaled by those two's table values over their
#: same-launch figures, so that it compares with the table's day.
COMPUTE_NS: dict[str, tuple[float, float, float]] = {
    "dense": (3.55, 3.15, 4.08),
    "gtopk": (3.11, 4.18, 12.49),
    "sparcml_recursive_double": (2.85, 4.75, 16.11),
    "sparcml_split_allgather": (3.16, 4.72, 13.96),
    "spardl": (4.71, 4.98, 10.44),
    "topka": (3.79, 4.45, 18.24),
    "topkdsa": (25.59, 23.16, 28.33),
    "oktopk": (15.27, 15.27, 27.06),
    "densestream": (15.02, 15.02, 43.61),
    "gssgd": (27.88, 50.92, 156.87),
    "skcompress": (4.1, 27.5, 171.9),
    "zen": (4.0, 6.4, 16.0),
}
_DENSITIES = (0.001, 0.01, 0.05)

#: the COO codecs a candidate may carry after a "+" (``topka+delta_binary``,
#: ``spardl+delta_binary+skcompress``): the option each sets (sparsecomm.formats.codec)
VARIANT_CODECS: dict[str, tuple[str, str]] = {"delta_binary": ("index_codec", "delta_binary"),
                                             "skcompress": ("value_codec", "skcompress")}
#: the codec variants auto weighs (option ``codecs``) for each of :data:`CODEC_BASES` among the candidates
CODEC_VARIANTS = ("delta_binary", "skcompress", "delta_binary+skcompress")
#: the algorithms whose codec variants auto weighs: every message of theirs is a COO vector, each
#: encoded by its sender and decoded once per receiver, and their plain schedule has no
#: variable-size round, so a variant's is :meth:`~sparsecomm.traffic.Traffic.coded`
CODEC_BASES = ("topka", "spardl")
#: per codec variant, at densities 0.1%, 1%, 5% of N = 15M (random gradients' top-k, float32,
#: one thread; benchmarks/bench_codec_cost.py, docs/results/codec_cost.json): the coded
#: message's bytes over the plain one's, ns per nonzero to encode (a lossy encode returns what
#: receivers will decode) and ns per nonzero to decode; then what a message costs beyond a
#: plain one's whatever its size (us to encode, us to decode: tables, headers, allocations;
#: measured at 20 nonzeros)
#: :data:`COMPUTE_NS` is wall time of 4 ranks sharing 2 cores (half a core each); the codecs'
#: one-thread figures are scaled by the same factor to be compared with it
CODEC_SHARE = 2.0
CODEC_COST: dict[str, tuple[tuple[float, float, float], tuple[float, float, float], tuple[float, float, float],
                            tuple[float, float]]] = {
    "delta_binary": ((0.689, 0.637, 0.601), (4.8, 3.9, 3.1), (3.7, 2.5, 2.5), (3.1, 6.9)),
    "skcompress": ((0.591, 0.583, 0.582), (16.1, 12.6, 14.2), (6.2, 5.3, 5.9), (6.3, 7.7)),
    "delta_binary+skcompress": ((0.281, 0.220, 0.183), (15.8, 14.3, 15.4), (7.8, 6.9, 7.7), (7.8, 7.8)),
}

def in_log_density(points, density: float) -> float:
    """``points`` at 0.1%, 1%, 5%, piecewise linear in log density, held outside."""
    x = math.log(min(max(density, _DENSITIES[0]), _DENSITIES[-1]))
    xs = [math.log(d) for d in _DENSITIES]
    for i in range(len(xs) - 1):
        if x <= xs[i + 1]:
            w = (x - xs[i]) / (xs[i + 1] - xs[i])
            return points[i] * (1 - w) + points[i + 1] * w
    return points[-1]


def compute_ns(name: str, density: float, table: dict | None = None) -> float:
    """Per-element compute (ns) of ``name`` at ``density``: piecewise linear in log density.
    A codec variant's is its algorithm's (the codec's own is :func:`codec_seconds`)."""
    if table and name in table:
        return float(table[name])
    return in_log_density(COMPUTE_NS.get(split_variant(name)[0], (10.0, 10.0, 10.0)), density)


def split_variant(name: str) -> tuple[str, str]:
    """``(algorithm, codecs)`` of a candidate name: ``("topka", "delta_binary")`` for
    ``topka+delta_binary``, ``(name, "")`` for a plain one."""
    base, _, codecs = name.partition("+")
    return base, codecs


def variant_options(name: str) -> dict[str, str]:
    """The constructor options of a candidate name's codecs (``{}`` for a plain name); a
    codec name auto does not know raises ValueError."""
    options: dict[str, str] = {}
    for codec in filter(None, split_variant(name)[1].split("+")):
        if codec not in VARIANT_CODECS or VARIANT_CODECS[codec][0] in options:
            raise ValueError(f"auto: candidate {name!r}: after '+' come codecs, at most one of each kind, among "
                             f"{', '.join(VARIANT_CODECS)} (e.g. 'topka+delta_binary+skcompress')")
        key, value = VARIANT_CODECS[codec]
        options[key] = value
    return options


def with_codec_variants(candidates) -> tuple[str, ...]:
    """``candidates`` followed by the :data:`CODEC_VARIANTS` of each of :data:`CODEC_BASES`
    among them (not listed already)."""
    out = list(candidates)
    out += [f"{base}+{codecs}" for base in CODEC_BASES if base in candidates for codecs in CODEC_VARIANTS
            if f"{base}+{codecs}" not in out]
    return tuple(out)


def codec_seconds(codecs: str, density: float, k: int, plain: Traffic, dtype: torch.dtype) -> float:
    """A codec variant's own compute per call (:data:`CODEC_COST`): its k selected entries
    encoded once (a rank's messages add up to about k entries in topka and spardl), every entry
    it receives decoded (the plain schedule's largest received bytes over a plain entry's), and
    one message encoded and one decoded per round of the plain schedule; times
    :data:`CODEC_SHARE`."""
    _, encode, decode, (encode_us, decode_us) = CODEC_COST[codecs]
    entry = 4 + dtype.itemsize
    received = float(plain.recv.max(initial=0)) / entry
    per_entry = in_log_density(encode, density) * k + in_log_density(decode, density) * received
    return CODEC_SHARE * (1e-9 * per_entry + 1e-6 * (encode_us + decode_us) * plain.max_rounds)
