"""The DDP hook's former home: the same module as :mod:`sparsecomm.hooks.ddp` (pickled states and
``import sparsecomm.hook`` keep working)."""

import sys

from .hooks import ddp as _module

sys.modules[__name__] = _module
