"""How often ``autoalloc explain``'s prediction agrees with the run view on the labelled corpus.

``tests/corpus/unlisted.json`` records, for each entry point, the modules its run reaches and
whether it builds an optimizer (a hand label); ``tests/test_corpus.py::unlisted_rule`` decides
from those (the run view). ``explain`` instead reads the script's real source (``autoalloc.scan``)
and decides from what it finds. This script runs the scan on the trees' real files at the
corpus's commits and compares, row by row (AMBIGUOUS rows left out):

- the prediction: ``first_match(rules, entry, scan.imported() | {"torch"}, trains=scan found an
  optimizer)`` with the built-in policy and the entry ``unlisted_rule`` builds; its apply rule
  or none;
- the run view: ``unlisted_rule(policy, row)``.

A disagreement is put down to the optimizer when deciding from the scan's names with the
labelled optimizer agrees with the run view; to the names when the run view's names with the
scan's optimizer answer agree; else to both. For each, the training rules' names
(``training_names``) that the scan misses or adds against the row's ``reaches`` + ``imports``
are listed. Precision and recall against the labels (TRAIN rows as positives) are given for
both views on the same rows.

Usage::

    python scripts/corpus/predict_agreement.py --trees DIR [--git-dirs MIRRORS] [--json OUT]

``DIR/<owner>+<name>`` holds a tree's files at the row's commit (``<owner>+<name>@<commit12>``
when the corpus names several commits of one tree). With ``--git-dirs``, trees missing from
``DIR`` are written there first from ``MIRRORS/<owner>+<name>/repo`` (a git directory, as for
``scripts/corpus/unlisted.py``), at the recorded commit, or at HEAD when the mirror lacks it
(noted in the output); files over 2 MiB and blobs the mirror does not hold are left out,
symbolic links are kept.
Only trees present in ``DIR`` are scored.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from autoalloc import scan  # noqa: E402
from autoalloc.entrypoint import EntryPoint  # noqa: E402
from autoalloc.match import first_match, training_names  # noqa: E402
from autoalloc.plan import library_names  # noqa: E402
from tests.test_corpus import (  # noqa: E402
    UNLISTED,
    builtin_policy,
    imported_modules,
    unlisted_rule,
)

MAX_BLOB = 2 << 20
COMMIT_FILE = ".corpus-commit.json"  # written into each tree this script materialises


def tree_dir(trees: Path, row: dict, multi: bool) -> Path:
    name = row["repo"].replace("/", "+", 1)
    return trees / (f"{name}@{row['commit'][:12]}" if multi else name)


def materialise(git_dir: Path, commit: str, out: Path) -> dict:
    """Write the files of ``commit`` (HEAD if the mirror lacks it) under ``out``."""
    git = ["git", "--git-dir", str(git_dir)]
    kind = subprocess.run([*git, "cat-file", "-t", commit], capture_output=True, text=True)
    found = kind.stdout.strip() == "commit"
    used = (
        commit
        if found
        else subprocess.run(
            [*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    )
    listing = subprocess.run(
        [*git, "ls-tree", "-r", "-l", used], capture_output=True, text=True, check=True
    ).stdout
    wanted, links, absent = [], set(), 0
    for line in listing.splitlines():
        meta, path = line.split("\t", 1)
        mode, kind_, sha, size = meta.split()
        if kind_ != "blob":
            continue
        if mode == "120000":
            links.add(path)  # a symbolic link (recipes share code through them)
            wanted.append((sha, path))
        elif not size.isdigit():
            absent += 1  # a blob the mirror does not hold (a large or LFS file)
        elif int(size) <= MAX_BLOB:
            wanted.append((sha, path))
    data = subprocess.run(
        [*git, "cat-file", "--batch"],
        input="".join(f"{s}\n" for s, _ in wanted).encode(),
        capture_output=True,
        check=True,
    ).stdout
    at = written = 0
    for _, path in wanted:
        end = data.index(b"\n", at)
        header = data[at:end].decode().split()
        at = end + 1
        if header[1] == "missing":
            absent += 1
            continue
        size = int(header[2])
        target = out / path
        target.parent.mkdir(parents=True, exist_ok=True)
        if path in links:
            os.symlink(data[at : at + size].decode(), target)
        else:
            target.write_bytes(data[at : at + size])
        at += size + 1
        written += 1
    note = {"commit": commit, "found": found, "used": used, "files": written, "absent": absent}
    (out / COMMIT_FILE).write_text(json.dumps(note), encoding="utf-8")
    return note


def launch_args(row: dict) -> list[str]:
    """The command line's arguments after the script (or ``-m module``)."""
    argv = row["launch"]["argv"]
    base = os.path.basename(row["path"])
    module = row["path"][:-3].replace("/", ".") if row["path"].endswith(".py") else None
    for i, arg in enumerate(argv[1:], 1):
        if os.path.basename(arg) == base:
            return argv[i + 1 :]
        if argv[i - 1] == "-m" and module and module.endswith(arg.removesuffix(".__main__")):
            return argv[i + 1 :]
    return argv[2:]


def entry_of(row: dict) -> EntryPoint:
    """The entry point ``tests/test_corpus.py::unlisted_rule`` decides for."""
    path = f"/src/{row['repo'].split('/')[1]}/{row['path']}"
    return EntryPoint("script", path, tuple(row["launch"]["argv"][1:]), path, path)


def own_names(tree: Path) -> frozenset[str]:
    """The tree's own top-level packages (a folder with ``__init__.py`` whose parent has none)
    and the modules at its root or in ``src/``: a rule's name that is one of these is the
    tree's own code, not a library."""
    out = set()
    for folder, dirs, files in os.walk(tree):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        if "__init__.py" in files and not os.path.isfile(
            os.path.join(os.path.dirname(folder), "__init__.py")
        ):
            out.add(os.path.basename(folder))
        if folder in (str(tree), str(tree / "src")):
            out.update(f[:-3] for f in files if f.endswith(".py"))
    return frozenset(out)


def applied(match) -> str | None:
    return match.rule.name if match.rule is not None and match.rule.action == "apply" else None


def score(trees: Path) -> dict:
    policy = builtin_policy()
    rules = policy.rules
    names = training_names(rules)
    libraries = scan.installed_dirs()
    libs = library_names(rules)
    commits: dict[str, set[str]] = {}
    for row in UNLISTED:
        commits.setdefault(row["repo"], set()).add(row["commit"])
    per_tree: dict[str, Counter] = {}
    used: dict[str, dict] = {}
    rows_out = []
    owns: dict[Path, frozenset[str]] = {}
    for row in UNLISTED:
        if row["label"] == "AMBIGUOUS":
            continue
        tree = tree_dir(trees, row, len(commits[row["repo"]]) > 1)
        if not tree.is_dir():
            continue
        note = tree / COMMIT_FILE
        used.setdefault(
            tree.name,
            json.loads(note.read_text())
            if note.is_file()
            else {"commit": row["commit"], "found": None},
        )
        used[tree.name]["repo"] = row["repo"]
        script = tree / row["path"]
        cwd = os.path.normpath(tree / row["launch"]["cwd"])
        if not os.path.isdir(cwd):
            cwd = str(tree)
        entry = entry_of(row)
        run_names = imported_modules({"imports": [*row["reaches"], *row["imports"]]})
        run = unlisted_rule(policy, row)
        out = {
            "repo": row["repo"],
            "path": row["path"],
            "label": row["label"],
            "run": run,
            "optimizer_label": row["optimizer"],
        }
        try:
            cpu = time.process_time()
            found = scan.scan(str(script), launch_args(row), cwd, libraries, names)
            out["scan_cpu_ms"] = round((time.process_time() - cpu) * 1000, 1)
        except FileNotFoundError:
            out["error"] = "script not in the tree"
            per_tree.setdefault(row["repo"], Counter())["missing script"] += 1
            rows_out.append(out)
            continue
        seen = found.imported(libs) | {"torch"}
        trains = found.optimizer is not None
        predicted = applied(first_match(rules, entry, seen, trains=trains))
        if_trains = applied(first_match(rules, entry, seen, trains=True))
        # decided before torch starts: what plan._early does (the entry script builds it)
        early = if_trains if found.builds_here else None
        outcome = (
            "apply"
            if predicted
            else "depends"
            if if_trains and not trains
            else "depends"
            if found.unknown
            else "off"
        )
        own = owns.setdefault(tree, own_names(tree))
        missing, extra = sorted((names & run_names) - seen), sorted((names & seen) - run_names)
        out |= {
            "predicted": predicted,
            "if_trains": if_trains,
            "outcome": outcome,
            "optimizer_scan": found.optimizer,
            "early": early,
            "complete": found.complete,
            "files": len(found.files),
            "unknown": list(found.unknown[:2]),
            "missing": missing,
            "extra": extra,
            "own": sorted(n for n in {*missing, *extra} if n.partition(".")[0] in own),
        }
        if predicted == run:
            out["agree"] = True
        else:
            out["agree"] = False
            out["direction"] = (
                "predicts apply, run none"
                if run is None
                else "predicts none, run applies"
                if predicted is None
                else "different rule"
            )
            by_opt = applied(first_match(rules, entry, seen, trains=row["optimizer"])) == run
            by_names = applied(first_match(rules, entry, run_names, trains=trains)) == run
            out["cause"] = (
                "optimizer and names"
                if by_opt and by_names
                else "optimizer"
                if by_opt
                else "names"
                if by_names
                else "optimizer and names"
            )
            if out["cause"] != "optimizer":
                out["cause"] = (
                    out["cause"]
                    if (out["missing"] or out["extra"])
                    else (out["cause"] + " (other names)")
                )
        c = per_tree.setdefault(row["repo"], Counter())
        c["agree" if out["agree"] else "disagree"] += 1
        c["incomplete"] += not found.complete
        c["early"] += early is not None
        c["early_without_optimizer"] += early is not None and not row["optimizer"]
        c["early_not_train"] += early is not None and row["label"] != "TRAIN"
        for view, got in (("pred", predicted), ("run", run)):
            want = row["label"] == "TRAIN"
            c[f"{view}_" + (("TP" if want else "FP") if got else ("FN" if want else "TN"))] += 1
        rows_out.append(out)
    return {"per_tree": per_tree, "trees": used, "rows": rows_out}


def ratios(c: Counter, view: str) -> tuple[float, float]:
    tp, fp, fn = c[f"{view}_TP"], c[f"{view}_FP"], c[f"{view}_FN"]
    return (tp / (tp + fp) if tp + fp else 1.0, tp / (tp + fn) if tp + fn else 1.0)


def render(result: dict) -> str:
    head = (
        f"{'tree':<46}{'rows':>5}{'agree':>6}{'dis':>4}{'inc':>4}   "
        f"{'pred TP/FP/FN':>14}{'run TP/FP/FN':>14}"
    )
    lines = [head]
    total: Counter = Counter()
    for repo in sorted(result["per_tree"]):
        c = result["per_tree"][repo]
        total.update(c)
        lines.append(
            f"{repo:<46}{c['agree'] + c['disagree']:>5}{c['agree']:>6}{c['disagree']:>4}"
            f"{c['incomplete']:>4}   {c['pred_TP']:>4}/{c['pred_FP']}/{c['pred_FN']:<6}"
            f"{c['run_TP']:>5}/{c['run_FP']}/{c['run_FN']}"
        )
    n = total["agree"] + total["disagree"]
    lines.append(
        f"{'all':<46}{n:>5}{total['agree']:>6}{total['disagree']:>4}"
        f"{total['incomplete']:>4}   {total['pred_TP']:>4}/{total['pred_FP']}/"
        f"{total['pred_FN']:<6}{total['run_TP']:>5}/{total['run_FP']}/{total['run_FN']}"
    )
    if n:
        lines.append(f"agreement {total['agree']}/{n} = {total['agree'] / n:.3f}")
    for view, title in (("pred", "prediction"), ("run", "run view")):
        p, r = ratios(total, view)
        lines.append(f"{title:<11} vs labels (TRAIN positive): precision {p:.3f} recall {r:.3f}")
    scored = [r for r in result["rows"] if "agree" in r]
    applies = [r for r in scored if r["run"]]
    same = sum(1 for r in applies if r["predicted"] == r["run"])
    later = sum(1 for r in applies if not r["predicted"] and r["if_trains"] == r["run"])
    lines.append(
        f"of {len(applies)} rows the run view applies to: the prediction applies the "
        f"same rule to {same}; {later} more would get it if an optimizer were found"
    )
    early = [r for r in scored if r.get("early")]
    lines.append(
        f"decided before torch starts: {len(early)} rows; without an optimizer in the run view "
        f"{sum(not r['optimizer_label'] for r in early)}; not TRAIN "
        f"{[(r['label'], r['repo'], r['path']) for r in early if r['label'] != 'TRAIN']}"
    )
    wrong = [r for r in scored if not r["agree"]]
    lines.append(f"disagreements by direction: {dict(Counter(r['direction'] for r in wrong))}")
    lines.append(f"disagreements by cause: {dict(Counter(r['cause'] for r in wrong))}")
    for r in wrong:
        lines.append(
            f"  {r['direction']:<27} {r['cause']:<20} {r['repo']} {r['path']} "
            f"(pred {r['predicted']}, run {r['run']}, label {r['label']}; optimizer scan "
            f"{'yes' if r['optimizer_scan'] else 'no'} label "
            f"{'yes' if r['optimizer_label'] else 'no'}"
            f"; missing {r['missing']}; extra {r['extra']}"
            + (f"; the tree's own: {r['own']}" if r["own"] else "")
            + ")"
        )
    return "\n".join(lines)


def summary(result: dict) -> dict:
    total: Counter = Counter()
    for c in result["per_tree"].values():
        total.update(c)
    n = total["agree"] + total["disagree"]
    scored = [r for r in result["rows"] if "agree" in r]
    wrong = [r for r in scored if not r["agree"]]
    p_pred, r_pred = ratios(total, "pred")
    p_run, r_run = ratios(total, "run")
    return {
        "what": "explain's prediction (autoalloc.scan on the trees' real source) against the "
        "run view (tests/test_corpus.py::unlisted_rule) on tests/corpus/unlisted.json, "
        "built-in policy, AMBIGUOUS rows left out",
        "scan_budget": {"files": scan.MAX_FILES, "bytes_per_file": scan.MAX_BYTES,
                        "bytes": scan.MAX_TOTAL},
        "scan_cpu_ms": _spread([r["scan_cpu_ms"] for r in result["rows"] if "scan_cpu_ms" in r]),
        "early": {
            "rows": total["early"],
            "without_an_optimizer_in_the_run_view": total["early_without_optimizer"],
            "not_speech_to_text_training": total["early_not_train"],
            "of_them": [f"{r['label']} {r['repo']} {r['path']} ({r['early']})"
                        for r in scored if r.get("early") and r["label"] != "TRAIN"],
        },
        "trees": result["trees"],
        "rows": n,
        "agree": total["agree"],
        "agreement": round(total["agree"] / n, 4) if n else None,
        "incomplete_scans": total["incomplete"],
        "missing_scripts": total["missing script"],
        "by_direction": dict(Counter(r["direction"] for r in wrong)),
        "by_cause": dict(Counter(r["cause"] for r in wrong)),
        "by_direction_and_cause": dict(Counter(f"{r['direction']}: {r['cause']}" for r in wrong)),
        "run_applies": {
            "rows": sum(1 for r in scored if r["run"]),
            "prediction_applies_same_rule": sum(
                1 for r in scored if r["run"] and r["predicted"] == r["run"]
            ),
            "prediction_depends_same_rule": sum(
                1 for r in scored if r["run"] and not r["predicted"] and r["if_trains"] == r["run"]
            ),
        },
        "by_label": {
            label: {
                "rows": sum(1 for r in scored if r["label"] == label),
                "agree": sum(1 for r in scored if r["label"] == label and r["agree"]),
            }
            for label in ("TRAIN", "AUDIO", "OTHER")
        },
        "names_differing_on_all_rows": {
            "missing": dict(Counter(n for r in scored for n in r["missing"]).most_common()),
            "extra": dict(Counter(n for r in scored for n in r["extra"]).most_common()),
            "rows_with_a_difference": sum(1 for r in scored if r["missing"] or r["extra"]),
        },
        "optimizer_vs_label_on_all_rows": dict(
            Counter(
                f"scan {'yes' if r['optimizer_scan'] else 'no'}, label "
                f"{'yes' if r['optimizer_label'] else 'no'}"
                for r in scored
            )
        ),
        "outcomes": dict(Counter(r["outcome"] for r in result["rows"] if "outcome" in r)),
        "vs_labels": {
            "prediction": {
                "TP": total["pred_TP"],
                "FP": total["pred_FP"],
                "FN": total["pred_FN"],
                "TN": total["pred_TN"],
                "precision": round(p_pred, 4),
                "recall": round(r_pred, 4),
            },
            "run_view": {
                "TP": total["run_TP"],
                "FP": total["run_FP"],
                "FN": total["run_FN"],
                "TN": total["run_TN"],
                "precision": round(p_run, 4),
                "recall": round(r_run, 4),
            },
        },
        "per_tree": {
            repo: {k: v for k, v in sorted(c.items()) if v}
            for repo, c in sorted(result["per_tree"].items())
        },
        "disagreements": [
            {
                k: r[k]
                for k in (
                    "repo",
                    "path",
                    "label",
                    "predicted",
                    "if_trains",
                    "run",
                    "direction",
                    "cause",
                    "optimizer_scan",
                    "optimizer_label",
                    "missing",
                    "extra",
                    "own",
                    "files",
                    "complete",
                )
            }
            for r in wrong
        ],
    }


def _spread(values: list[float]) -> dict:
    """Median, 90th percentile and largest of ``values`` (the CPU time of each scan)."""
    values = sorted(values)
    if not values:
        return {}
    n = len(values)
    return {"scans": n, "median": values[n // 2], "p90": values[min(n - 1, n * 9 // 10)],
            "max": values[-1], "mean": round(sum(values) / n, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trees", type=Path, required=True, help="<owner>+<name> checkouts")
    parser.add_argument(
        "--git-dirs",
        type=Path,
        default=None,
        help="mirrors to write missing trees from (<owner>+<name>/repo)",
    )
    parser.add_argument(
        "--repo",
        action="append",
        default=[],
        help="with --git-dirs: write only this tree (repeatable)",
    )
    parser.add_argument("--json", type=Path, default=None, help="write the summary here")
    args = parser.parse_args(argv)
    if args.git_dirs is not None:
        commits: dict[str, set[str]] = {}
        for row in UNLISTED:
            if not args.repo or row["repo"] in args.repo:
                commits.setdefault(row["repo"], set()).add(row["commit"])
        for repo, wanted in sorted(commits.items()):
            name = repo.replace("/", "+", 1)
            git_dir = args.git_dirs / name / "repo"
            git_dir = git_dir / ".git" if (git_dir / ".git").is_dir() else git_dir
            if not git_dir.is_dir():
                continue
            for commit in sorted(wanted):
                out = args.trees / (f"{name}@{commit[:12]}" if len(wanted) > 1 else name)
                if out.is_dir():
                    continue
                note = materialise(git_dir, commit, out)
                where = "found" if note["found"] else f"NOT FOUND, used HEAD {note['used'][:12]}"
                print(f"{repo} {commit[:12]}: {where}, {note['files']} files", file=sys.stderr)
    started = time.monotonic()
    result = score(args.trees)
    print(render(result))
    print(f"({time.monotonic() - started:.0f} s)")
    if args.json is not None:
        args.json.write_text(
            json.dumps(summary(result), indent=1) + "\n", encoding="utf-8"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
