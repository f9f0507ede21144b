"""Top-k selection and COO kernels: the Python face of ``csrc/ops.cpp``.

The faces only convert arguments and name them; the binding checks them and the C
kernel validates the data (index order and range), so nothing is checked twice.
"""

from __future__ import annotations

from typing import Optional, Sequence, Tuple

import torch

from ._errors import translating

__all__ = ["topk", "topk_radix", "block_topk", "topk_accum_", "block_topk_count", "merge_add", "merge_add_many", "scatter_add_",
           "scatter_set_", "gather", "nonfinite_flags", "release_caches", "NONFINITE_NAN", "NONFINITE_POS_INF",
           "NONFINITE_NEG_INF"]

_ops = torch.ops.sparsecomm

#: the bits of :func:`nonfinite_flags` (the kernel's ``SC_NONFINITE_*``, csrc/include/sparsecomm/kernels.h)
NONFINITE_NAN, NONFINITE_POS_INF, NONFINITE_NEG_INF = 1, 2, 4


@translating
def topk(x: torch.Tensor, k: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Exact top-``k`` entries of the 1-D tensor ``x`` by magnitude ``|x|``.

    Returns ``(values, indices)`` with ``m = min(k, len(x))`` entries: ``indices`` is
    int64 in ascending order and ``values = x[indices]`` (same dtype as ``x``, original
    sign). Ties in ``|x|`` are broken by the lower index, so the result is
    deterministic; ``+0.0`` and ``-0.0`` are equal and ``Inf`` counts as the largest
    magnitude. ``k = 0`` gives empty tensors, ``k >= len(x)`` every element.

    Raises ``ValueError`` if ``x`` is not 1-D, ``k < 0``, or ``x`` contains NaN;
    ``TypeError`` for dtypes other than float32/float64/float16/bfloat16.

    CPU: multi-threaded C kernel (sampled threshold + one filtering pass, with an exact
    radix fallback). Other devices: the torch implementation of ``ops._torch_impl``.
    """
    return _ops.topk(x, k)


@translating
def topk_radix(x: torch.Tensor, k: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """:func:`topk` always through the exact radix path (tests and benchmarks).

    Same contract and results as :func:`topk`; without the sampled fast path and the
    small-input quickselect, so the radix path can be exercised on any input.
    """
    return _ops.topk_radix(x, k)


@translating
def block_topk(x: torch.Tensor, num_blocks: int, k_per_block: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Top-``k_per_block`` by magnitude inside each of ``num_blocks`` blocks.

    Block ``b`` is ``x[b*N//B : (b+1)*N//B]`` (``N = len(x)``, ``B = num_blocks``;
    blocks differ in length by at most one). Each block contributes
    ``min(k_per_block, block_len)`` entries selected with the rules of :func:`topk`;
    the result is the concatenation in block order, so the global int64 ``indices``
    are ascending. ``num_blocks > N`` is allowed (empty blocks contribute nothing).
    SparDL's block-wise selection (section 3, Spar-Reduce-Scatter).

    Raises ``ValueError`` for ``num_blocks < 1``, ``k_per_block < 0``, non-1-D ``x``
    or NaN.
    """
    return _ops.block_topk(x, num_blocks, k_per_block)


def block_topk_count(n: int, num_blocks: int, k_per_block: int) -> int:
    """Entries :func:`block_topk` returns: sum over the blocks of min(k_per_block, len_b)."""
    if n <= 0 or num_blocks < 1 or k_per_block <= 0:
        return 0
    q, r = divmod(n, num_blocks)
    return r * min(k_per_block, q + 1) + (num_blocks - r) * min(k_per_block, q)


@translating
def topk_accum_(acc: torch.Tensor, g: torch.Tensor, k: int, *, num_blocks: int = 1,
                clear: bool = False) -> Tuple[torch.Tensor, torch.Tensor]:
    """The residual add fused with the selection: ``acc += g``, then the top-``k`` of the
    sums (``num_blocks > 1``: the top-``k`` of every block, as :func:`block_topk`).

    Returns ``(values, indices)`` exactly as ``topk(acc, k)`` (or ``block_topk(acc,
    num_blocks, k)``) would after ``acc.add_(g)`` -- the same bits, the same tie rule -- but
    on CPU the sampled fast path adds while it filters the candidates, so ``acc`` and ``g``
    are read once and ``acc`` written once instead of an add pass followed by a selection
    pass. With ``clear=True`` the selected positions of ``acc`` are then set to ``+0.0``
    (what was selected leaves the residual; ``acc.index_fill_(0, indices, 0)``).

    ``acc``: 1-D contiguous float32/float64, written in place; ``g``: the same dtype and
    length. ``acc`` must not share memory with ``g`` (``ValueError``). A NaN among the sums
    raises ``ValueError`` after ``acc`` received them (nothing is cleared then).
    """
    m = block_topk_count(acc.numel(), num_blocks, k) if acc.dim() == 1 else 0
    values = acc.new_empty(m)
    indices = torch.empty(m, dtype=torch.int64, device=acc.device)
    _ops.topk_accum_(acc, g, num_blocks, k, clear, values, indices)
    return values, indices


@translating
def merge_add(idx_a: torch.Tensor, val_a: torch.Tensor, idx_b: torch.Tensor,
              val_b: torch.Tensor, n: Optional[int] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """Union of two index-sorted COO vectors, summing values on shared indices.

    Returns ``(idx, val)``: ``idx`` is the sorted union of ``idx_a`` and ``idx_b``
    (same index dtype), ``val`` holds ``val_a + val_b`` where an index is in both,
    else the single value. Half types are summed in float32 and rounded once.
    Indices must be strictly ascending, ``>= 0`` and, when ``n`` is given, ``< n``:
    checked in full by the kernel (``ValueError`` naming the input and position).
    """
    return _ops.merge_add(idx_a, val_a, idx_b, val_b, -1 if n is None else n)


@translating
def merge_add_many(indices: Sequence[torch.Tensor], values: Sequence[torch.Tensor],
                   n: Optional[int] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """k-way union of index-sorted COO vectors ``(indices[p], values[p])``.

    Where several inputs hold the same index their values are summed in list order
    (input 0 first; half types in float32, rounded once), so every rank that passes
    the same inputs in the same order gets bit-identical results. O(total * log P)
    (heap merge, parallel over index ranges). At least one input is required; inputs
    are validated as in :func:`merge_add`.
    """
    indices, values = list(indices), list(values)
    if not indices and not values:  # the dispatcher routes by tensor arguments: none here
        raise ValueError("sparsecomm.merge_add_many: needs at least one input vector, got none")
    return _ops.merge_add_many(indices, values, -1 if n is None else n)


@translating
def scatter_add_(dense: torch.Tensor, idx: torch.Tensor, val: torch.Tensor) -> torch.Tensor:
    """In place ``dense[idx] += val`` for a 1-D contiguous ``dense``; returns ``dense``.

    ``idx`` (int32/int64, any order) may repeat: repeated indices add up, in order
    (strictly ascending indices are distinct, and only then does the kernel scatter in
    parallel). Half types: each addition in float32, rounded to the dense dtype.
    Indices must lie in ``[0, len(dense))`` (checked before anything is written);
    ``val`` or ``idx`` sharing memory with ``dense`` raises ``ValueError``.
    """
    _ops.scatter_add_(dense, idx, val)
    return dense


@translating
def scatter_set_(dense: torch.Tensor, idx: torch.Tensor, val: torch.Tensor, zero_rest: bool = False) -> torch.Tensor:
    """In place ``dense[idx] = val`` for a 1-D contiguous ``dense``; returns ``dense``.

    ``idx`` (int32/int64, any order) may repeat: the last value in input order stays.
    ``zero_rest=True`` sets every other entry to zero as well, so ``dense`` becomes the
    COO vector ``(idx, val)`` written out: with strictly ascending indices (a merged or
    selected vector) the kernel writes each entry once, chunk by chunk, instead of a full
    ``zero_()`` and then a scatter that misses the cache at every value (about 0.5
    residual-add passes instead of 0.7-0.8 at N = 15M, 1%; docs/benchmarks.md). Values are
    copied as bits. Indices must lie in ``[0, len(dense))`` (checked before anything is
    written); ``val`` or ``idx`` sharing memory with ``dense`` raises ``ValueError``.
    """
    _ops.scatter_set_(dense, idx, val, zero_rest)
    return dense


@translating
def gather(dense: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """``dense[idx]`` for a 1-D ``dense`` and int32/int64 ``idx`` (range checked)."""
    return _ops.gather(dense, idx)


@translating
def nonfinite_flags(x: torch.Tensor) -> int:
    """Which non-finite values the floating tensor ``x`` (any shape) holds: an OR of
    :data:`NONFINITE_NAN`, :data:`NONFINITE_POS_INF` and :data:`NONFINITE_NEG_INF`; 0 when every
    element is finite.

    CPU: one vectorized read of ``x`` that decides whether anything is there (about 0.45
    residual-add passes at N = 15M float32 on one thread, where ``torch.aminmax`` takes
    0.7), then, only if so, a second read that tells the kinds apart. Other devices: the
    torch implementation (one ``aminmax``, then ``isnan`` / ``isinf`` only if needed).
    ``TypeError`` for non-floating dtypes.
    """
    return int(_ops.nonfinite_flags(x))


def release_caches() -> int:
    """Frees the kernels' reusable buffers now; returns the bytes released.

    The top-k fast path keeps its per-thread candidate buffers between calls (at most
    ``SC_TOPK_CACHE_MAX_BYTES`` = 256 MiB; a call that needed more frees them when it
    ends), so a training loop does not pay fresh multi-MB allocations per call. Call
    this after training, or before a memory-hungry phase; a top-k running concurrently
    in another thread keeps its buffers (and 0 may be returned).
    """
    return int(_ops.release_caches())
