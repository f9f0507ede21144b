"""``python -m sparsecomm.launch ...``: the command line of :mod:`sparsecomm.launch.cli`."""

import sys

from .cli import main

sys.exit(main())
