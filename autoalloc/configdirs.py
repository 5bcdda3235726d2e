"""Where the site and user policy files are: platformdirs' answer, remembered across
processes in the layer cache (importing platformdirs and asking it costs more, in every
process that imports torch, than reading the answer back)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from autoalloc import layercache

_PACKAGES: dict[str, tuple] = {}


def site_path() -> str:
    return _remembered("site", _site_path)


def user_path() -> str:
    return _remembered("user", _user_path)


def _site_path() -> str:
    import platformdirs

    return os.path.join(platformdirs.site_config_dir("autoalloc"), "config.toml")


def _user_path() -> str:
    import platformdirs

    return os.path.join(platformdirs.user_config_dir("autoalloc"), "config.toml")


def _remembered(kind: str, locate: Callable[[], str]) -> str:
    """``locate()``, remembered by what it depends on: the environment variables it reads,
    the user, the platform and the installed platformdirs."""
    if not layercache.enabled():
        return locate()
    env = os.environ
    try:
        names = ("HOME", "XDG_CONFIG_HOME", "XDG_CONFIG_DIRS")
        key = (*(env.get(n) for n in names), os.getuid(), os.geteuid(), sys.platform,
               _package_files("platformdirs"))  # fmt: skip
    except Exception:
        return locate()
    hit = layercache.get(f"{kind}-dir", key, None)
    if isinstance(hit, str):
        return hit
    path = locate()
    if key[-1]:
        layercache.put(f"{kind}-dir", key, None, path)
    return path


def _package_files(name: str) -> tuple:
    """The identity of an installed package's ``__init__.py`` and ``version.py`` (an upgrade
    rewrites them), found without importing it; looked up once per process (the site and
    the user config directories both depend on platformdirs)."""
    if name not in _PACKAGES:
        _PACKAGES[name] = _find_package_files(name)
    return _PACKAGES[name]


def _find_package_files(name: str) -> tuple:
    from importlib.machinery import PathFinder

    spec = PathFinder.find_spec(name)
    origin = getattr(spec, "origin", None)
    if not origin or not os.path.isabs(origin):
        return ()
    out = []
    for path in (origin, os.path.join(os.path.dirname(origin), "version.py")):
        try:
            st = os.stat(path)
        except OSError:
            continue
        out.append((path, st.st_size, st.st_mtime_ns, st.st_ino))
    return tuple(out)
