"""The reducer's two levels: which hierarchy, on which Comms, and one call's node steps.

``SparseAllreduce(hierarchy="node")`` runs one call as (docs/architecture.md, "Two levels"):
the node's reduce-scatter of the gradient into ``acc = residual + node sum of this rank's
shard``, the algorithm among the shard's owners on the other nodes (one per node) into the
shard of the result, and the node's all-gather of the reduced shards. The residual lives on the
shard's owner; the reducer keeps the agreement record, the non-finite policy and the state.
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch

from .comm.base import Comm
from .comm.topology import NodeComms, Topology

__all__ = ["HIERARCHIES", "node_text", "check_hierarchy", "node_comms", "candidate_node_comms", "reduce_two_level",
           "level_snapshots", "level_stats"]

#: the values of the ``hierarchy`` option: one level of equal peers, dense inside a node and the
#: algorithm between nodes, or the one of the two the cost model predicts faster
#: (``SparseAllreduce._choose_hierarchy``)
HIERARCHIES = ("flat", "node", "auto")


def node_text(topology: Topology) -> str:
    """How a checkpoint and the handshake name two levels on ``topology``:
    ``node, <n> nodes x <L> ranks`` (the reducer's and the DDP hook's states must say the same)."""
    return f"node, {topology}"


def check_hierarchy(hierarchy: Any, nodes: Any) -> None:
    """A ValueError unless ``hierarchy`` is one of :data:`HIERARCHIES` and ``nodes`` (a Topology
    or NodeComms) fits it."""
    if hierarchy not in HIERARCHIES:
        raise ValueError(f"hierarchy must be one of {', '.join(map(repr, HIERARCHIES))}, got {hierarchy!r}")
    if nodes is not None and not isinstance(nodes, (Topology, NodeComms)):
        raise ValueError(f"nodes must be a sparsecomm.Topology (or the NodeComms of one), got {type(nodes).__name__}")
    if nodes is not None and hierarchy == "flat":
        raise ValueError("nodes is only used with hierarchy='node' or 'auto'; pass one of them too, or no nodes")


def node_comms(comm: Comm, topology: "Topology | NodeComms | None") -> NodeComms:
    """The two-level Comms over ``comm``: ``topology`` already split (checked to be over the same
    Comm), or split here (collective), from torchrun's environment when None."""
    if isinstance(topology, NodeComms):
        if topology.world is not comm:
            raise ValueError("the NodeComms given were split from another Comm than the one passed as comm")
        return topology
    return (Topology.from_env() if topology is None else topology).split(comm)


def candidate_node_comms(comm: Comm, topology: "Topology | NodeComms | None") -> NodeComms | None:
    """hierarchy="auto": the two-level Comms it may choose, or None when only flat is possible
    (no topology given and no ``LOCAL_WORLD_SIZE`` in the environment, one node, or one rank
    per node). Collective (the split) when a topology is found."""
    if topology is None:
        if os.environ.get("LOCAL_WORLD_SIZE") in (None, ""):
            return None
        topology = Topology.from_env()
    shape = topology.topology if isinstance(topology, NodeComms) else topology
    if shape.nodes == 1 or shape.ranks_per_node == 1:
        return None
    return node_comms(comm, topology)


def reduce_two_level(nodes: NodeComms, algorithm, flat: torch.Tensor, acc: torch.Tensor, k: int,
                     work_out: torch.Tensor, lo: int, hi: int, carry: torch.Tensor | None) -> float:
    """One two-level call: ``acc = residual + node sum of this rank's shard`` by the node's
    reduce-scatter straight from the gradient (:meth:`NodeComms.reduce_scatter_into_`: no copy
    of it), the algorithm among the n owners of the shard (one per node) into the shard
    ``[lo, hi)`` of ``work_out``, and the node's all-gather of the reduced shards into
    ``work_out``. ``carry``: loaded residual values outside this rank's shard, added to the
    gradient so the reduce-scatter takes them to their owner (the caller drops it after). Sets
    ``algorithm.last_nnz`` to the nonzeros of this rank's shard of the result (counting the whole
    result would read N values more). Returns the seconds of the reduce-scatter into ``acc``
    (the "add" phase)."""
    n = flat.numel()
    source = flat
    if flat.dtype != work_out.dtype or carry is not None:
        # half gradients are summed in float32; a carried residual joins the gradient in the
        # result buffer (the caller's gradient only when it is also out=, which the result overwrites)
        if work_out.data_ptr() != flat.data_ptr():
            work_out.copy_(flat)
        if carry is not None:
            work_out.add_(carry)
        source = work_out
    # the algorithm adds this rank's own slice in its first selection pass (one pass over the
    # shard less) where it can: on CPU, in the working dtype
    fuse = (nodes.inter is not None and hi > lo and source.device.type == "cpu" and source.dtype == acc.dtype
            and algorithm.takes_grad())
    start = time.perf_counter()
    nodes.reduce_scatter_into_(source, n, acc, own=not fuse)
    add_s = time.perf_counter() - start
    shard = work_out[lo:hi]
    if hi > lo:
        if nodes.inter is None:     # one node: the node's sum is the result; nothing is held back
            shard.copy_(acc)
            acc.zero_()
        elif fuse:   # safe when the shard is the gradient's own memory: read before written
            algorithm.reduce(acc, k, shard, grad=source[lo:hi])
        else:
            algorithm.reduce(acc, k, shard)
    if algorithm.last_nnz is None or nodes.inter is None:
        algorithm.last_nnz = int(torch.count_nonzero(shard))
    nodes.allgather_(work_out, n)
    return add_s


def level_snapshots(nodes: NodeComms | None) -> list:
    """Snapshots of the intra- and inter-node Comms' counters (two-level), else []."""
    if nodes is None:
        return []
    return [None if c is None else c.stats.snapshot() for c in (nodes.intra, nodes.inter)]


def level_stats(nodes: NodeComms, before: list, world: dict[str, Any], n_total_k: int,
                shard_n: int) -> dict[str, Any]:
    """The call's two-level figures: bytes and rounds inside the node and between nodes apart
    (``intra_*``, ``inter_*``: what this rank sent on its node's links and on the network), and
    the totals over all three Comms (``bytes_sent``, ``bytes_recv``, ``rounds``, ``comm_s``:
    ``world``'s figures plus both levels'); ``k_total`` is the whole tensor's k."""
    out: dict[str, Any] = {"hierarchy": "node", "topology": str(nodes.topology), "shard_n": shard_n,
                           "k_total": n_total_k}
    for level, comm, snap in zip(("intra", "inter"), (nodes.intra, nodes.inter), before):
        spent = (comm.stats - snap) if comm is not None else None
        for field in ("bytes_sent", "bytes_recv", "rounds"):
            value = 0 if spent is None else getattr(spent, field)
            out[f"{level}_{field}"] = value
            out[field] = out.get(field, world[field]) + value
        out["comm_s"] = out.get("comm_s", world["comm_s"]) + (0.0 if spent is None else spent.comm_s)
    return out
