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
set -uo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = "--prepare" ]; then
    set -e
    mkdir -p .whl
    rm -f .whl/autoalloc-*.whl .whl/platformdirs-*.whl
    python3 -m pip wheel -q --no-deps -w .whl . 2>&1 | grep -v '^WARNING: Location' || true
    python3 -m pip download -q --no-deps --only-binary=:all: -d .whl platformdirs 2>&1 | grep -v '^WARNING: Location' || true
    ls -l .whl/autoalloc-*.whl .whl/platformdirs-*.whl
    exit 0
fi

OUT=${OUT:-benchmarks/out/gpu_check}
LIMIT=${GPU_CHECK_LIMIT:-560}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_check.log") 2>&1
export PYTHONUNBUFFERED=1
START=$SECONDS

echo "== machine"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || echo "(no nvidia-smi)"
"$PY" -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)'

echo "== install autoalloc (from .whl/, no index)"
ls .whl/autoalloc-*.whl .whl/platformdirs-*.whl || { echo "no wheels: run 'bash benchmarks/gpu_check.sh --prepare' where pip reaches the index, and copy .whl/ along"; exit 2; }
if ! "$PY" -m pip install -q --no-index --no-deps --force-reinstall .whl/platformdirs-*.whl .whl/autoalloc-*.whl; then
    # python3's environment is not writable: a venv of our own that sees its packages.
    echo "installing into a venv beside python3's environment instead"
    SITE=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    "$PY" -m venv --without-pip /tmp/autoalloc-venv || exit 2
    VPY=/tmp/autoalloc-venv/bin/python
    VSITE=$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    echo "$SITE" > "$VSITE/_gpu_check_base.pth"
    "$PY" -m pip --python "$VPY" install -q --no-index --no-deps .whl/platformdirs-*.whl .whl/autoalloc-*.whl || exit 2
    PY=$VPY
fi
"$PY" -c 'import sys; armed = any(getattr(f, "autoalloc_watcher", False) for f in sys.meta_path); print("hook armed:", armed); sys.exit(0 if armed else 1)' \
    || { echo "autoalloc's startup hook is not live in $PY"; exit 2; }

echo "== autoalloc bench --quick"
"$PY" -m autoalloc bench --quick --out /tmp/autoalloc-bench-quick \
    --json "$OUT/quick.json" --png "$OUT/quick.png" --deadline 170
QUICK_RC=$?

# autoalloc ab on the workload as a user would run it on their own trainer, near the memory
# cap the quick run calibrated (its probe: peak allocated / 0.88).
CAP_GB=$("$PY" -c 'import json, sys; c = json.load(open(sys.argv[1]))["bench"]["calibration"]; print("%.2f" % (c["cap_bytes"] / 2**30) if c.get("cap_bytes") else "")' "$OUT/quick.json" 2>/dev/null)
REMAINING=$((LIMIT - (SECONDS - START)))
AB_RC=0
if [ -n "$CAP_GB" ] && [ "$REMAINING" -gt 150 ]; then
    echo "== autoalloc ab --steps 100 --repeat 2 -- the workload at a ${CAP_GB} GiB cap (${REMAINING} s left)"
    timeout $((REMAINING - 20)) "$PY" -m autoalloc ab --steps 100 --warmup 20 --repeat 2 --timeout 120 \
        --out /tmp/autoalloc-ab -- "$PY" -m autoalloc.bench.workload --preset quick --steps 100000 --cap-gb "$CAP_GB"
    AB_RC=$?
    cp /tmp/autoalloc-ab/ab.json "$OUT/ab.json" 2>/dev/null
    cp /tmp/autoalloc-ab/ab.png "$OUT/ab.png" 2>/dev/null
else
    echo "skipping autoalloc ab: no calibrated cap from the quick run, or not enough time left"
fi

REMAINING=$((LIMIT - (SECONDS - START)))
echo "== autoalloc bench (the full A/B; ${REMAINING} s left)"
FULL_RC=0
if [ "$REMAINING" -gt 120 ]; then
    "$PY" -m autoalloc bench --out /tmp/autoalloc-bench-full \
        --json "$OUT/full.json" --png "$OUT/full.png" --deadline $((REMAINING - 30))
    FULL_RC=$?
else
    echo "not enough time left for the full A/B: run it alone (GPU_CHECK_LIMIT, or: $PY -m autoalloc bench)"
fi
echo "== done in $((SECONDS - START)) s: quick rc=$QUICK_RC, ab rc=$AB_RC, full rc=$FULL_RC; results in $OUT"
ls -l "$OUT"
[ "$QUICK_RC" = 0 ] && [ "$AB_RC" = 0 ] && [ "$FULL_RC" = 0 ]
