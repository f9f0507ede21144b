"""``spardl``: SparDL ("SparDL: Distributed Deep Learning Training with Efficient Sparse
Communication", sections 3.1-3.3, Algorithms 1 and 2).

One call on P ranks split into d teams of Q = P/d consecutive ranks (team t = ranks
t*Q .. t*Q+Q-1, position p = rank % Q; d = 1 means no Spar-All-Gather):

1. **Spar-Reduce-Scatter** inside each team (section 3.1). The vector is cut into Q blocks,
   block b = [b*N//Q, (b+1)*N//Q) (the layout of :func:`ops.block_topk`). Position p keeps
   block p (preservation bag B_0) and puts the following blocks, in a circle, into
   l = ceil(log2 Q) sending bags: B_m holds the blocks at offsets [2^(m-1), 2^m - 1] from p,
   the last one possibly short (E = Q - 2^(l-1) blocks). At step i = 1..l the rank selects the
   top-c entries of each block of bag B_(l-i+1) (only the blocks that leave next: the paper's
   "Optimization for SRS"), sends them as ONE COO message to position p + 2^(l-i), receives
   the same bag of position p - 2^(l-i) and adds it into the blocks it still holds. After l
   steps it selects the top-c entries of block p.
2. **Spar-All-Gather** between teams (section 3.3), when d > 1:
   * R-SAG (d a power of two): log2 d steps of recursive doubling with the rank at the same
     position in team t XOR 2^s; both merge the two blocks (lower team group first), keep the
     top-L and keep the discarded values as residual, shared equally by the 2^(s+1) ranks that
     computed the same merge (1/2 on each side at the first step, as the paper says; 1/4 each
     at the second step, ... -- so nothing is counted twice when d > 2).
   * B-SAG (any d): the final selection of step 1 takes only the top-h entries (h adapted from
     call to call by Algorithm 2), the d ranks at the same position all-gather them with the
     shared Bruck all-gather, merge them in team order, keep the top-L and each keep 1/d of the
     discarded values as residual. If fewer than L entries remain the block is padded with
     zero-valued entries at the lowest unused indices of the block, so the final message has
     exactly L entries and its size is known to the receiver.
3. **Bruck all-gather** of the Q final blocks inside the team
   (:func:`sparsecomm.comm.collectives.bruck_allgather`) and a scatter into ``out``.

**Global residual collection (Algorithm 1).** The rank works in place in ``acc``: what it
selects and sends is removed, what it receives is added, what SAG discards is added back in
the shares above -- the in-procedure residual xi of lines 8 and 10. Every change is journalled
(index, value before the change; O(k log P) entries, no N-sized copy). At the end, at the
indices I of the global result acc keeps xi (line 14); everywhere else the journal restores
the rank's own original gradient + residual (lines 3 and 12-14: the local and end-procedure
residuals stay with the rank that produced them). Hence sum_r (g_r + e_r) = out + sum_r e'_r.

**Codecs** (``index_codec``, ``value_codec``, :mod:`sparsecomm.formats.codec`): every message
(SRS bags, R-SAG and B-SAG blocks, the final all-gather) goes through the codec; sizes vary, so
rounds use ``exchange_var`` / ``bruck_allgather_var``. With a lossy value codec the sender adds
``true - decoded`` into ``acc`` at the sent indices (journalled), and R-SAG merges its own
decoded values, so both partners compute the same sum; the residual collection above then
keeps conservation. ``index_codec`` alone leaves every result bit-identical.

**Choices where the paper is open.**

* Quota per block: c = ceil(k / Q) (k/P without SAG, L(k, d, P) = dk/P with SAG), at most the
  block's length. Every block message carries exactly min(c, len(block)) entries (entries
  with value 0 when a block has fewer nonzeros), so the receiver knows every size.
* Ties: the rule of :mod:`sparsecomm.ops` -- equal magnitudes go to the lower index.
* Teams are consecutive ranks (ranks of one node stay in one team for the intra-team phases).
* Default: ``teams=None`` gives 2 teams with R-SAG when P is even and >= 4, else no SAG.
* B-SAG: h is a float; the block takes min(c, max(1, ceil(h))) entries. After each call
  Algorithm 2 updates the step and h from N_t = entries after the all-gather, compared
  with L = c of this rank's block; h is kept in [k/P, dk/P] and |step| at most k(d-1)/P (the
  width of that range) so the doubling cannot run away. The first call uses h = k/P.
  When the quota covers the whole block (dense input, k >= N) h is the block length: the
  top-L after the all-gather then drops nothing and the result is exact, as without SAG.

Cost per rank (Table 1; c(.) bytes of a COO message of that many entries):
ceil(log2 Q) SRS rounds + (log2 d for R-SAG | ceil(log2 d) for B-SAG) + ceil(log2 Q)
all-gather rounds; bytes: one message per SRS step, one per R-SAG step (L entries), d-1
messages of h entries for B-SAG, and Q-1 block messages in the final all-gather.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from .. import ops
from ..comm.collectives import bruck_allgather, bruck_allgather_var
from ..formats import index_dtype_for
from ..formats.coo import coo_nbytes
from ..traffic import IndexSets, Traffic
from ..options import Option
from .base import Algorithm, register

__all__ = ["SparDL"]

_SAG_CHOICES = ("auto", "recursive", "bruck")


def _is_pow2(x: int) -> bool:
    return x >= 1 and (x & (x - 1)) == 0


def _divisors(p: int) -> list[int]:
    return [d for d in range(1, p + 1) if p % d == 0]


class _GroupView:
    """A subset of a Comm's ranks seen as a Comm of its own (rank, size, exchange), for the
    shared Bruck all-gather inside a team or across teams. Messages go through the parent,
    so bytes and rounds are counted there."""

    def __init__(self, parent, members: Sequence[int]):
        self.parent = parent
        self.members = list(members)
        self.rank = self.members.index(parent.rank)
        self.size = len(self.members)

    def exchange(self, sends, recvs) -> None:
        m = self.members
        self.parent.exchange([(m[p], t) for p, t in sends], [(m[p], t) for p, t in recvs])

    def exchange_var(self, sends, sources, max_nbytes=None) -> list[torch.Tensor]:
        m = self.members
        return self.parent.exchange_var([(m[p], t) for p, t in sends], [m[p] for p in sources], max_nbytes)

    @property
    def max_message_bytes(self) -> int | None:
        return self.parent.max_message_bytes


@dataclass
class _Step:
    dest: int                       # global rank
    source: int                     # global rank
    send_runs: list[tuple[int, int]]  # (first block, number of blocks), ascending
    send_count: int
    recv_count: int


@dataclass
class _Layout:
    """One rank's rounds and groups in a call of length n with k: blocks, quotas, the
    Spar-Reduce-Scatter steps, its team and its cross-team group (:func:`_rank_layout`)."""

    n: int
    k: int
    teams: int
    q: int                          # team size
    team: int
    pos: int
    quota: int                      # c = ceil(k / Q)
    bounds: list[int]               # Q + 1 block boundaries
    counts: list[int]               # entries of each block's message: min(c, len)
    steps: list[_Step] = field(default_factory=list)
    team_members: list[int] = field(default_factory=list)
    cross_members: list[int] = field(default_factory=list)  # same position, team order

    def rsag_partners(self) -> list[int]:
        """R-SAG's partner at each step s: the same position in team ``team XOR 2^s``."""
        return [(self.team ^ (1 << s)) * self.q + self.pos for s in range(int(math.log2(self.teams)))]


def _rank_layout(rank: int, size: int, teams: int, n: int, k: int) -> _Layout:
    """Rank ``rank``'s layout of one call on ``size`` ranks in ``teams`` teams (n, k): its team
    and position, the blocks and their quotas, the Spar-Reduce-Scatter rounds and its groups.
    What :meth:`SparDL.reduce` runs and :meth:`SparDL.traffic` counts."""
    d = teams
    q = size // d
    team, pos = rank // q, rank % q
    quota = -(-k // q)
    bounds = [b * n // q for b in range(q + 1)]
    counts = [min(quota, bounds[b + 1] - bounds[b]) for b in range(q)]
    layout = _Layout(n=n, k=k, teams=d, q=q, team=team, pos=pos, quota=quota, bounds=bounds, counts=counts,
                     team_members=[team * q + j for j in range(q)],
                     cross_members=[t * q + pos for t in range(d)])
    levels = math.ceil(math.log2(q)) if q > 1 else 0
    for i in range(1, levels + 1):
        dist = 2 ** (levels - i)
        hi = min(2 * dist, q) - 1          # bag B_(l-i+1): offsets [dist, hi]
        send_runs = _runs(pos, dist, hi, q)
        src = (pos - dist) % q
        recv_runs = _runs(src, dist, hi, q)
        layout.steps.append(_Step(
            dest=team * q + (pos + dist) % q, source=team * q + src, send_runs=send_runs,
            send_count=sum(counts[b] for b0, nb in send_runs for b in range(b0, b0 + nb)),
            recv_count=sum(counts[b] for b0, nb in recv_runs for b in range(b0, b0 + nb))))
    return layout


def _fresh_bsag_state(layout: _Layout) -> dict[str, Any]:
    """Algorithm 2's state before the first call: h = k/P."""
    size, k, d = layout.q * layout.teams, layout.k, layout.teams
    return {"n": layout.n, "k": k, "teams": d, "h": k / size, "step": 0.01 * k * (d - 1) / size, "flag": False}


def _bsag_quota(layout: _Layout, h: float) -> int:
    """Entries of the held block that B-SAG all-gathers, given Algorithm 2's h."""
    c = layout.counts[layout.pos]
    if c == layout.bounds[layout.pos + 1] - layout.bounds[layout.pos]:
        return c    # the whole block is selected (dense input): top-L drops nothing, top-h would
    return min(c, max(1, math.ceil(h - 1e-9)))


@register
class SparDL(Algorithm):
    name = "spardl"
    lossless = False
    option_specs = {
        # whether teams divides P is checked once P is known (check_size)
        "teams": Option(None, int, min=1,
                        what="None (the paper's default) or a positive int dividing the number of ranks"),
        "sag": Option("auto", str, choices=_SAG_CHOICES, what=f"one of {', '.join(map(repr, _SAG_CHOICES))}"),
    }
    uses_coo_codec = True

    def __init__(self, comm, **options: Any):
        super().__init__(comm, **options)
        self._teams: int | None = None
        self._mode = "none"
        if comm is not None:
            self._resolve(comm.size)
        self._layout: _Layout | None = None
        # B-SAG adaptive state (Algorithm 2), per (n, k)
        self._bsag: dict[str, Any] | None = None
        self._pending_state: dict[str, Any] | None = None

    # -- options ------------------------------------------------------------------------
    @classmethod
    def check_options(cls, options: dict[str, Any]) -> None:
        teams = options["teams"]
        if options["sag"] == "recursive" and teams is not None and not _is_pow2(teams):
            raise ValueError(f"spardl: sag='recursive' (R-SAG) needs teams to be a power of two, got teams={teams}; "
                             "use sag='bruck' (B-SAG) or sag='auto' for other team counts")

    def check_size(self, size: int) -> None:
        """ValueError unless ``teams`` (and ``sag``) work on ``size`` ranks."""
        self._resolve(size)

    def _resolve(self, size: int) -> None:
        teams, sag = self.options["teams"], self.options["sag"]
        if teams is None:
            teams = 2 if (size >= 4 and size % 2 == 0) else 1
        if size % teams:
            raise ValueError(f"spardl: teams={teams} does not divide the number of ranks P={size}; "
                             f"valid choices for P={size}: {', '.join(map(str, _divisors(size)))}")
        if teams == 1:
            mode = "none"
        elif sag == "recursive" or (sag == "auto" and _is_pow2(teams)):
            mode = "recursive"
        else:
            mode = "bruck"
        self._teams, self._mode = teams, mode

    @property
    def sag_mode(self) -> str:
        """'none', 'recursive' (R-SAG) or 'bruck' (B-SAG), once the number of ranks is known."""
        return self._mode

    @property
    def teams(self) -> int | None:
        return self._teams

    # -- B-SAG adaptive h (Algorithm 2) ---------------------------------------------------
    def _bsag_state(self, layout: _Layout) -> dict[str, Any]:
        st = self._bsag
        if st is None or st["n"] != layout.n or st["k"] != layout.k or st["teams"] != layout.teams:
            pending, self._pending_state = self._pending_state, None
            if pending and pending.get("n") == layout.n and pending.get("k") == layout.k \
                    and pending.get("teams") == layout.teams:
                st = dict(pending)
            else:
                st = _fresh_bsag_state(layout)
            self._bsag = st
        return st

    def _bsag_update(self, layout: _Layout, n_t: int) -> None:
        st = self._bsag_state(layout)
        size, k, d = self.comm.size, layout.k, layout.teams
        target = layout.counts[layout.pos]
        step, flag = st["step"], st["flag"]
        if (n_t > target) != (step > 0):       # line 3: keep the direction
            if flag:
                step, flag = step * 2, False
            else:
                flag = True
        else:                                   # lines 9-11: turn round, halve
            step, flag = -step / 2, False
        width = k * (d - 1) / size
        step = max(-width, min(width, step))
        st["step"], st["flag"] = step, flag
        st["h"] = max(k / size, min(d * k / size, st["h"] + step))   # line 12

    def state_dict(self) -> dict[str, Any]:
        st = self._bsag if self._bsag is not None else self._pending_state
        return {"bsag": dict(st)} if st else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not state:
            return
        unknown = set(state) - {"bsag"}
        if unknown:
            raise ValueError(f"spardl: unknown state keys {sorted(unknown)}")
        st = dict(state["bsag"])
        missing = {"n", "k", "teams", "h", "step", "flag"} - set(st)
        if missing:
            raise ValueError(f"spardl: B-SAG state lacks {sorted(missing)}")
        self._bsag = None
        self._pending_state = st

    # -- messages through the codec ----------------------------------------------------------
    def _encode(self, acc, idx, val, journal, holders: int = 1):
        """``(message, sent)`` of a COO vector; a lossy codec's error ``val - sent`` is added to
        ``acc`` at ``idx`` (journalled like every change), so it stays in the residual when
        ``idx`` ends in the result, and the journal restores the original elsewhere. A vector
        that ``holders`` ranks hold identically (after R-SAG steps, after B-SAG) is encoded by
        each of them into the same bytes: each keeps 1/holders of the error, as with SAG's
        discarded values, so it is counted once."""
        message, sent = self.codec.encode(idx, val, acc.numel(), self.comm.rank)
        if not self.codec.lossless and idx.numel():
            i64 = idx.to(torch.int64)
            # an entry just journalled for these very indices (their selection) restores them
            # after this one would: recording them again is a gather and a restore for nothing
            if not (journal and journal[-1][0] is idx):
                journal.append((i64, ops.gather(acc, i64)))
            err = val - sent
            ops.scatter_add_(acc, i64, err if holders == 1 else err * (1.0 / holders))
        return message, sent

    def _swap(self, dest: int, message: torch.Tensor, source: int, count: int, acc) -> torch.Tensor:
        """One round: send ``message`` to ``dest``, receive ``count`` entries from ``source``."""
        nbytes = self.codec.fixed_nbytes(count, acc.numel(), acc.dtype)
        if nbytes is None:
            return self.comm.exchange_var([(dest, message)], [source])[0]
        incoming = torch.empty(nbytes, dtype=torch.uint8, device=acc.device)
        self.comm.exchange([(dest, message)], [(source, incoming)])
        return incoming

    def _allgather(self, view, message: torch.Tensor, counts, acc) -> list[torch.Tensor]:
        if self.codec.plain:
            return bruck_allgather(view, message, [self.codec.fixed_nbytes(c, acc.numel(), acc.dtype)
                                                   for c in counts])
        return bruck_allgather_var(view, message)

    def _decode(self, payload, acc, sender: int, count: int):
        return self.codec.decode(payload, n=acc.numel(), value_dtype=acc.dtype, receiver=self.comm.rank,
                                 sender=sender, count=count)

    # -- the call -------------------------------------------------------------------------
    fuses_add = True

    def reduce(self, acc: torch.Tensor, k: int, out: torch.Tensor, grad: torch.Tensor | None = None) -> None:
        comm = self.comm
        if self._teams is None:
            self._resolve(comm.size)
        n = acc.numel()
        layout = self._layout
        if layout is None or layout.n != n or layout.k != k:
            layout = self._layout = _rank_layout(comm.rank, comm.size, self._teams, n, k)
        idx_dtype = index_dtype_for(n)
        journal: list[tuple[torch.Tensor, torch.Tensor]] = []   # (indices, values before the change)

        # 1. Spar-Reduce-Scatter inside the team. The gradient (grad=, fused) is added into
        # the blocks of the first selection by that selection, into the others right after
        # it, before anything received is added (acc = (e + g) + received, as unfused)
        for step in layout.steps:
            with self.timed("select"):
                sel_idx, sel_val = _select_runs(acc, layout, step.send_runs, layout.quota, grad)
                if grad is not None:
                    _add_outside(acc, grad, layout, step.send_runs)
                    grad = None
                journal.append((sel_idx, sel_val))
                message, _ = self._encode(acc, sel_idx, sel_val, journal)
            incoming = self._swap(step.dest, message, step.source, step.recv_count, acc)
            with self.timed("merge"):
                r_idx, r_val = self._decode(incoming, acc, step.source, step.recv_count)
                if r_idx.numel():
                    r_idx = r_idx.to(torch.int64)
                    journal.append((r_idx, ops.gather(acc, r_idx)))
                    ops.scatter_add_(acc, r_idx, r_val)

        # final selection of the held block (Algorithm 1 line 10); B-SAG takes only top-h
        final_quota = layout.quota
        if self._mode == "bruck":
            final_quota = _bsag_quota(layout, self._bsag_state(layout)["h"])
        with self.timed("select"):
            f_idx, f_val = _select_runs(acc, layout, [(layout.pos, 1)], final_quota, grad)
            if grad is not None:   # no SRS step (one rank per team): this was the first selection
                _add_outside(acc, grad, layout, [(layout.pos, 1)])
            f_idx = f_idx.to(idx_dtype)   # scatter_set_ and gather take either index dtype
            journal.append((f_idx, f_val))
            final_entry = len(journal) - 1
            selected = f_idx

        # 2. Spar-All-Gather between teams
        if self._mode == "recursive":
            f_idx, f_val = self._rsag(acc, layout, f_idx, f_val, journal)
        elif self._mode == "bruck":
            f_idx, f_val = self._bsag_step(acc, layout, f_idx, f_val, journal)

        # 3. Bruck all-gather of the final blocks inside the team
        if layout.q > 1:
            message, sent = self._encode(acc, f_idx, f_val, journal, holders=layout.teams)
            blocks = self._allgather(_GroupView(comm, layout.team_members), message, layout.counts, acc)
        with self.timed("merge"):
            if layout.q > 1:
                # its own block as the others decode it (the encoder returned that), undecoded
                parts = [(f_idx, sent) if j == layout.pos else
                         self._decode(blk, acc, layout.team_members[j], layout.counts[j])
                         for j, blk in enumerate(blocks)]
                # int32 or int64 as decoded: scatter_set_ and gather take either
                all_idx = torch.cat([p[0] for p in parts])
                all_val = torch.cat([p[1] for p in parts])
            else:
                all_idx, all_val = f_idx, f_val
        with self.timed("scatter"):
            # blocks are disjoint: no sums, identical everywhere; out written once, zeros between
            ops.scatter_set_(out, all_idx, all_val, zero_rest=True)
        with self.timed("residual"):
            # global residual collection: xi at the result's indices, the original elsewhere.
            # A journal entry whose indices all lie in the result is overwritten by xi anyway:
            # the final selection's, when it is the result itself (one rank per team and no
            # SAG step changed it); with nothing else to undo, acc is already right.
            covered = final_entry if layout.q == 1 and f_idx is selected else None
            undo = [(j_idx, j_val) for pos, (j_idx, j_val) in enumerate(journal)
                    if pos != covered and j_idx.numel()]
            if undo:
                xi = ops.gather(acc, all_idx)
                for j_idx, j_val in reversed(undo):
                    ops.scatter_set_(acc, j_idx, j_val)
                ops.scatter_set_(acc, all_idx, xi)
        self.last_nnz = int(torch.count_nonzero(all_val))

    traffic_model = "exact"

    @classmethod
    def traffic(cls, P: int, N: int, k: int, sets: IndexSets | None = None, dtype: torch.dtype = torch.float32,
                teams: int | None = None, sag: str = "auto", **options: Any) -> Traffic:
        """Every rank's :func:`_rank_layout` (what :meth:`reduce` runs), the plain codec's
        sizes; B-SAG with the first call's h = k/P (:func:`_fresh_bsag_state`). ``teams`` and
        ``sag`` resolve on P as the constructor and :meth:`check_size` resolve them."""
        shape = cls(None, teams=teams, sag=sag)
        shape.check_size(P)
        d, mode = shape.teams, shape.sag_mode
        t = Traffic(P)
        layouts = [_rank_layout(r, P, d, N, k) for r in range(P)]
        first = layouts[0]
        for i in range(len(first.steps)):
            t.round(range(P), [lay.steps[i].dest for lay in layouts],
                    [coo_nbytes(lay.steps[i].send_count, N, dtype) for lay in layouts])
        if mode == "recursive":
            partners = [lay.rsag_partners() for lay in layouts]
            for s in range(len(partners[0])):
                t.round(range(P), [p[s] for p in partners],
                        [coo_nbytes(lay.counts[lay.pos], N, dtype) for lay in layouts])
        elif mode == "bruck":
            for lay in layouts[:first.q]:   # one cross-team group per position
                h = _bsag_quota(lay, _fresh_bsag_state(lay)["h"])
                t.bruck_allgather(lay.cross_members, [coo_nbytes(h, N, dtype)] * d)
        if first.q > 1:
            for lay in layouts[::first.q]:   # one team per first member
                t.bruck_allgather(lay.team_members, [coo_nbytes(c, N, dtype) for c in lay.counts])
        return t

    # -- R-SAG ----------------------------------------------------------------------------
    def _rsag(self, acc, layout: _Layout, f_idx, f_val, journal):
        count = layout.counts[layout.pos]
        for s, partner in enumerate(layout.rsag_partners()):
            # both sides merge decoded values; 2^s ranks hold this f identically
            message, f_val = self._encode(acc, f_idx, f_val, journal, holders=1 << s)
            incoming = self._swap(partner, message, partner, count, acc)
            with self.timed("merge"):
                p_idx, p_val = self._decode(incoming, acc, partner, count)
                if layout.team & (1 << s):   # the lower team group's block first: same sum on both sides
                    m_idx, m_val = ops.merge_add(p_idx, p_val, f_idx, f_val)
                else:
                    m_idx, m_val = ops.merge_add(f_idx, f_val, p_idx, p_val)
            with self.timed("select"):
                f_idx, f_val, d_idx, d_val = _keep_top(m_idx, m_val, count)
            with self.timed("merge"):
                if d_idx.numel():   # discarded: shared by the 2^(s+1) ranks that computed this merge
                    d_idx = d_idx.to(torch.int64)
                    journal.append((d_idx, ops.gather(acc, d_idx)))
                    ops.scatter_add_(acc, d_idx, d_val * (1.0 / (2 << s)))
        return f_idx, f_val

    # -- B-SAG ----------------------------------------------------------------------------
    def _bsag_step(self, acc, layout: _Layout, f_idx, f_val, journal):
        comm, dtype = self.comm, acc.dtype
        h = f_idx.numel()
        d = layout.teams
        message, sent = self._encode(acc, f_idx, f_val, journal)
        blocks = self._allgather(_GroupView(comm, layout.cross_members), message, [h] * d, acc)
        with self.timed("merge"):
            parts = [(f_idx, sent) if layout.cross_members[t] == comm.rank else
                     self._decode(blk, acc, layout.cross_members[t], h) for t, blk in enumerate(blocks)]
            u_idx, u_val = ops.merge_add_many([p[0] for p in parts], [p[1] for p in parts])
        n_t = u_idx.numel()
        target = layout.counts[layout.pos]
        with self.timed("select"):
            if n_t >= target:
                f_idx, f_val, d_idx, d_val = _keep_top(u_idx, u_val, target)
            else:   # pad with zero values at the lowest unused indices of the block
                lo = layout.bounds[layout.pos]
                cand = torch.arange(lo, lo + target, dtype=u_idx.dtype, device=acc.device)
                pad = cand[~torch.isin(cand, u_idx)][: target - n_t]
                f_idx, f_val = ops.merge_add(u_idx, u_val, pad, torch.zeros(pad.numel(), dtype=dtype,
                                                                            device=acc.device))
                d_idx = u_idx[:0]
        with self.timed("merge"):
            if d_idx.numel():   # discarded: each of the d ranks holding this block keeps 1/d
                d_idx = d_idx.to(torch.int64)
                journal.append((d_idx, ops.gather(acc, d_idx)))
                ops.scatter_add_(acc, d_idx, d_val * (1.0 / d))
        self._bsag_update(layout, n_t)
        return f_idx, f_val


def _runs(start: int, lo: int, hi: int, q: int) -> list[tuple[int, int]]:
    """Blocks (start + o) % q for o in [lo, hi], as ascending contiguous runs (first, count)."""
    first, count = (start + lo) % q, hi - lo + 1
    if count <= 0:
        return []
    if first + count <= q:
        return [(first, count)]
    return [(0, first + count - q), (first, q - first)]


def _add_outside(x: torch.Tensor, grad: torch.Tensor, layout: _Layout, runs) -> None:
    """``x += grad`` outside the blocks of ``runs`` (inside them the fused selection added it)."""
    covered = sorted((layout.bounds[b0], layout.bounds[b0 + nb]) for b0, nb in runs)
    at = 0
    for lo, hi in covered + [(layout.n, layout.n)]:
        if lo > at:
            x[at:lo].add_(grad[at:lo])
        at = max(at, hi)


def _select_runs(x: torch.Tensor, layout: _Layout, runs, quota: int, grad: torch.Tensor | None = None):
    """Top-quota entries (by |x|, ties to the lower index) of every block in ``runs``; global
    int64 indices, ascending; the selected entries of ``x`` are then set to zero (they leave
    the residual). With ``grad`` (fused) each block first gets ``x += grad`` by the selection
    itself. One block_topk call per contiguous run when the run's own equal division matches
    the layout's block boundaries (always when Q divides N), else one topk call per block of the
    run."""
    bounds = layout.bounds
    idx_parts, val_parts = [], []
    for b0, nb in runs:
        lo, hi = bounds[b0], bounds[b0 + nb]
        if hi == lo:
            continue
        seg = x[lo:hi]
        width = hi - lo
        if nb == 1 or all(bounds[b0 + j] - lo == j * width // nb for j in range(1, nb)):
            v, i = Algorithm.select_topk(seg, quota, None if grad is None else grad[lo:hi], clear=True,
                                         num_blocks=nb)
            idx_parts.append(i + lo)
            val_parts.append(v)
        else:
            for b in range(b0, b0 + nb):
                blo, bhi = bounds[b], bounds[b + 1]
                if bhi > blo:
                    v, i = Algorithm.select_topk(x[blo:bhi], quota, None if grad is None else grad[blo:bhi],
                                                 clear=True)
                    idx_parts.append(i + blo)
                    val_parts.append(v)
    if not idx_parts:
        return torch.empty(0, dtype=torch.int64, device=x.device), x.new_empty(0)
    if len(idx_parts) == 1:
        return idx_parts[0], val_parts[0]
    return torch.cat(idx_parts), torch.cat(val_parts)


def _keep_top(idx: torch.Tensor, val: torch.Tensor, count: int):
    """Split a sorted COO vector into its top-``count`` entries and the rest (both sorted)."""
    if idx.numel() <= count:
        return idx, val, idx[:0], val[:0]
    _, pos = ops.topk(val, count)
    keep = torch.zeros(idx.numel(), dtype=torch.bool, device=idx.device)
    keep[pos] = True
    return idx[pos], val[pos], idx[~keep], val[~keep]
