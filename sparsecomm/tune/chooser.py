"""The tuner's choices, the same on every rank given the same arguments: the algorithm with the
least predicted time per call (:func:`choose_algorithm`), the (placement, algorithm) pair on a
cluster of nodes (:func:`choose_layout`), and the candidates worth measuring (:func:`shortlist`).

A prediction is the alpha-beta time of the candidate's message schedule (its
:meth:`~sparsecomm.algorithms.Algorithm.traffic`, index sets from
:func:`sparsecomm.traffic.default_sets`) plus its local compute
(:func:`~sparsecomm.tune.tables.compute_ns` times the elements it selects from) and, for a codec
variant, the codec's own cost (:func:`~sparsecomm.tune.tables.codec_seconds`).
"""

from __future__ import annotations

import math

import torch

from ..algorithms import traffic
from ..traffic import Links, Traffic, default_sets
from .costmodel import LAYOUTS, cluster_traffic
from .tables import CANDIDATES, CODEC_COST, codec_seconds, compute_ns, in_log_density, split_variant

__all__ = ["choose_algorithm", "choose_layout", "shortlist"]


def choose_algorithm(P: int, N: int, k: int, alpha: float, beta: float, sets=None, observed_k=None,
                     candidates=CANDIDATES, compute: dict | None = None, dtype: torch.dtype = torch.float32,
                     model_n: int = 1 << 16, size_rounds: bool = True) -> dict:
    """The candidate with the least predicted time (message schedule + compute); the same on every rank
    given the same arguments. ``size_rounds``: whether the Comm spends a round on the sizes of a
    variable-size round (:meth:`~sparsecomm.comm.base.Comm.sizes_take_a_round`). Returns
    {"algorithm", "predicted_s", "predictions"}."""
    if P <= 1 or N == 0:
        return {"algorithm": "dense", "predicted_s": 0.0, "predictions": {"dense": 0.0}}
    density = k / N
    if sets is None:
        sets = default_sets(P, N, k, model_n=model_n)
    preds = {}
    plain_records: dict[str, Traffic] = {}
    for name in candidates:
        base, codecs = split_variant(name)
        try:
            if base not in plain_records:
                plain_records[base] = traffic(base, P, N, k, sets=sets, dtype=dtype, size_rounds=size_rounds)
            plain = plain_records[base]
            if codecs:   # a codec variant: the plain schedule's bytes coded, its messages variable-size
                ratio = in_log_density(CODEC_COST[codecs][0], density)
                wire = plain.coded(ratio)
                wire = wire if size_rounds else wire.unsized()
            else:
                wire = plain
        except ValueError:
            continue   # e.g. options that do not fit P
        preds[name] = wire.time(alpha, beta) + compute_ns(name, density, compute) * 1e-9 * N
        if codecs:
            preds[name] += codec_seconds(codecs, density, k, plain, dtype)
    # a codec variant is a candidate only where it pays: predicted faster than its plain algorithm
    plain_times = {name: t for name, t in preds.items() if not split_variant(name)[1]}
    preds = {name: t for name, t in preds.items()
             if not split_variant(name)[1] or t < plain_times.get(split_variant(name)[0], math.inf)}
    best = min(preds, key=lambda n: (preds[n], list(candidates).index(n)))
    return {"algorithm": best, "predicted_s": preds[best], "predictions": preds}


def choose_layout(nodes: int, ranks_per_node: int, N: int, k: int, shard_k, links: Links,
                  candidates=CANDIDATES, compute: dict | None = None, dtype: torch.dtype = torch.float32,
                  model_n: int = 1 << 16, records: dict | None = None, size_rounds: bool = True) -> dict:
    """The (hierarchy, algorithm) with the least predicted time on ``nodes`` x ``ranks_per_node``
    ranks joined by ``links``: every candidate flat (its schedule on all ranks, each message on
    the link it takes: :meth:`~sparsecomm.traffic.Traffic.time_on_nodes`) and two-level
    (:func:`~sparsecomm.tune.costmodel.cluster_traffic`: the node's reduce-scatter and
    all-gather, the candidate on the L shards at once over the node's shared NIC), plus its
    compute on the elements it selects from (N flat, the largest shard two-level; the node's
    dense adds are left out). ``shard_k``: the k of each shard (the reducer's). The same on
    every rank given the same arguments. Returns {"hierarchy", "algorithm", "predicted_s",
    "predictions": {(hierarchy, algorithm): seconds}}. ``records``: (hierarchy, algorithm) ->
    its :class:`~sparsecomm.traffic.Traffic` where already made (a study at several links).
    ``size_rounds`` as in :func:`choose_algorithm`."""
    P = nodes * ranks_per_node
    density = k / N if N else 1.0
    records = records or {}
    flat_sets = None
    longest = -(-N // ranks_per_node)
    preds: dict[tuple[str, str], float] = {}
    for name in candidates:
        if split_variant(name)[1]:
            continue   # codec variants are weighed flat only (choose_algorithm)
        for hierarchy in LAYOUTS:
            if hierarchy == "node" and (nodes == 1 or ranks_per_node == 1) and P > 1:
                continue   # one node or one rank per node: the two levels are not two
            try:
                if (hierarchy, name) in records:
                    record = records[(hierarchy, name)]
                else:
                    if hierarchy == "flat" and flat_sets is None and P > 1 and N:
                        flat_sets = default_sets(P, N, k, model_n=model_n)
                    record = cluster_traffic(name, hierarchy, nodes, ranks_per_node, N, k, shard_k,
                                             sets=flat_sets, dtype=dtype, size_rounds=size_rounds)
            except ValueError:
                continue   # e.g. options that do not fit P
            elements = N if hierarchy == "flat" else longest
            preds[(hierarchy, name)] = record.time_on_nodes(ranks_per_node, links) + \
                compute_ns(name, density, compute) * 1e-9 * elements
    order = [(h, n) for n in candidates for h in LAYOUTS]
    best = min(preds, key=lambda key: (preds[key], order.index(key)))
    return {"hierarchy": best[0], "algorithm": best[1], "predicted_s": preds[best], "predictions": preds}


def shortlist(predictions: dict[str, float], candidates, size: int, margin: float) -> list[str]:
    """The candidates worth measuring: predicted within ``margin`` x the cheapest, cheapest
    first (ties: the order of ``candidates``), at most ``size`` of them."""
    order = list(candidates)
    ranked = sorted(predictions, key=lambda n: (predictions[n], order.index(n)))
    best = predictions[ranked[0]]
    return [n for n in ranked if predictions[n] <= margin * best][:size]
