"""The DDP communication hook: ``model.register_comm_hook(state, sparsecomm.ddp_hook)``.

Each DDP gradient bucket goes through its own :class:`~sparsecomm.SparseAllreduce` (one per
bucket index); the hook writes the average (sum / world size) into the bucket's buffer. For
float16/bfloat16 buckets the reducer hands back the float32 sum, which is divided by the world
size in float32 and only then rounded to the bucket's dtype (so 2 ranks with an fp16 gradient
of 40000 average to 40000, as with DDP's own allreduce, not to inf). Warm-up steps use DDP's
own arithmetic: divide the bucket by the world size, then the backend's dense allreduce.

Non-finite gradients (``nonfinite="propagate"``, the default): when any rank's bucket holds
NaN or Inf the bucket's result on every rank is the dense average of the raw gradients
(non-finite exactly where DDP's allreduce would be) and no residual changes, so
``torch.amp.GradScaler`` finds the overflow on every rank and skips the step everywhere.
``nonfinite="raise"`` makes every rank raise the same ValueError instead (see
:class:`~sparsecomm.SparseAllreduce`).

Bucket rebuilds. DDP re-buckets the parameters after the first iteration (in the order
their gradients became ready). The hook keys residuals by *parameter*, not by bucket: a
parameter's ordinal is the order in which the hook first saw it (DDP's initial bucket
assignment is deterministic, so ordinals agree across ranks and across restarts). When a
bucket's layout changes, every reducer's residual is cut into per-parameter pieces and
the new buckets are assembled from them, so no residual is lost; a parameter whose piece
does not fit (shape or dtype changed) starts from zero with a warning.

Checkpointing: :meth:`DDPHookState.state_dict` stores the step, the per-parameter
residuals and each algorithm's adaptive state (``Algorithm.state_dict()``: oktopk's thresholds
and boundaries, spardl's B-SAG h) keyed by its bucket's layout, which a reducer of the same
layout picks up again (after a load or DDP's bucket rebuild); the state pickles without its process group (like PowerSGD's state), and the
default group is used after unpickling unless ``process_group`` is set again.

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

import warnings
from typing import Any

import torch
import torch.distributed as dist

from . import algorithms
from ._bucket_worker import BucketWorker
from .comm.base import Comm
from .formats.header import FORMAT_VERSION
from .reducer import NONFINITE_POLICIES, SparseAllreduce, check_state_version

__all__ = ["DDPHookState", "ddp_hook"]


def _group_size(process_group: Any) -> int | None:
    """The number of ranks of ``process_group`` (None: the default group), or None while unknown."""
    if not (dist.is_available() and dist.is_initialized()):
        return None
    size = dist.get_world_size(process_group)
    return size if size > 0 else None  # -1: this rank is not in the group


def _signature(layout: list[tuple[int, int, int, torch.Size]]) -> tuple[tuple[int, int, int], ...]:
    """A bucket layout as (parameter ordinal, offset, numel) triples: what an algorithm's
    state (which depends on the bucket's length and order) must find again to continue."""
    return tuple((ordinal, offset, numel) for ordinal, offset, numel, _ in layout)


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
        **options: options of the algorithm, validated here.
    """

    def __init__(self, algorithm: str, density: float, process_group: Any = None, warmup_steps: int = 0,
                 comm: Comm | None = None, async_comm: bool = True, nonfinite: str = "propagate", **options: Any):
        if isinstance(density, bool) or not isinstance(density, (int, float)) or not (0.0 < density <= 1.0):
            raise ValueError(f"density must be a number in (0, 1], got {density!r}")
        if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 0:
            raise ValueError(f"warmup_steps must be an integer >= 0, got {warmup_steps!r}")
        if not isinstance(async_comm, bool):
            raise ValueError(f"async_comm must be True or False, got {async_comm!r}")
        if nonfinite not in NONFINITE_POLICIES:
            raise ValueError(f"nonfinite must be one of {', '.join(map(repr, NONFINITE_POLICIES))}, got {nonfinite!r}")
        self.nonfinite = nonfinite
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
        self._warmup = None  # (comm, CallScope) of the warm-up's dense allreduce
        self._reducers: dict[int, SparseAllreduce] = {}
        # bucket index -> [(param ordinal, offset, numel, shape)] of the bucket's buffer
        self._layouts: dict[int, list[tuple[int, int, int, torch.Size]]] = {}
        self._ordinals: dict[int, int] = {}          # id(parameter) -> ordinal
        self._loose_residuals: dict[int, torch.Tensor] = {}  # ordinal -> residual piece waiting for a bucket
        # bucket layout signature -> an algorithm's adaptive state (oktopk's thresholds, spardl's
        # B-SAG h) waiting for a reducer of the same layout (after a rebuild or a checkpoint load)
        self._loose_algorithm_states: dict[tuple[tuple[int, int, int], ...], dict[str, Any]] = {}
        self.last_stats: dict[int, dict[str, Any]] = {}

    # -- plumbing -------------------------------------------------------------------------
    @property
    def comm(self) -> Comm:
        # Built on DDP's thread at the first bucket (the same point on every rank): a
        # TorchComm runs on a private process group, so DDP's own collectives (e.g. its
        # find_unused_parameters allreduce) never interleave with the hook's.
        if self._comm is None:
            from .comm.torch_comm import TorchComm
            size = _group_size(self.process_group)
            if size is not None:  # options that need P fail here, on every rank, before any message
                self._options_checked.check_size(size)
            self._comm = TorchComm(self.process_group)
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

    def _layout_of(self, bucket: dist.GradBucket) -> list[tuple[int, int, int, torch.Size]]:
        buffer = bucket.buffer()
        base, item = buffer.data_ptr(), buffer.element_size()
        layout = []
        for param, grad in zip(bucket.parameters(), bucket.gradients()):
            ordinal = self._ordinals.setdefault(id(param), len(self._ordinals))
            layout.append((ordinal, (grad.data_ptr() - base) // item, grad.numel(), param.shape))
        return layout

    def _residual_pieces(self) -> dict[int, torch.Tensor]:
        """Every reducer's residual cut into per-parameter copies, keyed by ordinal."""
        pieces = {}
        for index, reducer in self._reducers.items():
            if reducer.residual is None:
                continue
            flat = reducer.residual.detach().reshape(-1)
            for ordinal, offset, numel, _ in self._layouts[index]:
                pieces[ordinal] = flat[offset:offset + numel].clone()
        return pieces

    def _algorithm_states(self) -> dict[tuple[tuple[int, int, int], ...], dict[str, Any]]:
        """Every reducer's algorithm state (where it keeps one), keyed by its bucket's layout."""
        states = dict(self._loose_algorithm_states)
        for index, reducer in self._reducers.items():
            st = reducer.algorithm.state_dict()
            if st:
                states[_signature(self._layouts[index])] = st
        return states

    def _release_all(self) -> None:
        """Keep every reducer's residual as per-parameter pieces (and its algorithm state under
        its layout) and drop the reducers."""
        self._loose_algorithm_states = self._algorithm_states()
        self._loose_residuals.update(self._residual_pieces())
        self._reducers.clear()
        self._layouts.clear()

    def _drain(self) -> None:
        """Wait until the background worker has run every queued bucket."""
        if self._worker is not None:
            self._worker.drain()

    def _reducer_for(self, bucket: dist.GradBucket) -> SparseAllreduce:
        index = bucket.index()
        layout = self._layout_of(bucket)
        if index in self._reducers and self._layouts[index] == layout:
            return self._reducers[index]
        if index in self._reducers:  # DDP rebuilt its buckets: keep residuals per parameter
            self._drain()  # no reducer may be running while its residual is cut up
            self._release_all()
        reducer = SparseAllreduce(self.algorithm, self.density, comm=self.comm, nonfinite=self.nonfinite,
                                  **self.options)
        if self._loose_residuals:
            buffer = bucket.buffer()
            work_dtype = torch.float32 if buffer.dtype in (torch.float16, torch.bfloat16) else buffer.dtype
            residual = torch.zeros(buffer.numel(), dtype=work_dtype, device=buffer.device)
            missing = []
            for ordinal, offset, numel, shape in layout:
                piece = self._loose_residuals.pop(ordinal, None)
                if piece is not None and piece.numel() == numel and piece.dtype == work_dtype:
                    residual[offset:offset + numel].copy_(piece.to(buffer.device))
                elif piece is not None:
                    missing.append(ordinal)
            if missing:
                warnings.warn(f"sparsecomm: bucket {index}: residuals of parameters {missing} no longer fit "
                              "(shape or dtype changed); they restart from zero", RuntimeWarning, stacklevel=3)
            reducer.load_state_dict({"format_version": FORMAT_VERSION, "algorithm": self.algorithm,
                                     "density": self.density, "residual": residual, "algorithm_state": {}})
        algorithm_state = self._loose_algorithm_states.pop(_signature(layout), None)
        if algorithm_state:  # only a bucket of the very same layout continues the state
            reducer.algorithm.load_state_dict(algorithm_state)
        self._reducers[index] = reducer
        self._layouts[index] = layout
        return reducer

    # -- checkpointing ----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        self._drain()
        residuals = {**self._loose_residuals, **self._residual_pieces()}
        return {"format_version": FORMAT_VERSION, "algorithm": self.algorithm, "density": self.density,
                "options": dict(self.options), "nonfinite": self.nonfinite, "warmup_steps": self.warmup_steps,
                "step": self.step,
                "residuals": residuals,
                "algorithm_states": [{"layout": [list(entry) for entry in sig], "state": st}
                                     for sig, st in self._algorithm_states().items()]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key in ("algorithm", "density", "options"):
            if state.get(key) != getattr(self, key):
                raise ValueError(f"state_dict has {key}={state.get(key)!r}, this hook state has "
                                 f"{getattr(self, key)!r}")
        check_state_version(state)
        self._drain()
        self.step = int(state["step"])
        self.warmup_steps = int(state.get("warmup_steps", self.warmup_steps))
        self._reducers.clear()
        self._layouts.clear()
        self._loose_residuals = {int(k): v for k, v in state["residuals"].items()}
        self._loose_algorithm_states = {tuple(tuple(int(x) for x in entry) for entry in item["layout"]): item["state"]
                                        for item in state.get("algorithm_states", [])}

    def __getstate__(self) -> dict[str, Any]:
        # process groups, communicators and the worker thread cannot be pickled;
        # configuration and residuals can
        return {**self.state_dict(), "async_comm": self.async_comm}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["algorithm"], state["density"], process_group=None,
                      warmup_steps=state["warmup_steps"], async_comm=state.get("async_comm", True),
                      nonfinite=state.get("nonfinite", "propagate"), **state["options"])
        self.load_state_dict(state)

    def close(self) -> None:
        """Stop the background worker (after the queued buckets); a later bucket restarts one."""
        if self._worker is not None:
            self._worker.stop()
            self._worker = None

    def _submit(self, job, future: torch.futures.Future) -> None:
        if self._worker is None or not self._worker.alive():
            self._worker = BucketWorker()
        self._worker.submit(job, future)


def ddp_hook(state: DDPHookState, bucket: dist.GradBucket) -> torch.futures.Future:
    """DDP communication hook: sparse allreduce of the bucket, averaged over the ranks.

    Register with ``model.register_comm_hook(state, sparsecomm.ddp_hook)``. With
    ``state.async_comm`` (default) the collective is queued on the state's background
    worker and the Future completes when it has run; otherwise it runs before returning.
    """
    buffer = bucket.buffer()
    comm = state.comm
    index = bucket.index()
    reducer = None if state.step < state.warmup_steps else state._reducer_for(bucket)
    if bucket.is_last():
        state.step += 1

    def job() -> torch.Tensor:
        if reducer is None:  # DDP's own allreduce_hook: divide first, then sum
            buffer.div_(comm.size)
            comm.allreduce_dense(buffer)
            return buffer
        if buffer.dtype in (torch.float16, torch.bfloat16):
            # the float32 sum, divided before the one rounding to the bucket's dtype
            total = reducer(buffer, out=torch.empty(buffer.shape, dtype=torch.float32, device=buffer.device))
            buffer.copy_(total.div_(comm.size))
        else:
            reducer(buffer, out=buffer)  # the reducer reads the gradient before writing the sum
            buffer.div_(comm.size)
        state.last_stats[index] = reducer.last_stats
        return buffer

    run = job if reducer is not None else state._scoped(job, comm)  # reducers scope their own calls
    future: torch.futures.Future = torch.futures.Future()
    if state.async_comm:
        state._submit(run, future)
    else:
        future.set_result(run())
    return future


# DDP checks the hook's annotations as objects (``from __future__ import annotations``
# would leave them as strings and make register_comm_hook reject the hook).
ddp_hook.__annotations__ = {"state": DDPHookState, "bucket": dist.GradBucket,
                            "return": torch.futures.Future[torch.Tensor]}
