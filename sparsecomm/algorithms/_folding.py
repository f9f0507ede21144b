"""Folding of a non-power-of-two group onto its largest power of two (as MPICH does).

With ``P`` ranks and ``p2`` the largest power of two <= P, the ``extra = P - p2`` ranks
``p2 .. P-1`` fold into partners ``0 .. extra-1``: before the power-of-two part each
extra rank sends its data to ``rank - p2`` (one round), which combines it with its own;
the power-of-two algorithm then runs on ranks ``0 .. p2-1`` only; afterwards each partner
sends the result back to its extra rank (one more round). When P is a power of two
nothing folds and the two rounds disappear.

Reusable by any algorithm that needs a power-of-two core (gtopk, recursive doubling):

    f = fold_layout(comm.size, comm.rank)
    if f.folded_out:      send to f.partner, later receive the result from it
    elif f.partner is not None:  receive from f.partner and combine, later send it the result
    core algorithm on ranks 0..f.p2-1
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Folding", "fold_layout", "largest_power_of_two"]


def largest_power_of_two(size: int) -> int:
    """The largest power of two <= size (size >= 1)."""
    if size < 1:
        raise ValueError(f"largest_power_of_two: size must be >= 1, got {size}")
    return 1 << (size.bit_length() - 1)


@dataclass(frozen=True)
class Folding:
    p2: int             #: largest power of two <= size: ranks 0..p2-1 form the core
    folded_out: bool    #: rank >= p2: sends to its partner, takes no part in the core
    partner: int | None  #: the folding partner (rank +/- p2), None when there is none


def fold_layout(size: int, rank: int) -> Folding:
    """The folding role of ``rank`` in a group of ``size`` ranks."""
    if not 0 <= rank < size:
        raise ValueError(f"fold_layout: rank {rank} outside a group of {size}")
    p2 = largest_power_of_two(size)
    extra = size - p2
    if rank >= p2:
        partner: int | None = rank - p2
    elif rank < extra:
        partner = rank + p2
    else:
        partner = None
    return Folding(p2, rank >= p2, partner)
