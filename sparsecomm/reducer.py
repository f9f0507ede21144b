"""The reducer's former home: the same module as :mod:`sparsecomm.reduce.reducer`."""

import sys

from .reduce import reducer as _module

sys.modules[__name__] = _module
