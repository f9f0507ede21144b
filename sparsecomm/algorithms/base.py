"""What every algorithm module implements, and the registry that finds them by name.

An algorithm is a class registered with :func:`register`. The reducer constructs it once
per tensor with the Comm and the user's keyword options, and calls :meth:`Algorithm.reduce`
on every step with

* ``acc`` -- this rank's gradient plus the residual carried in (1-D, working dtype). The
  algorithm leaves in ``acc``, in place, exactly what it did not let through: that is the
  residual carried to the next step (error feedback). ``acc`` is the reducer's own buffer,
  so keeping the residual there costs no allocation.
* ``k`` -- how many elements each rank selects (k = max(1, ceil(density * N)), at most N).
* ``out`` -- a dense buffer of the same length and dtype; the algorithm overwrites all of
  it with the reduced result, which must be bit-identical on every rank.

Each algorithm declares its keyword options once, as :class:`~sparsecomm.options.Option`
values in :attr:`Algorithm.option_specs`; the base constructor checks every given value
against them (one kind of error message, :func:`sparsecomm.options.check_declared`) and, for
algorithms with COO messages (:attr:`Algorithm.uses_coo_codec`), takes the codec options too
and builds ``self.codec``. Constructors only validate options and must not communicate (they
may be given ``comm=None`` for validation). An algorithm must only use
:class:`~sparsecomm.comm.Comm`, :mod:`sparsecomm.ops`, :mod:`sparsecomm.formats` and
:mod:`sparsecomm.options`.

Each algorithm also writes down its message schedule, sizes only, as the classmethod
:meth:`Algorithm.traffic` beside its ``reduce()``; :func:`traffic` finds it by name (the cost
model, :mod:`sparsecomm.costmodel`, and ``auto`` use it) and :func:`modelled` lists the
algorithms that have one.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from contextlib import contextmanager
from typing import Any, ClassVar, Iterator, Mapping

import torch

from .. import ops
from ..comm.base import Comm
from ..traffic import IndexSets, Traffic, default_sets
from ..formats.codec import CODEC_OPTIONS, CooCodec
from ..options import Option, check_declared

__all__ = ["Algorithm", "register", "names", "get", "traffic", "modelled", "TRAFFIC_MODELS"]

_REGISTRY: dict[str, type["Algorithm"]] = {}


def register(cls: type["Algorithm"]) -> type["Algorithm"]:
    """Class decorator: make an algorithm available by its ``name``."""
    name = cls.name
    if not name or name != name.lower():
        raise ValueError(f"algorithm names are non-empty lower-case strings, got {name!r}")
    if name in _REGISTRY and _REGISTRY[name] is not cls:
        raise ValueError(f"algorithm {name!r} is registered twice")
    _REGISTRY[name] = cls
    return cls


def names() -> list[str]:
    """The registered algorithm names, sorted."""
    return sorted(_REGISTRY)


def get(name: str) -> type["Algorithm"]:
    """The algorithm class registered as ``name``; ValueError listing the choices otherwise."""
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown algorithm {name!r}; choose one of: {', '.join(names())}") from None


#: what an algorithm's :meth:`Algorithm.traffic` gives: ``"exact"`` (sizes do not depend on
#: the data: exact for any input), ``"set-based"`` (exact given the ranks' index sets) or
#: ``"estimated"`` (an estimate; the cost model's tests bound its error)
TRAFFIC_MODELS = ("exact", "set-based", "estimated")


def modelled(kind: str | None = None) -> list[str]:
    """The registered algorithms with a :meth:`Algorithm.traffic` (of ``kind``, one of
    :data:`TRAFFIC_MODELS`, when given), sorted."""
    if kind is not None and kind not in TRAFFIC_MODELS:
        raise ValueError(f"modelled: kind must be one of {', '.join(TRAFFIC_MODELS)} or None, got {kind!r}")
    return sorted(name for name, cls in _REGISTRY.items()
                  if cls.traffic_model and (kind is None or cls.traffic_model == kind))


def traffic(name: str, P: int, N: int, k: int, sets: IndexSets | None = None,
            dtype: torch.dtype = torch.float32, *, size_rounds: bool = True, **options: Any) -> Traffic:
    """The :class:`~sparsecomm.traffic.Traffic` of one call of ``name`` on ``P`` ranks (``k``
    selected per rank, length ``N``): its :meth:`Algorithm.traffic`.

    ``sets`` (the ranks' selected indices) is needed by the set-based message schedules and some
    estimates; when missing, :func:`~sparsecomm.traffic.default_sets` draws them (at most 2^20
    long, scaled to N). ``size_rounds``: whether each variable-size round is preceded by a round
    of sizes, as on a Comm where :meth:`~sparsecomm.comm.base.Comm.sizes_take_a_round` (NCCL,
    calls outside a reducer); False gives :meth:`~sparsecomm.traffic.Traffic.unsized` (gloo and
    the simulated world inside a reducer call, MPI)."""
    cls = get(name)
    if not cls.traffic_model:
        raise ValueError(f"no traffic model for {name!r}; modelled: {', '.join(modelled())}")
    if P < 1 or N < 0 or k < 0:
        raise ValueError(f"traffic: need P >= 1, N >= 0, k >= 0; got P={P}, N={N}, k={k}")
    if sets is None and cls.traffic_needs_sets:
        sets = default_sets(P, N, k)
    t = cls.traffic(P, N, k, sets, dtype, **options)
    return t if size_rounds else t.unsized()


class Algorithm(ABC):
    """Base class of the sparse allreduce algorithms."""

    #: registry name
    name: ClassVar[str] = ""
    #: True when out is exactly the dense sum of the locally selected vectors
    lossless: ClassVar[bool] = True
    #: what else the ranks must share beyond name and options, e.g. a sketch's hash family
    #: (part of the reducer's handshake: ranks on builds that differ here refuse to reduce);
    #: an instance with a coded COO codec appends the codec's (:attr:`CooCodec.wire_revision`)
    wire_revision: ClassVar[str] = ""
    #: True when the algorithm is itself the dense allreduce of ``acc`` with a zero residual:
    #: NaN and Inf reach its result exactly as in a dense sum, so under the reducer's
    #: ``nonfinite="propagate"`` the finiteness check and its flag round are skipped
    propagates_nonfinite: ClassVar[bool] = False
    #: the keyword options the constructor accepts, declared once: default, type, range,
    #: choices (the codec options are added when :attr:`uses_coo_codec`)
    option_specs: ClassVar[dict[str, Option]] = {}
    #: the accepted options with their defaults (made from :attr:`option_specs`)
    option_defaults: ClassVar[dict[str, Any]] = {}
    #: True when the algorithm sends COO messages through a :class:`~sparsecomm.formats.codec.CooCodec`:
    #: it takes the codec options (:data:`~sparsecomm.formats.codec.CODEC_OPTIONS`) and the base
    #: constructor builds ``self.codec`` from them (a lossy value codec makes the instance lossy)
    uses_coo_codec: ClassVar[bool] = False
    #: codec options the algorithm sets itself rather than taking them from the user
    fixed_codec_options: ClassVar[dict[str, Any]] = {}
    #: True when :meth:`reduce` takes ``grad=``: the reducer then hands over ``acc`` without
    #: the gradient and the algorithm adds it itself, fused with its first selection
    #: (:func:`sparsecomm.ops.topk_accum_`: one pass over the residual and the gradient
    #: instead of an add pass and a selection pass)
    fuses_add: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any):
        super().__init_subclass__(**kwargs)
        specs = {key: spec for key, spec in cls.option_specs.items() if key not in cls.fixed_codec_options}
        if cls.uses_coo_codec:
            specs.update((key, spec) for key, spec in CODEC_OPTIONS.items()
                         if key not in cls.fixed_codec_options and key not in specs)
        cls.option_specs = specs
        cls.option_defaults = {key: spec.default for key, spec in specs.items()}

    def __init__(self, comm: Comm, **options: Any):
        self.comm = comm
        self.options = self.resolve_options(options)
        self.times: dict[str, float] = {}
        #: entries let through by the last call (the result's support), when known cheaply
        self.last_nnz: int | None = None
        if self.uses_coo_codec:
            self.codec = CooCodec({**self.options, **self.fixed_codec_options})
            self.lossless = self.lossless and self.codec.lossless
            if self.codec.wire_revision:   # the coded bodies' layout is shared too
                self.wire_revision = "/".join(r for r in (type(self).wire_revision, self.codec.wire_revision) if r)

    @classmethod
    def resolve_options(cls, options: Mapping[str, Any]) -> dict[str, Any]:
        """``options`` with the defaults of those not given, every value checked against
        :attr:`option_specs` and :meth:`check_options`: ValueError naming the algorithm, the
        option and what to give otherwise. Values are not changed."""
        unknown = sorted(set(options) - set(cls.option_specs))
        if unknown:
            accepted = ", ".join(sorted(cls.option_specs)) or "none"
            raise ValueError(f"algorithm {cls.name!r} does not take option(s) {', '.join(unknown)}; "
                             f"accepted options: {accepted}")
        merged = {**cls.option_defaults, **options}
        check_declared(cls.name, cls.option_specs, merged)
        cls.check_options(merged)
        return merged

    @classmethod
    def check_options(cls, options: dict[str, Any]) -> None:
        """ValueError for a combination of (each valid) options that cannot work together and
        that no single :class:`~sparsecomm.options.Option` states. None by default."""

    def check_size(self, size: int) -> None:
        """ValueError if the options cannot work on ``size`` ranks (e.g. spardl's ``teams``).

        For checks a constructor given ``comm=None`` cannot make: :class:`~sparsecomm.DDPHookState`
        calls it once the number of ranks is known, before any message is sent. None by default.
        """

    @abstractmethod
    def reduce(self, acc: torch.Tensor, k: int, out: torch.Tensor) -> None:
        """One step: write the reduced result into ``out`` and leave the residual in ``acc``.

        Algorithms with :attr:`fuses_add` take ``grad=`` too (``reduce(acc, k, out, grad=g)``):
        ``acc`` then holds only the residual and the step begins with ``acc += grad`` (same
        dtype, the bits of ``acc.add_(grad)``), fused with the first selection; ``grad`` is
        read in full before ``out`` is written (``out`` may be ``grad``'s memory)."""

    #: what :meth:`traffic` gives, one of :data:`TRAFFIC_MODELS`; "" when it has none
    traffic_model: ClassVar[str] = ""
    #: True when :meth:`traffic` reads the ranks' index sets (:func:`traffic` draws model sets
    #: when none are given)
    traffic_needs_sets: ClassVar[bool] = False

    @classmethod
    def traffic(cls, P: int, N: int, k: int, sets: IndexSets | None, dtype: torch.dtype,
                **options: Any) -> Traffic:
        """The message schedule of one call, sizes only: every round's messages (peers and
        wire sizes, as :meth:`reduce` sends them on ``P`` ranks, length ``N``, ``k`` selected
        per rank, values of ``dtype``), recorded in a :class:`~sparsecomm.traffic.Traffic`.
        ``sets`` are the ranks' selected indices, for message schedules whose sizes depend on them;
        ``options`` are the constructor's, plus any the message schedule needs to know about the call.
        Written beside :meth:`reduce` in the algorithm's module, from the same size and peer
        computations; ``tests/test_costmodel.py`` compares it with what the Comm counts."""
        raise NotImplementedError(f"algorithm {cls.name!r} has no traffic model (its message schedule, sizes only)")

    def takes_grad(self) -> bool:
        """Whether :meth:`reduce` takes ``grad=`` on this instance: :attr:`fuses_add` is set
        (an instance may turn it off) and the class that defines ``reduce`` set it itself, so a
        subclass that overrides ``reduce`` without opting in gets ``acc`` with the gradient added."""
        if not self.fuses_add:
            return False
        for klass in type(self).__mro__:
            if "reduce" in vars(klass):
                return bool(vars(klass).get("fuses_add", False))
        return False

    def layout_candidates(self) -> tuple[tuple[str, ...], dict[str, float] | None]:
        """What ``hierarchy="auto"`` weighs flat against two-level for this instance: the
        algorithm names whose schedules it predicts and a compute table (ns per element by
        name; None: the measured one). An algorithm is its own one candidate; ``auto`` names
        its candidates."""
        return (self.name,), None

    def placed_between_nodes(self, links: Any, ranks_per_node: int) -> None:
        """Told, as a fresh instance on the inter-node Comm that ``hierarchy="auto"`` chose, the
        cluster's measured links (a :class:`~sparsecomm.traffic.Links`) and how many ranks share
        a node's NIC. Nothing by default; ``auto`` starts from them instead of a new ping-pong."""

    @staticmethod
    def select_topk(acc: torch.Tensor, k: int, grad: torch.Tensor | None, clear: bool,
                    num_blocks: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """``(values, indices)`` of the top-``k`` of ``acc`` (per block with ``num_blocks``),
        after adding ``grad`` into ``acc`` when given (fused); ``clear`` then sets the selected
        entries of ``acc`` to zero (they leave the residual)."""
        if grad is not None:
            return ops.topk_accum_(acc, grad, k, num_blocks=num_blocks, clear=clear)
        values, indices = ops.topk(acc, k) if num_blocks == 1 else ops.block_topk(acc, num_blocks, k)
        if clear:
            acc.index_fill_(0, indices, 0)
        return values, indices

    @contextmanager
    def timed(self, phase: str) -> Iterator[None]:
        """Accumulate wall time of a local phase into :attr:`times`: ``select`` (choosing
        entries), ``residual`` (removing them from ``acc``), ``merge`` (combining received
        vectors) and ``scatter`` (writing the result into ``out``); the phase benchmark
        (:mod:`sparsecomm.bench.phases`) reports them apart."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.times[phase] = self.times.get(phase, 0.0) + time.perf_counter() - start

    def state_dict(self) -> dict[str, Any]:
        """Adaptive state carried between calls (none by default)."""
        return {}

    @classmethod
    def carried_state(cls, state: dict[str, Any]) -> dict[str, Any]:
        """The part of a :meth:`state_dict` that carries over to another tensor (the DDP
        hook's bucket rebuild): counters that belong to no particular tensor, e.g. a step
        that seeds randomness. Adaptive state about the tensor itself does not (none here)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state:
            raise ValueError(f"algorithm {self.name!r} keeps no state, got keys {sorted(state)}")
