"""Declared keyword options: what values an option takes, checked in one place with one message.

An :class:`Option` says what one keyword option accepts: its default, its type, bounds,
choices, whether None is allowed, and a further condition on the other options when one
is needed. :func:`check_declared` checks given values against these declarations and raises
one kind of ValueError::

    <owner>: <option> must be <what it takes> (<doc>), got <value!r>

(the owner is e.g. the algorithm's name). The algorithms declare theirs
(:attr:`sparsecomm.algorithms.Algorithm.option_specs`), the COO codec its own
(:data:`sparsecomm.formats.codec.CODEC_OPTIONS`). Checking never changes a value: what the
reducer's handshake compares is exactly what was given.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping

__all__ = ["Option", "check_declared"]


@dataclass(frozen=True)
class Option:
    """What one keyword option accepts.

    * ``default`` -- its value when not given.
    * ``kind`` -- the type a value must have: ``int``, ``float`` (any finite int or float),
      ``bool``, ``str``, another type or a tuple of types, or ``object`` (any; then ``choices``
      or ``check`` say what is valid). A bool is never taken for an int or a float.
    * ``min`` / ``max`` -- inclusive bounds; ``min_open`` makes the lower one exclusive.
    * ``even`` -- an int must be even.
    * ``choices`` -- the values allowed (compared with ``==``).
    * ``optional`` -- None is allowed too (default: when ``default`` is None); ``none_doc``
      says what None means, in the message.
    * ``check`` -- a further condition ``check(value, options)`` once the value passed all of
      the above; ``options`` holds every option, those declared before this one checked.
    * ``doc`` -- what the value is, in parentheses after what the option takes.
    * ``what`` -- what the option takes in the message, when the words made from the fields
      above do not say it (e.g. a bound that depends on another option).
    * ``label`` -- how the message names the option (default: its name).
    """

    default: Any
    kind: type | tuple[type, ...] = object
    min: float | None = None
    max: float | None = None
    min_open: bool = False
    even: bool = False
    choices: tuple[Any, ...] | None = None
    optional: bool | None = None
    none_doc: str = ""
    check: Callable[[Any, Mapping[str, Any]], bool] | None = None
    doc: str = ""
    what: str | None = None
    label: str | None = None

    @property
    def allows_none(self) -> bool:
        return self.default is None if self.optional is None else self.optional

    def accepts(self, value: Any, options: Mapping[str, Any]) -> bool:
        """Whether ``value`` is valid, given the other ``options``."""
        if value is None:
            return self.allows_none
        if isinstance(value, bool) and self.kind is not bool:
            return False
        if self.kind is float:
            if not (isinstance(value, (int, float)) and math.isfinite(value)):
                return False
        elif not isinstance(value, self.kind):
            return False
        if self.choices is not None and value not in self.choices:
            return False
        if self.min is not None and (value <= self.min if self.min_open else value < self.min):
            return False
        if self.max is not None and value > self.max:
            return False
        if self.even and value % 2:
            return False
        return self.check is None or bool(self.check(value, options))

    def describe(self) -> str:
        """What the option takes, in words (the message's ``must be ...``)."""
        if self.what is not None:
            text = self.what
        elif self.choices is not None:
            words = ["None"] * self.allows_none + [repr(c) for c in self.choices]
            text = words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"
        else:
            text = self._describe_value()
            if self.allows_none:
                text = f"None ({self.none_doc}) or {text}" if self.none_doc else f"None or {text}"
        return f"{text} ({self.doc})" if self.doc else text

    def _describe_value(self) -> str:
        bounds = []
        if self.min is not None:
            bounds.append(f"{'>' if self.min_open else '>='} {self.min if self.kind is int else format(self.min, 'g')}")
        if self.max is not None:
            bounds.append(f"<= {self.max if self.kind is int else format(self.max, 'g')}")
        if self.kind is int:
            noun = "an even int" if self.even else "an int"
            if self.min is not None and self.max is not None and not self.min_open:
                return f"{noun} in {self.min}..{self.max}"
            return " ".join([noun, " and ".join(bounds)]) if bounds else noun
        if self.kind is float:
            if self.min is not None and self.max is not None:
                return f"a number in {'(' if self.min_open else '['}{self.min:g}, {self.max:g}]"
            return " ".join(["a finite number", " and ".join(bounds)]) if bounds else "a finite number"
        kinds = self.kind if isinstance(self.kind, tuple) else (self.kind,)
        return " or ".join(f"a {k.__name__}" for k in kinds)


def check_declared(owner: str, specs: Mapping[str, Option], options: Mapping[str, Any]) -> None:
    """ValueError naming ``owner``, the option, what it takes and the value given, for the
    first of ``options`` (in the order of ``specs``) that its :class:`Option` rejects."""
    for name, spec in specs.items():
        value = options[name]
        if not spec.accepts(value, options):
            raise ValueError(f"{owner}: {spec.label or name} must be {spec.describe()}, got {value!r}")
