"""``python -m autoalloc.bench``: the same as ``autoalloc bench``."""

import sys

from autoalloc.bench.command import main

sys.exit(main())
