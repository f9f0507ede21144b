"""What the DDP and the FSDP2 hook states share: their configuration and its checks, the reducer
they build per bucket or module, the checks of a loaded state, the half-precision averaging
path, the owner check deferred until a Comm exists, and closing what they built.

:class:`HookConfig` is the base of :class:`~sparsecomm.hooks.ddp.DDPHookState` and
:class:`~sparsecomm.hooks.fsdp.FSDPHookState`; each keeps its own interface to its framework.
"""

from __future__ import annotations

import zlib
from typing import Any, ClassVar

import torch
import torch.distributed as dist

from .. import algorithms
from ..comm.base import Comm
from ..comm.topology import NodeComms
from ..errors import AgreedValueError
from ..reduce import SparseAllreduce, as_schedule, check_density, check_nonfinite
from ..reduce.checkpoint import check_owner, check_version, unpack_rank_part
from ..reduce.local_update import LocalUpdate, momentum_twice
from ..reduce.residual_store import check_residual_dtype
from .policy import DEFAULT, DENSE, ParameterInfo, Policy, Treatment, as_policy, parameter_infos

__all__ = ["HookConfig", "reduce_average", "dense_average", "dense_part_stats", "group_size"]

_HALF = (torch.float16, torch.bfloat16)


def group_size(process_group: Any) -> int | None:
    """The number of ranks of ``process_group`` (None: the default group), or None while unknown."""
    if not (dist.is_available() and dist.is_initialized()):
        return None
    size = dist.get_world_size(process_group)
    return size if size > 0 else None  # -1: this rank is not in the group


def reduce_average(reducer: SparseAllreduce, tensor: torch.Tensor, divisor: int | None, **call: Any) -> None:
    """``tensor`` (a bucket or shard) replaced in place by the reducer's sum over ranks divided by
    ``divisor`` (None: not divided). A float16 / bfloat16 tensor is summed in float32, divided,
    and rounded once to its dtype, so 2 ranks with an fp16 gradient of 40000 average to 40000
    (as DDP's own allreduce does), not to inf. ``call``: the reducer's keyword arguments (``step``)."""
    if tensor.dtype in _HALF:
        total = reducer(tensor, out=torch.empty(tensor.shape, dtype=torch.float32, device=tensor.device), **call)
        if divisor is not None:
            total.div_(divisor)
        tensor.copy_(total)
    else:
        reducer(tensor, out=tensor, **call)  # the reducer reads the gradient before writing the sum
        if divisor is not None:
            tensor.div_(divisor)


def dense_average(comm: Comm, tensor: torch.Tensor, divisor: int | None) -> None:
    """``tensor`` replaced in place by the backend's dense sum over ``comm`` divided by ``divisor``
    (None: not divided): a policy's dense part. Half tensors are summed in float32 and rounded
    once, as :func:`reduce_average` does."""
    work = tensor.to(torch.float32) if tensor.dtype in _HALF else tensor
    comm.allreduce_dense(work)
    if divisor is not None:
        work.div_(divisor)
    if work is not tensor:
        tensor.copy_(work)


def dense_part_stats(spent: Any, n: int) -> dict[str, Any]:
    """A policy's dense part's ``last_stats``: the Comm counters ``spent`` on its allreduce of ``n``
    elements, under the treatment "dense" (as the reducers' stats carry theirs)."""
    return {"algorithm": "dense", "treatment": "dense", "n": n, "bytes_sent": spent.bytes_sent,
            "bytes_recv": spent.bytes_recv, "rounds": spent.rounds, "comm_s": spent.comm_s}


class HookConfig:
    """The configuration and lifecycle both hook states share (module docstring)."""

    #: the state's class name, as its errors and checkpoints name it
    KIND: ClassVar[str]
    #: the keys of every local_state_dict() of the checkpoint version
    STATE_KEYS: ClassVar[tuple[str, ...]]
    #: the configuration a loaded state must share with this one
    LOAD_COMPARED: ClassVar[tuple[str, ...]] = ("algorithm", "density", "options")
    #: the torch.distributed group the state reduces over (None: the default group)
    process_group: Any = None

    def _configure(self, algorithm: str, density: float, nonfinite: str, density_schedule: Any,
                   options: dict[str, Any], comm: Comm | None, local_update: LocalUpdate = LocalUpdate(),
                   residual_dtype: Any = None, policy: Any = None) -> None:
        """Check and keep the algorithm, density, policy, schedule and options (the options
        now, by a comm-less instance: checks only; those that depend on the number of ranks
        later, by :meth:`_options_checked`'s ``check_size``), the local update (momentum
        correction, clipping: :mod:`sparsecomm.reduce.local_update`), the residual's form between
        calls (:mod:`sparsecomm.reduce.residual_store`), the per-parameter policy
        (:mod:`sparsecomm.hooks.policy`) and the Comm given, if any."""
        check_density(density)
        check_nonfinite(nonfinite)
        schedule = as_schedule(density_schedule)
        self._options_checked = algorithms.get(algorithm)(None, **options)
        self.algorithm = algorithm
        self.density = float(density)
        self.options = dict(options)
        self.nonfinite = nonfinite
        self.density_schedule = schedule
        self.local_update = local_update
        #: the residual's form between calls: None (float32), "bfloat16" or "int8"
        self.residual_dtype = check_residual_dtype(residual_dtype)
        #: which parameters go dense, or through another treatment (None: all through the algorithm)
        self.policy: Policy | None = as_policy(policy)
        #: treatment key -> its Treatment (the keys layout buckets carry: "" and "default" are the state's)
        self._treatments: dict[str, Treatment] = {}
        if self.policy is not None:
            for rule in self.policy.rules:
                if not isinstance(rule.treatment, Treatment):
                    continue
                if rule.treatment.density is not None and schedule is not None and schedule.kind == "adaptive":
                    raise ValueError(f"the policy's treatment {rule.treatment.text()!r} sets its own density, and the "
                                     "adaptive density schedule decides every density itself: drop one of them")
                self._configuration(rule.treatment)   # checked now: its options against its algorithm
                self._treatments[rule.treatment.text()] = rule.treatment
        #: id(parameter) -> its name and owning module's classes, from bind() (None: not bound)
        self._param_infos: dict[int, ParameterInfo] | None = None
        self._comm = comm
        self._owns_comm = comm is None  # a Comm this state builds is closed by close()
        self._nodes: NodeComms | None = None
        self._owns_nodes = True
        self._closed = False
        #: 0 while fresh; after load_state_dict the loaded save's fingerprint, handed to every
        #: reducer (SparseAllreduce.set_checkpoint_fingerprint), whose first handshake compares it across ranks
        self._checkpoint_id = 0
        #: (rank, world size, per rank) of a loaded state whose owner could not be checked at load
        #: time (no process group or Comm yet): checked when the Comm is built
        self._unchecked_owner: tuple[Any, Any, bool] | None = None

    # -- the per-parameter policy ---------------------------------------------------------------
    def policy_crc(self) -> int:
        """A checksum of the policy's canonical text ("none" without one), for the agreement."""
        return zlib.crc32((self.policy.text() if self.policy is not None else "none").encode())

    def check_same_policy(self, crcs: list[int]) -> None:
        """The same AgreedValueError on every rank unless every rank's :meth:`policy_crc` (all-gathered,
        in rank order) is this rank's: the split of the gradients, and every message after, depends on it."""
        if len(set(crcs)) > 1:
            groups: dict[int, list[int]] = {}
            for rank, crc in enumerate(crcs):
                groups.setdefault(crc, []).append(rank)
            mine = self.policy.text() if self.policy is not None else "none"
            raise AgreedValueError(f"the ranks' {self.KIND} policies differ ({' / '.join(f'ranks {r}' for r in groups.values())}"
                                   f"; this rank's: {mine}): build the state with the same policy on every rank")

    def bind(self, model: torch.nn.Module) -> None:
        """Learn ``model``'s parameter names and module types, which a policy's ``name=`` and
        ``module=`` rules match (``sparsecomm.register`` and ``sparsecomm.fsdp.register_hook`` call
        it). Local; call it before the first backward."""
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"bind(model): model must be a torch.nn.Module, got {type(model).__name__}")
        self._param_infos = parameter_infos(model)

    def treatment_key(self, param: torch.Tensor) -> str:
        """The policy's treatment of ``param`` as the key layout buckets carry: ``"dense"``,
        ``"default"`` or a :class:`Treatment`'s text. A ValueError when the policy matches by name or
        module and the model is unknown (registered without ``sparsecomm.register``)."""
        assert self.policy is not None
        info = None if self._param_infos is None else self._param_infos.get(id(param))
        if info is None:
            if self.policy.needs_model:
                raise ValueError(f"sparsecomm: this {self.KIND}'s policy matches parameters by name or module type, "
                                 "and the hook does not know the model: register with sparsecomm.register(model, "
                                 "state) (DDP) or sparsecomm.fsdp.register_hook (FSDP2), or call state.bind(model) "
                                 "before the first backward")
            info = ParameterInfo(param.numel(), param.dim())
        treatment = self.policy.treatment(info)
        return treatment.text() if isinstance(treatment, Treatment) else treatment

    def _configuration(self, treatment: "Treatment | None") -> tuple[str, float, dict[str, Any]]:
        """(algorithm, density, options) of a treatment: its own where it sets them, the state's
        elsewhere (its options on top of the state's when it keeps the state's algorithm)."""
        if treatment is None:
            return self.algorithm, self.density, dict(self.options)
        algorithm = treatment.algorithm or self.algorithm
        options = dict(treatment.options) if treatment.algorithm else {**self.options, **dict(treatment.options)}
        if treatment.algorithm is None and treatment.options:
            algorithms.get(algorithm)(None, **options)
        return algorithm, self.density if treatment.density is None else treatment.density, options

    def configuration_of(self, key: str) -> tuple[str, float, dict[str, Any]]:
        """(algorithm, density, options) of a layout bucket's treatment key ("" or "default": the
        state's; "dense": the dense algorithm, which a dense part runs when it keeps a local update,
        see :meth:`dense_needs_reducer`)."""
        if key in ("", DEFAULT):
            return self._configuration(None)
        if key == DENSE:
            return "dense", 1.0, {}
        if key not in self._treatments:
            raise ValueError(f"sparsecomm: a layout bucket has treatment {key!r}, which this {self.KIND}'s policy "
                             "does not have: build the state with the policy its checkpoint was saved with")
        return self._configuration(self._treatments[key])

    @property
    def dense_needs_reducer(self) -> bool:
        """Whether a policy's dense part goes through a reducer of the dense algorithm rather than
        the backend's allreduce alone: with momentum correction (the optimizer runs without
        momentum, so the dense part needs its velocity too; without masking, which at density 1
        would clear it every step), local clipping, or ``nonfinite="raise"`` (the reducer's check)."""
        return self.local_update.active or self.nonfinite == "raise"

    def _new_reducer(self, comm: Comm, treatment: str = "", **placement: Any) -> SparseAllreduce:
        """A reducer of this configuration (``treatment``: a policy's treatment key) on ``comm``
        (``placement``: hierarchy and nodes), continuing from the loaded save (its first
        handshake compares the fingerprint)."""
        algorithm, density, options = self.configuration_of(treatment)
        update = self.local_update.to_state()
        if treatment == DENSE:   # every coordinate is sent each step: masking would clear the velocity
            update["momentum_masking"] = False
        reducer = SparseAllreduce(algorithm, density, comm=comm, nonfinite=self.nonfinite,
                                  density_schedule=self.density_schedule, **placement,
                                  residual_dtype=self.residual_dtype, **update, **options)
        reducer.set_checkpoint_fingerprint(self._checkpoint_id)
        return reducer

    def momentum_clash(self, optimizers: Any) -> str | None:
        """What is wrong when this state's momentum correction meets ``optimizers`` that have
        momentum of their own (or are Adam-like); None when nothing is. The integrations, which
        see the optimizers, warn with it."""
        return momentum_twice(self.local_update, optimizers)

    def _local_update_state(self) -> dict[str, Any]:
        """The local update's entry of a state_dict: none when it is off (such a state keeps the
        keys and fingerprint it always had)."""
        state = {"local_update": self.local_update.to_state()} if self.local_update.active else {}
        if self.residual_dtype is not None:   # float32 keeps the keys and fingerprint it always had
            state["residual_dtype"] = self.residual_dtype
        if self.policy is not None:
            state["policy"] = self.policy.to_state()
        return state

    def _rank_and_size(self) -> tuple[int | None, int | None]:
        """This state's rank and world size: its world Comm's, else the process group's, else unknown."""
        comm = self._nodes.world if self._nodes is not None else self._comm
        if comm is not None:
            return comm.rank, comm.size
        size = group_size(self.process_group)
        return (None, None) if size is None else (dist.get_rank(self.process_group), size)

    def _checked_load(self, state: Any) -> dict[str, Any]:
        """This rank's part of a loaded state (packed by ``state_dict()`` or plain), checked:
        its checkpoint version, every key, and the configuration it was saved with. A
        ValueError saying what to do otherwise."""
        if isinstance(state, dict) and state.get("sparsecomm") == self.KIND:
            state = unpack_rank_part(self.KIND, state, *self._rank_and_size())
        check_version(state, self.KIND)
        # every state of this checkpoint version has every key; one without them is no state_dict()
        missing = [key for key in self.STATE_KEYS if key not in state]
        if missing:
            raise ValueError(f"this {self.KIND} state_dict lacks the keys {missing}: load what state_dict() or "
                             "local_state_dict() returned")
        for key in self.LOAD_COMPARED:
            if state[key] != getattr(self, key):
                raise ValueError(f"state_dict has {key}={state[key]!r}, this {self.KIND} has "
                                 f"{getattr(self, key)!r}: build the state with the checkpoint's configuration")
        saved_update = LocalUpdate.from_state(state.get("local_update"))
        if saved_update != self.local_update:
            raise ValueError(f"state_dict has local update {saved_update.options() or 'none'}, this {self.KIND} has "
                             f"{self.local_update.options() or 'none'} (momentum, nesterov, momentum_masking, "
                             "clip_norm): build the state with the checkpoint's configuration")
        if state.get("residual_dtype") != self.residual_dtype:
            raise ValueError(f"state_dict has residual_dtype={state.get('residual_dtype') or 'float32'!r}, this "
                             f"{self.KIND} has {self.residual_dtype or 'float32'!r}: build the state with the "
                             "checkpoint's residual_dtype")
        saved_policy = as_policy(state.get("policy"))
        if saved_policy != self.policy:
            raise ValueError(f"state_dict has policy {saved_policy.text() if saved_policy else 'none'}, this "
                             f"{self.KIND} has {self.policy.text() if self.policy else 'none'}: build the state with "
                             "the checkpoint's policy")
        saved_schedule = as_schedule(state["density_schedule"])
        if saved_schedule != self.density_schedule:
            raise ValueError(f"state_dict has density_schedule={saved_schedule!r}, this {self.KIND} has "
                             f"{self.density_schedule!r}: build the state with the checkpoint's schedule")
        return state

    def _check_owner(self, state: dict[str, Any], per_rank: bool) -> None:
        """Refuse another rank's or world size's state now, or, without a Comm or process group
        yet, remember it for :meth:`_check_deferred_owner`."""
        rank, size = self._rank_and_size()
        check_owner(self.KIND, state.get("rank"), state.get("world_size"), rank, size, per_rank)
        self._unchecked_owner = (state.get("rank"), state.get("world_size"), per_rank) if rank is None else None

    def _check_deferred_owner(self, rank: int, size: int) -> None:
        """The owner check a load made before any Comm existed, against the Comm now built."""
        if self._unchecked_owner is not None:
            saved_rank, saved_size, per_rank = self._unchecked_owner
            self._unchecked_owner = None
            check_owner(self.KIND, saved_rank, saved_size, rank, size, per_rank)

    def _close_comms(self) -> None:
        """Close the two-level Comms and the world Comm this state built (one passed in is the
        caller's); later use raises ValueError."""
        self._closed = True
        if self._nodes is not None and self._owns_nodes:
            self._nodes.close()
        if self._owns_comm and self._comm is not None and hasattr(self._comm, "close"):
            self._comm.close()
