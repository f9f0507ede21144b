"""``auto``'s former home: the same module as :mod:`sparsecomm.tune.auto` (the tuner's algorithm)."""

import sys

from ..tune import auto as _module

sys.modules[__name__] = _module
