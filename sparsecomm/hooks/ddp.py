"""The DDP communication hook: ``model.register_comm_hook(state, sparsecomm.ddp_hook)``.

Each DDP gradient bucket goes through a :class:`~sparsecomm.SparseAllreduce` (one per bucket of
the hook's bucket layout, see "Bucket rebuilds" below); the hook writes the average (sum / world size) into the
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

Bucket rebuilds and exact resume. DDP rebuilds its buckets after its first iteration, and a
fresh DDP after a restart starts from its initial layout again; bucket membership and order
decide the result of every position-dependent algorithm, so the hook reduces every step in its
own bucket *layout* (:mod:`sparsecomm.hooks.bucket_layout`: DDP's initial layout for steps 0 and 1, its
rebuilt layout from step 2 on), with one reducer per layout bucket, regrouping DDP's buckets
into it when they differ. Adopting the rebuilt layout keeps every residual: residuals are cut
per parameter and reassembled; a bucket equal to the old layout's bucket of the same index
keeps its reducer; of the other buckets' algorithm state only counters that belong to no
tensor carry over (``Algorithm.carried_state``: QSGD's and gssgd's step); per-tensor adaptive
state (spardl's B-SAG h, sparcml's observed fill-in, oktopk's thresholds and boundaries)
restarts, as it describes tensors that no longer exist. ``regrouped_buckets`` counts the DDP
buckets that went through the layout's buffers.

Checkpointing: :meth:`DDPHookState.state_dict` stores the step, the bucket layout (and a
rebuilt layout waiting for step 2), every parameter's residual and every layout bucket's algorithm state
(``algorithm_states``); restored with ``load_state_dict`` into a fresh state registered on a
fresh DDP model, training continues bit-identically to the uninterrupted run
(tests/test_resume.py: every algorithm; plain DDP, small buckets, ``gradient_as_bucket_view``,
``static_graph``, ``no_sync``, ``find_unused_parameters``, fp16 and bf16 parameters, warm-up;
P = 2 and 3). The state pickles without its process group (like PowerSGD's state), and the
default group is used after unpickling unless ``process_group`` is set again.

The state is per rank (each rank's residuals), so it records whose it is -- ``rank``,
``world_size`` and a ``fingerprint`` equal on every rank of one save (:mod:`sparsecomm.reduce.checkpoint`)
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
ValueError, CommError or CommTimeoutError itself (``bucket_worker.fail_future``). ``state_dict``, pickling and DDP's bucket rebuild first
wait for the queue to drain. The worker thread is not pickled; a new one starts lazily.
With ``async_comm=False`` the collectives run inside the hook (the Future is complete
when returned); results are identical either way.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import torch
import torch.distributed as dist

from .. import algorithms
from ..comm.base import Comm, ring_allreduce_cost
from ..comm.topology import NodeComms, Topology
from ..errors import AgreedValueError
from ..reduce import CHECKPOINT_VERSION, DensitySchedule, SparseAllreduce, check_hierarchy, saved_text
from ..reduce.density import check_step
from ..reduce.local_update import LocalUpdate
from ..reduce.checkpoint import fingerprint, gather_rank_parts, loaded_fingerprint, pack_rank_part
from .bucket_layout import BucketLayout, LayoutBucket
from .bucket_worker import BucketWorker
from .config import HookConfig, dense_part_stats, group_size, reduce_average

__all__ = ["DDPHookState", "ddp_hook", "register"]


class DDPHookState(HookConfig):
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
        hierarchy: ``"flat"`` (default: every rank a peer of every other), ``"auto"`` (each bucket's
            reducer picks flat or two-level by the cost model on the measured links, see
            :class:`~sparsecomm.SparseAllreduce`) or ``"node"``: each
            bucket is reduce-scattered densely inside the node, each rank's shard goes through
            the algorithm among the ranks of the same local rank on the other nodes (density is
            per shard: a node sends about ``density * N`` elements' worth, not L times that),
            and the node all-gathers the reduced shards (:class:`~sparsecomm.SparseAllreduce`).
        nodes: the cluster's shape for ``hierarchy="node"`` / ``"auto"``: a
            :class:`~sparsecomm.Topology`; default: torchrun's variables (:meth:`Topology.from_env`),
            read here. (Not ``topology``: that is skcompress's option.)
        momentum, nesterov, momentum_masking, clip_norm: momentum correction, momentum factor
            masking and local gradient clipping (Deep Gradient Compression, sections 3.2-3.3;
            :class:`~sparsecomm.SparseAllreduce`): with ``momentum=0.9`` each rank accumulates a
            velocity instead of the gradient, and the optimizer must run *without* momentum
            (``torch.optim.SGD(params, lr, momentum=0)``). Not with ``warmup_steps`` (use a
            ``density_schedule`` for a warm-up). ``clip_norm`` bounds the sum over ranks: in place of
            ``clip_grad_norm_(params, c)`` on the average, ``clip_norm=c * world_size``. Off by default.
        residual_dtype: the residuals' form between steps: None (float32, 4 bytes per parameter),
            ``torch.bfloat16`` (2) or ``"int8"`` (1 + 1/64: 8 bits with a power-of-two scale per block
            of 64), widened for each call; what the narrowing rounds away is reported per bucket as
            ``last_stats[j]["residual_rounding"]`` (:mod:`sparsecomm.reduce.residual_store`).
        policy: which parameters go dense or through another treatment
            (:mod:`sparsecomm.hooks.policy`): None (default: every parameter through ``algorithm``),
            ``"default"`` (``sparsecomm.Policy()``: parameters of at most one dimension and of fewer
            than 4096 elements dense) or a :class:`~sparsecomm.Policy` of rules by name, module type
            and size. Each DDP bucket is then reduced in one call per treatment (one dense allreduce
            of its dense parameters, one sparse call per other treatment, gathered contiguously);
            ``last_stats[j]["treatment"]`` names each layout bucket's, :meth:`treatment_stats` sums
            the bytes per treatment. Rules by name or module need the model:
            ``sparsecomm.register(model, state)`` (or :meth:`bind`).
        **options: options of the algorithm, validated here.
    """

    KIND = "DDPHookState"
    #: the keys of every local_state_dict() of CHECKPOINT_VERSION; their names are the checkpoint's
    #: on-disk format (e.g. "layout" for the bucket layout), kept as they are
    STATE_KEYS = ("checkpoint_version", "algorithm", "density", "options", "nonfinite", "warmup_steps",
                  "density_schedule", "step", "layout", "layout_final", "next_layout", "rank", "world_size",
                  "fingerprint", "residuals", "algorithm_states")

    def __init__(self, algorithm: str, density: float, process_group: Any = None, warmup_steps: int = 0,
                 comm: Comm | None = None, async_comm: bool = True, nonfinite: str = "propagate",
                 density_schedule: DensitySchedule | None = None, hierarchy: str = "flat",
                 nodes: Topology | None = None, momentum: float = 0.0, nesterov: bool = False,
                 momentum_masking: bool = False, clip_norm: float | None = None, residual_dtype: Any = None,
                 policy: Any = None, **options: Any):
        check_hierarchy(hierarchy, nodes)
        local_update = LocalUpdate(momentum, nesterov, momentum_masking, clip_norm)
        if isinstance(nodes, NodeComms):
            raise ValueError("DDPHookState takes a Topology as nodes (it splits its own Comm), not NodeComms")
        topology = nodes
        self.hierarchy = hierarchy
        if hierarchy == "node":
            self.topology = topology or Topology.from_env()
        elif hierarchy == "auto" and topology is None and os.environ.get("LOCAL_WORLD_SIZE") not in (None, ""):
            self.topology = Topology.from_env()    # auto without a topology is flat (SparseAllreduce)
        else:
            self.topology = topology if hierarchy == "auto" else None
        if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 0:
            raise ValueError(f"warmup_steps must be an integer >= 0, got {warmup_steps!r}")
        if warmup_steps and local_update.momentum > 0.0:
            raise ValueError("warmup_steps (dense steps outside the reducers) cannot keep momentum correction's "
                             "velocity; for a warm-up with momentum use density_schedule="
                             "DensitySchedule(...) (denser first steps through the reducers)")
        if not isinstance(async_comm, bool):
            raise ValueError(f"async_comm must be True or False, got {async_comm!r}")
        # validates the options now, not at the first bucket; those that depend on the number
        # of ranks (spardl's teams) too when it is known already, else in `comm` below
        self._configure(algorithm, density, nonfinite, density_schedule, options, comm, local_update, residual_dtype,
                        policy)
        size = comm.size if comm is not None else group_size(process_group)
        if self.hierarchy == "node":   # two levels: the algorithm runs among one rank per node
            size = self.topology.nodes
        elif self.hierarchy == "auto":   # either: checked by the reducer once it has decided
            size = None
        if size is not None:
            self._options_checked.check_size(size)
        self.async_comm = async_comm
        self._worker: BucketWorker | None = None
        self.warmup_steps = warmup_steps
        self.process_group = process_group
        self.step = 0
        self._warmup = None  # (comm, CallScope) of the warm-up's dense allreduce
        self._dense_part = None  # (comm, CallScope) of a policy's dense parameters' allreduce
        # the bucket layout the reductions use (hooks/bucket_layout.py); one reducer per bucket of it
        self._layout = BucketLayout(None if self.policy is None else self.treatment_key)
        self._policy_agreed = False   # compared over the ranks at the first bucket (_agree_policy)
        self._agreement = None        # its scope, until the first reduction's job runs it
        self._reducers: dict[int, SparseAllreduce] = {}
        self._loose_residuals: dict[int, torch.Tensor] = {}  # ordinal -> loaded residual waiting for its reducer
        self._loose_velocities: dict[int, torch.Tensor] = {}  # the same for momentum correction's velocities
        #: layout bucket -> an adaptive schedule's loaded regime (a bucket the layout changed starts afresh)
        self._loose_density_states: dict[int, dict[str, Any]] = {}
        self._loose_algorithm_states: dict[int, dict[str, Any]] = {}  # layout bucket -> loaded algorithm state
        self.last_stats: dict[int, dict[str, Any]] = {}
        # layout bucket -> (hook step, bytes of its dense allreduce) of its last_stats, for summary()
        self._reported: dict[int, tuple[int, int]] = {}

    def summary(self) -> str:
        """One line on the last step the hook reduced sparsely, from :attr:`last_stats` (a dict of
        about 25 figures per bucket): the bytes this rank sent, their ratio to what DDP's dense
        ring allreduce of the same buckets sends per rank (2 (P-1) ceil(bytes / P)), the algorithm
        (under ``auto``: the one each bucket ran, ``trying`` while its trials last), the density, the
        buckets, and the bytes the call's setup sent besides (agreement handshake; under ``auto``
        the first step's link measurement), which ``bytes_sent`` leaves out; a step whose gradient
        held NaN or Inf on some rank names those ranks (``nonfinite="propagate"``: a dense sum)::

            step 12: topka, density 0.01: sent 21.7 kB = 0.0403x dense's 539 kB, 2 buckets
            step 12: topka, density 0.01: sent 23.1 kB = 0.0429x dense's 539 kB, 4 buckets (1.4 kB of it dense parameters)
            step 1: auto trying topka, density 0.01: sent 1.58 kB = 0.0206x dense's 76.8 kB, 1 bucket
              (+4.46 MB setup)

        Local: no communication. Before the first step, and during ``warmup_steps`` (DDP's dense
        allreduce, not counted), it says so."""
        name = self.algorithm
        latest = max((step for step, _ in self._reported.values()), default=None)
        if self.step == 0 or (latest is None and self.step > self.warmup_steps):
            return f"{name} at density {self.density:g}: no step reduced yet"
        if latest is None:
            return (f"step {self.step}: warm-up, DDP's dense allreduce ({self.warmup_steps} warm-up steps; {name} "
                    f"from step {self.warmup_steps + 1})")
        buckets = sorted(j for j, (step, _) in self._reported.items() if step == latest)
        stats = [self.last_stats[j] for j in buckets]
        sent = sum(s.get("bytes_sent", 0) for s in stats)
        size = self._comm.size if self._comm is not None else 1
        dense = sum(ring_allreduce_cost(self._reported[j][1], size)[0] for j in buckets)
        text = f"step {latest + 1}: {_algorithm_text(name, stats)}"
        if name != "dense":
            text += f", density {self.density_at(latest):g}"
        nonfinite = sorted({r for s in stats for r in s.get("nonfinite_ranks") or ()})
        if nonfinite:   # "propagate": those buckets went dense, the raw gradients' sum
            text += f", NaN/Inf on rank{'s' if len(nonfinite) > 1 else ''} {', '.join(map(str, nonfinite))}: dense sum"
        text += f": sent {_bytes_text(sent)}"
        if any(s.get("hierarchy") == "node" for s in stats):
            text += f" ({_bytes_text(sum(s.get('inter_bytes_sent', 0) for s in stats))} between nodes)"
        text += f" = {sent / dense:.3g}x dense's {_bytes_text(dense)}" if dense else " (1 rank: nothing to send)"
        text += f", {len(buckets)} bucket{'s' if len(buckets) != 1 else ''}"
        dense_part = [s for s in stats if s.get("treatment") == "dense"]
        if dense_part:   # a policy's dense parameters, inside the total
            text += f" ({_bytes_text(sum(s.get('bytes_sent', 0) for s in dense_part))} of it dense parameters)"
        setup = sum(s.get("handshake_bytes", 0) for s in stats)
        return text + (f" (+{_bytes_text(setup)} setup)" if setup else "")

    @property
    def regrouped_buckets(self) -> int:
        """DDP buckets that were not a bucket of the layout and went through its gather
        buffers (each costs one copy of its gradients in and one of the result out)."""
        return self._layout.regrouped_buckets

    # the layout's parameter ordinals and DDP's buckets as last seen, read by tests/test_hook.py
    @property
    def _ordinals(self) -> dict[int, int]:
        return self._layout.ordinals

    @property
    def _layouts(self) -> dict[int, list]:
        return self._layout.ddp_buckets

    def density_at(self, step: int | None = None) -> float:
        """The density of hook step ``step`` (default: the next step); 1.0 during ``warmup_steps``.
        Under an adaptive schedule each bucket's reducer decides its own: the densest bucket's."""
        step = self.step if step is None else check_step(step)
        if step < self.warmup_steps:
            return 1.0
        if self.density_schedule is None:
            return self.density
        if self.density_schedule.kind == "adaptive" and self._reducers:
            return max(reducer.density_at(step) for reducer in self._reducers.values())
        return self.density_schedule.density_at(step, self.density)

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
            from ..comm.torch_comm import TorchComm
            size = group_size(self.process_group)
            if size is not None and self.hierarchy == "flat":  # options that need P fail here, on
                self._options_checked.check_size(size)         # every rank, before any message
            self._comm = TorchComm(self.process_group)
        if self.topology is not None and self._nodes is None:
            # collective, like the Comm's construction: at the first bucket, on every rank
            self._nodes = self.topology.split(self._comm)
        try:
            self._check_deferred_owner(self._comm.rank, self._comm.size)
        except ValueError as exc:  # the peers are about to wait for this rank's first bucket
            if self._comm.size > 1:
                self._comm.abort(f"ValueError: {exc} (loading the hook's state, before it sent anything)")
            raise
        return self._comm

    def _scoped(self, job, comm: Comm, policy_dense: bool = False):
        """``job`` run as one call of the warm-up's scope, or of the policy's dense part's
        (``policy_dense``): its own tag; a failure on this rank makes every rank raise, see
        Comm.call_scope. Scopes are made here, on DDP's thread, in the same order on every rank."""
        which = "_dense_part" if policy_dense else "_warmup"
        if getattr(self, which) is None or getattr(self, which)[0] is not comm:
            label = "DDP hook, a policy's dense parameters" if policy_dense else "DDP hook warm-up (dense allreduce)"
            setattr(self, which, (comm, comm.new_scope(label)))
        scope = getattr(self, which)[1]

        def run():
            with comm.call_scope(scope):
                return job()
        return run

    def _pieces(self, what: str, reducers: dict[int, SparseAllreduce] | None = None,
                buckets: list[LayoutBucket] | None = None) -> dict[int, torch.Tensor]:
        """Every reducer's ``what`` (``"residual"`` or ``"velocity"``) cut into per-parameter
        copies, keyed by ordinal (``buckets``: the layout the reducers were built for)."""
        pieces = {}
        buckets = self._layout.buckets if buckets is None else buckets
        for j, reducer in (self._reducers if reducers is None else reducers).items():
            whole = getattr(reducer, what)
            if whole is None:
                continue
            flat = whole.detach().reshape(-1)
            for ordinal, offset, numel, _ in buckets[j].entries:
                pieces[ordinal] = flat[offset:offset + numel].clone()
        return pieces

    def _drain(self) -> None:
        """Wait until the background worker has run every queued bucket."""
        if self._worker is not None:
            self._worker.drain()

    def _adopt(self, buckets: list[LayoutBucket]) -> None:
        """Make ``buckets`` (DDP's rebuilt layout) the layout for good. A bucket equal to the old
        layout's bucket of the same index keeps its reducer (residual and algorithm state); the
        residuals of the others are cut into per-parameter pieces and reassembled in the new
        buckets (no residual is lost), and of their algorithm state only what belongs to no
        particular tensor carries over (``Algorithm.carried_state``: step counters); the rest
        (spardl's B-SAG h, sparcml's observed fill-in) was about the old tensors."""
        self._drain()  # no reducer may be running while its residual is cut up
        old = self._layout.buckets
        old_states = {**self._loose_algorithm_states,
                      **{j: reducer.algorithm.state_dict() for j, reducer in self._reducers.items()}}
        # what belongs to no tensor, per treatment: from the first old bucket of that treatment
        first_of: dict[str, int] = {}
        for j, bucket in enumerate(old):
            first_of.setdefault(bucket.treatment, j)
        keep = self._layout.adopt(buckets)
        leaving = {j: reducer for j, reducer in self._reducers.items() if j not in keep}
        self._loose_residuals.update(self._pieces("residual", leaving, old))
        self._loose_velocities.update(self._pieces("velocity", leaving, old))
        self._reducers = {j: reducer for j, reducer in self._reducers.items() if j in keep}
        self._loose_density_states = {j: s for j, s in self._loose_density_states.items() if j in keep}
        states = {j: state for j, state in self._loose_algorithm_states.items() if j in keep}
        for j, bucket in enumerate(buckets):
            if j in keep:
                continue
            algorithm = self.configuration_of(bucket.treatment)[0]
            carried = algorithms.get(algorithm).carried_state(old_states.get(first_of.get(bucket.treatment, -1), {}))
            if carried:
                states[j] = dict(carried)
        self._loose_algorithm_states = states

    def _reducer(self, j: int) -> SparseAllreduce:
        """Layout bucket ``j``'s reducer, built at its first use from what a loaded state holds."""
        reducer = self._reducers.get(j)
        if reducer is not None:
            return reducer
        bucket = self._layout.buckets[j]
        comm = self.comm
        algorithm, density, _ = self.configuration_of(bucket.treatment)
        reducer = self._new_reducer(comm, bucket.treatment, hierarchy=self.hierarchy, nodes=self._nodes)
        algorithm_state = self._loose_algorithm_states.pop(j, {})
        pieces = [(entry, self._loose_residuals.pop(entry[0], None)) for entry in bucket.entries]
        velocities = [(entry, self._loose_velocities.pop(entry[0], None)) for entry in bucket.entries]
        density_state = self._loose_density_states.pop(j, None)
        if algorithm_state or density_state is not None or any(piece is not None for _, piece in pieces + velocities):
            work_dtype = torch.float32 if bucket.dtype in (torch.float16, torch.bfloat16) else bucket.dtype

            def assembled(parts, what):
                whole = torch.zeros(bucket.numel, dtype=work_dtype)
                missing = []
                for (ordinal, offset, numel, _), piece in parts:
                    if piece is not None and piece.numel() == numel and piece.dtype == work_dtype:
                        whole[offset:offset + numel].copy_(piece.reshape(-1))
                    elif piece is not None:
                        missing.append(ordinal)
                if missing:
                    warnings.warn(f"sparsecomm: bucket {j}: {what} of parameters {missing} no longer fit "
                                  "(shape or dtype changed); they restart from zero", RuntimeWarning, stacklevel=5)
                return whole
            residual = assembled(pieces, "residuals")
            velocity = assembled(velocities, "velocities") if self.local_update.momentum > 0.0 else None
            try:
                reducer.load_state_dict({"checkpoint_version": CHECKPOINT_VERSION, "algorithm": algorithm,
                                         "density": density, "rank": self.comm.rank,
                                         "world_size": self.comm.size, "fingerprint": self._checkpoint_id,
                                         # auto without a topology runs flat, as its reducers say
                                         **({} if self.hierarchy == "flat" or self.topology is None
                                            else {"hierarchy": saved_text(self.hierarchy, self.topology)}),
                                         "residual": residual, "algorithm_state": algorithm_state,
                                         **({} if velocity is None else {"velocity": velocity}),
                                         **({} if density_state is None else {"density_state": density_state})})
            except (ValueError, TypeError) as exc:
                # a state only this rank loaded: its peers are about to wait for this bucket's
                # messages, so they are told (CommAbortedError naming this rank) instead of
                # waiting out the timeout, as for a reducer's own argument errors
                if self.comm.size > 1:
                    self.comm.abort(f"{type(exc).__name__}: {exc} (restoring bucket {j}'s saved state, "
                                    "before it sent anything)")
                raise
        self._reducers[j] = reducer
        return reducer

    # -- one bucket -----------------------------------------------------------------------
    def _on_bucket(self, bucket: dist.GradBucket) -> torch.futures.Future:
        """Route DDP bucket ``bucket`` through the layout; the Future completes with its average."""
        self.comm  # noqa: B018 - built here, on DDP's thread, at the same point on every rank
        if not self._policy_agreed:   # run by the first reduction's job, before its messages
            self._policy_agreed = True
            # the scope now, on DDP's thread: every rank creates its scopes in the same order
            self._agreement = self.comm.new_scope("DDP hook policy agreement")
        future = self._layout.route(bucket, self.step, self._start, self._adopt)
        if bucket.is_last():
            self.step += 1
            self._layout.end_iteration()
        return future

    def _start(self, j: int, target: torch.Tensor, step: int, future: torch.futures.Future, scatter) -> None:
        """Reduce layout bucket ``j`` held in ``target`` (averaged in place) at hook step ``step``,
        then copy the result to the DDP buckets in ``scatter``; on the worker, or now when not
        async. Everything is decided here on DDP's thread, the schedule's step included."""
        comm = self.comm
        treatment = self._layout.buckets[j].treatment
        dense = step < self.warmup_steps or (treatment == "dense" and not self.dense_needs_reducer)
        reducer = None if dense else self._reducer(j)

        agreement, self._agreement = self._agreement, None

        def job() -> torch.Tensor:
            if agreement is not None:   # the first job: its failure is this bucket's, with its own type
                self._agree_policy(agreement)
            if reducer is None:  # DDP's own allreduce_hook: divide first, then sum
                before = comm.stats.snapshot()
                target.div_(comm.size)
                comm.allreduce_dense(target)
                if treatment == "dense" and step >= self.warmup_steps:   # the policy's dense part
                    self.last_stats[j] = dense_part_stats(comm.stats - before, target.numel())
                    self._reported[j] = (step, target.numel() * target.element_size())
            else:
                reduce_average(reducer, target, comm.size, step=step)
                self.last_stats[j] = reducer.last_stats
                if treatment:
                    self.last_stats[j]["treatment"] = treatment
                self._reported[j] = (step, target.numel() * target.element_size())
            for buffer, offset, layout_offset, numel, _ in scatter:
                buffer[offset:offset + numel].copy_(target[layout_offset:layout_offset + numel])
            return target

        # reducers scope their own calls
        run = job if reducer is not None else self._scoped(job, comm, policy_dense=step >= self.warmup_steps)
        if self.async_comm:
            self._submit(run, future)
        else:
            future.set_result(run())

    def _agree_policy(self, scope) -> None:
        """At the first bucket, before any message of a reduction (inside the first job, on the
        worker when async: a failure there is that bucket's, and fails every later one): every
        rank's policy text all-gathered; the same AgreedValueError on every rank when they differ
        (the buckets' split, and so every message after, would)."""
        comm = self.comm
        mine = torch.tensor([self.policy_crc()], dtype=torch.int64)
        with comm.call_scope(scope, agreed=lambda exc: isinstance(exc, AgreedValueError)):
            self.check_same_policy([int(crc) for crc in comm.allgather_small(mine).reshape(-1).tolist()])

    def treatment_stats(self) -> dict[str, dict[str, Any]]:
        """The last reduced step per treatment (``"dense"``, ``"default"`` or a Treatment's text):
        ``bytes_sent`` by this rank, elements ``n`` and the layout ``buckets``; empty before the
        first reduced step or without a policy (then every bucket is the state's algorithm)."""
        latest = max((step for step, _ in self._reported.values()), default=None)
        out: dict[str, dict[str, Any]] = {}
        for j, (step, _) in sorted(self._reported.items()):
            stats = self.last_stats.get(j, {})
            if step != latest or "treatment" not in stats:
                continue
            row = out.setdefault(stats["treatment"], {"bytes_sent": 0, "n": 0, "buckets": 0})
            row["bytes_sent"] += stats.get("bytes_sent", 0)
            row["n"] += stats.get("n", 0)
            row["buckets"] += 1
        return out

    # -- checkpointing ----------------------------------------------------------------------
    def local_state_dict(self) -> dict[str, Any]:
        """This rank's state as a plain dict: everything that decides the next reductions --
        the step, the bucket layout, every parameter's residual (``residuals``, by
        parameter ordinal) and every layout bucket's algorithm state (``algorithm_states``) --
        and whose it is: ``rank``, ``world_size`` and ``fingerprint`` (equal on every rank of one
        save: configuration, world size, step and layout; :mod:`sparsecomm.reduce.checkpoint`).
        :meth:`state_dict` is this dict packed for saving; :meth:`load_state_dict` takes either."""
        self._drain()
        residuals = {**self._loose_residuals, **self._pieces("residual")}
        velocities = {**self._loose_velocities, **self._pieces("velocity")}
        algorithm_states = {**self._loose_algorithm_states,
                            **{j: reducer.algorithm.state_dict() for j, reducer in self._reducers.items()}}
        rank, size = self._rank_and_size()
        state = {"checkpoint_version": CHECKPOINT_VERSION, "algorithm": self.algorithm, "density": self.density,
                 "options": dict(self.options), "nonfinite": self.nonfinite, "warmup_steps": self.warmup_steps,
                 "density_schedule": None if self.density_schedule is None else self.density_schedule.to_state(),
                 "step": self.step, **self._layout.state(), **self._local_update_state()}   # see STATE_KEYS
        if self.hierarchy != "flat":   # a flat state keeps the keys (and fingerprint) it always had
            state["hierarchy"] = saved_text(self.hierarchy, self.topology)
        state["rank"], state["world_size"] = rank, size
        algorithm_states = {j: s for j, s in algorithm_states.items() if s}
        pristine = not (self.step or self._layout.complete or residuals or algorithm_states)
        # 0 for a state that has seen nothing (as a fresh one: loading it changes nothing)
        state["fingerprint"] = 0 if pristine else \
            fingerprint("DDPHookState", {key: state[key] for key in sorted(state) if key != "rank"})
        state["residuals"] = residuals
        state["algorithm_states"] = algorithm_states
        if self.local_update.momentum > 0.0:
            state["velocities"] = velocities
        if self.density_schedule is not None and self.density_schedule.kind == "adaptive":
            state["density_states"] = {**self._loose_density_states,
                                       **{j: reducer.density_state for j, reducer in self._reducers.items()}}
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
        return pack_rank_part("DDPHookState", self.local_state_dict())

    def gathered_state_dict(self) -> dict[str, Any]:
        """:meth:`state_dict` with every rank's part at rank 0, for frameworks that write one
        checkpoint file from rank 0 and give that file to every rank on resume (Lightning,
        Accelerate: ``sparsecomm.integrations``). Collective: call it on every rank, at the same
        point. Rank 0 gets ``rank0`` ... ``rank<P-1>`` (the other ranks their own part);
        :meth:`load_state_dict` of that one dict on every rank takes the rank's own. Rank 0
        holds every rank's residuals meanwhile (P times one rank's). Without a process group
        (a 1-process run) it is :meth:`state_dict`."""
        rank, size = self._rank_and_size()
        if size is None or size == 1:
            return self.state_dict()
        comm = self.comm     # built first: the packed part is keyed by the Comm's rank
        packed = self.state_dict()
        return gather_rank_parts("DDPHookState", packed, comm)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` (or :meth:`local_state_dict`) of this rank, before the
        first step. Refused with a ValueError that says what to do: another rank's state (when
        it holds residuals or algorithm state: every rank must load its own), a state saved by
        another number of ranks (not supported: residuals are per rank), another algorithm,
        density, options or schedule, another checkpoint version. Ranks that load different
        saves (or some none) raise together at their first sparse bucket (the reducers'
        handshake compares the save's fingerprint)."""
        try:
            state, raw, mark = self._refuse_or_take(state)
        except (ValueError, TypeError) as exc:
            # any refusal, on this rank only or on every rank: the peers that loaded their state
            # are about to build the Comm at their first bucket (a collective: without this rank
            # it waits for the process group's timeout) and wait for this rank's messages; join
            # that construction and abort the Comm, so they raise naming this rank at once
            size = self._rank_and_size()[1]
            if size is not None and size > 1 and not self._closed:
                self.comm.abort(f"{type(exc).__name__}: {exc} (loading the hook's state, before it sent anything)")
            raise
        self._drain()
        self._checkpoint_id = mark
        self.step = int(state["step"])
        self.warmup_steps = int(state["warmup_steps"])
        self._reducers.clear()
        self._layout.load_state(state)
        self._loose_residuals = {int(k): v for k, v in state["residuals"].items()}
        self._loose_velocities = {int(k): v for k, v in state.get("velocities", {}).items()}
        self._loose_density_states = {int(j): dict(s) for j, s in state.get("density_states", {}).items()}
        self._loose_algorithm_states = {int(j): dict(s) for j, s in raw.items()}

    def _refuse_or_take(self, state: Any) -> tuple[dict[str, Any], dict, int]:
        """The checks of :meth:`load_state_dict`: this rank's part, its version, keys,
        configuration, hierarchy and owner. Returns (state, algorithm states, fingerprint)."""
        state = self._checked_load(state)
        mine = saved_text(self.hierarchy, self.topology)
        if state.get("hierarchy", "flat") != mine:
            raise ValueError(f"state_dict was saved with hierarchy {state.get('hierarchy', 'flat')!r}, this hook "
                             f"state runs {mine!r}: residuals are kept per shard owner in "
                             "two-level mode; resume with the same hierarchy and topology")
        raw = state["algorithm_states"]
        if not isinstance(raw, dict) or not all(isinstance(s, dict) for s in raw.values()):
            raise ValueError("state_dict's algorithm_states must map bucket numbers to dicts (each an algorithm's "
                             f"state_dict()); got {raw!r}"[:300])
        mark = loaded_fingerprint(state)
        self._check_owner(state, bool(state.get("residuals")) or bool(state.get("velocities")) or bool(raw))
        return state, raw, mark

    def __getstate__(self) -> dict[str, Any]:
        # process groups, communicators and the worker thread cannot be pickled;
        # configuration and residuals can
        return {**self.local_state_dict(), "async_comm": self.async_comm,
                "placement": (self.hierarchy, self.topology)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        hierarchy, nodes = state.get("placement", ("flat", None))
        self.__init__(state["algorithm"], state["density"], process_group=None,
                      warmup_steps=state["warmup_steps"], async_comm=state["async_comm"],
                      nonfinite=state["nonfinite"], density_schedule=state["density_schedule"],
                      hierarchy=hierarchy, nodes=nodes, residual_dtype=state.get("residual_dtype"),
                      policy=state.get("policy"),
                      **state.get("local_update", {}), **state["options"])
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
        self._close_comms()

    def _submit(self, job, future: torch.futures.Future) -> None:
        if self._worker is None or not self._worker.alive():
            self._worker = BucketWorker()
        self._worker.submit(job, future)


def _bytes_text(nbytes: float) -> str:
    """``540 B``, ``21.7 kB``, ``4.46 MB``, ``1.2 GB`` (powers of 1000)."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes:.0f} B"


def _algorithm_text(name: str, stats: list[dict[str, Any]]) -> str:
    """The algorithm of one step's buckets: its name, or under auto what the buckets ran."""
    ran = [s.get("auto_choice") for s in stats if s.get("auto_choice")]
    if not ran:
        return name
    counts = {choice: ran.count(choice) for choice in dict.fromkeys(ran)}
    choices = ", ".join(choice if len(counts) == 1 else f"{choice} x{count}" for choice, count in counts.items())
    return f"{name} {'trying' if any(s.get('auto_tuning') for s in stats) else '->'} {choices}"


def ddp_hook(state: DDPHookState, bucket: dist.GradBucket) -> torch.futures.Future:
    """DDP communication hook: sparse allreduce of the bucket, averaged over the ranks.

    Register with ``model.register_comm_hook(state, sparsecomm.ddp_hook)``. With
    ``state.async_comm`` (default) the collective is queued on the state's background
    worker and the Future completes when it has run; otherwise it runs before returning.
    Buckets are reduced in the state's own bucket layout (the first iteration's, then DDP's
    rebuilt one): see the module docstring, "Bucket rebuilds and exact resume".
    """
    return state._on_bucket(bucket)


# DDP checks the hook's annotations as objects (``from __future__ import annotations``
# would leave them as strings and make register_comm_hook reject the hook).
ddp_hook.__annotations__ = {"state": DDPHookState, "bucket": dist.GradBucket,
                            "return": torch.futures.Future[torch.Tensor]}


_told_one_process = False


def _unwrap_compiled(model: Any) -> Any:
    """The module inside torch.compile's wrapper (``OptimizedModule._orig_mod``)."""
    inner = getattr(model, "_orig_mod", None)
    return inner if isinstance(inner, torch.nn.Module) and type(model).__name__ == "OptimizedModule" else model


def register(model: torch.nn.Module, state: DDPHookState) -> DDPHookState:
    """Register :func:`ddp_hook` with ``state`` on ``model`` and return ``state``, whose
    ``state_dict()`` / ``load_state_dict()`` save and restore the hook (``gathered_state_dict()``
    where one file is written from rank 0).

    ``model``: a ``DistributedDataParallel`` (also inside ``torch.compile``'s wrapper), as after
    ``DDP(model)``, ``accelerator.prepare(model)`` or Lightning's DDP strategy. A bare module is
    what a 1-process run of the same script leaves (Accelerate's ``prepare`` with one process, a
    script that wraps in DDP only when ``WORLD_SIZE > 1``): with no process group, or a group of
    one rank, there is nothing to reduce, so this says so once (a UserWarning) and returns
    ``state`` unregistered; a bare module while several ranks run is refused (its gradients
    would not be averaged at all). When ``state`` has no process group and no Comm of its own it
    takes DDP's (``DDP(model, process_group=...)``), so the hook reduces over DDP's ranks.
    Raises TypeError for anything else (an FSDP2 module: :func:`sparsecomm.fsdp.register_hook`)."""
    global _told_one_process
    if not isinstance(state, DDPHookState):
        raise TypeError(f"sparsecomm.register(model, state): state must be a sparsecomm.DDPHookState, got "
                        f"{type(state).__name__} (build one: sparsecomm.DDPHookState('topka', density=0.01))")
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"sparsecomm.register(model, state): model must be a torch.nn.Module wrapped in "
                        f"DistributedDataParallel, got {type(model).__name__}")
    target = _unwrap_compiled(model)
    if isinstance(target, torch.nn.parallel.DistributedDataParallel):
        group = getattr(target, "process_group", None)
        if state.process_group is None and state._comm is None and group is not None \
                and dist.is_initialized() and group is not dist.group.WORLD:
            state.process_group = group
            if state.hierarchy == "flat":
                state._options_checked.check_size(dist.get_world_size(group))
        if state.policy is not None:
            state.bind(target.module)
        target.register_comm_hook(state, ddp_hook)
        return state
    if type(target).__name__.startswith("FSDP") or hasattr(target, "_get_fsdp_state"):
        raise TypeError("sparsecomm.register(model, state) takes a DistributedDataParallel model; this is an FSDP "
                        "module: use sparsecomm.fsdp.register_hook(model, sparsecomm.FSDPHookState(...))")
    ranks = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    if ranks > 1:
        raise ValueError(f"sparsecomm.register(model, state): model is a bare {type(target).__name__} but "
                         f"{ranks} ranks are running: its gradients would not be averaged at all. Wrap it "
                         "first: model = torch.nn.parallel.DistributedDataParallel(model) (or "
                         "accelerator.prepare(model)), then register")
    if not _told_one_process:
        _told_one_process = True
        warnings.warn(f"sparsecomm.register: {type(target).__name__} is not DistributedDataParallel and this is "
                      "a 1-process run: there is nothing to reduce, so the hook is not registered and the "
                      "gradients stay this process's own", UserWarning, stacklevel=2)
    return state
