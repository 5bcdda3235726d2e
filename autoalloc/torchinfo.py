"""Which torch is installed: version and flavour from ``torch/version.py``, without importing it.

Importing torch (or ``importlib.metadata``) to learn its version would defeat the point,
so this reads the small generated ``version.py`` next to the package that the import
system found. Once torch is imported, ``allocator_string`` is the one place that asks torch
what its allocator uses.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from typing import Any, Literal

from autoalloc import safefile
from autoalloc.records import record

Flavour = Literal["cpu", "cuda", "rocm"]

# The names parse_version_file reads; string parsing, not a regex: compiling one costs about
# a million instructions, in every process that imports torch.
_NAMES = ("__version__", "cuda", "hip", "rocm")


@record(frozen=True)
class TorchInfo:
    """The installed torch: ``version`` as in ``torch.__version__`` and its build flavour."""

    version: str
    cuda: str | None = None
    hip: str | None = None
    path: str = ""

    @property
    def release(self) -> tuple[int, int]:
        """(major, minor) from the version's leading ``N.N`` (0, 0 without one)."""
        major, dot, rest = self.version.partition(".")
        minor = rest[: len(rest) - len(rest.lstrip("0123456789"))]
        if not (dot and major.isdecimal() and major.isascii() and minor):
            return (0, 0)
        return (int(major), int(minor))

    @property
    def flavour(self) -> Flavour:
        if self.hip:
            return "rocm"
        if self.cuda:
            return "cuda"
        return "cpu"

    def describe(self) -> str:
        extra = {"cuda": f"CUDA {self.cuda}", "rocm": f"ROCm/HIP {self.hip}", "cpu": "CPU-only"}
        return f"torch {self.version} ({extra[self.flavour]})"


def parse_version_file(text: str, path: str = "") -> TorchInfo | None:
    """Read ``__version__``, ``cuda`` and ``hip`` from the text of ``torch/version.py``."""
    values: dict[str, str | None] = {}
    for line in text.splitlines():
        found = _assignment(line.strip())
        if found is not None:
            values[found[0]] = found[1]
    version = values.get("__version__")
    if not version:
        return None
    hip = values.get("hip") or values.get("rocm")
    return TorchInfo(version=version, cuda=values.get("cuda"), hip=hip, path=path)


def _assignment(line: str) -> tuple[str, str | None] | None:
    """``NAME = 'text'``, ``NAME: type = "text"`` or ``NAME = None`` for one of ``_NAMES``."""
    head, eq, value = line.partition("=")
    name = head.partition(":")[0]
    if not eq or name.rstrip() not in _NAMES or name[:1].isspace():
        return None
    value = value.strip()
    if value == "None":
        return name.rstrip(), None
    quote = value[:1]
    if quote in ("'", '"') and len(value) >= 2 and value[-1] == quote:
        if quote not in value[1:-1]:
            return name.rstrip(), value[1:-1]
    return None


_MAX_VERSION_FILE = 65536


def from_package_dir(package_dir: str) -> TorchInfo | None:
    """TorchInfo for the torch package in ``package_dir`` (the folder holding ``__init__.py``);
    ``version.py`` is read only if it is a regular file (``safefile``: a FIFO would block)."""
    try:
        raw = safefile.read(os.path.join(package_dir, "version.py"), _MAX_VERSION_FILE)[0]
        return parse_version_file(raw.decode("utf-8"), package_dir)
    except (OSError, ValueError):  # UnicodeDecodeError is a ValueError
        return None


def from_spec(spec: object) -> TorchInfo | None:
    """TorchInfo for a module spec of the ``torch`` package."""
    locations = getattr(spec, "submodule_search_locations", None) or []
    for location in locations:
        info = from_package_dir(location)
        if info:
            return info
    return None


def locate(paths: Iterable[str] | None = None) -> TorchInfo | None:
    """TorchInfo for the first torch package on ``paths`` (default ``sys.path``), as import
    would find it."""
    for entry in sys.path if paths is None else paths:
        package_dir = os.path.join(entry or os.curdir, "torch")
        if os.path.isfile(os.path.join(package_dir, "__init__.py")):
            return from_package_dir(package_dir)
    return None


GETTER = "_accelerator_getAllocatorSettings"  # on torch._C, 2.12+


def allocator_string(torch: Any) -> str | None:
    """What an imported ``torch`` says its allocator uses (its ``torch._C`` getter), or None
    where it has none; raises what the getter raises. The first read builds torch's allocator
    configuration from the environment if nothing did yet."""
    getter = getattr(getattr(torch, "_C", None), GETTER, None)
    return None if getter is None else str(getter())
