#!/usr/bin/env bash
# Run autoalloc's tests: a venv with torch 2.13 (CPU), autoalloc installed editable with its
# startup hook and the test extra, then ruff and pytest.
#   scripts/test.sh            the quick suite on torch 2.13 CPU (a few minutes on 2 cores)
#   scripts/test.sh --full     as CI: also the tests marked slow and the large samples (10,000
#                              fuzz cases, 100 fuzzed interpreters), torch 2.14.1 (CUDA build,
#                              ~5.5 GB) and the hook tests on every other Python 3.9-3.13 found
# Extra arguments go to pytest. A venv is reinstalled only when pyproject.toml or the hook
# files changed since its last install (autoalloc itself is editable); delete it to start over.
set -euo pipefail
cd "$(dirname "$0")/.."
FULL=0
if [ "${1:-}" = "--full" ]; then FULL=1; shift; fi
PYTHON=${PYTHON:-python3}
VENV=${AUTOALLOC_TEST_VENV:-.venv-test}

source scripts/pip_install.sh

# ensure_venv VENV WHAT PIP-ARGS...: create VENV if needed and install PIP-ARGS into it, unless
# it was installed from these very project files with these very arguments.
ensure_venv() {
    local venv=$1 what=$2
    shift 2
    local stamp="$venv/.autoalloc-installed"
    local want
    want="$(cat pyproject.toml autoalloc.pth autoalloc.start autoalloc/_startup.py autoalloc/_loader.py | sha256sum | cut -d' ' -f1) $*"
    if [ -x "$venv/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
        echo "using $venv ($what, up to date)"
        return
    fi
    if [ ! -x "$venv/bin/python" ]; then
        echo "creating $venv ..."
        "$PYTHON" -m venv "$venv"
    fi
    echo "installing $what into $venv (a line per package) ..."
    pip_install "$venv/bin/python" "$@"
    echo "$want" > "$stamp"
}

ensure_venv "$VENV" "torch 2.13 (CPU) and autoalloc with the test extra" -e ".[test]"
torch_is() {  # VENV VERSION (from the installed metadata: importing torch costs seconds)
    "$1/bin/python" -c "import importlib.metadata as m; v = m.version('torch');
assert v.startswith('$2'), 'torch ' + v"
}
torch_is "$VENV" 2.13.0

PYTEST_ARGS=()
if [ "$FULL" = 1 ]; then
    CUDA_VENV=${AUTOALLOC_CUDA_VENV:-.venv-test-cuda}
    ensure_venv "$CUDA_VENV" "torch 2.14.1 (CUDA build, ~5.5 GB) and autoalloc" \
        torch==2.14.1 numpy -e .
    torch_is "$CUDA_VENV" 2.14.1
    export AUTOALLOC_TORCH_CUDA_PYTHON="$PWD/$CUDA_VENV/bin/python"
    PYTHON_TESTED=$("$VENV/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    bash scripts/pythons.sh --skip "$PYTHON_TESTED"
    echo "gpu_check.sh --dry-run (what the GPU run does, on the CPU) ..."
    DRY_OUT=$(mktemp -d)
    if ! PYTHON="$PWD/$VENV/bin/python" OUT="$DRY_OUT" bash benchmarks/gpu_check.sh --dry-run \
        > "$DRY_OUT/stdout.txt" 2>&1; then
        tail -40 "$DRY_OUT/stdout.txt"
        echo "benchmarks/gpu_check.sh --dry-run failed (log above)"
        exit 1
    fi
    for result in quick.json ab.json gpu_check.log; do
        [ -s "$DRY_OUT/$result" ] || { echo "gpu_check.sh --dry-run wrote no $result"; exit 1; }
    done
    echo "gpu_check.sh --dry-run ok: $(ls "$DRY_OUT" | tr '\n' ' ')"
    rm -rf "$DRY_OUT"
    PYTEST_ARGS+=(--full)
fi

# Bytecode for autoalloc, as pip writes it for an installed package, before the tests'
# interpreters start: those started with PYTHONDONTWRITEBYTECODE would each compile it again,
# and the first of the others would race each other to write it. -q prints only errors.
env -u PYTHONDONTWRITEBYTECODE "$VENV/bin/python" -m compileall -q autoalloc
echo "ruff ..."
"$VENV/bin/ruff" check autoalloc tests benchmarks
echo "pytest on $("$VENV/bin/python" --version) ..."
"$VENV/bin/python" -m pytest -n "${AUTOALLOC_TEST_WORKERS:-auto}" \
    ${PYTEST_ARGS[@]+"${PYTEST_ARGS[@]}"} "$@"
