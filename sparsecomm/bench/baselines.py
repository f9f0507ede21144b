"""PyTorch's own DDP communication hooks, as the baselines users would pick instead.

The benchmarks and examples compare every sparsecomm algorithm with ``dense`` *and* with
what a PyTorch user reaches for first when the network is slow:

* ``torch_fp16``: :func:`torch.distributed.algorithms.ddp_comm_hooks.default_hooks.fp16_compress_hook`
  -- cast to float16, the backend's dense allreduce, divide by P, cast back. Half the bytes
  of ``dense``.
* ``torch_powersgd``: :func:`~torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook.powerSGD_hook`
  -- rank-``r`` PowerSGD (Vogels et al. 2019) with error feedback and warm start: every
  matrix-shaped gradient ``M`` (n x m) is sent as ``P`` (n x r) and ``Q`` (m x r) through two
  dense allreduces; vectors (biases) and matrices too small to gain ``min_compression_rate``
  go through a third, uncompressed allreduce. PyTorch's default ``start_powerSGD_iter`` is
  1000 (vanilla allreduce until then); here it defaults to 2 so that short runs measure the
  compressed steady state -- pass ``start_powerSGD_iter=1000`` for PyTorch's default.

:class:`TorchHook` wraps either one with the same surface as :class:`sparsecomm.DDPHookState`
where the benchmarks look (``density``, ``last_stats`` per bucket with ``bytes_sent`` and
``rounds``), and also runs it on a flat tensor outside DDP (:meth:`TorchHook.allreduce`),
which the collective benchmark uses. PyTorch's hooks return the *average* over ranks, where
sparsecomm's algorithms return the sum; timing comparisons are unaffected.

Bytes and rounds are counted like :meth:`sparsecomm.comm.Comm.allreduce_dense` counts the
backend's allreduce (ring formula, :func:`sparsecomm.comm.base.ring_allreduce_cost`), since
the hooks call ``torch.distributed.all_reduce`` whose internals cannot be observed: fp16 is one
allreduce of 2 N bytes; PowerSGD three allreduces (uncompressed part, all P's, all Q's) of
the sizes its own compress rule gives (mirrored in :func:`powersgd_counts`).
"""


import math
from typing import Any, Sequence

import torch
import torch.distributed as dist

from ..hooks.bucket_worker import BucketWorker
from ..comm.base import ring_allreduce_cost

__all__ = ["TorchHook", "names", "is_baseline", "powersgd_counts", "bucket_shapes"]

_NAMES = ("torch_fp16", "torch_powersgd")


def names() -> list[str]:
    """The PyTorch hook baselines, by the names the CLIs accept."""
    return list(_NAMES)


def is_baseline(name: str) -> bool:
    """Whether ``name`` is one of PyTorch's hooks here rather than a registered algorithm."""
    return name in _NAMES


def powersgd_counts(shapes: Sequence[Sequence[int]], rank: int, min_compression_rate: float = 2.0
                  ) -> tuple[int, int, int]:
    """(uncompressed elements, total P elements, total Q elements) PowerSGD sends for a bucket.

    Mirrors ``powerSGD_hook``'s step I: each gradient is viewed as ``(shape[0], -1)``;
    with ``r' = min(n, m, rank)`` it is compressed iff ``(n + m) r' min_compression_rate < n m``.
    """
    uncompressed = ps = qs = 0
    for shape in shapes:
        numel = math.prod(shape)
        if numel == 0:
            continue
        n = shape[0] if len(shape) else 1
        m = numel // n
        r = min(n, m, rank)
        if (n + m) * r * min_compression_rate < n * m:
            ps += n * r
            qs += m * r
        else:
            uncompressed += numel
    return uncompressed, ps, qs


def bucket_shapes(n: int, rows: int = 512, cols: int = 4608) -> list[tuple[int, ...]]:
    """Parameter shapes for a flat gradient of n elements with a conv net's layout.

    PowerSGD compresses per parameter matrix, so a bare 1-D vector would not be compressed
    at all. For the collective benchmark a flat N is cut like VGG-16's large layers: as many
    ``rows x cols`` matrices (default 512 x 4608, a 3x3 conv of 512 -> 512 channels viewed as
    PowerSGD views it) as fit, one ``(rest // rows) x rows`` matrix, and a vector tail of
    fewer than ``rows`` elements.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    shapes: list[tuple[int, ...]] = [(rows, cols)] * (n // (rows * cols))
    rest = n - len(shapes) * rows * cols
    if rest >= rows:
        shapes.append((rest // rows, rows))
        rest -= (rest // rows) * rows
    if rest:
        shapes.append((rest,))
    return shapes


class _FlatBucket:
    """The part of ``torch.distributed.GradBucket``'s interface the two hooks call.

    ``GradBucket`` has no Python constructor; outside DDP the benchmark hands the hooks this
    object over one flat buffer cut into parameter-shaped views.
    """

    def __init__(self, buffer: torch.Tensor, shapes: Sequence[Sequence[int]], index: int = 0) -> None:
        self._buffer = buffer
        self._shapes = [tuple(s) for s in shapes]
        self._index = index

    def buffer(self) -> torch.Tensor:
        return self._buffer

    def gradients(self) -> list[torch.Tensor]:
        views, offset = [], 0
        for shape in self._shapes:
            numel = math.prod(shape)
            views.append(self._buffer[offset:offset + numel].view(shape))
            offset += numel
        return views

    def parameters(self) -> list[torch.Tensor]:
        return self.gradients()

    def index(self) -> int:
        return self._index

    def is_last(self) -> bool:
        return True


class TorchHook:
    """One of PyTorch's DDP communication hooks, with per-bucket wire statistics.

    Args:
        name: ``"torch_fp16"`` or ``"torch_powersgd"``.
        process_group: the group to reduce over (None: the default group).
        powersgd_rank: PowerSGD's ``matrix_approximation_rank`` (>= 1).
        start_powerSGD_iter: steps of vanilla allreduce before PowerSGD compresses (>= 2, as
            PyTorch requires with error feedback; PyTorch's own default is 1000).
        min_compression_rate: PowerSGD's threshold for compressing a matrix (> 0).

    Register on DDP with :meth:`register`; ``last_stats[bucket_index]`` then holds
    ``bytes_sent`` and ``rounds`` of the bucket's last reduction, like
    :class:`sparsecomm.DDPHookState`.
    """

    def __init__(self, name: str, process_group: Any = None, *, powersgd_rank: int = 4,
                 start_powerSGD_iter: int = 2, min_compression_rate: float = 2.0) -> None:
        if name not in _NAMES:
            raise ValueError(f"unknown PyTorch hook baseline {name!r}; known: {', '.join(_NAMES)}")
        if isinstance(powersgd_rank, bool) or not isinstance(powersgd_rank, int) or powersgd_rank < 1:
            raise ValueError(f"powersgd_rank must be an int >= 1, got {powersgd_rank!r}")
        if isinstance(start_powerSGD_iter, bool) or not isinstance(start_powerSGD_iter, int) \
                or start_powerSGD_iter < 2:
            raise ValueError(f"start_powerSGD_iter must be an int >= 2 (PyTorch requires it with error "
                             f"feedback), got {start_powerSGD_iter!r}")
        if not min_compression_rate > 0:
            raise ValueError(f"min_compression_rate must be > 0, got {min_compression_rate!r}")
        self.name = name
        self.density = 1.0  # not a top-k method; kept for the tables that print density
        self.process_group = process_group
        self.powersgd_rank = powersgd_rank
        self.last_stats: dict[int, dict[str, Any]] = {}
        self._worker: BucketWorker | None = None  # for PowerSGD off NCCL, see _serialize_buckets
        if name == "torch_fp16":
            from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import fp16_compress_hook

            self._hook, self._state = fp16_compress_hook, process_group
        else:
            from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

            self._hook = psgd.powerSGD_hook
            self._state = psgd.PowerSGDState(process_group=process_group, matrix_approximation_rank=powersgd_rank,
                                             start_powerSGD_iter=start_powerSGD_iter,
                                             min_compression_rate=min_compression_rate)

    @property
    def algorithm(self) -> str:
        """The name, under the attribute :class:`sparsecomm.DDPHookState` has it."""
        return self.name

    @property
    def label(self) -> str:
        """The name with its setting, for tables: ``torch_powersgd (rank 4)``."""
        return f"{self.name} (rank {self.powersgd_rank})" if self.name == "torch_powersgd" else self.name

    def _world(self) -> int:
        return dist.get_world_size(self.process_group)

    def wire_stats(self, shapes: Sequence[Sequence[int]], element_size: int) -> dict[str, int]:
        """Bytes sent per rank and rounds of the next reduction of a bucket with these shapes."""
        world = self._world()
        if self.name == "torch_fp16":
            sizes = [2 * sum(math.prod(s) for s in shapes)]
        elif self._state.iter < self._state.start_powerSGD_iter:
            sizes = [element_size * sum(math.prod(s) for s in shapes)]
        else:
            counts = powersgd_counts(shapes, self.powersgd_rank, self._state.min_compression_rate)
            sizes = [element_size * count for count in counts]
        costs = [ring_allreduce_cost(nbytes, world) for nbytes in sizes]
        return {"bytes_sent": sum(c[0] for c in costs), "rounds": sum(c[1] for c in costs)}

    def _record(self, index: int, shapes: Sequence[Sequence[int]], element_size: int) -> None:
        self.last_stats[index] = self.wire_stats(shapes, element_size)
        dense = element_size * sum(math.prod(s) for s in shapes)
        self.last_stats[index]["dense_bytes_sent"] = ring_allreduce_cost(dense, self._world())[0]

    def summary(self) -> str:
        """One line on the last reduction, as :meth:`sparsecomm.DDPHookState.summary` words it:
        the bytes sent per rank and their ratio to the dense ring allreduce's."""
        stats = list(self.last_stats.values())
        if not stats:
            return f"{self.label}: nothing reduced yet"
        sent, dense = sum(s["bytes_sent"] for s in stats), sum(s["dense_bytes_sent"] for s in stats)
        ratio = f" = {sent / dense:.3g}x dense's {dense / 1e3:.3g} kB" if dense else " (1 rank: nothing to send)"
        return f"{self.label}: sent {sent / 1e3:.3g} kB{ratio}, {len(stats)} bucket{'s' if len(stats) != 1 else ''}"

    def _serialize_buckets(self) -> bool:
        """Whether bucket reductions must run one after another (PowerSGD off NCCL).

        PowerSGD issues its second and third allreduce from the completion callback of the
        previous one. On gloo those callbacks run on the backend's threads, so with several
        buckets in flight the ranks issue their collectives in different orders, and gloo
        aborts the process ("Received data size doesn't match expected size"). Seen here on
        a 784-4096-4096-10 MLP (3 buckets) on 2 and 4 ranks.
        """
        return self.name == "torch_powersgd" and dist.get_backend(self.process_group) != "nccl"

    def _run_in_order(self, bucket: dist.GradBucket) -> torch.futures.Future:
        """PyTorch's hook on one worker thread, bucket after bucket; backward goes on meanwhile.

        The worker is the one the DDP hook uses (:class:`sparsecomm.hooks.bucket_worker.BucketWorker`):
        after a failed bucket it fails every later one at once instead of issuing collectives
        that would pair with other ranks' earlier ones, and it is stopped (bounded) at
        interpreter exit.
        """
        if self._worker is None or not self._worker.alive():
            self._worker = BucketWorker()
        result: torch.futures.Future = torch.futures.Future()
        self._worker.submit(lambda: self._hook(self._state, bucket).wait(), result)
        return result

    def close(self) -> None:
        """Stop the worker thread, if any (it restarts on the next bucket)."""
        if self._worker is not None:
            self._worker.stop()
            self._worker = None

    @staticmethod
    def ddp_hook(state: "TorchHook", bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        """DDP comm hook: record the bucket's wire figures, then run PyTorch's hook."""
        grads = bucket.gradients()
        state._record(bucket.index(), [tuple(g.shape) for g in grads], bucket.buffer().element_size())
        if state._serialize_buckets():
            return state._run_in_order(bucket)
        return state._hook(state._state, bucket)

    def register(self, ddp_model: torch.nn.Module) -> None:
        """``ddp_model.register_comm_hook`` with this baseline.

        Raises ValueError for PowerSGD off NCCL on DDP's own group with
        ``find_unused_parameters=True``: DDP then issues a collective of its own during
        backward, which the worker thread's collectives could interleave with differently on
        each rank. Pass ``process_group=dist.new_group()`` to the constructor instead.
        """
        if (self._serialize_buckets() and self.process_group is None
                and getattr(ddp_model, "find_unused_parameters", False)):
            raise ValueError("torch_powersgd on gloo runs its buckets on a worker thread, which must not share "
                             "DDP's process group when find_unused_parameters=True; construct "
                             "TorchHook('torch_powersgd', process_group=torch.distributed.new_group())")
        ddp_model.register_comm_hook(self, TorchHook.ddp_hook)

    def allreduce(self, flat: torch.Tensor, shapes: Sequence[Sequence[int]] | None = None) -> torch.Tensor:
        """Run the hook on ``flat`` (1-D, modified in place) cut into ``shapes``; the average.

        ``shapes`` default to :func:`bucket_shapes` of ``flat.numel()``. Returns the hook's
        result (the same values on every rank); ``last_stats[0]`` holds its wire figures.
        """
        if flat.dim() != 1 or not flat.is_contiguous():
            raise ValueError(f"flat must be a contiguous 1-D tensor, got shape {tuple(flat.shape)}")
        shapes = bucket_shapes(flat.numel()) if shapes is None else [tuple(s) for s in shapes]
        if sum(math.prod(s) for s in shapes) != flat.numel():
            raise ValueError(f"shapes hold {sum(math.prod(s) for s in shapes)} elements, flat has {flat.numel()}")
        self._record(0, shapes, flat.element_size())
        return self._hook(self._state, _FlatBucket(flat, shapes)).wait()

    def residual(self, index: int = 0) -> torch.Tensor | None:
        """PowerSGD's error-feedback memory of bucket ``index`` (None for fp16 or before it exists)."""
        if self.name != "torch_powersgd":
            return None
        return self._state.error_dict.get(index)
