"""Which implementation the ops run on CPU tensors: the C kernels (default) or the torch
implementations of ``ops/_torch_impl/`` that GPUs without CUDA kernels run.

The switch exists so that the GPU fallback path is as tested as the C path on a machine
without a GPU: ``SPARSECOMM_OPS=torch`` in the environment turns it on for the whole
process (read once, when :mod:`sparsecomm.ops` is imported); :func:`use_torch_ops` turns it
on for a ``with`` block. It re-registers every op's CPU kernel with the dispatcher, so it
is process-wide (all threads), not thread-local; blocks nest. The wire checks of
``ops/_wire.py`` follow it too: while it is on, CPU payloads take the device path
(a host check of the fixed prefix, then the indices and padding checked with torch).
"""

from __future__ import annotations

import contextlib
import os
import threading
import warnings
from typing import Iterator, Optional

import torch

from . import _torch_impl

__all__ = ["use_torch_ops", "torch_ops_enabled", "ENV_VAR"]

#: Environment variable read at import: "torch" runs every op's torch implementation on
#: CPU tensors; "" or "native" (the default) the C kernels.
ENV_VAR = "SPARSECOMM_OPS"

_lock = threading.Lock()
_library: Optional[torch.library.Library] = None
_depth = 0


def torch_ops_enabled() -> bool:
    """True while CPU tensors run the torch implementations."""
    return _library is not None


def _enable() -> None:
    global _library, _depth
    with _lock:
        _depth += 1
        if _library is not None:
            return
        lib = torch.library.Library("sparsecomm", "IMPL")
        with warnings.catch_warnings():  # "Overriding a previously registered kernel": the point
            warnings.simplefilter("ignore")
            for name, fn in _torch_impl.impls().items():
                lib.impl(name, fn, "CPU")
        _library = lib


def _disable() -> None:
    global _library, _depth
    with _lock:
        _depth -= 1
        if _depth == 0 and _library is not None:
            _library._destroy()  # the C kernels' registrations come back
            _library = None


@contextlib.contextmanager
def use_torch_ops() -> Iterator[None]:
    """Run every sparsecomm op on CPU tensors with its torch implementation inside the block
    (the code GPUs without CUDA kernels run). Process-wide; nests."""
    _enable()
    try:
        yield
    finally:
        _disable()


def apply_environment() -> None:
    """Turn the switch on for the process when ``SPARSECOMM_OPS=torch``."""
    value = os.environ.get(ENV_VAR, "").strip().lower()
    if value in ("", "native", "c"):
        return
    if value != "torch":
        raise ValueError(f"{ENV_VAR}={os.environ[ENV_VAR]!r}: must be 'torch' (every op runs its torch "
                         "implementation, the GPU fallback) or 'native' / unset (the C kernels)")
    _enable()
