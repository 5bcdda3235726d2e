"""Where ``autoalloc ab`` and ``autoalloc bench`` write when not told: never inside the project.

A new directory per run under the user's cache directory (platformdirs), made as the layer
cache's directory is (``privatedir``): mode 0700 whatever the umask, in directories of this
user only (under ``sudo -E`` not in the user's HOME); else under the temporary directory.
"""

from __future__ import annotations

import os
import tempfile
import time


def private_run_dir(kind: str) -> str:
    """A new directory for one run of ``kind`` (``ab``, ``bench``), e.g.
    ``~/.cache/autoalloc/ab/20261201-153012-k2j4``."""
    import platformdirs

    from autoalloc import privatedir

    try:
        base = os.path.join(platformdirs.user_cache_dir("autoalloc"), kind)
        privatedir.make_private(base)
    except OSError:  # no cache directory of ours (HOME unreachable, another user's): /tmp
        base = tempfile.gettempdir()
    return tempfile.mkdtemp(prefix=time.strftime("%Y%m%d-%H%M%S-"), dir=base)
