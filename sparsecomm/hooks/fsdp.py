"""FSDP2 (``torch.distributed.fsdp.fully_shard``) with a sparse allreduce between nodes.

FSDP2 has no communication hook, but ``FSDPModule.set_all_reduce_hook`` runs a function on each
rank's reduce-scatter output, in place, before FSDP turns it into the sharded gradients. Sharding
each module over the L ranks of one node (a 1-D mesh: :func:`node_mesh`) and registering this
hook gives the two-level reduction of hybrid sharding (HSDP) with the inter-node step sparse:

1. FSDP reduce-scatters the gradients inside the node (dense, fast links): rank ``(node, l)``
   holds the node's average of shard ``l``;
2. the hook runs one :class:`~sparsecomm.SparseAllreduce` per FSDP module (flat algorithm, error
   feedback) over the n ranks that hold shard ``l``, one per node (``NodeComms.inter``), and
   divides the sum by n. The residual of a shard stays on the rank that owns the shard.

Usage (every rank, the same calls in the same order)::

    topology = sparsecomm.Topology.from_env()            # or Topology(nodes, ranks_per_node)
    mesh = sparsecomm.fsdp.node_mesh(topology)            # 1-D: this node's L ranks
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    state = sparsecomm.FSDPHookState("topka", 0.01, nodes=topology)
    sparsecomm.fsdp.register_hook(model, state)           # collective: builds the Comms

Averaging. FSDP leaves the hook the reduce-scatter output already divided as 1-D FSDP over L
ranks divides it (``ReduceOp.AVG`` for float32/bfloat16, ``sum / pre_factor`` for float16, or
the user's ``set_gradient_divide_factor``) and divides what the hook returns by its
post-factor. Native HSDP sums over the n replicas on top of the same division (AVG again without
a custom factor; with a custom factor, a plain sum). The hook does the same: the sum over nodes,
divided by n unless the FSDP module has a gradient divide factor. ``dense`` through the hook
is then what native HSDP computes (bit-identical for float32 on gloo at n = 2 and 3 nodes,
tests/test_fsdp.py; another backend's sum order may differ in the last bit for n > 2). A
bfloat16/float16 shard is reduced in float32 and rounded once, after the division (as the DDP
hook does), where HSDP rounds the sum first.

Non-finite gradients: ``nonfinite="propagate"`` (default) hands every rank of the shard's
inter-node group the dense average of the raw values where any rank's shard holds NaN or Inf
(SparseAllreduce's policy), so ``torch.amp.GradScaler`` sees the overflow where dense HSDP
would put it and no residual changes. ``nonfinite="raise"`` raises the same ValueError on every
rank of the job: the shards of a node are checked by different inter-node groups, so the hook
first all-gathers each rank's non-finite flag over all ranks (one small round per hooked
module and step, only under "raise"), which lets the ranks whose own shard is finite raise too
instead of waiting in FSDP's next reduce-scatter for ranks that left.

Failing together: a rank that fails inside the hook aborts the world, intra- and inter-node
Comms before the exception propagates, so peers waiting on any of them raise at once naming
it. Peers blocked in FSDP's own collectives (its reduce-scatter or all-gather over the node)
learn it from their backend when the failed process exits (gloo: at once, the connection
closes; NCCL: its watchdog, or the launcher stopping the job).

Checkpoint and exact resume: :meth:`FSDPHookState.state_dict` holds every hooked module's
reducer state (residual of this rank's shard, algorithm state, calls made), under the module's
name, and whose it is (``rank``, ``world_size``, ``fingerprint``: :mod:`sparsecomm.reduce.checkpoint`).
Saved per rank next to the model's and optimizer's sharded state, loaded with
:meth:`~FSDPHookState.load_state_dict` (before or after :func:`register_hook`) in fresh
processes, training continues bit-identically to the uninterrupted run. Ranks resumed from
different saves (or some fresh) raise the same ValueError at the first hooked module.

Not supported, refused with a ValueError saying what to do: a module sharded on a 2-D mesh
(native HSDP all-reduces across replicas itself: shard on the node's 1-D mesh instead), a mesh
that is not this rank's node as the Topology places it, ``replicate()`` modules, several
parameter groups per module (``shard_placement_fn`` with several meshes), and reduce dtypes
(``MixedPrecisionPolicy.reduce_dtype``) other than float32, bfloat16 and float16.
``reshard_after_forward`` changes only when FSDP all-gathers parameters, not the gradient
reduction the hook sits in. Gradient accumulation: ``set_requires_gradient_sync(False)`` skips
the reduce-scatter and therefore the hook (the next synced step reduces the accumulated
gradient); ``set_requires_all_reduce(False)`` has no effect on a 1-D mesh: the hook still runs.

CUDA: FSDP calls the hook with its all-reduce stream current, after making that stream wait
for the reduce-scatter, and runs its post-division and gradient views on the same stream after
the hook returns. The reducer queues its kernels on the current stream and blocks the host
until its messages are through, so no stream argument is passed to ``set_all_reduce_hook``:
FSDP's own stream already orders the hook between the reduce-scatter and the optimizer.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist

from ..comm.base import Comm, abort_together
from ..comm.topology import NodeComms, Topology, check_placements, groups_of
from ..errors import AgreedValueError
from ..reduce.local_update import LocalUpdate
from ..reduce import CHECKPOINT_VERSION, DensitySchedule, SparseAllreduce, nonfinite_error, nonfinite_flag
from ..reduce.checkpoint import fingerprint, loaded_fingerprint, pack_rank_part
from .config import HookConfig, dense_average, dense_part_stats, reduce_average

__all__ = ["FSDPHookState", "register_hook", "node_mesh", "two_level_mesh", "REDUCE_DTYPES"]

#: the reduce-scatter output dtypes the hook reduces (FSDP's MixedPrecisionPolicy.reduce_dtype)
REDUCE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _placements(topology: Topology, device: torch.device) -> list[list[int]]:
    """Every rank's (nodes, ranks per node, node, local rank), gathered over the default group
    (also with torchrun's layout: ranks that disagree on the topology must not build different
    meshes)."""
    rank, size = dist.get_rank(), dist.get_world_size()
    mine = torch.tensor([topology.nodes, topology.ranks_per_node, *topology.place(rank)], dtype=torch.int64,
                        device=device)
    every = [torch.empty_like(mine) for _ in range(size)]
    dist.all_gather(every, mine)
    return [t.tolist() for t in every]


def two_level_mesh(topology: Topology | None = None, device_type: str = "cpu"):
    """The 2-D DeviceMesh ``(replicate = nodes, shard = ranks of a node)`` of ``topology``
    (default: :meth:`Topology.from_env`), ranks placed as the topology places them. Collective
    over the default process group. Its ``["shard"]`` sub-mesh is :func:`node_mesh`; the mesh
    itself is what native HSDP (``fully_shard(mesh=...)``) takes."""
    from torch.distributed.device_mesh import DeviceMesh

    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError("node_mesh/two_level_mesh: torch.distributed is not initialized; call "
                         "init_process_group first")
    topology = Topology.from_env() if topology is None else topology
    if not isinstance(topology, Topology):
        raise ValueError(f"node_mesh/two_level_mesh: topology must be a sparsecomm.Topology, got "
                         f"{type(topology).__name__}")
    device = torch.device(device_type, torch.cuda.current_device()) if device_type == "cuda" else torch.device("cpu")
    every = _placements(topology, device)
    check_placements(every, dist.get_world_size())
    intra, _ = groups_of(every)
    return DeviceMesh(device_type, torch.tensor(intra, dtype=torch.int), mesh_dim_names=("replicate", "shard"))


def node_mesh(topology: Topology | None = None, device_type: str = "cpu"):
    """The 1-D DeviceMesh of this rank's node (its L ranks, by local rank): the mesh to pass to
    ``fully_shard`` before :func:`register_hook`. Collective over the default process group."""
    return two_level_mesh(topology, device_type)["shard"]


def _param_groups(module) -> list:
    """The FSDP parameter groups of ``module`` (torch's FSDPParamGroup objects): a list in torch
    2.13, a single group or None in older releases (2.11)."""
    state = module._get_fsdp_state()
    groups = getattr(state, "_fsdp_param_groups", None)
    if groups is not None:
        return list(groups)
    group = getattr(state, "_fsdp_param_group", None)
    return [] if group is None else [group]


class FSDPHookState(HookConfig):
    """Configuration and per-shard state of the FSDP2 all-reduce hook (:func:`register_hook`).

    Args:
        algorithm: a name from :func:`sparsecomm.algorithms.names` (run flat between nodes).
        density: fraction of a shard's elements each rank selects, in (0, 1].
        nodes: the cluster's shape, a :class:`~sparsecomm.Topology` (default:
            :meth:`Topology.from_env`), or :class:`~sparsecomm.NodeComms` already split from
            ``comm`` (not ``topology``: that is skcompress's option).
        nonfinite: ``"propagate"`` (default) or ``"raise"`` (see the module docstring).
        comm: the world :class:`~sparsecomm.comm.Comm` (every rank, numbered as torch's default
            group); default: a TorchComm over the default process group, built by register_hook.
        density_schedule: a :class:`~sparsecomm.DensitySchedule`, counted in each module's
            reductions (optimizer steps that synced gradients).
        momentum, nesterov, momentum_masking, clip_norm: momentum correction, momentum factor
            masking and local gradient clipping on each shard (Deep Gradient Compression, sections
            3.2-3.3; :class:`~sparsecomm.SparseAllreduce`): with ``momentum=0.9`` the optimizer must
            run *without* momentum. ``clip_norm`` bounds the sum over the ranks that reduce a shard,
            not their average (:mod:`sparsecomm.reduce.local_update`). Off by default.
        residual_dtype: each shard's residual between steps: None (float32), ``torch.bfloat16`` or
            ``"int8"`` (:class:`~sparsecomm.DDPHookState`, :mod:`sparsecomm.reduce.residual_store`).
        policy: which parameters go dense or through another treatment (:mod:`sparsecomm.hooks.policy`,
            as for :class:`~sparsecomm.DDPHookState`, matched on the parameters' global shapes): each
            module's shard is reduced in one call per treatment, the reducers of a treatment other than
            the state's kept as ``"<module>#<treatment>"``. Needs every parameter of a module to have
            a gradient at every step (FSDP leaves those without one out of its reduce-scatter).
        **options: options of the algorithm, validated here.
    """

    KIND = "FSDPHookState"
    STATE_KEYS = ("checkpoint_version", "algorithm", "density", "options", "nonfinite", "density_schedule",
                  "topology", "rank", "world_size", "fingerprint", "reducers")
    LOAD_COMPARED = ("algorithm", "density", "options", "nonfinite")

    def __init__(self, algorithm: str, density: float, nodes: Topology | NodeComms | None = None,
                 nonfinite: str = "propagate", comm: Comm | None = None,
                 density_schedule: DensitySchedule | None = None, momentum: float = 0.0, nesterov: bool = False,
                 momentum_masking: bool = False, clip_norm: float | None = None, residual_dtype: Any = None,
                 policy: Any = None, **options: Any):
        local_update = LocalUpdate(momentum, nesterov, momentum_masking, clip_norm)
        if nodes is not None and not isinstance(nodes, (Topology, NodeComms)):
            raise ValueError(f"nodes must be a sparsecomm.Topology or NodeComms, got {type(nodes).__name__}")
        self._configure(algorithm, density, nonfinite, density_schedule, options, comm, local_update, residual_dtype,
                        policy)
        #: under a policy, per hooked module: its shard's parts, [(treatment, [(offset, numel)])]
        self._parts: dict[str, list[tuple[str, list[tuple[int, int]]]]] = {}
        self._dense_scope = None   # the inter-node Comm's scope of the policy's dense parts
        self.topology = nodes
        self._owns_nodes = not isinstance(nodes, NodeComms)
        self._scope = None                       # the world Comm's scope of the hook's agreements
        self._reducers: dict[str, SparseAllreduce] = {}
        self._pending: dict[str, dict[str, Any]] = {}  # module name -> loaded reducer state
        #: compare the save each rank continues from (0: fresh) over every rank at the first hooked
        #: call after register_hook: every rank makes that call, whether it loaded a state or not
        self._agree_checkpoint = False
        self._attached = False
        self.last_stats: dict[str, dict[str, Any]] = {}

    # -- plumbing ------------------------------------------------------------------------
    @property
    def nodes(self) -> NodeComms | None:
        """The world, intra- and inter-node Comms (None until :func:`register_hook`)."""
        return self._nodes

    def _split(self) -> NodeComms:
        if self._nodes is None:
            if isinstance(self.topology, NodeComms):
                if self._comm is not None and self.topology.world is not self._comm:
                    raise ValueError("the NodeComms given as nodes were split from another Comm than comm")
                self._nodes = self.topology
            else:
                if self._comm is None:
                    from ..comm.torch_comm import TorchComm
                    self._comm = TorchComm()
                topology = Topology.from_env() if self.topology is None else self.topology
                self._nodes = topology.split(self._comm)
            self._scope = self._nodes.world.new_scope("FSDP hook agreement")
        return self._nodes

    def _apply_pending(self) -> None:
        """Hand the loaded per-module states to their reducers (registered modules only)."""
        unknown = sorted(set(self._pending) - set(self._reducers))
        if unknown:
            raise ValueError(f"the loaded FSDPHookState has states for the modules {unknown}, which this model's "
                             f"hooked modules {sorted(self._reducers)} lack: load the checkpoint into the model "
                             "it was saved from (the same fully_shard calls)")
        for name, saved in self._pending.items():
            self._reducers[name].load_state_dict(saved)
        for reducer in self._reducers.values():
            reducer.set_checkpoint_fingerprint(self._checkpoint_id)
        self._pending = {}

    def _abort(self, cause: str) -> None:
        """Abort every Comm of the state as one, the inter-node one first: the ranks of this
        shard wait in it right now (a store host waits for the readers once for all three)."""
        if self._nodes is not None:
            abort_together([self._nodes.inter, self._nodes.intra, self._nodes.world], cause)

    # -- registration -------------------------------------------------------------------
    def _attach(self, module) -> None:
        from torch.distributed.fsdp import FSDPModule

        if self._closed:
            raise ValueError("sparsecomm: this FSDPHookState was closed; build a new one on every rank")
        if self._attached:
            raise ValueError("this FSDPHookState is registered on a model already: build one state per model")
        if not isinstance(module, FSDPModule):
            raise ValueError(f"register_hook needs a module that fully_shard was applied to, got "
                             f"{type(module).__name__}: call fully_shard(module, mesh=sparsecomm.fsdp.node_mesh"
                             "(topology)) on its blocks and on the module first")
        nodes = self._split()
        world = nodes.world
        if world.size != dist.get_world_size():
            raise ValueError(f"the world Comm has {world.size} ranks but the default process group has "
                             f"{dist.get_world_size()}: pass a comm over every rank, numbered as torch's default group")
        if nodes.inter is not None:
            self._options_checked.check_size(nodes.inter.size)
        # this rank's node as torch ranks, by local rank: the shard mesh FSDP must use
        topology = nodes.topology
        # with each rank's policy: the same error on every rank when they differ, before any message
        every = world.allgather_small(torch.tensor([topology.nodes, topology.ranks_per_node, topology.node,
                                                    topology.local_rank, self.policy_crc()],
                                                   dtype=torch.int64)).tolist()
        try:
            self.check_same_policy([row[4] for row in every])
            targets = self._targets(module, groups_of([row[:4] for row in every])[0][topology.node])
            self._check_deferred_owner(world.rank, world.size)
            if nodes.inter is None and any(s.get("residual") is not None for s in self._pending.values()):
                raise ValueError("the loaded FSDPHookState holds residuals, but this job has one node: resume with "
                                 "the topology it was saved with")
            self._attached = True
            if nodes.inter is None:  # one node: FSDP's reduce-scatter already is the whole reduction
                self._pending = {}
                return
            self._agree_checkpoint = True
            if self.policy is None:
                self._reducers = {label: self._new_reducer(nodes.inter) for label, _, _ in targets}
            else:
                self.bind(module)
                self._parts = {label: self._shard_parts(group, nodes.intra.size if nodes.intra else 1)
                               for label, _, group in targets}
                self._reducers = {_reducer_name(label, treatment): self._new_reducer(nodes.inter, treatment)
                                  for label, parts in self._parts.items()
                                  for treatment, _ in parts if treatment != "dense" or self.dense_needs_reducer}
                self._dense_scope = nodes.inter.new_scope("FSDP hook, a policy's dense part")
            self._apply_pending()
        except (ValueError, TypeError) as exc:
            # a rank whose model or state is refused here while its peers' are not: they would wait
            # for it at their first hooked call; the aborted Comms make them raise there, naming it
            self._abort(f"{type(exc).__name__}: {exc} (register_hook, before the hook sent anything)")
            raise
        for label, sub, group in targets:
            sub.set_all_reduce_hook(self._hook_for(label, group))

    def _targets(self, module, node_ranks: list[int]) -> list[tuple[str, Any, Any]]:
        """(name, FSDP module, its parameter group) of every FSDP module under ``module`` that holds
        parameters, each checked to be sharded as the hook needs: over ``node_ranks`` (this rank's
        node as torch ranks, by local rank), on a 1-D mesh, one parameter group."""
        from torch.distributed.fsdp import FSDPModule
        from torch.distributed.tensor import Shard

        topology = self._nodes.topology
        targets = []
        for name, sub in module.named_modules():
            if not isinstance(sub, FSDPModule):
                continue
            label = name or "<root>"
            groups = _param_groups(sub)
            if len(groups) > 1:
                raise ValueError(f"FSDP module {label!r} has {len(groups)} parameter groups (shard_placement_fn with "
                                 "several meshes); the hook reduces one shard per module: shard it on one mesh")
            if not groups:
                continue  # holds no parameters of its own: nothing reaches a hook
            group = groups[0]
            for fsdp_param in group.fsdp_params:
                param = fsdp_param.sharded_param
                mesh = param.device_mesh
                if mesh.ndim != 1:
                    raise ValueError(f"FSDP module {label!r} is sharded on a {mesh.ndim}-D mesh "
                                     f"{tuple(mesh.mesh.shape)}: that is native HSDP, which all-reduces across the "
                                     "replicas itself. Shard it on the node's 1-D mesh "
                                     "(fully_shard(module, mesh=sparsecomm.fsdp.node_mesh(topology))) for the "
                                     "sparse inter-node hook, or drop the hook")
                if not all(isinstance(p, Shard) for p in param.placements):
                    raise ValueError(f"FSDP module {label!r} has placements {param.placements} (replicate()?): the "
                                     "hook needs fully_shard's Shard placement over the node's mesh")
                if mesh.mesh.tolist() != node_ranks:
                    raise ValueError(f"FSDP module {label!r} is sharded over ranks {mesh.mesh.tolist()}, but this "
                                     f"rank's node ({topology}, node {topology.node}) is ranks {node_ranks}: shard "
                                     "on sparsecomm.fsdp.node_mesh(topology) built from the same Topology")
            targets.append((label, sub, group))
        return targets

    def _shard_parts(self, group, shards: int) -> list[tuple[str, list[tuple[int, int]]]]:
        """Where each parameter of ``group`` lies in the module's reduce-scatter output -- FSDP2
        concatenates, in ``fsdp_params`` order, each parameter's shard of its gradient padded on
        dim 0 to a multiple of the ``shards`` ranks -- grouped by the policy's treatment of the
        parameter (in the order treatments first appear)."""
        parts: dict[str, list[tuple[int, int]]] = {}
        offset = 0
        for fsdp_param in group.fsdp_params:
            param = fsdp_param.sharded_param
            if not param.requires_grad:   # never has a gradient: not in the reduce-scatter
                continue
            size = tuple(param.size())   # the global shape (a DTensor)
            dim = getattr(param.placements[0], "dim", 0)
            if dim == 0:   # padded on dim 0 to a multiple of the shards
                rows = -(-size[0] // shards) * shards if size else 1
                numel = rows * math.prod(size[1:]) // shards
            else:          # Shard(dim > 0): FSDP requires even sharding, no padding
                numel = math.prod(size) // shards
            parts.setdefault(self.treatment_key(param), []).append((offset, numel))
            offset += numel
        return list(parts.items())

    def _hook_for(self, label: str, group):
        def hook(output: torch.Tensor) -> None:
            self._reduce(label, group, output)
        return hook

    # -- one shard ------------------------------------------------------------------------
    def _agree_world(self, output: torch.Tensor) -> None:
        """Over every rank, at once: the loaded save (after a load) and, under ``"raise"``, the
        non-finite flags; the same AgreedValueError on every rank when they differ or any is set."""
        world = self._nodes.world
        check = self._agree_checkpoint
        if not check and self.nonfinite != "raise":
            return
        flag = nonfinite_flag(output) if self.nonfinite == "raise" else 0
        with world.call_scope(self._scope):
            every = world.allgather_small(torch.tensor([self._checkpoint_id, flag], dtype=torch.int64)).tolist()
        self._agree_checkpoint = False
        marks = [mark for mark, _ in every]
        if len(set(marks)) > 1:
            groups: dict[int, list[int]] = {}
            for rank, mark in enumerate(marks):
                groups.setdefault(mark, []).append(rank)
            said = "; ".join(f"ranks {ranks}: {'fresh' if mark == 0 else f'save {mark:#x}'}"
                             for mark, ranks in groups.items())
            raise AgreedValueError(f"the ranks resumed the FSDP hook from different checkpoints ({said}): load every "
                                   "rank's own state_dict of one save on every rank, or none anywhere")
        flags = [f for _, f in every]
        if any(flags):
            raise nonfinite_error(flags, output.numel(), self.algorithm)

    def _reduce(self, label: str, group, output: torch.Tensor) -> None:
        """Sparse allreduce of ``output`` (this rank's reduce-scatter output of module ``label``)
        over the inter-node group, in place, averaged as native HSDP averages."""
        try:
            if output.dtype not in REDUCE_DTYPES:
                raise ValueError(f"FSDP module {label!r} reduces gradients in {output.dtype}; the sparse hook reduces "
                                 "float32, bfloat16 and float16: set MixedPrecisionPolicy(reduce_dtype=torch.float32)")
            self._agree_world(output)
            # divided by the nodes as native HSDP divides, unless the module has its own factor
            divide = getattr(group, "gradient_divide_factor", None) is None
            divisor = self._nodes.inter.size if divide else None
            if self.policy is not None:
                self._reduce_parts(label, output, divisor)
                return
            reducer = self._reducers[label]
            reduce_average(reducer, output, divisor)
            self.last_stats[label] = reducer.last_stats
        except AgreedValueError:
            raise  # every rank raises it together; nothing is in flight
        except BaseException as exc:
            self._abort(f"{type(exc).__name__}: {exc} (FSDP all-reduce hook of module {label!r})")
            raise

    def _reduce_parts(self, label: str, output: torch.Tensor, divisor: int | None) -> None:
        """Under a policy: each treatment's part of the shard gathered (a view when it is one
        piece), reduced -- dense by the backend's allreduce, the others by their reducer -- and
        written back. The parts' order is the same on every rank (the policy and the module's
        parameters are)."""
        span = sum(n for _, pieces in self._parts[label] for _, n in pieces)
        if output.numel() != span:
            raise ValueError(f"FSDP module {label!r} reduced {output.numel()} elements on this rank where its "
                             f"parameters span {span}: some parameter that requires a gradient "
                             "had none this step (FSDP leaves it out of the reduce-scatter). The policy needs every "
                             "such parameter of a module to have one: use policy=None for this model, or make every "
                             "parameter take part in the loss (or set requires_grad=False on those that do not)")
        inter = self._nodes.inter
        for treatment, pieces in self._parts[label]:
            whole = len(pieces) == 1
            part = output[pieces[0][0]:pieces[0][0] + pieces[0][1]] if whole else \
                torch.cat([output[o:o + n] for o, n in pieces])
            if treatment == "dense" and not self.dense_needs_reducer:
                before = inter.stats.snapshot()
                with inter.call_scope(self._dense_scope):
                    dense_average(inter, part, divisor)
                self.last_stats[_reducer_name(label, "dense")] = dense_part_stats(inter.stats - before, part.numel())
            else:
                name = _reducer_name(label, treatment)
                reducer = self._reducers[name]
                reduce_average(reducer, part, divisor)
                self.last_stats[name] = {**reducer.last_stats, "treatment": treatment}
            if not whole:
                at = 0
                for o, n in pieces:
                    output[o:o + n].copy_(part[at:at + n])
                    at += n

    # -- checkpointing --------------------------------------------------------------------
    def local_state_dict(self) -> dict[str, Any]:
        """This rank's state as a plain dict: each hooked module's reducer state under the
        module's name (``reducers``), the configuration, and whose it is (``rank`` and
        ``world_size`` of the world, ``fingerprint`` equal on every rank of one save)."""
        reducers = {**self._pending, **{name: r.state_dict() for name, r in self._reducers.items()}}
        rank, size = self._rank_and_size()
        shape = None
        if self._nodes is not None:
            shape = [self._nodes.topology.nodes, self._nodes.topology.ranks_per_node]
        elif isinstance(self.topology, Topology):
            shape = [self.topology.nodes, self.topology.ranks_per_node]
        state = {"checkpoint_version": CHECKPOINT_VERSION, "algorithm": self.algorithm, "density": self.density,
                 "options": dict(self.options), "nonfinite": self.nonfinite,
                 "density_schedule": None if self.density_schedule is None else self.density_schedule.to_state(),
                 "topology": shape, "rank": rank, "world_size": size, **self._local_update_state()}
        calls = {name: int(s.get("calls", 0)) for name, s in sorted(reducers.items())}
        pristine = not any(calls.values()) and not any(s.get("residual") is not None for s in reducers.values())
        # equal on every rank: the calls are, the residuals' sizes are not (shards differ by local rank)
        state["fingerprint"] = 0 if pristine else fingerprint(
            "FSDPHookState", {key: state[key] for key in sorted(state) if key != "rank"}, calls)
        state["reducers"] = reducers
        return state

    def state_dict(self) -> dict[str, Any]:
        """The state to save, one per rank (``torch.save(state.state_dict(), f"hook_rank{rank}.pt")``,
        or under ``torch.distributed.checkpoint`` as a ``Stateful``): this rank's
        :meth:`local_state_dict` as bytes under the key ``rank<r>``, as the DDP hook's. Local."""
        return pack_rank_part("FSDPHookState", self.local_state_dict())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore this rank's :meth:`state_dict` (or :meth:`local_state_dict`) before or after
        :func:`register_hook`, before the first backward (the first hooked call compares every
        rank's save). Refused with a ValueError saying what
        to do: another rank's state, another world size or topology, another algorithm, density,
        options, non-finite policy or schedule, another checkpoint version."""
        state = self._checked_load(state)
        mine = self.local_state_dict()["topology"]
        if state["topology"] is not None and mine is not None and list(state["topology"]) != mine:
            raise ValueError(f"state_dict was saved with {state['topology'][0]} nodes x {state['topology'][1]} ranks, "
                             f"this job runs {mine[0]} x {mine[1]}: the residuals are per shard of a node and cannot "
                             "be re-split; resume with the same topology, or start the hook fresh")
        reducers = state["reducers"]
        if not isinstance(reducers, dict) or not all(isinstance(s, dict) for s in reducers.values()):
            raise ValueError("state_dict's reducers must map module names to SparseAllreduce state_dicts")
        mark = loaded_fingerprint(state)
        per_rank = any(s.get("residual") is not None or s.get("algorithm_state") for s in reducers.values())
        self._check_owner(state, per_rank)   # without a process group yet: by register_hook, on the world Comm
        self._checkpoint_id = mark
        self._pending = {str(name): dict(s) for name, s in reducers.items()}
        if self._reducers:
            try:
                self._apply_pending()
            except (ValueError, TypeError) as exc:
                self._abort(f"{type(exc).__name__}: {exc} (loading the FSDP hook's state, before it sent anything)")
                raise

    def close(self) -> None:
        """Close the intra- and inter-node Comms and the world Comm this state built. Idempotent."""
        self._close_comms()


def _reducer_name(label: str, treatment: str) -> str:
    """A module's reducer of a treatment: the module's name for the state's own algorithm (as
    without a policy), ``"<module>#<treatment>"`` for the others."""
    return label if treatment in ("", "default") else f"{label}#{treatment}"


def register_hook(module, state: FSDPHookState) -> None:
    """Register ``state``'s sparse inter-node allreduce on every FSDP module under ``module``
    (the root ``fully_shard`` was applied to). Collective over every rank (it builds the
    world, intra- and inter-node Comms and checks the meshes): call it on every rank, after
    ``fully_shard`` and before the first backward. With one node it registers nothing."""
    if not isinstance(state, FSDPHookState):
        raise ValueError(f"register_hook needs a sparsecomm.FSDPHookState, got {type(state).__name__}")
    state._attach(module)
