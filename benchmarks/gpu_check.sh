#!/usr/bin/env bash
# A one-shot GPU check of `autoalloc bench` for a GPU machine without package-index access
# (docs/performance.md). Two steps:
#
#   1. where pip reaches the package index:
#        bash benchmarks/gpu_check.sh --prepare
#      builds autoalloc's wheel and fetches platformdirs (its one dependency) into .whl/
#      (git-ignored).
#   2. on the GPU machine, in a copy of this checkout with .whl/:
#        bash benchmarks/gpu_check.sh
#      installs autoalloc into the machine's python3 (which has torch with CUDA), checks
#      that the startup hook is live, runs `autoalloc bench --quick`, then `autoalloc ab
#      --steps 100 --repeat 2 -- python -m autoalloc.bench.workload ...` at the memory cap
#      the quick run calibrated, then the full A/B, within GPU_CHECK_LIMIT seconds (default
#      560: --deadline makes the A/B skip runs rather than overrun), and writes
#      quick.json/.png, ab.json/.png, full.json/.png and gpu_check.log under $OUT
#      (default benchmarks/out/gpu_check).
#
#   bash benchmarks/gpu_check.sh --dry-run     (on any CPU machine; scripts/test.sh --full runs it)
#      does everything the GPU run does, in CPU mode: builds autoalloc's wheel from this
#      checkout (no index: hatchling from PYTHON's environment), installs it offline into a
#      fresh venv beside PYTHON's torch (the path the GPU run takes when python3's environment
#      is not writable), checks the hook is live there, runs `autoalloc bench --quick` (its CPU
#      smoke path) and `autoalloc ab` on the workload (its smoke preset, a few steps), and writes the
#      results folder (default benchmarks/out/gpu_check-dry-run). The full A/B is left out.
set -uo pipefail
cd "$(dirname "$0")/.."

DRY=0
if [ "${1:-}" = "--dry-run" ]; then
    DRY=1
    shift
fi

if [ "${1:-}" = "--prepare" ]; then
    set -e
    mkdir -p .whl
    rm -f .whl/autoalloc-*.whl .whl/platformdirs-*.whl
    python3 -m pip wheel -q --no-deps -w .whl . 2>&1 | grep -v '^WARNING: Location' || true
    python3 -m pip download -q --no-deps --only-binary=:all: -d .whl platformdirs 2>&1 | grep -v '^WARNING: Location' || true
    ls -l .whl/autoalloc-*.whl .whl/platformdirs-*.whl
    exit 0
fi

if [ "$DRY" = 1 ]; then
    OUT=${OUT:-benchmarks/out/gpu_check-dry-run}
else
    OUT=${OUT:-benchmarks/out/gpu_check}
fi
LIMIT=${GPU_CHECK_LIMIT:-560}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
# this script's own results from an earlier run, by name: OUT may hold anything else
for name in quick ab full; do rm -f "$OUT/$name.json" "$OUT/$name.png"; done
exec > >(tee "$OUT/gpu_check.log") 2>&1
export PYTHONUNBUFFERED=1
START=$SECONDS
SCRATCH=$(mktemp -d "${TMPDIR:-/tmp}/autoalloc-gpu-check.XXXXXX")
trap 'rm -rf "$SCRATCH"' EXIT  # the venv, the wheel and the runs' logs (ab.json keeps their tails)
WHL=.whl

echo "== machine"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || echo "(no nvidia-smi)"
"$PY" -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)' || exit 2

# install_beside: a fresh venv of our own that sees $PY's packages (its torch), autoalloc's
# wheel installed into it with no index; PY becomes the venv's python.
install_beside() {
    local venv=$SCRATCH/venv site vsite
    site=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    "$PY" -m venv --without-pip "$venv" || exit 2
    vsite=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    echo "$site" > "$vsite/_gpu_check_base.pth"
    "$PY" -m pip --python "$venv/bin/python" install -q --no-index --no-deps "$@" || exit 2
    PY=$venv/bin/python
}

if [ "$DRY" = 1 ]; then
    echo "== dry run: build autoalloc's wheel from this checkout (no index)"
    WHL=$SCRATCH/whl
    "$PY" -m pip wheel -q --no-deps --no-index --no-build-isolation -w "$WHL" . || exit 2
    ls -l "$WHL"/autoalloc-*.whl || exit 2
    echo "== install autoalloc into a fresh venv beside $PY's torch (offline; platformdirs from there)"
    install_beside "$WHL"/autoalloc-*.whl
else
    echo "== install autoalloc (from .whl/, no index)"
    ls .whl/autoalloc-*.whl .whl/platformdirs-*.whl || { echo "no wheels: run 'bash benchmarks/gpu_check.sh --prepare' where pip reaches the index, and copy .whl/ along"; exit 2; }
    if ! "$PY" -m pip install -q --no-index --no-deps --force-reinstall .whl/platformdirs-*.whl .whl/autoalloc-*.whl; then
        # python3's environment is not writable: a venv of our own that sees its packages.
        echo "installing into a venv beside python3's environment instead"
        install_beside .whl/platformdirs-*.whl .whl/autoalloc-*.whl
    fi
fi
# From here on, run from a neutral directory: the checkout's autoalloc/ (first on sys.path for
# `python -c` and `-m`) must not stand in for the autoalloc that was installed.
cd "$SCRATCH" || exit 2
"$PY" -c 'import autoalloc, os, sys; d = os.path.dirname(autoalloc.__file__); print("autoalloc from", d); sys.exit(0 if "-packages" in d else 1)' \
    || { echo "the autoalloc $PY imports is not the installed one"; exit 2; }
"$PY" -c 'import sys; armed = any(getattr(f, "autoalloc_watcher", False) for f in sys.meta_path); print("hook armed:", armed); sys.exit(0 if armed else 1)' \
    || { echo "autoalloc's startup hook is not live in $PY"; exit 2; }

echo "== autoalloc bench --quick"
"$PY" -m autoalloc bench --quick --out "$SCRATCH/bench-quick" \
    --json "$OUT/quick.json" --png "$OUT/quick.png" --deadline 170
QUICK_RC=$?

# autoalloc ab on the workload as a user would run it on their own trainer, near the memory
# cap the quick run calibrated (its probe: peak allocated / 0.88).
CAP_GB=$("$PY" -c 'import json, sys; c = json.load(open(sys.argv[1]))["bench"]["calibration"]; print("%.2f" % (c["cap_bytes"] / 2**30) if c.get("cap_bytes") else "")' "$OUT/quick.json" 2>/dev/null)
REMAINING=$((LIMIT - (SECONDS - START)))
AB_RC=0
if [ "$DRY" = 1 ]; then
    echo "== autoalloc ab --steps 3 --repeat 1 -- the workload on the CPU (dry run)"
    "$PY" -m autoalloc ab --steps 3 --warmup 2 --repeat 1 --timeout 300 --out "$SCRATCH/ab" \
        -- "$PY" -m autoalloc.bench.workload --preset smoke --device cpu --steps 100000
    AB_RC=$?
    cp "$SCRATCH/ab/ab.json" "$OUT/ab.json" 2>/dev/null
    cp "$SCRATCH/ab/ab.png" "$OUT/ab.png" 2>/dev/null
elif [ -n "$CAP_GB" ] && [ "$REMAINING" -gt 150 ]; then
    echo "== autoalloc ab --steps 100 --repeat 2 -- the workload at a ${CAP_GB} GiB cap (${REMAINING} s left)"
    timeout $((REMAINING - 20)) "$PY" -m autoalloc ab --steps 100 --warmup 20 --repeat 2 --timeout 120 \
        --out "$SCRATCH/ab" -- "$PY" -m autoalloc.bench.workload --preset quick --steps 100000 --cap-gb "$CAP_GB"
    AB_RC=$?
    cp "$SCRATCH/ab/ab.json" "$OUT/ab.json" 2>/dev/null
    cp "$SCRATCH/ab/ab.png" "$OUT/ab.png" 2>/dev/null
else
    echo "skipping autoalloc ab: no calibrated cap from the quick run, or not enough time left"
fi

REMAINING=$((LIMIT - (SECONDS - START)))
echo "== autoalloc bench (the full A/B; ${REMAINING} s left)"
FULL_RC=0
if [ "$DRY" = 1 ]; then
    echo "dry run: the full A/B is for the GPU (the quick run above went through the same path)"
elif [ "$REMAINING" -gt 120 ]; then
    "$PY" -m autoalloc bench --out "$SCRATCH/bench-full" \
        --json "$OUT/full.json" --png "$OUT/full.png" --deadline $((REMAINING - 30))
    FULL_RC=$?
else
    echo "not enough time left for the full A/B: run it alone (GPU_CHECK_LIMIT, or: $PY -m autoalloc bench)"
fi
echo "== done in $((SECONDS - START)) s: quick rc=$QUICK_RC, ab rc=$AB_RC, full rc=$FULL_RC; results in $OUT"
ls -l "$OUT"
[ "$QUICK_RC" = 0 ] && [ "$AB_RC" = 0 ] && [ "$FULL_RC" = 0 ]
