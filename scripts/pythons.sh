#!/usr/bin/env bash
# Hook-level tests (startup, entry point, policy, the .pth file; no torch) on every CPython
# 3.9-3.13 found: pyenv's versions first (its shims fail unless a version is selected), then
# PATH. Each gets a venv with autoalloc installed editable (hatchling), tomli below 3.11.
#   scripts/pythons.sh [--skip X.Y]   X.Y: a version whose tests run elsewhere (scripts/test.sh
#                                     runs the whole suite on its own venv's Python)
# A venv is reinstalled only when the files an install copies changed since its last install.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/pip_install.sh
SKIP=""
if [ "${1:-}" = "--skip" ]; then SKIP=$2; shift 2; fi
found=0
for v in 3.9 3.10 3.11 3.12 3.13; do
    if [ "$v" = "$SKIP" ]; then echo "python$v: the main test run covers it, skipped"; continue; fi
    py=""
    for candidate in $(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$v".*/bin/python"$v" 2>/dev/null | sort -rV) \
                     $(command -v "python$v" 2>/dev/null || true); do
        if "$candidate" -c pass >/dev/null 2>&1; then py=$candidate; break; fi
    done
    if [ -z "$py" ]; then echo "python$v: not found, skipped"; continue; fi
    venv=".venv-py$v"
    stamp="$venv/.autoalloc-installed"
    # _startup.py and _loader.py too: the editable install copies them into site-packages
    want="$(cat pyproject.toml autoalloc.pth autoalloc.start autoalloc/_startup.py autoalloc/_loader.py | sha256sum | cut -d' ' -f1) $py"
    if [ ! -x "$venv/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
        [ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
        echo "installing autoalloc, pytest and hypothesis into $venv ..."
        pip_install "$venv/bin/python" -e . pytest hypothesis
        echo "$want" > "$stamp"
    fi
    echo "== hook tests on $("$venv/bin/python" --version)"
    "$venv/bin/python" -m pytest -q -m hook -p no:cacheprovider --full tests
    found=$((found + 1))
done
[ "$found" -ge 1 ] || [ -n "$SKIP" ]
