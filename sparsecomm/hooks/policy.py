"""Which parameters a hook compresses, and how: a per-parameter :class:`Policy`.

Compressing biases, normalization layers and other small tensors like large weight matrices
saves little and can cost accuracy: Deep Gradient Compression and most work after it leave
them dense, and users of compression hooks ask to exclude layers by name or below a size (the
minimum compression gain of PyTorch's PowerSGD hook, ``min_compression_rate``). A policy maps
each parameter, by its qualified name, the type of the module that owns it, its number of
elements and dimensions, to a *treatment*:

* ``"dense"``: the parameter's gradient goes through the backend's dense allreduce, averaged as
  DDP averages (no residual, no compression);
* ``"default"``: the hook state's algorithm, density and options;
* a :class:`Treatment`: another algorithm, density or options (for example a denser embedding).

The rules are tried in order, the first that matches decides; then the built-in defaults
(``dense_1d``: every parameter of at most one dimension -- biases, normalization weights --
dense; ``dense_below``: every parameter of fewer elements dense); then ``"default"``::

    policy = sparsecomm.Policy([
        sparsecomm.Rule("dense", name="*.embedding.*"),
        sparsecomm.Rule(sparsecomm.Treatment("topka", density=0.05), name="decoder.*"),
        sparsecomm.Rule("dense", module=torch.nn.LayerNorm),
    ])
    state = sparsecomm.DDPHookState("topka", 0.01, policy=policy)
    sparsecomm.register(model, state)        # names and modules come from the model

A policy is a value: compared by its canonical text (:meth:`Policy.text`), which the hook puts in
its agreement and its checkpoint. Module types are kept by their qualified class names, so a
policy pickles and compares across processes; a parameter matches ``module=`` when the module
that owns it is an instance of that class (its class or a base class has that name).
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from typing import Any

import torch

from .. import algorithms
from ..reduce import check_density

__all__ = ["DEFAULT_DENSE_BELOW", "Policy", "Rule", "Treatment", "ParameterInfo", "parameter_infos"]

#: the built-in size threshold: parameters of fewer elements go dense. Sending 4096 float32 values
#: densely costs what sending about 1000 (index, value) pairs costs: a tensor that small gains at
#: most a few kB per step from compression, and small layers (the classifier of a narrow head, a
#: convolution's few filters) are where dropped coordinates cost accuracy
DEFAULT_DENSE_BELOW = 4096

#: treatment names that are not a Treatment object
DENSE, DEFAULT = "dense", "default"


@dataclass(frozen=True)
class Treatment:
    """An algorithm, density and options for the parameters a rule selects (None: the hook
    state's). Options are the algorithm's own, checked here."""

    algorithm: str | None = None
    density: float | None = None
    options: tuple[tuple[str, Any], ...] = field(default=())

    def __init__(self, algorithm: str | None = None, density: float | None = None, **options: Any):
        if algorithm is not None:
            algorithms.get(algorithm)   # a clear error naming the registered ones
        if density is not None:
            check_density(density)
            density = float(density)
        object.__setattr__(self, "algorithm", algorithm)
        object.__setattr__(self, "density", density)
        object.__setattr__(self, "options", tuple(sorted(options.items())))
        if algorithm is not None:
            algorithms.get(algorithm)(None, **dict(self.options))   # the algorithm's own checks

    def text(self) -> str:
        """``"spardl density=0.05 teams=2"``; the parts it leaves to the state are not named
        (``"density=0.05"``; ``"default"`` when it sets nothing)."""
        parts = [self.algorithm] if self.algorithm else []
        if self.density is not None:
            parts.append(f"density={self.density!r}")
        parts += [f"{key}={value!r}" for key, value in self.options]
        return " ".join(parts) or DEFAULT

    def to_state(self) -> dict[str, Any]:
        return {"algorithm": self.algorithm, "density": self.density, "options": dict(self.options)}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> "Treatment":
        return cls(state.get("algorithm"), state.get("density"), **state.get("options", {}))


def _treatment(value: Any) -> "str | Treatment":
    if isinstance(value, Treatment):
        return value
    if value in (DENSE, DEFAULT):
        return value
    if value is None:
        return DEFAULT
    if isinstance(value, dict):   # a saved Treatment.to_state(), or Treatment's own arguments
        if set(value) <= {"algorithm", "density", "options"} and isinstance(value.get("options", {}), dict):
            return Treatment.from_state(value)
        return Treatment(**value)
    raise ValueError(f"a policy's treatment is 'dense', 'default' (the state's algorithm) or a sparsecomm.Treatment"
                     f"(algorithm, density, **options); got {value!r}")


def _class_name(cls: Any) -> str:
    if isinstance(cls, str):
        if not cls:
            raise ValueError("Rule(module=...): an empty class name")
        return cls
    if isinstance(cls, type):
        return f"{cls.__module__}.{cls.__qualname__}"
    raise ValueError(f"Rule(module=...) takes a module class (torch.nn.LayerNorm) or its qualified name, got {cls!r}")


@dataclass(frozen=True)
class Rule:
    """Parameters that match every condition given get ``treatment``: ``name`` (an fnmatch
    pattern on the qualified name, as ``model.named_parameters()`` gives it without DDP's
    ``module.`` prefix), ``module`` (the owning module is an instance of this class, or of one of
    these), ``below`` (fewer elements than this), ``max_ndim`` (at most this many dimensions).
    A rule with no condition matches every parameter."""

    treatment: Any
    name: str | None = None
    module: Any = None
    below: int | None = None
    max_ndim: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "treatment", _treatment(self.treatment))
        if self.name is not None and (not isinstance(self.name, str) or not self.name):
            raise ValueError(f"Rule(name=...) is an fnmatch pattern such as '*.bias', got {self.name!r}")
        if self.module is not None:
            classes = self.module if isinstance(self.module, (tuple, list)) else (self.module,)
            object.__setattr__(self, "module", tuple(sorted(_class_name(c) for c in classes)))
        for key in ("below", "max_ndim"):
            value = getattr(self, key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ValueError(f"Rule({key}=...) must be an integer >= 0, got {value!r}")

    @property
    def needs_model(self) -> bool:
        return self.name is not None or self.module is not None

    def matches(self, info: "ParameterInfo") -> bool:
        if self.name is not None and (info.name is None or not fnmatch.fnmatchcase(info.name, self.name)):
            return False
        if self.module is not None and not set(self.module) & set(info.classes):
            return False
        if self.below is not None and not info.numel < self.below:
            return False
        return self.max_ndim is None or info.ndim <= self.max_ndim

    def text(self) -> str:
        when = [f"{key}={getattr(self, key)!r}" for key in ("name", "module", "below", "max_ndim")
                if getattr(self, key) is not None]
        what = self.treatment.text() if isinstance(self.treatment, Treatment) else self.treatment
        return f"{' '.join(when) or 'any'} -> {what}"


@dataclass(frozen=True)
class ParameterInfo:
    """What a policy sees of one parameter (name and classes only where the model is known)."""

    numel: int
    ndim: int
    name: str | None = None
    classes: tuple[str, ...] = ()


def unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    """The user's module inside the wrappers that hold it: DDP's (``.module``), torch.compile's
    (``._orig_mod``) and Lightning's (its DDP holds a ``_LightningModuleWrapperBase`` whose
    ``_forward_module`` is the LightningModule). By type, so a submodule the user named
    ``module`` keeps its name."""
    while True:
        if isinstance(model, torch.nn.parallel.DistributedDataParallel):
            model = model.module
        elif type(model).__name__ == "OptimizedModule" and isinstance(getattr(model, "_orig_mod", None),
                                                                     torch.nn.Module):
            model = model._orig_mod
        elif type(model).__name__.endswith("LightningModuleWrapperBase") and \
                isinstance(getattr(model, "_forward_module", None), torch.nn.Module):
            model = model._forward_module
        else:
            return model


def parameter_infos(model: torch.nn.Module) -> dict[int, ParameterInfo]:
    """id(parameter) -> its :class:`ParameterInfo`: its name as the user's module (inside the
    wrappers, :func:`unwrapped`) names it, and the classes of the module that owns it, with their
    bases."""
    infos: dict[int, ParameterInfo] = {}
    for module_name, module in unwrapped(model).named_modules(remove_duplicate=False):
        classes = tuple(_class_name(c) for c in type(module).__mro__ if c is not object)
        for name, param in module.named_parameters(prefix=module_name, recurse=False, remove_duplicate=False):
            if id(param) not in infos:   # a shared parameter: its first owner, as named_parameters()
                infos[id(param)] = ParameterInfo(param.numel(), param.dim(), name, classes)
    return infos


class Policy:
    """The rules and defaults of the module docstring.

    Args:
        rules: :class:`Rule` objects, tried in order; the first that matches decides.
        dense_1d: after the rules, parameters of at most one dimension go dense (default True).
        dense_below: after the rules, parameters of fewer elements go dense
            (default :data:`DEFAULT_DENSE_BELOW`; 0: none).
    """

    def __init__(self, rules: Any = (), dense_1d: bool = True, dense_below: int = DEFAULT_DENSE_BELOW):
        if isinstance(rules, Rule):
            rules = (rules,)
        rules = tuple(rules)
        bad = [r for r in rules if not isinstance(r, Rule)]
        if bad:
            raise ValueError(f"Policy(rules=...) takes sparsecomm.Rule objects, got {bad[0]!r}")
        if not isinstance(dense_1d, bool):
            raise ValueError(f"dense_1d must be True or False, got {dense_1d!r}")
        if isinstance(dense_below, bool) or not isinstance(dense_below, int) or dense_below < 0:
            raise ValueError(f"dense_below must be an integer >= 0 (0: no size rule), got {dense_below!r}")
        self.rules, self.dense_1d, self.dense_below = rules, dense_1d, dense_below

    @property
    def needs_model(self) -> bool:
        """Whether a rule matches by name or module type (the hook must know the model)."""
        return any(rule.needs_model for rule in self.rules)

    def treatment(self, info: ParameterInfo) -> "str | Treatment":
        """``"dense"``, ``"default"`` or a :class:`Treatment` for one parameter."""
        for rule in self.rules:
            if rule.matches(info):
                return rule.treatment
        if self.dense_1d and info.ndim <= 1:
            return DENSE
        if info.numel < self.dense_below:
            return DENSE
        return DEFAULT

    def text(self) -> str:
        """The canonical text the agreement and the checkpoint compare."""
        rules = "; ".join(rule.text() for rule in self.rules)
        return f"rules [{rules}], dense_1d={self.dense_1d}, dense_below={self.dense_below}"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Policy) and other.text() == self.text()

    def __hash__(self) -> int:
        return hash(self.text())

    def __repr__(self) -> str:
        return f"Policy({self.text()})"

    def to_state(self) -> dict[str, Any]:
        return {"rules": [{"treatment": r.treatment.to_state() if isinstance(r.treatment, Treatment) else r.treatment,
                           "name": r.name, "module": None if r.module is None else list(r.module),
                           "below": r.below, "max_ndim": r.max_ndim} for r in self.rules],
                "dense_1d": self.dense_1d, "dense_below": self.dense_below}

    @classmethod
    def from_state(cls, state: Any) -> "Policy":
        if isinstance(state, Policy):
            return state
        if not isinstance(state, dict):
            raise ValueError(f"a saved policy is a dict (Policy.to_state()), got {type(state).__name__}")
        rules = [Rule(r["treatment"], name=r.get("name"), module=r.get("module"), below=r.get("below"),
                      max_ndim=r.get("max_ndim")) for r in state.get("rules", [])]
        return cls(rules, dense_1d=state.get("dense_1d", True), dense_below=state.get("dense_below",
                                                                                       DEFAULT_DENSE_BELOW))


def as_policy(value: Any) -> Policy | None:
    """None (every parameter through the state's algorithm), a :class:`Policy`, ``"default"``
    (``Policy()``: its built-in rules), or a saved :meth:`Policy.to_state`."""
    if value is None:
        return None
    if value == "default":
        return Policy()
    if isinstance(value, (Policy, dict)):
        return Policy.from_state(value)
    raise ValueError(f"policy must be None (compress every parameter), 'default' (1-D parameters and parameters of "
                     f"fewer than {DEFAULT_DENSE_BELOW} elements dense) or a sparsecomm.Policy; got {value!r}")
