"""The reducer room: :class:`SparseAllreduce` and what every call of it relies on.

* :mod:`~sparsecomm.reduce.reducer`: the call (error feedback, ``out=``, statistics, state);
* :mod:`~sparsecomm.reduce.agreement`: the per-call agreement record, all-gathered and compared;
* :mod:`~sparsecomm.reduce.placement`: flat, two-level and auto placement behind one interface;
* :mod:`~sparsecomm.reduce.nonfinite`: the non-finite policy, shared with the FSDP hook;
* :mod:`~sparsecomm.reduce.density`: k from a density, and density warm-up schedules;
* :mod:`~sparsecomm.reduce.checkpoint`: checkpoint versions, fingerprints and per-rank parts.
"""

from .checkpoint import CHECKPOINT_VERSION
from .density import DensitySchedule, as_schedule, check_density, k_for
from .nonfinite import NONFINITE_POLICIES, check_nonfinite, nonfinite_error, nonfinite_flag
from .placement import HIERARCHIES, check_hierarchy, node_text, saved_text
from .reducer import SparseAllreduce

__all__ = ["SparseAllreduce", "k_for", "DensitySchedule", "as_schedule", "check_density", "NONFINITE_POLICIES",
           "check_nonfinite", "nonfinite_error", "nonfinite_flag", "HIERARCHIES", "check_hierarchy", "node_text",
           "saved_text", "CHECKPOINT_VERSION"]
