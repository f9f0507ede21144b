"""The cost model's public name: the same module as :mod:`sparsecomm.tune.costmodel`."""

import sys

from .tune import costmodel as _module

sys.modules[__name__] = _module
