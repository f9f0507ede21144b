"""The FSDP2 hook's former home: the same module as :mod:`sparsecomm.hooks.fsdp` (``sparsecomm.fsdp.register_hook``,
``node_mesh`` and pickled states keep working)."""

import sys

from .hooks import fsdp as _module

sys.modules[__name__] = _module
