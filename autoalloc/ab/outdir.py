"""Where ``autoalloc ab`` and ``autoalloc bench`` write when not told: never inside the project.

A new directory per run in ``ab/`` or ``bench/`` of autoalloc's cache directory
(``cachedir``: mode 0700 whatever the umask, in directories of this user only, so under
``sudo -E`` not in the user's HOME, and never in a directory autoalloc did not make that
holds other files); else under the temporary directory.
"""

from __future__ import annotations

import tempfile
import time


def private_run_dir(kind: str) -> str:
    """A new directory for one run of ``kind`` (``ab``, ``bench``), e.g.
    ``~/.cache/autoalloc/ab/20261201-153012-k2j4``."""
    from autoalloc import cachedir

    try:
        base = cachedir.make_subdir(kind)
    except OSError:  # no cache directory of ours (HOME unreachable, another user's): /tmp
        base = tempfile.gettempdir()
    return tempfile.mkdtemp(prefix=time.strftime("%Y%m%d-%H%M%S-"), dir=base)
