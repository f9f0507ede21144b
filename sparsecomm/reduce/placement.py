"""Where a reducer's call runs: flat among all ranks, in two levels over a cluster's nodes, or
whichever of the two the cost model predicts faster (the option ``hierarchy``).

One interface, :class:`Placement`, for the three: the Comms a call uses (:meth:`~Placement.comms`,
:meth:`~Placement.levels`), the slice of the gradient this rank's algorithm owns
(:meth:`~Placement.shard_bounds`), the call itself (:meth:`~Placement.run`), its two-level
statistics, and how the handshake and a checkpoint name it (:meth:`~Placement.text`,
:meth:`~Placement.saved_text`). The reducer keeps the agreement record, the non-finite policy,
the residual and the state (docs/architecture.md, "Two levels").

``hierarchy="node"`` runs one call as: the node's reduce-scatter of the gradient into ``acc =
residual + node sum of this rank's shard``, the algorithm among the shard's owners on the other
nodes (one per node) into the shard of the result, and the node's all-gather of the reduced
shards (its message schedule, sizes only: :mod:`sparsecomm.tune.two_level_schedule`). The
residual lives on the shard's owner.
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch

from ..comm.base import Comm
from ..comm.collectives import block_bounds
from ..comm.topology import NodeComms, Topology
from ..tune import LAYOUTS, choose_layout, measure_links
from .density import k_for
from .local_update import LocalUpdateState

__all__ = ["HIERARCHIES", "Placement", "FlatPlacement", "NodePlacement", "AutoPlacement", "check_hierarchy",
           "node_text", "saved_text", "node_comms", "candidate_node_comms", "make_placement"]

#: the values of the ``hierarchy`` option: the layouts the cost model times (one level of equal
#: peers; dense inside a node and the algorithm between nodes), and "auto", the one of them it
#: predicts faster
HIERARCHIES = LAYOUTS + ("auto",)


def node_text(topology: Topology) -> str:
    """How a checkpoint and the handshake name two levels on ``topology``:
    ``node, <n> nodes x <L> ranks`` (the reducer's and the DDP hook's states must say the same)."""
    return f"node, {topology}"


def saved_text(hierarchy: str, topology: Topology | None) -> str:
    """What a checkpoint says of a placement: ``flat``, ``node, <topology>``, or ``auto`` (not
    decided yet, or decided anew by each bucket's reducer)."""
    return {"flat": "flat", "node": node_text(topology) if topology is not None else "node"}.get(hierarchy, "auto")


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


def _levels(nodes: NodeComms | None) -> list[tuple[Comm, str]]:
    """The intra- and inter-node Comms of ``nodes`` (those that exist) with their names."""
    if nodes is None:
        return []
    return [(c, level) for c, level in ((nodes.intra, "inside the node"), (nodes.inter, "between nodes"))
            if c is not None]


def _fuses(algorithm, source: torch.Tensor, acc: torch.Tensor) -> bool:
    """Whether the algorithm adds ``source`` into ``acc`` in its first selection pass (one pass
    over them less): where it can, on CPU, in the working dtype, with elements to select."""
    return (acc.numel() > 0 and source.dtype == acc.dtype and acc.device.type == "cpu"
            and algorithm.takes_grad())


def _reduce(algorithm, acc: torch.Tensor, k: int, out: torch.Tensor, grad: torch.Tensor | None) -> None:
    """The algorithm's reduce, fused with the add of ``grad`` when one is given. Safe when
    ``out`` is the gradient's own memory: the algorithm reads it before it writes ``out``."""
    if grad is None:
        algorithm.reduce(acc, k, out)
    else:
        algorithm.reduce(acc, k, out, grad=grad)


class Placement:
    """Where one reducer's calls run (module docstring). ``hierarchy`` is the option's value,
    ``nodes`` the two-level Comms a call uses (None: flat)."""

    hierarchy = "flat"
    nodes: NodeComms | None = None
    #: whether the two-level Comms were split for this placement (then :meth:`close` closes them)
    owns_nodes = False

    def comms(self, world: Comm) -> list[Comm]:
        """Every Comm a call may use, to check and abort together."""
        return [world] if self.nodes is None else self.nodes.comms

    def levels(self) -> list[tuple[Comm, str]]:
        """The Comms of the two levels with their names, each needing a call scope of its own."""
        return _levels(self.nodes)

    def shard_bounds(self, n: int) -> tuple[int, int]:
        """[lo, hi) of the slice of an N-element gradient this rank's algorithm owns."""
        return 0, n

    def algorithm_comm(self, world: Comm) -> Comm:
        """The Comm the algorithm runs on."""
        return world

    def text(self) -> str:
        """The handshake's and the options text's name of it ("" when flat)."""
        return ""

    def saved_text(self) -> str:
        """What a state_dict saves of it (:func:`saved_text`)."""
        return "flat"

    def decided(self) -> bool:
        return True

    def close(self) -> None:
        """Close the two-level Comms this placement split (NodeComms passed in are the caller's)."""
        split = self._split_nodes()
        if self.owns_nodes and split is not None:
            split.close()

    def _split_nodes(self) -> NodeComms | None:
        return self.nodes

    def run(self, algorithm, flat: torch.Tensor, acc: torch.Tensor, k: int, work_out: torch.Tensor,
            carry: torch.Tensor | None, local: LocalUpdateState | None = None, scale: float = 1.0) -> float:
        """One call: ``acc`` (the residual) takes the gradient ``flat``, the algorithm writes the
        reduced sum into ``work_out`` and leaves what it held back in ``acc``. Returns the
        seconds of the add (the "add" phase). ``local``: momentum correction and masking
        (:mod:`sparsecomm.reduce.local_update`), with the gradient scaled by ``scale`` (clipping)."""
        raise NotImplementedError

    def snapshot(self) -> list:
        """The levels' counters before a call (for :meth:`stats`)."""
        return []

    def stats(self, before: list, world: dict[str, Any], k_total: int, shard_n: int) -> dict[str, Any]:
        """The call's figures by level, added to ``last_stats``."""
        return {}


class FlatPlacement(Placement):
    """The algorithm among all ranks of the reducer's Comm."""

    def run(self, algorithm, flat, acc, k, work_out, carry, local=None, scale=1.0):
        start = time.perf_counter()
        # what joins the residual: the gradient, or (local update) the velocity or the scaled gradient
        source = flat if local is None else local.feed(flat, scale, scratch=work_out)
        fuse = _fuses(algorithm, source, acc) and (local is None or not local.masks)
        if not fuse:
            acc.add_(source)
        add_s = time.perf_counter() - start
        if acc.numel():
            if local is not None:
                local.before_algorithm(acc)
            _reduce(algorithm, acc, k, work_out, source if fuse else None)
            if local is not None:
                local.after_algorithm(acc)
        return add_s


class NodePlacement(Placement):
    """Dense inside each node, the algorithm between nodes on each rank's shard."""

    hierarchy = "node"

    def __init__(self, nodes: NodeComms):
        self.nodes = nodes

    def shard_bounds(self, n):
        """Slice ``local_rank`` of the node's reduce-scatter (contiguous, lengths differing by
        at most one)."""
        if self.nodes.intra is None:
            return 0, n
        bounds = block_bounds(n, self.nodes.intra.size)
        return bounds[self.nodes.intra.rank], bounds[self.nodes.intra.rank + 1]

    def algorithm_comm(self, world):
        return self.nodes.inter

    def text(self):
        return node_text(self.nodes.topology)

    def saved_text(self):
        return self.text()

    def run(self, algorithm, flat, acc, k, work_out, carry, local=None, scale=1.0):
        """The node's reduce-scatter straight from the gradient
        (:meth:`NodeComms.reduce_scatter_into_`: no copy of it) into ``acc``, the algorithm
        among the owners of the shard (one per node) into the shard ``[lo, hi)`` of
        ``work_out``, and the node's all-gather of the reduced shards into ``work_out``.
        ``carry``: loaded residual values outside this rank's shard, added to the gradient so
        the reduce-scatter takes them to their owner (the caller drops it after). Sets
        ``algorithm.last_nnz`` to the nonzeros of this rank's shard of the result (counting the
        whole result would read N values more)."""
        if local is not None:
            return self._run_local(algorithm, flat, acc, k, work_out, carry, local, scale)
        nodes = self.nodes
        n = flat.numel()
        lo, hi = self.shard_bounds(n)
        source = flat
        if flat.dtype != work_out.dtype or carry is not None:
            # half gradients are summed in float32; a carried residual joins the gradient in the
            # result buffer (the caller's gradient only when it is also out=, which the result overwrites)
            if work_out.data_ptr() != flat.data_ptr():
                work_out.copy_(flat)
            if carry is not None:
                work_out.add_(carry)
            source = work_out
        fuse = nodes.inter is not None and _fuses(algorithm, source, acc)
        start = time.perf_counter()
        nodes.reduce_scatter_into_(source, n, acc, own=not fuse)
        add_s = time.perf_counter() - start
        shard = work_out[lo:hi]
        if hi > lo:
            if nodes.inter is None:     # one node: the node's sum is the result; nothing is held back
                shard.copy_(acc)
                acc.zero_()
            else:
                _reduce(algorithm, acc, k, shard, source[lo:hi] if fuse else None)
        if algorithm.last_nnz is None or nodes.inter is None:
            algorithm.last_nnz = int(torch.count_nonzero(shard))
        nodes.allgather_(work_out, n)
        return add_s

    def _run_local(self, algorithm, flat, acc, k, work_out, carry, local, scale):
        """:meth:`run` with a local update: the rank's gradient scaled (clipping) before the
        node's reduce-scatter, which sums it into a shard of its own; the velocity of that
        node sum joins the residual (momentum correction on the shard, beside the residual). A
        loaded state's values outside the shard (``carry``: the residual's; ``local.carry``: the
        velocity's) go to their owners' residual and velocity by reduce-scatters of their own: a
        carry is no gradient, it must not enter the velocity. The reducer gives a carry on every
        rank of the node or on none, so the node makes the same rounds everywhere."""
        nodes = self.nodes
        n = flat.numel()
        lo, hi = self.shard_bounds(n)
        source = flat
        if flat.dtype != work_out.dtype or scale != 1.0:
            if work_out.data_ptr() != flat.data_ptr():
                work_out.copy_(flat)
            if scale != 1.0:
                work_out.mul_(scale)
            source = work_out
        start = time.perf_counter()
        node_sum = torch.zeros(hi - lo, dtype=acc.dtype, device=acc.device)
        nodes.reduce_scatter_into_(source, n, node_sum)
        if carry is not None:
            nodes.reduce_scatter_fence(source)
            nodes.reduce_scatter_into_(carry, n, acc)
            if local.velocity is not None:
                moved = local.carry if local.carry is not None else torch.zeros_like(carry)
                nodes.reduce_scatter_fence(carry)
                nodes.reduce_scatter_into_(moved, n, local.velocity)
            local.carry = None
        acc.add_(local.feed(node_sum, 1.0, scratch=node_sum))
        add_s = time.perf_counter() - start
        shard = work_out[lo:hi]
        if hi > lo:
            local.before_algorithm(acc)
            if nodes.inter is None:     # one node: the node's sum is the result; nothing is held back
                shard.copy_(acc)
                acc.zero_()
            else:
                _reduce(algorithm, acc, k, shard, None)
            local.after_algorithm(acc)
        if algorithm.last_nnz is None or nodes.inter is None:
            algorithm.last_nnz = int(torch.count_nonzero(shard))
        nodes.allgather_(work_out, n)
        return add_s

    def snapshot(self):
        return [None if c is None else c.stats.snapshot() for c in (self.nodes.intra, self.nodes.inter)]

    def stats(self, before, world, k_total, shard_n):
        """Bytes and rounds inside the node and between nodes apart (``intra_*``, ``inter_*``:
        what this rank sent on its node's links and on the network), and the totals over all
        three Comms (``bytes_sent``, ``bytes_recv``, ``rounds``, ``comm_s``: ``world``'s figures
        plus both levels'); ``k_total`` is the whole tensor's k."""
        nodes = self.nodes
        out: dict[str, Any] = {"hierarchy": "node", "topology": str(nodes.topology), "shard_n": shard_n,
                               "k_total": k_total}
        for level, comm, snap in zip(("intra", "inter"), (nodes.intra, nodes.inter), before):
            spent = (comm.stats - snap) if comm is not None else None
            for field in ("bytes_sent", "bytes_recv", "rounds"):
                value = 0 if spent is None else getattr(spent, field)
                out[f"{level}_{field}"] = value
                out[field] = out.get(field, world[field]) + value
            out["comm_s"] = out.get("comm_s", world["comm_s"]) + (0.0 if spent is None else spent.comm_s)
        return out


class AutoPlacement(Placement):
    """Flat or two-level, whichever the cost model predicts faster for the first call's tensor on
    the measured links (:meth:`decide`), the same on every rank; until then it is undecided and
    its two-level Comms are candidates. Without a topology only flat is possible: decided at once."""

    hierarchy = "auto"

    def __init__(self, candidates: NodeComms | None):
        #: the two-level Comms it may choose (None: flat only)
        self.candidates = candidates
        #: "flat" or "node" once decided, else None
        self.choice: str | None = None if candidates is not None else "flat"
        #: a choice a loaded state holds: it stands at the first call, with no measurement
        self.resumed: str | None = None
        #: what the cost model predicted ({} when nothing was predicted)
        self.decision: dict[str, Any] = {}
        self.chosen: Placement = FlatPlacement()

    @property
    def nodes(self) -> NodeComms | None:   # type: ignore[override]
        return self.chosen.nodes

    def decided(self) -> bool:
        return self.choice is not None

    def _split_nodes(self):
        return self.candidates

    def comms(self, world):
        nodes = self.chosen.nodes if self.choice else self.candidates
        return [world] if nodes is None else nodes.comms

    def levels(self):
        return [] if self.choice == "flat" else _levels(self.candidates)

    def shard_bounds(self, n):
        return self.chosen.shard_bounds(n)

    def algorithm_comm(self, world):
        return self.chosen.algorithm_comm(world)

    def text(self):
        if self.choice is None:
            return "auto: " + (f"resumed {self.resumed}" if self.resumed else "undecided")
        return "auto: " + (self.chosen.text() or "flat")

    def saved_text(self):
        if self.choice is None:
            return {None: "auto", "flat": "flat", "node": node_text(self.candidates.topology)}[self.resumed]
        return self.chosen.saved_text()

    def resume(self, saved: str) -> bool:
        """Take a loaded state's placement (``flat``, ``auto`` or the candidates' ``node, ...``)
        while undecided; False when it is none of those (the caller refuses the state)."""
        if self.choice is not None or saved not in ("flat", "auto", node_text(self.candidates.topology)):
            return False
        self.resumed = None if saved == "auto" else saved.split(",")[0]
        return True

    def decide(self, world: Comm, algorithm, n: int, k: int, shard_k: list[int], work_dtype: torch.dtype) -> str:
        """Flat or two-level for this tensor, the same on every rank: a resumed choice stands;
        otherwise a ping-pong on each level (:func:`~sparsecomm.tune.links.measure_links`, world
        rank 0's fits on every rank) and the cost model's prediction of the tensor on the
        cluster (:func:`~sparsecomm.tune.chooser.choose_layout`: every candidate the algorithm
        names -- itself, or auto's candidates -- flat and two-level, over the node's shared NIC).
        Returns the choice; the caller moves the algorithm onto :meth:`algorithm_comm`."""
        nodes = self.candidates
        choice = self.resumed
        if choice is None:
            links = measure_links(world, nodes.intra, nodes.inter)
            candidates, compute = algorithm.layout_candidates()
            self.decision = choose_layout(nodes.topology.nodes, nodes.topology.ranks_per_node, n, k, shard_k, links,
                                          candidates=candidates, compute=compute, dtype=work_dtype,
                                          size_rounds=nodes.inter.sizes_take_a_round(bounded=True))
            self.decision["links"] = links
            choice = self.decision["hierarchy"]
        self.choice = choice
        if choice == "node":
            self.chosen = NodePlacement(nodes)
        return choice

    def run(self, algorithm, flat, acc, k, work_out, carry, local=None, scale=1.0):
        return self.chosen.run(algorithm, flat, acc, k, work_out, carry, local, scale)

    def snapshot(self):
        return self.chosen.snapshot()

    def stats(self, before, world, k_total, shard_n):
        return self.chosen.stats(before, world, k_total, shard_n)


def make_placement(hierarchy: str, comm: Comm, nodes: "Topology | NodeComms | None") -> Placement:
    """The placement of ``hierarchy`` over ``comm`` (collective when it splits the Comm)."""
    if hierarchy == "node":
        placement: Placement = NodePlacement(node_comms(comm, nodes))
    elif hierarchy == "auto":
        placement = AutoPlacement(candidate_node_comms(comm, nodes))
    else:
        return FlatPlacement()
    placement.owns_nodes = not isinstance(nodes, NodeComms)
    return placement


def shard_ks(density: float, n: int, ranks_per_node: int) -> list[int]:
    """The k of each of a node's shards of an N-element tensor (the reducer's k per shard)."""
    bounds = block_bounds(n, ranks_per_node)
    return [k_for(density, bounds[q + 1] - bounds[q]) for q in range(ranks_per_node)]
