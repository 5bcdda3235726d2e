#!/usr/bin/env python3
"""Write autoalloc/builtin.json: autoalloc/builtin.toml as validated (what the schema's walk
keeps of it), with the size and CRC-32 of the bytes it was made from. The first process to
import torch after an install or an upgrade builds the built-in rules from it instead of
parsing and validating the TOML (``layercache.released``); a builtin.toml edited since is
parsed as it is. Run it after editing builtin.toml or the schema
(``tests/test_builtin_policy.py`` fails until then)::

    python scripts/builtin_json.py
"""

from __future__ import annotations

import json
import sys
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from autoalloc import schema, sources  # noqa: E402  (this checkout's)

PACKAGE = ROOT / "autoalloc"


def released(toml: bytes) -> str:
    """The text of builtin.json for builtin.toml's bytes ``toml``."""
    document = schema.walk(sources.parse_toml(toml), "builtin", False)
    if document.problems:
        raise SystemExit(f"builtin.toml: {document.problems[0].sentence()}")
    kept = {k: getattr(document, k) for k in ("settings", "rules", "wrappers", "pending")}
    twin = {"toml": [len(toml), zlib.crc32(toml)], "walked": kept}
    return json.dumps(twin, indent=1, ensure_ascii=False) + "\n"


def main() -> int:
    text = released((PACKAGE / "builtin.toml").read_bytes())
    (PACKAGE / "builtin.json").write_text(text, encoding="utf-8")
    print(f"wrote {PACKAGE / 'builtin.json'} ({len(text.encode())} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
