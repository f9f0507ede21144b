"""``python -m sparsecomm.bench ...``: see :mod:`sparsecomm.bench.cli`."""
import sys

from .cli import main

sys.exit(main())
