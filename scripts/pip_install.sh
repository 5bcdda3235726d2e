# Sourced by scripts/demo.sh, test.sh and pythons.sh: pip_install PYTHON PIP-ARGS... runs
# `PYTHON -m pip install PIP-ARGS...` and prints one line per package as pip gets to it,
# instead of minutes of silence (torch alone is about 200 MB); on failure, pip's last lines.
pip_install() {
    local python=$1 log rc
    shift
    log=$(mktemp)
    set +e
    "$python" -m pip install --progress-bar off "$@" 2>&1 | tee "$log" \
        | grep --line-buffered -E '^(Collecting|Obtaining|Processing|Building|Installing collected|Successfully installed)' \
        | sed -u 's/^/  pip: /'
    rc=${PIPESTATUS[0]}
    set -e
    if [ "$rc" != 0 ]; then
        echo "pip install failed (exit $rc); its last lines:" >&2
        tail -n 25 "$log" >&2
    fi
    rm -f "$log"
    return "$rc"
}
