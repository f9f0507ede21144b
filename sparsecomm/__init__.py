"""sparsecomm: sparse and compressed allreduce for communication-efficient data-parallel training.

Quick use::

    import sparsecomm as sc
    state = sc.DDPHookState("topka", density=0.01)
    sc.register(model, state)        # model.register_comm_hook(state, sc.ddp_hook), 1 process too

or, functionally, ``sc.SparseAllreduce("topka", 0.01, comm)(grad)``.
"""

from __future__ import annotations

from . import algorithms, comm, formats, ops
from . import tune  # registers auto, which picks among the algorithms per tensor
from . import hooks, reduce
from .hooks import DDPHookState, FSDPHookState, ddp_hook, register
from .hooks import fsdp
from .hooks import Policy, Rule, Treatment
from .reduce import DensitySchedule, SparseAllreduce, k_for
from .comm.topology import NodeComms, Topology

from ._version import __version__

__all__ = ["algorithms", "comm", "formats", "ops", "SparseAllreduce", "k_for", "DDPHookState", "ddp_hook", "register", "FSDPHookState", "fsdp",
           "Policy", "Rule", "Treatment",
           "DensitySchedule", "Topology", "NodeComms", "__version__"]

