"""``SparseAllreduce``: error feedback, k from density, statistics; runs one algorithm.

Per call, on every rank r (the error-feedback invariant of docs/architecture.md, "Algorithms"):

1. ``acc = g_r + e_r`` -- the gradient plus the residual carried in (in the reducer's own
   buffer, so the steady state allocates nothing but the result),
2. the algorithm writes the reduced result ``out`` and leaves in ``acc`` what it did not
   let through, which becomes ``e'_r``; hence ``sum_r (g_r + e_r) == out + sum_r e'_r``.

float16 / bfloat16 gradients are reduced in float32 (residual, messages and sums), and
the result is rounded once to the gradient's dtype (or handed back in float32 when ``out``
is float32, so a caller can scale it before rounding, as the DDP hook does).

Non-finite gradients (NaN, +Inf, -Inf) follow one policy for every algorithm, the option
``nonfinite``. Before the algorithm runs, each rank checks its gradient in one read
(:func:`sparsecomm.ops.nonfinite_flags`: NaN, +Inf and -Inf told apart) and the ranks
all-gather its flag in the call's agreement record (below; ``allgather_small``, counted in
``last_stats`` as ``check_*``). If every rank is finite the algorithm runs; otherwise no
algorithm runs and no residual changes:

* ``"propagate"`` (the default): the result is the backend's dense allreduce of the raw
  gradients, non-finite exactly where a dense allreduce is (so ``torch.amp.GradScaler`` sees
  the overflow on every rank and skips the step), and every residual stays as it was;
* ``"raise"``: every rank raises the same ValueError naming the ranks whose gradient was
  non-finite and what they held.

``dense`` under ``"propagate"`` skips the read of the gradient (it is itself the dense
allreduce, its residual always zero) but not the record's round. The functional API defaults to ``"propagate"`` like
the hook: a SparseAllreduce then behaves as the ``dist.all_reduce`` it replaces, non-finite
values are never dropped or silently mixed into residuals, and the caller sees them in the
result on every rank; ``"raise"`` is the opt-in for failing fast. The check is on the
gradient: a sum of finite values that overflows inside an algorithm is that algorithm's
arithmetic (Inf is selected first; the kernels still raise on a NaN they meet).

Every call begins with one all-gather of a fixed-size agreement record (:mod:`sparsecomm.reduce.agreement`;
:data:`sparsecomm.formats.header.AGREEMENT_FIELDS`, 120 bytes: format version, kind, sparsecomm
version, algorithm, options, density, N, dtype, k, checkpoint, calls made, step, resets, and
the non-finite flag). The first call after construction, ``reset()`` or
``load_state_dict()`` sends it as a handshake; later calls send it as their check, in the round
the non-finite flag takes anyway (no extra round). Because every kind has the same size and
goes first on the call's tag, ranks at different points -- one reset and another not, another
step, N, k or dtype, another checkpoint -- compare records before any message whose size
depends on those values. Any difference raises the same
:class:`~sparsecomm.errors.AgreedValueError` (a ValueError) on every rank, naming the ranks
and the field, instead of a hang, a process abort or a wrong sum; the Comm stays usable.
Differing sparsecomm versions, algorithms and options are named in words (two more small
all-gathers of the texts, only on that error path). The options are the algorithm's options
and ``nonfinite``, as sorted ``key=value`` text. ``reset()`` is therefore collective: every
rank calls it, between the same calls.
"""

from __future__ import annotations

import contextlib
import functools
import math
import sys
import time
import zlib
from typing import Any

import torch

from .. import algorithms, ops
from ..comm.base import Comm, abort_together
from ..comm.topology import NodeComms, Topology
from ..errors import AgreedValueError
from ..formats.header import AgreementKind
from .agreement import Signature, agree, signature
from .checkpoint import CHECKPOINT_VERSION, check_owner, check_version, fingerprint, loaded_fingerprint
from .density import AdaptiveDensity, DensitySchedule, as_schedule, check_density, check_step, k_for
from .local_update import LocalUpdate, LocalUpdateState
from .nonfinite import NONFINITE_POLICIES, check_nonfinite, nonfinite_error, nonfinite_flag
from .residual_store import ResidualStore, check_residual_dtype
from .placement import AutoPlacement, check_hierarchy, make_placement, shard_ks

__all__ = ["SparseAllreduce", "k_for", "check_nonfinite", "nonfinite_error", "NONFINITE_POLICIES"]

_HALF_TYPES = (torch.float16, torch.bfloat16)

#: fresh CPU results from this size on get transparent huge pages (see _fresh_result)
_HUGE_RESULT_BYTES = 4 << 20


def _fresh_result(grad: torch.Tensor) -> torch.Tensor:
    """A new tensor for the result when the caller passes no ``out=``. On CPU a large one is
    advised transparent huge pages before its first touch: in 4 KiB pages, faulting in 60 MB
    costs ~4 residual-add passes per call (one fault and one zeroing per page), in 2 MiB pages
    ~0.5 (docs/benchmarks.md, "Local compute per call"); passing ``out=`` saves even that."""
    result = torch.empty(grad.shape, dtype=grad.dtype, device=grad.device)
    nbytes = result.numel() * result.element_size()
    if result.device.type == "cpu" and nbytes >= _HUGE_RESULT_BYTES:
        ops.advise_huge(result.data_ptr(), nbytes)
    return result


def _eager_under_compile(fn):
    """``fn`` run eagerly under torch.compile (``torch.compiler.disable``), without importing
    dynamo where nothing compiles: ``torch.compiler.disable`` imports ``torch._dynamo`` (2-3 s of
    CPU) in every process that imports sparsecomm, every rank of a launch included. Nothing can
    be compiling while ``torch._dynamo`` is not imported, so the plain function runs then; once
    it is, the call goes through the disabled wrapper, built once."""
    disabled = None

    @functools.wraps(fn)
    def call(*args, **kwargs):
        nonlocal disabled
        if "torch._dynamo" not in sys.modules:
            return fn(*args, **kwargs)
        if disabled is None:
            disabled = torch.compiler.disable(fn)
        return disabled(*args, **kwargs)

    return call


class SparseAllreduce:
    """Sparse allreduce of one tensor with error feedback.

    ``reducer(grad)`` returns the dense SUM over ranks of what the algorithm lets through
    (same shape and dtype as ``grad``, identical on every rank); what this rank did not
    get through is kept in :attr:`residual` and added to the next call's gradient.

    Args:
        algorithm: a name from :func:`sparsecomm.algorithms.names`.
        density: fraction of elements each rank selects, in (0, 1].
        comm: the :class:`~sparsecomm.comm.Comm` to use; default: a TorchComm over the
            default torch.distributed process group.
        nonfinite: ``"propagate"`` (default) or ``"raise"``: what happens when any rank's
            gradient holds NaN or Inf (see the module docstring); part of the handshake.
        density_schedule: a :class:`~sparsecomm.DensitySchedule` (warm-up densities of the
            first steps; ``density`` after it), part of the handshake. A call's step is its
            ``step=`` argument, else the number of calls before it (in ``state_dict()``).
        hierarchy: ``"flat"`` (default: the algorithm among all ranks), ``"node"``: the node's
            dense reduce-scatter, the algorithm on each rank's shard among the ranks of its
            local rank on the other nodes (k per shard: ``density`` of the shard), the node's
            all-gather (docs/architecture.md, "Two levels"), or ``"auto"``: the one the cost
            model predicts faster on the measured links, decided before the first call, the
            same on every rank, kept in ``state_dict()`` (flat without a topology).
        nodes: the cluster's shape for ``"node"`` / ``"auto"``: a :class:`~sparsecomm.Topology`
            (split here: collective), or the :class:`~sparsecomm.NodeComms` of one
            ``Topology.split(comm)`` shared by every reducer of the job (one set of process groups,
            links measured once); default: torchrun's variables (:meth:`Topology.from_env`).
            (Not ``topology``: that is skcompress's option, passed through ``**options``.)
        momentum: momentum correction (DGC section 3.2; :mod:`sparsecomm.reduce.local_update`):
            each rank keeps a velocity ``u <- momentum * u + g`` and accumulates it instead of
            the gradient; pair it with an optimizer *without* momentum (``SGD(momentum=0)``).
            0 (default): off. ``nesterov=True``: Nesterov's form. ``momentum_masking=True``: the
            velocity is cleared where the call sent (DGC 3.3).
        clip_norm: local gradient clipping (DGC 3.3): each rank scales its gradient to an L2 norm
            of at most ``clip_norm / sqrt(P)`` before it joins the velocity or residual. None: off.
        residual_dtype: the residual's form between calls (:mod:`sparsecomm.reduce.residual_store`):
            None (the working dtype, float32 for float32 and half gradients), ``torch.bfloat16``
            (2 bytes per element) or ``"int8"`` (1 + 1/64: 8 bits, a power-of-two scale per block
            of 64). Widened into a float32 buffer for each call and narrowed after it; what the
            narrowing rounds away is ``last_stats["residual_rounding"]`` (L1, relative), the memory
            kept ``last_stats["residual_bytes"]``. Part of the handshake.
        **options: the algorithm's own options (validated by it).

    ``reducer(grad, out=buf)`` writes the result into ``buf`` (same shape, ``grad``'s dtype or
    float32 for half gradients; it may be ``grad`` itself) and returns it. In a loop, pass the
    same ``out=`` every call: without it each call allocates a fresh result of N elements, and
    the first touch of fresh memory costs page faults and zeroing -- at N = 15M float32 about
    0.4-1.2 residual-add passes with the transparent huge pages the reducer asks for on CPU
    (about 4.5 passes, ~20 ms, where no huge pages are granted), on top of the ~3 passes of the
    call itself (docs/benchmarks.md, "Local compute per call"). The DDP hook always writes in place.
    """

    def __init__(self, algorithm: str, density: float, comm: Comm | None = None, nonfinite: str = "propagate",
                 density_schedule: DensitySchedule | None = None, hierarchy: str = "flat",
                 nodes: "Topology | NodeComms | None" = None, momentum: float = 0.0, nesterov: bool = False,
                 momentum_masking: bool = False, clip_norm: float | None = None,
                 residual_dtype: "torch.dtype | str | None" = None, **options: Any):
        local_update = LocalUpdate(momentum, nesterov, momentum_masking, clip_norm)
        #: the residual's form between calls (None: the working dtype; :mod:`.residual_store`)
        self.residual_form = check_residual_dtype(residual_dtype)
        check_density(density)
        check_nonfinite(nonfinite)
        check_hierarchy(hierarchy, nodes)
        topology = nodes
        cls = algorithms.get(algorithm)
        if comm is None and isinstance(topology, NodeComms):
            comm = topology.world
        #: close() closes the Comm only when the reducer built it
        self._owns_comm = comm is None
        self._closed = False
        if comm is None:
            from ..comm.torch_comm import TorchComm
            comm = TorchComm()
        if not isinstance(comm, Comm):
            raise ValueError(f"comm must be a sparsecomm.comm.Comm, got {type(comm).__name__}")
        self.algorithm_name = algorithm
        self.density = float(density)
        self.nonfinite = nonfinite
        self.local_update = local_update
        #: the velocity and the steps of the local update; None when it is off
        self._local = LocalUpdateState(local_update) if local_update.active else None
        self._pending_velocity: torch.Tensor | None = None
        self.density_schedule = as_schedule(density_schedule)
        #: an adaptive schedule's regime (reset() starts it afresh); None for other schedules
        self._adaptive = self._new_adaptive()
        self.hierarchy = hierarchy
        self.calls = 0  # calls made: the step of the next call when the caller gives none
        self.comm = comm
        self._label = label = f"SparseAllreduce({algorithm}, density {self.density:g})"
        #: where the calls run: flat, two-level, or auto's choice of the two (collective: may split)
        self.placement = make_placement(hierarchy, comm, topology)
        self._options = options
        self.algorithm = cls(self.placement.algorithm_comm(comm), **options)
        self._scope = comm.new_scope(label)
        self._level_scopes = [(c, c.new_scope(f"{label}, {level}")) for c, level in self.placement.levels()]
        self._residual: torch.Tensor | None = None
        #: a narrow residual_dtype: the residual between calls (then _residual stays None)
        self._store: ResidualStore | None = None
        self._pending_residual: torch.Tensor | None = None
        #: two-level: a loaded residual's values outside this rank's shard (the shard moved: another
        #: bucket layout), added to the next gradient so the node's reduce-scatter takes them to
        #: their owner; None when there are none
        self._carry: torch.Tensor | None = None
        self._agreed: tuple | None = None   # (n, dtype, device) the ranks agreed on
        self._shape: torch.Size | None = None
        #: 0 on a fresh reducer; load_state_dict (or set_checkpoint_fingerprint) sets a 63-bit
        #: fingerprint of the loaded state, which the handshake compares across ranks ("checkpoint")
        self._checkpoint_id = 0
        self._resets = 0    # reset() and load_state_dict() calls: part of every agreement record
        #: this rank's fixed record fields and texts, from its last handshake (reused by later calls)
        self._signature: Signature | None = None
        self.last_stats: dict[str, Any] = {}

    # -- public state ----------------------------------------------------------------------
    @property
    def nodes(self) -> NodeComms | None:
        """The two-level Comms the calls use (hierarchy="node", or "auto" once it chose them), else None."""
        return self.placement.nodes

    @property
    def hierarchy_choice(self) -> str | None:
        """"flat" or "node"; under hierarchy="auto" None until the first call decides."""
        return self.placement.choice if isinstance(self.placement, AutoPlacement) else self.hierarchy

    @property
    def hierarchy_decision(self) -> dict[str, Any]:
        """hierarchy="auto": what the cost model predicted ({} when nothing was predicted)."""
        return self.placement.decision if isinstance(self.placement, AutoPlacement) else {}

    @property
    def residual(self) -> torch.Tensor | None:
        """What this rank carries to the next call (shape of the last gradient; float32 for
        half gradients), or None before the first call."""
        if self._agreed is None:
            return self._pending_residual
        return self._whole(self._residual if self._store is None else self._store.values(self._agreed[1]), self._carry)

    @property
    def velocity(self) -> torch.Tensor | None:
        """Momentum correction's velocity (shape of the last gradient, working dtype; two-level:
        this rank's shard in place, zeros elsewhere), or None without momentum or before the
        first call."""
        if self._agreed is None:
            return self._pending_velocity
        velocity = None if self._local is None else self._local.velocity
        return None if velocity is None else self._whole(velocity, self._local.carry)

    def _whole(self, part: torch.Tensor, carry: torch.Tensor | None) -> torch.Tensor:
        """A state kept beside the residual, as a tensor of the gradient's shape."""
        if self.nodes is None:
            return part.view(self._shape)
        # two-level: a new tensor of the gradient's shape, this rank's shard in place, zeros (or
        # values still to be carried to their owner) elsewhere
        n = math.prod(self._shape)
        lo, hi = self.shard_bounds(n)
        full = torch.zeros(n, dtype=part.dtype, device=part.device) if carry is None else carry.clone()
        full[lo:hi] += part
        return full.view(self._shape)

    def k_for(self, n: int) -> int:
        return k_for(self.density, n)

    def shard_bounds(self, n: int) -> tuple[int, int]:
        """[lo, hi) of the slice of an N-element gradient this rank owns between nodes: slice
        ``local_rank`` of the node's reduce-scatter (contiguous, lengths differing by at most
        one); the whole tensor when flat."""
        return self.placement.shard_bounds(n)

    def density_at(self, step: int) -> float:
        """The density of call ``step`` (the schedule's, or ``density`` without one)."""
        if self.density_schedule is None:
            return self.density
        critical = True if self._adaptive is None else self._adaptive.critical
        return self.density_schedule.density_at(step, self.density, critical)

    @property
    def density_state(self) -> dict[str, Any] | None:
        """An adaptive schedule's regime (as ``state_dict()["density_state"]``), else None."""
        return None if self._adaptive is None else self._adaptive.state_dict()

    def _new_adaptive(self) -> AdaptiveDensity | None:
        schedule = self.density_schedule
        return AdaptiveDensity(schedule) if schedule is not None and schedule.kind == "adaptive" else None

    def close(self) -> None:
        """Release what the reducer built: the two-level Comms it split (``hierarchy="node"`` or
        ``"auto"`` with a Topology or torchrun's variables) and the TorchComm it made when no
        ``comm`` was given -- their process groups, sockets and threads. A Comm or NodeComms
        passed in is the caller's to close. Call it on every rank when done (or use the reducer
        as a context manager: ``with SparseAllreduce(...) as reducer:``); later calls raise
        ValueError, ``state_dict()`` still works. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self.placement.close()
        if self._owns_comm and hasattr(self.comm, "close"):
            self.comm.close()

    def __enter__(self) -> "SparseAllreduce":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def reset(self) -> None:
        """Forget the residual (e.g. before reusing the reducer for another tensor).

        Collective: every rank calls it, between the same two calls. The next call then
        starts with a handshake on every rank; a rank that reset alone makes that call raise
        the same ValueError on every rank, naming the ranks, and the reducers stay usable once
        every rank has called ``reset()`` (ranks that all reset between the same two calls
        agree, however many times each did)."""
        self._resets += 1
        self._adaptive = self._new_adaptive()
        self._residual = None
        self._store = None
        self._pending_residual = None
        self._pending_velocity = None
        self._carry = None
        self._agreed = None
        self._shape = None

    def state_dict(self) -> dict[str, Any]:
        """This rank's state (residual, algorithm state, calls made) and whose it is: ``rank``,
        ``world_size`` and a ``fingerprint`` equal on every rank of one save (a hash of the
        configuration, world size, calls made and N; :mod:`sparsecomm.reduce.checkpoint`). Local: no
        communication, so any subset of ranks may call it. Save one per rank."""
        residual = None if self.residual is None else self.residual.detach().clone()
        velocity = None if self.velocity is None else self.velocity.detach().clone()
        placed = {} if self.placement.saved_text() == "flat" else {"hierarchy": self.placement.saved_text()}
        return {
            **placed,
            "checkpoint_version": CHECKPOINT_VERSION,
            "algorithm": self.algorithm_name,
            "density": self.density,
            "rank": self.comm.rank,
            "world_size": self.comm.size,
            "fingerprint": fingerprint("SparseAllreduce", self.comm.size, self.algorithm_name, self.density,
                                       self.options_text(), self.calls,
                                       None if residual is None else residual.numel()),
            "residual": residual,
            "algorithm_state": self.algorithm.state_dict(),
            "calls": self.calls,
            **({"velocity": velocity} if self.local_update.momentum > 0.0 else {}),
            **({} if self._adaptive is None else {"density_state": self._adaptive.state_dict()}),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict` of this rank. A ValueError refuses another rank's state
        (one holding a residual or algorithm state), another world size's, another algorithm's,
        or another checkpoint version's. The state's fingerprint becomes the one the next
        handshake compares, so ranks that loaded different saves (or none) raise together."""
        check_version(state, "SparseAllreduce")
        if state.get("algorithm") != self.algorithm_name:
            raise ValueError(f"state_dict is for algorithm {state.get('algorithm')!r}, "
                             f"this reducer runs {self.algorithm_name!r}")
        check_owner("SparseAllreduce", state.get("rank"), state.get("world_size"), self.comm.rank, self.comm.size,
                    per_rank=state.get("residual") is not None or bool(state.get("algorithm_state")))
        saved, mine = state.get("hierarchy", "flat"), self.placement.saved_text()
        if isinstance(self.placement, AutoPlacement) and self.placement.resume(saved):
            mine = saved   # not decided yet: the saved choice stands (its residual is that part)
        if saved != mine:
            raise ValueError(f"state_dict was saved with hierarchy {saved!r}, this reducer runs {mine!r}: its "
                             "residual is another part of the gradient; resume with the same hierarchy and "
                             "topology")
        velocity = state.get("velocity")
        if velocity is not None and self.local_update.momentum == 0.0:
            raise ValueError("state_dict holds a momentum correction's velocity, this reducer has momentum=0: "
                             "build it with the momentum it was saved with")
        mark = loaded_fingerprint(state)
        self.reset()
        if self._adaptive is not None and state.get("density_state") is not None:
            self._adaptive.load_state_dict(state["density_state"])
        self._pending_residual = state.get("residual")
        self._pending_velocity = velocity
        self.calls = int(state.get("calls", 0))
        self.algorithm.load_state_dict(state.get("algorithm_state", {}))
        self._checkpoint_id = mark

    def set_checkpoint_fingerprint(self, mark: int) -> None:
        """Say which save this reducer continues from: the ``fingerprint`` of a checkpoint
        (equal on every rank of one save; 0: a fresh start), as :meth:`load_state_dict` does
        from the state it loads. The agreement records from the next call on carry it, so
        ranks that resumed from different saves raise the same error on every rank. For a
        reducer whose state was restored elsewhere (the DDP hook's reducers of a loaded
        state). A ValueError unless an int in [0, 2**63)."""
        self._checkpoint_id = loaded_fingerprint({"fingerprint": mark})

    # -- the call --------------------------------------------------------------------------
    # Under torch.compile a call runs eagerly (a graph break around it): its
    # communication waits on other processes (sockets, MPI, Python threads) and its
    # wire headers are numpy structs, none of which dynamo can trace. The ops it calls
    # are custom ops with fake kernels, so the same local compute traces in a user's
    # own compiled code (tests/test_op_contracts.py).
    @_eager_under_compile
    def __call__(self, grad: torch.Tensor, out: torch.Tensor | None = None, *, step: int | None = None) -> torch.Tensor:
        """Reduce ``grad``; ``step`` picks the density schedule's step (default: calls so far)."""
        if self._closed:
            raise ValueError(f"{self._label} was closed; build a new one on every rank (its state_dict() carries "
                             "the residual)")
        for comm in self._comms():
            comm.check_usable()
        # The caller's arguments are checked before the call scope, so nothing of this call
        # is in flight; but the peers are (or soon will be) in this call waiting for messages
        # that will not come: the Comm is aborted, so they raise CommAbortedError naming this
        # rank and the cause within a poll slice instead of waiting the timeout, while this
        # rank raises its own error (ValueError). On one rank nothing waits: no abort.
        try:
            self._check_arguments(grad, out)
            if step is not None:
                step = check_step(step)
        except (ValueError, TypeError) as exc:
            abort_together(self._waited_on(), f"{type(exc).__name__}: {exc} (in {self._scope.label}, before it sent "
                                          "anything)")
            raise
        # The call's messages carry its own tag; an exception raised inside on this rank is
        # published to every peer, which then raises too, naming this rank (Comm.call_scope),
        # except the errors every rank raises by agreement (AgreedValueError). Two-level: the
        # call is a call of each of its Comms, so a failure aborts all three and a peer waiting
        # on any of them raises.
        # No variable-size message of a call is larger than 16 bytes per element + headers.
        limit = 16 * grad.numel() + 65536
        agreed = lambda exc: isinstance(exc, AgreedValueError)  # noqa: E731
        def abort_levels(exc: BaseException) -> None:
            # Two levels: all three Comms at once, before the call scopes unwind one by one (each
            # would make a store host wait for its readers in turn, about 1 s per Comm, while the
            # peers waiting on the others are not yet released). A peer's abort reaches this rank
            # on one Comm, which a call scope does not publish again; ranks that share only another
            # of its Comms with this rank wait there: it is relayed (a Comm keeps its first cause).
            # hierarchy="auto" before it decides: the candidate Comms.
            if self._level_scopes and not agreed(exc):
                abort_together(self._waited_on(), f"{type(exc).__name__}: {exc}")

        try:
            with contextlib.ExitStack() as scopes:
                scopes.enter_context(self.comm.call_scope(self._scope, max_message_bytes=limit, agreed=agreed))
                for comm, scope in self._level_scopes:
                    scopes.enter_context(comm.call_scope(scope, max_message_bytes=limit, agreed=agreed))
                try:
                    result = self._call(grad, out, self.calls if step is None else step)
                except BaseException as exc:
                    abort_levels(exc)
                    raise
        except BaseException as exc:   # entering a scope failed (a Comm broken by a peer's abort)
            abort_levels(exc)
            raise
        self.calls += 1
        return result

    def _comms(self) -> list[Comm]:
        return self.placement.comms(self.comm)

    def _waited_on(self) -> list[Comm]:
        """The Comms on which a peer may wait for this rank (one of a single rank stays usable)."""
        return [comm for comm in self._comms() if comm.size > 1]

    def _choose_hierarchy(self, n: int, dtype: torch.dtype, work_dtype: torch.dtype, step: int) -> None:
        """hierarchy="auto", before the first call's residual exists: flat or two-level, the
        same on every rank (:meth:`AutoPlacement.decide
        <sparsecomm.reduce.placement.AutoPlacement.decide>`). A handshake first, so ranks that
        would decide from different inputs (a resumed choice on some ranks only) raise instead of
        exchanging mismatched ping-pongs. Two-level runs the algorithm anew on the inter-node
        Comm, with the state it had and the measured links (:meth:`Algorithm.placed_between_nodes
        <sparsecomm.algorithms.Algorithm.placed_between_nodes>`)."""
        placement = self.placement
        k = k_for(self.density_at(step), n)
        self._handshake(n, dtype, k, step)
        resumed = placement.resumed
        per = placement.candidates.topology.ranks_per_node
        if placement.decide(self.comm, self.algorithm, n, k, shard_ks(self.density_at(step), n, per),
                            work_dtype) == "node":
            state = self.algorithm.state_dict()
            self.algorithm = algorithms.get(self.algorithm_name)(placement.algorithm_comm(self.comm), **self._options)
            if state:
                self.algorithm.load_state_dict(state)
            elif resumed is None:
                self.algorithm.placed_between_nodes(placement.decision["links"], per)
        else:
            self._level_scopes = []
        placement.resumed = None

    def _check_arguments(self, grad: torch.Tensor, out: torch.Tensor | None) -> None:
        if not isinstance(grad, torch.Tensor) or not grad.is_floating_point():
            raise ValueError(f"grad must be a floating-point tensor, got "
                             f"{type(grad).__name__ if not isinstance(grad, torch.Tensor) else grad.dtype}")
        work_dtype = torch.float32 if grad.dtype in _HALF_TYPES else grad.dtype
        if out is not None and (out.shape != grad.shape or out.dtype not in (grad.dtype, work_dtype)
                                or out.device != grad.device):
            raise ValueError(f"out must match grad (shape {tuple(grad.shape)}, {grad.dtype} or {work_dtype}, "
                             f"{grad.device}); got shape {tuple(out.shape)}, {out.dtype}, {out.device}")
        # another N, dtype or device than agreed is found inside the call, by the agreement
        # record (kind REUSED): every rank raises the same error, whether all or some changed

    def _call(self, grad: torch.Tensor, out: torch.Tensor | None, step: int) -> torch.Tensor:
        work_dtype = torch.float32 if grad.dtype in _HALF_TYPES else grad.dtype
        start = time.perf_counter()
        flat = grad.detach().reshape(-1)
        n = flat.numel()
        handshake = self.comm.stats.snapshot()
        levels = self.placement.snapshot()
        # the schedule and the step are in the agreement record: the same k everywhere (two-level:
        # the record carries the whole tensor's k, the algorithm selects k of its shard)
        k = k_for(self.density_at(step), n)
        if self.hierarchy_choice is None:
            self._choose_hierarchy(n, grad.dtype, work_dtype, step)
        lo, hi = self.shard_bounds(n)
        shard_k = k if self.nodes is None else k_for(self.density_at(step), hi - lo)
        key = (n, work_dtype, grad.device)
        reused = self._agreed is not None and self._agreed != key
        acc = None if reused else self._prepare(n, work_dtype, grad, k, step)
        after_handshake = self.comm.stats.snapshot()
        check_start = time.perf_counter()
        # the same list on every rank; raises on any disagreement, a reuse, and under "raise"
        nonfinite = self._check_call(flat, grad.dtype, k, step,
                                     AgreementKind.REUSED if reused else AgreementKind.CALL)
        assert acc is not None
        check_s = time.perf_counter() - check_start
        after_check = self.comm.stats.snapshot()
        if out is not None and out.dtype == work_dtype and out.is_contiguous():
            result = out
            # safe even if out aliases grad: the placement reads grad into acc, or (fused) the
            # algorithm reads it before it writes out (Algorithm.reduce), before out is written
            work_out = out.view(-1)
        else:
            result = _fresh_result(grad) if out is None else out
            work_out = result.view(-1) if grad.dtype == work_dtype and result.is_contiguous() else \
                torch.empty(n, dtype=work_dtype, device=grad.device)
        self.algorithm.times = {}
        self.algorithm.last_nnz = None
        add_s = 0.0
        if nonfinite:  # "propagate": the dense allreduce of the raw gradients, residuals untouched
            work_out.copy_(flat)
            self.comm.allreduce_dense(work_out)
        else:
            # acc = g + e in the working dtype (or fused into the algorithm's first selection),
            # then the algorithm: flat, or between nodes on this rank's shard
            local, scale = self._local, 1.0
            if local is not None:
                scale = local.clip_scale(flat, self.comm.size)
            add_s = self.placement.run(self.algorithm, flat, acc, shard_k, work_out, self._carry, local, scale)
            self._carry = None
            if self._store is not None:
                rounding = self._store.narrow_from(acc)
        density = self.density_at(step)
        if self._adaptive is not None and not nonfinite:   # the reduced sum: the same on every rank
            self._adaptive.update(step, work_out)
        if work_out.data_ptr() != result.data_ptr() or work_out.dtype != result.dtype:
            result.copy_(work_out.view(result.shape))
        self._shape = grad.shape
        spent = self.comm.stats - after_check
        handshake_spent = after_handshake - handshake
        check_spent = after_check - after_handshake
        times = self.algorithm.times
        self.last_stats = {
            "algorithm": self.algorithm_name, "n": n, "k": shard_k,
            "bytes_sent": spent.bytes_sent, "bytes_recv": spent.bytes_recv, "rounds": spent.rounds,
            "nnz_out": self.algorithm.last_nnz if self.algorithm.last_nnz is not None
            else int(torch.count_nonzero(work_out)),
            "select_s": times.get("select", 0.0) + times.get("residual", 0.0),
            "merge_s": times.get("merge", 0.0) + times.get("scatter", 0.0),
            # local compute by phase (sparsecomm.bench.phases): the residual add, then the
            # algorithm's select / residual / merge / scatter
            "phases_s": {"add": add_s, **times},
            "comm_s": spent.comm_s, "total_s": time.perf_counter() - start,
            "handshake_bytes": handshake_spent.bytes_sent, "handshake_rounds": handshake_spent.rounds,
            "check_bytes": check_spent.bytes_sent, "check_rounds": check_spent.rounds, "check_s": check_s,
            "nonfinite_ranks": nonfinite,
        }
        if self._adaptive is not None:   # this call's density, and the regime of the next interval's
            self.last_stats.update(density=density, critical=self._adaptive.critical)
        if self._local is not None and self.local_update.clip_norm is not None:
            self.last_stats["clip_scale"] = 1.0 if nonfinite else scale
        # the bytes this reducer keeps between calls: its residual (narrow or not) and velocity
        self.last_stats["residual_bytes"] = (self._store.nbytes if self._store is not None
                                             else self._residual.numel() * self._residual.element_size())
        velocity = None if self._local is None else self._local.velocity
        self.last_stats["velocity_bytes"] = 0 if velocity is None else velocity.numel() * velocity.element_size()
        if self._store is not None:
            self.last_stats["residual_rounding"] = 0.0 if nonfinite else rounding
        self.last_stats.update(self.placement.stats(levels, self.last_stats, k, hi - lo))
        extra = getattr(self.algorithm, "stats_extra", None)
        if extra is not None:   # e.g. auto: its choice, predicted and measured time
            self.last_stats.update(extra(self.last_stats["total_s"]))
        return result

    def _check_call(self, flat: torch.Tensor, dtype: torch.dtype, k: int, step: int,
                    kind: AgreementKind) -> list[int]:
        """This call's agreement record, all-gathered with its non-finite flag: the ranks whose
        gradient holds NaN or Inf (the same list on every rank). Raises the same
        AgreedValueError on every rank when the records differ (:meth:`_agree`), when every rank
        reuses the reducer for another tensor without reset(), and under ``nonfinite="raise"``
        when the list is not empty. The gradient is not read for N = 0 nor for an algorithm
        that is itself the dense allreduce under ``"propagate"`` (its flag is 0)."""
        n = flat.numel()
        # two-level with a per-shard decision: dense on some shards only, so every rank reads its gradient
        read = (kind == AgreementKind.CALL and n > 0
                and not (self.nonfinite == "propagate" and self.algorithm.propagates_nonfinite
                         and not self._decides_per_shard()))
        flags = self._agree(kind, n, dtype, k, step, nonfinite_flag(flat) if read else 0)
        if kind == AgreementKind.REUSED:
            agreed_n, agreed_dtype, agreed_device = self._agreed
            raise AgreedValueError(f"rank {self.comm.rank}: this reducer was used for N={agreed_n} ({agreed_dtype}, "
                                   f"{agreed_device}) and now gets N={n} ({flat.dtype}, {flat.device}) on every "
                                   "rank: use one SparseAllreduce per tensor, or call reset() on every rank first")
        if self.algorithm.propagates_nonfinite or any(flags):
            # the records proved every rank is in this call with the same N and dtype, and
            # will run the dense allreduce: the Comm's own size check before it adds nothing
            # (two-level: the shards of one inter-node group have equal lengths, from N)
            for comm in self._comms():
                comm.mark_dense_agreed()
        if not any(flags):
            return []
        if self.nonfinite == "raise":
            raise nonfinite_error(flags, n, self.algorithm_name)
        return [rank for rank, flag in enumerate(flags) if flag]

    def _prepare(self, n: int, work_dtype: torch.dtype, grad: torch.Tensor, k: int, step: int) -> torch.Tensor:
        """The residual buffer for this call (the key was checked in _check_arguments); agree
        with the other ranks first if new. An algorithm's ``prepare(n, k, dtype)`` runs for
        every call, with this call's k, before anything asks it what it will do (its
        ``propagates_nonfinite``, ``takes_grad()``): e.g. auto decides anew when a density
        schedule changes k, and the candidate it will run answers."""
        key = (n, work_dtype, grad.device)
        prepare = getattr(self.algorithm, "prepare", None)
        if self.nodes is not None and self.nodes.inter is None:
            prepare = None      # one node: no algorithm runs
        # the algorithm works on this rank's shard (two-level) with its own k
        lo, hi = self.shard_bounds(n)
        part, part_k = hi - lo, (k if self.nodes is None else k_for(self.density_at(step), hi - lo))
        if self._agreed is None:
            if prepare is not None:   # e.g. auto decides here, so the handshake covers its choice
                # prepare may communicate (auto's ping-pong), and what it sends depends on the
                # options and any loaded state: agree on those first, so ranks that differ raise
                # the handshake's error instead of exchanging mismatched messages in prepare
                self._handshake(n, grad.dtype, k, step)
                prepare(part, part_k, work_dtype)
            self._handshake(n, grad.dtype, k, step)
            pending = self._pending_residual
            if pending is not None and pending.numel() != n:
                # N and the save's fingerprint are agreed by now: every rank raises this
                raise AgreedValueError(f"the loaded state_dict holds the residual of a tensor of N={pending.numel()}, "
                                       f"this call's tensor has N={n}: the state_dict belongs to another tensor")
            velocity = self._pending_velocity
            if velocity is not None and velocity.numel() != n:
                raise AgreedValueError(f"the loaded state_dict holds the velocity of a tensor of N={velocity.numel()}, "
                                       f"this call's tensor has N={n}: the state_dict belongs to another tensor")
            self._agreed, self._pending_residual, self._pending_velocity = key, None, None
            self._residual = torch.zeros(part, dtype=work_dtype, device=grad.device)
            if pending is not None:
                pending = pending.reshape(-1).to(device=grad.device, dtype=work_dtype)
                self._residual.copy_(pending[lo:hi])
                if part != n:   # two-level: what lies outside the shard goes to its owner
                    carry = pending.clone()
                    carry[lo:hi] = 0
                    self._carry = carry if bool(carry.any()) else None
            if velocity is not None:
                velocity = velocity.reshape(-1).to(device=grad.device, dtype=work_dtype)
            if self._local is not None:
                self._local.prepare(part, work_dtype, grad.device, None if velocity is None else velocity[lo:hi])
                if part != n and (pending is not None or velocity is not None):
                    # two-level with a local update: a carry cannot ride on the gradient (it would
                    # enter the velocity), so a loaded state's values outside the shard take rounds
                    # of their own in the first call -- on every rank that loaded one (a loaded
                    # state is agreed: its fingerprint, or the hook loading every rank's), even
                    # when they are all zeros, so that every rank of the node makes the same rounds
                    if self._carry is None:
                        self._carry = torch.zeros(n, dtype=work_dtype, device=grad.device)
                    carried = torch.zeros(n, dtype=work_dtype, device=grad.device) if velocity is None \
                        else velocity.clone()
                    carried[lo:hi] = 0
                    self._local.carry = carried
            if self.residual_form is not None:   # kept narrow from now on; exact for a loaded one
                self._store = ResidualStore(self.residual_form, part, grad.device)
                self._store.narrow_from(self._residual, measure=False)
                self._residual = None
        elif prepare is not None:   # agreed earlier: a new k only (no communication for the same n)
            prepare(part, part_k, work_dtype)
        if self._store is not None:   # this call's working residual, widened
            acc = torch.empty(part, dtype=work_dtype, device=grad.device)
            self._store.widen_into(acc)
            return acc
        return self._residual

    def _handshake(self, n: int, dtype: torch.dtype, k: int, step: int) -> None:
        """The first call's agreement record: this rank's signature taken afresh and kept for
        the later calls' records; raises on any difference."""
        revision = self.algorithm.wire_revision
        algorithm_id = f"{self.algorithm_name}/{revision}" if revision else self.algorithm_name
        per_shard = self._decides_per_shard()
        self._signature = signature(self.algorithm_name if per_shard else algorithm_id, self.options_text(),
                                    self.density)
        self._agree(AgreementKind.HANDSHAKE, n, dtype, k, step, 0)
        if per_shard:
            self._agree_per_shard(algorithm_id)

    def _decides_per_shard(self) -> bool:
        """Two-level with an algorithm that decides for its tensor (``prepare``: auto, by the
        shard's length and the inter-node group's measured links): each inter-node group may then
        decide otherwise, so only the ranks that hold one shard must agree on the decision."""
        return self.nodes is not None and callable(getattr(self.algorithm, "prepare", None))

    def _agree_per_shard(self, algorithm_id: str) -> None:
        """One more small all-gather of the handshake (on every rank, from the same table): the
        same AgreedValueError on every rank unless the ranks of each inter-node group have the same
        ``algorithm_id`` (the algorithm's decision, or which saved decision it resumes)."""
        mine = torch.tensor([zlib.crc32(algorithm_id.encode()), self.nodes.topology.local_rank], dtype=torch.int64)
        sides: dict[int, dict[int, list[int]]] = {}
        for rank, (crc, local) in enumerate(self.comm.allgather_small(mine).tolist()):
            sides.setdefault(local, {}).setdefault(crc, []).append(rank)
        split = [f"local rank {local}: " + " / ".join(f"ranks {ranks}" for ranks in by_crc.values())
                 for local, by_crc in sorted(sides.items()) if len(by_crc) > 1]
        if split:
            raise AgreedValueError(f"the ranks that hold one shard between nodes decided differently for it "
                                   f"({self.algorithm_name}, {'; '.join(split)}): every rank must call the same "
                                   "reducer with the same tensor, and every rank resume from the same save or none")

    def _agree(self, kind: AgreementKind, n: int, dtype: torch.dtype, k: int, step: int, flag: int) -> list[int]:
        """This call's agreement record, all-gathered and compared (:mod:`sparsecomm.reduce.agreement`):
        every rank's non-finite flag, or the same AgreedValueError on every rank."""
        assert self._signature is not None, "a handshake comes first"
        return agree(self.comm, self._signature, kind, n=n, dtype=dtype, k=k, step=step, flag=flag,
                     checkpoint=self._checkpoint_id, calls=self.calls, resets=self._resets,
                     algorithm=self.algorithm_name, density=self.density)

    def options_text(self) -> str:
        """The options as the handshake compares and the mismatch error shows them: the
        algorithm's options and ``nonfinite``, sorted ``key=value`` (values by ``repr``)."""
        merged = {**self.algorithm.options, "nonfinite": self.nonfinite, **self.local_update.options()}
        if self.nodes is not None or self.hierarchy == "auto":  # flat leaves the text as it was
            merged["hierarchy"] = self.placement.text()
        if self.residual_form is not None:   # float32 leaves the text as it was
            merged["residual_dtype"] = self.residual_form
        if self.density_schedule is not None:  # a schedule is a value: its canonical text is compared
            merged["density_schedule"] = self.density_schedule.spec_text()
        return ", ".join(f"{key}={merged[key]!r}" for key in sorted(merged))
