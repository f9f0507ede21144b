"""Density warm-up: a declarative schedule of the density over the first training steps.

Sparsifying from the first step can slow early training: the residuals (error feedback) hold
most of the gradient while the weights change fastest. The papers start denser and tighten:

* gs-SGD's experiments (section 5) use 25% -> 7.25% -> 1.5% -> 0.4% over the first epochs:
  ``DensitySchedule.per_epoch([0.25, 0.0725, 0.015], steps_per_epoch=E)`` with the hook's
  ``density=0.004`` for every later step;
* Deep Gradient Compression (section 3.4, "warm-up training") raises the sparsity
  exponentially, 75% -> 93.75% -> 98.4375% -> 99.6% -> 99.9%, i.e. the density falls by a
  constant factor per epoch (about 4) from 25% to the final 0.1%:
  ``DensitySchedule.exponential(start=0.25, warmup_steps=4 * E, stages=4)`` with
  ``density=0.001``.

A schedule describes the warm-up only; after it the state's own ``density`` holds. It is a
value (kind and numbers), not a function, on purpose: every rank must use the same density at
every step (k decides message sizes, and a difference would hang or corrupt a collective), so
the reducer's signature handshake compares the schedule's canonical text (:meth:`spec_text`)
like any option, and ``state_dict()`` stores :meth:`to_state` so a resumed run continues the
same schedule at the same step. A Python callable can be neither compared across processes
(its code and closure may differ while its name agrees) nor stored in a checkpoint; hashing
sampled values would let schedules that differ between the samples pass. Densities computed
by :meth:`exponential` are rounded to 6 significant digits so that every platform's ``pow``
gives the same k.

:meth:`DensitySchedule.adaptive` is Accordion's rule (Agarwal et al., "Adaptive Gradient
Communication via Critical Learning Regime Identification", MLSys 2021, section 3): every
``interval`` steps the norm of the reduced gradient accumulated over the interval is compared with
the previous interval's; a relative change of at least ``eta`` is a critical regime, which uses the
``high`` density for the next interval, otherwise ``low``. The schedule stays a value (its
numbers); the regime is state, kept by each reducer (:class:`AdaptiveDensity`), decided from the
reduced result -- identical on every rank -- and saved in its ``state_dict()``. The k it gives is
in every call's agreement record like any other, so ranks that decided differently would raise
together, never exchange mismatched messages.
"""

from __future__ import annotations

import math
import operator
from fractions import Fraction
from typing import Any, Sequence

import torch

__all__ = ["DensitySchedule", "AdaptiveDensity", "as_schedule", "check_density", "check_step", "k_for"]

_KINDS = ("per_step", "exponential", "adaptive")


def k_for(density: float, n: int) -> int:
    """Elements each rank selects: max(1, ceil(density * N)), at most N (0 when N == 0).

    The product is taken on the density's shortest decimal form (``repr``), exactly: the
    binary float product overshoots for decimal densities (0.07 * 100 evaluates to
    7.000000000000001, whose ceiling would be 8, not the 7 a user asking for 7% expects).
    """
    if n == 0:
        return 0
    return min(n, max(1, math.ceil(Fraction(repr(float(density))) * n)))


def check_step(step: Any) -> int:
    """``step`` as an int; a ValueError unless it is an integer >= 0 (a step of training, 0-based)."""
    if isinstance(step, bool):
        raise ValueError(f"step must be an integer >= 0, got {step!r}")
    try:
        value = operator.index(step)
    except TypeError:
        raise ValueError(f"step must be an integer >= 0, got {step!r} ({type(step).__name__})") from None
    if value < 0:
        raise ValueError(f"step must be an integer >= 0, got {value}")
    return value


def check_density(value: Any, what: str = "density") -> float:
    """``value`` as a float; a ValueError unless it is a number in (0, 1] (the reducer's, the
    hook's and every density of a schedule)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0.0 < float(value) <= 1.0) \
            or not math.isfinite(float(value)):
        raise ValueError(f"{what} must be a number in (0, 1], got {value!r}")
    return float(value)


def _check_steps(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{what} must be an integer >= 1, got {value!r}")
    return value


class DensitySchedule:
    """The density of the first steps of training; after them the caller's final density.

    Build one with :meth:`per_epoch`, :meth:`per_step` or :meth:`exponential`; then
    ``schedule.density_at(step, final)`` is the density of step ``step`` (0-based, counted in
    the hook's iterations).
    """

    __slots__ = ("kind", "densities", "stage_steps", "start", "warmup_steps", "stages", "low", "high", "interval",
                 "eta", "warmup")

    def __init__(self, kind: str, *, densities: Sequence[float] = (), stage_steps: int = 0, start: float = 0.0,
                 warmup_steps: int = 0, stages: int = 0, low: float = 0.0, high: float = 0.0, interval: int = 0,
                 eta: float = 0.0, warmup: "DensitySchedule | None" = None):
        if kind not in _KINDS:
            raise ValueError(f"density schedule kind must be one of {', '.join(map(repr, _KINDS))}, got {kind!r}")
        self.kind = kind
        self.low = self.high = self.eta = 0.0
        self.interval = 0
        self.warmup = None
        if kind == "adaptive":
            self.low = check_density(low, "adaptive schedule low")
            self.high = check_density(high, "adaptive schedule high")
            if self.low > self.high:
                raise ValueError(f"adaptive schedule: low ({self.low}) must not exceed high ({self.high})")
            self.interval = _check_steps(interval, "adaptive schedule interval")
            if isinstance(eta, bool) or not isinstance(eta, (int, float)) or not (math.isfinite(eta) and eta > 0):
                raise ValueError(f"adaptive schedule eta (the relative change of the accumulated gradient's norm "
                                 f"that marks a critical regime) must be a number > 0, got {eta!r}")
            self.eta = float(eta)
            if warmup is not None and (not isinstance(warmup, DensitySchedule) or warmup.kind == "adaptive"):
                raise ValueError(f"adaptive schedule warmup must be a per_step, per_epoch or exponential "
                                 f"DensitySchedule (its final density is high), got {warmup!r}")
            self.warmup = warmup
            self.densities, self.stage_steps, self.start, self.stages = (), 0, 0.0, 0
            self.warmup_steps = 0 if warmup is None else warmup.warmup_steps
            return
        if kind == "per_step":
            if not isinstance(densities, (list, tuple)) or not densities:
                raise ValueError(f"a per-epoch/per-step density schedule needs a non-empty list of densities, "
                                 f"got {densities!r}")
            self.densities = tuple(check_density(d, f"density schedule entry {i}") for i, d in enumerate(densities))
            self.stage_steps = _check_steps(stage_steps, "steps_per_epoch (steps per schedule entry)")
            self.start, self.warmup_steps, self.stages = 0.0, len(self.densities) * self.stage_steps, len(self.densities)
        else:
            self.densities = ()
            self.start = check_density(start, "exponential schedule start")
            self.warmup_steps = _check_steps(warmup_steps, "exponential schedule warmup_steps")
            self.stages = _check_steps(stages if stages else warmup_steps, "exponential schedule stages")
            if self.stages > self.warmup_steps:
                raise ValueError(f"exponential schedule: stages ({self.stages}) cannot exceed warmup_steps "
                                 f"({self.warmup_steps})")
            self.stage_steps = 0

    # -- constructors ------------------------------------------------------------------------
    @classmethod
    def per_epoch(cls, densities: Sequence[float], steps_per_epoch: int) -> "DensitySchedule":
        """``densities[e]`` during epoch ``e`` (``steps_per_epoch`` steps each), then the final
        density (gs-SGD: ``[0.25, 0.0725, 0.015]`` before 0.4%)."""
        return cls("per_step", densities=list(densities), stage_steps=steps_per_epoch)

    @classmethod
    def per_step(cls, densities: Sequence[float], every: int = 1) -> "DensitySchedule":
        """``densities[i]`` for steps ``[i * every, (i + 1) * every)``, then the final density."""
        return cls("per_step", densities=list(densities), stage_steps=every)

    @classmethod
    def exponential(cls, start: float, warmup_steps: int, stages: int | None = None) -> "DensitySchedule":
        """DGC's warm-up: from ``start`` down to the final density by a constant factor per
        stage, ``stages`` equal stages over ``warmup_steps`` (default: one stage per step)."""
        return cls("exponential", start=start, warmup_steps=warmup_steps, stages=stages or 0)

    @classmethod
    def adaptive(cls, low: float, high: float, interval: int, eta: float = 0.5,
                 warmup: "DensitySchedule | None" = None) -> "DensitySchedule":
        """Accordion's rule (module docstring): ``high`` in a critical regime -- the first
        interval, and any interval after one whose accumulated reduced gradient's norm changed by
        at least ``eta`` (relative) from the interval before -- else ``low``; decided every
        ``interval`` steps. ``warmup``: a per_step / exponential schedule of the first steps (its
        final density: ``high``), the adaptive rule after it. The state's ``density`` is not used."""
        return cls("adaptive", low=low, high=high, interval=interval, eta=eta, warmup=warmup)

    # -- use -----------------------------------------------------------------------------------
    def density_at(self, step: int, final: float, critical: bool = True) -> float:
        """The density of step ``step`` (an integer >= 0, else ValueError) when the density after
        the warm-up is ``final``; an adaptive schedule's after its warm-up by the regime
        (``critical``: high, else low; its ``final`` is not used)."""
        step = check_step(step)
        if self.kind == "adaptive":
            if self.warmup is not None and step < self.warmup.warmup_steps:
                return self.warmup.density_at(step, self.high)
            return self.high if critical else self.low
        if step >= self.warmup_steps:
            return float(final)
        if self.kind == "per_step":
            return self.densities[step // self.stage_steps]
        stage = step * self.stages // self.warmup_steps
        value = self.start * (final / self.start) ** (stage / self.stages)
        return float(f"{value:.6g}")

    def spec_text(self) -> str:
        """Canonical text: what the signature handshake compares and errors show."""
        if self.kind == "per_step":
            return f"per_step(densities={list(self.densities)!r}, every={self.stage_steps})"
        if self.kind == "adaptive":
            return (f"adaptive(low={self.low!r}, high={self.high!r}, interval={self.interval}, eta={self.eta!r}, "
                    f"warmup={None if self.warmup is None else self.warmup.spec_text()})")
        return f"exponential(start={self.start!r}, warmup_steps={self.warmup_steps}, stages={self.stages})"

    def to_state(self) -> dict[str, Any]:
        """Plain data for ``state_dict()`` (no code): :meth:`from_state` rebuilds it."""
        if self.kind == "per_step":
            return {"kind": "per_step", "densities": list(self.densities), "every": self.stage_steps}
        if self.kind == "adaptive":
            return {"kind": "adaptive", "low": self.low, "high": self.high, "interval": self.interval, "eta": self.eta,
                    "warmup": None if self.warmup is None else self.warmup.to_state()}
        return {"kind": "exponential", "start": self.start, "warmup_steps": self.warmup_steps, "stages": self.stages}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> "DensitySchedule":
        if not isinstance(state, dict) or state.get("kind") not in _KINDS:
            raise ValueError(f"not a density schedule state: {state!r}")
        if state["kind"] == "per_step":
            return cls.per_step(state["densities"], state["every"])
        if state["kind"] == "adaptive":
            warmup = state.get("warmup")
            return cls.adaptive(state["low"], state["high"], state["interval"], state["eta"],
                                None if warmup is None else cls.from_state(warmup))
        return cls.exponential(state["start"], state["warmup_steps"], state["stages"])

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DensitySchedule) and self.spec_text() == other.spec_text()

    def __hash__(self) -> int:
        return hash(self.spec_text())

    def __repr__(self) -> str:
        return f"DensitySchedule.{self.spec_text()}"


def as_schedule(value: Any) -> DensitySchedule | None:
    """``value`` as a schedule: None, a :class:`DensitySchedule`, or its ``to_state()`` dict.

    A callable is refused with the reason (see the module docstring)."""
    if value is None or isinstance(value, DensitySchedule):
        return value
    if isinstance(value, dict):
        return DensitySchedule.from_state(value)
    if callable(value):
        raise ValueError("density_schedule must be a sparsecomm.DensitySchedule (per_epoch, per_step, "
                         "exponential or adaptive), not a callable: every rank must provably use the same density at every "
                         "step and a checkpoint must restore it, and a function can be neither compared across "
                         "ranks nor saved")
    raise ValueError(f"density_schedule must be a sparsecomm.DensitySchedule or None, got {type(value).__name__}")


class AdaptiveDensity:
    """One reducer's regime under an adaptive schedule (module docstring): whether the current
    interval is critical, the reduced gradient accumulated over it, and the previous interval's
    norm. Updated from the reduced result after each call, identically on every rank."""

    def __init__(self, schedule: DensitySchedule):
        self.schedule = schedule
        self.critical = True          # the first interval (Accordion starts in a critical regime)
        self.last_norm: float | None = None
        self.accumulated: torch.Tensor | None = None

    def update(self, step: int, result: torch.Tensor) -> None:
        """Add call ``step``'s reduced ``result`` (flat, identical on every rank); at the end of an
        interval (steps counted after the warm-up), decide the next interval's regime."""
        schedule = self.schedule
        if step < schedule.warmup_steps:
            return
        if self.accumulated is None or self.accumulated.numel() != result.numel():
            self.accumulated = torch.zeros(result.numel(), dtype=torch.float32 if result.dtype in
                                           (torch.float16, torch.bfloat16) else result.dtype, device=result.device)
        self.accumulated.add_(result)
        if (step - schedule.warmup_steps + 1) % schedule.interval:
            return
        norm = float(torch.linalg.vector_norm(self.accumulated))
        if self.last_norm is not None:
            change = abs(self.last_norm - norm) / self.last_norm if self.last_norm > 0 else math.inf
            self.critical = change >= schedule.eta
        self.last_norm = norm
        self.accumulated.zero_()

    def state_dict(self) -> dict[str, Any]:
        return {"critical": self.critical, "last_norm": self.last_norm,
                "accumulated": None if self.accumulated is None else self.accumulated.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not isinstance(state, dict) or not isinstance(state.get("critical"), bool):
            raise ValueError(f"not an adaptive density state (critical, last_norm, accumulated): {state!r}"[:300])
        self.critical = state["critical"]
        self.last_norm = None if state.get("last_norm") is None else float(state["last_norm"])
        accumulated = state.get("accumulated")
        self.accumulated = None if accumulated is None else accumulated.clone()
