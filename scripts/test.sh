#!/usr/bin/env bash
# Run autoalloc's tests from nothing: a venv with torch 2.13 (CPU), autoalloc installed
# with its startup hook and the test extra, then ruff and pytest.
#   scripts/test.sh            the suite on torch 2.13 CPU (a few minutes)
#   scripts/test.sh --full     as CI: also torch 2.14.1 (CUDA build, ~5.5 GB from the local
#                              wheel cache) and the hook tests on every Python 3.9-3.13 found
# Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
FULL=0
if [ "${1:-}" = "--full" ]; then FULL=1; shift; fi
PYTHON=${PYTHON:-python3}
VENV=${AUTOALLOC_TEST_VENV:-.venv-test}

quiet_pip() { "$@" 2>&1 | grep -v -e '^WARNING: Location' -e '^$' || true; }

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
quiet_pip "$VENV/bin/python" -m pip install -q -e ".[test]"
"$VENV/bin/python" -c "import torch, sys; assert torch.__version__.startswith('2.13.0'), torch.__version__"

if [ "$FULL" = 1 ]; then
    CUDA_VENV=${AUTOALLOC_CUDA_VENV:-.venv-test-cuda}
    [ -x "$CUDA_VENV/bin/python" ] || "$PYTHON" -m venv "$CUDA_VENV"
    quiet_pip "$CUDA_VENV/bin/python" -m pip install -q torch==2.14.1 numpy -e .
    export AUTOALLOC_TORCH_CUDA_PYTHON="$PWD/$CUDA_VENV/bin/python"
    bash scripts/pythons.sh
fi

"$VENV/bin/ruff" check autoalloc tests benchmarks
"$VENV/bin/python" -m pytest -n "${AUTOALLOC_TEST_WORKERS:-auto}" "$@"
