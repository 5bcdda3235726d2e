"""The modules autoalloc itself imports to decide at ``import torch``: none of a rule's lists
of module names (``modulesets.MODULE_LISTS``) can name one.

An ``imports`` rule fires when the program really imports the module (its code executes).
A module autoalloc's own decision already imported (to read TOML, find config directories,
match globs) is in ``sys.modules`` before the program asks for it, so the program's later
``import json`` executes nothing and can never fire the rule (nor hold, exclude or outweigh
anything as one of its other import lists). ``check`` and ``explain`` name
such a rule; the hook traces it under ``AUTOALLOC_DEBUG``. The set is what
``python -c "import torch"`` with the hook imported on CPython 3.11 (tests keep it complete
for the interpreter they run on), plus ``tomli``, which older Pythons use instead of tomllib.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from autoalloc.modulesets import MODULE_LISTS

SELF_IMPORTS = frozenset(
    """
    __future__ _ast _bisect _bz2 _collections _compression _datetime _functools _json _lzma
    _opcode _operator _random _sha512 _sre _string _typing _weakrefset ast bisect bz2
    collections collections.abc contextlib copy copyreg dataclasses
    datetime dis encodings.utf_8_sig enum errno fnmatch functools importlib
    importlib._bootstrap importlib._bootstrap_external importlib.machinery inspect ipaddress
    itertools json json.decoder json.encoder json.scanner keyword linecache lzma math ntpath
    opcode operator pathlib pickle _pickle _compat_pickle struct _struct platformdirs
    platformdirs._paths platformdirs._runtime
    platformdirs._xdg platformdirs.api platformdirs.unix platformdirs.version random re
    re._casefix re._compiler re._constants re._parser reprlib shutil string tempfile token
    tokenize tomllib tomllib._parser tomllib._re tomllib._types types typing typing.io
    typing.re unicodedata urllib urllib.parse warnings weakref zlib
    tomli tomli._parser tomli._re tomli._types
    """.split()
)


def never_triggers(imports: Iterable[str]) -> list[str]:
    """The names of a rule's ``imports`` that can never fire it (autoalloc imports them)."""
    return [n for n in imports if n in SELF_IMPORTS or n.partition(".")[0] == "autoalloc"]


def messages(rule: Any) -> list[str]:
    """What ``check`` and ``explain`` say about each list of module names of ``rule`` (a
    policy Rule) that names such modules."""
    return [
        f"rule {rule.name}: {key} {', '.join(repr(n) for n in names)} can never {kind.does}: "
        "autoalloc itself imports that module to decide, before the program does; name a "
        "module of the program (a toolkit's or your own) instead"
        for key, kind in MODULE_LISTS.items()
        if (names := never_triggers(getattr(rule, key)))
    ]
