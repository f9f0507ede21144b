"""The non-finite policy every reducer and both hooks follow: what a gradient holding NaN or Inf
does (the option ``nonfinite``; the reducer's module docstring says what each value does).

A rank's gradient is read once for its flag (:func:`nonfinite_flag`: the bits of
:func:`sparsecomm.ops.nonfinite_flags`, NaN, +Inf and -Inf told apart); the ranks share their
flags (the reducer in its agreement record, the FSDP hook in one small all-gather over every rank)
and, under ``"raise"``, every rank raises :func:`nonfinite_error`'s same text.
"""

from __future__ import annotations

from typing import Any

import torch

from .. import ops
from ..errors import AgreedValueError

__all__ = ["NONFINITE_POLICIES", "check_nonfinite", "nonfinite_flag", "nonfinite_error"]

#: the values of the ``nonfinite`` option
NONFINITE_POLICIES = ("propagate", "raise")


def check_nonfinite(nonfinite: Any) -> None:
    """A ValueError unless ``nonfinite`` is one of :data:`NONFINITE_POLICIES`."""
    if nonfinite not in NONFINITE_POLICIES:
        raise ValueError(f"nonfinite must be one of {', '.join(map(repr, NONFINITE_POLICIES))}, got {nonfinite!r}")


def nonfinite_flag(tensor: torch.Tensor) -> int:
    """0 if every element is finite, else the bits (:data:`sparsecomm.ops.NONFINITE_NAN`,
    ``_POS_INF``, ``_NEG_INF``) of what the tensor holds: :func:`sparsecomm.ops.nonfinite_flags`,
    one vectorized read on CPU (about 0.45 residual-add passes at N = 15M float32 where
    ``torch.aminmax`` took 0.7; docs/benchmarks.md), a second only when something is there."""
    if tensor.numel() == 0:
        return 0
    if tensor.device.type not in ("cpu", "cuda"):  # no kernel is registered there: a CPU copy is read
        tensor = tensor.cpu()
    return ops.nonfinite_flags(tensor)


def _flag_words(flag: int) -> str:
    return " and ".join(word for bit, word in ((ops.NONFINITE_NAN, "NaN"), (ops.NONFINITE_POS_INF, "+Inf"),
                                               (ops.NONFINITE_NEG_INF, "-Inf")) if flag & bit)


def nonfinite_error(flags: list[int], n: int, algorithm: str) -> AgreedValueError:
    """The ValueError every rank raises under ``nonfinite="raise"`` (the same text on all)."""
    groups: dict[int, list[int]] = {}
    for rank, flag in enumerate(flags):
        if flag:
            groups.setdefault(flag, []).append(rank)
    held = "; ".join(f"ranks {ranks} have {_flag_words(flag)}" for flag, ranks in groups.items())
    bad = sorted(rank for ranks in groups.values() for rank in ranks)
    return AgreedValueError(f"non-finite gradient on ranks {bad} ({held}; N={n}, {algorithm}, nonfinite='raise'): "
                      "no rank reduced it and no residual changed; nonfinite='propagate' hands the dense "
                      "allreduce of the raw gradients to every rank instead (what GradScaler expects)")
