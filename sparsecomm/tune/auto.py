"""``auto``: pick the fastest algorithm for each tensor from the cost models.

For users who do not know which algorithm suits their network, model and scale. Before the
first call for a tensor (the reducer's ``prepare`` step, before its signature handshake) every
rank

1. takes alpha and beta: the options when given, else a short ping-pong between ranks 0 and 1
   through the Comm (1 KB, 64 KB and 1 MB, three trips each, half round trips, least squares:
   :func:`sparsecomm.traffic.fit_alpha_beta`; :func:`sparsecomm.tune.links.link_fit`), done once
   per Comm and reused by every reducer on it; rank 0's fit is all-gathered and every rank uses rank 0's values, so the inputs of the
   decision are identical everywhere;
2. predicts each candidate's time per call: the alpha-beta time of its message schedule
   (its :meth:`~sparsecomm.algorithms.Algorithm.traffic`, with index sets from
   :func:`sparsecomm.traffic.default_sets`, a model of real gradients) plus its
   local compute, ``compute_ns[name](density) * N`` (a per-element coefficient measured once,
   :data:`COMPUTE_NS`, interpolated in log density; ``compute`` overrides it);
3. shortlists the candidates the model puts within ``margin`` x the cheapest (at most
   ``shortlist`` of them, cheapest first) and, when more than one is left and ``tune`` > 0,
   *measures* them: the next ``tune`` calls run the first, the ``tune`` after that the second,
   and so on (every call is a real reduction: its result and residual are that candidate's);
   then each rank's best time per candidate is all-gathered, a candidate's time is its slowest
   rank's, and the fastest is kept for every later call (ties: the shortlist's order). The
   model's ranking is right to within its compute term, measured once at P = 4 on 2 shared
   cores (docs/scale.md); the trial calls are what close the last 10-60% between candidates the
   model cannot tell apart. With ``tune=0`` (or one candidate left) the cheapest predicted
   runs from the first call. The handshake's algorithm field names the shortlist while
   tuning (``auto/tune(topka+spardl+gtopk)x2``) and the choice otherwise (``auto/topka``,
   ``auto/gssgd/<its wire revision>``), so ranks that would run different algorithms raise
   instead of exchanging mismatched messages.

A measured choice depends on this run's timings: two runs of one script may keep different
algorithms (as two ping-pong fits may differ). ``alpha``, ``beta`` and ``tune=0`` make the
choice a function of (P, N, k) alone. Checkpoints (per rank: the trial times are this rank's
clock): a state saved after the trials holds the choice, and the resumed run continues
bit-identically to the uninterrupted one; a state saved while tuning holds the fit, the shortlist,
the trial position, this rank's times so far and the candidates' states, and the resumed run
continues the trials in the same order (its trial calls are bit-identical) but times the
remaining ones in the new processes, so its decision -- the same on every rank -- may keep
another candidate than the uninterrupted run would have (docs/scale.md, "auto and
checkpoints"). A state saved before the tensor's first call holds no fit unless one was
carried from another bucket; the resumed run then measures its own ping-pong.

``last_stats`` gets ``auto_choice`` (the algorithm this call ran), ``auto_tuning`` (whether
it was a trial), ``auto_predicted_s`` (the model's time of it), ``auto_measured_s`` (the
call's wall time), ``auto_trials`` (once decided: each shortlisted candidate's measured
seconds, slowest rank), ``auto_alpha`` and ``auto_beta``. The choice and
the chosen algorithm's state are in ``state_dict()``: a resumed reducer keeps the choice (no
new ping-pong, no new decision for the same N and k).

The tables (candidates, compute and codec costs) are :mod:`sparsecomm.tune.tables`, the
predictions and the shortlist :mod:`sparsecomm.tune.chooser`, the ping-pong
:mod:`sparsecomm.tune.links`; this module is the algorithm that runs the choice. On a cluster of
nodes, :meth:`AutoAlgorithm.choose_placement` is what ``SparseAllreduce(...,
hierarchy="auto")`` decides flat against two-level with (docs/scale.md, "Two-level clusters").

Options: ``alpha``, ``beta`` (None: ping-pong), ``candidates`` (a tuple of algorithm names;
default :data:`CANDIDATES`), ``compute`` (None or a dict name -> ns per element), ``tune``
(calls per shortlisted candidate, default 2: the first of a candidate's calls also pays its
first-call costs, so the better of two is kept; 0: the model alone decides), ``shortlist``
(most candidates measured, default 4: at P = 4, 0.1% the model ranked the fastest, topka, fourth), ``margin`` (only candidates predicted within this
factor of the cheapest, default 2.0: the model's largest miss in docs/scale.md was 1.6x) and
``codecs`` (default True: the default candidates include the codec variants of topka and spardl).

Codec variants. A candidate ``base+codec[+codec]`` (``topka+delta_binary``,
``spardl+delta_binary+skcompress``) is ``base`` with those COO codecs (docs/skcompress.md). Its
prediction: the plain schedule with every message's bytes times the codec's measured ratio, each
message variable-size (:meth:`~sparsecomm.traffic.Traffic.coded`), plus the plain compute and the
codec's own (:func:`codec_seconds`: :data:`CODEC_COST`'s encode and decode ns per nonzero and
us per message). A variant is a candidate only where it is predicted faster than its plain
algorithm: on links slow enough for the bytes saved to pay for the coding.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch

from ..algorithms import Algorithm, get, modelled, register
from ..options import Option
from ..traffic import Links
from .chooser import choose_algorithm, choose_layout, shortlist
from .links import link_fit, measure_links
from .tables import (CANDIDATES, CODEC_BASES, CODEC_COST, CODEC_SHARE, CODEC_VARIANTS, COMPUTE_NS, codec_seconds,
                     compute_ns, split_variant, variant_options, with_codec_variants)

# the tables and choosers keep their names here too: ``from sparsecomm.algorithms.auto import ...``
# has always reached them through this module
__all__ = ["AutoAlgorithm", "choose_algorithm", "choose_layout", "measure_links", "shortlist", "CANDIDATES",
           "COMPUTE_NS", "CODEC_COST", "CODEC_SHARE", "CODEC_VARIANTS", "CODEC_BASES", "split_variant",
           "variant_options", "with_codec_variants", "codec_seconds", "compute_ns"]

#: the clock of the trial calls (a module attribute so that tests can see which call was timed)
_clock = time.perf_counter


def _is_cost(value: Any) -> bool:
    """A finite number >= 0 (of nanoseconds per element), not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


@register
class AutoAlgorithm(Algorithm):
    name = "auto"
    lossless = False   # the instance says what its choice is
    option_specs = {
        "alpha": Option(None, float, min=0, none_doc="measured by a ping-pong", doc="seconds per message",
                        label="option alpha"),
        "beta": Option(None, float, min=0, none_doc="measured by a ping-pong", doc="seconds per byte",
                       label="option beta"),
        "candidates": Option(None, (tuple, list), check=lambda names, options: bool(names),
                             what="a non-empty tuple of algorithm names", label="option candidates"),
        "compute": Option(None, dict, check=lambda table, options: all(map(_is_cost, table.values())),
                          what="None or a dict name -> ns per element (finite, >= 0)", label="option compute"),
        "tune": Option(2, int, min=0, max=1000, label="option tune"),
        "shortlist": Option(4, int, min=1, max=1000, label="option shortlist"),
        "margin": Option(2.0, float, min=1, doc="a factor of the cheapest prediction", label="option margin"),
        "codecs": Option(True, bool, doc="add the codec variants of topka and spardl to the default candidates",
                         label="option codecs"),
    }

    @classmethod
    def check_options(cls, options: dict[str, Any]) -> None:
        if (options["alpha"] is None) != (options["beta"] is None):
            raise ValueError("auto: give both alpha and beta, or neither (then a ping-pong measures both)")
        if options["candidates"] is not None:
            bad = [c for c in options["candidates"] if c == "auto" or split_variant(c)[0] not in modelled()
                   or (split_variant(c)[1] and split_variant(c)[0] not in CODEC_BASES)]
            if bad:
                raise ValueError(f"auto: candidates {bad} cannot be chosen; choose among {', '.join(modelled())}, "
                                 f"and codec variants ('+delta_binary', '+skcompress', both) of "
                                 f"{', '.join(CODEC_BASES)}")
            for c in options["candidates"]:
                variant_options(c)

    def __init__(self, comm, **options: Any):
        super().__init__(comm, **options)
        if self.options["candidates"] is not None:
            self.options["candidates"] = tuple(self.options["candidates"])
        self.choice: str | None = None          # the kept algorithm, once decided
        self.inner: Algorithm | None = None     # the instance the next call runs
        self.decision: dict[str, Any] = {}
        self.instances: dict[str, Algorithm] = {}
        self.trials: list[str] = []             # while tuning: the shortlist; [] once decided
        self.trial_call = 0                      # trial calls made
        self.trial_times: dict[str, list[float]] = {}   # this rank's seconds per trial call
        self.measured: dict[str, float] = {}    # after tuning: the slowest rank's best per candidate
        self.settling = False                   # the first call at a new k: run, do not time
        self._pending: dict[str, Any] | None = None
        self._carried_fit: tuple[float, float] | None = None

    # -- what the reducer asks before a call: the instance that will run decides -----------
    @property
    def times(self) -> dict[str, float]:
        return self._times

    @times.setter
    def times(self, value: dict[str, float]) -> None:
        # the reducer resets ``times`` at the start of every call: until reduce runs, this call
        # ran nothing (the non-finite path skips reduce), so last_stats must not repeat the last
        self._times = value
        self.ran, self.ran_trial, self.ran_undecided = None, False, False

    @property
    def tuning(self) -> bool:
        return bool(self.trials)

    @property
    def wire_revision(self) -> str:   # the handshake's algorithm field names the choice
        def named(name: str) -> str:
            rev = self._instance(name).wire_revision
            return name + (f"/{rev}" if rev else "")
        if self.tuning:
            return f"tune({'+'.join(named(n) for n in self.trials)})x{self.options['tune']}"
        if self.choice:
            return named(self.choice)
        # before the first decision (the reducer's first handshake, before prepare): whether
        # prepare will measure a ping-pong or reuse a saved decision or fit -- ranks that differ
        # here would exchange mismatched messages inside prepare, so they must differ in the
        # handshake first (one rank resumed from a checkpoint, the others fresh)
        if self._pending:   # which decision: ranks resumed from different checkpoints differ here
            p = self._pending
            what = p["choice"] if "choice" in p else f"tune{p['tuning']['calls']}"
            return f"resumed({p['n']},{p['k']},{what})"
        return "carried-fit" if self._carried_fit is not None else ""

    @property
    def propagates_nonfinite(self) -> bool:   # dense's non-finite policy when dense runs next
        return self.inner is not None and self.inner.propagates_nonfinite

    def takes_grad(self) -> bool:              # the fused add when the next candidate fuses
        return self.inner is not None and self.inner.takes_grad()

    def layout_candidates(self) -> tuple[tuple[str, ...], dict[str, float] | None]:
        """Its candidates (codec variants are weighed flat only) and its compute table."""
        return self.options["candidates"] or CANDIDATES, self.options["compute"]

    def placed_between_nodes(self, links: Links, ranks_per_node: int) -> None:
        """Start from the measured network link with each rank's share of the node's NIC (beta
        times the ranks per node), as a carried fit: no ping-pong of its own."""
        self.load_state_dict({"alpha": links.alpha, "beta": links.beta * ranks_per_node})

    def _instance(self, name: str) -> Algorithm:
        if name not in self.instances:
            self.instances[name] = get(split_variant(name)[0])(self.comm, **variant_options(name))
        return self.instances[name]

    def _next_trial(self) -> str:
        return self.trials[self.trial_call // self.options["tune"]]

    # -- deciding ------------------------------------------------------------------------
    def prepare(self, n: int, k: int, dtype: torch.dtype) -> None:
        """Decide for a tensor of n elements (called by the reducer before its handshake, on
        every rank; may communicate)."""
        if self.inner is not None and self.decision.get("n") == n and self.decision.get("k") == k:
            return
        pending = self._pending
        if pending and pending.get("n") == n:
            # a saved decision for this tensor; saved at another k (a density schedule's step), it is
            # then the decision a k change starts from, as in the run that saved it
            self._pending = None
            self._restore(pending)
            if self.decision["k"] == k:
                return
        comm = self.comm
        alpha, beta = self.options["alpha"], self.options["beta"]
        same_n = self.inner is not None and self.decision.get("n") == n
        if same_n:   # only k changed (a density schedule): the fit stands, no collective here
            alpha, beta = self.decision["alpha"], self.decision["beta"]
        elif alpha is None and self._carried_fit is not None:
            alpha, beta = self._carried_fit
        elif alpha is None:
            alpha, beta = link_fit(comm)
        candidates = self._candidates()
        pick = choose_algorithm(comm.size, n, k, float(alpha), float(beta), candidates=candidates,
                                compute=self.options["compute"], dtype=dtype,
                                size_rounds=comm.sizes_take_a_round(bounded=True))
        short = shortlist(pick["predictions"], candidates, self.options["shortlist"], self.options["margin"])
        self.decision = {"n": n, "k": k, "alpha": float(alpha), "beta": float(beta),
                         "predictions": {name: pick["predictions"][name] for name in short}}
        # same n: the shortlisted candidates' adaptive state carries over a new k; the others go
        # (a tuning record holds the state of the shortlist only)
        self.instances = {name: inst for name, inst in self.instances.items() if same_n and name in short}
        self.trial_call, self.trial_times, self.measured = 0, {}, {}
        if self.options["tune"] and len(short) > 1:
            self.trials, self.choice, self.lossless = short, None, False
            self.inner = self._instance(short[0])
            # while a density schedule moves k every call, trials at different k would not compare:
            # the first call at a new k runs the model's pick untimed, trials start once k holds
            self.settling = same_n
        else:
            self._keep(short[0])

    def _keep(self, choice: str) -> None:
        self.trials, self.choice, self.settling = [], choice, False
        self.inner = self._instance(choice)
        self.instances = {choice: self.inner}   # the others' state is of no further use
        self.lossless = self.inner.lossless

    def _decide(self) -> None:
        """After the last trial call, on every rank: all-gather each rank's best time per
        candidate; a candidate costs what its slowest rank measured; keep the fastest."""
        mine = torch.tensor([min(self.trial_times[name]) for name in self.trials], dtype=torch.float64,
                            device="cpu")
        table = self.comm.allgather_small(mine).cpu().view(-1, len(self.trials))
        slowest = table.amax(0).tolist()
        best = min(range(len(self.trials)), key=lambda i: (slowest[i], i))
        self.measured = dict(zip(self.trials, slowest))
        self._keep(self.trials[best])

    def reduce(self, acc: torch.Tensor, k: int, out: torch.Tensor, grad: torch.Tensor | None = None) -> None:
        if self.inner is None or self.decision.get("n") != acc.numel() or self.decision.get("k") != k:
            if grad is not None:   # the reducer fused on a decision made for another tensor
                acc.add_(grad)
                grad = None
            self.prepare(acc.numel(), k, acc.dtype)   # without the reducer: decide here
        inner = self.inner
        inner.times = self.times
        inner.last_nnz = None
        if grad is not None and not inner.takes_grad():
            acc.add_(grad)
            grad = None
        self.ran_undecided = self.tuning
        self.ran_trial = self.tuning and not self.settling
        self.ran = self.choice if not self.tuning else (self.trials[0] if self.settling else self._next_trial())
        self.settling = False
        start = _clock()
        if grad is None:
            inner.reduce(acc, k, out)
        else:
            inner.reduce(acc, k, out, grad=grad)
        spent = _clock() - start
        self.last_nnz = inner.last_nnz
        if self.ran_trial:
            self.trial_times.setdefault(self.ran, []).append(spent)
            self.trial_call += 1
            if self.trial_call == self.options["tune"] * len(self.trials):
                self._decide()
            else:
                self.inner = self._instance(self._next_trial())

    def stats_extra(self, total_s: float) -> dict[str, Any]:
        """Added to the reducer's ``last_stats``."""
        return {"auto_choice": self.ran, "auto_tuning": self.ran_undecided,
                "auto_predicted_s": self.decision.get("predictions", {}).get(self.ran),
                "auto_measured_s": total_s, "auto_trials": dict(self.measured) if self.measured else None,
                "auto_alpha": self.decision.get("alpha"), "auto_beta": self.decision.get("beta")}

    # -- checkpoints -----------------------------------------------------------------------
    _DECISION_KEYS = ("n", "k", "alpha", "beta", "predictions")

    def state_dict(self) -> dict[str, Any]:
        if self.inner is None:   # not run yet: what it was given (a saved decision, a carried fit)
            if self._pending:
                return dict(self._pending)
            return {"alpha": self._carried_fit[0], "beta": self._carried_fit[1]} if self._carried_fit else {}
        state = {key: self.decision[key] for key in self._DECISION_KEYS}
        if self.tuning:
            state["tuning"] = {"shortlist": list(self.trials), "tune": self.options["tune"],
                               "calls": self.trial_call, "settling": self.settling,
                               "times": {name: list(t) for name, t in self.trial_times.items()},
                               "states": {name: inst.state_dict() for name, inst in self.instances.items()}}
        else:
            state.update(choice=self.choice, measured=dict(self.measured), inner=self.inner.state_dict())
        return state

    @classmethod
    def carried_state(cls, state: dict[str, Any]) -> dict[str, Any]:
        """The alpha-beta fit carries to a rebuilt bucket, so its decision does not depend on a
        new ping-pong (a resumed run decides as the uninterrupted one)."""
        return {"alpha": state["alpha"], "beta": state["beta"]} if "alpha" in state else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not state:
            return
        if set(state) == {"alpha", "beta"}:   # carried from another bucket
            self._carried_fit = (float(state["alpha"]), float(state["beta"]))
            return
        missing = set(self._DECISION_KEYS) - set(state)
        if missing or ("choice" in state) == ("tuning" in state):
            raise ValueError(f"auto: a state_dict holds {', '.join(self._DECISION_KEYS)} and either a choice or "
                             f"a tuning record; got keys {sorted(state)}")
        if "choice" in state:
            if state["choice"] not in self._candidates():
                raise ValueError(f"auto: the state_dict's choice {state['choice']!r} is not among this reducer's "
                                 f"candidates ({', '.join(self._candidates())}): it belongs to another configuration")
        else:
            self._check_tuning(state["tuning"])
        self.inner, self.choice, self.decision, self.trials = None, None, {}, []
        self._pending = dict(state)

    def _candidates(self) -> tuple[str, ...]:
        if self.options["candidates"]:   # as given: codec variants are named there
            return self.options["candidates"]
        return with_codec_variants(CANDIDATES) if self.options["codecs"] else CANDIDATES

    def _check_tuning(self, tuning: Any) -> None:
        """A tuning record must be one this reducer could have written: its shortlist among
        the candidates, and exactly one time per trial call made so far."""
        ok = isinstance(tuning, dict) and {"shortlist", "tune", "calls", "times", "states"} <= set(tuning)
        if ok:
            short, tune, calls = tuning["shortlist"], tuning["tune"], tuning["calls"]
            ok = (isinstance(short, list) and 1 < len(short) <= self.options["shortlist"]
                  and len(set(short)) == len(short) and all(n in self._candidates() for n in short)
                  and tune == self.options["tune"] and type(calls) is int and 0 <= calls < tune * len(short)
                  and isinstance(tuning.get("settling", False), bool)
                  and isinstance(tuning["times"], dict) and isinstance(tuning["states"], dict)
                  and set(tuning["states"]) <= set(short))
            if ok:
                made = {name: min(max(calls - i * tune, 0), tune) for i, name in enumerate(short)}
                ok = all(name in short and isinstance(t, list) and len(t) == made[name]
                         and all(isinstance(x, float) and math.isfinite(x) and x >= 0 for x in t)
                         for name, t in tuning["times"].items()) \
                    and all(len(tuning["times"].get(name, [])) == count for name, count in made.items())
        if not ok:
            raise ValueError("auto: the state_dict's tuning record is malformed or was made with another tune= "
                             f"(this reducer has tune={self.options['tune']}): {tuning!r}"[:400])

    def _restore(self, state: dict[str, Any]) -> None:
        self.decision = {key: state[key] for key in self._DECISION_KEYS}
        self.instances, self.measured = {}, {}
        if "choice" in state:
            self._keep(state["choice"])
            self.measured = dict(state.get("measured", {}))
            self.inner.load_state_dict(state.get("inner", {}))
            return
        tuning = state["tuning"]
        self.trials, self.choice = list(tuning["shortlist"]), None
        self.trial_call = tuning["calls"]
        self.settling = tuning.get("settling", False)
        self.lossless = False
        self.trial_times = {name: list(t) for name, t in tuning["times"].items()}
        for name, inner_state in tuning["states"].items():
            self._instance(name).load_state_dict(inner_state)
        self.inner = self._instance(self._next_trial())
