"""The one place where kernel failures become the Python exceptions users catch.

The C kernels return a status (``csrc/include/sparsecomm/abi.h``); the bindings
(``csrc/checks.h``: ``raise_status``) raise torch's exception types for them. This
module maps those onto Python's:

==========================================  ==========================  =====================
C status                                    torch raises                users get
==========================================  ==========================  =====================
ARG, NAN, INDEX_RANGE, INDEX_ORDER, OVERLAP  ValueError                  ValueError
NOMEM                                       torch.OutOfMemoryError      MemoryError
MALFORMED                                   ValueError (WIRE_PREFIX)    WireFormatError
(a bad dtype, found by the binding)         TypeError                   TypeError
(an argument of the wrong Python type)      RuntimeError from the       TypeError
                                            schema parser
==========================================  ==========================  =====================
"""

from __future__ import annotations

import functools
from typing import Callable, TypeVar

import torch

from ..errors import WireFormatError

__all__ = ["WIRE_PREFIX", "translating"]

# The text a wire/format error from received bytes begins with, for every raiser on the
# Python side (the torch implementations import it from here). csrc/checks.h writes it once
# more as kWirePrefix, C++ cannot import it; tests/test_single_sources.py reads that header
# and fails when the two differ.
WIRE_PREFIX = "malformed message: "
# how torch's schema parser reports an argument of the wrong type
_SCHEMA_TYPE_ERRORS = ("Expected a value of type", "expected a value of type")

F = TypeVar("F", bound=Callable)


def _translate(exc: BaseException) -> BaseException | None:
    if isinstance(exc, torch.OutOfMemoryError):
        return MemoryError(str(exc))
    if isinstance(exc, ValueError) and not isinstance(exc, WireFormatError):
        msg = str(exc)
        if msg.startswith(WIRE_PREFIX):
            return WireFormatError(msg[len(WIRE_PREFIX):])
        return None
    if type(exc) is RuntimeError and any(s in str(exc) for s in _SCHEMA_TYPE_ERRORS):
        return TypeError(str(exc).split("\n")[0])
    return None


def translating(fn: F) -> F:
    """Decorator of the ops' Python faces: re-raises kernel failures as above."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (ValueError, RuntimeError) as exc:  # OutOfMemoryError is a RuntimeError
            mapped = _translate(exc)
            if mapped is None:
                raise
            raise mapped from None

    return wrapper  # type: ignore[return-value]
