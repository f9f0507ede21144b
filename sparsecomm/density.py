"""Density schedules' former home: the same module as :mod:`sparsecomm.reduce.density`."""

import sys

from .reduce import density as _module

sys.modules[__name__] = _module
