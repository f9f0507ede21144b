"""``oktopk``: Ok-Topk (Li and Hoefler, "Near-Optimal Sparse Allreduce for Distributed Deep
Learning", PPoPP'22: section 3.1, Algorithm 1 (the sparse allreduce) and section 4,
Algorithm 2 (the SGD loop with residuals and threshold reuse)).

One call on P ranks (``step`` counts the calls of this reducer):

1. **Local selection with threshold reuse** (section 3.1.3). Every ``tau`` steps the rank
   takes its exact local top-k (:func:`ops.topk`) and keeps the k-th largest magnitude as its
   local threshold; in between it reuses the threshold, adapted (see "Keeping the counts near
   k" below): of the threshold's *ladder* of 97 rungs it takes the lowest rung selecting at
   most k entries, if that rung selects at least 2k/3, and selects every entry with
   ``|acc| >= rung`` (found among the C top-(k+1): a rung selects at most k exactly when it
   lies above the (k+1)-th largest magnitude; on the CPU that kernel is one filtering pass,
   faster than counting in torch); otherwise it takes the exact top-k at this step. So
   2k/3 <= c <= k in every call.
2. **Balanced space repartition** every ``tau_prime`` steps (section 3.1.1): the index space
   [0, N) is cut into P contiguous regions, region j owned by rank j. Each rank proposes the
   P-1 boundaries that split *its own* selected indices into P equal-count parts; the ranks
   all-gather the proposals and every rank takes their integer mean (the ranks that selected
   nothing abstain; with nobody left, equal-length regions), so the boundaries are identical
   everywhere and the regions hold about the same number of selected entries summed over
   the ranks.
3. **Split and reduce** with destination rotation (section 3.1.1): at step i = 1..P-1 rank r
   sends its entries of region (r+i) mod P to that region's owner and receives region r's
   entries from rank (r-i) mod P, so at every step each rank sends to and receives from one
   distinct peer (no endpoint contention). The owner sums what it holds in rank order
   (:func:`ops.merge_add_many`).
4. **Global selection with threshold reuse** (section 3.1.2): every ``tau`` steps the exact
   global k-th largest magnitude of the reduced values (all regions together) is found by a
   distributed radix select (4 passes of an 8-bit digit histogram, all-gathered) and exactly
   min(k, candidates) entries are taken (ties to the lower index, as :func:`ops.topk`). In
   between each owner counts its reduced entries at or above every rung of the reused global
   threshold's ladder; the counts are all-gathered (one round, before any entry moves) and
   every owner keeps its entries at or above the lowest rung whose total G is at most k, if
   G >= 2k/3 (all candidates when they are at most k); otherwise the exact selection runs at
   this step. So G <= k always and G >= min(2k/3, candidates). Magnitudes are compared in
   float32 here (float64 sums are rounded for the comparison only).
5. **Balance and allgatherv** (section 3.1.2): the owners' selected lists, concatenated in
   rank order, are redistributed in one round into P blocks of equal size (sizes differ by at
   most one), then the shared Bruck all-gather gives every rank all of them; ``out`` is the
   scatter of that list, bit-identical on every rank.

**Residuals (conservation).** A rank removes from ``acc`` what it selects in step 1. An index
belongs to exactly one region and is reduced once, so its global sum is either in the result
as a whole or not at all; for every index it selected that is not in the final list, a rank
puts its own value back into ``acc`` (exactly: ``acc`` was zero there). Hence
sum_r (g_r + e_r) = out + sum_r e'_r, every entry of the result being the sum of the values
its contributors removed.

**Codecs** (``index_codec``, ``value_codec``, :mod:`sparsecomm.formats.codec`): the split,
balance and all-gather messages (all sorted COO) go through the codec; sizes then vary, so
those rounds use ``exchange_var`` / ``bruck_allgather_var`` (one size round each where the
Comm needs one: :meth:`~sparsecomm.comm.base.Comm.sizes_take_a_round`). ``index_codec`` alone leaves every result, residual and volume
bit-identical. With a lossy value codec each encoding rank keeps the error
``true - decoded`` of what it encoded, so every error is counted once: a split message's error
stays with its sender, but only for entries that end in the result (for the others the sender
puts back its whole value, as above); a reduced entry is then encoded once by its region's
owner (balance; its own block's part is not sent) and once by the rank whose balanced block
holds it (all-gather), each keeping its error; every one of those entries is in the result.
The owner selects among, and every rank sums, decoded values only, so the result is identical
everywhere and sum_r (g_r + e_r) = out + sum_r e'_r still holds. The volume below counts
entries, so its bound is unchanged; the codecs shrink the bytes.

**Keeping the counts near k.** A reused threshold drifts from the k-th largest magnitude as
the gradients change (in training the magnitudes shrink, so a fixed global threshold passes
ever fewer entries: G/k had a median of 0.46 and a minimum of 0.05 on the digits MLP's
gradients; see docs/oktopk.md). The authors' code (Shigangli/Ok-Topk, VGG/compression.py,
``add2residual``; VGG/allreducer.py, the ``oktopk`` branch) raises a reused local threshold by
3% (up to 5 times) while it selects more than 4k/3, scales it by 1.012 for the next step when
it selected fewer than 2k/3 or more than 5k/4, and scales the global threshold by 1.008 when G
left [2k/3, 4k/3]. This module keeps their band's lower end and the paper's k as the upper
one, and moves the threshold as far as needed at once: the *ladder* of a threshold t is the 97
float32 values whose bit patterns are key(t) + j 2^16, j = -48..48 (1/128 octave, 0.54%, apart;
a factor of 1.30 either way; integer arithmetic, so identical on every rank). The lowest rung
selecting at most k becomes the threshold, if it selects at least 2k/3; outside the ladder's
reach, or when two adjacent rungs straddle the band, the exact selection runs at that step.
The global counts travel in the all-gather that already carried the count at t, so reuse
costs no extra round.

**Volume bound.** Counting entries (an index and a value) each rank sends: split <= c_r (its
selected count; the entries of its own region stay), balance <= G - floor(G/P) and the Bruck
all-gather of the balanced blocks (sizes differ by at most one) <= (P-1) ceil(G/P). The
paper's bound (eq. 3: 6k(P-1)/P words, an entry being two words, in the balanced case) is
floor(3k(P-1)/P) entries (:func:`paper_bound`); it holds when the regions are balanced and
c, G <= k, which the rules above keep. With regions out of balance between repartitions it
can be exceeded; measured in training it held in every call (docs/oktopk.md). In every case
c <= k and G <= k bound a call by floor(6k(P-1)/P) entries (:func:`volume_bound`) whenever
k + (k - floor(k/P)) + (P-1) ceil(k/P) fits in it (:func:`bound_guaranteed`: every
k >= P(P+1)/(3P-4), e.g. k >= 3 at P = 2 or 4, k >= 12 at P = 33). For smaller k the exact
top-k alone can exceed it: with fewer than P entries to all-gather, some rank must send an
entry to P-1 peers. ``last_volume`` reports each phase of the last call (entries; headers
and the control all-gathers are not entries), c, G and the candidates. An early
recomputation does not move the fixed recomputation steps (the multiples of ``tau``).

**Choices where the paper is open.** Defaults ``tau = 32`` (both thresholds) and
``tau_prime = 64``, the authors' settings in their released training code (LSTM trainer and
DDP-hook version; their BERT trainer recomputes the thresholds every 128 steps); boundaries by
the mean of per-rank quantiles (as the authors' code does); the exact global threshold by radix
select instead of gathering every reduced value; split messages of zero entries are not sent
(both sides know the counts from an all-gather of the P x P count table, one per call). Every
call all-gathers the step and a checksum of the shared state (boundaries, global threshold):
ranks that disagree (e.g. only some loaded a checkpoint) raise the same ValueError before
anything changes.

Cost per call, L = ceil(log2 P): L (count table) + at most P-1 (split) + L (reduced counts;
1 + 97 int64 per rank on a reuse step, 1 otherwise) +
at most 1 (balance) + L (all-gather) rounds; + L on repartition steps; + 4L when the exact
global threshold is computed.
"""

from __future__ import annotations

import math
import zlib
from typing import Any

import numpy as np
import torch

from .. import ops
from ..comm.collectives import allgather_int64, bruck_allgather, bruck_allgather_var
from ..errors import AgreedValueError, WireFormatError
from ..formats import index_dtype_for
from ..formats.coo import coo_nbytes
from ..traffic import IndexSets, Traffic
from ..options import Option
from .base import Algorithm, register

__all__ = ["OkTopk", "volume_bound", "paper_bound", "bound_guaranteed", "ladder", "RUNGS"]

#: rungs on each side of a reused threshold, and their spacing in float32 bit patterns
RUNGS = 48
_RUNG_STEP = 1 << 16
_KEY_INF = 0x7F800000
#: the radix select's digits: 8 bits of the float32 magnitude each, one 256-bin histogram per digit
_DIGIT_SHIFTS = (24, 16, 8, 0)
_DIGIT_BINS = 256
_STATE_KEYS = {"n", "k", "size", "step", "local_threshold", "global_threshold", "boundaries"}
# what tau and tau_prime take: periods in steps
_MAX_PERIOD = 2**31 - 1
_PERIOD = "an integer number of steps in [1, 2^31 - 1]"


def volume_bound(k: int, size: int) -> int:
    """floor(6k(P-1)/P): the entries one rank may send in one call in every case (twice the
    paper's bound; see :func:`paper_bound`)."""
    return 6 * k * (size - 1) // size


def paper_bound(k: int, size: int) -> int:
    """floor(3k(P-1)/P): the paper's bound, 6k(P-1)/P words per rank, in entries (an index and
    a value, two words). Held whenever a rung of the global ladder fits it (see the module
    docstring), measured in docs/oktopk.md otherwise."""
    return 3 * k * (size - 1) // size


def _allgather_worst(k: int, size: int) -> int:
    """Most entries a rank sends in the balance step plus the all-gather when at most k entries
    are selected globally: (k - floor(k/P)) + (P-1) ceil(k/P) (balanced blocks differ by one,
    and the Bruck all-gather sends P-1 blocks)."""
    return (k - k // size) + (size - 1) * (-(-k // size))


def bound_guaranteed(k: int, size: int) -> bool:
    """Whether floor(6k(P-1)/P) holds in every case: a local selection of at most k entries
    plus the worst balance and all-gather fit in it. True for every k >= P(P+1)/(3P-4)
    (k >= 3 at P = 2 or 4, k >= 12 at P = 33); below it a call can exceed the bound only
    because P-1 ranks must receive entries that fewer ranks hold (the all-gather of k < P
    entries)."""
    return size == 1 or k + _allgather_worst(k, size) <= volume_bound(k, size)


def ladder(threshold: float) -> list[int]:
    """The rungs of a reused threshold t: the float32 bit patterns key(t) + j * 2^16 for
    j = -RUNGS..RUNGS (steps of 1/128 octave, about 0.54%; 3/8 octave, a factor of 1.30,
    either way; clamped to [0, +inf]), ascending. Integer steps on the bit pattern, so every
    rank computes the same rungs from the same threshold."""
    key = int(torch.tensor([threshold], dtype=torch.float32, device="cpu").view(torch.int32))
    return [min(max(key + j * _RUNG_STEP, 0), _KEY_INF) for j in range(-RUNGS, RUNGS + 1)]


def _key_value(key: int) -> float:
    """The float32 magnitude whose bit pattern is ``key``, as a Python float."""
    return float(torch.tensor([key], dtype=torch.int32, device="cpu").view(torch.float32))


def _pick_rung(counts: list[int], k: int) -> int | None:
    """The lowest rung (largest count) selecting at most k, if it selects at least 2k/3;
    None otherwise (the exact selection runs instead)."""
    for j, c in enumerate(counts):     # counts do not increase with j
        if c <= k:
            return j if 3 * c >= 2 * k else None
    return None


def _bruck_entries(block: list[int], rank: int) -> int:
    """Entries :func:`bruck_allgather` sends from ``rank`` for these block sizes: at distance
    d it sends the min(d, P-d) blocks it holds first (its own, then those of rank+1, ...)."""
    size, sent, distance = len(block), 0, 1
    while distance < size:
        sent += sum(block[(rank + j) % size] for j in range(min(distance, size - distance)))
        distance *= 2
    return sent


def _balanced_blocks(total: int, size: int) -> list[int]:
    """The balance step's blocks: ``total`` entries in ``size`` blocks differing by at most one."""
    return [total // size + (1 if j < total % size else 0) for j in range(size)]


def _local_rung(acc: torch.Tensor, k: int, threshold: float) -> tuple[torch.Tensor, float] | None:
    """The ladder rule on ``|acc|``: (the indices of every entry at or above the lowest rung
    of ``threshold``'s ladder that selects at most k entries, that rung) if the rung selects
    at least 2k/3; None otherwise. Compared in acc's dtype.

    Computed from the exact top-(k+1) (:func:`ops.topk`, one pass in the C kernel) rather than
    a count per rung: a rung selects at most k entries exactly when it lies above the
    (k+1)-th largest magnitude, and then everything it selects is among the top k."""
    n = acc.numel()
    values = [_key_value(key) for key in ladder(threshold)]
    rungs = torch.tensor(values, dtype=acc.dtype, device=acc.device)
    top_values, top_idx = ops.topk(acc, min(k + 1, n))
    mags = top_values.abs()
    j = 0
    if n > k:   # the lowest rung strictly above the (k+1)-th largest magnitude
        j = int(torch.searchsorted(rungs, torch.sort(mags).values[:1], right=True))
        if j == len(values):
            return None
    chosen = mags >= rungs[j]
    count = int(chosen.sum())
    if 3 * count < 2 * k:
        return None
    return top_idx[chosen], values[j]


def _member(haystack: torch.Tensor, needles: torch.Tensor) -> torch.Tensor:
    """needles[i] in haystack, both ascending int64 (numpy's binary search on CPU: 3x torch's)."""
    if haystack.numel() == 0:
        return torch.zeros(needles.numel(), dtype=torch.bool, device=needles.device)
    if haystack.device.type == "cpu":
        h, q = haystack.numpy(), needles.numpy()
        pos = np.minimum(np.searchsorted(h, q), h.size - 1)
        return torch.from_numpy(h[pos] == q)
    pos = torch.searchsorted(haystack, needles).clamp_(max=haystack.numel() - 1)
    return haystack[pos] == needles


def _keys(values: torch.Tensor) -> torch.Tensor:
    """Magnitudes as float32 bit patterns: non-negative int32 that order like the magnitudes."""
    return values.abs().to(torch.float32).view(torch.int32)


def _state_checksum(boundaries: list[int] | None, global_threshold: float | None) -> int:
    text = f"{boundaries}|{global_threshold!r}".encode()
    return zlib.crc32(text)


def _mean_boundaries(table: torch.Tensor, size: int, n: int) -> list[int]:
    """The P + 1 region boundaries of a repartition (section 3.1.1) from the agreement table
    (row q: step, checksum, rank q's count, its P-1 proposals, flag): the integer mean of the
    proposals in rank order, the same on every rank; the ranks that selected nothing abstain,
    and with nobody left the regions have equal lengths."""
    voters = [q for q in range(size) if int(table[q, 2]) > 0]
    bounds = [0]
    for i in range(1, size):
        if voters:
            bounds.append(sum(int(table[q, 2 + i]) for q in voters) // len(voters))
        else:
            bounds.append(i * n // size)
    return bounds + [n]


@register
class OkTopk(Algorithm):
    """Ok-Topk's sparse allreduce; see the module docstring. Options: ``tau`` (threshold
    recomputation period, steps) and ``tau_prime`` (space repartition period, steps)."""

    name = "oktopk"
    lossless = False
    #: the reuse step's count all-gather carries the ladder's 2 RUNGS + 1 counts
    wire_revision = "rung-ladder"
    option_specs = {"tau": Option(32, int, min=1, max=_MAX_PERIOD, what=_PERIOD),
                    "tau_prime": Option(64, int, min=1, max=_MAX_PERIOD, what=_PERIOD)}
    uses_coo_codec = True

    def __init__(self, comm, **options: Any):
        super().__init__(comm, **options)
        self.tau = self.options["tau"]
        self.tau_prime = self.options["tau_prime"]
        self.step = 0
        self.local_threshold: float | None = None
        self.global_threshold: float | None = None
        self.boundaries: list[int] | None = None
        self._key: tuple[int, int, int] | None = None  # (n, k, size) the state belongs to
        #: entries this rank sent in the last call, per phase, with the bound B
        self.last_volume: dict[str, int] = {}
        #: what the last call did: exact or reused thresholds, repartition
        self.last_events: dict[str, bool] = {}

    # -- state ----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        if self._key is None:
            return {}
        n, k, size = self._key
        return {"n": n, "k": k, "size": size, "step": self.step, "local_threshold": self.local_threshold,
                "global_threshold": self.global_threshold,
                "boundaries": None if self.boundaries is None else list(self.boundaries)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not state:
            return
        unknown = set(state) - _STATE_KEYS
        missing = _STATE_KEYS - set(state)
        if unknown or missing:
            raise ValueError(f"oktopk: state has unknown keys {sorted(unknown)} / lacks {sorted(missing)}; "
                             f"expected {sorted(_STATE_KEYS)}")
        n, k, size, step = (state[key] for key in ("n", "k", "size", "step"))
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (n, k, size, step)) \
                or size < 1:
            raise ValueError(f"oktopk: state n, k, size, step must be integers >= 0 (size >= 1), got "
                             f"{n!r}, {k!r}, {size!r}, {step!r}")
        bounds = state["boundaries"]
        if bounds is not None:
            bounds = [int(b) for b in bounds]
            if len(bounds) != size + 1 or bounds[0] != 0 or bounds[-1] != n \
                    or any(a > b for a, b in zip(bounds, bounds[1:])):
                raise ValueError(f"oktopk: state boundaries must be {size + 1} non-decreasing indices from 0 to "
                                 f"N = {n}, got {bounds}")
        thresholds = []
        for key in ("local_threshold", "global_threshold"):
            t = state[key]
            if t is not None and not (isinstance(t, (int, float)) and math.isfinite(t) and t >= 0):
                raise ValueError(f"oktopk: state {key} must be None or a finite number >= 0, got {t!r}")
            thresholds.append(None if t is None else float(t))
        self._key = (n, k, size)
        self.step = step
        self.local_threshold, self.global_threshold = thresholds
        self.boundaries = bounds

    def _adopt(self, n: int, k: int, size: int) -> None:
        """Start afresh when the state belongs to another tensor length, k or P."""
        if self._key != (n, k, size):
            self._key = (n, k, size)
            self.step = 0
            self.local_threshold = self.global_threshold = None
            self.boundaries = None

    # -- the call -------------------------------------------------------------------------
    def reduce(self, acc: torch.Tensor, k: int, out: torch.Tensor) -> None:
        """One call of Algorithm 1 (section 3.1), phases as in the module docstring; ``acc``
        keeps the residuals (Algorithm 2's e_t, section 4)."""
        size, n = self.comm.size, acc.numel()
        k = min(k, n)
        self._adopt(n, k, size)
        step = self.step
        events = {"local_exact": False, "global_exact": False, "repartition": False}
        itype = index_dtype_for(n)
        with self.timed("select"):
            selected, sel_values = self._select_local(acc, k, step, events)
        cuts, counts, counts_table = self._agree_on_regions(step, selected, n, events)
        # from here on every rank is at the same step with the same shared state
        acc.index_fill_(0, selected, 0)
        cand_idx, cand_val, split_err, split_sent = self._split_and_reduce(acc, selected, sel_values, cuts, counts,
                                                                           counts_table, n, itype)
        g_idx, g_val, g, total_m = self._select_global(cand_idx, cand_val, acc, k, step, n, events)
        blk_idx, blk_val, block, balance_sent = self._balance(g_idx, g_val, g, acc, n, itype)
        blocks = self._allgather(blk_idx, blk_val, block, acc, n)
        with self.timed("merge"):
            final_idx = self._write_result(blocks, block, acc, out, n)
            self._put_back(acc, selected, sel_values, split_err, final_idx)
        self.last_nnz = int(final_idx.numel())
        gathered = _bruck_entries(block, self.comm.rank)
        self.last_volume = {"split": split_sent, "balance": balance_sent, "allgather": gathered,
                            "selected": int(selected.numel()), "global": sum(g), "candidates": total_m, "k": k,
                            "bound": volume_bound(k, size), "paper_bound": paper_bound(k, size)}
        self.last_volume["entries"] = split_sent + balance_sent + gathered
        self.last_events = events
        self.step = step + 1

    # -- the call's phases ----------------------------------------------------------------
    def _select_local(self, acc: torch.Tensor, k: int, step: int,
                      events: dict[str, bool]) -> tuple[torch.Tensor, torch.Tensor]:
        """Phase 1, local selection with threshold reuse (section 3.1.3): ``(selected,
        their values)``, selected ascending. acc is not changed before the ranks agreed on the
        step (:meth:`_agree_on_regions`)."""
        selected = None
        if self.local_threshold is not None and step % self.tau != 0:
            # the lowest rung of the reused threshold's ladder selecting between 2k/3 and
            # k entries becomes the threshold; its entries are those of the top-(k+1) at
            # or above it
            picked = _local_rung(acc, k, self.local_threshold)
            if picked is not None:
                selected, self.local_threshold = picked
        if selected is None:                     # a recomputation step, or no rung in [2k/3, k]
            values, selected = ops.topk(acc, k)
            self.local_threshold = float(values.abs().min()) if values.numel() else 0.0
            events["local_exact"] = True
        return selected, acc[selected]

    def _agree_on_regions(self, step: int, selected: torch.Tensor, n: int,
                          events: dict[str, bool]) -> tuple[list[int], list[int], torch.Tensor]:
        """Phase 2, the regions (section 3.1.1), and the count table of phase 3: ``(cuts,
        counts, counts_table)``, ``selected[cuts[j]:cuts[j+1]]`` this rank's ``counts[j]``
        entries of region j and ``counts_table[q, j]`` rank q's count of them. The call's first all-gather carries
        (step, checksum of the shared state, payload, flag): the same length either way, so
        ranks at different steps meet in it and raise together (see :meth:`_agree`) before acc
        changes. On a repartition step the payload is this rank's count and boundary proposals
        (the count table then takes one more all-gather), else the count table's row."""
        size = self.comm.size
        repartition = self.boundaries is None or step % self.tau_prime == 0
        checksum = _state_checksum(self.boundaries, self.global_threshold)
        if repartition:
            c = selected.numel()
            proposals = [int(selected[(i * c) // size]) for i in range(1, size)] if c else [0] * (size - 1)
            self.boundaries = _mean_boundaries(self._agree(step, checksum, [c, *proposals, 1], n), size, n)
            events["repartition"] = True
        cuts = torch.searchsorted(selected, torch.tensor(self.boundaries, dtype=torch.int64,
                                                         device=selected.device)).tolist()
        counts = [cuts[j + 1] - cuts[j] for j in range(size)]
        if repartition:
            counts_table = allgather_int64(self.comm, counts, n) if size > 1 else torch.tensor([counts], device="cpu")
        else:
            counts_table = self._agree(step, checksum, [*counts, 0], n)[:, 2:2 + size]
        return cuts, counts, counts_table

    def _split_and_reduce(self, acc: torch.Tensor, selected: torch.Tensor, sel_values: torch.Tensor,
                          cuts: list[int], counts: list[int], counts_table: torch.Tensor, n: int,
                          itype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, int]:
        """Phase 3, split and reduce with destination rotation (section 3.1.1): ``(cand_idx,
        cand_val, split_err, split_sent)``, the sums of this rank's region in rank order, the
        split messages' codec error per selected entry (None with a lossless codec) and the
        entries sent."""
        size, rank = self.comm.size, self.comm.rank
        own_idx = selected.to(itype)
        pieces_idx = [own_idx[cuts[j]:cuts[j + 1]] for j in range(size)]
        pieces_val = [sel_values[cuts[j]:cuts[j + 1]] for j in range(size)]
        received: dict[int, tuple[torch.Tensor, torch.Tensor]] = {rank: (pieces_idx[rank], pieces_val[rank])}
        # a lossy value codec's error of each selected entry (true - decoded; 0 in the own region,
        # which is not sent): kept in acc only if the entry ends in the result (see _put_back)
        split_err = torch.zeros_like(sel_values) if not self.codec.lossless else None
        split_sent = 0
        for i in range(1, size):
            dest, source = (rank + i) % size, (rank - i) % size
            sends = []
            if counts[dest]:
                message, sent = self._encode(pieces_idx[dest], pieces_val[dest], n)
                sends.append((dest, message))
                if split_err is not None:
                    split_err[cuts[dest]:cuts[dest + 1]] = pieces_val[dest] - sent
                split_sent += counts[dest]
            expect = int(counts_table[source, rank])
            got = self._exchange(sends, {source: expect} if expect else {}, n, acc)
            if expect:
                received[source] = self._decode(got[source], n, acc, source, expect)
        lo, hi = self.boundaries[rank], self.boundaries[rank + 1]
        with self.timed("merge"):
            inputs = [received[q] for q in range(size) if q in received and received[q][0].numel()]
            if inputs:
                for q_idx, _ in inputs:
                    if q_idx.numel() and (int(q_idx[0]) < lo or int(q_idx[-1]) >= hi):
                        raise WireFormatError(f"oktopk: rank {rank} received entries outside its region "
                                              f"[{lo}, {hi}) in the split step")
                cand_idx, cand_val = ops.merge_add_many([x[0] for x in inputs], [x[1] for x in inputs], n)
            else:
                cand_idx = torch.empty(0, dtype=itype, device=acc.device)
                cand_val = torch.empty(0, dtype=acc.dtype, device=acc.device)
        return cand_idx, cand_val, split_err, split_sent

    def _select_global(self, cand_idx: torch.Tensor, cand_val: torch.Tensor, acc: torch.Tensor, k: int, step: int,
                       n: int, events: dict[str, bool]) -> tuple[torch.Tensor, torch.Tensor, list[int], int]:
        """Phase 4, global selection with threshold reuse (section 3.1.2): ``(g_idx, g_val, g,
        total_m)``, this rank's selected reduced entries, every rank's count of them and the
        candidates of all ranks. At a reuse step every owner counts its reduced entries at or
        above each rung of the reused threshold's ladder; the counts are all-gathered before
        any entry moves, and the lowest rung selecting between 2k/3 and k in all is taken
        (everything when the candidates are at most k); otherwise the exact top-k."""
        keys = _keys(cand_val)
        m = cand_idx.numel()
        reuse = self.global_threshold is not None and step % self.tau != 0
        payload = [m]
        if reuse:
            rung_keys = ladder(self.global_threshold)
            sorted_keys = torch.sort(keys).values
            at_or_above = torch.searchsorted(sorted_keys, torch.tensor(rung_keys, dtype=keys.dtype,
                                                                       device=keys.device))
            payload += (m - at_or_above).tolist()
        mg = allgather_int64(self.comm, payload, n) if self.comm.size > 1 else torch.tensor([payload], device="cpu")
        total_m = int(mg[:, 0].sum())
        j = _pick_rung(mg[:, 1:].sum(dim=0).tolist(), k) if reuse else None
        if reuse and total_m <= k:                   # every candidate; the threshold stays
            keep = torch.ones(m, dtype=torch.bool, device=acc.device)
            g = mg[:, 0].tolist()
        elif j is not None:
            keep = keys >= rung_keys[j]
            g = mg[:, 1 + j].tolist()
            self.global_threshold = _key_value(rung_keys[j])
        else:
            events["global_exact"] = True
            if total_m <= k:
                keep = torch.ones(m, dtype=torch.bool, device=acc.device)
                g = mg[:, 0].tolist()
                self.global_threshold = 0.0
            else:
                keep, g, t_key = self._radix_select(keys, k, n)
                self.global_threshold = _key_value(t_key)
        return cand_idx[keep], cand_val[keep], g, total_m

    def _balance(self, g_idx: torch.Tensor, g_val: torch.Tensor, g: list[int], acc: torch.Tensor, n: int,
                 itype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, list[int], int]:
        """Phase 5, balance (section 3.1.2): the owners' lists, concatenated in rank order,
        redistributed in one round into P blocks of equal size (sizes differ by at most one).
        Returns ``(blk_idx, blk_val, block, balance_sent)``: this rank's block, every block's
        size and the entries sent."""
        size, rank = self.comm.size, self.comm.rank
        block = _balanced_blocks(sum(g), size)
        block_start = [sum(block[:j]) for j in range(size)]
        list_start = [sum(g[:j]) for j in range(size)]

        def overlap(src: int, dst: int) -> tuple[int, int]:
            a = max(list_start[src], block_start[dst])
            b = min(list_start[src] + g[src], block_start[dst] + block[dst])
            return a, max(a, b)

        sends, balance_sent = [], 0
        for dst in range(size):
            a, b = overlap(rank, dst)
            if dst != rank and b > a:
                s = a - list_start[rank]
                message, _ = self._encode(g_idx[s:s + b - a], g_val[s:s + b - a], n, acc)
                sends.append((dst, message))
                balance_sent += b - a
        expected = {}
        for src in range(size):
            a, b = overlap(src, rank)
            if src != rank and b > a:
                expected[src] = b - a
        incoming = self._exchange(sends, expected, n, acc)
        mine_idx, mine_val = [], []
        for src in range(size):
            a, b = overlap(src, rank)
            if b <= a:
                continue
            if src == rank:
                s = a - list_start[rank]
                mine_idx.append(g_idx[s:s + b - a])
                mine_val.append(g_val[s:s + b - a])
            else:
                i_, v_ = self._decode(incoming[src], n, acc, src, b - a)
                mine_idx.append(i_)
                mine_val.append(v_)
        blk_idx = torch.cat(mine_idx) if mine_idx else torch.empty(0, dtype=itype, device=acc.device)
        blk_val = torch.cat(mine_val) if mine_val else torch.empty(0, dtype=acc.dtype, device=acc.device)
        return blk_idx, blk_val, block, balance_sent

    def _allgather(self, blk_idx: torch.Tensor, blk_val: torch.Tensor, block: list[int], acc: torch.Tensor,
                   n: int) -> list[torch.Tensor]:
        """Phase 5, allgatherv (section 3.1.2): every rank's block message, by the shared Bruck
        all-gather (sizes known to all with the plain codec, carried in the messages
        otherwise)."""
        message, _ = self._encode(blk_idx, blk_val, n, acc)
        if self.codec.plain:
            return bruck_allgather(self.comm, message, [self.codec.fixed_nbytes(b, n, acc.dtype) for b in block])
        return bruck_allgather_var(self.comm, message)

    def _write_result(self, blocks: list[torch.Tensor], block: list[int], acc: torch.Tensor, out: torch.Tensor,
                      n: int) -> torch.Tensor:
        """``out`` = the scatter of the gathered blocks, bit-identical on every rank; returns
        their indices (ascending)."""
        decoded = [self._decode(blocks[q], n, acc, q, block[q]) for q in range(self.comm.size)]
        final_idx = torch.cat([d[0] for d in decoded])
        final_val = torch.cat([d[1] for d in decoded])
        if final_idx.numel() > 1 and not bool((final_idx[1:] > final_idx[:-1]).all()):
            raise WireFormatError(f"oktopk: rank {self.comm.rank}: the gathered blocks are not in ascending "
                                  "index order")
        ops.scatter_set_(out, final_idx, final_val, zero_rest=True)  # ascending: one write of out
        return final_idx

    @staticmethod
    def _put_back(acc: torch.Tensor, selected: torch.Tensor, sel_values: torch.Tensor,
                  split_err: torch.Tensor | None, final_idx: torch.Tensor) -> None:
        """The residual update (conservation, Algorithm 2's e_t, section 4): put back into acc
        what this rank selected and the result does not hold; of what it holds, keep the split
        messages' codec error (the balance and all-gather errors are already in acc, at the
        rank that encoded them)."""
        if selected.numel():
            back = ~_member(final_idx.to(torch.int64), selected)
            if split_err is not None:
                ops.scatter_add_(acc, selected, torch.where(back, sel_values, split_err))
            elif bool(back.any()):
                ops.scatter_add_(acc, selected[back], sel_values[back])

    traffic_model = "estimated"

    @classmethod
    def traffic(cls, P: int, N: int, k: int, sets: IndexSets | None = None, dtype: torch.dtype = torch.float32,
                first_call: bool = False, **options: Any) -> Traffic:
        """Estimate of a threshold-reuse step: the agreement all-gather (step, checksum, P counts,
        flag), P-1 split rounds of k/P entries, the all-gather of m and the 2 RUNGS + 1 rung
        counts of the global threshold's ladder (only m on a recomputation step), one balance
        round of about G/P entries (G = k) and the Bruck all-gather of P blocks of G/P.
        ``first_call`` (every ``tau``-th step has the radix select, every ``tau_prime``-th the
        repartition): the proposals' agreement and the counts all-gather instead, and the
        radix select's all-gathered histograms. The plain codec's sizes."""
        t = Traffic(P)
        t.exact = False
        if P == 1:
            return t
        k = min(k, N)
        t.allgather_int64(3 + P)   # [step, checksum, P counts or (count, P-1 proposals), flag]
        if first_call:
            t.allgather_int64(P)
        per = -(-k // P)
        ranks = np.arange(P)
        for i in range(1, P):
            t.round(ranks, (ranks + i) % P, [coo_nbytes(per, N, dtype)] * P)
        t.allgather_int64(1 if first_call else 1 + 2 * RUNGS + 1)
        if first_call:
            for _ in _DIGIT_SHIFTS:
                t.allgather_int64(_DIGIT_BINS)
        t.round(ranks, (ranks + 1) % P, [coo_nbytes(per // 2, N, dtype)] * P)
        t.bruck_allgather(range(P), [coo_nbytes(b, N, dtype) for b in _balanced_blocks(k, P)])
        return t

    # -- messages through the codec --------------------------------------------------------
    def _encode(self, idx: torch.Tensor, val: torch.Tensor, n: int, acc: torch.Tensor | None = None):
        """``(message, sent)`` of a sorted COO vector. With ``acc`` (the balance and all-gather
        messages, whose entries are all in the result), a lossy codec's error ``val - sent`` is
        added to ``acc`` at ``idx`` here: the encoding rank keeps it, and it is counted once
        because each reduced entry is encoded by one owner (balance) and then by one block
        holder (all-gather). The split messages' error is the caller's (kept only for entries
        that end in the result)."""
        message, sent = self.codec.encode(idx, val, n, self.comm.rank)
        if acc is not None and not self.codec.lossless and idx.numel():
            ops.scatter_add_(acc, idx.to(torch.int64), val - sent)
        return message, sent

    def _exchange(self, sends, expected: dict[int, int], n: int, acc: torch.Tensor) -> dict[int, torch.Tensor]:
        """One round: ``sends`` out, ``expected[source]`` entries in from each source; a
        variable-size round when the codec's sizes are not known to the receiver."""
        sources = list(expected)
        if not self.codec.plain:
            return dict(zip(sources, self.comm.exchange_var(sends, sources))) if sends or sources else {}
        bufs = {q: torch.empty(self.codec.fixed_nbytes(c, n, acc.dtype), dtype=torch.uint8, device=acc.device)
                for q, c in expected.items()}
        self.comm.exchange(sends, list(bufs.items()))
        return bufs

    def _decode(self, payload: torch.Tensor, n: int, acc: torch.Tensor, sender: int, count: int):
        return self.codec.decode(payload, n=n, value_dtype=acc.dtype, receiver=self.comm.rank, sender=sender,
                                 count=count)

    def _agree(self, step: int, checksum: int, payload: list[int], n: int, start: int | None = None) -> torch.Tensor:
        """All-gather ``[step, checksum, *payload]``; the same ValueError on every rank when the
        ranks are at different steps or hold different shared state."""
        if self.comm.size == 1:
            return torch.tensor([[step, checksum, *payload]], device="cpu")
        table = allgather_int64(self.comm, [step, checksum, *payload], n)
        steps, sums = table[:, 0].tolist(), table[:, 1].tolist()
        if len(set(steps)) > 1 or len(set(sums)) > 1:
            raise AgreedValueError(
                f"oktopk: the ranks disagree on their state (steps per rank {steps}, state checksums {sums}): "
                "every rank must load the same checkpoint state, or none")
        return table

    def _radix_select(self, keys: torch.Tensor, k: int, n: int) -> tuple[torch.Tensor, list[int], int]:
        """Exactly k of the reduced entries of all ranks by magnitude, ties to the lower index
        (region order is index order): 4 all-gathered histograms of 8-bit digits of the float32
        magnitude bits. Returns (this rank's mask, every rank's count, the k-th largest key)."""
        comm, size, rank = self.comm, self.comm.size, self.comm.rank
        active = torch.ones(keys.numel(), dtype=torch.bool, device=keys.device)
        need, prefix = k, 0
        greater = [0] * size
        hist_table = None
        digit = 0
        for shift in _DIGIT_SHIFTS:
            digits = (keys[active] >> shift) & 0xFF
            hist = torch.bincount(digits.to(torch.int64), minlength=_DIGIT_BINS)
            hist_table = allgather_int64(comm, hist.tolist(), n) if size > 1 else hist.view(1, _DIGIT_BINS)
            total = hist_table.sum(dim=0).tolist()
            cum = 0
            for digit in range(255, -1, -1):
                if cum + total[digit] >= need:
                    break
                cum += total[digit]
            need -= cum
            above = hist_table[:, digit + 1:].sum(dim=1).tolist()
            greater = [greater[q] + int(above[q]) for q in range(size)]
            prefix |= digit << shift
            active &= ((keys >> shift) & 0xFF) == digit
        equal = hist_table[:, digit].tolist()
        take, left = [], need
        for q in range(size):
            t = min(int(equal[q]), max(0, left))
            take.append(t)
            left -= t
        mask = keys > prefix
        ties = torch.nonzero(keys == prefix).view(-1)
        mask[ties[:take[rank]]] = True
        counts = [greater[q] + take[q] for q in range(size)]
        return mask, counts, prefix
