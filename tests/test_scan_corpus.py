"""explain's prediction (``autoalloc.scan`` on real source) against the corpus's run view.

Needs the corpus's trees on disk: ``AUTOALLOC_CORPUS_TREES`` names a folder of
``<owner>+<name>`` checkouts at the commits ``tests/corpus/unlisted.json`` records (written by
``scripts/corpus/predict_agreement.py --trees DIR --git-dirs MIRRORS``). Skipped without it.
The figures it guards are in ``benchmarks/results/2026-12-06-predict-agreement.json``.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

TREES = os.environ.get("AUTOALLOC_CORPUS_TREES", "")
SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "corpus" / "predict_agreement.py"
RESULT = (
    Path(__file__).resolve().parents[1] / "benchmarks/results/2026-12-06-predict-agreement.json"
)

pytestmark = pytest.mark.skipif(
    not TREES or not os.path.isdir(TREES),
    reason="AUTOALLOC_CORPUS_TREES does not name a folder of the corpus's trees "
    "(scripts/corpus/predict_agreement.py --trees DIR --git-dirs MIRRORS writes one)",
)


def test_the_prediction_agrees_with_the_run_view() -> None:
    spec = importlib.util.spec_from_file_location("predict_agreement", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    result = module.score(Path(TREES))
    summary = module.summary(result)
    assert summary["rows"] > 0, "no corpus tree found under AUTOALLOC_CORPUS_TREES"
    measured = json.loads(RESULT.read_text(encoding="utf-8"))["per_tree"]
    # the trees present: at least as many rows agree as when measured (1,396 of 1,428 in all)
    want = sum(measured[repo].get("agree", 0) for repo in summary["per_tree"])
    assert summary["agree"] >= want, module.render(result)
    # decided before torch starts only where the entry script itself trains
    assert summary["early"]["without_an_optimizer_in_the_run_view"] == 0, summary["early"]
