"""sparsecomm: sparse and compressed allreduce for communication-efficient data-parallel training.

Quick use::

    import sparsecomm as sc
    state = sc.DDPHookState("topka", density=0.01)
    model.register_comm_hook(state, sc.ddp_hook)

or, functionally, ``sc.SparseAllreduce("topka", 0.01, comm)(grad)``.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from . import algorithms, comm, formats, ops
from .hook import DDPHookState, ddp_hook
from .reducer import SparseAllreduce, k_for
from .density import DensitySchedule

from ._version import __version__

__all__ = ["algorithms", "baselines", "comm", "formats", "ops", "SparseAllreduce", "k_for", "DDPHookState", "ddp_hook",
           "DensitySchedule", "__version__"]


def __getattr__(name: str) -> ModuleType:
    # PEP 562: ``sparsecomm.baselines`` (PyTorch's own hooks, for comparisons) is imported on
    # first use, so that training code that never compares pays nothing for it
    if name == "baselines":
        return importlib.import_module(f"{__name__}.baselines")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
