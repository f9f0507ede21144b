"""sparsecomm: sparse and compressed allreduce for communication-efficient data-parallel training.

Quick use::

    import sparsecomm as sc
    state = sc.DDPHookState("topka", density=0.01)
    model.register_comm_hook(state, sc.ddp_hook)

or, functionally, ``sc.SparseAllreduce("topka", 0.01, comm)(grad)``.
"""

from . import algorithms, baselines, comm, formats, ops
from .hook import DDPHookState, ddp_hook
from .reducer import SparseAllreduce, k_for

__version__ = "0.1.0"

__all__ = ["algorithms", "baselines", "comm", "formats", "ops", "SparseAllreduce", "k_for", "DDPHookState", "ddp_hook",
           "__version__"]
