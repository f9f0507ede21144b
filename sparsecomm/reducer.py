"""``SparseAllreduce``: error feedback, k from density, statistics; runs one algorithm.

Per call, on every rank r (the error-feedback invariant of docs/architecture.md, "Algorithms"):

1. ``acc = g_r + e_r`` -- the gradient plus the residual carried in (in the reducer's own
   buffer, so the steady state allocates nothing but the result),
2. the algorithm writes the reduced result ``out`` and leaves in ``acc`` what it did not
   let through, which becomes ``e'_r``; hence ``sum_r (g_r + e_r) == out + sum_r e'_r``.

float16 / bfloat16 gradients are reduced in float32 (residual, messages and sums), and
the result is rounded once to the gradient's dtype.

Before the first call with a given length and dtype the ranks exchange a small signature
(format version, sparsecomm version, algorithm, options, density, N, dtype, k). Any
difference raises the same ValueError on every rank, naming the ranks and the field, instead
of a hang or a wrong sum; differing sparsecomm versions are named in words (one more small
all-gather of the version strings, only on that error path).
"""

from __future__ import annotations

import math
from fractions import Fraction
import time
import zlib
from typing import Any

import torch

from . import _version as _version_module
from . import algorithms
from .comm.base import Comm
from .formats.header import DTYPE_CODES, FORMAT_VERSION, MAGIC

__all__ = ["SparseAllreduce", "k_for"]

_HALF_TYPES = (torch.float16, torch.bfloat16)
_SIGNATURE_FIELDS = ("magic", "format version", "sparsecomm version", "algorithm", "options", "density", "N",
                     "dtype", "k")
#: bytes of a version string sent to name differing versions in the error (longer ones are cut)
_VERSION_BYTES = 64


def k_for(density: float, n: int) -> int:
    """Elements each rank selects: max(1, ceil(density * N)), at most N (0 when N == 0).

    The product is taken on the density's shortest decimal form (``repr``), exactly: the
    binary float product overshoots for decimal densities (0.07 * 100 evaluates to
    7.000000000000001, whose ceiling would be 8, not the 7 a user asking for 7% expects).
    """
    if n == 0:
        return 0
    return min(n, max(1, math.ceil(Fraction(repr(float(density))) * n)))


def check_state_version(state: dict[str, Any]) -> None:
    """Refuse a state_dict written by another sparsecomm format version."""
    if state.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"state_dict has format version {state.get('format_version')}, "
                         f"this sparsecomm writes {FORMAT_VERSION}")


def _crc(text: str) -> int:
    return zlib.crc32(text.encode())


def _version() -> str:
    """This rank's sparsecomm version, read at each handshake (not frozen at import)."""
    return str(_version_module.__version__)


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
        **options: the algorithm's own options (validated by it).
    """

    def __init__(self, algorithm: str, density: float, comm: Comm | None = None, **options: Any):
        if isinstance(density, bool) or not isinstance(density, (int, float)) or not (0.0 < density <= 1.0):
            raise ValueError(f"density must be a number in (0, 1], got {density!r}")
        cls = algorithms.get(algorithm)
        if comm is None:
            from .comm.torch_comm import TorchComm
            comm = TorchComm()
        if not isinstance(comm, Comm):
            raise ValueError(f"comm must be a sparsecomm.comm.Comm, got {type(comm).__name__}")
        self.algorithm_name = algorithm
        self.density = float(density)
        self.comm = comm
        self.algorithm = cls(comm, **options)
        self._residual: torch.Tensor | None = None
        self._pending_residual: torch.Tensor | None = None
        self._agreed: tuple | None = None   # (n, dtype, device) the ranks agreed on
        self._shape: torch.Size | None = None
        self.last_stats: dict[str, Any] = {}

    # -- public state ----------------------------------------------------------------------
    @property
    def residual(self) -> torch.Tensor | None:
        """What this rank carries to the next call (shape of the last gradient; float32 for
        half gradients), or None before the first call."""
        if self._residual is None:
            return self._pending_residual
        return self._residual.view(self._shape)

    def k_for(self, n: int) -> int:
        return k_for(self.density, n)

    def reset(self) -> None:
        """Forget the residual (e.g. before reusing the reducer for another tensor)."""
        self._residual = None
        self._pending_residual = None
        self._agreed = None
        self._shape = None

    def state_dict(self) -> dict[str, Any]:
        return {
            "format_version": FORMAT_VERSION,
            "algorithm": self.algorithm_name,
            "density": self.density,
            "residual": None if self.residual is None else self.residual.detach().clone(),
            "algorithm_state": self.algorithm.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("algorithm") != self.algorithm_name:
            raise ValueError(f"state_dict is for algorithm {state.get('algorithm')!r}, "
                             f"this reducer runs {self.algorithm_name!r}")
        check_state_version(state)
        self.reset()
        self._pending_residual = state.get("residual")
        self.algorithm.load_state_dict(state.get("algorithm_state", {}))

    # -- the call --------------------------------------------------------------------------
    # Under torch.compile a call runs eagerly (a graph break around it): its
    # communication waits on other processes (sockets, MPI, Python threads) and its
    # wire headers are numpy structs, none of which dynamo can trace. The ops it calls
    # are custom ops with fake kernels, so the same local compute traces in a user's
    # own compiled code (tests/test_op_contracts.py).
    @torch.compiler.disable
    def __call__(self, grad: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        if not isinstance(grad, torch.Tensor) or not grad.is_floating_point():
            raise ValueError(f"grad must be a floating-point tensor, got "
                             f"{type(grad).__name__ if not isinstance(grad, torch.Tensor) else grad.dtype}")
        if out is not None and (out.shape != grad.shape or out.dtype != grad.dtype or out.device != grad.device):
            raise ValueError(f"out must match grad (shape {tuple(grad.shape)}, {grad.dtype}, {grad.device}); "
                             f"got shape {tuple(out.shape)}, {out.dtype}, {out.device}")
        start = time.perf_counter()
        flat = grad.detach().reshape(-1)
        n = flat.numel()
        work_dtype = torch.float32 if grad.dtype in _HALF_TYPES else grad.dtype
        handshake = self.comm.stats.snapshot()
        acc = self._prepare(n, work_dtype, grad)
        after_handshake = self.comm.stats.snapshot()
        acc.add_(flat)  # acc = g + e, accumulated in the working dtype
        k = self.k_for(n)
        if out is not None and out.dtype == work_dtype and out.is_contiguous():
            result = out
            work_out = out.view(-1)  # safe even if out aliases grad: grad was read into acc above
        else:
            result = torch.empty(grad.shape, dtype=grad.dtype, device=grad.device) if out is None else out
            work_out = result.view(-1) if grad.dtype == work_dtype and result.is_contiguous() else \
                torch.empty(n, dtype=work_dtype, device=grad.device)
        self.algorithm.times = {}
        self.algorithm.last_nnz = None
        if n:
            self.algorithm.reduce(acc, k, work_out)
        if work_out.data_ptr() != result.data_ptr() or work_out.dtype != result.dtype:
            result.copy_(work_out.view(result.shape))
        self._shape = grad.shape
        spent = self.comm.stats - after_handshake
        handshake_spent = after_handshake - handshake
        times = self.algorithm.times
        self.last_stats = {
            "algorithm": self.algorithm_name, "n": n, "k": k,
            "bytes_sent": spent.bytes_sent, "bytes_recv": spent.bytes_recv, "rounds": spent.rounds,
            "nnz_out": self.algorithm.last_nnz if self.algorithm.last_nnz is not None
            else int(torch.count_nonzero(work_out)),
            "select_s": times.get("select", 0.0), "merge_s": times.get("merge", 0.0),
            "comm_s": spent.comm_s, "total_s": time.perf_counter() - start,
            "handshake_bytes": handshake_spent.bytes_sent, "handshake_rounds": handshake_spent.rounds,
        }
        return result

    def _prepare(self, n: int, work_dtype: torch.dtype, grad: torch.Tensor) -> torch.Tensor:
        """The residual buffer for this call; agree with the other ranks first if new."""
        key = (n, work_dtype, grad.device)
        if self._agreed is not None and self._agreed != key:
            raise ValueError(f"this reducer was used for N={self._agreed[0]} ({self._agreed[1]}, "
                             f"{self._agreed[2]}) and now gets N={n} ({work_dtype}, {grad.device}): "
                             "use one SparseAllreduce per tensor, or call reset() first")
        if self._agreed is None:
            self._handshake(n, grad.dtype)
            self._agreed = key
            pending, self._pending_residual = self._pending_residual, None
            self._residual = torch.zeros(n, dtype=work_dtype, device=grad.device)
            if pending is not None:
                if pending.numel() != n:
                    raise ValueError(f"the loaded residual has {pending.numel()} elements but the gradient "
                                     f"has {n}: the state_dict belongs to another tensor")
                self._residual.copy_(pending.reshape(-1))
        return self._residual

    def _handshake(self, n: int, dtype: torch.dtype) -> None:
        """Exchange a signature; raise the same ValueError on every rank on any difference."""
        options = repr(sorted((key, repr(value)) for key, value in self.algorithm.options.items()))
        density_bits = torch.tensor([self.density], dtype=torch.float64).view(torch.int64).item()
        algorithm_id = f"{self.algorithm_name}/{self.algorithm.wire_revision}"
        version = _version()
        mine = torch.tensor([MAGIC, FORMAT_VERSION, _crc(version), _crc(algorithm_id), _crc(options),
                             density_bits, n, DTYPE_CODES.get(dtype, 0), self.k_for(n)], dtype=torch.int64)
        table = self.comm.allgather_small(mine).cpu()
        differing = [i for i in range(len(_SIGNATURE_FIELDS)) if not bool((table[:, i] == table[0, i]).all())]
        if not differing:
            return
        lines = []
        for i in differing:
            field = _SIGNATURE_FIELDS[i]
            values = table[:, i].tolist()
            if field == "sparsecomm version":
                values = self._version_words(version, differing, values)
            elif field == "dtype":
                by_code = {code: str(d) for d, code in DTYPE_CODES.items()}
                values = [by_code.get(v, v) for v in values]
            elif field == "density":
                values = [torch.tensor([v]).view(torch.float64).item() for v in values]
            elif field in ("algorithm", "options", "magic"):
                values = [f"#{v:x}" for v in values]
            groups: dict[Any, list[int]] = {}
            for rank, value in enumerate(values):
                groups.setdefault(value, []).append(rank)
            lines.append(f"{field}: " + "; ".join(f"ranks {ranks} have {value}" for value, ranks in groups.items()))
        raise ValueError(f"rank {self.comm.rank}: the ranks disagree on the reduction "
                         f"({self.algorithm_name}, density {self.density}, this rank N={n}, {dtype}):\n  "
                         + "\n  ".join(lines)
                         + "\nevery rank must call the same reducer with the same tensor size, dtype, "
                           "algorithm, options and sparsecomm version")

    def _version_words(self, version: str, differing: list[int], hashes: list[int]) -> list[str]:
        """Every rank's version string, for the error message (all ranks call this together:
        they all saw the same table). Only when the handshake layout itself agrees (same magic
        and format version): a peer speaking another layout might not answer, so its version
        is then shown by hash."""
        if any(_SIGNATURE_FIELDS[i] in ("magic", "format version") for i in differing):
            return [f"#{h:x}" for h in hashes]
        raw = version.encode()[:_VERSION_BYTES]
        padded = torch.zeros(_VERSION_BYTES, dtype=torch.uint8)
        padded[:len(raw)] = torch.tensor(list(raw), dtype=torch.uint8)
        words = []
        for row in self.comm.allgather_small(padded).cpu():
            text = bytes(row.tolist()).rstrip(b"\0").decode("utf-8", errors="replace")
            words.append(repr(text))
        return words
