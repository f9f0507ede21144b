"""Schedule model of every registered algorithm: bytes and rounds per rank without running it.

``traffic(name, P, N, k, sets=None, **options)`` replays an algorithm's message schedule with
sizes only -- the same rounds, peers and wire sizes (:mod:`sparsecomm.formats` sizes) as the
algorithm module -- and returns a :class:`Schedule`: bytes sent, bytes received and rounds of
every rank, and the alpha-beta time of the schedule. Used by the scale study
(:mod:`sparsecomm.bench.scale`, ``python -m sparsecomm.bench scale``) and by ``auto``
(:mod:`sparsecomm.algorithms.auto`).

Three kinds of algorithms:

* *data-independent sizes* (``dense``, ``topka``, ``gtopk``, ``gssgd``, ``spardl`` on its first
  call): the schedule is exact for any input; ``tests/test_costmodel.py`` checks it, rank by
  rank, against the bytes and rounds the simulated Comm counts;
* *sizes from the union of the ranks' index sets* (``sparcml_recursive_double``,
  ``sparcml_split_allgather``, ``topkdsa``, ``sparcml``): exact given the ranks' selected
  index sets (:class:`IndexSets`) -- the real ones in the tests, a model of real gradients
  (:func:`model_sets`) at large P;
* *estimated* (``densestream``: blocks counted as runs of consecutive indices, the zero-run
  rule ignored; ``oktopk``: the reuse step, regions assumed to hold k/P entries of every
  rank and G = k; ``skcompress``: one rank's real encoded message size for every rank):
  ``Schedule.exact`` is False and the tests bound the error.

The time of a schedule (:meth:`Schedule.time`): rounds run one after another; a rank's cost in
a round is ``messages * alpha + bytes * beta`` on its sending side and on its receiving side
(full-duplex links), the round costs what its slowest rank pays. Variable-size rounds
(``exchange_var``) count the size round the Comm sends (8 bytes per message), as TorchComm and
the simulated Comm do. Local compute is not in it (``auto`` adds a per-element coefficient).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
import torch

from .formats.coo import coo_nbytes
from .formats.densestream import densestream_nbytes
from .formats.header import HEADER_NBYTES
from .formats.stream import stream_delta, stream_nbytes

__all__ = ["Schedule", "IndexSets", "model_sets", "traffic", "modelled", "EXACT", "SET_BASED", "ESTIMATED",
           "paper_formula", "gssgd_traffic", "fit_alpha_beta"]

#: algorithms whose sizes do not depend on the data (exact for any input)
EXACT = ("dense", "topka", "gtopk", "gssgd", "spardl")
#: exact given the ranks' index sets
SET_BASED = ("sparcml_recursive_double", "sparcml_split_allgather", "topkdsa", "sparcml")
#: estimates (see the module docstring)
ESTIMATED = ("densestream", "oktopk", "skcompress")


class Schedule:
    """Per-rank bytes and rounds of one call, and its round-by-round cost."""

    def __init__(self, size: int):
        self.size = size
        self.sent = np.zeros(size, dtype=np.int64)
        self.recv = np.zeros(size, dtype=np.int64)
        self.rounds = np.zeros(size, dtype=np.int64)
        #: per round: (messages sent, bytes sent, messages received, bytes received) of each rank
        self._cost: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        self.exact = True
        self.notes: list[str] = []

    def round(self, src: Sequence[int], dst: Sequence[int], nbytes: Sequence[int],
              idle: Sequence[int] = ()) -> None:
        """One round of messages ``src[i] -> dst[i]`` of ``nbytes[i]`` bytes; ``idle`` ranks take
        part without a message (a receive of nothing still counts the round there)."""
        src = np.asarray(src, dtype=np.int64)
        dst = np.asarray(dst, dtype=np.int64)
        nb = np.asarray(nbytes, dtype=np.int64)
        p = self.size
        ms = np.bincount(src, minlength=p)
        mr = np.bincount(dst, minlength=p)
        bs = np.bincount(src, weights=nb, minlength=p).astype(np.int64)
        br = np.bincount(dst, weights=nb, minlength=p).astype(np.int64)
        self.sent += bs
        self.recv += br
        part = (ms > 0) | (mr > 0)
        if len(idle):
            part[np.asarray(idle, dtype=np.int64)] = True
        if not part.any():
            return
        self.rounds += part
        self._cost.append((ms, bs, mr, br))

    def var_round(self, src, dst, nbytes, receivers: Sequence[int] = ()) -> None:
        """``exchange_var``: a round of 8-byte sizes, then the payloads."""
        self.round(src, dst, [8] * len(src), idle=receivers)
        self.round(src, dst, nbytes, idle=receivers)

    def time(self, alpha: float, beta: float) -> float:
        total = 0.0
        for ms, bs, mr, br in self._cost:
            total += float(np.maximum(ms * alpha + bs * beta, mr * alpha + br * beta).max())
        return total

    @property
    def bytes_per_rank(self) -> int:
        """The most bytes any rank sends (the study's "bytes per rank")."""
        return int(self.sent.max()) if self.size else 0

    @property
    def max_rounds(self) -> int:
        return int(self.rounds.max()) if self.size else 0


def fit_alpha_beta(sizes, times) -> tuple[float, float]:
    """Ordinary least squares on t = alpha + beta * bytes.

    beta is the slope (the large messages set it, as they should: tbf lets a burst of a few
    hundred KB through faster than the rate). When the intercept comes out negative,
    alpha = t - beta * bytes of the smallest message, clamped at 0.
    """
    x = np.asarray(sizes, dtype=np.float64)
    t = np.asarray(times, dtype=np.float64)
    A = np.stack([np.ones_like(x), x], 1)
    alpha, beta = (float(v) for v in np.linalg.lstsq(A, t, rcond=None)[0])
    if beta <= 0:
        beta = float(np.sum(x * t) / np.sum(x * x))
    if alpha < 0:
        i = int(np.argmin(x))
        alpha = max(0.0, float(t[i] - beta * x[i]))
    return alpha, beta


# -- index sets ---------------------------------------------------------------------------------
@dataclass
class IndexSets:
    """The ranks' selected indices (sorted int64 numpy arrays over [0, n)).

    ``scale`` > 1 stands for a vector ``scale`` times longer than ``n`` with the same structure:
    every count and position is multiplied by it (the scale study draws sets at a model length
    and scales them to N, so P = 1024 stays small)."""

    sets: list[np.ndarray]
    n: int
    scale: float = 1.0
    _cache: dict = field(default_factory=dict, repr=False)

    @classmethod
    def from_tensors(cls, sets: Sequence[torch.Tensor], n: int) -> "IndexSets":
        return cls([np.sort(np.asarray(s.cpu(), dtype=np.int64)) for s in sets], n)

    def count(self, arr_or_len) -> int:
        m = arr_or_len if isinstance(arr_or_len, (int, np.integer)) else len(arr_or_len)
        return int(round(m * self.scale))

    def union(self, ranks: Sequence[int]) -> np.ndarray:
        key = tuple(sorted(ranks))
        hit = self._cache.get(key)
        if hit is None:
            hit = np.empty(0, np.int64)
            for r in key:
                hit = _union(hit, self.sets[r])
            if len(key) > 1:
                self._cache[key] = hit
        return hit

    def merge(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return _union(a, b)


def _union(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Union of two sorted arrays of distinct indices (a sort, not numpy's hash-based unique)."""
    c = np.concatenate([a, b])
    c.sort(kind="stable")
    if len(c) < 2:
        return c
    return c[np.concatenate([[True], c[1:] != c[:-1]])]


def model_sets(size: int, n: int, k: int, overlap: float = 0.10, hot_fraction: float = 0.25,
               hot_share: float = 0.60, regions: int = 64, seed: int = 0) -> list[np.ndarray]:
    """Index sets drawn from a model of real gradients' local top-k (measured on the digits MLP,
    docs/scale.md): a fraction ``overlap`` of every rank's k indices comes from one pool shared by
    all ranks, the rest is the rank's own; both are drawn with ``hot_share`` of the indices in a
    fixed ``hot_fraction`` of ``regions`` equal index ranges (the layers that carry the large
    gradients), uniformly inside a range. Sorted, distinct; about k per rank."""
    rng = np.random.default_rng(seed)
    hot_regions = rng.choice(regions, max(1, round(hot_fraction * regions)), replace=False)
    is_hot = np.zeros(regions, dtype=bool)
    is_hot[hot_regions] = True
    bounds = [r * n // regions for r in range(regions + 1)]

    def draw(m: int) -> np.ndarray:
        hot = rng.random(m) < hot_share
        pick = np.where(hot, rng.choice(np.flatnonzero(is_hot), m), rng.choice(np.flatnonzero(~is_hot), m))
        lo = np.asarray(bounds)[pick]
        hi = np.asarray(bounds)[pick + 1]
        return lo + (rng.random(m) * np.maximum(hi - lo, 1)).astype(np.int64)

    shared_k = int(round(overlap * k))
    pool = _union(draw(2 * shared_k + 1), np.empty(0, np.int64))[: max(1, 2 * shared_k)]
    out = []
    for _ in range(size):
        common = rng.choice(pool, min(shared_k, len(pool)), replace=False) if shared_k else np.empty(0, np.int64)
        own = draw(k - len(common) + k // 20 + 1)
        s = _union(np.sort(common), own)
        if len(s) > k:
            s = np.sort(rng.choice(s, k, replace=False))
        out.append(s.astype(np.int64))
    return out


# -- collective pieces --------------------------------------------------------------------------
def _bruck(s: Schedule, members: Sequence[int], sizes: Sequence[int]) -> None:
    """:func:`~sparsecomm.comm.collectives.bruck_allgather` inside ``members`` (global ranks),
    block q of ``sizes[q]`` bytes."""
    q = len(members)
    members = np.asarray(members, dtype=np.int64)
    sz = np.asarray(sizes, dtype=np.int64)
    ext = np.concatenate([sz, sz])
    csum = np.concatenate([[0], np.cumsum(ext)])
    pos = np.arange(q)
    d = 1
    while d < q:
        count = min(d, q - d)
        nb = csum[pos + count] - csum[pos]
        s.round(members[pos], members[(pos - d) % q], nb)
        d *= 2


def _allgather_int64(s: Schedule, count: int) -> None:
    _bruck(s, range(s.size), [HEADER_NBYTES + 8 * count] * s.size)


def _fold(p: int) -> tuple[int, int]:
    p2 = 1 << (p.bit_length() - 1)
    return p2, p - p2


# -- the algorithms -----------------------------------------------------------------------------
def _dense(P, N, k, sets, dtype, **o):
    """The ring reduce-scatter + all-gather the simulated Comm runs (chunks of torch.tensor_split)."""
    s = Schedule(P)
    isz = dtype.itemsize
    chunk = np.array([(N // P + (1 if j < N % P else 0)) * isz for j in range(P)])
    ranks = np.arange(P)
    for step in range(P - 1):   # reduce-scatter: rank r sends chunk (r - step) mod P
        s.round(ranks, (ranks + 1) % P, chunk[(ranks - step) % P])
    for step in range(P - 1):   # all-gather: rank r sends chunk (r + 1 - step) mod P
        s.round(ranks, (ranks + 1) % P, chunk[(ranks + 1 - step) % P])
    return s


def _topka(P, N, k, sets, dtype, **o):
    s = Schedule(P)
    _bruck(s, range(P), [coo_nbytes(min(k, N), N, dtype)] * P)
    return s


def _gtopk(P, N, k, sets, dtype, **o):
    s = Schedule(P)
    k = min(k, N)
    m = coo_nbytes(k, N, dtype)
    p2, extra = _fold(P)
    if extra:
        s.round(range(p2, P), range(extra), [m] * extra)
    d = 1
    while d < p2:
        snd = [r for r in range(p2) if r % (2 * d) == d]
        s.round(snd, [r - d for r in snd], [m] * len(snd))
        d *= 2
    d = p2 // 2
    while d >= 1:
        snd = [r for r in range(p2) if r % (2 * d) == 0]
        s.round(snd, [r + d for r in snd], [m] * len(snd))
        d //= 2
    if extra:
        s.round(range(extra), range(p2, P), [m] * extra)
    return s


def gssgd_traffic(P: int, N: int, k: int, dtype: torch.dtype = torch.float32, **options) -> Schedule:
    """The adapter for gs-SGD: the algorithm class's own ``traffic(P, N, k, value_size, **options)
    -> (bytes_per_rank, rounds)`` (its schedule, checked against the simulated Comm in
    tests/test_gssgd.py), spread evenly over its rounds for :meth:`Schedule.time`; every rank
    is given the slowest rank's figures."""
    from .algorithms import get
    nbytes, rounds = get("gssgd").traffic(P, N, k, value_size=dtype.itemsize, **options)
    s = Schedule(P)
    s.sent[:] = nbytes
    s.rounds[:] = rounds
    s._cost = [(np.ones(P, np.int64), np.full(P, nbytes // max(rounds, 1)), np.ones(P, np.int64),
                np.full(P, nbytes // max(rounds, 1)))] * int(rounds)
    s.notes.append("gssgd.traffic")
    return s


class _FakeComm:
    def __init__(self, rank: int, size: int):
        self.rank, self.size = rank, size


def _spardl(P, N, k, sets, dtype, teams=None, sag="auto", **o):
    """SparDL's plan (``SparDL._make_plan``, the schedule the algorithm itself runs) for every
    rank; B-SAG with the first call's h = k/P."""
    from .algorithms.spardl import SparDL
    s = Schedule(P)
    plans = []
    for r in range(P):
        alg = SparDL(None, teams=teams, sag=sag)
        alg.comm = _FakeComm(r, P)
        alg._resolve(P)
        plans.append((alg, alg._make_plan(N, k)))
    mode = plans[0][0].sag_mode
    first = plans[0][1]
    for i in range(len(first.steps)):
        s.round(range(P), [pl.steps[i].dest for _, pl in plans],
                [coo_nbytes(pl.steps[i].send_count, N, dtype) for _, pl in plans])
    d, q = first.teams, first.q
    if mode == "recursive":
        for st in range(int(math.log2(d))):
            dst = [(pl.team ^ (1 << st)) * q + pl.pos for _, pl in plans]
            s.round(range(P), dst, [coo_nbytes(pl.counts[pl.pos], N, dtype) for _, pl in plans])
    elif mode == "bruck":
        for pos in range(q):
            alg, pl = plans[pos]
            h = alg._bsag_h(pl)
            _bruck(s, pl.cross_members, [coo_nbytes(h, N, dtype)] * d)
    if q > 1:
        for t in range(d):
            pl = plans[t * q][1]
            _bruck(s, pl.team_members, [coo_nbytes(c, N, dtype) for c in pl.counts])
    return s


def _stream_bytes(n: int, count: int, dtype) -> int:
    dense = count > stream_delta(n, dtype)
    return stream_nbytes(n, 0 if dense else count, dtype, dense)


def _sparcml_rd(P, N, k, sets: IndexSets, dtype, **o):
    """SSAR_Recursive_Double: stream sizes from the unions of the groups' index sets; a stream
    turns dense when the two counts' sum passes delta (the SparseStream rule)."""
    s = Schedule(P)
    delta = stream_delta(N, dtype)
    p2, extra = _fold(P)
    # state per rank: (union array or None when dense, count)
    state = []
    for r in range(P):
        c = sets.count(sets.sets[r])
        state.append((None, N) if c > delta else (sets.sets[r], c))

    def add(a, b):
        if a[0] is None or b[0] is None or a[1] + b[1] > delta:
            return (None, N)
        u = sets.merge(a[0], b[0])
        return (u, sets.count(u))

    def nbytes(st):
        return stream_nbytes(N, 0 if st[0] is None else st[1], dtype, st[0] is None)

    if extra:
        s.var_round(range(p2, P), range(extra), [nbytes(state[r]) for r in range(p2, P)])
        for r in range(extra):
            state[r] = add(state[r], state[r + p2])
    d = 1
    while d < p2:
        s.var_round(range(p2), [r ^ d for r in range(p2)], [nbytes(state[r]) for r in range(p2)])
        new = {}
        for r in range(p2):
            lo = min(r, r ^ d)
            if lo not in new:
                new[lo] = add(state[lo], state[lo ^ d])
        state[:p2] = [new[min(r, r ^ d)] for r in range(p2)]
        d *= 2
    if extra:
        s.var_round(range(extra), range(p2, P), [nbytes(state[r]) for r in range(extra)])
    return s


def _split_counts(P, N, sets: IndexSets):
    """Per owner j: piece counts of every rank in range j, and the running union count after
    adding ranks 0..i in order (for the stream's dense switch)."""
    b = [j * N // P for j in range(P + 1)]
    scale = sets.scale
    cuts = [np.searchsorted(x, np.asarray(b) / scale if scale != 1 else b) for x in sets.sets]
    pieces = np.array([[c[j + 1] - c[j] for j in range(P)] for c in cuts], dtype=np.int64)  # [rank, owner]
    return b, cuts, pieces


def _split_phase(s: Schedule, P, N, sets: IndexSets, dtype):
    b, cuts, pieces = _split_counts(P, N, sets)
    src, dst, nb = [], [], []
    for r in range(P):
        for j in range(P):
            if j != r:
                src.append(r)
                dst.append(j)
                nb.append(_stream_bytes(b[j + 1] - b[j], sets.count(pieces[r, j]), dtype))
    s.var_round(src, dst, nb)
    return b, cuts, pieces


def _owner_result(P, N, sets: IndexSets, dtype, b, cuts, pieces, j) -> tuple[bool, int]:
    """(dense, count) of owner j's reduced stream: pieces added in rank order."""
    n_j = b[j + 1] - b[j]
    delta = stream_delta(n_j, dtype)
    parts = [sets.sets[r][cuts[r][j]:cuts[r][j + 1]] for r in range(P)]
    c = sets.count(parts[0])
    if c > delta:
        return True, n_j
    cat = np.concatenate(parts)
    owner = np.repeat(np.arange(P), [len(p) for p in parts])
    order = np.argsort(cat, kind="stable")   # stable: the first of equal indices has the lowest rank
    srt = cat[order]
    first = order[np.concatenate([[True], srt[1:] != srt[:-1]])] if len(srt) else order
    new_at = np.bincount(owner[first], minlength=P)
    running = np.cumsum(new_at)
    for i in range(1, P):
        if c + sets.count(pieces[i, j]) > delta:
            return True, n_j
        c = sets.count(running[i])
    return False, c


def _split_allgather(P, N, k, sets, dtype, **o):
    s = Schedule(P)
    if P == 1:
        return s
    b, cuts, pieces = _split_phase(s, P, N, sets, dtype)
    _allgather_int64_raw(s)
    sizes = []
    for j in range(P):
        dense, c = _owner_result(P, N, sets, dtype, b, cuts, pieces, j)
        sizes.append(stream_nbytes(b[j + 1] - b[j], 0 if dense else c, dtype, dense))
    _bruck(s, range(P), sizes)
    return s


def _allgather_int64_raw(s: Schedule) -> None:
    """``bruck_allgather_var``'s size all-gather: one int64 per rank, no header."""
    _bruck(s, range(s.size), [8] * s.size)


def _topkdsa(P, N, k, sets, dtype, **o):
    s = Schedule(P)
    if P == 1:
        return s
    b, _, _ = _split_phase(s, P, N, sets, dtype)
    _bruck(s, range(P), [stream_nbytes(b[j + 1] - b[j], 0, dtype, True) for j in range(P)])
    return s


def _sparcml(P, N, k, sets, dtype, alpha=50e-6, beta=8e-9, observed_k=None, **o):
    from .algorithms.sparcml import choose
    name = choose(N, k, P, observed_k, dtype, alpha, beta)
    s = _MODELS[name](P, N, k, sets, dtype)
    s.notes.append(f"sparcml chose {name}")
    return s


def _runs(arr: np.ndarray) -> int:
    return 0 if len(arr) == 0 else 1 + int(np.count_nonzero(np.diff(arr) > 1))


def _densestream(P, N, k, sets, dtype, **o):
    """Estimate: blocks = runs of consecutive indices of each union (the zero-run rule, which
    joins blocks across short gaps, is ignored), values = union count."""
    s = Schedule(P)
    s.exact = False
    if P == 1:
        return s
    p2, extra = _fold(P)
    _allgather_int64(s, p2 - 1)
    props = np.zeros(p2 - 1, dtype=np.int64)
    for x in sets.sets:
        m = len(x)
        if m:
            props += np.array([x[j * m // p2] for j in range(1, p2)], dtype=np.int64)
    b = [0] + [int(v) for v in props // P] + [sets.n]
    scale = sets.scale

    def msg(arr, lo, hi):
        part = arr[np.searchsorted(arr, lo):np.searchsorted(arr, hi)]
        return densestream_nbytes(sets.count(_runs(part)), sets.count(part), int(N), dtype)

    held = [sets.sets[r] for r in range(P)]
    if extra:
        s.var_round(range(p2, P), range(extra), [msg(held[r], 0, sets.n) for r in range(p2, P)])
        for r in range(extra):
            held[r] = _union(held[r], held[r + p2])
    rng = [(0, p2)] * p2
    d = p2 // 2
    while d >= 1:
        dst, nb, new = [], [], {}
        for r in range(p2):
            first, last = rng[r]
            mid = (first + last) // 2
            give = (mid, last) if r & d == 0 else (first, mid)
            dst.append(r ^ d)
            nb.append(msg(held[r], b[give[0]], b[give[1]]))
        s.var_round(range(p2), dst, nb)
        for r in range(p2):
            first, last = rng[r]
            mid = (first + last) // 2
            keep = (first, mid) if r & d == 0 else (mid, last)
            lo, hi = b[keep[0]], b[keep[1]]
            a, c = held[r], held[r ^ d]
            new[r] = (_union(a[np.searchsorted(a, lo):np.searchsorted(a, hi)],
                                 c[np.searchsorted(c, lo):np.searchsorted(c, hi)]), keep)
        for r in range(p2):
            held[r], rng[r] = new[r]
        d //= 2
    d = 1
    while d < p2:
        s.var_round(range(p2), [r ^ d for r in range(p2)], [msg(held[r], 0, sets.n) for r in range(p2)])
        joint = {}
        for r in range(p2):   # the aligned group of 2d ranks holds one union: computed once
            g = r & ~(2 * d - 1)
            if g not in joint:
                joint[g] = _union(held[g], held[g + d])
        held = [joint[r & ~(2 * d - 1)] for r in range(p2)] + held[p2:]
        d *= 2
    if extra:
        s.var_round(range(extra), range(p2, P), [msg(held[r], 0, sets.n) for r in range(extra)])
    _ = scale
    return s


def _oktopk(P, N, k, sets, dtype, first_call=False, **o):
    """Estimate of a threshold-reuse step: the agreement all-gather (step, checksum, P counts,
    flag), P-1 split rounds of k/P entries, the all-gather of m and the 97 rung counts of the
    global threshold's ladder (only m on a recomputation step), one balance round of about
    G/P entries (G = k) and the Bruck all-gather of P blocks of G/P. ``first_call`` (every
    ``tau``-th step has the radix select, every ``tau_prime``-th the repartition): the proposals'
    agreement and the counts all-gather instead, and 4 all-gathered 256-bin histograms."""
    s = Schedule(P)
    s.exact = False
    if P == 1:
        return s
    k = min(k, N)
    if first_call:
        _allgather_int64(s, 3 + P)
        _allgather_int64(s, P)
    else:
        _allgather_int64(s, 3 + P)
    per = -(-k // P)
    ranks = np.arange(P)
    for i in range(1, P):
        s.round(ranks, (ranks + i) % P, [coo_nbytes(per, N, dtype)] * P)
    _allgather_int64(s, 1 if first_call else 98)
    if first_call:
        for _ in range(4):
            _allgather_int64(s, 256)
    s.round(ranks, (ranks + 1) % P, [coo_nbytes(per // 2, N, dtype)] * P)
    _bruck(s, range(P), [coo_nbytes(k // P + (1 if j < k % P else 0), N, dtype) for j in range(P)])
    return s


_CODED_CACHE: dict = {}


def _coded_nbytes(N: int, k: int, dtype) -> int:
    """One rank's real SKCompress message (both codecs) for k standard-normal values at indices
    drawn by the gradient model: every rank's message is taken to be this size."""
    key = (N, k, dtype)
    if key not in _CODED_CACHE:
        from .formats import CODEC_OPTION_DEFAULTS, CooCodec
        codec = CooCodec({**CODEC_OPTION_DEFAULTS, "index_codec": "delta_binary", "value_codec": "skcompress"})
        idx = torch.from_numpy(model_sets(1, N, k)[0])
        vals = torch.randn(idx.numel(), generator=torch.Generator().manual_seed(1)).to(dtype)
        _CODED_CACHE[key] = int(codec.encode(idx, vals, N, 0)[0].numel())
    return _CODED_CACHE[key]


def _skcompress(P, N, k, sets, dtype, topology="allgather", **o):
    s = Schedule(P)
    s.exact = False
    if P == 1:
        return s
    m = _coded_nbytes(N, min(k, N), dtype)
    if topology == "ps":
        s.var_round(range(1, P), [0] * (P - 1), [m] * (P - 1))
        s.var_round([0] * (P - 1), range(1, P), [m] * (P - 1))
    else:
        _allgather_int64_raw(s)
        _bruck(s, range(P), [m] * P)
    return s


_MODELS: dict[str, Callable[..., Schedule]] = {
    "dense": _dense, "topka": _topka, "gtopk": _gtopk, "gssgd": gssgd_traffic, "spardl": _spardl,
    "sparcml_recursive_double": _sparcml_rd, "sparcml_split_allgather": _split_allgather, "topkdsa": _topkdsa,
    "sparcml": _sparcml, "densestream": _densestream, "oktopk": _oktopk, "skcompress": _skcompress,
}


def modelled() -> list[str]:
    """The algorithms this module has a schedule for."""
    return sorted(_MODELS)


def traffic(name: str, P: int, N: int, k: int, sets: IndexSets | None = None,
            dtype: torch.dtype = torch.float32, **options: Any) -> Schedule:
    """The :class:`Schedule` of one call of ``name`` on ``P`` ranks (``k`` selected per rank).

    ``sets`` (the ranks' selected indices) is needed by the set-based and estimated models; when
    missing, :func:`model_sets` draws them (at most 2^20 long, scaled to N)."""
    if name not in _MODELS:
        raise ValueError(f"no schedule model for {name!r}; modelled: {', '.join(modelled())}")
    if P < 1 or N < 0 or k < 0:
        raise ValueError(f"traffic: need P >= 1, N >= 0, k >= 0; got P={P}, N={N}, k={k}")
    if sets is None and name in SET_BASED + ("densestream",):
        sets = default_sets(P, N, k)
    if name == "gssgd":
        return gssgd_traffic(P, N, k, dtype, **options)
    return _MODELS[name](P, N, k, sets, dtype, **options)


def default_sets(P: int, N: int, k: int, model_n: int = 1 << 20, seed: int = 0) -> IndexSets:
    """Model index sets at length min(N, model_n), scaled to N."""
    n_model = min(N, model_n)
    k_model = max(1, round(k * n_model / N)) if N else 0
    return IndexSets(model_sets(P, n_model, k_model, seed=seed), n_model, N / n_model if n_model else 1.0)


# -- the papers' formulas -------------------------------------------------------------------------
def paper_formula(name: str, P: int, N: int, k: int, d: int = 2, log_d_words: float | None = None,
                  word: int = 4) -> tuple[float, float] | None:
    """(latency terms, bytes) per rank of a paper's cost formula for power-of-two P, words of
    ``word`` bytes (a COO entry is 2 words): SparDL Table 1 (dense, topka, topkdsa as its lower
    end, gtopk, oktopk lower end, spardl no SAG / R-SAG with d teams), SparCML section 4
    (recursive double: lower end log2(P) k entries; split-allgather: lower end 2 (P-1)/P k entries),
    gs-SGD eq. 1 (2 ceil(log2 P) messages of the sketch, ``log_d_words`` words)."""
    lg = math.log2(P) if P > 1 else 0
    w = word
    if name == "dense":
        return 2 * lg, 2 * (P - 1) / P * N * w
    if name == "topka":
        return lg, 2 * (P - 1) * k * w
    if name == "topkdsa":
        return P + 2 * lg, 4 * (P - 1) / P * k * w
    if name == "gtopk":
        return 2 * lg, 4 * lg * k * w
    if name == "oktopk":
        return 2 * (P + lg), 2 * k * (P - 1) / P * w
    if name == "spardl":
        if d == 1:
            return 2 * math.ceil(lg), 4 * k * (P - 1) / P * w
        return 2 * math.ceil(math.log2(P / d)) + math.log2(d), 2 * k * ((2 * P - 2 * d) / P + d / P * math.log2(d)) * w
    if name == "sparcml_recursive_double":
        return lg, 2 * lg * k * w
    if name == "sparcml_split_allgather":
        return (P - 1) + lg, 2 * 2 * (P - 1) / P * k * w
    if name == "gssgd":
        words = log_d_words if log_d_words is not None else math.log2(max(N, 2))
        return 2 * math.ceil(lg), 2 * math.ceil(lg) * words * w
    return None
