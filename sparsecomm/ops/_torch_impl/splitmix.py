"""splitmix64 on int64 tensors (``csrc/cpu/common.h``; torch has no uint64 arithmetic, and
int64 products wrap like uint64 ones): QSGD's draws and the Count-Sketch hashes."""

from __future__ import annotations

import torch

__all__ = ["MASK64", "u64", "srl", "mix64"]


MASK64 = (1 << 64) - 1


def u64(u: int) -> int:
    """An unsigned 64-bit constant as the int64 torch arithmetic wraps to."""
    u &= MASK64
    return u - (1 << 64) if u >= 1 << 63 else u


def srl(z: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64 bit patterns (torch's >> is arithmetic)."""
    return (z >> s) & ((1 << (64 - s)) - 1)


def mix64(z: torch.Tensor) -> torch.Tensor:
    """splitmix64's finaliser; int64 arithmetic wraps like uint64."""
    z = z ^ srl(z, 30)
    z = z * u64(0xBF58476D1CE4E5B9)
    z = z ^ srl(z, 27)
    z = z * u64(0x94D049BB133111EB)
    return z ^ srl(z, 31)
