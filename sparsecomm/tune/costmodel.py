"""Cost model of every registered algorithm: bytes and rounds per rank without running it.

``traffic(name, P, N, k, sets=None, **options)`` replays an algorithm's message schedule with
sizes only -- the same rounds, peers and wire sizes (:mod:`sparsecomm.formats` sizes) as the
algorithm's ``reduce()`` -- and returns a :class:`~sparsecomm.traffic.Traffic`: bytes sent,
bytes received and rounds of every rank, and the alpha-beta time of the call. Each message schedule
lives in its algorithm's module, as the classmethod ``traffic()`` beside ``reduce()`` and built
from the same size and peer computations (:meth:`sparsecomm.algorithms.Algorithm.traffic`); the
record, its time, the rounds they share and the index sets are :mod:`sparsecomm.traffic`. This
module is their public face, with the papers' formulas (:func:`paper_formula`). Used by the
scale study (:mod:`sparsecomm.bench.scale`, ``python -m sparsecomm.bench scale``) and by users;
``auto``'s chooser (:mod:`sparsecomm.tune.chooser`) times its candidates with the same
records (:func:`cluster_traffic`).

Three kinds of algorithms (each class's ``traffic_model``):

* *data-independent sizes* (:data:`EXACT`: ``dense``, ``topka``, ``gtopk``, ``gssgd``,
  ``spardl`` on its first call): exact for any input; ``tests/test_costmodel.py`` checks it,
  rank by rank, against the bytes and rounds the simulated Comm counts (gssgd: its own
  ``rank_traffic()``, the slowest rank's figures given to every rank);
* *sizes from the union of the ranks' index sets* (:data:`SET_BASED`:
  ``sparcml_recursive_double``, ``sparcml_split_allgather``, ``topkdsa``, ``sparcml``, ``zen``):
  exact given the ranks' selected index sets (:class:`IndexSets`) -- the real ones in the tests, a
  model of real gradients (:func:`model_sets`) at large P;
* *estimated* (:data:`ESTIMATED`: ``densestream``: blocks counted as runs of consecutive
  indices, the zero-run rule ignored; ``oktopk``: the reuse step, regions assumed to hold k/P
  entries of every rank and G = k; ``skcompress``: one rank's real encoded message size for
  every rank): ``Traffic.exact`` is False and the tests bound the error.

The time of a call (:meth:`Traffic.time`): rounds run one after another; a rank's cost in a
round is ``messages * alpha + bytes * beta`` on its sending side and on its receiving side
(full-duplex links), the round costs what its slowest rank pays. Variable-size rounds
(``exchange_var``, ``bruck_allgather_var``) count a round of sizes (8 bytes per message) before
their payloads where the Comm sends one (NCCL, calls outside a reducer: ``size_rounds=True``, the
default); with ``size_rounds=False`` each size travels in its payload's round (gloo and the
simulated Comm inside a reducer call, MPI's probes: :meth:`Traffic.unsized`). Local compute is
not in it (``auto`` adds a per-element coefficient).

Clusters of nodes (:func:`predict`): ``nodes`` nodes of ``ranks_per_node`` ranks on two kinds of
link (:class:`Links`: the network between nodes, one NIC per node shared by its ranks, and the
ranks' own links inside a node). ``hierarchy="flat"`` is the algorithm's own schedule on all
ranks, each message on the link it takes (:meth:`Traffic.time_on_nodes`);
``hierarchy="node"`` is the reducer's two-level call (:mod:`sparsecomm.tune.two_level_schedule`:
the node's reduce-scatter, the algorithm on the L shards at once over the shared NIC, the
node's all-gather). ``tests/test_costmodel.py`` checks the two-level schedule's bytes and rounds
per rank and level against the simulated two-level reducer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from ..algorithms import modelled, traffic
from ..traffic import IndexSets, Links, Traffic, default_sets, fit_alpha_beta, model_sets
from .two_level_schedule import two_level_traffic

__all__ = ["Traffic", "IndexSets", "Links", "model_sets", "default_sets", "traffic", "modelled", "EXACT", "SET_BASED",
           "ESTIMATED", "paper_formula", "fit_alpha_beta", "predict", "Prediction", "cluster_traffic", "LAYOUTS"]

#: the schedules :func:`predict` models on a cluster of nodes: the placements of
#: :data:`sparsecomm.reduce.HIERARCHIES` that run one schedule ("auto" picks one of these)
LAYOUTS = ("flat", "node")

#: algorithms whose sizes do not depend on the data (exact for any input)
EXACT = tuple(modelled("exact"))
#: exact given the ranks' index sets
SET_BASED = tuple(modelled("set-based"))
#: estimates (see the module docstring)
ESTIMATED = tuple(modelled("estimated"))


# -- the papers' formulas -------------------------------------------------------------------------
def paper_formula(name: str, P: int, N: int, k: int, d: int = 2, log_d_words: float | None = None,
                  word: int = 4) -> tuple[float, float] | None:
    """(latency terms, bytes) per rank of a paper's cost formula for power-of-two P, words of
    ``word`` bytes (a COO entry is 2 words): SparDL Table 1 (dense, topka, topkdsa as its lower
    end, gtopk, oktopk lower end, spardl no SAG / R-SAG with d teams), SparCML section 4
    (recursive double: lower end log2(P) k entries; split-allgather: lower end 2 (P-1)/P k entries),
    gs-SGD eq. 1 (2 ceil(log2 P) messages of the sketch, ``log_d_words`` words)."""
    lg = math.log2(P) if P > 1 else 0
    w = word
    if name == "dense":
        return 2 * lg, 2 * (P - 1) / P * N * w
    if name == "topka":
        return lg, 2 * (P - 1) * k * w
    if name == "topkdsa":
        return P + 2 * lg, 4 * (P - 1) / P * k * w
    if name == "gtopk":
        return 2 * lg, 4 * lg * k * w
    if name == "oktopk":
        return 2 * (P + lg), 2 * k * (P - 1) / P * w
    if name == "spardl":
        if d == 1:
            return 2 * math.ceil(lg), 4 * k * (P - 1) / P * w
        return 2 * math.ceil(math.log2(P / d)) + math.log2(d), 2 * k * ((2 * P - 2 * d) / P + d / P * math.log2(d)) * w
    if name == "sparcml_recursive_double":
        return lg, 2 * lg * k * w
    if name == "sparcml_split_allgather":
        return (P - 1) + lg, 2 * 2 * (P - 1) / P * k * w
    if name == "gssgd":
        words = log_d_words if log_d_words is not None else math.log2(max(N, 2))
        return 2 * math.ceil(lg), 2 * math.ceil(lg) * words * w
    return None


# -- clusters of nodes ----------------------------------------------------------------------------
@dataclass
class Prediction:
    """One call on a cluster, predicted: ``time_s`` (alpha-beta, compute aside), the most
    bytes a rank sends inside its node (``intra_bytes``) and to other nodes (``inter_bytes``),
    the most bytes one node's NIC sends (``nic_bytes``), the most rounds of a rank, and the
    :class:`Traffic` record (global ranks, torchrun's layout)."""

    algorithm: str
    hierarchy: str
    nodes: int
    ranks_per_node: int
    time_s: float
    intra_bytes: int
    inter_bytes: int
    nic_bytes: int
    rounds: int
    exact: bool
    traffic: Traffic


def predict(algorithm: str, N: int, k: int, nodes: int, ranks_per_node: int, links: Links,
            hierarchy: str = "flat", shard_k: Sequence[int] | None = None, sets: IndexSets | None = None,
            shard_sets: Sequence[IndexSets | None] | None = None, dtype: torch.dtype = torch.float32,
            **options: Any) -> Prediction:
    """Time and bytes of one call of ``algorithm`` on ``nodes`` x ``ranks_per_node`` ranks.

    ``hierarchy="flat"``: every rank selects ``k`` of N (``sets``: their index sets, for the
    set-based schedules). ``hierarchy="node"``: the two-level call; ``shard_k[l]`` is what the
    ranks of local rank l select of their shard -- the reducer's ``k_for(density, shard
    length)`` over :func:`~sparsecomm.comm.collectives.block_bounds` (N, ranks_per_node), which
    the caller computes (``sparsecomm.k_for``) -- and ``shard_sets`` their index sets.
    ``dtype`` is the values' dtype (float32 for half gradients, as the reducer works)."""
    if not isinstance(links, Links):
        raise ValueError(f"predict: links must be a sparsecomm.costmodel.Links, got {type(links).__name__}")
    record = cluster_traffic(algorithm, hierarchy, nodes, ranks_per_node, N, k, shard_k, sets=sets,
                             shard_sets=shard_sets, dtype=dtype, **options)
    P = nodes * ranks_per_node
    inside, outside = record.sent_by_level(ranks_per_node)
    nic = outside.reshape(nodes, ranks_per_node).sum(1) if P else outside
    return Prediction(algorithm, hierarchy, nodes, ranks_per_node, record.time_on_nodes(ranks_per_node, links),
                      int(inside.max(initial=0)), int(outside.max(initial=0)), int(nic.max(initial=0)),
                      record.max_rounds, record.exact, record)


def cluster_traffic(algorithm: str, hierarchy: str, nodes: int, ranks_per_node: int, N: int, k: int,
                    shard_k: Sequence[int] | None = None, sets: IndexSets | None = None,
                    shard_sets: Sequence[IndexSets | None] | None = None, dtype: torch.dtype = torch.float32,
                    **options: Any) -> Traffic:
    """The :class:`Traffic` of one call of ``algorithm`` placed as ``hierarchy`` on ``nodes`` x
    ``ranks_per_node`` ranks (global ranks, torchrun's layout): its own schedule on every rank
    (flat), or the two-level call (:func:`~sparsecomm.tune.two_level_schedule.two_level_traffic`).
    Arguments as in :func:`predict`, whose record this is; ``auto``'s layout chooser times the same."""
    if hierarchy not in LAYOUTS:
        raise ValueError(f"predict: hierarchy must be one of {', '.join(map(repr, LAYOUTS))}, got {hierarchy!r}")
    if hierarchy == "flat":
        return traffic(algorithm, nodes * ranks_per_node, N, k, sets=sets, dtype=dtype, **options)
    if shard_k is None:
        raise ValueError("predict: hierarchy='node' needs shard_k, the k of each of the ranks_per_node shards "
                         "(k_for(density, shard length) over block_bounds(N, ranks_per_node))")
    return two_level_traffic(algorithm, nodes, ranks_per_node, N, shard_k, sets=shard_sets, dtype=dtype, **options)
