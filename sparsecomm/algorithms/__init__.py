"""Sparse allreduce algorithms, one module per family, found by name in a registry.

``sparsecomm.algorithms.names()`` lists what is registered; ``get(name)`` returns the class;
``traffic(name, P, N, k)`` gives one call's message schedule, sizes only (``modelled()`` lists
the algorithms that have one).
Importing this package imports every algorithm module so that each registers itself; ``auto``,
which picks one of them per tensor, is the tuner's (:mod:`sparsecomm.tune.auto`, registered by
``import sparsecomm``; ``sparsecomm.algorithms.auto`` names the same module).
"""

from .base import Algorithm, get, modelled, names, register, traffic
from . import dense, topka, gssgd, gtopk  # noqa: F401  (each module registers its algorithm)
from . import spardl  # noqa: F401
from . import oktopk  # noqa: F401  (Ok-Topk: docs/oktopk.md)
from . import sparcml  # noqa: F401  (sparcml_*, topkdsa and the sparcml chooser: docs/sparcml.md)
from . import densestream  # noqa: F401  (DenseStreamAllreduce: docs/densestream.md)
from . import skcompress  # noqa: F401  (docs/skcompress.md)
from . import zen  # noqa: F401  (ZEN's hash-balanced sparse allreduce: docs/zen.md)

__all__ = ["Algorithm", "get", "names", "register", "traffic", "modelled"]
