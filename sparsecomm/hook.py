"""The DDP communication hook: ``model.register_comm_hook(state, sparsecomm.ddp_hook)``.

Each DDP gradient bucket goes through its own :class:`~sparsecomm.SparseAllreduce` (one per
bucket index); the hook writes the average (sum / world size) into the bucket's buffer.

Bucket rebuilds. DDP re-buckets the parameters after the first iteration (in the order
their gradients became ready). The hook keys residuals by *parameter*, not by bucket: a
parameter's ordinal is the order in which the hook first saw it (DDP's initial bucket
assignment is deterministic, so ordinals agree across ranks and across restarts). When a
bucket's layout changes, every reducer's residual is cut into per-parameter pieces and
the new buckets are assembled from them, so no residual is lost; a parameter whose piece
does not fit (shape or dtype changed) starts from zero with a warning.

Checkpointing: :meth:`DDPHookState.state_dict` stores the step and the per-parameter
residuals; the state pickles without its process group (like PowerSGD's state), and the
default group is used after unpickling unless ``process_group`` is set again.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
import torch.distributed as dist

from . import algorithms
from .comm.base import Comm
from .formats.header import FORMAT_VERSION
from .reducer import SparseAllreduce

__all__ = ["DDPHookState", "ddp_hook"]


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
        **options: options of the algorithm, validated here.
    """

    def __init__(self, algorithm: str, density: float, process_group: Any = None, warmup_steps: int = 0,
                 comm: Comm | None = None, **options: Any):
        if isinstance(density, bool) or not isinstance(density, (int, float)) or not (0.0 < density <= 1.0):
            raise ValueError(f"density must be a number in (0, 1], got {density!r}")
        if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 0:
            raise ValueError(f"warmup_steps must be an integer >= 0, got {warmup_steps!r}")
        algorithms.get(algorithm)(None, **options)  # validates the options now, not at the first bucket
        self.algorithm = algorithm
        self.density = float(density)
        self.options = dict(options)
        self.warmup_steps = warmup_steps
        self.process_group = process_group
        self.step = 0
        self._comm = comm
        self._reducers: dict[int, SparseAllreduce] = {}
        # bucket index -> [(param ordinal, offset, numel, shape)] of the bucket's buffer
        self._layouts: dict[int, list[tuple[int, int, int, torch.Size]]] = {}
        self._ordinals: dict[int, int] = {}          # id(parameter) -> ordinal
        self._loose_residuals: dict[int, torch.Tensor] = {}  # ordinal -> residual piece waiting for a bucket
        self.last_stats: dict[int, dict[str, Any]] = {}

    # -- plumbing -------------------------------------------------------------------------
    @property
    def comm(self) -> Comm:
        if self._comm is None:
            from .comm.torch_comm import TorchComm
            self._comm = TorchComm(self.process_group)
        return self._comm

    def _layout_of(self, bucket: dist.GradBucket) -> list[tuple[int, int, int, torch.Size]]:
        buffer = bucket.buffer()
        base, item = buffer.data_ptr(), buffer.element_size()
        layout = []
        for param, grad in zip(bucket.parameters(), bucket.gradients()):
            ordinal = self._ordinals.setdefault(id(param), len(self._ordinals))
            layout.append((ordinal, (grad.data_ptr() - base) // item, grad.numel(), param.shape))
        return layout

    def _release_all(self) -> None:
        """Cut every reducer's residual into per-parameter pieces and drop the reducers."""
        for index, reducer in self._reducers.items():
            residual = reducer.residual
            if residual is None:
                continue
            flat = residual.reshape(-1)
            for ordinal, offset, numel, _ in self._layouts[index]:
                self._loose_residuals[ordinal] = flat[offset:offset + numel].clone()
        self._reducers.clear()
        self._layouts.clear()

    def _reducer_for(self, bucket: dist.GradBucket) -> SparseAllreduce:
        index = bucket.index()
        layout = self._layout_of(bucket)
        if index in self._reducers and self._layouts[index] == layout:
            return self._reducers[index]
        if index in self._reducers:  # DDP rebuilt its buckets: keep residuals per parameter
            self._release_all()
        reducer = SparseAllreduce(self.algorithm, self.density, comm=self.comm, **self.options)
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
        self._reducers[index] = reducer
        self._layouts[index] = layout
        return reducer

    # -- checkpointing ----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        residuals = dict(self._loose_residuals)
        for index, reducer in self._reducers.items():
            if reducer.residual is None:
                continue
            flat = reducer.residual.reshape(-1)
            for ordinal, offset, numel, _ in self._layouts[index]:
                residuals[ordinal] = flat[offset:offset + numel].detach().clone()
        return {"format_version": FORMAT_VERSION, "algorithm": self.algorithm, "density": self.density,
                "options": dict(self.options), "warmup_steps": self.warmup_steps, "step": self.step,
                "residuals": residuals}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key in ("algorithm", "density", "options"):
            if state.get(key) != getattr(self, key):
                raise ValueError(f"state_dict has {key}={state.get(key)!r}, this hook state has "
                                 f"{getattr(self, key)!r}")
        if state.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"state_dict has format version {state.get('format_version')}, "
                             f"this sparsecomm writes {FORMAT_VERSION}")
        self.step = int(state["step"])
        self.warmup_steps = int(state.get("warmup_steps", self.warmup_steps))
        self._reducers.clear()
        self._layouts.clear()
        self._loose_residuals = {int(k): v for k, v in state["residuals"].items()}

    def __getstate__(self) -> dict[str, Any]:
        # process groups and communicators cannot be pickled; configuration and residuals can
        return self.state_dict()

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["algorithm"], state["density"], process_group=None,
                      warmup_steps=state["warmup_steps"], **state["options"])
        self.load_state_dict(state)


def ddp_hook(state: DDPHookState, bucket: dist.GradBucket) -> torch.futures.Future:
    """DDP communication hook: sparse allreduce of the bucket, averaged over the ranks.

    Register with ``model.register_comm_hook(state, sparsecomm.ddp_hook)``. Runs the
    collective before returning (the returned Future is already complete).
    """
    buffer = bucket.buffer()
    comm = state.comm
    if state.step < state.warmup_steps:
        comm.allreduce_dense(buffer)
    else:
        reducer = state._reducer_for(bucket)
        reducer(buffer, out=buffer)  # the reducer reads the gradient before writing the sum
        state.last_stats[bucket.index()] = reducer.last_stats
    buffer.div_(comm.size)
    if bucket.is_last():
        state.step += 1
    future: torch.futures.Future = torch.futures.Future()
    future.set_result(buffer)
    return future


# DDP checks the hook's annotations as objects (``from __future__ import annotations``
# would leave them as strings and make register_comm_hook reject the hook).
ddp_hook.__annotations__ = {"state": DDPHookState, "bucket": dist.GradBucket,
                            "return": torch.futures.Future[torch.Tensor]}
