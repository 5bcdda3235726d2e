"""``python -m autoalloc``: the command-line interface."""

import sys

from autoalloc.cli import main

sys.exit(main())
