"""Read ``AUTOALLOC_REPORT`` output back: any path, any content, one verdict per file, no hang.

A report file holds one JSON object per line (``recorder.emit``; processes given the same file
each append theirs); a file written by an older autoalloc holds one indented object. A
directory holds one such file per process. ``-`` is standard input (``AUTOALLOC_REPORT=-``
wrote the report into the job's stderr, among the program's own lines, which are passed
over). Whatever a path holds (a list, a number, wrong field types, deep nesting, a truncated
or binary file, a FIFO or a device) becomes a ``Verdict`` instead of an exception or a wait:
only regular files are opened, at most ``MAX_BYTES`` are read.
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any, Literal

from autoalloc.ab.recorder import SCHEMA
from autoalloc.messages import printable

MAX_BYTES = 256 << 20
Outcome = Literal["ok", "skipped"]

# The fields the tables read, and the JSON types each must have when present.
_NUMBER = (int, float)
FIELDS: dict[str, tuple[type, ...]] = {
    "steps": (int,),
    "warmup": (int,),
    "pid": (int,),
    "step_ends_s": (list,),
    "step_sample": (dict,),
    "cuda_steps": (list,),
    "rank": (dict,),
    "signals": (list,),
    "decision": (dict,),
    "allocator_settings": (dict,),
    "cuda": (bool,),
    "device_name": (str,),
    "peak_reserved": _NUMBER,
    "peak_allocated": _NUMBER,
}
COUNTERS = ("num_device_alloc", "num_device_free", "num_alloc_retries", "num_ooms")


@dataclass
class Verdict:
    """What one path gave: its reports, or why it gave none (or fewer than it holds)."""

    path: str
    outcome: Outcome
    reports: list[dict[str, Any]] = field(default_factory=list)
    why: str = ""

    def line(self) -> str:
        count = len(self.reports)
        text = f"{count} report{'' if count == 1 else 's'}"
        if self.outcome != "ok":
            text = f"{self.why} ({text} read)" if count else self.why
        return printable(f"{self.path}: {text}")


def problem(report: object) -> str | None:
    """Why a parsed JSON value is not a report the tables can show (None: it is one)."""
    if not isinstance(report, dict):
        kind = {list: "list", str: "string", bool: "boolean", type(None): "null"}
        return f"a JSON {kind.get(type(report), 'number')}, not a report object"
    schema = report.get("schema")
    if schema is not None and schema != SCHEMA:
        return f"not an autoalloc report (schema {str(schema)[:40]!r})"
    if schema is None and "steps" not in report:
        return "not an autoalloc report (no schema, no steps)"
    for key, types in FIELDS.items():
        value = report.get(key)
        if value is not None and (
            not isinstance(value, types) or (bool not in types and isinstance(value, bool))
        ):
            return f"field {key!r} is a {type(value).__name__}, not what a report holds"
    sample = report.get("step_sample") or {"every": 1, "times_s": []}
    every, later = sample.get("every"), sample.get("times_s")
    if not isinstance(every, int) or every < 1 or not isinstance(later, list):
        return "field 'step_sample' holds no positive 'every' and list 'times_s'"
    for key, times in (("step_ends_s", report.get("step_ends_s")), ("step_sample", later)):
        if not all(isinstance(t, _NUMBER) for t in times or ()):
            return f"field {key!r} holds something other than numbers"
    if not all(isinstance(v, int) for v in (report.get("rank") or {}).values()):
        return "field 'rank' holds something other than integers"
    for step in report.get("cuda_steps") or ():
        if not isinstance(step, dict) or not all(isinstance(step.get(k), int) for k in COUNTERS):
            return "field 'cuda_steps' holds something other than counter records"
    return None


def _parse(text: str) -> object:
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def _why_not_json(text: str, exc: Exception) -> str:
    body = text.strip()
    if body.startswith("{") and not body.endswith("}"):
        return "truncated (the JSON ends early: still being written, or its writer was killed)"
    return f"not JSON ({str(exc)[:80]})"


# (line number, the value, why it is no JSON value: None when it is one)
Piece = tuple[int, object, "str | None"]
_NOT_SPACE = re.compile(r"\S")


def _values(text: str) -> Iterator[Piece]:
    """The JSON values of a file, one after the other, whatever whitespace is between them
    (one per line, or an indented one followed by appended lines); after a piece that is no
    JSON, reading goes on at the next line that starts with ``{``."""
    decoder = json.JSONDecoder()
    pos, number, counted = 0, 1, 0
    while (found := _NOT_SPACE.search(text, pos)) is not None:
        pos = found.start()
        number, counted = number + text.count("\n", counted, pos), pos
        try:
            value, pos = decoder.raw_decode(text, pos)
        except (ValueError, RecursionError) as exc:
            after = text.find("\n{", pos)
            piece = text[pos : after if after >= 0 else len(text)]
            why = "nested too deeply" if isinstance(exc, RecursionError) else None
            yield number, None, why or _why_not_json(piece, exc)
            if after < 0:
                return
            pos = after + 1
            continue
        yield number, value, None


def _lines(text: str) -> Iterator[Piece]:
    """A job's stderr: its lines that start as a JSON object does (the others are the
    program's)."""
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith('{"'):
            try:
                yield number, _parse(line), None
            except ValueError as exc:
                yield number, None, _why_not_json(line, exc)


def parse_text(path: str, text: str, stream: bool = False) -> Verdict:
    """The reports in a file's text: JSON values one after the other (one object per line, an
    older autoalloc's indented object, or both), each piece that is no report skipped and
    counted.

    ``stream``: the text is a job's stderr, whose lines that are no JSON object are the
    program's, not damage; nor is a JSON line that is no report.
    """
    verdict = Verdict(path, "ok")
    skipped: list[str] = []
    for number, value, why in _lines(text) if stream else _values(text):
        if why is None:
            why = problem(value)
            if why and stream:
                continue
        if why:
            skipped.append(f"line {number}: {why}")
        else:
            verdict.reports.append(value)  # type: ignore[arg-type]
    if skipped:
        verdict.outcome = "skipped"
        count = len(skipped)
        verdict.why = f"{skipped[0]}; {count} part{'' if count == 1 else 's'} skipped in all"
    elif not verdict.reports:
        verdict.outcome = "skipped"
        verdict.why = "no report in it" if text.strip() else "empty"
    return verdict


def _read_regular(path: str) -> tuple[str | None, str]:
    """A regular file's text, or None and why it is not read (never opens anything else)."""
    from autoalloc import safefile

    try:
        data = safefile.read(path, MAX_BYTES)[0]
    except safefile.NotRegular as exc:
        return None, _kind(exc.mode)
    except safefile.TooLarge:
        return None, f"larger than {MAX_BYTES >> 20} MiB"
    except OSError as exc:
        return None, exc.strerror or str(exc)
    if b"\0" in data:
        return None, "binary, not a report"
    try:
        return data.decode("utf-8"), ""
    except UnicodeDecodeError:
        return None, "not UTF-8 text, not a report"


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO: not read here (it could wait for ever); pipe it: autoalloc report - < FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device, not a report file"
    return "not a regular file"


def _dedup(reports: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """One report per process: a process that wrote twice (a signal, then exit) keeps its last."""
    out: dict[object, dict[str, Any]] = {}
    for i, report in enumerate(reports):
        key = (
            (report.get("host"), report.get("pid"), report.get("started")) if "pid" in report else i
        )
        out.pop(key, None)
        out[key] = report
    return list(out.values())


def read_file(path: str) -> Verdict:
    text, why = _read_regular(path)
    if text is None:
        return Verdict(path, "skipped", why=why)
    verdict = parse_text(path, text)
    verdict.reports = [{**r, "file": path} for r in _dedup(verdict.reports)]
    return verdict


def read_stream(stream: IO[str], name: str = "-") -> Verdict:
    verdict = parse_text(name, stream.read(MAX_BYTES), stream=True)
    verdict.reports = [{**r, "file": name} for r in _dedup(verdict.reports)]
    return verdict


def read_directory(directory: str) -> list[Verdict]:
    """A verdict for each ``.json``/``.jsonl`` entry of a directory (other names are not ours)."""
    try:
        names = sorted(os.listdir(directory))
    except OSError as exc:
        return [Verdict(directory, "skipped", why=exc.strerror or str(exc))]
    out = [
        read_file(os.path.join(directory, name))
        for name in names
        if name.endswith((".json", ".jsonl"))
    ]
    return out or [Verdict(directory, "skipped", why="no report files (*.json) in it")]


def read_paths(paths: Iterable[str], stdin: IO[str] | None = None) -> list[Verdict]:
    """A verdict per file for each path given: a file, a directory, or ``-`` (stdin)."""
    out: list[Verdict] = []
    for path in paths:
        if path == "-":
            out.append(read_stream(stdin if stdin is not None else sys.stdin))
        elif os.path.isdir(path):
            out.extend(read_directory(path))
        else:
            out.append(read_file(path))
    return out


def by_rank(reports: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rank order (processes without a rank last)."""
    from autoalloc.ab.table import report_rank

    return sorted(reports, key=lambda r: (report_rank(r) is None, report_rank(r) or 0))


def command(paths: Iterable[str], as_json: bool, out: IO[str], err: IO[str]) -> int:
    """``autoalloc report PATH...``: the table (or JSON) of every report, a line per bad file."""
    from autoalloc.ab import table

    verdicts = read_paths(paths)
    for verdict in verdicts:
        if verdict.outcome != "ok":
            print(f"autoalloc report: skipped {verdict.line()}", file=err)
    reports = by_rank(r for v in verdicts for r in v.reports)
    if not reports:
        print("autoalloc report: no reports found", file=err)
        return 1
    print(json.dumps(reports, indent=1) if as_json else table.render_reports(reports), file=out)
    return 0 if all(v.outcome == "ok" for v in verdicts) else 1
