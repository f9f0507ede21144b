"""Where the ranks sit: ``n`` nodes of ``L`` ranks each, and the Comms of a two-level reduction.

A GPU cluster's ranks are not equal peers: the L ranks of a node talk over fast links (NVLink,
PCIe, shared memory) and share one NIC to the 1-25 Gbit/s network between nodes. A
:class:`Topology` says how many nodes and ranks per node there are and where this rank is;
:meth:`Topology.split` checks that every rank says the same and builds, once, the two groups a
two-level reduction runs on (:class:`NodeComms`):

* the **intra-node** group: the L ranks of this rank's node, ordered by local rank;
* the **inter-node** group: the n ranks with this rank's local rank, one per node, ordered by
  node (the ranks that hold the same shard of a bucket after the node's reduce-scatter).

torchrun (and ``python -m sparsecomm.launch --nnodes n --nproc-per-node L``) sets
``LOCAL_WORLD_SIZE``, ``LOCAL_RANK`` and ``GROUP_RANK`` (``NODE_RANK`` on some launchers):
:meth:`Topology.from_env` reads them. Nodes of unequal size are refused: every shard of a
two-level reduction needs one owner on every node.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

import torch

from .base import Comm, abort_together
from .collectives import direct_allgather_slices_, direct_reduce_scatter_into_
from .shared_memory import NodeSharedMemory

__all__ = ["Topology", "NodeComms"]

#: what a rank in :meth:`Topology.split` waits in, as a reorder error names it: a rank that builds
#: a flat reducer meets it there when its peers build two-level ones
SPLIT_LABEL = ("the node split of a two-level reducer or hook (hierarchy='node' or 'auto'; every rank must "
               "use the same hierarchy)")


def _env_int(env: Mapping[str, str], *names: str) -> tuple[int | None, str]:
    """The first of ``names`` that is set (non-empty), as an int, and its name."""
    for name in names:
        text = env.get(name)
        if text not in (None, ""):
            try:
                return int(text), name
            except ValueError:
                raise ValueError(f"Topology.from_env: {name}={text!r} is not an integer") from None
    return None, names[0]


def _env_check(ok: bool, what: str) -> None:
    if not ok:
        raise ValueError(f"Topology.from_env: {what}: the launcher's variables do not describe one rank of "
                         "equal nodes; pass Topology(nodes=..., ranks_per_node=...) instead")


@dataclass(frozen=True)
class Topology:
    """``nodes`` nodes of ``ranks_per_node`` ranks each; this rank is local rank ``local_rank``
    of node ``node``. Left out (None), ``node`` and ``local_rank`` follow torchrun's layout from
    the rank: ``node = rank // ranks_per_node``, ``local_rank = rank % ranks_per_node``.

    ``Topology(nodes=P, ranks_per_node=1)`` is the flat case (every rank its own node)."""

    nodes: int
    ranks_per_node: int
    node: int | None = None
    local_rank: int | None = None

    def __post_init__(self) -> None:
        for name in ("nodes", "ranks_per_node"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"Topology: {name} must be an integer >= 1, got {value!r}")
        if (self.node is None) != (self.local_rank is None):
            raise ValueError("Topology: give both node and local_rank, or neither (then both follow "
                             "torchrun's layout from the rank)")
        if self.node is not None:
            if not (isinstance(self.node, int) and 0 <= self.node < self.nodes):
                raise ValueError(f"Topology: node must be in [0, {self.nodes}), got {self.node!r}")
            if not (isinstance(self.local_rank, int) and 0 <= self.local_rank < self.ranks_per_node):
                raise ValueError(f"Topology: local_rank must be in [0, {self.ranks_per_node}), "
                                 f"got {self.local_rank!r}")

    @property
    def size(self) -> int:
        """Ranks in all: ``nodes * ranks_per_node``."""
        return self.nodes * self.ranks_per_node

    def __str__(self) -> str:
        return f"{self.nodes} nodes x {self.ranks_per_node} ranks"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "Topology":
        """The topology torchrun describes in the environment: ``WORLD_SIZE``,
        ``LOCAL_WORLD_SIZE``, ``LOCAL_RANK`` and ``GROUP_RANK`` (or ``NODE_RANK``). A ValueError
        says which variable is missing or inconsistent."""
        env = os.environ if env is None else env
        world, _ = _env_int(env, "WORLD_SIZE")
        local_size, _ = _env_int(env, "LOCAL_WORLD_SIZE")
        if world is None or local_size is None:
            raise ValueError("Topology.from_env: WORLD_SIZE and LOCAL_WORLD_SIZE are not set (torchrun and "
                             "python -m sparsecomm.launch set them); pass Topology(nodes=..., ranks_per_node=...) "
                             "instead")
        _env_check(world >= 1, f"WORLD_SIZE={world} is not >= 1")
        _env_check(local_size >= 1, f"LOCAL_WORLD_SIZE={local_size} is not >= 1")
        if world % local_size:
            raise ValueError(f"Topology.from_env: WORLD_SIZE={world} is not a multiple of LOCAL_WORLD_SIZE="
                             f"{local_size}: nodes of unequal size cannot run a two-level reduction "
                             "(every shard needs an owner on every node); use hierarchy='flat'")
        nodes = world // local_size
        local, _ = _env_int(env, "LOCAL_RANK")
        node, node_name = _env_int(env, "GROUP_RANK", "NODE_RANK")
        if local is None or node is None:
            rank, _ = _env_int(env, "RANK")
            if rank is None:
                raise ValueError("Topology.from_env: neither LOCAL_RANK and GROUP_RANK (or NODE_RANK) nor RANK "
                                 "is set")
            _env_check(0 <= rank < world, f"RANK={rank} is not in [0, WORLD_SIZE={world})")
            node, local = divmod(rank, local_size)
        else:
            _env_check(0 <= local < local_size, f"LOCAL_RANK={local} is not in [0, LOCAL_WORLD_SIZE={local_size})")
            _env_check(0 <= node < nodes, f"{node_name}={node} is not in [0, {nodes}) (WORLD_SIZE={world} / "
                                          f"LOCAL_WORLD_SIZE={local_size} nodes)")
        return cls(nodes, local_size, node, local)

    def place(self, rank: int) -> tuple[int, int]:
        """(node, local rank) of ``rank``: the given ones, else torchrun's layout."""
        if self.node is not None:
            return self.node, self.local_rank
        return divmod(rank, self.ranks_per_node)

    def split(self, comm: Comm) -> "NodeComms":
        """Check the topology against every rank's and build the intra- and inter-node Comms.

        Collective over ``comm`` (one all-gather of four integers, then the two splits): every
        rank calls it at the same point. Raises the same ValueError on every rank when the
        ranks' topologies differ, when ``nodes * ranks_per_node`` is not ``comm.size``, or when
        two ranks claim the same place."""
        mine = torch.tensor([self.nodes, self.ranks_per_node, *self.place(comm.rank)], dtype=torch.int64)
        with comm.outside_calls(SPLIT_LABEL):
            every = comm.allgather_small(mine).tolist()
        check_placements(every, comm.size)
        intra, inter = groups_of(every)
        node, local = self.place(comm.rank)
        placed = Topology(self.nodes, self.ranks_per_node, node, local)
        intra_comm = comm.split(intra, local=True) if self.ranks_per_node > 1 else None
        inter_comm = comm.split(inter) if self.nodes > 1 else None
        # ranks of separate processes on one host: the node's dense steps through shared memory
        shared = NodeSharedMemory.open(intra_comm) if intra_comm is not None and not intra_comm.in_one_process \
            else None
        return NodeComms(placed, comm, intra_comm, inter_comm, shared)


def check_placements(every: list[list[int]], size: int) -> None:
    """A ValueError (the same text on every rank, from the gathered values) unless every rank
    gave the same nodes and ranks per node, their product is ``size``, and the (node, local
    rank) places are distinct."""
    shapes = {(n, per) for n, per, _, _ in every}
    if len(shapes) > 1:
        said = "; ".join(f"rank {r} says {n} nodes x {per}" for r, (n, per, _, _) in enumerate(every))
        raise ValueError(f"the ranks disagree on the topology ({said}): give every rank the same Topology, "
                         "or launch every node with the same --nproc-per-node (nodes of unequal size "
                         "cannot run a two-level reduction; use hierarchy='flat')")
    nodes, per = shapes.pop()
    if nodes * per != size:
        raise ValueError(f"the topology {nodes} nodes x {per} ranks has {nodes * per} ranks but the group has "
                         f"{size}: nodes of unequal size cannot run a two-level reduction; use hierarchy='flat' "
                         "or a Topology that matches the job")
    owners: dict[tuple[int, int], int] = {}
    for rank, (_, _, node, local) in enumerate(every):
        if (node, local) in owners:
            raise ValueError(f"ranks {owners[(node, local)]} and {rank} both say they are local rank {local} "
                             f"of node {node}: check LOCAL_RANK and GROUP_RANK (or the Topology given)")
        owners[(node, local)] = rank


def groups_of(every: list[list[int]]) -> tuple[list[list[int]], list[list[int]]]:
    """(intra-node groups: one per node, by local rank; inter-node groups: one per local rank,
    by node) as ranks of the Comm the placements were gathered on."""
    nodes, per = every[0][0], every[0][1]
    where = {(node, local): rank for rank, (_, _, node, local) in enumerate(every)}
    intra = [[where[(node, local)] for local in range(per)] for node in range(nodes)]
    inter = [[where[(node, local)] for node in range(nodes)] for local in range(per)]
    return intra, inter


@dataclass
class NodeComms:
    """The Comms of a two-level reduction on one rank: ``world`` (every rank: agreement and the
    dense path of non-finite gradients), ``intra`` (this node's L ranks; None when L = 1) and
    ``inter`` (the n ranks of this local rank, one per node; None when n = 1). Made once by
    :meth:`Topology.split` and shared by every reducer of a job."""

    topology: Topology
    world: Comm
    intra: Comm | None
    inter: Comm | None
    #: the node's segment when its ranks share a host (sparsecomm/comm/shared_memory.py), else None
    shared: NodeSharedMemory | None = None

    def reduce_scatter_into_(self, tensor: torch.Tensor, n: int, acc: torch.Tensor, own: bool = True) -> None:
        """``acc +=`` the node's sum of this rank's slice (slice ``local_rank`` of
        :func:`~sparsecomm.comm.collectives.block_bounds`) of ``tensor``: the peers' slices in
        rank order, then its own (``own=False``: left to the caller, who adds it fused with the
        algorithm's first selection); through shared memory for CPU tensors when the node has
        it, else one round of messages."""
        if self.intra is None:
            if own:
                acc.add_(tensor)
        elif self.shared is not None and tensor.device.type == "cpu":
            self.shared.reduce_scatter_into_(tensor, acc, own)
        else:
            direct_reduce_scatter_into_(self.intra, tensor, n, acc, own)

    def reduce_scatter_fence(self, tensor: torch.Tensor) -> None:
        """Between two :meth:`reduce_scatter_into_` calls in a row: the shared segment's slots
        are reused, so the node waits until every rank has read the first's (nothing to wait
        for with messages: each round has its own)."""
        if self.intra is not None and self.shared is not None and tensor.device.type == "cpu":
            self.shared.fence()

    def allgather_(self, tensor: torch.Tensor, n: int) -> None:
        """Every node rank's slice of ``tensor`` to all of them, in place."""
        if self.intra is None:
            return
        if self.shared is not None and tensor.device.type == "cpu":
            self.shared.allgather_(tensor)
        else:
            direct_allgather_slices_(self.intra, tensor, n)

    @property
    def comms(self) -> list[Comm]:
        """The distinct Comms, world first."""
        return [c for c in (self.world, self.intra, self.inter) if c is not None]

    def abort(self, cause: str) -> None:
        """Abort every Comm as one: peers waiting on any of them raise at once, naming this rank
        (a store host waits for their readers once, :func:`~sparsecomm.comm.base.abort_together`)."""
        abort_together(self.comms, cause)

    def check_usable(self) -> None:
        for c in self.comms:
            c.check_usable()

    def close(self) -> None:
        """Close the intra- and inter-node Comms (``world`` is the caller's)."""
        for c in (self.intra, self.inter):
            close = getattr(c, "close", None)
            if close is not None:
                close()
