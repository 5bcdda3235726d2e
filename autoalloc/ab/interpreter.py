"""Which Python a command runs, and whether autoalloc is installed in it (for ``autoalloc ab``).

``ab`` measures through ``AUTOALLOC_REPORT``, which only an interpreter with autoalloc's
startup hook honours: ``.venv/bin/autoalloc ab -- /other/venv/bin/python train.py`` would run
the whole program in both arms and bring back nothing. The command's interpreter is found
from its first word (``python3``, a path to one, or a script whose ``#!`` line names one)
and asked, before any run, whether autoalloc's startup hook runs in it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence

# Whether autoalloc's startup hook ran in that interpreter (its startup module is loaded by
# the .pth line before any program code): importable from the working directory is not enough.
PROBE = (
    "import sys; m = sys.modules; "
    "sys.exit(0 if '_autoalloc_startup' in m or 'autoalloc._startup' in m else 3)"
)


def _is_python(path: str) -> bool:
    name = os.path.basename(path)
    return name.startswith("python") or name in ("pypy", "pypy3")


def interpreter(command: Sequence[str]) -> str | None:
    """The Python executable ``command`` runs (None: not one that can be told)."""
    if not command:
        return None
    first = shutil.which(command[0]) or command[0]
    if _is_python(first):
        return first
    try:
        with open(first, "rb") as f:
            head = f.readline(256)
    except OSError:
        return None
    if not head.startswith(b"#!"):
        return None
    words = head[2:].decode("utf-8", "replace").split()
    if words and os.path.basename(words[0]) == "env":
        words = [w for w in words[1:] if not w.startswith("-")]
    if words and _is_python(words[0]):
        return shutil.which(words[0]) or words[0]
    return None


def lacks_autoalloc(command: Sequence[str], timeout: float = 60) -> str | None:
    """The interpreter of ``command`` when autoalloc's hook does not run in it (None: it does,
    or that cannot be told)."""
    python = interpreter(command)
    if python is None:
        return None
    try:
        probe = subprocess.run(
            [python, "-c", PROBE],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return python if probe.returncode == 3 else None


def advice(python: str) -> str:
    """What to tell a user whose command runs a Python without autoalloc."""
    bindir = os.path.dirname(python)
    own = os.path.join(bindir, "autoalloc") if bindir else "autoalloc"
    return (
        f"{python} does not have autoalloc, so its processes write no report and nothing "
        f"can be compared; install it there ({install_line(python)}) and run that "
        f"environment's own `{own} ab -- ...`"
    )


def install_line(python: str, direct_url: str | None = None) -> str:
    """A pip command that installs this autoalloc into ``python``'s environment from where
    this one came (PEP 610's ``direct_url.json``: a clone or a wheel on disk, a VCS URL);
    autoalloc is not on the package index. ``direct_url``: that file's text (read here when
    None)."""
    import json
    import shlex

    if direct_url is None:
        try:
            from importlib.metadata import distribution

            direct_url = distribution("autoalloc").read_text("direct_url.json")
        except Exception:
            direct_url = None
    try:
        origin = json.loads(direct_url or "{}")
        url = origin["url"]
    except (ValueError, KeyError, TypeError):
        return f"{python} -m pip install ./autoalloc, from the folder that holds your clone"
    if url.startswith("file://"):
        from urllib.parse import unquote, urlsplit

        source = unquote(urlsplit(url).path)
    elif isinstance(origin.get("vcs_info"), dict):
        vcs = origin["vcs_info"]
        source = f"{vcs.get('vcs', 'git')}+{url}@{vcs.get('commit_id', '')}".rstrip("@")
    else:
        source = url
    return f"{shlex.quote(python)} -m pip install {shlex.quote(source)}"
