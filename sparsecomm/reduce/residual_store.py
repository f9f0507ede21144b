"""Where a reducer keeps its residual between calls: in the working dtype (float32), or in a
narrower form that costs less memory -- ``residual_dtype=torch.bfloat16`` (2 bytes per element)
or ``"int8"`` (1 byte per element and one exponent byte per block of :data:`BLOCK` elements).

Error feedback keeps a residual as large as the gradient: 4 bytes per parameter in float32, a
quarter on top of a mixed-precision Adam state of 16. LoCo ("LoCo: Low-Bit Communication
Adaptor for Large-scale Model Training", TPAMI 2025) keeps the compensation error in 8 bits
without loss; torchft declined error feedback for that memory.

Per call the stored residual is widened into a transient float32 buffer (one bucket or shard
at a time), the algorithm runs on it exactly as on a float32 residual, and what it held back is
narrowed again. What the narrowing loses is the only change to conservation::

    sum_r (g_r + e_r) == out + sum_r e'_r + sum_r d_r

where ``e'_r`` is what is stored (and comes back next call) and ``d_r = acc_r - e'_r`` the
rounding. Entries the algorithm sent are 0 after the call and 0 is exact in every form, so
``d_r`` lives only on entries held back: per entry ``|d| <= 2**-8 |acc|`` in bfloat16 (round to
nearest even, 8 significant bits), ``|d| <= s / 2`` in int8 with the block's scale ``s``. The reducer reports
``||d||_1 / ||acc||_1`` of this rank as ``last_stats["residual_rounding"]``.

int8: each block of :data:`BLOCK` elements has a power-of-two scale ``s = 2**e``, the smallest
with ``max |x| / s <= 127``; entries are ``round(x / s)`` in [-127, 127]. Powers of two make the
form a fixed point of widening and narrowing (the block's largest entry is at least 64 after
rounding, so narrowing the widened values finds the same ``e``), so a checkpoint that saves the
widened float32 values resumes bit-exactly. A power of two costs up to one bit against an
exact max-abs scale (the block's largest entry lands in [64, 127], not at 127).
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["BLOCK", "RESIDUAL_DTYPES", "ResidualStore", "check_residual_dtype", "residual_dtype_text"]

#: elements per int8 block (one exponent byte each: 1/64 byte per element)
BLOCK = 64
#: the narrow forms, by their name in options, agreement texts and checkpoints
RESIDUAL_DTYPES = ("float32", "bfloat16", "int8")
# exponents of empty (all-zero) blocks: any value works, 0 decodes them to 0
_ZERO_EXPONENT = 0


def check_residual_dtype(value: Any) -> str | None:
    """``value`` as a form name of :data:`RESIDUAL_DTYPES`, or None for the working dtype (None
    or torch.float32). A ValueError for anything else."""
    if value is None or value is torch.float32 or value == "float32":
        return None
    if value is torch.bfloat16 or value == "bfloat16":
        return "bfloat16"
    if value in ("int8", torch.int8):
        return "int8"
    raise ValueError(f"residual_dtype must be None (the working dtype, float32), torch.bfloat16 or 'int8' (8 bits "
                     f"with a power-of-two scale per block of {BLOCK}); got {value!r}")


def residual_dtype_text(form: str | None) -> str:
    return "float32" if form is None else form


def bytes_per_element(form: str | None) -> float:
    """The residual's memory per gradient element in ``form``."""
    return {None: 4.0, "bfloat16": 2.0, "int8": 1.0 + 1.0 / BLOCK}[form]


class ResidualStore:
    """One reducer's residual of ``n`` elements in a narrow ``form`` ("bfloat16" or "int8")."""

    def __init__(self, form: str, n: int, device: torch.device):
        if form not in ("bfloat16", "int8"):
            raise ValueError(f"ResidualStore keeps bfloat16 or int8, not {form!r}")
        self.form, self.n = form, n
        if form == "bfloat16":
            self.data = torch.zeros(n, dtype=torch.bfloat16, device=device)
            self.exponents = None
        else:
            self.data = torch.zeros(n, dtype=torch.int8, device=device)
            self.exponents = torch.full(((n + BLOCK - 1) // BLOCK,), _ZERO_EXPONENT, dtype=torch.int8, device=device)

    @property
    def nbytes(self) -> int:
        extra = 0 if self.exponents is None else self.exponents.numel()
        return self.data.numel() * self.data.element_size() + extra

    def widen_into(self, acc: torch.Tensor) -> None:
        """The stored residual, as float32 values, into ``acc`` (n elements)."""
        if self.exponents is None:
            acc.copy_(self.data)
            return
        full = self.n - self.n % BLOCK
        scales = torch.ldexp(torch.ones((), device=acc.device), self.exponents.to(torch.float32))
        if full:
            torch.mul(self.data[:full].view(-1, BLOCK), scales[:full // BLOCK, None],
                      out=acc[:full].view(-1, BLOCK))
        if full != self.n:
            torch.mul(self.data[full:], scales[-1], out=acc[full:])

    def values(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The stored residual as a new tensor of ``dtype`` (the reducer's working dtype)."""
        out = torch.empty(self.n, dtype=dtype, device=self.data.device)
        self.widen_into(out)
        return out

    def narrow_from(self, acc: torch.Tensor, measure: bool = True) -> float | None:
        """Store ``acc`` (float32, n elements) narrowed; return ``||acc - stored||_1 / ||acc||_1``
        (0.0 for a zero ``acc``) when ``measure``. ``acc`` is left as it was."""
        if self.exponents is None:
            self.data.copy_(acc)
        else:
            self._narrow_int8(acc)
        if not measure:
            return None
        total = float(acc.abs().sum())
        if total == 0.0:
            return 0.0
        return float((acc - self.values(acc.dtype)).abs().sum()) / total

    def _narrow_int8(self, acc: torch.Tensor) -> None:
        full = self.n - self.n % BLOCK
        parts = []
        if full:
            parts.append((acc[:full].view(-1, BLOCK), self.data[:full].view(-1, BLOCK), self.exponents[:full // BLOCK]))
        if full != self.n:
            parts.append((acc[full:].view(1, -1), self.data[full:].view(1, -1), self.exponents[full // BLOCK:]))
        for values, data, exponents in parts:
            peak = values.abs().amax(dim=1)
            # the smallest e with peak / 2**e <= 127: frexp gives peak / 127 = m * 2**x, m in [0.5, 1)
            mantissa, exponent = torch.frexp(peak / 127.0)
            exponent = exponent - (mantissa == 0.5).to(exponent.dtype)   # an exact power of two fits at x - 1
            exponent = torch.where(peak > 0, exponent, torch.full_like(exponent, _ZERO_EXPONENT))
            exponent = exponent.clamp_(-127, 127)
            scaled = torch.ldexp(values, (-exponent)[:, None].to(values.dtype))
            data.copy_(scaled.round_().clamp_(-127, 127))
            exponents.copy_(exponent)
