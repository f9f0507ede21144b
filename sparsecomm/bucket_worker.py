"""The DDP hook's worker's former home: the same module as :mod:`sparsecomm.hooks.bucket_worker`."""

import sys

from .hooks import bucket_worker as _module

sys.modules[__name__] = _module
