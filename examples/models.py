"""The examples' models: they live in :mod:`sparsecomm.bench.models` (the time-to-accuracy
benchmark, ``python -m sparsecomm.bench accuracy``, trains the same ones from an installed
package); re-exported here for the example scripts."""

from sparsecomm.bench.models import *  # noqa: F401,F403
from sparsecomm.bench.models import __all__  # noqa: F401
