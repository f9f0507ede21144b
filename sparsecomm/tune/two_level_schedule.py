"""One call's traffic on a cluster of nodes in two levels, sizes only: the message schedule of
``SparseAllreduce(..., hierarchy="node")``.

``nodes`` nodes of ``ranks_per_node`` (L) ranks, rank ``node * L + local`` (torchrun's layout).
The reducer's two-level call (:class:`sparsecomm.reduce.placement.NodePlacement`) is, in order:

1. the node's reduce-scatter of the N-element bucket
   (:func:`~sparsecomm.comm.collectives.direct_reduce_scatter_into_`, one round, its messages
   from :func:`~sparsecomm.comm.collectives.direct_reduce_scatter_rounds`), every node at once;
2. the algorithm on each of the L shards (:func:`~sparsecomm.comm.collectives.block_bounds`),
   among the ``nodes`` ranks of that local rank: its own ``traffic()`` on ``nodes`` ranks, shard
   length and the shard's k, the L calls running at the same time (round j of every shard in
   one round), so the messages leaving a node in a round are those of all its L ranks;
3. the node's all-gather of the reduced shards
   (:func:`~sparsecomm.comm.collectives.direct_allgather_rounds`).

The record is a :class:`~sparsecomm.traffic.Traffic` over all ``nodes * L`` ranks; its
:meth:`~sparsecomm.traffic.Traffic.time_on_nodes` puts each message on the link it takes (the
node's shared NIC or the ranks' own intra-node links). A flat call on the same cluster is the
algorithm's own ``traffic()`` on ``nodes * L`` ranks, timed the same way.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

from ..comm.collectives import block_bounds, direct_allgather_rounds, direct_reduce_scatter_rounds
from ..traffic import IndexSets, Traffic
from ..algorithms import traffic

__all__ = ["two_level_traffic"]


def _node_rounds(traffic_record: Traffic, nodes: int, per: int, rounds) -> None:
    """Append one collective's rounds (ranks 0 .. per - 1 of a node) run in every node at once."""
    first = np.arange(nodes, dtype=np.int64)[:, None] * per
    for src, dst, nbytes in rounds:
        traffic_record.round(first + src, first + dst, np.broadcast_to(nbytes, (nodes, len(nbytes))))


def two_level_traffic(name: str, nodes: int, ranks_per_node: int, N: int, shard_k: Sequence[int],
                      sets: Sequence[IndexSets | None] | None = None, dtype: torch.dtype = torch.float32,
                      **options: Any) -> Traffic:
    """The :class:`~sparsecomm.traffic.Traffic` of one two-level call of ``name`` (module
    docstring): ``shard_k[l]`` is what the ranks of local rank l select of their shard (the
    reducer's ``k_for(density, shard length)``), ``sets[l]`` their index sets when the
    algorithm's schedule needs them (None: drawn by :func:`~sparsecomm.traffic.default_sets`,
    once per distinct shard length and k), ``dtype`` the values' dtype (the reducer's work
    dtype: float32 for half gradients)."""
    per = ranks_per_node
    if nodes < 1 or per < 1 or N < 0:
        raise ValueError(f"two_level_traffic: need nodes >= 1, ranks_per_node >= 1, N >= 0; got {nodes}, {per}, {N}")
    if len(shard_k) != per:
        raise ValueError(f"two_level_traffic: shard_k has {len(shard_k)} entries, one per local rank ({per}) needed")
    if sets is not None and len(sets) != per:
        raise ValueError(f"two_level_traffic: sets has {len(sets)} entries, one per local rank ({per}) needed")
    t = Traffic(nodes * per)
    isize = dtype.itemsize
    if per > 1:
        _node_rounds(t, nodes, per, direct_reduce_scatter_rounds(per, N, isize))
    if nodes > 1:
        bounds = block_bounds(N, per)
        drawn: dict[tuple[int, int], Traffic] = {}
        parts = []
        for local in range(per):
            length, k = bounds[local + 1] - bounds[local], shard_k[local]
            if length == 0:
                continue
            given = None if sets is None else sets[local]
            if given is None:
                if (length, k) not in drawn:
                    drawn[(length, k)] = traffic(name, nodes, length, k, dtype=dtype, **options)
                shard = drawn[(length, k)]
            else:
                shard = traffic(name, nodes, length, k, sets=given, dtype=dtype, **options)
            parts.append((shard, [node * per + local for node in range(nodes)]))
            t.exact = t.exact and shard.exact
        t.run_concurrently(parts)
    if per > 1:
        _node_rounds(t, nodes, per, direct_allgather_rounds(per, N, isize))
    return t
