"""What a rank does to its gradient before it joins the residual: momentum correction, momentum
factor masking and local gradient clipping (Lin et al., "Deep Gradient Compression", ICLR 2018,
sections 3.2 and 3.3).

Error feedback on the raw gradient leaves momentum to the optimizer, which then sees only the
sparse sum: a coordinate delayed for several steps misses the momentum it would have gathered
(DGC 3.2). With momentum correction each rank keeps a velocity per coordinate and accumulates
the velocity instead of the gradient; the user's optimizer runs without momentum::

    u <- m * u + g              (nesterov: u <- m * (u + g), and u + g joins the residual)
    e <- e + u                  the residual; the algorithm sends its top-k and keeps the rest

At density 1 (every coordinate sent each step) the sum over ranks of ``u`` is then exactly the
momentum buffer torch.optim.SGD(momentum=m) keeps for the averaged gradient (its first step
included: buffer = g), so plain SGD on the reduced average takes dense momentum SGD's steps.

Momentum factor masking (DGC 3.3): where a coordinate was sent, its velocity is cleared too, so
a stale velocity does not push a coordinate that was just updated in the same direction again.
"Sent" is a coordinate whose residual the call changed (an algorithm leaves every coordinate it
did not let through exactly as it was, and changes the others to 0, or to what a value codec's
rounding kept back). At density 1 masking clears every velocity: plain SGD.

Local gradient clipping (DGC 3.3): before the gradient joins the velocity (or the residual),
each rank scales it to an L2 norm of at most ``clip_norm / sqrt(P)`` (P ranks: the rank's share
of a global threshold ``clip_norm``, as DGC scales it), per tensor the reducer is given (a DDP
bucket, an FSDP module's shard). The threshold is on the *sum* over ranks, which is P times the
average DDP gives the optimizer: to replace ``torch.nn.utils.clip_grad_norm_(params, c)`` on the
averaged gradient, pass ``clip_norm = c * P`` (each rank then clips to ``c * sqrt(P)``).

Where the velocity lives: beside the residual -- the whole tensor when flat, this rank's shard
in two levels (after the node's dense reduce-scatter, the velocity of the node's summed shard:
the sum over nodes is the same, and masking needs the coordinates the shard's owner sent).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["LocalUpdate", "LocalUpdateState", "momentum_twice"]


@dataclass(frozen=True)
class LocalUpdate:
    """The options (module docstring): ``momentum`` in [0, 1) (0: off), ``nesterov``,
    ``momentum_masking``, ``clip_norm`` (None: off; else > 0). Checked here; part of every
    agreement record through :meth:`options`."""

    momentum: float = 0.0
    nesterov: bool = False
    momentum_masking: bool = False
    clip_norm: float | None = None

    def __post_init__(self) -> None:
        m = self.momentum
        if isinstance(m, bool) or not isinstance(m, (int, float)) or not (0.0 <= float(m) < 1.0):
            raise ValueError(f"momentum must be a number in [0, 1) (0: off), got {m!r}; pair a momentum here with "
                             "an optimizer without momentum, e.g. torch.optim.SGD(params, lr, momentum=0)")
        object.__setattr__(self, "momentum", float(m))
        for name in ("nesterov", "momentum_masking"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if (self.nesterov or self.momentum_masking) and self.momentum == 0.0:
            which = "nesterov" if self.nesterov else "momentum_masking"
            raise ValueError(f"{which}=True needs a momentum: pass momentum=0.9 (for example) as well")
        c = self.clip_norm
        if c is not None:
            if isinstance(c, bool) or not isinstance(c, (int, float)) or not (math.isfinite(c) and c > 0):
                raise ValueError(f"clip_norm must be a finite number > 0, or None (no clipping); got {c!r}")
            object.__setattr__(self, "clip_norm", float(c))

    @property
    def active(self) -> bool:
        return self.momentum > 0.0 or self.clip_norm is not None

    def options(self) -> dict[str, Any]:
        """The options that are on, as the agreement record's options text names them (nothing
        when off, so a reducer without them compares and fingerprints as before)."""
        out: dict[str, Any] = {}
        if self.momentum > 0.0:
            out["momentum"] = self.momentum
            if self.nesterov:
                out["nesterov"] = True
            if self.momentum_masking:
                out["momentum_masking"] = True
        if self.clip_norm is not None:
            out["clip_norm"] = self.clip_norm
        return out

    def to_state(self) -> dict[str, Any]:
        return {"momentum": self.momentum, "nesterov": self.nesterov, "momentum_masking": self.momentum_masking,
                "clip_norm": self.clip_norm}

    @classmethod
    def from_state(cls, state: Any) -> "LocalUpdate":
        if state is None:
            return cls()
        if not isinstance(state, dict):
            raise ValueError(f"a saved local update must be a dict (LocalUpdate.to_state()), got {type(state).__name__}")
        return cls(**state)


class LocalUpdateState:
    """One reducer's velocity and the per-call steps of :class:`LocalUpdate`."""

    def __init__(self, config: LocalUpdate):
        self.config = config
        #: the velocity, beside the residual (None before the first call, or without momentum)
        self.velocity: torch.Tensor | None = None
        #: two-level, after a load: velocity values of the whole tensor outside this rank's shard,
        #: summed into their owners' velocities in the next call (None: nothing to carry)
        self.carry: torch.Tensor | None = None
        self._before: torch.Tensor | None = None

    @property
    def masks(self) -> bool:
        """Whether a call must tell what it sent (momentum factor masking)."""
        return self.velocity is not None and self.config.momentum_masking

    def clip_scale(self, flat: torch.Tensor, ranks: int) -> float:
        """The factor that brings this rank's gradient to at most ``clip_norm / sqrt(ranks)``
        (1.0 without clipping, or under it). Reads the gradient once."""
        limit = self.config.clip_norm
        if limit is None or flat.numel() == 0:
            return 1.0
        # half gradients in float32 (no overflow of the squares)
        norm = float(torch.linalg.vector_norm(flat, dtype=torch.float32 if flat.dtype in
                                              (torch.float16, torch.bfloat16) else flat.dtype))
        bound = limit / math.sqrt(ranks)
        return bound / norm if norm > bound else 1.0

    def prepare(self, n: int, dtype: torch.dtype, device: torch.device, loaded: torch.Tensor | None) -> None:
        """The velocity of an ``n``-element part (zeros, or the loaded one's values)."""
        self.carry = None
        if self.config.momentum == 0.0:
            self.velocity = None
            return
        self.velocity = torch.zeros(n, dtype=dtype, device=device)
        if loaded is not None:
            self.velocity.copy_(loaded.reshape(-1).to(device=device, dtype=dtype))

    def feed(self, grad: torch.Tensor, scale: float, scratch: torch.Tensor | None) -> torch.Tensor:
        """What joins the residual this call: ``scale * grad`` without momentum, else the new
        velocity (nesterov: velocity + gradient, written into ``scratch`` when given, which may
        be ``grad``'s own memory, else into a new tensor)."""
        u = self.velocity
        if u is None:
            if scale == 1.0:
                return grad
            out = scratch if scratch is not None else torch.empty_like(grad)
            return torch.mul(grad, scale, out=out)
        m = self.config.momentum
        if self.config.nesterov:    # u <- m (u + g); u + g joins
            u.add_(grad, alpha=scale).mul_(m)
            out = scratch if scratch is not None else torch.empty_like(grad)
            return torch.add(u, grad, alpha=scale, out=out)
        u.mul_(m).add_(grad, alpha=scale)
        return u

    def before_algorithm(self, acc: torch.Tensor) -> None:
        """Masking: remember the residual the algorithm gets (to tell what it sent)."""
        if self.velocity is not None and self.config.momentum_masking:
            self._before = acc.clone()

    def after_algorithm(self, acc: torch.Tensor) -> None:
        """Masking: clear the velocity where the call changed the residual (what it sent)."""
        before, self._before = self._before, None
        if before is not None:
            self.velocity.masked_fill_(acc != before, 0)


def momentum_twice(update: LocalUpdate, optimizers: Any) -> str | None:
    """What is wrong when the hook's momentum correction meets an optimizer that has momentum of
    its own (the step would apply momentum twice), or an Adam-like one (momentum correction is
    the velocity of SGD with momentum); None when nothing is. For the integrations, which see the
    optimizers: they warn with it."""
    if update.momentum == 0.0:
        return None
    for optimizer in optimizers or ():
        inner = getattr(optimizer, "optimizer", optimizer)   # Accelerate's and Lightning's wrappers
        for group in getattr(inner, "param_groups", ()):
            if group.get("momentum", 0) or group.get("betas") is not None:
                what = f"momentum={group['momentum']}" if group.get("momentum", 0) else f"betas={group['betas']}"
                return (f"sparsecomm: the hook applies momentum correction (momentum={update.momentum}) and the "
                        f"optimizer {type(inner).__name__} has {what}: the velocity would be applied twice (or fed "
                        "to an adaptive method it was not made for). Pair momentum correction with "
                        "torch.optim.SGD(params, lr, momentum=0), or drop momentum= from the hook's state")
    return None
