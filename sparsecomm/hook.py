"""The DDP communication hook: ``model.register_comm_hook(state, sparsecomm.ddp_hook)``.

Each DDP gradient bucket goes through a :class:`~sparsecomm.SparseAllreduce` (one per bucket of
the plan, see "Bucket rebuilds" below); the hook writes the average (sum / world size) into the
bucket's buffer. For float16/bfloat16 buckets the reducer hands back the float32 sum, which is
divided by the world size in float32 and only then rounded to the bucket's dtype (so 2 ranks
with an fp16 gradient of 40000 average to 40000, as with DDP's own allreduce, not to inf).
Warm-up steps use DDP's own arithmetic: divide the bucket by the world size, then the backend's
dense allreduce.

Non-finite gradients (``nonfinite="propagate"``, the default): when any rank's bucket holds
NaN or Inf the bucket's result on every rank is the dense average of the raw gradients
(non-finite exactly where DDP's allreduce would be) and no residual changes, so
``torch.amp.GradScaler`` finds the overflow on every rank and skips the step everywhere.
``nonfinite="raise"`` makes every rank raise the same ValueError instead (see
:class:`~sparsecomm.SparseAllreduce`).

Bucket rebuilds and exact resume. DDP reduces its initial bucket layout in its first
iteration and rebuilds its buckets after it (in the order gradients became ready); a fresh
DDP -- after a restart -- does the same again. Bucket membership and order decide the result
of every position-dependent algorithm (spardl's blocks, gssgd's hashes, even gloo's dense ring
sums for P >= 3), so the hook does not follow DDP's buckets blindly: it reduces every step in
its *plan*, a bucket layout recorded in the state (per bucket: parameter ordinals, offsets,
size, dtype), with one reducer per plan bucket.

* The plan is DDP's initial layout (the first iteration the state sees) for steps 0 and 1,
  and DDP's rebuilt layout from step 2 (``ADOPT_STEP``) on: it is recorded when first seen
  (step 1) and adopted once, at the start of step 2. A checkpoint taken after any step
  therefore knows the layout of the next step -- after step 1 the rebuild has not been seen,
  and the next step uses the initial layout; after step 2 it has.
* When DDP's buckets of an iteration are not the plan's (the step that sees the rebuild
  first; the first iteration after a restart, which is DDP's initial layout again), the hook
  copies each DDP bucket's gradients into the plan buckets' buffers, starts every plan bucket
  as soon as it is complete, in plan order (the same on every rank), and copies the averaged
  result back; DDP's Future of a bucket completes when the last plan bucket covering it has.
  Otherwise each DDP bucket is its plan bucket, reduced in place at no extra cost.
* After a restart from a checkpoint taken after step 1, the rebuilt layout is unknown to the
  plan at step 2, where it must already be used: that one iteration's buckets are held until
  its last bucket and then reduced in the (adopted) rebuilt layout.
* Adopting the rebuilt layout keeps every residual: residuals are cut per parameter and
  reassembled; a bucket equal to the old plan's bucket of the same index keeps its reducer;
  of the other buckets' algorithm state only counters that belong to no tensor carry over
  (``Algorithm.carried_state``: QSGD's and gssgd's step); per-tensor adaptive state (spardl's
  B-SAG h, sparcml's observed fill-in, oktopk's thresholds and boundaries) restarts, as it
  describes tensors that no longer exist.

Parameter ordinals are the order in which the hook first saw the parameters (DDP's initial
bucketing is deterministic, so they agree across ranks and across restarts). A parameter
whose shape or dtype differs from the plan's raises a ValueError (the model changed: build a
new state). ``regrouped_buckets`` counts the DDP buckets that went through the plan's buffers.

Checkpointing: :meth:`DDPHookState.state_dict` stores the step, the plan (and a rebuilt
layout waiting for step 2), every parameter's residual and every plan bucket's algorithm state
(``algorithm_states``); restored with ``load_state_dict`` into a fresh state registered on a
fresh DDP model, training continues bit-identically to the uninterrupted run
(tests/test_resume.py: every algorithm; plain DDP, small buckets, ``gradient_as_bucket_view``,
``static_graph``, ``no_sync``, ``find_unused_parameters``, fp16 and bf16 parameters, warm-up;
P = 2 and 3). The state pickles without its process group (like PowerSGD's state), and the
default group is used after unpickling unless ``process_group`` is set again.

The state is per rank (each rank's residuals), so it records whose it is -- ``rank``,
``world_size`` and a ``fingerprint`` equal on every rank of one save (sparsecomm/_checkpoint.py)
-- and ``load_state_dict`` refuses another rank's state or another world size's with a
ValueError saying how to save: one file per rank (``torch.save(state.state_dict(),
f"hook_rank{rank}.pt")``), or ``torch.distributed.checkpoint`` with the state as a ``Stateful``
(``state_dict()`` puts this rank's part, ``local_state_dict()`` as ``torch.save`` bytes, under
the key ``rank<r>``, so DCP writes and returns each rank's own; tests/test_checkpoint.py).
The loaded fingerprint goes to every reducer's first handshake: ranks resumed from different
saves, or some fresh, raise the same ValueError on every rank.

Non-blocking communication (SparCML section 5; ``async_comm=True``, the default): the hook
only queues the bucket and returns its Future at once; one background worker thread per
state runs the collectives in FIFO order (bucket order, the same on every rank, so the
ranks' point-to-point messages match), so the communication of one bucket overlaps the
backward pass computing the next. Everything the hook decides from ``state`` (warm-up or
not, the bucket's reducer and layout, the step count) is decided on the calling thread at
enqueue time; the worker only runs the reducer on the bucket buffer, which DDP keeps alive
and untouched until it has waited on the Future. An exception in the worker is set on that
bucket's Future, so it is raised by DDP's wait in ``loss.backward()``; every later bucket
fails at once with an error naming the first failure, of the same type (never a hang on
this rank; the Comm publishes the failure, so peers raise within about 0.05 s naming this
rank). The Future carries the original exception: ``loss.backward()`` raises the
ValueError, CommError or CommTimeoutError itself (``_bucket_worker.fail_future``). ``state_dict``, pickling and DDP's bucket rebuild first
wait for the queue to drain. The worker thread is not pickled; a new one starts lazily.
With ``async_comm=False`` the collectives run inside the hook (the Future is complete
when returned); results are identical either way.
"""

from __future__ import annotations

import io
import warnings
from typing import Any

import torch
import torch.distributed as dist

from . import algorithms
from ._bucket_worker import BucketWorker, fail_future
from .comm.base import Comm
from ._checkpoint import CHECKPOINT_VERSION, HOW_TO_SAVE, check_owner, check_version, fingerprint, loaded_fingerprint
from .reducer import NONFINITE_POLICIES, SparseAllreduce
from .density import DensitySchedule, as_schedule

__all__ = ["DDPHookState", "ddp_hook"]


def _group_size(process_group: Any) -> int | None:
    """The number of ranks of ``process_group`` (None: the default group), or None while unknown."""
    if not (dist.is_available() and dist.is_initialized()):
        return None
    size = dist.get_world_size(process_group)
    return size if size > 0 else None  # -1: this rank is not in the group


#: one parameter's place in a bucket: (parameter ordinal, offset, numel, shape)
_Entry = tuple[int, int, int, torch.Size]
#: the first step reduced in DDP's rebuilt layout (see the module docstring)
ADOPT_STEP = 2


class _PlanBucket:
    """One bucket of the hook's reduction layout: what its reducer reduces, in what order."""

    __slots__ = ("entries", "numel", "dtype")

    def __init__(self, entries: list[_Entry], numel: int, dtype: torch.dtype):
        self.entries = entries
        self.numel = numel
        self.dtype = dtype

    def matches(self, entries: list[_Entry], buffer: torch.Tensor) -> bool:
        return self.entries == entries and self.numel == buffer.numel() and self.dtype == buffer.dtype

    def to_state(self) -> dict[str, Any]:
        return {"entries": [(o, off, n, tuple(shape)) for o, off, n, shape in self.entries], "numel": self.numel,
                "dtype": self.dtype}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> "_PlanBucket":
        return cls([(int(o), int(off), int(n), torch.Size(shape)) for o, off, n, shape in state["entries"]],
                   int(state["numel"]), state["dtype"])


class _Iteration:
    """Book-keeping of one backward pass whose DDP buckets differ from the plan."""

    __slots__ = ("step", "defer", "deferred", "next", "missing", "scatter", "waiting")

    def __init__(self, step: int, defer: bool = False):
        self.step = step    # the hook's step when the iteration began (warm-up or not)
        self.defer = defer  # hold every bucket until the last: this iteration's layout becomes the plan
        self.deferred: list[tuple[int, torch.Tensor, torch.futures.Future]] = []
        self.next = 0       # the next plan bucket to start (they start in plan order on every rank)
        self.missing: dict[int, int] = {}   # plan bucket -> parameters not gathered yet
        # plan bucket -> where its result goes: (DDP buffer, offset there, offset in the plan bucket, numel, DDP index)
        self.scatter: dict[int, list[tuple[torch.Tensor, int, int, int, int]]] = {}
        # DDP bucket index -> [its Future, its buffer, plan buckets still running for it]
        self.waiting: dict[int, list[Any]] = {}


class DDPHookState:
    """Configuration and per-bucket state of :func:`ddp_hook`.

    Args:
        algorithm: a name from :func:`sparsecomm.algorithms.names`.
        density: fraction of elements each rank selects per bucket, in (0, 1].
        process_group: the torch.distributed group; None is the default group.
        warmup_steps: iterations that use a plain dense allreduce before sparsification
            starts (a common remedy for early-training instability).
        comm: a ready :class:`~sparsecomm.comm.Comm` to use instead of a TorchComm over
            ``process_group`` (e.g. an MPIComm).
        async_comm: run the collectives on a background worker (default True); False
            runs them inside the hook.
        nonfinite: ``"propagate"`` (default: what mixed precision's GradScaler needs) or
            ``"raise"``: what a bucket holding NaN or Inf on any rank does.
        density_schedule: a :class:`~sparsecomm.DensitySchedule`: denser steps first (gs-SGD's
            per-epoch list, DGC's exponential warm-up), ``density`` after it. Counted in the
            hook's steps (iterations, including ``warmup_steps``); compared by the signature
            handshake and kept in ``state_dict()``. Default None: ``density`` from step 0 --
            measured, a warm-up cost spardl and gtopk at 1% time to accuracy on the demo's
            MLP and gave no consistent gain on digits (docs/benchmarks.md, "Density warm-up").
        **options: options of the algorithm, validated here.
    """

    def __init__(self, algorithm: str, density: float, process_group: Any = None, warmup_steps: int = 0,
                 comm: Comm | None = None, async_comm: bool = True, nonfinite: str = "propagate",
                 density_schedule: DensitySchedule | None = None, **options: Any):
        if isinstance(density, bool) or not isinstance(density, (int, float)) or not (0.0 < density <= 1.0):
            raise ValueError(f"density must be a number in (0, 1], got {density!r}")
        if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 0:
            raise ValueError(f"warmup_steps must be an integer >= 0, got {warmup_steps!r}")
        if not isinstance(async_comm, bool):
            raise ValueError(f"async_comm must be True or False, got {async_comm!r}")
        if nonfinite not in NONFINITE_POLICIES:
            raise ValueError(f"nonfinite must be one of {', '.join(map(repr, NONFINITE_POLICIES))}, got {nonfinite!r}")
        self.nonfinite = nonfinite
        self.density_schedule = as_schedule(density_schedule)
        # validates the options now, not at the first bucket; those that depend on the number
        # of ranks (spardl's teams) too when it is known already, else in `comm` below
        self._options_checked = algorithms.get(algorithm)(None, **options)  # comm-less: checks only
        size = comm.size if comm is not None else _group_size(process_group)
        if size is not None:
            self._options_checked.check_size(size)
        self.async_comm = async_comm
        self._worker: BucketWorker | None = None
        self.algorithm = algorithm
        self.density = float(density)
        self.options = dict(options)
        self.warmup_steps = warmup_steps
        self.process_group = process_group
        self.step = 0
        self._comm = comm
        self._owns_comm = comm is None  # a Comm this state builds is closed by close()
        self._closed = False
        self._warmup = None  # (comm, CallScope) of the warm-up's dense allreduce
        # The plan: the bucket layout the reductions use (see the module docstring, "Bucket
        # rebuilds and exact resume"); one reducer per plan bucket.
        self._plan: list[_PlanBucket] = []
        self._plan_complete = False
        self._plan_final = False  # the plan is DDP's rebuilt layout: never replaced again
        self._next_plan: list[_PlanBucket] | None = None  # DDP's rebuilt layout, the plan from ADOPT_STEP
        self._observed: list[_PlanBucket] = []  # DDP's buckets so far in this iteration
        self._seen = 0  # iterations since construction or load_state_dict (DDP's first: its initial layout)
        self._where: dict[int, tuple[int, int, int, torch.Size]] = {}  # ordinal -> (plan bucket, offset, numel, shape)
        self._plan_buffers: dict[int, torch.Tensor] = {}  # plan bucket -> its gather buffer (off-plan DDP buckets)
        self._reducers: dict[int, SparseAllreduce] = {}
        self._iteration: _Iteration | None = None
        #: DDP's buckets as last seen: bucket index -> [(param ordinal, offset, numel, shape)]
        self._layouts: dict[int, list[_Entry]] = {}
        self._ordinals: dict[int, int] = {}          # id(parameter) -> ordinal
        self._loose_residuals: dict[int, torch.Tensor] = {}  # ordinal -> loaded residual waiting for its reducer
        self._loose_algorithm_states: dict[int, dict[str, Any]] = {}  # plan bucket -> loaded algorithm state
        self.last_stats: dict[int, dict[str, Any]] = {}
        #: 0 while fresh; after load_state_dict the loaded save's fingerprint, handed to every
        #: reducer (SparseAllreduce._checkpoint_id), whose first handshake compares it across ranks
        self._checkpoint_id = 0
        #: (rank, world size) of a loaded state whose owner could not be checked at load time
        #: (no process group or Comm yet): checked when the Comm is built
        self._unchecked_owner: tuple[Any, Any, bool] | None = None
        #: DDP buckets that were not a bucket of the plan and went through its gather buffers
        #: (each costs one copy of its gradients in and one of the result out)
        self.regrouped_buckets = 0

    def density_at(self, step: int | None = None) -> float:
        """The density of hook step ``step`` (default: the next step); 1.0 during ``warmup_steps``."""
        step = self.step if step is None else step
        if step < self.warmup_steps:
            return 1.0
        return self.density if self.density_schedule is None else self.density_schedule.density_at(step, self.density)

    # -- plumbing -------------------------------------------------------------------------
    @property
    def comm(self) -> Comm:
        # Built on DDP's thread at the first bucket (the same point on every rank): a
        # TorchComm runs on a private process group, so DDP's own collectives (e.g. its
        # find_unused_parameters allreduce) never interleave with the hook's.
        if self._closed:
            raise ValueError("sparsecomm: this DDPHookState was closed; build a new one on every rank (its "
                             "state_dict() carries the residuals) and register it on the model")
        if self._comm is None:
            from .comm.torch_comm import TorchComm
            size = _group_size(self.process_group)
            if size is not None:  # options that need P fail here, on every rank, before any message
                self._options_checked.check_size(size)
            self._comm = TorchComm(self.process_group)
        if self._unchecked_owner is not None:
            saved_rank, saved_size, per_rank = self._unchecked_owner
            self._unchecked_owner = None
            try:
                check_owner("DDPHookState", saved_rank, saved_size, self._comm.rank, self._comm.size, per_rank)
            except ValueError as exc:  # the peers are about to wait for this rank's first bucket
                if self._comm.size > 1:
                    self._comm.abort(f"ValueError: {exc} (loading the hook's state, before it sent anything)")
                raise
        return self._comm

    def _scoped(self, job, comm: Comm):
        """``job`` run as one call of the warm-up's scope (its own tag; a failure on this
        rank makes every rank raise, see Comm.call_scope)."""
        if self._warmup is None or self._warmup[0] is not comm:
            self._warmup = (comm, comm.new_scope("DDP hook warm-up (dense allreduce)"))
        scope = self._warmup[1]

        def run():
            with comm.call_scope(scope):
                return job()
        return run

    def _layout_of(self, bucket: dist.GradBucket) -> list[_Entry]:
        buffer = bucket.buffer()
        base, item = buffer.data_ptr(), buffer.element_size()
        layout = []
        for param, grad in zip(bucket.parameters(), bucket.gradients()):
            ordinal = self._ordinals.setdefault(id(param), len(self._ordinals))
            layout.append((ordinal, (grad.data_ptr() - base) // item, grad.numel(), param.shape))
        return layout

    def _set_plan(self, plan: list[_PlanBucket]) -> None:
        self._plan = list(plan)
        self._where = {}
        for j, planned in enumerate(plan):
            for ordinal, offset, numel, shape in planned.entries:
                self._where[ordinal] = (j, offset, numel, shape)
        self._plan_complete = True

    def _residual_pieces(self) -> dict[int, torch.Tensor]:
        """Every reducer's residual cut into per-parameter copies, keyed by ordinal."""
        pieces = {}
        for j, reducer in self._reducers.items():
            if reducer.residual is None:
                continue
            flat = reducer.residual.detach().reshape(-1)
            for ordinal, offset, numel, _ in self._plan[j].entries:
                pieces[ordinal] = flat[offset:offset + numel].clone()
        return pieces

    def _drain(self) -> None:
        """Wait until the background worker has run every queued bucket."""
        if self._worker is not None:
            self._worker.drain()

    def _adopt(self, plan: list[_PlanBucket]) -> None:
        """Make ``plan`` (DDP's rebuilt layout) the plan for good. A bucket equal to the old
        plan's bucket of the same index keeps its reducer (residual and algorithm state); the
        residuals of the others are cut into per-parameter pieces and reassembled in the new
        buckets (no residual is lost), and of their algorithm state only what belongs to no
        particular tensor carries over (``Algorithm.carried_state``: step counters); the rest
        (spardl's B-SAG h, sparcml's observed fill-in) was about the old tensors."""
        self._drain()  # no reducer may be running while its residual is cut up
        old = self._plan
        keep = {j for j, planned in enumerate(plan) if j < len(old) and self._same_layout([planned], [old[j]])}
        old_states = {**self._loose_algorithm_states,
                      **{j: reducer.algorithm.state_dict() for j, reducer in self._reducers.items()}}
        carried = algorithms.get(self.algorithm).carried_state(old_states.get(0, {}))
        for j, reducer in self._reducers.items():
            if j not in keep and reducer.residual is not None:
                flat = reducer.residual.detach().reshape(-1)
                for ordinal, offset, numel, _ in old[j].entries:
                    self._loose_residuals[ordinal] = flat[offset:offset + numel].clone()
        self._reducers = {j: reducer for j, reducer in self._reducers.items() if j in keep}
        self._plan_buffers = {j: buf for j, buf in self._plan_buffers.items() if j in keep}
        states = {j: state for j, state in self._loose_algorithm_states.items() if j in keep}
        if carried:
            states.update({j: dict(carried) for j in range(len(plan)) if j not in keep})
        self._loose_algorithm_states = states
        self._set_plan(plan)
        self._plan_final, self._next_plan = True, None

    def _reducer(self, j: int) -> SparseAllreduce:
        """Plan bucket ``j``'s reducer, built at its first use from what a loaded state holds."""
        reducer = self._reducers.get(j)
        if reducer is not None:
            return reducer
        planned = self._plan[j]
        reducer = SparseAllreduce(self.algorithm, self.density, comm=self.comm, nonfinite=self.nonfinite,
                                  density_schedule=self.density_schedule, **self.options)
        algorithm_state = self._loose_algorithm_states.pop(j, {})
        pieces = [(entry, self._loose_residuals.pop(entry[0], None)) for entry in planned.entries]
        if algorithm_state or any(piece is not None for _, piece in pieces):
            work_dtype = torch.float32 if planned.dtype in (torch.float16, torch.bfloat16) else planned.dtype
            residual = torch.zeros(planned.numel, dtype=work_dtype)
            missing = []
            for (ordinal, offset, numel, _), piece in pieces:
                if piece is not None and piece.numel() == numel and piece.dtype == work_dtype:
                    residual[offset:offset + numel].copy_(piece.reshape(-1))
                elif piece is not None:
                    missing.append(ordinal)
            if missing:
                warnings.warn(f"sparsecomm: bucket {j}: residuals of parameters {missing} no longer fit "
                              "(shape or dtype changed); they restart from zero", RuntimeWarning, stacklevel=4)
            try:
                reducer.load_state_dict({"checkpoint_version": CHECKPOINT_VERSION, "algorithm": self.algorithm,
                                         "density": self.density, "rank": self.comm.rank,
                                         "world_size": self.comm.size, "fingerprint": self._checkpoint_id,
                                         "residual": residual, "algorithm_state": algorithm_state})
            except (ValueError, TypeError) as exc:
                # a state only this rank loaded: its peers are about to wait for this bucket's
                # messages, so they are told (CommAbortedError naming this rank) instead of
                # waiting out the timeout, as for a reducer's own argument errors
                if self.comm.size > 1:
                    self.comm.abort(f"{type(exc).__name__}: {exc} (restoring bucket {j}'s saved state, "
                                    "before it sent anything)")
                raise
        reducer._checkpoint_id = self._checkpoint_id  # compared by its first handshake, also when nothing loaded
        self._reducers[j] = reducer
        return reducer

    # -- one bucket -----------------------------------------------------------------------
    def _on_bucket(self, bucket: dist.GradBucket) -> torch.futures.Future:
        """Route DDP bucket ``bucket`` through the plan; the Future completes with its average."""
        index, buffer = bucket.index(), bucket.buffer()
        entries = self._layout_of(bucket)
        self._layouts[index] = entries
        self.comm  # noqa: B018 - built here, on DDP's thread, at the same point on every rank
        if index == 0 or self._iteration is None:
            if self._next_plan is not None and self.step >= ADOPT_STEP:
                self._adopt(self._next_plan)
            # DDP's layout is settled (this is not its first iteration) but unknown to the plan
            # at a step that must already use it (a resume from a checkpoint after step 1):
            # hold this iteration's buckets until its layout is known, then adopt it
            defer = (self._plan_complete and not self._plan_final and self._next_plan is None
                     and self._seen >= 1 and self.step >= ADOPT_STEP)
            self._iteration = _Iteration(self.step, defer)
            self._observed = []
        it = self._iteration
        self._observed.append(_PlanBucket(entries, buffer.numel(), buffer.dtype))
        if not self._plan_complete:  # the first backward this state sees: DDP's buckets are the plan
            if index != len(self._plan):
                raise RuntimeError(f"sparsecomm: DDP bucket {index} arrived while recording bucket "
                                   f"{len(self._plan)} of the first iteration (buckets run in index order)")
            self._plan.append(_PlanBucket(entries, buffer.numel(), buffer.dtype))
            if bucket.is_last():
                self._set_plan(self._plan)
        future: torch.futures.Future = torch.futures.Future()
        if it.defer:
            it.deferred.append((index, buffer, future))
        elif it.next == index and index < len(self._plan) and index not in it.missing \
                and self._plan[index].matches(entries, buffer):
            it.next += 1
            self._start(index, buffer, it, future, ())  # the plan's own bucket: reduced in place
        else:
            self.regrouped_buckets += 1
            self._gather(index, buffer, entries, it, future)
        if bucket.is_last():
            if it.defer:
                if not self._same_layout(self._observed, self._plan):
                    self._adopt(self._observed)
                self._plan_final = True
                for j, held, held_future in it.deferred:  # now the plan's own buckets, in order
                    it.next += 1
                    self._start(j, held, it, held_future, ())
            elif self._plan_complete and not self._plan_final and self._next_plan is None and self._seen >= 1:
                # DDP's settled layout (it rebuilds after its first iteration, if at all)
                if self._same_layout(self._observed, self._plan):
                    self._plan_final = True
                else:
                    self._next_plan = self._observed  # the plan from ADOPT_STEP on
            self._seen += 1
            self.step += 1
            self._iteration = None
            if it.next != len(self._plan):
                short = {j: it.missing.get(j, len(self._plan[j].entries)) for j in range(it.next, len(self._plan))}
                raise ValueError(f"sparsecomm: this iteration's DDP buckets lack parameters of the hook's recorded "
                                 f"layout (recorded bucket: parameters missing = {short}): the model changed; "
                                 "build a new DDPHookState (and drop its state_dict) for it")
        return future

    @staticmethod
    def _same_layout(a: list[_PlanBucket], b: list[_PlanBucket]) -> bool:
        return len(a) == len(b) and all(x.entries == y.entries and x.numel == y.numel and x.dtype == y.dtype
                                        for x, y in zip(a, b))

    def _gather(self, index: int, buffer: torch.Tensor, entries: list[_Entry], it: _Iteration,
                future: torch.futures.Future) -> None:
        """Copy a DDP bucket that is not the plan's into the plan buckets' buffers; start every
        plan bucket that is then complete, in plan order."""
        touched = set()
        for ordinal, offset, numel, shape in entries:
            where = self._where.get(ordinal)
            if where is None or where[2] != numel or where[3] != shape:
                raise ValueError(f"sparsecomm: DDP bucket {index} holds parameter {ordinal} (shape {tuple(shape)}), "
                                 "which the hook's recorded layout does not have with that shape: the model "
                                 "changed; build a new DDPHookState (and drop its state_dict) for it")
            j, plan_offset, _, _ = where
            if self._plan[j].dtype != buffer.dtype:
                raise ValueError(f"sparsecomm: parameter {ordinal} is {buffer.dtype} in DDP bucket {index} but "
                                 f"{self._plan[j].dtype} in the hook's recorded layout: the model changed")
            if j < it.next or it.missing.get(j) == 0:
                raise ValueError(f"sparsecomm: parameter {ordinal} reached the hook twice in one iteration")
            target = self._plan_buffers.get(j)
            if target is None:
                target = self._plan_buffers[j] = torch.zeros(self._plan[j].numel, dtype=buffer.dtype,
                                                             device=buffer.device)
            target[plan_offset:plan_offset + numel].copy_(buffer[offset:offset + numel])
            it.missing[j] = it.missing.get(j, len(self._plan[j].entries)) - 1
            it.scatter.setdefault(j, []).append((buffer, offset, plan_offset, numel, index))
            touched.add(j)
        it.waiting[index] = [future, buffer, len(touched)]
        if not touched:
            future.set_result(buffer)
        while it.next < len(self._plan) and it.missing.get(it.next) == 0:
            j = it.next
            it.next += 1
            scatter = it.scatter.pop(j)
            done: torch.futures.Future = torch.futures.Future()
            owners = sorted({entry[4] for entry in scatter})
            done.add_done_callback(lambda f, owners=owners, it=it: self._settle(f, owners, it))
            self._start(j, self._plan_buffers[j], it, done, scatter)

    @staticmethod
    def _settle(done: torch.futures.Future, owners: list[int], it: _Iteration) -> None:
        """A plan bucket finished: complete the DDP buckets it was the last one for, or fail
        them all with its exception (its own type, see ``fail_future``)."""
        try:
            done.wait()
        except BaseException as exc:  # noqa: BLE001 - handed on to DDP's Futures
            for owner in owners:
                future = it.waiting[owner][0]
                if not future.done():
                    fail_future(future, exc)
            return
        for owner in owners:
            record = it.waiting[owner]
            record[2] -= 1
            if record[2] == 0 and not record[0].done():
                record[0].set_result(record[1])

    def _start(self, j: int, target: torch.Tensor, it: _Iteration, future: torch.futures.Future,
               scatter) -> None:
        """Reduce plan bucket ``j`` held in ``target`` (averaged in place), then copy the result
        to the DDP buckets in ``scatter``; on the worker, or now when not async."""
        comm = self.comm
        reducer = None if it.step < self.warmup_steps else self._reducer(j)
        step = it.step  # the schedule's step, decided here on DDP's thread like everything else

        def job() -> torch.Tensor:
            if reducer is None:  # DDP's own allreduce_hook: divide first, then sum
                target.div_(comm.size)
                comm.allreduce_dense(target)
            elif target.dtype in (torch.float16, torch.bfloat16):
                # the float32 sum, divided before the one rounding to the bucket's dtype
                total = reducer(target, out=torch.empty(target.shape, dtype=torch.float32, device=target.device),
                                step=step)
                target.copy_(total.div_(comm.size))
            else:
                reducer(target, out=target, step=step)  # the reducer reads the gradient before writing the sum
                target.div_(comm.size)
            if reducer is not None:
                self.last_stats[j] = reducer.last_stats
            for buffer, offset, plan_offset, numel, _ in scatter:
                buffer[offset:offset + numel].copy_(target[plan_offset:plan_offset + numel])
            return target

        run = job if reducer is not None else self._scoped(job, comm)  # reducers scope their own calls
        if self.async_comm:
            self._submit(run, future)
        else:
            future.set_result(run())

    # -- checkpointing ----------------------------------------------------------------------
    def _rank_and_size(self) -> tuple[int | None, int | None]:
        """This state's rank and world size: its Comm's, else the process group's, else unknown."""
        if self._comm is not None:
            return self._comm.rank, self._comm.size
        size = _group_size(self.process_group)
        return (None, None) if size is None else (dist.get_rank(self.process_group), size)

    def local_state_dict(self) -> dict[str, Any]:
        """This rank's state as a plain dict: everything that decides the next reductions --
        the step, the plan (bucket layout), every parameter's residual (``residuals``, by
        parameter ordinal) and every plan bucket's algorithm state (``algorithm_states``) --
        and whose it is: ``rank``, ``world_size`` and ``fingerprint`` (equal on every rank of one
        save: configuration, world size, step and plan; sparsecomm/_checkpoint.py).
        :meth:`state_dict` is this dict packed for saving; :meth:`load_state_dict` takes either."""
        self._drain()
        residuals = {**self._loose_residuals, **self._residual_pieces()}
        algorithm_states = {**self._loose_algorithm_states,
                            **{j: reducer.algorithm.state_dict() for j, reducer in self._reducers.items()}}
        rank, size = self._rank_and_size()
        state = {"checkpoint_version": CHECKPOINT_VERSION, "algorithm": self.algorithm, "density": self.density,
                 "options": dict(self.options), "nonfinite": self.nonfinite, "warmup_steps": self.warmup_steps,
                 "density_schedule": None if self.density_schedule is None else self.density_schedule.to_state(),
                 "step": self.step,
                 "layout": [planned.to_state() for planned in self._plan] if self._plan_complete else None,
                 "layout_final": self._plan_final,
                 "next_layout": None if self._next_plan is None else [planned.to_state() for planned in self._next_plan]}
        state["rank"], state["world_size"] = rank, size
        algorithm_states = {j: s for j, s in algorithm_states.items() if s}
        pristine = not (self.step or self._plan_complete or residuals or algorithm_states)
        # 0 for a state that has seen nothing (as a fresh one: loading it changes nothing)
        state["fingerprint"] = 0 if pristine else \
            fingerprint("DDPHookState", {key: state[key] for key in sorted(state) if key != "rank"})
        state["residuals"] = residuals
        state["algorithm_states"] = algorithm_states
        return state

    def state_dict(self) -> dict[str, Any]:
        """The state to save, one per rank: ``{"sparsecomm": "DDPHookState", "checkpoint_version",
        "world_size", "fingerprint", "rank<r>": bytes}``, where ``rank<r>`` holds this rank's
        :meth:`local_state_dict` (``torch.save`` bytes). Local: no communication.

        Saved with ``torch.save(state.state_dict(), f"hook_rank{rank}.pt")`` on every rank, or as
        a ``torch.distributed.checkpoint`` ``Stateful`` (``dcp.save({"model": ..., "hook": state})``):
        the per-rank part sits under a key of its own rank, so DCP writes each rank's own and
        gives it back to that rank (a plain per-rank dict of tensors would be deduplicated as
        replicated, and a fresh state could not name its residuals for DCP to fill in). The few
        keys beside it are the same on every rank."""
        local = self.local_state_dict()
        buffer = io.BytesIO()
        torch.save(local, buffer)
        key = "rank?" if local["rank"] is None else f"rank{local['rank']}"
        return {"sparsecomm": "DDPHookState", "checkpoint_version": CHECKPOINT_VERSION,
                "world_size": local["world_size"], "fingerprint": local["fingerprint"], key: buffer.getvalue()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (or :meth:`local_state_dict`) of this rank, before the
        first step. Refused with a ValueError that says what to do: another rank's state (when
        it holds residuals or algorithm state: every rank must load its own), a state saved by
        another number of ranks (not supported: residuals are per rank), another algorithm,
        density, options or schedule, another checkpoint version. Ranks that load different
        saves (or some none) raise together at their first sparse bucket (the reducers'
        handshake compares the save's fingerprint)."""
        if isinstance(state, dict) and state.get("sparsecomm") == "DDPHookState":
            state = self._unpack(state)
        check_version(state, "DDPHookState")
        for key in ("algorithm", "density", "options"):
            if state.get(key) != getattr(self, key):
                raise ValueError(f"state_dict has {key}={state.get(key)!r}, this hook state has "
                                 f"{getattr(self, key)!r}")
        saved_schedule = as_schedule(state.get("density_schedule"))
        if saved_schedule != self.density_schedule:
            raise ValueError(f"state_dict has density_schedule={saved_schedule!r}, this hook state has "
                             f"{self.density_schedule!r}: build the state with the checkpoint's schedule")
        raw = state.get("algorithm_states", {})
        if not isinstance(raw, dict) or not all(isinstance(s, dict) for s in raw.values()):
            raise ValueError("state_dict's algorithm_states must map bucket numbers to dicts (each an algorithm's "
                             f"state_dict()); got {raw!r}"[:300])
        mark = loaded_fingerprint(state)
        per_rank = bool(state.get("residuals")) or bool(raw)
        rank, size = self._rank_and_size()
        try:
            check_owner("DDPHookState", state.get("rank"), state.get("world_size"), rank, size, per_rank)
        except ValueError as exc:
            # the peers that loaded their own state are about to build the Comm at their first
            # bucket (a collective: without this rank it waits for the process group's timeout)
            # and wait for this rank's messages: join that construction and abort the Comm, so
            # they raise naming this rank at once
            if size is not None and size > 1 and not self._closed:
                self.comm.abort(f"ValueError: {exc} (loading the hook's state, before it sent anything)")
            raise
        self._drain()
        self._unchecked_owner = (state.get("rank"), state.get("world_size"), per_rank) if rank is None else None
        self._checkpoint_id = mark
        self.step = int(state["step"])
        self.warmup_steps = int(state.get("warmup_steps", self.warmup_steps))
        self._reducers.clear()
        self._plan_buffers.clear()
        self._iteration = None
        self._plan, self._where, self._plan_complete = [], {}, False
        if state.get("layout"):
            self._set_plan([_PlanBucket.from_state(planned) for planned in state["layout"]])
        self._plan_final = bool(state.get("layout_final", False))
        self._seen = 0
        self._next_plan = None if not state.get("next_layout") else \
            [_PlanBucket.from_state(planned) for planned in state["next_layout"]]
        self._loose_residuals = {int(k): v for k, v in state["residuals"].items()}
        self._loose_algorithm_states = {int(j): dict(s) for j, s in raw.items()}

    def _unpack(self, packed: dict[str, Any]) -> dict[str, Any]:
        """This rank's local state out of a :meth:`state_dict`, or the error naming whose it is."""
        if packed.get("checkpoint_version") != CHECKPOINT_VERSION:
            check_version(packed, "DDPHookState")
        parts = {key: value for key, value in packed.items() if key.startswith("rank")}
        rank, _ = self._rank_and_size()
        key = f"rank{rank}" if f"rank{rank}" in parts else ("rank?" if "rank?" in parts else None)
        if key is None and rank is None and len(parts) == 1:
            key = next(iter(parts))   # checked against the Comm's rank when it is built
        if key is None and len(parts) == 1:
            key = next(iter(parts))   # another rank's: refused below if it holds per-rank data
        if key is None or not isinstance(parts[key], (bytes, bytearray)):
            raise ValueError(f"this DDPHookState state_dict holds the parts {sorted(parts)}, none of them this "
                             f"rank's (rank {rank}): " + HOW_TO_SAVE)
        local = torch.load(io.BytesIO(parts[key]), weights_only=True)
        if not isinstance(local, dict):
            raise ValueError(f"this DDPHookState state_dict's part {key} is not a state: {type(local).__name__}")
        return local

    def __getstate__(self) -> dict[str, Any]:
        # process groups, communicators and the worker thread cannot be pickled;
        # configuration and residuals can
        return {**self.local_state_dict(), "async_comm": self.async_comm}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["algorithm"], state["density"], process_group=None,
                      warmup_steps=state["warmup_steps"], async_comm=state.get("async_comm", True),
                      nonfinite=state.get("nonfinite", "propagate"),
                      density_schedule=state.get("density_schedule"), **state["options"])
        self.load_state_dict(state)

    def close(self) -> None:
        """Release what the state took: stop the background worker (after the queued buckets)
        and close the Comm it built (a TorchComm's private process group, sockets and threads;
        a Comm passed as ``comm=`` is the caller's to close). Call it on every rank when done
        with the model, or before building a new state after a failure. ``state_dict()`` still
        works; a later bucket raises ValueError. Idempotent."""
        if self._worker is not None:
            self._worker.stop()
            self._worker = None
        self._closed = True
        if self._owns_comm and self._comm is not None and hasattr(self._comm, "close"):
            self._comm.close()

    def _submit(self, job, future: torch.futures.Future) -> None:
        if self._worker is None or not self._worker.alive():
            self._worker = BucketWorker()
        self._worker.submit(job, future)


def ddp_hook(state: DDPHookState, bucket: dist.GradBucket) -> torch.futures.Future:
    """DDP communication hook: sparse allreduce of the bucket, averaged over the ranks.

    Register with ``model.register_comm_hook(state, sparsecomm.ddp_hook)``. With
    ``state.async_comm`` (default) the collective is queued on the state's background
    worker and the Future completes when it has run; otherwise it runs before returning.
    Buckets are reduced in the layout of the first iteration the state saw (its *plan*):
    see the module docstring, "Bucket rebuilds and exact resume".
    """
    return state._on_bucket(bucket)


# DDP checks the hook's annotations as objects (``from __future__ import annotations``
# would leave them as strings and make register_comm_hook reject the hook).
ddp_hook.__annotations__ = {"state": DDPHookState, "bucket": dist.GradBucket,
                            "return": torch.futures.Future[torch.Tensor]}
